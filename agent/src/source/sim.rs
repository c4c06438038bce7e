//! The simulated node: the embedded default source.
//!
//! Window-mean metrics are the simulator's exact means since the previous
//! capture (as GPM would report them); point metrics are the state at the
//! capture instant, so the SM clock shows the OFU paper's ±32 MHz jitter.
//!
//! With [`SimSource::with_pids`] a GPU that runs a job also reports one
//! compute process, PID `base + gpu index` (the fake NVML library's
//! convention with base 10 000), so job attribution can be exercised
//! against a fake `/proc` tree. Off by default: on a real host those PIDs
//! belong to unrelated processes.

use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{GpuInfo, JobAssignment};
use flopwatch_sim::{FleetPlan, SimModel};

/// A simulated node of a simulated fleet.
pub struct SimSource {
    model: SimModel,
    inventory: Vec<GpuInfo>,
    last_ms: Option<i64>,
    energy_j: Vec<f64>,
    pid_base: Option<u32>,
}

impl SimSource {
    /// Node `node` of `fleet`, whose clock starts at `start_ms`.
    pub fn new(fleet: &FleetPlan, node: usize, start_ms: i64, seed: u64) -> Self {
        Self::from_model(SimModel::new(fleet, node, start_ms, seed))
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
                mig_parent_uuid: None,
            })
            .collect();
        let n = model.gpu_count();
        Self {
            model,
            inventory,
            last_ms: None,
            energy_j: vec![0.0; n],
            pid_base: None,
        }
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

    fn processes(&self) -> Vec<(usize, u32)> {
        let Some(base) = self.pid_base else {
            return Vec::new();
        };
        self.model
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.job.is_some())
            .map(|(g, _)| (g, base.saturating_add(g as u32)))
            .collect()
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        let prev = self.last_ms.replace(now_ms);
        let mut gpus = Vec::with_capacity(self.inventory.len());
        for g in 0..self.inventory.len() {
            let s = self.model.state_at(g, now_ms);
            let mut readings = vec![
                Reading::new(m::SM_CLOCK_MHZ, s.sm_clock_mhz.round()),
                Reading::new(m::POWER_W, s.power_w),
                Reading::new(m::TEMP_C, s.temp_c.round()),
                Reading::new(m::MEM_USED_BYTES, s.mem_used_bytes),
                Reading::new(m::MEM_CLOCK_MHZ, s.mem_clock_mhz),
                Reading::new(m::THROTTLE_REASONS, 0.0),
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
                        Reading::new(m::NVLINK_TX_BYTES_S, a.nvlink_tx_bytes_s),
                        Reading::new(m::NVLINK_RX_BYTES_S, a.nvlink_rx_bytes_s),
                        Reading::new(m::PCIE_TX_BYTES_S, a.pcie_tx_bytes_s),
                        Reading::new(m::PCIE_RX_BYTES_S, a.pcie_rx_bytes_s),
                    ]);
                    u32::try_from(now_ms - p).unwrap_or(u32::MAX)
                }
                _ => 0,
            };
            readings.push(Reading::new(m::ENERGY_J, self.energy_j[g]));
            gpus.push(GpuCapture {
                gpu: g,
                window_ms,
                readings,
            });
        }
        let jobs = self
            .model
            .plans
            .iter()
            .enumerate()
            .filter_map(|(g, p)| {
                p.job.as_ref().map(|j| JobAssignment {
                    gpu_uuid: self.inventory[g].uuid.clone(),
                    job_id: j.clone(),
                    since_ms: self.model.start_ms,
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
