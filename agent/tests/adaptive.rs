//! Adaptive sampler properties (Moneo §2.3) on synthetic captures.

use flopwatch_agent::adaptive::AdaptiveSampler;
use flopwatch_agent::sampler::Sampler;
use flopwatch_agent::source::{Capture, GpuCapture, Reading};
use flopwatch_config::SamplingConfig;
use proptest::prelude::*;

fn cfg() -> SamplingConfig {
    SamplingConfig {
        adaptive: true,
        ..Default::default()
    }
}

/// One capture of the OFU inputs plus power at `ts`.
fn capture(ts: i64, tpa: f64, clk: f64, power: f64) -> Capture {
    Capture {
        ts_ms: ts,
        gpus: vec![GpuCapture {
            gpu: 0,
            window_ms: 100,
            readings: vec![
                Reading::new("tensor_active", tpa),
                Reading::new("sm_clock_avg_mhz", clk),
                Reading::new("sm_clock_mhz", clk),
                Reading::new("power_w", power),
                Reading::new("dram_active", tpa * 0.5),
            ],
        }],
        ..Default::default()
    }
}

fn interval(s: &AdaptiveSampler, metric: &str) -> u32 {
    s.intervals()
        .into_iter()
        .find(|x| x.2 > 0 && x.1 == metric)
        .map(|x| x.2)
        .unwrap()
}

/// Runs `n` captures of `f(k)`; returns readings sent.
fn drive(s: &mut AdaptiveSampler, from: i64, n: i64, f: impl Fn(i64) -> (f64, f64)) -> u64 {
    let mut sent = 0;
    for k in from..from + n {
        let (tpa, clk) = f(k);
        let mut c = capture(k * 100, tpa, clk, 300.0 + 300.0 * tpa);
        s.observe(&mut c);
        sent += c.gpus[0].readings.len() as u64;
    }
    sent
}

fn wobble(k: i64) -> f64 {
    ((k * 7919) % 13) as f64 / 13.0 - 0.5
}

#[test]
fn steady_backs_off_tenfold() {
    let mut s = AdaptiveSampler::new(&cfg(), 1);
    let n = 6000;
    let sent = drive(&mut s, 0, n, |k| {
        (0.78 + 0.004 * wobble(k), 1352.0 + 20.0 * wobble(k + 3))
    });
    assert!(sent * 10 <= 5 * n as u64, "sent {sent} of {}", 5 * n);
    assert!(interval(&s, "tensor_active") >= 10_000);
}

#[test]
fn training_with_dips_backs_off() {
    let mut s = AdaptiveSampler::new(&cfg(), 2);
    let n = 6000;
    // 1.2 s steps: 10 captures of compute, 2 of all-reduce.
    let sent = drive(&mut s, 0, n, |k| {
        if k % 12 >= 10 {
            (0.04, 1950.0)
        } else {
            (0.62 + 0.004 * wobble(k), 1352.0 + 20.0 * wobble(k))
        }
    });
    assert!(sent * 10 <= 5 * n as u64, "sent {sent} of {}", 5 * n);
}

#[test]
fn step_change_snaps_back() {
    let mut s = AdaptiveSampler::new(&cfg(), 3);
    drive(&mut s, 0, 1200, |_| (0.78, 1352.0));
    assert!(interval(&s, "tensor_active") > 1000);
    drive(&mut s, 1200, 1, |_| (0.45, 1352.0));
    assert!(
        interval(&s, "tensor_active") <= 100 || {
            drive(&mut s, 1201, 1, |_| (0.45, 1352.0));
            interval(&s, "tensor_active") <= 100
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn interval_within_bounds(seed in 0u64..1000, level in 0.1f64..0.9, steps in proptest::collection::vec((0i64..600, 0.05f64..0.95), 0..4)) {
        let c = cfg();
        let mut s = AdaptiveSampler::new(&c, seed);
        for k in 0..3000i64 {
            let v = steps.iter().filter(|x| x.0 * 5 <= k).map(|x| x.1).next_back().unwrap_or(level);
            let mut cap = capture(k * 100, v + 0.003 * wobble(k), 1400.0, 400.0);
            s.observe(&mut cap);
            for (_, _, i) in s.intervals() {
                prop_assert!((100..=30_000).contains(&i), "interval {i}");
            }
        }
    }

    #[test]
    fn change_snaps_within_two_intervals(seed in 0u64..1000, level in 0.2f64..0.9, up in any::<bool>(), rel in 0.11f64..0.8, warm in 300i64..2000) {
        let mut s = AdaptiveSampler::new(&cfg(), seed);
        drive(&mut s, 0, warm, |k| (level + 0.001 * wobble(k), 1352.0));
        let new = if up { (level * (1.0 + rel)).min(1.0) } else { level * (1.0 - rel) };
        prop_assume!((new - level).abs() >= 0.11 * level);
        drive(&mut s, warm, 2, |_| (new, 1352.0));
        prop_assert!(interval(&s, "tensor_active") <= 100);
    }

    #[test]
    fn window_means_preserved(seed in 0u64..1000, vals in proptest::collection::vec(0.0f64..1.0, 50..1500)) {
        let mut s = AdaptiveSampler::new(&cfg(), seed);
        let (mut sent_tpa, mut sent_w, mut all_tpa, mut all_w) = (0.0, 0u64, 0.0, 0u64);
        let n = vals.len();
        for (k, v) in vals.iter().enumerate() {
            // Mostly flat with the generated values as rare excursions.
            let v = if k % 17 == 0 { *v } else { 0.7 };
            let mut c = capture(k as i64 * 100, v, 1400.0, 400.0);
            all_tpa += v * 100.0;
            all_w += 100;
            s.observe(&mut c);
            for r in &c.gpus[0].readings {
                if r.metric == "tensor_active" {
                    let w = r.window_ms.unwrap_or(100);
                    sent_tpa += r.value * f64::from(w);
                    sent_w += u64::from(w);
                }
            }
        }
        // Everything still pending is flushed by one more capture far later
        // only if due; compare what was sent against the captures it covers.
        prop_assert!(sent_w <= all_w);
        let covered: f64 = vals.iter().enumerate().take((sent_w / 100) as usize)
            .map(|(k, v)| if k % 17 == 0 { *v } else { 0.7 } * 100.0).sum();
        prop_assert!((sent_tpa - covered).abs() < 1e-6 * all_w as f64, "{sent_tpa} vs {covered} ({n})");
        let _ = all_tpa;
    }
}
