//! The private Kafka broker: an outage (stop, produce, restart) holds an idempotent
//! producer's message until the broker is back, and nothing is lost or duplicated.
//! Run with `--nocapture` to see the measured start, stop and restart times.

use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Message, Offset, TopicPartitionList};
use railhook_testkit::kafka::KafkaBroker;

/// The two tests run one at a time, so their timings are not two JVMs fighting for CPU.
static ONE_BROKER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `RAILHOOK_KAFKA_KEEP=1` keeps the broker's folder after drop (for a look at its log).
fn keeps_dir() -> bool {
    std::env::var("RAILHOOK_KAFKA_KEEP").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether a socket with local port `port` is in TIME_WAIT (state 06 in /proc/net/tcp).
fn time_wait_on(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[1].ends_with(&format!(":{port:04X}")) && fields[3] == "06"
    })
}

/// Leaves a server-side TIME_WAIT socket on `addr`: accept a connection, close it from the
/// server side first.
fn leave_server_time_wait(addr: &str) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind(addr).expect("bind the stopped broker's port");
    let mut client = std::net::TcpStream::connect(addr).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    drop(server);
    let mut buf = [0u8; 1];
    assert_eq!(client.read(&mut buf).expect("read EOF"), 0);
    drop(client);
}

async fn create_topic(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&[NewTopic::new(topic, 1, TopicReplication::Fixed(1))], &options)
        .await
        .expect("create topic");
    for r in results {
        r.unwrap_or_else(|(t, code)| panic!("create topic {t}: {code}"));
    }
}

/// Reads partition 0 from the start until `n` messages arrived, then checks that no more come.
async fn consume_all(brokers: &str, topic: &str, n: usize) -> Vec<(i64, String)> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{topic}.reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).expect("assign partition 0");
    let mut got = Vec::new();
    while got.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} messages within 30 s: {got:?}", got.len()))
            .expect("consume");
        got.push((msg.offset(), String::from_utf8_lossy(msg.payload().unwrap_or_default()).into_owned()));
    }
    if let Ok(extra) = tokio::time::timeout(Duration::from_secs(2), consumer.recv()).await {
        let extra = extra.expect("consume");
        panic!("unexpected extra message at offset {}: {:?}", extra.offset(), extra.payload_view::<str>());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_holds_an_idempotent_send_until_the_broker_restarts() {
    let _one = ONE_BROKER_AT_A_TIME.lock().await;
    let t = Instant::now();
    let mut broker = KafkaBroker::start().await;
    let start_time = t.elapsed();
    let brokers = broker.brokers();
    assert_ne!(brokers, railhook_testkit::kafka_brokers(), "a private broker, not the shared one");
    assert!(broker.dir().starts_with(std::env::temp_dir()));
    assert!(broker.log_path().is_file());

    let topic = format!("{}outage", railhook_testkit::topic_prefix());
    create_topic(&brokers, &topic).await;

    // The relay's producer settings.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("message.timeout.ms", "0")
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let before = producer
        .send(FutureRecord::to(&topic).partition(0).key("k").payload("before the outage"), Timeout::After(Duration::from_secs(30)))
        .await
        .map_err(|(e, _)| e)
        .expect("first message acknowledged");
    assert_eq!((before.partition, before.offset), (0, 0));

    let pid = broker.pid().expect("running");
    assert!(broker.is_running());
    let t = Instant::now();
    broker.stop().await;
    let stop_time = t.elapsed();
    assert!(!pid_alive(pid), "pid {pid} still exists after stop");
    assert!(!broker.is_running());
    assert_eq!(broker.pid(), None);
    assert!(std::net::TcpStream::connect(&brokers).is_err(), "something still listens on {brokers}");

    // With message.timeout.ms=0 the send waits for the broker instead of failing.
    // RAILHOOK_TEST_OUTAGE_SECS lengthens the outage (the relay's fault tests use 30 s).
    let outage = Duration::from_secs(std::env::var("RAILHOOK_TEST_OUTAGE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3));
    let mut during = producer
        .send_result(FutureRecord::to(&topic).partition(0).key("k").payload("during the outage"))
        .map_err(|(e, _)| e)
        .expect("enqueue during the outage");
    assert!(
        tokio::time::timeout(outage, &mut during).await.is_err(),
        "a send completed while the broker was down"
    );

    let t = Instant::now();
    broker.restart().await;
    let restart_time = t.elapsed();
    let new_pid = broker.pid().expect("running again");
    assert_ne!(new_pid, pid);

    let t = Instant::now();
    let delivered = tokio::time::timeout(Duration::from_secs(60), during)
        .await
        .expect("the in-flight message acknowledged within 60 s of the restart")
        .expect("delivery future")
        .map_err(|(e, _)| e)
        .expect("the in-flight message delivered");
    let ack_after_restart = t.elapsed();
    assert_eq!((delivered.partition, delivered.offset), (0, 1));

    let got = consume_all(&brokers, &topic, 2).await;
    assert_eq!(got, vec![(0, "before the outage".to_string()), (1, "during the outage".to_string())]);

    eprintln!(
        "private Kafka timings: start {:.1} s, graceful stop {:.1} s, outage {} s, restart {:.1} s, \
         in-flight ack {:.1} s after the restart returned",
        start_time.as_secs_f64(),
        stop_time.as_secs_f64(),
        outage.as_secs(),
        restart_time.as_secs_f64(),
        ack_after_restart.as_secs_f64()
    );

    let dir = broker.dir().to_path_buf();
    drop(producer);
    drop(broker);
    assert!(!pid_alive(new_pid), "pid {new_pid} still exists after drop");
    assert!(keeps_dir() || !dir.exists(), "{} still exists after drop", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_then_restart_recovers_and_drop_cleans_up() {
    let _one = ONE_BROKER_AT_A_TIME.lock().await;
    let mut broker = KafkaBroker::start().await;
    let brokers = broker.brokers();
    let topic = format!("{}killed", railhook_testkit::topic_prefix());
    create_topic(&brokers, &topic).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .create()
        .expect("producer");
    producer
        .send(FutureRecord::to(&topic).partition(0).key("k").payload("before the kill"), Timeout::After(Duration::from_secs(30)))
        .await
        .map_err(|(e, _)| e)
        .expect("acknowledged");

    let pid = broker.pid().expect("running");
    let t = Instant::now();
    broker.kill().await;
    let kill_time = t.elapsed();
    assert!(!pid_alive(pid), "pid {pid} still exists after kill");
    broker.kill().await; // a second kill (or stop) of a stopped broker does nothing
    broker.stop().await;

    // A closed broker connection leaves the broker's port in TIME_WAIT; Kafka binds with
    // SO_REUSEADDR, so the restart must not care.
    leave_server_time_wait(&brokers);
    assert!(time_wait_on(broker.port()), "no TIME_WAIT socket on port {}", broker.port());

    let t = Instant::now();
    broker.restart().await;
    let restart_time = t.elapsed();
    // Acknowledged with acks=all before the kill, so it survived it.
    let got = consume_all(&brokers, &topic, 1).await;
    assert_eq!(got, vec![(0, "before the kill".to_string())]);
    eprintln!(
        "private Kafka timings: SIGKILL {:.2} s, restart after SIGKILL {:.1} s",
        kill_time.as_secs_f64(),
        restart_time.as_secs_f64()
    );

    let pid = broker.pid().expect("running again");
    let dir = broker.dir().to_path_buf();
    drop(broker);
    assert!(!pid_alive(pid), "pid {pid} still exists after drop");
    assert!(keeps_dir() || !dir.exists(), "{} still exists after drop", dir.display());
}
