//! `flopwatch-bench`: flopwatch's benchmarks and load generators, a
//! binary of their own beside the tests, so the shipped `flopwatch` carries
//! none of them. Each subcommand drives the real agent, collector and
//! binaries (docs/BENCHMARKS.md gives each figure with its command).
//!
//! `ingest` (here): durable ingest throughput of a collector. Starts a
//! collector in-process (RocksDB under `--data-dir` or a temporary
//! directory, WAL on), opens `--streams` Ingest streams over loopback gRPC
//! as agents do, and sends pre-built batches (each `--gpus` × `--metrics`
//! series of `--points` samples, H100 inventory, realistic values) with
//! `--window` batches in flight per stream. Only acknowledged samples count:
//! an ack means durable in RocksDB's WAL. The load generator shares the
//! machine with the collector, so the figure is conservative.
//!
//! The other benchmarks live in the modules below.

mod backpressure;
mod cpus;
mod fleet;
mod hist_line;
mod ledger;
mod peer;
mod prom_query;
mod query;
mod sink;
mod slow_engine;
mod soak;
mod storage;
mod tenants;
mod victoria;

use anyhow::Context;
use flopwatch_agent::TokioClock;
use flopwatch_collector::server;
use flopwatch_config::CollectorConfig;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::metrics::CATALOG;
use flopwatch_proto::v1::{
    self, agent_message, collector_message, ingest_client::IngestClient, AgentMessage,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// The collector's allocator, as in the shipped binary's collector build
/// (cli/src/alloc.rs), so in-process collectors are measured as they run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// flopwatch's benchmarks and load generators.
#[derive(clap::Parser)]
#[command(name = "flopwatch-bench", version, about)]
struct BenchArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Bytes per sample on disk against Prometheus (promtool), and the
    /// 30-day hourly OFU query.
    Storage(storage::StorageArgs),
    /// Another tenant's ack latency, alone and under a flooding tenant.
    Tenants(tenants::TenantsArgs),
    /// The collector's memory while agents push more than its (slowed)
    /// storage takes: agents spool, the collector stays flat.
    Backpressure(backpressure::BackpressureArgs),
    /// Hours of a collector's life in minutes: the real collector and a
    /// fleet of agents on a clock `--warp` times faster than the wall
    /// clock, with ack latency, memory, disk and compaction lag every 5 s.
    Soak(soak::SoakArgs),
    /// A fleet of agents on one collector (streams, memory per stream, ack
    /// latency), and with `--storm` its return after a collector kill -9.
    Fleet(fleet::FleetArgs),
    /// PromQL through the collector's Prometheus API: the fleet-wide query
    /// against Prometheus and VictoriaMetrics on the same samples, and
    /// one GPU's queries with up to 100,000 GPUs' records in the store.
    Query(query::QueryArgs),
    /// The ledger of a month of a fleet over `Query/Ledger`.
    Ledger(ledger::LedgerArgs),
    /// Durable ingest rate (samples/s acknowledged); with `--peer
    /// prometheus`, against a Prometheus fed the same samples in the same
    /// run, and the 30-day OFU query against Prometheus' `query_range`.
    Ingest(IngestArgs),
}

/// Arguments of `bench ingest`.
#[derive(clap::Args)]
struct IngestArgs {
    /// Concurrent agent streams.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// GPUs per stream.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Metrics per GPU (from the catalog).
    #[arg(long, default_value_t = 20)]
    metrics: usize,
    /// Samples per series per batch.
    #[arg(long, default_value_t = 50)]
    points: usize,
    /// Batches in flight per stream.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// How long to measure (each system, with `--peer`).
    #[arg(long, default_value = "20s")]
    duration: String,
    /// RocksDB directory (default: a temporary one, removed after).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Also measure these peers on the same machine, fed the same samples
    /// with the same batch size and concurrency (comma-separated:
    /// `prometheus,victoria-metrics`).
    #[arg(long, value_enum, value_delimiter = ',')]
    peer: Vec<peer::Peer>,
    /// Compaction included: the collector compacts every second while it
    /// ingests, and after the run until it has sealed every hour due; the
    /// rate is the samples acknowledged over both times together.
    #[arg(long)]
    sustained: bool,
    /// With `--peer victoria-metrics`: the server binary.
    #[arg(long, default_value = "victoria-metrics")]
    victoria_metrics: String,
    /// With `--peer`: days of one GPU's OFU at 100 ms for the query
    /// comparison (0 skips it).
    #[arg(long, default_value_t = 30)]
    query_days: i64,
    /// With `--peer prometheus`: the server binary.
    #[arg(long, default_value = "prometheus")]
    prometheus: String,
    /// With `--peer prometheus`: promtool (TSDB blocks for the query).
    #[arg(long, default_value = "promtool")]
    promtool: String,
}

fn hello(node: &str, gpus: usize) -> v1::Hello {
    v1::Hello {
        agent_id: node.into(),
        node: Some(v1::NodeIdentity {
            node_id: node.into(),
            hostname: node.into(),
            boot_id: "bench".into(),
            labels: Default::default(),
        }),
        gpus: (0..gpus)
            .map(|g| v1::GpuInfo {
                index: g as u32,
                uuid: gpu_uuid(node, g),
                model: "NVIDIA H100 80GB HBM3".into(),
                ..Default::default()
            })
            .collect(),
        protocol_version: 1,
        ..Default::default()
    }
}

/// The uuid of GPU `g` of `node`.
fn gpu_uuid(node: &str, g: usize) -> String {
    format!("GPU-{node}-{g:02}")
}

/// The `p`-th sample of GPU `g`'s metric `mi`: its time (100 ms apart from
/// `t0`) and a realistic value for the metric's unit (ratios, clocks,
/// power) with a 10-on, 2-off phase. `bench ingest` and its peer send the
/// same samples.
fn sample(p: usize, g: usize, mi: usize, unit: &str, t0: i64) -> (i64, f64) {
    let phase = (p % 12 < 10) as u8 as f64;
    let v = match unit {
        "ratio" => 0.05 + 0.6 * phase,
        "MHz" => 1352.0 + ((p * 7 + g + mi) % 5) as f64,
        _ => 300.0 + 250.0 * phase,
    };
    (t0 + p as i64 * 100, v)
}

/// Batch `seq` (from 1) of `node`: every GPU × metric with samples
/// `seq * points ..` of [`sample`].
fn batch(node: &str, seq: u64, gpus: usize, metrics: usize, points: usize, t0: i64) -> v1::Batch {
    let mut series = Vec::with_capacity(gpus * metrics);
    let first = seq as usize * points;
    for g in 0..gpus {
        for (mi, m) in CATALOG.iter().take(metrics).enumerate() {
            let (timestamps_ms, values) = (first..first + points)
                .map(|p| sample(p, g, mi, m.unit, t0))
                .unzip();
            series.push(v1::Series {
                gpu_uuid: gpu_uuid(node, g),
                metric: m.name.into(),
                timestamps_ms,
                values,
                window_ms: vec![100; points],
                ..Default::default()
            });
        }
    }
    v1::Batch {
        seq,
        series,
        ..Default::default()
    }
}

fn main() -> std::process::ExitCode {
    // The shipped binary's memory settings (glibc's malloc, huge pages
    // off), inherited by the collector and load generators it starts.
    flopwatch_transport::memory::tune();
    let a = <BenchArgs as clap::Parser>::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOPWATCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // Before the runtime's threads start, so that they inherit it.
    if let What::Fleet(f) = &a.what {
        f.before_runtime();
    }
    let done = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(a)));
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// OFU derivations as ingest records them for an H100 (f_max 1830 MHz,
/// the window-averaged clock), for the benches that commit OFU samples
/// straight to a store: `uuid` → its derivation.
fn h100_derivation(
    uuid: &str,
) -> std::collections::HashMap<String, flopwatch_collector::store::Derivation> {
    flopwatch_collector::store::Derivation::new(1830.0, flopwatch_proto::metrics::SM_CLOCK_AVG_MHZ)
        .map(|d| (uuid.to_string(), d))
        .into_iter()
        .collect()
}

/// A duration argument (`20s`, `2h15m`), ms.
fn parse_ms(s: &str) -> anyhow::Result<i64> {
    Ok(humantime::parse_duration(s)
        .map_err(|e| anyhow::anyhow!("`{s}`: {e}"))?
        .as_millis() as i64)
}

/// The shipped `flopwatch` binary, for benchmarks that run it as a
/// process: `FLOPWATCH_BIN`, else the `flopwatch` beside this binary (the
/// same target directory).
fn flopwatch_exe() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("FLOPWATCH_BIN") {
        return Ok(p.into());
    }
    let p = std::env::current_exe()?.with_file_name("flopwatch");
    anyhow::ensure!(
        p.is_file(),
        "{} not found: build it (cargo build -p flopwatch-cli) or set FLOPWATCH_BIN",
        p.display()
    );
    Ok(p)
}

async fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.what {
        What::Storage(s) => storage::run(s).await,
        What::Tenants(t) => tenants::run(t).await,
        What::Backpressure(b) => backpressure::run(b).await,
        What::Fleet(f) => fleet::run(f).await,
        What::Soak(s) => soak::run(s).await,
        What::Query(q) => query::run(q).await,
        What::Ledger(l) => ledger::run(l).await,
        What::Ingest(i) if !i.peer.is_empty() => peer::run(&i).await,
        What::Ingest(i) => ingest(&i, ingest_start_ms(&i)?).await.map(drop),
    }
}

/// Samples a run had accepted, and how long it ran.
#[derive(Debug, Clone, Copy)]
struct Accepted {
    samples: u64,
    secs: f64,
}

impl Accepted {
    fn per_second(&self) -> f64 {
        self.samples as f64 / self.secs
    }
}

/// Where `bench ingest`'s samples start: far enough back that a run of
/// `duration` never reaches the present. Every series advances 100 ms per
/// point, so at a rate of r samples/s over S series a run covers
/// r / S / 10 seconds of sample time per second; [`MAX_RATE`] bounds r. A
/// run that outruns it has samples refused as too far in the future, and
/// [`ingest`] fails rather than report a rate.
fn ingest_start_ms(a: &IngestArgs) -> anyhow::Result<i64> {
    let duration_ms = crate::parse_ms(&a.duration)? as u64;
    let series = (a.streams * a.gpus * a.metrics.min(CATALOG.len())).max(1) as u64;
    let span = (duration_ms * (MAX_RATE / series / 10)).max(3_600_000);
    // Well inside the collector's default 30-day retention.
    if span > 20 * 86_400_000 {
        anyhow::bail!(
            "a {} run over {series} series could cover {} days of sample time: run it shorter or with more series",
            a.duration,
            span / 86_400_000
        );
    }
    Ok(flopwatch_proto::clock::SystemClock.now_ms() - span as i64)
}

/// The most samples per second `bench ingest` plans for (above any rate
/// measured on the 2-core machine, docs/BENCHMARKS.md).
const MAX_RATE: u64 = 40_000_000;

/// The collector's durable ingest rate, the samples of [`sample`] from
/// `start_ms`.
async fn ingest(a: &IngestArgs, start_ms: i64) -> anyhow::Result<Accepted> {
    let (streams, gpus, points, window) = (a.streams, a.gpus, a.points, a.window);
    let metrics = a.metrics.min(CATALOG.len());
    let duration = Duration::from_millis(crate::parse_ms(&a.duration)? as u64);
    let tmp = tempdir_path();
    let dir = a.data_dir.clone().unwrap_or_else(|| tmp.clone());
    let mut cfg = CollectorConfig {
        data_dir: dir.clone(),
        anonymous_tenant: Some("default".into()),
        max_batch_bytes: 64 << 20,
        ..Default::default()
    };
    if a.sustained {
        cfg.storage.compaction_interval = Duration::from_secs(1);
    }
    let clock = Arc::new(TokioClock::new());
    let (collector, server) = server::Loopback::open(&cfg, clock.clone())
        .await
        .with_context(|| format!("opening {}", dir.display()))?;
    let url = server.url.clone();

    let acked = Arc::new(AtomicU64::new(0));
    let per_batch = (gpus * metrics * points) as u64;
    let started = Stopwatch::start();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let url = url.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let node = format!("bench-{s:03}");
            let mut client = IngestClient::connect(url)
                .await?
                .max_decoding_message_size(64 << 20);
            let (tx, rx) = mpsc::channel::<AgentMessage>(window + 2);
            tx.send(AgentMessage {
                msg: Some(agent_message::Msg::Hello(hello(&node, gpus))),
            })
            .await?;
            let mut inbound = client.stream(ReceiverStream::new(rx)).await?.into_inner();
            let _welcome = inbound.message().await?;
            let mut seq = 0u64;
            let mut in_flight = 0usize;
            loop {
                while in_flight < window && started.elapsed() < duration {
                    seq += 1;
                    let b = batch(&node, seq, gpus, metrics, points, start_ms);
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
                    Some(v1::CollectorMessage {
                        msg: Some(collector_message::Msg::Ack(a)),
                    }) => {
                        in_flight -= 1;
                        acked.fetch_add(a.accepted_samples, Ordering::Relaxed);
                        if let Some(r) = a.rejected.first() {
                            anyhow::bail!(
                                "batch {} had {} samples refused ({}): the run left the \
                                 samples' time range, and its rate would count them",
                                a.seq,
                                r.samples,
                                r.reason
                            );
                        }
                    }
                    Some(other) => anyhow::bail!("unexpected reply {other:?}"),
                    None => anyhow::bail!("stream closed"),
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut elapsed = started.elapsed().as_secs_f64();
    let total = acked.load(Ordering::Relaxed);
    if a.sustained {
        // Until a pass that began after the last ack has found nothing
        // overdue: every hour due is sealed.
        let store = &collector.store;
        let first = store.whole_passes() + 2;
        while store.whole_passes() < first || store.compaction_lag_ms(clock.now_ms()) > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let drained = started.elapsed().as_secs_f64() - elapsed;
        println!(
            "compaction included: {total} samples acknowledged in {elapsed:.2} s, every hour due sealed {drained:.2} s later ({} raw samples in sealed chunks; the rest is hours not yet due)",
            store.sealed_raw_samples()
        );
        elapsed += drained;
    }
    server.stop().await?;
    let stats = &collector.stats;
    let commits = stats.batches_committed.load(Ordering::Relaxed).max(1);
    println!(
        "ingest: {streams} streams × {gpus} GPUs × {metrics} metrics × {points} points/batch ({per_batch} samples/batch), window {window}"
    );
    println!(
        "acked {total} samples in {elapsed:.2} s = {:.0} samples/s durable (WAL, no fsync); mean commit {:.2} ms",
        total as f64 / elapsed,
        stats.commit_micros.load(Ordering::Relaxed) as f64 / commits as f64 / 1000.0
    );
    drop(collector);
    if dir == tmp {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(Accepted {
        samples: total,
        secs: elapsed,
    })
}

fn tempdir_path() -> std::path::PathBuf {
    let stamp = flopwatch_proto::clock::SystemClock.now_ms();
    std::env::temp_dir().join(format!("flopwatch-bench-{}-{stamp}", std::process::id()))
}
