//! Selection on synthetic data whose answer is known.

use crate::common;

use common::*;
use flopwatch_selector::{select, Interpolation, ProgressBar, Row, SelectOptions, Selection};

fn run(rows: Vec<Row>, options: &SelectOptions) -> Selection {
    select(rows, options, &ProgressBar::hidden()).expect("selection succeeds")
}

fn member_sets(sel: &Selection) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = sel.groups.iter().map(|g| g.members.clone()).collect();
    for g in &mut groups {
        g.sort();
    }
    groups.sort();
    groups
}

fn expected() -> Vec<Vec<String>> {
    expected_groups()
        .into_iter()
        .map(|g| g.into_iter().map(String::from).collect())
        .collect()
}

#[test]
fn groups_and_drops_are_exactly_right() {
    let sel = run(known_truth_rows(), &SelectOptions::default());
    assert_eq!(sel.dropped_low_variance, expected_dropped());
    assert_eq!(member_sets(&sel), expected());
    // One kept metric per group, each the group's representative.
    assert_eq!(sel.kept.len(), sel.groups.len());
    for g in &sel.groups {
        assert!(g.members.contains(&g.representative));
        assert!(sel.kept.contains(&g.representative));
    }
}

#[test]
fn same_answer_with_linear_interpolation() {
    let options = SelectOptions {
        interpolation: Interpolation::Linear,
        ..SelectOptions::default()
    };
    let sel = run(known_truth_rows(), &options);
    assert_eq!(sel.dropped_low_variance, expected_dropped());
    assert_eq!(member_sets(&sel), expected());
}

#[test]
fn row_order_does_not_matter() {
    let mut rows = known_truth_rows();
    rows.reverse();
    let a = run(rows, &SelectOptions::default());
    let b = run(known_truth_rows(), &SelectOptions::default());
    assert_eq!(a.groups, b.groups);
    assert_eq!(a.kept, b.kept);
}

#[test]
fn pairs_within_a_group_are_all_under_the_threshold() {
    let sel = run(known_truth_rows(), &SelectOptions::default());
    let d = &sel.details;
    let t = d.options.distance_threshold;
    for g in &sel.groups {
        for a in &g.members {
            for b in &g.members {
                let (i, j) = (
                    d.candidates.binary_search(a).unwrap(),
                    d.candidates.binary_search(b).unwrap(),
                );
                assert!(d.distance[[i, j]] < t, "{a} vs {b}: {}", d.distance[[i, j]]);
            }
        }
    }
    // The split pair is identical in w1 and far apart in w2.
    let i = d.candidates.binary_search(&"split_a".to_owned()).unwrap();
    let j = d.candidates.binary_search(&"split_b".to_owned()).unwrap();
    assert!(d.per_workload[0][[i, j]] < 1e-6);
    assert!(d.per_workload[1][[i, j]] > t);
}

#[test]
fn preference_list_picks_the_representative() {
    let options = SelectOptions {
        prefer: vec!["not_a_metric".into(), "base_x1000".into(), "base".into()],
        ..SelectOptions::default()
    };
    let sel = run(known_truth_rows(), &options);
    let g = sel.groups.iter().find(|g| g.members.len() == 5).unwrap();
    assert_eq!(g.representative, "base_x1000");
    assert!(sel.kept.contains(&"base_x1000".to_owned()));
    assert!(!sel.kept.contains(&"base".to_owned()));
}

#[test]
fn representative_is_highest_variance_then_name() {
    // Exact copies tie on variance: the smallest name wins.
    let mut rows = Vec::new();
    let w = walk(7, 500);
    push(&mut rows, "w", "zeta", 0, &w);
    push(&mut rows, "w", "alpha", 0, &w);
    let sel = run(rows.clone(), &SelectOptions::default());
    assert_eq!(sel.kept, vec!["alpha"]);
    // Same shape, but more spread relative to its peak: wins over the name.
    let mut rows = Vec::new();
    let s: Vec<f64> = (0..500).map(|k| (k as f64 / 20.0).sin()).collect();
    let low: Vec<f64> = s.iter().map(|v| 100.0 + 10.0 * v).collect();
    let high: Vec<f64> = s.iter().map(|v| 11.0 + 10.0 * v).collect();
    push(&mut rows, "w", "b_low", 0, &low);
    push(&mut rows, "w", "z_high", 0, &high);
    let sel = run(rows, &SelectOptions::default());
    assert_eq!(sel.groups.len(), 1);
    assert_eq!(sel.kept, vec!["z_high"]);
}

#[test]
fn a_metric_constant_in_one_workload_is_kept() {
    let sel = run(known_truth_rows(), &SelectOptions::default());
    assert!(sel.kept.contains(&"sometimes_flat".to_owned()));
    let m = sel
        .details
        .metrics
        .iter()
        .find(|m| m.name == "sometimes_flat")
        .unwrap();
    assert_eq!(m.variance[0], Some(0.0));
    assert!(m.variance[1].unwrap() > 0.01);
}

#[test]
fn empty_input_is_an_error_not_a_panic() {
    assert!(select(
        Vec::new(),
        &SelectOptions::default(),
        &ProgressBar::hidden()
    )
    .is_err());
}

#[test]
fn a_single_sample_per_metric_is_dropped_not_a_panic() {
    let rows = vec![
        Row {
            workload: "w".into(),
            metric: "a".into(),
            timestamp_ms: 0,
            value: 1.0,
        },
        Row {
            workload: "w".into(),
            metric: "b".into(),
            timestamp_ms: 0,
            value: 2.0,
        },
    ];
    let sel = run(rows, &SelectOptions::default());
    assert!(sel.kept.is_empty());
    assert_eq!(sel.dropped_low_variance, vec!["a", "b"]);
}

#[test]
fn disjoint_time_windows_are_an_error() {
    let mut rows = Vec::new();
    push(&mut rows, "w", "a", 0, &walk(1, 10));
    push(&mut rows, "w", "b", 10_000, &walk(2, 10));
    let err = select(rows, &SelectOptions::default(), &ProgressBar::hidden()).unwrap_err();
    assert!(err.to_string().contains("workload \"w\""), "{err}");
}

#[test]
fn nan_rows_are_rejected() {
    let rows = vec![Row {
        workload: "w".into(),
        metric: "a".into(),
        timestamp_ms: 0,
        value: f64::NAN,
    }];
    let err = select(rows, &SelectOptions::default(), &ProgressBar::hidden()).unwrap_err();
    assert!(err.to_string().contains("NaN"), "{err}");
}
