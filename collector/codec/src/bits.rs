//! Bit-level primitives of the block formats: varints, zigzag, bit
//! writers and readers, Gorilla XOR columns, group bit-packing, decimal
//! columns and delta-of-delta timestamps (formats 1 and 2).

use super::{CodecError, GROUP};

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes `b` as its length (a varint) and the bytes, as
/// [`Reader::bytes`] reads them.
pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Bytes [`put_varint`] writes for `v`.
pub(super) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn u8(&mut self) -> Result<u8, CodecError> {
        let b = *self.buf.get(self.pos).ok_or(CodecError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn varint(&mut self) -> Result<u64, CodecError> {
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

    /// A run of bytes written as its length (a varint) and the bytes;
    /// `what` names the length in the error when it cannot be one.
    pub(super) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], CodecError> {
        let len = usize::try_from(self.varint()?).map_err(|_| CodecError::Corrupt(what))?;
        let end = self.pos.checked_add(len).ok_or(CodecError::Truncated)?;
        let b = self.buf.get(self.pos..end).ok_or(CodecError::Truncated)?;
        self.pos = end;
        Ok(b)
    }
}

pub(super) struct BitWriter {
    pub(super) out: Vec<u8>,
    pub(super) used: u8,
}

impl BitWriter {
    /// Appends the low `n` bits of `v` (`n` ≤ 64), high first, filling
    /// each byte from its top bit: a byte at a time.
    pub(super) fn bits(&mut self, v: u64, n: u8) {
        let mut n = u32::from(n.min(64));
        while n > 0 {
            if self.used == 0 {
                self.out.push(0);
            }
            let free = 8 - u32::from(self.used);
            let take = free.min(n);
            let chunk = ((v >> (n - take)) & ((1u64 << take) - 1)) as u8;
            let last = self.out.len() - 1;
            self.out[last] |= chunk << (free - take);
            self.used = ((u32::from(self.used) + take) % 8) as u8;
            n -= take;
        }
    }
}

pub(super) struct BitReader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) bit: usize,
}

impl BitReader<'_> {
    /// Reads `n` bits (`n` ≤ 64), high first: a byte at a time.
    pub(super) fn bits(&mut self, n: u8) -> Result<u64, CodecError> {
        let mut n = u32::from(n.min(64));
        let mut v = 0u64;
        while n > 0 {
            let byte = *self.buf.get(self.bit / 8).ok_or(CodecError::Truncated)?;
            let avail = 8 - (self.bit % 8) as u32;
            let take = avail.min(n);
            let chunk = (u32::from(byte) >> (avail - take)) & ((1 << take) - 1);
            v = (v << take) | u64::from(chunk);
            self.bit += take as usize;
            n -= take;
        }
        Ok(v)
    }
}

pub(super) fn encode_xor(out: &mut Vec<u8>, col: &[f64]) {
    if let Some(stream) = xor_stream(col, usize::MAX) {
        put_bytes(out, &stream);
    }
}

/// The XOR stream of `col`; `None` as soon as it grows past `limit`
/// bytes (a caller that only wants it if it is the smaller of two).
pub(super) fn xor_stream(col: &[f64], limit: usize) -> Option<Vec<u8>> {
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
        if w.out.len() > limit {
            return None;
        }
    }
    Some(w.out)
}

pub(super) fn decode_xor(r: &mut Reader<'_>, n: usize) -> Result<Vec<f64>, CodecError> {
    let buf = r.bytes("column length")?;
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
pub(super) fn pack_groups(w: &mut BitWriter, vals: &[u64]) {
    for g in vals.chunks(GROUP) {
        let width = g.iter().map(|d| 64 - d.leading_zeros()).max().unwrap_or(0) as u8;
        w.bits(u64::from(width), 7);
        for &d in g {
            w.bits(d, width);
        }
    }
}

/// Reads `n` values written by [`pack_groups`].
pub(super) fn unpack_groups(br: &mut BitReader<'_>, n: usize) -> Result<Vec<u64>, CodecError> {
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
pub(super) fn decimal_scale(col: &[f64]) -> Option<(u8, Vec<i64>)> {
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

pub(super) fn encode_decimal(out: &mut Vec<u8>, scale: u8, ints: &[i64]) {
    out.push(scale);
    let Some(&first) = ints.first() else { return };
    put_varint(out, zigzag(first));
    let mut w = BitWriter {
        out: Vec::with_capacity(ints.len()),
        used: 0,
    };
    let deltas: Vec<u64> = ints.windows(2).map(|p| zigzag(p[1] - p[0])).collect();
    pack_groups(&mut w, &deltas);
    put_bytes(out, &w.out);
}

pub(super) fn decode_decimal(r: &mut Reader<'_>, n: usize) -> Result<Vec<f64>, CodecError> {
    let scale = r.u8()?;
    if scale > 9 {
        return Err(CodecError::Corrupt("decimal scale"));
    }
    let p = 10f64.powi(i32::from(scale));
    let first = unzigzag(r.varint()?);
    let buf = r.bytes("column length")?;
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
pub(super) fn encode_ts(out: &mut Vec<u8>, ts: &[i64]) {
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
    put_bytes(out, &w.out);
}

pub(super) fn decode_ts(r: &mut Reader<'_>, n: usize) -> Result<Vec<i64>, CodecError> {
    let first = unzigzag(r.varint()?);
    let buf = r.bytes("ts length")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixed_bytes_round_trip_and_stop_at_the_end() {
        let mut out = Vec::new();
        put_bytes(&mut out, b"abc");
        put_bytes(&mut out, &[]);
        out.push(7);
        let mut r = Reader { buf: &out, pos: 0 };
        assert_eq!(r.bytes("x"), Ok(&b"abc"[..]));
        assert_eq!(r.bytes("x"), Ok(&[][..]));
        assert_eq!(r.u8(), Ok(7));
        // A length past the end of the buffer, or past any buffer, is a
        // truncation, never a panic.
        for len in [5, u64::MAX] {
            let mut bad = Vec::new();
            put_varint(&mut bad, len);
            bad.extend_from_slice(b"ab");
            let mut r = Reader { buf: &bad, pos: 0 };
            assert_eq!(r.bytes("x"), Err(CodecError::Truncated), "{len}");
        }
    }
}
