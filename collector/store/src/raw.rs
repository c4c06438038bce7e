//! Raw series blocks, and the read groups whose chunks share their
//! timestamps.

use super::hours::WINDOW_MS;
use super::keys::{get_str, put_str};
use super::scan::scan_series;
use super::{corrupt, Cf, StoreError, View};
use flopwatch_codec::Block;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::Point;

/// A raw series block of points.
pub(super) fn raw_block(points: &[Point]) -> Block {
    let has_peaks = points.iter().any(|p| p.peak.is_some());
    let has_windows = points.iter().any(|p| p.window_ms.is_some());
    let mut cols = vec![points.iter().map(|p| p.value).collect::<Vec<_>>()];
    if has_peaks {
        cols.push(points.iter().map(|p| p.peak.unwrap_or(p.value)).collect());
    }
    Block {
        ts: points.iter().map(|p| p.ts_ms).collect(),
        cols,
        windows: if has_windows {
            points.iter().map(|p| p.window_ms.unwrap_or(0)).collect()
        } else {
            Vec::new()
        },
    }
}

/// Points of a raw block.
pub(super) fn raw_points(b: &Block) -> Result<Vec<Point>, StoreError> {
    let values = b
        .cols
        .first()
        .ok_or_else(|| corrupt(Cf::Raw, "no value column"))?;
    if b.cols.iter().any(|c| c.len() != b.len()) {
        return Err(corrupt(Cf::Raw, "shape"));
    }
    Ok((0..b.len())
        .map(|i| Point {
            ts_ms: b.ts[i],
            value: values[i],
            peak: b.cols.get(1).map(|c| c[i]),
            window_ms: b.windows.get(i).copied(),
        })
        .collect())
}

/// The raw series whose sealed chunk of an hour the GPU's other raw
/// chunks of that hour may take their timestamps and windows from, when
/// theirs are the same (a read group: tensor activity and the SM clocks
/// are read at the same instants). Written by compaction, which keeps the
/// two consistent: a rewrite of the reference chunk re-encodes the chunks
/// that share it in the same write.
pub(super) const TIME_REF: &str = m::TENSOR_ACTIVE;

/// The raw prefix (tenant · gpu · [`TIME_REF`]) of the series whose
/// timestamps the raw series `prefix` (tenant · gpu · metric) may share;
/// `None` for the reference series itself or a malformed prefix.
pub(super) fn time_ref_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut pos = 0;
    get_str(prefix, &mut pos)?;
    get_str(prefix, &mut pos)?;
    let gpu_end = pos;
    let metric = get_str(prefix, &mut pos)?;
    if metric == TIME_REF || pos != prefix.len() {
        return None;
    }
    let mut p = prefix[..gpu_end].to_vec();
    put_str(&mut p, TIME_REF);
    Some(p)
}

/// Timestamps and windows of one chunk.
pub(super) type Times = (Vec<i64>, Vec<u32>);

/// The timestamps and windows of the sealed raw chunk of the series
/// `prefix` in the hour starting at `w`, if there is one.
pub(super) fn chunk_times(
    view: &dyn View,
    prefix: &[u8],
    w: i64,
) -> Result<Option<Times>, StoreError> {
    let mut out = None;
    scan_series(view, Cf::Raw, prefix, w, w + WINDOW_MS, &mut |hour, v| {
        if hour == w {
            out = Some(Block::decode_time(v).map_err(|e| corrupt(Cf::Raw, e))?);
            return Ok(false);
        }
        Ok(true)
    })?;
    Ok(out)
}

/// Decodes the raw blocks of one series read through one view: a chunk
/// that shares its timestamps gets them from the GPU's [`TIME_REF`]
/// chunk of the same hour (the last hour's kept).
pub(super) struct RawReader<'a> {
    view: &'a dyn View,
    time_ref: Option<Vec<u8>>,
    cached: Option<(i64, Times)>,
}

impl<'a> RawReader<'a> {
    /// A reader for the raw series `prefix` (tenant · gpu · metric).
    pub(super) fn new(view: &'a dyn View, prefix: &[u8]) -> Self {
        Self {
            view,
            time_ref: time_ref_prefix(prefix),
            cached: None,
        }
    }

    /// The block `v`, read from `cf`, of the hour starting at `w`.
    pub(super) fn decode(&mut self, cf: Cf, w: i64, v: &[u8]) -> Result<Block, StoreError> {
        if !Block::shares_time(v) {
            return Block::decode(v).map_err(|e| corrupt(cf, e));
        }
        let Some(rp) = &self.time_ref else {
            return Err(corrupt(cf, "shared timestamps without a reference series"));
        };
        if self.cached.as_ref().map(|(h, _)| *h) != Some(w) {
            let t = chunk_times(self.view, rp, w)?
                .ok_or_else(|| corrupt(cf, "the chunk whose timestamps it shares is missing"))?;
            self.cached = Some((w, t));
        }
        let (_, (ts, windows)) = self.cached.as_ref().expect("just set");
        Block::decode_shared(v, ts, windows).map_err(|e| corrupt(cf, e))
    }
}
