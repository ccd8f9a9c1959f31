//! `/v1/endpoints`: customer URLs, their custom headers and their signing secrets.
//!
//! An Endpoint URL is checked here, at creation and on change, and again by the worker at
//! connect time (DNS answers change between the two). The check here catches mistakes and
//! obvious attempts early; the connect-time check is the one that protects the network.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_config::Config;
use railhook_core::address::{parse_endpoint_url, AllowList, Resolver};
use railhook_core::signing::EndpointSecret;
use railhook_core::EndpointId;
use railhook_store::endpoints::{self, Endpoint, EndpointChanges, EndpointHeaders, NewEndpoint, PreviousSecret};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{not_null, present, parse_id, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

/// How long a host name may take to resolve when an Endpoint URL is checked.
pub const DNS_TIMEOUT: Duration = Duration::from_secs(2);
pub const MAX_DESCRIPTION_CHARS: usize = 1000;
pub const RATE_LIMIT_PER_SECOND: std::ops::RangeInclusive<i64> = 1..=10_000;
pub const MAX_HEADERS: usize = 20;
pub const MAX_HEADER_NAME_LEN: usize = 256;
pub const MAX_HEADER_VALUE_LEN: usize = 4096;



#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Its host must resolve to addresses `network.allow_cidrs` allows (422 `url_unresolvable`
    /// or `url_not_allowed` otherwise).
    #[schema(schema_with = url_schema)]
    pub url: String,
    #[serde(default)]
    #[schema(schema_with = description_or_null)]
    pub description: Option<String>,
    pub enabled: Option<bool>,
    /// `whsec_` + base64; generated when absent.
    #[schema(schema_with = secret_or_null)]
    pub secret: Option<String>,
    /// 1 to 10 000.
    #[schema(schema_with = rate_limit_or_null)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub rate_limit_per_second: Option<i64>,
    /// Sent with every request; at most 20, no hop-by-hop header and none Railhook sets;
    /// names are case-insensitive (two that differ only in case: 422 `duplicate_header`).
    #[schema(schema_with = headers_or_null)]
    pub headers: Option<EndpointHeaders>,
}

fn url_schema() -> utoipa::openapi::Object {
    crate::schema::url().build()
}

fn description_schema() -> utoipa::openapi::Object {
    crate::schema::text(MAX_DESCRIPTION_CHARS).build()
}

fn description_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(description_schema())
}

fn secret_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(crate::schema::endpoint_secret())
}

pub(crate) fn rate_limit_or_null() -> utoipa::openapi::Object {
    crate::schema::nullable_integer(RATE_LIMIT_PER_SECOND).build()
}

fn headers_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .max_properties(Some(MAX_HEADERS))
        .property_names(Some(crate::schema::custom_header_name(MAX_HEADER_NAME_LEN)))
        .additional_properties(Some(crate::schema::visible_ascii(MAX_HEADER_VALUE_LEN, false)))
        .build()
}

fn headers_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(headers_schema())
}

/// Any subset of the fields; `rate_limit_per_second: null` removes the limit.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = url_schema)]
    pub url: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = description_schema)]
    pub description: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub enabled: Option<Option<bool>>,
    #[serde(default, deserialize_with = "crate::extract::present_int")]
    #[schema(schema_with = rate_limit_or_null)]
    pub rate_limit_per_second: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = headers_schema)]
    pub headers: Option<Option<EndpointHeaders>>,
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// The new secret; generated when absent.
    #[schema(schema_with = secret_or_null)]
    pub secret: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SecretRotated {
    /// The new current secret.
    pub secret: String,
    /// Until then the previous secret signs too (one signature per secret).
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EndpointSecretView {
    /// The current secret.
    pub secret: String,
    /// Rotated-out secrets that still sign until their `expires_at`, newest first.
    pub previous_secrets: Vec<PreviousSecret>,
}

fn invalid_url(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_url", message).with_field("url")
}

/// Parses the URL and checks every address it leads to against the allow-list: an IP
/// literal directly, a host name through DNS (with [`DNS_TIMEOUT`]), refused if ANY answer
/// is denied, since the connection could go to any of them. Returns the normalised URL,
/// which is what is stored.
pub(crate) async fn check_url(config: &Config, resolver: &Resolver, raw: &str) -> Result<String, ApiError> {
    let url = parse_endpoint_url(raw.trim()).map_err(|e| invalid_url(e.to_string()))?;
    let allow = AllowList::parse(&config.network.allow_cidrs).map_err(|e| {
        tracing::error!(error = %e, "network.allow_cidrs does not parse (config validation should have refused it)");
        ApiError::internal()
    })?;
    let addresses: Vec<IpAddr> = match (url.ip(), url.domain()) {
        (Some(ip), _) => vec![ip],
        (None, Some(domain)) => resolve(resolver, domain).await?,
        (None, None) => return Err(invalid_url("url must have a host")),
    };
    for ip in addresses {
        allow
            .check(ip)
            .map_err(|reason| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "url_not_allowed", reason.to_string()).with_field("url"))?;
    }
    Ok(url.as_str().to_string())
}

/// 422 `url_unresolvable`: the URL is well formed but its host has no address (now).
fn unresolvable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "url_unresolvable", message).with_field("url")
}

async fn resolve(resolver: &Resolver, host: &str) -> Result<Vec<IpAddr>, ApiError> {
    let addresses = tokio::time::timeout(DNS_TIMEOUT, resolver(host))
        .await
        .map_err(|_| unresolvable(format!("the host {host} did not resolve within {} s", DNS_TIMEOUT.as_secs())))?
        .map_err(|e| unresolvable(format!("the host {host} does not resolve: {e}")))?;
    if addresses.is_empty() {
        return Err(unresolvable(format!("the host {host} has no addresses")));
    }
    Ok(addresses)
}

pub(crate) fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Custom headers: at most [`MAX_HEADERS`], names are HTTP tokens, values visible ASCII
/// (inner spaces allowed), no hop-by-hop header and none Railhook sets itself; names are
/// case-insensitive, so two that differ only in case are one header given twice.
fn check_headers(headers: &EndpointHeaders) -> Result<(), ApiError> {
    if headers.len() > MAX_HEADERS {
        return Err(ApiError::invalid("headers", format!("at most {MAX_HEADERS} custom headers")));
    }
    let mut seen = BTreeSet::new();
    for (name, value) in headers {
        let field = format!("headers.{name}");
        if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN || !name.bytes().all(is_token_char) {
            return Err(ApiError::invalid(
                field,
                format!("a header name is 1 to {MAX_HEADER_NAME_LEN} letters, digits and !#$%&'*+-.^_`|~"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if railhook_core::signing::is_reserved_header(&lower) {
            return Err(ApiError::invalid(field, format!("{name} is a hop-by-hop header or one Railhook sets itself")));
        }
        if !seen.insert(lower) {
            return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "duplicate_header", format!("{name} is given twice (header names are case-insensitive)"))
                .with_field(field));
        }
        if value.len() > MAX_HEADER_VALUE_LEN
            || !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
            || value.starts_with(' ')
            || value.ends_with(' ')
        {
            return Err(ApiError::invalid(
                field,
                format!("a header value must be visible ASCII (inner spaces allowed), at most {MAX_HEADER_VALUE_LEN} bytes"),
            ));
        }
    }
    Ok(())
}

fn check_description(description: &str) -> Result<&str, ApiError> {
    let description = description.trim();
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::invalid("description", format!("description must be at most {MAX_DESCRIPTION_CHARS} characters")));
    }
    Ok(description)
}

pub(crate) fn check_rate_limit(value: i64) -> Result<i32, ApiError> {
    if !RATE_LIMIT_PER_SECOND.contains(&value) {
        return Err(ApiError::invalid(
            "rate_limit_per_second",
            format!("rate_limit_per_second must be from {} to {} (or null for no limit)", RATE_LIMIT_PER_SECOND.start(), RATE_LIMIT_PER_SECOND.end()),
        ));
    }
    // At most 10 000: fits.
    Ok(value as i32)
}

fn secret_or_generated(given: Option<&str>) -> Result<EndpointSecret, ApiError> {
    match given {
        Some(raw) => EndpointSecret::parse(raw).map_err(|e| ApiError::invalid("secret", format!("secret is not usable: {e}"))),
        None => Ok(EndpointSecret::generate()),
    }
}

/// Create an Endpoint. Its URL must reach an allowed address (DNS answers included); its
/// secret is generated unless given, and is read through `GET /v1/endpoints/{id}/secret`.
#[utoipa::path(post, path = "/v1/endpoints", tag = "endpoints", request_body = CreateEndpoint,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 201, body = Endpoint), BodyErrors))]
pub async fn create(
    Project(principal): Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateEndpoint>,
) -> ApiResult<(StatusCode, Json<Endpoint>)> {
    let description = check_description(body.description.as_deref().unwrap_or(""))?;
    let rate_limit_per_second = body.rate_limit_per_second.map(check_rate_limit).transpose()?;
    let headers = body.headers.unwrap_or_default();
    check_headers(&headers)?;
    let secret = secret_or_generated(body.secret.as_deref())?;
    // Last: it may wait for DNS, and cheaper mistakes should be reported without that wait.
    let url = check_url(&state.config, &state.resolver, &body.url).await?;
    let new = NewEndpoint {
        url: &url,
        description,
        enabled: body.enabled.unwrap_or(true),
        rate_limit_per_second,
        headers: &headers,
        secret: secret.as_str(),
    };
    let client = state.pool.get().await?;
    let endpoint = endpoints::create_endpoint(&**client, principal.project_id, new).await?;
    Ok((StatusCode::CREATED, Json(endpoint)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The project's Endpoints in id order, a page at a time.
#[utoipa::path(get, path = "/v1/endpoints", tag = "endpoints",
    params(("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::EndpointId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Endpoint>), ListErrors))]
pub async fn list(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<List<Endpoint>>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let after = paging.cursor::<EndpointId>()?;
    let client = state.pool.get().await?;
    let rows = endpoints::list_endpoints(&**client, principal.project_id, after, limit + 1).await?;
    Ok(Json(page(rows, limit, |e| e.id.to_string())))
}

#[utoipa::path(get, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = crate::schema::EndpointId, Path, description = "Endpoint id (ep_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Endpoint), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Endpoint>> {
    let id: EndpointId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let endpoint = endpoints::get_endpoint(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("endpoint"))?;
    Ok(Json(endpoint))
}

/// Change any subset of the fields; `rate_limit_per_second: null` removes the limit.
#[utoipa::path(patch, path = "/v1/endpoints/{id}", tag = "endpoints", request_body = UpdateEndpoint,
    params(("id" = crate::schema::EndpointId, Path, description = "Endpoint id (ep_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Endpoint), BodyByIdErrors))]
pub async fn update(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateEndpoint>,
) -> ApiResult<Json<Endpoint>> {
    let id: EndpointId = parse_id("id", &id)?;
    let description = not_null("description", body.description)?;
    let description = description.as_deref().map(check_description).transpose()?;
    let rate_limit_per_second = body.rate_limit_per_second.map(|v| v.map(check_rate_limit).transpose()).transpose()?;
    let headers = not_null("headers", body.headers)?;
    if let Some(headers) = &headers {
        check_headers(headers)?;
    }
    let enabled = not_null("enabled", body.enabled)?;
    let url = match not_null("url", body.url)? {
        Some(raw) => Some(check_url(&state.config, &state.resolver, &raw).await?),
        None => None,
    };
    let changes = EndpointChanges { url: url.as_deref(), description, enabled, rate_limit_per_second, headers: headers.as_ref() };
    let client = state.pool.get().await?;
    let endpoint = endpoints::update_endpoint(&**client, principal.project_id, id, changes)
        .await?
        .ok_or_else(|| ApiError::not_found("endpoint"))?;
    Ok(Json(endpoint))
}

/// Delete the Endpoint with its secrets, Subscriptions and Deliveries.
#[utoipa::path(delete, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = crate::schema::EndpointId, Path, description = "Endpoint id (ep_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 204, description = "Deleted"), ByIdErrors))]
pub async fn delete(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let id: EndpointId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    if endpoints::delete_endpoint(&**client, principal.project_id, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("endpoint"))
    }
}


/// Make a new secret current (generated unless given); the previous one keeps signing for
/// `api.secret_rotation_grace_seconds`. The body is optional: `{"secret": "whsec_..."}`,
/// `{}` or nothing at all.
#[utoipa::path(post, path = "/v1/endpoints/{id}/rotate-secret", tag = "endpoints",
    request_body(content = RotateSecret, description = "Optional; may be left out entirely"),
    params(("id" = crate::schema::EndpointId, Path, description = "Endpoint id (ep_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = SecretRotated), BodyByIdErrors))]
pub async fn rotate_secret(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<SecretRotated>> {
    let id: EndpointId = parse_id("id", &id)?;
    let body: RotateSecret = crate::extract::optional_json(&headers, body).await?;
    let secret = secret_or_generated(body.secret.as_deref())?;
    let mut client = state.pool.get().await?;
    let tx = client.transaction().await?;
    let rotation = endpoints::rotate_secret(&*tx, principal.project_id, id, secret.as_str(), state.config.api.secret_rotation_grace_seconds)
        .await?
        .ok_or_else(|| ApiError::not_found("endpoint"))?;
    tx.commit().await?;
    Ok(Json(SecretRotated { secret: secret.as_str().to_string(), previous_secret_expires_at: rotation.previous_expires_at }))
}

/// The current secret and the rotated-out ones that still sign.
#[utoipa::path(get, path = "/v1/endpoints/{id}/secret", tag = "endpoints",
    params(("id" = crate::schema::EndpointId, Path, description = "Endpoint id (ep_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = EndpointSecretView), ByIdErrors))]
pub async fn secret(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<EndpointSecretView>> {
    let id: EndpointId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let found = endpoints::secrets(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("endpoint"))?;
    let secret = found.current.ok_or_else(|| {
        tracing::error!(endpoint = %id, "endpoint has no current secret");
        ApiError::internal()
    })?;
    Ok(Json(EndpointSecretView { secret, previous_secrets: found.previous }))
}
