//! The range coder of sealed chunks, for binary symbols only.
//!
//! The byte stream is exactly that of `constriction`'s queue range coder
//! (`DefaultRangeEncoder`: 32-bit words, a 64-bit state, 16-bit
//! probabilities), which wrote every format-3 chunk so far; the tests
//! check both ways against it. What this one adds is speed where the
//! chunk codec spends its time, about fourteen binary decisions per
//! value: a symbol is a multiply, an add and a compare inlined into the
//! caller, with no error path on the encoder, and the decoder compares
//! against `scale × p` instead of dividing for a quantile (the same
//! answer for two symbols).

/// Bits of every probability.
pub(crate) const PRECISION: u32 = 16;
/// Probability 1, in 1/2^16.
pub(crate) const ONE: u32 = 1 << PRECISION;
/// While `range` is below this, a word is shifted out (in).
const RENORM: u64 = 1 << 32;

/// Encodes binary symbols; `p0` is always the probability of `false`, in
/// `1..ONE`.
pub(crate) struct RangeEncoder {
    lower: u64,
    range: u64,
    /// Words held back while the carry into them is unknown: how many
    /// and the first one.
    inverted: Option<(usize, u32)>,
    words: Vec<u32>,
}

impl RangeEncoder {
    pub(crate) fn new() -> Self {
        Self {
            lower: 0,
            range: u64::MAX,
            inverted: None,
            words: Vec::new(),
        }
    }

    #[inline(always)]
    pub(crate) fn encode(&mut self, bit: bool, p0: u32) {
        let scale = self.range >> PRECISION;
        let (cum, p) = if bit {
            (u64::from(p0), u64::from(ONE - p0))
        } else {
            (0, u64::from(p0))
        };
        self.range = scale * p;
        let lower = self.lower.wrapping_add(scale * cum);
        if let Some((n, first)) = self.inverted {
            if lower.wrapping_add(self.range) > lower {
                self.resolve(n, first, lower < self.lower);
            }
        }
        self.lower = lower;
        if self.range < RENORM {
            self.shift();
        }
    }

    /// Writes the held-back words once the carry is known.
    #[cold]
    fn resolve(&mut self, n: usize, first: u32, carried: bool) {
        let (first, rest) = if carried {
            (first.wrapping_add(1), 0)
        } else {
            (first, u32::MAX)
        };
        self.words.push(first);
        self.words.extend(std::iter::repeat_n(rest, n - 1));
        self.inverted = None;
    }

    #[inline(always)]
    fn shift(&mut self) {
        self.range <<= 32;
        let word = (self.lower >> 32) as u32;
        self.lower <<= 32;
        match &mut self.inverted {
            Some((n, _)) => *n += 1,
            None if self.lower.wrapping_add(self.range) > self.lower => self.words.push(word),
            None => self.inverted = Some((1, word)),
        }
    }

    /// The compressed words: those written, then the ones that pin the
    /// final range down (none when no symbol was coded).
    pub(crate) fn finish(mut self) -> Vec<u32> {
        if self.range == u64::MAX {
            return self.words;
        }
        let point = self.lower.wrapping_add((1 << 32) - 1);
        if let Some((n, first)) = self.inverted {
            // The point's addition carried past the held-back words or not.
            self.resolve(n, first, point < self.lower);
        }
        let point_word = (point >> 32) as u32;
        let upper_word = (self.lower.wrapping_add(self.range) >> 32) as u32;
        self.words.push(point_word);
        if upper_word == point_word {
            self.words.push(0);
        }
        self.words
    }
}

/// Decodes what [`RangeEncoder`] wrote, given the same probabilities; past
/// the end the stream reads as zeros.
pub(crate) struct RangeDecoder<'a> {
    lower: u64,
    range: u64,
    point: u64,
    /// Little-endian 32-bit words not read yet.
    rest: &'a [u8],
}

/// A stream that cannot have been written by the encoder.
#[derive(Debug)]
pub(crate) struct InvalidStream;

impl<'a> RangeDecoder<'a> {
    /// `bytes` is a whole number of words.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        let mut d = Self {
            lower: 0,
            range: u64::MAX,
            point: 0,
            rest: bytes,
        };
        // Up to two words; fewer leave the low bits zero.
        for _ in 0..2 {
            d.point = (d.point << 32) | u64::from(d.word());
        }
        d
    }

    #[inline(always)]
    fn word(&mut self) -> u32 {
        match self.rest.split_first_chunk::<4>() {
            Some((w, rest)) => {
                self.rest = rest;
                u32::from_le_bytes(*w)
            }
            None => 0,
        }
    }

    #[inline(always)]
    pub(crate) fn decode(&mut self, p0: u32) -> Result<bool, InvalidStream> {
        let scale = self.range >> PRECISION;
        let offset = self.point.wrapping_sub(self.lower);
        // The quantile `offset / scale` is past the last probability.
        if offset >= scale << PRECISION {
            return Err(InvalidStream);
        }
        let split = scale * u64::from(p0);
        let bit = offset >= split;
        if bit {
            self.lower = self.lower.wrapping_add(split);
            self.range = scale * u64::from(ONE - p0);
        } else {
            self.range = split;
        }
        if self.range < RENORM {
            self.lower <<= 32;
            self.range <<= 32;
            self.point = (self.point << 32) | u64::from(self.word());
        }
        Ok(bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use constriction::stream::model::{DecoderModel, EncoderModel, EntropyModel};
    use constriction::stream::queue::{DefaultRangeDecoder, DefaultRangeEncoder};
    use constriction::stream::{Decode, Encode};
    use proptest::prelude::*;
    use std::borrow::Borrow;
    use std::num::NonZeroU32;

    /// One binary symbol for `constriction`, `p0` the probability of false.
    #[derive(Clone, Copy)]
    struct Bit(u32);

    impl EntropyModel<16> for Bit {
        type Symbol = bool;
        type Probability = u32;
    }

    impl EncoderModel<16> for Bit {
        fn left_cumulative_and_probability(
            &self,
            symbol: impl Borrow<bool>,
        ) -> Option<(u32, NonZeroU32)> {
            Some(if *symbol.borrow() {
                (self.0, NonZeroU32::new(ONE - self.0)?)
            } else {
                (0, NonZeroU32::new(self.0)?)
            })
        }
    }

    impl DecoderModel<16> for Bit {
        fn quantile_function(&self, quantile: u32) -> (bool, u32, NonZeroU32) {
            let nz = |p| NonZeroU32::new(p).unwrap_or(NonZeroU32::MIN);
            if quantile < self.0 {
                (false, 0, nz(self.0))
            } else {
                (true, self.0, nz(ONE - self.0))
            }
        }
    }

    fn bytes(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Symbols with probabilities from nearly certain to even, and runs
    /// of likely symbols long enough to hold words back (carries).
    fn symbols() -> impl Strategy<Value = Vec<(bool, u32)>> {
        prop::collection::vec(
            prop_oneof![
                (any::<bool>(), 32u32..=ONE - 32),
                (Just(false), Just(ONE - 32)),
                (Just(true), Just(32)),
                (any::<bool>(), Just(ONE / 2)),
            ],
            0..3000,
        )
    }

    proptest! {
        #[test]
        fn the_stream_is_constrictions(symbols in symbols()) {
            let mut ours = RangeEncoder::new();
            let mut theirs = DefaultRangeEncoder::new();
            for &(bit, p0) in &symbols {
                ours.encode(bit, p0);
                theirs.encode_symbol(bit, Bit(p0)).unwrap();
            }
            let ours = ours.finish();
            let theirs = theirs.into_compressed().unwrap();
            prop_assert_eq!(&ours, &theirs);
            // And each decodes it as the other does.
            let stream = bytes(&ours);
            let mut mine = RangeDecoder::new(&stream);
            let mut other = DefaultRangeDecoder::from_compressed(theirs).unwrap();
            for &(bit, p0) in &symbols {
                prop_assert_eq!(mine.decode(p0).unwrap(), bit);
                prop_assert_eq!(other.decode_symbol(Bit(p0)).unwrap(), bit);
            }
        }

        #[test]
        fn any_bytes_decode_as_constriction_decodes_them(
            words in prop::collection::vec(any::<u32>(), 0..8),
            p0s in prop::collection::vec(32u32..=ONE - 32, 1..200),
        ) {
            let stream = bytes(&words);
            let mut mine = RangeDecoder::new(&stream);
            let mut other = DefaultRangeDecoder::from_compressed(words).unwrap();
            for &p0 in &p0s {
                let (a, b) = (mine.decode(p0), other.decode_symbol(Bit(p0)));
                prop_assert_eq!(a.is_ok(), b.is_ok());
                match (a, b) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                    _ => break,
                }
            }
        }
    }
}
