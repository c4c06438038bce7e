//! The entropy stage of sealed chunks: adaptive binary models driving
//! `constriction`'s range coder, and a coder for signed integer residuals
//! built on them.
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

use super::CodecError;
use constriction::stream::model::{DecoderModel, EncoderModel, EntropyModel};
use constriction::stream::queue::{DefaultRangeDecoder, DefaultRangeEncoder};
use constriction::stream::{Decode, Encode};
use std::borrow::Borrow;
use std::num::NonZeroU32;

/// Bits of every probability.
const PRECISION: usize = 16;
const ONE: u32 = 1 << PRECISION;
/// Bounds of an adaptive probability: no symbol ever becomes impossible.
const P_MIN: u32 = 32;
/// Adaptation speed: each coded bit moves the probability 1/2^5 of the way.
const ADAPT: u32 = 5;
/// Contexts of the bit-length tree: expected bit lengths 0..CONTEXTS.
const CONTEXTS: usize = 40;
/// Mantissa bits below the leading one coded with adaptive models.
const MANTISSA_MODELLED: u32 = 2;

/// The frozen state of one binary model for one coding step.
#[derive(Clone, Copy)]
struct Bit {
    p0: u32,
}

fn nonzero(p: u32) -> NonZeroU32 {
    // p is in [P_MIN, ONE - P_MIN] by construction; MIN keeps this total.
    NonZeroU32::new(p).unwrap_or(NonZeroU32::MIN)
}

impl EntropyModel<PRECISION> for Bit {
    type Symbol = bool;
    type Probability = u32;
}

impl EncoderModel<PRECISION> for Bit {
    fn left_cumulative_and_probability(
        &self,
        symbol: impl Borrow<bool>,
    ) -> Option<(u32, NonZeroU32)> {
        Some(if *symbol.borrow() {
            (self.p0, nonzero(ONE - self.p0))
        } else {
            (0, nonzero(self.p0))
        })
    }
}

impl DecoderModel<PRECISION> for Bit {
    fn quantile_function(&self, quantile: u32) -> (bool, u32, NonZeroU32) {
        if quantile < self.p0 {
            (false, 0, nonzero(self.p0))
        } else {
            (true, self.p0, nonzero(ONE - self.p0))
        }
    }
}

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
    fn frozen(self) -> Bit {
        Bit {
            p0: u32::from(self.0),
        }
    }

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

const EVEN: Bit = Bit { p0: ONE / 2 };

/// Writes bits into one range-coded stream.
pub(crate) struct Encoder {
    rc: DefaultRangeEncoder,
    failed: bool,
}

impl Encoder {
    pub(crate) fn new() -> Self {
        Self {
            rc: DefaultRangeEncoder::new(),
            failed: false,
        }
    }

    fn raw(&mut self, bit: bool, model: Bit) {
        // Fails only for a symbol of probability zero, which no model has.
        self.failed |= self.rc.encode_symbol(bit, model).is_err();
    }

    /// Codes `bit` with `m` and adapts `m`.
    pub(crate) fn bit(&mut self, m: &mut Model, bit: bool) {
        self.raw(bit, m.frozen());
        m.update(bit);
    }

    /// Codes the low `n` bits of `v` (high first) at even odds.
    pub(crate) fn even(&mut self, v: u64, n: u32) {
        for i in (0..n).rev() {
            self.raw((v >> i) & 1 == 1, EVEN);
        }
    }

    /// The stream's bytes (little-endian 32-bit words).
    pub(crate) fn finish(self) -> Result<Vec<u8>, CodecError> {
        if self.failed {
            return Err(CodecError::Corrupt("entropy coder"));
        }
        let words = self
            .rc
            .into_compressed()
            .map_err(|_| CodecError::Corrupt("entropy coder"))?;
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}

/// Reads bits from one range-coded stream. Past its end the stream reads
/// as zeros; a stream that does not decode is an error, never a panic.
pub(crate) struct Decoder {
    rc: DefaultRangeDecoder,
}

impl Decoder {
    pub(crate) fn new(bytes: &[u8]) -> Result<Self, CodecError> {
        if !bytes.len().is_multiple_of(4) {
            return Err(CodecError::Corrupt("entropy stream length"));
        }
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let rc = DefaultRangeDecoder::from_compressed(words)
            .map_err(|_| CodecError::Corrupt("entropy stream"))?;
        Ok(Self { rc })
    }

    fn raw(&mut self, model: Bit) -> Result<bool, CodecError> {
        self.rc
            .decode_symbol(model)
            .map_err(|_| CodecError::Corrupt("entropy stream"))
    }

    /// Decodes a bit coded with `m` and adapts `m`.
    pub(crate) fn bit(&mut self, m: &mut Model) -> Result<bool, CodecError> {
        let b = self.raw(m.frozen())?;
        m.update(b);
        Ok(b)
    }

    /// Decodes `n` bits coded by [`Encoder::even`].
    pub(crate) fn even(&mut self, n: u32) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for _ in 0..n {
            v = (v << 1) | u64::from(self.raw(EVEN)?);
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

    fn get(&mut self, dec: &mut Decoder) -> Result<u32, CodecError> {
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
    pub(crate) fn get(&mut self, dec: &mut Decoder, bias: i32) -> Result<(i64, bool), CodecError> {
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

    pub(crate) fn get(&mut self, dec: &mut Decoder) -> Result<u64, CodecError> {
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
        let bytes = enc.finish().unwrap();
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
        let bytes = enc.finish().unwrap();
        // 100 000 zeros: well under a byte per thousand.
        assert!(bytes.len() < 100, "{}", bytes.len());
    }
}
