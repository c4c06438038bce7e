//! Properties of the (RMS) Moneo eq. 1 distance.

use flopwatch_selector::distance::{moneo_eq1, pairwise_rms, rms_distance};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

fn series() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
    (2usize..60).prop_flat_map(|n| {
        (
            prop::collection::vec(-1000i32..1000, n),
            prop::collection::vec(-1000i32..1000, n),
        )
            .prop_map(|(a, b)| {
                (
                    a.into_iter().map(f64::from).collect(),
                    b.into_iter().map(f64::from).collect(),
                )
            })
    })
}

proptest! {
    #[test]
    fn symmetric((x, y) in series()) {
        let (x, y) = (Array1::from(x), Array1::from(y));
        let a = rms_distance(x.view(), y.view()).unwrap();
        let b = rms_distance(y.view(), x.view()).unwrap();
        prop_assert!((a - b).abs() < 1e-12);
        prop_assert!((0.0..=1.0 + 1e-12).contains(&a));
    }

    #[test]
    fn zero_on_identical((x, _) in series()) {
        let x = Array1::from(x);
        prop_assert_eq!(rms_distance(x.view(), x.view()).unwrap(), 0.0);
        prop_assert_eq!(moneo_eq1(x.view(), x.view()).unwrap(), 0.0);
    }

    #[test]
    fn invariant_to_positive_affine_scaling(
        (x, y) in series(),
        a in 1e-3f64..1e3,
        b in -1e4f64..1e4,
        c in 1e-3f64..1e3,
        d in -1e4f64..1e4,
    ) {
        let (x, y) = (Array1::from(x), Array1::from(y));
        let base = rms_distance(x.view(), y.view()).unwrap();
        let xs = x.mapv(|v| a * v + b);
        let ys = y.mapv(|v| c * v + d);
        let scaled = rms_distance(xs.view(), ys.view()).unwrap();
        prop_assert!((base - scaled).abs() < 1e-9, "{} vs {}", base, scaled);
        // A scaled copy of itself is at distance 0.
        prop_assert!(rms_distance(x.view(), xs.view()).unwrap() < 1e-9);
    }

    #[test]
    fn gram_form_matches_direct_form((x, y) in series()) {
        let (x, y) = (Array1::from(x), Array1::from(y));
        let mut m = Array2::zeros((x.len(), 2));
        for (col, s) in [&x, &y].into_iter().enumerate() {
            let mut c = s.clone();
            flopwatch_selector::distance::normalize_min_max(c.view_mut());
            m.column_mut(col).assign(&c);
        }
        let d = pairwise_rms(m.view());
        let direct = rms_distance(x.view(), y.view()).unwrap();
        prop_assert!((d[[0, 1]] - direct).abs() < 1e-7);
        prop_assert_eq!(d[[0, 0]], 0.0);
    }
}
