//! The private Postgres cluster: logical WAL, a committed row survives a fast restart, the
//! same port answers after it, and Drop removes the folder.

use railhook_testkit::pg::PgCluster;

async fn client(url: &str) -> tokio_postgres::Client {
    railhook_testkit::connect(url).await.expect("connect to the private Postgres")
}

#[tokio::test]
async fn private_cluster_is_logical_and_survives_a_fast_restart() {
    let mut pg = PgCluster::start().await;
    let port = pg.port();
    let dir = pg.dir().to_path_buf();
    {
        let db = client(&pg.url("postgres")).await;
        let level: String = db.query_one("SHOW wal_level", &[]).await.unwrap().get(0);
        assert_eq!(level, "logical");
        db.batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (7)").await.unwrap();
    }
    pg.fast_restart().await;
    assert_eq!(pg.port(), port);
    let db = client(&pg.url("postgres")).await;
    let v: i32 = db.query_one("SELECT v FROM t", &[]).await.unwrap().get(0);
    assert_eq!(v, 7);
    drop(db);
    pg.stop().await;
    assert!(railhook_testkit::connect(&pg.url("postgres")).await.is_err(), "a stopped cluster refuses connections");
    drop(pg);
    if std::env::var("RAILHOOK_PG_KEEP").is_err() {
        assert!(!dir.exists(), "{} is removed on drop", dir.display());
    }
}
