//! Every reader of `deliveries` in the store keeps an index plan on a big database
//! (`railhook_testkit::bigdb`, the shape of tests/ui/bigdb) after migration 0032 moved the
//! sets they look for out of the partial indexes on `status`: the retry scheduler, the
//! sweeps, the re-announcements, the gauges, the lists, a person's retries, retention and
//! the Endpoint delete. Each statement is the one the code runs (its constant), EXPLAINed
//! as a prepared statement with a custom and with a generic plan; neither may read
//! `deliveries` or `events` whole. (The UI's and the worker's own statements are checked in
//! their crates; the Endpoint delete's batches in tests/deletes.rs: on this database, where
//! each Endpoint has a tenth of the rows, the planner reads its first 1,000 in a sequential
//! scan with a LIMIT, as it did before migration 0032.)

use railhook_store::lifecycle::schedule;
use railhook_store::{deliveries, lifecycle::manual, retention};
use railhook_testkit::bigdb::{assert_index_plans, BigDb};

#[tokio::test]
async fn every_reader_keeps_an_index_plan_on_a_big_database() {
    let big = BigDb::new().await;
    let c = big.db.client().await;
    let project = format!("'{}'::uuid", big.project);
    let endpoint = format!("'{}'::uuid", big.endpoints[3]);
    let counts: (i64, i64, i64, i64) = {
        let r = c
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'PROCESSING'),
                        count(*) FILTER (WHERE status = 'FAILED') FROM deliveries",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    eprintln!("big database: {} Deliveries, {} PENDING, {} PROCESSING, {} FAILED", counts.0, counts.1, counts.2, counts.3);
    assert!(counts.1 > 0 && counts.2 > 0 && counts.3 > 0);

    let statements: Vec<(&str, &str, String, Vec<&str>)> = vec![
        ("retry scheduler", schedule::SCHEDULE_SQL, "500, 50, 200, 30, 'retry'".into(), vec!["deliveries_due_idx"]),
        ("stuck sweep", schedule::SWEEP_STUCK_SQL, "300, 1000, 'reannounce'".into(), vec!["delivery_claims", "deliveries_pkey"]),
        ("stranded sweep", schedule::SWEEP_STRANDED_SQL, "3600, 1000, 'reannounce'".into(), vec!["open_deliveries", "deliveries_pkey"]),
        ("hard cap", schedule::SWEEP_CAPPED_SQL, "345600, 1000".into(), vec!["open_deliveries", "deliveries_pkey"]),
        ("open rows of ended Deliveries", schedule::SWEEP_CLOSED_SQL, "1000".into(), vec!["open_deliveries"]),
        ("re-announcement after a restart", schedule::REANNOUNCE_AFTER_RESTART_SQL, "1000, 'reannounce'".into(), vec!["open_deliveries"]),
        ("Claims restored", schedule::RESTORE_CLAIMS_SQL, String::new(), vec!["open_deliveries"]),
        ("the relay's re-announcement", schedule::REANNOUNCE_DELIVERIES_SQL, "'00000000-0000-0000-0000-000000000000'::uuid, 5000, 'reannounce'".into(), vec!["open_deliveries_pkey"]),
        ("queue gauges", schedule::QUEUE_GAUGES_SQL, String::new(), vec!["open_deliveries"]),
        ("Deliveries list", deliveries::LIST_SQL, format!("{project}, NULL, NULL, NULL, NULL, NULL, NULL, 51"), vec![]),
        ("Deliveries list, PENDING", deliveries::LIST_SQL, format!("{project}, 'PENDING', NULL, NULL, NULL, NULL, NULL, 51"), vec![]),
        ("Deliveries list, FAILED", deliveries::LIST_SQL, format!("{project}, 'FAILED', NULL, NULL, NULL, NULL, NULL, 51"), vec![]),
        ("Deliveries list, an Endpoint", deliveries::LIST_SQL, format!("{project}, NULL, {endpoint}, NULL, NULL, NULL, NULL, 51"), vec![]),
        ("Failed Messages", deliveries::FAILED_SQL, format!("{project}, NULL, NULL, NULL, NULL, NULL, 51"), vec!["deliveries_failed"]),
        ("Failed Messages, failed in the last hour", deliveries::FAILED_SQL, format!("{project}, NULL, NULL, now() - interval '1 hour', NULL, NULL, 51"), vec![]),
        ("Failed Messages, an Endpoint", deliveries::FAILED_SQL, format!("{project}, {endpoint}, NULL, NULL, NULL, NULL, 51"), vec![]),
        ("bulk retry by filter", manual::BULK_RETRY_SQL, format!("{project}, NULL, 3, NULL, NULL, NULL, NULL, 1000, 'manual_retry'"), vec!["deliveries_failed"]),
        ("bulk retry by ids", manual::BULK_RETRY_SQL, format!("{project}, ARRAY[gen_random_uuid()], 3, NULL, NULL, NULL, NULL, 1, 'manual_retry'"), vec![]),
        ("retry", manual::RETRY_SQL, format!("gen_random_uuid(), {project}, 3, 'manual_retry'"), vec!["deliveries_pkey"]),
        ("retention batch", retention::EVENTS_SQL, format!("{project}, now() - interval '7 days', now() - interval '14 days', '-infinity'::timestamptz, '00000000-0000-0000-0000-000000000000'::uuid, 200, false"), vec!["deliveries_event_idx"]),
        // The claim's concurrency counts (inside railhook_claim_batch, rules.sql).
        (
            "the claim's count per Endpoint",
            "SELECT count(*) FROM delivery_claims c
             JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
             WHERE c.project_id = $1 AND c.endpoint_id = $2 AND NOT coalesce(c.claim_token = ANY ($3), false)",
            format!("{project}, {endpoint}, '{{}}'::uuid[]"),
            vec!["delivery_claims"],
        ),
        (
            "the claim's count per Project",
            "SELECT count(*) FROM delivery_claims c
             JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
             WHERE c.project_id = $1 AND NOT coalesce(c.claim_token = ANY ($2), false)",
            format!("{project}, '{{}}'::uuid[]"),
            vec!["delivery_claims"],
        ),
    ];
    for (what, sql, args, uses) in statements {
        assert_index_plans(&c, what, sql, &args, &uses).await;
    }
}
