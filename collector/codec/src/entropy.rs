//! The entropy stage of sealed chunks: adaptive binary models driving a
//! range coder ([`super::range`], the stream of `constriction`'s), and a
//! coder for signed integer residuals built on them.
//!
//! Every probability is an integer (16 bits) updated by integer arithmetic
//! only, so an encoder and a decoder on any machine see the same model
//! state: a chunk written on one host decodes bit for bit on another.
//!
//! A residual is binarized as in CABAC or LZMA: its bit length (0 for a
//! zero residual) through a binary tree of adaptive models selected by a
//! context — the expected bit length, tracked as a moving average of the
//! recent ones — then the sign, the two bits below the leading one
//! (adaptive, per length) and the remaining low bits at even odds. The
//! cost per residual follows the actual spread of the data (close to the
//! entropy of the noise), and a run of zero residuals (a regular interval,
//! an idle GPU's constant counter) costs a few thousandths of a bit each.

use super::range::{RangeDecoder, RangeEncoder, ONE};
use super::CodecError;

/// Bounds of an adaptive probability: no symbol ever becomes impossible.
const P_MIN: u32 = 32;
/// Adaptation speed: each coded bit moves the probability 1/2^5 of the way.
const ADAPT: u32 = 5;
/// Contexts of the bit-length tree: expected bit lengths 0..CONTEXTS.
const CONTEXTS: usize = 40;
/// Mantissa bits below the leading one coded with adaptive models.
const MANTISSA_MODELLED: u32 = 2;

/// An adaptive binary model: the probability of a 0, in 1/2^16 (kept in
/// 16 bits: it stays within `P_MIN..=ONE - P_MIN`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Model(u16);

impl Default for Model {
    fn default() -> Self {
        Model((ONE / 2) as u16)
    }
}

impl Model {
    #[inline(always)]
    fn p0(self) -> u32 {
        u32::from(self.0)
    }

    #[inline(always)]
    fn update(&mut self, bit: bool) {
        let mut p = u32::from(self.0);
        if bit {
            p -= p >> ADAPT;
        } else {
            p += (ONE - p) >> ADAPT;
        }
        // In range, so it fits in 16 bits.
        self.0 = p.clamp(P_MIN, ONE - P_MIN) as u16;
    }
}

/// Writes bits into one range-coded stream.
pub(crate) struct Encoder {
    rc: RangeEncoder,
}

impl Encoder {
    pub(crate) fn new() -> Self {
        Self {
            rc: RangeEncoder::new(),
        }
    }

    /// Codes `bit` with `m` and adapts `m`.
    #[inline(always)]
    pub(crate) fn bit(&mut self, m: &mut Model, bit: bool) {
        self.rc.encode(bit, m.p0());
        m.update(bit);
    }

    /// Codes the low `n` bits of `v` (high first) at even odds.
    pub(crate) fn even(&mut self, v: u64, n: u32) {
        for i in (0..n).rev() {
            self.rc.encode((v >> i) & 1 == 1, ONE / 2);
        }
    }

    /// The stream's bytes (little-endian 32-bit words).
    pub(crate) fn finish(self) -> Vec<u8> {
        self.rc
            .finish()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }
}

/// Reads bits from one range-coded stream. Past its end the stream reads
/// as zeros; a stream that does not decode is an error, never a panic.
pub(crate) struct Decoder<'a> {
    rc: RangeDecoder<'a>,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Result<Self, CodecError> {
        if !bytes.len().is_multiple_of(4) {
            return Err(CodecError::Corrupt("entropy stream length"));
        }
        Ok(Self {
            rc: RangeDecoder::new(bytes),
        })
    }

    #[inline(always)]
    fn raw(&mut self, p0: u32) -> Result<bool, CodecError> {
        self.rc
            .decode(p0)
            .map_err(|_| CodecError::Corrupt("entropy stream"))
    }

    /// Decodes a bit coded with `m` and adapts `m`.
    #[inline(always)]
    pub(crate) fn bit(&mut self, m: &mut Model) -> Result<bool, CodecError> {
        let b = self.raw(m.p0())?;
        m.update(b);
        Ok(b)
    }

    /// Decodes `n` bits coded by [`Encoder::even`].
    pub(crate) fn even(&mut self, n: u32) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for _ in 0..n {
            v = (v << 1) | u64::from(self.raw(ONE / 2)?);
        }
        Ok(v)
    }
}

/// A binary tree of models, `DEPTH` levels: codes a value in
/// `0..2^DEPTH`; `N` is `2^DEPTH` (node 1 is the root).
#[derive(Clone)]
struct Tree<const DEPTH: u32, const N: usize>([Model; N]);

impl<const DEPTH: u32, const N: usize> Default for Tree<DEPTH, N> {
    fn default() -> Self {
        const { assert!(N == 1 << DEPTH) };
        Tree([Model::default(); N])
    }
}

impl<const DEPTH: u32, const N: usize> Tree<DEPTH, N> {
    fn put(&mut self, enc: &mut Encoder, v: u32) {
        let mut node = 1usize;
        for i in (0..DEPTH).rev() {
            let b = (v >> i) & 1 == 1;
            enc.bit(&mut self.0[node], b);
            node = node * 2 + usize::from(b);
        }
    }

    fn get(&mut self, dec: &mut Decoder<'_>) -> Result<u32, CodecError> {
        let mut node = 1usize;
        for _ in 0..DEPTH {
            let b = dec.bit(&mut self.0[node])?;
            node = node * 2 + usize::from(b);
        }
        Ok(node as u32 - (1 << DEPTH))
    }
}

/// Adaptive models for a sequence of signed integer residuals.
pub(crate) struct Residuals {
    /// Whether r is 0, by context.
    zero: [Model; CONTEXTS],
    /// Bit length of |r| minus one (0..64) by context.
    len: Vec<Tree<6, 64>>,
    sign: [Model; 2],
    /// The bits below the leading one, by bit length.
    mantissa: Vec<[Model; 1 << MANTISSA_MODELLED]>,
    /// Moving average of recent bit lengths (minus their bias), in 1/16.
    avg: i32,
}

impl Default for Residuals {
    fn default() -> Self {
        Self {
            zero: [Model::default(); CONTEXTS],
            len: vec![Tree::default(); CONTEXTS],
            sign: [Model::default(); 2],
            mantissa: vec![[Model::default(); 1 << MANTISSA_MODELLED]; 65],
            avg: 0,
        }
    }
}

/// Bit length of `v`: 0 for 0, 64 for values from 2^63.
fn bit_len(v: u64) -> u32 {
    64 - v.leading_zeros()
}

impl Residuals {
    /// The context for a residual whose expected length is shifted by
    /// `bias` (in 1/16 bit; a mean over a longer window has a wider spread).
    fn context(&self, bias: i32) -> usize {
        ((self.avg + bias + 8) >> 4).clamp(0, CONTEXTS as i32 - 1) as usize
    }

    /// Whether a residual of bit length `len` is far outside the recent
    /// spread (a level change), with the same `bias`.
    fn is_jump(&self, len: u32, bias: i32) -> bool {
        (len as i32) * 16 > self.avg + bias + 4 * 16
    }

    fn learn(&mut self, len: u32, bias: i32) {
        let x = (len as i32) * 16 - bias;
        self.avg += (x - self.avg) / 8;
    }

    /// Codes `r`; returns whether it was a jump ([`Residuals::is_jump`]).
    pub(crate) fn put(&mut self, enc: &mut Encoder, r: i64, bias: i32) -> bool {
        let a = r.unsigned_abs();
        let len = bit_len(a);
        let ctx = self.context(bias);
        enc.bit(&mut self.zero[ctx], len == 0);
        if len > 0 {
            self.len[ctx].put(enc, len - 1);
            enc.bit(&mut self.sign[usize::from(len > 8)], r < 0);
            self.put_mantissa(enc, a, len);
        }
        let jump = self.is_jump(len, bias);
        self.learn(len, bias);
        jump
    }

    fn put_mantissa(&mut self, enc: &mut Encoder, a: u64, len: u32) {
        let below = len - 1;
        let modelled = below.min(MANTISSA_MODELLED);
        let m = &mut self.mantissa[len as usize];
        let mut node = 1usize;
        for i in 0..modelled {
            let b = (a >> (below - 1 - i)) & 1 == 1;
            enc.bit(&mut m[node], b);
            node = node * 2 + usize::from(b);
        }
        enc.even(a, below - modelled);
    }

    /// Decodes a residual coded by [`Residuals::put`] with the same `bias`;
    /// returns it and whether it was a jump.
    pub(crate) fn get(
        &mut self,
        dec: &mut Decoder<'_>,
        bias: i32,
    ) -> Result<(i64, bool), CodecError> {
        let ctx = self.context(bias);
        let len = if dec.bit(&mut self.zero[ctx])? {
            0
        } else {
            self.len[ctx].get(dec)? + 1
        };
        let mut r = 0i64;
        if len > 0 {
            let negative = dec.bit(&mut self.sign[usize::from(len > 8)])?;
            let below = len - 1;
            let modelled = below.min(MANTISSA_MODELLED);
            let m = &mut self.mantissa[len as usize];
            let mut node = 1usize;
            let mut a = 1u64;
            for _ in 0..modelled {
                let b = dec.bit(&mut m[node])?;
                node = node * 2 + usize::from(b);
                a = (a << 1) | u64::from(b);
            }
            let rest = below - modelled;
            a = (a << rest) | dec.even(rest)?;
            // |r| = 2^63 only as i64::MIN.
            r = if negative {
                0i64.wrapping_sub(a as i64)
            } else {
                a as i64
            };
        }
        let jump = self.is_jump(len, bias);
        self.learn(len, bias);
        Ok((r, jump))
    }
}

/// Codes raw 64-bit patterns (values no integer form holds) as the XOR
/// with the previous pattern: its leading zeros through a tree, then the
/// bits below the leading one at even odds.
#[derive(Default)]
pub(crate) struct Patterns {
    zeros: Tree<7, 128>,
}

impl Patterns {
    pub(crate) fn put(&mut self, enc: &mut Encoder, x: u64) {
        let lz = x.leading_zeros();
        self.zeros.put(enc, lz);
        if lz < 64 {
            enc.even(x, 63 - lz);
        }
    }

    pub(crate) fn get(&mut self, dec: &mut Decoder<'_>) -> Result<u64, CodecError> {
        let lz = self.zeros.get(dec)?;
        if lz > 64 {
            return Err(CodecError::Corrupt("pattern"));
        }
        if lz == 64 {
            return Ok(0);
        }
        let below = 63 - lz;
        Ok((1u64 << below) | dec.even(below)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals_round_trip_extremes() {
        let vals = [
            0i64,
            1,
            -1,
            5,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
            -300,
            0,
            0,
            123_456_789,
        ];
        let mut enc = Encoder::new();
        let mut m = Residuals::default();
        let mut p = Patterns::default();
        for (i, &v) in vals.iter().enumerate() {
            m.put(&mut enc, v, i as i32 * 7 - 20);
            p.put(&mut enc, v as u64);
        }
        let bytes = enc.finish();
        let mut dec = Decoder::new(&bytes).unwrap();
        let mut m = Residuals::default();
        let mut p = Patterns::default();
        for (i, &v) in vals.iter().enumerate() {
            assert_eq!(m.get(&mut dec, i as i32 * 7 - 20).unwrap().0, v);
            assert_eq!(p.get(&mut dec).unwrap(), v as u64);
        }
    }

    #[test]
    fn zero_runs_cost_almost_nothing() {
        let mut enc = Encoder::new();
        let mut m = Residuals::default();
        for _ in 0..100_000 {
            m.put(&mut enc, 0, 0);
        }
        let bytes = enc.finish();
        // 100 000 zeros: well under a byte per thousand.
        assert!(bytes.len() < 100, "{}", bytes.len());
    }
}
