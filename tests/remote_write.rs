//! Remote write loses nothing across restarts: a collector process
//! forwarding to a Prometheus that is down, killed with `kill -9` and
//! restarted, then stopped with SIGTERM and restarted, while an agent
//! streams a simulated node into it. Once the receiver (Debian's
//! Prometheus 2.42 with its remote-write receiver) comes up, every GPU's
//! OFU series it holds runs from the agent's first batch to its last
//! without a hole: what the collector acknowledged was journaled with the
//! batch, and each restart resumed from the journal.

use flopwatch_proto::clock::Deadline;
use flopwatch_tests::procs::{
    agent_spec, cluster_with, collector_metrics, free_port, scrape_opt, start_agent,
    start_collector, AgentShape,
};
use flopwatch_tests::prom::tool;
use flopwatch_tests::prometheus_peer::{LocalPrometheus, PrometheusOptions};
use serde_json::Value;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_outage_across_kill_and_restart_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let prom_port = free_port();
    let rw = format!(
        "[remote_write]\nurl = \"http://127.0.0.1:{prom_port}/api/v1/write\"\n\
         interval = \"200ms\"\nmin_backoff = \"100ms\"\nmax_backoff = \"500ms\"\n"
    );
    let spec = cluster_with(root.path(), 1, &rw).remove(0);
    let mut collector = start_collector(&spec, 0);
    let agent = agent_spec(
        root.path(),
        0,
        &[spec.url()],
        AgentShape {
            nodes: 1,
            gpus: 2,
            interval_ms: 100,
            flush_ms: 500,
            fsync_ms: 200,
        },
    );
    let mut agent = start_agent(&agent);
    let first = flopwatch_tests::procs::now_ms();
    std::thread::sleep(Duration::from_secs(4));
    // kill -9 in the outage; back after half a second.
    collector.kill9();
    std::thread::sleep(Duration::from_millis(500));
    collector = start_collector(&spec, 0);
    std::thread::sleep(Duration::from_secs(4));
    // A clean stop in the outage.
    collector.term(Duration::from_secs(30));
    collector = start_collector(&spec, 0);
    std::thread::sleep(Duration::from_secs(3));
    agent.proc.term(Duration::from_secs(30));
    let last = flopwatch_tests::procs::now_ms();
    let metrics = collector_metrics(&mut collector);
    let pending = scrape_opt(&metrics, "flopwatch_remote_write_pending_samples").unwrap_or(0.0);
    assert!(pending > 0.0, "the backlog is journaled: {pending}");

    // The receiver comes up; the collector delivers the backlog.
    let dir = root.path().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let mut prom = LocalPrometheus::spawn(&PrometheusOptions {
        binary: tool("prometheus"),
        remote_write_receiver: true,
        ..PrometheusOptions::new(&dir, prom_port)
    })
    .unwrap();
    let http = reqwest::Client::new();
    let url = prom.url();
    prom.wait_ready(
        || http.get(format!("{url}/-/ready")),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let deadline = Deadline::after(Duration::from_secs(60));
    while scrape_opt(&metrics, "flopwatch_remote_write_pending_samples").unwrap_or(1.0) > 0.0 {
        assert!(!deadline.passed(), "the backlog was never delivered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        scrape_opt(
            &metrics,
            "flopwatch_remote_write_dropped_samples_total{reason=\"queue_full\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
    // Every OFU sample Prometheus holds, per GPU.
    let r: Value = http
        .get(format!("{url}/api/v1/query"))
        .query(&[
            ("query", "flopwatch_ofu_ratio[10m]"),
            ("time", &format!("{}", last as f64 / 1000.0 + 5.0)),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .map(|t| serde_json::from_str(&t).unwrap_or(Value::Null))
        .unwrap();
    let series = r["data"]["result"].as_array().cloned().unwrap_or_default();
    assert_eq!(series.len(), 2, "{r}");
    for s in &series {
        let ts: Vec<i64> = s["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v[0].as_f64().unwrap() * 1000.0).round() as i64)
            .collect();
        let gaps: Vec<i64> = ts.windows(2).map(|w| w[1] - w[0]).collect();
        let widest = gaps.iter().copied().max().unwrap_or(0);
        // One point per batch (every 500 ms); a lost stretch would show
        // as a hole of seconds.
        assert!(
            widest <= 1_500,
            "{}: a hole of {widest} ms in {} samples",
            s["metric"],
            ts.len()
        );
        assert!(ts[0] - first <= 2_000, "starts {} ms late", ts[0] - first);
        assert!(
            last - ts[ts.len() - 1] <= 2_000,
            "ends {} ms early",
            last - ts[ts.len() - 1]
        );
    }
    collector.term(Duration::from_secs(30));
}
