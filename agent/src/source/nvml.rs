//! NVML through nvml-wrapper: the source for real NVIDIA GPUs.
//!
//! * **Tensor activity and the other pipe counters** come from GPM on
//!   Hopper and newer: each capture takes *one* GPM sample per GPU and diffs
//!   it against the previous capture's sample (`nvmlGpmMetricsGet`; two
//!   samples per GPU reused in turn, [`super::gpm`]), so every
//!   value is the hardware's exact average over the window, whatever its
//!   length (the OFU paper's eq. 1 needs tensor pipe activity as a window
//!   mean). NVML reports utilizations in percent and bandwidth in MiB/s;
//!   they become fractions and bytes/s here.
//! * **The SM clock** is read twice: the instantaneous `clock_info` point
//!   (`sm_clock_mhz`), whose noise OFU §IV-C measures, and the mean of the
//!   driver's processor-clock samples since the last one seen
//!   (`sm_clock_avg_mhz`), the window average OFU wants. With no new
//!   samples the point clock stands in.
//! * Power, temperature, memory, clocks, utilization rates, throttle
//!   reasons, ECC and energy are plain reads.
//! * **Compute processes** (`nvmlDeviceGetComputeRunningProcesses_v3`):
//!   their count is `compute_processes` every capture, and their PIDs are
//!   kept per GPU ([`NvmlSource::last_pids`], [`GpuSource::processes`]) for
//!   job attribution ([`crate::attribution`]).
//! * **Events**: at open, one NVML event set is created and every GPU that
//!   supports them is registered for critical XID errors and double-bit ECC
//!   errors (GPUs answering NotSupported are skipped). Each capture drains
//!   the set without waiting (`nvmlEventSetWait_v2` with a 0 ms timeout,
//!   until it times out) into [`Capture::events`]: kind `"xid"` with the XID
//!   as code, or `"ecc_dbe"`.
//! * **MIG mode** is read once at open; NotSupported (or a driver without
//!   the call) means MIG is off. MIG instances are not enumerated yet.
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
//! it came from, and the crate keeps raw handles out of its code (the one
//! exception is [`super::gpm`], the allocation-free GPM reads). The `Nvml`
//! is therefore leaked into a `&'static Nvml`: at most
//! one per library path per process (a repeated `open` of the same path
//! reuses it), which is what a node agent needs anyway: NVML is loaded once
//! and lives as long as the process.

use super::gpm::GpmPair;
use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use crate::sampler::ReadPlan;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::Event;
use flopwatch_proto::model::GpuInfo;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, Sampling, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use tracing::{debug, warn};

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

/// GPM metrics read every window: NVML id, catalog name, unit factor.
const GPM_METRICS: [(GpmMetricId, &str, f64); 11] = [
    (GpmMetricId::AnyTensorUtil, m::TENSOR_ACTIVE, PERCENT),
    (GpmMetricId::SmUtil, m::SM_ACTIVE, PERCENT),
    (GpmMetricId::SmOccupancy, m::SM_OCCUPANCY, PERCENT),
    (GpmMetricId::DramBwUtil, m::DRAM_ACTIVE, PERCENT),
    (GpmMetricId::Fp16Util, m::FP16_ACTIVE, PERCENT),
    (GpmMetricId::Fp32Util, m::FP32_ACTIVE, PERCENT),
    (GpmMetricId::Fp64Util, m::FP64_ACTIVE, PERCENT),
    (GpmMetricId::NvlinkTotalTxPerSec, m::NVLINK_TX_BYTES_S, MIB),
    (GpmMetricId::NvlinkTotalRxPerSec, m::NVLINK_RX_BYTES_S, MIB),
    (GpmMetricId::PcieTxPerSec, m::PCIE_TX_BYTES_S, MIB),
    (GpmMetricId::PcieRxPerSec, m::PCIE_RX_BYTES_S, MIB),
];

/// The GPUs of this node, read through NVML.
pub struct NvmlSource {
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
    /// Whether MIG mode is enabled (read at open).
    mig: bool,
    /// NVLink links the GPU has (0 for a GPU without NVLink), probed at open.
    nvlinks: u32,
    /// Links up at the last state read.
    active_links: u32,
    /// The NVLink data counters at the previous read (GPUs without GPM):
    /// (unix ms, tx KiB, rx KiB).
    last_nvlink: Option<(i64, u64, u64)>,
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
            if mig {
                warn!(
                    index,
                    "MIG is enabled; MIG instances are not enumerated, counters are whole-GPU"
                );
            }
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
                mig_parent_uuid: None,
            });
            let (nvlinks, active_links) = probe_nvlinks(&device);
            gpus.push(Gpu {
                device,
                gpm,
                gpm_denied: false,
                gpm_pair: GpmPair::new(nvml),
                last_clock_us: None,
                pids: Vec::new(),
                mig,
                nvlinks,
                active_links,
                last_nvlink: None,
            });
        }
        let mut reported = HashSet::new();
        let events = event_set(nvml, &gpus, &mut reported);
        Ok(Self {
            gpm_denied: vec![false; gpus.len()],
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
    pub fn last_pids(&self) -> Vec<(String, Vec<u32>)> {
        self.inventory
            .iter()
            .zip(&self.gpus)
            .map(|(info, gpu)| (info.uuid.clone(), gpu.pids.clone()))
            .collect()
    }

    /// Whether MIG mode is enabled on inventory GPU `gpu` (false when the
    /// GPU or driver does not support MIG).
    pub fn mig_enabled(&self, gpu: usize) -> bool {
        self.gpus.get(gpu).is_some_and(|g| g.mig)
    }

    /// Takes every pending event off the event set, without waiting.
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
/// [`WATCHED_EVENTS`]; `None` when there is no set or no GPU registered.
fn event_set(
    nvml: &'static Nvml,
    gpus: &[Gpu],
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
    for (index, gpu) in gpus.iter().enumerate() {
        let wanted = match gpu.device.supported_event_types() {
            Ok(types) => types & WATCHED_EVENTS,
            Err(e) => {
                log_failure(reported, index, "nvmlDeviceGetSupportedEventTypes", &e);
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
            }
            Err(e) => {
                if registered > 0 {
                    warn!(
                        gpu = index,
                        error = %e.error,
                        "NVML event registration failed; earlier GPUs' events are lost"
                    );
                    registered = 0;
                } else {
                    log_failure(reported, index, "nvmlDeviceRegisterEvents", &e.error);
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

/// Whether `e` says the GPU or driver lacks the call (not a failure).
fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
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
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for (index, gpu) in self.gpus.iter_mut().enumerate() {
            let mut out = Out {
                gpu: index,
                readings: Vec::with_capacity(24),
                reported: &mut self.reported,
                plan,
                now_ms,
                window_ms,
            };
            read_gpu(gpu, windowed, &mut out);
            read_links(gpu, windowed, &mut out);
            self.gpm_denied[index] = gpu.gpm_denied;
            gpus.push(GpuCapture {
                gpu: index,
                window_ms,
                readings: out.readings,
            });
        }
        let events = self.drain_events(now_ms);
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
            .enumerate()
            .flat_map(|(g, gpu)| gpu.pids.iter().map(move |&pid| (g, pid)))
            .collect()
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
}

impl Out<'_> {
    /// Whether the plan wants `metric` of this GPU.
    fn wants(&self, metric: &str) -> bool {
        self.plan.wants(self.gpu, metric)
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
    if gpu.gpm && GPM_METRICS.iter().any(|(_, metric, _)| out.wants(metric)) {
        read_gpm(gpu, out);
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
    out.read(m::MEM_USED_BYTES, "nvmlDeviceGetMemoryInfo", || {
        d.memory_info().map(|mi| mi.used as f64)
    });
    out.read(m::MEM_CLOCK_MHZ, "nvmlDeviceGetClockInfo(MEM)", || {
        d.clock_info(Clock::Memory).map(f64::from)
    });
    if windowed && (out.wants(m::GPU_UTIL) || out.wants(m::MEM_COPY_UTIL)) {
        match d.utilization_rates() {
            Ok(u) => out.readings.extend([
                Reading::new(m::GPU_UTIL, f64::from(u.gpu) * PERCENT),
                Reading::new(m::MEM_COPY_UTIL, f64::from(u.memory) * PERCENT),
            ]),
            Err(e) => out.failed("nvmlDeviceGetUtilizationRates", &e),
        }
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
    }
}

/// Takes this capture's GPM sample and, when the previous one exists,
/// reads every GPM metric over the window between them.
fn read_gpm(gpu: &mut Gpu, out: &mut Out<'_>) {
    let start = match gpu.gpm_pair.take(&gpu.device, out.now_ms) {
        Ok(start) => start,
        Err(e) => {
            // No window can start at a sample we do not have.
            gpm_failed(gpu, out, "nvmlGpmSampleGet", &e);
            return;
        }
    };
    gpu.gpm_denied = false;
    let Some(start) = start else { return };
    // A GPM sample skipped by the read plan widened this window.
    let span = u32::try_from((out.now_ms - start).max(0))
        .ok()
        .filter(|&w| w != out.window_ms);
    let ids = GPM_METRICS.map(|(id, _, _)| id);
    let mut results = GPM_METRICS.map(|_| Err(NvmlError::Uninitialized));
    match gpu.gpm_pair.metrics(&ids, &mut results) {
        Ok(()) => {
            for (&(_, metric, scale), result) in GPM_METRICS.iter().zip(results) {
                if out.put(metric, metric, result.map(|v| v * scale)).is_some() {
                    if let Some(r) = out.readings.last_mut() {
                        r.window_ms = span;
                    }
                }
            }
        }
        Err(e) => gpm_failed(gpu, out, "nvmlGpmMetricsGet", &e),
    }
}

/// A refused GPM call: the one warning for the whole process (every GPU of
/// a container lacks the same capability), and the GPU marked refused;
/// any other failure is logged as usual.
fn gpm_failed(gpu: &mut Gpu, out: &mut Out<'_>, call: &'static str, e: &NvmlError) {
    if !matches!(e, NvmlError::NoPermission) {
        out.failed(call, e);
        return;
    }
    gpu.gpm_denied = true;
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
    use nvml_wrapper::structs::device::FieldId;
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

fn sample_value(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}
