//! The forwarding journal: what remote write has still to send (its
//! records and bookkeeping here; the store's reads and writes of it in
//! `journal_ops`).
//!
//! A batch's points for remote write are written in the same RocksDB write
//! as the batch itself ([`super::Store::commit`], `CommitSet::forward`), so what is
//! acknowledged to an agent is queued for forwarding, durably, or neither:
//! a restart — `kill -9` included — loses nothing the collector acked. The
//! sender reads the oldest entries, sends them, and deletes exactly the
//! entries it read once every point of them was delivered (or refused, or
//! dropped by policy); an entry written meanwhile is read next time. The
//! sender reads from a cursor past what it deleted, never past a number
//! whose write is still under way (writes may land out of number order), so
//! a read does not walk the deleted entries' tombstones.
//!
//! Keys: [`PREFIX`] · sequence number (u64, big-endian) in the journal
//! family ([`super::Cf::Journal`]). Value: the number of points (u32), the oldest point's time (i64,
//! unix ms), both big-endian, then the points in remote write's compact
//! layout (each GPU's labels and each series name once; the collector's
//! `remote_write::wire`), snappy-compressed when the count's top bit
//! ([`PACKED`]) is set: a batch's GPUs share most of their labels, and
//! the entry is written through the write-ahead log and a memtable with
//! the batch, so its bytes count against ingest's. Sequence numbers rise with each entry; after
//! a restart they continue past the highest one on disk.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Key prefix of journal entries (journal family).
pub const PREFIX: &[u8] = b"~fwd/";

/// The end of the journal's key range.
pub(super) const END: &[u8] = b"~fwd0";

/// Key prefix of the open-series register (open-series family,
/// [`super::Cf::OpenSeries`]): the series
/// remote write has sent and not yet ended, so that a restarted collector
/// still ends them with staleness markers. One key per GPU and series name
/// ([`open_key`]); the value is a remote-write 1.0 `WriteRequest` holding
/// the series' labels and one sample at the time it was registered.
/// Written with the batch that starts or relabels the series, deleted with
/// the marker that ends it.
pub const OPEN_PREFIX: &[u8] = b"~fwo/";

/// The end of the open-series register's key range.
pub(super) const OPEN_END: &[u8] = b"~fwo0";

/// Open-series register entries: key and value.
pub type OpenEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// The register key of GPU `gpu`'s series named `name`.
pub fn open_key(gpu: &str, name: &str) -> Vec<u8> {
    let mut k = OPEN_PREFIX.to_vec();
    k.extend_from_slice(gpu.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

/// The GPU and series name of a register key.
pub fn open_key_parts(k: &[u8]) -> Option<(String, String)> {
    let rest = k.strip_prefix(OPEN_PREFIX)?;
    let at = rest.iter().position(|&b| b == 0)?;
    let gpu = std::str::from_utf8(&rest[..at]).ok()?;
    let name = std::str::from_utf8(&rest[at + 1..]).ok()?;
    Some((gpu.to_string(), name.to_string()))
}

/// Set in an entry's point count when its body is snappy-compressed (raw
/// format); the count is the other 31 bits.
pub const PACKED: u32 = 1 << 31;

/// One journal entry read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its key (to delete it once sent).
    pub key: Vec<u8>,
    /// Points in it.
    pub points: u32,
    /// Its oldest point's time, unix ms.
    pub oldest_ms: i64,
    /// Whether `body` is snappy-compressed ([`PACKED`]).
    pub packed: bool,
    /// The points (the collector's `remote_write::wire` layout).
    pub body: Vec<u8>,
}

/// The next sequence number, found on first use, and the numbers handed
/// out whose write has not ended yet.
#[derive(Debug, Default)]
pub struct Journal {
    pub(super) next: AtomicU64,
    pub(super) loaded: Mutex<bool>,
    pub(super) inflight: Mutex<BTreeSet<u64>>,
}

/// A sequence number handed out for a write; dropped once the write ended
/// (written or failed), so the sender's cursor may pass it.
#[derive(Debug)]
pub struct Ticket {
    pub(super) journal: Arc<Journal>,
    pub(super) seq: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut f) = self.journal.inflight.lock() {
            f.remove(&self.seq);
        }
    }
}

pub(super) fn key(seq: u64) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// An entry's value; `points` with [`PACKED`] set for a compressed
/// `body`.
pub fn value(points: u32, oldest_ms: i64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + body.len());
    v.extend_from_slice(&points.to_be_bytes());
    v.extend_from_slice(&oldest_ms.to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// The sequence number of a journal key.
pub(super) fn seq_of(k: &[u8]) -> Option<u64> {
    k.get(PREFIX.len()..)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
}

pub(super) fn parse(k: &[u8], v: &[u8]) -> Option<Entry> {
    let count = u32::from_be_bytes(v.get(..4)?.try_into().ok()?);
    let oldest_ms = i64::from_be_bytes(v.get(4..12)?.try_into().ok()?);
    Some(Entry {
        key: k.to_vec(),
        points: count & !PACKED,
        oldest_ms,
        packed: count & PACKED != 0,
        body: v[12..].to_vec(),
    })
}
