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

/// Which readings the next capture needs: everything except what it
/// skips. Readings the sampler has never seen are always wanted, so a new
/// metric or GPU is read at once; so is a metric outside the catalog.
///
/// A plan is made at every capture and asked about every reading, so it
/// is a bit set per device (bit *i*: the catalog's *i*-th metric,
/// [`metrics::index`]): combining two plans is an OR of words, and a
/// question is one lookup of the name and a bit test. A node's devices
/// (8 GPUs, their InfiniBand ports, NUMA nodes, the host) fit in the plan
/// itself, so making one allocates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// Per device, the catalog metrics skipped; no trailing empty sets, so
    /// equal plans compare equal.
    skip: smallvec::SmallVec<[u64; 24]>,
}

// One word per device holds the whole catalog.
const _: () = assert!(metrics::CATALOG.len() <= u64::BITS as usize);

impl ReadPlan {
    /// Read everything.
    pub fn all() -> Self {
        Self::default()
    }

    /// Everything except `skip`, as (device, metric) pairs in any order.
    pub fn skipping(skip: impl IntoIterator<Item = (usize, &'static str)>) -> Self {
        let mut plan = Self::default();
        for (device, metric) in skip {
            plan.skip(device, metric);
        }
        plan
    }

    /// Also skips `metric` of `device` (nothing when it is not in the
    /// catalog: such a metric is always read).
    pub fn skip(&mut self, device: usize, metric: &str) {
        if let Some(i) = metrics::index(metric) {
            self.skip_set(device, 1 << i);
        }
    }

    /// Also skips the metrics of `set` (a bit set as [`ReadPlan::set_of`]
    /// makes) of `device`.
    pub fn skip_set(&mut self, device: usize, set: u64) {
        if set == 0 {
            return;
        }
        if self.skip.len() <= device {
            self.skip.resize(device + 1, 0);
        }
        self.skip[device] |= set;
    }

    /// The bit set of `names` (those in the catalog), for
    /// [`ReadPlan::skip_set`].
    pub fn set_of<'a>(names: impl IntoIterator<Item = &'a str>) -> u64 {
        names
            .into_iter()
            .filter_map(metrics::index)
            .fold(0, |set, i| set | 1 << i)
    }

    /// This plan, also skipping what `other` skips.
    pub fn also_skipping(mut self, other: &ReadPlan) -> Self {
        if self.skip.len() < other.skip.len() {
            self.skip.resize(other.skip.len(), 0);
        }
        for (a, b) in self.skip.iter_mut().zip(&other.skip) {
            *a |= b;
        }
        self
    }

    /// Whether `metric` of `device` should be read.
    pub fn wants(&self, device: usize, metric: &str) -> bool {
        match (self.skip.get(device), metrics::index(metric)) {
            (Some(set), Some(i)) => set & (1 << i) == 0,
            _ => true,
        }
    }

    /// How many (device, metric) pairs may be skipped.
    pub fn skipped_count(&self) -> usize {
        self.skip.iter().map(|s| s.count_ones() as usize).sum()
    }

    /// The pairs that may be skipped, by device, then in catalog order.
    pub fn skipped(&self) -> Vec<(usize, &'static str)> {
        self.skip
            .iter()
            .enumerate()
            .flat_map(|(device, &set)| {
                metrics::CATALOG
                    .iter()
                    .enumerate()
                    .filter(move |(i, _)| set & (1 << i) != 0)
                    .map(move |(_, m)| (device, m.name))
            })
            .collect()
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
    fn combined_plans_skip_the_union() {
        use metrics::{POWER_W as P, SM_ACTIVE as S, TENSOR_ACTIVE as T};
        let base = vec![(0, T), (2, P), (1, S)];
        for more in [
            vec![(0, P), (1, S), (3, T)],
            vec![(3, T), (0, P), (1, S)],
            vec![(0, T), (2, P)],
            vec![(5, S)],
            vec![],
        ] {
            let got =
                ReadPlan::skipping(base.clone()).also_skipping(&ReadPlan::skipping(more.clone()));
            let mut want: Vec<_> = base.iter().chain(&more).copied().collect();
            want.sort_by_key(|&(d, m)| (d, metrics::index(m)));
            want.dedup();
            assert_eq!(got.skipped(), want, "{more:?}");
            assert_eq!(got.skipped_count(), want.len());
            for (g, m) in &want {
                assert!(!got.wants(*g, m));
            }
            assert!(got.wants(4, T) && got.wants(0, S) && got.wants(9, P));
            // The same plan made in another order is equal.
            let mut rev = want.clone();
            rev.reverse();
            assert_eq!(ReadPlan::skipping(rev), got);
        }
        assert_eq!(
            ReadPlan::all().also_skipping(&ReadPlan::all()),
            ReadPlan::all()
        );
    }

    #[test]
    fn a_metric_outside_the_catalog_is_always_read() {
        let plan = ReadPlan::skipping(vec![(0, "not_a_metric"), (0, metrics::POWER_W)]);
        assert!(plan.wants(0, "not_a_metric"));
        assert!(!plan.wants(0, metrics::POWER_W));
        assert_eq!(plan.skipped(), vec![(0, metrics::POWER_W)]);
        let mut set_plan = ReadPlan::all();
        set_plan.skip_set(0, ReadPlan::set_of([metrics::POWER_W, "not_a_metric"]));
        assert_eq!(set_plan, plan);
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
