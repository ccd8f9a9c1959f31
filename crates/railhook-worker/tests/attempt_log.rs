//! The attempt log end to end (issue 17): through the relay and the worker to a receiver on
//! 127.0.0.1, each Attempt is recorded with the request headers it sent (the signature the
//! receiver checked, the Endpoint's credential redacted, its other custom headers kept), the
//! response's status, headers and whole body (compressed by Postgres when large), duration and
//! error class.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::*;
use railhook_testkit::relay::Fixture;

/// A 500 page of about 20 KB, as an application server's error page looks.
fn error_page() -> String {
    let mut page = String::from("<!DOCTYPE html><html><head><title>500 Internal Server Error</title></head><body><h1>Internal Server Error</h1><pre>");
    for i in 0..200 {
        page.push_str(&format!("  at com.example.billing.InvoiceService.handle(InvoiceService.java:{})\n", 100 + i));
    }
    page.push_str("</pre></body></html>");
    page
}

#[tokio::test]
async fn each_attempt_keeps_its_request_headers_and_the_whole_response() {
    // The first request gets the error page, the second a small JSON answer.
    let seen: Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>> = Arc::default();
    let n = Arc::new(AtomicUsize::new(0));
    let app = {
        let (seen, n) = (seen.clone(), n.clone());
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let (seen, n) = (seen.clone(), n.clone());
                async move {
                    seen.lock().unwrap().push((headers, body.to_vec()));
                    if n.fetch_add(1, Ordering::SeqCst) == 0 {
                        (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/html"), ("x-request-id", "req-1")], error_page()).into_response()
                    } else {
                        (StatusCode::OK, [("content-type", "application/json")], r#"{"received":true}"#).into_response()
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let sys = System::start(|_| {}).await;
    let (fixture, secrets) = Fixture::create_with(&sys.client, &[url], &spec(&[1], 3, 5)).await;
    sys.client
        .execute(
            "UPDATE endpoints SET headers = '{\"Authorization\": \"Bearer sk_live_abc\", \"X-Tenant\": \"t-1\"}' WHERE id = $1",
            &[&fixture.endpoints[0].0],
        )
        .await
        .unwrap();
    let delivery = fixture.ingest(&sys.pool, "invoice.paid").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 2);

    let id: railhook_core::DeliveryId = delivery.parse().unwrap();
    let rows = sys
        .client
        .query(
            "SELECT attempt_number, status_code, result, duration_ms, request_headers, response_headers, response_body, response_truncated,
                    pg_column_compression(response_body), octet_length(response_body), pg_column_size(response_body)
             FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number",
            &[&id.0],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for (row, (sent, body)) in rows.iter().zip(&seen) {
        let headers: serde_json::Value = row.get(4);
        // What the receiver got, as sent: the signature it verifies among them.
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature", "x-event-id", "content-type", "user-agent"] {
            assert_eq!(headers[name], sent[name].to_str().unwrap(), "{name} in {headers}");
        }
        assert_eq!(headers["webhook-id"], delivery.as_str());
        assert_eq!(headers["x-tenant"], "t-1");
        // The receiver got the credential; the log did not keep it.
        assert_eq!(sent["authorization"], "Bearer sk_live_abc");
        assert_eq!(headers["authorization"], "<redacted>");
        assert!(!headers.to_string().contains("sk_live_abc"), "{headers}");
        assert!(row.get::<_, i32>(3) >= 0);
        // The recorded signature verifies the body that was sent, with the receiver's own
        // Standard Webhooks check.
        let mut recorded = HeaderMap::new();
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            recorded.insert(name, headers[name].as_str().unwrap().parse().unwrap());
        }
        assert!(verifies(&secrets[0], &recorded, body));
    }

    let (first, second) = (&rows[0], &rows[1]);
    assert_eq!((first.get::<_, i32>(0), first.get::<_, Option<i32>>(1), first.get::<_, String>(2)), (1, Some(500), "http_status".to_string()));
    let response_headers: serde_json::Value = first.get(5);
    assert_eq!(response_headers["x-request-id"], "req-1");
    assert_eq!(first.get::<_, String>(6), error_page(), "the whole body, as sent");
    assert!(!first.get::<_, bool>(7));
    // About 20 KB of text: Postgres stored it compressed (lz4, migration 0017).
    assert_eq!(first.get::<_, Option<String>>(8).as_deref(), Some("lz4"));
    let (raw, stored) = (first.get::<_, i32>(9), first.get::<_, i32>(10));
    assert!(stored * 4 < raw, "compressed to {stored} bytes from {raw}");

    assert_eq!((second.get::<_, i32>(0), second.get::<_, Option<i32>>(1), second.get::<_, String>(2)), (2, Some(200), "success".to_string()));
    assert_eq!(second.get::<_, String>(6), r#"{"received":true}"#);
    assert_eq!(second.get::<_, Option<String>>(8), None, "a small row is not compressed");
    sys.stop().await;
}
