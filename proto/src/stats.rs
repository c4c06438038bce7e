//! Summary statistics the agent and the collector both report.
//!
//! One quantile definition for the whole of flopwatch: the collector's
//! OFU percentiles, its event baselines and medians, and the agent's
//! sampling evaluation all rank values the same way, so a p50 in one
//! report means what it means in another.

/// The `q`-quantile (`q` in 0..=1, clamped) of `v` by nearest rank: the
/// value at rank `⌈q·n⌉` (at least 1) of `v` sorted ascending. It is always
/// one of the values, never an average of two: the median of an even
/// number of values is the lower middle one.
///
/// Sorts `v` in place by [`f64::total_cmp`], so NaNs never panic the sort
/// (positive NaNs rank above +∞, negative ones below −∞). `None` when `v`
/// is empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_odd_lengths() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.1), Some(1.0));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut v, 1.0), Some(5.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    /// Where the former definitions parted: on an even count the
    /// collector's event median averaged the middle two (2.5 here) and the
    /// agent's evaluation took index round(q·(n−1)): 3.0 for the median,
    /// 2.0 for the 25th percentile.
    #[test]
    fn even_lengths_take_the_nearest_rank() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&mut v, 0.5), Some(2.0));
        assert_eq!(quantile(&mut v, 0.25), Some(1.0));
        assert_eq!(quantile(&mut v, 0.6), Some(3.0));
        assert_eq!(quantile(&mut v, 0.99), Some(4.0));
        assert_eq!(quantile(&mut [0.25, 0.75], 0.5), Some(0.25));
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
