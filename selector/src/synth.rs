//! Synthetic traces with known redundancy, for the benchmark and demos.
//!
//! `metrics` metrics over `workloads` workloads, `points` samples each at
//! ~100 ms: every 10th metric is constant (should be dropped); the rest are
//! positive affine copies (different units and offsets) of `metrics / 5`
//! smooth base signals plus 0.5 % noise, so they should fall into groups of
//! about five. Every 3rd metric is sampled at irregular times (±20 ms).

use crate::SampleSet;

/// Deterministic xorshift64* noise.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn signed(&mut self) -> f64 {
        2.0 * self.unit() - 1.0
    }
}

/// Sampling period of the synthetic traces.
pub const STEP_MS: i64 = 100;

/// Build the synthetic sample set (see the module docs).
pub fn fleet_like(metrics: usize, workloads: usize, points: usize, seed: u64) -> SampleSet {
    let mut set = SampleSet::new();
    let bases = (metrics / 5).max(1);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for w in 0..workloads {
        let name = format!("workload-{w}");
        let t0 = w as i64 * 10_000_000;
        // Base signals: smoothed random walks, a fresh one per workload.
        let signals: Vec<Vec<f64>> = (0..bases)
            .map(|_| {
                let (mut x, mut v) = (0.0f64, 0.0f64);
                (0..points)
                    .map(|_| {
                        v = 0.99 * v + 0.1 * rng.signed();
                        x += v;
                        x
                    })
                    .collect()
            })
            .collect();
        let ranges: Vec<(f64, f64)> = signals
            .iter()
            .map(|s| {
                s.iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                        (a.min(v), b.max(v))
                    })
            })
            .collect();
        for m in 0..metrics {
            let metric = format!("metric_{m:03}");
            if m % 10 == 9 {
                for k in 0..points {
                    let t = t0 + k as i64 * STEP_MS;
                    set.push_unchecked(&name, &metric, t, 42.0);
                }
                continue;
            }
            let b = m % bases;
            let (lo, hi) = ranges[b];
            let range = (hi - lo).max(1e-9);
            let scale = 10f64.powi((m % 4) as i32); // units differ
            let offset = (m % 7) as f64 * 100.0;
            let irregular = m % 3 == 0;
            for (k, &x) in signals[b].iter().enumerate() {
                let jitter = if irregular {
                    (rng.signed() * 20.0) as i64
                } else {
                    0
                };
                let t = t0 + (k as i64 * STEP_MS + jitter).max(0);
                let value = scale * ((x - lo) + 0.005 * range * rng.signed()) + offset;
                set.push_unchecked(&name, &metric, t, value);
            }
        }
    }
    set
}
