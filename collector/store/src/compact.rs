//! Background compaction of the head into hourly chunks, rollups, and
//! retention.
//!
//! Acknowledged batches sit in the `head` family as small per-batch blocks
//! bundled per GPU ([`super::gpu_block`]), durable through the WAL before
//! the ack. Once
//! an hour has been over for `seal_delay`, [`Store::compact`] merges each
//! series' head blocks of that hour — with the hour's chunk if late data
//! had already been compacted once — into one chunk (decimal/XOR-packed by
//! [`Block::encode_compact`]), computes the hour's rollup, and in **one**
//! atomic write per GPU-hour puts
//! the chunks and rollups and deletes the head blocks and any older
//! chunk. A crash before that write leaves the head blocks (compacted
//! again on the next pass); after it, the chunks. Readers scan head and
//! chunks under one snapshot, so every sample is seen exactly once, during
//! a compaction and after it.
//!
//! A pass walks the head once (a seek past each GPU-hour not yet due, and
//! past the open hour whole: the head leads with the hour) and is skipped
//! while nothing in the head can be sealed yet (the store's `head_low`).
//! Once every GPU's hours before some hour are sealed, the head's files
//! holding them are compacted away (`Store::clear_head`).
//!
//! Retention: RocksDB drops every chunk, head block and rollup of hours
//! wholly before its tenant's cutoff whenever it rewrites the file holding
//! it (a compaction filter, [`super::Engine::expire_by_compaction`]), so no
//! pass walks the series; on an engine without one, [`Store::expire`]
//! deletes them per series with range deletes and compacts the ranges.
//! Reads are clamped to the cutoff meanwhile, so expired samples are never
//! returned.

use super::gpu_block;
use super::hours::{window_of, MINUTE_MS, WINDOW_MS};
use super::keys;
use super::ofu_chunk::{
    ofu_block_start, ofu_samples, ofu_value, raw_hour, refs_hold, resolver, Derivations, Form,
    HourMap, RefCache, CLOCKS,
};
use super::parallel;
use super::raw::{chunk_times, raw_block, raw_points, time_ref_prefix, Times, TIME_REF};
use super::rollup::{self, Bucket, Rollup};
use super::{corrupt, Cf, Derivation, OfuSample, Op, Precision, Step, Store, StoreError};
use flopwatch_codec::Block;
use flopwatch_proto::clock::Stopwatch;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// What a compaction or expiry pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Series-hours turned into chunks.
    pub chunks: u64,
    /// Head blocks merged (and deleted).
    pub blocks: u64,
    /// Samples in the written chunks.
    pub samples: u64,
    /// Series ranges deleted by retention.
    pub expired_ranges: u64,
}

/// Most samples decoded for one series-hour: beyond it the hour is left in
/// the head (and logged) rather than growing memory without bound.
const MAX_HOUR_SAMPLES: usize = flopwatch_codec::MAX_BLOCK_SAMPLES;

/// One series of a GPU-hour to seal: its kind, key prefix and head
/// blocks.
type SeriesWork<'a> = (u8, Vec<u8>, &'a [&'a [u8]]);

/// Head bytes of a GPU-hour from which its series are planned on every
/// core (below, starting a thread costs more than it saves).
pub(super) const PARALLEL_BYTES: usize = 64 << 10;

/// Seal phases (of 65,536) an hour's seal goes past between two sweeps of
/// its sealed keys (`Store::sweep_head`): a sixteenth.
const SWEEP_PHASES: u32 = 1 << 12;

/// Series whose expired hours are deleted in one write.
const EXPIRE_BATCH: usize = 1024;

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// One series-hour of the head: keys and values of its blocks.
struct Group {
    kind: u8,
    /// Series prefix inside the chunk family (no kind byte).
    prefix: Vec<u8>,
    window: i64,
    blocks: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One series-hour's compaction, planned.
struct Planned {
    /// Samples in its new chunk.
    samples: usize,
    /// The new chunk's timestamps and windows (the reference series only).
    times: Option<Times>,
}

/// One job's (or a raw series') aggregate of an hour and its 60 minutes,
/// as compaction adds the hour's samples. Every sample weighs its window,
/// raw or OFU: with adaptive sampling one sample may stand for seconds,
/// another for 100 ms.
struct HourAcc {
    hour: Bucket,
    minutes: [Bucket; 60],
}

impl Default for HourAcc {
    fn default() -> Self {
        HourAcc {
            hour: Bucket::default(),
            minutes: [Bucket::default(); 60],
        }
    }
}

impl HourAcc {
    /// Adds a sample of the hour starting at `window`.
    fn add(&mut self, window: i64, ts: i64, v: f64, tpa: f64, clk: f64, window_ms: u32) {
        self.hour.add(ts, v, tpa, clk, window_ms);
        let m = ((ts - window) / MINUTE_MS).clamp(0, 59) as usize;
        self.minutes[m].add(ts, v, tpa, clk, window_ms);
    }

    /// The minutes that hold a sample, by index, in order.
    fn minutes(&self) -> Vec<(u8, Bucket)> {
        (0u8..)
            .zip(self.minutes.iter())
            .filter(|(_, b)| b.mean.count > 0)
            .map(|(m, b)| (m, *b))
            .collect()
    }
}

fn upper(prefix: &[u8]) -> Vec<u8> {
    let mut to = prefix.to_vec();
    to.extend_from_slice(&[0xff; 17]);
    to
}

impl Store {
    /// Compacts every head hour that ended at least `seal_delay_ms` before
    /// `now_ms`. Each series-hour is one atomic write.
    pub fn compact(&self, now_ms: i64, seal_delay_ms: i64) -> Result<CompactionReport, StoreError> {
        self.compact_within(now_ms, seal_delay_ms, None)
    }

    /// [`Store::compact`], stopping between two series-hours once
    /// `deadline` has passed (what is left waits for the next pass).
    pub fn compact_within(
        &self,
        now_ms: i64,
        seal_delay_ms: i64,
        deadline: Option<flopwatch_proto::clock::Deadline>,
    ) -> Result<CompactionReport, StoreError> {
        let stop = move || deadline.is_some_and(|d| d.passed());
        self.compact_until(now_ms, seal_delay_ms, &stop)
    }

    /// [`Store::compact`], stopping between two series-hours once `stop`
    /// says so. Each GPU's hour is sealed `seal_delay_ms` plus the GPU's
    /// phase within the seal spread after it ends ([`super::fold`]).
    pub(super) fn compact_until(
        &self,
        now_ms: i64,
        seal_delay_ms: i64,
        stop: &dyn Fn() -> bool,
    ) -> Result<CompactionReport, StoreError> {
        // The earliest any series is sealed: before the phases.
        let sealed_before = window_of(now_ms.saturating_sub(seal_delay_ms));
        let mut report = CompactionReport::default();
        let seen = self.head_low.swap(i64::MAX, Ordering::SeqCst);
        if seen >= sealed_before {
            // Nothing written since the last whole pass, nor passed over
            // by it, belongs to a sealed hour: a walk over every series of
            // the head would find nothing.
            self.head_low.fetch_min(seen, Ordering::SeqCst);
            if seen == i64::MAX {
                self.head_left.store(i64::MAX, Ordering::SeqCst);
            }
            self.whole_passes.fetch_add(1, Ordering::SeqCst);
            return Ok(report);
        }
        let mut unsealed = i64::MAX;
        let mut frontier = None;
        let due = |prefix: &[u8]| self.sealed_before(prefix, now_ms, seal_delay_ms);
        let whole = self.pass(
            sealed_before,
            &due,
            stop,
            &mut report,
            (&mut unsealed, &mut frontier),
        );
        // What this pass left for later: the hours it passed over, and,
        // when it did not finish, whatever it was asked to look at.
        self.head_low.fetch_min(unsealed, Ordering::SeqCst);
        if matches!(whole, Ok(true)) {
            self.head_left.store(unsealed, Ordering::SeqCst);
            self.whole_passes.fetch_add(1, Ordering::SeqCst);
            // Every hour before both is sealed for every GPU.
            self.clear_head(unsealed.min(sealed_before))?;
        } else {
            self.head_low.fetch_min(seen, Ordering::SeqCst);
        }
        // Also after a pass cut short: it found the frontier only once it
        // had sealed every GPU before it (a pass stops between batches).
        if let Some((hour, phase)) = frontier {
            self.sweep_head(hour, phase)?;
        }
        whole.map(|_| report)
    }

    /// Once every GPU's hours before `hour` are sealed, has the engine
    /// rewrite the head's files holding them: they hold only deleted
    /// bundles and their tombstones (the head leads with the hour), so
    /// they go, rather than staying on disk until RocksDB's own
    /// compactions reach them (at 10,000 agents the head held up to 6.7
    /// bytes a sample while the hour before was sealed; docs/STORAGE.md,
    /// *Head*). Once per hour: a later pass with nothing new sealed asks
    /// nothing. Logical, not a file deletion: a late batch of such an
    /// hour, written meanwhile, stays (and is sealed by the next pass).
    fn clear_head(&self, hour: i64) -> Result<(), StoreError> {
        if self.head_cleared.fetch_max(hour, Ordering::SeqCst) >= hour {
            return Ok(());
        }
        let (before, took) = (self.engine.family_bytes(Cf::Head), Stopwatch::start());
        self.engine
            .compact_range(Cf::Head, &[keys::KIND_GPU], &keys::head_hour(hour))?;
        tracing::info!(
            hour,
            head_before = before,
            head_after = self.engine.family_bytes(Cf::Head),
            took = ?took.elapsed(),
            "sealed hours of the head cleared"
        );
        // Readers stop looking in the hours left empty.
        self.head_hours.forget_empty(&*self.engine, hour)
    }

    /// While an hour is sealed, has the engine rewrite the head's files
    /// holding the GPUs of `hour` sealed since the last sweep, those whose
    /// seal phase is before `phase`: an hour's GPUs sort in the order they
    /// are sealed ([`keys::seal_phase`]), so they are one range of keys
    /// holding deleted bundles and their tombstones, and their space comes
    /// back as the seal goes on rather than at its end (at 10,000 agents
    /// the sealed hour's 1.3 GB stayed on disk until the whole hour was
    /// sealed; docs/STORAGE.md, *Head*). A sweep waits for a sixteenth of
    /// the phases, and, as [`Store::clear_head`], is logical: a late batch
    /// in the range stays, and is sealed by the next pass.
    fn sweep_head(&self, hour: i64, phase: u16) -> Result<(), StoreError> {
        let from = {
            let mut swept = self.head_swept.lock().unwrap_or_else(|e| e.into_inner());
            let from = match swept.0.cmp(&hour) {
                std::cmp::Ordering::Less => 0,
                std::cmp::Ordering::Equal => swept.1,
                // Late data of an hour before the one swept last.
                std::cmp::Ordering::Greater => return Ok(()),
            };
            if u32::from(phase) < u32::from(from) + SWEEP_PHASES {
                return Ok(());
            }
            *swept = (hour, phase);
            from
        };
        let (before, took) = (self.engine.family_bytes(Cf::Head), Stopwatch::start());
        self.engine.compact_range(
            Cf::Head,
            &keys::head_phase(hour, from),
            &keys::head_phase(hour, phase),
        )?;
        tracing::info!(
            hour,
            from,
            phase,
            head_before = before,
            head_after = self.engine.family_bytes(Cf::Head),
            took = ?took.elapsed(),
            "sealed part of the head swept"
        );
        Ok(())
    }

    /// One walk over the head, compacting every sealed series-hour (none
    /// of an hour at or after `latest`), up to a GPU-hour per core at a
    /// time, each of another GPU (they share no key); false when `stop`
    /// stopped it. `unsealed` gets the earliest hour of
    /// the series it passed over. A series-hour that cannot be compacted
    /// (corrupt, too large) is logged and left, and not counted there: it
    /// is tried again by the next pass that runs, not made to run passes.
    fn pass(
        &self,
        latest: i64,
        sealed_before: &dyn Fn(&[u8]) -> i64,
        stop: &dyn Fn() -> bool,
        report: &mut CompactionReport,
        (unsealed, frontier): (&mut i64, &mut Option<(i64, u16)>),
    ) -> Result<bool, StoreError> {
        let mut cursor: Vec<u8> = Vec::new();
        let end = vec![0xff; 8];
        // A group found after a batch was full, or of a GPU already in it.
        let mut pending: Option<Group> = None;
        let mut walked = false;
        loop {
            if stop() {
                return Ok(false);
            }
            // Up to a GPU-hour per core, each of another GPU.
            let mut batch: Vec<Group> = pending.take().into_iter().collect();
            while batch.len() < self.seal_width.max(1) && !walked {
                let Some(g) = self.next_group(
                    &mut cursor,
                    &end,
                    latest,
                    sealed_before,
                    (&mut *unsealed, &mut *frontier),
                )?
                else {
                    walked = true;
                    break;
                };
                if batch.iter().any(|b| b.prefix == g.prefix) {
                    pending = Some(g);
                    break;
                }
                batch.push(g);
            }
            if batch.is_empty() {
                return Ok(true);
            }
            let done = if batch.len() == 1 {
                // One GPU-hour: its series on every core once it is large.
                vec![self.compact_group(&batch[0], true)]
            } else {
                parallel::each_in_parallel(batch.iter().collect(), &|g: &Group| {
                    self.compact_group(g, false)
                })
            };
            for (g, r) in batch.iter().zip(done) {
                match r {
                    Ok(r) => {
                        report.chunks += r.chunks;
                        report.blocks += r.blocks;
                        report.samples += r.samples;
                    }
                    // Bad bytes in one series-hour must not stop the others:
                    // it stays as it is (and expires with its tenant's data).
                    Err(e @ StoreError::Corrupt { .. }) => {
                        tracing::warn!(error = %e, window = g.window, "series-hour not compacted")
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// The next sealed GPU-hour of the head at or after `cursor`, moving
    /// `cursor` past it. One walk: an hour's GPUs sort in the order they
    /// are sealed, so at the first GPU whose hour is not sealed yet the
    /// rest of the hour is passed over with a seek to the next hour, as is
    /// an hour in which no GPU is sealed yet (at or after `latest`): a pass
    /// reads nothing of the open hour, nor of the GPUs not yet due in the
    /// hour being sealed. `frontier` gets the first such hour and the seal
    /// phase from which its GPUs are not due.
    fn next_group(
        &self,
        cursor: &mut Vec<u8>,
        end: &[u8],
        latest: i64,
        sealed_before: &dyn Fn(&[u8]) -> i64,
        (unsealed, frontier): (&mut i64, &mut Option<(i64, u16)>),
    ) -> Result<Option<Group>, StoreError> {
        loop {
            let mut group: Option<Group> = None;
            let mut bad: Option<Vec<u8>> = None;
            self.engine.walk(Cf::Head, cursor, end, &mut |k, v| {
                // Only GPU bundles are written to the head (format 1).
                let Some((plen, _)) =
                    keys::series_prefix(Cf::Head, k).filter(|_| k.first() == Some(&keys::KIND_GPU))
                else {
                    bad = Some(k.to_vec());
                    return Step::Stop;
                };
                let Some(ts) = keys::key_ts(k, plen) else {
                    bad = Some(k.to_vec());
                    return Step::Stop;
                };
                let w = window_of(ts);
                match &mut group {
                    None => {
                        if w >= latest {
                            // No GPU's hour is sealed this late.
                            *unsealed = (*unsealed).min(w);
                            return match w.checked_add(WINDOW_MS) {
                                Some(next) => Step::Seek(keys::head_hour(next)),
                                None => Step::Stop,
                            };
                        }
                        let gpu = &k[keys::HEAD_GPU_AT..plen];
                        if w >= sealed_before(&keys::kind_prefix(keys::KIND_GPU, gpu)) {
                            // This GPU's hour is not due yet, nor that of
                            // any GPU after it in the hour.
                            *unsealed = (*unsealed).min(w);
                            if frontier.is_none() {
                                *frontier = keys::head_key_phase(k).map(|p| (w, p));
                            }
                            return match w.checked_add(WINDOW_MS) {
                                Some(next) => Step::Seek(keys::head_hour(next)),
                                None => Step::Stop,
                            };
                        }
                        group = Some(Group {
                            kind: k[0],
                            prefix: gpu.to_vec(),
                            window: w,
                            blocks: vec![(k.to_vec(), v.to_vec())],
                        });
                        Step::Next
                    }
                    Some(g) => {
                        // The same GPU and hour: the same run of keys.
                        if k.len() >= plen && g.blocks[0].0.get(..plen) == Some(&k[..plen]) {
                            g.blocks.push((k.to_vec(), v.to_vec()));
                            Step::Next
                        } else {
                            Step::Stop
                        }
                    }
                }
            })?;
            if let Some(k) = bad {
                // A key no version of this store writes: step over it.
                tracing::warn!(key = ?k, "skipping malformed head key");
                *cursor = k;
                cursor.push(0);
                continue;
            }
            if let Some(g) = &group {
                let last = &g.blocks[g.blocks.len() - 1].0;
                *cursor = last.clone();
                cursor.push(0);
            }
            return Ok(group);
        }
    }

    /// Compacts one GPU's bundles of an hour ([`super::gpu_block`]): every
    /// series they hold, and the GPU's OFU, in one atomic write that also
    /// deletes the bundles. The reference series is planned first; the
    /// others decode their old chunks with its timestamps as stored and
    /// share those of its new chunk, on every core when `spread` and the
    /// hour is large. One series-hour too large to compact leaves the
    /// GPU's hour in the head.
    fn compact_group(&self, g: &Group, spread: bool) -> Result<CompactionReport, StoreError> {
        let mut report = CompactionReport::default();
        let bundles = g
            .blocks
            .iter()
            .map(|(_, v)| gpu_block::decode(v))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::new();
        let mut ofu: Vec<&[u8]> = Vec::new();
        for b in &bundles {
            for (metric, block) in &b.raw {
                raw.entry(metric).or_default().push(block);
            }
            ofu.extend(&b.ofu);
        }
        let mut ref_prefix = g.prefix.clone();
        keys::put_str(&mut ref_prefix, TIME_REF);
        let mut before = None;
        self.engine.view(&mut |view| {
            before = chunk_times(view, &ref_prefix, g.window)?;
            Ok(())
        })?;
        let mut ops = Vec::new();
        let (mut chunks, mut samples) = (0u64, 0usize);
        let mut after = before.clone();
        if let Some(values) = raw.remove(TIME_REF) {
            let ts = (before.as_ref(), None);
            let Some(p) =
                self.plan_series(keys::KIND_RAW, &ref_prefix, g.window, &values, ts, &mut ops)?
            else {
                return Ok(report);
            };
            after = p.times;
            chunks += 1;
            samples += p.samples;
        }
        // The other series and the OFU only read the reference's new
        // timestamps: planned on every core when the hour is large, their
        // writes joined in the same order as on one thread.
        let ts = (before.as_ref(), after.as_ref());
        let mut work: Vec<SeriesWork<'_>> = raw
            .iter()
            .map(|(metric, values)| {
                let mut prefix = g.prefix.clone();
                keys::put_str(&mut prefix, metric);
                (keys::KIND_RAW, prefix, values.as_slice())
            })
            .collect();
        if !ofu.is_empty() {
            work.push((keys::KIND_OFU, g.prefix.clone(), ofu.as_slice()));
        }
        let bytes: usize = g.blocks.iter().map(|(_, v)| v.len()).sum();
        let per_thread = if spread && bytes >= self.parallel_from {
            1
        } else {
            usize::MAX
        };
        let plan = |(kind, prefix, values): SeriesWork<'_>| {
            let mut ops = Vec::new();
            let p = self.plan_series(kind, &prefix, g.window, values, ts, &mut ops)?;
            Ok::<_, StoreError>((kind, p, ops))
        };
        let mut raw_samples = samples;
        for part in parallel::in_parallel(work, per_thread, &plan) {
            for (kind, p, planned) in part? {
                // One series-hour too large leaves the GPU's hour in the head.
                let Some(p) = p else {
                    return Ok(report);
                };
                chunks += 1;
                samples += p.samples;
                if kind == keys::KIND_RAW {
                    raw_samples += p.samples;
                }
                ops.extend(planned);
            }
        }
        for (k, _) in &g.blocks {
            ops.push(Op::Delete(Cf::Head, k.clone()));
        }
        self.engine.apply(ops, false)?;
        self.sealed_raw
            .fetch_add(raw_samples as u64, Ordering::Relaxed);
        report.chunks += chunks;
        report.blocks += g.blocks.len() as u64;
        report.samples += samples as u64;
        Ok(report)
    }

    /// Plans one series-hour's chunk and rollup from its old chunks and the
    /// head block values `head`, pushing the writes onto `ops` (the caller
    /// adds the head's deletes and applies them). `times` are the GPU's
    /// reference chunk's timestamps of the hour: as stored (to decode this
    /// series' old raw chunks) and as they will be once `ops` are applied
    /// (to share in the new chunk); unused for the reference series
    /// itself. `None` when the series-hour is too large to compact (it
    /// stays in the head).
    fn plan_series(
        &self,
        kind: u8,
        prefix: &[u8],
        window: i64,
        head: &[&[u8]],
        times: (Option<&Times>, Option<&Times>),
        ops: &mut Vec<Op>,
    ) -> Result<Option<Planned>, StoreError> {
        let chunk_cf = if kind == keys::KIND_RAW {
            Cf::Raw
        } else {
            Cf::Ofu
        };
        let (stored, shared) = times;
        // The GPU's reference series (`None`: this is the reference).
        let time_ref = if chunk_cf == Cf::Raw {
            time_ref_prefix(prefix)
        } else {
            let mut p = prefix.to_vec();
            keys::put_str(&mut p, TIME_REF);
            Some(p)
        };
        let g = Group {
            kind,
            prefix: prefix.to_vec(),
            window,
            blocks: Vec::new(),
        };
        let mut new_times = None;
        // The hour's existing chunks (late data after an earlier pass).
        let old = self.hour_entries(chunk_cf, &g.prefix, g.window)?;
        let values = old
            .iter()
            .map(|(_, v)| v.as_slice())
            .chain(head.iter().copied());
        // The hour and its minutes per job (raw series: one entry, "").
        let mut entries: BTreeMap<String, HourAcc> = BTreeMap::new();
        let samples;
        if chunk_cf == Cf::Raw {
            let (stored, shared) = if time_ref.is_some() {
                (stored, shared)
            } else {
                (None, None)
            };
            let mut points = Vec::new();
            for v in values {
                let b = match stored {
                    Some((ts, w)) => Block::decode_shared(v, ts, w),
                    None => Block::decode(v),
                }
                .map_err(|e| corrupt(chunk_cf, e))?;
                points.extend(raw_points(&b)?);
                if points.len() > MAX_HOUR_SAMPLES {
                    tracing::warn!(samples = points.len(), "series-hour too large to compact");
                    return Ok(None);
                }
            }
            points.sort_by_key(|p| p.ts_ms);
            if let Some(d) = raw_metric(&g.prefix).and_then(|m| self.precision.decimals(m)) {
                for p in &mut points {
                    p.value = super::round_decimals(p.value, d);
                    p.peak = p.peak.map(|x| super::round_decimals(x, d));
                }
            }
            // An entry only for a series-hour with samples, as for a job.
            if !points.is_empty() {
                let acc = entries.entry(String::new()).or_default();
                for p in &points {
                    acc.add(
                        g.window,
                        p.ts_ms,
                        p.value,
                        0.0,
                        0.0,
                        p.window_ms.unwrap_or(0),
                    );
                }
            }
            samples = points.len();
            let last = points.last().map_or(g.window, |p| p.ts_ms);
            let block = raw_block(&points);
            let shares = !block.is_empty()
                && shared
                    .as_ref()
                    .is_some_and(|(ts, w)| *ts == block.ts && *w == block.windows);
            let value = if shares {
                block.encode_compact_shared()
            } else {
                block.encode_compact()
            }
            .map_err(|e| corrupt(chunk_cf, e))?;
            if time_ref.is_none() {
                new_times = Some((block.ts.clone(), block.windows.clone()));
                // The reference series (OFU and the GPU's other raw
                // series): chunks sharing its old timestamps
                // are re-encoded in this write if they change.
                if let Some((_, v)) = old.first() {
                    let before = Block::decode_time(v).map_err(|e| corrupt(chunk_cf, e))?;
                    if before.0 != block.ts || before.1 != block.windows {
                        ops.extend(self.unshare(&g.prefix, g.window, &before)?);
                    }
                }
            }
            for (k, _) in &old {
                ops.push(Op::Delete(chunk_cf, k.clone()));
            }
            ops.push(Op::Put(
                chunk_cf,
                keys::block_key(&g.prefix, last, 0),
                value,
            ));
        } else {
            // The GPU's tensor activity and clocks of the hour, which the
            // chunk refers to instead of storing them again.
            let mut tpa = HourMap::default();
            let mut clocks = Vec::new();
            let mut cache = RefCache::default();
            let mut by_job: BTreeMap<String, Vec<super::OfuSample>> = BTreeMap::new();
            // How each job's samples were derived at ingest (all its
            // blocks', when they agree).
            let mut how: BTreeMap<String, Derivations> = BTreeMap::new();
            let mut n = 0;
            let mut failure = None;
            self.engine.view(&mut |view| {
                tpa = raw_hour(
                    view,
                    &g.prefix,
                    flopwatch_proto::metrics::TENSOR_ACTIVE,
                    g.window,
                )?;
                clocks = CLOCKS
                    .iter()
                    .map(|c| raw_hour(view, &g.prefix, c, g.window))
                    .collect::<Result<_, _>>()?;
                for v in values.clone() {
                    let (job, s, d) =
                        ofu_samples(v, &mut resolver(view, &g.prefix, &mut cache, g.window))?;
                    n += s.len();
                    if n > MAX_HOUR_SAMPLES {
                        failure = Some(n);
                        return Ok(());
                    }
                    by_job.entry(job.to_string()).or_default().extend(s);
                    how.entry(job.to_string()).or_default().add(d);
                }
                Ok(())
            })?;
            if let Some(n) = failure {
                tracing::warn!(samples = n, "series-hour too large to compact");
                return Ok(None);
            }
            for (k, _) in &old {
                ops.push(Op::Delete(chunk_cf, k.clone()));
            }
            if self.precision.touches_ofu() {
                round_map(
                    &mut tpa,
                    &self.precision,
                    flopwatch_proto::metrics::TENSOR_ACTIVE,
                );
                for (c, m) in clocks.iter_mut().zip(CLOCKS) {
                    round_map(c, &self.precision, m);
                }
            }
            for (i, (job, s)) in by_job.iter_mut().enumerate() {
                s.sort_by_key(|x| x.ts_ms);
                let derivation = how.get(job).and_then(Derivations::common);
                // The clock series the derivation names, as stored.
                let clock = derivation.and_then(|d| clocks.get(usize::from(d.clock)));
                let refs = match (derivation, clock) {
                    (Some(d), Some(clock)) if self.precision.touches_ofu() => {
                        match rounded_refs(s, d, &tpa, clock, &self.precision) {
                            Some(rounded) => {
                                *s = rounded;
                                true
                            }
                            None => false,
                        }
                    }
                    (Some(_), Some(clock)) => refs_hold(s, &tpa, clock),
                    _ => false,
                };
                if !s.is_empty() {
                    let acc = entries.entry(job.clone()).or_default();
                    for x in s.iter() {
                        acc.add(
                            g.window,
                            x.ts_ms,
                            x.ofu,
                            x.tensor_active,
                            x.sm_clock_mhz,
                            x.window_ms,
                        );
                    }
                }
                let last = s.last().map_or(g.window, |x| x.ts_ms);
                ops.push(Op::Put(
                    chunk_cf,
                    keys::block_key(&g.prefix, last, i as u64),
                    ofu_value(job, s, Form::Sealed, derivation, refs, shared)?,
                ));
            }
            // Each minute's last sample, every job's together (lasts.rs).
            let mut lkey = keys::kind_prefix(keys::KIND_LAST, &g.prefix);
            keys::put_ts(&mut lkey, g.window);
            let lasts = super::lasts::encode(
                g.window,
                by_job
                    .values()
                    .flatten()
                    .map(|x| (x.ts_ms, x.ofu, x.window_ms)),
            );
            ops.push(Op::Put(Cf::Rollup, lkey, lasts));
            // Each job's ledger figures of the hour (job_hours.rs).
            let figures: Vec<(&str, super::JobHour)> = by_job
                .iter()
                .filter(|(j, _)| !j.is_empty())
                .filter_map(|(j, s)| super::JobHour::of(s).map(|h| (j.as_str(), h)))
                .collect();
            let mut jkey = keys::kind_prefix(keys::KIND_JOBS, &g.prefix);
            keys::put_ts(&mut jkey, g.window);
            ops.push(Op::Put(
                Cf::Rollup,
                jkey,
                super::job_hours::encode(&figures),
            ));
            samples = n;
        }
        // Raw series keep the hour only; OFU keeps minutes too.
        let rollup = Rollup::per_job(
            entries
                .into_iter()
                .map(|(job, acc)| {
                    let minutes = if g.kind == keys::KIND_OFU {
                        acc.minutes()
                    } else {
                        Vec::new()
                    };
                    (
                        job,
                        rollup::Entry {
                            hour: acc.hour,
                            minutes,
                        },
                    )
                })
                .collect(),
        );
        let mut rkey = keys::kind_prefix(g.kind, &g.prefix);
        keys::put_ts(&mut rkey, g.window);
        ops.push(Op::Put(Cf::Rollup, rkey, rollup.encode()));
        Ok(Some(Planned {
            samples,
            times: new_times,
        }))
    }

    /// The keys and values of `cf` under `prefix` keyed by a time in the
    /// hour starting at `w` (blocks and chunks by their last sample).
    fn hour_entries(&self, cf: Cf, prefix: &[u8], w: i64) -> Result<Vec<Entry>, StoreError> {
        let mut from = prefix.to_vec();
        keys::put_ts(&mut from, w);
        let mut to = prefix.to_vec();
        keys::put_ts(&mut to, w + WINDOW_MS);
        let mut out = Vec::new();
        self.engine.scan(cf, &from, &to, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })?;
        Ok(out)
    }

    /// Puts that re-encode, on their own timestamps, the GPU's raw and OFU
    /// chunks of the hour starting at `w` that share `before`, the
    /// timestamps of the reference chunk `ref_prefix` about to change.
    fn unshare(&self, ref_prefix: &[u8], w: i64, before: &Times) -> Result<Vec<Op>, StoreError> {
        let mut gpu = 0;
        keys::get_str(ref_prefix, &mut gpu);
        keys::get_str(ref_prefix, &mut gpu);
        let gpu_prefix = &ref_prefix[..gpu];
        let end = upper(gpu_prefix);
        let mut cursor = gpu_prefix.to_vec();
        let mut sharers: Vec<Entry> = Vec::new();
        loop {
            // The next series of the GPU, then its chunk of the hour.
            let mut next = None;
            self.engine.scan(Cf::Raw, &cursor, &end, &mut |k, _| {
                next = Some(match keys::series_prefix(Cf::Raw, k) {
                    Some((plen, _)) => Ok(k[..plen].to_vec()),
                    None => Err(k.to_vec()),
                });
                false
            })?;
            let prefix = match next {
                None => break,
                Some(Ok(p)) => p,
                Some(Err(mut bad)) => {
                    bad.push(0);
                    cursor = bad;
                    continue;
                }
            };
            if prefix != ref_prefix {
                sharers.extend(
                    self.hour_entries(Cf::Raw, &prefix, w)?
                        .into_iter()
                        .filter(|(_, v)| Block::shares_time(v)),
                );
            }
            cursor = upper(&prefix);
        }
        let mut ops = sharers
            .into_iter()
            .map(|(k, v)| {
                let b = Block::decode_shared(&v, &before.0, &before.1)
                    .and_then(|b| b.encode_compact())
                    .map_err(|e| corrupt(Cf::Raw, e))?;
                Ok(Op::Put(Cf::Raw, k, b))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // The GPU's OFU chunks of the hour (`tenant · gpu · last_ts · n`).
        for (k, v) in self.hour_entries(Cf::Ofu, gpu_prefix, w)? {
            let at = ofu_block_start(&v).ok_or_else(|| corrupt(Cf::Ofu, "job"))?;
            if Block::shares_time(&v[at..]) {
                let b = Block::decode_shared(&v[at..], &before.0, &before.1)
                    .and_then(|b| b.encode_compact())
                    .map_err(|e| corrupt(Cf::Ofu, e))?;
                let mut value = v[..at].to_vec();
                value.extend(b);
                ops.push(Op::Put(Cf::Ofu, k, value));
            }
        }
        Ok(ops)
    }

    /// Deletes every tenant's events before its retention cutoff and, on
    /// an engine that does not drop expired keys as it compacts
    /// ([`super::Engine::expire_by_compaction`]), its data of hours wholly
    /// before the cutoff, reclaiming the space. Without a retention
    /// policy, nothing.
    pub fn expire(&self) -> Result<CompactionReport, StoreError> {
        let mut report = CompactionReport::default();
        let Some(retention) = self.retention.clone() else {
            return Ok(report);
        };
        // An engine that drops expired keys as it compacts needs no walk.
        let walked: &[Cf] = if self.expired_in_engine {
            &[]
        } else {
            &[Cf::Raw, Cf::Ofu, Cf::Head, Cf::Rollup]
        };
        for &cf in walked {
            // One walk per family, a seek per series; the range deletes
            // are applied a batch at a time, between walks.
            let mut cursor: Vec<u8> = Vec::new();
            let mut touched: Option<(Vec<u8>, Vec<u8>)> = None;
            loop {
                let mut ranges: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                let mut resume: Option<Vec<u8>> = None;
                self.engine.walk(cf, &cursor, &[0xff; 8], &mut |k, _| {
                    // A key no version of this store writes: step over it.
                    let Some((plen, tenant)) = keys::series_prefix(cf, k) else {
                        return Step::Next;
                    };
                    let prefix = &k[..plen];
                    let next = upper(prefix);
                    // Chunks and blocks are keyed by their last sample,
                    // rollups by their hour: both below `cutoff` are wholly
                    // expired. `k` is the series' first key.
                    let mut to = prefix.to_vec();
                    keys::put_ts(&mut to, window_of(retention.cutoff(tenant)));
                    if k < to.as_slice() {
                        let mut from = prefix.to_vec();
                        keys::put_ts(&mut from, i64::MIN);
                        ranges.push((from, to));
                        if ranges.len() >= EXPIRE_BATCH {
                            resume = Some(next);
                            return Step::Stop;
                        }
                    }
                    Step::Seek(next)
                })?;
                if let (Some((from, _)), Some((_, to))) = (ranges.first(), ranges.last()) {
                    touched = Some(match touched.take() {
                        None => (from.clone(), to.clone()),
                        Some((f, _)) => (f, to.clone()),
                    });
                }
                report.expired_ranges += ranges.len() as u64;
                if !ranges.is_empty() {
                    let ops = ranges
                        .into_iter()
                        .map(|(from, to)| Op::DeleteRange(cf, from, to))
                        .collect();
                    self.engine.apply(ops, false)?;
                }
                match resume {
                    Some(c) => cursor = c,
                    None => break,
                }
            }
            if let Some((from, to)) = touched {
                self.engine.compact_range(cf, &from, &to)?;
            }
        }
        // Events: `e · tenant · ts`.
        let mut tenants = std::collections::BTreeSet::new();
        let (efrom, eto) = keys::meta_range(keys::META_EVENT, &[]);
        let mut cursor = efrom;
        loop {
            let mut found = None;
            self.engine.scan(Cf::Meta, &cursor, &eto, &mut |k, _| {
                let mut pos = 1;
                found = keys::get_str(k, &mut pos).map(str::to_string);
                false
            })?;
            let Some(t) = found else { break };
            let (_, to) = keys::meta_range(keys::META_EVENT, &[&t]);
            cursor = to;
            tenants.insert(t);
        }
        for t in tenants {
            let base = keys::meta_key(keys::META_EVENT, &[&t]);
            let mut to = base.clone();
            keys::put_ts(&mut to, retention.cutoff(&t));
            self.engine
                .apply(vec![Op::DeleteRange(Cf::Meta, base, to)], false)?;
        }
        Ok(report)
    }
}

/// The metric of a raw series prefix (tenant · gpu · metric).
fn raw_metric(prefix: &[u8]) -> Option<&str> {
    let mut pos = 0;
    keys::get_str(prefix, &mut pos)?;
    keys::get_str(prefix, &mut pos)?;
    keys::get_str(prefix, &mut pos)
}

/// A raw hour as compaction will store it under `precision`.
fn round_map(map: &mut HourMap, precision: &Precision, metric: &str) {
    if precision.decimals(metric).is_none() {
        return;
    }
    for bits in map.values_mut().flatten() {
        *bits = precision.round(metric, f64::from_bits(*bits)).to_bits();
    }
}

/// With precision on tensor activity or a clock: the samples with those
/// rounded as their raw series will be (and OFU recomputed from them with
/// the recorded tensor clock), if the raw series `tpa` and `clock` (the
/// derivation's clock series) then hold them. `None` keeps the samples as
/// received.
fn rounded_refs(
    samples: &[OfuSample],
    d: Derivation,
    tpa: &HourMap,
    clock: &HourMap,
    precision: &Precision,
) -> Option<Vec<OfuSample>> {
    let metric = d.clock_metric()?;
    let rounded: Vec<OfuSample> = samples
        .iter()
        .map(|x| {
            let t = precision.round(flopwatch_proto::metrics::TENSOR_ACTIVE, x.tensor_active);
            let c = precision.round(metric, x.sm_clock_mhz);
            OfuSample {
                ofu: flopwatch_proto::ofu::ofu(t, c, d.tensor_clock_mhz),
                tensor_active: t,
                sm_clock_mhz: c,
                ..*x
            }
        })
        .collect();
    refs_hold(&rounded, tpa, clock).then_some(rounded)
}
