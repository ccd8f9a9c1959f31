//! `dedupe` against a real Postgres (`RAILHOOK_TEST_PG_URL`, as the rest of the workspace's
//! tests; `scripts/test` sets it): a fresh database per test, an effect table without a
//! unique key of its own, so only `processed_webhooks` keeps the effect single.


use std::time::Duration;

use railhook_receiver::{dedupe, migrate, prune};
use tokio_postgres::{Client, NoTls};

fn admin_url() -> String {
    std::env::var("RAILHOOK_TEST_PG_URL").unwrap_or_else(|_| "postgres://railhook@127.0.0.1:54329/postgres".into())
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("cannot reach test Postgres at {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// A new, empty database (`rh_test_` prefix: `scripts/test` drops leftovers) with the
/// receiver's tables.
async fn receiver_db() -> String {
    let admin = connect(&admin_url()).await;
    let name = format!("rh_test_rx_{}", uuid::Uuid::new_v4().simple());
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
    let (base, _) = admin_url().rsplit_once('/').map(|(b, d)| (b.to_string(), d.to_string())).unwrap();
    let url = format!("{base}/{name}");
    let client = connect(&url).await;
    migrate(&client).await.unwrap();
    migrate(&client).await.expect("migrate is idempotent");
    client.batch_execute("CREATE TABLE effects (id bigserial PRIMARY KEY, webhook_id text NOT NULL)").await.unwrap();
    url
}

/// What a handler does: dedupe and the effect in one transaction.
async fn handle(client: &mut Client, webhook_id: &str) -> bool {
    let tx = client.transaction().await.unwrap();
    let first = dedupe(&tx, webhook_id).await.unwrap();
    if first {
        tx.execute("INSERT INTO effects (webhook_id) VALUES ($1)", &[&webhook_id]).await.unwrap();
    }
    tx.commit().await.unwrap();
    first
}

async fn effects(client: &Client, webhook_id: &str) -> i64 {
    client.query_one("SELECT count(*) FROM effects WHERE webhook_id = $1", &[&webhook_id]).await.unwrap().get(0)
}

#[tokio::test]
async fn first_time_true_then_false() {
    let url = receiver_db().await;
    let mut client = connect(&url).await;
    assert!(handle(&mut client, "dlv_a").await);
    assert!(!handle(&mut client, "dlv_a").await);
    assert!(handle(&mut client, "dlv_b").await);
    assert_eq!(effects(&client, "dlv_a").await, 1);
    assert_eq!(effects(&client, "dlv_b").await, 1);
}

#[tokio::test]
async fn a_rolled_back_transaction_records_nothing() {
    let url = receiver_db().await;
    let mut client = connect(&url).await;
    {
        let tx = client.transaction().await.unwrap();
        assert!(dedupe(&tx, "dlv_crash").await.unwrap());
        tx.execute("INSERT INTO effects (webhook_id) VALUES ('dlv_crash')", &[]).await.unwrap();
        tx.rollback().await.unwrap();
    }
    // The retry acts: the effect happens once, not zero times.
    assert!(handle(&mut client, "dlv_crash").await);
    assert_eq!(effects(&client, "dlv_crash").await, 1);
}

/// Two arrivals of one Delivery at once: the second insert waits on the first
/// transaction's row and then finds it; exactly one effect.
#[tokio::test]
async fn concurrent_duplicates_have_one_effect() {
    let url = receiver_db().await;
    let mut first = connect(&url).await;
    let mut second = connect(&url).await;
    let tx1 = first.transaction().await.unwrap();
    assert!(dedupe(&tx1, "dlv_race").await.unwrap());
    let racer = tokio::spawn(async move { handle(&mut second, "dlv_race").await });
    // The second transaction is blocked on the primary key until the first ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!racer.is_finished(), "the duplicate must wait for the first transaction");
    tx1.execute("INSERT INTO effects (webhook_id) VALUES ('dlv_race')", &[]).await.unwrap();
    tx1.commit().await.unwrap();
    assert!(!racer.await.unwrap(), "the duplicate sees the committed id");
    assert_eq!(effects(&first, "dlv_race").await, 1);

    // And many at once through separate connections.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move { handle(&mut connect(&url).await, "dlv_many").await }));
    }
    let mut firsts = 0;
    for t in tasks {
        firsts += t.await.unwrap() as usize;
    }
    assert_eq!(firsts, 1);
    assert_eq!(effects(&first, "dlv_many").await, 1);
}

#[tokio::test]
async fn prune_deletes_only_old_ids() {
    let url = receiver_db().await;
    let mut client = connect(&url).await;
    handle(&mut client, "dlv_old").await;
    handle(&mut client, "dlv_new").await;
    client.execute("UPDATE processed_webhooks SET processed_at = now() - interval '40 days' WHERE webhook_id = 'dlv_old'", &[]).await.unwrap();
    assert_eq!(prune(&client, Duration::from_secs(30 * 86400)).await.unwrap(), 1);
    let left: Vec<String> = client.query("SELECT webhook_id FROM processed_webhooks", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(left, vec!["dlv_new".to_string()]);
}
