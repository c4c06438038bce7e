//! Node-level counters next to a GPU source: InfiniBand ports, NUMA nodes
//! and the host (docs/COUNTERS.md).
//!
//! A [`DeviceReader`] reads one family of node devices (the InfiniBand
//! ports of `/sys/class/infiniband`, the NUMA nodes and host of `/proc` and
//! `/sys`, or the simulator's). [`NodeSource`] wraps any [`GpuSource`] and
//! appends the readers' devices after its GPUs: device `i` is capture index
//! `inventory().len() + i`, so the sampler, the read plan and the batcher
//! handle device series exactly like GPU series, keyed by the device's id.

use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use crate::sampler::{PlanCarry, ReadPlan};
use flopwatch_proto::model::{DeviceInfo, GpuInfo};

/// One device's readings from one read.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReading {
    /// Index into the reader's [`DeviceReader::devices`].
    pub device: usize,
    /// Window the window-mean readings cover, ms (0 when there is none
    /// yet, e.g. the first read of a counter).
    pub window_ms: u32,
    /// The readings.
    pub readings: Vec<Reading>,
}

/// A reader of node-level devices. The device list is fixed when the
/// reader is built; a device that disappears later reports what it can
/// (an InfiniBand port reports `ib_port_active` 0).
pub trait DeviceReader: Send {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// The devices, with local ids (`ib:mlx5_0:1`, `numa:0`, `host`).
    fn devices(&self) -> &[DeviceInfo];
    /// Reads every device once at `now_ms`.
    fn read(&mut self, now_ms: i64) -> Vec<DeviceReading>;
    /// Reads at `now_ms` what `wants(device, metric)` asks for; may read
    /// more (the default reads everything: [`NodeSource`] drops and folds
    /// what the plan skips). A reader that skips a window-mean metric
    /// reports it, when next read, over the whole span since its last
    /// read, with the reading's `window_ms` set to that span.
    fn read_planned(
        &mut self,
        now_ms: i64,
        wants: &dyn Fn(usize, &'static str) -> bool,
    ) -> Vec<DeviceReading> {
        let _ = wants;
        self.read(now_ms)
    }
}

/// A GPU source plus node-level device readers.
pub struct NodeSource {
    inner: Box<dyn GpuSource>,
    readers: Vec<Box<dyn DeviceReader>>,
    devices: Vec<DeviceInfo>,
    /// First device index of each reader within `devices`.
    offsets: Vec<usize>,
    carry: PlanCarry,
}

impl NodeSource {
    /// `inner`'s GPUs followed by the readers' devices, in reader order.
    pub fn new(inner: Box<dyn GpuSource>, readers: Vec<Box<dyn DeviceReader>>) -> Self {
        let mut devices = Vec::new();
        let mut offsets = Vec::with_capacity(readers.len());
        for r in &readers {
            offsets.push(devices.len());
            devices.extend(r.devices().iter().cloned());
        }
        tracing::info!(
            gpus = inner.inventory().len(),
            devices = devices.len(),
            readers = ?readers.iter().map(|r| r.name()).collect::<Vec<_>>(),
            "node counters"
        );
        Self {
            inner,
            readers,
            devices,
            offsets,
            carry: PlanCarry::default(),
        }
    }

    /// Every reader's devices, as much as `plan` asks for (all with
    /// `None`).
    fn device_captures(&mut self, now_ms: i64, plan: Option<&ReadPlan>) -> Capture {
        let base = self.inner.inventory().len();
        let mut gpus = Vec::new();
        for (r, off) in self.readers.iter_mut().zip(&self.offsets) {
            let read = match plan {
                None => r.read(now_ms),
                Some(plan) => r.read_planned(now_ms, &|d, m| plan.wants(base + off + d, m)),
            };
            for d in read {
                if d.device >= r.devices().len() {
                    continue;
                }
                gpus.push(GpuCapture {
                    gpu: base + off + d.device,
                    window_ms: d.window_ms,
                    readings: d.readings,
                });
            }
        }
        Capture {
            ts_ms: now_ms,
            gpus,
            ..Capture::default()
        }
    }
}

impl GpuSource for NodeSource {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn inventory(&self) -> &[GpuInfo] {
        self.inner.inventory()
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        let mut c = self.inner.capture(now_ms)?;
        c.gpus.extend(self.device_captures(now_ms, None).gpus);
        Ok(c)
    }

    /// The GPU source applies the plan itself, and so do readers that
    /// can ([`DeviceReader::read_planned`]); what a reader read anyway is
    /// folded by [`PlanCarry`], so a skipped window-mean reading still
    /// counts toward the next one.
    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let mut c = self.inner.capture_planned(now_ms, plan)?;
        let mut d = self.device_captures(now_ms, Some(plan));
        self.carry.apply(plan, &mut d);
        c.gpus.extend(d.gpus);
        Ok(c)
    }

    fn processes(&self) -> Vec<(usize, u32)> {
        self.inner.processes()
    }

    fn gpm_permission_denied(&self) -> &[bool] {
        self.inner.gpm_permission_denied()
    }

    fn mfu_reports(&mut self, now_ms: i64) -> Vec<flopwatch_proto::model::MfuReport> {
        self.inner.mfu_reports(now_ms)
    }
}

/// Simulated node counters: one InfiniBand port per GPU (`mlx5_<g>` port
/// 1, rail-optimized like a DGX H100), two NUMA nodes (one per half of the
/// GPUs) and the host, all derived from the simulator's GPU states so the
/// communication phases of the simulated jobs show on the ports.
pub struct SimDevices {
    model: flopwatch_sim::SimModel,
    devices: Vec<DeviceInfo>,
    numa: usize,
    last_ms: Option<i64>,
}

impl SimDevices {
    /// Devices of the node `model` simulates.
    pub fn new(model: flopwatch_sim::SimModel) -> Self {
        use flopwatch_proto::model::{DEVICE_HOST, DEVICE_IB_PORT, DEVICE_NUMA_NODE};
        let gpus = model.gpu_count();
        let numa = if gpus > 1 { 2 } else { 1 };
        let mut devices: Vec<DeviceInfo> = (0..gpus)
            .map(|g| DeviceInfo {
                id: format!("ib:mlx5_{g}:1"),
                kind: DEVICE_IB_PORT.into(),
                name: format!("mlx5_{g}:1"),
            })
            .collect();
        devices.extend((0..numa).map(|n| DeviceInfo {
            id: format!("numa:{n}"),
            kind: DEVICE_NUMA_NODE.into(),
            name: n.to_string(),
        }));
        devices.push(DeviceInfo {
            id: "host".into(),
            kind: DEVICE_HOST.into(),
            name: "host".into(),
        });
        Self {
            model,
            devices,
            numa,
            last_ms: None,
        }
    }
}

/// Simulated host memory, bytes (2 TiB, as on a DGX H100).
const SIM_HOST_MEM_BYTES: f64 = 2.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0;

impl DeviceReader for SimDevices {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn read(&mut self, now_ms: i64) -> Vec<DeviceReading> {
        use flopwatch_proto::metrics as m;
        let gpus = self.model.gpu_count();
        let prev = self.last_ms.replace(now_ms).filter(|&p| p < now_ms);
        let window_ms = prev.map_or(0, |p| u32::try_from(now_ms - p).unwrap_or(u32::MAX));
        let means: Vec<Option<flopwatch_sim::GpuState>> = (0..gpus)
            .map(|g| prev.map(|p| self.model.window(g, p, now_ms).mean))
            .collect();
        let mut out = Vec::with_capacity(self.devices.len());
        for (g, mean) in means.iter().enumerate() {
            let mut readings = vec![
                Reading::new(m::IB_PORT_ACTIVE, 1.0),
                Reading::new(m::IB_LINK_RATE_GBPS, 400.0),
                Reading::new(m::IB_TX_DISCARDS_TOTAL, 0.0),
                Reading::new(m::IB_RX_ERRORS_TOTAL, 0.0),
                Reading::new(m::IB_LINK_ERRORS_TOTAL, 0.0),
            ];
            if let Some(s) = mean {
                readings.push(Reading::new(m::IB_TX_BYTES_S, s.ib_tx_bytes_s));
                readings.push(Reading::new(m::IB_RX_BYTES_S, s.ib_rx_bytes_s));
            }
            out.push(DeviceReading {
                device: g,
                window_ms,
                readings,
            });
        }
        // Data loaders and launch threads: CPU load follows GPU activity.
        let per_node = gpus.div_ceil(self.numa).max(1);
        let mut host_util = 0.0;
        for n in 0..self.numa {
            let members: Vec<usize> = (n * per_node..((n + 1) * per_node).min(gpus)).collect();
            let busy = |g: &usize| {
                means[*g].map_or_else(
                    || self.model.state_at(*g, now_ms).sm_active,
                    |s| s.sm_active,
                )
            };
            let util = (0.04
                + 0.5 * members.iter().map(busy).sum::<f64>() / members.len().max(1) as f64)
                .min(1.0);
            host_util += util / self.numa as f64;
            let mut readings = vec![
                Reading::new(m::HOST_CPU_FREQ_MHZ, 3_100.0 - 700.0 * util),
                Reading::new(
                    m::HOST_MEM_AVAILABLE_BYTES,
                    SIM_HOST_MEM_BYTES / self.numa as f64 * (0.9 - 0.4 * util),
                ),
            ];
            if prev.is_some() {
                readings.push(Reading::new(m::HOST_CPU_UTIL, util));
            }
            out.push(DeviceReading {
                device: gpus + n,
                window_ms,
                readings,
            });
        }
        let mut readings = vec![
            Reading::new(m::HOST_CPU_FREQ_MHZ, 3_100.0 - 700.0 * host_util),
            Reading::new(
                m::HOST_MEM_AVAILABLE_BYTES,
                SIM_HOST_MEM_BYTES * (0.9 - 0.4 * host_util),
            ),
        ];
        if prev.is_some() {
            readings.push(Reading::new(m::HOST_CPU_UTIL, host_util));
        }
        out.push(DeviceReading {
            device: gpus + self.numa,
            window_ms,
            readings,
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::sim::SimSource;
    use flopwatch_proto::metrics as m;
    use flopwatch_sim::{FleetPlan, SimModel};

    #[test]
    fn devices_follow_the_gpus_and_carry_window_means() {
        let fleet = FleetPlan::new(2, 4, 30_000);
        let model = SimModel::new(&fleet, 0, 0, 3);
        let mut s = NodeSource::new(
            Box::new(SimSource::from_model(model.clone())),
            vec![Box::new(SimDevices::new(model.clone()))],
        );
        assert_eq!(s.inventory().len(), 4);
        let ids: Vec<&str> = s.devices().iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "ib:mlx5_0:1",
                "ib:mlx5_1:1",
                "ib:mlx5_2:1",
                "ib:mlx5_3:1",
                "numa:0",
                "numa:1",
                "host"
            ]
        );
        let first = s.capture(1_000).unwrap();
        assert_eq!(first.gpus.len(), 4 + 7);
        let c = s.capture(1_400).unwrap();
        let port3 = c.gpus.iter().find(|g| g.gpu == 4 + 3).unwrap();
        assert_eq!(port3.window_ms, 400);
        let rx = port3
            .readings
            .iter()
            .find(|r| r.metric == m::IB_RX_BYTES_S)
            .unwrap()
            .value;
        assert_eq!(rx, model.window(3, 1_000, 1_400).mean.ib_rx_bytes_s);
        let owners = crate::source::series_owners(&s, "node-0");
        assert_eq!(owners.len(), 11);
        assert_eq!(owners[4 + 6].uuid, "host@node-0");
        // A plan skipping a device's window mean folds it into the next read.
        let plan = ReadPlan::skipping(vec![(4 + 3, m::IB_RX_BYTES_S)]);
        let c = s.capture_planned(1_500, &plan).unwrap();
        let port3 = c.gpus.iter().find(|g| g.gpu == 7).unwrap();
        assert!(port3.readings.iter().all(|r| r.metric != m::IB_RX_BYTES_S));
        let c = s.capture_planned(1_600, &ReadPlan::all()).unwrap();
        let r = c.gpus.iter().find(|g| g.gpu == 7).unwrap();
        let rx = r
            .readings
            .iter()
            .find(|r| r.metric == m::IB_RX_BYTES_S)
            .unwrap();
        assert_eq!(rx.window_ms, Some(200));
        let truth = model.window(3, 1_400, 1_600).mean.ib_rx_bytes_s;
        assert!((rx.value - truth).abs() < 1e-6 * truth.max(1.0));
    }
}
