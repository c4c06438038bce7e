//! Adaptive sampling (Moneo §2.3): send less while a metric's peak is
//! stable, snap back to the minimum interval when it is not.
//!
//! **What runs when.** The capture loop ([`crate::run`]) runs at the minimum
//! interval (`sampling.min_interval`, 100 ms by default: the hardware
//! counters' floor). Every capture reads the *trigger group*
//! (`sampling.trigger_metrics`, by default the OFU inputs `tensor_active`,
//! `sm_clock_avg_mhz`, `sm_clock_mhz`) and checks it, so a change is caught
//! at the capture that shows it. What is *sent* backs off: the trigger group
//! on one shared schedule (so OFU is computable at every sent sample), every
//! other metric on its own. A change seen in the trigger group snaps every
//! group of that GPU (a workload change shows first in the OFU inputs);
//! the other groups snap at their next read, which the snap makes due.
//!
//! **Which cost is saved.** Two:
//! * *Samples* sent and stored: one reading per metric per period instead of
//!   one per capture. Always saved.
//! * *Reads* (NVML calls): trigger metrics are read at every capture; any
//!   other metric only inside its ground-truth periods, at its sends and at
//!   the `align` cuts. [`Sampler::due`] (and [`AdaptiveSampler::reads_due`])
//!   says which, before the capture; a source that honours the
//!   [`ReadPlan`] skips the rest and reports a skipped window-mean metric,
//!   when next read, as the mean over the whole span with `window_ms` set.
//!   The stability check of a non-trigger metric only looks at reads that
//!   were due, so its schedule is the same whether the source skipped the
//!   other reads or not (extra reads still sharpen the sent peak).
//!   `stats().reads` counts the readings the source delivered.
//!
//! **Nothing averaged is lost.** A sent sample of a window-mean metric
//! (GPM / DCGM profiling fields) carries the time-weighted mean of every
//! reading since the previous send, its `window_ms` the total and `peak` the
//! highest reading: Σ value × window over sent samples equals Σ over
//! captures, so TPA and the average clock over any window whose edges are
//! sends are exact. Sends are therefore also cut at every multiple of
//! `sampling.align` (60 s, unix time; the cut does not move the schedule),
//! *before* the first capture past the boundary joins: the cut sample ends
//! at the last capture before the boundary ([`Reading::end_ms`]), so a sent
//! sample holds captures of one 1-min, 10-min or 1-h bucket of the query
//! grid only (a sample belongs to the bucket its end falls in), exactly as
//! a fixed sampler's captures fall, and each bucket's mean is the one at
//! the minimum interval. The averaged SM clock of an
//! aggregated sample is weighted by tensor activity, so mean(TPA) × clock =
//! mean(TPA × clock): OFU (eq. 1) from the sent means equals the mean of
//! the per-capture OFUs, except for the clamp at f_max (a window that mixes
//! clocks above and below f_max), which the agent does not know, and for
//! the clock's rounding to 1 kHz ([`WEIGHTED_CLOCK_STEPS_PER_MHZ`]: OFU
//! moves by under 4·10⁻⁷).
//! Point metrics carry the latest read and the highest read as `peak`,
//! counters the latest; `window_ms` is the span since the previous send.
//!
//! **Moneo §2.3, piece by piece.**
//! * While stable, at each send the interval doubles plus a random jitter
//!   (`sampling.jitter` × interval, from a seeded RNG).
//! * "Not stable" (snap to the minimum, send what was pending), either of
//!   the paper's cases:
//!   (a) the peak differs from the collected peak by ≥ `change_threshold`
//!   (10 %). Each metric keeps a *reference peak*: the peak over the
//!   trailing `peak_window` (5 s) when its last change was seen. When the
//!   trailing peak moves ≥ 10 % away from it (scaled by the metric's noise
//!   floor near zero), that is a change: the reference moves to the new
//!   peak and the group snaps. Because the reference only moves at a
//!   change, a slow drift is caught once its cumulative shift reaches 10 %
//!   (a reference that followed every send would never see it). A drop is
//!   also caught early, before the trailing peak moves: the level staying
//!   below the learned peak longer than any dip seen while learning (×1.2,
//!   at least two reads) — a training step's short communication dips,
//!   learned as normal, do not snap. A fall of the trailing peak while the
//!   group is still learning after such an early snap only moves the
//!   reference.
//!   (b) the density of reads within the threshold of the learned peak over
//!   `peak_window` falls below `density_threshold` × the density learned.
//! * Ground truth: after a snap a group stays at the minimum interval for
//!   `peak_window` and learns its peak, density and longest dip. While
//!   backed off, non-trigger metrics are read and checked in a ground-truth
//!   period at the end of each interval of length
//!   max(`peak_window`, `ground_truth_ratio` × interval); trigger metrics
//!   are checked at every capture.
//! * Cap: the 5th percentile (`stable_percentile`) of the lengths of the
//!   stable runs learned so far (time between snaps, the last 64, once 8
//!   are known), never above `max_interval` (≤ 30 s).
//!
//! Time is injected: `now` is the capture's `ts_ms`; nothing reads the
//! wall clock.

use crate::capture::{Capture, GpuCapture, ReadPlan, Reading};
use crate::sampler::Sampler;
use crate::trailing::Trailing;
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
/// Read at every capture, sent on their own schedule: the energy counter,
/// so that the samples sent when a job starts or ends (the sampler is
/// flushed then) carry its value at that instant and the ledger splits
/// energy between jobs exactly (one NVML call per GPU).
const ALWAYS_READ: [&str; 1] = [metrics::ENERGY_J];
const RUNS_NEEDED: usize = 8;

/// Where a metric's track is among one GPU's groups: (group, track).
type Slot = (usize, usize);

/// `metric`'s slot among `groups`. Readings name catalog metrics, the same
/// static strings every capture, so the address is compared first and the
/// text only when no address matches.
fn locate(groups: &[Group], metric: &str) -> Option<Slot> {
    let find = |same: &dyn Fn(&str) -> bool| {
        groups
            .iter()
            .enumerate()
            .find_map(|(i, g)| g.tracks.iter().position(|t| same(t.metric)).map(|j| (i, j)))
    };
    find(&|m| std::ptr::eq(m, metric)).or_else(|| find(&|m| m == metric))
}

/// What the sampler has done, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplerStats {
    /// Captures observed.
    pub captures: u64,
    /// Readings the source delivered (read).
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

/// What a check found; ordered by severity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    #[default]
    None,
    /// The trailing peak fell ≥ 10 % below the reference.
    Fall,
    /// Not stable: snap.
    Snap,
}

#[derive(Debug, Clone)]
struct Track {
    metric: &'static str,
    agg: Aggregation,
    floor: f64,
    /// Checked reads in the trailing `peak_window`.
    ring: Trailing,
    seen_since: Option<i64>,
    /// Trailing peak at the last change (case (a)'s collected peak).
    reference: Option<f64>,
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
    /// Time of the latest reading in the pending sample.
    last_ms: i64,
    n: u32,
    /// End of the last sent sample.
    since: Option<i64>,
}

#[derive(Debug, Clone)]
struct Group {
    /// [`TRIGGER`], or the one metric of the group.
    name: &'static str,
    trigger: bool,
    min_ms: i64,
    max_ms: i64,
    interval_ms: i64,
    /// Start of the current send period (the schedule).
    period_start: i64,
    /// Time of the last send, or of the capture that made a cut at an
    /// `align` boundary.
    last_emit: Option<i64>,
    run_start: i64,
    runs: VecDeque<i64>,
    tracks: Vec<Track>,
    /// Tracks still learning (no `learned`): the group is learning while
    /// any is, asked twice per capture.
    unlearned: usize,
    /// The tracks' metrics as a read-plan set ([`ReadPlan::set_of`]).
    reads: u64,
    change: Change,
    /// The GPU's trigger group snapped: snap at the next read.
    follow: bool,
}

/// Steps per MHz of the averaged SM clock of an aggregated sample (1 kHz;
/// the mean is weighted by tensor activity, or by time while the tensor
/// pipes are idle). A weighted mean has no short decimal form: sent as
/// computed, its last digits are rounding noise that no store can compress
/// (about 6 bytes per sample). NVML reports clocks in whole MHz, so a
/// kilohertz keeps every digit that means something, and OFU (a fraction
/// of the peak) moves by at most 0.0005 MHz / the tensor peak clock: under
/// 4·10⁻⁷ (0.00004 percentage points) on any GPU of the spec table.
pub const WEIGHTED_CLOCK_STEPS_PER_MHZ: f64 = 1000.0;

/// `mhz` to a whole number of kilohertz: the double nearest `k / 1000`,
/// which a store's decimal coder holds exactly.
fn whole_khz(mhz: f64) -> f64 {
    (mhz * WEIGHTED_CLOCK_STEPS_PER_MHZ).round() / WEIGHTED_CLOCK_STEPS_PER_MHZ
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
    align_ms: i64,
    triggers: Vec<String>,
    overrides: BTreeMap<String, (Option<i64>, Option<i64>)>,
    /// Per GPU, its groups in order of name (the trigger group first).
    groups: BTreeMap<usize, Vec<Group>>,
    rng: SmallRng,
    stats: SamplerStats,
    /// Per group of the GPU being observed: not due, read this capture
    /// (kept to reuse their memory).
    not_due: Vec<bool>,
    touched: Vec<bool>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Smallest change worth a snap for metrics whose peak is near zero.
pub fn floor_for(metric: &str) -> f64 {
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
            align_ms: i64::try_from(cfg.align.as_millis()).unwrap_or(i64::MAX),
            triggers: cfg.trigger_metrics.clone(),
            overrides: cfg
                .overrides
                .iter()
                .map(|(k, o)| (k.clone(), (o.min_interval.map(ms), o.max_interval.map(ms))))
                .collect(),
            groups: BTreeMap::new(),
            rng: SmallRng::seed_from_u64(seed),
            stats: SamplerStats::default(),
            not_due: Vec::new(),
            touched: Vec::new(),
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
            .flat_map(|(gpu, gs)| gs.iter().map(move |g| (*gpu, g)))
            .flat_map(|(gpu, g)| {
                let i = u32::try_from(g.interval_ms).unwrap_or(u32::MAX);
                g.tracks.iter().map(move |t| (gpu, t.metric, i))
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
    /// `now_ms`: always for trigger metrics and metrics not seen yet,
    /// otherwise only inside the ground-truth period, at a send, at an
    /// `align` cut or after the trigger group snapped (see the module docs).
    pub fn reads_due(&self, gpu: usize, metric: &str, now_ms: i64) -> bool {
        if !self.adaptive || self.is_trigger(metric) || ALWAYS_READ.contains(&metric) {
            return true;
        }
        let groups = self.groups.get(&gpu).map_or(&[][..], Vec::as_slice);
        locate(groups, metric).is_none_or(|(g, _)| self.group_due(&groups[g], now_ms))
    }

    fn is_trigger(&self, metric: &str) -> bool {
        self.triggers.iter().any(|t| t == metric)
    }

    fn group_due(&self, g: &Group, now: i64) -> bool {
        g.trigger
            || g.follow
            || self.in_ground_truth(g, now)
            || g.due(now, self.capture_ms)
            // The last capture before an `align` cut and the first after
            // it, so that the cut sample ends at the last read before the
            // boundary.
            || g.crosses(now + self.capture_ms, self.align_ms)
    }

    fn in_ground_truth(&self, g: &Group, now: i64) -> bool {
        if g.trigger || g.learning() {
            return true;
        }
        let gt = self
            .window_ms
            .max((self.gt_ratio * g.interval_ms as f64) as i64);
        now >= g.period_start + g.interval_ms - gt
    }

    /// `metric`'s slot among `gpu`'s groups, made on its first reading:
    /// the slot, and whether a group was inserted (at the slot's group,
    /// moving the later ones up by one).
    fn group_for(&mut self, gpu: usize, metric: &'static str, now: i64) -> (Slot, bool) {
        if let Some(at) = self.groups.get(&gpu).and_then(|gs| locate(gs, metric)) {
            return (at, false);
        }
        let trigger = self.is_trigger(metric);
        let name = if trigger { TRIGGER } else { metric };
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
        let gs = self.groups.entry(gpu).or_default();
        let (gi, inserted) = match gs.binary_search_by(|g| g.name.cmp(name)) {
            Ok(gi) => (gi, false),
            Err(gi) => {
                gs.insert(
                    gi,
                    Group {
                        name,
                        trigger,
                        min_ms,
                        max_ms,
                        interval_ms: min_ms,
                        period_start: now,
                        last_emit: None,
                        run_start: now,
                        runs: VecDeque::new(),
                        tracks: Vec::new(),
                        unlearned: 0,
                        reads: 0,
                        change: Change::None,
                        follow: false,
                    },
                );
                (gi, true)
            }
        };
        let g = &mut gs[gi];
        g.reads |= ReadPlan::set_of([metric]);
        g.unlearned += 1;
        g.tracks.push(Track {
            metric,
            agg: metrics::lookup(metric)
                .map(|m| m.aggregation)
                .unwrap_or(Aggregation::Point),
            floor: floor_for(metric),
            ring: Trailing::default(),
            seen_since: None,
            reference: None,
            learn_since: now,
            learned: None,
            low_reads: 0,
            sum_vw: 0.0,
            sum_w: 0,
            sum_tvw: 0.0,
            sum_tw: 0.0,
            peak: f64::MIN,
            last: 0.0,
            last_ms: now,
            n: 0,
            since: None,
        });
        ((gi, g.tracks.len() - 1), inserted)
    }
}

impl Group {
    /// The interval cap: the `percentile` of stable runs, within
    /// [min, max].
    fn cap(&self, percentile: f64) -> i64 {
        if self.runs.len() < RUNS_NEEDED {
            return self.max_ms;
        }
        let mut v: Vec<i64> = self.runs.iter().copied().collect();
        v.sort_unstable();
        let idx = ((percentile / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)].clamp(self.min_ms, self.max_ms)
    }

    fn learning(&self) -> bool {
        debug_assert_eq!(
            self.unlearned,
            self.tracks.iter().filter(|t| t.learned.is_none()).count()
        );
        self.unlearned > 0
    }

    /// The send period is over.
    fn due(&self, now: i64, capture_ms: i64) -> bool {
        now - self.period_start >= self.interval_ms - capture_ms / 2
    }

    /// An `align` boundary lies between the last send and `now`.
    fn crosses(&self, now: i64, align_ms: i64) -> bool {
        align_ms > 0
            && self
                .last_emit
                .is_some_and(|e| now.div_euclid(align_ms) > e.div_euclid(align_ms))
    }

    /// Emits the pending sample of every track and resets it; `cw` is the
    /// capture's window.
    fn emit(&mut self, now: i64, cw: u64, out: &mut Vec<Reading>) {
        self.emit_until(now, false, cw, out);
    }

    /// The `align` cut at the capture at `now`, the first past a
    /// boundary, before that capture is added: each track's pending sample
    /// ends at its latest reading, before the boundary, and the capture
    /// starts the next sample. A sent sample then holds captures of one
    /// query bucket only, as a fixed sampler's do, so every bucket's mean
    /// is the same as at the minimum interval.
    fn cut(&mut self, now: i64, cw: u64, out: &mut Vec<Reading>) {
        self.emit_until(now, true, cw, out);
    }

    /// [`Group::emit`]; with `at_last_read` each sample ends at its
    /// track's latest reading rather than at `now`.
    fn emit_until(&mut self, now: i64, at_last_read: bool, cw: u64, out: &mut Vec<Reading>) {
        self.last_emit = Some(now);
        for t in &mut self.tracks {
            if t.n == 0 {
                continue;
            }
            // A track not read since its latest reading (its field left
            // the source) ends there too: its sample must not claim the
            // time after, when nothing was read.
            let ends_early = at_last_read || t.last_ms < now;
            let now = if ends_early { t.last_ms.min(now) } else { now };
            let mut r = Reading::new(t.metric, t.last);
            if ends_early {
                r.end_ms = Some(now);
            }
            let window = if t.agg == Aggregation::WindowMean && t.sum_w > 0 {
                r.value = t.sum_vw / t.sum_w as f64;
                t.sum_w
            } else {
                t.since
                    .map(|s| u64::try_from(now - s).unwrap_or(0))
                    .unwrap_or(t.sum_w)
            };
            // OFU is tensor activity × clock (OFU eq. 1), and the two move
            // against each other (compute phases run at a low clock,
            // communication dips at a high one). Averaging them separately
            // over a backed-off window would lose that correlation, so the
            // averaged clock of an aggregated sample is weighted by tensor
            // activity: mean(TPA) × this clock = mean(TPA × clock) over the
            // sub-windows, and the collector's OFU equals the mean of the
            // per-capture OFUs (up to the clamp at f_max).
            if t.metric == metrics::SM_CLOCK_AVG_MHZ && t.n > 1 {
                if t.sum_tw > 1e-12 {
                    r.value = t.sum_tvw / t.sum_tw;
                }
                // Both means to the same kilohertz, so that a chunk's
                // clock column has one decimal form, weighted or not.
                r.value = whole_khz(r.value);
            }
            if t.n > 1 && t.agg != Aggregation::Counter && t.peak > f64::MIN {
                r.peak = Some(t.peak);
            }
            if window != cw && window > 0 {
                r.window_ms = Some(u32::try_from(window).unwrap_or(u32::MAX));
            }
            out.push(r);
            t.sum_vw = 0.0;
            t.sum_w = 0;
            t.sum_tvw = 0.0;
            t.sum_tw = 0.0;
            t.peak = f64::MIN;
            t.n = 0;
            t.since = Some(now);
        }
    }

    fn snap(&mut self, now: i64) {
        // Only a run that became stable (learned, backed off) is a stable
        // run; a snap while still learning restarts the learning.
        if !self.learning() {
            self.runs.push_back(now - self.run_start);
            if self.runs.len() > RUNS_KEPT {
                self.runs.pop_front();
            }
        }
        self.run_start = now;
        self.interval_ms = self.min_ms;
        self.period_start = now;
        self.follow = false;
        self.unlearned = self.tracks.len();
        for t in &mut self.tracks {
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

    /// Adds a checked read of one capture window.
    fn check(&mut self, now: i64, v: f64, p: &Params) -> Change {
        self.ring.push(now, v, p.window_ms);
        let seen = *self.seen_since.get_or_insert(now);
        // A window's worth of reads (90 %: capture times jitter).
        let full = now - seen >= p.window_ms
            && self.ring.len() as i64 * p.capture_ms * 10 >= p.window_ms * 9;
        let peak = self.ring.peak();
        let mut out = Change::None;
        // (a) the trailing peak moved ≥ θ away from the reference peak.
        match self.reference {
            None if full => self.reference = Some(peak),
            None => {}
            Some(r) => {
                let th = p.theta * self.scale(r);
                if (full && (peak - r).abs() >= th) || (!full && v - r >= th) {
                    self.reference = Some(peak);
                    out = if peak > r { Change::Snap } else { Change::Fall };
                }
            }
        }
        let Some(l) = self.learned else {
            if now - self.learn_since >= p.window_ms - p.capture_ms {
                let xs: Vec<f64> = self
                    .ring
                    .iter()
                    .filter(|x| x.0 >= self.learn_since)
                    .map(|x| x.1)
                    .collect();
                if !xs.is_empty() {
                    let peak = xs.iter().copied().fold(f64::MIN, f64::max);
                    let lo = peak - p.theta * self.scale(peak);
                    let (mut run, mut longest) = (0, 0);
                    for &x in &xs {
                        run = if x < lo { run + 1 } else { 0 };
                        longest = longest.max(run);
                    }
                    self.learned = Some(Learned {
                        peak,
                        density: xs.iter().filter(|&&x| x >= lo).count() as f64 / xs.len() as f64,
                        max_dip_ms: longest * p.capture_ms,
                    });
                }
            }
            return out;
        };
        let lo = l.peak - p.theta * self.scale(l.peak);
        // (a), early: the level stays below the peak longer than any
        // learned dip.
        // Window means only: a point read (the instantaneous clock, ±32 MHz
        // of jitter) dips by chance; its drops are left to the trailing peak.
        self.low_reads = if v < lo && self.agg == Aggregation::WindowMean {
            self.low_reads + 1
        } else {
            0
        };
        let allowed = (l.max_dip_ms as f64 * 1.2) as i64;
        if self.low_reads * p.capture_ms > allowed.max(p.capture_ms) {
            return Change::Snap;
        }
        // (b) the density near the peak fell.
        if self.ring.len() as i64 >= p.window_ms / p.capture_ms
            && self.density(lo) < p.density_threshold * l.density
        {
            return Change::Snap;
        }
        out
    }

    fn density(&mut self, lo: f64) -> f64 {
        if self.ring.is_empty() {
            return 1.0;
        }
        self.ring.count_at_least(lo) as f64 / self.ring.len() as f64
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

    /// Every pending sample, each ending at its latest reading.
    fn flush(&mut self, now_ms: i64) -> Capture {
        let mut c = Capture {
            ts_ms: now_ms,
            ..Capture::default()
        };
        for (gpu, gs) in &mut self.groups {
            let mut out = Vec::new();
            for g in gs {
                g.emit_until(now_ms, true, 0, &mut out);
            }
            if out.is_empty() {
                continue;
            }
            self.stats.samples += out.len() as u64;
            c.gpus.push(GpuCapture {
                gpu: *gpu,
                window_ms: 0,
                readings: out,
            });
        }
        c
    }

    fn intervals(&self) -> Vec<(usize, &'static str, u32)> {
        AdaptiveSampler::intervals(self)
    }

    /// Everything not due per [`AdaptiveSampler::reads_due`] is skipped.
    fn due(&self, at_ms: i64) -> ReadPlan {
        if !self.adaptive {
            return ReadPlan::all();
        }
        let mut plan = ReadPlan::all();
        let always = ReadPlan::set_of(ALWAYS_READ);
        for (&gpu, gs) in &self.groups {
            for g in gs.iter().filter(|g| !self.group_due(g, at_ms)) {
                plan.skip_set(gpu, g.reads & !always);
            }
        }
        plan
    }

    fn holds_back(&self) -> bool {
        self.adaptive
    }

    fn observe(&mut self, capture: &mut Capture) {
        self.stats.captures += 1;
        let now = capture.ts_ms;
        let n: usize = capture.gpus.iter().map(|g| g.readings.len()).sum();
        self.stats.reads += n as u64;
        if !self.adaptive {
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
            let gpu = gc.gpu;
            let readings = std::mem::take(&mut gc.readings);
            let cw = u64::from(gc.window_ms);
            // A read of about one capture window: checked. Longer windows
            // (a partial-read source's catch-up read) only add to the mean.
            let fine_ms = cw.max(self.capture_ms as u64) * 3 / 2;
            // Decided before this capture changes any state, so the checks
            // only see the reads the plan asked for.
            let mut not_due = std::mem::take(&mut self.not_due);
            not_due.clear();
            if let Some(gs) = self.groups.get(&gpu) {
                not_due.extend(gs.iter().map(|g| !self.group_due(g, now)));
            }
            // Cut at an `align` boundary before this capture joins.
            for g in self.groups.get_mut(&gpu).into_iter().flatten() {
                if g.crosses(now, self.align_ms) {
                    g.cut(now, cw, &mut gc.readings);
                }
            }
            let tpa_now = readings
                .iter()
                .find(|r| r.metric == metrics::TENSOR_ACTIVE)
                .map(|r| r.value.clamp(0.0, 1.0));
            let mut touched = std::mem::take(&mut self.touched);
            touched.clear();
            touched.resize(not_due.len(), false);
            for r in readings {
                let ((gi, ti), inserted) = self.group_for(gpu, r.metric, now);
                if inserted {
                    // A new group is due (it is learning).
                    not_due.insert(gi, false);
                    touched.insert(gi, false);
                }
                touched[gi] = true;
                let checked = !not_due[gi];
                let g = &mut self.groups.get_mut(&gpu).expect("group just made")[gi];
                let t = &mut g.tracks[ti];
                let w = r.window_ms.map_or(cw, u64::from);
                t.sum_vw += r.value * w as f64;
                t.sum_w += w;
                if let (Some(tpa), metrics::SM_CLOCK_AVG_MHZ) = (tpa_now, r.metric) {
                    t.sum_tvw += tpa * r.value * w as f64;
                    t.sum_tw += tpa * w as f64;
                }
                t.n += 1;
                t.last = r.value;
                t.last_ms = now;
                t.peak = t.peak.max(r.peak.unwrap_or(r.value));
                if checked && w <= fine_ms {
                    let was_learning = t.learned.is_none();
                    let c = t.check(now, r.value, &p);
                    g.unlearned -= usize::from(was_learning && t.learned.is_some());
                    g.change = g.change.max(c);
                }
            }
            // In order of name: the trigger group first, so that its snap
            // reaches the others.
            let mut trigger_snapped = false;
            for (g, &touched) in self
                .groups
                .get_mut(&gpu)
                .into_iter()
                .flatten()
                .zip(&touched)
            {
                if !touched {
                    // Not read this capture: a trigger snap makes it due.
                    g.follow |= trigger_snapped && !g.trigger;
                    g.change = Change::None;
                    continue;
                }
                let learning = g.learning();
                let change = std::mem::take(&mut g.change);
                // A fall of the trailing peak shows a drop one window late:
                // a snap within that window has already answered it.
                let snap = change == Change::Snap
                    || (change == Change::Fall && now - g.run_start > self.window_ms)
                    || g.follow
                    || (trigger_snapped && !g.trigger);
                if snap {
                    g.emit(now, cw, &mut gc.readings);
                    g.snap(now);
                    self.stats.snaps += 1;
                    trigger_snapped |= g.trigger;
                } else if g.due(now, self.capture_ms) {
                    g.emit(now, cw, &mut gc.readings);
                    g.period_start = now;
                    if !learning {
                        let jitter: f64 = self.rng.random_range(0.0..=1.0) * self.jitter;
                        let next = g.interval_ms as f64 * (2.0 + jitter);
                        let cap = g.cap(self.percentile);
                        g.interval_ms = (next as i64).clamp(g.min_ms, cap.max(g.min_ms));
                    }
                }
            }
            self.stats.samples += gc.readings.len() as u64;
            self.not_due = not_due;
            self.touched = touched;
        }
    }
}
