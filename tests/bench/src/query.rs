//! `flopwatch-bench query`: PromQL queries through the collector's
//! Prometheus API against the stores a user would pick instead.
//!
//! 1. **Fleet-wide**: `--gpus` GPUs (8 per node, in `--jobs` jobs) × `--hours`
//!    of OFU every `--interval`, the same samples to flopwatch (its store,
//!    compacted: chunks and rollups), to Prometheus 2.42 (OpenMetrics →
//!    promtool blocks) and to VictoriaMetrics (its import API, flushed and
//!    merged); then `avg by (job_id) (flopwatch_ofu_ratio)` over the whole
//!    range at `--step` through each one's `query_range`, the answers
//!    compared point by point.
//! 2. **Selection at fleet scale** (flopwatch alone): one GPU with 30 days
//!    of OFU at 1 min among 100, then `--records` GPUs' records (each a
//!    node's, a job's and a few samples); at each size, after a restart
//!    (the index loads at the first query), one GPU's 30-day query, one
//!    GPU's day at `--step`, and the fleet-wide query.
//!
//! Each figure is the median of `--runs` runs over loopback HTTP (the
//! fleet-wide query in rounds that ask flopwatch and each peer once in
//! turn, so all are measured over the same minutes, with each round's
//! ratio printed too);
//! VictoriaMetrics is asked with `nocache=1` (its result cache would
//! otherwise answer every run after the first).

use super::prom_query::{self as peer, om_sample};
use super::victoria::Victoria;
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
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `bench query`.
#[derive(clap::Args)]
pub(super) struct QueryArgs {
    /// GPUs of the fleet-wide query.
    #[arg(long, default_value_t = 1000)]
    gpus: usize,
    /// Jobs the fleet's GPUs run (contiguous blocks of GPUs).
    #[arg(long, default_value_t = 50)]
    jobs: usize,
    /// Hours of the fleet's samples.
    #[arg(long, default_value_t = 24)]
    hours: i64,
    /// Sample interval of the fleet.
    #[arg(long, default_value = "15s")]
    interval: String,
    /// Step of the range queries.
    #[arg(long, default_value = "60s")]
    step: String,
    /// GPUs' records in the store for the selection measurements
    /// (comma-separated sizes, each after the previous).
    #[arg(long, default_value = "10000,100000", value_delimiter = ',')]
    records: Vec<usize>,
    /// Peers to compare with: `prometheus`, `victoria-metrics` (none: `-`).
    #[arg(
        long,
        default_value = "prometheus,victoria-metrics",
        value_delimiter = ','
    )]
    peers: Vec<String>,
    /// Runs per query (the median is reported). Seven proved too few on a
    /// shared 2-core machine (medians ±10 % run to run); 21 hold within a
    /// few percent (docs/BENCHMARKS.md, PromQL).
    #[arg(long, default_value_t = 21)]
    runs: usize,
    /// Work directory (default: a temporary one, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The Prometheus server binary.
    #[arg(long, default_value = "prometheus")]
    prometheus: String,
    /// promtool (TSDB blocks).
    #[arg(long, default_value = "promtool")]
    promtool: String,
    /// The VictoriaMetrics server binary.
    #[arg(long, default_value = "victoria-metrics")]
    victoria_metrics: String,
}

fn ms(s: &str) -> anyhow::Result<i64> {
    Ok(humantime::parse_duration(s)
        .with_context(|| format!("not a duration: {s}"))?
        .as_millis() as i64)
}

/// A query's answer: label set (JSON text) → points.
type Answer = BTreeMap<String, Vec<(i64, f64)>>;

/// One `query_range` of `q` over `range` at `url`: its time in ms
/// (request sent to body read) and its answer.
async fn query_once(
    http: &reqwest::Client,
    url: &str,
    q: &str,
    (start, end, step): (i64, i64, i64),
    extra: &[(&str, &str)],
) -> anyhow::Result<(f64, Answer)> {
    let secs = |ms: i64| format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000));
    let mut form: Vec<(&str, String)> = vec![
        ("query", q.to_string()),
        ("start", secs(start)),
        ("end", secs(end)),
        ("step", secs(step)),
    ];
    form.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let t = Stopwatch::start();
    let r = http
        .post(format!("{url}/api/v1/query_range"))
        .form(&form)
        .send()
        .await?;
    let status = r.status();
    let text = r.text().await?;
    let took = t.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() {
        bail!("query_range `{q}` at {url}: {status}: {text}");
    }
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let mut answer = Answer::new();
    for s in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let pts = s["values"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .filter_map(|p| {
                        let t = (p[0].as_f64()? * 1000.0).round() as i64;
                        Some((t, p[1].as_str()?.parse::<f64>().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        answer.insert(s["metric"].to_string(), pts);
    }
    Ok((took, answer))
}

/// `query_range` of `q` over `range` at `url`, `runs` times (plus one
/// unmeasured warm-up): sorted times in ms and the last answer.
async fn range_query(
    http: &reqwest::Client,
    url: &str,
    q: &str,
    range: (i64, i64, i64),
    runs: usize,
    extra: &[(&str, &str)],
) -> anyhow::Result<(Vec<f64>, Answer)> {
    let (times, answer) = interleaved(http, &[(url, extra)], q, range, runs)
        .await?
        .remove(0);
    Ok((sorted(&times), answer))
}

/// The same `query_range` at each of `targets` (URL and extra form
/// fields), in rounds: after one unmeasured warm-up at each, `runs`
/// rounds that ask every target once, each round starting at the next
/// target, so every store is measured over the same minutes of a shared
/// machine. Per target: its times in round order (ms) and its last
/// answer.
async fn interleaved(
    http: &reqwest::Client,
    targets: &[(&str, &[(&str, &str)])],
    q: &str,
    range: (i64, i64, i64),
    runs: usize,
) -> anyhow::Result<Vec<(Vec<f64>, Answer)>> {
    let mut out = Vec::with_capacity(targets.len());
    for (url, extra) in targets {
        out.push((
            Vec::with_capacity(runs),
            query_once(http, url, q, range, extra).await?.1,
        ));
    }
    for round in 0..runs {
        for i in 0..targets.len() {
            let j = (round + i) % targets.len();
            let (url, extra) = targets[j];
            let (took, a) = query_once(http, url, q, range, extra).await?;
            out[j].0.push(took);
            out[j].1 = a;
        }
    }
    Ok(out)
}

/// `t` sorted (for [`median`] and the extremes).
fn sorted(t: &[f64]) -> Vec<f64> {
    let mut t = t.to_vec();
    t.sort_by(|a, b| a.total_cmp(b));
    t
}

/// Points compared and the largest relative difference, or why the two
/// answers are not the same.
fn compare(ours: &Answer, theirs: &Answer) -> Result<(usize, f64), String> {
    if ours.keys().ne(theirs.keys()) {
        return Err(format!(
            "label sets differ: {} against {}",
            ours.len(),
            theirs.len()
        ));
    }
    let (mut n, mut worst) = (0, 0.0f64);
    for (l, a) in ours {
        let b = &theirs[l];
        if a.len() != b.len() {
            return Err(format!("{l}: {} points against {}", a.len(), b.len()));
        }
        for (x, y) in a.iter().zip(b) {
            if x.0 != y.0 {
                return Err(format!("{l}: a point at {} against {}", x.0, y.0));
            }
            let d = (x.1 - y.1).abs() / x.1.abs().max(y.1.abs()).max(1e-300);
            worst = worst.max(if x.1 == y.1 { 0.0 } else { d });
            n += 1;
        }
    }
    Ok((n, worst))
}

fn median(t: &[f64]) -> f64 {
    t[t.len() / 2]
}

/// A GPU of the fleet: its UUID, node and job.
fn fleet_gpu(g: usize, gpus: usize, jobs: usize) -> (String, String, String) {
    (
        format!("GPU-fleet-{g:05}"),
        format!("fleet-node-{:04}", g / 8),
        format!("job-{:03}", g * jobs / gpus),
    )
}

/// GPU `g`'s OFU samples of the hour starting at `h`, every `interval`
/// (a job's level and each GPU's own noise).
fn fleet_hour(job: usize, h: i64, interval: i64, x: &mut u64) -> Vec<OfuSample> {
    let level = 0.15 + 0.6 * ((job * 37 % 100) as f64 / 100.0);
    (0..WINDOW_MS / interval)
        .map(|i| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let noise = (*x % 10_000) as f64 / 1e5;
            let ofu = ((level + noise) * 1e4).round() / 1e4;
            OfuSample {
                ts_ms: h + i * interval + 1_000,
                ofu,
                tensor_active: ofu * 1830.0 / 1755.0,
                sm_clock_mhz: 1755.0,
                window_ms: interval as u32,
            }
        })
        .collect()
}

fn config(dir: &Path) -> CollectorConfig {
    CollectorConfig {
        data_dir: dir.to_path_buf(),
        anonymous_tenant: Some("default".into()),
        retention: Duration::from_secs(40 * 24 * 3600),
        prometheus_api: flopwatch_config::PrometheusApiConfig {
            // The fleet-wide query at 100,000 GPUs' records selects that
            // many series.
            max_series: 1_000_000,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A node's records.
fn node_record(node: &str) -> NodeRecord {
    NodeRecord {
        node_id: node.into(),
        hostname: node.into(),
        ..Default::default()
    }
}

fn gpu_record(uuid: &str, node: &str, index: u32) -> GpuRecord {
    GpuRecord {
        uuid: uuid.into(),
        node_id: node.into(),
        index,
        model: "NVIDIA H100 80GB HBM3".into(),
        ..Default::default()
    }
}

fn job_record(job: &str, uuid: &str, node: &str, from: i64, to: i64) -> JobRecord {
    JobRecord {
        job_id: job.into(),
        gpu_uuid: uuid.into(),
        node_id: node.into(),
        first_seen_ms: from,
        last_seen_ms: to,
        ..Default::default()
    }
}

/// One GPU's samples of an hour: its index in the fleet, its samples.
type GpuHour = (usize, Vec<OfuSample>);

/// A peer to compare with: its name, URL and extra query parameters.
type Peer<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);

/// The fleet's samples into `store`, and as Prometheus text to `text`
/// (`ts` the timestamp writer: seconds for OpenMetrics, ms for
/// VictoriaMetrics' import), an hour at a time.
struct Fleet {
    gpus: usize,
    jobs: usize,
    start: i64,
    end: i64,
    interval: i64,
}

impl Fleet {
    /// Writes the fleet into `store`, calling `hour` with each hour's
    /// samples (GPU index, samples).
    fn load(
        &self,
        store: &Store,
        hour: &mut dyn FnMut(&[GpuHour]) -> anyhow::Result<()>,
    ) -> anyhow::Result<u64> {
        let mut xs: Vec<u64> = (0..self.gpus)
            .map(|g| 0x9e37_79b9_7f4a_7c15 ^ ((g as u64 + 1) * 0x2545_f491))
            .collect();
        let mut total = 0u64;
        let mut seq = 0u64;
        for (k, h) in (self.start..self.end)
            .step_by(WINDOW_MS as usize)
            .enumerate()
        {
            let mut all = Vec::with_capacity(self.gpus);
            for (g, x) in xs.iter_mut().enumerate() {
                let job = g * self.jobs / self.gpus;
                all.push((g, fleet_hour(job, h, self.interval, x)));
            }
            for node in all.chunks(8) {
                seq += 1;
                let mut set = CommitSet {
                    seq,
                    ..Default::default()
                };
                for (g, samples) in node {
                    let (uuid, node_id, job) = fleet_gpu(*g, self.gpus, self.jobs);
                    total += samples.len() as u64;
                    set.derivations.extend(super::h100_derivation(&uuid));
                    set.ofu
                        .push((uuid.clone(), Some(job.clone()), samples.clone()));
                    if k == 0 {
                        set.gpus.push(gpu_record(&uuid, &node_id, (*g % 8) as u32));
                        set.jobs
                            .push(job_record(&job, &uuid, &node_id, self.start, self.end));
                        if g % 8 == 0 {
                            set.nodes.push(node_record(&node_id));
                        }
                    }
                }
                store.commit("default", &set)?;
            }
            hour(&all)?;
        }
        Ok(total)
    }

    /// The Prometheus text line of a sample (labels as flopwatch's for
    /// the query: `UUID`, `job_id`, `node`).
    fn line(
        &self,
        out: &mut Vec<u8>,
        g: usize,
        s: &OfuSample,
        ms_stamp: bool,
    ) -> std::io::Result<()> {
        let (uuid, node, job) = fleet_gpu(g, self.gpus, self.jobs);
        let labels = format!("UUID=\"{uuid}\",job_id=\"{job}\",node=\"{node}\"");
        if ms_stamp {
            writeln!(
                out,
                "flopwatch_ofu_ratio{{{labels}}} {:?} {}",
                s.ofu, s.ts_ms
            )
        } else {
            om_sample(out, "flopwatch_ofu_ratio", &labels, s.ts_ms, s.ofu)
        }
    }
}

/// The scaling store: one GPU with 30 days at 1 min, and the records of
/// `n` GPUs in all (8 per node, a job each, one hour of a sample a minute
/// two days ago and a power reading), added to what `store` holds.
fn add_records(store: &Store, from: usize, to: usize, now: i64) -> anyhow::Result<()> {
    let t = now / WINDOW_MS * WINDOW_MS - 48 * WINDOW_MS;
    let ids: Vec<usize> = (from..to).collect();
    for (k, chunk) in ids.chunks(8).enumerate() {
        let mut set = CommitSet {
            seq: (from + k) as u64 + 1_000_000,
            ..Default::default()
        };
        for &g in chunk {
            let uuid = format!("GPU-rec-{g:06}");
            let node = format!("rec-node-{:05}", g / 8);
            let job = format!("rec-job-{:04}", g / 64);
            set.gpus.push(gpu_record(&uuid, &node, (g % 8) as u32));
            set.jobs
                .push(job_record(&job, &uuid, &node, t, t + WINDOW_MS));
            if g % 8 == 0 || g == from {
                set.nodes.push(node_record(&node));
            }
            let samples: Vec<OfuSample> = (0..60)
                .map(|i| OfuSample {
                    ts_ms: t + i * 60_000,
                    ofu: 0.3,
                    tensor_active: 0.3,
                    sm_clock_mhz: 1830.0,
                    window_ms: 60_000,
                })
                .collect();
            set.derivations.extend(super::h100_derivation(&uuid));
            set.ofu.push((uuid.clone(), Some(job), samples));
            set.series.push(SeriesBatch {
                gpu_uuid: uuid,
                metric: "power_w".into(),
                points: vec![Point {
                    ts_ms: t,
                    value: 300.0,
                    peak: None,
                    window_ms: Some(60_000),
                }],
            });
        }
        store.commit("default", &set)?;
    }
    Ok(())
}

/// The GPU with 30 days of OFU at 1 min (from `start` to `end`).
fn add_month(store: &Store, start: i64, end: i64) -> anyhow::Result<u64> {
    let (uuid, node, job) = ("GPU-month", "month-node", "month-job");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut total = 0;
    for (k, h) in (start..end).step_by(WINDOW_MS as usize).enumerate() {
        let samples = fleet_hour(7, h, 60_000, &mut x);
        total += samples.len() as u64;
        store.commit(
            "default",
            &CommitSet {
                seq: k as u64 + 1,
                ofu: vec![(uuid.into(), Some(job.into()), samples)],
                derivations: super::h100_derivation(uuid),
                gpus: if k == 0 {
                    vec![gpu_record(uuid, node, 0)]
                } else {
                    Vec::new()
                },
                nodes: if k == 0 {
                    vec![node_record(node)]
                } else {
                    Vec::new()
                },
                jobs: if k == 0 {
                    vec![job_record(job, uuid, node, start, end)]
                } else {
                    Vec::new()
                },
                ..Default::default()
            },
        )?;
    }
    Ok(total)
}

pub(super) async fn run(a: QueryArgs) -> anyhow::Result<()> {
    let interval = ms(&a.interval)?;
    let step = ms(&a.step)?;
    if WINDOW_MS % interval != 0 || a.gpus == 0 || a.jobs == 0 {
        bail!("--interval must divide an hour; --gpus and --jobs more than 0");
    }
    let tmp = a.dir.is_none();
    let work = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("flopwatch-bench-query-{}", std::process::id()))
    });
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let outcome = measure(&a, &work, interval, step).await;
    // A temporary directory goes whatever happened (gigabytes of stores).
    if tmp {
        let _ = std::fs::remove_dir_all(&work);
    }
    outcome
}

async fn measure(a: &QueryArgs, work: &Path, interval: i64, step: i64) -> anyhow::Result<()> {
    let now = flopwatch_proto::clock::SystemClock.now_ms();
    let end = now / WINDOW_MS * WINDOW_MS - WINDOW_MS;
    let start = end - a.hours * WINDOW_MS;
    let fleet = Fleet {
        gpus: a.gpus,
        jobs: a.jobs,
        start,
        end,
        interval,
    };
    let prometheus = a.peers.iter().any(|p| p == "prometheus");
    let victoria = a.peers.iter().any(|p| p == "victoria-metrics");
    let http = reqwest::Client::new();

    // The fleet, to every store.
    let built = Stopwatch::start();
    let dir = work.join("flopwatch");
    let om = work.join("fleet.om");
    let mut om_file = prometheus
        .then(|| std::fs::File::create(&om).map(std::io::BufWriter::new))
        .transpose()?;
    if let Some(f) = om_file.as_mut() {
        writeln!(f, "# TYPE flopwatch_ofu_ratio gauge")?;
    }
    let vm = if victoria {
        Some(Victoria::start(&a.victoria_metrics, &work.join("victoria"), 60).await?)
    } else {
        None
    };
    // VictoriaMetrics' text, an hour per file, imported once written.
    let vm_dir = work.join("vm-import");
    std::fs::create_dir_all(&vm_dir)?;
    let mut vm_files: Vec<PathBuf> = Vec::new();
    let total = {
        let store = Store::new(Arc::new(RocksEngine::open(&dir)?), false);
        let total = fleet.load(&store, &mut |hour| {
            let mut text = Vec::new();
            let mut om_text = Vec::new();
            for (g, samples) in hour {
                for s in samples {
                    if vm.is_some() {
                        fleet.line(&mut text, *g, s, true)?;
                    }
                    if om_file.is_some() {
                        fleet.line(&mut om_text, *g, s, false)?;
                    }
                }
            }
            if let Some(f) = om_file.as_mut() {
                f.write_all(&om_text)?;
            }
            if vm.is_some() {
                let f = vm_dir.join(format!("{}.txt", vm_files.len()));
                std::fs::write(&f, &text)?;
                vm_files.push(f);
            }
            Ok(())
        })?;
        store.compact(now + 2 * WINDOW_MS, 0)?;
        store.engine().flush()?;
        total
    };
    println!(
        "fleet: {} GPUs × {} h of OFU every {} = {total} samples, {} jobs; flopwatch's store written and compacted in {:.1} s",
        a.gpus,
        a.hours,
        a.interval,
        a.jobs,
        built.elapsed().as_secs_f64()
    );
    let mut peers: Vec<Peer> = Vec::new();
    let mut _prom = None;
    if let Some(mut f) = om_file.take() {
        writeln!(f, "# EOF")?;
        f.flush()?;
        drop(f);
        let t = Stopwatch::start();
        let tsdb = work.join("prometheus").join("tsdb");
        std::fs::create_dir_all(&tsdb)?;
        flopwatch_tests::prometheus_peer::create_blocks(&a.promtool, &om, &tsdb, "24h")
            .map_err(anyhow::Error::msg)?;
        std::fs::remove_file(&om)?;
        let qp = peer::QueryPeer {
            prometheus: a.prometheus.clone(),
            promtool: a.promtool.clone(),
            work: work.join("prometheus"),
        };
        let (p, _) = peer::serve_blocks(&qp, &tsdb, 30).await?;
        println!(
            "  Prometheus: the same samples as TSDB blocks (OpenMetrics → promtool) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        peers.push(("Prometheus 2.42", p.url(), Vec::new()));
        _prom = Some(p);
    }
    if let Some(v) = &vm {
        let t = Stopwatch::start();
        for f in vm_files.drain(..) {
            v.import(&http, std::fs::read_to_string(&f)?).await?;
            std::fs::remove_file(&f)?;
        }
        v.settle(&http).await?;
        println!(
            "  VictoriaMetrics: the same samples imported, flushed and merged in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        peers.push(("VictoriaMetrics 1.79", v.url(), vec![("nocache", "1")]));
    }
    let clock = Arc::new(TokioClock::new());
    let (_c, srv) = server::Loopback::open(&config(&dir), clock.clone()).await?;
    let q = "avg by (job_id) (flopwatch_ofu_ratio)";
    let range = (start, end, step);
    // flopwatch and every peer asked in turn, round by round.
    let mut targets: Vec<(&str, &[(&str, &str)])> = vec![(srv.api_url.as_str(), &[])];
    targets.extend(
        peers
            .iter()
            .map(|(_, url, extra)| (url.as_str(), extra.as_slice())),
    );
    let mut measured = interleaved(&http, &targets, q, range, a.runs).await?;
    let (ours_rounds, ours) = measured.remove(0);
    let ours_t = sorted(&ours_rounds);
    let points: usize = ours.values().map(Vec::len).sum();
    println!(
        "\nfleet-wide `{q}`, {} h at {}: {} series, {points} points; {} rounds, each asking every store once in turn",
        a.hours,
        a.step,
        ours.len(),
        a.runs
    );
    println!(
        "  flopwatch: median {:.1} ms (min {:.1}, max {:.1}; {} runs)",
        median(&ours_t),
        ours_t[0],
        ours_t[ours_t.len() - 1],
        ours_t.len()
    );
    if points == 0 {
        bail!("flopwatch answered nothing");
    }
    for ((name, _, _), (rounds, theirs)) in peers.iter().zip(measured) {
        let (n, worst) = compare(&ours, &theirs)
            .map_err(|e| anyhow::anyhow!("{name} answers `{q}` differently: {e}"))?;
        if worst > 1e-9 {
            bail!("{name} answers `{q}` differently: worst relative difference {worst:e}");
        }
        let t = sorted(&rounds);
        // The ratio within each round: both stores over the same moments.
        let ratios = sorted(
            &rounds
                .iter()
                .zip(&ours_rounds)
                .map(|(theirs, ours)| theirs / ours)
                .collect::<Vec<_>>(),
        );
        println!(
            "  {name}: median {:.1} ms (min {:.1}, max {:.1}; {} runs); {n} points equal to flopwatch's within {worst:.1e}; flopwatch {:.2}× faster (medians); per round {:.2}× median, {:.2}–{:.2}×",
            median(&t),
            t[0],
            t[t.len() - 1],
            t.len(),
            median(&t) / median(&ours_t),
            median(&ratios),
            ratios[0],
            ratios[ratios.len() - 1],
        );
    }
    srv.stop().await?;
    drop(vm);
    drop(_prom);

    // Selection at fleet scale.
    let dir = work.join("scale");
    let month_end = end;
    let month_start = end - 30 * 24 * WINDOW_MS;
    {
        let store = Store::new(Arc::new(RocksEngine::open(&dir)?), false);
        let n = add_month(&store, month_start, month_end)?;
        add_records(&store, 0, 99, now)?;
        store.compact(now + 2 * WINDOW_MS, 0)?;
        store.engine().flush()?;
        println!("\nselection: one GPU with 30 days of OFU at 1 min ({n} samples) among the records of N GPUs");
    }
    let mut sizes = vec![100];
    sizes.extend(a.records.iter().copied().filter(|&n| n > 100));
    let month_q = "avg_over_time(flopwatch_ofu_ratio{UUID=\"GPU-month\"}[1h])";
    let day_q = "flopwatch_ofu_ratio{UUID=\"GPU-month\"}";
    for (i, &n) in sizes.iter().enumerate() {
        if i > 0 {
            let store = Store::new(Arc::new(RocksEngine::open(&dir)?), false);
            let t = Stopwatch::start();
            add_records(&store, sizes[i - 1] - 1, n - 1, now)?;
            store.compact(now + 2 * WINDOW_MS, 0)?;
            store.engine().flush()?;
            println!(
                "  {} more GPUs' records written in {:.1} s",
                n - sizes[i - 1],
                t.elapsed().as_secs_f64()
            );
        }
        let (_c, srv) = server::Loopback::open(&config(&dir), clock.clone()).await?;
        // The first query loads the index.
        let t = Stopwatch::start();
        range_query(
            &http,
            &srv.api_url,
            day_q,
            (end - WINDOW_MS, end, step),
            0,
            &[],
        )
        .await?;
        let load = t.elapsed().as_secs_f64() * 1000.0;
        let (mt, m) = range_query(
            &http,
            &srv.api_url,
            month_q,
            (month_start + WINDOW_MS, month_end, WINDOW_MS),
            a.runs,
            &[],
        )
        .await?;
        let (dt, d) = range_query(
            &http,
            &srv.api_url,
            day_q,
            (month_end - 24 * WINDOW_MS, month_end, step),
            a.runs,
            &[],
        )
        .await?;
        let (ft, f) = range_query(
            &http,
            &srv.api_url,
            q,
            (month_end - 24 * WINDOW_MS, month_end, step),
            a.runs.min(3),
            &[],
        )
        .await?;
        println!(
            "  {n:>7} GPUs: first query (index load) {load:.0} ms; one GPU 30 d at 1 h {:.1} ms ({} points); one GPU 24 h at {} {:.1} ms ({} points); fleet-wide 24 h {:.1} ms ({} series)",
            median(&mt),
            m.values().map(Vec::len).sum::<usize>(),
            a.step,
            median(&dt),
            d.values().map(Vec::len).sum::<usize>(),
            median(&ft),
            f.len(),
        );
        srv.stop().await?;
    }
    Ok(())
}
