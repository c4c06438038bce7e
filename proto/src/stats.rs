//! Summary statistics the agent and the collector both report.
//!
//! One quantile definition for the whole of flopwatch: the collector's
//! OFU percentiles, its event baselines and medians, and the agent's
//! sampling evaluation all rank values the same way, so a p50 in one
//! report means what it means in another.

/// The `q`-quantile (`q` in 0..=1, clamped) of `v`, as Prometheus's
/// `quantile` and `quantile_over_time` compute it: the values sorted
/// ascending, rank `q·(n−1)`, linear interpolation between the two values
/// around it. The median of an even number of values is the mean of the
/// middle two; a quantile of one value is that value.
///
/// Sorts `v` in place by [`f64::total_cmp`], so NaNs never panic the sort
/// (positive NaNs rank above +∞, negative ones below −∞). `None` when `v`
/// is empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    let w = rank - lo as f64;
    if w == 0.0 {
        return Some(v[lo]);
    }
    Some(v[lo] * (1.0 - w) + v[hi] * w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_lengths() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut v, 1.0), Some(5.0));
        // Rank 0.4 between 1 and 2.
        assert!((quantile(&mut v, 0.1).unwrap() - 1.4).abs() < 1e-12);
        assert_eq!(quantile(&mut [7.0], 0.3), Some(7.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    /// Where the former definitions parted: on an even count the
    /// collector's event median averaged the middle two, its OFU
    /// percentiles took the nearest rank (2.0 here) and the evaluation
    /// index round(q·(n−1)) (3.0). Prometheus interpolates, and so does
    /// flopwatch everywhere now.
    #[test]
    fn even_lengths_interpolate_as_prometheus_does() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&mut v, 0.5), Some(2.5));
        assert_eq!(quantile(&mut v, 0.25), Some(1.75));
        assert!((quantile(&mut v, 0.99).unwrap() - 3.97).abs() < 1e-12);
        assert_eq!(quantile(&mut [0.25, 0.75], 0.5), Some(0.5));
    }

    #[test]
    fn nan_sorts_without_panic_and_out_of_range_q_clamps() {
        let mut v = vec![f64::NAN, 2.0, 1.0];
        assert_eq!(quantile(&mut v, 0.5), Some(2.0));
        assert!(quantile(&mut v, 1.0).unwrap().is_nan());
        assert_eq!(quantile(&mut v, -3.0), Some(1.0));
        assert!(quantile(&mut v, 7.0).unwrap().is_nan());
    }
}
