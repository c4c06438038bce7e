//! `flopwatch-bench ledger`: the ledger (docs/LEDGER.md) of a month of a
//! fleet, through the shipped path: `--gpus` GPUs (8 per node, one job
//! per node at a time, each job running `--job-days` and the next
//! starting on the same GPUs, staggered across nodes; nodes spread over
//! `--tenants` tenants) × `--days` of OFU, energy counter and board power
//! every `--interval`, written into a collector's RocksDB store batch by
//! batch and compacted a day at a time (chunks and rollups, as the
//! compactor seals them), then asked over gRPC (`Query/Ledger`, what
//! `flopwatch report` sends) for the whole period: the fleet with the
//! provider's view, one tenant, and one job; each the median of `--runs`
//! answers after a warm-up.

use anyhow::{bail, Context};
use flopwatch_agent::TokioClock;
use flopwatch_collector::server;
use flopwatch_collector::store::rocks::RocksEngine;
use flopwatch_collector::store::{
    CommitSet, GpuRecord, JobRecord, NodeRecord, OfuSample, Store, WINDOW_MS,
};
use flopwatch_config::CollectorConfig;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::model::{Point, SeriesBatch};
use flopwatch_proto::v1;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `bench ledger`.
#[derive(clap::Args)]
pub(super) struct LedgerArgs {
    /// GPUs of the fleet (8 per node).
    #[arg(long, default_value_t = 1000)]
    gpus: usize,
    /// Days of samples.
    #[arg(long, default_value_t = 30)]
    days: i64,
    /// Sample interval.
    #[arg(long, default_value = "60s")]
    interval: String,
    /// How long each job runs, days.
    #[arg(long, default_value_t = 3)]
    job_days: i64,
    /// Tenants the nodes are spread over.
    #[arg(long, default_value_t = 10)]
    tenants: usize,
    /// Answers per question (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Work directory (default: a temporary one, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The provider's token the questions carry (loopback only).
const PROVIDER: &str = "bench-ledger-provider";

/// The fleet's shape.
struct Fleet {
    gpus: usize,
    tenants: usize,
    start: i64,
    interval: i64,
    job_ms: i64,
}

impl Fleet {
    fn nodes(&self) -> usize {
        self.gpus.div_ceil(8)
    }

    fn tenant(&self, node: usize) -> String {
        format!("tenant-{:02}", node % self.tenants.max(1))
    }

    /// The job node `node` runs at `t` and when it started: each node's
    /// jobs are staggered by a fraction of a job's length.
    fn job(&self, node: usize, t: i64) -> (String, i64) {
        let offset = (node as i64 * 7_919 * 60_000) % self.job_ms;
        let k = (t - self.start + offset).div_euclid(self.job_ms);
        let from = (self.start - offset + k * self.job_ms).max(self.start);
        (format!("job-{node:04}-{k:03}"), from)
    }
}

fn ms(s: &str) -> anyhow::Result<i64> {
    Ok(humantime::parse_duration(s)
        .with_context(|| format!("not a duration: {s}"))?
        .as_millis() as i64)
}

pub(super) async fn run(a: LedgerArgs) -> anyhow::Result<()> {
    let interval = ms(&a.interval)?;
    if WINDOW_MS % interval != 0 || a.gpus == 0 || a.days <= 0 || a.job_days <= 0 {
        bail!("--interval must divide an hour; --gpus, --days and --job-days more than 0");
    }
    let tmp = a.dir.is_none();
    let work = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("flopwatch-bench-ledger-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let outcome = measure(&a, &work, interval).await;
    if tmp {
        let _ = std::fs::remove_dir_all(&work);
    }
    outcome
}

async fn measure(a: &LedgerArgs, work: &Path, interval: i64) -> anyhow::Result<()> {
    let now = flopwatch_proto::clock::SystemClock.now_ms();
    let end = now / WINDOW_MS * WINDOW_MS - WINDOW_MS;
    let start = end - a.days * 24 * WINDOW_MS;
    let fleet = Fleet {
        gpus: a.gpus,
        tenants: a.tenants,
        start,
        interval,
        job_ms: a.job_days * 24 * WINDOW_MS,
    };
    let dir = work.join("flopwatch");
    let built = Stopwatch::start();
    let samples = {
        let store = Store::new(Arc::new(RocksEngine::open(&dir)?), false);
        let n = load(&fleet, &store, end)?;
        store.compact(now + 2 * WINDOW_MS, 0)?;
        store.engine().flush()?;
        n
    };
    let disk = super::storage::dir_bytes(&dir);
    println!(
        "fleet: {} GPUs × {} days, OFU, energy counter and power every {} = {samples} samples, jobs of {} days on {} tenants; written and compacted in {:.0} s ({:.2} GiB on disk)",
        a.gpus,
        a.days,
        a.interval,
        a.job_days,
        a.tenants,
        built.elapsed().as_secs_f64(),
        disk as f64 / (1u64 << 30) as f64
    );
    let cfg = CollectorConfig {
        data_dir: dir.clone(),
        admin_tokens_sha256: vec![flopwatch_collector::digest(PROVIDER)],
        plaintext: true,
        retention: Duration::from_secs((a.days as u64 + 10) * 24 * 3600),
        ..Default::default()
    };
    let clock = Arc::new(TokioClock::new());
    let (_c, srv) = server::Loopback::open(&cfg, clock).await?;
    let mut q = v1::query_client::QueryClient::connect(srv.url.clone()).await?;
    let (_, first_job) = {
        let (j, f) = fleet.job(0, end - 1);
        (f, j)
    };
    let asks = [
        ("the fleet (every tenant)", String::new(), String::new()),
        ("one tenant", fleet.tenant(0), String::new()),
        ("one job", String::new(), first_job),
    ];
    for (what, tenant, job) in asks {
        let req = v1::LedgerRequest {
            start_ms: start,
            end_ms: end,
            tenant,
            job_id: job,
        };
        let mut times = Vec::new();
        let mut last = None;
        for i in 0..=a.runs {
            let t = Stopwatch::start();
            let mut r = tonic::Request::new(req.clone());
            r.metadata_mut()
                .insert("authorization", format!("Bearer {PROVIDER}").parse()?);
            let r = q.ledger(r).await?.into_inner();
            if i > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
            last = Some(r);
        }
        times.sort_by(f64::total_cmp);
        let r = last.unwrap_or_default();
        let held: f64 = r.entries.iter().map(|e| e.held_s).sum::<f64>() / 3600.0;
        let gpus: std::collections::BTreeSet<&str> =
            r.entries.iter().map(|e| e.gpu_uuid.as_str()).collect();
        println!(
            "  {what}: {} holdings on {} GPUs, {held:.0} GPU-h held — median {:.3} s (min {:.3}, max {:.3}) over {} answers",
            r.entries.len(),
            gpus.len(),
            times[times.len() / 2],
            times[0],
            times[times.len() - 1],
            times.len()
        );
    }
    srv.stop().await?;
    Ok(())
}

/// Writes the fleet into `store` an hour at a time (a node's batch per
/// hour), compacting each finished day; the number of samples.
fn load(f: &Fleet, store: &Store, end: i64) -> anyhow::Result<u64> {
    let per_hour = WINDOW_MS / f.interval;
    let mut energy = vec![0.0f64; f.gpus];
    let mut seq = 0u64;
    let mut total = 0u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 10_000) as f64 / 1e4
    };
    for (k, h) in (f.start..end).step_by(WINDOW_MS as usize).enumerate() {
        for node in 0..f.nodes() {
            let tenant = f.tenant(node);
            let node_id = format!("bench-node-{node:04}");
            seq += 1;
            let mut set = CommitSet {
                seq,
                ..Default::default()
            };
            if k == 0 {
                set.nodes.push(NodeRecord {
                    node_id: node_id.clone(),
                    hostname: node_id.clone(),
                    ..Default::default()
                });
            }
            let gpus = node * 8..((node + 1) * 8).min(f.gpus);
            for (g, energy) in gpus.clone().zip(&mut energy[gpus]) {
                let uuid = format!("GPU-bench-{g:05}");
                if k == 0 {
                    set.gpus.push(GpuRecord {
                        uuid: uuid.clone(),
                        node_id: node_id.clone(),
                        index: (g % 8) as u32,
                        model: "NVIDIA H100 80GB HBM3".into(),
                        ..Default::default()
                    });
                }
                // The hour's samples, cut where the node's job changes.
                let mut by_job: Vec<(String, i64, Vec<OfuSample>)> = Vec::new();
                let (mut power, mut counter) = (Vec::new(), Vec::new());
                for i in 1..=per_hour {
                    let ts = h + i * f.interval;
                    let (job, since) = f.job(node, ts - 1);
                    // A job's level; its first tenth idles (loading).
                    let level = 0.2 + 0.5 * ((node * 37 % 100) as f64 / 100.0);
                    let idle = ts - since < f.job_ms / 10;
                    let tpa = if idle { 0.0 } else { level + 0.05 * noise() };
                    let watts = if idle { 70.0 } else { 250.0 + 400.0 * tpa };
                    *energy += watts * f.interval as f64 / 1000.0;
                    let sample = OfuSample {
                        ts_ms: ts,
                        ofu: tpa * 1755.0 / 1830.0,
                        tensor_active: tpa,
                        sm_clock_mhz: 1755.0,
                        window_ms: f.interval as u32,
                    };
                    match by_job.last_mut() {
                        Some((j, _, s)) if *j == job => s.push(sample),
                        _ => by_job.push((job, since, vec![sample])),
                    }
                    let point = |v: f64| Point {
                        ts_ms: ts,
                        value: v,
                        peak: None,
                        window_ms: Some(f.interval as u32),
                    };
                    power.push(point(watts));
                    counter.push(point(*energy));
                }
                for (job, since, samples) in by_job {
                    total += samples.len() as u64;
                    let last = samples.last().map_or(h, |s| s.ts_ms);
                    set.jobs.push(JobRecord {
                        job_id: job.clone(),
                        gpu_uuid: uuid.clone(),
                        node_id: node_id.clone(),
                        namespace: tenant.clone(),
                        first_seen_ms: since,
                        last_seen_ms: last,
                        ..Default::default()
                    });
                    set.derivations.extend(super::h100_derivation(&uuid));
                    set.ofu.push((uuid.clone(), Some(job), samples));
                }
                total += (power.len() + counter.len()) as u64;
                for (metric, points) in [("power_w", power), ("energy_j", counter)] {
                    set.series.push(SeriesBatch {
                        gpu_uuid: uuid.clone(),
                        metric: metric.into(),
                        points,
                    });
                }
            }
            store.commit(&tenant, &set)?;
        }
        if (k + 1) % 24 == 0 {
            store.compact(h + 2 * WINDOW_MS, 0)?;
        }
    }
    Ok(total)
}
