//! A big database for plan tests: the shape of `tests/ui/bigdb` (one Project, 10 Endpoints
//! subscribed to `order.*`, one Delivery per Event over the last 30 days, 8 % FAILED spread
//! over the whole time, 1 % PENDING among the newest 2 %, the rest SUCCESS, ids in creation
//! order), plus what the lifecycle's readers look for: first Attempts PENDING and unclaimed,
//! Deliveries PROCESSING under a Claim (some of them past the stuck timeout), and an old
//! stranded one. `ANALYZE`d, so the planner sees the sizes a production database has.
//!
//! [`plans`] EXPLAINs a statement as a prepared statement, with a custom and with a generic
//! plan (the client libraries prepare their statements, and Postgres switches to the
//! generic plan after five executions when it looks no dearer than the custom ones).

use tokio_postgres::Client;
use uuid::Uuid;

use crate::relay::Fixture;

/// How many Deliveries [`BigDb::new`] makes: `RAILHOOK_BIGDB_ROWS`, or 200,000.
pub fn rows() -> i64 {
    std::env::var("RAILHOOK_BIGDB_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

pub struct BigDb {
    pub db: crate::TestDb,
    pub project: Uuid,
    pub endpoints: Vec<Uuid>,
    pub rows: i64,
}

impl BigDb {
    pub async fn new() -> BigDb {
        let db = crate::TestDb::new().await;
        let client = db.client().await;
        let fixture = Fixture::create(&client, 10).await;
        let n = rows();
        client.batch_execute(&fill_sql(n)).await.expect("fill the big database");
        client.batch_execute("ANALYZE").await.expect("analyze");
        BigDb { project: fixture.project.0, endpoints: fixture.endpoints.iter().map(|e| e.0).collect(), db, rows: n }
    }
}

fn fill_sql(n: i64) -> String {
    format!(
        r#"
CREATE TEMP TABLE eps AS SELECT row_number() OVER (ORDER BY id) - 1 AS n, id, project_id FROM endpoints;
CREATE FUNCTION pg_temp.v7(ts timestamptz, n bigint, kind int) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
  SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(kind), 3, '0') || '8' || lpad(to_hex(n), 15, '0'))::uuid
$$;
DO $$
DECLARE lo bigint := 0; total bigint := {n}; step bigint := 50000; t0 timestamptz := now() - interval '30 days';
BEGIN
  WHILE lo < total LOOP
    INSERT INTO events (id, project_id, event_type, payload, created_at)
    SELECT pg_temp.v7(t0 + g * (interval '30 days' / total), g, 1), (SELECT project_id FROM eps LIMIT 1),
           (ARRAY['order.paid','order.created','order.refunded','order.shipped','order.cancelled'])[1 + g % 5],
           jsonb_build_object('order', 'ord_' || g, 'amount_cents', g % 10000), t0 + g * (interval '30 days' / total)
    FROM generate_series(lo, least(lo + step, total) - 1) g;
    INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, attempt_count, max_attempts, retry_delays,
                            timeout_seconds, next_retry_at, last_error, created_at, updated_at, completed_at,
                            last_announced_at, ladder_started_at, claim_token, claimed_at)
    SELECT pg_temp.v7(ts, g, 2), eps.project_id, pg_temp.v7(ts, g, 1), eps.id,
           s.status::delivery_status, CASE WHEN s.status IN ('PENDING', 'PROCESSING') AND g % 4 = 0 THEN 0 WHEN s.status = 'PENDING' THEN 1 ELSE 1 + (g % 3)::int END,
           8, '{{5,30,120}}', 30,
           -- A quarter of the open ones are first Attempts (no next_retry_at), the rest retries.
           CASE WHEN s.status = 'PENDING' AND g % 4 <> 0 THEN ts + interval '1 hour' END,
           CASE s.status WHEN 'FAILED' THEN 'HTTP 500' END, ts, ts,
           CASE WHEN s.status IN ('SUCCESS','FAILED') THEN ts + interval '150 ms' END,
           ts, ts,
           CASE WHEN s.status = 'PROCESSING' THEN gen_random_uuid() END,
           CASE WHEN s.status = 'PROCESSING' THEN ts + interval '1 second' END
    FROM generate_series(lo, least(lo + step, total) - 1) g
    CROSS JOIN LATERAL (SELECT t0 + g * (interval '30 days' / total) AS ts) t
    CROSS JOIN LATERAL (SELECT CASE WHEN g >= total - total / 50 AND g % 2 = 0 THEN 'PENDING'
                                    WHEN g >= total - total / 50 AND g % 50 = 1 THEN 'PROCESSING'
                                    WHEN g % 25 = 3 OR g % 25 = 4 THEN 'FAILED' ELSE 'SUCCESS' END AS status) s
    JOIN eps ON eps.n = g % 10;
    lo := lo + step;
  END LOOP;
END $$;
-- The Claims of the PROCESSING ones (the claim writes them; here they are made directly).
INSERT INTO delivery_claims (project_id, endpoint_id, delivery_id, claim_token, claimed_at)
SELECT d.project_id, d.endpoint_id, d.id, d.claim_token, d.claimed_at
FROM open_deliveries o JOIN deliveries d ON d.id = o.delivery_id WHERE d.status = 'PROCESSING';
"#
    )
}

/// The plans of `sql` for the arguments `args` (SQL literals, comma-separated, one per
/// parameter), custom then generic, each as EXPLAIN prints it.
pub async fn plans(client: &Client, sql: &str, args: &str) -> (String, String) {
    let name = format!("p{}", &Uuid::new_v4().simple().to_string()[..12]);
    client.batch_execute(&format!("PREPARE {name} AS {sql}")).await.unwrap_or_else(|e| panic!("prepare {sql}: {e}"));
    let execute = if args.is_empty() { name.clone() } else { format!("{name}({args})") };
    let mut out = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        client.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan cache mode");
        let rows = client.query(&format!("EXPLAIN EXECUTE {execute}"), &[]).await.unwrap_or_else(|e| panic!("explain {sql}: {e}"));
        out.push(rows.iter().map(|r| r.get::<_, String>(0) + "\n").collect::<String>());
    }
    client.batch_execute(&format!("DEALLOCATE {name}; RESET plan_cache_mode")).await.expect("deallocate");
    let generic = out.pop().unwrap_or_default();
    let custom = out.pop().unwrap_or_default();
    (custom, generic)
}

/// The estimated total cost of a plan (its first line's `cost=startup..total`).
fn total_cost(plan: &str) -> f64 {
    plan.lines()
        .next()
        .and_then(|l| l.split("cost=").nth(1))
        .and_then(|c| c.split("..").nth(1))
        .and_then(|c| c.split_whitespace().next())
        .and_then(|c| c.parse().ok())
        .unwrap_or(f64::INFINITY)
}

/// Asserts that the plans of `sql` Postgres may use read neither `deliveries` nor `events`
/// whole, and that each names every index or table in `uses`: the custom plan always; the
/// generic plan when its estimated cost is at most the custom plan's (Postgres switches to
/// it after five executions only then; a generic plan of a statement with optional filters,
/// `$n IS NULL OR ...`, is often a sequential scan that is never chosen).
pub async fn assert_index_plans(client: &Client, what: &str, sql: &str, args: &str, uses: &[&str]) {
    let (custom, generic) = plans(client, sql, args).await;
    let mut chosen = vec![("custom", &custom)];
    if total_cost(&generic) <= total_cost(&custom) {
        chosen.push(("generic", &generic));
    }
    for (kind, plan) in chosen {
        for table in ["deliveries", "events"] {
            assert!(!plan.contains(&format!("Seq Scan on {table} ")) && !plan.contains(&format!("Seq Scan on {table}\n")), "{what} ({kind} plan) reads {table} whole:\n{plan}");
        }
        for u in uses {
            assert!(plan.contains(u), "{what} ({kind} plan) does not use {u}:\n{plan}");
        }
    }
}
