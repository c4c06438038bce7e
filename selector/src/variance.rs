//! The unit-free variance measure of the low-variance filter (Moneo §2.2,
//! first step).
//!
//! `v(x) = Var(x) / max_t x_t²`, i.e. the squared ratio of the standard
//! deviation to the series' peak magnitude. It lies in `[0, 1]`, does not
//! change when a metric is rescaled (MHz vs Hz, bytes vs MiB), and is small
//! exactly when the fluctuations are small *compared with the level* the
//! metric sits at: an SM clock jittering 1980 ± 1 MHz is near-constant
//! (`v ≈ 1e-7`), an SM utilisation swinging 0–100 % is not (`v ≈ 0.1`).
//!
//! Why not the alternatives:
//! - variance scaled by the range (`Var / range²`) is blind to amplitude:
//!   pure jitter of 1 MHz on 1980 MHz fills its own range and scores like a
//!   real 0–100 % swing, so nothing near-constant would ever be dropped;
//! - the coefficient of variation (`σ / |mean|`) has the same intent but
//!   diverges for series whose mean is near zero (mostly-idle counters,
//!   signed deltas); dividing by the peak magnitude keeps it bounded.
//!
//! A flat series at exactly zero scores 0.

use ndarray::ArrayView1;

/// `Var(x) / max|x|²` (population variance); 0 for an empty or all-zero series.
pub fn relative_variance(x: ArrayView1<'_, f64>) -> f64 {
    let peak = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if x.is_empty() || peak == 0.0 || !peak.is_finite() {
        return 0.0;
    }
    // Work on x / peak (in [-1, 1]) so squares cannot overflow.
    let n = x.len() as f64;
    let mean = x.iter().map(|v| v / peak).sum::<f64>() / n;
    let var = x.iter().map(|v| (v / peak - mean).powi(2)).sum::<f64>() / n;
    var.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array1};

    #[test]
    fn constant_and_zero_series_score_zero() {
        assert_eq!(relative_variance(array![5.0, 5.0, 5.0].view()), 0.0);
        assert_eq!(relative_variance(array![0.0, 0.0].view()), 0.0);
        assert_eq!(relative_variance(Array1::<f64>::zeros(0).view()), 0.0);
    }

    #[test]
    fn scale_free_and_amplitude_aware() {
        let x = array![0.0, 1.0, 0.0, 1.0];
        let v = relative_variance(x.view());
        assert!((v - 0.25).abs() < 1e-12);
        assert!((relative_variance((&x * 1000.0).view()) - v).abs() < 1e-12);
        // 1 MHz jitter on a 1980 MHz clock is near-constant.
        let clock = array![1979.0, 1981.0, 1979.0, 1981.0];
        assert!(relative_variance(clock.view()) < 1e-6);
    }
}
