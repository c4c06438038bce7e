//! Writes the ground-truth traces in `agent/traces/` from the simulator:
//! `cargo run -p flopwatch-agent --example make_traces [-- OUT_DIR]`.
//!
//! 10 min at 100 ms for one H100; window-mean metrics are the simulator's
//! exact means over each 100 ms window, point metrics its state at the row's
//! time. Workloads the simulator lacks (steps, drift, alternating GEMM,
//! irregular bursts) are built here by switching the simulated workload
//! over time.

use flopwatch_sim::{GpuPlan, SimModel, Workload};
use std::fmt::Write as _;

const STEP_MS: i64 = 100;
const LEN_MS: i64 = 600_000;

fn gemm(t: f64) -> Workload {
    Workload::SteadyGemm { tensor_active: t }
}

fn write(dir: &str, name: &str, workload: impl Fn(i64) -> Workload) {
    let mut s = String::from("timestamp_ms,gpu,metric,value\n");
    for k in 0..=LEN_MS / STEP_MS {
        let ts = k * STEP_MS;
        let m = SimModel::with_plans(
            vec![GpuPlan {
                job: Some("trace".into()),
                workload: workload((ts - STEP_MS).max(0)),
                turns: None,
            }],
            0,
            7,
        );
        let w = m.window(0, ts - STEP_MS, ts);
        let p = m.state_at(0, ts - 1);
        for (metric, v) in [
            ("tensor_active", w.mean.tensor_active),
            ("sm_clock_avg_mhz", w.mean.sm_clock_mhz),
            ("sm_clock_mhz", p.sm_clock_mhz),
            ("power_w", p.power_w),
            ("dram_active", w.mean.dram_active),
        ] {
            let _ = writeln!(s, "{ts},0,{metric},{v:.5}");
        }
    }
    let path = format!("{dir}/{name}.csv");
    std::fs::write(&path, s).expect("write trace");
    println!("wrote {path}");
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "agent/traces".into());
    std::fs::create_dir_all(&dir).expect("create dir");
    write(&dir, "steady_gemm", |_| gemm(0.78));
    write(&dir, "training", |_| Workload::Training {
        tensor_active: 0.62,
        step_ms: 1200,
        comm_ms: 180,
    });
    write(&dir, "step_changes", |t| match t / 1000 {
        0..120 => gemm(0.78),
        120..240 => gemm(0.45),
        240..300 => gemm(0.78),
        300..360 => Workload::Idle,
        360..480 => gemm(0.6),
        _ => gemm(0.3),
    });
    write(&dir, "drift", |t| {
        gemm(0.3 + 0.5 * t as f64 / LEN_MS as f64)
    });
    // OFU paper Table I "Alt.": 16384² and 4096² GEMMs alternating every 10 s.
    write(&dir, "alternating_gemm", |t| {
        if (t / 10_000) % 2 == 0 {
            gemm(0.78)
        } else {
            gemm(0.45)
        }
    });
    // Idle with short inference bursts (0.5–3 s) at irregular gaps (15–45 s).
    let mut bursts = Vec::new();
    let (mut t, mut h) = (5_000i64, 0x9E37_79B9u64);
    while t < LEN_MS {
        h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 500 + ((h >> 33) % 26) as i64 * 100;
        bursts.push((t, t + len));
        h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        t += len + 15_000 + ((h >> 33) % 301) as i64 * 100;
    }
    write(&dir, "idle_bursts", move |t| {
        if bursts.iter().any(|&(a, b)| t >= a && t < b) {
            gemm(0.35)
        } else {
            Workload::Idle
        }
    });
}
