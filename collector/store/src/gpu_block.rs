//! GPU blocks: one head entry per GPU (or node device), batch and hour.
//!
//! An acknowledged batch lands in the head as one entry per GPU and hour,
//! keyed `'g' · hour · tenant · gpu · last_ts · seq`, whose value bundles the
//! blocks the batch holds for that GPU: one raw block per metric (as a
//! series' own head block would hold it) and its OFU block. Keyed per
//! series instead, a batch of 8 GPUs × 20 metrics was 168 RocksDB entries
//! with a 60-byte key each; a backed-off agent's batch carries one point
//! per series, so the keys were most of the bytes written, and the
//! memtable's inserts most of a commit's time (docs/STORAGE.md, *Head*).
//! Bundled, the same batch is 8 entries.
//!
//! Readers take a series' blocks out of the bundles with [`parts`]; a
//! compaction pass turns a GPU's bundles of an hour into its series'
//! chunks and rollups in one write (`compact.rs`). The key leads with the
//! hour, so a GPU's bundles are read hour by hour ([`scan_bundles`]): a
//! seek to the GPU's run of keys in each hour the head holds (kept in
//! memory, [`super::head_hours`]).
//!
//! ```text
//! u8 version (1; 2: a folded bundle, see `fold.rs`)
//! u32 raw blocks:  (u8 len, metric name, u32 len, raw block) each
//! u32 OFU blocks:  (u32 len, OFU block value) each
//! ```
//! Counts and lengths are little-endian.

use super::hours::WINDOW_MS;
use super::keys;
use super::scan::{scan_series, BlockVisitor};
use super::{corrupt, Cf, StoreError, View};

/// The bundle format a commit writes.
const VERSION: u8 = 1;

/// The same format, marking a bundle folded from others (`fold.rs`): its
/// blocks are encoded as sealed chunks are.
const FOLDED: u8 = 2;

/// Whether the bundle `v` was folded from others.
pub(super) fn is_folded(v: &[u8]) -> bool {
    v.first() == Some(&FOLDED)
}

/// Which blocks of a bundle a reader wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part<'a> {
    /// The raw series of this metric.
    Raw(&'a str),
    /// The OFU series.
    Ofu,
}

/// A decoded bundle: borrowed slices of its value.
#[derive(Debug, Default, PartialEq)]
pub(super) struct GpuBlock<'v> {
    /// Metric and raw block, in the order written.
    pub raw: Vec<(&'v str, &'v [u8])>,
    /// OFU block values (job id, then the block).
    pub ofu: Vec<&'v [u8]>,
}

/// Writes a bundle: raw blocks, encoded straight into it, and OFU block
/// values, in any order (the OFU section goes after the raw one).
pub(super) struct Writer {
    /// The version, the raw count, the raw blocks.
    raw: Vec<u8>,
    raw_count: u32,
    ofu: Vec<u8>,
    ofu_count: u32,
}

impl Writer {
    /// An empty bundle.
    pub(super) fn new() -> Self {
        Self::with_version(VERSION)
    }

    /// An empty folded bundle.
    pub(super) fn folded() -> Self {
        Self::with_version(FOLDED)
    }

    fn with_version(version: u8) -> Self {
        let mut raw = Vec::with_capacity(256);
        raw.push(version);
        raw.extend_from_slice(&[0; 4]);
        Self {
            raw,
            raw_count: 0,
            ofu: Vec::new(),
            ofu_count: 0,
        }
    }

    /// Adds `metric`'s raw block, which `encode` appends to the buffer it
    /// is given.
    pub(super) fn raw<E>(
        &mut self,
        metric: &str,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        super::keys::put_str(&mut self.raw, metric);
        let at = self.raw.len();
        self.raw.extend_from_slice(&[0; 4]);
        encode(&mut self.raw)?;
        let len = (self.raw.len() - at - 4) as u32;
        self.raw[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.raw_count += 1;
        Ok(())
    }

    /// Adds an OFU block value.
    pub(super) fn ofu(&mut self, value: &[u8]) {
        self.ofu
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.ofu.extend_from_slice(value);
        self.ofu_count += 1;
    }

    /// The bundle's bytes.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.raw[1..5].copy_from_slice(&self.raw_count.to_le_bytes());
        self.raw.extend_from_slice(&self.ofu_count.to_le_bytes());
        self.raw.extend_from_slice(&self.ofu);
        self.raw
    }
}

/// A reader of a bundle's bytes.
struct Cursor<'v> {
    v: &'v [u8],
    pos: usize,
}

impl<'v> Cursor<'v> {
    fn take(&mut self, n: usize) -> Result<&'v [u8], StoreError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.v.len());
        let end = end.ok_or_else(|| corrupt(Cf::Head, "GPU block truncated"))?;
        let out = &self.v[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<usize, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn str(&mut self) -> Result<&'v str, StoreError> {
        let n = usize::from(self.take(1)?[0]);
        std::str::from_utf8(self.take(n)?).map_err(|_| corrupt(Cf::Head, "GPU block metric name"))
    }
}

/// Decodes a bundle (a malformed one is a corruption error of `head`).
pub(super) fn decode(v: &[u8]) -> Result<GpuBlock<'_>, StoreError> {
    let mut c = Cursor { v, pos: 0 };
    if !matches!(c.take(1)?[0], VERSION | FOLDED) {
        return Err(corrupt(Cf::Head, "GPU block version"));
    }
    let mut out = GpuBlock::default();
    for _ in 0..c.u32()? {
        let metric = c.str()?;
        let n = c.u32()?;
        out.raw.push((metric, c.take(n)?));
    }
    for _ in 0..c.u32()? {
        let n = c.u32()?;
        out.ofu.push(c.take(n)?);
    }
    if c.pos != v.len() {
        return Err(corrupt(Cf::Head, "GPU block has trailing bytes"));
    }
    Ok(out)
}

impl<'v> GpuBlock<'v> {
    /// The blocks of `part`, in the order written.
    pub(super) fn part(&self, part: Part<'_>) -> Vec<&'v [u8]> {
        match part {
            Part::Raw(metric) => self
                .raw
                .iter()
                .filter(|(m, _)| *m == metric)
                .map(|(_, b)| *b)
                .collect(),
            Part::Ofu => self.ofu.clone(),
        }
    }
}

/// Which hours a reader of one GPU's bundles looks in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BundleHours {
    /// These hours, in order (the head's, or one known hour).
    Held(Vec<i64>),
    /// Every hour the family holds, found by seeking (limbo, whose
    /// bundles are few).
    Discover,
}

/// Discovery, for families other than the head.
static DISCOVER: BundleHours = BundleHours::Discover;

impl BundleHours {
    /// These hours where `cf` is the head; found by seeking elsewhere.
    pub(super) fn of(&self, cf: Cf) -> &BundleHours {
        if cf == Cf::Head {
            self
        } else {
            &DISCOVER
        }
    }
}

/// The earliest hour at or after `from` in which `cf` (the head or limbo)
/// holds a bundle of any GPU: one seek.
pub(super) fn next_hour(view: &dyn View, cf: Cf, from: i64) -> Result<Option<i64>, StoreError> {
    let start = keys::head_hour(from);
    let mut found = None;
    view.scan(cf, &start, &[keys::KIND_GPU + 1], &mut |k, _| {
        found = Some(keys::get_ts(&k[1..]).ok_or_else(|| corrupt(cf, "head key")));
        false
    })?;
    found.transpose()
}

/// Visits the bundles of `cf` (the head or limbo) of the GPU `gpu`
/// (tenant · gpu) whose hour overlaps `[start, end)`, as [`scan_series`]
/// visits a series' own blocks: hour by hour, `f` getting each bundle's
/// hour and value and returning whether to go on. The head leads with the
/// hour, so this is a seek to the GPU's run in each of `hours` (the
/// head's, [`super::head_hours`]), or, to find them, a seek per hour the
/// family holds.
pub(super) fn scan_bundles(
    view: &dyn View,
    cf: Cf,
    hours: &BundleHours,
    gpu: &[u8],
    start: i64,
    end: i64,
    f: &mut BlockVisitor<'_>,
) -> Result<(), StoreError> {
    let first = start.div_euclid(WINDOW_MS).saturating_mul(WINDOW_MS);
    let mut run = |h: i64| -> Result<bool, StoreError> {
        let mut more = true;
        scan_series(
            view,
            cf,
            &keys::head_prefix(h, gpu),
            start,
            end,
            &mut |w, v| {
                more = f(w, v)?;
                Ok(more)
            },
        )?;
        Ok(more)
    };
    match hours {
        BundleHours::Held(held) => {
            for &h in held.iter().filter(|h| **h >= first && **h < end) {
                if !run(h)? {
                    break;
                }
            }
        }
        BundleHours::Discover => {
            let mut hour = first;
            while hour < end {
                let Some(h) = next_hour(view, cf, hour)? else {
                    break;
                };
                if h >= end || !run(h)? {
                    break;
                }
                hour = h.saturating_add(WINDOW_MS);
                if hour == h {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// The hours in which `cf` (the head or limbo) holds a bundle of the GPU
/// `gpu` (tenant · gpu), in order: a seek to the GPU's run in each of
/// `hours`, and, to find them, one more per hour the family holds.
pub(super) fn hours(
    view: &dyn View,
    cf: Cf,
    hours: &BundleHours,
    gpu: &[u8],
) -> Result<Vec<i64>, StoreError> {
    let mut out = Vec::new();
    let mut holds = |h: i64| -> Result<(), StoreError> {
        let from = keys::head_prefix(h, gpu);
        let mut to = from.clone();
        to.extend_from_slice(&[0xff; 17]);
        let mut held = false;
        view.scan(cf, &from, &to, &mut |_, _| {
            held = true;
            false
        })?;
        if held {
            out.push(h);
        }
        Ok(())
    };
    match hours {
        BundleHours::Held(held) => {
            for &h in held {
                holds(h)?;
            }
        }
        BundleHours::Discover => {
            let mut hour = i64::MIN;
            while let Some(h) = next_hour(view, cf, hour)? {
                holds(h)?;
                match h.checked_add(WINDOW_MS) {
                    Some(next) => hour = next,
                    None => break,
                }
            }
        }
    }
    Ok(out)
}

/// Visits the blocks of `part` held in the bundles of `cf` (the head or
/// limbo) of the GPU `gpu` (tenant · gpu) whose hour overlaps `[start,
/// end)`, as [`scan_series`] visits a series' own blocks: `f` gets each
/// block's hour and value and returns whether to go on.
#[allow(clippy::too_many_arguments)]
pub(super) fn scan_parts(
    view: &dyn View,
    cf: Cf,
    hours: &BundleHours,
    gpu: &[u8],
    part: Part<'_>,
    start: i64,
    end: i64,
    f: &mut BlockVisitor<'_>,
) -> Result<(), StoreError> {
    scan_bundles(view, cf, hours, gpu, start, end, &mut |w, v| {
        for block in decode(v)?.part(part) {
            if !f(w, block)? {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// Adds to `out` the metrics of every bundle of `cf` of the GPU `gpu`
/// (tenant · gpu).
pub(super) fn metrics(
    view: &dyn View,
    cf: Cf,
    hours: &BundleHours,
    gpu: &[u8],
    out: &mut std::collections::BTreeSet<String>,
) -> Result<(), StoreError> {
    scan_bundles(view, cf, hours, gpu, i64::MIN, i64::MAX, &mut |_, v| {
        for (m, _) in &decode(v)?.raw {
            if !out.contains(*m) {
                out.insert(m.to_string());
            }
        }
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(raw: &[(&str, Vec<u8>)], ofu: &[Vec<u8>]) -> Vec<u8> {
        let mut w = Writer::new();
        // The OFU blocks first: the writer puts them after the raw ones.
        for v in ofu {
            w.ofu(v);
        }
        for (metric, block) in raw {
            w.raw(metric, |out| {
                out.extend_from_slice(block);
                Ok::<(), ()>(())
            })
            .unwrap();
        }
        w.finish()
    }

    #[test]
    fn a_bundle_gives_back_each_part_in_order() {
        let raw = vec![
            ("power_w", vec![1u8, 2, 3]),
            ("tensor_active", vec![]),
            ("power_w", vec![9]),
        ];
        let ofu = vec![vec![7u8; 300]];
        let v = encode(&raw, &ofu);
        let b = decode(&v).unwrap();
        assert_eq!(
            b.part(Part::Raw("power_w")),
            vec![&[1u8, 2, 3][..], &[9][..]]
        );
        assert_eq!(b.part(Part::Raw("tensor_active")), vec![&[0u8; 0][..]]);
        assert!(b.part(Part::Raw("sm_clock_mhz")).is_empty());
        assert_eq!(b.part(Part::Ofu), vec![&[7u8; 300][..]]);
        assert_eq!(decode(&encode(&[], &[])).unwrap(), GpuBlock::default());
    }

    #[test]
    fn malformed_bundles_are_corrupt_not_a_panic() {
        let v = encode(&[("m", vec![1, 2, 3])], &[vec![4]]);
        for cut in 0..v.len() {
            assert!(decode(&v[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = v.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let mut other = v.clone();
        other[0] = 3;
        assert!(decode(&other).is_err(), "unknown version");
        other[0] = FOLDED;
        assert!(decode(&other).is_ok() && is_folded(&other));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(v in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&v);
        }
    }
}
