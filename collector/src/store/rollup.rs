//! Rollup records: an hour's aggregate and its minutes'.

use crate::ofu::Mean;

/// Bytes of one aggregate in a rollup record: the sample count (u64), then
/// weight, weighted sums of OFU (the value, for a raw series), tensor
/// activity and SM clock, min and max (f64), all little-endian — the
/// order of [`Mean::parts`].
const AGG_BYTES: usize = 56;

fn encode_agg(m: &Mean, out: &mut Vec<u8>) {
    let (count, parts) = m.parts();
    out.extend_from_slice(&count.to_le_bytes());
    for f in parts {
        out.extend_from_slice(&f.to_le_bytes());
    }
}

fn decode_agg(b: &[u8]) -> Option<Mean> {
    let b = b.get(..AGG_BYTES)?;
    let u = |i: usize| -> Option<[u8; 8]> { b.get(i * 8..i * 8 + 8)?.try_into().ok() };
    let mut parts = [0.0; 6];
    for (i, f) in parts.iter_mut().enumerate() {
        *f = f64::from_le_bytes(u(i + 1)?);
    }
    Some(Mean::from_parts(u64::from_le_bytes(u(0)?), parts))
}

/// A rollup record: the hour, then the minutes that have samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rollup {
    pub hour: Mean,
    /// Minute index (0..60) and its aggregate.
    pub minutes: Vec<(u8, Mean)>,
}

impl Rollup {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + AGG_BYTES * (1 + self.minutes.len()));
        let mask = self.minutes.iter().fold(0u64, |m, (i, _)| m | (1u64 << i));
        out.extend_from_slice(&mask.to_le_bytes());
        encode_agg(&self.hour, &mut out);
        for (_, a) in &self.minutes {
            encode_agg(a, &mut out);
        }
        out
    }

    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let mask = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        if mask >> 60 != 0 {
            return None;
        }
        let hour = decode_agg(b.get(8..)?)?;
        let mut minutes = Vec::new();
        let mut pos = 8 + AGG_BYTES;
        for i in 0..60u8 {
            if mask & (1 << i) != 0 {
                minutes.push((i, decode_agg(b.get(pos..)?)?));
                pos += AGG_BYTES;
            }
        }
        (pos == b.len()).then_some(Self { hour, minutes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollup record layout that stores already hold: a minute mask,
    /// then 56 bytes per aggregate (count, weight, Σ value, Σ TPA, Σ clock,
    /// min, max, little-endian).
    #[test]
    fn rollup_records_keep_their_byte_layout() {
        let mut hour = Mean::default();
        hour.add(0.5, 0.6, 1500.0, 100);
        hour.add(0.25, 0.3, 1200.0, 300);
        let mut minute = Mean::default();
        minute.add(0.25, 0.3, 1200.0, 300);
        let r = Rollup {
            hour,
            minutes: vec![(7, minute)],
        };
        let mut want = (1u64 << 7).to_le_bytes().to_vec();
        for (count, fs) in [
            (2u64, [400.0, 125.0, 150.0, 510_000.0, 0.25, 0.5]),
            (1, [300.0, 75.0, 90.0, 360_000.0, 0.25, 0.25]),
        ] {
            want.extend_from_slice(&count.to_le_bytes());
            for f in fs {
                want.extend_from_slice(&f64::to_le_bytes(f));
            }
        }
        assert_eq!(r.encode(), want);
        assert_eq!(Rollup::decode(&want), Some(r));
        assert_eq!(Rollup::decode(&want[..want.len() - 1]), None);
    }
}
