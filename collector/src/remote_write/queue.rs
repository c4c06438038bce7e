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
//! ([`RemoteQueue::expire`]). What it remembers is kept in the store too
//! (the journal's open-series register, written with the batch that
//! starts or relabels a series and deleted with the marker that ends it:
//! nothing per batch in the steady state), so that after a restart —
//! `kill -9` included — a series that does not come back still gets its
//! marker ([`RemoteQueue::restore`]).

use super::open::{Base, Noted, OpenSeries};
use super::wire;
use super::STALE_NAN;
use crate::live::BatchGpu;
#[cfg(test)]
use crate::live::GpuLive;
use crate::series::{family_of, label_refs, Family, On};
use crate::store::journal::{self, OpenEntries};
use crate::store::{CommitSet, Store, StoreError};
use flopwatch_proto::metrics as m;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// What a batch sends of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fidelity {
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

/// A counter remote write sends besides the OFU series, named once.
#[derive(Debug)]
struct Counter {
    metric: String,
    family: Family,
    /// Its samples' name, and its summary's.
    name: String,
    max: String,
    count: String,
    fidelity: Fidelity,
}

/// Remote write's side of ingest, over the store's journal.
pub struct RemoteQueue {
    /// Per series kind (`"ofu"` or a catalog name); else `fidelity`.
    fidelity_by: HashMap<String, Fidelity>,
    fidelity: Fidelity,
    pub(super) store: Store,
    metrics: Vec<String>,
    /// `metrics`, to look a batch's series up in.
    forwarded: HashSet<String>,
    /// The catalog's among `metrics`, in their order.
    counters: Vec<Counter>,
    external: Vec<(String, String)>,
    /// The series queued and not ended, by GPU and name (one label set
    /// each: a GPU's series changes labels only when its job does).
    sent: Mutex<OpenSeries>,
    /// Points in the journal (counted from it when the sender starts).
    pub(super) pending: AtomicI64,
    /// The oldest pending point's time (`i64::MAX`: none).
    pub(super) oldest_ms: AtomicI64,
    /// Told when `pending` rises to `fill_at` (a request's worth): the
    /// sender sends then rather than waiting out its `interval`.
    pub(super) filled: tokio::sync::Notify,
    /// The pending count that wakes the sender (`i64::MAX`: none yet).
    pub(super) fill_at: AtomicI64,
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
        let counters = metrics
            .iter()
            .filter_map(|metric| {
                let family = family_of(metric, On::Gpu)?;
                let name = family.sample_name();
                Some(Counter {
                    metric: metric.clone(),
                    max: format!("{name}_max"),
                    count: format!("{name}_count"),
                    name,
                    family,
                    fidelity: Fidelity::Mean,
                })
            })
            .collect();
        Self {
            fidelity_by: HashMap::new(),
            fidelity: Fidelity::Mean,
            store,
            forwarded: metrics.iter().cloned().collect(),
            counters,
            metrics,
            external: external
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            sent: Mutex::new(OpenSeries::default()),
            pending: AtomicI64::new(0),
            oldest_ms: AtomicI64::new(i64::MAX),
            filled: tokio::sync::Notify::new(),
            fill_at: AtomicI64::new(i64::MAX),
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
        for c in &mut self.counters {
            c.fidelity = self
                .fidelity_by
                .get(&c.metric)
                .copied()
                .unwrap_or(self.fidelity);
        }
        self
    }

    fn fidelity_of(&self, what: &str) -> Fidelity {
        self.fidelity_by.get(what).copied().unwrap_or(self.fidelity)
    }

    /// Whether a batch's series of `metric` count in what it forwards
    /// (the OFU series' time comes from tensor activity's).
    pub fn forwards(&self, metric: &str) -> bool {
        metric == m::TENSOR_ACTIVE || self.forwarded.contains(metric)
    }

    /// Points in the journal, as last counted.
    pub fn pending(&self) -> u64 {
        u64::try_from(self.pending.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// The oldest pending point's time, unix ms.
    pub fn oldest_ms(&self) -> Option<i64> {
        Some(self.oldest_ms.load(Ordering::Relaxed)).filter(|&t| t != i64::MAX)
    }

    /// A GPU's series' labels but their name, on the wire: the GPU's, and
    /// the external ones it lacks, the empty ones left out (as the
    /// specification asks), sorted; split where `__name__` goes.
    fn base(&self, g: &BatchGpu<'_>) -> Base {
        let index = g.index.to_string();
        let mut l: Vec<(&str, &str)> = label_refs(
            &index,
            [g.uuid, g.model, g.hostname, g.node_id, g.tenant],
            g.job,
        );
        for (k, v) in &self.external {
            if !l.iter().any(|(n, _)| n == k) {
                l.push((k, v));
            }
        }
        l.retain(|(_, v)| !v.is_empty());
        l.sort();
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for (k, v) in l {
            let b = if k < "__name__" {
                &mut before
            } else {
                &mut after
            };
            wire::label_into(k, v, b);
        }
        Base { before, after }
    }

    /// The journal entry of a batch whose GPUs are `gpus`
    /// (`live::batch_gpus`) and whose samples are `set`'s; empty when
    /// there is nothing to send. The points of series relabelled since
    /// their last batch (a job that ended) get their staleness markers in
    /// it.
    #[cfg(test)]
    pub fn entry(&self, gpus: &[GpuLive], set: &CommitSet) -> Vec<u8> {
        self.forward_live(gpus, set).0
    }

    /// [`RemoteQueue::forward`] of GPUs given whole.
    #[cfg(test)]
    pub fn forward_live(&self, gpus: &[GpuLive], set: &CommitSet) -> (Vec<u8>, OpenEntries) {
        let gpus: Vec<BatchGpu<'_>> = gpus.iter().map(BatchGpu::from).collect();
        self.forward(&gpus, set)
    }

    /// [`RemoteQueue::entry`], and the open-series register entries of the
    /// series it starts or relabels (`CommitSet::forward_open`).
    pub(crate) fn forward<'a>(
        &'a self,
        gpus: &[BatchGpu<'_>],
        set: &CommitSet,
    ) -> (Vec<u8>, OpenEntries) {
        let mut entry = Entry::default();
        let mut open = Vec::new();
        let ofu_fidelity = self.fidelity_of("ofu");
        // A GPU's points: name, time, value, when it goes stale.
        let mut new: Vec<(&str, i64, f64, i64)> = Vec::new();
        for g in gpus {
            new.clear();
            let mut push = |name: &'a str, ts: i64, value: f64, until: i64| {
                new.push((name, ts, value, until));
            };
            let ofu_ts = g.counter(m::TENSOR_ACTIVE).map(|((ts, _), _)| ts);
            if let (Some(ts), Some(o)) = (ofu_ts, g.ofu) {
                let until = g.ofu_fresh.seen_ms + g.ofu_fresh.for_ms;
                let samples = set
                    .ofu
                    .iter()
                    .filter(|(gpu, _, _)| *gpu == g.uuid)
                    .flat_map(|(_, _, s)| s.iter());
                match ofu_fidelity {
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
                        push("flopwatch_ofu_ratio", ts, o.ofu, until);
                        push(
                            "flopwatch_ofu_tensor_active_ratio",
                            ts,
                            o.tensor_active,
                            until,
                        );
                        push(
                            "flopwatch_ofu_sm_clock_hertz",
                            ts,
                            o.sm_clock_mhz * 1e6,
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
            for c in &self.counters {
                let Some(((ts, v), fresh)) = g.counter(&c.metric) else {
                    continue;
                };
                let f = &c.family;
                let until = fresh.seen_ms + fresh.for_ms;
                let series = set
                    .series
                    .iter()
                    .find(|s| s.gpu_uuid == g.uuid && s.metric == c.metric);
                match (c.fidelity, series) {
                    (Fidelity::Full, Some(s)) => {
                        for p in &s.points {
                            push(&c.name, p.ts_ms, p.value * f.scale, until);
                        }
                    }
                    (Fidelity::Summary, Some(s)) if !f.counter => {
                        push(&c.name, ts, mean(s) * f.scale, until);
                        let max = s
                            .points
                            .iter()
                            .map(|p| p.value)
                            .fold(f64::NEG_INFINITY, f64::max);
                        push(&c.max, ts, max * f.scale, until);
                        push(&c.count, ts, s.points.len() as f64, until);
                    }
                    (_, Some(s)) if !f.counter => push(&c.name, ts, mean(s) * f.scale, until),
                    _ => push(&c.name, ts, v * f.scale, until),
                }
            }
            if new.is_empty() {
                continue;
            }
            let (base, markers) = self.note_sent(g.uuid, self.base(g), &new, &mut open);
            for (l, ts) in markers {
                entry.push(&l, ts, f64::from_bits(STALE_NAN));
            }
            entry.0.group(
                &base.before,
                &base.after,
                new.iter().map(|&(name, ts, v, _)| (Some(name), ts, v)),
            );
        }
        (entry.finish(), open)
    }

    /// Records `new` as the GPU's current series, and returns the
    /// staleness markers of its series of the same names under other labels
    /// (a job that ended): those end where the new ones begin. A series
    /// new or relabelled adds its register entry to `open`.
    fn note_sent(
        &self,
        gpu: &str,
        base: Base,
        new: &[(&str, i64, f64, i64)],
        open: &mut OpenEntries,
    ) -> (Arc<Base>, Vec<(Vec<u8>, i64)>) {
        let Ok(mut sent) = self.sent.lock() else {
            return (Arc::new(base), Vec::new());
        };
        let base = sent.base(gpu, base);
        let mut markers = Vec::new();
        for (name, ts, _, until_ms) in new {
            match sent.note(gpu, name, &base, *ts, *until_ms) {
                Noted::Same => continue,
                Noted::New => {}
                Noted::Relabelled(before, last_ts) => {
                    markers.push((before.with_name(name), (*ts).max(last_ts + 1)));
                }
            }
            // The register entry: the series' labels and newest time.
            let mut reg = Vec::new();
            wire::series_into(&base.with_name(name), *ts, 0.0, &mut reg);
            open.push((journal::open_key(gpu, name), reg));
        }
        (base, markers)
    }

    /// After a restart: takes back the series a previous run sent and did
    /// not end (the store's open-series register), each current for
    /// `grace_ms` from `now_ms` unless a batch continues it — one that
    /// comes back under other labels ends it at once, one that does not
    /// come back gets its marker when the grace runs out. A series a batch
    /// of this run already relabelled is ended now. Returns how many were
    /// taken back.
    pub fn restore(&self, now_ms: i64, grace_ms: i64) -> Result<usize, StoreError> {
        let stored = self.store.journal_open_series()?;
        let mut markers = Entry::default();
        let mut closed = Vec::new();
        let mut n = 0;
        {
            let Ok(mut sent) = self.sent.lock() else {
                return Ok(0);
            };
            let mut raw = Vec::new();
            for (k, v) in &stored {
                raw.clear();
                let parsed = journal::open_key_parts(k)
                    .zip(wire::read(v, &mut raw).and_then(|()| raw.first()));
                let Some(((gpu, name), p, (before, after))) =
                    parsed.and_then(|(k, p)| Some((k, p, wire::split_name(p.labels)?)))
                else {
                    tracing::warn!("malformed remote-write open-series entry dropped");
                    closed.push(k.clone());
                    continue;
                };
                match sent.get(&gpu, &name) {
                    // Continued by this run already.
                    Some(s) if s.labels() == p.labels => {}
                    // Relabelled by this run (its entry already replaced).
                    Some(s) => markers.push(
                        p.labels,
                        s.last_ts.max(p.ts_ms + 1),
                        f64::from_bits(STALE_NAN),
                    ),
                    None => {
                        n += 1;
                        let base = Base {
                            before: before.to_vec(),
                            after: after.to_vec(),
                        };
                        let base = sent.base(&gpu, base);
                        sent.insert(
                            &gpu,
                            &name,
                            base,
                            (p.ts_ms, false),
                            now_ms.saturating_add(grace_ms),
                        );
                    }
                }
            }
        }
        let entry = markers.finish();
        if !entry.is_empty() || !closed.is_empty() {
            if entry.is_empty() {
                self.store.journal_done(closed)?;
            } else {
                self.store.journal_close(entry.clone(), closed)?;
                self.committed(&entry);
            }
        }
        Ok(n)
    }

    /// A batch with `entry` was committed: its points are pending, and the
    /// sender is woken when they fill a request.
    pub fn committed(&self, entry: &[u8]) {
        if let Some((n, oldest)) = head(entry) {
            let before = self.pending.fetch_add(i64::from(n), Ordering::Relaxed);
            self.oldest_ms.fetch_min(oldest, Ordering::Relaxed);
            let at = self.fill_at.load(Ordering::Relaxed);
            if before < at && before + i64::from(n) >= at {
                self.filled.notify_one();
            }
        }
    }

    /// Journals a staleness marker for every series gone stale by `now_ms`
    /// (collector clock), just after its newest sample (at `now_ms` for a
    /// series taken back after a restart and not continued:
    /// [`super::open::Sent::end_ms`]).
    pub fn expire(&self, now_ms: i64) -> Result<(), StoreError> {
        let (entry, closed) = {
            let Ok(mut sent) = self.sent.lock() else {
                return Ok(());
            };
            let mut out = Entry::default();
            let mut closed = Vec::new();
            for s in sent.expire(now_ms) {
                closed.push(journal::open_key(&s.gpu, &s.name));
                out.push(&s.labels(), s.end_ms(now_ms), f64::from_bits(STALE_NAN));
            }
            (out.finish(), closed)
        };
        if entry.is_empty() {
            return Ok(());
        }
        self.store.journal_close(entry.clone(), closed)?;
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

/// A journal entry being written ([`wire::EntryWriter`]).
#[derive(Default)]
struct Entry(wire::EntryWriter);

impl Entry {
    /// Adds the point of the series with `labels` (whole, as on the wire).
    fn push(&mut self, labels: &[u8], ts_ms: i64, value: f64) {
        self.0
            .group(labels, &[], std::iter::once((None, ts_ms, value)));
    }

    /// The entry (empty for no point), its body snappy-compressed where
    /// that is smaller ([`journal::PACKED`]).
    fn finish(self) -> Vec<u8> {
        let (n, oldest) = (self.0.points(), self.0.oldest_ms());
        if n == 0 {
            return Vec::new();
        }
        let body = self.0.finish();
        match snap::raw::Encoder::new().compress_vec(&body) {
            Ok(packed) if packed.len() < body.len() && n < journal::PACKED => {
                journal::value(n | journal::PACKED, oldest, &packed)
            }
            _ => journal::value(n, oldest, &body),
        }
    }
}

/// The journal entry holding `points` (empty for none).
#[cfg(test)]
pub(super) fn entry_of(points: &[super::Point]) -> Vec<u8> {
    let mut e = Entry::default();
    for p in points {
        e.push(&wire::labels_of(&p.labels), p.ts_ms, p.value);
    }
    e.finish()
}

/// An entry's point count and oldest time.
fn head(entry: &[u8]) -> Option<(u32, i64)> {
    let n = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?) & !journal::PACKED;
    let oldest = i64::from_be_bytes(entry.get(4..12)?.try_into().ok()?);
    Some((n, oldest))
}

#[cfg(test)]
mod tests {
    use super::super::{journal_points as points_of, Point};
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
        let packed = entry[0] & 0x80 != 0;
        let p = points_of(&wire::unpack(packed, &entry[12..]).unwrap()).unwrap();
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
    fn a_node_s_batch_is_journaled_packed_and_read_back_whole() {
        // Eight GPUs of one node in one job: their labels differ in the
        // UUID and index only, which the packed body stores about once.
        let q = queue(&["power_w"], &[("cluster", "eu-west-1a")]);
        let gpus: Vec<GpuLive> = (0..8u32)
            .map(|i| {
                let mut g = gpu(0.25 + f64::from(i) / 100.0, 1_000);
                g.uuid = format!("GPU-3f2a9c1e-7b4d-4e8a-9c21-5d6e7f80{i:04x}");
                g.index = i;
                g.model = "NVIDIA H100 80GB HBM3".into();
                g.hostname = "gpu-node-0421.cluster.example.com".into();
                g.node_id = "gpu-node-0421".into();
                g.job = Some(flopwatch_proto::v1::JobAssignment {
                    gpu_uuid: g.uuid.clone(),
                    job_id: "train-llama-70b-run-17".into(),
                    pod: "trainer-0".into(),
                    namespace: "research".into(),
                    ..Default::default()
                });
                g
            })
            .collect();
        let entry = q.entry(&gpus, &CommitSet::default());
        assert_ne!(entry[0] & 0x80, 0, "packed");
        let unpacked = wire::unpack(true, &entry[12..]).unwrap();
        assert!(
            entry.len() * 2 < unpacked.len(),
            "packed {} B against {} B",
            entry.len(),
            unpacked.len()
        );
        let pts = points(&entry);
        assert_eq!(pts.len(), 8 * 4, "OFU, tensor activity, SM clock, power");
        let ofu: Vec<f64> = pts
            .iter()
            .filter(|p| name(p) == "flopwatch_ofu_ratio")
            .map(|p| p.value)
            .collect();
        assert_eq!(ofu.len(), 8);
        assert!((ofu[7] - 0.32).abs() < 1e-12, "{ofu:?}");
        // What the store reads back counts the points without the flag.
        q.store
            .commit(
                "t",
                &CommitSet {
                    forward: entry.clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        q.committed(&entry);
        assert_eq!(q.pending(), 32);
        let (e, _) = q.store.journal_read(0, u64::MAX).unwrap();
        assert_eq!((e[0].points, e[0].packed), (32, true));
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
        let pts = points_of(&wire::unpack(e[0].packed, &e[0].body).unwrap()).unwrap();
        assert_eq!(pts.len(), 4);
        // Each just after its newest sample (the agent's clock), not at
        // the collector's time of expiry.
        for p in &pts {
            assert_eq!(p.value.to_bits(), STALE_NAN);
            let want = if name(p) == "flopwatch_gpu_power_watts" {
                6
            } else {
                2_001
            };
            assert_eq!(p.ts_ms, want, "{p:?}");
        }
        assert!(pts
            .iter()
            .all(|p| !p.labels.iter().any(|l| l.name == "job_id")));
        assert_eq!(q.pending(), 4);
        // Each series ends once.
        q.expire(30_000).unwrap();
        assert_eq!(q.store.journal_read(0, u64::MAX).unwrap().0.len(), 1);
        // A batch the agent kept through a disconnect arrives late, its
        // points older than the collector's time of expiry: they come
        // after the markers, so a receiver takes them in order, and their
        // series start again.
        let mut late = g.clone();
        late.counters.insert(m::TENSOR_ACTIVE.into(), (15_000, 0.5));
        late.counters.insert("power_w".into(), (15_000, 310.0));
        let (entry, open) = q.forward_live(&[late], &CommitSet::default());
        let pts = points(&entry);
        assert_eq!(pts.len(), 4, "{pts:?}");
        assert!(pts
            .iter()
            .all(|p| p.value.to_bits() != STALE_NAN && p.ts_ms == 15_000));
        assert_eq!(open.len(), 4, "the series are open again");
    }

    #[test]
    fn series_left_open_by_a_stopped_collector_still_end() {
        use crate::store::memory::MemEngine;
        let engine = Arc::new(MemEngine::new());
        let q = RemoteQueue::new(
            Store::new(engine.clone(), false),
            vec!["power_w".into()],
            &BTreeMap::new(),
        );
        // Two GPUs' series sent through committed batches (the register
        // entries go with the batch); then the collector dies.
        let mut a = gpu(0.25, 1_000);
        a.job = Some(flopwatch_proto::v1::JobAssignment {
            job_id: "train".into(),
            ..Default::default()
        });
        let mut b = gpu(0.5, 1_000);
        b.uuid = "GPU-2".into();
        for g in [&a, &b] {
            let (forward, forward_open) =
                q.forward_live(std::slice::from_ref(g), &CommitSet::default());
            assert_eq!(forward_open.len(), 4, "a new GPU registers its 4 series");
            let set = CommitSet {
                forward,
                forward_open,
                ..Default::default()
            };
            q.store.commit("t", &set).unwrap();
        }
        // The same series again: nothing more to register.
        let mut again = b.clone();
        again.counters.insert(m::TENSOR_ACTIVE.into(), (1_500, 0.5));
        assert!(q.forward_live(&[again], &CommitSet::default()).1.is_empty());
        drop(q);
        // The restarted collector takes them back before ingest starts.
        // GPU-1 comes back without its job (its job's series end at
        // once), GPU-2 never comes back (its series end when the grace
        // runs out).
        let q = RemoteQueue::new(
            Store::new(engine, false),
            vec!["power_w".into()],
            &BTreeMap::new(),
        );
        assert_eq!(q.restore(80_000, 60_000).unwrap(), 8);
        a.job = None;
        a.counters.insert(m::TENSOR_ACTIVE.into(), (90_000, 0.5));
        // Received at 200 s on the collector's clock: current past 140 s.
        a.ofu_fresh.seen_ms = 200_000;
        for f in a.fresh.values_mut() {
            f.seen_ms = 200_000;
        }
        let (forward, forward_open) = q.forward_live(&[a.clone()], &CommitSet::default());
        assert_eq!(
            forward_open.len(),
            4,
            "GPU-1's series registered under their new labels"
        );
        q.store
            .commit(
                "t",
                &CommitSet {
                    forward: forward.clone(),
                    forward_open,
                    ..Default::default()
                },
            )
            .unwrap();
        let markers: Vec<Point> = points(&forward)
            .into_iter()
            .filter(|p| p.value.to_bits() == STALE_NAN)
            .collect();
        assert_eq!(markers.len(), 4, "{markers:?}");
        assert!(markers.iter().all(|p| p
            .labels
            .iter()
            .any(|l| l.name == "job_id" && l.value == "train")));
        for p in &markers {
            // OFU's at the new sample's time; power's (its reading did not
            // move, at 5) just after its last.
            let want = if name(p) == "flopwatch_gpu_power_watts" {
                6
            } else {
                90_000
            };
            assert_eq!(p.ts_ms, want, "{p:?}");
        }
        let uuid = |p: &Point| {
            p.labels
                .iter()
                .find(|l| l.name == "UUID")
                .map(|l| l.value.clone())
        };
        // GPU-2's end once the grace has run out, and leave the register.
        q.expire(140_000).unwrap();
        let marked = |q: &RemoteQueue| -> Vec<Point> {
            let (e, _) = q.store.journal_read(0, u64::MAX).unwrap();
            e.iter()
                .flat_map(|e| points_of(&wire::unpack(e.packed, &e.body).unwrap()).unwrap())
                .filter(|p| p.value.to_bits() == STALE_NAN && uuid(p).as_deref() == Some("GPU-2"))
                .collect()
        };
        assert!(marked(&q).is_empty(), "still within the grace");
        q.expire(140_001).unwrap();
        let m2 = marked(&q);
        assert_eq!(m2.len(), 4);
        assert!(m2.iter().all(|p| p.ts_ms == 140_001));
        let open = q.store.journal_open_series().unwrap();
        assert_eq!(open.len(), 4, "only GPU-1's current series stay registered");
        assert!(open
            .iter()
            .all(|(k, _)| crate::store::journal::open_key_parts(k).unwrap().0 == "GPU-1"));
        // A third run has nothing of GPU-2's to end.
        let q3 = RemoteQueue::new(q.store.clone(), Vec::new(), &BTreeMap::new());
        assert_eq!(q3.restore(200_000, 60_000).unwrap(), 4);
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
