//! The generated OpenAPI document covers every route, and every documented route exists.

mod common;

use common::Api;

/// Every (method, path) the router serves under /v1 (and the ingress), with the response codes its document
/// declares. Adding a route means adding it here, and the test below then demands its
/// documentation; the codes pin what the shared error responses expand to.
const ROUTES: &[(&str, &str, &str)] = &[
    ("post", "/v1/admin/organizations", "201 400 401 403 413 415 422 503"),
    ("post", "/v1/admin/organizations/{org_id}/projects", "201 400 401 404 413 415 422 503"),
    ("get", "/v1/admin/projects/{project_id}", "200 400 401 403 404 503"),
    ("patch", "/v1/admin/projects/{project_id}", "200 400 401 403 404 413 415 422 503"),
    ("post", "/v1/api-keys", "201 400 401 413 415 422 503"),
    ("get", "/v1/api-keys", "200 401 503"),
    ("delete", "/v1/api-keys/{id}", "204 400 401 404 503"),
    ("post", "/v1/events", "200 201 400 401 409 413 415 422 503"),
    ("get", "/v1/events", "200 400 401 503"),
    ("get", "/v1/events/{id}", "200 400 401 404 503"),
    ("post", "/v1/endpoints", "201 400 401 413 415 422 503"),
    ("get", "/v1/endpoints", "200 400 401 503"),
    ("get", "/v1/endpoints/{id}", "200 400 401 404 503"),
    ("patch", "/v1/endpoints/{id}", "200 400 401 404 413 415 422 503"),
    ("delete", "/v1/endpoints/{id}", "204 400 401 404 503"),
    ("post", "/v1/endpoints/{id}/rotate-secret", "200 400 401 404 413 415 422 503"),
    ("get", "/v1/endpoints/{id}/secret", "200 400 401 404 503"),
    ("post", "/v1/subscriptions", "201 400 401 404 413 415 422 503"),
    ("get", "/v1/subscriptions", "200 400 401 503"),
    ("get", "/v1/subscriptions/{id}", "200 400 401 404 503"),
    ("patch", "/v1/subscriptions/{id}", "200 400 401 404 413 415 422 503"),
    ("delete", "/v1/subscriptions/{id}", "204 400 401 404 503"),
    ("get", "/v1/deliveries", "200 400 401 503"),
    ("get", "/v1/deliveries/{id}", "200 400 401 404 503"),
    ("get", "/v1/deliveries/{id}/attempts", "200 400 401 404 503"),
    ("post", "/v1/deliveries/{id}/retry", "202 400 401 404 409 413 415 422 503"),
    ("get", "/v1/failed-messages", "200 400 401 503"),
    ("post", "/v1/failed-messages/retry", "202 400 401 413 415 422 503"),
    ("get", "/v1/sources", "200 400 401 503"),
    ("post", "/v1/sources", "201 400 401 413 415 422 503"),
    ("delete", "/v1/sources/{id}", "204 400 401 404 503"),
    ("get", "/v1/sources/{id}", "200 400 401 404 503"),
    ("patch", "/v1/sources/{id}", "200 400 401 404 413 415 422 503"),
    ("post", "/v1/sources/{id}/disable", "200 400 401 404 503"),
    ("post", "/v1/sources/{id}/rotate-secret", "200 400 401 404 413 415 422 503"),
    ("get", "/v1/sources/{id}/destinations", "200 400 401 404 503"),
    ("post", "/v1/sources/{id}/destinations", "201 400 401 404 413 415 422 503"),
    ("delete", "/v1/sources/{id}/destinations/{destination_id}", "204 400 401 404 503"),
    ("get", "/v1/sources/{id}/destinations/{destination_id}", "200 400 401 404 503"),
    ("patch", "/v1/sources/{id}/destinations/{destination_id}", "200 400 401 404 413 415 422 503"),
    ("get", "/v1/incoming-events", "200 400 401 503"),
    ("get", "/v1/incoming-events/{id}", "200 400 401 404 503"),
    ("post", "/v1/incoming-events/{id}/replay", "202 400 401 404 409 413 415 422 503"),
    ("post", "/v1/forwards/{id}/retry", "202 400 401 404 409 413 415 422 503"),
    ("get", "/v1/failed-forwards", "200 400 401 503"),
    ("post", "/v1/failed-forwards/retry", "202 400 401 413 415 422 503"),
    ("post", "/v1/replays", "200 202 400 401 404 409 413 415 422 503"),
    ("get", "/v1/replays", "200 400 401 503"),
    ("get", "/v1/replays/{id}", "200 400 401 404 503"),
    ("post", "/v1/replays/{id}/cancel", "200 400 401 404 409 503"),
    ("post", "/ingress/{token}", "200 202 401 404 410 413 429 503"),
];

#[tokio::test]
async fn openapi_document_covers_every_route_with_schemas_and_errors() {
    let api = Api::start().await;
    let resp = api.http.get(api.url("/openapi.json")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let doc: serde_json::Value = resp.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);

    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            documented.push((method.clone(), path.clone()));
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{method} {path}: no responses"));
            let codes = responses.keys().map(String::as_str).collect::<Vec<_>>().join(" ");
            if let Some((_, _, expected)) = ROUTES.iter().find(|(m, p, _)| m == method && p == path) {
                assert_eq!(&codes, expected, "{method} {path}: response codes");
            }
            assert!(responses.keys().any(|c| c.starts_with('2')), "{method} {path}: no success response");
            assert!(responses.keys().any(|c| c.starts_with('4')), "{method} {path}: no error responses");
            for (code, r) in responses {
                if code.starts_with('4') {
                    assert!(r["content"]["application/json"]["schema"].is_object(), "{method} {path} {code}: error without schema");
                }
            }
            // Optional or no JSON body: rotating an Endpoint's secret, disabling a Source,
            // cancelling a Replay; the ingress takes any content type.
            let no_json_body =
                path.ends_with("/v1/endpoints/{id}/rotate-secret") || path.ends_with("/disable") || path.ends_with("/cancel") || path.starts_with("/ingress/");
            if method == "post" && !no_json_body {
                assert!(op["requestBody"]["content"]["application/json"]["schema"].is_object(), "{method} {path}: no request schema");
            }
        }
    }
    for (method, path, _) in ROUTES {
        assert!(documented.iter().any(|(m, p)| m == method && p == path), "{method} {path} is not documented");
    }
    for (method, path) in &documented {
        assert!(ROUTES.iter().any(|(m, p, _)| m == method && p == path), "{method} {path} is documented but not in ROUTES");
        // The router really serves it: anything but route_not_found / method_not_allowed.
        let concrete = path.replace("{org_id}", "org_x").replace("{id}", "x_x").replace("{destination_id}", "x_x").replace("{token}", "x");
        let resp = api.http.request(method.to_uppercase().parse().unwrap(), api.url(&concrete)).send().await.unwrap();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        let code = body["error"]["code"].as_str().unwrap_or("");
        assert!(code != "route_not_found" && code != "method_not_allowed", "{method} {path} is documented but not routed");
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in ["CreateEvent", "Event", "DeliverySummary", "ErrorBody", "CreateNamed", "ProjectCreated", "NewApiKey", "Delivery", "Attempt", "FailedMessage", "RetryDelivery", "BulkRetry", "BulkRetried", "SkippedDelivery", "Source", "CreateSource", "Destination", "DestinationAuthInput", "IncomingEvent", "Forward", "IngressAccepted", "ForwardSummary", "RetryForward", "BulkForwardRetry", "BulkForwardRetried", "SkippedForward", "ReplayIncomingEvent", "Replayed"] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    assert_eq!(doc["components"]["schemas"]["CreateEvent"]["required"], serde_json::json!(["type", "payload"]));
}

/// The document states the constraints the server enforces, from the constants the checks
/// use (crate::schema); tests/fuzz/run checks them against the server.
#[tokio::test]
async fn openapi_states_ids_ranges_lengths_and_enums() {
    let api = Api::start().await;
    let doc: serde_json::Value = api.http.get(api.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let schemas = &doc["components"]["schemas"];
    let param = |path: &str, method: &str, name: &str| {
        let params = doc["paths"][path][method]["parameters"].as_array().unwrap_or_else(|| panic!("{method} {path}: no parameters"));
        params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{method} {path}: no {name}")).clone()
    };
    // Ids in paths and queries: a $ref to the id's schema, whose pattern is the parser's.
    assert_eq!(param("/v1/endpoints/{id}", "get", "id")["schema"]["$ref"], "#/components/schemas/EndpointId");
    assert_eq!(param("/v1/deliveries", "get", "event_id")["schema"]["$ref"], "#/components/schemas/EventId");
    assert_eq!(param("/v1/deliveries", "get", "cursor")["schema"]["$ref"], "#/components/schemas/DeliveryId");
    assert_eq!(schemas["EndpointId"]["pattern"], "^ep_[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$");
    assert_eq!(schemas["EndpointId"]["minLength"], 29);
    // Integer ranges.
    let limit = &schemas["Limit"];
    assert_eq!((limit["minimum"].as_f64(), limit["maximum"].as_f64()), (Some(1.0), Some(railhook_api::pagination::MAX_LIMIT as f64)));
    let rate = &schemas["CreateEndpoint"]["properties"]["rate_limit_per_second"];
    let range = railhook_api::endpoints::RATE_LIMIT_PER_SECOND;
    assert_eq!((rate["minimum"].as_f64(), rate["maximum"].as_f64()), (Some(*range.start() as f64), Some(*range.end() as f64)), "{rate}");
    assert_eq!(rate["type"], serde_json::json!(["integer", "null"]));
    // Lengths, enums, array bounds.
    assert_eq!(schemas["CreateEndpoint"]["properties"]["description"]["oneOf"][1]["maxLength"], railhook_api::endpoints::MAX_DESCRIPTION_CHARS);
    assert_eq!(schemas["DeliveryStatus"]["enum"], serde_json::json!(["PENDING", "PROCESSING", "SUCCESS", "FAILED"]));
    let delays = &schemas["CreateSubscription"]["properties"]["retry_delays"]["oneOf"][1];
    assert_eq!((delays["minItems"].as_u64(), delays["maxItems"].as_u64()), (Some(1), Some(20)), "{delays}");
    assert_eq!(schemas["CreateSubscription"]["properties"]["endpoint_id"]["$ref"], "#/components/schemas/EndpointId");
    // Closed bodies: an unknown field is refused, and the document says so.
    assert_eq!(schemas["CreateEndpoint"]["additionalProperties"], false);
    assert_eq!(schemas["BulkRetry"]["oneOf"][0]["additionalProperties"], false);
    assert_eq!(schemas["CreateReplay"]["required"], serde_json::json!(["from", "to"]));
}
