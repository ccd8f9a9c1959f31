//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` annotations and
//! the request and response types, served at `GET /openapi.json`.

use axum::Json;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ErrorDetail};
use crate::schema;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some("Project API key (`rhk_...`); `X-API-Key` works too")).build()),
        );
        components.add_security_scheme("api_key_header", SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))));
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some("Operator token, RAILHOOK_ADMIN_TOKEN")).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Railhook API", description = "Self-hosted webhook gateway: ingest events, manage endpoints and subscriptions, inspect deliveries and retry Failed Messages; receive providers' webhooks through Sources and forward them to Destinations."),
    paths(
        crate::admin::create_organization,
        crate::admin::create_project,
        crate::admin::get_project,
        crate::admin::update_project,
        crate::api_keys::create,
        crate::api_keys::list,
        crate::api_keys::revoke,
        crate::events::create,
        crate::events::list,
        crate::events::get,
        crate::endpoints::create,
        crate::endpoints::list,
        crate::endpoints::get,
        crate::endpoints::update,
        crate::endpoints::delete,
        crate::endpoints::rotate_secret,
        crate::endpoints::secret,
        crate::subscriptions::create,
        crate::subscriptions::list,
        crate::subscriptions::get,
        crate::subscriptions::update,
        crate::subscriptions::delete,
        crate::deliveries::list,
        crate::deliveries::get,
        crate::deliveries::attempts,
        crate::deliveries::retry,
        crate::deliveries::failed,
        crate::deliveries::retry_failed,
        crate::sources::create,
        crate::sources::list,
        crate::sources::get,
        crate::sources::update,
        crate::sources::disable,
        crate::sources::delete,
        crate::sources::rotate_secret,
        crate::sources::create_destination,
        crate::sources::list_destinations,
        crate::sources::get_destination,
        crate::sources::update_destination,
        crate::sources::delete_destination,
        crate::incoming::list,
        crate::incoming::get,
        crate::forwards::replay,
        crate::forwards::retry,
        crate::forwards::failed,
        crate::forwards::retry_failed,
        crate::replays::create,
        crate::replays::list,
        crate::replays::get,
        crate::replays::cancel,
        crate::ingress::receive,
    ),
    components(schemas(
        ErrorBody,
        ErrorDetail,
        schema::OrganizationId,
        crate::admin::ProjectIdSchema,
        schema::ApiKeyId,
        schema::EventId,
        schema::EndpointId,
        schema::SubscriptionId,
        schema::DeliveryId,
        schema::AttemptId,
        schema::SourceId,
        schema::IncomingEventId,
        schema::DestinationId,
        schema::ForwardId,
        schema::ReplayId,
        schema::Limit,
        schema::Time,
        schema::EventType,
        schema::EventTypePattern,
        schema::DeliveryStatus,
        schema::JsonValue,
        crate::events::IdempotencyKey,
        crate::deliveries::FailedMessageFilter,
        crate::deliveries::BulkRetry,
        crate::forwards::FailedForwardsFilter,
        crate::forwards::BulkForwardRetry,
        crate::sources::DestinationAuthInput,
    )),
    modifiers(&Security)
)]
pub struct ApiDoc;

pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
