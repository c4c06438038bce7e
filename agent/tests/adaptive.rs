//! Adaptive sampler properties (Moneo §2.3) on synthetic captures.

use flopwatch_agent::source::{Capture, GpuCapture, Reading};
use flopwatch_agent::AdaptiveSampler;
use flopwatch_agent::Sampler;
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

/// Changes of a series as `eval` defines them: the trailing 5 s (50
/// captures) peak moving ≥ 10 % from the peak at the previous change.
/// Returns (capture index, rise).
fn reference_changes(xs: &[f64]) -> Vec<(usize, bool)> {
    let mut out = Vec::new();
    let mut reference: Option<f64> = None;
    for k in 50..xs.len() {
        let p = xs[k + 1 - 50..=k].iter().copied().fold(f64::MIN, f64::max);
        match reference {
            None => reference = Some(p),
            Some(r) if (p - r).abs() >= 0.1 * r.abs().max(0.05) => {
                out.push((k, p > r));
                reference = Some(p);
            }
            _ => {}
        }
    }
    out
}

#[test]
fn trigger_change_snaps_every_group_of_the_gpu() {
    let mut s = AdaptiveSampler::new(&cfg(), 4);
    drive(&mut s, 0, 1200, |k| (0.78 + 0.002 * wobble(k), 1352.0));
    assert!(interval(&s, "power_w") > 1000);
    assert!(interval(&s, "dram_active") > 1000);
    drive(&mut s, 1200, 2, |_| (0.3, 1352.0));
    assert_eq!(interval(&s, "tensor_active"), 100);
    assert_eq!(interval(&s, "power_w"), 100);
    assert_eq!(interval(&s, "dram_active"), 100);
}

#[test]
fn read_plan_skips_backed_off_metrics_only() {
    let mut s = AdaptiveSampler::new(&cfg(), 5);
    assert!(s.due(0).wants(0, "power_w"));
    let mut skipped = 0;
    for k in 0..1200i64 {
        let plan = s.due(k * 100);
        assert!(plan.wants(0, "tensor_active"));
        assert!(plan.wants(0, "sm_clock_avg_mhz"));
        assert!(plan.wants(0, "sm_clock_mhz"));
        assert!(plan.wants(1, "power_w"), "an unseen GPU is read");
        skipped += u64::from(!plan.wants(0, "power_w"));
        let mut c = capture(k * 100, 0.78, 1352.0, 700.0);
        c.gpus[0].readings.retain(|r| plan.wants(0, r.metric));
        s.observe(&mut c);
    }
    assert!(skipped > 600, "power_w skipped {skipped} of 1200");
    assert!(s.stats().reads < 5 * 1200 - 600);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A slow drift is caught each time its windowed peak has moved 10 %
    /// from the peak at the previous change (not from the last send).
    #[test]
    fn slow_drift_caught_at_each_ten_percent(seed in 0u64..1000, level in 0.2f64..0.6, up in any::<bool>(), per_min in 0.04f64..0.15) {
        let n = 3000usize;
        let slope = if up { per_min } else { -per_min } / 600.0;
        let xs: Vec<f64> = (0..n)
            .map(|k| level * (1.0 + slope * k as f64) + 0.001 * wobble(k as i64))
            .collect();
        let changes = reference_changes(&xs);
        prop_assume!(!changes.is_empty());
        let mut s = AdaptiveSampler::new(&cfg(), seed);
        let mut at_min = Vec::with_capacity(n);
        let mut longest = 0;
        for (k, &x) in xs.iter().enumerate() {
            let mut c = capture(k as i64 * 100, x, 1352.0, 500.0);
            s.observe(&mut c);
            let i = interval(&s, "tensor_active");
            at_min.push(i <= 100);
            longest = longest.max(i);
        }
        prop_assert!(longest >= 3000, "never backed off: {longest}");
        for (k, rise) in changes {
            let from = if rise { k } else { k.saturating_sub(50) };
            let to = (k + 2).min(n - 1);
            prop_assert!(at_min[from..=to].iter().any(|&m| m), "change at capture {k} (rise {rise}) not caught");
        }
    }

    /// Sends are cut at every minute: a sent sample holds captures of one
    /// minute only (a capture belongs to the minute its end falls in, as
    /// the collector's query grid has it), and OFU over each minute from
    /// the sent samples equals the mean of the per-capture OFUs (clock
    /// below f_max).
    #[test]
    fn minute_windows_exact(seed in 0u64..1000, levels in proptest::collection::vec((0.05f64..0.95, 1000f64..1800.0), 4..40)) {
        let mut s = AdaptiveSampler::new(&cfg(), seed);
        let n = 3600i64;
        let seg = n / levels.len() as i64 + 1;
        let at = |k: i64| {
            let (t, c) = levels[(k / seg) as usize];
            (t + 0.002 * wobble(k), c + 5.0 * wobble(k + 1))
        };
        let mut truth = [0.0f64; 7];
        let mut sent_tpa: Vec<(i64, u32, f64)> = Vec::new();
        let mut sent_clk: Vec<(i64, u32, f64)> = Vec::new();
        for k in 1..=n {
            let (tpa, clk) = at(k);
            let ts = k * 100;
            truth[(ts / 60_000) as usize] += tpa * clk / 1830.0 / 600.0;
            let mut c = capture(ts, tpa, clk, 500.0);
            s.observe(&mut c);
            for r in &c.gpus[0].readings {
                // As the agent's batcher stores it.
                let p = r.point(ts, 100);
                let w = p.window_ms.unwrap_or(100);
                match r.metric {
                    "tensor_active" => sent_tpa.push((p.ts_ms, w, p.value)),
                    "sm_clock_avg_mhz" => sent_clk.push((p.ts_ms, w, p.value)),
                    _ => {}
                }
            }
        }
        prop_assert_eq!(sent_tpa.len(), sent_clk.len());
        // An aggregated clock is a whole number of kilohertz, exactly the
        // double a decimal coder rebuilds.
        let steps = flopwatch_agent::WEIGHTED_CLOCK_STEPS_PER_MHZ;
        for &(ts, _, v) in sent_clk.iter().filter(|c| c.1 > 100) {
            prop_assert_eq!(((v * steps).round() / steps).to_bits(), v.to_bits(), "clock {} at {}", v, ts);
        }
        let mut ofu = [0.0f64; 7];
        for (a, b) in sent_tpa.iter().zip(&sent_clk) {
            prop_assert_eq!((a.0, a.1), (b.0, b.1));
            let (ts, w) = (a.0, i64::from(a.1));
            let minute = ts / 60_000;
            // Its first capture ends 100 ms after the sample's start.
            prop_assert_eq!((ts - w + 100) / 60_000, minute, "sample ({}, {}) holds captures of two minutes", ts, w);
            ofu[minute as usize] += a.2 * b.2 / 1830.0 * w as f64 / 60_000.0;
        }
        // The weighted clock is sent to 1 kHz: each minute's OFU may move
        // by half a kilohertz over the peak clock, and no more.
        let tolerance = 0.5 / flopwatch_agent::WEIGHTED_CLOCK_STEPS_PER_MHZ / 1830.0 + 1e-9;
        for m in 1..6 {
            prop_assert!((ofu[m] - truth[m]).abs() < tolerance, "minute {m}: sent {} vs true {}", ofu[m], truth[m]);
        }
    }

    /// A source that honours the read plan (skipped window means reported
    /// at the next read over the whole span) loses no window mean.
    #[test]
    fn partial_reads_keep_window_means(seed in 0u64..1000, vals in proptest::collection::vec(0.37f64..0.43, 1200..2400)) {
        let mut s = AdaptiveSampler::new(&cfg(), seed);
        let (mut carry_vw, mut carry_w) = (0.0, 0u64);
        let (mut sent_vw, mut sent_w) = (0.0, 0u64);
        for (k, v) in vals.iter().enumerate() {
            let dram = if k % 23 == 0 { *v } else { 0.4 };
            let ts = k as i64 * 100;
            let plan = s.due(ts);
            let mut c = capture(ts, 0.7, 1400.0, 400.0);
            let g = &mut c.gpus[0];
            g.readings.retain(|r| r.metric != "dram_active");
            if plan.wants(0, "dram_active") {
                let mut r = Reading::new("dram_active", (carry_vw + dram * 100.0) / (carry_w + 100) as f64);
                if carry_w > 0 {
                    r.window_ms = Some(u32::try_from(carry_w + 100).unwrap());
                }
                g.readings.push(r);
                (carry_vw, carry_w) = (0.0, 0);
            } else {
                carry_vw += dram * 100.0;
                carry_w += 100;
            }
            s.observe(&mut c);
            for r in &c.gpus[0].readings {
                if r.metric == "dram_active" {
                    let w = r.window_ms.unwrap_or(100);
                    sent_vw += r.value * f64::from(w);
                    sent_w += u64::from(w);
                }
            }
        }
        let n = vals.len() as u64;
        prop_assert!(s.stats().reads < 5 * n - n / 4, "reads {} of {}", s.stats().reads, 5 * n);
        let covered: f64 = vals.iter().enumerate().take((sent_w / 100) as usize)
            .map(|(k, v)| if k % 23 == 0 { *v } else { 0.4 } * 100.0).sum();
        prop_assert!((sent_vw - covered).abs() < 1e-6 * sent_w.max(1) as f64, "{sent_vw} vs {covered}");
    }
}

/// Stopping loses nothing: what a backed-off sampler still holds comes out
/// of `flush`, each sample ending at its last reading, and the sent
/// windows add up to every capture's.
#[test]
fn flush_sends_what_is_held_back() {
    let mut s = AdaptiveSampler::new(&cfg(), 3);
    let mut covered = 0u64;
    let mut last_end = 0;
    let n = 1000;
    for k in 1..=n {
        let mut c = capture(k * 100, 0.6 + 0.002 * wobble(k), 1400.0, 500.0);
        s.observe(&mut c);
        for r in c.gpus[0]
            .readings
            .iter()
            .filter(|r| r.metric == "tensor_active")
        {
            let p = r.point(c.ts_ms, 100);
            covered += u64::from(p.window_ms.unwrap_or(100));
            last_end = p.ts_ms;
        }
    }
    assert!(
        last_end < n * 100 - 1_000,
        "the steady sampler held nothing back"
    );
    let tail = s.flush(n * 100 + 50);
    let r = tail.gpus[0]
        .readings
        .iter()
        .find(|r| r.metric == "tensor_active")
        .expect("a pending tensor_active sample");
    let p = r.point(tail.ts_ms, tail.gpus[0].window_ms);
    assert_eq!(p.ts_ms, n * 100, "ends at the last reading");
    covered += u64::from(p.window_ms.unwrap());
    assert_eq!(covered, n as u64 * 100);
    // Nothing is held twice.
    assert!(s.flush(n * 100 + 100).gpus.is_empty());
}
