//! Folding: a GPU's newest head bundles merged into one compressed bundle
//! while its hour is still open, and the phase at which each GPU is folded
//! and sealed.
//!
//! A backed-off agent's batch holds one point per series, so a bundle
//! (`gpu_block.rs`) costs about 35 bytes a sample: the head of a 10,000-
//! agent collector grew by 480 MB a minute and held an hour of it, and one
//! pass at five past the hour read all of it back. Folding keeps the head
//! small while the hour is open: once the oldest of a GPU's unfolded
//! bundles is `fold_after` old (plus the GPU's own phase, so the fleet is
//! folded evenly over the span), the GPU's unfolded bundles of each open
//! hour become **one** bundle whose blocks are encoded as sealed chunks
//! are, with each column's predictor fixed rather than tried
//! (`Block::encode_compact_quick`: the seal encodes them again), in one
//! atomic write that deletes the
//! bundles it replaces. A folded bundle is a bundle like any other (its
//! version byte marks it folded), so readers and the seal take it as they
//! take a batch's; the seal then merges a handful of folded bundles
//! instead of hundreds of one-point ones.
//!
//! Which GPUs to look at comes from [`FoldQueue`], fed by every commit
//! with the earliest bundle it wrote per GPU: a pass reads only the GPUs
//! due, never the whole head. The queue is a schedule, not a record: after
//! a restart it is empty, and whatever it forgot is sealed with its hour.

use super::gpu_block;
use super::hours::{window_of, WINDOW_MS};
use super::keys;
use super::ofu_chunk::{ofu_samples, ofu_value, Derivations, Form, HourMap, HourRefs};
use super::raw::Times;
use super::raw::{raw_block, raw_points};
use super::{corrupt, Cf, OfuSample, Op, Store, StoreError};
use flopwatch_codec::Block;
use flopwatch_proto::model::Point;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// A head key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// What a fold pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FoldReport {
    /// Folded bundles written.
    pub folded: u64,
    /// Bundles they replaced.
    pub bundles: u64,
    /// Samples in them.
    pub samples: u64,
}

/// GPUs with unfolded head bundles: head GPU prefix (`'g' · tenant ·
/// gpu`) → the last timestamp of its earliest unfolded bundle.
#[derive(Default)]
pub(super) struct FoldQueue {
    gpus: Mutex<HashMap<Vec<u8>, i64>>,
}

impl FoldQueue {
    /// A bundle with last timestamp `ts` was written under `prefix`.
    pub(super) fn note(&self, prefix: &[u8], ts: i64) {
        let mut g = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        match g.get_mut(prefix) {
            Some(t) => *t = (*t).min(ts),
            None => {
                g.insert(prefix.to_vec(), ts);
            }
        }
    }

    /// Takes the GPUs whose earliest unfolded bundle is due at `now_ms`:
    /// `after_ms` old, plus the GPU's phase within `after_ms`. Each comes
    /// with that bundle's last timestamp: no unfolded bundle the queue was
    /// told of is keyed earlier.
    fn take_due(&self, now_ms: i64, after_ms: i64) -> Vec<(Vec<u8>, i64)> {
        let mut g = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        let due: Vec<(Vec<u8>, i64)> = g
            .iter()
            .filter(|(p, t)| t.saturating_add(after_ms + phase(p, after_ms)) <= now_ms)
            .map(|(p, t)| (p.clone(), *t))
            .collect();
        for (p, _) in &due {
            g.remove(p);
        }
        due
    }

    /// GPUs waiting.
    pub(super) fn len(&self) -> usize {
        self.gpus.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A GPU's fixed phase within `span_ms`, from its head GPU prefix
/// (`'g' · tenant · gpu`): its seal phase ([`keys::seal_phase`]) scaled to
/// the span, so the same on every pass and every start, spread evenly
/// over the fleet, and never earlier for a GPU whose head keys sort later
/// in an hour.
pub(super) fn phase(prefix: &[u8], span_ms: i64) -> i64 {
    if span_ms <= 0 {
        return 0;
    }
    let p = keys::seal_phase(prefix.get(1..).unwrap_or_default());
    ((i128::from(p) * i128::from(span_ms)) >> 16) as i64
}

/// Head OFU blocks never refer to sealed chunks: reading one that does is
/// a corruption.
struct NoRefs;

impl HourRefs for NoRefs {
    fn raw(&mut self, _: &'static str) -> Result<Arc<HourMap>, StoreError> {
        Err(corrupt(Cf::Head, "a head OFU block refers to sealed data"))
    }

    fn times(&mut self) -> Result<Arc<Times>, StoreError> {
        Err(corrupt(Cf::Head, "a head OFU block shares timestamps"))
    }
}

impl Store {
    /// Folds the head bundles of every GPU due at `now_ms` (see the
    /// module doc), stopping between two GPUs once `stop` says so (those
    /// left are queued again). Hours the GPU's seal is due for are left to
    /// the seal.
    pub(super) fn fold(
        &self,
        now_ms: i64,
        stop: &dyn Fn() -> bool,
    ) -> Result<FoldReport, StoreError> {
        let mut report = FoldReport::default();
        let after = self.spread.fold_after_ms;
        if after <= 0 {
            return Ok(report);
        }
        let due = self.fold_queue.take_due(now_ms, after);
        for (i, (prefix, from)) in due.iter().enumerate() {
            if stop() {
                for (p, t) in &due[i..] {
                    self.fold_queue.note(p, *t);
                }
                break;
            }
            match self.fold_gpu(prefix, *from, now_ms, &mut report) {
                // Bad bytes under one GPU must not stop the others: they
                // stay as they are, for the seal to report.
                Err(e @ StoreError::Corrupt { .. }) => {
                    tracing::warn!(error = %e, "GPU head not folded")
                }
                r => r?,
            }
        }
        Ok(report)
    }

    /// Folds one GPU's unfolded bundles keyed at `from_ms` or later, hour
    /// by hour. Starting there skips what is folded already and the hours
    /// left to the seal: a fold reads the minutes it folds, not the GPU's
    /// whole head.
    fn fold_gpu(
        &self,
        prefix: &[u8],
        from_ms: i64,
        now_ms: i64,
        report: &mut FoldReport,
    ) -> Result<(), StoreError> {
        let seal_delay = i64::try_from(self.schedule.1.as_millis()).unwrap_or(i64::MAX);
        let sealed_before = self.sealed_before(prefix, now_ms, seal_delay);
        let start = from_ms.max(sealed_before);
        // The GPU (tenant · gpu) whose runs of head keys to read.
        let gpu = &prefix[1..];
        // Unfolded bundles by hour (key, value), from the first hour not
        // due for sealing to the open one: the head leads with the hour,
        // so each is the GPU's own run of keys. (A bundle of a later hour,
        // from a clock ahead of ours, is left to its seal.)
        let mut hours: BTreeMap<i64, Vec<Entry>> = BTreeMap::new();
        let mut hour = window_of(start);
        while hour <= window_of(now_ms) {
            let run = keys::head_prefix(hour, gpu);
            let (from, to) = keys::scan_bounds(&run, start);
            let mut bad = None;
            self.engine.scan(Cf::Head, &from, &to, &mut |k, v| {
                if keys::key_ts(k, run.len()).is_none() {
                    bad = Some(corrupt(Cf::Head, "malformed head key"));
                    return false;
                }
                if !gpu_block::is_folded(v) {
                    hours
                        .entry(hour)
                        .or_default()
                        .push((k.to_vec(), v.to_vec()));
                }
                true
            })?;
            if let Some(e) = bad {
                return Err(e);
            }
            hour += WINDOW_MS;
        }
        for (_, bundles) in hours {
            if bundles.len() < 2 {
                continue;
            }
            let (value, samples) = fold_bundles(&bundles)?;
            let (last, rest) = bundles.split_last().expect("two or more");
            let mut ops: Vec<Op> = rest
                .iter()
                .map(|(k, _)| Op::Delete(Cf::Head, k.clone()))
                .collect();
            // Under the greatest key it replaces: unique, deleted by this
            // same write, and keyed by the latest sample as every bundle.
            ops.push(Op::Put(Cf::Head, last.0.clone(), value));
            let hours = super::head_hours::of_keys([last.0.as_slice()]);
            self.engine.apply(ops, false)?;
            self.head_hours.written(hours);
            report.folded += 1;
            report.bundles += bundles.len() as u64;
            report.samples += samples;
        }
        Ok(())
    }

    /// The first hour of the GPU under `prefix` (a head GPU prefix, or a
    /// series prefix of another kind) not yet due for sealing at `now_ms`:
    /// hours are sealed `seal_delay_ms` plus the GPU's phase within
    /// `seal_spread` after they end.
    pub(super) fn sealed_before(&self, prefix: &[u8], now_ms: i64, seal_delay_ms: i64) -> i64 {
        let seal_delay = seal_delay_ms;
        let spread = if prefix.first() == Some(&keys::KIND_GPU) {
            phase(prefix, self.spread.seal_spread_ms)
        } else {
            0
        };
        window_of(now_ms.saturating_sub(seal_delay).saturating_sub(spread))
    }
}

/// One folded bundle of `bundles` (a GPU's bundles of one hour), and the
/// samples it holds: each series' points merged in time order and encoded
/// as a sealed chunk is, each job's OFU likewise.
fn fold_bundles(bundles: &[Entry]) -> Result<(Vec<u8>, u64), StoreError> {
    let mut raw: BTreeMap<&str, Vec<Point>> = BTreeMap::new();
    let mut ofu: BTreeMap<String, (Vec<OfuSample>, Derivations)> = BTreeMap::new();
    let decoded = bundles
        .iter()
        .map(|(_, v)| gpu_block::decode(v))
        .collect::<Result<Vec<_>, _>>()?;
    for b in &decoded {
        for (metric, block) in &b.raw {
            let block = Block::decode(block).map_err(|e| corrupt(Cf::Head, e))?;
            raw.entry(metric).or_default().extend(raw_points(&block)?);
        }
        for v in &b.ofu {
            let (job, s, d) = ofu_samples(v, &mut NoRefs)?;
            let (samples, how) = ofu.entry(job.to_string()).or_default();
            samples.extend(s);
            how.add(d);
        }
    }
    let mut samples = 0u64;
    let mut w = gpu_block::Writer::folded();
    for (metric, mut points) in raw {
        points.sort_by_key(|p| p.ts_ms);
        samples += points.len() as u64;
        let encoded = raw_block(&points)
            .encode_compact_quick()
            .map_err(|e| corrupt(Cf::Head, e))?;
        w.raw(metric, |out| {
            out.extend_from_slice(&encoded);
            Ok::<_, StoreError>(())
        })?;
    }
    for (job, (mut s, how)) in ofu {
        s.sort_by_key(|x| x.ts_ms);
        samples += s.len() as u64;
        w.ofu(&ofu_value(
            &job,
            &s,
            Form::Folded,
            how.common(),
            false,
            None,
        )?);
    }
    Ok((w.finish(), samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_stable_and_spread() {
        let span = 1_200_000;
        let phases: Vec<i64> = (0..1000)
            .map(|i| phase(format!("gGPU-{i}").as_bytes(), span))
            .collect();
        assert!(phases.iter().all(|p| (0..span).contains(p)));
        assert_eq!(phase(b"gGPU-7", span), phases[7]);
        // Spread: each fifth of the span holds between 15 % and 25 %.
        for q in 0..5 {
            let n = phases.iter().filter(|p| **p * 5 / span == q).count();
            assert!((150..=250).contains(&n), "fifth {q}: {n}");
        }
        assert_eq!(phase(b"x", 0), 0);
    }

    #[test]
    fn the_queue_hands_out_each_gpu_once_when_due() {
        let q = FoldQueue::default();
        q.note(b"a", 1_000);
        q.note(b"a", 500);
        q.note(b"b", 10_000);
        let after = 100;
        let due_a = 500 + after + phase(b"a", after);
        assert!(q.take_due(due_a - 1, after).is_empty());
        assert_eq!(q.take_due(due_a, after), vec![(b"a".to_vec(), 500)]);
        assert!(q.take_due(due_a, after).is_empty());
        assert_eq!(q.len(), 1);
    }

    use crate::conformance::{gpu_batch, gpu_batch_of};
    use crate::memory::MemEngine;
    use crate::WINDOW_MS;
    use std::time::Duration;

    const T0: i64 = 1_700_002_800_000 - 1_700_002_800_000 % WINDOW_MS;

    fn stores() -> (Store, Store) {
        let folding = Store::new(Arc::new(MemEngine::default()), false)
            .with_spread(Duration::ZERO, Duration::from_secs(10));
        let plain = Store::new(Arc::new(MemEngine::default()), false);
        (folding, plain)
    }

    fn head_keys(s: &Store) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        s.engine
            .scan(Cf::Head, &[], &[0xff; 8], &mut |k, v| {
                out.push((k.to_vec(), gpu_block::is_folded(v)));
                true
            })
            .unwrap();
        out
    }

    fn family(s: &Store, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        s.engine
            .scan(cf, &[], &[0xff; 8], &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        out
    }

    fn read(s: &Store) -> (Vec<Point>, Vec<OfuSample>) {
        let raw = s
            .series("t", "GPU-1", "power_w", i64::MIN, i64::MAX, usize::MAX)
            .unwrap();
        let mut ofu = Vec::new();
        s.ofu("t", "GPU-1", i64::MIN, i64::MAX, None, &mut |x| ofu.push(x))
            .unwrap();
        (raw, ofu)
    }

    #[test]
    fn folding_keeps_every_sample_and_the_sealed_chunks_byte_for_byte() {
        let (folding, plain) = stores();
        // 30 batches of one second, then 30 more after a fold; the last
        // hour's batches are across the hour's end.
        for s in [&folding, &plain] {
            for i in 0..30 {
                s.commit("t", &gpu_batch(i + 1, T0 + i as i64 * 1_000))
                    .unwrap();
            }
        }
        assert_eq!(head_keys(&folding).len(), 30);
        let now = T0 + 30_000 + 20_000;
        let r = folding.fold(now, &|| false).unwrap();
        assert_eq!((r.folded, r.bundles), (1, 30), "{r:?}");
        // 30 batches × 10 samples × (3 raw series + OFU).
        assert_eq!(r.samples, 1_200);
        let head = head_keys(&folding);
        assert_eq!(head.len(), 1);
        assert!(head[0].1, "the bundle left is folded");
        assert_eq!(read(&folding), read(&plain), "reads see the same samples");
        for s in [&folding, &plain] {
            for i in 30..60 {
                s.commit("t", &gpu_batch(i + 1, T0 + i as i64 * 1_000))
                    .unwrap();
            }
        }
        // Nothing is due before the newest unfolded bundle's time comes.
        assert_eq!(folding.fold(T0 + 40_000, &|| false).unwrap().folded, 0);
        let r = folding.fold(now + 60_000, &|| false).unwrap();
        assert_eq!(
            (r.folded, r.bundles),
            (1, 30),
            "folded bundles are not folded again"
        );
        assert_eq!(head_keys(&folding).len(), 2);
        assert_eq!(read(&folding), read(&plain));
        let head_bytes = |s: &Store| -> usize {
            family(s, Cf::Head)
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum()
        };
        assert!(
            head_bytes(&folding) * 5 < head_bytes(&plain) * 2,
            "folded {} bytes against {}",
            head_bytes(&folding),
            head_bytes(&plain)
        );
        // Sealed, both stores hold the same chunks and rollups.
        for s in [&folding, &plain] {
            s.compact(T0 + 2 * WINDOW_MS, 0).unwrap();
            assert!(head_keys(s).is_empty());
        }
        for cf in [Cf::Raw, Cf::Ofu, Cf::Rollup] {
            assert_eq!(family(&folding, cf), family(&plain, cf), "{cf:?}");
        }
    }

    #[test]
    fn an_hour_sealed_on_every_core_is_the_hour_sealed_on_one() {
        let one = Store::new(Arc::new(MemEngine::default()), false);
        let every = Store {
            parallel_from: 0,
            ..Store::new(Arc::new(MemEngine::default()), false)
        };
        // Two hours, the second with late batches after its first seal.
        for s in [&one, &every] {
            for i in 0..40 {
                s.commit("t", &gpu_batch(i + 1, T0 + i as i64 * 90_000))
                    .unwrap();
            }
            s.compact(T0 + 2 * WINDOW_MS, 0).unwrap();
            for i in 40..50 {
                s.commit("t", &gpu_batch(i + 1, T0 + WINDOW_MS + i as i64 * 1_000))
                    .unwrap();
            }
            s.compact(T0 + 3 * WINDOW_MS, 0).unwrap();
            assert!(head_keys(s).is_empty());
        }
        for cf in [Cf::Raw, Cf::Ofu, Cf::Rollup] {
            let (a, b) = (family(&one, cf), family(&every, cf));
            assert!(!a.is_empty(), "{cf:?}");
            assert_eq!(a, b, "{cf:?}");
        }
        assert_eq!(read(&one), read(&every));
    }

    #[test]
    fn gpu_hours_sealed_side_by_side_are_the_gpu_hours_sealed_one_by_one() {
        let store = |seal_width| Store {
            seal_width,
            ..Store::new(Arc::new(MemEngine::default()), false)
        };
        let (one, four) = (store(1), store(4));
        // Seven GPUs over two hours, the second with late batches after
        // its first seal; a pass meets some GPUs twice in a row.
        for s in [&one, &four] {
            let mut seq = 0;
            let mut batches = |from: i64, n: i64, step: i64| {
                for i in 0..n {
                    for g in 0..7 {
                        seq += 1;
                        let set = gpu_batch_of(&format!("GPU-{g}"), seq, from + i * step);
                        s.commit("t", &set).unwrap();
                    }
                }
            };
            batches(T0, 40, 90_000);
            s.compact(T0 + 2 * WINDOW_MS, 0).unwrap();
            batches(T0 + WINDOW_MS, 10, 1_000);
            s.compact(T0 + 3 * WINDOW_MS, 0).unwrap();
            assert!(head_keys(s).is_empty());
        }
        for cf in [Cf::Raw, Cf::Ofu, Cf::Rollup] {
            let (a, b) = (family(&one, cf), family(&four, cf));
            assert!(!a.is_empty(), "{cf:?}");
            assert_eq!(a, b, "{cf:?}");
        }
    }

    #[test]
    fn a_fold_reads_from_the_earliest_unfolded_bundle_on() {
        let tap = Arc::new(crate::tap::Tap::default());
        let s = Store::new(tap.clone(), false).with_spread(Duration::ZERO, Duration::from_secs(10));
        let batches = |from: u64| {
            for i in from..from + 30 {
                s.commit("t", &gpu_batch(i + 1, T0 + i as i64 * 1_000))
                    .unwrap();
            }
        };
        batches(0);
        let first = tap.scanned();
        assert_eq!(s.fold(T0 + 50_000, &|| false).unwrap().bundles, 30);
        assert_eq!(
            tap.scanned() - first,
            30,
            "the first fold reads its 30 bundles"
        );
        batches(30);
        let second = tap.scanned();
        assert_eq!(s.fold(T0 + 110_000, &|| false).unwrap().bundles, 30);
        // The folded bundle before them is not read again.
        assert_eq!(tap.scanned() - second, 30);
        assert_eq!(head_keys(&s).len(), 2);
    }

    #[test]
    fn a_sealed_hour_is_left_to_the_seal_and_a_stop_requeues() {
        let folding = Store::new(Arc::new(MemEngine::default()), false)
            .with_compaction(Duration::from_secs(60), Duration::ZERO)
            .with_spread(Duration::ZERO, Duration::from_secs(10));
        for i in 0..5 {
            folding
                .commit("t", &gpu_batch(i + 1, T0 + i as i64 * 1_000))
                .unwrap();
        }
        // Stopped before the first GPU: nothing folded, the GPU waits.
        let r = folding.fold(T0 + 60_000, &|| true).unwrap();
        assert_eq!(r.folded, 0);
        assert_eq!(folding.fold_backlog(), 1);
        // An hour later the hour is due for sealing: not folded.
        let r = folding.fold(T0 + WINDOW_MS + 60_000, &|| false).unwrap();
        assert_eq!(r.folded, 0);
        assert_eq!(head_keys(&folding).len(), 5);
    }

    #[test]
    fn the_seal_spreads_gpus_over_the_span() {
        let spread = Duration::from_secs(1200);
        let s =
            Store::new(Arc::new(MemEngine::default()), false).with_spread(spread, Duration::ZERO);
        let prefixes: Vec<Vec<u8>> = (0..200)
            .map(|i| keys::kind_prefix(keys::KIND_GPU, &keys::ofu_prefix("t", &format!("GPU-{i}"))))
            .collect();
        // Right at the seal delay's end only a few GPUs are due; after
        // the spread every one is; halfway about half.
        let due = |at: i64| {
            prefixes
                .iter()
                .filter(|p| s.sealed_before(p, T0 + WINDOW_MS + at, 0) > T0)
                .count()
        };
        assert!(due(0) <= 2, "{}", due(0));
        assert_eq!(due(1_200_000), 200);
        let half = due(600_000);
        assert!((70..=130).contains(&half), "{half}");
        // Another kind of series is not spread.
        let raw = keys::kind_prefix(keys::KIND_RAW, &keys::raw_prefix("t", "GPU-1", "m"));
        assert!(s.sealed_before(&raw, T0 + WINDOW_MS, 0) > T0);
    }

    #[test]
    fn a_stopped_pass_leaves_whole_gpu_hours_and_the_next_finishes() {
        let store = Store::new(Arc::new(MemEngine::default()), false);
        let plain = Store::new(Arc::new(MemEngine::default()), false);
        for s in [&store, &plain] {
            for h in 0..6 {
                s.commit("t", &gpu_batch(h as u64 + 1, T0 + h * WINDOW_MS))
                    .unwrap();
            }
        }
        // A stop that comes after three GPU-hours.
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 3;
        let r = store.compact_until(T0 + 10 * WINDOW_MS, 0, &stop).unwrap();
        // Each GPU-hour: three raw chunks and one OFU chunk, all or none.
        assert_eq!(r.chunks, 3 * 4, "{r:?}");
        assert_eq!(head_keys(&store).len(), 3);
        assert_eq!(read(&store), read(&plain), "every sample once, mid-way");
        assert_eq!(store.whole_passes(), 0);
        let r = store.compact(T0 + 10 * WINDOW_MS, 0).unwrap();
        assert_eq!(r.chunks, 3 * 4, "{r:?}");
        assert!(head_keys(&store).is_empty());
        assert_eq!(store.whole_passes(), 1);
        plain.compact(T0 + 10 * WINDOW_MS, 0).unwrap();
        for cf in [Cf::Raw, Cf::Ofu, Cf::Rollup] {
            assert_eq!(family(&store, cf), family(&plain, cf), "{cf:?}");
        }
    }
}
