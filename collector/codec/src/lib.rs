//! Block codec for series samples, in the spirit of Gorilla (Pelkonen et
//! al., VLDB 2015) and Prometheus' XOR chunks. Three formats, told apart
//! by the first byte; every one is still read:
//!
//! * **1** ([`Block::encode`], the head's fast form): timestamps as
//!   bit-packed delta-of-deltas (one bit per sample while the interval
//!   holds, 10–24 bits when it changes), values as Gorilla XOR, windows
//!   run-length encoded.
//! * **2** (sealed chunks before format 3, and blocks of more than
//!   [`sealed::MAX_COLS`] columns): per column XOR or exact decimals
//!   (scaled integers' deltas bit-packed in groups of 16), windows
//!   run-length or against the timestamp gaps.
//! * **3** ([`Block::encode_compact`], sealed chunks): prediction and an
//!   entropy stage (a binary range coder writing `constriction`'s stream, with adaptive integer
//!   models); exact decimals and window means of decimals as integers,
//!   residuals from a running level; see [`sealed`].
//!
//! Layout of 1 and 2: `version u8 | flags u8 | columns u8 | count varint |
//! ts… | column… | windows…`; version 2 starts every column with a mode
//! byte (0 XOR, 1 decimal). Decoding checks every bound and returns an
//! error on malformed input; it never panics.

#![forbid(unsafe_code)]

mod bits;
mod entropy;
mod range;
mod sealed;

use bits::{
    decimal_scale, decode_decimal, decode_ts, decode_xor, encode_decimal, encode_ts, encode_xor,
    pack_groups, put_bytes, put_varint, unpack_groups, unzigzag, zigzag, BitReader, BitWriter,
    Reader,
};

const VERSION: u8 = 1;
const VERSION_MODES: u8 = 2;
const MODE_XOR: u8 = 0;
const MODE_DECIMAL: u8 = 1;
/// Deltas per bit-packed group of a decimal column.
const GROUP: usize = 16;
const FLAG_WINDOWS: u8 = 1;
/// Version 2: windows stored as their difference from the gap to the
/// previous timestamp (a sampler's window is usually exactly that gap),
/// zigzag-encoded and bit-packed in groups.
const FLAG_WINDOWS_GAP: u8 = 2;
/// Upper bound on samples per block, so a hostile header cannot make the
/// decoder allocate unbounded memory.
pub const MAX_BLOCK_SAMPLES: usize = 1 << 20;

/// Samples sharing timestamps: one timestamp column, `cols` value columns,
/// optional window lengths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Block {
    /// Unix ms, one per sample.
    pub ts: Vec<i64>,
    /// Value columns, each as long as `ts`.
    pub cols: Vec<Vec<f64>>,
    /// Window lengths in ms, empty or as long as `ts`.
    pub windows: Vec<u32>,
}

/// A block that cannot be decoded (or encoded).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// Input ended early.
    #[error("block truncated")]
    Truncated,
    /// Unknown format version.
    #[error("unsupported block version {0}")]
    Version(u8),
    /// A header field is out of range.
    #[error("corrupt block: {0}")]
    Corrupt(&'static str),
    /// The block's timestamps are another chunk's, and were not given.
    #[error("block shares another chunk's timestamps")]
    SharedTime,
}

impl Block {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    /// True when the block holds no sample.
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    /// Encodes the block (XOR values, the fast form used for the head).
    /// Columns must be as long as `ts`; `windows` empty or as long.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        self.encode_with(false)
    }

    /// Encodes a sealed chunk (format 3, [`sealed`]; format 2 beyond
    /// [`sealed::MAX_COLS`] columns). Slower than [`Block::encode`],
    /// decoded by the same [`Block::decode`].
    pub fn encode_compact(&self) -> Result<Vec<u8>, CodecError> {
        if self.cols.len() > sealed::MAX_COLS {
            return self.encode_with(true);
        }
        self.check_shape()?;
        sealed::encode(self, false, sealed::Effort::Best)
    }

    /// Encodes a sealed chunk (format 3, decoded by [`Block::decode`]) as
    /// [`Block::encode_compact`] does, but with each column's predictor
    /// fixed rather than chosen by trial: one encoding per column instead
    /// of one per candidate, a few percent larger. For blocks that will be
    /// encoded again (a fold's, which a seal re-encodes).
    pub fn encode_compact_quick(&self) -> Result<Vec<u8>, CodecError> {
        if self.cols.len() > sealed::MAX_COLS {
            return self.encode_with(true);
        }
        self.check_shape()?;
        sealed::encode(self, false, sealed::Effort::Quick)
    }

    /// Encodes a sealed chunk (format 3) without its timestamps and
    /// windows: the reader supplies them from another chunk that has the
    /// same ones ([`Block::decode_shared`]). Errors beyond
    /// [`sealed::MAX_COLS`] columns.
    pub fn encode_compact_shared(&self) -> Result<Vec<u8>, CodecError> {
        if self.cols.len() > sealed::MAX_COLS {
            return Err(CodecError::Corrupt("columns"));
        }
        self.check_shape()?;
        sealed::encode(self, true, sealed::Effort::Best)
    }

    /// Whether `buf` holds a chunk written by
    /// [`Block::encode_compact_shared`], whose timestamps are another's.
    pub fn shares_time(buf: &[u8]) -> bool {
        sealed::shares_time(buf)
    }

    /// The timestamps and windows of a block, without decoding its values
    /// where the format allows; an error for a block that shares another's.
    pub fn decode_time(buf: &[u8]) -> Result<(Vec<i64>, Vec<u32>), CodecError> {
        if buf.first() == Some(&sealed::VERSION_SEALED) {
            let mut r = Reader { buf, pos: 1 };
            return sealed::decode_times(&mut r);
        }
        let b = Self::decode(buf)?;
        Ok((b.ts, b.windows))
    }

    /// Decodes a block; one that shares its timestamps and windows takes
    /// `ts` and `windows` (and must have as many samples), any other
    /// ignores them.
    pub fn decode_shared(buf: &[u8], ts: &[i64], windows: &[u32]) -> Result<Self, CodecError> {
        Self::decode_with(buf, Some((ts, windows)))
    }

    /// Encodes in format 2 (the sealed form before format 3).
    pub fn encode_v2(&self) -> Result<Vec<u8>, CodecError> {
        self.encode_with(true)
    }

    fn check_shape(&self) -> Result<(), CodecError> {
        let n = self.ts.len();
        if n > MAX_BLOCK_SAMPLES {
            return Err(CodecError::Corrupt("too many samples"));
        }
        if self.cols.len() > u8::MAX as usize || self.cols.iter().any(|c| c.len() != n) {
            return Err(CodecError::Corrupt("column length"));
        }
        if !self.windows.is_empty() && self.windows.len() != n {
            return Err(CodecError::Corrupt("window length"));
        }
        Ok(())
    }

    fn encode_with(&self, compact: bool) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::with_capacity(8 + self.ts.len() * (2 + self.cols.len() * 2));
        self.encode_with_into(compact, &mut out)?;
        Ok(out)
    }

    /// [`Block::encode`]'s bytes appended to `out` (a head bundle holds
    /// several blocks in one value).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        self.encode_with_into(false, out)
    }

    fn encode_with_into(&self, compact: bool, out: &mut Vec<u8>) -> Result<(), CodecError> {
        self.check_shape()?;
        let n = self.ts.len();
        let start = out.len();
        out.push(if compact { VERSION_MODES } else { VERSION });
        out.push(if self.windows.is_empty() {
            0
        } else {
            FLAG_WINDOWS
        });
        out.push(self.cols.len() as u8);
        put_varint(out, n as u64);
        encode_ts(out, &self.ts);
        for c in &self.cols {
            if !compact {
                encode_xor(out, c);
                continue;
            }
            let mut xor = vec![MODE_XOR];
            encode_xor(&mut xor, c);
            if let Some((scale, ints)) = decimal_scale(c) {
                let mut dec = vec![MODE_DECIMAL];
                encode_decimal(&mut dec, scale, &ints);
                if dec.len() < xor.len() {
                    out.extend_from_slice(&dec);
                    continue;
                }
            }
            out.extend_from_slice(&xor);
        }
        // Windows repeat (fixed or slowly changing intervals): run-length.
        let mut rle = Vec::new();
        let mut i = 0;
        while i < self.windows.len() {
            let w = self.windows[i];
            let run = self.windows[i..].iter().take_while(|&&x| x == w).count();
            put_varint(&mut rle, u64::from(w));
            put_varint(&mut rle, run as u64);
            i += run;
        }
        if compact && !self.windows.is_empty() {
            // Irregular intervals: windows against the timestamp gaps.
            let d: Vec<u64> = (0..n)
                .map(|i| {
                    let gap = if i == 0 {
                        0
                    } else {
                        self.ts[i].wrapping_sub(self.ts[i - 1])
                    };
                    zigzag(i64::from(self.windows[i]).wrapping_sub(gap))
                })
                .collect();
            let mut w = BitWriter {
                out: Vec::new(),
                used: 0,
            };
            pack_groups(&mut w, &d);
            let mut gap = Vec::new();
            put_bytes(&mut gap, &w.out);
            if gap.len() < rle.len() {
                out[start + 1] |= FLAG_WINDOWS_GAP;
                out.extend_from_slice(&gap);
                return Ok(());
            }
        }
        out.extend_from_slice(&rle);
        Ok(())
    }

    /// Decodes a block (an error for one that shares another's timestamps:
    /// see [`Block::decode_shared`]).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        Self::decode_with(buf, None)
    }

    fn decode_with(buf: &[u8], time: Option<(&[i64], &[u32])>) -> Result<Self, CodecError> {
        let mut r = Reader { buf, pos: 0 };
        let version = r.u8()?;
        if version == sealed::VERSION_SEALED {
            let b = sealed::decode(&mut r, time)?;
            if r.pos != buf.len() {
                return Err(CodecError::Corrupt("trailing bytes"));
            }
            return Ok(b);
        }
        if version != VERSION && version != VERSION_MODES {
            return Err(CodecError::Version(version));
        }
        let flags = r.u8()?;
        let known = if version == VERSION_MODES {
            FLAG_WINDOWS | FLAG_WINDOWS_GAP
        } else {
            FLAG_WINDOWS
        };
        if flags & !known != 0 || flags == FLAG_WINDOWS_GAP {
            return Err(CodecError::Corrupt("unknown flags"));
        }
        let ncols = r.u8()? as usize;
        let n = usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("count"))?;
        if n > MAX_BLOCK_SAMPLES || n > buf.len().saturating_mul(8) {
            return Err(CodecError::Corrupt("count"));
        }
        let ts = if n == 0 {
            Vec::new()
        } else {
            decode_ts(&mut r, n)?
        };
        let mut cols = Vec::with_capacity(ncols);
        for _ in 0..ncols {
            let mode = if version == VERSION_MODES {
                r.u8()?
            } else {
                MODE_XOR
            };
            cols.push(match (n, mode) {
                (0, MODE_XOR) => {
                    if r.varint()? != 0 {
                        return Err(CodecError::Corrupt("column length"));
                    }
                    Vec::new()
                }
                (0, MODE_DECIMAL) => {
                    r.u8()?;
                    Vec::new()
                }
                (_, MODE_XOR) => decode_xor(&mut r, n)?,
                (_, MODE_DECIMAL) => decode_decimal(&mut r, n)?,
                _ => return Err(CodecError::Corrupt("column mode")),
            });
        }
        let mut windows = Vec::new();
        if flags & FLAG_WINDOWS_GAP != 0 {
            let buf = r.bytes("window length")?;
            let mut br = BitReader { buf, bit: 0 };
            let d = unpack_groups(&mut br, n)?;
            windows.reserve(n);
            for (i, z) in d.into_iter().enumerate() {
                let gap = if i == 0 {
                    0
                } else {
                    ts[i].wrapping_sub(ts[i - 1])
                };
                let w = u32::try_from(unzigzag(z).wrapping_add(gap))
                    .map_err(|_| CodecError::Corrupt("window"))?;
                windows.push(w);
            }
        } else if flags & FLAG_WINDOWS != 0 {
            windows.reserve(n);
            while windows.len() < n {
                let w = u32::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("window"))?;
                let run = r.varint()?;
                if run == 0 || run > (n - windows.len()) as u64 {
                    return Err(CodecError::Corrupt("window run"));
                }
                windows.extend(std::iter::repeat_n(w, run as usize));
            }
        }
        if r.pos != buf.len() {
            return Err(CodecError::Corrupt("trailing bytes"));
        }
        Ok(Self { ts, cols, windows })
    }
}

#[cfg(test)]
mod tests;
