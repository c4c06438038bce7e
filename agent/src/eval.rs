//! `flopwatch eval-sampling`: replays a fine-grained ground-truth trace
//! through the real [`AdaptiveSampler`] and two fixed baselines (the
//! minimum interval, and the interval that sends as many samples as the
//! adaptive run), and scores them.
//!
//! The trace (`timestamp_ms,gpu,metric,value`, see
//! [`crate::source::replay`]) is the ground truth: window-mean metrics are
//! hardware averages over the interval since the previous row, point
//! metrics instantaneous reads. It is first resampled to `--min-interval`
//! (window means combine exactly, points keep the latest read).
//!
//! The adaptive run replays a source that honours the sampler's read plan
//! ([`Sampler::due`]): before each capture it asks which readings are due,
//! skips the rest, and reports a skipped window-mean metric at its next
//! read as the mean over the whole span (`window_ms` set), as a
//! counter-delta source would. The fixed runs read what they send.
//!
//! Scores (per run):
//! * `reads`, `samples`: readings read and sent.
//! * A **change** is a shift by ≥ `change_threshold` (10 %) of a metric's
//!   *windowed peak* — the highest ground-truth value over the trailing
//!   `peak_window` (5 s) — relative to the windowed peak at the previous
//!   change (or at the first full window), with the metric's noise floor
//!   for peaks near zero (0.05 for ratios, 50 MHz, 10 W, 2 °C), computed on
//!   the resampled trace independently of any run. Its time is the first
//!   capture whose windowed peak has moved. `changes_*` and `delay_*`
//!   count the trigger metrics (read at every capture); `*_all` every
//!   metric.
//! * **Detected**: the run's schedule for that metric is at its minimum
//!   interval at some capture from the change's *start* to 30 s after the
//!   change. A rise starts at the change. A fall of the windowed peak is
//!   only visible one window after the level dropped, so it starts
//!   `peak_window` earlier (a sampler that snapped at the drop itself
//!   detected it). The delay is the time of that capture minus the
//!   change's, at least 0. For a fixed run the schedule counts as "at its
//!   minimum" at each sample it sends; the same rule scores every run.
//! * `peak_error_pct`: for each sent sample, |sent peak − true peak over the
//!   sample's window| / true peak, time-weighted mean over samples and
//!   metrics (a sample without `peak` offers its value).
//! * `ofu_error_pp_1m` / `_10m`: largest |OFU from the sent samples − OFU
//!   from the trace| in percentage points over the 1-min / 10-min windows
//!   of the time grid (`[k·len, (k+1)·len)`, unix ms, as a query step grid
//!   is) that lie wholly inside the trace (a trace shorter than one window
//!   counts as one window). OFU eq. 1 with the clamp, f_max 1830 MHz
//!   (H100): `tpa × min(clk, f_max) / f_max` per sample, clk the
//!   window-averaged clock when the trace has it; a window's OFU is the
//!   mean of its samples weighted by their overlap with the window (a sent
//!   sample is taken as uniform over its own window). The adaptive sampler
//!   cuts its sends at `sampling.align` (1 min) boundaries, so its samples
//!   never straddle a window; a fixed run's may.

use crate::adaptive::{floor_for, AdaptiveSampler};
use crate::sampler::{PlanCarry, Sampler};
use crate::source::replay::ReplaySource;
use crate::source::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use flopwatch_config::SamplingConfig;
use flopwatch_proto::metrics::{self, Aggregation};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Tensor-core peak clock of the H100 (OFU §IV-D), MHz.
pub const F_MAX_MHZ: f64 = 1830.0;

/// Arguments of `flopwatch eval-sampling`.
#[derive(Debug, Clone, clap::Parser)]
pub struct EvalArgs {
    /// Ground-truth trace, long-form CSV `timestamp_ms,gpu,metric,value`.
    #[arg(long)]
    pub trace: PathBuf,
    /// Minimum (capture) interval.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub min_interval: Duration,
    /// Write an SVG plot of the trace, the samples sent and the interval.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Jitter seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Why an evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The trace is unreadable or malformed (names file and line).
    #[error("{0}")]
    Trace(#[from] SourceError),
    /// Reading the trace failed.
    #[error("{file}: {message}")]
    Io {
        /// File.
        file: String,
        /// What failed.
        message: String,
    },
    /// The arguments cannot be used.
    #[error("{0}")]
    Args(String),
    /// Drawing the plot failed.
    #[error("plot {file}: {message}")]
    Plot {
        /// File.
        file: String,
        /// What failed.
        message: String,
    },
}

/// Scores of one run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RunReport {
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
pub struct EvalReport {
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
pub fn run(args: &EvalArgs) -> Result<EvalReport, EvalError> {
    let file = args.trace.display().to_string();
    let text = std::fs::read_to_string(&args.trace).map_err(|e| EvalError::Io {
        file: file.clone(),
        message: e.to_string(),
    })?;
    let cfg = SamplingConfig {
        adaptive: true,
        min_interval: args.min_interval,
        ..Default::default()
    };
    let (report, plot) = evaluate(&text, &file, &cfg, args.seed)?;
    if let Some(p) = &args.plot {
        draw(p, &plot).map_err(|message| EvalError::Plot {
            file: p.display().to_string(),
            message,
        })?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", table(&report));
    }
    Ok(report)
}

/// A human-readable table of a report.
pub fn table(r: &EvalReport) -> String {
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
pub struct PlotData {
    trace: Vec<(f64, f64)>,
    sent: Vec<(f64, f64)>,
    interval: Vec<(f64, f64)>,
}

/// Evaluates trace text; `file` names it in errors.
pub fn evaluate(
    text: &str,
    file: &str,
    cfg: &SamplingConfig,
    seed: u64,
) -> Result<(EvalReport, PlotData), EvalError> {
    let min_ms = cfg.min_interval.as_millis() as i64;
    if min_ms <= 0 {
        return Err(EvalError::Args("--min-interval must be positive".into()));
    }
    let mut src = ReplaySource::parse(text, file, "NVIDIA H100 80GB HBM3")?;
    let mut raw = Vec::new();
    loop {
        match src.capture(0) {
            Ok(c) => raw.push(c),
            Err(SourceError::Exhausted) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let base = resample(&raw, min_ms);
    let truth = series_of(&base);
    let is_trigger = |m: &str| cfg.trigger_metrics.iter().any(|t| t == m);

    // Adaptive.
    let mut sampler = AdaptiveSampler::new(cfg, seed);
    let mut sent: Series = BTreeMap::new();
    let mut at_min: BTreeMap<Key, Vec<i64>> = BTreeMap::new();
    let mut plot = PlotData::default();
    // The source honours the sampler's read plan (`PlanCarry`).
    let mut carry = PlanCarry::default();
    for c in &base {
        let plan = sampler.due(c.ts_ms);
        let mut c = c.clone();
        carry.apply(&plan, &mut c);
        sampler.observe(&mut c);
        push_sent(&mut sent, &c);
        for (gpu, metric, i) in sampler.intervals() {
            if i <= sampler.min_interval_ms(metric) {
                at_min.entry((gpu, metric)).or_default().push(c.ts_ms);
            }
            if gpu == 0 && metric == metrics::TENSOR_ACTIVE {
                plot.interval
                    .push((c.ts_ms as f64 / 1000.0, f64::from(i) / 1000.0));
            }
        }
    }
    let st = sampler.stats();
    let mut adaptive = score(&truth, &sent, &at_min, cfg, &is_trigger);
    adaptive.reads = st.reads;
    adaptive.samples = st.samples;
    for s in truth
        .get(&(0, metrics::TENSOR_ACTIVE))
        .into_iter()
        .flatten()
    {
        plot.trace.push((s.ts as f64 / 1000.0, s.value));
    }
    for s in sent.get(&(0, metrics::TENSOR_ACTIVE)).into_iter().flatten() {
        plot.sent.push((s.ts as f64 / 1000.0, s.value));
    }

    let fixed = |interval: i64| {
        let caps = resample(&base, interval);
        let s = series_of(&caps);
        let marks: BTreeMap<Key, Vec<i64>> = s
            .iter()
            .map(|(k, v)| (*k, v.iter().map(|x| x.ts).collect()))
            .collect();
        let mut r = score(&truth, &s, &marks, cfg, &is_trigger);
        r.samples = s.values().map(|v| v.len() as u64).sum();
        r.reads = r.samples;
        r.interval_ms = interval as u64;
        r
    };
    let fixed_min = fixed(min_ms);
    let k = (fixed_min.samples as f64 / adaptive.samples.max(1) as f64)
        .round()
        .max(1.0) as i64;
    let fixed_same_budget = fixed(k * min_ms);
    let reduction = fixed_min.samples as f64 / adaptive.samples.max(1) as f64;
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

fn push_sent(out: &mut Series, c: &Capture) {
    for g in &c.gpus {
        for r in &g.readings {
            out.entry((g.gpu, r.metric)).or_default().push(Sent {
                ts: c.ts_ms,
                value: r.value,
                peak: r.peak,
                window: r.window_ms.unwrap_or(g.window_ms),
            });
        }
    }
}

fn series_of(caps: &[Capture]) -> Series {
    let mut s = BTreeMap::new();
    for c in caps {
        push_sent(&mut s, c);
    }
    s
}

/// Combines captures into bins of `interval_ms` ending at multiples of it
/// (from the first capture's time): window means exactly, points latest.
fn resample(caps: &[Capture], interval_ms: i64) -> Vec<Capture> {
    let Some(t0) = caps.first().map(|c| c.ts_ms) else {
        return Vec::new();
    };
    let mut out: Vec<Capture> = Vec::new();
    let mut bin_of_last = i64::MIN;
    // (gpu, metric) -> (Σ v·w, Σ w, last, max)
    type Acc = BTreeMap<(usize, &'static str), (f64, u64, f64, f64)>;
    let mut acc: Acc = BTreeMap::new();
    let mut windows: BTreeMap<usize, u64> = BTreeMap::new();
    let flush =
        |acc: &mut Acc, windows: &mut BTreeMap<usize, u64>, ts: i64, out: &mut Vec<Capture>| {
            let mut c = Capture {
                ts_ms: ts,
                ..Default::default()
            };
            for (gpu, w) in windows.iter() {
                let readings = acc
                    .iter()
                    .filter(|((g, _), _)| g == gpu)
                    .map(|((_, m), &(svw, sw, last, _))| {
                        let mean = metrics::lookup(m).map(|d| d.aggregation)
                            == Some(Aggregation::WindowMean);
                        Reading::new(
                            m,
                            if mean && sw > 0 {
                                svw / sw as f64
                            } else {
                                last
                            },
                        )
                    })
                    .collect();
                c.gpus.push(GpuCapture {
                    gpu: *gpu,
                    window_ms: u32::try_from(*w).unwrap_or(u32::MAX),
                    readings,
                });
            }
            acc.clear();
            windows.clear();
            out.push(c);
        };
    let mut last_ts = t0;
    for c in caps {
        let bin = (c.ts_ms - t0 + interval_ms - 1).div_euclid(interval_ms);
        if bin != bin_of_last && !windows.is_empty() {
            flush(&mut acc, &mut windows, last_ts, &mut out);
        }
        bin_of_last = bin;
        last_ts = c.ts_ms;
        for g in &c.gpus {
            *windows.entry(g.gpu).or_default() += u64::from(g.window_ms);
            for r in &g.readings {
                let e = acc
                    .entry((g.gpu, r.metric))
                    .or_insert((0.0, 0, 0.0, f64::MIN));
                e.0 += r.value * f64::from(g.window_ms);
                e.1 += u64::from(g.window_ms);
                e.2 = r.value;
                e.3 = e.3.max(r.value);
            }
        }
    }
    if !windows.is_empty() {
        flush(&mut acc, &mut windows, last_ts, &mut out);
    }
    out
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

fn percentile(v: &mut [f64], p: f64) -> f64 {
    flopwatch_proto::stats::quantile(v, p / 100.0).unwrap_or(0.0)
}

fn score(
    truth: &Series,
    sent: &Series,
    at_min: &BTreeMap<Key, Vec<i64>>,
    cfg: &SamplingConfig,
    is_trigger: &dyn Fn(&str) -> bool,
) -> RunReport {
    let mut r = RunReport::default();
    let window_ms = cfg.peak_window.as_millis() as i64;
    let (mut delays, mut delays_all) = (Vec::new(), Vec::new());
    for (key, s) in truth {
        let marks = at_min.get(key).map(Vec::as_slice).unwrap_or(&[]);
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
    r.ofu_error_pp_1m = ofu_error(truth, sent, 60_000);
    r.ofu_error_pp_10m = ofu_error(truth, sent, 600_000);
    r
}

/// OFU eq. 1 with the clamp (collector/src/ofu.rs).
pub fn ofu(tensor_active: f64, sm_clock_mhz: f64) -> f64 {
    tensor_active.clamp(0.0, 1.0) * sm_clock_mhz.clamp(0.0, F_MAX_MHZ) / F_MAX_MHZ
}

/// Per-GPU OFU samples (ts, window, ofu) from a series set.
fn ofu_samples(s: &Series, gpu: usize) -> Vec<(i64, i64, f64)> {
    let Some(tpa) = s.get(&(gpu, metrics::TENSOR_ACTIVE)) else {
        return Vec::new();
    };
    let clk = s
        .get(&(gpu, metrics::SM_CLOCK_AVG_MHZ))
        .or_else(|| s.get(&(gpu, metrics::SM_CLOCK_MHZ)));
    let clk: BTreeMap<i64, f64> = clk.into_iter().flatten().map(|x| (x.ts, x.value)).collect();
    tpa.iter()
        .filter_map(|x| {
            let c = clk.get(&x.ts).copied().unwrap_or(F_MAX_MHZ);
            (x.window > 0).then(|| (x.ts, i64::from(x.window), ofu(x.value, c)))
        })
        .collect()
}

fn ofu_error(truth: &Series, sent: &Series, len_ms: i64) -> f64 {
    let gpus: std::collections::BTreeSet<usize> = truth.keys().map(|k| k.0).collect();
    let mut worst: f64 = 0.0;
    for gpu in gpus {
        let t = ofu_samples(truth, gpu);
        let s = ofu_samples(sent, gpu);
        let (Some(start), Some(end)) = (t.first().map(|x| x.0 - x.1), t.last().map(|x| x.0)) else {
            continue;
        };
        // Whole grid windows [k·len, (k+1)·len) inside the trace; a trace
        // shorter than one is one window.
        let first = (start + len_ms - 1).div_euclid(len_ms);
        let last = end.div_euclid(len_ms);
        let windows: Vec<(i64, i64)> = if last > first {
            (first..last)
                .map(|k| (k * len_ms, (k + 1) * len_ms))
                .collect()
        } else {
            vec![(start, end)]
        };
        for (a, b) in windows {
            let mean = |v: &[(i64, i64, f64)]| {
                let (mut sum, mut w) = (0.0, 0.0);
                for &(ts, win, o) in v {
                    let ov = (ts.min(b) - (ts - win).max(a)).max(0) as f64;
                    sum += o * ov;
                    w += ov;
                }
                (w > 0.0).then(|| sum / w)
            };
            if let (Some(x), Some(y)) = (mean(&t), mean(&s)) {
                worst = worst.max((x - y).abs() * 100.0);
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
