//! Moneo eq. (1): normalized Euclidean distance between two metrics.
//!
//! The paper divides `x_t − y_t` by `max_t {x_t, y_t}` so that metrics of
//! different magnitude compare. That still tells a metric from its own
//! ×1000 copy (the difference is 999·x). We therefore min-max normalize
//! each series to `[0, 1]` first — after which the eq. 1 divisor is 1
//! whenever either series varies — making the distance invariant to any
//! positive affine change of units (`a·x + b`, `a > 0`). A flat series
//! normalizes to all zeros.
//!
//! Eq. 1 grows like `√T`; the selector thresholds its RMS form
//! `d = eq1 / √T ∈ [0, 1]`, the root-mean-square gap between the two
//! normalized curves, so one threshold fits traces of any length or step.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut1, Zip};

/// Min-max normalize `x` in place to `[0, 1]`; a flat series becomes zeros.
pub fn normalize_min_max(mut x: ArrayViewMut1<'_, f64>) {
    let (lo, hi) = x
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    // Halve before subtracting so that ±1e308 ranges cannot overflow.
    let half_range = hi / 2.0 - lo / 2.0;
    if !(half_range > 0.0 && half_range.is_finite()) {
        x.fill(0.0); // flat (or empty) series
        return;
    }
    x.mapv_inplace(|v| ((v / 2.0 - lo / 2.0) / half_range).clamp(0.0, 1.0));
}

fn normalized(x: ArrayView1<'_, f64>) -> Array1<f64> {
    let mut x = x.to_owned();
    normalize_min_max(x.view_mut());
    x
}

/// Moneo eq. (1) on min-max normalized copies of `x` and `y`:
/// `( Σ_t |(x̂_t − ŷ_t) / max_t{x̂_t, ŷ_t}|² )^½`.
///
/// `None` if the series are empty or of different lengths.
pub fn moneo_eq1(x: ArrayView1<'_, f64>, y: ArrayView1<'_, f64>) -> Option<f64> {
    if x.len() != y.len() || x.is_empty() {
        return None;
    }
    let (x, y) = (normalized(x), normalized(y));
    let peak = x.iter().chain(y.iter()).fold(0.0f64, |m, &v| m.max(v));
    if peak == 0.0 {
        return Some(0.0); // both flat: identical shapes
    }
    let sum: f64 = Zip::from(&x)
        .and(&y)
        .fold(0.0, |acc, a, b| acc + ((a - b) / peak).powi(2));
    Some(sum.sqrt())
}

/// RMS form of eq. (1): `moneo_eq1(x, y) / √T`, in `[0, 1]`. This is the
/// quantity `--distance-threshold` applies to.
pub fn rms_distance(x: ArrayView1<'_, f64>, y: ArrayView1<'_, f64>) -> Option<f64> {
    moneo_eq1(x, y).map(|d| d / (x.len() as f64).sqrt())
}

/// RMS distances between all columns of `m` (`T × k`, columns already
/// normalized to `[0, 1]`), as a symmetric `k × k` matrix.
///
/// Uses `‖a − b‖² = ‖a‖² + ‖b‖² − 2 a·b` with one Gram product `Mᵀ M`,
/// which ndarray computes with a blocked, vectorized kernel.
pub fn pairwise_rms(m: ArrayView2<'_, f64>) -> Array2<f64> {
    let t = m.nrows().max(1) as f64;
    let gram = m.t().dot(&m);
    let norms = gram.diag().to_owned();
    let mut d = gram;
    Zip::indexed(&mut d).for_each(|(i, j), g| {
        *g = if i == j {
            0.0
        } else {
            ((norms[i] + norms[j] - 2.0 * *g).max(0.0) / t).sqrt()
        };
    });
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, stack, Axis};

    #[test]
    fn scaled_copy_is_at_zero_distance() {
        let x = array![1.0, 3.0, 2.0, 5.0];
        let y = x.mapv(|v| v * 1000.0 + 7.0);
        assert!(rms_distance(x.view(), y.view()).unwrap() < 1e-12);
    }

    #[test]
    fn opposite_square_waves_are_at_distance_one() {
        let x = array![0.0, 1.0, 0.0, 1.0];
        let y = array![1.0, 0.0, 1.0, 0.0];
        assert!((rms_distance(x.view(), y.view()).unwrap() - 1.0).abs() < 1e-12);
        assert!((moneo_eq1(x.view(), y.view()).unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn mismatched_lengths_are_none() {
        assert!(rms_distance(array![1.0].view(), array![1.0, 2.0].view()).is_none());
    }

    #[test]
    fn gram_form_matches_direct_form() {
        let cols = [
            array![0.0, 0.5, 1.0, 0.2, 0.9],
            array![1.0, 0.0, 0.3, 0.3, 0.1],
            array![0.0, 0.0, 0.0, 0.0, 0.0],
        ];
        let views: Vec<_> = cols.iter().map(|c| c.view()).collect();
        let m = stack(Axis(1), &views).unwrap();
        let d = pairwise_rms(m.view());
        for i in 0..3 {
            for j in 0..3 {
                let direct = rms_distance(cols[i].view(), cols[j].view()).unwrap();
                assert!((d[[i, j]] - direct).abs() < 1e-12, "{i},{j}");
            }
        }
    }

    #[test]
    fn huge_ranges_do_not_overflow() {
        let mut x = array![-1e308, 1e308, 0.0];
        normalize_min_max(x.view_mut());
        assert_eq!(x, array![0.0, 1.0, 0.5]);
    }
}
