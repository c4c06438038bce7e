//! What ingest queues for remote write: a batch's journal entry, built
//! from the batch's own GPUs (`live::batch_gpus`) and samples: OFU, tensor
//! activity and SM clock when the batch had OFU, and each configured
//! counter when the batch carried it — a counter the batch did not carry
//! is not sent again. Per series, as [`Fidelity`] says: the batch's mean
//! (a counter's newest value), that plus the batch's `_max` and `_count`,
//! or every sample. The entry goes into the store with the batch
//! (`store::journal`).
//!
//! It also remembers which series it queued, to end them with
//! staleness markers: at once for a GPU's series whose labels changed
//! (its job ended or changed), and once a series goes stale
//! ([`RemoteQueue::expire`]).

use super::{labels, request, Label, Point, STALE_NAN};
use crate::live::GpuLive;
use crate::series::{family_of, gpu_labels, On};
use crate::store::journal;
use crate::store::{CommitSet, Store, StoreError};
use flopwatch_proto::metrics as m;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

/// A GPU's series of one name queued and not yet ended: its labels, its
/// newest sample's time, and the collector time after which it is stale.
#[derive(Debug, Clone)]
struct Sent {
    labels: Vec<Label>,
    last_ts: i64,
    until_ms: i64,
}

/// What a batch sends of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fidelity {
    /// One point: the batch's mean (a counter's newest value).
    Mean,
    /// The mean, and the batch's maximum (`<name>_max`) and sample count
    /// (`<name>_count`) at the same time; a counter sends its newest value
    /// only.
    Summary,
    /// Every sample of the batch.
    Full,
}

impl Fidelity {
    fn parse(s: &str) -> Self {
        match s {
            "summary" => Self::Summary,
            "full" => Self::Full,
            _ => Self::Mean,
        }
    }
}

/// Remote write's side of ingest, over the store's journal.
pub struct RemoteQueue {
    /// Per series kind (`"ofu"` or a catalog name); else `fidelity`.
    fidelity_by: HashMap<String, Fidelity>,
    fidelity: Fidelity,
    pub(super) store: Store,
    metrics: Vec<String>,
    external: Vec<(String, String)>,
    /// The series queued and not ended, by GPU and name (one label set
    /// each: a GPU's series changes labels only when its job does).
    sent: Mutex<HashMap<(String, String), Sent>>,
    /// Points in the journal (counted from it when the sender starts).
    pub(super) pending: AtomicI64,
    /// The oldest pending point's time (`i64::MAX`: none).
    pub(super) oldest_ms: AtomicI64,
}

impl std::fmt::Debug for RemoteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteQueue")
            .field("metrics", &self.metrics)
            .field("external", &self.external)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl RemoteQueue {
    /// Forwarding into `store`'s journal; `metrics` are the counters sent
    /// besides the OFU series, `external` labels are added to every
    /// series that does not have them.
    pub fn new(store: Store, metrics: Vec<String>, external: &BTreeMap<String, String>) -> Self {
        Self {
            fidelity_by: HashMap::new(),
            fidelity: Fidelity::Mean,
            store,
            metrics,
            external: external
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            sent: Mutex::new(HashMap::new()),
            pending: AtomicI64::new(0),
            oldest_ms: AtomicI64::new(i64::MAX),
        }
    }

    /// Sends `default` of every series, `by_metric` of those it names
    /// (`"ofu"`, or a catalog metric).
    pub fn with_fidelity(mut self, default: &str, by_metric: &BTreeMap<String, String>) -> Self {
        self.fidelity = Fidelity::parse(default);
        self.fidelity_by = by_metric
            .iter()
            .map(|(k, v)| (k.clone(), Fidelity::parse(v)))
            .collect();
        self
    }

    fn fidelity_of(&self, what: &str) -> Fidelity {
        self.fidelity_by.get(what).copied().unwrap_or(self.fidelity)
    }

    /// Points in the journal, as last counted.
    pub fn pending(&self) -> u64 {
        u64::try_from(self.pending.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// The oldest pending point's time, unix ms.
    pub fn oldest_ms(&self) -> Option<i64> {
        Some(self.oldest_ms.load(Ordering::Relaxed)).filter(|&t| t != i64::MAX)
    }

    /// A series' labels: the GPU's, then the external ones it lacks.
    fn base(&self, g: &GpuLive) -> Vec<(String, String)> {
        let mut l = gpu_labels(g);
        for (k, v) in &self.external {
            if !l.iter().any(|(n, _)| n == k) {
                l.push((k.clone(), v.clone()));
            }
        }
        l
    }

    /// The journal entry of a batch whose GPUs are `gpus`
    /// (`live::batch_gpus`) and whose samples are `set`'s; empty when
    /// there is nothing to send. The points of series relabelled since
    /// their last batch (a job that ended) get their staleness markers in
    /// it.
    pub fn entry(&self, gpus: &[GpuLive], set: &CommitSet) -> Vec<u8> {
        let mut points = Vec::new();
        for g in gpus {
            let base = self.base(g);
            let mut new = Vec::new();
            // (name, when it goes stale) of each point, in `new`'s order.
            let mut ends = Vec::new();
            let mut push = |name: &str, ts: i64, value: f64, until: i64| {
                new.push(Point {
                    labels: labels(name, &base),
                    ts_ms: ts,
                    value,
                });
                ends.push((name.to_string(), until));
            };
            let ofu_ts = g.counters.get(m::TENSOR_ACTIVE).map(|c| c.0);
            if let (Some(ts), Some(ofu)) = (ofu_ts, g.ofu) {
                let until = g.ofu_fresh.seen_ms + g.ofu_fresh.for_ms;
                let samples = set
                    .ofu
                    .iter()
                    .filter(|(gpu, _, _)| *gpu == g.uuid)
                    .flat_map(|(_, _, s)| s.iter());
                match self.fidelity_of("ofu") {
                    Fidelity::Full => {
                        for x in samples {
                            push("flopwatch_ofu_ratio", x.ts_ms, x.ofu, until);
                            push(
                                "flopwatch_ofu_tensor_active_ratio",
                                x.ts_ms,
                                x.tensor_active,
                                until,
                            );
                            push(
                                "flopwatch_ofu_sm_clock_hertz",
                                x.ts_ms,
                                x.sm_clock_mhz * 1e6,
                                until,
                            );
                        }
                    }
                    f => {
                        push("flopwatch_ofu_ratio", ts, ofu, until);
                        push(
                            "flopwatch_ofu_tensor_active_ratio",
                            ts,
                            g.tensor_active,
                            until,
                        );
                        push(
                            "flopwatch_ofu_sm_clock_hertz",
                            ts,
                            g.sm_clock_mhz * 1e6,
                            until,
                        );
                        if f == Fidelity::Summary {
                            let (max, n) = samples
                                .fold((f64::NEG_INFINITY, 0u32), |(m, n), x| (m.max(x.ofu), n + 1));
                            if n > 0 {
                                push("flopwatch_ofu_ratio_max", ts, max, until);
                                push("flopwatch_ofu_ratio_count", ts, f64::from(n), until);
                            }
                        }
                    }
                }
            }
            // The same families, names and base units as on /metrics.
            for metric in &self.metrics {
                let (Some((ts, v)), Some(f)) = (g.counters.get(metric), family_of(metric, On::Gpu))
                else {
                    continue;
                };
                let name = f.sample_name();
                let fresh = g.fresh.get(metric).copied().unwrap_or_default();
                let until = fresh.seen_ms + fresh.for_ms;
                let series = set
                    .series
                    .iter()
                    .find(|s| s.gpu_uuid == g.uuid && s.metric == *metric);
                match (self.fidelity_of(metric), series) {
                    (Fidelity::Full, Some(s)) => {
                        for p in &s.points {
                            push(&name, p.ts_ms, p.value * f.scale, until);
                        }
                    }
                    (Fidelity::Summary, Some(s)) if !f.counter => {
                        push(&name, *ts, mean(s) * f.scale, until);
                        let max = s
                            .points
                            .iter()
                            .map(|p| p.value)
                            .fold(f64::NEG_INFINITY, f64::max);
                        push(&format!("{name}_max"), *ts, max * f.scale, until);
                        push(&format!("{name}_count"), *ts, s.points.len() as f64, until);
                    }
                    (_, Some(s)) if !f.counter => push(&name, *ts, mean(s) * f.scale, until),
                    _ => push(&name, *ts, v * f.scale, until),
                }
            }
            points.extend(self.note_sent(&g.uuid, &new, ends));
            points.extend(new);
        }
        entry_of(&points)
    }

    /// Records `new` as the GPU's current series, and returns the
    /// staleness markers of its series of the same names under other labels
    /// (a job that ended): those end where the new ones begin.
    fn note_sent(&self, gpu: &str, new: &[Point], ends: Vec<(String, i64)>) -> Vec<Point> {
        let Ok(mut sent) = self.sent.lock() else {
            return Vec::new();
        };
        let mut markers = Vec::new();
        for (p, (name, until_ms)) in new.iter().zip(ends) {
            let now = Sent {
                labels: p.labels.clone(),
                last_ts: p.ts_ms,
                until_ms,
            };
            if let Some(before) = sent.insert((gpu.to_string(), name), now) {
                if before.labels != p.labels {
                    markers.push(Point {
                        labels: before.labels,
                        ts_ms: p.ts_ms.max(before.last_ts + 1),
                        value: f64::from_bits(STALE_NAN),
                    });
                }
            }
        }
        markers
    }

    /// A batch with `entry` was committed: its points are pending.
    pub fn committed(&self, entry: &[u8]) {
        if let Some((n, oldest)) = head(entry) {
            self.pending.fetch_add(i64::from(n), Ordering::Relaxed);
            self.oldest_ms.fetch_min(oldest, Ordering::Relaxed);
        }
    }

    /// Journals a staleness marker for every series gone stale by `now_ms`
    /// (collector clock), just after its last sample or at `now_ms`.
    pub fn expire(&self, now_ms: i64) -> Result<(), StoreError> {
        let markers: Vec<Point> = {
            let Ok(mut sent) = self.sent.lock() else {
                return Ok(());
            };
            let mut out = Vec::new();
            sent.retain(|_, s| {
                if s.until_ms >= now_ms {
                    return true;
                }
                out.push(Point {
                    labels: std::mem::take(&mut s.labels),
                    ts_ms: now_ms.max(s.last_ts + 1),
                    value: f64::from_bits(STALE_NAN),
                });
                false
            });
            out
        };
        let entry = entry_of(&markers);
        if entry.is_empty() {
            return Ok(());
        }
        self.store.journal_append(entry.clone())?;
        self.committed(&entry);
        Ok(())
    }
}

/// A gauge's mean over a batch, each sample weighted by its window where
/// the samples have windows.
fn mean(s: &flopwatch_proto::model::SeriesBatch) -> f64 {
    let (mut sum, mut w) = (0.0, 0.0);
    for p in &s.points {
        let k = f64::from(p.window_ms.filter(|&w| w > 0).unwrap_or(1));
        sum += p.value * k;
        w += k;
    }
    if w > 0.0 {
        sum / w
    } else {
        f64::NAN
    }
}

/// The journal entry holding `points` (empty for none).
pub(super) fn entry_of(points: &[Point]) -> Vec<u8> {
    if points.is_empty() {
        return Vec::new();
    }
    let oldest = points.iter().map(|p| p.ts_ms).min().unwrap_or(0);
    let body = request(points).encode_to_vec();
    journal::value(
        u32::try_from(points.len()).unwrap_or(u32::MAX),
        oldest,
        &body,
    )
}

/// An entry's point count and oldest time.
fn head(entry: &[u8]) -> Option<(u32, i64)> {
    let n = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?);
    let oldest = i64::from_be_bytes(entry.get(4..12)?.try_into().ok()?);
    Some((n, oldest))
}

#[cfg(test)]
mod tests {
    use super::super::points_of;
    use super::*;
    use crate::live::Freshness;
    use crate::store::memory::MemEngine;
    use std::sync::Arc;

    fn queue(metrics: &[&str], external: &[(&str, &str)]) -> RemoteQueue {
        RemoteQueue::new(
            Store::new(Arc::new(MemEngine::new()), false),
            metrics.iter().map(|m| m.to_string()).collect(),
            &external
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// A GPU as a batch tells it: OFU from tensor activity at `ts`, power
    /// at 5, both current until 20.3 s.
    fn gpu(ofu: f64, ts: i64) -> GpuLive {
        let fresh = Freshness {
            seen_ms: 10_000,
            for_ms: 10_300,
        };
        GpuLive {
            tenant: "t".into(),
            uuid: "GPU-1".into(),
            model: "H100".into(),
            hostname: "h".into(),
            node_id: "n".into(),
            ofu: Some(ofu),
            tensor_active: 0.5,
            sm_clock_mhz: 1800.0,
            counters: [
                ("power_w".to_string(), (5, 300.0)),
                (m::TENSOR_ACTIVE.to_string(), (ts, 0.5)),
            ]
            .into(),
            ofu_fresh: fresh,
            fresh: [("power_w".to_string(), fresh)].into(),
            ..Default::default()
        }
    }

    /// The points of an entry.
    fn points(entry: &[u8]) -> Vec<Point> {
        let (n, _) = head(entry).unwrap();
        let p = points_of(&entry[12..]).unwrap();
        assert_eq!(p.len() as u32, n);
        p
    }

    fn name(p: &Point) -> String {
        p.labels
            .iter()
            .find(|l| l.name == "__name__")
            .map(|l| l.value.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_batch_sends_ofu_and_its_counters_in_base_units() {
        let q = queue(
            &["power_w", "energy_j"],
            &[("site", "eu-1"), ("hostname", "x")],
        );
        let mut g = gpu(0.25, 1_000);
        g.counters.insert("energy_j".into(), (5, 1234.0));
        let pts = points(&q.entry(&[g], &CommitSet::default()));
        let named: Vec<(String, f64)> = pts.iter().map(|p| (name(p), p.value)).collect();
        for want in [
            ("flopwatch_ofu_ratio", 0.25),
            ("flopwatch_gpu_power_watts", 300.0),
            ("flopwatch_gpu_energy_joules_total", 1234.0),
            ("flopwatch_ofu_sm_clock_hertz", 1.8e9),
        ] {
            assert!(
                named.iter().any(|(n, v)| n == want.0 && *v == want.1),
                "{want:?} not in {named:?}"
            );
        }
        // External labels join where the series has none of its own; the
        // OFU is at the tensor sample's time.
        for p in &pts {
            let get = |k: &str| {
                p.labels
                    .iter()
                    .find(|l| l.name == k)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(get("site"), Some("eu-1"));
            assert_eq!(get("hostname"), Some("h"));
        }
        let ofu = pts
            .iter()
            .find(|p| name(p) == "flopwatch_ofu_ratio")
            .unwrap();
        assert_eq!(ofu.ts_ms, 1_000);
        // A GPU the batch carried nothing configured for: nothing to send.
        let mut quiet = gpu(0.25, 1_000);
        quiet.ofu = None;
        quiet.counters.clear();
        assert!(q.entry(&[quiet], &CommitSet::default()).is_empty());
    }

    #[test]
    fn series_that_stop_get_staleness_markers() {
        let q = queue(&["power_w"], &[]);
        let mut g = gpu(0.25, 1_000);
        g.job = Some(flopwatch_proto::v1::JobAssignment {
            job_id: "train".into(),
            ..Default::default()
        });
        assert_eq!(
            points(&q.entry(&[g.clone()], &CommitSet::default())).len(),
            4
        );
        // The job ended: the GPU's series lose the job's labels, and the
        // job's series end where the new ones begin.
        g.job = None;
        let mut g2 = g.clone();
        g2.counters.insert(m::TENSOR_ACTIVE.into(), (2_000, 0.5));
        let pts = points(&q.entry(&[g2], &CommitSet::default()));
        let stale: Vec<&Point> = pts
            .iter()
            .filter(|p| p.value.to_bits() == STALE_NAN)
            .collect();
        assert_eq!(stale.len(), 4, "{pts:?}");
        for p in &stale {
            assert!(p
                .labels
                .iter()
                .any(|l| l.name == "job_id" && l.value == "train"));
            // OFU's at the new sample's time; power's (its reading did
            // not move, at 5) just after its last.
            let want = if name(p) == "flopwatch_gpu_power_watts" {
                6
            } else {
                2_000
            };
            assert_eq!(p.ts_ms, want, "{p:?}");
        }
        // Nothing more arrives: past their bound, the current ones end,
        // journaled.
        q.expire(20_300).unwrap();
        assert!(
            q.store.journal_read(0, u64::MAX).unwrap().0.is_empty(),
            "still current"
        );
        q.expire(20_301).unwrap();
        let (e, _) = q.store.journal_read(0, u64::MAX).unwrap();
        assert_eq!(e.len(), 1);
        let pts = points_of(&e[0].body).unwrap();
        assert_eq!(pts.len(), 4);
        assert!(pts
            .iter()
            .all(|p| p.value.to_bits() == STALE_NAN && p.ts_ms == 20_301));
        assert!(pts
            .iter()
            .all(|p| !p.labels.iter().any(|l| l.name == "job_id")));
        assert_eq!(q.pending(), 4);
        // Each series ends once.
        q.expire(30_000).unwrap();
        assert_eq!(q.store.journal_read(0, u64::MAX).unwrap().0.len(), 1);
    }

    #[test]
    fn fidelity_sends_the_mean_a_summary_or_every_sample() {
        use crate::store::OfuSample;
        use flopwatch_proto::model::{Point as Sample, SeriesBatch};
        let mut g = gpu(0.3, 2_000);
        g.counters.insert("power_w".into(), (2_000, 320.0));
        let set = CommitSet {
            ofu: vec![(
                "GPU-1".into(),
                None,
                (0..4)
                    .map(|i| OfuSample {
                        ts_ms: 500 * (i + 1),
                        ofu: [0.2, 0.4, 0.25, 0.35][i as usize],
                        tensor_active: 0.5,
                        sm_clock_mhz: 1800.0,
                        window_ms: 500,
                    })
                    .collect(),
            )],
            series: vec![SeriesBatch {
                gpu_uuid: "GPU-1".into(),
                metric: "power_w".into(),
                points: [(1_000, 280.0), (2_000, 320.0)]
                    .into_iter()
                    .map(|(ts_ms, value)| Sample {
                        ts_ms,
                        value,
                        peak: None,
                        window_ms: Some(1_000),
                    })
                    .collect(),
            }],
            ..Default::default()
        };
        let named = |q: &RemoteQueue| -> Vec<(String, i64, f64)> {
            let mut v: Vec<(String, i64, f64)> = points(&q.entry(&[g.clone()], &set))
                .iter()
                .map(|p| (name(p), p.ts_ms, p.value))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            v
        };
        // Mean: the batch's OFU mean and power's mean over its samples.
        let mean = named(&queue(&["power_w"], &[]));
        assert_eq!(mean.len(), 4);
        assert!(mean.contains(&("flopwatch_gpu_power_watts".into(), 2_000, 300.0)));
        assert!(mean.contains(&("flopwatch_ofu_ratio".into(), 2_000, 0.3)));
        // Summary: plus the batch's maximum and count.
        let q = queue(&["power_w"], &[]).with_fidelity("summary", &BTreeMap::new());
        let sum = named(&q);
        for want in [
            ("flopwatch_ofu_ratio_max", 2_000, 0.4),
            ("flopwatch_ofu_ratio_count", 2_000, 4.0),
            ("flopwatch_gpu_power_watts_max", 2_000, 320.0),
            ("flopwatch_gpu_power_watts_count", 2_000, 2.0),
        ] {
            assert!(
                sum.contains(&(want.0.into(), want.1, want.2)),
                "{want:?} in {sum:?}"
            );
        }
        // Full for OFU only: every OFU sample, power's mean.
        let q = queue(&["power_w"], &[])
            .with_fidelity("mean", &[("ofu".to_string(), "full".to_string())].into());
        let full = named(&q);
        let ofu: Vec<(i64, f64)> = full
            .iter()
            .filter(|p| p.0 == "flopwatch_ofu_ratio")
            .map(|p| (p.1, p.2))
            .collect();
        assert_eq!(
            ofu,
            [(500, 0.2), (1_000, 0.4), (1_500, 0.25), (2_000, 0.35)]
        );
        assert_eq!(
            full.iter()
                .filter(|p| p.0 == "flopwatch_gpu_power_watts")
                .count(),
            1
        );
    }
}
