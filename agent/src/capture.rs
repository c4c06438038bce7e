//! What one capture reads, and what the next one must read.
//!
//! Sources produce [`Capture`]s, samplers filter and aggregate them, the
//! batcher turns their [`Reading`]s into stored [`Point`]s
//! ([`Reading::point`], the pipeline's one conversion). A [`ReadPlan`] is
//! a sampler's answer to "what must the next capture read"; [`PlanCarry`]
//! applies it to sources that read everything anyway. Sources and
//! samplers both import this module, and it imports neither.

use flopwatch_proto::metrics::{self, Aggregation};
use flopwatch_proto::model::{Event, JobAssignment, Point};
use std::collections::HashMap;

/// One metric's value from one capture.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Catalog name ([`flopwatch_proto::metrics`]).
    pub metric: &'static str,
    /// Value; for window-mean metrics, the mean since the previous capture.
    pub value: f64,
    /// Highest sub-window value, when a sampler aggregated several reads.
    pub peak: Option<f64>,
    /// Window this value covers, ms, when it differs from the capture's
    /// (a sampler that backed off aggregates several captures into one).
    pub window_ms: Option<u32>,
    /// End of the window, unix ms, when it ends before the capture: a
    /// sampler's aggregate cut at an `align` boundary covers the captures
    /// before the boundary, and the capture that crossed it starts the next.
    pub end_ms: Option<i64>,
}

impl Reading {
    /// A plain reading covering the capture's window.
    pub const fn new(metric: &'static str, value: f64) -> Self {
        Self {
            metric,
            value,
            peak: None,
            window_ms: None,
            end_ms: None,
        }
    }

    /// The stored sample this reading becomes, in a capture taken at
    /// `capture_ms` whose window-mean readings cover `capture_window_ms`
    /// (0: no window yet). The one conversion of the pipeline: the agent's
    /// batches, `eval-sampling` and the benches all go through it, so the
    /// window and peak a sampler set reach the collector, which weights
    /// each sample by its window (OFU eq. 11 with unequal windows).
    pub fn point(&self, capture_ms: i64, capture_window_ms: u32) -> Point {
        Point {
            ts_ms: self.end_ms.unwrap_or(capture_ms),
            value: self.value,
            peak: self.peak,
            window_ms: self
                .window_ms
                .or((capture_window_ms > 0).then_some(capture_window_ms)),
        }
    }
}

/// Everything read from one GPU in one capture.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuCapture {
    /// Index into [`GpuSource::inventory`](crate::source::GpuSource::inventory).
    pub gpu: usize,
    /// Length of the window the window-mean readings cover, ms (0 for the
    /// first capture, which has no window yet).
    pub window_ms: u32,
    /// The readings.
    pub readings: Vec<Reading>,
}

/// One pass over every GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capture {
    /// When the capture was taken, unix ms.
    pub ts_ms: i64,
    /// Per-GPU readings.
    pub gpus: Vec<GpuCapture>,
    /// Current job attribution, when the source knows it.
    pub jobs: Vec<JobAssignment>,
    /// Events since the previous capture.
    pub events: Vec<Event>,
}

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
        // Plans are made at every capture, mostly from lists already in
        // order: checking is cheaper than sorting.
        if !skip.is_sorted() {
            skip.sort_unstable();
        }
        skip.dedup();
        Self { skip }
    }

    /// This plan, also skipping `more`. Plans are combined at every
    /// capture from lists already in order, so a sorted `more` is merged
    /// (linear) rather than appended and sorted again.
    pub fn also_skipping(self, more: &[(usize, &'static str)]) -> Self {
        if more.is_empty() {
            return self;
        }
        if !more.is_sorted() {
            let mut skip = self.skip;
            skip.extend_from_slice(more);
            return Self::skipping(skip);
        }
        let mut skip = Vec::with_capacity(self.skip.len() + more.len());
        let (mut a, mut b) = (
            self.skip.into_iter().peekable(),
            more.iter().copied().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x <= y => a.next(),
                (Some(_), Some(_)) | (None, Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, None) => break,
            };
            if let Some(p) = next {
                if skip.last() != Some(&p) {
                    skip.push(p);
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_reading_keeps_its_sampler_window_and_peak() {
        let mut r = Reading::new(metrics::TENSOR_ACTIVE, 0.4);
        assert_eq!(
            r.point(1_000, 100),
            Point {
                ts_ms: 1_000,
                value: 0.4,
                peak: None,
                window_ms: Some(100)
            }
        );
        assert_eq!(r.point(1_000, 0).window_ms, None);
        r.window_ms = Some(3_200);
        r.peak = Some(0.9);
        r.end_ms = Some(900);
        let p = r.point(1_000, 100);
        assert_eq!(
            (p.ts_ms, p.peak, p.window_ms),
            (900, Some(0.9), Some(3_200))
        );
    }

    #[test]
    fn combined_plans_skip_the_union_in_order_once() {
        use metrics::{POWER_W as P, SM_ACTIVE as S, TENSOR_ACTIVE as T};
        let base = ReadPlan::skipping(vec![(0, T), (2, P), (1, S)]);
        let union = |more: &[(usize, &'static str)]| {
            let mut want: Vec<_> = base.skipped().iter().chain(more).copied().collect();
            want.sort_unstable();
            want.dedup();
            want
        };
        for more in [
            vec![(0, P), (1, S), (3, T)],
            vec![(3, T), (0, P), (1, S)],
            vec![(0, T), (2, P)],
            vec![(5, S)],
        ] {
            let got = ReadPlan::skipping(base.skipped().to_vec()).also_skipping(&more);
            assert_eq!(got.skipped(), union(&more).as_slice(), "{more:?}");
            for (g, m) in union(&more) {
                assert!(!got.wants(g, m));
            }
            assert!(got.wants(4, T));
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
}
