//! OFU block values: the job id, then a block whose OFU column (and
//! tensor activity and clock columns) are left out when they can be
//! recomputed exactly from the GPU's raw series.

use super::gpu_block::{self, Part};
use super::hours::WINDOW_MS;
use super::keys::{self, get_str, put_str};
use super::raw::{chunk_times, raw_points, RawReader, Times, TIME_REF};
use super::records::OfuSample;
use super::scan::scan_series;
use super::{corrupt, Cf, StoreError, View};
use crate::codec::Block;
use flopwatch_proto::metrics as m;
use std::collections::HashMap;
use std::sync::Arc;

/// Marks an OFU chunk whose OFU column is not stored but recomputed from
/// tensor activity and SM clock with the tensor clock that follows it
/// (block versions are 1 and 2, so the byte is unambiguous).
const DERIVED_OFU: u8 = 0xd0;

/// The tensor clock `f` with which every sample's OFU is exactly
/// `ofu(tensor_active, sm_clock_mhz, f)` (bit for bit), if there is one.
pub(super) fn derivation_clock(samples: &[OfuSample]) -> Option<f64> {
    let exact = |f: f64| {
        samples.iter().all(|s| {
            crate::ofu::ofu(s.tensor_active, s.sm_clock_mhz, f).to_bits() == s.ofu.to_bits()
        })
    };
    let mut candidates = Vec::new();
    let usable = |s: &&OfuSample| s.ofu > 0.0 && s.tensor_active > 0.0 && s.tensor_active <= 1.0;
    // A sample whose clock was below the tensor clock (OFU < TPA) pins it.
    if let Some(s) = samples
        .iter()
        .filter(usable)
        .find(|s| s.tensor_active - s.ofu > 1e-9)
    {
        let f = s.tensor_active * s.sm_clock_mhz / s.ofu;
        candidates.extend([
            f.round(),
            (f * 2.0).round() / 2.0,
            (f * 10.0).round() / 10.0,
        ]);
    } else if samples.iter().any(|s| usable(&s)) {
        // Every clock at or above the tensor clock: try the smallest.
        let min = samples
            .iter()
            .map(|s| s.sm_clock_mhz)
            .fold(f64::INFINITY, f64::min);
        candidates.extend([min.floor(), min]);
    } else {
        candidates.push(1.0);
    }
    candidates
        .into_iter()
        .filter(|f| f.is_finite() && *f > 0.0)
        .find(|&f| exact(f))
}

/// Marks an OFU chunk that stores neither OFU nor tensor activity nor SM
/// clock: OFU is recomputed with the tensor clock that follows, the other
/// two are read from the GPU's raw series of the same hour (their values at
/// the chunk's timestamps, checked bit for bit at compaction). The clock
/// series is [`CLOCKS`]`[i]` for the index byte after the tensor clock.
const REF_OFU: u8 = 0xd1;

/// Raw series an OFU sample's SM clock comes from (ingest prefers the
/// window average).
pub(super) const CLOCKS: [&str; 2] = [m::SM_CLOCK_AVG_MHZ, m::SM_CLOCK_MHZ];

/// One raw series' values in one hour by timestamp, as bits; `None` where
/// a timestamp repeats with different values.
pub(super) type HourMap = HashMap<i64, Option<u64>>;

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
    let head = keys::kind_prefix(keys::KIND_RAW, &raw);
    let mut map = HourMap::new();
    let mut reader = RawReader::new(view, &raw);
    // Chunks, the head's bundles, and one-series head blocks of stores
    // written before bundling.
    for (cf, p, bundled) in [
        (Cf::Raw, &raw, false),
        (Cf::Head, &ofu_prefix.to_vec(), true),
        (Cf::Head, &head, false),
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
            gpu_block::scan_parts(view, cf, p, Part::Raw(metric), w, w + WINDOW_MS, &mut visit)?;
        } else {
            scan_series(view, cf, p, w, w + WINDOW_MS, &mut visit)?;
        }
    }
    Ok(map)
}

/// Which of [`CLOCKS`] (if any) holds, with tensor activity, exactly the
/// values of every sample.
pub(super) fn ref_clock(samples: &[OfuSample], tpa: &HourMap, clocks: &[HourMap]) -> Option<u8> {
    let has = |m: &HourMap, ts: i64, v: f64| m.get(&ts) == Some(&Some(v.to_bits()));
    if !samples.iter().all(|s| has(tpa, s.ts_ms, s.tensor_active)) {
        return None;
    }
    (0..clocks.len())
        .find(|&i| {
            samples
                .iter()
                .all(|s| has(&clocks[i], s.ts_ms, s.sm_clock_mhz))
        })
        .map(|i| i as u8)
}

/// An OFU block value: job id, then the block. A sealed chunk drops the
/// OFU column when it can be recomputed exactly ([`DERIVED_OFU`]), and the
/// tensor activity and clock columns too when `refs` names the raw clock
/// series that holds them ([`REF_OFU`]).
/// A sealed chunk whose timestamps and windows are exactly `shared` (the
/// GPU's [`TIME_REF`] chunk's of the hour) leaves them out.
pub(super) fn ofu_value(
    job: &str,
    samples: &[OfuSample],
    compact: bool,
    refs: Option<u8>,
    shared: Option<&Times>,
) -> Result<Vec<u8>, StoreError> {
    let derived = if compact {
        derivation_clock(samples)
    } else {
        None
    };
    let refs = refs.filter(|_| derived.is_some());
    let mut cols = Vec::with_capacity(3);
    if derived.is_none() {
        cols.push(samples.iter().map(|s| s.ofu).collect());
    }
    if refs.is_none() {
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
    if let Some(f) = derived {
        value.push(if refs.is_some() { REF_OFU } else { DERIVED_OFU });
        value.extend_from_slice(&f.to_le_bytes());
    }
    if let Some(i) = refs {
        value.push(i);
    }
    let shares =
        !block.is_empty() && shared.is_some_and(|(ts, w)| *ts == block.ts && *w == block.windows);
    let enc = match (compact, shares) {
        (true, true) => block.encode_compact_shared(),
        (true, false) => block.encode_compact(),
        _ => block.encode(),
    };
    value.extend(enc.map_err(|e| corrupt(Cf::Ofu, e))?);
    Ok(value)
}

/// Where the block of an OFU block value starts (after the job id, the
/// mode byte, the tensor clock and the clock series).
pub(super) fn ofu_block_start(v: &[u8]) -> Option<usize> {
    let mut pos = 0;
    get_str(v, &mut pos)?;
    match v.get(pos).copied() {
        Some(DERIVED_OFU) => pos += 9,
        Some(REF_OFU) => pos += 10,
        _ => {}
    }
    (pos <= v.len()).then_some(pos)
}

/// Job id and samples of an OFU block value; `resolve` gives a raw series
/// of the block's hour when the block refers to them.
pub(super) fn ofu_samples<'v>(
    v: &'v [u8],
    resolve: &mut dyn HourRefs,
) -> Result<(&'v str, Vec<OfuSample>), StoreError> {
    let mut pos = 0;
    let job = get_str(v, &mut pos).ok_or_else(|| corrupt(Cf::Ofu, "job"))?;
    let mode = v.get(pos).copied();
    let derived = if mode == Some(DERIVED_OFU) || mode == Some(REF_OFU) {
        let f: [u8; 8] = v
            .get(pos + 1..pos + 9)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt(Cf::Ofu, "tensor clock"))?;
        pos += 9;
        Some(f64::from_le_bytes(f))
    } else {
        None
    };
    let refs = if mode == Some(REF_OFU) {
        let i = *v.get(pos).ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
        pos += 1;
        let clock = *CLOCKS
            .get(usize::from(i))
            .ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
        Some((resolve.raw(m::TENSOR_ACTIVE)?, resolve.raw(clock)?))
    } else {
        None
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
                Some(f) => crate::ofu::ofu(tpa, clk, f),
                None => b.cols[0][i],
            },
            tensor_active: tpa,
            sm_clock_mhz: clk,
            window_ms: b.windows[i],
        });
    }
    Ok((job, samples))
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
