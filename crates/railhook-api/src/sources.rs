//! `/v1/sources` and `/v1/sources/{id}/destinations`: where providers send (a Source with its
//! provider, secret and ingress URL) and where what they send goes (its Destinations).
//!
//! A Source's provider configuration and secret are validated by `railhook-ingress`, so a
//! Source never holds a secret its verifier cannot use. A Destination URL is checked like an
//! Endpoint URL (the SSRF rules, [`crate::endpoints::check_url`]); the worker checks again at
//! connect time.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_core::signing::EndpointSecret;
use railhook_core::{DestinationId, SourceId};
use railhook_ingress::{Provider, ProviderConfig};
use railhook_store::sources::{self, DestinationAuth, DestinationChanges, NewDestination, NewSource, SourceChanges};
use serde::{Deserialize, Serialize};

use crate::endpoints::{check_rate_limit, check_url, is_token_char};
use crate::error::{ApiError, ApiResult};
use crate::extract::{not_null, parse_id, present, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

pub const MAX_NAME_CHARS: usize = 200;
const MAX_CREDENTIAL_LEN: usize = 4096;

/// A Source as the API shows it: never its secrets.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Source {
    #[schema(value_type = String)]
    pub id: SourceId,
    pub name: String,
    /// `stripe`, `github`, `gitlab`, `shopify`, `slack`, `twilio`, `square`, `hubspot`,
    /// `sendgrid`, `standard_webhooks` or `generic_hmac`.
    pub provider: String,
    /// The provider's configuration (`generic_hmac` only).
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    /// A disabled Source answers 410 and stores nothing.
    pub enabled: bool,
    /// Requests per second accepted at the ingress (per API process); null: unlimited.
    pub rate_limit_per_second: Option<i32>,
    /// Where the provider sends: `/ingress/<token>` (the token is 256 random bits).
    pub ingress_path: String,
    /// The same under `ingress.public_url`, when that is configured.
    pub ingress_url: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Source {
    fn view(state: &AppState, s: sources::Source) -> Source {
        let ingress_path = format!("/ingress/{}", s.ingress_token);
        let base = state.config.ingress.public_url.trim_end_matches('/');
        let ingress_url = (!base.is_empty()).then(|| format!("{base}{ingress_path}"));
        Source {
            id: s.id,
            name: s.name,
            provider: s.provider,
            config: s.config,
            enabled: s.enabled,
            rate_limit_per_second: s.rate_limit_per_second,
            ingress_path,
            ingress_url,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSource {
    /// Defaults to the provider's name.
    #[schema(schema_with = name_or_null)]
    pub name: Option<String>,
    #[schema(schema_with = provider_schema)]
    pub provider: String,
    /// `generic_hmac` only (required there; other providers take none or `{}`): `{"header",
    /// "algorithm": "sha1|sha256|sha512", "encoding": "hex|base64", "prefix"?,
    /// "timestamp_header"?, "event_id_header"?}`. What the provider does not take is 422
    /// `invalid_for_provider`.
    #[schema(schema_with = crate::schema::json_object_or_null)]
    pub config: Option<serde_json::Value>,
    /// The provider's signing secret (SendGrid: its verification public key; Standard
    /// Webhooks: `whsec_` + base64 of 24 to 64 bytes). At most 4096 bytes, no surrounding
    /// whitespace. A secret the provider's verifier cannot use is 422 `invalid_for_provider`.
    #[schema(schema_with = secret_schema)]
    pub secret: String,
    pub enabled: Option<bool>,
    /// 1 to 10 000.
    #[schema(schema_with = crate::endpoints::rate_limit_or_null)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub rate_limit_per_second: Option<i64>,
}

fn name_schema() -> utoipa::openapi::Object {
    crate::schema::trimmed_name(MAX_NAME_CHARS).build()
}

fn config_schema() -> utoipa::openapi::Object {
    crate::schema::json_object().build()
}

fn name_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(name_schema())
}

fn provider_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(Provider::ALL.iter().map(|p| p.as_str())))
        .build()
}

/// A provider's secret: not empty, no surrounding whitespace, no NUL; at most 4096 bytes
/// (stated as 1024 characters, which always fit).
fn secret_schema() -> utoipa::openapi::Object {
    crate::schema::trimmed_name(1024)
        .pattern(Some(format!("^[^{ws}\\u0000](?:[^\\u0000]*[^{ws}\\u0000])?$", ws = crate::schema::WHITESPACE_CLASS)))
        .build()
}

/// Any subset of the fields; `rate_limit_per_second: null` removes the limit. The provider
/// cannot change: create another Source.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSource {
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = name_schema)]
    pub name: Option<Option<String>>,
    /// As at creation; what the Source's provider does not take is 422 `invalid_for_provider`.
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = config_schema)]
    pub config: Option<Option<serde_json::Value>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub enabled: Option<Option<bool>>,
    #[serde(default, deserialize_with = "crate::extract::present_int")]
    #[schema(schema_with = crate::endpoints::rate_limit_or_null)]
    pub rate_limit_per_second: Option<Option<i64>>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSourceSecret {
    /// The provider's new secret (as at creation; 422 `invalid_for_provider` for one its
    /// verifier cannot use).
    #[schema(schema_with = secret_schema)]
    pub secret: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SourceSecretRotated {
    /// Until then the previous secret still verifies requests (`ingress.secret_overlap_seconds`).
    pub previous_secret_expires_at: DateTime<Utc>,
}

fn check_name(name: &str) -> Result<&str, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::invalid("name", format!("name must be 1 to {MAX_NAME_CHARS} characters")));
    }
    Ok(name)
}

/// A provider's configuration or secret refused: 422 `invalid_for_provider` naming the
/// field. Whether a `config` or `secret` is usable depends on the provider (a rule between
/// fields, or a key format such as SendGrid's P-256 key, that the document cannot state).
fn config_error(e: railhook_ingress::ConfigError) -> ApiError {
    if e.field == "secret" || e.field.starts_with("config") {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_for_provider", e.message).with_field(e.field)
    } else {
        ApiError::invalid(e.field, e.message)
    }
}

/// The stored form of a provider configuration: only `generic_hmac`'s `config` member.
fn stored_config(config: &ProviderConfig) -> Result<Option<serde_json::Value>, ApiError> {
    let ProviderConfig::GenericHmac(hmac) = config else { return Ok(None) };
    serde_json::to_value(hmac).map(Some).map_err(|e| {
        tracing::error!(error = %e, "cannot serialise a generic_hmac configuration");
        ApiError::internal()
    })
}

/// Create a Source. The response's `ingress_path` (or `ingress_url`) is what to give the
/// provider.
#[utoipa::path(post, path = "/v1/sources", tag = "sources", request_body = CreateSource,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 201, body = Source), BodyErrors))]
pub async fn create(Project(principal): Project, State(state): State<AppState>, ApiJson(body): ApiJson<CreateSource>) -> ApiResult<(StatusCode, Json<Source>)> {
    let provider: Provider = body.provider.parse().map_err(config_error)?;
    let config = ProviderConfig::from_parts(provider, body.config.as_ref()).map_err(config_error)?;
    config.validate_secret(&body.secret).map_err(config_error)?;
    let name = check_name(body.name.as_deref().unwrap_or(provider.as_str()))?;
    let rate_limit_per_second = body.rate_limit_per_second.map(check_rate_limit).transpose()?;
    let stored = stored_config(&config)?;
    let new = NewSource {
        name,
        provider: provider.as_str(),
        config: stored.as_ref(),
        secret: &body.secret,
        enabled: body.enabled.unwrap_or(true),
        rate_limit_per_second,
    };
    let client = state.pool.get().await?;
    let source = sources::create_source(&**client, principal.project_id, new).await?;
    Ok((StatusCode::CREATED, Json(Source::view(&state, source))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

fn paging(query: Result<Query<ListQuery>, QueryRejection>) -> Result<PageParams, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    Ok(PageParams { limit: q.limit, cursor: q.cursor })
}

/// The project's Sources in id order, a page at a time.
#[utoipa::path(get, path = "/v1/sources", tag = "sources",
    params(("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::SourceId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Source>), ListErrors))]
pub async fn list(Project(principal): Project, State(state): State<AppState>, query: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<Json<List<Source>>> {
    let paging = paging(query)?;
    let limit = paging.limit()?;
    let after = paging.cursor::<SourceId>()?;
    let client = state.pool.get().await?;
    let rows = sources::list_sources(&**client, principal.project_id, after, limit + 1).await?;
    let views = rows.into_iter().map(|s| Source::view(&state, s)).collect();
    Ok(Json(page(views, limit, |s: &Source| s.id.to_string())))
}

#[utoipa::path(get, path = "/v1/sources/{id}", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Source), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Source>> {
    let id: SourceId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let source = sources::get_source(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    Ok(Json(Source::view(&state, source)))
}

/// Change any subset of the fields; `enabled: false` disables the Source (410 at its ingress).
#[utoipa::path(patch, path = "/v1/sources/{id}", tag = "sources", request_body = UpdateSource,
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Source), BodyByIdErrors))]
pub async fn update(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateSource>,
) -> ApiResult<Json<Source>> {
    let id: SourceId = parse_id("id", &id)?;
    let name = not_null("name", body.name)?;
    let name = name.as_deref().map(check_name).transpose()?;
    let enabled = not_null("enabled", body.enabled)?;
    let rate_limit_per_second = body.rate_limit_per_second.map(|v| v.map(check_rate_limit).transpose()).transpose()?;
    let client = state.pool.get().await?;
    let config = match not_null("config", body.config)? {
        Some(raw) => {
            let (provider, _) = sources::provider_of(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("source"))?;
            let provider: Provider = provider.parse().map_err(config_error)?;
            let config = ProviderConfig::from_parts(provider, Some(&raw)).map_err(config_error)?;
            stored_config(&config)?
        }
        None => None,
    };
    let changes = SourceChanges { name, config: config.as_ref(), enabled, rate_limit_per_second };
    let source = sources::update_source(&**client, principal.project_id, id, changes).await?.ok_or_else(|| ApiError::not_found("source"))?;
    Ok(Json(Source::view(&state, source)))
}

/// Disable the Source: its ingress URL answers 410 and stores nothing until it is enabled
/// again (`PATCH` with `enabled: true`).
#[utoipa::path(post, path = "/v1/sources/{id}/disable", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Source), ByIdErrors))]
pub async fn disable(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Source>> {
    let id: SourceId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let changes = SourceChanges { enabled: Some(false), ..SourceChanges::default() };
    let source = sources::update_source(&**client, principal.project_id, id, changes).await?.ok_or_else(|| ApiError::not_found("source"))?;
    Ok(Json(Source::view(&state, source)))
}

/// Delete the Source with its Destinations, Incoming Events and Forwards.
#[utoipa::path(delete, path = "/v1/sources/{id}", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 204, description = "Deleted"), ByIdErrors))]
pub async fn delete(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let id: SourceId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    if sources::delete_source(&**client, principal.project_id, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("source"))
    }
}

/// Make the provider's new secret current; the previous one still verifies requests for
/// `ingress.secret_overlap_seconds` (24 h by default).
#[utoipa::path(post, path = "/v1/sources/{id}/rotate-secret", tag = "sources", request_body = RotateSourceSecret,
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = SourceSecretRotated), BodyByIdErrors))]
pub async fn rotate_secret(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RotateSourceSecret>,
) -> ApiResult<Json<SourceSecretRotated>> {
    let id: SourceId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let (provider, config) = sources::provider_of(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    let provider: Provider = provider.parse().map_err(config_error)?;
    let config = ProviderConfig::from_parts(provider, config.as_ref()).map_err(config_error)?;
    config.validate_secret(&body.secret).map_err(config_error)?;
    let expires_at = sources::rotate_source_secret(&**client, principal.project_id, id, &body.secret, state.config.ingress.secret_overlap_seconds)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    Ok(Json(SourceSecretRotated { previous_secret_expires_at: expires_at }))
}

/// How Railhook authenticates to a Destination, as given: `{"type": "none"}`, `{"type":
/// "basic", "username", "password"}`, `{"type": "bearer", "token"}`, `{"type": "header",
/// "name", "value"}` or `{"type": "standard_webhooks", "secret"?}` (re-sign every Forward
/// with Standard Webhooks headers; the secret, `whsec_` + base64, is generated when absent).
/// The schema (a `oneOf` of closed objects) is written out below: utoipa leaves a tagged
/// enum's variants open.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DestinationAuthInput {
    None,
    Basic { username: String, password: String },
    Bearer { token: String },
    Header { name: String, value: String },
    StandardWebhooks { secret: Option<String> },
}

impl utoipa::PartialSchema for DestinationAuthInput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
        let variant = |tag: &str, fields: Vec<(&str, Schema, bool)>| {
            let kind = ObjectBuilder::new().schema_type(Type::String).enum_values(Some([tag]));
            let object = crate::schema::closed_object().schema_type(Type::Object).property("type", kind).required("type");
            fields.into_iter().fold(object, |o, (name, schema, required)| {
                let o = o.property(name, schema);
                if required {
                    o.required(name)
                } else {
                    o
                }
            })
        };
        let credential = || Schema::from(credential_schema());
        OneOfBuilder::new()
            .item(variant("none", vec![]))
            .item(variant("basic", vec![("username", username_schema().into(), true), ("password", credential(), true)]))
            .item(variant("bearer", vec![("token", credential(), true)]))
            .item(variant("header", vec![("name", auth_header_name_schema().into(), true), ("value", credential(), true)]))
            .item(variant("standard_webhooks", vec![("secret", webhooks_secret_or_null(), false)]))
            .into()
    }
}

impl utoipa::ToSchema for DestinationAuthInput {}

/// The longest header name a Destination's `header` auth may use.
const MAX_AUTH_HEADER_NAME_LEN: usize = 256;

fn credential_schema() -> utoipa::openapi::Object {
    crate::schema::visible_ascii(MAX_CREDENTIAL_LEN, true).build()
}

fn username_schema() -> utoipa::openapi::Object {
    crate::schema::visible_ascii(MAX_CREDENTIAL_LEN, true).pattern(Some("^[!-9;-~](?:[ -9;-~]*[!-9;-~])?$")).build()
}

fn auth_header_name_schema() -> utoipa::openapi::Object {
    crate::schema::custom_header_name(MAX_AUTH_HEADER_NAME_LEN)
}

fn webhooks_secret_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(crate::schema::endpoint_secret())
}

/// A Destination's auth as shown: credentials are write-only, except the Standard Webhooks
/// secret, which the receiver needs to verify.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DestinationAuthView {
    None,
    Basic { username: String },
    Bearer,
    Header { name: String },
    StandardWebhooks { secret: String },
}

impl From<DestinationAuth> for DestinationAuthView {
    fn from(auth: DestinationAuth) -> DestinationAuthView {
        match auth {
            DestinationAuth::None => DestinationAuthView::None,
            DestinationAuth::Basic { username, .. } => DestinationAuthView::Basic { username },
            DestinationAuth::Bearer { .. } => DestinationAuthView::Bearer,
            DestinationAuth::Header { name, .. } => DestinationAuthView::Header { name },
            DestinationAuth::StandardWebhooks { secret } => DestinationAuthView::StandardWebhooks { secret },
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Destination {
    #[schema(value_type = String)]
    pub id: DestinationId,
    #[schema(value_type = String)]
    pub source_id: SourceId,
    pub url: String,
    pub auth: DestinationAuthView,
    /// A disabled Destination gets no new Forwards.
    pub enabled: bool,
    /// Forwards per second at most; null: unlimited.
    pub rate_limit_per_second: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<sources::Destination> for Destination {
    fn from(d: sources::Destination) -> Destination {
        Destination {
            id: d.id,
            source_id: d.source_id,
            url: d.url,
            auth: d.auth.into(),
            enabled: d.enabled,
            rate_limit_per_second: d.rate_limit_per_second,
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDestination {
    /// Checked as an Endpoint URL (422 `url_unresolvable` or `url_not_allowed` for a host
    /// that does not resolve to allowed addresses).
    #[schema(schema_with = crate::schema::url_object)]
    pub url: String,
    /// `{"type": "none"}` when absent.
    pub auth: Option<DestinationAuthInput>,
    pub enabled: Option<bool>,
    /// 1 to 10 000.
    #[schema(schema_with = crate::endpoints::rate_limit_or_null)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub rate_limit_per_second: Option<i64>,
}

/// Any subset of the fields; `rate_limit_per_second: null` removes the limit.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDestination {
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = crate::schema::url_object)]
    pub url: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = DestinationAuthInput)]
    pub auth: Option<Option<DestinationAuthInput>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub enabled: Option<Option<bool>>,
    #[serde(default, deserialize_with = "crate::extract::present_int")]
    #[schema(schema_with = crate::endpoints::rate_limit_or_null)]
    pub rate_limit_per_second: Option<Option<i64>>,
}

/// Visible ASCII (inner spaces allowed), 1 to [`MAX_CREDENTIAL_LEN`] bytes: what a header
/// value can carry.
fn check_credential(field: &str, value: &str) -> Result<(), ApiError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_CREDENTIAL_LEN
        && value.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
        && !value.starts_with(' ')
        && !value.ends_with(' ');
    if !ok {
        return Err(ApiError::invalid(field, format!("{field} must be 1 to {MAX_CREDENTIAL_LEN} visible ASCII characters (inner spaces allowed)")));
    }
    Ok(())
}

fn check_auth(input: DestinationAuthInput) -> Result<DestinationAuth, ApiError> {
    Ok(match input {
        DestinationAuthInput::None => DestinationAuth::None,
        DestinationAuthInput::Basic { username, password } => {
            check_credential("auth.username", &username)?;
            if username.contains(':') {
                return Err(ApiError::invalid("auth.username", "auth.username may not contain ':' (HTTP Basic separates it from the password with one)"));
            }
            check_credential("auth.password", &password)?;
            DestinationAuth::Basic { username, password }
        }
        DestinationAuthInput::Bearer { token } => {
            check_credential("auth.token", &token)?;
            DestinationAuth::Bearer { token }
        }
        DestinationAuthInput::Header { name, value } => {
            if name.is_empty() || name.len() > MAX_AUTH_HEADER_NAME_LEN || !name.bytes().all(is_token_char) {
                return Err(ApiError::invalid("auth.name", "auth.name must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"));
            }
            if railhook_core::signing::is_reserved_header(&name) {
                return Err(ApiError::invalid("auth.name", format!("{name} is a hop-by-hop header or one Railhook sets itself")));
            }
            check_credential("auth.value", &value)?;
            DestinationAuth::Header { name, value }
        }
        DestinationAuthInput::StandardWebhooks { secret } => {
            let secret = match secret {
                Some(raw) => EndpointSecret::parse(&raw).map_err(|e| ApiError::invalid("auth.secret", format!("auth.secret is not usable: {e}")))?,
                None => EndpointSecret::generate(),
            };
            DestinationAuth::StandardWebhooks { secret: secret.as_str().to_string() }
        }
    })
}

/// Add a Destination to the Source; every enabled Destination gets a Forward of each
/// Incoming Event stored from then on.
#[utoipa::path(post, path = "/v1/sources/{id}/destinations", tag = "sources", request_body = CreateDestination,
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 201, body = Destination), BodyByIdErrors))]
pub async fn create_destination(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<CreateDestination>,
) -> ApiResult<(StatusCode, Json<Destination>)> {
    let source: SourceId = parse_id("id", &id)?;
    let auth = check_auth(body.auth.unwrap_or(DestinationAuthInput::None))?;
    let rate_limit_per_second = body.rate_limit_per_second.map(check_rate_limit).transpose()?;
    // Last: it may wait for DNS.
    let url = check_url(&state.config, &state.resolver, &body.url).await?;
    let new = NewDestination { url: &url, auth: &auth, enabled: body.enabled.unwrap_or(true), rate_limit_per_second };
    let client = state.pool.get().await?;
    let destination = sources::create_destination(&**client, principal.project_id, source, new).await?.ok_or_else(|| ApiError::not_found("source"))?;
    Ok((StatusCode::CREATED, Json(destination.into())))
}

/// The Source's Destinations in id order, a page at a time.
#[utoipa::path(get, path = "/v1/sources/{id}/destinations", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::DestinationId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Destination>), ByIdErrors))]
pub async fn list_destinations(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<List<Destination>>> {
    let source: SourceId = parse_id("id", &id)?;
    let paging = paging(query)?;
    let limit = paging.limit()?;
    let after = paging.cursor::<DestinationId>()?;
    let client = state.pool.get().await?;
    let rows = sources::list_destinations(&**client, principal.project_id, source, after, limit + 1)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    let views = rows.into_iter().map(Destination::from).collect();
    Ok(Json(page(views, limit, |d: &Destination| d.id.to_string())))
}

fn ids(id: &str, destination_id: &str) -> Result<(SourceId, DestinationId), ApiError> {
    Ok((parse_id("id", id)?, parse_id("destination_id", destination_id)?))
}

#[utoipa::path(get, path = "/v1/sources/{id}/destinations/{destination_id}", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)"), ("destination_id" = crate::schema::DestinationId, Path, description = "Destination id (dst_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Destination), ByIdErrors))]
pub async fn get_destination(
    Project(principal): Project,
    State(state): State<AppState>,
    Path((id, destination_id)): Path<(String, String)>,
) -> ApiResult<Json<Destination>> {
    let (source, id) = ids(&id, &destination_id)?;
    let client = state.pool.get().await?;
    let destination = sources::get_destination(&**client, principal.project_id, source, id).await?.ok_or_else(|| ApiError::not_found("destination"))?;
    Ok(Json(destination.into()))
}

#[utoipa::path(patch, path = "/v1/sources/{id}/destinations/{destination_id}", tag = "sources", request_body = UpdateDestination,
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)"), ("destination_id" = crate::schema::DestinationId, Path, description = "Destination id (dst_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Destination), BodyByIdErrors))]
pub async fn update_destination(
    Project(principal): Project,
    State(state): State<AppState>,
    Path((id, destination_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<UpdateDestination>,
) -> ApiResult<Json<Destination>> {
    let (source, id) = ids(&id, &destination_id)?;
    let auth = not_null("auth", body.auth)?.map(check_auth).transpose()?;
    let enabled = not_null("enabled", body.enabled)?;
    let rate_limit_per_second = body.rate_limit_per_second.map(|v| v.map(check_rate_limit).transpose()).transpose()?;
    let url = match not_null("url", body.url)? {
        Some(raw) => Some(check_url(&state.config, &state.resolver, &raw).await?),
        None => None,
    };
    let changes = DestinationChanges { url: url.as_deref(), auth: auth.as_ref(), enabled, rate_limit_per_second };
    let client = state.pool.get().await?;
    let destination = sources::update_destination(&**client, principal.project_id, source, id, changes)
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    Ok(Json(destination.into()))
}

/// Delete the Destination and its Forwards.
#[utoipa::path(delete, path = "/v1/sources/{id}/destinations/{destination_id}", tag = "sources",
    params(("id" = crate::schema::SourceId, Path, description = "Source id (src_...)"), ("destination_id" = crate::schema::DestinationId, Path, description = "Destination id (dst_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 204, description = "Deleted"), ByIdErrors))]
pub async fn delete_destination(
    Project(principal): Project,
    State(state): State<AppState>,
    Path((id, destination_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (source, id) = ids(&id, &destination_id)?;
    let client = state.pool.get().await?;
    if sources::delete_destination(&**client, principal.project_id, source, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("destination"))
    }
}
