//! NVML through nvml-wrapper: the source for real NVIDIA GPUs.
//!
//! * **Tensor activity and the other pipe counters** come from GPM on
//!   Hopper and newer: each capture takes *one* GPM sample per GPU and diffs
//!   it against the previous capture's sample (`nvmlGpmMetricsGet`; two
//!   samples per GPU reused in turn, [`super::gpm`]), so every
//!   value is the hardware's exact average over the window, whatever its
//!   length (the OFU paper's eq. 1 needs tensor pipe activity as a window
//!   mean). The graphics engine's activity (`GraphicsUtil`,
//!   `gr_engine_active`, what DCGM's `PROF_GR_ENGINE_ACTIVE` is) comes in
//!   the same pass. NVML reports utilizations in percent and bandwidth in
//!   MiB/s; they become fractions and bytes/s here.
//! * **The SM clock** is read twice: the instantaneous `clock_info` point
//!   (`sm_clock_mhz`), whose noise OFU §IV-C measures, and the mean of the
//!   driver's processor-clock samples since the last one seen
//!   (`sm_clock_avg_mhz`), the window average OFU wants. With no new
//!   samples the point clock stands in.
//! * Power, temperature, memory, clocks, utilization rates, throttle
//!   reasons, ECC and energy are plain reads, and so are the counters of
//!   dcgm-exporter's default set beyond them:
//!   * memory used, free and reserved from one
//!     `nvmlDeviceGetMemoryInfo_v2` (nvml-wrapper's `memory_info`);
//!   * the memory (HBM) temperature, field `NVML_FI_DEV_MEMORY_TEMP` of
//!     `nvmlDeviceGetFieldValues`; a GDDR card answers NotSupported and
//!     gives no reading;
//!   * the video encoder's and decoder's utilization
//!     (`nvmlDeviceGetEncoderUtilization` / `…DecoderUtilization`, percent
//!     over the driver's sampling period), from the second capture on as
//!     the utilization rates;
//!   * the remapped rows (`nvmlDeviceGetRemappedRows`, which nvml-wrapper
//!     0.13 lacks: [`super::gpm::remapped_rows`]): rows remapped after
//!     correctable and uncorrectable errors, lifetime counters read on the
//!     slow cadence like ECC ([`crate::cadence`]), and whether a
//!     remapping failed. One call answers all three; it is made when the
//!     read plan wants any of them and only those wanted are reported.
//! * **Compute processes** (`nvmlDeviceGetComputeRunningProcesses_v3`):
//!   their count is `compute_processes` every capture, and their PIDs are
//!   kept per GPU ([`NvmlSource::last_pids`], [`GpuSource::processes`]) for
//!   job attribution ([`crate::attribution`]).
//! * **Per-process SM utilisation** (`nvmlDeviceGetProcessUtilization`,
//!   [`GpuSource::process_utilization`]), for apportioning a GPU that
//!   several jobs share (time-slicing, MPS): read with the process list,
//!   i.e. whenever the read plan wants `compute_processes` (at every
//!   capture under a fixed sampler), so the figures and the PIDs they are
//!   matched with come from the same capture. Each GPU keeps the newest
//!   sample stamp (µs) it consumed and asks for the samples after it only;
//!   each PID's figure is its `sm_util` averaged over those samples
//!   (`mean_sm_util`): the span since the previous read, or the driver's
//!   buffer where that is shorter (a plan that skips the process list for
//!   long averages over the newest samples the driver kept). The first
//!   read only sets the stamp (no window yet); NotFound (no sample since
//!   the stamp) gives no figures and is no error; NotSupported (MIG mode,
//!   older GPUs) is logged once per GPU. Between reads the last figures
//!   stand, as the PIDs do. Cost: nvml-wrapper asks the count, then the
//!   samples (two driver calls per GPU per read; one when there are none),
//!   and a buffer of a few hundred 32-byte samples at most.
//! * **Events**: at open, one NVML event set is created and every GPU that
//!   supports them is registered for critical XID errors and double-bit ECC
//!   errors (GPUs answering NotSupported are skipped). Each capture drains
//!   the set without waiting (`nvmlEventSetWait_v2` with a 0 ms timeout,
//!   until it times out) into [`Capture::events`]: kind `"xid"` with the XID
//!   as code, or `"ecc_dbe"`. The events are drained before the GPUs are
//!   read.
//! * **Last XID** (`xid_last`): NVML has no call for it, so each GPU keeps
//!   the code of the last XID the event set delivered for it (0 until
//!   one arrives) and reports it at every capture, as dcgm-exporter
//!   reports DCGM's XID field. Unlike DCGM's, it knows nothing of an XID
//!   raised before the agent started (0 then), nor of one on a GPU not
//!   registered for XID events, which gives no `xid_last` at all.
//! * **MIG** ([`super::mig`]): a card in MIG mode is listed as
//!   [`Mig::Card`], each of its MIG devices after it as a GPU of its own
//!   ([`Mig::Instance`]: UUID `MIG-…`, GPU and compute instance ids, the
//!   profile, the instance's SMs and memory). An instance reports the GPM
//!   pipe metrics of its own GPU instance (`nvmlGpmMigSampleGet` on the
//!   card, window means like the card's) and the card's SM clock, point
//!   and average (one clock drives the whole GPU), so OFU is computed per
//!   instance; its graphics-engine activity too (the utilization of an
//!   instance, as DCGM gives it). The card keeps its device-wide counters
//!   (power, temperature and memory temperature, memory, clocks, ECC and
//!   remapped rows, energy, video engines, NVLink and PCIe, events and the
//!   last XID) but reports none of
//!   [`INSTANCE_ACTIVITY`] (tensor activity,
//!   graphics-engine activity and the other pipe metrics, GPU
//!   utilization): its
//!   compute counts once, through its instances. MIG mode and devices are
//!   read at open, at the first capture, then every
//!   [`RESCAN_MS`](super::mig::RESCAN_MS) (2 s) and after an instance is
//!   found gone: a new instance is appended to the inventory, a destroyed
//!   one stays listed without readings, one created again with the same
//!   ids takes its entry back. NotSupported (or a driver without the
//!   calls) means MIG is off, and a card whose MIG devices cannot be
//!   enumerated stays a whole GPU.
//! * **GPM permission**: in a container without `CAP_SYS_ADMIN` the driver
//!   refuses GPM samples (`NVML_ERROR_NO_PERMISSION`) although the GPU
//!   supports them. The GPM metrics (tensor activity, the OFU input, among
//!   them) are then absent, never zeros; one warning per process names the
//!   fix ([`GPM_DENIED_HELP`]); [`GpuSource::gpm_permission_denied`] tells
//!   the agent's `/metrics` which GPUs are refused; NVLink and PCIe
//!   throughput fall back to their non-GPM reads. The sample is retried
//!   every capture, so a granted permission brings GPM back.
//!
//! A counter the GPU does not support (or that fails) is skipped and logged
//! once per GPU; it never fails the capture. A missing or broken driver is
//! [`SourceError::NoDriver`], never a panic.
//!
//! Lifetimes: nvml-wrapper ties every `Device` and `GpmSample` to the `Nvml`
//! it came from, and the crate keeps raw handles out of its code (the
//! exceptions are [`super::gpm`], the allocation-free GPM reads, and the
//! MIG instance ids of [`super::mig`]). The `Nvml`
//! is therefore leaked into a `&'static Nvml`: at most
//! one per library path per process (a repeated `open` of the same path
//! reuses it), which is what a node agent needs anyway: NVML is loaded once
//! and lives as long as the process.

use super::gpm::{remapped_rows, unsupported, GpmPair};
use super::mig::MigCard;
use super::{Capture, GpuCapture, GpuSource, Reading, SourceError, INSTANCE_ACTIVITY};
use crate::sampler::ReadPlan;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::Event;
use flopwatch_proto::model::GpuInfo;
#[cfg(doc)]
use flopwatch_proto::model::Mig;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, Sampling, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, EventSet, Nvml};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use tracing::{debug, info, warn};

/// Library names tried when no path is given: the versioned name every
/// driver install has, then the development symlink nvml-wrapper defaults to.
const DEFAULT_LIBRARIES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// Event types registered on every GPU that supports them.
const WATCHED_EVENTS: EventTypes =
    EventTypes::CRITICAL_XID_ERROR.union(EventTypes::DOUBLE_BIT_ECC_ERROR);
/// Most events taken from the set in one capture (a storm cannot stall it).
const MAX_EVENTS_PER_CAPTURE: usize = 1024;
/// `gpu` key of the log-once set for failures not tied to one GPU.
const NODE: usize = usize::MAX;

/// NVML's percent → fraction.
const PERCENT: f64 = 0.01;
/// NVML's MiB/s → bytes/s.
const MIB: f64 = 1024.0 * 1024.0;

/// The one warning logged when the driver refuses GPM samples.
pub const GPM_DENIED_HELP: &str = "GPM samples refused (NVML_ERROR_NO_PERMISSION): \
    in a container they need CAP_SYS_ADMIN. Add SYS_ADMIN to the agent pod's \
    securityContext.capabilities.add, or run the agent with \
    AmbientCapabilities=CAP_SYS_ADMIN (systemd). Until then tensor activity, \
    the other GPM pipe counters and OFU are unavailable on these GPUs; the \
    other counters go on. Alternatively let a dcgm-exporter that has the \
    capability stand in for GPM ([nvml] gpm_fallback = \"URL\"), or read it \
    instead of NVML (source = \"dcgm-exporter:URL\").";

/// GPM metrics read every window: NVML id, catalog name, unit factor. The
/// first [`GPM_PIPE`] are a MIG instance's own (what a MIG card leaves to
/// its instances); the rest are device-wide.
const GPM_METRICS: [(GpmMetricId, &str, f64); 12] = [
    (GpmMetricId::AnyTensorUtil, m::TENSOR_ACTIVE, PERCENT),
    (GpmMetricId::SmUtil, m::SM_ACTIVE, PERCENT),
    (GpmMetricId::SmOccupancy, m::SM_OCCUPANCY, PERCENT),
    (GpmMetricId::DramBwUtil, m::DRAM_ACTIVE, PERCENT),
    (GpmMetricId::Fp16Util, m::FP16_ACTIVE, PERCENT),
    (GpmMetricId::Fp32Util, m::FP32_ACTIVE, PERCENT),
    (GpmMetricId::Fp64Util, m::FP64_ACTIVE, PERCENT),
    (GpmMetricId::GraphicsUtil, m::GR_ENGINE_ACTIVE, PERCENT),
    (GpmMetricId::NvlinkTotalTxPerSec, m::NVLINK_TX_BYTES_S, MIB),
    (GpmMetricId::NvlinkTotalRxPerSec, m::NVLINK_RX_BYTES_S, MIB),
    (GpmMetricId::PcieTxPerSec, m::PCIE_TX_BYTES_S, MIB),
    (GpmMetricId::PcieRxPerSec, m::PCIE_RX_BYTES_S, MIB),
];
/// How many of [`GPM_METRICS`] are pipe metrics.
const GPM_PIPE: usize = 8;

/// The GPUs of this node, read through NVML.
pub struct NvmlSource {
    nvml: &'static Nvml,
    /// The cards (physical GPUs); their MIG instances are in each card's
    /// [`MigCard`].
    gpus: Vec<Gpu>,
    inventory: Vec<GpuInfo>,
    last_ms: Option<i64>,
    /// (GPU, call) pairs already logged as failing ([`NODE`] for the node).
    reported: HashSet<(usize, &'static str)>,
    /// The event set every supporting GPU is registered on, if any.
    events: Option<EventSet<'static>>,
    /// Per inventory GPU: whether its last GPM call was refused for lack
    /// of permission.
    gpm_denied: Vec<bool>,
}

/// Per-GPU state carried between captures.
struct Gpu {
    /// Its position in the inventory.
    pos: usize,
    device: Device<'static>,
    gpm: bool,
    /// Whether the last GPM call was refused (`NVML_ERROR_NO_PERMISSION`).
    gpm_denied: bool,
    /// The GPU's GPM samples, the previous one the start of the next
    /// window.
    gpm_pair: GpmPair,
    /// Timestamp (µs) of the newest processor-clock sample consumed.
    last_clock_us: Option<u64>,
    /// PIDs of the compute processes seen at the last capture.
    pids: Vec<u32>,
    /// Whether the per-process utilisation was read once (the first read
    /// only sets [`Gpu::proc_util_us`]).
    proc_util_read: bool,
    /// Stamp (µs) of the newest per-process utilisation sample consumed.
    proc_util_us: Option<u64>,
    /// Each PID's SM utilisation, percent, over the last read's window.
    proc_util: Vec<(u32, f64)>,
    /// MIG mode and the MIG instances listed.
    mig: MigCard,
    /// NVLink links the GPU has (0 for a GPU without NVLink), probed at open.
    nvlinks: u32,
    /// Links up at the last state read.
    active_links: u32,
    /// The NVLink data counters at the previous read (GPUs without GPM):
    /// (unix ms, tx KiB, rx KiB).
    last_nvlink: Option<(i64, u64, u64)>,
    /// Whether the GPU is registered on the event set for XID errors:
    /// only then is [`Gpu::xid_last`] known.
    xid_watched: bool,
    /// The last XID taken off the event set for this GPU (0: none since
    /// the agent started).
    xid_last: i64,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("gpus", &self.inventory.len())
            .field("last_ms", &self.last_ms)
            .finish_non_exhaustive()
    }
}

// `capture` runs on a blocking thread: the source must move there.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<NvmlSource>();
};

/// Loads NVML from `path` once per process (see the module docs).
fn load(path: &OsStr) -> Result<&'static Nvml, NvmlError> {
    static LOADED: Mutex<Vec<(OsString, &'static Nvml)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, nvml)) = loaded.iter().find(|(p, _)| p == path) {
        return Ok(nvml);
    }
    let nvml: &'static Nvml = Box::leak(Box::new(Nvml::builder().lib_path(path).init()?));
    loaded.push((path.to_owned(), nvml));
    Ok(nvml)
}

fn driver_error(call: &'static str, e: NvmlError) -> SourceError {
    SourceError::Driver {
        call,
        message: e.to_string(),
    }
}

impl NvmlSource {
    /// Loads NVML from `library_path` (default: the system's
    /// `libnvidia-ml.so.1`, then `libnvidia-ml.so`) and reads the inventory.
    ///
    /// A library that cannot be loaded or initialized is
    /// [`SourceError::NoDriver`], naming every path tried.
    pub fn open(library_path: Option<&Path>) -> Result<Self, SourceError> {
        let candidates: Vec<&OsStr> = match library_path {
            Some(p) => vec![p.as_os_str()],
            None => DEFAULT_LIBRARIES.iter().map(OsStr::new).collect(),
        };
        let mut tried = Vec::new();
        for path in candidates {
            match load(path) {
                Ok(nvml) => return Self::from_nvml(nvml),
                Err(e) => tried.push(format!("{}: {e}", path.to_string_lossy())),
            }
        }
        Err(SourceError::NoDriver(format!(
            "cannot load NVML ({})",
            tried.join("; ")
        )))
    }

    fn from_nvml(nvml: &'static Nvml) -> Result<Self, SourceError> {
        let count = nvml
            .device_count()
            .map_err(|e| driver_error("nvmlDeviceGetCount", e))?;
        let driver_version = nvml.sys_driver_version().unwrap_or_else(|e| {
            warn!(error = %e, "NVML driver version unavailable");
            "unknown".to_string()
        });
        let mut gpus = Vec::new();
        let mut inventory = Vec::new();
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    warn!(index, error = %e, "skipping a GPU NVML cannot open");
                    continue;
                }
            };
            let uuid = match device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    warn!(index, error = %e, "skipping a GPU without a UUID");
                    continue;
                }
            };
            let gpm = device.gpm_support().unwrap_or(false);
            let mig = match device.mig_mode() {
                Ok(mode) => mode.current == 1,
                Err(e) if unsupported(&e) => false,
                Err(e) => {
                    debug!(index, error = %e, "MIG mode unreadable; assuming off");
                    false
                }
            };
            let pos = inventory.len();
            inventory.push(GpuInfo {
                index,
                uuid,
                model: device.name().unwrap_or_else(|_| "unknown".to_string()),
                sm_count: device
                    .attributes()
                    .map(|a| a.multiprocessor_count)
                    .unwrap_or(0),
                max_sm_clock_mhz: device.max_clock_info(Clock::SM).unwrap_or(0),
                max_mem_clock_mhz: device.max_clock_info(Clock::Memory).unwrap_or(0),
                driver_version: driver_version.clone(),
                pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                gpm_supported: gpm,
                memory_total_bytes: device.memory_info().map(|mi| mi.total).unwrap_or(0),
                mig: Default::default(),
            });
            let mut mig = MigCard::new(mig);
            if mig.mode {
                // The card's instances follow it in the inventory.
                if let Err((call, e)) = mig.refresh(nvml, &device, pos, None, &mut inventory, None)
                {
                    warn!(index, call, error = %e, "MIG is enabled but its instances cannot be listed; counters are whole-GPU");
                }
            }
            let (nvlinks, active_links) = probe_nvlinks(&device);
            gpus.push(Gpu {
                pos,
                device,
                gpm,
                gpm_denied: false,
                gpm_pair: GpmPair::new(nvml),
                last_clock_us: None,
                pids: Vec::new(),
                proc_util_read: false,
                proc_util_us: None,
                proc_util: Vec::new(),
                mig,
                nvlinks,
                active_links,
                last_nvlink: None,
                xid_watched: false,
                xid_last: 0,
            });
        }
        let mut reported = HashSet::new();
        let events = event_set(nvml, &mut gpus, &mut reported);
        Ok(Self {
            nvml,
            gpm_denied: vec![false; inventory.len()],
            gpus,
            inventory,
            last_ms: None,
            reported,
            events,
        })
    }

    /// The PIDs of the compute processes each GPU ran at the last capture,
    /// by GPU UUID, in inventory order (empty before the first capture, and
    /// for GPUs whose process list could not be read).
    /// MIG instances have none of their own (their processes are the
    /// card's).
    pub fn last_pids(&self) -> Vec<(String, Vec<u32>)> {
        let mut out: Vec<(String, Vec<u32>)> = self
            .inventory
            .iter()
            .map(|info| (info.uuid.clone(), Vec::new()))
            .collect();
        for gpu in &self.gpus {
            out[gpu.pos].1.clone_from(&gpu.pids);
        }
        out
    }

    /// Whether MIG mode is enabled on inventory GPU `gpu`, a card (false
    /// when the GPU or driver does not support MIG, and for a MIG
    /// instance).
    pub fn mig_enabled(&self, gpu: usize) -> bool {
        self.gpus.iter().any(|g| g.pos == gpu && g.mig.mode)
    }

    /// Reads MIG mode and the MIG devices of the cards that are due
    /// ([`super::mig`]).
    fn refresh_mig(&mut self, now_ms: i64) {
        for (card, gpu) in self.gpus.iter_mut().enumerate() {
            if !gpu.mig.due(now_ms) {
                continue;
            }
            let mode = match gpu.device.mig_mode() {
                Ok(mode) => Some(mode.current == 1),
                Err(e) if unsupported(&e) => Some(false),
                Err(e) => {
                    log_failure(&mut self.reported, gpu.pos, "nvmlDeviceGetMigMode", &e);
                    None
                }
            };
            let before = gpu.mig.listed;
            match gpu.mig.refresh(
                self.nvml,
                &gpu.device,
                gpu.pos,
                mode,
                &mut self.inventory,
                Some(now_ms),
            ) {
                Ok(()) if gpu.mig.listed && !before => {
                    info!(
                        gpu = card,
                        "MIG instances listed; the card's compute counts through them"
                    );
                }
                Ok(()) => {}
                Err((call, e)) => log_failure(&mut self.reported, gpu.pos, call, &e),
            }
        }
        self.gpm_denied.resize(self.inventory.len(), false);
    }

    /// Takes every pending event off the event set, without waiting; an
    /// XID becomes its GPU's [`Gpu::xid_last`].
    fn drain_events(&mut self, now_ms: i64) -> Vec<Event> {
        let mut out = Vec::new();
        let Some(set) = &self.events else {
            return out;
        };
        while out.len() < MAX_EVENTS_PER_CAPTURE {
            let data = match set.wait(0) {
                Ok(data) => data,
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    log_failure(&mut self.reported, NODE, "nvmlEventSetWait_v2", &e);
                    break;
                }
            };
            let gpu_uuid = match data.device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    log_failure(&mut self.reported, NODE, "nvmlDeviceGetUUID(event)", &e);
                    continue;
                }
            };
            if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                let (code, detail) = match data.event_data {
                    Some(XidError::Value(x)) => (
                        i64::try_from(x).unwrap_or(i64::MAX),
                        format!("critical XID error {x}"),
                    ),
                    Some(XidError::Unknown) | None => {
                        (999, "critical XID error (unknown XID)".to_string())
                    }
                };
                let inventory = &self.inventory;
                if let Some(gpu) = self
                    .gpus
                    .iter_mut()
                    .find(|g| inventory[g.pos].uuid == gpu_uuid)
                {
                    gpu.xid_last = code;
                }
                out.push(Event {
                    gpu_uuid,
                    kind: "xid".to_string(),
                    ts_ms: now_ms,
                    code,
                    detail,
                });
            } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                out.push(Event {
                    gpu_uuid,
                    kind: "ecc_dbe".to_string(),
                    ts_ms: now_ms,
                    code: data.event_type.bits() as i64,
                    detail: "double-bit (uncorrectable) ECC error".to_string(),
                });
            }
        }
        out
    }
}

/// Creates the event set and registers every GPU that supports
/// [`WATCHED_EVENTS`], marking those registered for XIDs
/// ([`Gpu::xid_watched`]); `None` when there is no set or no GPU
/// registered.
fn event_set(
    nvml: &'static Nvml,
    gpus: &mut [Gpu],
    reported: &mut HashSet<(usize, &'static str)>,
) -> Option<EventSet<'static>> {
    let mut set = match nvml.create_event_set() {
        Ok(set) => Some(set),
        Err(e) => {
            log_failure(reported, NODE, "nvmlEventSetCreate", &e);
            return None;
        }
    };
    let mut registered = 0;
    for index in 0..gpus.len() {
        let gpu = &gpus[index];
        let wanted = match gpu.device.supported_event_types() {
            Ok(types) => types & WATCHED_EVENTS,
            Err(e) => {
                log_failure(reported, gpu.pos, "nvmlDeviceGetSupportedEventTypes", &e);
                continue;
            }
        };
        if wanted.is_empty() {
            continue;
        }
        // A failed registration frees the set (nvml-wrapper's contract):
        // start a new one for the remaining GPUs.
        let current = match set.take() {
            Some(s) => s,
            None => match nvml.create_event_set() {
                Ok(s) => s,
                Err(e) => {
                    log_failure(reported, NODE, "nvmlEventSetCreate", &e);
                    return None;
                }
            },
        };
        match gpu.device.register_events(wanted, current) {
            Ok(s) => {
                set = Some(s);
                registered += 1;
                gpus[index].xid_watched = wanted.contains(EventTypes::CRITICAL_XID_ERROR);
            }
            Err(e) => {
                if registered > 0 {
                    warn!(
                        gpu = gpu.pos,
                        error = %e.error,
                        "NVML event registration failed; earlier GPUs' events are lost"
                    );
                    registered = 0;
                    for earlier in &mut gpus[..index] {
                        earlier.xid_watched = false;
                    }
                } else {
                    log_failure(reported, gpu.pos, "nvmlDeviceRegisterEvents", &e.error);
                }
            }
        }
    }
    set.filter(|_| registered > 0)
}

/// Logs `call`'s failure on `gpu` once: NotSupported (and a driver lacking
/// the function) at debug level, anything else as a warning.
fn log_failure(
    reported: &mut HashSet<(usize, &'static str)>,
    gpu: usize,
    call: &'static str,
    e: &NvmlError,
) {
    if !reported.insert((gpu, call)) {
        return;
    }
    if unsupported(e) {
        debug!(gpu, call, error = %e, "not supported; skipping it");
    } else {
        warn!(gpu, call, error = %e, "NVML call failed; skipping it");
    }
}

impl GpuSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        self.capture_planned(now_ms, &ReadPlan::all())
    }

    /// Skips the NVML calls of every field the plan does not want. GPM is
    /// one sample per GPU for all GPM metrics: it is taken when any of them
    /// is wanted, and then reports all of them over the span since the
    /// previous sample (`window_ms` set when that span is longer than the
    /// capture's window). Trigger metrics (the OFU inputs) are always due.
    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let prev = self.last_ms.replace(now_ms);
        let window_ms = prev.map_or(0, |p| {
            u32::try_from((now_ms - p).max(0)).unwrap_or(u32::MAX)
        });
        let windowed = prev.is_some();
        self.refresh_mig(now_ms);
        // Before the reads: an XID taken now is this capture's `xid_last`.
        let events = self.drain_events(now_ms);
        let mut pass = Pass {
            reported: &mut self.reported,
            plan,
            now_ms,
            window_ms,
        };
        let mut gpus = Vec::with_capacity(self.inventory.len());
        for gpu in &mut self.gpus {
            let listed = gpu.mig.listed;
            // An instance's SM clock is its card's: read it for them too.
            let clocks_for_instances = listed
                && gpu.mig.instances.iter().any(|i| {
                    i.device.is_some()
                        && (plan.wants(i.pos, m::SM_CLOCK_MHZ)
                            || plan.wants(i.pos, m::SM_CLOCK_AVG_MHZ))
                });
            let mut out = pass.out(gpu.pos, clocks_for_instances);
            read_gpu(gpu, windowed, &mut out);
            read_links(gpu, windowed, &mut out);
            let mut readings = out.readings;
            self.gpm_denied[gpu.pos] = gpu.gpm_denied;
            if listed {
                // Counted once, through the instances.
                readings.retain(|r| !INSTANCE_ACTIVITY.contains(&r.metric));
                read_instances(gpu, &readings, &mut pass, &mut self.gpm_denied, &mut gpus);
            }
            gpus.push(GpuCapture {
                gpu: gpu.pos,
                window_ms,
                readings,
            });
        }
        gpus.sort_by_key(|c| c.gpu);
        Ok(Capture {
            ts_ms: now_ms,
            gpus,
            jobs: Vec::new(),
            events,
        })
    }

    fn gpm_permission_denied(&self) -> &[bool] {
        &self.gpm_denied
    }

    fn processes(&self) -> Vec<(usize, u32)> {
        self.gpus
            .iter()
            .flat_map(|gpu| gpu.pids.iter().map(move |&pid| (gpu.pos, pid)))
            .collect()
    }

    /// The figures of each GPU's last per-process utilisation read (see
    /// the module docs): of the last capture's window when the plan read
    /// the process list then.
    fn process_utilization(&self) -> Vec<(usize, u32, f64)> {
        self.gpus
            .iter()
            .flat_map(|gpu| {
                gpu.proc_util
                    .iter()
                    .map(move |&(pid, util)| (gpu.pos, pid, util))
            })
            .collect()
    }
}

/// What every GPU's reads in one capture share.
struct Pass<'a> {
    reported: &'a mut HashSet<(usize, &'static str)>,
    plan: &'a ReadPlan,
    now_ms: i64,
    window_ms: u32,
}

impl Pass<'_> {
    /// An empty [`Out`] for inventory GPU `gpu`.
    fn out(&mut self, gpu: usize, clocks_for_instances: bool) -> Out<'_> {
        Out {
            gpu,
            readings: Vec::with_capacity(24),
            reported: self.reported,
            plan: self.plan,
            now_ms: self.now_ms,
            window_ms: self.window_ms,
            clocks_for_instances,
        }
    }
}

/// The listed MIG instances of the card `gpu`, into `gpus`: each one's GPM
/// pipe metrics over the window, and the card's SM clocks (from
/// `card_readings`), one clock driving the whole GPU. An instance whose
/// GPM sample finds it gone gives nothing, and the card is read again at
/// the next capture.
fn read_instances(
    gpu: &mut Gpu,
    card_readings: &[Reading],
    pass: &mut Pass<'_>,
    gpm_denied: &mut [bool],
    gpus: &mut Vec<GpuCapture>,
) {
    let clocks: Vec<Reading> = card_readings
        .iter()
        .filter(|r| r.metric == m::SM_CLOCK_MHZ || r.metric == m::SM_CLOCK_AVG_MHZ)
        .copied()
        .collect();
    let pipe = &GPM_METRICS[..GPM_PIPE];
    // GPM counts per GPU instance: its first compute instance reports it.
    let mut sampled = Vec::new();
    for inst in gpu.mig.instances.iter_mut().filter(|i| i.device.is_some()) {
        let mut out = pass.out(inst.pos, false);
        if gpu.gpm && !sampled.contains(&inst.gpu_instance_id) {
            sampled.push(inst.gpu_instance_id);
            let wanted = pipe.iter().any(|(_, metric, _)| out.wants(metric));
            let target = Target::Instance(inst.gpu_instance_id);
            if wanted
                && !read_gpm(
                    &gpu.device,
                    target,
                    &mut inst.gpm_pair,
                    &mut inst.gpm_denied,
                    pipe,
                    &mut out,
                )
            {
                gpu.mig.rescan = true;
                continue;
            }
        }
        let plan = out.plan;
        out.readings
            .extend(clocks.iter().filter(|r| plan.wants(inst.pos, r.metric)));
        gpm_denied[inst.pos] = inst.gpm_denied;
        gpus.push(GpuCapture {
            gpu: inst.pos,
            window_ms: out.window_ms,
            readings: out.readings,
        });
    }
}

/// One GPU's readings, and the log-once bookkeeping for its failures.
struct Out<'a> {
    gpu: usize,
    readings: Vec<Reading>,
    reported: &'a mut HashSet<(usize, &'static str)>,
    /// What the sampler needs from this capture.
    plan: &'a ReadPlan,
    /// The capture's time and window.
    now_ms: i64,
    window_ms: u32,
    /// Read the SM clocks whatever the plan says of this GPU: a MIG card's
    /// instances want them.
    clocks_for_instances: bool,
}

impl Out<'_> {
    /// Whether the plan wants `metric` of this GPU.
    fn wants(&self, metric: &str) -> bool {
        self.plan.wants(self.gpu, metric)
            || (self.clocks_for_instances
                && (metric == m::SM_CLOCK_MHZ || metric == m::SM_CLOCK_AVG_MHZ))
    }

    /// Reads `value` under `metric` when the plan wants it (the closure is
    /// the NVML call, not made otherwise), or logs `call`'s failure once.
    fn read(
        &mut self,
        metric: &'static str,
        call: &'static str,
        value: impl FnOnce() -> Result<f64, NvmlError>,
    ) -> Option<f64> {
        if !self.wants(metric) {
            return None;
        }
        self.put(metric, call, value())
    }

    /// Whether the plan wants any of `metrics` of this GPU.
    fn wants_any(&self, metrics: &[&str]) -> bool {
        metrics.iter().any(|metric| self.wants(metric))
    }

    /// Records those of `readings` (metric, value) the plan wants: one
    /// NVML call answers them all.
    fn push_wanted<const N: usize>(&mut self, readings: [(&'static str, f64); N]) {
        for (metric, value) in readings {
            if self.wants(metric) {
                self.readings.push(Reading::new(metric, value));
            }
        }
    }

    /// Records `value` under `metric`, or logs `call`'s failure once.
    fn put(
        &mut self,
        metric: &'static str,
        call: &'static str,
        value: Result<f64, NvmlError>,
    ) -> Option<f64> {
        match value {
            Ok(value) => {
                self.readings.push(Reading::new(metric, value));
                Some(value)
            }
            Err(e) => {
                self.failed(call, &e);
                None
            }
        }
    }

    fn failed(&mut self, call: &'static str, e: &NvmlError) {
        log_failure(self.reported, self.gpu, call, e);
    }
}

fn read_gpu(gpu: &mut Gpu, windowed: bool, out: &mut Out<'_>) {
    // A MIG card's pipe metrics are its instances': only the device-wide
    // GPM metrics are its own.
    let metrics = if gpu.mig.listed {
        &GPM_METRICS[GPM_PIPE..]
    } else {
        &GPM_METRICS[..]
    };
    if gpu.gpm && metrics.iter().any(|(_, metric, _)| out.wants(metric)) {
        read_gpm(
            &gpu.device,
            Target::Card,
            &mut gpu.gpm_pair,
            &mut gpu.gpm_denied,
            metrics,
            out,
        );
    }
    let d = &gpu.device;

    // SM clock: the point read, and the mean of the driver's samples since
    // the newest one already consumed (OFU §IV-C: the point is noisy).
    // Skipping the samples call widens the next one's span by itself.
    let point = out.read(m::SM_CLOCK_MHZ, "nvmlDeviceGetClockInfo(SM)", || {
        d.clock_info(Clock::SM).map(f64::from)
    });
    if windowed && out.wants(m::SM_CLOCK_AVG_MHZ) {
        let average = match d.samples(Sampling::ProcessorClock, gpu.last_clock_us) {
            Ok(samples) => {
                gpu.last_clock_us = samples
                    .iter()
                    .map(|s| s.timestamp)
                    .max()
                    .or(gpu.last_clock_us);
                let values: Vec<f64> = samples.iter().map(|s| sample_value(&s.value)).collect();
                (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
            }
            // The driver's way of saying "nothing newer than last_seen".
            Err(NvmlError::NotFound) => None,
            Err(e) => {
                out.failed("nvmlDeviceGetSamples(PROCESSOR_CLK)", &e);
                None
            }
        };
        if let Some(value) = average.or(point) {
            out.readings.push(Reading::new(m::SM_CLOCK_AVG_MHZ, value));
        }
    }

    out.read(m::POWER_W, "nvmlDeviceGetPowerUsage", || {
        d.power_usage().map(|mw| f64::from(mw) / 1000.0)
    });
    out.read(m::TEMP_C, "nvmlDeviceGetTemperature", || {
        d.temperature(TemperatureSensor::Gpu).map(f64::from)
    });
    // nvml-wrapper 0.13's `memory_info` is `nvmlDeviceGetMemoryInfo_v2`:
    // `used` leaves out what the driver reserves, which is `reserved`.
    const MEMORY: [&str; 3] = [m::MEM_USED_BYTES, m::MEM_FREE_BYTES, m::MEM_RESERVED_BYTES];
    if out.wants_any(&MEMORY) {
        match d.memory_info() {
            Ok(mi) => out.push_wanted([
                (m::MEM_USED_BYTES, mi.used as f64),
                (m::MEM_FREE_BYTES, mi.free as f64),
                (m::MEM_RESERVED_BYTES, mi.reserved as f64),
            ]),
            Err(e) => out.failed("nvmlDeviceGetMemoryInfo_v2", &e),
        }
    }
    // HBM has a sensor of its own; GDDR cards answer NotSupported.
    out.read(
        m::MEMORY_TEMP_C,
        "nvmlDeviceGetFieldValues(MEMORY_TEMP)",
        || memory_temp(d),
    );
    out.read(m::MEM_CLOCK_MHZ, "nvmlDeviceGetClockInfo(MEM)", || {
        d.clock_info(Clock::Memory).map(f64::from)
    });
    // In MIG mode the driver has no whole-GPU utilization rates.
    if windowed && !gpu.mig.listed && (out.wants(m::GPU_UTIL) || out.wants(m::MEM_COPY_UTIL)) {
        match d.utilization_rates() {
            Ok(u) => out.readings.extend([
                Reading::new(m::GPU_UTIL, f64::from(u.gpu) * PERCENT),
                Reading::new(m::MEM_COPY_UTIL, f64::from(u.memory) * PERCENT),
            ]),
            Err(e) => out.failed("nvmlDeviceGetUtilizationRates", &e),
        }
    }
    // The video engines' utilization over the driver's sampling period
    // (about 1/6 s): device-wide, so a MIG card keeps it.
    if windowed {
        out.read(m::ENC_UTIL, "nvmlDeviceGetEncoderUtilization", || {
            d.encoder_utilization()
                .map(|u| f64::from(u.utilization) * PERCENT)
        });
        out.read(m::DEC_UTIL, "nvmlDeviceGetDecoderUtilization", || {
            d.decoder_utilization()
                .map(|u| f64::from(u.utilization) * PERCENT)
        });
    }
    out.read(
        m::THROTTLE_REASONS,
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        || d.current_throttle_reasons().map(|r| r.bits() as f64),
    );
    out.read(
        m::ECC_SBE_TOTAL,
        "nvmlDeviceGetTotalEccErrors(corrected)",
        || {
            d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                .map(|n| n as f64)
        },
    );
    out.read(
        m::ECC_DBE_TOTAL,
        "nvmlDeviceGetTotalEccErrors(uncorrected)",
        || {
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .map(|n| n as f64)
        },
    );
    out.read(m::ENERGY_J, "nvmlDeviceGetTotalEnergyConsumption", || {
        d.total_energy_consumption().map(|mj| mj as f64 / 1000.0)
    });
    // Row remapping (Ampere and newer): lifetime counts, slow counters
    // like ECC (`crate::cadence`), and whether a remapping failed.
    const REMAP: [&str; 3] = [
        m::REMAPPED_ROWS_CORRECTABLE_TOTAL,
        m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL,
        m::ROW_REMAP_FAILURE,
    ];
    if out.wants_any(&REMAP) {
        match remapped_rows(d) {
            Ok(r) => out.push_wanted([
                (m::REMAPPED_ROWS_CORRECTABLE_TOTAL, f64::from(r.correctable)),
                (
                    m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL,
                    f64::from(r.uncorrectable),
                ),
                (m::ROW_REMAP_FAILURE, f64::from(u8::from(r.failure))),
            ]),
            Err(e) => out.failed("nvmlDeviceGetRemappedRows", &e),
        }
    }
    // NVML has no call for the last XID: it is the last one the event set
    // delivered, known only on a GPU registered for XIDs.
    if gpu.xid_watched && out.wants(m::XID_LAST) {
        out.readings
            .push(Reading::new(m::XID_LAST, gpu.xid_last as f64));
    }
    // The PIDs feed job attribution, which tolerates PIDs as old as this
    // metric's interval.
    if out.wants(m::COMPUTE_PROCESSES) {
        match d.running_compute_processes() {
            Ok(processes) => {
                gpu.pids = processes.iter().map(|p| p.pid).collect();
                out.readings
                    .push(Reading::new(m::COMPUTE_PROCESSES, processes.len() as f64));
            }
            Err(e) => {
                gpu.pids.clear();
                out.failed("nvmlDeviceGetComputeRunningProcesses_v3", &e);
            }
        }
        // Shares matter only where two processes (so maybe two owners)
        // run: a GPU with one reads no per-process figures, and its first
        // window starts when a second process appears.
        if gpu.pids.len() >= 2 {
            read_process_util(gpu, out);
        } else {
            gpu.proc_util_read = false;
            gpu.proc_util_us = None;
            gpu.proc_util.clear();
        }
    }
}

/// Each process's SM utilisation over the samples since the newest one
/// consumed (`nvmlDeviceGetProcessUtilization`), into
/// [`Gpu::proc_util`]; see the module docs.
fn read_process_util(gpu: &mut Gpu, out: &mut Out<'_>) {
    let first = !gpu.proc_util_read;
    let since = gpu.proc_util_us;
    match gpu.device.process_utilization_stats(since) {
        Ok(samples) => {
            gpu.proc_util_read = true;
            // Only what is newer than the stamp, whatever the driver sends.
            let fresh = samples
                .iter()
                .filter(|s| since.is_none_or(|t| s.timestamp > t));
            gpu.proc_util_us = fresh.clone().map(|s| s.timestamp).max().or(since);
            gpu.proc_util = if first {
                Vec::new()
            } else {
                mean_sm_util(fresh.map(|s| (s.pid, s.sm_util)))
            };
        }
        // The driver's way of saying "nothing newer than last_seen".
        Err(NvmlError::NotFound) => {
            gpu.proc_util_read = true;
            gpu.proc_util.clear();
        }
        Err(e) => {
            gpu.proc_util.clear();
            out.failed("nvmlDeviceGetProcessUtilization", &e);
        }
    }
}

/// Each PID's mean SM utilisation (percent) over one window's samples
/// (PID, `sm_util`), by PID: its samples' sum over the number of the
/// driver's sample periods in the window, taken as the most samples any
/// one PID has. nvml.h has the driver leave out a process in a period
/// where it was idle; such a period then counts as 0 for it, not as a
/// period it was not there for. (A driver that sends every process every
/// period gives the plain mean.)
fn mean_sm_util(samples: impl IntoIterator<Item = (u32, u32)>) -> Vec<(u32, f64)> {
    let mut by_pid: std::collections::BTreeMap<u32, (u64, u32)> = Default::default();
    for (pid, sm) in samples {
        let e = by_pid.entry(pid).or_default();
        e.0 += u64::from(sm);
        e.1 += 1;
    }
    let periods = by_pid.values().map(|&(_, n)| n).max().unwrap_or(0);
    by_pid
        .into_iter()
        .map(|(pid, (sum, _))| (pid, sum as f64 / f64::from(periods.max(1))))
        .collect()
}

/// Whose GPM samples: the card's, or one of its MIG GPU instances'.
#[derive(Clone, Copy)]
enum Target {
    Card,
    Instance(u32),
}

/// Takes this capture's GPM sample of `target` (on the card `device`)
/// and, when the previous one exists, reads `metrics` over the window
/// between them. False when the sample found no such MIG instance.
fn read_gpm(
    device: &Device<'static>,
    target: Target,
    pair: &mut GpmPair,
    denied: &mut bool,
    metrics: &[(GpmMetricId, &'static str, f64)],
    out: &mut Out<'_>,
) -> bool {
    let (gpu_instance, call) = match target {
        Target::Card => (None, "nvmlGpmSampleGet"),
        Target::Instance(gi) => (Some(gi), "nvmlGpmMigSampleGet"),
    };
    let start = match pair.take(device, gpu_instance, out.now_ms) {
        Ok(start) => start,
        Err(e) => {
            // No window can start at a sample we do not have.
            let gone =
                gpu_instance.is_some() && matches!(e, NvmlError::NotFound | NvmlError::InvalidArg);
            if !gone {
                gpm_failed(denied, out, call, &e);
            }
            return !gone;
        }
    };
    *denied = false;
    let Some(start) = start else { return true };
    // A GPM sample skipped by the read plan widened this window.
    let span = u32::try_from((out.now_ms - start).max(0))
        .ok()
        .filter(|&w| w != out.window_ms);
    let n = metrics.len();
    let mut ids = GPM_METRICS.map(|(id, _, _)| id);
    for (slot, (id, _, _)) in ids.iter_mut().zip(metrics) {
        *slot = *id;
    }
    let mut results = GPM_METRICS.map(|_| Err(NvmlError::Uninitialized));
    match pair.metrics(&ids[..n], &mut results[..n]) {
        Ok(()) => {
            for (&(_, metric, scale), result) in metrics.iter().zip(results) {
                if out.put(metric, metric, result.map(|v| v * scale)).is_some() {
                    if let Some(r) = out.readings.last_mut() {
                        r.window_ms = span;
                    }
                }
            }
        }
        Err(e) => gpm_failed(denied, out, "nvmlGpmMetricsGet", &e),
    }
    true
}

/// A refused GPM call: the one warning for the whole process (every GPU of
/// a container lacks the same capability), and the GPU marked refused;
/// any other failure is logged as usual.
fn gpm_failed(denied: &mut bool, out: &mut Out<'_>, call: &'static str, e: &NvmlError) {
    if !matches!(e, NvmlError::NoPermission) {
        out.failed(call, e);
        return;
    }
    *denied = true;
    if out.reported.insert((NODE, "gpm permission")) {
        warn!(gpu = out.gpu, call, "{GPM_DENIED_HELP}");
    }
}

/// Most NVLink links a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

/// The GPU's NVLink links (those whose state can be read) and how many are
/// up. A GPU without NVLink answers NotSupported: (0, 0).
fn probe_nvlinks(d: &Device<'static>) -> (u32, u32) {
    let mut links = 0;
    let mut up = 0;
    for l in 0..MAX_NVLINKS {
        match d.link_wrapper_for(l).is_active() {
            Ok(a) => {
                links = l + 1;
                up += u32::from(a);
            }
            Err(_) => break,
        }
    }
    (links, up)
}

/// NVLink and PCIe beyond GPM (Moneo Table 1's NVLink and PCIe rows):
///
/// * every GPU: links up (`nvmlDeviceGetNvLinkState`), the replay,
///   recovery and CRC error counters summed over the links
///   (`nvmlDeviceGetNvLinkErrorCounter`), and the PCIe replay counter;
/// * GPUs without GPM: NVLink throughput from the data counters
///   (`nvmlDeviceGetFieldValues`, `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX`,
///   KiB): the counter difference over the time between reads, an exact
///   window mean. nvml-wrapper 0.13 sends `scopeId` 0, which selects link
///   0, so the rate is link 0's × the links up (NCCL stripes traffic
///   evenly over the links); and PCIe throughput from
///   `nvmlDeviceGetPcieThroughput` (KiB/s over the driver's last 20 ms, a
///   short sample rather than a window mean).
fn read_links(gpu: &mut Gpu, windowed: bool, out: &mut Out<'_>) {
    use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
    use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    let d = &gpu.device;
    if gpu.nvlinks > 0 && (out.wants(m::NVLINK_LINKS_ACTIVE) || out.wants(m::NVLINK_ERRORS_TOTAL)) {
        let mut up = 0u32;
        let mut errors = 0u64;
        let mut ok = true;
        for l in 0..gpu.nvlinks {
            let link = d.link_wrapper_for(l);
            match link.is_active() {
                Ok(true) => up += 1,
                Ok(false) => continue,
                Err(e) => {
                    out.failed("nvmlDeviceGetNvLinkState", &e);
                    ok = false;
                    break;
                }
            }
            for c in [
                ErrorCounter::DlReplay,
                ErrorCounter::DlRecovery,
                ErrorCounter::DlCrcFlit,
                ErrorCounter::DlCrcData,
            ] {
                match link.error_counter(c) {
                    Ok(n) => errors = errors.saturating_add(n),
                    Err(e) if unsupported(&e) => {}
                    Err(e) => out.failed("nvmlDeviceGetNvLinkErrorCounter", &e),
                }
            }
        }
        if ok {
            gpu.active_links = up;
            if out.wants(m::NVLINK_LINKS_ACTIVE) {
                out.readings
                    .push(Reading::new(m::NVLINK_LINKS_ACTIVE, f64::from(up)));
            }
            if out.wants(m::NVLINK_ERRORS_TOTAL) {
                out.readings
                    .push(Reading::new(m::NVLINK_ERRORS_TOTAL, errors as f64));
            }
        }
    }
    out.read(
        m::PCIE_REPLAY_TOTAL,
        "nvmlDeviceGetPcieReplayCounter",
        || d.pcie_replay_counter().map(f64::from),
    );
    // GPM covers throughput, unless it is refused (then the reads below
    // stand in, as on a GPU without GPM).
    if gpu.gpm && !gpu.gpm_denied {
        return;
    }
    if gpu.nvlinks > 0 && (out.wants(m::NVLINK_TX_BYTES_S) || out.wants(m::NVLINK_RX_BYTES_S)) {
        const TX: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
        const RX: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
        match d.field_values_for(&[FieldId(TX), FieldId(RX)]) {
            Ok(values) => {
                let kib: Vec<Option<u64>> = values
                    .into_iter()
                    .map(|v| match v.ok()?.value.ok()? {
                        SampleValue::U64(x) => Some(x),
                        SampleValue::U32(x) => Some(u64::from(x)),
                        SampleValue::I64(x) => u64::try_from(x).ok(),
                        SampleValue::F64(_) => None,
                    })
                    .collect();
                if let [Some(tx), Some(rx)] = kib[..] {
                    let now = out.now_ms;
                    if let Some((t, tx0, rx0)) = gpu.last_nvlink.filter(|l| l.0 < now) {
                        let secs = (now - t) as f64 / 1000.0;
                        let span = u32::try_from(now - t).ok().filter(|&w| w != out.window_ms);
                        let links = f64::from(gpu.active_links.max(1));
                        // A counter that went back was reset: no rate.
                        for (metric, c, c0) in [
                            (m::NVLINK_TX_BYTES_S, tx, tx0),
                            (m::NVLINK_RX_BYTES_S, rx, rx0),
                        ] {
                            if c >= c0 {
                                let mut r =
                                    Reading::new(metric, (c - c0) as f64 * 1024.0 * links / secs);
                                r.window_ms = span;
                                out.readings.push(r);
                            }
                        }
                    }
                    if gpu.last_nvlink.is_none_or(|l| l.0 < now) {
                        gpu.last_nvlink = Some((now, tx, rx));
                    }
                } else {
                    out.failed(
                        "nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA)",
                        &NvmlError::NotSupported,
                    );
                }
            }
            Err(e) => out.failed("nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA)", &e),
        }
    }
    if windowed {
        out.read(
            m::PCIE_TX_BYTES_S,
            "nvmlDeviceGetPcieThroughput(TX)",
            || {
                d.pcie_throughput(PcieUtilCounter::Send)
                    .map(|k| f64::from(k) * 1024.0)
            },
        );
        out.read(
            m::PCIE_RX_BYTES_S,
            "nvmlDeviceGetPcieThroughput(RX)",
            || {
                d.pcie_throughput(PcieUtilCounter::Receive)
                    .map(|k| f64::from(k) * 1024.0)
            },
        );
    }
}

/// The memory (HBM) temperature, °C: field `NVML_FI_DEV_MEMORY_TEMP` of
/// `nvmlDeviceGetFieldValues`, whose own return says NotSupported on a
/// GPU without the sensor.
fn memory_temp(d: &Device<'static>) -> Result<f64, NvmlError> {
    const ID: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_MEMORY_TEMP;
    let sample = d
        .field_values_for(&[FieldId(ID)])?
        .into_iter()
        .next()
        .ok_or(NvmlError::Unknown)??;
    sample.value.map(|v| sample_value(&v))
}

fn sample_value(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::mean_sm_util;

    #[test]
    fn every_sample_period_counts_for_every_process() {
        // Two periods; PID 7 was idle in the second and left out of it.
        let got = mean_sm_util([(5, 40), (7, 20), (5, 60)]);
        assert_eq!(got, vec![(5, 50.0), (7, 10.0)]);
        // A driver that sends every process every period: the plain mean.
        let got = mean_sm_util([(5, 40), (7, 0), (5, 61), (7, 3)]);
        assert_eq!(got, vec![(5, 50.5), (7, 1.5)]);
        assert!(mean_sm_util([]).is_empty());
    }
}
