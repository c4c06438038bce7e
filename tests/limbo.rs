//! Batches two collectors may both hold, produced deterministically with a
//! raw-protocol client in place of an agent, against real `flopwatch`
//! collector processes: the commit-then-die case settles to exactly one
//! copy, and a peer that never answers leaves the batch kept after the
//! limbo timeout.

use flopwatch_proto::clock::Deadline;
use flopwatch_proto::v1::{
    self, agent_message, collector_message, ingest_client::IngestClient, AgentMessage,
};
use flopwatch_tests::procs::*;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

static SERIAL: Mutex<()> = Mutex::new(());

const GPU: &str = "GPU-raw-0";

/// An Ingest stream opened as an agent would: Hello, then Welcome.
struct RawAgent {
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<v1::CollectorMessage>,
    acked: u64,
}

impl RawAgent {
    async fn connect(url: &str) -> Self {
        let mut client = IngestClient::connect(url.to_string()).await.unwrap();
        let (tx, rx) = mpsc::channel(16);
        tx.send(AgentMessage {
            msg: Some(agent_message::Msg::Hello(v1::Hello {
                agent_id: "raw-agent".into(),
                node: Some(v1::NodeIdentity {
                    node_id: "raw-node".into(),
                    hostname: "raw-node".into(),
                    boot_id: "boot-1".into(),
                    labels: Default::default(),
                }),
                gpus: vec![v1::GpuInfo {
                    index: 0,
                    uuid: GPU.into(),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut inbound = client
            .stream(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let acked = match inbound.message().await.unwrap() {
            Some(v1::CollectorMessage {
                msg: Some(collector_message::Msg::Welcome(w)),
            }) => w.acked_seq,
            other => panic!("expected a Welcome, got {other:?}"),
        };
        Self { tx, inbound, acked }
    }

    /// Sends batch `seq` (10 power samples from `t0 + seq` s).
    async fn send(&self, seq: u64, t0: i64, uncertain: bool) {
        let ts: Vec<i64> = (0..10).map(|i| t0 + seq as i64 * 1000 + i * 100).collect();
        let batch = v1::Batch {
            seq,
            agent_id: "raw-agent".into(),
            boot_id: "boot-1".into(),
            series: vec![v1::Series {
                gpu_uuid: GPU.into(),
                metric: "power_w".into(),
                values: ts.iter().map(|&t| (t % 500) as f64).collect(),
                timestamps_ms: ts,
                ..Default::default()
            }],
            uncertain,
            ..Default::default()
        };
        self.tx
            .send(AgentMessage {
                msg: Some(agent_message::Msg::Batch(batch)),
            })
            .await
            .unwrap();
    }

    /// The next acknowledged sequence number.
    async fn ack(&mut self) -> u64 {
        match self.inbound.message().await.unwrap() {
            Some(v1::CollectorMessage {
                msg: Some(collector_message::Msg::Ack(a)),
            }) => a.seq,
            other => panic!("expected an Ack, got {other:?}"),
        }
    }
}

/// Timestamps of the GPU's power series: one collector's own data
/// (`local_only`) or the fleet's through it.
async fn stored(url: &str, local_only: bool) -> Vec<i64> {
    let mut q = query(url).await;
    series_ts(&mut q, GPU, "power_w", local_only)
        .await
        .unwrap_or_default()
}

/// Waits until `cond` holds for the value of `name` on `/metrics` at
/// `addr`, at most `limit`.
fn wait_metric(addr: &str, name: &str, limit: Duration, cond: impl Fn(f64) -> bool) -> f64 {
    let until = Deadline::after(limit);
    loop {
        if let Some(v) = scrape_opt(addr, name).filter(|v| cond(*v)) {
            return v;
        }
        assert!(
            !until.passed(),
            "{name} at {addr}: {:?} after {limit:?}",
            scrape_opt(addr, name)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn outcome(o: &str) -> String {
    format!("flopwatch_limbo_settled_batches_total{{outcome=\"{o}\"}}")
}

#[test]
fn a_batch_committed_by_a_collector_that_died_before_acking_is_kept_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 2);
    let (a_url, b_url) = (specs[0].url(), specs[1].url());
    let a = start_collector(&specs[0], 0);
    let mut b = start_collector(&specs[1], 1);
    let b_metrics = collector_metrics(&mut b);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = now_ms() - 60_000;

    // Batch 1 reaches A and is committed; its ack would reach the agent
    // only now, but A is killed first (the client reads the ack only to
    // know the commit happened; the agent it plays never saw it).
    rt.block_on(async {
        let mut to_a = RawAgent::connect(&a_url).await;
        assert_eq!(to_a.acked, 0);
        to_a.send(1, t0, false).await;
        assert_eq!(to_a.ack().await, 1);
    });
    a.kill9();

    // The agent moves to B and resends what was on the wire to A, flagged:
    // batch 1 (committed by A) and batch 2 (never reached it); then a new
    // batch 3.
    rt.block_on(async {
        let mut to_b = RawAgent::connect(&b_url).await;
        assert_eq!(to_b.acked, 0, "B knows nothing of this agent");
        to_b.send(1, t0, true).await;
        to_b.send(2, t0, true).await;
        to_b.send(3, t0, false).await;
        for want in 1..=3 {
            assert_eq!(to_b.ack().await, want);
        }
    });
    assert_eq!(
        scrape(&b_metrics, "flopwatch_limbo_committed_batches_total"),
        2.0
    );
    // With A down, B cannot settle: both stay in limbo, and readable.
    wait_metric(
        &b_metrics,
        "flopwatch_cluster_peer_errors_total",
        Duration::from_secs(30),
        |v| v >= 1.0,
    );
    assert_eq!(scrape(&b_metrics, "flopwatch_limbo_batches"), 2.0);
    assert_eq!(rt.block_on(stored(&b_url, true)).len(), 30);

    // A comes back holding batch 1: B drops its copy of 1 and keeps 2.
    let a = start_collector(&specs[0], 0);
    wait_metric(
        &b_metrics,
        "flopwatch_limbo_batches",
        Duration::from_secs(30),
        |v| v == 0.0,
    );
    assert_eq!(scrape(&b_metrics, &outcome("dropped")), 1.0);
    assert_eq!(scrape(&b_metrics, &outcome("kept")), 1.0);
    assert_eq!(scrape(&b_metrics, &outcome("timed_out")), 0.0);
    let batch = |seq: i64| -> Vec<i64> { (0..10).map(|i| t0 + seq * 1000 + i * 100).collect() };
    let (on_a, on_b, fleet_a, fleet_b) = rt.block_on(async {
        (
            stored(&a_url, true).await,
            stored(&b_url, true).await,
            stored(&a_url, false).await,
            stored(&b_url, false).await,
        )
    });
    assert_eq!(on_a, batch(1), "A holds batch 1 only");
    assert_eq!(on_b, [batch(2), batch(3)].concat(), "B holds 2 and 3");
    let all = [batch(1), batch(2), batch(3)].concat();
    assert_eq!(fleet_a, all, "the fleet answer shows each sample once");
    assert_eq!(fleet_b, all);
    // The acked numbers are unchanged: a replay is a duplicate on both.
    rt.block_on(async {
        assert_eq!(RawAgent::connect(&a_url).await.acked, 1);
        assert_eq!(RawAgent::connect(&b_url).await.acked, 3);
    });
    drop(a);
}

#[test]
fn limbo_without_every_peers_answer_is_kept_after_the_timeout() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    // Collector 0 is never started: its answer never comes.
    let specs = cluster_with(root.path(), 2, "limbo_timeout = \"3s\"");
    let url = specs[1].url();
    let mut b = start_collector(&specs[1], 1);
    let metrics = collector_metrics(&mut b);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t0 = now_ms() - 60_000;
    rt.block_on(async {
        let mut agent = RawAgent::connect(&url).await;
        agent.send(1, t0, true).await;
        assert_eq!(agent.ack().await, 1);
    });
    wait_metric(
        &metrics,
        &outcome("timed_out"),
        Duration::from_secs(30),
        |v| v == 1.0,
    );
    assert_eq!(scrape(&metrics, "flopwatch_limbo_batches"), 0.0);
    assert!(scrape(&metrics, "flopwatch_cluster_peer_errors_total") >= 1.0);
    assert_eq!(
        rt.block_on(stored(&url, true)).len(),
        10,
        "kept as a normal commit"
    );
    assert_eq!(b.count_lines("limbo timeout"), 1, "logged:\n{}", b.log());
}
