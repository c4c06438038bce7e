//! The store: flopwatch's data model over an [`Engine`].

use super::gpu_block::{self, Part};
use super::hours::{hour_runs, window_of, MINUTE_MS, WINDOW_MS};
use super::keys::{self, get_str};
use super::lasts::HourLasts;
use super::ofu_chunk::{ofu_samples, ofu_value, resolver, Form, RefCache};
use super::raw::{raw_block, raw_points, RawReader};
use super::records::EventRecord;
use super::records::{
    AgentKey, CommitSet, GpuRecord, JobRecord, LastsPiece, NodeRecord, OfuPiece, OfuSample,
};
use super::retention::Retention;
use super::rollup::Rollup;
use super::scan::scan_series;
use super::{corrupt, Cf, Engine, Put, Reader, StoreError};
use flopwatch_proto::model::Point;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// flopwatch's store over any engine.
#[derive(Clone)]
pub struct Store {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) sync: bool,
    pub(super) retention: Option<Retention>,
    /// Compaction interval and seal delay.
    pub(super) schedule: (std::time::Duration, std::time::Duration),
    /// What compaction rounds (nothing by default).
    pub(super) precision: Arc<super::Precision>,
    /// Serialises changes to one agent's held ranges.
    pub(super) stripes: Arc<super::membership::Stripes>,
    /// The earliest hour a head block may belong to that no whole
    /// compaction pass has passed over since it was written (`i64::MIN`:
    /// unknown, as when the store is opened). While that hour is not
    /// sealed a pass has nothing to do and is skipped (see
    /// [`Store::compact_within`]).
    pub(super) head_low: Arc<AtomicI64>,
    /// What series the store holds, by tenant ([`super::index`]).
    pub(super) index: Arc<super::index::SeriesIndex>,
    /// Remote write's journal ([`super::journal`]).
    pub(super) journal: Arc<super::journal::Journal>,
    /// When GPUs are folded and sealed ([`Spread`]).
    pub(super) spread: Spread,
    /// GPUs with head bundles not folded yet ([`super::fold`]).
    pub(super) fold_queue: Arc<super::fold::FoldQueue>,
    /// The earliest hour the last whole compaction pass left in the head
    /// (`i64::MAX`: none; `i64::MIN`: no whole pass yet).
    pub(super) head_left: Arc<AtomicI64>,
    /// The hour before which the head's files were last compacted away
    /// once sealed (`i64::MIN`: not yet; [`super::compact`]).
    pub(super) head_cleared: Arc<AtomicI64>,
    /// The hour being sealed and the seal phase before which its sealed
    /// keys were last compacted away ([`super::compact`]).
    pub(super) head_swept: Arc<std::sync::Mutex<(i64, u16)>>,
    /// The hours in which the head holds bundles ([`super::head_hours`]).
    pub(super) head_hours: Arc<super::head_hours::HeadHours>,
    /// Raw samples written into sealed chunks since the store was opened.
    pub(super) sealed_raw: Arc<std::sync::atomic::AtomicU64>,
    /// Whole compaction passes completed since the store was opened.
    pub(super) whole_passes: Arc<std::sync::atomic::AtomicU64>,
    /// The engine drops expired keys in its own compactions
    /// ([`Engine::expire_by_compaction`]).
    pub(super) expired_in_engine: bool,
    /// Head bytes of a GPU-hour from which its series are sealed on every
    /// core ([`super::compact`]).
    pub(super) parallel_from: usize,
    /// GPU-hours a compaction pass seals at a time, each on a core of its
    /// own (the cores, [`super::compact`]).
    pub(super) seal_width: usize,
}

/// When a GPU's head is folded and its hours sealed (see
/// [`super::fold`]); both off (0) unless configured.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Spread {
    /// Hours are sealed GPU by GPU over this span after the seal delay, ms.
    pub(super) seal_spread_ms: i64,
    /// A GPU's unfolded bundles are folded once the oldest is this old
    /// (plus its phase within it), ms; 0: never.
    pub(super) fold_after_ms: i64,
}

/// `e` · tenant · ts · kind · job · gpu: time-ordered within a tenant.
fn event_key(tenant: &str, e: &EventRecord) -> Vec<u8> {
    let mut k = keys::meta_key(keys::META_EVENT, &[tenant]);
    keys::put_ts(&mut k, e.ts_ms);
    for p in [&e.kind, &e.job_id, &e.gpu_uuid] {
        keys::put_str(&mut k, p);
    }
    k
}

/// A batch's head blocks of one GPU and hour: the last timestamp, and
/// the bundle being written.
type Bundle = (i64, gpu_block::Writer);

/// What a batch staged for a write leaves for after it: the earliest hour
/// of its head blocks, and each GPU's earliest bundle (for folding).
type Staged = (i64, Vec<(Vec<u8>, i64)>);

/// Bundles by GPU and hour.
type Bundles<'a> = BTreeMap<(&'a str, i64), Bundle>;

/// The bundle of `gpu` for the hour of `last`, its last timestamp raised
/// to `last`.
fn bundle<'m, 'a>(bundles: &'m mut Bundles<'a>, gpu: &'a str, last: i64) -> &'m mut Bundle {
    let b = bundles
        .entry((gpu, window_of(last)))
        .or_insert_with(|| (last, gpu_block::Writer::new()));
    b.0 = b.0.max(last);
    b
}

/// A mask of an hour's minutes, every minute set reading as all bits (an
/// hour covered whole).
/// Minutes `lo..hi` of an hour as bits (bit `i`: minute `i`).
fn minute_bits(lo: i64, hi: i64) -> u64 {
    let (lo, hi) = (lo.clamp(0, 60), hi.clamp(0, 60));
    if lo >= hi {
        return 0;
    }
    (u64::MAX >> (64 - (hi - lo))) << lo
}

/// A value per hour of one series' read, in hour order: the few hours a
/// read keeps a note of, without a hash map per series.
struct Hours<T>(Vec<(i64, T)>);

impl<T> Default for Hours<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Copy> Hours<T> {
    fn insert(&mut self, w: i64, v: T) {
        match self.0.binary_search_by_key(&w, |e| e.0) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (w, v)),
        }
    }

    fn get(&self, w: i64) -> Option<T> {
        let i = self.0.binary_search_by_key(&w, |e| e.0).ok()?;
        Some(self.0[i].1)
    }
}

fn whole_hour_as_all(mask: u64) -> u64 {
    if mask == (1 << 60) - 1 {
        u64::MAX
    } else {
        mask
    }
}

/// What one read of a GPU's OFU yields to [`Store::ofu_pieces`] and
/// [`Store::ofu_lasts`].
enum Read<'a> {
    Piece(OfuPiece),
    Hour(HourLasts<'a>),
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs of strings and numbers cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn from_json<T: DeserializeOwned>(b: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| corrupt(Cf::Meta, e))
}

impl Store {
    /// A store over `engine`; `sync` fsyncs every commit.
    pub fn new(engine: Arc<dyn Engine>, sync: bool) -> Self {
        Self {
            engine,
            sync,
            retention: None,
            schedule: (
                std::time::Duration::from_secs(60),
                std::time::Duration::from_secs(300),
            ),
            precision: Arc::default(),
            stripes: Arc::default(),
            head_low: Arc::new(AtomicI64::new(i64::MIN)),
            index: Arc::default(),
            journal: Arc::default(),
            spread: Spread::default(),
            fold_queue: Arc::default(),
            head_left: Arc::new(AtomicI64::new(i64::MIN)),
            head_cleared: Arc::new(AtomicI64::new(i64::MIN)),
            head_swept: Arc::new(std::sync::Mutex::new((i64::MIN, 0))),
            head_hours: Arc::default(),
            sealed_raw: Arc::default(),
            expired_in_engine: false,
            whole_passes: Arc::default(),
            parallel_from: super::compact::PARALLEL_BYTES,
            seal_width: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// Seals hours GPU by GPU over `seal_spread` after the seal delay, and
    /// folds a GPU's newest head bundles once the oldest is `fold_after`
    /// old (zero: never); see [`super::fold`].
    pub fn with_spread(
        mut self,
        seal_spread: std::time::Duration,
        fold_after: std::time::Duration,
    ) -> Self {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.spread = Spread {
            seal_spread_ms: ms(seal_spread),
            fold_after_ms: ms(fold_after),
        };
        self
    }

    /// How far sealing is behind its schedule at `now_ms`: how long ago
    /// the earliest hour the last whole pass left in the head was due
    /// (its end, the seal delay and the whole seal spread), 0 when none
    /// is overdue.
    pub fn compaction_lag_ms(&self, now_ms: i64) -> i64 {
        let left = self.head_left.load(Ordering::SeqCst);
        if left == i64::MAX || left == i64::MIN {
            // Nothing left, or no whole pass yet to tell.
            return 0;
        }
        let seal_delay = i64::try_from(self.schedule.1.as_millis()).unwrap_or(i64::MAX);
        let due = left
            .saturating_add(WINDOW_MS)
            .saturating_add(seal_delay)
            .saturating_add(self.spread.seal_spread_ms);
        now_ms.saturating_sub(due).max(0)
    }

    /// Raw samples written into sealed chunks since the store was opened
    /// (a chunk rewritten for late data counts all its samples again).
    pub fn sealed_raw_samples(&self) -> u64 {
        self.sealed_raw.load(Ordering::Relaxed)
    }

    /// Compaction passes that walked the whole head since the store was
    /// opened (a pass skipped for having nothing to seal counts too).
    pub fn whole_passes(&self) -> u64 {
        self.whole_passes.load(Ordering::SeqCst)
    }

    /// GPUs whose newest head bundles wait to be folded.
    pub fn fold_backlog(&self) -> usize {
        self.fold_queue.len()
    }

    /// The hours in which to read `cf`'s bundles (the head's known ones;
    /// limbo's found by seeking).
    pub(super) fn bundle_hours(&self, cf: Cf) -> super::gpu_block::BundleHours {
        match cf {
            Cf::Head => self.head_hours.held(&*self.engine),
            _ => super::gpu_block::BundleHours::Discover,
        }
    }

    /// Head blocks of the hour starting at `window` (or later) were
    /// written: the next compaction pass looks at them once that hour is
    /// sealed. Called after the write, so a pass that started before this
    /// call either saw the blocks or leaves them to the next pass.
    pub(super) fn head_written(&self, window: i64) {
        self.head_low.fetch_min(window, Ordering::SeqCst);
    }

    /// Bundles were written: their GPUs are folded once due.
    fn fold_written(&self, written: &[(Vec<u8>, i64)]) {
        for (prefix, ts) in written {
            self.fold_queue.note(prefix, *ts);
        }
    }

    /// Rounds values at compaction as `precision` says (opt-in lossy
    /// storage; see [`super::Precision`]).
    pub fn with_precision(mut self, precision: super::Precision) -> Self {
        self.precision = Arc::new(precision);
        self
    }

    /// Compacts every `every`, sealing an hour `seal_delay` after it ends
    /// (see [`super::run_compactor`]).
    pub fn with_compaction(
        mut self,
        every: std::time::Duration,
        seal_delay: std::time::Duration,
    ) -> Self {
        self.schedule = (every, seal_delay);
        self
    }

    /// Applies `retention`: reads never return older samples, and the
    /// engine drops them as it compacts its files (RocksDB's compaction
    /// filter), or, on an engine that cannot, [`Store::expire`] deletes
    /// them.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        let r = retention.clone();
        let expired = move |cf: Cf, key: &[u8]| {
            // Chunks and blocks are keyed by their last sample, rollups by
            // their hour: both wholly expired below the cutoff's hour.
            let Some((plen, tenant)) = keys::series_prefix(cf, key) else {
                return false;
            };
            keys::key_ts(key, plen).is_some_and(|ts| ts < window_of(r.cutoff(tenant)))
        };
        self.expired_in_engine = self.engine.expire_by_compaction(Arc::new(expired));
        self.retention = Some(retention);
        self
    }

    /// The engine (for flush and size).
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// The oldest timestamp of `tenant` kept at `now_ms` (`i64::MIN`
    /// without retention).
    pub fn cutoff(&self, tenant: &str, now_ms: i64) -> i64 {
        match &self.retention {
            Some(r) => {
                let keep = r.tenants.get(tenant).copied().unwrap_or(r.default_ms);
                now_ms.saturating_sub(keep)
            }
            None => i64::MIN,
        }
    }

    /// `start` raised to `tenant`'s retention cutoff.
    pub(super) fn clamp(&self, tenant: &str, start: i64) -> i64 {
        match &self.retention {
            Some(r) => start.max(r.cutoff(tenant)),
            None => start,
        }
    }

    /// Writes one batch atomically and durably: its samples go to the
    /// head as one bundle per GPU and hour ([`super::gpu_block`]) holding
    /// a block per series.
    pub fn commit(&self, tenant: &str, set: &CommitSet) -> Result<(), StoreError> {
        self.commit_all(tenant, std::slice::from_ref(set))
    }

    /// Writes several batches of `tenant` in one atomic, durable write
    /// (group commit): what [`Store::commit`] would write for each, side
    /// by side. Batches of the same agent · boot go in separate writes, in
    /// order, since each one's record of held numbers builds on the one
    /// before.
    pub fn commit_all(&self, tenant: &str, sets: &[CommitSet]) -> Result<(), StoreError> {
        let mut from = 0;
        while from < sets.len() {
            let mut agents = std::collections::HashSet::new();
            let to = from
                + sets[from..]
                    .iter()
                    .take_while(|s| s.agent.as_ref().is_none_or(|a| agents.insert(a)))
                    .count();
            self.write_group(tenant, &sets[from..to])?;
            from = to;
        }
        Ok(())
    }

    /// One write for `sets`, no two of one agent · boot.
    fn write_group(&self, tenant: &str, sets: &[CommitSet]) -> Result<(), StoreError> {
        // Each agent's record of held numbers is read and rewritten under
        // its stripe's lock, held until the write ended.
        let _stripes = self
            .stripes
            .lock_all(sets.iter().filter_map(|s| s.agent.as_ref()));
        let mut puts: Vec<Put> = Vec::new();
        let mut tickets = Vec::new();
        let mut after: Vec<Staged> = Vec::with_capacity(sets.len());
        for set in sets {
            let (low, written) = self.stage(tenant, set, &mut puts, &mut tickets)?;
            after.push((low, written));
        }
        if puts.is_empty() {
            return Ok(());
        }
        sort_puts(&mut puts);
        for set in sets {
            self.index.before_write(tenant, set);
        }
        let hours = super::head_hours::of_keys(
            puts.iter()
                .filter(|(cf, _, _)| *cf == Cf::Head)
                .map(|(_, k, _)| k.as_slice()),
        );
        self.engine.write(puts, self.sync)?;
        // Before the batches are acknowledged: a reader from then on
        // looks in these hours.
        self.head_hours.written(hours);
        drop(tickets);
        for (set, (low, written)) in sets.iter().zip(after) {
            // Limbo blocks reach the head when settled (`Store::settle`).
            if set.limbo.is_none() {
                self.head_written(low);
                self.fold_written(&written);
            }
            self.index.observe(tenant, set);
        }
        Ok(())
    }

    /// Adds one batch's puts to `out` (its remote-write journal ticket to
    /// `tickets`, to be held until the write ended); the earliest hour of
    /// head blocks and each GPU's earliest bundle, for after the write.
    /// The caller holds the agent's stripe.
    fn stage(
        &self,
        tenant: &str,
        set: &CommitSet,
        out: &mut Vec<Put>,
        tickets: &mut Vec<super::journal::Ticket>,
    ) -> Result<Staged, StoreError> {
        let mut bundles: Bundles<'_> = BTreeMap::new();
        for s in &set.series {
            for run in hour_runs(s.points.len(), |i| s.points[i].ts_ms) {
                let points = &s.points[run];
                let last = points.iter().map(|p| p.ts_ms).max().unwrap_or(0);
                bundle(&mut bundles, &s.gpu_uuid, last)
                    .1
                    .raw(&s.metric, |out| raw_block(points).encode_into(out))
                    .map_err(|e| corrupt(Cf::Raw, e))?;
            }
        }
        for (gpu, job, samples) in &set.ofu {
            for run in hour_runs(samples.len(), |i| samples[i].ts_ms) {
                let samples = &samples[run];
                let value = ofu_value(
                    job.as_deref().unwrap_or(""),
                    samples,
                    Form::Head,
                    set.derivations.get(gpu).copied(),
                    false,
                    None,
                )?;
                let last = samples.iter().map(|s| s.ts_ms).max().unwrap_or(0);
                bundle(&mut bundles, gpu, last).1.ofu(&value);
            }
        }
        let mut puts: Vec<Put> = Vec::with_capacity(bundles.len() + set.gpus.len() + 4);
        // The earliest hour of the head blocks written.
        let mut low = i64::MAX;
        // Each GPU's earliest bundle, for folding.
        let mut written: Vec<(Vec<u8>, i64)> = Vec::new();
        for ((gpu, window), (last, bundle)) in bundles {
            low = low.min(window);
            // `tenant · gpu`, the prefix a GPU's OFU chunks have too.
            let prefix = keys::kind_prefix(keys::KIND_GPU, &keys::ofu_prefix(tenant, gpu));
            if self.spread.fold_after_ms > 0 && written.last().is_none_or(|(p, _)| *p != prefix) {
                written.push((prefix.clone(), last));
            }
            puts.push((
                Cf::Head,
                keys::head_key(&prefix[1..], last, set.seq),
                bundle.finish(),
            ));
        }
        for n in &set.nodes {
            puts.push((
                Cf::Meta,
                keys::meta_key(keys::META_NODE, &[tenant, &n.node_id]),
                json(n),
            ));
        }
        for g in &set.gpus {
            puts.push((
                Cf::Meta,
                keys::meta_key(keys::META_GPU, &[tenant, &g.uuid]),
                json(g),
            ));
        }
        for j in &set.jobs {
            puts.push((
                Cf::Meta,
                keys::meta_key(keys::META_JOB, &[tenant, &j.job_id, &j.gpu_uuid]),
                json(j),
            ));
        }
        for e in &set.events {
            puts.push((Cf::Meta, event_key(tenant, e), json(e)));
        }
        for (k, v) in &set.forward_open {
            puts.push((Cf::OpenSeries, k.clone(), v.clone()));
        }
        // Held until the write ended (its number in flight).
        if !set.forward.is_empty() {
            let (put, ticket) = self.journal_put(set.forward.clone())?;
            puts.push(put);
            tickets.push(ticket);
        }
        if let Some(a) = &set.agent {
            puts.push((
                Cf::Meta,
                keys::meta_key(keys::META_AGENT, &[&a.tenant, &a.agent_id, &a.boot_id]),
                set.seq.to_be_bytes().to_vec(),
            ));
            // The batch's number joins the held ranges (or its limbo
            // record) in this same write.
            if let Some(since) = set.limbo {
                let record = self.limbo_puts(a, set.seq, since, &mut puts);
                puts.push(record);
            } else if !set.no_data {
                puts.push(self.held_put(a, set.seq)?);
            }
        }
        out.append(&mut puts);
        Ok((low, written))
    }

    /// Highest durable sequence number of an agent (0: none).
    pub fn acked_seq(&self, a: &AgentKey) -> Result<u64, StoreError> {
        let k = keys::meta_key(keys::META_AGENT, &[&a.tenant, &a.agent_id, &a.boot_id]);
        match self.engine.get(Cf::Meta, &k)? {
            None => Ok(0),
            Some(v) => {
                let b: [u8; 8] = v
                    .as_slice()
                    .try_into()
                    .map_err(|_| corrupt(Cf::Meta, "acked seq"))?;
                Ok(u64::from_be_bytes(b))
            }
        }
    }

    /// Raw samples of one series in `[start, end)`, the first `limit` in
    /// time order: sealed chunks and head blocks read under one view, so
    /// each sample is seen once even while a compaction runs.
    pub fn series(
        &self,
        tenant: &str,
        gpu: &str,
        metric: &str,
        start: i64,
        end: i64,
        limit: usize,
    ) -> Result<Vec<Point>, StoreError> {
        self.series_in(None, tenant, gpu, metric, start, end, limit)
    }

    /// [`Store::series`] under `reader`'s view, or a view of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn series_in(
        &self,
        reader: Option<&Reader<'_>>,
        tenant: &str,
        gpu: &str,
        metric: &str,
        start: i64,
        end: i64,
        limit: usize,
    ) -> Result<Vec<Point>, StoreError> {
        let start = self.clamp(tenant, start);
        let mut out = Vec::new();
        let prefix = keys::raw_prefix(tenant, gpu, metric);
        let bundles = keys::ofu_prefix(tenant, gpu);
        self.in_view(reader, &mut |view, head| {
            let mut reader = RawReader::new(view, &prefix);
            // Chunks, then bundles in the head and limbo.
            let sources = [
                (Cf::Raw, None),
                (Cf::Head, Some(&bundles)),
                (Cf::Limbo, Some(&bundles)),
            ];
            for (cf, bundled) in sources {
                let mut taken = 0usize;
                let mut visit = |hour: i64, v: &[u8]| {
                    let b = reader.decode(cf, hour, v)?;
                    for pt in raw_points(&b)? {
                        if pt.ts_ms >= start && pt.ts_ms < end {
                            out.push(pt);
                            taken += 1;
                        }
                    }
                    Ok(taken < limit)
                };
                match (cf, bundled) {
                    (_, Some(g)) => gpu_block::scan_parts(
                        view,
                        cf,
                        head.of(cf),
                        g,
                        Part::Raw(metric),
                        start,
                        end,
                        &mut visit,
                    )?,
                    (_, None) => scan_series(view, cf, &prefix, start, end, &mut visit)?,
                }
            }
            Ok(())
        })?;
        out.sort_by_key(|p| p.ts_ms);
        out.truncate(limit);
        Ok(out)
    }

    /// OFU samples of one GPU in `[start, end)`, only those recorded while
    /// `job` ran on it when `job` is given.
    pub fn ofu(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        f: &mut dyn FnMut(OfuSample),
    ) -> Result<(), StoreError> {
        self.ofu_in(None, tenant, gpu, start, end, job, f)
    }

    /// [`Store::ofu`] under `reader`'s view, or a view of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn ofu_in(
        &self,
        reader: Option<&Reader<'_>>,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        f: &mut dyn FnMut(OfuSample),
    ) -> Result<(), StoreError> {
        self.ofu_read(
            reader,
            tenant,
            gpu,
            start,
            end,
            job,
            None,
            false,
            &mut |r| {
                if let Read::Piece(OfuPiece::Sample(s)) = r {
                    f(s)
                }
            },
        )
    }

    /// OFU of one GPU in `[start, end)` as samples and, where the caller
    /// allows it, rollup buckets. With `buckets = Some(step)`, a sealed
    /// hour or minute lying wholly inside the range and inside one step
    /// bucket `start + k·step` (any when `step` is 0) comes as one
    /// [`OfuPiece::Agg`] instead of its samples; at steps of 1 h or more
    /// every sealed minute inside the range does (its bucket is the one it
    /// starts in). With `job`, the buckets are that job's (the rollups keep
    /// an entry per job; an hour rolled up before they did is read sample
    /// by sample). Hours with samples still in the head come as samples.
    /// Every sample counts exactly once.
    #[allow(clippy::too_many_arguments)]
    pub fn ofu_pieces(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        buckets: Option<i64>,
        f: &mut dyn FnMut(OfuPiece),
    ) -> Result<(), StoreError> {
        self.ofu_read(
            None,
            tenant,
            gpu,
            start,
            end,
            job,
            buckets,
            false,
            &mut |r| {
                if let Read::Piece(p) = r {
                    f(p)
                }
            },
        )
    }

    /// OFU of one GPU in `[start, end)` as samples and, for the sealed
    /// minutes lying wholly inside the range, their last samples, an hour
    /// at a time ([`LastsPiece::Hour`], from the hour's minute lasts: see
    /// `lasts.rs`) instead of their samples: what an instant selector at
    /// steps on whole minutes reads. So is the minute the range starts
    /// inside, when its last sample lies in the range: that sample, and
    /// no sample on the minute's start (it lies before the range). Hours
    /// with samples still in the head, or sealed before minute lasts were
    /// kept, come as samples.
    pub fn ofu_lasts(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        f: &mut dyn FnMut(LastsPiece<'_>),
    ) -> Result<(), StoreError> {
        self.ofu_lasts_in(None, tenant, gpu, start, end, f)
    }

    /// [`Store::ofu_lasts`] under `reader`'s view, or a view of its own.
    pub fn ofu_lasts_in(
        &self,
        reader: Option<&Reader<'_>>,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        f: &mut dyn FnMut(LastsPiece<'_>),
    ) -> Result<(), StoreError> {
        // Step 0: any minute wholly inside the range; no rollup buckets
        // are asked for, so every piece is a sample or an hour.
        self.ofu_read(
            reader,
            tenant,
            gpu,
            start,
            end,
            None,
            Some(0),
            true,
            &mut |r| match r {
                Read::Piece(OfuPiece::Sample(s)) => f(LastsPiece::Sample(s)),
                Read::Hour(h) => f(LastsPiece::Hour(h)),
                Read::Piece(OfuPiece::Agg { .. }) => {}
            },
        )
    }

    /// [`Store::ofu_pieces`], with minute lasts instead of rollup
    /// buckets when `lasts`.
    #[allow(clippy::too_many_arguments)]
    fn ofu_read(
        &self,
        at: Option<&Reader<'_>>,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        buckets: Option<i64>,
        lasts: bool,
        f: &mut dyn FnMut(Read<'_>),
    ) -> Result<(), StoreError> {
        let start = self.clamp(tenant, start);
        // Past a GPU's last OFU a query asked for (`Store::ofu_bounds`)
        // nothing lies: not read (a range past a GPU's last hour would
        // seek each family there). The start stays: buckets align on it.
        let end = match self.known_ofu_bounds(tenant, gpu) {
            Some((_, last)) => end.min(last.saturating_add(1)),
            None => end,
        };
        if start >= end {
            return Ok(());
        }
        let prefix = keys::ofu_prefix(tenant, gpu);
        let step = buckets;
        let bucket = |ts: i64| match step {
            Some(s) if s > 0 => (ts - start).div_euclid(s),
            _ => 0,
        };
        // At steps of an hour or more a minute counts in the bucket where
        // it starts: a bucket edge that falls inside a minute moves to the
        // minute's start (< 1 min of a ≥ 1 h bucket), so no chunk has to
        // be decoded for an unaligned start. Totals stay exact.
        let coarse = step.is_some_and(|s| s >= WINDOW_MS);
        let usable = |from: i64, len: i64| {
            from >= start
                && from + len <= end
                && (bucket(from) == bucket(from + len - 1) || (coarse && len == MINUTE_MS))
        };
        self.in_view(at, &mut |view, head| {
            // Hours with head blocks are read sample by sample.
            let mut in_head = Hours::default();
            // Covered minutes per hour (all 60 bits: the whole hour).
            let mut covered: Hours<u64> = Hours::default();
            let mut raw_cache = RefCache::default();
            // The head's and limbo's samples, read once where the hours
            // they hold are needed first.
            let mut head_samples: Option<Vec<OfuSample>> = None;
            if step.is_some() {
                let mut buf = Vec::new();
                for cf in [Cf::Head, Cf::Limbo] {
                    let mut take = |w: i64, v: &[u8]| -> Result<bool, StoreError> {
                        in_head.insert(w, ());
                        let (block_job, samples, _) =
                            ofu_samples(v, &mut resolver(view, &prefix, &mut raw_cache, w))?;
                        if job.is_none_or(|j| j == block_job) {
                            buf.extend(
                                samples
                                    .into_iter()
                                    .filter(|s| s.ts_ms >= start && s.ts_ms < end),
                            );
                        }
                        Ok(true)
                    };
                    gpu_block::scan_parts(
                        view,
                        cf,
                        head.of(cf),
                        &prefix,
                        Part::Ofu,
                        start,
                        end,
                        &mut take,
                    )?;
                }
                head_samples = Some(buf);
                if lasts {
                    // Minute lasts of the sealed hours: every minute wholly
                    // inside the range.
                    let lprefix = keys::kind_prefix(keys::KIND_LAST, &prefix);
                    scan_series(
                        view,
                        Cf::Rollup,
                        &lprefix,
                        window_of(start),
                        end,
                        &mut |w, v| {
                            if in_head.get(w).is_some() {
                                return Ok(true);
                            }
                            // The minutes handed over (wholly inside the
                            // range: lasts are read at step 0, one bucket),
                            // and those outside it (nothing of theirs is read).
                            let at = |t: i64, up: bool| {
                                let m = t.saturating_sub(w);
                                let i = if up {
                                    m.saturating_add(MINUTE_MS - 1)
                                } else {
                                    m
                                };
                                i.div_euclid(MINUTE_MS).clamp(0, 60)
                            };
                            let mut mask = minute_bits(at(start, true), at(end, false));
                            let mut outside =
                                minute_bits(0, at(start, false)) | minute_bits(at(end, true), 60);
                            let hour = HourLasts::parse(w, v)
                                .ok_or_else(|| corrupt(Cf::Rollup, "minute lasts"))?;
                            // The minute the range ends inside (a job's span
                            // ends after its last sample) is whole in the
                            // range when its samples all lie before `end`.
                            let i = (end - w).div_euclid(MINUTE_MS);
                            let m = w + i * MINUTE_MS;
                            if (0..60).contains(&i)
                                && m >= start
                                && m < end
                                && hour.last_of(i as u32).is_none_or(|t| t < end)
                            {
                                mask |= 1 << i;
                            }
                            // The minute the range starts inside: what of it
                            // lies in the range is its newest sample where
                            // that is at or after `start` (then all its
                            // samples up to `end` are, and none is
                            // otherwise), never its sample on the start.
                            let i = (start - w).div_euclid(MINUTE_MS);
                            let mut no_start = 0;
                            if (0..60).contains(&i) && w + i * MINUTE_MS < start {
                                match hour.last_of(i as u32) {
                                    Some(t) if t >= end => {}
                                    Some(t) if t >= start => {
                                        mask |= 1 << i;
                                        no_start |= 1 << i;
                                    }
                                    _ => outside |= 1 << i,
                                }
                            }
                            let hour = hour.only(mask).without_start(no_start);
                            if !hour.is_empty() {
                                f(Read::Hour(hour));
                            }
                            covered.insert(w, whole_hour_as_all(mask | outside));
                            Ok(true)
                        },
                    )?;
                }
                let rprefix = keys::kind_prefix(keys::KIND_OFU, &prefix);
                // Minute lasts answer instead of the rollups: not read.
                let rollups = if lasts { None } else { Some(&rprefix) };
                if let Some(rprefix) = rollups {
                    scan_series(
                        view,
                        Cf::Rollup,
                        rprefix,
                        window_of(start),
                        end,
                        &mut |w, v| {
                            if in_head.get(w).is_some() {
                                return Ok(true);
                            }
                            let r =
                                Rollup::decode(v).ok_or_else(|| corrupt(Cf::Rollup, "record"))?;
                            let Some(r) = (match job {
                                Some(j) => r.job(j),
                                None => Some(r.gpu()),
                            }) else {
                                return Ok(true);
                            };
                            if usable(w, WINDOW_MS) {
                                covered.insert(w, u64::MAX);
                                if r.hour.mean.count > 0 {
                                    f(Read::Piece(OfuPiece::Agg {
                                        ts_ms: w,
                                        len_ms: WINDOW_MS,
                                        agg: r.hour.mean,
                                        first: r.hour.first,
                                    }));
                                }
                                return Ok(true);
                            }
                            // Minutes inside the range: from their rollup (those
                            // without samples have nothing to read either).
                            let mut mask = 0u64;
                            for i in 0..60u8 {
                                if usable(w + i64::from(i) * MINUTE_MS, MINUTE_MS) {
                                    mask |= 1 << i;
                                }
                            }
                            for (i, b) in r.minutes {
                                if mask & (1 << i) != 0 {
                                    f(Read::Piece(OfuPiece::Agg {
                                        ts_ms: w + i64::from(i) * MINUTE_MS,
                                        len_ms: MINUTE_MS,
                                        agg: b.mean,
                                        first: b.first,
                                    }));
                                }
                            }
                            covered.insert(w, whole_hour_as_all(mask));
                            Ok(true)
                        },
                    )?;
                }
            }
            // Chunks are read only between hours the rollups covered whole.
            let mut full: Vec<i64> = covered
                .0
                .iter()
                .filter(|(_, m)| *m == u64::MAX)
                .map(|(w, _)| *w)
                .collect();
            full.sort_unstable();
            let mut ranges = Vec::new();
            let mut cur = start;
            for w in full {
                if w > cur {
                    ranges.push((Cf::Ofu, &prefix, cur, w));
                }
                cur = cur.max(w + WINDOW_MS);
            }
            if cur < end {
                ranges.push((Cf::Ofu, &prefix, cur, end));
            }
            // Then bundles in the head and limbo (`bundled`).
            let mut ranges: Vec<_> = ranges.into_iter().map(|r| (r, false)).collect();
            if head_samples.is_none() {
                for cf in [Cf::Head, Cf::Limbo] {
                    ranges.push(((cf, &prefix, start, end), true));
                }
            }
            for ((cf, p, from, to), bundled) in ranges {
                let mut visit = |w: i64, v: &[u8]| {
                    let mask = if cf == Cf::Ofu {
                        covered.get(w).unwrap_or(0)
                    } else {
                        0
                    };
                    if mask == u64::MAX {
                        return Ok(true);
                    }
                    let (block_job, samples, _) =
                        ofu_samples(v, &mut resolver(view, &prefix, &mut raw_cache, w))?;
                    if job.is_some_and(|j| j != block_job) {
                        return Ok(true);
                    }
                    for s in samples {
                        let minute = (s.ts_ms - w) / MINUTE_MS;
                        let bit = if (0..60).contains(&minute) {
                            1u64 << minute
                        } else {
                            0
                        };
                        if s.ts_ms >= start && s.ts_ms < end && mask & bit == 0 {
                            f(Read::Piece(OfuPiece::Sample(s)));
                        }
                    }
                    Ok(true)
                };
                if bundled {
                    gpu_block::scan_parts(
                        view,
                        cf,
                        head.of(cf),
                        p,
                        Part::Ofu,
                        from,
                        to,
                        &mut visit,
                    )?;
                } else {
                    scan_series(view, cf, p, from, to, &mut visit)?;
                }
            }
            for s in head_samples.into_iter().flatten() {
                f(Read::Piece(OfuPiece::Sample(s)));
            }
            Ok(())
        })
    }

    fn meta_list<T: DeserializeOwned>(
        &self,
        kind: u8,
        tenant: Option<&str>,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let parts: Vec<&str> = tenant.into_iter().collect();
        let (from, to) = keys::meta_range(kind, &parts);
        let mut raw = Vec::new();
        self.engine.scan(Cf::Meta, &from, &to, &mut |k, v| {
            raw.push((k.to_vec(), v.to_vec()));
            true
        })?;
        raw.into_iter()
            .map(|(k, v)| {
                let mut pos = 1;
                let t = get_str(&k, &mut pos).ok_or_else(|| corrupt(Cf::Meta, "key"))?;
                Ok((t.to_string(), from_json(&v)?))
            })
            .collect()
    }

    /// Nodes of `tenant` (every tenant when `None`), with their tenant.
    pub fn nodes(&self, tenant: Option<&str>) -> Result<Vec<(String, NodeRecord)>, StoreError> {
        self.meta_list(keys::META_NODE, tenant)
    }

    /// GPUs of `tenant` (every tenant when `None`).
    pub fn gpus(&self, tenant: Option<&str>) -> Result<Vec<(String, GpuRecord)>, StoreError> {
        self.meta_list(keys::META_GPU, tenant)
    }

    /// Job-on-GPU records of `tenant` (every tenant when `None`).
    pub fn jobs(&self, tenant: Option<&str>) -> Result<Vec<(String, JobRecord)>, StoreError> {
        self.meta_list(keys::META_JOB, tenant)
    }

    /// Events of `tenant` with `start_ms <= ts < end_ms`, oldest first, at
    /// most `limit`.
    pub fn events(
        &self,
        tenant: &str,
        start_ms: i64,
        end_ms: i64,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let base = keys::meta_key(keys::META_EVENT, &[tenant]);
        let (mut from, mut to) = (base.clone(), base);
        keys::put_ts(&mut from, start_ms);
        keys::put_ts(&mut to, end_ms);
        // Events of batches in limbo are stored under the same keys in the
        // limbo family: merged in key (time) order under one view.
        let mut raw = Vec::new();
        self.engine.view(&mut |view| {
            for cf in [Cf::Meta, Cf::Limbo] {
                let mut n = 0;
                view.scan(cf, &from, &to, &mut |k, v| {
                    raw.push((k.to_vec(), v.to_vec()));
                    n += 1;
                    n < limit
                })?;
            }
            Ok(())
        })?;
        raw.sort();
        raw.truncate(limit);
        raw.iter().map(|(_, v)| from_json(v)).collect()
    }

    /// One node's record.
    pub fn node(&self, tenant: &str, node_id: &str) -> Result<Option<NodeRecord>, StoreError> {
        match self.engine.get(
            Cf::Meta,
            &keys::meta_key(keys::META_NODE, &[tenant, node_id]),
        )? {
            Some(v) => Ok(Some(from_json(&v)?)),
            None => Ok(None),
        }
    }

    /// One GPU's record.
    pub fn gpu(&self, tenant: &str, uuid: &str) -> Result<Option<GpuRecord>, StoreError> {
        match self
            .engine
            .get(Cf::Meta, &keys::meta_key(keys::META_GPU, &[tenant, uuid]))?
        {
            Some(v) => Ok(Some(from_json(&v)?)),
            None => Ok(None),
        }
    }
}

/// Puts in key order (a stable sort: a key put twice keeps its last
/// value). RocksDB's memtable inserts a key after the previous one from
/// where that one went in, so a batch's keys in order cost a short walk
/// each instead of a search from the top of the skip list.
fn sort_puts(puts: &mut [Put]) {
    puts.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
}
