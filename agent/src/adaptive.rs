//! Adaptive sampling (Moneo §2.3): send less while a metric's peak is
//! stable, snap back to the minimum interval when it is not.
//!
//! **What runs when.** The capture loop ([`crate::run`]) runs at the minimum
//! interval (`sampling.min_interval`, 100 ms by default: the hardware
//! counters' floor). Every capture reads the *trigger group*
//! (`sampling.trigger_metrics`, by default the OFU inputs `tensor_active`,
//! `sm_clock_avg_mhz`, `sm_clock_mhz`) and checks it, so a change is caught
//! within one or two minimum intervals. What is *sent* backs off: the trigger
//! group on one shared schedule (so OFU is computable at every sent sample),
//! every other metric on its own.
//!
//! **Which cost is saved.** Samples sent (and stored): one reading per
//! metric per period instead of one per capture. Reads of the trigger group
//! are never reduced. Other metrics only need reading during Moneo's
//! ground-truth periods and at the send: [`AdaptiveSampler::reads_due`]
//! says which, so a source that supports partial reads (NVML calls per
//! field) can skip the rest; the stability check of a non-trigger metric
//! only looks at reads inside its ground-truth periods, so its behaviour
//! is the same whether the source skipped the other reads or not. The
//! sources in this crate read everything every capture, so today only the
//! samples are saved; `stats().reads` counts what a partial-read source
//! would read.
//!
//! **Nothing averaged is lost.** A sent sample of a window-mean metric
//! (GPM / DCGM profiling fields) carries the time-weighted mean of every
//! sub-window read since the previous send, its `window_ms` the total and
//! `peak` the highest sub-window value: Σ value × window over sent samples
//! equals Σ over captures, so TPA and the average clock over any window
//! aligned to sends are exact. (What *is* lost is the covariance of TPA and
//! clock inside one sent sample: OFU from the sent means is
//! TPA̅ × f̅ / f_max rather than the mean of TPA × f / f_max; see the eval.)
//! Point metrics carry the latest read and the highest read as `peak`;
//! counters the latest.
//!
//! **Moneo §2.3, piece by piece.**
//! * While stable, at each send the interval doubles plus a random jitter
//!   (`sampling.jitter` × interval, from a seeded RNG).
//! * "Not stable" (snap to the minimum, send what was pending): (a) the
//!   peak differs from the collected peak by more than `change_threshold`
//!   (10 %): a read above it, or the peak over the last `peak_window` below
//!   it, or the level staying below it longer than any dip seen while
//!   learning (×1.2, at least two reads) — this last rule catches drops in
//!   one or two reads while a training step's short communication dips,
//!   learned as normal, do not snap; (b) the density of reads within the
//!   threshold of the peak over `peak_window` falls below
//!   `density_threshold` × the density learned.
//! * Ground truth: after a snap a metric stays at the minimum interval for
//!   `peak_window` and learns its peak, density and longest dip. While
//!   backed off, non-trigger metrics are read and checked in a ground-truth
//!   period at the end of each interval of length
//!   max(`peak_window`, `ground_truth_ratio` × interval).
//! * Cap: the 5th percentile (`stable_percentile`) of the lengths of the
//!   stable runs learned so far (time between snaps, the last 64, once 8
//!   are known), never above `max_interval` (≤ 30 s).
//!
//! Time is injected: `now` is the capture's `ts_ms`; nothing reads the
//! wall clock.

use crate::sampler::Sampler;
use crate::source::{Capture, Reading};
use flopwatch_config::SamplingConfig;
use flopwatch_proto::metrics::{self, Aggregation};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Group key of the trigger group.
const TRIGGER: &str = "";
/// Stable-run lengths kept per group, and how many before the cap is learned.
const RUNS_KEPT: usize = 64;
const RUNS_NEEDED: usize = 8;

/// What the sampler has done, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplerStats {
    /// Captures observed.
    pub captures: u64,
    /// Readings a partial-read source would have had to read.
    pub reads: u64,
    /// Readings sent.
    pub samples: u64,
    /// Snaps back to the minimum interval.
    pub snaps: u64,
}

#[derive(Debug, Clone, Copy)]
struct Learned {
    peak: f64,
    density: f64,
    max_dip_ms: i64,
}

#[derive(Debug, Clone)]
struct Track {
    metric: &'static str,
    agg: Aggregation,
    floor: f64,
    ring: VecDeque<(i64, f64)>,
    learn_since: i64,
    learned: Option<Learned>,
    low_reads: i64,
    // Pending sample.
    sum_vw: f64,
    sum_w: u64,
    // Tensor-activity-weighted sums, for the averaged SM clock (see emit).
    sum_tvw: f64,
    sum_tw: f64,
    peak: f64,
    last: f64,
    n: u32,
}

#[derive(Debug, Clone)]
struct Group {
    trigger: bool,
    min_ms: i64,
    max_ms: i64,
    interval_ms: i64,
    period_start: i64,
    run_start: i64,
    runs: VecDeque<i64>,
    tracks: Vec<Track>,
    unstable: bool,
}

/// The adaptive sampler. See the module docs.
#[derive(Debug)]
pub struct AdaptiveSampler {
    adaptive: bool,
    capture_ms: i64,
    max_ms: i64,
    theta: f64,
    density_threshold: f64,
    window_ms: i64,
    jitter: f64,
    gt_ratio: f64,
    percentile: f64,
    triggers: Vec<String>,
    overrides: BTreeMap<String, (Option<i64>, Option<i64>)>,
    groups: BTreeMap<(usize, &'static str), Group>,
    rng: SmallRng,
    stats: SamplerStats,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Smallest change worth a snap for metrics whose peak is near zero.
pub(crate) fn floor_for(metric: &str) -> f64 {
    match metrics::lookup(metric).map(|m| m.unit) {
        Some("ratio") => 0.05,
        Some("MHz") => 50.0,
        Some("W") => 10.0,
        Some("Cel") => 2.0,
        _ => 1e-9,
    }
}

impl AdaptiveSampler {
    /// A sampler for `cfg`; `seed` seeds the jitter. With
    /// `cfg.adaptive == false` every capture is sent unchanged.
    pub fn new(cfg: &SamplingConfig, seed: u64) -> Self {
        let capture_ms = ms(cfg.min_interval);
        Self {
            adaptive: cfg.adaptive,
            capture_ms,
            max_ms: ms(cfg.max_interval).max(capture_ms),
            theta: cfg.change_threshold,
            density_threshold: cfg.density_threshold,
            window_ms: ms(cfg.peak_window).max(capture_ms),
            jitter: cfg.jitter.max(0.0),
            gt_ratio: cfg.ground_truth_ratio.max(0.0),
            percentile: cfg.stable_percentile.clamp(0.0, 100.0),
            triggers: cfg.trigger_metrics.clone(),
            overrides: cfg
                .overrides
                .iter()
                .map(|(k, o)| (k.clone(), (o.min_interval.map(ms), o.max_interval.map(ms))))
                .collect(),
            groups: BTreeMap::new(),
            rng: SmallRng::seed_from_u64(seed),
            stats: SamplerStats::default(),
        }
    }

    /// Counts so far.
    pub fn stats(&self) -> SamplerStats {
        self.stats
    }

    /// Each (gpu, metric)'s current send interval, ms.
    pub fn intervals(&self) -> Vec<(usize, &'static str, u32)> {
        self.groups
            .iter()
            .flat_map(|((gpu, _), g)| {
                let i = u32::try_from(g.interval_ms).unwrap_or(u32::MAX);
                g.tracks.iter().map(move |t| (*gpu, t.metric, i))
            })
            .collect()
    }

    /// The shortest send interval `metric` can have, ms.
    pub fn min_interval_ms(&self, metric: &str) -> u32 {
        let m = if self.is_trigger(metric) {
            self.capture_ms
        } else {
            self.overrides
                .get(metric)
                .and_then(|o| o.0)
                .unwrap_or(self.capture_ms)
        };
        u32::try_from(m).unwrap_or(u32::MAX)
    }

    /// Whether a source must read `metric` of `gpu` in the capture at
    /// `now_ms`: always for trigger metrics, otherwise only inside the
    /// ground-truth period or at the send (see the module docs).
    pub fn reads_due(&self, gpu: usize, metric: &str, now_ms: i64) -> bool {
        if !self.adaptive || self.is_trigger(metric) {
            return true;
        }
        match self
            .groups
            .iter()
            .find(|((g, k), _)| *g == gpu && *k == metric)
        {
            Some((_, g)) => self.in_ground_truth(g, now_ms) || g.due(now_ms, self.capture_ms),
            None => true,
        }
    }

    fn is_trigger(&self, metric: &str) -> bool {
        self.triggers.iter().any(|t| t == metric)
    }

    fn in_ground_truth(&self, g: &Group, now: i64) -> bool {
        if g.trigger || g.tracks.iter().any(|t| t.learned.is_none()) {
            return true;
        }
        let gt = self
            .window_ms
            .max((self.gt_ratio * g.interval_ms as f64) as i64);
        now >= g.period_start + g.interval_ms - gt
    }

    fn group_for(&mut self, gpu: usize, metric: &'static str, now: i64) -> (usize, &'static str) {
        let trigger = self.is_trigger(metric);
        let key = (gpu, if trigger { TRIGGER } else { metric });
        let (min_ms, max_ms) = if trigger {
            (self.capture_ms, self.max_ms)
        } else {
            let o = self.overrides.get(metric).copied().unwrap_or((None, None));
            let min = o.0.unwrap_or(self.capture_ms).max(self.capture_ms);
            (
                min,
                o.1.unwrap_or(self.max_ms).clamp(min, self.max_ms.max(min)),
            )
        };
        let g = self.groups.entry(key).or_insert_with(|| Group {
            trigger,
            min_ms,
            max_ms,
            interval_ms: min_ms,
            period_start: now,
            run_start: now,
            runs: VecDeque::new(),
            tracks: Vec::new(),
            unstable: false,
        });
        if !g.tracks.iter().any(|t| t.metric == metric) {
            g.tracks.push(Track {
                metric,
                agg: metrics::lookup(metric)
                    .map(|m| m.aggregation)
                    .unwrap_or(Aggregation::Point),
                floor: floor_for(metric),
                ring: VecDeque::new(),
                learn_since: now,
                learned: None,
                low_reads: 0,
                sum_vw: 0.0,
                sum_w: 0,
                sum_tvw: 0.0,
                sum_tw: 0.0,
                peak: f64::MIN,
                last: 0.0,
                n: 0,
            });
        }
        key
    }

    /// The interval cap of a group: the learned percentile of stable runs,
    /// within [min, max].
    fn cap(&self, g: &Group) -> i64 {
        if g.runs.len() < RUNS_NEEDED {
            return g.max_ms;
        }
        let mut v: Vec<i64> = g.runs.iter().copied().collect();
        v.sort_unstable();
        let idx = ((self.percentile / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)].clamp(g.min_ms, g.max_ms)
    }
}

impl Group {
    fn due(&self, now: i64, capture_ms: i64) -> bool {
        now - self.period_start >= self.interval_ms - capture_ms / 2
    }

    /// Emits the pending sample of every track and resets it.
    fn emit(&mut self, out: &mut Vec<Reading>) {
        for t in &mut self.tracks {
            if t.n == 0 {
                continue;
            }
            let mut r = Reading::new(t.metric, t.last);
            if t.agg == Aggregation::WindowMean && t.sum_w > 0 {
                r.value = t.sum_vw / t.sum_w as f64;
            }
            // OFU is tensor activity × clock (OFU eq. 1), and the two move
            // against each other (compute phases run at a low clock,
            // communication dips at a high one). Averaging them separately
            // over a backed-off window would lose that correlation, so the
            // averaged clock of an aggregated sample is weighted by tensor
            // activity: mean(TPA) × this clock = mean(TPA × clock) over the
            // sub-windows, and the collector's OFU equals the mean of the
            // per-capture OFUs.
            if t.metric == flopwatch_proto::metrics::SM_CLOCK_AVG_MHZ && t.n > 1 && t.sum_tw > 1e-12
            {
                r.value = t.sum_tvw / t.sum_tw;
            }
            if t.n > 1 {
                if t.agg != Aggregation::Counter && t.peak > f64::MIN {
                    r.peak = Some(t.peak);
                }
                if t.sum_w > 0 {
                    r.window_ms = Some(u32::try_from(t.sum_w).unwrap_or(u32::MAX));
                }
            }
            out.push(r);
            t.sum_vw = 0.0;
            t.sum_w = 0;
            t.sum_tvw = 0.0;
            t.sum_tw = 0.0;
            t.peak = f64::MIN;
            t.n = 0;
        }
    }

    fn snap(&mut self, now: i64) {
        self.runs.push_back(now - self.run_start);
        if self.runs.len() > RUNS_KEPT {
            self.runs.pop_front();
        }
        self.run_start = now;
        self.interval_ms = self.min_ms;
        for t in &mut self.tracks {
            t.ring.clear();
            t.learned = None;
            t.learn_since = now;
            t.low_reads = 0;
        }
    }
}

impl Track {
    fn scale(&self, peak: f64) -> f64 {
        peak.abs().max(self.floor)
    }

    /// Adds a checked read; returns true when the metric is not stable.
    fn check(&mut self, now: i64, v: f64, p: &Params) -> bool {
        self.ring.push_back((now, v));
        while self.ring.front().is_some_and(|f| f.0 <= now - p.window_ms) {
            self.ring.pop_front();
        }
        let Some(l) = self.learned else {
            if now - self.learn_since >= p.window_ms - p.capture_ms {
                let peak = self.ring.iter().map(|x| x.1).fold(f64::MIN, f64::max);
                let lo = peak - p.theta * self.scale(peak);
                let (mut run, mut longest) = (0, 0);
                for &(_, x) in &self.ring {
                    run = if x < lo { run + 1 } else { 0 };
                    longest = longest.max(run);
                }
                self.learned = Some(Learned {
                    peak,
                    density: self.density(lo),
                    max_dip_ms: longest * p.capture_ms,
                });
            }
            return false;
        };
        let s = self.scale(l.peak);
        let (hi, lo) = (l.peak + p.theta * s, l.peak - p.theta * s);
        // (a) a read above the collected peak.
        if v > hi {
            return true;
        }
        // (a) the level stays below the peak longer than any learned dip.
        self.low_reads = if v < lo { self.low_reads + 1 } else { 0 };
        let allowed = (l.max_dip_ms as f64 * 1.2) as i64;
        if self.low_reads * p.capture_ms > allowed.max(p.capture_ms) {
            return true;
        }
        if self.ring.len() as i64 >= p.window_ms / p.capture_ms {
            // (a) the windowed peak fell; (b) the density near the peak fell.
            let peak = self.ring.iter().map(|x| x.1).fold(f64::MIN, f64::max);
            if peak < lo || self.density(lo) < p.density_threshold * l.density {
                return true;
            }
        }
        false
    }

    fn density(&self, lo: f64) -> f64 {
        if self.ring.is_empty() {
            return 1.0;
        }
        self.ring.iter().filter(|x| x.1 >= lo).count() as f64 / self.ring.len() as f64
    }
}

struct Params {
    theta: f64,
    density_threshold: f64,
    window_ms: i64,
    capture_ms: i64,
}

impl Sampler for AdaptiveSampler {
    fn next_delay(&self) -> Duration {
        Duration::from_millis(self.capture_ms as u64)
    }

    fn observe(&mut self, capture: &mut Capture) {
        self.stats.captures += 1;
        let now = capture.ts_ms;
        if !self.adaptive {
            let n: usize = capture.gpus.iter().map(|g| g.readings.len()).sum();
            self.stats.reads += n as u64;
            self.stats.samples += n as u64;
            return;
        }
        let p = Params {
            theta: self.theta,
            density_threshold: self.density_threshold,
            window_ms: self.window_ms,
            capture_ms: self.capture_ms,
        };
        for gc in &mut capture.gpus {
            let readings = std::mem::take(&mut gc.readings);
            let w = u64::from(gc.window_ms);
            let tpa_now = readings
                .iter()
                .find(|r| r.metric == flopwatch_proto::metrics::TENSOR_ACTIVE)
                .map(|r| r.value.clamp(0.0, 1.0));
            let mut touched: Vec<(usize, &'static str)> = Vec::new();
            for r in readings {
                let key = self.group_for(gc.gpu, r.metric, now);
                if !touched.contains(&key) {
                    touched.push(key);
                }
                let g = &self.groups[&key];
                let read = self.in_ground_truth(g, now) || g.due(now, self.capture_ms);
                let g = self.groups.get_mut(&key).expect("group just inserted");
                let Some(t) = g.tracks.iter_mut().find(|t| t.metric == r.metric) else {
                    continue;
                };
                // The mean of a window-mean metric is exact whatever was
                // skipped (counter deltas); peaks only see reads made.
                t.sum_vw += r.value * w as f64;
                t.sum_w += w;
                if let (Some(tpa), flopwatch_proto::metrics::SM_CLOCK_AVG_MHZ) = (tpa_now, r.metric)
                {
                    t.sum_tvw += tpa * r.value * w as f64;
                    t.sum_tw += tpa * w as f64;
                }
                t.n += 1;
                if read {
                    self.stats.reads += 1;
                    t.last = r.value;
                    t.peak = t.peak.max(r.peak.unwrap_or(r.value));
                    if t.check(now, r.value, &p) {
                        g.unstable = true;
                    }
                } else if t.agg == Aggregation::WindowMean {
                    t.last = r.value;
                }
            }
            for key in touched {
                let cap = self.cap(&self.groups[&key]);
                let jitter: f64 = self.rng.random_range(0.0..=1.0) * self.jitter;
                let g = self.groups.get_mut(&key).expect("touched group");
                if g.unstable {
                    g.unstable = false;
                    g.emit(&mut gc.readings);
                    g.snap(now);
                    g.period_start = now;
                    self.stats.snaps += 1;
                } else if g.due(now, self.capture_ms) {
                    g.emit(&mut gc.readings);
                    g.period_start = now;
                    if g.tracks.iter().all(|t| t.learned.is_some()) {
                        let next = g.interval_ms as f64 * (2.0 + jitter);
                        g.interval_ms = (next as i64).clamp(g.min_ms, cap.max(g.min_ms));
                    }
                }
            }
            self.stats.samples += gc.readings.len() as u64;
        }
    }
}
