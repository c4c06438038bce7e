//! The simulated node: the embedded default source.
//!
//! Window-mean metrics are the simulator's exact means since the previous
//! capture (as GPM would report them); point metrics are the state at the
//! capture instant, so the SM clock shows the OFU paper's ±32 MHz jitter.
//! Values have the driver's resolution: clocks in whole MHz (the averaged
//! clock a mean of whole-MHz samples), power in whole milliwatts,
//! temperature in whole °C, memory in whole bytes. The fields of
//! dcgm-exporter's default set the model has no state for are derived:
//! memory temperature 4 °C above the GPU's, a fixed driver reservation
//! ([`SIM_RESERVED_BYTES`]) and the rest of memory free, graphics-engine
//! activity between SM activity and GPU utilization (√ of SM activity),
//! memory copy utilization equal to DRAM activity, an idle video encoder
//! and decoder, no PCIe replay and no remapped row.
//!
//! With [`SimSource::with_pids`] a GPU that runs a job also reports one
//! compute process, PID `base + gpu index` (the fake NVML library's
//! convention with base 10 000), so job attribution can be exercised
//! against a fake `/proc` tree. Off by default: on a real host those PIDs
//! belong to unrelated processes.
//!
//! What real nodes do, on request ([`SimHarshness`], `[sim]` in
//! `agent.toml`): jobs that end and start on the same GPUs (the fleet's
//! [`Turns`](flopwatch_sim::Turns)), profiling fields that leave for a
//! while (DCGM's profiling module stopped: tensor and pipe activity and
//! the averaged clock are missing, the device fields stay), a source that
//! does not answer for a while after the start, and a GPU two processes
//! share (a second PID, `base + 1000 + gpu`).

use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use crate::sampler::{PlanCarry, ReadPlan};
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{GpuInfo, JobAssignment, MfuReport};
use flopwatch_sim::{FleetPlan, SimModel};

/// A simulated node of a simulated fleet.
pub struct SimSource {
    model: SimModel,
    inventory: Vec<GpuInfo>,
    last_ms: Option<i64>,
    energy_j: Vec<f64>,
    pid_base: Option<u32>,
    carry: PlanCarry,
    mfu: Option<SimMfu>,
    harsh: SimHarshness,
}

/// The harsher conditions a simulated node may show (all off by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimHarshness {
    /// Profiling fields are missing in `[from, to)` (unix ms).
    pub profiling_outages: Vec<(i64, i64)>,
    /// Captures fail before this time (unix ms): a source not up yet.
    pub up_at_ms: Option<i64>,
    /// This GPU's job has a second process (a shared GPU).
    pub shared_gpu: Option<usize>,
}

/// The profiling (DCGM `PROF_*`, GPM) fields a profiling outage removes.
pub const PROFILING_FIELDS: [&str; 10] = [
    m::TENSOR_ACTIVE,
    m::GR_ENGINE_ACTIVE,
    m::SM_CLOCK_AVG_MHZ,
    m::SM_ACTIVE,
    m::SM_OCCUPANCY,
    m::DRAM_ACTIVE,
    m::FP16_ACTIVE,
    m::FP32_ACTIVE,
    m::FP64_ACTIVE,
    m::NVLINK_TX_BYTES_S,
];

/// Jobs of the demo fleet that report their own MFU, with the factor
/// between what they report and their true OFU: `llm-pretrain` reports
/// honestly (a little under OFU, the tile-quantization overhead of OFU
/// paper §IV-A), `moe-train` with the inflated FLOPs count of the paper's
/// §V-C case (54.27 % reported against 25.58 % measured: 2.12×).
pub const SIM_MFU_JOBS: [(&str, f64); 2] = [("llm-pretrain", 0.95), ("moe-train", 2.12)];
/// Device memory the simulated driver reserves for itself, bytes.
pub const SIM_RESERVED_BYTES: f64 = 537.0 * 1024.0 * 1024.0;

/// How often a simulated job reports its MFU, ms.
pub const SIM_MFU_PERIOD_MS: i64 = 10_000;

/// The simulated jobs' MFU reports: each job reports from the node that
/// holds its first GPU, over all of its GPUs across the fleet (every node
/// of a simulated fleet shares the seed, so their models are known here).
struct SimMfu {
    jobs: Vec<MfuJob>,
    models: Vec<SimModel>,
    last_ms: Option<i64>,
}

/// A reporting job: its name, its report ÷ true OFU, and its GPUs as
/// (index into `SimMfu::models`, GPU).
struct MfuJob {
    job: String,
    factor: f64,
    gpus: Vec<(usize, usize)>,
}

impl SimMfu {
    fn new(fleet: &FleetPlan, node: usize, start_ms: i64, seed: u64) -> Option<Self> {
        let mut models: Vec<(usize, SimModel)> = Vec::new();
        let mut jobs = Vec::new();
        for (job, factor) in SIM_MFU_JOBS {
            let gpus: Vec<(usize, usize)> = (0..fleet.nodes)
                .flat_map(|n| (0..fleet.gpus).map(move |g| (n, g)))
                .filter(|&(n, g)| fleet.gpu(n, g).job.as_deref() == Some(job))
                .collect();
            if gpus.first().map(|&(n, _)| n) != Some(node) {
                continue;
            }
            let mut at = Vec::with_capacity(gpus.len());
            for (n, g) in gpus {
                let i = match models.iter().position(|(m, _)| *m == n) {
                    Some(i) => i,
                    None => {
                        models.push((n, SimModel::new(fleet, n, start_ms, seed)));
                        models.len() - 1
                    }
                };
                at.push((i, g));
            }
            jobs.push(MfuJob {
                job: job.to_string(),
                factor,
                gpus: at,
            });
        }
        (!jobs.is_empty()).then(|| Self {
            jobs,
            models: models.into_iter().map(|(_, m)| m).collect(),
            last_ms: None,
        })
    }

    fn reports(&mut self, now_ms: i64) -> Vec<MfuReport> {
        let Some(last) = self.last_ms else {
            self.last_ms = Some(now_ms);
            return Vec::new();
        };
        if now_ms - last < SIM_MFU_PERIOD_MS {
            return Vec::new();
        }
        self.last_ms = Some(now_ms);
        self.jobs
            .iter()
            .map(|j| {
                let ofu = j
                    .gpus
                    .iter()
                    .map(|&(m, g)| self.models[m].window(g, last, now_ms).ofu)
                    .sum::<f64>()
                    / j.gpus.len().max(1) as f64;
                MfuReport {
                    job_id: j.job.clone(),
                    ts_ms: now_ms,
                    start_ms: last,
                    mfu: Some(ofu * j.factor),
                    tflops_by_precision: Vec::new(),
                }
            })
            .collect()
    }
}

impl SimSource {
    /// Node `node` of `fleet`, whose clock starts at `start_ms`.
    pub fn new(fleet: &FleetPlan, node: usize, start_ms: i64, seed: u64) -> Self {
        let mut s = Self::from_model(SimModel::new(fleet, node, start_ms, seed));
        s.mfu = SimMfu::new(fleet, node, start_ms, seed);
        s
    }

    /// A source over an explicit model (tests).
    pub fn from_model(model: SimModel) -> Self {
        let inventory = (0..model.gpu_count())
            .map(|g| GpuInfo {
                index: g as u32,
                uuid: model.uuid(g),
                model: model.model.name.clone(),
                sm_count: model.model.sm_count,
                max_sm_clock_mhz: model.model.max_sm_clock_mhz,
                max_mem_clock_mhz: model.model.max_mem_clock_mhz,
                driver_version: "sim".to_string(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + g),
                gpm_supported: true,
                memory_total_bytes: model.model.memory_total_bytes,
                mig: Default::default(),
            })
            .collect();
        let n = model.gpu_count();
        Self {
            model,
            inventory,
            last_ms: None,
            energy_j: vec![0.0; n],
            pid_base: None,
            carry: PlanCarry::default(),
            mfu: None,
            harsh: SimHarshness::default(),
        }
    }

    /// The same node under harsher conditions.
    pub fn with_harshness(mut self, harsh: SimHarshness) -> Self {
        self.harsh = harsh;
        self
    }

    /// Reports a compute process, PID `base + gpu`, on every GPU that runs
    /// a job (see the module docs).
    pub fn with_pids(mut self, base: u32) -> Self {
        self.pid_base = Some(base);
        self
    }

    /// The underlying model (ground truth for tests).
    pub fn model(&self) -> &SimModel {
        &self.model
    }

    /// UUIDs of the simulated GPUs, in index order.
    pub fn inventory_uuids(&self) -> Vec<String> {
        self.inventory.iter().map(|g| g.uuid.clone()).collect()
    }
}

impl GpuSource for SimSource {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    /// [`SIM_MFU_JOBS`] report every [`SIM_MFU_PERIOD_MS`].
    fn mfu_reports(&mut self, now_ms: i64) -> Vec<MfuReport> {
        self.mfu
            .as_mut()
            .map_or_else(Vec::new, |m| m.reports(now_ms))
    }

    fn processes(&self) -> Vec<(usize, u32)> {
        let Some(base) = self.pid_base else {
            return Vec::new();
        };
        let now = self
            .last_ms
            .unwrap_or(self.model.start_ms)
            .saturating_sub(1);
        let mut out: Vec<(usize, u32)> = (0..self.model.gpu_count())
            .filter(|&g| self.model.job_at(g, now).is_some())
            .map(|g| (g, base.saturating_add(g as u32)))
            .collect();
        if let Some(g) = self
            .harsh
            .shared_gpu
            .filter(|&g| out.iter().any(|p| p.0 == g))
        {
            out.push((g, base.saturating_add(1000 + g as u32)));
        }
        out
    }

    /// The model is evaluated in full either way; the plan decides what is
    /// reported, exactly as a field-by-field source would ([`PlanCarry`]).
    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let mut capture = self.capture(now_ms)?;
        self.carry.apply(plan, &mut capture);
        Ok(capture)
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        if self.harsh.up_at_ms.is_some_and(|up| now_ms < up) {
            return Err(SourceError::Driver {
                call: "capture",
                message: "simulated source not up yet".to_string(),
            });
        }
        let prev = self.last_ms.replace(now_ms);
        let outage = self
            .harsh
            .profiling_outages
            .iter()
            .any(|&(a, b)| a <= now_ms && now_ms < b);
        let mut gpus = Vec::with_capacity(self.inventory.len());
        for g in 0..self.inventory.len() {
            let s = self.model.state_at(g, now_ms);
            let total = self.inventory[g].memory_total_bytes as f64;
            let mut readings = vec![
                Reading::new(m::SM_CLOCK_MHZ, s.sm_clock_mhz.round()),
                Reading::new(m::POWER_W, s.power_w),
                Reading::new(m::TEMP_C, s.temp_c.round()),
                Reading::new(m::MEM_USED_BYTES, s.mem_used_bytes),
                Reading::new(m::MEM_CLOCK_MHZ, s.mem_clock_mhz),
                Reading::new(m::THROTTLE_REASONS, 0.0),
                // HBM runs a few degrees above the GPU die's sensor.
                Reading::new(m::MEMORY_TEMP_C, (s.temp_c + 4.0).round()),
                Reading::new(m::MEM_RESERVED_BYTES, SIM_RESERVED_BYTES),
                Reading::new(
                    m::MEM_FREE_BYTES,
                    (total - s.mem_used_bytes - SIM_RESERVED_BYTES).max(0.0),
                ),
                Reading::new(m::ROW_REMAP_FAILURE, 0.0),
            ];
            let window_ms = match prev {
                Some(p) if now_ms > p => {
                    let w = self.model.window(g, p, now_ms);
                    let a = w.mean;
                    self.energy_j[g] += a.power_w * (now_ms - p) as f64 / 1000.0;
                    readings.extend([
                        Reading::new(m::TENSOR_ACTIVE, a.tensor_active),
                        Reading::new(m::SM_CLOCK_AVG_MHZ, a.sm_clock_mhz),
                        Reading::new(m::SM_ACTIVE, a.sm_active),
                        Reading::new(m::SM_OCCUPANCY, a.sm_occupancy),
                        Reading::new(m::DRAM_ACTIVE, a.dram_active),
                        Reading::new(m::FP16_ACTIVE, a.fp16_active),
                        Reading::new(m::FP32_ACTIVE, a.fp32_active),
                        Reading::new(m::FP64_ACTIVE, a.fp64_active),
                        Reading::new(m::GPU_UTIL, a.sm_active.ceil().min(1.0)),
                        // Busy at least as long as an SM is, at most as
                        // long as a kernel runs.
                        Reading::new(m::GR_ENGINE_ACTIVE, a.sm_active.sqrt()),
                        // NVML's memory utilization: time the memory
                        // was read or written, DRAM activity here.
                        Reading::new(m::MEM_COPY_UTIL, a.dram_active),
                        Reading::new(m::ENC_UTIL, 0.0),
                        Reading::new(m::DEC_UTIL, 0.0),
                        Reading::new(m::NVLINK_TX_BYTES_S, a.nvlink_tx_bytes_s),
                        Reading::new(m::NVLINK_RX_BYTES_S, a.nvlink_rx_bytes_s),
                        Reading::new(m::PCIE_TX_BYTES_S, a.pcie_tx_bytes_s),
                        Reading::new(m::PCIE_RX_BYTES_S, a.pcie_rx_bytes_s),
                    ]);
                    u32::try_from(now_ms - p).unwrap_or(u32::MAX)
                }
                _ => 0,
            };
            if outage {
                readings.retain(|r| !PROFILING_FIELDS.contains(&r.metric));
            }
            readings.extend([
                Reading::new(m::ENERGY_J, self.energy_j[g]),
                Reading::new(m::PCIE_REPLAY_TOTAL, 0.0),
                Reading::new(m::REMAPPED_ROWS_CORRECTABLE_TOTAL, 0.0),
                Reading::new(m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL, 0.0),
            ]);
            gpus.push(GpuCapture {
                gpu: g,
                window_ms,
                readings,
            });
        }
        // The job that ran over the window ending now (a job that starts
        // at this instant has not run yet; one that ended now has).
        let jobs = (0..self.inventory.len())
            .filter_map(|g| {
                self.model
                    .job_at(g, now_ms.saturating_sub(1))
                    .map(|(job_id, since_ms)| JobAssignment {
                        gpu_uuid: self.inventory[g].uuid.clone(),
                        job_id,
                        since_ms,
                        ..Default::default()
                    })
            })
            .collect();
        Ok(Capture {
            ts_ms: now_ms,
            gpus,
            jobs,
            events: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moe_job_reports_an_mfu_twice_its_true_ofu_from_its_first_node() {
        // 4 × 8 GPUs: moe-train runs on flat GPUs 12..16, all on node 1.
        let fleet = FleetPlan::new(4, 8, 3_600_000);
        let t0 = 1_000_000;
        let mut n1 = SimSource::new(&fleet, 1, t0, 7);
        let mut n2 = SimSource::new(&fleet, 2, t0, 7);
        assert!(
            n1.mfu_reports(t0).is_empty(),
            "the first call starts the period"
        );
        assert!(n1.mfu_reports(t0 + 5_000).is_empty());
        let r = n1.mfu_reports(t0 + SIM_MFU_PERIOD_MS);
        let moe: Vec<_> = r.iter().filter(|r| r.job_id == "moe-train").collect();
        assert_eq!(moe.len(), 1, "{r:?}");
        let truth = SimModel::new(&fleet, 1, t0, 7);
        let moe_gpus: Vec<usize> = (0..8)
            .filter(|&g| fleet.gpu(1, g).job.as_deref() == Some("moe-train"))
            .collect();
        assert_eq!(moe_gpus, [4, 5, 6, 7]);
        let ofu = moe_gpus
            .iter()
            .map(|&g| truth.window(g, t0, t0 + SIM_MFU_PERIOD_MS).ofu)
            .sum::<f64>()
            / 4.0;
        assert!(ofu > 0.1, "{ofu}");
        assert!((moe[0].mfu.unwrap() - 2.12 * ofu).abs() < 1e-12);
        assert_eq!(moe[0].start_ms, t0);
        assert_eq!(moe[0].ts_ms, t0 + SIM_MFU_PERIOD_MS);
        // Node 2 holds no job's first GPU: it reports nothing.
        n2.mfu_reports(t0);
        assert!(n2.mfu_reports(t0 + SIM_MFU_PERIOD_MS).is_empty());
    }

    #[test]
    fn second_capture_carries_exact_window_means() {
        let fleet = FleetPlan::new(1, 8, 30_000);
        let mut s = SimSource::new(&fleet, 0, 1_000_000, 5);
        let first = s.capture(1_000_000).unwrap();
        assert!(first.gpus[0]
            .readings
            .iter()
            .all(|r| r.metric != m::TENSOR_ACTIVE));
        let second = s.capture(1_000_250).unwrap();
        let tpa = second.gpus[0]
            .readings
            .iter()
            .find(|r| r.metric == m::TENSOR_ACTIVE)
            .unwrap()
            .value;
        let truth = s.model().window(0, 1_000_000, 1_000_250).mean.tensor_active;
        assert_eq!(tpa, truth);
        assert_eq!(second.gpus[0].window_ms, 250);
        assert_eq!(second.jobs.len(), 8);
    }
}
