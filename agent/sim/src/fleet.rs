//! Which job each simulated GPU runs, and the model that answers queries.

use crate::{mix, window_over, GpuState, SimGpuModel, WindowMean, Workload, TICK_MS};

/// One GPU's plan: its job (if any) and workload.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPlan {
    /// Job name, `None` for an idle GPU.
    pub job: Option<String>,
    /// What the GPU runs.
    pub workload: Workload,
    /// `Some`: the job runs in turns, as batch jobs do — each turn a job of
    /// its own (`<job>-1`, `<job>-2`, …) that ends, and the GPU idles
    /// until the next starts.
    pub turns: Option<Turns>,
}

/// Jobs that start and end on the same GPUs: a turn runs `run_ms`, then the
/// GPU idles `gap_ms`, from the fleet's start on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turns {
    /// How long each job runs, ms.
    pub run_ms: i64,
    /// How long the GPU idles between jobs, ms.
    pub gap_ms: i64,
}

impl Turns {
    /// The turn running `rel_ms` after the start (1-based) and when it
    /// started (ms after the start); `None` in a gap.
    pub fn at(&self, rel_ms: i64) -> Option<(i64, i64)> {
        let period = (self.run_ms + self.gap_ms).max(TICK_MS);
        let k = rel_ms.div_euclid(period);
        (rel_ms.rem_euclid(period) < self.run_ms).then_some((k + 1, k * period))
    }
}

/// The fleet's plan: `nodes` × `gpus` GPUs, several jobs, one regressing.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetPlan {
    /// Nodes in the fleet.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus: usize,
    /// When the regressing job loses efficiency, ms after the start.
    pub regress_after_ms: i64,
    /// `Some`: `gemm-bench` runs as a series of jobs that end
    /// ([`GpuPlan::turns`]).
    pub turns: Option<Turns>,
}

impl FleetPlan {
    /// The default demo fleet shape.
    pub fn new(nodes: usize, gpus: usize, regress_after_ms: i64) -> Self {
        Self {
            nodes,
            gpus,
            regress_after_ms,
            turns: None,
        }
    }

    /// The same fleet with `gemm-bench` run in `turns`.
    pub fn with_turns(mut self, turns: Turns) -> Self {
        self.turns = Some(turns);
        self
    }

    /// The plan for GPU `gpu` of node `node`.
    ///
    /// Jobs: `llm-pretrain` (data-parallel training) on the first 3/8 of
    /// the fleet, `moe-train` (mixture-of-experts training with all-to-all
    /// bursts) on the next 1/8, `gemm-bench` (steady GEMM), `inference` (bursts and idle
    /// gaps), `finetune` (training that regresses 2.5× midway), `notebook`
    /// (GPUs held and left idle, from 1/32 of the fleet up) and a few
    /// unallocated idle GPUs. Small fleets still get every job where they have room.
    /// In a fleet of at least 6 GPUs, the second `llm-pretrain` GPU is a
    /// straggler: it reaches 60 % of its peers' tensor activity (a GPU
    /// held back by, say, thermal throttling).
    pub fn gpu(&self, node: usize, gpu: usize) -> GpuPlan {
        let total = (self.nodes * self.gpus).max(1);
        let flat = node * self.gpus + gpu;
        // Fraction of the fleet before this GPU decides its job.
        let pos = flat as f64 / total as f64;
        let straggler = flat == 1 && total >= 6;
        let (job, workload) = if pos < 0.375 {
            (
                "llm-pretrain",
                Workload::Training {
                    tensor_active: if straggler { 0.62 * 0.6 } else { 0.62 },
                    step_ms: 1200,
                    comm_ms: 180,
                },
            )
        } else if pos < 0.5 {
            (
                "moe-train",
                Workload::Moe {
                    tensor_active: 0.45,
                    step_ms: 1600,
                    comm_ms: 100,
                    a2a_period_ms: 500,
                    a2a_ms: 100,
                },
            )
        } else if pos < 0.625 {
            (
                "gemm-bench",
                Workload::SteadyGemm {
                    tensor_active: 0.78,
                },
            )
        } else if pos < 0.75 {
            (
                "inference",
                Workload::Bursty {
                    tensor_active: 0.35,
                    on_ms: 3000,
                    off_ms: 2000,
                },
            )
        } else if pos < 0.9375 {
            (
                "finetune",
                Workload::Regressing {
                    tensor_active: 0.55,
                    step_ms: 900,
                    comm_ms: 120,
                    after_ms: self.regress_after_ms,
                    factor: 2.5,
                },
            )
        } else if pos < 0.96875 {
            // Allocated and left idle, as a forgotten notebook is.
            ("notebook", Workload::Idle)
        } else {
            return GpuPlan {
                job: None,
                workload: Workload::Idle,
                turns: None,
            };
        };
        GpuPlan {
            job: Some(job.to_string()),
            workload,
            turns: self.turns.filter(|_| job == "gemm-bench"),
        }
    }
}

/// A simulated node's GPUs, answering "state at" and "mean over".
#[derive(Debug, Clone)]
pub struct SimModel {
    /// The GPU model every simulated GPU is.
    pub model: SimGpuModel,
    /// Per-GPU plans.
    pub plans: Vec<GpuPlan>,
    /// Fleet start, unix ms.
    pub start_ms: i64,
    seed: u64,
    node: usize,
}

impl SimModel {
    /// Node `node` of `fleet`, started at `start_ms`, noise seeded by `seed`.
    pub fn new(fleet: &FleetPlan, node: usize, start_ms: i64, seed: u64) -> Self {
        let plans = (0..fleet.gpus).map(|g| fleet.gpu(node, g)).collect();
        Self {
            model: SimGpuModel::h100_sxm(),
            plans,
            start_ms,
            seed,
            node,
        }
    }

    /// A node with explicit plans (tests).
    pub fn with_plans(plans: Vec<GpuPlan>, start_ms: i64, seed: u64) -> Self {
        Self {
            model: SimGpuModel::h100_sxm(),
            plans,
            start_ms,
            seed,
            node: 0,
        }
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.plans.len()
    }

    /// Stable per-node, per-GPU identifier in NVML's UUID format.
    pub fn uuid(&self, gpu: usize) -> String {
        let a = mix(self.seed ^ ((self.node as u64) << 32) ^ gpu as u64);
        let b = mix(a);
        format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            a as u16,
            (b >> 48) as u16,
            b & 0xFFFF_FFFF_FFFF
        )
    }

    fn key(&self, gpu: usize) -> u64 {
        mix(self.seed ^ mix(self.node as u64) ^ mix(gpu as u64 + 1))
    }

    /// The job GPU `gpu` runs at `t_ms` and since when (unix ms): its
    /// plan's job, or the turn running then ([`GpuPlan::turns`]).
    pub fn job_at(&self, gpu: usize, t_ms: i64) -> Option<(String, i64)> {
        let plan = &self.plans[gpu];
        let job = plan.job.as_ref()?;
        match plan.turns {
            None => Some((job.clone(), self.start_ms)),
            Some(turns) => turns
                .at(t_ms - self.start_ms)
                .map(|(k, from)| (format!("{job}-{k}"), self.start_ms + from)),
        }
    }

    /// The workload's state at `tick`, idle in a gap between turns.
    fn state_at_tick(&self, gpu: usize, key: u64, tick: i64) -> GpuState {
        let plan = &self.plans[gpu];
        let rel = tick * TICK_MS - self.start_ms;
        let workload = match plan.turns {
            Some(turns) if turns.at(rel).is_none() => &Workload::Idle,
            _ => &plan.workload,
        };
        workload.state(&self.model, key, self.start_ms, tick)
    }

    /// Instantaneous state at `t_ms` (unix ms): what a point read returns.
    pub fn state_at(&self, gpu: usize, t_ms: i64) -> GpuState {
        self.state_at_tick(gpu, self.key(gpu), t_ms.div_euclid(TICK_MS))
    }

    /// Exact means over `[from_ms, to_ms)`: what a GPM two-sample read or a
    /// hardware-averaged DCGM field returns, plus ground-truth OFU.
    pub fn window(&self, gpu: usize, from_ms: i64, to_ms: i64) -> WindowMean {
        let key = self.key(gpu);
        window_over(from_ms, to_ms, self.model.tensor_clock_mhz as f64, |tick| {
            self.state_at_tick(gpu, key, tick)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_has_every_job_and_a_regression() {
        let f = FleetPlan::new(4, 8, 30_000);
        let jobs: std::collections::BTreeSet<_> = (0..4)
            .flat_map(|n| (0..8).map(move |g| (n, g)))
            .filter_map(|(n, g)| f.gpu(n, g).job)
            .collect();
        assert_eq!(
            jobs.into_iter().collect::<Vec<_>>(),
            vec![
                "finetune",
                "gemm-bench",
                "inference",
                "llm-pretrain",
                "moe-train",
                "notebook"
            ]
        );
    }

    #[test]
    fn gemm_clock_matches_paper_jitter() {
        let m = SimModel::with_plans(
            vec![GpuPlan {
                job: Some("g".into()),
                workload: Workload::SteadyGemm {
                    tensor_active: 0.78,
                },
                turns: None,
            }],
            0,
            7,
        );
        let n = 20_000;
        let clocks: Vec<f64> = (0..n)
            .map(|i| m.state_at(0, i * TICK_MS).sm_clock_mhz)
            .collect();
        let mean = clocks.iter().sum::<f64>() / n as f64;
        let sd = (clocks.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!((mean - 1352.0).abs() < 3.0, "mean {mean}");
        assert!((sd - 32.0).abs() < 2.0, "sd {sd}");
    }

    #[test]
    fn regression_drops_tensor_activity() {
        let f = FleetPlan::new(1, 16, 10_000);
        let m = SimModel::new(&f, 0, 0, 1);
        let ft = (0..16)
            .find(|&g| m.plans[g].job.as_deref() == Some("finetune"))
            .unwrap();
        let before = m.window(ft, 0, 9_000).mean.tensor_active;
        let after = m.window(ft, 11_000, 20_000).mean.tensor_active;
        assert!(
            before / after > 2.3 && before / after < 2.7,
            "{before} {after}"
        );
    }

    #[test]
    fn moe_bursts_and_all_reduce_show_on_infiniband() {
        let f = FleetPlan::new(4, 8, 60_000);
        let m = SimModel::new(&f, 1, 0, 2);
        let job = |g: usize| m.plans[g].job.clone().unwrap_or_default();
        let moe = (0..8).find(|&g| job(g) == "moe-train").unwrap();
        let dp = (0..8).find(|&g| job(g) == "llm-pretrain").unwrap();
        let rates = |g: usize| -> Vec<f64> {
            (0..150)
                .map(|i| m.window(g, i * 100, (i + 1) * 100).mean.ib_rx_bytes_s)
                .collect()
        };
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let moe_rates = rates(moe);
        let peak = moe_rates.iter().cloned().fold(0.0, f64::max);
        // Bursts near line rate, a quiet median between them.
        assert!(peak > 0.8 * crate::IB_ALL_TO_ALL_BYTES_S, "{peak}");
        assert!(peak > 20.0 * median(moe_rates.clone()), "{moe_rates:?}");
        // Three exchanges per 1.6 s step: about 28 in 15 s.
        let bursts = moe_rates
            .windows(2)
            .filter(|w| w[0] < 0.6 * peak && w[1] >= 0.6 * peak)
            .count();
        assert!((20..=30).contains(&bursts), "{bursts}");
        // Data-parallel: all-reduce traffic once per 1.2 s step.
        let dp_rates = rates(dp);
        let dp_peak = dp_rates.iter().cloned().fold(0.0, f64::max);
        assert!(dp_peak > 0.8 * crate::IB_ALL_REDUCE_BYTES_S, "{dp_peak}");
        assert!(dp_peak < crate::IB_ALL_TO_ALL_BYTES_S);
        // An idle GPU's NIC is quiet.
        let idle = SimModel::new(&f, 3, 0, 2);
        assert!(idle.window(7, 0, 10_000).mean.ib_rx_bytes_s < 2e6);
    }

    #[test]
    fn readings_have_the_drivers_resolution() {
        let f = FleetPlan::new(1, 8, 10_000);
        let m = SimModel::new(&f, 0, 0, 3);
        for g in 0..8 {
            for t in (0..5_000).step_by(70) {
                let s = m.state_at(g, t);
                assert_eq!(s.sm_clock_mhz, s.sm_clock_mhz.round(), "{s:?}");
                let mw = (s.power_w * 1000.0).round();
                assert_eq!(s.power_w, mw / 1000.0, "{s:?}");
                assert_eq!(s.mem_used_bytes, s.mem_used_bytes.round(), "{s:?}");
            }
            // A 100 ms window holds ten whole-MHz ticks: the mean is their
            // sum over ten, correctly rounded, as Σ samples / n is.
            let w = m.window(g, 1_000, 1_100).mean.sm_clock_mhz;
            let sum: f64 = (100..110)
                .map(|t| m.state_at(g, t * TICK_MS).sm_clock_mhz)
                .sum();
            assert_eq!(w, sum / 10.0);
        }
    }

    #[test]
    fn steps_follow_their_schedule() {
        let m = SimModel::with_plans(
            vec![GpuPlan {
                job: Some("load".into()),
                workload: Workload::Steps {
                    steps: vec![(1_000, 0.7), (3_000, 0.0), (4_000, 0.3)],
                },
                turns: None,
            }],
            10_000,
            5,
        );
        let tpa = |from: i64, to: i64| m.window(0, 10_000 + from, 10_000 + to).mean.tensor_active;
        assert_eq!(tpa(0, 1_000), 0.0, "idle before the first step");
        assert!(
            (tpa(1_000, 3_000) - 0.7).abs() < 0.005,
            "{}",
            tpa(1_000, 3_000)
        );
        assert_eq!(tpa(3_000, 4_000), 0.0, "idle at a zero step");
        assert!(
            (tpa(4_000, 9_000) - 0.3).abs() < 0.005,
            "{}",
            tpa(4_000, 9_000)
        );
        // A window across a boundary is the time-weighted mix.
        assert!(
            (tpa(2_000, 4_000) - 0.35).abs() < 0.005,
            "{}",
            tpa(2_000, 4_000)
        );
    }

    #[test]
    fn window_is_exact_mean_of_ticks() {
        let f = FleetPlan::new(1, 8, 10_000);
        let m = SimModel::new(&f, 0, 0, 3);
        let w = m.window(0, 1_000, 1_100);
        let manual: f64 = (100..110)
            .map(|t| m.state_at(0, t * TICK_MS).tensor_active)
            .sum::<f64>()
            / 10.0;
        assert!((w.mean.tensor_active - manual).abs() < 1e-12);
    }

    #[test]
    fn jobs_in_turns_end_and_leave_the_gpu_idle() {
        let f = FleetPlan::new(1, 8, 60_000).with_turns(Turns {
            run_ms: 10_000,
            gap_ms: 5_000,
        });
        let m = SimModel::new(&f, 0, 1_000_000, 4);
        let g = (0..8)
            .find(|&g| m.plans[g].job.as_deref() == Some("gemm-bench"))
            .unwrap();
        assert_eq!(
            m.job_at(g, 1_000_000),
            Some(("gemm-bench-1".into(), 1_000_000))
        );
        assert_eq!(
            m.job_at(g, 1_009_999),
            Some(("gemm-bench-1".into(), 1_000_000))
        );
        assert_eq!(m.job_at(g, 1_010_000), None, "ended");
        assert_eq!(
            m.job_at(g, 1_015_000),
            Some(("gemm-bench-2".into(), 1_015_000))
        );
        assert!(m.window(g, 1_000_000, 1_010_000).mean.tensor_active > 0.7);
        assert_eq!(m.window(g, 1_010_000, 1_015_000).mean.tensor_active, 0.0);
        // Other jobs run on.
        let other = (0..8)
            .find(|&o| m.plans[o].job.as_deref() == Some("llm-pretrain"))
            .unwrap();
        assert_eq!(
            m.job_at(other, 1_012_000).map(|j| j.0),
            Some("llm-pretrain".into())
        );
    }
}
