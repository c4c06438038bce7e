//! A simulated GPU node, deterministic in (seed, node, gpu, time).
//!
//! The simulator is the embedded default source of the agent and the engine
//! behind the fake `libnvidia-ml.so`, so both see the same fleet. It models
//! the workloads a realistic node runs:
//!
//! * steady GEMM (high, flat tensor activity),
//! * periodic training steps with communication phases (compute at high
//!   tensor activity, short all-reduce dips with NVLink and InfiniBand
//!   traffic),
//! * mixture-of-experts training whose all-to-all token exchanges send
//!   short bursts near the InfiniBand line rate (Moneo §4.2: MoE needs
//!   more than 100 GB/s of InfiniBand per node),
//! * idle gaps (an inference service with bursts and pauses),
//! * a job whose efficiency regresses midway (OFU paper §VI-A: 2.5×),
//! * SM clock jitter like the OFU paper's 1352 ± 32 MHz under sustained
//!   GEMM (§IV-C).
//!
//! Time is split into ticks of [`TICK_MS`]; every quantity is constant over
//! a tick and derived from a hash of (seed, node, gpu, tick), so any window
//! mean can be computed exactly by summing ticks. That is how GPM works on
//! real hardware (two counter snapshots, the difference is the exact window
//! average), and it is what lets tests compare flopwatch's OFU against the
//! simulator's ground truth.

#![forbid(unsafe_code)]

mod fleet;
mod workload;

pub use fleet::{FleetPlan, GpuPlan, SimModel, Turns};
pub use workload::Workload;
pub use workload::{IB_ALL_REDUCE_BYTES_S, IB_ALL_TO_ALL_BYTES_S};

/// Resolution of the simulation, in milliseconds.
pub const TICK_MS: i64 = 10;

/// Everything one GPU reports at one instant (or averaged over a window).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuState {
    /// Tensor pipe activity, fraction 0..=1 (GPM `AnyTensorUtil` / 100,
    /// DCGM `PIPE_TENSOR_ACTIVE`).
    pub tensor_active: f64,
    /// SM clock in MHz: whole MHz at a tick (the driver's resolution); a
    /// window mean is a mean of whole-MHz samples.
    pub sm_clock_mhz: f64,
    /// Fraction of time at least one warp was resident on an SM.
    pub sm_active: f64,
    /// Resident warps over the maximum.
    pub sm_occupancy: f64,
    /// DRAM bandwidth utilization, 0..=1.
    pub dram_active: f64,
    /// FP16/BF16 pipe (non-tensor) activity.
    pub fp16_active: f64,
    /// FP32 pipe activity.
    pub fp32_active: f64,
    /// FP64 pipe activity.
    pub fp64_active: f64,
    /// Board power in watts, whole milliwatts at a tick.
    pub power_w: f64,
    /// GPU temperature in °C.
    pub temp_c: f64,
    /// Device memory in use, whole bytes.
    pub mem_used_bytes: f64,
    /// NVLink transmit, bytes/s.
    pub nvlink_tx_bytes_s: f64,
    /// NVLink receive, bytes/s.
    pub nvlink_rx_bytes_s: f64,
    /// PCIe transmit, bytes/s.
    pub pcie_tx_bytes_s: f64,
    /// PCIe receive, bytes/s.
    pub pcie_rx_bytes_s: f64,
    /// Memory clock in MHz.
    pub mem_clock_mhz: f64,
    /// InfiniBand transmit of the GPU's NIC (one 400 Gb/s port per GPU,
    /// rail-optimized like a DGX H100), bytes/s.
    pub ib_tx_bytes_s: f64,
    /// InfiniBand receive of the GPU's NIC, bytes/s.
    pub ib_rx_bytes_s: f64,
}

impl GpuState {
    /// Adds `o` × `w` to every field (weighted sums: window means, and a
    /// MIG card as the SM-weighted mix of its instances).
    pub fn add_scaled(&mut self, o: &GpuState, w: f64) {
        self.tensor_active += o.tensor_active * w;
        self.sm_clock_mhz += o.sm_clock_mhz * w;
        self.sm_active += o.sm_active * w;
        self.sm_occupancy += o.sm_occupancy * w;
        self.dram_active += o.dram_active * w;
        self.fp16_active += o.fp16_active * w;
        self.fp32_active += o.fp32_active * w;
        self.fp64_active += o.fp64_active * w;
        self.power_w += o.power_w * w;
        self.temp_c += o.temp_c * w;
        self.mem_used_bytes += o.mem_used_bytes * w;
        self.nvlink_tx_bytes_s += o.nvlink_tx_bytes_s * w;
        self.nvlink_rx_bytes_s += o.nvlink_rx_bytes_s * w;
        self.pcie_tx_bytes_s += o.pcie_tx_bytes_s * w;
        self.pcie_rx_bytes_s += o.pcie_rx_bytes_s * w;
        self.mem_clock_mhz += o.mem_clock_mhz * w;
        self.ib_tx_bytes_s += o.ib_tx_bytes_s * w;
        self.ib_rx_bytes_s += o.ib_rx_bytes_s * w;
    }

    /// Every field divided by `d`.
    pub fn divided(&self, d: f64) -> GpuState {
        GpuState {
            tensor_active: self.tensor_active / d,
            sm_clock_mhz: self.sm_clock_mhz / d,
            sm_active: self.sm_active / d,
            sm_occupancy: self.sm_occupancy / d,
            dram_active: self.dram_active / d,
            fp16_active: self.fp16_active / d,
            fp32_active: self.fp32_active / d,
            fp64_active: self.fp64_active / d,
            power_w: self.power_w / d,
            temp_c: self.temp_c / d,
            mem_used_bytes: self.mem_used_bytes / d,
            nvlink_tx_bytes_s: self.nvlink_tx_bytes_s / d,
            nvlink_rx_bytes_s: self.nvlink_rx_bytes_s / d,
            pcie_tx_bytes_s: self.pcie_tx_bytes_s / d,
            pcie_rx_bytes_s: self.pcie_rx_bytes_s / d,
            mem_clock_mhz: self.mem_clock_mhz / d,
            ib_tx_bytes_s: self.ib_tx_bytes_s / d,
            ib_rx_bytes_s: self.ib_rx_bytes_s / d,
        }
    }
}

/// Exact means over a window, and the ground-truth OFU over it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowMean {
    /// Time-weighted mean of every counter over the window.
    pub mean: GpuState,
    /// Highest per-tick tensor activity seen in the window (the "peak").
    pub peak_tensor_active: f64,
    /// Mean over the window of `tensor_active × min(f_SM, f_max) / f_max`,
    /// computed tick by tick: the ground truth OFU (OFU eq. 1).
    pub ofu: f64,
}

/// A GPU model as the simulator presents it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpuModel {
    /// Marketing name as NVML reports it.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Maximum SM (graphics) clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Tensor-core peak clock, MHz (OFU §IV-D).
    pub tensor_clock_mhz: u32,
    /// Maximum memory clock, MHz.
    pub max_mem_clock_mhz: u32,
    /// Device memory, bytes.
    pub memory_total_bytes: u64,
    /// Board power limit, watts.
    pub power_limit_w: f64,
}

impl SimGpuModel {
    /// The H100 SXM5 80GB, the simulator's default.
    pub fn h100_sxm() -> Self {
        Self {
            name: "NVIDIA H100 80GB HBM3".to_string(),
            sm_count: 132,
            max_sm_clock_mhz: 1980,
            tensor_clock_mhz: 1830,
            max_mem_clock_mhz: 2619,
            memory_total_bytes: 80 * 1024 * 1024 * 1024,
            power_limit_w: 700.0,
        }
    }
}

/// SplitMix64: a tiny, well-distributed hash used for deterministic noise.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from a hash.
pub(crate) fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Standard normal from a hash (Box–Muller on two derived uniforms).
pub(crate) fn normal(h: u64) -> f64 {
    let u1 = unit(mix(h)).max(1e-12);
    let u2 = unit(mix(h ^ 0xA5A5_A5A5_A5A5_A5A5));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Accumulates per-tick states over a window into exact means (and the
/// tick-by-tick ground-truth OFU against `tensor_clock_mhz`), for any
/// per-tick state: a simulated GPU's, or a fake MIG instance's.
pub fn window_over(
    from_ms: i64,
    to_ms: i64,
    tensor_clock_mhz: f64,
    mut state_at_tick: impl FnMut(i64) -> GpuState,
) -> WindowMean {
    let mut out = WindowMean::default();
    if to_ms <= from_ms {
        let s = state_at_tick(from_ms.div_euclid(TICK_MS));
        out.mean = s;
        out.peak_tensor_active = s.tensor_active;
        out.ofu = s.tensor_active * s.sm_clock_mhz.min(tensor_clock_mhz) / tensor_clock_mhz;
        return out;
    }
    // Sums weighted by whole milliseconds, divided once at the end: a mean
    // of integer samples (the SM clock, like the driver's processor-clock
    // samples averaged) is then the correctly rounded quotient, as the
    // agent's NVML path computes it (Σ samples / n).
    let total = (to_ms - from_ms) as f64;
    let mut tick = from_ms.div_euclid(TICK_MS);
    let mut peak = f64::MIN;
    let mut ofu = 0.0;
    let mut sum = GpuState::default();
    while tick * TICK_MS < to_ms {
        let start = (tick * TICK_MS).max(from_ms);
        let end = ((tick + 1) * TICK_MS).min(to_ms);
        let w = (end - start) as f64;
        let s = state_at_tick(tick);
        sum.add_scaled(&s, w);
        peak = peak.max(s.tensor_active);
        ofu += w * s.tensor_active * s.sm_clock_mhz.min(tensor_clock_mhz) / tensor_clock_mhz;
        tick += 1;
    }
    out.mean = sum.divided(total);
    out.peak_tensor_active = peak;
    out.ofu = ofu / total;
    out
}
