//! `POST /ingress/{token}`: where providers send. Verify first, then keep the request exactly
//! as it arrived, deduped on the provider's event id, with a Forward (and its announcement)
//! per enabled Destination, in one statement ([`railhook_store::incoming::receive`]).
//!
//! Answers: 202 stored; 200 a provider's resend (nothing written) or Slack's `url_verification`
//! challenge (its value as the body, nothing stored); 401 refused, with only the reason code
//! (`error.code`, e.g. `bad_signature`), counted in `railhook_ingress_refused_total{provider,
//! reason}`; 404 unknown token; 410 disabled Source; 413 body over `ingress.max_body_bytes`;
//! 429 over the Source's `rate_limit_per_second`; 503 when Postgres is unavailable (nothing is
//! half-stored: the statement commits whole or not at all).
//!
//! The Source's rate is counted per API process (a token bucket in memory, one second of
//! burst): with N API processes a Source may get up to N times its rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use prometheus::{IntCounterVec, Opts};
use railhook_core::SourceId;
use railhook_ingress::{IncomingRequest, Provider, ProviderConfig, Refusal, Secret};
use railhook_store::incoming::{self, NewIncomingEvent, Received, StoredHeader};
use tracing::Instrument as _;
use railhook_store::sources::{self, IngressSource};
use serde::Serialize;

use crate::error::{ApiError, ErrorBody};
use crate::AppState;

/// Refused ingress requests, by provider and reason code.
pub const REFUSED_TOTAL: &str = "railhook_ingress_refused_total";
/// Accepted ingress requests, by provider and outcome (`stored`, `duplicate`, `challenge`).
pub const RECEIVED_TOTAL: &str = "railhook_ingress_received_total";

/// The longest token looked up; real ones are 43 characters. Longer is a 404 without a query.
const MAX_TOKEN_LEN: usize = 128;

/// What the ingress route holds besides the API's state.
pub struct Ingress {
    app: AppState,
    refused: IntCounterVec,
    received: IntCounterVec,
    rates: RateLimiter,
}

/// The ingress route, with its own body limit (`ingress.max_body_bytes`, not `api.*`).
pub fn router(app: &AppState) -> Router {
    let refused = IntCounterVec::new(Opts::new(REFUSED_TOTAL, "Ingress requests refused by their Source's verifier, by provider and reason."), &["provider", "reason"])
        .expect("valid metric");
    let received = IntCounterVec::new(Opts::new(RECEIVED_TOTAL, "Ingress requests accepted, by provider and outcome (stored, duplicate, challenge)."), &["provider", "outcome"])
        .expect("valid metric");
    for collector in [&refused, &received] {
        if let Err(e) = app.metrics.registry().register(Box::new(collector.clone())) {
            tracing::warn!(error = %e, "ingress metrics not registered");
        }
    }
    let limit = app.config.ingress.max_body_bytes;
    let ingress = Arc::new(Ingress { app: app.clone(), refused, received, rates: RateLimiter::default() });
    Router::new()
        .route("/ingress/{token}", post(receive))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(move |request: Request, next: axum::middleware::Next| async move {
            let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                return too_large().into_response();
            }
            next.run(request).await
        }))
        .with_state(ingress)
}

fn too_large() -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is larger than the limit (ingress.max_body_bytes)").with_field("body")
}

/// The answer to an accepted request.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct IngressAccepted {
    /// The Incoming Event (`ine_...`): the new one, or the one a resend duplicates.
    pub id: String,
    /// `stored` (202) or `duplicate` (200).
    pub status: &'static str,
}

/// Receive a provider's webhook. Any content type; the body is kept byte for byte.
#[utoipa::path(post, path = "/ingress/{token}", tag = "ingress",
    request_body(content = String, description = "The provider's request, any content type", content_type = "*/*"),
    params(("token" = String, Path, description = "The Source's ingress token")),
    responses(
        (status = 202, description = "Stored, with a Forward per enabled Destination", body = IngressAccepted),
        (status = 200, description = "A resend of a stored event (nothing written), or Slack's url_verification challenge (text/plain)", body = IngressAccepted),
        (status = 401, description = "Refused by the provider's verifier; error.code is the reason (bad_signature, missing_header, malformed_header, timestamp_out_of_tolerance, body_not_parsable, ...)", body = ErrorBody),
        (status = 404, description = "Unknown token", body = ErrorBody),
        (status = 410, description = "The Source is disabled", body = ErrorBody),
        (status = 413, description = "Body over ingress.max_body_bytes", body = ErrorBody),
        (status = 429, description = "Over the Source's rate_limit_per_second (Retry-After: 1)", body = ErrorBody),
        (status = 503, description = "Database unavailable; nothing was stored", body = ErrorBody)))]
pub async fn receive(
    State(ingress): State<Arc<Ingress>>,
    Path(token): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| if e.status() == StatusCode::PAYLOAD_TOO_LARGE { too_large() } else { crate::extract::body_rejection(e) })?;
    // No token is that long or holds a NUL (which Postgres would refuse as a parameter).
    if token.len() > MAX_TOKEN_LEN || token.contains('\0') {
        return Err(unknown_token());
    }
    let client = ingress.app.pool.get().await?;
    let source = sources::source_for_ingress(&client, &token).await?.ok_or_else(unknown_token)?;
    if !source.enabled {
        return Err(ApiError::new(StatusCode::GONE, "source_disabled", "this Source is disabled"));
    }
    if let Some(rate) = source.rate_limit_per_second {
        if !ingress.rates.admit(source.id, rate) {
            let mut response = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "over this Source's rate limit; retry later").into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Ok(response);
        }
    }
    let config = provider_config(&source)?;
    let provider = config.provider();
    let url = public_url(&ingress.app, &headers, &uri);
    let request = IncomingRequest {
        method: method.as_str(),
        url: &url,
        headers: headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect(),
        body: &body,
    };
    let secrets: Vec<Secret> = source.secrets.iter().map(|s| Secret::new(s.as_str())).collect();
    let verified = match railhook_ingress::verifier(&config).verify(&request, &secrets, SystemTime::now()) {
        Ok(verified) => verified,
        Err(refusal) => return Err(ingress.refuse(provider, refusal)),
    };
    if let Some(challenge) = verified.challenge {
        ingress.received.with_label_values(&[provider.as_str(), "challenge"]).inc();
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], challenge).into_response());
    }
    let stored_headers: Vec<StoredHeader> = headers.iter().map(|(n, v)| StoredHeader::new(n.as_str(), v.as_bytes())).collect();
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let new = NewIncomingEvent {
        project: source.project_id,
        source: source.id,
        provider_event_id: verified.event_id.as_deref(),
        method: method.as_str(),
        headers: &stored_headers,
        body: &body,
        content_type: content_type.as_deref(),
        trace: None,
    };
    // Issue 33: the ingest span continues the provider's trace, if it sent one (a malformed
    // traceparent is ignored); the Forwards' announcements carry its context on.
    let remote = railhook_telemetry::traces::incoming(&headers);
    let span = tracing::info_span!(target: railhook_telemetry::traces::TARGET, parent: None, railhook_telemetry::traces::span::INGEST,
        otel.kind = "server", http.request.method = %method, http.route = "/ingress/{token}", railhook.provider = provider.as_str());
    railhook_telemetry::traces::continue_from(&span, remote.as_ref());
    let new = NewIncomingEvent { trace: railhook_telemetry::traces::context_of(&span, remote.as_ref()), ..new };
    let received = incoming::receive(&client, new).instrument(span).await.map_err(|e| {
        // The Source was deleted between the lookup and the insert.
        if matches!(&e, railhook_store::StoreError::Db(db) if db.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION)) {
            unknown_token()
        } else {
            ApiError::from(e)
        }
    })?;
    let (status, id, outcome) = match received {
        Received::Stored { id, .. } => (StatusCode::ACCEPTED, id, "stored"),
        Received::Duplicate { id, .. } => (StatusCode::OK, id, "duplicate"),
    };
    ingress.received.with_label_values(&[provider.as_str(), outcome]).inc();
    Ok((status, Json(IngressAccepted { id: id.to_string(), status: outcome })).into_response())
}

impl Ingress {
    /// A 401 with the reason code alone, counted.
    fn refuse(&self, provider: Provider, refusal: Refusal) -> ApiError {
        self.refused.with_label_values(&[provider.as_str(), refusal.as_str()]).inc();
        ApiError::new(StatusCode::UNAUTHORIZED, refusal.as_str(), "the request was refused")
    }
}

fn unknown_token() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no Source has this ingress URL")
}

/// The Source's verifier configuration. A stored configuration that no longer parses is a
/// fault of ours (the API validated it), hence a 500.
fn provider_config(source: &IngressSource) -> Result<ProviderConfig, ApiError> {
    source
        .provider
        .parse::<Provider>()
        .and_then(|p| ProviderConfig::from_parts(p, source.config.as_ref()))
        .map_err(|e| {
            tracing::error!(source = %source.id, error = %e, "stored provider configuration does not parse");
            ApiError::internal()
        })
}

/// The URL as the provider called it (Twilio, Square and HubSpot sign it): under
/// `ingress.public_url` when set, else `http://` + the `Host` header.
fn public_url(app: &AppState, headers: &HeaderMap, uri: &Uri) -> String {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let base = app.config.ingress.public_url.trim_end_matches('/');
    if base.is_empty() {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        format!("http://{host}{path}")
    } else {
        format!("{base}{path}")
    }
}

/// Per-Source token buckets holding one second of the Source's rate.
#[derive(Default)]
struct RateLimiter {
    buckets: Mutex<HashMap<SourceId, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// Takes one token of `source`'s bucket, refilled at `rate` per second up to `rate`.
    fn admit(&self, source: SourceId, rate: i32) -> bool {
        let rate = f64::from(rate.max(1));
        let now = Instant::now();
        // A poisoned lock only means another request panicked mid-update; the bucket is still usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(source).or_insert(Bucket { tokens: rate, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_holds_one_second_of_the_rate() {
        let limiter = RateLimiter::default();
        let source = SourceId::new();
        assert!((0..5).all(|_| limiter.admit(source, 5)));
        assert!(!limiter.admit(source, 5));
        assert!(limiter.admit(SourceId::new(), 5), "buckets are per Source");
    }
}
