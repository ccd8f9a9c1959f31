//! Bytes per Attempt (issue 17), measured: the same realistic mix of Attempts written into
//! the attempt log as migration 0005 kept it (no request headers, TOAST's default pglz) and as
//! migration 0017 keeps it (request headers, lz4, partitioned by day), and the steps between,
//! each reported as `pg_total_relation_size` (heap, TOAST and indexes) over rows, with the time
//! its inserts took. Ignored by default (it writes 20,000 Attempts per variant); run with
//!
//! ```text
//! cargo test -p railhook-store --release --test attempt_bytes -- --ignored --nocapture
//! ```
//!
//! The figures are in docs/BENCHMARKS.md ("The attempt log"). One check runs always: the mix
//! is what its doc says.

use std::time::{Duration, Instant};

use railhook_core::pattern::{candidate_patterns, EventType};
use railhook_store::events;
use railhook_testkit::relay::Fixture;
use railhook_testkit::TestDb;
use tokio_postgres::types::Json;
use tokio_postgres::Client;
use uuid::Uuid;

/// Attempts per variant.
const ATTEMPTS: usize = 20_000;
/// Deliveries they belong to (the foreign key needs real ones).
const DELIVERIES: usize = 2_000;

/// A deterministic generator (the same mix in every variant and run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn hex(&mut self, len: usize) -> String {
        (0..len).map(|_| char::from_digit(self.below(16) as u32, 16).unwrap()).collect()
    }
    fn b64(&mut self, len: usize) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..len).map(|_| A[self.below(64) as usize] as char).collect()
    }
}

/// One Attempt's stored content.
struct Row {
    status: Option<i32>,
    result: &'static str,
    error: Option<String>,
    request_headers: serde_json::Value,
    response_headers: serde_json::Value,
    body: String,
    truncated: bool,
}

/// The kind of answer, by share of Attempts (percent), as a gateway's log shows them: most
/// receivers answer 2xx with nothing or a tiny acknowledgement; some echo a JSON receipt;
/// failing ones answer JSON errors, a proxy's small HTML page, an application's error page
/// (a few KB), rarely a large page or dump (cut at the 64 KiB cap); and some never answer.
const MIX: [(&str, u64); 7] = [
    ("2xx tiny (empty, OK, {\"received\":true})", 40),
    ("2xx JSON receipt, 150-700 B", 20),
    ("4xx JSON error, 100-300 B", 10),
    ("5xx proxy HTML page, 150-600 B", 12),
    ("5xx application error page, 2-8 KB", 5),
    ("large page or dump, 20-64 KB", 3),
    ("no response (timeout, connect)", 10),
];

fn kind(rng: &mut Lcg) -> usize {
    let mut roll = rng.below(100);
    for (i, (_, share)) in MIX.iter().enumerate() {
        if roll < *share {
            return i;
        }
        roll -= share;
    }
    unreachable!("the shares add up to 100")
}

fn response_headers(rng: &mut Lcg, content_type: &str, len: usize, server: &str) -> serde_json::Value {
    let mut h = serde_json::json!({
        "content-type": content_type,
        "content-length": len.to_string(),
        "date": format!("Fri, 04 Dec 2026 {:02}:{:02}:{:02} GMT", rng.below(24), rng.below(60), rng.below(60)),
        "server": server,
        "x-request-id": format!("{}-{}-{}", rng.hex(8), rng.hex(4), rng.hex(12)),
        "connection": "keep-alive",
    });
    if rng.below(2) == 0 {
        h["strict-transport-security"] = "max-age=31536000; includeSubDomains".into();
        h["cache-control"] = "no-store".into();
    }
    if rng.below(3) == 0 {
        h["cf-ray"] = format!("{}-FRA", rng.hex(16)).into();
        h["vary"] = "Accept-Encoding".into();
    }
    h
}

fn request_headers(rng: &mut Lcg) -> serde_json::Value {
    let mut h = serde_json::json!({
        "webhook-id": format!("dlv_{}", rng.b64(26)),
        "webhook-timestamp": (1_796_000_000 + rng.below(1_000_000)).to_string(),
        "webhook-signature": format!("v1,{}=", rng.b64(43)),
        "x-event-id": format!("evt_{}", rng.b64(26)),
        "content-type": "application/json",
        "user-agent": "Railhook/0.1.0",
    });
    if rng.below(4) == 0 {
        h["authorization"] = "<redacted>".into();
        h["x-tenant"] = format!("tenant-{}", rng.below(1000)).into();
    }
    h
}

fn stack_trace(rng: &mut Lcg, lines: usize) -> String {
    const FRAMES: [&str; 6] = [
        "at com.example.billing.InvoiceService.handle(InvoiceService.java:{})",
        "at org.springframework.web.servlet.FrameworkServlet.service(FrameworkServlet.java:{})",
        "at jakarta.servlet.http.HttpServlet.service(HttpServlet.java:{})",
        "at org.apache.catalina.core.ApplicationFilterChain.doFilter(ApplicationFilterChain.java:{})",
        "at com.example.webhooks.SignatureFilter.doFilter(SignatureFilter.java:{})",
        "at java.base/java.lang.Thread.run(Thread.java:{})",
    ];
    (0..lines).map(|_| format!("    {}\n", FRAMES[rng.below(6) as usize].replace("{}", &(20 + rng.below(900)).to_string()))).collect()
}

fn row(rng: &mut Lcg) -> Row {
    let request_headers = request_headers(rng);
    let (status, result, error, body, content_type, server): (Option<i32>, &str, Option<String>, String, &str, &str) = match kind(rng) {
        0 => {
            let body = ["", "OK", r#"{"received":true}"#, r#"{"status":"ok"}"#][rng.below(4) as usize].to_string();
            (Some([200, 200, 200, 202, 204][rng.below(5) as usize]), "success", None, body, "application/json", "nginx")
        }
        1 => {
            let items: Vec<String> = (0..rng.below(6)).map(|i| format!(r#"{{"line":{i},"sku":"SKU-{}","qty":{}}}"#, rng.hex(6), rng.below(9) + 1)).collect();
            let body = format!(
                r#"{{"id":"rcpt_{}","object":"webhook_receipt","event":"evt_{}","type":"order.paid","status":"accepted","received_at":"2026-12-04T08:{:02}:{:02}.{:03}Z","items":[{}]}}"#,
                rng.hex(24), rng.b64(26), rng.below(60), rng.below(60), rng.below(1000), items.join(",")
            );
            (Some(200), "success", None, body, "application/json", "gunicorn")
        }
        2 => {
            let (code, message) = [(400, "payload failed validation: field data.amount must be positive"), (401, "invalid signature"), (404, "no such route"), (422, "unsupported event type")][rng.below(4) as usize];
            let body = format!(r#"{{"error":{{"code":{code},"message":"{message}","request_id":"{}"}}}}"#, rng.hex(32));
            (Some(code), "http_status", Some(format!("HTTP {code}")), body, "application/json", "envoy")
        }
        3 => {
            let code = [502, 503, 504][rng.below(3) as usize];
            let reason = match code { 502 => "Bad Gateway", 503 => "Service Temporarily Unavailable", _ => "Gateway Time-out" };
            let mut body = format!("<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n");
            if rng.below(2) == 0 {
                // nginx pads its error pages for old browsers.
                for _ in 0..6 {
                    body.push_str("<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n");
                }
            }
            (Some(code), "http_status", Some(format!("HTTP {code}")), body, "text/html", "nginx")
        }
        4 => {
            let lines = 25 + rng.below(80) as usize;
            let (request, invoice) = (rng.hex(32), rng.hex(12));
            let body = format!(
                "<!DOCTYPE html><html><head><title>500 Internal Server Error</title><style>body{{font-family:sans-serif}}pre{{background:#eee}}</style></head><body><h1>Internal Server Error</h1><p>Request {}</p><pre>java.lang.IllegalStateException: invoice {} not found\n{}</pre></body></html>",
                request, invoice, stack_trace(rng, lines)
            );
            (Some(500), "http_status", Some("HTTP 500".into()), body, "text/html", "Apache-Coyote/1.1")
        }
        5 => {
            let mut body = format!("<!DOCTYPE html><html><body><h1>Debug</h1><pre>request {}\n", rng.hex(32));
            let target = 20_000 + rng.below(48_000) as usize;
            while body.len() < target {
                body.push_str(&stack_trace(rng, 20));
                body.push_str(&format!("context: {{\"user\": \"u_{}\", \"order\": \"ord_{}\", \"amount\": {}}}\n", rng.hex(10), rng.hex(10), rng.below(100_000)));
            }
            body.truncate(64 * 1024);
            (Some(500), "http_status", Some("HTTP 500".into()), body, "text/html", "Werkzeug/3.0")
        }
        _ => {
            let (result, error) = if rng.below(2) == 0 {
                ("timeout", "no response status line and headers within 30000 ms".to_string())
            } else {
                ("connect", format!("tcp connect error: Connection refused (os error 111) to 203.0.113.{}:443", rng.below(255)))
            };
            return Row { status: None, result, error: Some(error), request_headers, response_headers: serde_json::json!({}), body: String::new(), truncated: false };
        }
    };
    let truncated = body.len() >= 64 * 1024;
    let response_headers = response_headers(rng, content_type, body.len(), server);
    Row { status, result, error, request_headers, response_headers, body, truncated }
}

/// The attempt log as migrations 0005 to 0016 kept it, under another name.
const BEFORE_DDL: &str = "
CREATE TABLE {t} (
    id uuid PRIMARY KEY, project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    delivery_id uuid REFERENCES deliveries (id) ON DELETE CASCADE, forward_id uuid REFERENCES forwards (id) ON DELETE CASCADE,
    attempt_number integer NOT NULL, started_at timestamptz NOT NULL, duration_ms integer NOT NULL, status_code integer,
    result text NOT NULL, error_message text, response_headers jsonb, response_body text,
    response_truncated boolean NOT NULL DEFAULT false, {extra}
    CHECK ((delivery_id IS NULL) <> (forward_id IS NULL)));
CREATE INDEX {t}_delivery_idx ON {t} (delivery_id, attempt_number) WHERE delivery_id IS NOT NULL;
CREATE INDEX {t}_forward_idx ON {t} (forward_id, attempt_number) WHERE forward_id IS NOT NULL;";

async fn deliveries(client: &Client, fixture: &Fixture) -> Vec<Uuid> {
    let ty = EventType::parse("order.paid").unwrap();
    let payload = serde_json::json!({"n": 1});
    for _ in 0..DELIVERIES {
        client
            .query(
                events::INGEST_SQL,
                &[&Uuid::now_v7(), &fixture.project.0, &"order.paid", &Json(&payload), &None::<&str>, &vec![0u8; 32], &candidate_patterns(&ty), &events::DEFAULT_OUTGOING_DELAYS.to_vec(), &None::<Vec<u8>>, &None::<&str>, &None::<&str>],
            )
            .await
            .unwrap();
    }
    client.query("SELECT id FROM deliveries", &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// Writes the mix into `table` as the finalise does (one multi-row statement per 500);
/// the time the statements took.
async fn load(client: &Client, table: &str, with_request_headers: bool, project: Uuid, deliveries: &[Uuid], mix: &[Row]) -> Duration {
    let mut rng = Lcg(71);
    let mut took = Duration::ZERO;
    let mut written = 0;
    while written < ATTEMPTS {
        let n = 500.min(ATTEMPTS - written);
        let rows = &mix[written..written + n];
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        let projects = vec![project; n];
        let dl: Vec<Uuid> = (0..n).map(|i| deliveries[(written + i) % deliveries.len()]).collect();
        let numbers: Vec<i32> = (0..n).map(|i| ((written + i) / deliveries.len()) as i32 + 1).collect();
        let started_at = vec![chrono::Utc::now(); n];
        let durations: Vec<i32> = (0..n).map(|_| rng.below(2_000) as i32).collect();
        let codes: Vec<Option<i32>> = rows.iter().map(|r| r.status).collect();
        let results: Vec<&str> = rows.iter().map(|r| r.result).collect();
        let errors: Vec<Option<&str>> = rows.iter().map(|r| r.error.as_deref()).collect();
        let response_headers: Vec<&serde_json::Value> = rows.iter().map(|r| &r.response_headers).collect();
        let bodies: Vec<&str> = rows.iter().map(|r| r.body.as_str()).collect();
        let truncated: Vec<bool> = rows.iter().map(|r| r.truncated).collect();
        let request_headers: Vec<Option<&serde_json::Value>> = rows.iter().map(|r| with_request_headers.then_some(&r.request_headers)).collect();
        let (columns, extra_param) = if with_request_headers { (", request_headers", ", $13::jsonb[]") } else { ("", "") };
        let sql = format!(
            "INSERT INTO {table} (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result, error_message,
                                  response_headers, response_body, response_truncated{columns})
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int[], $5::timestamptz[], $6::int[], $7::int[], $8::text[],
                                  $9::text[], $10::jsonb[], $11::text[], $12::bool[]{extra_param})"
        );
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&ids, &projects, &dl, &numbers, &started_at, &durations, &codes, &results, &errors, &response_headers, &bodies, &truncated];
        if with_request_headers {
            params.push(&request_headers);
        }
        let started = Instant::now();
        client.execute(&sql, &params).await.unwrap();
        took += started.elapsed();
        written += n;
    }
    took
}

/// Heap, TOAST and indexes of `table` (of each partition, for a partitioned one).
async fn bytes(client: &Client, table: &str) -> i64 {
    client
        .query_one(
            "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree(c.oid))
                         ELSE pg_total_relation_size(c.oid) END
             FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&table],
        )
        .await
        .unwrap()
        .get(0)
}

#[test]
fn the_mix_adds_up() {
    assert_eq!(MIX.iter().map(|(_, share)| share).sum::<u64>(), 100);
    let mut rng = Lcg(17);
    let rows: Vec<Row> = (0..2_000).map(|_| row(&mut rng)).collect();
    assert!(rows.iter().all(|r| r.body.len() <= 64 * 1024));
    let no_answer = rows.iter().filter(|r| r.status.is_none()).count();
    assert!((100..300).contains(&no_answer), "about a tenth never answered: {no_answer}");
}

#[tokio::test]
#[ignore = "a measurement: writes 20,000 Attempts per variant; see the module doc"]
async fn bytes_per_attempt() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let fixture = Fixture::create(&client, 1).await;
    let deliveries = deliveries(&client, &fixture).await;
    railhook_store::attempts::ensure_partitions(&client, chrono::Utc::now(), 1).await.unwrap();

    // The mix itself, raw.
    let mut rng = Lcg(17);
    let rows: Vec<Row> = (0..ATTEMPTS).map(|_| row(&mut rng)).collect();
    let body_bytes: usize = rows.iter().map(|r| r.body.len()).sum();
    let request_bytes: usize = rows.iter().map(|r| r.request_headers.to_string().len()).sum();
    let response_bytes: usize = rows.iter().map(|r| r.response_headers.to_string().len()).sum();
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.body.len()).collect();
    sizes.sort_unstable();
    println!(
        "mix: {ATTEMPTS} Attempts; response body mean {} B (median {} B, p90 {} B, p99 {} B, max {} B); request headers mean {} B; response headers mean {} B (as JSON text)",
        body_bytes / ATTEMPTS, sizes[ATTEMPTS / 2], sizes[ATTEMPTS * 9 / 10], sizes[ATTEMPTS * 99 / 100], sizes[ATTEMPTS - 1],
        request_bytes / ATTEMPTS, response_bytes / ATTEMPTS
    );
    for (what, share) in MIX {
        println!("  {share:>3} %  {what}");
    }

    let variants: [(&str, &str, bool, &str); 4] = [
        ("before (0005-0016: no request headers, pglz)", "attempts_before", false, ""),
        ("request headers, pglz", "attempts_pglz", true, "request_headers jsonb,"),
        ("request headers, lz4, not partitioned", "attempts_lz4", true, "request_headers jsonb COMPRESSION lz4,"),
        ("after (0017: request headers, lz4, partitioned)", "attempts", true, ""),
    ];
    for (_, table, _, extra) in &variants {
        if *table != "attempts" {
            client.batch_execute(&BEFORE_DDL.replace("{t}", table).replace("{extra}", extra)).await.unwrap();
            if extra.contains("lz4") {
                for column in ["error_message", "response_headers", "response_body"] {
                    client.batch_execute(&format!("ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")).await.unwrap();
                }
            }
        }
    }
    println!("{:<50} {:>12} {:>10} {:>10} {:>12}", "variant", "total bytes", "B/Attempt", "vs before", "insert time");
    let mut before = 0.0;
    for (name, table, with_request_headers, _) in variants {
        let took = load(&client, table, with_request_headers, fixture.project.0, &deliveries, &rows).await;
        let total = bytes(&client, table).await;
        let per = total as f64 / ATTEMPTS as f64;
        if before == 0.0 {
            before = per;
        }
        println!("{name:<50} {total:>12} {per:>10.0} {:>9.0} % {:>9} ms", 100.0 * per / before, took.as_millis());
    }
    for r in client
        .query(
            "SELECT coalesce(pg_column_compression(response_body), 'none'), count(*), sum(octet_length(response_body))::bigint,
                    sum(pg_column_size(response_body))::bigint
             FROM attempts GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
    {
        let (method, n, raw, stored): (String, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        println!("after: response bodies stored {method}: {n} Attempts, {raw} bytes of body in {stored} bytes ({:.1}x)", raw as f64 / stored.max(1) as f64);
    }

    // The compression's CPU: the large bodies compressed again and again, pglz and lz4 in
    // turn. They come from a table that keeps them uncompressed: a value copied from a
    // compressed column keeps its compression, whatever the target column's.
    client
        .batch_execute(
            "CREATE TABLE bodies_pglz (b text COMPRESSION pglz); CREATE TABLE bodies_lz4 (b text COMPRESSION lz4);
             CREATE TABLE bodies_raw (b text); ALTER TABLE bodies_raw ALTER COLUMN b SET STORAGE EXTERNAL;
             INSERT INTO bodies_raw SELECT response_body || '' FROM attempts WHERE octet_length(response_body) > 2000;",
        )
        .await
        .unwrap();
    let mut took = [Duration::ZERO; 2];
    for _ in 0..3 {
        for (i, table) in ["bodies_pglz", "bodies_lz4"].iter().enumerate() {
            client.batch_execute(&format!("TRUNCATE {table}")).await.unwrap();
            let started = Instant::now();
            client.batch_execute(&format!("INSERT INTO {table} SELECT b FROM bodies_raw")).await.unwrap();
            took[i] += started.elapsed();
        }
    }
    let row = client.query_one("SELECT pg_total_relation_size('bodies_pglz'), pg_total_relation_size('bodies_lz4'), count(*) FROM bodies_raw", &[]).await.unwrap();
    let (pglz, lz4, n): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    println!(
        "compressing the {n} large bodies 3 times: pglz {} ms ({pglz} bytes), lz4 {} ms ({lz4} bytes)",
        took[0].as_millis(), took[1].as_millis()
    );
}
