//! Workload shapes: what a GPU is doing at a given tick.

use crate::{mix, normal, unit, GpuState, SimGpuModel, TICK_MS};
use serde::{Deserialize, Serialize};

/// What a simulated GPU runs. Times are relative to the fleet's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// Nothing running.
    Idle,
    /// Back-to-back large GEMMs at a flat tensor activity.
    SteadyGemm {
        /// Tensor activity while computing, 0..=1.
        tensor_active: f64,
    },
    /// Data-parallel training: compute, then an all-reduce over NVLink.
    Training {
        /// Tensor activity during the compute phase.
        tensor_active: f64,
        /// Step period, ms.
        step_ms: i64,
        /// Communication phase at the end of each step, ms.
        comm_ms: i64,
    },
    /// An inference service: bursts of work separated by idle gaps.
    Bursty {
        /// Tensor activity during a burst.
        tensor_active: f64,
        /// Burst length, ms.
        on_ms: i64,
        /// Idle gap, ms.
        off_ms: i64,
    },
    /// Mixture-of-experts training: compute interleaved with all-to-all
    /// token exchanges (dispatch and combine of the expert layers) that
    /// burst over NVLink and InfiniBand, then a gradient all-reduce at the
    /// end of each step.
    Moe {
        /// Tensor activity during compute.
        tensor_active: f64,
        /// Step period, ms.
        step_ms: i64,
        /// All-reduce at the end of each step, ms.
        comm_ms: i64,
        /// Period of the all-to-all exchanges within a step, ms.
        a2a_period_ms: i64,
        /// Length of one all-to-all exchange, ms.
        a2a_ms: i64,
    },
    /// Training whose efficiency drops by `factor` after `after_ms`
    /// (OFU §VI-A saw 2.5×).
    Regressing {
        /// Tensor activity before the regression.
        tensor_active: f64,
        /// Step period, ms.
        step_ms: i64,
        /// Communication phase, ms.
        comm_ms: i64,
        /// When the regression starts, ms after the fleet's start.
        after_ms: i64,
        /// Divisor applied to tensor activity afterwards.
        factor: f64,
    },
    /// A load that follows a schedule of steps (a load generator telling
    /// the fake driver what it runs): each `(ms, tensor_active)` sets the
    /// tensor activity from `ms` (after the fleet's start) until the next
    /// step, a steady GEMM at that level, or idle at 0. Idle before the
    /// first step. Steps are in time order.
    Steps {
        /// `(ms after the start, tensor activity 0..=1)`, ascending in time.
        steps: Vec<(i64, f64)>,
    },
}

/// InfiniBand traffic of one GPU's NIC during a data-parallel all-reduce
/// (its share of the inter-node ring), bytes/s each way.
pub const IB_ALL_REDUCE_BYTES_S: f64 = 22e9;
/// InfiniBand traffic of one GPU's NIC during an MoE all-to-all: close to
/// the 50 GB/s line rate of a 400 Gb/s (NDR) port, bytes/s each way.
pub const IB_ALL_TO_ALL_BYTES_S: f64 = 46e9;

/// Which collective a GPU is in at one tick.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Comm {
    None,
    AllReduce,
    AllToAll,
}

/// Phase of a workload at one tick, before noise and clocks.
struct Phase {
    tensor: f64,
    busy: f64,
    comm: Comm,
}

impl Workload {
    fn phase(&self, rel_ms: i64) -> Phase {
        let training = |tensor: f64, step: i64, comm: i64| {
            let pos = rel_ms.rem_euclid(step.max(TICK_MS));
            if pos >= step - comm {
                Phase {
                    tensor: tensor * 0.06,
                    busy: 0.35,
                    comm: Comm::AllReduce,
                }
            } else {
                Phase {
                    tensor,
                    busy: 0.97,
                    comm: Comm::None,
                }
            }
        };
        match *self {
            Workload::Idle => Phase {
                tensor: 0.0,
                busy: 0.0,
                comm: Comm::None,
            },
            Workload::SteadyGemm { tensor_active } => Phase {
                tensor: tensor_active,
                busy: 0.99,
                comm: Comm::None,
            },
            Workload::Training {
                tensor_active,
                step_ms,
                comm_ms,
            } => training(tensor_active, step_ms, comm_ms),
            Workload::Bursty {
                tensor_active,
                on_ms,
                off_ms,
            } => {
                let period = (on_ms + off_ms).max(TICK_MS);
                if rel_ms.rem_euclid(period) < on_ms {
                    Phase {
                        tensor: tensor_active,
                        busy: 0.9,
                        comm: Comm::None,
                    }
                } else {
                    Phase {
                        tensor: 0.0,
                        busy: 0.0,
                        comm: Comm::None,
                    }
                }
            }
            Workload::Moe {
                tensor_active,
                step_ms,
                comm_ms,
                a2a_period_ms,
                a2a_ms,
            } => {
                let pos = rel_ms.rem_euclid(step_ms.max(TICK_MS));
                if pos < step_ms - comm_ms
                    && pos.rem_euclid(a2a_period_ms.max(TICK_MS)) >= a2a_period_ms - a2a_ms
                {
                    Phase {
                        tensor: tensor_active * 0.1,
                        busy: 0.5,
                        comm: Comm::AllToAll,
                    }
                } else {
                    training(tensor_active, step_ms, comm_ms)
                }
            }
            Workload::Regressing {
                tensor_active,
                step_ms,
                comm_ms,
                after_ms,
                factor,
            } => {
                let t = if rel_ms >= after_ms {
                    tensor_active / factor.max(1.0)
                } else {
                    tensor_active
                };
                training(t, step_ms, comm_ms)
            }
            Workload::Steps { ref steps } => {
                // The last step at or before this time; idle before the first.
                let at = steps.partition_point(|&(t, _)| t <= rel_ms);
                match at.checked_sub(1).map(|i| steps[i].1.clamp(0.0, 1.0)) {
                    Some(level) if level > 0.0 => Phase {
                        tensor: level,
                        busy: 0.99,
                        comm: Comm::None,
                    },
                    _ => Phase {
                        tensor: 0.0,
                        busy: 0.0,
                        comm: Comm::None,
                    },
                }
            }
        }
    }

    /// The GPU's full state during `tick` (absolute tick index), for a
    /// fleet that started at `start_ms` (unix ms). `key` seeds the noise.
    pub fn state(&self, model: &SimGpuModel, key: u64, start_ms: i64, tick: i64) -> GpuState {
        let rel_ms = tick * TICK_MS - start_ms;
        let p = self.phase(rel_ms);
        let h = mix(key ^ (tick as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
        // Small per-tick wobble in tensor activity (kernel boundaries).
        let tensor = if p.tensor > 0.0 {
            (p.tensor + 0.01 * normal(h ^ 1)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        // SM clock: near max boost when idle, pulled down by power under
        // load; ±32 MHz jitter like OFU §IV-C (1352 ± 32 MHz under GEMM).
        let max_clk = model.max_sm_clock_mhz as f64;
        let load = (tensor / 0.75).min(1.0);
        let clk_target = max_clk - (max_clk - 1352.0) * load;
        let jitter = if load > 0.0 { 32.0 } else { 6.0 };
        // Whole MHz, as the driver reports clocks (`nvmlDeviceGetClockInfo`
        // and the processor-clock samples are integers).
        let sm_clock = (clk_target + jitter * normal(h ^ 2))
            .clamp(210.0, max_clk)
            .round();
        let busy = p.busy;
        let power = 70.0 + (model.power_limit_w - 70.0) * (0.25 * busy + 0.7 * load).min(1.0);
        let (nvlink, ib) = match p.comm {
            Comm::AllReduce => (180e9, IB_ALL_REDUCE_BYTES_S),
            Comm::AllToAll => (140e9, IB_ALL_TO_ALL_BYTES_S),
            // Data loading and checkpoints trickle over the NIC.
            Comm::None => (2e9 * busy, 1e6 + 40e6 * busy),
        };
        GpuState {
            tensor_active: tensor,
            sm_clock_mhz: sm_clock,
            sm_active: (busy * (0.98 + 0.02 * unit(h ^ 3))).min(1.0),
            sm_occupancy: busy * 0.42,
            dram_active: (0.08 + 0.45 * tensor + if p.comm != Comm::None { 0.2 } else { 0.0 })
                .min(1.0)
                * busy.max(0.02),
            fp16_active: 0.03 * busy,
            fp32_active: 0.08 * busy,
            fp64_active: 0.0,
            // Whole milliwatts, as `nvmlDeviceGetPowerUsage` reports.
            power_w: ((power + 8.0 * normal(h ^ 4)) * 1000.0).round() / 1000.0,
            temp_c: 32.0 + 38.0 * (0.3 * busy + 0.7 * load),
            // Whole bytes (`nvmlDeviceGetMemoryInfo`).
            // A service between bursts, or a load between steps, keeps
            // its memory.
            mem_used_bytes: if busy > 0.0
                || matches!(self, Workload::Bursty { .. } | Workload::Steps { .. })
            {
                (0.72 * model.memory_total_bytes as f64).round()
            } else {
                0.6e9
            },
            nvlink_tx_bytes_s: nvlink * (1.0 + 0.02 * normal(h ^ 5)).max(0.0),
            nvlink_rx_bytes_s: nvlink * (1.0 + 0.02 * normal(h ^ 6)).max(0.0),
            pcie_tx_bytes_s: 1.5e9 * busy + 2e6,
            pcie_rx_bytes_s: 3.0e9 * busy + 2e6,
            mem_clock_mhz: model.max_mem_clock_mhz as f64,
            ib_tx_bytes_s: ib * (1.0 + 0.02 * normal(h ^ 7)).max(0.0),
            ib_rx_bytes_s: ib * (1.0 + 0.02 * normal(h ^ 8)).max(0.0),
        }
    }
}
