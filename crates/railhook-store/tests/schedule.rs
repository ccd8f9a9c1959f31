//! The retry scheduler's re-announcement keeps the round's token (tenth session): a due retry
//! whose hint was not claimed within `worker.retry_reannounce_after_seconds` is announced
//! again with the same scheduler token, so the first hint, when it arrives late (a worker
//! behind, a deep partition), still claims it. With a new token per re-announcement every
//! hint older than the last re-announcement claimed nothing, and a worker more than that far
//! behind never caught up (the 50,000-event chaos run: 1,588 Deliveries stuck, 29,179 futile
//! claims). A hint of an earlier round still claims nothing.

use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::lifecycle::{self as store, ClaimRequest, ClaimResult, Limits};
use railhook_testkit::relay::Fixture;

fn limits() -> Limits {
    Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: true }
}

async fn token(db: &impl tokio_postgres::GenericClient, id: &DeliveryId) -> Option<uuid::Uuid> {
    db.query_one("SELECT claim_token FROM deliveries WHERE id = $1", &[&id.0]).await.unwrap().get(0)
}

fn hint(id: DeliveryId, token: Option<uuid::Uuid>) -> ClaimRequest {
    ClaimRequest { delivery: id, token: ClaimToken::new(), hint: token.map(ClaimToken), wait: false, announced_at: None, position: None }
}

#[tokio::test]
async fn a_reannounced_retry_keeps_its_token_so_the_first_hint_still_claims_it() {
    let (_db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let db = pool.get().await.unwrap();
    let id: DeliveryId = fixture.ingest(&pool, "order.created").await.remove(0).parse().unwrap();
    // Due as a retry (a Delivery back on its ladder, nothing announced for it yet).
    db.execute("UPDATE deliveries SET next_retry_at = now() - interval '1 s', claim_token = NULL, attempt_count = 1 WHERE id = $1", &[&id.0]).await.unwrap();

    assert_eq!(store::schedule_due(&**db, 500, 50, 200, 0.0).await.unwrap(), 1, "announced");
    let first = token(&**db, &id).await.expect("tokened");
    // Not claimed: announced again (reannounce_after 0 s) with the same token.
    assert_eq!(store::schedule_due(&**db, 500, 50, 200, 0.0).await.unwrap(), 1, "announced again");
    assert_eq!(token(&**db, &id).await, Some(first), "the round keeps its token");

    // A hint of another token (an earlier round's) claims nothing; the first hint claims it.
    let stale = store::claim_batch(&db, &[hint(id, Some(uuid::Uuid::new_v4()))], &limits()).await.unwrap();
    assert!(!matches!(stale[0], ClaimResult::Claimed(_)), "{stale:?}");
    let late_first = store::claim_batch(&db, &[hint(id, Some(first))], &limits()).await.unwrap();
    assert!(matches!(late_first[0], ClaimResult::Claimed(_)), "the first hint, late, claims it: {late_first:?}");
    // The re-announcement's hint (same token) finds it claimed.
    let second = store::claim_batch(&db, &[hint(id, Some(first))], &limits()).await.unwrap();
    assert!(!matches!(second[0], ClaimResult::Claimed(_)), "claimed once: {second:?}");
}
