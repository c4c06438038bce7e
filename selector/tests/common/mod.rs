//! Synthetic workloads with a known answer.
#![allow(dead_code)]

use flopwatch_selector::Row;

/// Deterministic xorshift noise in [-1, 1).
pub(crate) struct Noise(u64);

impl Noise {
    pub(crate) fn new(seed: u64) -> Self {
        Noise(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// A smooth random walk (moving-average of a random walk), deterministic.
pub(crate) fn walk(seed: u64, n: usize) -> Vec<f64> {
    let mut noise = Noise::new(seed);
    let mut x = 0.0;
    let raw: Vec<f64> = (0..n)
        .map(|_| {
            x += noise.next();
            x
        })
        .collect();
    (0..n)
        .map(|i| {
            let lo = i.saturating_sub(10);
            raw[lo..=i].iter().sum::<f64>() / (i - lo + 1) as f64
        })
        .collect()
}

pub(crate) const POINTS: usize = 2000;
pub(crate) const STEP: i64 = 100;

/// Push `values` (one per 100 ms from `t0`) as rows.
pub(crate) fn push(rows: &mut Vec<Row>, workload: &str, metric: &str, t0: i64, values: &[f64]) {
    for (k, &value) in values.iter().enumerate() {
        rows.push(Row {
            workload: workload.to_owned(),
            metric: metric.to_owned(),
            timestamp_ms: t0 + k as i64 * STEP,
            value,
        });
    }
}

/// Two workloads with known redundancy:
/// - dropped: `const_a` (5.0), `const_zero` (0.0), `clock_jitter` (1980 ± 0.5);
/// - group: `base`, `base_dup` (exact), `base_x1000` (×1000 + 3),
///   `base_noisy` (1 % noise), `base_irregular` (irregular timestamps);
/// - group: `other`, `other_w1_only` (copy, recorded only in w1);
/// - alone: `base_very_noisy` (25 % noise), `split_a`/`split_b` (equal in
///   w1, different in w2), `sometimes_flat` (constant in w1, varies in w2).
pub(crate) fn known_truth_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (wi, (w, t0)) in [("w1", 0i64), ("w2", 1_000_000)].into_iter().enumerate() {
        let seed = wi as u64 * 100;
        let period = [400.0, 230.0][wi];
        let base: Vec<f64> = (0..POINTS)
            .map(|k| {
                let t = k as f64;
                50.0 + 30.0 * (t / period * std::f64::consts::TAU).sin()
                    + 10.0 * (t / (period / 3.7) * std::f64::consts::TAU + 1.0).sin()
            })
            .collect();
        let range = 80.0;
        let mut n = Noise::new(seed + 1);
        push(&mut rows, w, "const_a", t0, &[5.0; POINTS]);
        push(&mut rows, w, "const_zero", t0, &[0.0; POINTS]);
        let clock: Vec<f64> = (0..POINTS).map(|_| 1980.0 + 0.5 * n.next()).collect();
        push(&mut rows, w, "clock_jitter", t0, &clock);
        push(&mut rows, w, "base", t0, &base);
        push(&mut rows, w, "base_dup", t0, &base);
        let scaled: Vec<f64> = base.iter().map(|v| v * 1000.0 + 3.0).collect();
        push(&mut rows, w, "base_x1000", t0, &scaled);
        let noisy: Vec<f64> = base.iter().map(|v| v + 0.01 * range * n.next()).collect();
        push(&mut rows, w, "base_noisy", t0, &noisy);
        let very: Vec<f64> = base.iter().map(|v| v + 0.5 * range * n.next()).collect();
        push(&mut rows, w, "base_very_noisy", t0, &very);
        // Same signal, sampled at irregular times around the 100 ms grid.
        for k in 0..POINTS {
            let jitter = (n.next() * 40.0) as i64;
            let t = (k as i64 * STEP + jitter).max(0);
            let f = t as f64 / STEP as f64;
            let value = 50.0
                + 30.0 * (f / period * std::f64::consts::TAU).sin()
                + 10.0 * (f / (period / 3.7) * std::f64::consts::TAU + 1.0).sin();
            rows.push(Row {
                workload: w.to_owned(),
                metric: "base_irregular".to_owned(),
                timestamp_ms: t0 + t,
                value,
            });
        }
        let other = walk(seed + 2, POINTS);
        push(&mut rows, w, "other", t0, &other);
        if wi == 0 {
            push(&mut rows, w, "other_w1_only", t0, &other);
        }
        let s1 = walk(seed + 3, POINTS);
        push(&mut rows, w, "split_a", t0, &s1);
        let s2 = if wi == 0 {
            s1.clone()
        } else {
            walk(seed + 4, POINTS)
        };
        push(&mut rows, w, "split_b", t0, &s2);
        let flat: Vec<f64> = if wi == 0 {
            vec![7.0; POINTS]
        } else {
            (0..POINTS)
                .map(|k| if (k / 150) % 2 == 0 { 2.0 } else { 9.0 })
                .collect()
        };
        push(&mut rows, w, "sometimes_flat", t0, &flat);
    }
    rows
}

pub(crate) fn expected_groups() -> Vec<Vec<&'static str>> {
    vec![
        vec![
            "base",
            "base_dup",
            "base_irregular",
            "base_noisy",
            "base_x1000",
        ],
        vec!["base_very_noisy"],
        vec!["other", "other_w1_only"],
        vec!["sometimes_flat"],
        vec!["split_a"],
        vec!["split_b"],
    ]
}

pub(crate) fn expected_dropped() -> Vec<&'static str> {
    vec!["clock_jitter", "const_a", "const_zero"]
}

/// Write rows as a CSV file.
pub(crate) fn write_csv(path: &std::path::Path, rows: &[Row]) {
    use std::fmt::Write;
    let mut s = String::from("workload,metric,timestamp_ms,value\n");
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{}",
            r.workload, r.metric, r.timestamp_ms, r.value
        );
    }
    std::fs::write(path, s).unwrap();
}
