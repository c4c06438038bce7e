//! Storage behind traits.
//!
//! Two layers, as in TiKV's `engine_traits`:
//!
//! * [`Engine`]: an ordered key-value store with column families and atomic,
//!   durable write batches. [`rocks::RocksEngine`] (RocksDB, the only module
//!   that names a RocksDB type) and [`memory::MemEngine`] implement it, and
//!   one conformance suite (`conformance` tests below) runs against both.
//! * [`Store`]: flopwatch's data model on top of any engine: series blocks
//!   (see [`crate::codec`]), derived OFU blocks, node/GPU/job metadata and
//!   per-agent acknowledged sequence numbers, with the key layout of
//!   [`keys`]. The collector's logic depends only on `Store`.
//!
//! Durability: [`Store::commit`] writes one batch's samples, OFU, metadata
//! and acked sequence number in a single engine write batch that goes
//! through the RocksDB write-ahead log before it returns, so an acked batch
//! is either wholly present after a crash or was never acked.

pub mod keys;
pub mod memory;
mod model;
pub mod rocks;

pub use model::{
    AgentKey, CommitSet, GpuRecord, JobRecord, NodeRecord, OfuSample, Store, StoredSeries,
};

/// Column families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    /// Raw series blocks.
    Raw,
    /// Derived OFU blocks.
    Ofu,
    /// Metadata: nodes, GPUs, jobs, acked sequence numbers.
    Meta,
}

impl Cf {
    /// Every column family.
    pub const ALL: [Cf; 3] = [Cf::Raw, Cf::Ofu, Cf::Meta];

    /// The family's name on disk.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Raw => "raw",
            Cf::Ofu => "ofu",
            Cf::Meta => "meta",
        }
    }
}

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The engine failed (I/O, corruption, no space).
    #[error("storage engine: {0}")]
    Engine(String),
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

/// An ordered key-value engine with column families.
pub trait Engine: Send + Sync + 'static {
    /// Applies every put atomically and durably (through the WAL; fsynced
    /// when `sync`).
    fn write(&self, puts: Vec<Put>, sync: bool) -> Result<(), StoreError>;

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

    /// Deletes keys in `[from, to)`.
    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError>;

    /// Flushes memtables to disk files (for measurements and shutdown).
    fn flush(&self) -> Result<(), StoreError>;

    /// Bytes the engine occupies on disk (0 for memory).
    fn disk_bytes(&self) -> u64;
}

#[cfg(test)]
mod conformance;
