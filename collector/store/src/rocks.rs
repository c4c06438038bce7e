//! The RocksDB engine: the only module that names a RocksDB type.
//!
//! One directory per collector, column families `raw`, `ofu`, `meta`,
//! `head`, `rollup`, `limbo` (created when missing, so an older store
//! opens unchanged).
//! Writes go through the WAL (never disabled); `sync` adds an fsync. Chunks
//! are already compressed by [`flopwatch_codec`], so their families have no
//! block compression; the rollups and the metadata (plain fixed-width
//! records) are compressed with zstd (the only codec built in), and the
//! head (a batch's small blocks under their metrics' names) with zstd's
//! fastest level. RocksDB's compactions run at the lowest CPU and I/O
//! priority, its flushes at ingest's.

use super::{Cf, Engine, Expiry, Op, Step, StoreError, View};
use rocksdb::{
    BlockBasedOptions, ColumnFamilyDescriptor, DBCompressionType, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// RocksDB under a directory.
pub struct RocksEngine {
    db: DB,
    path: PathBuf,
    /// A read-only secondary: no snapshots, but nothing changes under it
    /// (it catches up with the primary only when opened).
    secondary: bool,
    /// Retention's test, once the store hands it over
    /// ([`Engine::expire_by_compaction`]); the families' compaction
    /// filters read it.
    expiry: ExpirySlot,
}

/// Where the compaction filters find retention's test.
type ExpirySlot = Arc<RwLock<Option<Arc<Expiry>>>>;

/// The families whose keys retention expires in compaction.
const EXPIRING: [Cf; 4] = [Cf::Raw, Cf::Ofu, Cf::Head, Cf::Rollup];

fn err(e: rocksdb::Error) -> StoreError {
    StoreError::Engine(e.into_string())
}

/// Memtable bytes of all column families together before the largest is
/// flushed.
pub const MEMTABLE_BUDGET: usize = 64 * 1024 * 1024;

/// WAL bytes before the families that still hold the oldest log are
/// flushed. The head takes most of the WAL and is flushed by the memtable
/// budget; every other family (metadata, raw chunks, rollups) is written
/// a little with most commits and so is flushed at each WAL rollover, one
/// small level-0 file per family each time. A larger WAL (was 256 MiB)
/// makes them fewer, at the cost of more to replay after a crash (memory
/// stays bounded by [`MEMTABLE_BUDGET`]).
pub const MAX_TOTAL_WAL: u64 = 1024 * 1024 * 1024;

fn options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(true);
    o.create_missing_column_families(true);
    o.set_compression_type(rocksdb::DBCompressionType::None);
    // One flush and three compactions at a time. With one compaction
    // (RocksDB's default for two jobs) a family's long compaction held
    // back every other family's: at 10,000 agents, while the head's ran at
    // the lowest priority on a busy machine, the metadata's and the raw
    // chunks' small level-0 files reached RocksDB's slowdown trigger (20)
    // and writes were delayed for seconds (docs/BENCHMARKS.md, around the
    // clock). Compactions take only the CPU ingest leaves
    // (`lower_compaction_priority`), so more of them never take a core.
    o.increase_parallelism(2);
    o.set_max_background_jobs(4);
    o.set_max_total_wal_size(MAX_TOTAL_WAL);
    // One memtable budget for every column family together (the default
    // is 64 MiB per family, twice over while one flushes): the collector's
    // memory stays bounded however the write load is spread.
    o.set_db_write_buffer_size(MEMTABLE_BUDGET);
    o.set_keep_log_file_num(4);
    // RocksDB's info log restates every option of every column family at
    // each open; warnings and errors are what an operator needs.
    o.set_log_level(rocksdb::LogLevel::Warn);
    o
}

/// Block size of the metadata family (zstd-compressed): a block holds
/// several records and compresses better than one record alone.
const ZSTD_BLOCK_BYTES: usize = 16 * 1024;

/// Block size of the rollup family, read mostly by scans over a GPU's
/// hours: a fleet-wide query walks one minute-lasts record (about 1.5 kB)
/// per GPU-hour, and each block it enters costs a cache lookup and a
/// block iterator, so larger blocks cut that cost per record; a 30-day
/// read of one GPU (its 720 hour rollups of about 3.4 kB) still
/// decompresses only a few megabytes.
const ROLLUP_BLOCK_BYTES: usize = 64 * 1024;

/// zstd level of the last level's files, where rollups and metadata spend
/// their life (upper levels use RocksDB's default, zstd level 3). These
/// families take a few kB per GPU-hour, so the slower level costs little.
const ZSTD_BOTTOM_LEVEL: i32 = 9;

/// Block size of the head (zstd-compressed). zstd builds its tables for
/// every block it compresses or decompresses, which at RocksDB's default
/// 4 KiB was a quarter of what the head's compactions cost at 10,000 agents
/// (docs/BENCHMARKS.md, soak); a fold or a seal reads a GPU's bundles side
/// by side, several kilobytes at a time, so larger blocks cost reads
/// little.
const HEAD_BLOCK_BYTES: usize = 16 * 1024;

/// Target size of the head's files (RocksDB's default is 64 MiB). Within
/// an hour the head's keys lead with their GPU, so every level holds
/// every GPU and a file of one level overlaps a like share of the next:
/// with 64 MiB files on a head of 1.3 GB, a compaction into the last
/// level rewrote about half of it, both copies on disk until it ended (at
/// 10,000 agents the head grew by 600–700 MB at once for 15 to 25 s;
/// docs/BENCHMARKS.md, around the clock). Smaller files make each
/// compaction a small share of the head, for the same bytes rewritten in
/// all.
const HEAD_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// zstd level of the head's files: the fastest, since every head file is
/// rewritten or deleted within the hour.
const HEAD_ZSTD_LEVEL: i32 = 1;

/// A family's options:
///
/// * the head, whose blocks are all deleted within about an hour of being
///   written, has its files compacted once they are mostly tombstones, so
///   the space of compacted hours comes back while the collector runs
///   rather than whenever a level fills;
/// * rollups and metadata are zstd-compressed (the chunks of `raw` and
///   `ofu` are entropy-coded already), and so is the head, at zstd's
///   fastest level.
fn family_options(cf: Cf, expiry: &ExpirySlot) -> Options {
    let mut o = options();
    if EXPIRING.contains(&cf) {
        // Retention: a key past its tenant's cutoff goes when its file is
        // next rewritten. RocksDB rewrites a file at least every 30 days
        // when a family has a filter (its `periodic_compaction_seconds`
        // default), and reads are clamped to the cutoff meanwhile.
        let slot = expiry.clone();
        o.set_compaction_filter(
            "flopwatch-retention",
            move |_level: u32, key: &[u8], _value: &[u8]| {
                let expired = slot
                    .read()
                    .ok()
                    .and_then(|f| f.as_ref().map(|f| f(cf, key)))
                    .unwrap_or(false);
                if expired {
                    rocksdb::compaction_filter::Decision::Remove
                } else {
                    rocksdb::compaction_filter::Decision::Keep
                }
            },
        );
    }
    match cf {
        Cf::Head => {
            o.add_compact_on_deletion_collector_factory(1024, 512, 0.5);
            // A batch's bundle repeats its metrics' names and lengths, and
            // a GPU's bundles sit side by side: zstd at its fastest level
            // takes most of that out, and fewer bytes are fewer for
            // RocksDB's compactions to rewrite (at 10,000 agents the head
            // uncompressed cost them more CPU than zstd does; folded
            // bundles are packed already and pass through).
            o.set_compression_type(DBCompressionType::Zstd);
            o.set_compression_options(-14, HEAD_ZSTD_LEVEL, 0, 0);
            let mut t = BlockBasedOptions::default();
            t.set_block_size(HEAD_BLOCK_BYTES);
            o.set_block_based_table_factory(&t);
            o.set_target_file_size_base(HEAD_FILE_BYTES);
        }
        Cf::Rollup | Cf::Meta => {
            o.set_compression_type(DBCompressionType::Zstd);
            o.set_bottommost_compression_type(DBCompressionType::Zstd);
            // Window bits and strategy are zlib's (ignored by zstd); no
            // dictionary.
            o.set_bottommost_compression_options(-14, ZSTD_BOTTOM_LEVEL, 0, 0, true);
            let mut t = BlockBasedOptions::default();
            t.set_block_size(match cf {
                Cf::Rollup => ROLLUP_BLOCK_BYTES,
                _ => ZSTD_BLOCK_BYTES,
            });
            o.set_block_based_table_factory(&t);
        }
        Cf::Raw | Cf::Ofu | Cf::Limbo | Cf::Journal | Cf::OpenSeries => {}
    }
    o
}

/// Runs RocksDB's compactions (its low-priority pool) at the lowest CPU
/// and I/O priority: they rewrite files in the background and must not
/// take a core from the commits that acknowledge batches. Flushes (the
/// high-priority pool) keep ingest's priority, so memtables still reach
/// the disk when ingest keeps every core busy. Process-wide (RocksDB's
/// default environment), and done once.
fn lower_compaction_priority() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match rocksdb::Env::new() {
        Ok(mut env) => {
            env.lower_thread_pool_cpu_priority();
            env.lower_thread_pool_io_priority();
        }
        Err(e) => tracing::warn!(error = %e, "RocksDB compactions keep ingest's priority"),
    });
}

/// A format error naming the store's directory.
fn at(path: &Path, e: StoreError) -> StoreError {
    match e {
        StoreError::Format(m) => StoreError::Format(format!("{}: {m}", path.display())),
        e => e,
    }
}

impl RocksEngine {
    /// Opens (creating if needed) the database in `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::Engine(format!("{}: {e}", path.display())))?;
        lower_compaction_priority();
        let expiry = ExpirySlot::default();
        let cfs = Cf::ALL
            .iter()
            .map(|cf| ColumnFamilyDescriptor::new(cf.name(), family_options(*cf, &expiry)));
        let db = DB::open_cf_descriptors(&options(), path, cfs).map_err(err)?;
        let engine = Self {
            db,
            path: path.to_path_buf(),
            secondary: false,
            expiry,
        };
        crate::format::settle(&engine, true).map_err(|e| at(path, e))?;
        Ok(engine)
    }

    /// Opens `path` read-only as a secondary instance (a running collector
    /// is undisturbed); `scratch` holds the secondary's own logs.
    pub fn open_secondary(path: &Path, scratch: &Path) -> Result<Self, StoreError> {
        let mut o = options();
        o.set_max_open_files(-1);
        // A store of an earlier format lacks the families added since
        // (`format`): the secondary opens those it has.
        let existing = DB::list_cf(&o, path).unwrap_or_default();
        let names: Vec<&str> = Cf::ALL
            .iter()
            .map(|c| c.name())
            .filter(|n| existing.is_empty() || existing.iter().any(|e| e == n))
            .collect();
        let db = DB::open_cf_as_secondary(&o, path, scratch, names).map_err(err)?;
        db.try_catch_up_with_primary().map_err(err)?;
        let engine = Self {
            db,
            path: path.to_path_buf(),
            secondary: true,
            expiry: ExpirySlot::default(),
        };
        crate::format::settle(&engine, false).map_err(|e| at(path, e))?;
        Ok(engine)
    }

    fn cf(&self, cf: Cf) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| StoreError::Engine(format!("column family {} missing", cf.name())))
    }
}

/// Scans under one RocksDB snapshot (none on a secondary, which does not
/// change while open). Each family's iterator is kept from one scan to
/// the next: a view that reads many series (a [`crate::Reader`]) seeks
/// it again instead of building a new one per scan.
struct SnapView<'a> {
    /// Declared before the snapshot: dropped before it.
    kept: Mutex<Vec<Kept<'a>>>,
    engine: &'a RocksEngine,
    snap: Option<rocksdb::Snapshot<'a>>,
}

/// A family's iterator kept by a view, and where it is known to stand.
struct Kept<'a> {
    cf: Cf,
    it: rocksdb::DBRawIterator<'a>,
    /// The iterator stands on the first key at or after this one (or, no
    /// longer valid with no error, there is none): a scan from any key
    /// between this one and the key it stands on starts where it stands,
    /// with no seek. A view reading series in key order (a group of GPUs)
    /// finds the next series' first key where the last scan stopped, and
    /// a seek walks every level of the tree. Empty: not known.
    after: Vec<u8>,
}

/// Hidden keys (tombstones, older versions) a kept iterator may pass over
/// in one seek. A kept iterator has no upper bound (it serves many
/// ranges), so in the head, whose keys are deleted as their hours are
/// sealed, a seek into a range holding only tombstones would walk on
/// through the tombstones of the series after it. Past this many, the
/// scan goes on with an iterator bounded to its range.
const SKIPPABLE: u64 = 256;

impl View for SnapView<'_> {
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let engine = self.engine;
        if from >= to || (engine.secondary && engine.db.cf_handle(cf.name()).is_none()) {
            return Ok(());
        }
        let options = || {
            let mut ro = ReadOptions::default();
            if let Some(s) = &self.snap {
                ro.set_snapshot(s);
            }
            ro
        };
        // A scan made from inside another's callback on the same family
        // finds none kept and builds its own.
        let kept = {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let at = kept.iter().position(|k| k.cf == cf);
            at.map(|i| kept.swap_remove(i))
        };
        let Kept {
            mut it, mut after, ..
        } = match kept {
            Some(k) => k,
            None => {
                let mut ro = options();
                ro.set_max_skippable_internal_keys(SKIPPABLE);
                Kept {
                    cf,
                    it: engine.db.raw_iterator_cf_opt(engine.cf(cf)?, ro),
                    after: Vec::new(),
                }
            }
        };
        let stands = !after.is_empty()
            && after.as_slice() <= from
            && if it.valid() {
                it.key().is_some_and(|k| k >= from)
            } else {
                it.status().is_ok()
            };
        if !stands {
            it.seek(from);
        }
        // The last key handed to `f`, where the bounded scan goes on.
        let mut last: Option<Vec<u8>> = None;
        // Whether the scan ended on the first key at or after `to`, or
        // found none (where the iterator then stands is known).
        let mut bounded = true;
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                bounded = false;
                break;
            };
            if k >= to {
                break;
            }
            if !f(k, v) {
                // It stands on a key handed over: not known.
                after.clear();
                return self.keep(Kept { cf, it, after });
            }
            let l = last.get_or_insert_with(Vec::new);
            l.clear();
            l.extend_from_slice(k);
            it.next();
        }
        match it.status() {
            Err(e) if e.kind() == rocksdb::ErrorKind::Incomplete => {
                let resume = match last {
                    Some(mut k) => {
                        k.push(0);
                        k
                    }
                    None => from.to_vec(),
                };
                engine.scan_with(options(), cf, &resume, to, f)
            }
            Err(e) => Err(err(e)),
            Ok(()) => {
                // It stands on the first key after the last one handed
                // over (or after `from`), and that key is at or after
                // `to` (or there is none): the first at or after `to`.
                after.clear();
                if bounded {
                    after.extend_from_slice(to);
                }
                self.keep(Kept { cf, it, after })
            }
        }
    }
}

impl<'a> SnapView<'a> {
    /// Keeps `k` for the next scan of its family (one per family).
    fn keep(&self, k: Kept<'a>) -> Result<(), StoreError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.iter().any(|c| c.cf == k.cf) {
            kept.push(k);
        }
        Ok(())
    }
}

impl RocksEngine {
    fn scan_with(
        &self,
        mut ro: ReadOptions,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if from >= to || (self.secondary && self.db.cf_handle(cf.name()).is_none()) {
            return Ok(());
        }
        ro.set_iterate_upper_bound(to.to_vec());
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf)?, ro);
        it.seek(from);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !f(k, v) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(err)
    }
}

impl Engine for RocksEngine {
    fn last_key(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if from >= to || (self.secondary && self.db.cf_handle(cf.name()).is_none()) {
            return Ok(None);
        }
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(from.to_vec());
        ro.set_iterate_upper_bound(to.to_vec());
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf)?, ro);
        it.seek_to_last();
        let last = it.valid().then(|| it.key().map(<[u8]>::to_vec)).flatten();
        it.status().map_err(err)?;
        Ok(last)
    }

    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                Op::Put(cf, k, v) => batch.put_cf(self.cf(cf)?, k, v),
                Op::Delete(cf, k) => batch.delete_cf(self.cf(cf)?, k),
                Op::DeleteRange(cf, from, to) => batch.delete_range_cf(self.cf(cf)?, from, to),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        wo.disable_wal(false);
        self.db.write_opt(batch, &wo).map_err(err)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if self.secondary && self.db.cf_handle(cf.name()).is_none() {
            return Ok(None);
        }
        self.db.get_cf(self.cf(cf)?, key).map_err(err)
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.scan_with(ReadOptions::default(), cf, from, to, f)
    }

    fn walk(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), StoreError> {
        if from >= to || (self.secondary && self.db.cf_handle(cf.name()).is_none()) {
            return Ok(());
        }
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(to.to_vec());
        // A walk passes over much it does not keep: no caching of it.
        ro.fill_cache(false);
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf)?, ro);
        it.seek(from);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            match f(k, v) {
                Step::Next => it.next(),
                Step::Seek(target) => {
                    if target.as_slice() > k {
                        it.seek(&target);
                    } else {
                        it.next();
                    }
                }
                Step::Stop => return Ok(()),
            }
        }
        it.status().map_err(err)
    }

    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let v = SnapView {
            kept: Mutex::new(Vec::new()),
            engine: self,
            snap: (!self.secondary).then(|| self.db.snapshot()),
        };
        f(&v)
    }

    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        // Beside RocksDB's own compactions, not instead of them: an
        // exclusive one would hold them off, and level 0 would grow under
        // ingest until writes were delayed.
        let mut o = rocksdb::CompactOptions::default();
        o.set_exclusive_manual_compaction(false);
        self.db
            .compact_range_cf_opt(self.cf(cf)?, Some(from), Some(to), &o);
        Ok(())
    }

    fn expire_by_compaction(&self, expired: Arc<Expiry>) -> bool {
        if self.secondary {
            return false;
        }
        match self.expiry.write() {
            Ok(mut slot) => {
                *slot = Some(expired);
                true
            }
            Err(_) => false,
        }
    }

    fn compact_fully(&self, cf: Cf, max_bytes: u64) -> Result<bool, StoreError> {
        if self.family_bytes(cf) > max_bytes {
            return Ok(false);
        }
        // A plain range compaction moves a file of tombstones alone to
        // the last level untouched and leaves it there; forcing the last
        // level drops them.
        let mut o = rocksdb::CompactOptions::default();
        o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::ForceOptimized);
        self.db
            .compact_range_cf_opt(self.cf(cf)?, None::<&[u8]>, None::<&[u8]>, &o);
        Ok(true)
    }

    fn files(&self, cf: Cf) -> Vec<crate::FileStat> {
        let Ok(files) = self.db.live_files() else {
            return Vec::new();
        };
        files
            .into_iter()
            .filter(|f| f.column_family_name == cf.name())
            .map(|f| crate::FileStat {
                level: f.level.max(0) as u32,
                bytes: f.size as u64,
                first: f.start_key.unwrap_or_default(),
                last: f.end_key.unwrap_or_default(),
                entries: f.num_entries,
                deletions: f.num_deletions,
            })
            .collect()
    }

    fn family_bytes(&self, cf: Cf) -> u64 {
        let Some(h) = self.db.cf_handle(cf.name()) else {
            return 0;
        };
        self.db
            .property_int_value_cf(&h, rocksdb::properties::TOTAL_SST_FILES_SIZE)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.db.delete_range_cf(self.cf(cf)?, from, to).map_err(err)
    }

    fn flush(&self) -> Result<(), StoreError> {
        for cf in Cf::ALL {
            self.db.flush_cf(self.cf(cf)?).map_err(err)?;
        }
        self.db.flush_wal(true).map_err(err)
    }

    fn memory_bytes(&self) -> u64 {
        use rocksdb::properties as p;
        let mut total = 0;
        for cf in Cf::ALL {
            let Some(h) = self.db.cf_handle(cf.name()) else {
                continue;
            };
            for name in [
                p::SIZE_ALL_MEM_TABLES,
                p::BLOCK_CACHE_USAGE,
                p::ESTIMATE_TABLE_READERS_MEM,
            ] {
                total += self
                    .db
                    .property_int_value_cf(&h, name)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
            }
        }
        total
    }

    fn backlog(&self) -> super::Backlog {
        use rocksdb::properties as p;
        let int = |name: &rocksdb::properties::PropName| {
            self.db.property_int_value(name).ok().flatten().unwrap_or(0)
        };
        let mut b = super::Backlog {
            running_compactions: int(p::NUM_RUNNING_COMPACTIONS),
            delayed_write_rate: int(p::ACTUAL_DELAYED_WRITE_RATE),
            writes_stopped: int(p::IS_WRITE_STOPPED) != 0,
            ..Default::default()
        };
        let level0 = p::num_files_at_level(0);
        for cf in Cf::ALL {
            let Some(h) = self.db.cf_handle(cf.name()) else {
                continue;
            };
            let cf_int = |name: &rocksdb::properties::PropName| {
                self.db
                    .property_int_value_cf(&h, name)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            };
            b.pending_compaction_bytes += cf_int(p::ESTIMATE_PENDING_COMPACTION_BYTES);
            // A string property (no integer form).
            let l0 = self
                .db
                .property_value_cf(&h, &level0)
                .ok()
                .flatten()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if l0 > b.l0_files {
                b.l0_files = l0;
                b.l0_family = Some(cf);
            }
        }
        b
    }

    fn disk_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(rd) = std::fs::read_dir(p) else {
                return 0;
            };
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_1_store_is_refused_read_only_and_carried_over_when_written() {
        use crate::journal::{key, open_key, value};
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let register = open_key("GPU-1", "flopwatch_ofu_ratio");
        // A format 1 store: the families before `journal` and
        // `open_series`, the journal in `meta`.
        {
            let old = ["raw", "ofu", "meta", "head", "rollup", "limbo"];
            let db = DB::open_cf(&options(), dir.path(), old).unwrap();
            let meta = db.cf_handle("meta").unwrap();
            db.put_cf(&meta, crate::keys::FORMAT, 1u32.to_be_bytes())
                .unwrap();
            db.put_cf(&meta, key(0), value(1, 5, &[1])).unwrap();
            db.put_cf(&meta, &register, b"labels").unwrap();
        }
        let Err(err) = RocksEngine::open_secondary(dir.path(), scratch.path()) else {
            panic!("a format 1 store opened read-only");
        };
        assert!(err.to_string().contains("for writing"), "{err}");
        let e = RocksEngine::open(dir.path()).unwrap();
        assert_eq!(e.get(Cf::Meta, &key(0)).unwrap(), None);
        assert_eq!(
            e.get(Cf::Journal, &key(0)).unwrap(),
            Some(value(1, 5, &[1]))
        );
        assert_eq!(
            e.get(Cf::OpenSeries, &register).unwrap(),
            Some(b"labels".to_vec())
        );
        assert_eq!(
            e.get(Cf::Meta, crate::keys::FORMAT).unwrap(),
            Some(crate::FORMAT.to_be_bytes().to_vec())
        );
    }

    #[test]
    fn files_list_a_familys_flushed_keys_and_deletions_and_no_other_familys() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        let key = |i: u8| vec![b'g', i];
        let mut ops: Vec<Op> = (0..10)
            .map(|i| Op::Put(Cf::Head, key(i), vec![i; 64]))
            .collect();
        ops.push(Op::Put(Cf::Raw, b"r".to_vec(), vec![1]));
        e.apply(ops, false).unwrap();
        e.apply(vec![Op::Delete(Cf::Head, key(3))], false).unwrap();
        // Nothing flushed yet: no file.
        assert!(e.files(Cf::Head).is_empty());
        e.flush().unwrap();
        let head = e.files(Cf::Head);
        assert_eq!(head.len(), 1, "{head:?}");
        let f = &head[0];
        assert_eq!(
            (f.level, f.first.clone(), f.last.clone()),
            (0, key(0), key(9))
        );
        // The flush drops the deleted key's put and keeps its tombstone:
        // nine puts and one deletion.
        assert_eq!((f.entries, f.deletions), (10, 1), "{f:?}");
        assert!(f.bytes > 0);
        let raw = e.files(Cf::Raw);
        assert_eq!(raw.len(), 1, "{raw:?}");
        assert_eq!((raw[0].first.clone(), raw[0].entries), (b"r".to_vec(), 1));
    }

    /// The keys `view` finds in `[from, to)` of the head.
    fn keys_in(view: &dyn View, from: &[u8], to: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        view.scan(Cf::Head, from, to, &mut |k, _| {
            out.push(k.to_vec());
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn a_view_seeks_its_kept_iterators_past_tombstones_without_losing_or_repeating_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        let key = |series: u8, i: u32| [&[series][..], &i.to_be_bytes()].concat();
        // Series 1: two live keys, then far more deleted ones than a seek
        // may pass over, then a live one. Series 2: only deleted keys.
        // Series 3: one live key.
        let dead = 4 * SKIPPABLE as u32;
        let mut ops: Vec<Op> = Vec::new();
        for i in 0..dead + 3 {
            ops.push(Op::Put(Cf::Head, key(1, i), vec![1]));
        }
        for i in 0..dead {
            ops.push(Op::Put(Cf::Head, key(2, i), vec![2]));
        }
        ops.push(Op::Put(Cf::Head, key(3, 0), vec![3]));
        e.apply(ops, false).unwrap();
        let mut dels: Vec<Op> = (2..dead + 2)
            .map(|i| Op::Delete(Cf::Head, key(1, i)))
            .collect();
        dels.extend((0..dead).map(|i| Op::Delete(Cf::Head, key(2, i))));
        e.apply(dels, false).unwrap();
        let all = |series: u8| (key(series, 0), key(series + 1, 0));
        e.view(&mut |view| {
            // Twice over one view: the second time every iterator is a
            // kept one.
            for _ in 0..2 {
                let (a, b) = all(1);
                assert_eq!(
                    keys_in(view, &a, &b),
                    vec![key(1, 0), key(1, 1), key(1, dead + 2)]
                );
                let (a, b) = all(2);
                assert!(keys_in(view, &a, &b).is_empty());
                let (a, b) = all(3);
                assert_eq!(keys_in(view, &a, &b), vec![key(3, 0)]);
                // A scan of the same family from inside another's callback.
                let (a, b) = all(1);
                let mut inner = Vec::new();
                view.scan(Cf::Head, &a, &b, &mut |_, _| {
                    let (c, d) = all(3);
                    inner.push(keys_in(view, &c, &d));
                    true
                })?;
                assert_eq!(inner, vec![vec![key(3, 0)]; 3]);
            }
            Ok(())
        })
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Scans of any ranges, in any order, some stopped early, through
        /// one view (whose kept iterators start a scan where the last one
        /// stopped when they can) hand over what a fresh iterator bounded
        /// to each range does.
        #[test]
        fn views_scans_in_any_order_and_last_keys_find_what_fresh_scans_do(
            live in proptest::collection::btree_set(0u16..400, 0..120),
            dead in proptest::collection::btree_set(0u16..400, 0..120),
            scans in proptest::collection::vec((0u16..420, 0u16..60, 0usize..6, proptest::bool::ANY), 1..40),
        ) {
            // A chained range starts where the one before it ended (as the
            // next series of a group does).
            let mut end = 0;
            let scans: Vec<(u16, u16, usize)> = scans
                .into_iter()
                .map(|(a, len, stop, chained)| {
                    let a = if chained { end } else { a };
                    end = a + len;
                    (a, len, stop)
                })
                .collect();
            let dir = tempfile::tempdir().unwrap();
            let e = RocksEngine::open(dir.path()).unwrap();
            let key = |i: u16| [b"k".as_slice(), &i.to_be_bytes()].concat();
            let puts = live.iter().chain(&dead).map(|&i| Op::Put(Cf::Head, key(i), vec![1])).collect();
            e.apply(puts, false).unwrap();
            let dels = dead.difference(&live).map(|&i| Op::Delete(Cf::Head, key(i))).collect();
            e.apply(dels, false).unwrap();
            // Each range as its own bounded scan would find it (the first
            // `stop` keys where the callback stops it), then the same
            // ranges through one view.
            let fresh: Vec<Vec<Vec<u8>>> = scans
                .iter()
                .map(|&(a, len, stop)| {
                    let mut got = Vec::new();
                    e.scan(Cf::Head, &key(a), &key(a + len), &mut |k, _| {
                        got.push(k.to_vec());
                        got.len() != stop
                    })
                    .unwrap();
                    got
                })
                .collect();
            let mut viewed = Vec::new();
            e.view(&mut |view| {
                for &(a, len, stop) in &scans {
                    let mut got = Vec::new();
                    view.scan(Cf::Head, &key(a), &key(a + len), &mut |k, _| {
                        got.push(k.to_vec());
                        got.len() != stop
                    })?;
                    viewed.push(got);
                }
                Ok(())
            })
            .unwrap();
            proptest::prop_assert_eq!(viewed, fresh);
            // The last live key of each range, past deleted ones.
            for &(a, len, _) in &scans {
                let want = live.range(a..a + len).next_back().map(|&i| key(i));
                let got = e.last_key(Cf::Head, &key(a), &key(a + len)).unwrap();
                proptest::prop_assert_eq!(got, want, "[{}, {})", a, a + len);
            }
        }
    }

    /// What a GPU-hour's OFU rollup looks like on disk: a mask, then
    /// fixed-width little-endian counts and slowly varying sums.
    fn rollup_like(gpu: u64, hour: u64) -> Vec<u8> {
        let mut v = u64::MAX.to_le_bytes().to_vec();
        for m in 0..61u64 {
            v.extend_from_slice(&(590 + (m + gpu) % 7).to_le_bytes());
            for k in 0..6u64 {
                let x = 60_000.0 * (0.5 + 0.001 * ((m * 31 + k * 17 + hour) % 97) as f64);
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        v
    }

    #[test]
    fn rollups_are_compressed_on_disk_and_chunks_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        let mut ops: Vec<Op> = Vec::new();
        for gpu in 0..8u64 {
            for hour in 0..24u64 {
                let key = [gpu.to_be_bytes(), hour.to_be_bytes()].concat();
                let v = rollup_like(gpu, hour);
                ops.push(Op::Put(Cf::Raw, key.clone(), v.clone()));
                ops.push(Op::Put(Cf::Rollup, key, v));
            }
        }
        let logical: u64 = ops
            .iter()
            .map(|o| match o {
                Op::Put(Cf::Rollup, k, v) => (k.len() + v.len()) as u64,
                _ => 0,
            })
            .sum();
        e.apply(ops, false).unwrap();
        e.flush().unwrap();
        for cf in [Cf::Raw, Cf::Rollup] {
            assert!(e.compact_fully(cf, u64::MAX).unwrap());
        }
        let raw = e.family_bytes(Cf::Raw);
        let rollup = e.family_bytes(Cf::Rollup);
        // Uncompressed, the file holds at least the records themselves.
        assert!(raw >= logical, "raw {raw} B for {logical} B of records");
        assert!(
            rollup * 2 < raw,
            "rollup {rollup} B is not compressed (raw {raw} B)"
        );
        // Compressed blocks read back intact.
        let mut n = 0;
        e.scan(Cf::Rollup, &[], &[0xff; 17], &mut |k, v| {
            let gpu = u64::from_be_bytes(k[..8].try_into().unwrap());
            let hour = u64::from_be_bytes(k[8..].try_into().unwrap());
            assert_eq!(v, rollup_like(gpu, hour).as_slice());
            n += 1;
            true
        })
        .unwrap();
        assert_eq!(n, 8 * 24);
    }
}
