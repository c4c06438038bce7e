//! An agent's message decoded from its bytes straight into the model's
//! types: a batch's series become [`SeriesBatch`]es without passing
//! through `v1::Series` first.
//!
//! A batch of a backed-off agent is 160 series of one point each. Decoded
//! by the generated code, every series is two strings and three or four
//! one-element vectors (timestamps, values, windows, peaks), which the
//! conversion ([`crate::convert`]) then copies into its points and frees:
//! six allocations a series, most of a collector's decoding time at fleet
//! scale. Here each series is its two strings and one vector of points,
//! filled as the columns arrive (packed or not, in any order, as protobuf
//! allows) and sized from a packed column's length. The rest of a batch
//! (jobs, events, intervals, MFU reports) goes through the generated code
//! and the conversions as before.
//!
//! The result is the generated code's followed by the conversion's, field
//! for field (the tests check it on arbitrary batches and on arbitrary
//! bytes): the last value of a scalar field wins, repeated fields append,
//! unknown fields are skipped, a oneof takes its last member (merging
//! repeats of it), and malformed bytes are an error. A series whose columns
//! disagree in length is not an error of the decoding: it is reported in
//! [`WireBatch::malformed`], as the conversion reports it, so that the
//! collector can answer the batch by its number.

use crate::convert::ConvertError;
use crate::model::{Batch, Point, SamplingInterval, SeriesBatch};
use crate::v1;
use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// Bytes that are not the message they claim to be.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// As the generated code finds it.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// As this decoder finds it.
    #[error("failed to decode Protobuf message: {0}")]
    Malformed(&'static str),
}

/// A batch as it arrived.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireBatch {
    /// The batch (a malformed series' points left out).
    pub batch: Batch,
    /// Its size on the wire, bytes.
    pub len: usize,
    /// Its samples: the timestamps of every series, malformed ones
    /// included.
    pub samples: usize,
    /// The first series whose columns disagree in length, if any: the
    /// batch cannot be stored.
    pub malformed: Option<ConvertError>,
}

/// `v1::AgentMessage`, its batch decoded into the model.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentFrame {
    /// A `Hello`.
    Hello(Box<v1::Hello>),
    /// A `Batch`.
    Batch(Box<WireBatch>),
    /// Neither member set.
    Empty,
}

impl AgentFrame {
    /// Decodes a `v1::AgentMessage`.
    pub fn decode(mut buf: &[u8]) -> Result<Self, FrameError> {
        // The oneof's last member, and every occurrence of it since it
        // became the last (repeats of a message field merge: their bytes
        // decode as one).
        let mut last: Option<(u32, Vec<&[u8]>)> = None;
        while !buf.is_empty() {
            let (tag, wire) = decode_key(&mut buf)?;
            match tag {
                1 | 2 => {
                    let bytes = delimited(wire, &mut buf)?;
                    match &mut last {
                        Some((t, parts)) if *t == tag => parts.push(bytes),
                        _ => last = Some((tag, vec![bytes])),
                    }
                }
                _ => skip_field(wire, tag, &mut buf, DecodeContext::default())?,
            }
        }
        let Some((tag, parts)) = last else {
            return Ok(Self::Empty);
        };
        let joined;
        let bytes = if let [one] = parts.as_slice() {
            *one
        } else {
            joined = parts.concat();
            &joined
        };
        Ok(if tag == 1 {
            Self::Hello(Box::new(v1::Hello::decode(bytes)?))
        } else {
            Self::Batch(Box::new(decode_batch(bytes)?))
        })
    }
}

/// Decodes a `v1::Batch`.
pub fn decode_batch(bytes: &[u8]) -> Result<WireBatch, FrameError> {
    let mut out = WireBatch {
        len: bytes.len(),
        ..WireBatch::default()
    };
    let b = &mut out.batch;
    let mut buf = bytes;
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            1 => b.seq = varint(wire, &mut buf)?,
            2 => b.agent_id = string(wire, &mut buf)?,
            3 => b.boot_id = string(wire, &mut buf)?,
            4 => {
                let (series, cols) = decode_series(delimited(wire, &mut buf)?)?;
                out.samples += cols.ts;
                match cols.check(&series) {
                    Ok(()) => b.series.push(series),
                    Err(e) => {
                        out.malformed.get_or_insert(e);
                    }
                }
            }
            5 => b
                .jobs
                .push(v1::JobAssignment::decode(delimited(wire, &mut buf)?)?.into()),
            6 => b
                .events
                .push(v1::Event::decode(delimited(wire, &mut buf)?)?.into()),
            7 => b.sent_at_ms = varint(wire, &mut buf)? as i64,
            8 => b.from_spool = varint(wire, &mut buf)? != 0,
            9 => {
                let i = v1::SamplingInterval::decode(delimited(wire, &mut buf)?)?;
                b.intervals.push(SamplingInterval {
                    gpu_uuid: i.gpu_uuid,
                    metric: i.metric,
                    interval_ms: i.interval_ms,
                });
            }
            10 => b.pending_bytes = varint(wire, &mut buf)?,
            11 => b.pending_batches = varint(wire, &mut buf)? as u32,
            12 => b
                .mfu_reports
                .push(v1::MfuReport::decode(delimited(wire, &mut buf)?)?.into()),
            13 => b.uncertain = varint(wire, &mut buf)? != 0,
            _ => skip_field(wire, tag, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(out)
}

/// How many entries each of a series' columns had.
#[derive(Debug, Default)]
struct Cols {
    ts: usize,
    values: usize,
    peaks: usize,
    windows: usize,
}

impl Cols {
    /// As [`crate::convert`]'s check: values as many as timestamps, peaks
    /// and windows as many or none.
    fn check(&self, s: &SeriesBatch) -> Result<(), ConvertError> {
        let n = self.ts;
        for (field, got, optional) in [
            ("values", self.values, false),
            ("peaks", self.peaks, true),
            ("window_ms", self.windows, true),
        ] {
            if got != n && !(optional && got == 0) {
                return Err(ConvertError::LengthMismatch {
                    gpu: s.gpu_uuid.clone(),
                    metric: s.metric.clone(),
                    field,
                    got,
                    want: n,
                });
            }
        }
        Ok(())
    }
}

/// The point at `i` of `points`, added if it is the next one (columns fill
/// the points in step, so `i` is at most their length).
fn at(points: &mut Vec<Point>, i: usize) -> &mut Point {
    if i == points.len() {
        points.push(Point {
            ts_ms: 0,
            value: 0.0,
            peak: None,
            window_ms: None,
        });
    }
    &mut points[i]
}

/// Room for `count` more entries of a column that has `done` so far.
fn reserve(points: &mut Vec<Point>, done: usize, count: usize) {
    let need = done + count;
    if need > points.len() {
        points.reserve_exact(need - points.len());
    }
}

/// Decodes a `v1::Series`: the series and its columns' lengths.
fn decode_series(mut buf: &[u8]) -> Result<(SeriesBatch, Cols), FrameError> {
    let mut s = SeriesBatch::default();
    let mut c = Cols::default();
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            1 => s.gpu_uuid = string(wire, &mut buf)?,
            2 => s.metric = string(wire, &mut buf)?,
            3 => varints(wire, &mut buf, &mut s.points, &mut c.ts, |p, v| {
                p.ts_ms = v as i64;
            })?,
            4 => doubles(wire, &mut buf, &mut s.points, &mut c.values, |p, v| {
                p.value = v;
            })?,
            5 => doubles(wire, &mut buf, &mut s.points, &mut c.peaks, |p, v| {
                p.peak = Some(v);
            })?,
            6 => varints(wire, &mut buf, &mut s.points, &mut c.windows, |p, v| {
                p.window_ms = Some(v as u32);
            })?,
            _ => skip_field(wire, tag, &mut buf, DecodeContext::default())?,
        }
    }
    s.points.truncate(c.ts);
    Ok((s, c))
}

/// A repeated varint column, packed or one entry.
fn varints(
    wire: WireType,
    buf: &mut &[u8],
    points: &mut Vec<Point>,
    n: &mut usize,
    set: impl Fn(&mut Point, u64),
) -> Result<(), FrameError> {
    match wire {
        WireType::LengthDelimited => {
            let mut packed = delimited(wire, buf)?;
            // Every varint ends in the one byte of it below 0x80.
            let count = packed.iter().filter(|&&b| b < 0x80).count();
            reserve(points, *n, count);
            while !packed.is_empty() {
                let v = decode_varint(&mut packed)?;
                set(at(points, *n), v);
                *n += 1;
            }
        }
        _ => {
            let v = varint(wire, buf)?;
            set(at(points, *n), v);
            *n += 1;
        }
    }
    Ok(())
}

/// A repeated double column, packed or one entry.
fn doubles(
    wire: WireType,
    buf: &mut &[u8],
    points: &mut Vec<Point>,
    n: &mut usize,
    set: impl Fn(&mut Point, f64),
) -> Result<(), FrameError> {
    match wire {
        WireType::LengthDelimited => {
            let packed = delimited(wire, buf)?;
            if packed.len() % 8 != 0 {
                return Err(FrameError::Malformed(
                    "packed doubles not a multiple of 8 bytes",
                ));
            }
            reserve(points, *n, packed.len() / 8);
            for v in packed.chunks_exact(8) {
                let v = f64::from_le_bytes(v.try_into().unwrap_or_default());
                set(at(points, *n), v);
                *n += 1;
            }
        }
        WireType::SixtyFourBit => {
            if buf.len() < 8 {
                return Err(FrameError::Malformed("buffer underflow"));
            }
            let v = buf.get_f64_le();
            set(at(points, *n), v);
            *n += 1;
        }
        _ => return Err(wire_error(WireType::SixtyFourBit)),
    }
    Ok(())
}

fn wire_error(want: WireType) -> FrameError {
    FrameError::Malformed(match want {
        WireType::Varint => "invalid wire type (expected a varint)",
        WireType::SixtyFourBit => "invalid wire type (expected 64 bits)",
        _ => "invalid wire type (expected length-delimited)",
    })
}

/// A varint field's value.
fn varint(wire: WireType, buf: &mut &[u8]) -> Result<u64, FrameError> {
    if wire != WireType::Varint {
        return Err(wire_error(WireType::Varint));
    }
    Ok(decode_varint(buf)?)
}

/// A length-delimited field's bytes.
fn delimited<'a>(wire: WireType, buf: &mut &'a [u8]) -> Result<&'a [u8], FrameError> {
    if wire != WireType::LengthDelimited {
        return Err(wire_error(WireType::LengthDelimited));
    }
    let len = decode_varint(buf)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= buf.len())
        .ok_or(FrameError::Malformed("buffer underflow"))?;
    let (bytes, rest) = buf.split_at(len);
    *buf = rest;
    Ok(bytes)
}

/// A string field's value.
fn string(wire: WireType, buf: &mut &[u8]) -> Result<String, FrameError> {
    let bytes = delimited(wire, buf)?;
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| FrameError::Malformed("invalid string value: data is not UTF-8 encoded"))
}

#[cfg(test)]
mod tests;
