//! A Railhook receiver in Rust: [`VerifiedWebhook`] refuses what is not authentic (400/401
//! with a JSON error), [`dedupe`] records the `webhook-id` in the transaction that writes the
//! effect, so a Delivery sent twice has one effect.
//!
//! The effect is a row in `effects`, a ledger with no unique key of its own: only the dedupe
//! keeps an Event from being booked twice. `main.rs` runs it from the environment
//! (`DATABASE_URL`, `WEBHOOK_SECRET`, `PORT`); tests call [`app`] directly.

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use deadpool_postgres::Pool;
use railhook_receiver::{dedupe, VerifiedWebhook, Verifier};
use serde_json::{json, Value};

/// The example's effect table (the dedupe table is the kit's: [`railhook_receiver::migrate`]).
pub const EFFECTS_DDL: &str = "\
CREATE TABLE IF NOT EXISTS effects (
    id          bigserial   PRIMARY KEY,
    webhook_id  text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    data        jsonb,
    receiver    text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
";

#[derive(Clone)]
pub struct AppState {
    /// The Endpoint's secret(s): two during a rotation.
    pub verifier: Verifier,
    /// The receiver's own database, where the dedupe and the effect commit together.
    pub pool: Pool,
}

impl FromRef<AppState> for Verifier {
    fn from_ref(state: &AppState) -> Verifier {
        state.verifier.clone()
    }
}

/// Creates `processed_webhooks` and `effects` if missing.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    let client = pool.get().await?;
    railhook_receiver::migrate(&**client).await?;
    client.batch_execute(EFFECTS_DDL).await?;
    Ok(())
}

/// The receiver's routes: `POST /webhooks`.
pub fn app(state: AppState) -> Router {
    Router::new().route("/webhooks", post(receive)).with_state(state)
}

/// Verified by the extractor before it runs; then the dedupe and the effect in one
/// transaction. `processed` the first time, `duplicate` after; both 200, so Railhook stops.
async fn receive(State(state): State<AppState>, webhook: VerifiedWebhook) -> Result<Json<Value>, AppError> {
    let event: Value = webhook.json().map_err(|e| AppError::BadRequest(format!("body is not JSON: {e}")))?;
    let mut client = state.pool.get().await.map_err(|e| AppError::Unavailable(e.to_string()))?;
    let tx = client.transaction().await?;
    let first = dedupe(&tx, &webhook.id).await?;
    if first {
        tx.execute(
            "INSERT INTO effects (webhook_id, event_id, event_type, data, receiver) VALUES ($1, $2, $3, $4, 'rust')",
            &[&webhook.id, &event["id"].as_str().unwrap_or_default(), &event["type"].as_str().unwrap_or_default(), &event["data"]],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Json(json!({"status": if first { "processed" } else { "duplicate" }})))
}

/// 400 for a body that is not what Railhook sends; 503 when the database failed (nothing was
/// committed, so Railhook's retry is safe and wanted), its message kept out of the answer.
pub enum AppError {
    BadRequest(String),
    Unavailable(String),
}

impl From<tokio_postgres::Error> for AppError {
    fn from(e: tokio_postgres::Error) -> Self {
        AppError::Unavailable(e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::BadRequest(message) => (StatusCode::BAD_REQUEST, Json(json!({"error": {"code": "invalid_body", "message": message}}))).into_response(),
            AppError::Unavailable(detail) => {
                eprintln!("database error: {detail}");
                (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": {"code": "database", "message": "try again"}}))).into_response()
            }
        }
    }
}
