//! Opt-in storage precision (`[storage.precision]` in collector.toml): a
//! metric's values rounded to a declared resolution when its hours are
//! compacted, like VictoriaMetrics' `-precisionBits`. Lossless (no metric
//! listed) by default.
//!
//! The resolution is a power of ten, `10^-d`, and a value is rounded the
//! way the sealed-chunk codec divides (`round(v · 10^d) / 10^d`), so a
//! rounded value is an exact decimal the codec stores as a small integer.
//! A rounded value is what every later read returns; the head (samples not
//! yet compacted) still holds the values as received.

use flopwatch_proto::metrics as m;
use std::collections::BTreeMap;

/// Decimal places per metric.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Precision(BTreeMap<String, i32>);

/// `v` rounded to a multiple of `10^-d`; non-finite values as they are.
pub fn round_decimals(v: f64, d: i32) -> f64 {
    if !v.is_finite() {
        return v;
    }
    let p = 10f64.powi(d.abs());
    let r = if d >= 0 {
        (v * p).round() / p
    } else {
        (v / p).round() * p
    };
    // −0.0 and 0.0 are the same reading; +0.0 is the cheaper to store.
    if r == 0.0 {
        0.0
    } else if r.is_finite() {
        r
    } else {
        v
    }
}

impl Precision {
    /// From `[storage.precision]` as decimal places (see
    /// `StorageConfig::precision_decimals`).
    pub fn new(decimals: BTreeMap<String, i32>) -> Self {
        Self(decimals)
    }

    /// Whether every value is kept as received.
    pub fn is_lossless(&self) -> bool {
        self.0.is_empty()
    }

    /// Decimal places `metric` is kept at, if it is rounded.
    pub fn decimals(&self, metric: &str) -> Option<i32> {
        self.0.get(metric).copied()
    }

    /// `v` of `metric` as stored.
    pub fn round(&self, metric: &str, v: f64) -> f64 {
        self.decimals(metric).map_or(v, |d| round_decimals(v, d))
    }

    /// Whether an OFU chunk's inputs (tensor activity, an SM clock) are
    /// rounded.
    pub fn touches_ofu(&self) -> bool {
        [m::TENSOR_ACTIVE, m::SM_CLOCK_AVG_MHZ, m::SM_CLOCK_MHZ]
            .iter()
            .any(|x| self.0.contains_key(*x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_exact_decimals() {
        assert_eq!(round_decimals(0.620_43, 3), 0.62);
        assert_eq!(round_decimals(585.423, 0), 585.0);
        assert_eq!(round_decimals(1463.7, -1), 1460.0);
        assert_eq!(round_decimals(-0.0004, 3).to_bits(), 0.0f64.to_bits());
        assert!(round_decimals(f64::NAN, 2).is_nan());
        let p = Precision::new([("power_w".to_string(), 0)].into());
        assert_eq!(p.round("power_w", 585.6), 586.0);
        assert_eq!(p.round("tensor_active", 0.620_43), 0.620_43);
        assert!(!p.touches_ofu());
    }
}
