//! `flopwatch-bench tenants`: does a flooding tenant raise another tenant's
//! ack latency?
//!
//! A collector in-process (RocksDB in a temporary directory, WAL on) with
//! two tenants. The quiet tenant's agent sends a batch (8 GPUs × 20
//! metrics × 10 samples) every 100 ms and waits for its ack; its ack latencies are measured three times: alone,
//! while the flooding tenant's `--flood-streams` streams push batches as
//! fast as acks come back (8 in flight each) under the default per-tenant
//! commit slots, and the same flood with the commit slots raised to
//! `--flood-streams` (no fairness gate). Latency is from sending a batch to
//! its ack, over loopback gRPC.

use super::{batch, hello};
use flopwatch_agent::TokioClock;
use flopwatch_collector::digest;
use flopwatch_collector::server;
use flopwatch_config::{CollectorConfig, LimitsOverride, TenantConfig};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::v1::{
    agent_message, collector_message, ingest_client::IngestClient, AgentMessage,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Arguments of `bench tenants`.
#[derive(clap::Args)]
pub(super) struct TenantsArgs {
    /// Streams of the flooding tenant.
    #[arg(long, default_value_t = 16)]
    flood_streams: usize,
    /// How long each phase measures.
    #[arg(long, default_value = "15s")]
    duration: String,
}

struct Phase {
    name: &'static str,
    latencies_ms: Vec<f64>,
    flood_samples: u64,
    seconds: f64,
}

async fn open(
    url: &str,
    token: &str,
    node: &str,
    gpus: usize,
) -> anyhow::Result<(
    mpsc::Sender<AgentMessage>,
    tonic::Streaming<flopwatch_proto::v1::CollectorMessage>,
)> {
    let mut client = IngestClient::connect(url.to_string())
        .await?
        .max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel::<AgentMessage>(16);
    tx.send(AgentMessage {
        msg: Some(agent_message::Msg::Hello(hello(node, gpus))),
    })
    .await?;
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let mut inbound = client.stream(req).await?.into_inner();
    let _welcome = inbound.message().await?;
    Ok((tx, inbound))
}

async fn phase(
    name: &'static str,
    commits: Option<u32>,
    streams: usize,
    duration: Duration,
) -> anyhow::Result<Phase> {
    let dir = super::tempdir_path();
    let tenant = |n: &str, commits: Option<u32>| TenantConfig {
        name: n.into(),
        agent_tokens_sha256: vec![digest(&format!("{n}-token"))],
        limits: LimitsOverride {
            max_concurrent_commits: commits,
            ..Default::default()
        },
        ..Default::default()
    };
    let cfg = CollectorConfig {
        data_dir: dir.clone(),
        tenants: vec![tenant("flooder", commits), tenant("quiet", None)],
        max_batch_bytes: 64 << 20,
        plaintext: true,
        ..Default::default()
    };
    let clock = Arc::new(TokioClock::new());
    let (_collector, srv) = server::Loopback::open(&cfg, clock.clone()).await?;
    let t0 = clock.now_ms() - 3_600_000;
    let stop = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicU64::new(0));
    let mut floods = Vec::new();
    for s in 0..streams {
        let (url, stop, flooded) = (srv.url.clone(), stop.clone(), flooded.clone());
        floods.push(tokio::spawn(async move {
            let node = format!("flood-{s:03}");
            let (tx, mut inbound) = open(&url, "flooder-token", &node, 8).await?;
            let (mut seq, mut in_flight) = (0u64, 0usize);
            loop {
                while in_flight < 8 && !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let b = batch(&node, seq, 8, 20, 50, t0 + seq as i64 * 5000);
                    tx.send(AgentMessage {
                        msg: Some(agent_message::Msg::Batch(b)),
                    })
                    .await?;
                    in_flight += 1;
                }
                if in_flight == 0 {
                    break;
                }
                match inbound.message().await? {
                    Some(m) => {
                        in_flight -= 1;
                        if let Some(collector_message::Msg::Ack(a)) = m.msg {
                            flooded.fetch_add(a.accepted_samples, Ordering::Relaxed);
                        }
                    }
                    None => break,
                }
            }
            anyhow::Ok(())
        }));
    }
    // Let the flood reach its pace before measuring.
    if streams > 0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (tx, mut inbound) = open(&srv.url, "quiet-token", "quiet-node", 8).await?;
    let before = flooded.load(Ordering::Relaxed);
    let started = Stopwatch::start();
    let mut latencies = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut seq = 0u64;
    while started.elapsed() < duration {
        tick.tick().await;
        seq += 1;
        let b = batch("quiet-node", seq, 8, 20, 10, t0 + seq as i64 * 1000);
        let sent = Stopwatch::start();
        tx.send(AgentMessage {
            msg: Some(agent_message::Msg::Batch(b)),
        })
        .await?;
        match inbound.message().await? {
            Some(m) if matches!(m.msg, Some(collector_message::Msg::Ack(_))) => {
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0)
            }
            other => anyhow::bail!("quiet tenant: unexpected reply {other:?}"),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let flood_samples = flooded.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        f.await??;
    }
    srv.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Phase {
        name,
        latencies_ms: latencies,
        flood_samples,
        seconds,
    })
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

pub(super) async fn run(a: TenantsArgs) -> anyhow::Result<()> {
    let duration = Duration::from_millis(crate::parse_ms(&a.duration)? as u64);
    let n = a.flood_streams;
    let phases = [
        phase("quiet tenant alone", None, 0, duration).await?,
        phase(
            "with the flood, default commit slots (2)",
            None,
            n,
            duration,
        )
        .await?,
        phase(
            "with the flood, no gate (slots = flood streams)",
            Some(n as u32),
            n,
            duration,
        )
        .await?,
    ];
    println!(
        "quiet tenant: one 1,600-sample batch every 100 ms, waiting for each ack; flood: {n} streams × 8 in flight × 8,000-sample batches"
    );
    println!("| phase | quiet acks | p50 ms | p99 ms | max ms | flood samples/s acked |");
    println!("|---|---:|---:|---:|---:|---:|");
    for mut p in phases {
        let count = p.latencies_ms.len();
        let (p50, p99, max) = (
            pct(&mut p.latencies_ms, 0.5),
            pct(&mut p.latencies_ms, 0.99),
            pct(&mut p.latencies_ms, 1.0),
        );
        println!(
            "| {} | {count} | {p50:.2} | {p99:.2} | {max:.2} | {:.0} |",
            p.name,
            p.flood_samples as f64 / p.seconds
        );
    }
    Ok(())
}
