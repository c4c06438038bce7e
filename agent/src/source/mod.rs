//! GPU sources: where counters come from.
//!
//! A [`GpuSource`] only knows how to *read once* (`capture`); the interval,
//! batching and shutdown live in [`crate::run`] (the split vector's
//! `host_metrics` makes between `capture` and `run`). Implementations:
//!
//! * [`sim::SimSource`]: the simulated node (embedded default),
//! * [`nvml::NvmlSource`]: NVML through nvml-wrapper, GPM on Hopper+,
//! * [`replay::ReplaySource`]: a recorded long-form CSV trace,
//! * [`dcgm::DcgmExporterSource`]: a local dcgm-exporter `/metrics` page.
//!
//! Node-level devices (InfiniBand ports, NUMA nodes, the host;
//! docs/COUNTERS.md) come from [`node::DeviceReader`]s
//! ([`infiniband::IbReader`], [`host::HostReader`], [`node::SimDevices`])
//! that [`node::NodeSource`] appends after any GPU source's GPUs.

use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{DeviceInfo, GpuInfo};

pub mod dcgm;
mod gpm;
pub mod gpm_fallback;
pub mod host;
pub mod infiniband;
pub mod mig;
pub mod node;
pub mod nvml;
pub mod replay;
pub mod sim;

pub use crate::capture::{Capture, GpuCapture, Reading};

/// Why a source could not read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The NVIDIA driver library is missing or unusable.
    #[error("NVIDIA driver not available: {0}")]
    NoDriver(String),
    /// A driver call failed.
    #[error("NVML {call}: {message}")]
    Driver {
        /// The call that failed.
        call: &'static str,
        /// The driver's message.
        message: String,
    },
    /// A trace file is malformed.
    #[error("{file}:{line}: {message}")]
    Trace {
        /// File.
        file: String,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A trace has no more samples.
    #[error("end of trace")]
    Exhausted,
    /// Reading a file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A dcgm-exporter scrape failed, or its page is unusable.
    #[error("dcgm-exporter {url}: {message}")]
    Exporter {
        /// The URL scraped.
        url: String,
        /// What went wrong (with the page's line number for a bad line).
        message: String,
    },
    /// A configuration the source cannot use.
    #[error("{0}")]
    Config(String),
}

impl SourceError {
    /// Whether trying again later may succeed: a dcgm-exporter that does
    /// not answer (yet), or answers badly (an HTTP error, a malformed page,
    /// a page without GPUs while DCGM starts), or a driver call that
    /// failed. A configuration the source cannot use (a bad URL), a driver
    /// library that cannot be loaded, a bad or finished trace, or a file
    /// that cannot be read is not: retrying would only hide it
    /// ([`crate::Agent::start_opening`] fails at once on those).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Exporter { .. } | Self::Driver { .. })
    }
}

/// A source of GPU counters. `capture` is called from a blocking context;
/// implementations may block on the driver.
pub trait GpuSource: Send {
    /// Short name for logs ("sim", "nvml", ...).
    fn name(&self) -> &'static str;

    /// The node's GPUs (and MIG instances). After a capture the list may
    /// have grown by entries appended at its end (a MIG instance created,
    /// a GPU that came up late), and an entry may have changed in place (a
    /// card that gained instances became [`Mig::Card`](flopwatch_proto::model::Mig::Card),
    /// an instance's profile); entries are never removed or reordered: a
    /// device that goes away stays listed and gives no readings. Capture
    /// indices are positions in the list as it is after the capture. The
    /// agent notices a change after each capture and opens its stream again
    /// with the new list (`crate::sampling`).
    fn inventory(&self) -> &[GpuInfo];

    /// Reads every GPU once. Window-mean metrics cover the time since the
    /// previous capture; point metrics are read at `now_ms`.
    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError>;

    /// Reads what `plan` wants (a [`Sampler::due`](crate::sampler::Sampler::due)
    /// read plan). A source that reads fields one by one skips the others;
    /// a skipped window-mean metric is reported at its next read as the
    /// mean since its previous read, with [`Reading::window_ms`] spanning
    /// that time. Readings beyond the plan may still come (one GPM sample
    /// yields every GPM metric at once); the sampler folds them in. The
    /// default reads everything.
    fn capture_planned(
        &mut self,
        now_ms: i64,
        plan: &crate::capture::ReadPlan,
    ) -> Result<Capture, SourceError> {
        let _ = plan;
        self.capture(now_ms)
    }

    /// Node-level devices (InfiniBand ports, NUMA nodes, the host), fixed
    /// for the source's lifetime. Device `i`'s readings come as the
    /// [`GpuCapture`] with index `inventory().len() + i`, so the sampler
    /// treats them like a GPU's. Ids are local to the node
    /// (`ib:mlx5_0:1`); the agent qualifies them with the node id
    /// ([`qualify`]). Most sources have none.
    fn devices(&self) -> &[DeviceInfo] {
        &[]
    }

    /// Per inventory GPU, whether the driver refused its GPM samples for
    /// lack of permission at the last capture (a container without
    /// `CAP_SYS_ADMIN`; [`nvml::GPM_DENIED_HELP`]). Empty for sources
    /// without GPM.
    fn gpm_permission_denied(&self) -> &[bool] {
        &[]
    }

    /// The compute processes seen at the last capture, as (inventory
    /// index, PID) pairs, for job attribution ([`crate::attribution`]).
    /// Sources that do not see processes return none.
    fn processes(&self) -> Vec<(usize, u32)> {
        Vec::new()
    }

    /// The SM utilisation of each compute process over the last capture's
    /// window, where the driver reports it, as (inventory index, PID,
    /// percent of the GPU's SMs), for apportioning a GPU that several jobs
    /// share ([`crate::attribution`]). Sources without per-process figures
    /// return none.
    fn process_utilization(&self) -> Vec<(usize, u32, f64)> {
        Vec::new()
    }

    /// MFU the node's jobs reported since the last call, when the source
    /// sees such reports ([`crate::mfu`]; the simulator's jobs report).
    fn mfu_reports(&mut self, now_ms: i64) -> Vec<flopwatch_proto::model::MfuReport> {
        let _ = now_ms;
        Vec::new()
    }
}

/// Compute-activity metrics of a MIG card that are its instances' own: a
/// card in MIG mode ([`Mig::Card`](flopwatch_proto::model::Mig::Card))
/// whose instances are listed does not report them, so that its capacity
/// and OFU count once, through the instances.
pub const INSTANCE_ACTIVITY: &[&str] = &[
    m::TENSOR_ACTIVE,
    m::SM_ACTIVE,
    m::SM_OCCUPANCY,
    m::DRAM_ACTIVE,
    m::FP16_ACTIVE,
    m::FP32_ACTIVE,
    m::FP64_ACTIVE,
    m::GPU_UTIL,
    m::GR_ENGINE_ACTIVE,
];

/// A device's series key: its local id qualified with the node id
/// (`ib:mlx5_0:1@node-3`), unique in the tenant as GPU UUIDs are.
pub fn qualify(device: &DeviceInfo, node_id: &str) -> DeviceInfo {
    DeviceInfo {
        id: format!("{}@{node_id}", device.id),
        ..device.clone()
    }
}

/// Every series owner of a source, in capture index order: its GPUs, then
/// one record per device whose `uuid` is the device's qualified id (the
/// batcher keys series by that field; nothing else of a device record is
/// read).
pub fn series_owners(source: &dyn GpuSource, node_id: &str) -> Vec<GpuInfo> {
    let mut owners = source.inventory().to_vec();
    owners.extend(source.devices().iter().map(|d| GpuInfo {
        index: u32::MAX,
        uuid: qualify(d, node_id).id,
        ..GpuInfo::default()
    }));
    owners
}

/// Opens the source a config names, with the node-level counters of
/// `[host]` ([`node::NodeSource`]). `start_ms` anchors the simulator.
pub fn open(
    kind: &flopwatch_config::SourceKind,
    cfg: &flopwatch_config::AgentConfig,
    start_ms: i64,
) -> Result<Box<dyn GpuSource>, SourceError> {
    use flopwatch_config::SourceKind;
    let h = &cfg.host;
    // A simulated node: simulated node counters when `[sim]` asks for
    // them, else the host readers only over trees `[host]` names (a
    // simulated node over a prepared sysfs), never the machine's own.
    let defaults = flopwatch_config::HostSettings::default();
    let own_roots = h.sys_root != defaults.sys_root || h.proc_root != defaults.proc_root;
    if matches!(kind, SourceKind::Sim) && !own_roots {
        let s = &cfg.sim;
        return Ok(sim_node(
            &sim_fleet(&cfg.sim),
            s.node_index,
            start_ms,
            s.seed,
            s.node_counters,
        ));
    }
    let gpus = open_gpus(kind, cfg, start_ms)?;
    let mut readers: Vec<Box<dyn node::DeviceReader>> = Vec::new();
    if !matches!(kind, SourceKind::Replay(_)) {
        if h.infiniband {
            readers.push(Box::new(infiniband::IbReader::discover(&h.sys_root)));
        }
        if h.cpu_memory {
            readers.push(Box::new(host::HostReader::discover(
                &h.sys_root,
                &h.proc_root,
            )));
        }
    }
    if readers.is_empty() {
        return Ok(gpus);
    }
    Ok(Box::new(node::NodeSource::new(gpus, readers)))
}

/// The simulated fleet `[sim]` describes.
fn sim_fleet(s: &flopwatch_config::SimSettings) -> flopwatch_sim::FleetPlan {
    let fleet = flopwatch_sim::FleetPlan::new(s.nodes, s.gpus, s.regress_after.as_millis() as i64);
    if s.job_run.is_zero() {
        return fleet;
    }
    fleet.with_turns(flopwatch_sim::Turns {
        run_ms: s.job_run.as_millis() as i64,
        gap_ms: s.job_gap.as_millis() as i64,
    })
}

/// The harsher conditions `[sim]` asks for, from `start_ms` on.
fn sim_harshness(s: &flopwatch_config::SimSettings, start_ms: i64) -> sim::SimHarshness {
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    sim::SimHarshness {
        profiling_outages: s
            .profiling_outage_after
            .map(|a| {
                let from = start_ms.saturating_add(ms(a));
                (from, from.saturating_add(ms(s.profiling_outage_for)))
            })
            .into_iter()
            .collect(),
        up_at_ms: (!s.up_after.is_zero()).then(|| start_ms.saturating_add(ms(s.up_after))),
        shared_gpu: s.shared_gpu,
    }
}

/// Node `node` of the simulated `fleet`: its GPUs and, with
/// `node_counters`, its simulated InfiniBand ports, NUMA nodes and host
/// ([`node::SimDevices`]). The one way a simulated node is built, for the
/// agent's `source = "sim"` and the demo alike.
pub fn sim_node(
    fleet: &flopwatch_sim::FleetPlan,
    node: usize,
    start_ms: i64,
    seed: u64,
    node_counters: bool,
) -> Box<dyn GpuSource> {
    let gpus = sim::SimSource::new(fleet, node, start_ms, seed);
    if !node_counters {
        return Box::new(gpus);
    }
    let devices = node::SimDevices::new(gpus.model().clone());
    Box::new(node::NodeSource::new(
        Box::new(gpus),
        vec![Box::new(devices)],
    ))
}

/// The GPU source alone.
fn open_gpus(
    kind: &flopwatch_config::SourceKind,
    cfg: &flopwatch_config::AgentConfig,
    start_ms: i64,
) -> Result<Box<dyn GpuSource>, SourceError> {
    use flopwatch_config::SourceKind;
    Ok(match kind {
        SourceKind::Sim => {
            let s = &cfg.sim;
            Box::new(
                sim::SimSource::new(&sim_fleet(s), s.node_index, start_ms, s.seed)
                    .with_harshness(sim_harshness(s, start_ms)),
            )
        }
        SourceKind::Nvml => {
            // The fallback exporter is opened on the first refusal: a bad
            // URL is said now, before the driver is even loaded.
            if let Some(url) = &cfg.nvml.gpm_fallback {
                dcgm::normalize_url(url)?;
            }
            let nvml = Box::new(nvml::NvmlSource::open(cfg.nvml.library_path.as_deref())?);
            match &cfg.nvml.gpm_fallback {
                Some(url) => Box::new(gpm_fallback::GpmFallback::new(nvml, url)),
                None => nvml,
            }
        }
        SourceKind::Replay(path) => Box::new(
            replay::ReplaySource::open(path, "NVIDIA H100 80GB HBM3").map_err(|e| match e {
                SourceError::Io(io) => SourceError::Config(format!("{}: {io}", path.display())),
                other => other,
            })?,
        ),
        SourceKind::DcgmExporter(url) => Box::new(dcgm::DcgmExporterSource::open(url)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a source that does not answer (yet) is worth another try.
    #[test]
    fn only_answers_that_can_change_are_transient() {
        let kind = |s: &str| s.parse::<flopwatch_config::SourceKind>().unwrap();
        let mut cfg = flopwatch_config::AgentConfig::default();
        cfg.nvml.library_path = Some("/nonexistent/libnvidia-ml.so".into());
        // Nothing listens on port 9 (discard) of the loopback.
        for (source, transient) in [
            ("dcgm-exporter:http://127.0.0.1:9/metrics", true),
            ("dcgm-exporter:https://127.0.0.1:9400/metrics", false),
            ("dcgm-exporter:http://", false),
            ("replay:/nonexistent/trace.csv", false),
            ("nvml", false),
        ] {
            let e = open_gpus(&kind(source), &cfg, 0).err().expect(source);
            assert_eq!(e.is_transient(), transient, "{source}: {e}");
        }
        let driver = SourceError::Driver {
            call: "nvmlDeviceGetCount",
            message: "unknown error".into(),
        };
        assert!(driver.is_transient());
    }

    /// `[nvml] gpm_fallback` is opened late, on the first refusal, so a
    /// URL that can never work is refused at start, naming the URL.
    #[test]
    fn a_bad_gpm_fallback_url_fails_at_start() {
        let mut cfg = flopwatch_config::AgentConfig::default();
        cfg.nvml.gpm_fallback = Some("ftp://127.0.0.1:9400/metrics".to_string());
        cfg.nvml.library_path = Some("/nonexistent/libnvidia-ml.so".into());
        let e = open_gpus(&flopwatch_config::SourceKind::Nvml, &cfg, 0)
            .err()
            .expect("refused");
        assert!(
            matches!(&e, SourceError::Config(m) if m.contains("ftp://127.0.0.1:9400/metrics")),
            "{e}"
        );
    }
}
