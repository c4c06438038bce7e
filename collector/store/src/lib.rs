//! Storage behind traits.
//!
//! Two layers, as in TiKV's `engine_traits`:
//!
//! * [`Engine`]: an ordered key-value store with column families and atomic,
//!   durable write batches. [`rocks::RocksEngine`] (RocksDB, the only module
//!   that names a RocksDB type) and [`memory::MemEngine`] implement it, and
//!   one conformance suite (`conformance` tests below) runs against both.
//! * [`Store`]: flopwatch's data model on top of any engine: series blocks
//!   (see [`flopwatch_codec`]), derived OFU blocks, node/GPU/job metadata and
//!   per-agent acknowledged sequence numbers, with the key layout of
//!   [`keys`]. The collector's logic depends only on `Store`.
//!
//! Chunks: acknowledged batches land in the `head` family as small
//! blocks, bundled per GPU ([`gpu_block`]); [`Store::compact`] merges each
//! series' blocks of an hour into one chunk, with rollups, a GPU's hour in
//! one atomic write (see docs/STORAGE.md).
//!
//! Durability: [`Store::commit`] writes one batch's samples, OFU, metadata
//! and acked sequence number in a single engine write batch that goes
//! through the RocksDB write-ahead log before it returns, so an acked batch
//! is either wholly present after a crash or was never acked.

#![forbid(unsafe_code)]

mod compact;
mod compactor;
mod fold;
mod format;
mod gpu_block;
mod handoff;
mod head_hours;
mod hours;
pub mod index;
mod job_hours;
pub mod journal;
mod journal_ops;
pub mod keys;
mod lasts;
mod limbo;
mod listing;
mod membership;
pub mod memory;
mod model;
mod ofu_chunk;
pub mod parallel;
mod precision;
mod raw;
mod reader;
mod records;
mod retention;
pub mod rocks;
mod rollup;
mod scan;

pub use compact::CompactionReport;
pub use compactor::run_compactor;
pub use fold::FoldReport;
pub use format::FORMAT;
pub use hours::{MINUTE_MS, WINDOW_MS};
pub use job_hours::{JobHour, IDLE_TENSOR_ACTIVE};
pub use lasts::{HourLasts, MinuteLast, WholeHour};
pub use limbo::{LimboBatch, Settle};
pub use membership::SeqRanges;
pub use model::Store;
pub use precision::{round_decimals, Precision};
pub use reader::Reader;
pub use records::{
    AgentKey, CommitSet, Derivation, DeviceRecord, EventRecord, GpuRecord, JobRecord, LastsPiece,
    NodeRecord, OfuPiece, OfuSample, StoredSeries, OFU_CLOCKS,
};
pub use retention::Retention;

/// A corruption error in column family `cf`.
pub(crate) fn corrupt(cf: Cf, message: impl ToString) -> StoreError {
    StoreError::Corrupt {
        cf: cf.name(),
        message: message.to_string(),
    }
}

/// Column families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    /// Sealed raw series chunks (one per series and hour).
    Raw,
    /// Sealed derived OFU chunks (one per GPU, job and hour).
    Ofu,
    /// Metadata: nodes, GPUs, jobs, acked sequence numbers.
    Meta,
    /// The head: per-batch blocks of raw and OFU samples as acknowledged,
    /// waiting to be compacted into chunks.
    Head,
    /// Hourly and per-minute rollups of sealed hours.
    Rollup,
    /// Batches another collector may hold too: blocks and events under
    /// their head and meta keys, read with them, not compacted, until the
    /// cluster settles them (see `limbo`).
    Limbo,
    /// Remote write's journal (`journal`): entries live for seconds,
    /// deleted once sent. A family of its own, uncompressed, so that its
    /// churn never makes RocksDB rewrite the metadata (zstd at its slow
    /// bottom level) or the register of open series.
    Journal,
    /// Remote write's register of open series (`journal`): one key per
    /// series sent and not yet ended, written when a series starts or ends
    /// (rarely, next to the journal), so a compaction of the journal's
    /// tombstones never rewrites it.
    OpenSeries,
}

impl Cf {
    /// Every column family.
    pub const ALL: [Cf; 8] = [
        Cf::Raw,
        Cf::Ofu,
        Cf::Meta,
        Cf::Head,
        Cf::Rollup,
        Cf::Limbo,
        Cf::Journal,
        Cf::OpenSeries,
    ];

    /// The family's name on disk.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Raw => "raw",
            Cf::Ofu => "ofu",
            Cf::Meta => "meta",
            Cf::Head => "head",
            Cf::Rollup => "rollup",
            Cf::Limbo => "limbo",
            Cf::Journal => "journal",
            Cf::OpenSeries => "open_series",
        }
    }
}

/// One operation of an atomic write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace a key.
    Put(Cf, Vec<u8>, Vec<u8>),
    /// Remove a key.
    Delete(Cf, Vec<u8>),
    /// Remove every key in `[from, to)`.
    DeleteRange(Cf, Vec<u8>, Vec<u8>),
}

/// Where an [`Engine::walk`] goes after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// To the next key.
    Next,
    /// To the first key at or after this one (the next key when it is not
    /// past the key just visited).
    Seek(Vec<u8>),
    /// Nowhere: the walk ends.
    Stop,
}

/// A consistent read-only view: every scan through one view sees the
/// store at the same instant, whatever is written meanwhile.
pub trait View: Sync {
    /// Visits keys in `[from, to)` in order until `f` returns false.
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;
}

/// A storage failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The engine failed (I/O, corruption, no space).
    #[error("storage engine: {0}")]
    Engine(String),
    /// The store's format is not the one this build reads (see
    /// [`FORMAT`]).
    #[error("store format: {0}")]
    Format(String),
    /// Stored bytes could not be decoded.
    #[error("corrupt record in {cf}: {message}")]
    Corrupt {
        /// Column family.
        cf: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// One write: a put into a column family.
pub type Put = (Cf, Vec<u8>, Vec<u8>);

/// Whether retention has expired a key of a family (see
/// [`Engine::expire_by_compaction`]).
pub type Expiry = dyn Fn(Cf, &[u8]) -> bool + Send + Sync;

/// An ordered key-value engine with column families.
pub trait Engine: Send + Sync + 'static {
    /// Applies every put atomically and durably (through the WAL; fsynced
    /// when `sync`).
    fn write(&self, puts: Vec<Put>, sync: bool) -> Result<(), StoreError> {
        self.apply(
            puts.into_iter().map(|(c, k, v)| Op::Put(c, k, v)).collect(),
            sync,
        )
    }

    /// Applies puts and deletes atomically and durably: after a crash
    /// either all of them are present or none.
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError>;

    /// Runs `f` over one consistent view of every column family.
    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// Rewrites the files holding `[from, to)` of `cf`, dropping deleted
    /// and overwritten entries, so their space is reclaimed.
    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError>;

    /// Rewrites every file of `cf`, those of its last level included, so
    /// that no deleted entry or tombstone stays on disk — when its files
    /// hold at most `max_bytes` (else nothing); whether it did.
    fn compact_fully(&self, cf: Cf, max_bytes: u64) -> Result<bool, StoreError> {
        let _ = max_bytes;
        self.compact_range(cf, &[], &[0xff; 800])?;
        Ok(true)
    }

    /// Hands retention to the engine: from now on it drops every key of
    /// the `raw`, `ofu`, `head` and `rollup` families for which `expired`
    /// says so whenever it rewrites the file holding it (RocksDB's
    /// compaction filter), so no pass has to walk the series to delete
    /// them. False (the default) when the engine cannot: the store then
    /// deletes expired keys itself ([`Store::expire`]).
    fn expire_by_compaction(&self, expired: std::sync::Arc<Expiry>) -> bool {
        let _ = expired;
        false
    }

    /// Bytes of `cf`'s files on disk (0 for an engine without files).
    fn family_bytes(&self, cf: Cf) -> u64 {
        let _ = cf;
        0
    }

    /// Point lookup.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Visits keys in `[from, to)` in order until `f` returns false.
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;

    /// The last key in `[from, to)`, if any. This default scans the range;
    /// an engine with iterators seeks to its end.
    fn last_key(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let mut last = None;
        self.scan(cf, from, to, &mut |k, _| {
            last = Some(k.to_vec());
            true
        })?;
        Ok(last)
    }

    /// Visits keys in `[from, to)` in order, each answered with where to
    /// go next. An engine with iterators walks with one, so skipping a run
    /// of keys costs a seek, where ending a [`Engine::scan`] and starting
    /// another costs a new iterator (over every memtable and file of the
    /// family). This default restarts a scan at each seek.
    fn walk(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), StoreError> {
        let mut at = from.to_vec();
        loop {
            let mut next: Option<Vec<u8>> = None;
            self.scan(cf, &at, to, &mut |k, v| match f(k, v) {
                Step::Next => true,
                Step::Seek(target) => {
                    next = Some(past(target, k));
                    false
                }
                Step::Stop => false,
            })?;
            match next {
                Some(n) => at = n,
                None => return Ok(()),
            }
        }
    }

    /// Deletes keys in `[from, to)`.
    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError>;

    /// Flushes memtables to disk files (for measurements and shutdown).
    fn flush(&self) -> Result<(), StoreError>;

    /// Bytes the engine occupies on disk (0 for memory).
    fn disk_bytes(&self) -> u64;

    /// Bytes of memory the engine holds for itself (memtables, block
    /// cache, table readers); 0 when it cannot tell.
    fn memory_bytes(&self) -> u64 {
        0
    }

    /// What the engine's own background work (flushes, compactions) owes,
    /// and whether writes wait on it; all zero for an engine without any.
    fn backlog(&self) -> Backlog {
        Backlog::default()
    }

    /// The live files of `cf`, level by level (none for an engine
    /// without files): where its bytes sit, and how many of them are
    /// deletions waiting for a compaction.
    fn files(&self, cf: Cf) -> Vec<FileStat> {
        let _ = cf;
        Vec::new()
    }
}

/// One file of a family ([`Engine::files`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileStat {
    /// Its level (0: just flushed).
    pub level: u32,
    /// Bytes on disk.
    pub bytes: u64,
    /// Its first key.
    pub first: Vec<u8>,
    /// Its last key.
    pub last: Vec<u8>,
    /// Entries, and of them deletions (tombstones).
    pub entries: u64,
    pub deletions: u64,
}

/// The engine's background debt: what a write may end up waiting on.
///
/// RocksDB slows writes down, then stops them, when level 0 holds too many
/// files or compactions owe too many bytes; a collector whose compactions
/// fall behind therefore acknowledges slower, whatever priority they run
/// at (docs/STORAGE.md, "Write stalls").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Files in level 0 of the family that has the most.
    pub l0_files: u64,
    /// That family.
    pub l0_family: Option<Cf>,
    /// Bytes compactions estimate they still have to rewrite, over every
    /// family.
    pub pending_compaction_bytes: u64,
    /// Compactions running now.
    pub running_compactions: u64,
    /// Writes are delayed: the rate they are held to, bytes per second
    /// (0 when not delayed).
    pub delayed_write_rate: u64,
    /// Writes are stopped until compactions catch up.
    pub writes_stopped: bool,
}

/// Where a walk seeks to from `key`: `target`, or the key right after
/// `key` when `target` is not past it (a walk never goes back).
pub(crate) fn past(target: Vec<u8>, key: &[u8]) -> Vec<u8> {
    if target.as_slice() > key {
        target
    } else {
        let mut next = key.to_vec();
        next.push(0);
        next
    }
}

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_limbo;
#[cfg(test)]
mod tap;
