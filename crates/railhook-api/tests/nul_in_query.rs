//! A NUL in a free-text query parameter or path segment: no stored value can hold one (Postgres `text`
//! cannot), so it matches nothing; it is neither sent to Postgres (which refuses it, a 500)
//! nor refused (the OpenAPI document allows any string there).

mod common;

use common::Api;

#[tokio::test]
async fn a_nul_in_provider_event_id_matches_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    for raw in ["%00", "a%00b", "evt_1%00"] {
        let (status, body) = api.get(&p.key, &format!("/v1/incoming-events?provider_event_id={raw}")).await;
        assert_eq!(status, 200, "{raw}: {body}");
        assert_eq!(body["data"], serde_json::json!([]), "{raw}: {body}");
    }
}

#[tokio::test]
async fn a_nul_in_an_ingress_token_is_an_unknown_token() {
    let api = Api::start().await;
    for raw in ["%00", "abc%00def"] {
        let resp = api.http.post(api.url(&format!("/ingress/{raw}"))).body("{}").send().await.unwrap();
        assert_eq!(resp.status(), 404, "{raw}: {:?}", resp.text().await);
    }
}
