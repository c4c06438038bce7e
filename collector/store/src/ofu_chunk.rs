//! OFU block values: the job id, how OFU was derived at ingest (the
//! tensor clock and the SM clock's raw series, recorded with the head block
//! and carried through folding to compaction), then a block whose OFU
//! column (and tensor activity and clock columns) are left out when they
//! can be recomputed exactly from the GPU's raw series. Compaction checks
//! the recorded derivation bit for bit; it never searches for one.

use super::gpu_block::BundleHours;
use super::gpu_block::{self, Part};
use super::hours::WINDOW_MS;
use super::keys::{get_str, put_str};
use super::raw::{chunk_times, raw_points, RawReader, Times, TIME_REF};
use super::records::{Derivation, OfuSample};
use super::scan::scan_series;
use super::{corrupt, Cf, StoreError, View};
use flopwatch_codec::Block;
use flopwatch_proto::metrics as m;
use std::collections::HashMap;
use std::sync::Arc;

/// How an OFU block value after the job id is laid out: a mode byte (block
/// versions are 1 and 2, so it is unambiguous), then the [`Derivation`]
/// recorded at ingest (tensor clock, f64 LE; clock series, a byte), then the
/// block. Without a mode byte the block holds OFU, tensor activity and SM
/// clock, and nothing says how OFU was derived.
///
/// The head's form: all three columns, and the derivation.
const RECORDED_OFU: u8 = 0xd2;

/// A sealed (or folded) chunk whose OFU column is not stored but
/// recomputed from tensor activity and SM clock with the tensor clock.
const DERIVED_OFU: u8 = 0xd0;

/// A sealed chunk that stores neither OFU nor tensor activity nor SM clock:
/// OFU is recomputed with the tensor clock, the other two are read from the
/// GPU's raw series of the same hour (`tensor_active` and the derivation's
/// clock series, their values at the chunk's timestamps, checked bit for bit
/// at compaction).
const REF_OFU: u8 = 0xd1;

/// Bytes of a mode byte and a derivation.
const DERIVATION_BYTES: usize = 10;

/// Raw series an OFU sample's SM clock comes from (ingest prefers the
/// window average).
pub(super) const CLOCKS: [&str; 2] = super::records::OFU_CLOCKS;

/// One raw series' values in one hour by timestamp, as bits; `None` where
/// a timestamp repeats with different values. Hashed with foldhash (a
/// few times faster than the standard SipHash on an hour of timestamps),
/// seeded at random per process: timestamps come from agents.
pub(super) type HourMap = HashMap<i64, Option<u64>, foldhash::fast::RandomState>;

/// The raw series `metric` of the GPU whose OFU prefix is `ofu_prefix`, in
/// the hour starting at `w`: chunks and head.
pub(super) fn raw_hour(
    view: &dyn View,
    ofu_prefix: &[u8],
    metric: &str,
    w: i64,
) -> Result<HourMap, StoreError> {
    let mut raw = ofu_prefix.to_vec();
    put_str(&mut raw, metric);
    let mut map = HourMap::default();
    let mut reader = RawReader::new(view, &raw);
    // Chunks, then the head's bundles.
    for (cf, p, bundled) in [
        (Cf::Raw, &raw, false),
        (Cf::Head, &ofu_prefix.to_vec(), true),
    ] {
        let mut visit = |hour: i64, v: &[u8]| {
            let b = reader.decode(cf, hour, v)?;
            for pt in raw_points(&b)? {
                let bits = pt.value.to_bits();
                map.entry(pt.ts_ms)
                    .and_modify(|e| {
                        if *e != Some(bits) {
                            *e = None
                        }
                    })
                    .or_insert(Some(bits));
            }
            Ok(true)
        };
        if bundled {
            // The one hour asked for: a seek to the GPU's run in it.
            let hour = BundleHours::Held(vec![w]);
            gpu_block::scan_parts(
                view,
                cf,
                &hour,
                p,
                Part::Raw(metric),
                w,
                w + WINDOW_MS,
                &mut visit,
            )?;
        } else {
            scan_series(view, cf, p, w, w + WINDOW_MS, &mut visit)?;
        }
    }
    Ok(map)
}

/// The derivations of the blocks merged into one chunk: the one they
/// share, or none when a block has none or another (a GPU model or clock
/// series that changed within the hour).
#[derive(Debug, Default)]
pub(super) struct Derivations {
    seen: bool,
    common: Option<Derivation>,
}

impl Derivations {
    /// One more block's.
    pub(super) fn add(&mut self, d: Option<Derivation>) {
        self.common = if self.seen {
            self.common.filter(|c| Some(*c) == d)
        } else {
            d
        };
        self.seen = true;
    }

    /// What every block shares.
    pub(super) fn common(&self) -> Option<Derivation> {
        self.common
    }
}

/// Whether the raw series `tpa` and `clock` hold exactly every sample's
/// tensor activity and SM clock.
pub(super) fn refs_hold(samples: &[OfuSample], tpa: &HourMap, clock: &HourMap) -> bool {
    let has = |m: &HourMap, ts: i64, v: f64| m.get(&ts) == Some(&Some(v.to_bits()));
    samples
        .iter()
        .all(|s| has(tpa, s.ts_ms, s.tensor_active) && has(clock, s.ts_ms, s.sm_clock_mhz))
}

/// How an OFU block value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// A batch's bundle: the fast head encoding, every column recorded.
    Head,
    /// A folded bundle: a sealed chunk's encoding, its predictors fixed
    /// (`Block::encode_compact_quick`), as the seal encodes it again.
    Folded,
    /// A sealed chunk.
    Sealed,
}

/// An OFU block value: job id, then the block. With `derivation` (checked
/// exact on `samples`) the head form records it beside all three columns
/// ([`RECORDED_OFU`]); a sealed chunk drops the OFU column
/// ([`DERIVED_OFU`]), and the tensor activity and clock columns too when
/// `refs` (the raw series hold them: [`REF_OFU`]).
/// A sealed chunk whose timestamps and windows are exactly `shared` (the
/// GPU's [`TIME_REF`] chunk's of the hour) leaves them out.
pub(super) fn ofu_value(
    job: &str,
    samples: &[OfuSample],
    form: Form,
    derivation: Option<Derivation>,
    refs: bool,
    shared: Option<&Times>,
) -> Result<Vec<u8>, StoreError> {
    let derivation = derivation.filter(|d| d.exact(samples));
    let compact = form != Form::Head;
    let mode = derivation.map(|_| match (compact, refs) {
        (false, _) => RECORDED_OFU,
        (true, false) => DERIVED_OFU,
        (true, true) => REF_OFU,
    });
    let mut cols = Vec::with_capacity(3);
    if !matches!(mode, Some(DERIVED_OFU | REF_OFU)) {
        cols.push(samples.iter().map(|s| s.ofu).collect());
    }
    if mode != Some(REF_OFU) {
        cols.push(samples.iter().map(|s| s.tensor_active).collect());
        cols.push(samples.iter().map(|s| s.sm_clock_mhz).collect());
    }
    let block = Block {
        ts: samples.iter().map(|s| s.ts_ms).collect(),
        cols,
        windows: samples.iter().map(|s| s.window_ms).collect(),
    };
    let mut value = Vec::new();
    put_str(&mut value, job);
    if let (Some(mode), Some(d)) = (mode, derivation) {
        value.push(mode);
        value.extend_from_slice(&d.tensor_clock_mhz.to_le_bytes());
        value.push(d.clock);
    }
    let shares =
        !block.is_empty() && shared.is_some_and(|(ts, w)| *ts == block.ts && *w == block.windows);
    let enc = match (form, shares) {
        (Form::Sealed, true) => block.encode_compact_shared(),
        (Form::Sealed, false) => block.encode_compact(),
        (Form::Folded, _) => block.encode_compact_quick(),
        (Form::Head, _) => block.encode(),
    };
    value.extend(enc.map_err(|e| corrupt(Cf::Ofu, e))?);
    Ok(value)
}

/// Where the block of an OFU block value starts (after the job id, the
/// mode byte, the tensor clock and the clock series).
pub(super) fn ofu_block_start(v: &[u8]) -> Option<usize> {
    let mut pos = 0;
    get_str(v, &mut pos)?;
    if matches!(v.get(pos), Some(&(RECORDED_OFU | DERIVED_OFU | REF_OFU))) {
        pos += DERIVATION_BYTES;
    }
    (pos <= v.len()).then_some(pos)
}

/// An OFU block value read back: job id, samples, and how OFU was derived
/// when that was recorded.
pub(super) type OfuBlock<'v> = (&'v str, Vec<OfuSample>, Option<Derivation>);

/// Job id, samples and derivation of an OFU block value; `resolve` gives a
/// raw series of the block's hour when the block refers to them.
pub(super) fn ofu_samples<'v>(
    v: &'v [u8],
    resolve: &mut dyn HourRefs,
) -> Result<OfuBlock<'v>, StoreError> {
    let mut pos = 0;
    let job = get_str(v, &mut pos).ok_or_else(|| corrupt(Cf::Ofu, "job"))?;
    let mode = v
        .get(pos)
        .copied()
        .filter(|m| matches!(*m, RECORDED_OFU | DERIVED_OFU | REF_OFU));
    let derivation = match mode {
        Some(_) => {
            let f: [u8; 8] = v
                .get(pos + 1..pos + 9)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt(Cf::Ofu, "tensor clock"))?;
            let clock = *v
                .get(pos + 9)
                .ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
            pos += DERIVATION_BYTES;
            let d = Derivation {
                tensor_clock_mhz: f64::from_le_bytes(f),
                clock,
            };
            d.clock_metric()
                .ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
            Some(d)
        }
        None => None,
    };
    let refs = match (mode, derivation.and_then(|d| d.clock_metric())) {
        (Some(REF_OFU), Some(clock)) => Some((resolve.raw(m::TENSOR_ACTIVE)?, resolve.raw(clock)?)),
        _ => None,
    };
    let derived = match (mode, derivation) {
        (Some(DERIVED_OFU | REF_OFU), Some(d)) => Some(d.tensor_clock_mhz),
        _ => None,
    };
    let b = if Block::shares_time(&v[pos..]) {
        let t = resolve.times()?;
        Block::decode_shared(&v[pos..], &t.0, &t.1)
    } else {
        Block::decode(&v[pos..])
    }
    .map_err(|e| corrupt(Cf::Ofu, e))?;
    let ncols = usize::from(derived.is_none()) + if refs.is_some() { 0 } else { 2 };
    if b.cols.len() != ncols
        || b.cols.iter().any(|c| c.len() != b.len())
        || b.windows.len() != b.len()
    {
        return Err(corrupt(Cf::Ofu, "shape"));
    }
    let lookup = |map: &HourMap, ts: i64| -> Result<f64, StoreError> {
        match map.get(&ts) {
            Some(Some(bits)) => Ok(f64::from_bits(*bits)),
            _ => Err(corrupt(Cf::Ofu, "referenced raw sample missing")),
        }
    };
    let mut samples = Vec::with_capacity(b.len());
    for i in 0..b.len() {
        let (tpa, clk) = match &refs {
            Some((t, c)) => (lookup(t, b.ts[i])?, lookup(c, b.ts[i])?),
            None => (b.cols[ncols - 2][i], b.cols[ncols - 1][i]),
        };
        samples.push(OfuSample {
            ts_ms: b.ts[i],
            ofu: match derived {
                Some(f) => flopwatch_proto::ofu::ofu(tpa, clk, f),
                None => b.cols[0][i],
            },
            tensor_active: tpa,
            sm_clock_mhz: clk,
            window_ms: b.windows[i],
        });
    }
    Ok((job, samples, derivation))
}

/// What [`ofu_samples`] reads besides the block: the GPU's raw series of
/// the block's hour, and its [`TIME_REF`] chunk's timestamps.
pub(super) trait HourRefs {
    /// The raw series `metric` of the hour, by timestamp.
    fn raw(&mut self, metric: &'static str) -> Result<Arc<HourMap>, StoreError>;
    /// The timestamps and windows of the hour's [`TIME_REF`] chunk.
    fn times(&mut self) -> Result<Arc<Times>, StoreError>;
}

/// Raw hours and reference timestamps read for OFU blocks, kept across
/// the blocks of one read.
#[derive(Default)]
pub(super) struct RefCache {
    raw: HashMap<(&'static str, i64), Arc<HourMap>>,
    times: HashMap<i64, Arc<Times>>,
}

/// [`HourRefs`] of the hour starting at `w` of the GPU whose OFU prefix
/// is `ofu_prefix`, over `view`.
pub(super) struct Resolver<'a> {
    view: &'a dyn View,
    ofu_prefix: &'a [u8],
    cache: &'a mut RefCache,
    w: i64,
}

impl HourRefs for Resolver<'_> {
    fn raw(&mut self, metric: &'static str) -> Result<Arc<HourMap>, StoreError> {
        if let Some(m) = self.cache.raw.get(&(metric, self.w)) {
            return Ok(m.clone());
        }
        let m = Arc::new(raw_hour(self.view, self.ofu_prefix, metric, self.w)?);
        self.cache.raw.insert((metric, self.w), m.clone());
        Ok(m)
    }

    fn times(&mut self) -> Result<Arc<Times>, StoreError> {
        if let Some(t) = self.cache.times.get(&self.w) {
            return Ok(t.clone());
        }
        let mut p = self.ofu_prefix.to_vec();
        put_str(&mut p, TIME_REF);
        let t = chunk_times(self.view, &p, self.w)?
            .ok_or_else(|| corrupt(Cf::Ofu, "the chunk whose timestamps it shares is missing"))?;
        let t = Arc::new(t);
        self.cache.times.insert(self.w, t.clone());
        Ok(t)
    }
}

/// A resolver for [`ofu_samples`] over `view`, caching each raw hour.
pub(super) fn resolver<'a>(
    view: &'a dyn View,
    ofu_prefix: &'a [u8],
    cache: &'a mut RefCache,
    w: i64,
) -> Resolver<'a> {
    Resolver {
        view,
        ofu_prefix,
        cache,
        w,
    }
}
