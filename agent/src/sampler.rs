//! When to read and what to send.
//!
//! The loop in [`crate::run`] asks a [`Sampler`] how long to wait before the
//! next capture and which readings of a capture to keep. [`FixedSampler`]
//! reads everything at a fixed interval; the adaptive sampler (Moneo §2.3)
//! implements the same trait.
//!
//! **Read savings.** Before a capture the loop may ask [`Sampler::due`]
//! which readings the sampler needs; a source that reads fields one by one
//! (NVML calls) can skip the others. A skipped window-mean metric must be
//! reported, when next read, as the mean over everything since its previous
//! read, with [`Reading::window_ms`](crate::source::Reading) set to that
//! span (counter deltas give this for free). A source that ignores the plan
//! and reads everything stays correct: the sampler then only saves samples.

use crate::source::Capture;
use flopwatch_proto::metrics::{self, Aggregation};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Which readings the next capture needs: everything except `skip`.
/// Readings the sampler has never seen are always wanted, so a new metric
/// or GPU is read at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// (gpu, metric) pairs the sampler does not need, sorted.
    skip: Vec<(usize, &'static str)>,
}

impl ReadPlan {
    /// Read everything.
    pub fn all() -> Self {
        Self::default()
    }

    /// Everything except `skip`.
    pub fn skipping(mut skip: Vec<(usize, &'static str)>) -> Self {
        skip.sort_unstable();
        skip.dedup();
        Self { skip }
    }

    /// Whether `metric` of `gpu` should be read.
    pub fn wants(&self, gpu: usize, metric: &str) -> bool {
        self.skip
            .binary_search_by(|&(g, m)| (g, m).cmp(&(gpu, metric)))
            .is_err()
    }

    /// The pairs that may be skipped.
    pub fn skipped(&self) -> &[(usize, &'static str)] {
        &self.skip
    }
}

/// Applies a [`ReadPlan`] to a source that reads everything anyway (the
/// simulator, a replayed trace), so that what reaches the sampler is what a
/// field-by-field source would have read: readings the plan skips are
/// dropped, and a skipped window-mean reading is folded into the next read
/// of that metric, whose value becomes the mean over the whole span and
/// whose `window_ms` spans it (as a counter-delta source reports it). A
/// skipped point reading is simply not taken.
#[derive(Debug, Default)]
pub struct PlanCarry {
    /// (gpu, metric) → (Σ value × window, Σ window) of skipped windows.
    carry: HashMap<(usize, &'static str), (f64, u64)>,
}

impl PlanCarry {
    /// Applies `plan` to `capture` in place; returns how many readings the
    /// plan skipped.
    pub fn apply(&mut self, plan: &ReadPlan, capture: &mut Capture) -> u64 {
        let mut skipped = 0u64;
        for g in &mut capture.gpus {
            let (gpu, cw) = (g.gpu, g.window_ms);
            let carry = &mut self.carry;
            g.readings.retain_mut(|r| {
                let mean = metrics::lookup(r.metric).map(|d| d.aggregation)
                    == Some(Aggregation::WindowMean);
                let w = u64::from(r.window_ms.unwrap_or(cw));
                if !plan.wants(gpu, r.metric) {
                    skipped += 1;
                    if mean {
                        let e = carry.entry((gpu, r.metric)).or_default();
                        e.0 += r.value * w as f64;
                        e.1 += w;
                    }
                    return false;
                }
                if let Some((svw, sw)) = carry.remove(&(gpu, r.metric)).filter(|x| x.1 > 0) {
                    let total = sw + w;
                    r.value = (svw + r.value * w as f64) / total as f64;
                    r.window_ms = Some(u32::try_from(total).unwrap_or(u32::MAX));
                }
                true
            });
        }
        skipped
    }
}

/// Decides the schedule and what is kept.
pub trait Sampler: Send {
    /// Delay until the next capture.
    fn next_delay(&self) -> Duration;

    /// Filters a capture in place: readings removed are not sent.
    fn observe(&mut self, capture: &mut Capture);

    /// What the capture about to be taken at `at_ms` (unix ms) must read.
    /// The default reads everything.
    fn due(&self, at_ms: i64) -> ReadPlan {
        let _ = at_ms;
        ReadPlan::all()
    }

    /// Each metric's current interval, ms, as (GPU index, metric, ms), for
    /// the collector and the agent's `/metrics`. Empty when the sampler has
    /// one interval for everything.
    fn intervals(&self) -> Vec<(usize, &'static str, u32)> {
        Vec::new()
    }
}

/// Fixed interval; optionally a metric allow-list.
#[derive(Debug, Clone)]
pub struct FixedSampler {
    interval: Duration,
    metrics: Option<HashSet<String>>,
    dropped: Vec<(usize, &'static str)>,
}

impl FixedSampler {
    /// Every `interval`, keeping `metrics` (all when `None`).
    pub fn new(interval: Duration, metrics: Option<HashSet<String>>) -> Self {
        Self {
            interval,
            metrics,
            dropped: Vec::new(),
        }
    }
}

impl Sampler for FixedSampler {
    fn next_delay(&self) -> Duration {
        self.interval
    }

    fn observe(&mut self, capture: &mut Capture) {
        if let Some(keep) = &self.metrics {
            for g in &mut capture.gpus {
                let gpu = g.gpu;
                let dropped = &mut self.dropped;
                g.readings.retain(|r| {
                    let k = keep.contains(r.metric);
                    if !k {
                        if let Err(i) = dropped.binary_search(&(gpu, r.metric)) {
                            dropped.insert(i, (gpu, r.metric));
                        }
                    }
                    k
                });
            }
        }
    }

    /// Metrics outside the allow-list need no read once seen.
    fn due(&self, _at_ms: i64) -> ReadPlan {
        ReadPlan::skipping(self.dropped.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{GpuCapture, Reading};

    fn capture(ts_ms: i64, window_ms: u32, readings: Vec<Reading>) -> Capture {
        Capture {
            ts_ms,
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms,
                readings,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn carry_folds_skipped_window_means_into_the_next_read() {
        let mut carry = PlanCarry::default();
        let skip = ReadPlan::skipping(vec![(0, metrics::SM_ACTIVE), (0, metrics::POWER_W)]);
        let mut c = capture(
            100,
            100,
            vec![
                Reading::new(metrics::SM_ACTIVE, 0.2),
                Reading::new(metrics::POWER_W, 300.0),
                Reading::new(metrics::TENSOR_ACTIVE, 0.5),
            ],
        );
        assert_eq!(carry.apply(&skip, &mut c), 2);
        assert_eq!(
            c.gpus[0].readings,
            vec![Reading::new(metrics::TENSOR_ACTIVE, 0.5)]
        );
        let mut c = capture(
            400,
            300,
            vec![
                Reading::new(metrics::SM_ACTIVE, 0.6),
                Reading::new(metrics::POWER_W, 200.0),
            ],
        );
        assert_eq!(carry.apply(&ReadPlan::all(), &mut c), 0);
        let sm = c.gpus[0].readings[0];
        // (0.2 × 100 + 0.6 × 300) / 400: the exact mean over both windows.
        assert!((sm.value - 0.5).abs() < 1e-12);
        assert_eq!(sm.window_ms, Some(400));
        // A point reading is not averaged: the skipped read never happened.
        assert_eq!(c.gpus[0].readings[1], Reading::new(metrics::POWER_W, 200.0));
    }

    #[test]
    fn allow_list_filters_readings() {
        let mut s = FixedSampler::new(
            Duration::from_millis(100),
            Some(["power_w".to_string()].into()),
        );
        assert!(s.due(0).wants(0, "temp_c"));
        let mut c = Capture {
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 100,
                readings: vec![Reading::new("power_w", 1.0), Reading::new("temp_c", 2.0)],
            }],
            ..Default::default()
        };
        s.observe(&mut c);
        assert_eq!(c.gpus[0].readings.len(), 1);
        assert_eq!(s.next_delay(), Duration::from_millis(100));
        let plan = s.due(100);
        assert!(!plan.wants(0, "temp_c"));
        assert!(plan.wants(0, "power_w"));
        assert!(plan.wants(1, "temp_c"));
    }
}
