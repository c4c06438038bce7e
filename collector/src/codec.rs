//! Block codec for series samples, in the spirit of Gorilla (Pelkonen et
//! al., VLDB 2015) and Prometheus' XOR chunks:
//!
//! * timestamps: the first as a varint, then bit-packed delta-of-deltas:
//!   one bit per sample while the interval holds, 10–24 bits when the
//!   adaptive sampler changes it.
//! * values (one or more f64 columns): Gorilla XOR with leading/trailing
//!   zero windows, bit-packed.
//! * or, in sealed chunks ([`Block::encode_compact`]), a column whose
//!   values are all decimals with at most 9 fractional digits (as counters
//!   and readings printed with fixed precision are) as scaled integers:
//!   first value as a varint, then deltas zigzag-encoded and bit-packed in
//!   groups of 16 at the group's widest width. The encoder checks that the
//!   decimal form decodes to the identical bits, else it keeps XOR.
//! * optional window lengths: run-length encoded (value, run) varints.
//!
//! Layout: `version u8 | flags u8 | columns u8 | count varint | ts… |
//! column… | windows…`; version 2 starts every column with a mode byte
//! (0 XOR, 1 decimal), version 1 (XOR only) is still read. Decoding checks
//! every bound and returns an error on malformed input; it never panics.

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
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, CodecError> {
        let b = *self.buf.get(self.pos).ok_or(CodecError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(CodecError::Corrupt("varint too long"))
    }
}

struct BitWriter {
    out: Vec<u8>,
    used: u8,
}

impl BitWriter {
    fn bits(&mut self, v: u64, n: u8) {
        for i in (0..n).rev() {
            if self.used == 0 {
                self.out.push(0);
            }
            let bit = ((v >> i) & 1) as u8;
            let last = self.out.len() - 1;
            self.out[last] |= bit << (7 - self.used);
            self.used = (self.used + 1) % 8;
        }
    }
}

struct BitReader<'a> {
    buf: &'a [u8],
    bit: usize,
}

impl BitReader<'_> {
    fn bits(&mut self, n: u8) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for _ in 0..n {
            let byte = *self.buf.get(self.bit / 8).ok_or(CodecError::Truncated)?;
            v = (v << 1) | u64::from((byte >> (7 - (self.bit % 8))) & 1);
            self.bit += 1;
        }
        Ok(v)
    }
}

fn encode_xor(out: &mut Vec<u8>, col: &[f64]) {
    let mut w = BitWriter {
        out: Vec::with_capacity(col.len() * 2),
        used: 0,
    };
    let mut prev = 0u64;
    let (mut lead, mut trail) = (u8::MAX, 0u8);
    for (i, v) in col.iter().enumerate() {
        let bits = v.to_bits();
        if i == 0 {
            w.bits(bits, 64);
            prev = bits;
            continue;
        }
        let x = bits ^ prev;
        prev = bits;
        if x == 0 {
            w.bits(0, 1);
            continue;
        }
        w.bits(1, 1);
        let l = (x.leading_zeros() as u8).min(31);
        let t = x.trailing_zeros() as u8;
        if lead != u8::MAX && l >= lead && t >= trail {
            w.bits(0, 1);
            w.bits(x >> trail, 64 - lead - trail);
        } else {
            lead = l;
            trail = t;
            let len = 64 - l - t;
            w.bits(1, 1);
            w.bits(u64::from(l), 5);
            // len is 1..=64; store len-1 in 6 bits.
            w.bits(u64::from(len - 1), 6);
            w.bits(x >> t, len);
        }
    }
    put_varint(out, w.out.len() as u64);
    out.extend_from_slice(&w.out);
}

fn decode_xor(r: &mut Reader<'_>, n: usize) -> Result<Vec<f64>, CodecError> {
    let len = usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("column length"))?;
    let end = r.pos.checked_add(len).ok_or(CodecError::Truncated)?;
    let buf = r.buf.get(r.pos..end).ok_or(CodecError::Truncated)?;
    r.pos = end;
    let mut br = BitReader { buf, bit: 0 };
    let mut out = Vec::with_capacity(n);
    let mut prev = 0u64;
    let (mut lead, mut trail) = (0u8, 0u8);
    let mut have_window = false;
    for i in 0..n {
        if i == 0 {
            prev = br.bits(64)?;
            out.push(f64::from_bits(prev));
            continue;
        }
        if br.bits(1)? == 1 {
            if br.bits(1)? == 1 {
                lead = br.bits(5)? as u8;
                let len = br.bits(6)? as u8 + 1;
                if u32::from(lead) + u32::from(len) > 64 {
                    return Err(CodecError::Corrupt("xor window"));
                }
                trail = 64 - lead - len;
                have_window = true;
            } else if !have_window {
                return Err(CodecError::Corrupt("xor window reused before set"));
            }
            let len = 64 - lead - trail;
            let x = br.bits(len)? << trail;
            prev ^= x;
        }
        out.push(f64::from_bits(prev));
    }
    Ok(out)
}

/// Writes `vals` in groups of [`GROUP`], each as a 7-bit width and the
/// values at that width.
fn pack_groups(w: &mut BitWriter, vals: &[u64]) {
    for g in vals.chunks(GROUP) {
        let width = g.iter().map(|d| 64 - d.leading_zeros()).max().unwrap_or(0) as u8;
        w.bits(u64::from(width), 7);
        for &d in g {
            w.bits(d, width);
        }
    }
}

/// Reads `n` values written by [`pack_groups`].
fn unpack_groups(br: &mut BitReader<'_>, n: usize) -> Result<Vec<u64>, CodecError> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let width = br.bits(7)? as u8;
        if width > 64 {
            return Err(CodecError::Corrupt("group width"));
        }
        for _ in 0..(n - out.len()).min(GROUP) {
            out.push(br.bits(width)?);
        }
    }
    Ok(out)
}

/// The smallest scale `k` (0..=9) such that every value is exactly
/// `integer / 10^k`, with the integers and their deltas in ±2^52.
fn decimal_scale(col: &[f64]) -> Option<(u8, Vec<i64>)> {
    const LIMIT: f64 = (1u64 << 52) as f64;
    'scales: for k in 0u8..=9 {
        let p = 10f64.powi(i32::from(k));
        let mut ints = Vec::with_capacity(col.len());
        for &v in col {
            let m = (v * p).round();
            if !m.is_finite() || m.abs() >= LIMIT {
                continue 'scales;
            }
            // Through the integer, as the decoder does (-0.0 becomes 0).
            let i = m as i64;
            if (i as f64 / p).to_bits() != v.to_bits() {
                continue 'scales;
            }
            ints.push(i);
        }
        return Some((k, ints));
    }
    None
}

fn encode_decimal(out: &mut Vec<u8>, scale: u8, ints: &[i64]) {
    out.push(scale);
    let Some(&first) = ints.first() else { return };
    put_varint(out, zigzag(first));
    let mut w = BitWriter {
        out: Vec::with_capacity(ints.len()),
        used: 0,
    };
    let deltas: Vec<u64> = ints.windows(2).map(|p| zigzag(p[1] - p[0])).collect();
    pack_groups(&mut w, &deltas);
    put_varint(out, w.out.len() as u64);
    out.extend_from_slice(&w.out);
}

fn decode_decimal(r: &mut Reader<'_>, n: usize) -> Result<Vec<f64>, CodecError> {
    let scale = r.u8()?;
    if scale > 9 {
        return Err(CodecError::Corrupt("decimal scale"));
    }
    let p = 10f64.powi(i32::from(scale));
    let first = unzigzag(r.varint()?);
    let len = usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("column length"))?;
    let end = r.pos.checked_add(len).ok_or(CodecError::Truncated)?;
    let buf = r.buf.get(r.pos..end).ok_or(CodecError::Truncated)?;
    r.pos = end;
    let mut br = BitReader { buf, bit: 0 };
    let mut out = Vec::with_capacity(n);
    let mut cur = first;
    out.push(cur as f64 / p);
    for z in unpack_groups(&mut br, n - 1)? {
        cur = cur.wrapping_add(unzigzag(z));
        out.push(cur as f64 / p);
    }
    Ok(out)
}

/// Timestamps: first as a zigzag varint, then bit-packed delta-of-deltas
/// (the first delta counts as a delta-of-delta from 0), Gorilla-style:
/// `0` for an unchanged interval, `10`+8 bits, `110`+12 bits, `1110`+20
/// bits (zigzag), `1111`+64 bits.
fn encode_ts(out: &mut Vec<u8>, ts: &[i64]) {
    let Some(&first) = ts.first() else { return };
    put_varint(out, zigzag(first));
    let mut w = BitWriter {
        out: Vec::with_capacity(ts.len() / 4),
        used: 0,
    };
    let (mut prev, mut prev_delta) = (first, 0i64);
    for &t in &ts[1..] {
        let delta = t.wrapping_sub(prev);
        let z = zigzag(delta.wrapping_sub(prev_delta));
        match z {
            0 => w.bits(0, 1),
            1..=0xff => {
                w.bits(0b10, 2);
                w.bits(z, 8);
            }
            0x100..=0xfff => {
                w.bits(0b110, 3);
                w.bits(z, 12);
            }
            0x1000..=0xf_ffff => {
                w.bits(0b1110, 4);
                w.bits(z, 20);
            }
            _ => {
                w.bits(0b1111, 4);
                w.bits(z, 64);
            }
        }
        prev = t;
        prev_delta = delta;
    }
    put_varint(out, w.out.len() as u64);
    out.extend_from_slice(&w.out);
}

fn decode_ts(r: &mut Reader<'_>, n: usize) -> Result<Vec<i64>, CodecError> {
    let first = unzigzag(r.varint()?);
    let len = usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("ts length"))?;
    let end = r.pos.checked_add(len).ok_or(CodecError::Truncated)?;
    let buf = r.buf.get(r.pos..end).ok_or(CodecError::Truncated)?;
    r.pos = end;
    let mut br = BitReader { buf, bit: 0 };
    let mut ts = Vec::with_capacity(n);
    ts.push(first);
    let (mut prev, mut prev_delta) = (first, 0i64);
    for _ in 1..n {
        let z = if br.bits(1)? == 0 {
            0
        } else if br.bits(1)? == 0 {
            br.bits(8)?
        } else if br.bits(1)? == 0 {
            br.bits(12)?
        } else if br.bits(1)? == 0 {
            br.bits(20)?
        } else {
            br.bits(64)?
        };
        prev_delta = prev_delta.wrapping_add(unzigzag(z));
        prev = prev.wrapping_add(prev_delta);
        ts.push(prev);
    }
    Ok(ts)
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

    /// Encodes a sealed chunk: each column as decimals when that is exact
    /// and smaller, else XOR. Slower than [`Block::encode`], decoded by the
    /// same [`Block::decode`].
    pub fn encode_compact(&self) -> Result<Vec<u8>, CodecError> {
        self.encode_with(true)
    }

    fn encode_with(&self, compact: bool) -> Result<Vec<u8>, CodecError> {
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
        let mut out = Vec::with_capacity(8 + n * (2 + self.cols.len() * 2));
        out.push(if compact { VERSION_MODES } else { VERSION });
        out.push(if self.windows.is_empty() {
            0
        } else {
            FLAG_WINDOWS
        });
        out.push(self.cols.len() as u8);
        put_varint(&mut out, n as u64);
        encode_ts(&mut out, &self.ts);
        for c in &self.cols {
            if !compact {
                encode_xor(&mut out, c);
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
            put_varint(&mut gap, w.out.len() as u64);
            gap.extend_from_slice(&w.out);
            if gap.len() < rle.len() {
                out[1] |= FLAG_WINDOWS_GAP;
                out.extend_from_slice(&gap);
                return Ok(out);
            }
        }
        out.extend_from_slice(&rle);
        Ok(out)
    }

    /// Decodes a block.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader { buf, pos: 0 };
        let version = r.u8()?;
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
            let len =
                usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("window length"))?;
            let end = r.pos.checked_add(len).ok_or(CodecError::Truncated)?;
            let buf = r.buf.get(r.pos..end).ok_or(CodecError::Truncated)?;
            r.pos = end;
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn same_bits(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    proptest! {
        #[test]
        fn round_trips(
            start in -1_000_000_000_000i64..4_000_000_000_000i64,
            deltas in prop::collection::vec(0i64..40_000, 0..300),
            vals in prop::collection::vec(any::<f64>(), 300),
            windows in prop::collection::vec(any::<u32>(), 300),
            with_windows in any::<bool>(),
        ) {
            let mut ts = vec![start];
            for d in &deltas { ts.push(ts.last().unwrap() + d); }
            let n = ts.len();
            let b = Block {
                ts,
                cols: vec![vals[..n].to_vec(), vals[..n].iter().map(|v| v * 0.5).collect()],
                windows: if with_windows { windows[..n].to_vec() } else { Vec::new() },
            };
            let d = Block::decode(&b.encode().unwrap()).unwrap();
            prop_assert_eq!(&d.ts, &b.ts);
            prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
            prop_assert!(same_bits(&d.cols[1], &b.cols[1]));
            prop_assert_eq!(&d.windows, &b.windows);
        }

        #[test]
        fn decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Block::decode(&bytes);
        }
    }

    #[test]
    fn regular_series_is_compact() {
        let n = 1000;
        let b = Block {
            ts: (0..n).map(|i| 1_700_000_000_000 + i * 100).collect(),
            cols: vec![(0..n)
                .map(|i| if i % 50 < 40 { 0.62 } else { 0.04 })
                .collect()],
            windows: vec![100; n as usize],
        };
        let bytes = b.encode().unwrap();
        // A bit per regular timestamp, a bit per repeated value, a few
        // bytes for the constant windows: well under a byte per sample.
        assert!(bytes.len() < 600, "{}", bytes.len());
        assert_eq!(Block::decode(&bytes).unwrap(), b);
    }

    proptest! {
        #[test]
        fn compact_round_trips_bit_exactly(
            start in 0i64..4_000_000_000_000i64,
            deltas in prop::collection::vec(1i64..5_000, 0..200),
            ints in prop::collection::vec(-10_000_000i64..10_000_000, 200),
            scale in 0u32..7,
            noise in prop::collection::vec(any::<f64>(), 200),
            decimal in any::<bool>(),
            wins in prop::collection::vec(any::<u32>(), 200),
            window_kind in 0u8..3,
        ) {
            let mut ts = vec![start];
            for d in &deltas { ts.push(ts.last().unwrap() + d); }
            let n = ts.len();
            let p = 10f64.powi(scale as i32);
            let col: Vec<f64> = if decimal {
                ints[..n].iter().map(|&i| i as f64 / p).collect()
            } else {
                noise[..n].to_vec()
            };
            let windows: Vec<u32> = match window_kind {
                0 => vec![100; n],
                // As a sampler sends them: the gap, sometimes off by a little.
                1 => (0..n)
                    .map(|i| if i == 0 { 100 } else { (ts[i] - ts[i - 1]) as u32 + wins[i] % 3 })
                    .collect(),
                _ => wins[..n].to_vec(),
            };
            let b = Block { ts, cols: vec![col], windows };
            let d = Block::decode(&b.encode_compact().unwrap()).unwrap();
            prop_assert_eq!(&d.ts, &b.ts);
            prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
            prop_assert_eq!(&d.windows, &b.windows);
        }
    }

    #[test]
    fn decimals_pack_smaller_than_xor() {
        // Five-decimal readings with noise, as the simulator's traces.
        let n = 3600;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let col: Vec<f64> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (62_000 + (x % 1000) as i64) as f64 / 1e5
            })
            .collect();
        let b = Block {
            ts: (0..n as i64).map(|i| 1_700_000_000_000 + i * 100).collect(),
            cols: vec![col, vec![-0.0; n], vec![f64::NAN; n]],
            windows: vec![],
        };
        let xor = b.encode().unwrap();
        let dec = b.encode_compact().unwrap();
        assert!(
            dec.len() * 3 < xor.len() * 2,
            "{} vs {}",
            dec.len(),
            xor.len()
        );
        let d = Block::decode(&dec).unwrap();
        for c in 0..3 {
            assert!(same_bits(&d.cols[c], &b.cols[c]), "column {c}");
        }
    }

    #[test]
    fn empty_blocks_round_trip() {
        let b = Block {
            ts: vec![],
            cols: vec![vec![], vec![]],
            windows: vec![],
        };
        assert_eq!(Block::decode(&b.encode().unwrap()).unwrap(), b);
        assert_eq!(Block::decode(&b.encode_compact().unwrap()).unwrap(), b);
    }

    #[test]
    fn truncation_is_an_error() {
        let b = Block {
            ts: vec![1, 2, 3],
            cols: vec![vec![1.0, 2.0, 3.0]],
            windows: vec![],
        };
        let bytes = b.encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(Block::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
    }
}
