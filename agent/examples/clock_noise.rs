//! OFU paper Table I on the simulator: how much does sampling the SM clock
//! at a point, rather than averaging it over the window, add to the OFU
//! error when a 1 s baseline is subsampled at 5/10/20/30 s?
//! `cargo run --release -p flopwatch-agent --example clock_noise`.
//!
//! Baseline: OFU over each 1-min window from 1 s samples (TPA and clock
//! window means). Subsampled at k s: TPA is the window mean over k s; the
//! clock is either a point read at the sample time or its k s window mean.
//! Error = subsampled − baseline OFU per 1-min window, in pp; σ and the
//! 2.5–97.5 % interval over all windows of a 2 h run.

use flopwatch_sim::{GpuPlan, SimModel, Workload};

const FMAX: f64 = 1830.0;

type Case = (&'static str, Box<dyn Fn(i64) -> Workload>);

fn ofu(t: f64, c: f64) -> f64 {
    t.clamp(0.0, 1.0) * c.clamp(0.0, FMAX) / FMAX
}

fn main() {
    let hours = 2i64;
    let cases: [Case; 2] = [
        (
            "steady GEMM",
            Box::new(|_| Workload::SteadyGemm {
                tensor_active: 0.78,
            }),
        ),
        (
            "alternating 16384/4096 (10 s)",
            Box::new(|t| Workload::SteadyGemm {
                tensor_active: if (t / 10_000) % 2 == 0 { 0.78 } else { 0.45 },
            }),
        ),
    ];
    println!(
        "{:<32} {:>4} {:>10} {:>22} {:>10} {:>22}",
        "workload", "k s", "σ point", "95% point", "σ window", "95% window"
    );
    for (name, wl) in &cases {
        // One model per workload phase, switched by time.
        let model = |t: i64| {
            SimModel::with_plans(
                vec![GpuPlan {
                    job: None,
                    workload: wl(t),
                    turns: None,
                }],
                0,
                11,
            )
        };
        let end = hours * 3_600_000;
        // 1 s baseline.
        let base: Vec<f64> = (0..end / 1000)
            .map(|s| {
                let m = model(s * 1000);
                let w = m.window(0, s * 1000, (s + 1) * 1000);
                ofu(w.mean.tensor_active, w.mean.sm_clock_mhz)
            })
            .collect();
        for k in [5i64, 10, 20, 30] {
            let (mut ep, mut ew) = (Vec::new(), Vec::new());
            for win in 0..end / 60_000 {
                let b: f64 = base[(win * 60) as usize..((win + 1) * 60) as usize]
                    .iter()
                    .sum::<f64>()
                    / 60.0;
                let (mut sp, mut sw, mut n) = (0.0, 0.0, 0.0);
                let mut t = win * 60_000 + k * 1000;
                while t <= (win + 1) * 60_000 {
                    // Window mean over k s (exact over ticks, as GPM reads it);
                    // phases change on 10 s boundaries so split per second.
                    let (mut tpa, mut clk) = (0.0, 0.0);
                    for s in 0..k {
                        let a = t - k * 1000 + s * 1000;
                        let w = model(a).window(0, a, a + 1000);
                        tpa += w.mean.tensor_active / k as f64;
                        clk += w.mean.sm_clock_mhz / k as f64;
                    }
                    let point = model(t - 1).state_at(0, t - 1).sm_clock_mhz;
                    sp += ofu(tpa, point);
                    sw += ofu(tpa, clk);
                    n += 1.0;
                    t += k * 1000;
                }
                ep.push(100.0 * (sp / n - b));
                ew.push(100.0 * (sw / n - b));
            }
            let stats = |v: &mut Vec<f64>| {
                let m = v.iter().sum::<f64>() / v.len() as f64;
                let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
                v.sort_by(f64::total_cmp);
                let q = |p: f64| v[((p * (v.len() - 1) as f64).round()) as usize];
                (sd, q(0.025), q(0.975))
            };
            let (sp, lp, hp) = stats(&mut ep);
            let (sw, lw, hw) = stats(&mut ew);
            println!(
                "{name:<32} {k:>4} {sp:>10.3} {:>22} {sw:>10.3} {:>22}",
                format!("[{lp:.3}, {hp:.3}]"),
                format!("[{lw:.3}, {hw:.3}]")
            );
        }
    }
}
