//! `flopwatch eval-sampling`: adaptive against fixed-interval sampling on
//! a ground-truth trace, measured through the pipeline that ships.
//!
//! Each run replays the trace (`timestamp_ms,gpu,metric,value`, see
//! `flopwatch_agent::source::replay`) through the real agent — paced
//! replay source (it honours the sampler's read plan), sampler, batcher,
//! outbox, gRPC client — into a real collector with RocksDB, in one
//! process under paused tokio time: the agent's and the collector's clocks
//! are the same injected clock, so a 10-minute trace replays in seconds.
//! Every score below comes from what the collector answers afterwards
//! (`Query/Series` for the stored samples, `Query/Ofu` for OFU); nothing
//! of the pipeline is modelled here. Three runs: the adaptive sampler, a
//! fixed sampler at the minimum interval, and a fixed sampler at the
//! interval that sends as many samples as the adaptive run.
//!
//! The trace is the ground truth: window-mean metrics are hardware
//! averages over the interval since the previous row, point metrics
//! instantaneous reads. The truth is the trace as read at `--min-interval`
//! (the paced replay combines window means exactly, points keep the latest
//! read), placed at a whole hour of unix time ([`T0_MS`]).
//!
//! Scores (per run):
//! * `reads`: readings the source delivered; `samples`: samples the
//!   collector stored.
//! * A **change** is a shift by ≥ `change_threshold` (10 %) of a metric's
//!   *windowed peak* — the highest ground-truth value over the trailing
//!   `peak_window` (5 s) — relative to the windowed peak at the previous
//!   change (or at the first full window), with the metric's noise floor
//!   for peaks near zero (0.05 for ratios, 50 MHz, 10 W, 2 °C), computed on
//!   the truth independently of any run. Its time is the first capture
//!   whose windowed peak has moved. `changes_*` and `delay_*` count the
//!   trigger metrics (read at every capture); `*_all` every metric.
//! * **Detected**: the collector holds a sample of that metric covering at
//!   most the run's send interval (the minimum interval for the adaptive
//!   run: it has snapped back) that ends between the change's *start* and
//!   30 s after the change. A rise starts at the change. A fall of the
//!   windowed peak is only visible one window after the level dropped, so
//!   it starts `peak_window` earlier. The delay is that sample's end minus
//!   the change's time, at least 0.
//! * `peak_error_pct`: for each stored sample, |stored peak − true peak
//!   over the sample's window| / true peak, time-weighted mean over samples
//!   and metrics (a sample without `peak` offers its value).
//! * `ofu_error_pp_1m` / `_10m`: largest |OFU the collector answers (one
//!   `Query/Ofu` per GPU at a 1-min or 10-min step) − OFU of the truth| in
//!   percentage points over the windows of the step grid that lie wholly
//!   inside the trace (a trace shorter than one window counts as one). The
//!   truth's OFU per window is eq. 1 (`flopwatch_collector::ofu`, with
//!   the clamp, f_max from the GPU spec table) per truth sample, averaged
//!   weighted by window over the samples whose window *ends* in it: the
//!   query grid's own rule (a sample belongs to the bucket of its end).

use anyhow::{bail, Context};
use flopwatch_agent::source::replay::ReplaySource;
use flopwatch_agent::source::{Capture, GpuSource, SourceError};
use flopwatch_agent::TokioClock;
use flopwatch_agent::{floor_for, AdaptiveSampler};
use flopwatch_agent::{Agent, AgentOptions};
use flopwatch_agent::{FixedSampler, ReadPlan, Sampler};
use flopwatch_collector::ofu;
use flopwatch_collector::server;
use flopwatch_config::{CollectorConfig, SamplingConfig, SpecTable};
use flopwatch_proto::metrics;
use flopwatch_proto::model::{GpuInfo, NodeIdentity};
use flopwatch_proto::v1::{self, ofu_request, query_client::QueryClient};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The GPU model a trace's GPUs are (the traces are H100 recordings).
const MODEL: &str = "NVIDIA H100 80GB HBM3";

/// Where the replayed trace starts, unix ms: a whole hour, so the 1- and
/// 10-min windows of the query grid start with the trace.
pub(crate) const T0_MS: i64 = 1_800_000_000_000;

/// The grid windows scored, ms.
const WINDOWS: [i64; 2] = [60_000, 600_000];

/// Arguments of `flopwatch eval-sampling`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EvalArgs {
    /// Ground-truth trace, long-form CSV `timestamp_ms,gpu,metric,value`.
    #[arg(long)]
    pub trace: PathBuf,
    /// Minimum (capture) interval.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub min_interval: Duration,
    /// Write an SVG plot of the trace, the samples stored and the interval.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Jitter seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Scores of one run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct RunReport {
    /// Send interval, ms (0 for the adaptive run).
    pub interval_ms: u64,
    /// Readings read.
    pub reads: u64,
    /// Readings sent.
    pub samples: u64,
    /// Changes in trigger metrics.
    pub changes_total: u64,
    /// Of which detected.
    pub changes_detected: u64,
    /// Median detection delay, s (trigger metrics).
    pub delay_p50_s: f64,
    /// 99th percentile detection delay, s (trigger metrics).
    pub delay_p99_s: f64,
    /// Changes in any metric.
    pub changes_total_all: u64,
    /// Of which detected.
    pub changes_detected_all: u64,
    /// 99th percentile detection delay, s (any metric).
    pub delay_p99_all_s: f64,
    /// Mean relative peak error, %.
    pub peak_error_pct: f64,
    /// Largest OFU error over 1-min windows, percentage points.
    pub ofu_error_pp_1m: f64,
    /// Largest OFU error over 10-min windows, percentage points.
    pub ofu_error_pp_10m: f64,
}

/// The evaluation's result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct EvalReport {
    /// Trace file.
    pub trace: String,
    /// Minimum interval, ms.
    pub min_interval_ms: u64,
    /// The adaptive sampler.
    pub adaptive: RunReport,
    /// Fixed at the minimum interval.
    pub fixed_min: RunReport,
    /// Fixed at the interval sending as many samples as adaptive.
    pub fixed_same_budget: RunReport,
    /// fixed_min.samples ÷ adaptive.samples.
    pub reduction: f64,
}

/// One stored sample.
#[derive(Debug, Clone, Copy)]
struct Sent {
    ts: i64,
    value: f64,
    peak: Option<f64>,
    window: u32,
}

type Key = (usize, &'static str);
type Series = BTreeMap<Key, Vec<Sent>>;

/// Runs the evaluation and prints a table (or JSON) to stdout.
pub(crate) fn run(args: &EvalArgs) -> anyhow::Result<EvalReport> {
    let file = args.trace.display().to_string();
    let text = std::fs::read_to_string(&args.trace).with_context(|| file.clone())?;
    let cfg = SamplingConfig {
        adaptive: true,
        min_interval: args.min_interval,
        ..Default::default()
    };
    let (report, plot) = evaluate(&text, &file, &cfg, args.seed)?;
    if let Some(p) = &args.plot {
        draw(p, &plot).map_err(|e| anyhow::anyhow!("plot {}: {e}", p.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(report)
}

/// Evaluates trace text; `file` names it in errors. Runs the pipeline
/// three times (see the module docs); blocking: each run has its own
/// paused-time runtime.
pub(crate) fn evaluate(
    text: &str,
    file: &str,
    cfg: &SamplingConfig,
    seed: u64,
) -> anyhow::Result<(EvalReport, PlotData)> {
    let min_ms = cfg.min_interval.as_millis() as i64;
    if min_ms <= 0 {
        bail!("--min-interval must be positive");
    }
    let specs = SpecTable::builtin();
    let f_max = specs
        .lookup(MODEL)
        .map(|s| f64::from(s.tensor_clock_mhz))
        .context("no spec for the trace's GPU model")?;
    let truth_caps = truth(text, file, min_ms)?;
    let truth = series_of(&truth_caps);
    let is_trigger = |m: &str| cfg.trigger_metrics.iter().any(|t| t == m);
    let score_run = |r: &Stored, interval_ms: i64| {
        let mut s = score(&truth, &r.series, interval_ms, cfg, &is_trigger);
        s.interval_ms = if interval_ms == min_ms && r.adaptive {
            0
        } else {
            interval_ms as u64
        };
        s.reads = r.reads;
        s.samples = r.series.values().map(|v| v.len() as u64).sum();
        s.ofu_error_pp_1m = ofu_error(&truth, &r.ofu[0], &r.ofu_whole, WINDOWS[0], f_max);
        s.ofu_error_pp_10m = ofu_error(&truth, &r.ofu[1], &r.ofu_whole, WINDOWS[1], f_max);
        s
    };

    let adaptive_run = pipeline(
        text,
        file,
        Box::new(AdaptiveSampler::new(cfg, seed)),
        true,
        min_ms,
    )?;
    let adaptive = score_run(&adaptive_run, min_ms);
    let fixed_min_run = pipeline(
        text,
        file,
        Box::new(FixedSampler::new(cfg.min_interval)),
        false,
        min_ms,
    )?;
    let fixed_min = score_run(&fixed_min_run, min_ms);
    let k = (fixed_min.samples as f64 / adaptive.samples.max(1) as f64)
        .round()
        .max(1.0) as i64;
    let budget_run = pipeline(
        text,
        file,
        Box::new(FixedSampler::new(Duration::from_millis(
            (k * min_ms) as u64,
        ))),
        false,
        min_ms,
    )?;
    let fixed_same_budget = score_run(&budget_run, k * min_ms);
    let reduction = fixed_min.samples as f64 / adaptive.samples.max(1) as f64;

    let mut plot = PlotData::default();
    let secs = |ts: i64| (ts - T0_MS) as f64 / 1000.0;
    for s in truth
        .get(&(0, metrics::TENSOR_ACTIVE))
        .into_iter()
        .flatten()
    {
        plot.trace.push((secs(s.ts), s.value));
    }
    for s in adaptive_run
        .series
        .get(&(0, metrics::TENSOR_ACTIVE))
        .into_iter()
        .flatten()
    {
        plot.sent.push((secs(s.ts), s.value));
        plot.interval
            .push((secs(s.ts), f64::from(s.window) / 1000.0));
    }
    Ok((
        EvalReport {
            trace: file.to_string(),
            min_interval_ms: min_ms as u64,
            adaptive,
            fixed_min,
            fixed_same_budget,
            reduction,
        },
        plot,
    ))
}

/// The trace as read every `min_ms`, from its start at [`T0_MS`] +
/// `min_ms` (where an agent started at [`T0_MS`] takes its first capture):
/// the paced replay source, read directly.
fn truth(text: &str, file: &str, min_ms: i64) -> anyhow::Result<Vec<Capture>> {
    let mut src = ReplaySource::parse(text, file, MODEL)?.paced(T0_MS + min_ms);
    let mut out = Vec::new();
    let mut now = T0_MS + min_ms;
    loop {
        match src.capture(now) {
            Ok(c) if c.gpus.is_empty() => {}
            Ok(c) => out.push(c),
            Err(SourceError::Exhausted) => return Ok(out),
            Err(e) => return Err(e.into()),
        }
        now += min_ms;
    }
}

fn series_of(caps: &[Capture]) -> Series {
    let mut s = Series::new();
    for c in caps {
        for g in &c.gpus {
            for r in &g.readings {
                let p = r.point(c.ts_ms, g.window_ms);
                s.entry((g.gpu, r.metric)).or_default().push(Sent {
                    ts: p.ts_ms,
                    value: p.value,
                    peak: p.peak,
                    window: p.window_ms.unwrap_or(0),
                });
            }
        }
    }
    s
}

/// What one run left in the collector.
struct Stored {
    adaptive: bool,
    /// Readings the source delivered.
    reads: u64,
    /// Stored samples per (GPU, metric).
    series: Series,
    /// Per GPU, OFU per bucket start, for each of [`WINDOWS`].
    ofu: [BTreeMap<usize, BTreeMap<i64, f64>>; 2],
    /// Per GPU, OFU over the whole trace.
    ofu_whole: BTreeMap<usize, f64>,
}

/// A source that counts the readings it delivers.
struct Counting {
    inner: ReplaySource,
    reads: Arc<AtomicU64>,
}

impl Counting {
    fn count(&self, c: Capture) -> Capture {
        let n: usize = c.gpus.iter().map(|g| g.readings.len()).sum();
        self.reads.fetch_add(n as u64, Ordering::Relaxed);
        c
    }
}

impl GpuSource for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn inventory(&self) -> &[GpuInfo] {
        self.inner.inventory()
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        let c = self.inner.capture(now_ms)?;
        Ok(self.count(c))
    }

    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let c = self.inner.capture_planned(now_ms, plan)?;
        Ok(self.count(c))
    }
}

/// One run: the trace through an agent with `sampler` into a fresh
/// collector, then the collector's answers.
fn pipeline(
    text: &str,
    file: &str,
    sampler: Box<dyn Sampler>,
    adaptive: bool,
    min_ms: i64,
) -> anyhow::Result<Stored> {
    let dir = scratch_dir();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let out = rt.block_on(pipeline_in(text, file, sampler, adaptive, min_ms, &dir));
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn scratch_dir() -> PathBuf {
    static RUN: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "flopwatch-eval-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ))
}

async fn pipeline_in(
    text: &str,
    file: &str,
    sampler: Box<dyn Sampler>,
    adaptive: bool,
    min_ms: i64,
    dir: &std::path::Path,
) -> anyhow::Result<Stored> {
    let clock = Arc::new(TokioClock::starting_at(T0_MS));
    let cfg = CollectorConfig {
        data_dir: dir.to_path_buf(),
        anonymous_tenant: Some("default".into()),
        plaintext: true,
        ..Default::default()
    };
    let (_collector, server) = server::Loopback::open(&cfg, clock.clone())
        .await
        .with_context(|| format!("opening {}", dir.display()))?;
    let source = ReplaySource::parse(text, file, MODEL)?.paced(T0_MS + min_ms);
    let inventory = source.inventory().to_vec();
    let reads = Arc::new(AtomicU64::new(0));
    let agent = Agent::start(
        Box::new(Counting {
            inner: source,
            reads: reads.clone(),
        }),
        sampler,
        AgentOptions {
            drain_timeout: Duration::from_secs(60),
            ..AgentOptions::new(
                NodeIdentity::named("eval-node", "eval-boot"),
                vec![server.url.clone()],
            )
        },
        clock,
    );
    // The replay ends the sampling loop; the agent then drains.
    while !agent.sampling_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let outbox = agent.outbox.clone();
    agent.stop().await;
    if !outbox.is_empty() {
        bail!("{} batches were not acknowledged", outbox.len());
    }

    let mut q = QueryClient::connect(server.url.clone()).await?;
    let mut series = Series::new();
    let metrics_of_trace: Vec<&'static str> = metrics::CATALOG
        .iter()
        .map(|d| d.name)
        .filter(|m| text.contains(&format!(",{m},")))
        .collect();
    let end = T0_MS + 365 * 86_400_000;
    for (i, g) in inventory.iter().enumerate() {
        for &m in &metrics_of_trace {
            let s = q
                .series(v1::SeriesRequest {
                    gpu_uuid: g.uuid.clone(),
                    metric: m.to_string(),
                    start_ms: T0_MS,
                    end_ms: end,
                    limit: 1_000_000,
                })
                .await?
                .into_inner()
                .series
                .unwrap_or_default();
            let v: Vec<Sent> = s
                .timestamps_ms
                .iter()
                .enumerate()
                .map(|(k, &ts)| Sent {
                    ts,
                    value: s.values[k],
                    peak: s.peaks.get(k).copied(),
                    window: s.window_ms.get(k).copied().unwrap_or(0),
                })
                .collect();
            if !v.is_empty() {
                series.insert((i, m), v);
            }
        }
    }
    // OFU up to the end of the last grid window holding a sample.
    let last = series
        .values()
        .flatten()
        .map(|x| x.ts)
        .max()
        .unwrap_or(T0_MS);
    let end = (last.div_euclid(WINDOWS[1]) + 1) * WINDOWS[1];
    let mut ofu = [BTreeMap::new(), BTreeMap::new()];
    let mut ofu_whole = BTreeMap::new();
    for (i, g) in inventory.iter().enumerate() {
        for (w, len) in WINDOWS.iter().enumerate() {
            let r = q
                .ofu(v1::OfuRequest {
                    scope: Some(ofu_request::Scope::GpuUuid(g.uuid.clone())),
                    start_ms: T0_MS,
                    end_ms: end,
                    step_ms: *len,
                })
                .await?
                .into_inner();
            ofu[w].insert(
                i,
                r.points.iter().map(|p| (p.timestamp_ms, p.ofu)).collect(),
            );
            if let Some(s) = r.summary.filter(|s| s.samples > 0) {
                ofu_whole.insert(i, s.mean);
            }
        }
    }
    drop(q);
    server.stop().await?;
    Ok(Stored {
        adaptive,
        reads: reads.load(Ordering::Relaxed),
        series,
        ofu,
        ofu_whole,
    })
}

/// A human-readable table of a report.
pub(crate) fn table(r: &EvalReport) -> String {
    let mut s = format!(
        "{} (min interval {} ms): reduction {:.1}x\n{:<18} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8}\n",
        r.trace, r.min_interval_ms, r.reduction, "run", "interval", "reads", "samples", "changes", "p50 s", "p99 s",
        "peak err%", "ofu 1m", "ofu 10m"
    );
    for (name, x) in [
        ("adaptive", &r.adaptive),
        ("fixed_min", &r.fixed_min),
        ("fixed_same_budget", &r.fixed_same_budget),
    ] {
        s += &format!(
            "{:<18} {:>8} {:>8} {:>9} {:>8} {:>8.2} {:>8.2} {:>9.2} {:>8.3} {:>8.3}\n",
            name,
            if x.interval_ms == 0 {
                "adaptive".to_string()
            } else {
                format!("{}ms", x.interval_ms)
            },
            x.reads,
            x.samples,
            format!("{}/{}", x.changes_detected, x.changes_total),
            x.delay_p50_s,
            x.delay_p99_s,
            x.peak_error_pct,
            x.ofu_error_pp_1m,
            x.ofu_error_pp_10m
        );
    }
    s
}

/// What the plot shows (GPU 0).
#[derive(Debug, Default)]
pub(crate) struct PlotData {
    trace: Vec<(f64, f64)>,
    sent: Vec<(f64, f64)>,
    interval: Vec<(f64, f64)>,
}

/// Changes in one ground-truth series: (time, start), ms; see the module
/// docs.
fn changes(s: &[Sent], window_ms: i64, theta: f64, floor: f64) -> Vec<(i64, i64)> {
    let Some(t0) = s.first().map(|x| x.ts) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut ring: std::collections::VecDeque<(i64, f64)> = Default::default();
    let mut reference: Option<f64> = None;
    for x in s {
        ring.push_back((x.ts, x.value));
        while ring.front().is_some_and(|f| f.0 <= x.ts - window_ms) {
            ring.pop_front();
        }
        if x.ts - t0 < window_ms {
            continue;
        }
        let p = ring.iter().map(|r| r.1).fold(f64::MIN, f64::max);
        match reference {
            None => reference = Some(p),
            Some(r) if (p - r).abs() >= theta * r.abs().max(floor) => {
                out.push((x.ts, if p > r { x.ts } else { x.ts - window_ms }));
                reference = Some(p);
            }
            _ => {}
        }
    }
    out
}

fn score(
    truth: &Series,
    sent: &Series,
    interval_ms: i64,
    cfg: &SamplingConfig,
    is_trigger: &dyn Fn(&str) -> bool,
) -> RunReport {
    let mut r = RunReport::default();
    let window_ms = cfg.peak_window.as_millis() as i64;
    let (mut delays, mut delays_all) = (Vec::new(), Vec::new());
    for (key, s) in truth {
        // Stored samples at the run's finest resolution.
        let marks: Vec<i64> = sent
            .get(key)
            .into_iter()
            .flatten()
            .filter(|x| i64::from(x.window) <= interval_ms)
            .map(|x| x.ts)
            .collect();
        for (tc, from) in changes(s, window_ms, cfg.change_threshold, floor_for(key.1)) {
            let i = marks.partition_point(|&t| t < from);
            let hit = marks.get(i).filter(|&&t| t <= tc + 30_000);
            let trig = is_trigger(key.1);
            r.changes_total_all += 1;
            r.changes_total += u64::from(trig);
            if let Some(&t) = hit {
                let d = (t - tc).max(0) as f64 / 1000.0;
                r.changes_detected_all += 1;
                delays_all.push(d);
                if trig {
                    r.changes_detected += 1;
                    delays.push(d);
                }
            }
        }
    }
    r.delay_p50_s = percentile(&mut delays, 50.0);
    r.delay_p99_s = percentile(&mut delays, 99.0);
    r.delay_p99_all_s = percentile(&mut delays_all, 99.0);

    // Peak error.
    let (mut err_w, mut w_sum) = (0.0, 0.0);
    for (key, s) in sent {
        let Some(t) = truth.get(key) else { continue };
        for x in s {
            let from = x.ts - i64::from(x.window);
            let lo = t.partition_point(|y| y.ts <= from);
            let hi = t.partition_point(|y| y.ts <= x.ts);
            let true_peak = t[lo..hi.max(lo)]
                .iter()
                .map(|y| y.value)
                .fold(f64::MIN, f64::max);
            if true_peak == f64::MIN {
                continue;
            }
            let e = (x.peak.unwrap_or(x.value) - true_peak).abs()
                / true_peak.abs().max(floor_for(key.1));
            let w = f64::from(x.window.max(1));
            err_w += e * w;
            w_sum += w;
        }
    }
    r.peak_error_pct = if w_sum > 0.0 {
        100.0 * err_w / w_sum
    } else {
        0.0
    };
    r
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    flopwatch_proto::stats::quantile(v, p / 100.0).unwrap_or(0.0)
}

/// The truth's OFU over `[a, a + len)` per GPU: eq. 1 per sample,
/// weighted by window, over the samples ending in the window.
fn truth_ofu(truth: &Series, gpu: usize, len: i64, f_max: f64) -> BTreeMap<i64, f64> {
    let Some(tpa) = truth.get(&(gpu, metrics::TENSOR_ACTIVE)) else {
        return BTreeMap::new();
    };
    let clk = truth
        .get(&(gpu, metrics::SM_CLOCK_AVG_MHZ))
        .or_else(|| truth.get(&(gpu, metrics::SM_CLOCK_MHZ)));
    let clk: BTreeMap<i64, f64> = clk.into_iter().flatten().map(|x| (x.ts, x.value)).collect();
    let mut acc: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for x in tpa.iter().filter(|x| x.window > 0) {
        let Some(&c) = clk.get(&x.ts) else { continue };
        let e = acc.entry(x.ts.div_euclid(len) * len).or_default();
        e.0 += ofu(x.value, c, f_max) * f64::from(x.window);
        e.1 += f64::from(x.window);
    }
    acc.into_iter().map(|(k, (s, w))| (k, s / w)).collect()
}

/// Largest |collector OFU − truth OFU|, percentage points, over the grid
/// windows of `len` wholly inside the truth; for a trace shorter than one
/// window, the whole trace (`whole`: the collector's OFU over it).
fn ofu_error(
    truth: &Series,
    answered: &BTreeMap<usize, BTreeMap<i64, f64>>,
    whole: &BTreeMap<usize, f64>,
    len: i64,
    f_max: f64,
) -> f64 {
    let mut worst: f64 = 0.0;
    for (&gpu, got) in answered {
        let Some(tpa) = truth.get(&(gpu, metrics::TENSOR_ACTIVE)) else {
            continue;
        };
        let (Some(first), Some(last)) = (tpa.first(), tpa.last()) else {
            continue;
        };
        let start = first.ts - i64::from(first.window);
        let mut any = false;
        for (a, w) in truth_ofu(truth, gpu, len, f_max) {
            if a < start || a + len > last.ts + 1 {
                continue;
            }
            any = true;
            let g = got.get(&a).copied().unwrap_or(0.0);
            worst = worst.max((g - w).abs() * 100.0);
        }
        if !any {
            let want = truth_ofu(truth, gpu, i64::MAX / 4, f_max);
            if let (Some(w), Some(g)) = (want.values().next(), whole.get(&gpu)) {
                worst = worst.max((g - w).abs() * 100.0);
            }
        }
    }
    worst
}

fn draw(path: &std::path::Path, d: &PlotData) -> Result<(), String> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(450);
    let x_max = d.trace.last().map(|x| x.0).unwrap_or(1.0).max(1.0);
    let y_max = d.trace.iter().map(|x| x.1).fold(0.0, f64::max).max(0.05) * 1.1;
    let mut c = ChartBuilder::on(&top)
        .caption(
            "tensor_active (GPU 0): trace and samples sent",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("s")
        .draw()
        .map_err(|e| e.to_string())?;
    c.draw_series(LineSeries::new(d.trace.iter().copied(), &BLUE.mix(0.5)))
        .map_err(|e| e.to_string())?;
    c.draw_series(d.sent.iter().map(|&p| Circle::new(p, 3, RED.filled())))
        .map_err(|e| e.to_string())?;
    let i_max = d.interval.iter().map(|x| x.1).fold(0.1, f64::max) * 1.1;
    let mut c = ChartBuilder::on(&bottom)
        .caption("send interval of the trigger group (s)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..i_max)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("s")
        .draw()
        .map_err(|e| e.to_string())?;
    c.draw_series(LineSeries::new(d.interval.iter().copied(), &BLACK))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_trace_names_file_and_line() {
        let cfg = SamplingConfig {
            adaptive: true,
            ..Default::default()
        };
        let e = evaluate(
            "timestamp_ms,gpu,metric,value\n0,0,tensor_active,x\n",
            "t.csv",
            &cfg,
            1,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("t.csv:2:"), "{e}");
        assert!(evaluate("", "t.csv", &cfg, 1).is_err());
    }
}
