//! A payload's numbers read back as they were ingested, through `jsonb` (which keeps a
//! number as exact decimal digits): found by the fuzz run (tests/fuzz/run), where a payload
//! holding 1.7976931348623155e308 was stored, and reading it back failed (the connection
//! dropped on a panic) because serde_json, without `float_roundtrip`, parsed the 309 digits
//! Postgres returned a little above f64::MAX.

mod common;

use common::Api;
use serde_json::json;

#[tokio::test]
async fn extreme_numbers_in_a_payload_read_back_unchanged() {
    let api = Api::start().await;
    let p = api.project().await;
    let numbers = [f64::MAX, 1.797_693_134_862_315_5e308, -1.797_693_134_862_315e308, 5e-324, 2.2250738585072014e-308, 20814.850494384766, 1e21, -0.0];
    for n in numbers {
        let payload = json!({"n": n, "nested": [n, {"m": n}]});
        let (status, created) = api.post(&p.key, "/v1/events", json!({"type": "num.check", "payload": payload})).await;
        assert_eq!(status, 201, "{n}: {created}");
        let id = created["id"].as_str().unwrap();
        let (status, got) = api.get(&p.key, &format!("/v1/events/{id}")).await;
        assert_eq!(status, 200, "{n}: {got}");
        assert_eq!(got["payload"]["n"].as_f64(), Some(n), "{n}: {got}");
        assert_eq!(got["payload"]["nested"][1]["m"].as_f64(), Some(n), "{n}: {got}");
    }
    let (status, list) = api.get(&p.key, "/v1/events?type=num.check").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"].as_array().unwrap().len(), numbers.len());
}
