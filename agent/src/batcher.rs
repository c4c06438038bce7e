//! Groups captures into batches: samples per GPU × metric, columnar.
//! Each reading becomes its stored point through
//! [`Reading::point`](crate::capture::Reading::point), the pipeline's one
//! conversion.
//!
//! **When a batch is cut** ([`Batcher::due`]): when it holds the most
//! samples a batch may, or by age. While some series held is sampled at
//! least once per flush interval (a fixed sampler, or an adaptive one
//! snapped to its minimum), every flush interval, as always. While every
//! series held comes more slowly (a backed-off adaptive sampler sends one
//! point per interval, its `window_ms` that interval), each point waits
//! at most the shortest such interval, capped at [`MAX_BATCH_AGE`]: the
//! points of one interval leave together, one batch per interval instead
//! of one per second holding almost nothing, and the collector commits
//! that many fewer writes (`flopwatch-bench fleet`). With nothing held,
//! an empty batch (the agent's intervals and backlog, and its sign of
//! life) goes every [`MAX_BATCH_AGE`]. A change snaps the sampler back,
//! its points carry short windows, and the flush interval's cadence
//! resumes. Events (XID) go out at the flush interval.

use crate::capture::Capture;
use flopwatch_proto::model::{Batch, Event, GpuInfo, JobAssignment, Point, SeriesBatch};
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest a batch is held while its samples come slowly: bounds what a
/// kill -9 of an agent without a spool loses, and how late a backed-off
/// agent's samples reach the collector.
pub(crate) const MAX_BATCH_AGE: Duration = Duration::from_secs(10);

/// One (GPU, metric) series: its place in the capture order, and how many
/// points it took since the last cut.
#[derive(Debug)]
struct Slot {
    gpu: usize,
    metric: &'static str,
    points: usize,
}

/// How far past the expected slot [`Batcher::add`] looks before a full
/// search: a capture that skipped a few readings (slow counters between
/// their reads) still finds the next one in this many steps.
const LOOKAHEAD: usize = 16;

/// Accumulates captures until cut.
///
/// Every capture of a source lists its readings in the same order, so the
/// series are kept in the order they were first seen and each reading is
/// first looked for just after the previous one's series: a comparison or
/// two per reading, where a map keyed by (GPU, metric name) compared
/// strings at every level.
///
/// Points are kept in the order they came, each with its series, in one
/// buffer reused from batch to batch, and grouped into series at the cut.
/// A capture's points are then one run of adjacent writes, where a buffer
/// per series made each reading write to memory of its own, which the
/// capture a tenth of a second before had left out of the cache (in a
/// profile of the NVML path, most of the batcher's time was those writes).
#[derive(Debug, Default)]
pub struct Batcher {
    slots: Vec<Slot>,
    /// Where the next reading is expected.
    cursor: usize,
    /// The points since the last cut: (slot, point), in arrival order.
    points: Vec<(u32, Point)>,
    /// The latest capture's attribution, by (inventory index, job id):
    /// several jobs on a shared GPU.
    jobs: BTreeMap<(usize, String), JobAssignment>,
    /// Σ share (ppm) and captures of each shared GPU's jobs since the last
    /// cut: a batch carries their mean share.
    shares: BTreeMap<(usize, String), (u64, u64)>,
    events: Vec<Event>,
    /// Shortest window (ms) of the points added since the last cut.
    interval_ms: Option<u32>,
    /// When the first point or event since the last cut was added.
    first_ms: Option<i64>,
}

impl Batcher {
    /// The slot of (`gpu`, `metric`), made when new.
    fn slot(&mut self, gpu: usize, metric: &'static str) -> usize {
        // Names come from the catalog's constants: the same address, mostly.
        let is = |s: &Slot| s.gpu == gpu && (std::ptr::eq(s.metric, metric) || s.metric == metric);
        let ahead = self.slots.len().min(self.cursor + LOOKAHEAD);
        let found = (self.cursor..ahead)
            .find(|&i| is(&self.slots[i]))
            .or_else(|| self.slots.iter().position(is));
        let i = found.unwrap_or_else(|| {
            self.slots.push(Slot {
                gpu,
                metric,
                points: 0,
            });
            self.slots.len() - 1
        });
        self.cursor = i + 1;
        i
    }

    /// Adds a capture.
    pub fn add(&mut self, capture: Capture, inventory: &[GpuInfo]) {
        self.add_readings(capture.ts_ms, capture.gpus, inventory);
        // The capture's attribution is the current one: a job that ended
        // disappears from the next batch.
        self.jobs.clear();
        for j in capture.jobs {
            if let Some(i) = inventory.iter().position(|g| g.uuid == j.gpu_uuid) {
                let key = (i, j.job_id.clone());
                if let Some(share) = j.share {
                    let e = self.shares.entry(key.clone()).or_default();
                    e.0 += u64::from(share.ppm);
                    e.1 += 1;
                }
                self.jobs.insert(key, j);
            }
        }
        if !capture.events.is_empty() {
            self.first_ms.get_or_insert(capture.ts_ms);
        }
        self.events.extend(capture.events);
    }

    /// Whether `jobs` (a capture's attribution) names other jobs than the
    /// batch holds so far: the sampling loop then cuts the batch first, so
    /// that a batch's samples all belong to its jobs (a job's end is then
    /// exact to the capture, not to the batch).
    pub fn jobs_change(&self, jobs: &[JobAssignment], inventory: &[GpuInfo]) -> bool {
        if self.is_empty() {
            return false;
        }
        // The job ids of each GPU, in both (a share that moves is no
        // change: the batch carries the mean).
        let now: std::collections::BTreeSet<(usize, &str)> = jobs
            .iter()
            .filter_map(|j| {
                let i = inventory.iter().position(|g| g.uuid == j.gpu_uuid)?;
                Some((i, j.job_id.as_str()))
            })
            .collect();
        let held: std::collections::BTreeSet<(usize, &str)> = self
            .jobs
            .keys()
            .filter(|(i, _)| *i < inventory.len())
            .map(|(i, j)| (*i, j.as_str()))
            .collect();
        now != held
    }

    /// Adds what a sampler held back ([`Sampler::flush`](crate::sampler::Sampler::flush)):
    /// readings of earlier captures, with no attribution of their own, so
    /// the current attribution stays.
    pub fn add_held(&mut self, held: Capture, inventory: &[GpuInfo]) {
        self.add_readings(held.ts_ms, held.gpus, inventory);
        self.events.extend(held.events);
    }

    fn add_readings(
        &mut self,
        ts_ms: i64,
        gpus: Vec<crate::capture::GpuCapture>,
        inventory: &[GpuInfo],
    ) {
        self.cursor = 0;
        if gpus.iter().any(|g| !g.readings.is_empty()) {
            self.first_ms.get_or_insert(ts_ms);
        }
        for g in gpus {
            if g.gpu >= inventory.len() {
                continue;
            }
            for r in g.readings {
                let i = self.slot(g.gpu, r.metric);
                let p = r.point(ts_ms, g.window_ms);
                let w = p.window_ms.unwrap_or(0);
                self.interval_ms = Some(self.interval_ms.map_or(w, |m| m.min(w)));
                self.slots[i].points += 1;
                self.points.push((i as u32, p));
            }
        }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.events.is_empty()
    }

    /// How old a batch may grow before it is cut, ms: `flush_ms` while
    /// a series held is sampled at least that often (or an event is
    /// held), else the shortest sampling interval among the series held,
    /// at most [`MAX_BATCH_AGE`] (which is also the pace of the empty
    /// batches that tell the collector an agent with nothing to send is
    /// alive). Never below `flush_ms`. See the module docs.
    pub fn max_age_ms(&self, flush_ms: i64) -> i64 {
        let cap = (MAX_BATCH_AGE.as_millis() as i64).max(flush_ms);
        if !self.events.is_empty() {
            return flush_ms;
        }
        self.interval_ms
            .map_or(cap, |w| i64::from(w).clamp(flush_ms, cap))
    }

    /// When the batch is due by age, unix ms, the last cut having been at
    /// `last_cut_ms`. At the flush interval the cadence is the flush
    /// interval's, as with a fixed sampler; past it, each point waits at
    /// most the max age, so that the points of one sampling interval
    /// (metric groups back off on their own schedules) leave together.
    pub fn due_at(&self, last_cut_ms: i64, flush_ms: i64) -> i64 {
        let age = self.max_age_ms(flush_ms);
        match self.first_ms {
            Some(first) if age > flush_ms => first + age,
            _ => last_cut_ms + age,
        }
    }

    /// Whether to cut at `now_ms`: the batch holds `max_samples`, or it
    /// is due by age ([`Batcher::due_at`]).
    pub fn due(&self, now_ms: i64, last_cut_ms: i64, flush_ms: i64, max_samples: usize) -> bool {
        self.points.len() >= max_samples || now_ms >= self.due_at(last_cut_ms, flush_ms)
    }

    /// The batch's attribution: the latest capture's, each shared GPU's
    /// shares averaged over the captures since the last cut (and made
    /// whole again: they sum to 10⁶ ppm per GPU).
    fn attribution(&mut self) -> Vec<JobAssignment> {
        let shares = std::mem::take(&mut self.shares);
        let mut jobs: Vec<JobAssignment> = self.jobs.values().cloned().collect();
        let mean = |key: &(usize, String)| shares.get(key).map(|(sum, n)| sum / (*n).max(1));
        let keys: Vec<(usize, String)> = self.jobs.keys().cloned().collect();
        for (j, key) in jobs.iter_mut().zip(&keys) {
            if let (Some(share), Some(m)) = (j.share.as_mut(), mean(key)) {
                share.ppm = u32::try_from(m).unwrap_or(u32::MAX);
            }
        }
        // Rounding of the means: the largest share of each GPU takes it.
        let mut by_gpu: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (k, (i, _)) in keys.iter().enumerate() {
            if jobs[k].share.is_some() {
                by_gpu.entry(*i).or_default().push(k);
            }
        }
        for ks in by_gpu.values() {
            let sum: i64 = ks
                .iter()
                .filter_map(|&k| jobs[k].share.map(|s| i64::from(s.ppm)))
                .sum();
            if let Some(&big) = ks.iter().max_by_key(|&&k| jobs[k].share.map(|s| s.ppm)) {
                if let Some(s) = jobs[big].share.as_mut() {
                    s.ppm = (i64::from(s.ppm) + 1_000_000 - sum).clamp(0, 1_000_000) as u32;
                }
            }
        }
        jobs
    }

    /// Takes everything as a batch (seq 0: numbered when first sent),
    /// series in (GPU, metric) order.
    pub fn cut(
        &mut self,
        inventory: &[GpuInfo],
        agent_id: &str,
        boot_id: &str,
        now_ms: i64,
    ) -> Batch {
        // Series in (GPU, metric) order; where each slot's series is.
        let mut order: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].points > 0)
            .collect();
        order.sort_unstable_by_key(|&i| (self.slots[i].gpu, self.slots[i].metric));
        let mut place = vec![usize::MAX; self.slots.len()];
        let mut series: Vec<SeriesBatch> = order
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let s = &self.slots[i];
                place[i] = k;
                SeriesBatch {
                    gpu_uuid: inventory[s.gpu].uuid.clone(),
                    metric: s.metric.to_string(),
                    points: Vec::with_capacity(s.points),
                }
            })
            .collect();
        for (slot, p) in self.points.drain(..) {
            series[place[slot as usize]].points.push(p);
        }
        // A series with nothing since the last cut is forgotten (a metric
        // the filter or a policy dropped); the others keep their place.
        self.slots.retain(|s| s.points > 0);
        for s in &mut self.slots {
            s.points = 0;
        }
        self.interval_ms = None;
        self.first_ms = None;
        Batch {
            seq: 0,
            agent_id: agent_id.to_string(),
            boot_id: boot_id.to_string(),
            series,
            // Attribution rides on every batch: the collector needs no state
            // from earlier batches to attribute this one.
            jobs: self.attribution(),
            events: std::mem::take(&mut self.events),
            sent_at_ms: now_ms,
            ..Batch::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};
    use flopwatch_proto::metrics;

    #[test]
    fn an_aggregated_reading_keeps_its_window_and_peak() {
        let inventory = vec![GpuInfo {
            uuid: "GPU-0".into(),
            ..Default::default()
        }];
        let mut r = Reading::new(metrics::TENSOR_ACTIVE, 0.3);
        r.window_ms = Some(6_400);
        r.peak = Some(0.8);
        let mut b = Batcher::default();
        b.add(
            Capture {
                ts_ms: 10_000,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: vec![r, Reading::new(metrics::POWER_W, 300.0)],
                }],
                ..Default::default()
            },
            &inventory,
        );
        let batch = b.cut(&inventory, "n", "b", 10_000);
        let by_metric = |m: &str| batch.series.iter().find(|s| s.metric == m).unwrap().points[0];
        assert_eq!(
            by_metric(metrics::TENSOR_ACTIVE),
            Point {
                ts_ms: 10_000,
                value: 0.3,
                peak: Some(0.8),
                window_ms: Some(6_400)
            }
        );
        assert_eq!(by_metric(metrics::POWER_W).window_ms, Some(100));
    }

    #[test]
    fn series_come_out_in_gpu_and_metric_order_whatever_the_reading_order() {
        let inventory: Vec<GpuInfo> = (0..2)
            .map(|i| GpuInfo {
                uuid: format!("GPU-{i}"),
                ..Default::default()
            })
            .collect();
        let capture = |ts_ms: i64, per_gpu: &[&'static str]| Capture {
            ts_ms,
            gpus: (0..2)
                .rev()
                .map(|gpu| GpuCapture {
                    gpu,
                    window_ms: 100,
                    readings: per_gpu
                        .iter()
                        .map(|&m| Reading::new(m, ts_ms as f64))
                        .collect(),
                })
                .collect(),
            ..Default::default()
        };
        let mut b = Batcher::default();
        let all = [metrics::TENSOR_ACTIVE, metrics::ENERGY_J, metrics::POWER_W];
        b.add(capture(100, &all), &inventory);
        // A capture that skipped a reading, then one in another order.
        b.add(
            capture(200, &[metrics::TENSOR_ACTIVE, metrics::POWER_W]),
            &inventory,
        );
        b.add(
            capture(
                300,
                &[metrics::POWER_W, metrics::ENERGY_J, metrics::TENSOR_ACTIVE],
            ),
            &inventory,
        );
        assert_eq!(b.len(), 16);
        let batch = b.cut(&inventory, "n", "b", 300);
        let got: Vec<(&str, &str, Vec<i64>)> = batch
            .series
            .iter()
            .map(|s| {
                (
                    s.gpu_uuid.as_str(),
                    s.metric.as_str(),
                    s.points.iter().map(|p| p.ts_ms).collect(),
                )
            })
            .collect();
        let mut want = Vec::new();
        for gpu in ["GPU-0", "GPU-1"] {
            want.push((gpu, metrics::ENERGY_J, vec![100, 300]));
            want.push((gpu, metrics::POWER_W, vec![100, 200, 300]));
            want.push((gpu, metrics::TENSOR_ACTIVE, vec![100, 200, 300]));
        }
        assert_eq!(got, want);
        // Only what came after the cut is in the next batch.
        b.add(capture(400, &[metrics::POWER_W]), &inventory);
        let batch = b.cut(&inventory, "n", "b", 400);
        assert_eq!(batch.series.len(), 2);
        assert!(batch
            .series
            .iter()
            .all(|s| s.metric == metrics::POWER_W && s.points.len() == 1));
    }

    #[test]
    fn batches_are_cut_at_the_pace_samples_come() {
        let inventory = vec![GpuInfo {
            uuid: "GPU-0".into(),
            ..Default::default()
        }];
        let capture = |ts_ms: i64, window: Option<u32>| {
            let mut r = Reading::new(metrics::TENSOR_ACTIVE, 0.5);
            r.window_ms = window;
            Capture {
                ts_ms,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: vec![r],
                }],
                ..Default::default()
            }
        };
        let due = |b: &Batcher, now: i64, last_cut: i64| b.due(now, last_cut, 1_000, 100);
        let mut b = Batcher::default();
        // Fixed 100 ms: the flush interval's cadence.
        b.add(capture(100, None), &inventory);
        assert_eq!(b.max_age_ms(1_000), 1_000);
        assert!(!due(&b, 999, 0));
        assert!(due(&b, 1_000, 0));
        b.cut(&inventory, "n", "b", 1_000);
        // Nothing held: an empty batch per MAX_BATCH_AGE.
        assert!(!due(&b, 10_999, 1_000));
        assert!(due(&b, 11_000, 1_000));
        // Backed off to 6.4 s: a point waits 6.4 s for the others.
        b.add(capture(12_000, Some(6_400)), &inventory);
        b.add(capture(15_000, Some(6_400)), &inventory);
        assert!(!due(&b, 18_399, 11_000));
        assert!(due(&b, 18_400, 11_000));
        b.cut(&inventory, "n", "b", 18_400);
        // Snapped back: the flush interval again.
        b.add(capture(19_000, Some(100)), &inventory);
        assert!(!due(&b, 19_399, 18_400));
        assert!(due(&b, 19_400, 18_400));
        b.cut(&inventory, "n", "b", 19_400);
        // Past the cap.
        b.add(capture(40_000, Some(30_000)), &inventory);
        assert_eq!(b.max_age_ms(1_000), MAX_BATCH_AGE.as_millis() as i64);
        assert!(due(&b, 50_000, 19_400));
        // A longer flush interval is never shortened; a full batch goes now.
        assert_eq!(b.max_age_ms(3_600_000), 3_600_000);
        assert!(b.due(40_000, 40_000, 1_000, 1));
        // An event goes out at the flush interval.
        b.cut(&inventory, "n", "b", 50_000);
        b.add(
            Capture {
                ts_ms: 50_500,
                events: vec![Event::default()],
                ..Default::default()
            },
            &inventory,
        );
        assert_eq!(b.max_age_ms(1_000), 1_000);
        assert!(due(&b, 51_000, 50_000));
    }
}
