//! The fake driver's state and every answer it gives, in safe Rust.
//!
//! [`Fake`] is one simulated node ([`SimModel`]) plus what a driver keeps
//! between calls: the init reference count, allocated GPM samples and the
//! energy counters. The C exports in `exports.rs` only translate pointers
//! to and from these methods, so the logic is testable without FFI.

use crate::config::{ConfigError, FakeConfig, RemapSpec, ENV_VAR};
use crate::derived;
use crate::mig::{InstanceAt, MigNode, MAX_INSTANCES};
use crate::schedule::Schedule;
use crate::share::{self, ShareSpec};
use flopwatch_sim::{FleetPlan, GpuPlan, GpuState, SimModel, WindowMean, Workload, TICK_MS};
use nvml_wrapper_sys::bindings as sys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// An NVML return code.
pub(crate) type Ret = sys::nvmlReturn_t;

/// Device handles are tagged integers, never dereferenced: handle of GPU
/// `i` is `DEVICE_TAG + i`. A stray pointer is rejected, not followed.
const DEVICE_TAG: usize = 0x7e57_0000;
/// MIG device handles are `MIG_TAG + MIG_STRIDE × card + GPU instance id`,
/// valid while that instance exists.
const MIG_TAG: usize = 0x7e58_0000;
/// Handle space per card for its MIG devices.
const MIG_STRIDE: usize = 16;
/// GPM sample handles are `SAMPLE_TAG + n`, looked up in a table.
const SAMPLE_TAG: usize = 0x6e50_0000;
/// Most GPM samples alive at once (a leak in a caller hits this bound).
const MAX_LIVE_SAMPLES: usize = 4096;
/// Event set handles are `EVENT_SET_TAG + n`, looked up in a table.
const EVENT_SET_TAG: usize = 0x5e70_0000;
/// Most event sets alive at once.
const MAX_EVENT_SETS: usize = 1024;
/// PID of the one process of a busy GPU `g`: `PID_BASE + g`.
pub(crate) const PID_BASE: u32 = 10_000;
/// Event types the fake's GPUs support (nvml.h `nvmlEventType*`).
pub(crate) const SUPPORTED_EVENTS: u64 = (sys::nvmlEventTypeXidCriticalError
    | sys::nvmlEventTypeDoubleBitEccError
    | sys::nvmlEventTypeSingleBitEccError) as u64;
/// Memory the driver reserves on the device, bytes.
const RESERVED_BYTES: u64 = 512 << 20;
/// NVLink links on an H100 SXM.
const NVLINK_LINKS: f64 = 18.0;
/// One MiB: GPM reports bandwidth in MiB/s (nvml.h).
const MIB: f64 = 1024.0 * 1024.0;
/// Longest stretch the energy counter integrates tick by tick; a longer gap
/// is charged at the mean power of its last hour (bounded work per call).
const ENERGY_EXACT_MS: i64 = 3_600_000;

/// Fake clock: 0 means the wall clock, anything else is a frozen unix ms.
static FROZEN_MS: AtomicI64 = AtomicI64::new(0);

/// The one driver state of this copy of the library.
static STATE: Mutex<Option<Fake>> = Mutex::new(None);

/// Freezes the fake clock at `ms` (0 returns to the wall clock).
pub(crate) fn set_time_ms(ms: i64) {
    FROZEN_MS.store(ms, Ordering::SeqCst);
}

/// Now on the fake clock, unix ms.
pub(crate) fn now_ms() -> i64 {
    match FROZEN_MS.load(Ordering::SeqCst) {
        0 => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
        ms => ms,
    }
}

fn lock() -> MutexGuard<'static, Option<Fake>> {
    // A panic while holding the lock cannot leave the state half-written in
    // a way that matters to a fake; keep serving.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `nvmlInit`: builds the state from the environment on first use (unless
/// a test configured it already) and counts the reference.
pub(crate) fn init() -> Ret {
    let mut guard = lock();
    if guard.is_none() {
        let spec = std::env::var(ENV_VAR).unwrap_or_default();
        match FakeConfig::parse(&spec) {
            Ok(config) => {
                crate::hang::arm(config.hang_after);
                *guard = Some(Fake::new(config, now_ms()));
            }
            Err(e) => {
                eprintln!("fake libnvidia-ml: {ENV_VAR}={spec:?}: {e}");
                return sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
            }
        }
    }
    if let Some(fake) = guard.as_mut() {
        fake.init_count += 1;
    }
    sys::nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlShutdown`: drops one reference; the simulated node stays (a later
/// init sees the same GPUs, as after a real driver re-init).
pub(crate) fn shutdown() -> Ret {
    if let Some(fake) = lock().as_mut() {
        fake.init_count = fake.init_count.saturating_sub(1);
    }
    sys::nvmlReturn_enum_NVML_SUCCESS
}

/// Replaces the simulated node (keeps the init count, drops GPM samples'
/// contents so no window spans two configurations).
pub(crate) fn configure(spec: &str) -> Result<(), ConfigError> {
    let config = FakeConfig::parse(spec)?;
    // Before the state lock: a call blocked in the gate holds no lock.
    crate::hang::arm(config.hang_after);
    let mut guard = lock();
    let mut fake = Fake::new(config, now_ms());
    if let Some(old) = guard.take() {
        fake.init_count = old.init_count;
        fake.samples = old.samples.into_keys().map(|k| (k, None)).collect();
        fake.next_sample = old.next_sample;
        // Sets stay valid handles, but their registrations named the old
        // node's GPUs.
        fake.event_sets = old
            .event_sets
            .into_iter()
            .map(|(k, set)| {
                (
                    k,
                    EventSet {
                        created_ms: set.created_ms,
                        ..EventSet::default()
                    },
                )
            })
            .collect();
        fake.next_event_set = old.next_event_set;
    }
    *guard = Some(fake);
    Ok(())
}

/// Runs `f` on the initialized state; `NVML_ERROR_UNINITIALIZED` otherwise.
pub(crate) fn with<R>(f: impl FnOnce(&mut Fake) -> Result<R, Ret>) -> Result<R, Ret> {
    match lock().as_mut() {
        Some(fake) if fake.init_count > 0 => {
            fake.follow_schedule();
            f(fake)
        }
        _ => Err(sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED),
    }
}

/// When and on which GPU (or MIG GPU instance) a GPM sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    gpu: usize,
    /// `Some`: a MIG GPU instance's sample (`nvmlGpmMigSampleGet`).
    gpu_instance: Option<u32>,
    t_ms: i64,
}

/// What a device handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    /// A card (a whole GPU, or a card in MIG mode).
    Card(usize),
    /// A MIG device: the card and the instance.
    Mig(usize, InstanceAt),
}

/// A GPU's energy counter: integrated up to `t_ms`.
#[derive(Debug, Clone, Copy)]
struct EnergyMeter {
    t_ms: i64,
    mj: f64,
}

/// One `nvmlEventSet_t`: what is registered on it and what it delivered.
#[derive(Debug, Clone, Default)]
struct EventSet {
    /// When the set was created (fake clock): earlier XIDs are not seen.
    created_ms: i64,
    /// Registered event-type mask per GPU.
    registered: HashMap<usize, u64>,
    /// Indices into `FakeConfig::xids` already queued on this set.
    queued: Vec<usize>,
    /// Events waiting to be delivered: (GPU, type, data).
    queue: std::collections::VecDeque<(usize, u64, u64)>,
}

/// One delivered NVML event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventOut {
    pub gpu: usize,
    pub event_type: u64,
    pub data: u64,
}

/// One process's utilisation sample (`nvmlProcessUtilizationSample_t`;
/// the video engines are idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessSample {
    pub pid: u32,
    /// When the sample's tick ended, µs on the fake clock.
    pub ts_us: u64,
    /// Percent of the GPU's SMs.
    pub sm_util: u32,
    /// Percent of the GPU's memory bandwidth.
    pub mem_util: u32,
}

/// The end of tick `k`, µs: the stamp of its samples.
fn tick_end_us(k: i64) -> u64 {
    (k as u64 + 1) * (TICK_MS * 1000) as u64
}

/// PCI identity of a fake GPU.
pub(crate) struct Pci {
    pub bus: u32,
    pub bus_id: String,
    pub bus_id_legacy: String,
    pub device_id: u32,
    pub subsystem_id: u32,
}

/// One simulated node behind the fake driver.
pub(crate) struct Fake {
    pub config: FakeConfig,
    pub model: SimModel,
    /// The cards' MIG layouts and instances.
    pub mig: MigNode,
    init_count: u32,
    samples: HashMap<usize, Option<Stamp>>,
    next_sample: usize,
    energy: Vec<EnergyMeter>,
    /// NVLink data counters, bytes since the driver loaded, integrated up
    /// to `t_ms`: (t_ms, tx, rx) per GPU.
    nvlink: Vec<(i64, f64, f64)>,
    event_sets: HashMap<usize, EventSet>,
    next_event_set: usize,
    /// The load schedule GPU 0 follows (`schedule=PATH`).
    schedule: Option<Schedule>,
}

impl Fake {
    /// The node `config` describes; the driver "loads" at `now_ms`.
    pub(crate) fn new(config: FakeConfig, now_ms: i64) -> Self {
        let fleet = FleetPlan::new(config.nodes, config.gpus, config.regress_after_ms);
        let start = config.start_ms.unwrap_or(now_ms);
        let mut model = SimModel::new(&fleet, config.node, start, config.seed);
        let schedule = config.schedule.clone().map(|path| {
            // A load process owns GPU 0 from the start; it is idle until
            // the schedule's first step.
            model.plans[0] = GpuPlan {
                job: Some("load".to_string()),
                workload: Workload::Steps { steps: Vec::new() },
                turns: None,
            };
            Schedule::new(path)
        });
        let energy = vec![
            EnergyMeter {
                t_ms: now_ms,
                mj: 0.0
            };
            config.gpus
        ];
        let nvlink = vec![(now_ms, 0.0, 0.0); config.gpus];
        let mig = MigNode::new(&config, start);
        Self {
            config,
            model,
            mig,
            init_count: 0,
            samples: HashMap::new(),
            next_sample: 0,
            energy,
            nvlink,
            event_sets: HashMap::new(),
            next_event_set: 0,
            schedule,
        }
    }

    /// GPU 0 takes the schedule file's steps, when it changed (unix ms in
    /// the file, ms after the fleet start in the workload).
    pub(crate) fn follow_schedule(&mut self) {
        let Some(steps) = self.schedule.as_mut().and_then(Schedule::refresh) else {
            return;
        };
        let start = self.model.start_ms;
        self.model.plans[0].workload = Workload::Steps {
            steps: steps.iter().map(|&(t, v)| (t - start, v)).collect(),
        };
    }

    /// The opaque handle of GPU `gpu`.
    pub(crate) fn handle_of(&self, gpu: usize) -> Result<usize, Ret> {
        if gpu < self.model.gpu_count() {
            Ok(DEVICE_TAG + gpu)
        } else {
            Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        }
    }

    /// The card a handle names. A live MIG device is `NOT_SUPPORTED`: the
    /// calls that take one resolve it with [`Fake::device`].
    pub(crate) fn gpu(&self, handle: usize, now: i64) -> Result<usize, Ret> {
        match self.device(handle, now)? {
            Dev::Card(g) => Ok(g),
            Dev::Mig(..) => Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        }
    }

    /// The card or MIG device a handle names at `now`; a MIG device whose
    /// instance no longer exists is an invalid handle.
    pub(crate) fn device(&self, handle: usize, now: i64) -> Result<Dev, Ret> {
        let invalid = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        if let Some(g) = handle.checked_sub(DEVICE_TAG) {
            if g < self.model.gpu_count() {
                return Ok(Dev::Card(g));
            }
        }
        let m = handle.checked_sub(MIG_TAG).ok_or(invalid)?;
        let (g, id) = (m / MIG_STRIDE, m % MIG_STRIDE);
        if g >= self.model.gpu_count() {
            return Err(invalid);
        }
        self.mig
            .instance_at(g, id as u32, now)
            .map(|i| Dev::Mig(g, i))
            .ok_or(invalid)
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex`: the `index`-th instance of
    /// card `gpu` now; `NOT_FOUND` past the last.
    pub(crate) fn mig_handle(&self, gpu: usize, index: u32, now: i64) -> Result<usize, Ret> {
        if index >= MAX_INSTANCES {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        if !self.mig.layout_at(gpu, now).is_on() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        let instances = self.mig.instances_at(gpu, now);
        let i = instances
            .get(index as usize)
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        Ok(MIG_TAG + MIG_STRIDE * gpu + i.gpu_instance_id as usize)
    }

    /// `nvmlDeviceGetMaxMigDeviceCount`: 7 in MIG mode, 0 otherwise.
    pub(crate) fn max_mig_devices(&self, gpu: usize, now: i64) -> u32 {
        if self.mig.layout_at(gpu, now).is_on() {
            MAX_INSTANCES
        } else {
            0
        }
    }

    /// `nvmlDeviceGetMigMode`: enabled per the card's layout now, or
    /// `NOT_SUPPORTED` on a card without MIG.
    pub(crate) fn mig_mode(&self, gpu: usize, now: i64) -> Result<u32, Ret> {
        if !self.mig.supported(gpu) {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        Ok(if self.mig.layout_at(gpu, now).is_on() {
            sys::NVML_DEVICE_MIG_ENABLE
        } else {
            sys::NVML_DEVICE_MIG_DISABLE
        })
    }

    /// Card `gpu`'s state at `now`: the simulator's GPU, or in MIG mode
    /// the mix of its instances ([`MigNode::card_tick`]).
    pub(crate) fn state_at(&self, gpu: usize, now: i64) -> GpuState {
        self.mig.card_state_at(&self.model, gpu, now)
    }

    /// Card `gpu`'s exact means over `[from, to)`, MIG mode included.
    pub(crate) fn window(&self, gpu: usize, from: i64, to: i64) -> WindowMean {
        self.mig.card_window(&self.model, gpu, from, to)
    }

    /// PCI identity: an HGX-like layout, one bus per GPU.
    pub(crate) fn pci(&self, gpu: usize) -> Pci {
        let bus = 0x18 + gpu as u32;
        Pci {
            bus,
            bus_id: format!("00000000:{bus:02X}:00.0"),
            bus_id_legacy: format!("0000:{bus:02X}:00.0"),
            // Device 0x2330 (H100 SXM5 80GB), vendor 0x10DE.
            device_id: 0x2330_10DE,
            subsystem_id: 0x16C1_10DE,
        }
    }

    /// `nvmlDeviceGetClockInfo`: the clock right now.
    pub(crate) fn clock(
        &self,
        gpu: usize,
        clock: sys::nvmlClockType_t,
        now: i64,
    ) -> Result<u32, Ret> {
        let s = self.state_at(gpu, now);
        match clock {
            sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS | sys::nvmlClockType_enum_NVML_CLOCK_SM => {
                Ok(s.sm_clock_mhz.round() as u32)
            }
            sys::nvmlClockType_enum_NVML_CLOCK_MEM => Ok(s.mem_clock_mhz.round() as u32),
            sys::nvmlClockType_enum_NVML_CLOCK_VIDEO => Ok((s.sm_clock_mhz * 0.9).round() as u32),
            _ => Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    /// `nvmlDeviceGetMaxClockInfo`.
    pub(crate) fn max_clock(&self, clock: sys::nvmlClockType_t) -> Result<u32, Ret> {
        let m = &self.model.model;
        match clock {
            sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS
            | sys::nvmlClockType_enum_NVML_CLOCK_SM
            | sys::nvmlClockType_enum_NVML_CLOCK_VIDEO => Ok(m.max_sm_clock_mhz),
            sys::nvmlClockType_enum_NVML_CLOCK_MEM => Ok(m.max_mem_clock_mhz),
            _ => Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    /// `nvmlDeviceGetPowerUsage`, milliwatts.
    pub(crate) fn power_mw(&self, gpu: usize, now: i64) -> u32 {
        (self.state_at(gpu, now).power_w.max(0.0) * 1000.0).round() as u32
    }

    /// `nvmlDeviceGetTemperature` (GPU sensor), °C.
    pub(crate) fn temperature(&self, gpu: usize, now: i64) -> u32 {
        self.state_at(gpu, now).temp_c.max(0.0).round() as u32
    }

    /// `NVML_FI_DEV_MEMORY_TEMP`, °C ([`derived::memory_temp_c`]);
    /// `NOT_SUPPORTED` with `memory_temp=0` (a GDDR card).
    pub(crate) fn memory_temp(&self, gpu: usize, now: i64) -> Result<u32, Ret> {
        if !self.config.memory_temp {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        Ok(derived::memory_temp_c(&self.state_at(gpu, now)))
    }

    /// `nvmlDeviceGetEncoderUtilization` / `nvmlDeviceGetDecoderUtilization`:
    /// (percent, sampling period µs) as configured (`enc_util`,
    /// `dec_util`).
    pub(crate) fn video_util(&self, encoder: bool) -> (u32, u32) {
        let pct = if encoder {
            self.config.enc_util
        } else {
            self.config.dec_util
        };
        (pct, derived::VIDEO_SAMPLING_PERIOD_US)
    }

    /// `nvmlDeviceGetRemappedRows`: the GPU's `remapped_rows` entry (the
    /// last one given for it), or no remapping at all.
    pub(crate) fn remapped_rows(&self, gpu: usize) -> RemapSpec {
        self.config
            .remapped_rows
            .iter()
            .rev()
            .find(|r| r.gpu == gpu)
            .copied()
            .unwrap_or(RemapSpec {
                gpu,
                ..RemapSpec::default()
            })
    }

    /// `nvmlDeviceGetMemoryInfo_v2`: (total, reserved, free, used) bytes.
    pub(crate) fn memory(&self, gpu: usize, now: i64) -> (u64, u64, u64, u64) {
        let total = self.model.model.memory_total_bytes;
        let usable = total - RESERVED_BYTES;
        let used = (self.state_at(gpu, now).mem_used_bytes.max(0.0) as u64).min(usable);
        (total, RESERVED_BYTES, usable - used, used)
    }

    /// `nvmlDeviceGetUtilizationRates`: percent over the last second, like
    /// the driver's own sample period.
    /// A card in MIG mode answers `NOT_SUPPORTED`, as the driver does.
    pub(crate) fn utilization(&self, gpu: usize, now: i64) -> Result<(u32, u32), Ret> {
        if self.mig.layout_at(gpu, now).is_on() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        let w = self.window(gpu, now - 1000, now).mean;
        let pct = |x: f64| (100.0 * x).clamp(0.0, 100.0).round() as u32;
        Ok((pct(w.sm_active), pct(w.dram_active)))
    }

    /// `nvmlDeviceGetCurrentClocksThrottleReasons`: idle, or power-capped
    /// under heavy tensor load (which is what pulls the clock to ~1352 MHz).
    pub(crate) fn throttle_reasons(&self, gpu: usize, now: i64) -> u64 {
        let s = self.state_at(gpu, now);
        if s.sm_active == 0.0 && s.tensor_active == 0.0 {
            u64::from(sys::nvmlClocksEventReasonGpuIdle)
        } else if s.tensor_active > 0.3 {
            u64::from(sys::nvmlClocksEventReasonSwPowerCap)
        } else {
            u64::from(sys::nvmlClocksEventReasonNone)
        }
    }

    /// `nvmlDeviceGetTotalEccErrors`: a healthy GPU, always zero.
    pub(crate) fn ecc_errors(
        &self,
        error_type: sys::nvmlMemoryErrorType_t,
        counter: sys::nvmlEccCounterType_t,
    ) -> Result<u64, Ret> {
        let known_type = error_type
            == sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED
            || error_type == sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
        let known_counter = counter == sys::nvmlEccCounterType_enum_NVML_VOLATILE_ECC
            || counter == sys::nvmlEccCounterType_enum_NVML_AGGREGATE_ECC;
        if known_type && known_counter {
            Ok(0)
        } else {
            Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        }
    }

    /// `nvmlDeviceGetTotalEnergyConsumption`: mJ since the driver loaded,
    /// the integral of the simulated power. Monotonic even if the fake clock
    /// is moved back.
    pub(crate) fn energy_mj(&mut self, gpu: usize, now: i64) -> u64 {
        let meter = self.energy[gpu];
        if now > meter.t_ms {
            let from = meter.t_ms.max(now - ENERGY_EXACT_MS);
            let mean_w = self.window(gpu, from, now).mean.power_w.max(0.0);
            self.energy[gpu] = EnergyMeter {
                t_ms: now,
                mj: meter.mj + mean_w * (now - meter.t_ms) as f64,
            };
        }
        self.energy[gpu].mj as u64
    }

    /// NVLink data counters (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX`),
    /// KiB since the driver loaded, summed over the active links: the
    /// integral of the simulated NVLink throughput. `None` when no link is
    /// up.
    pub(crate) fn nvlink_kib(&mut self, gpu: usize, now: i64) -> Option<(u64, u64)> {
        let (t, tx, rx) = self.nvlink[gpu];
        if now > t {
            let from = t.max(now - ENERGY_EXACT_MS);
            let w = self.window(gpu, from, now).mean;
            let secs = (now - t) as f64 / 1000.0;
            self.nvlink[gpu] = (
                now,
                tx + w.nvlink_tx_bytes_s.max(0.0) * secs,
                rx + w.nvlink_rx_bytes_s.max(0.0) * secs,
            );
        }
        let (_, tx, rx) = self.nvlink[gpu];
        (self.config.nvlinks > 0).then(|| ((tx / 1024.0) as u64, (rx / 1024.0) as u64))
    }

    /// `nvmlDeviceGetNvLinkState`: links below `nvlinks` are active.
    pub(crate) fn nvlink_active(&self, link: u32) -> Result<bool, Ret> {
        if link >= crate::config::MAX_NVLINKS {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        Ok(link < self.config.nvlinks)
    }

    /// `nvmlDeviceGetNvLinkErrorCounter`: `nvlink_replays` replay errors
    /// on every active link, no other errors.
    pub(crate) fn nvlink_errors(
        &self,
        link: u32,
        counter: sys::nvmlNvLinkErrorCounter_t,
    ) -> Result<u64, Ret> {
        let active = self.nvlink_active(link)?;
        Ok(
            if active && counter == sys::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY {
                self.config.nvlink_replays
            } else {
                0
            },
        )
    }

    /// `nvmlDeviceGetPcieThroughput`: KiB/s over the last 20 ms, as the
    /// driver samples it.
    pub(crate) fn pcie_kib_s(
        &self,
        gpu: usize,
        counter: sys::nvmlPcieUtilCounter_t,
        now: i64,
    ) -> Result<u32, Ret> {
        let w = self.window(gpu, now - 20, now).mean;
        let bytes = match counter {
            sys::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => w.pcie_tx_bytes_s,
            sys::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => w.pcie_rx_bytes_s,
            _ => return Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        };
        Ok((bytes / 1024.0).clamp(0.0, f64::from(u32::MAX)) as u32)
    }

    /// `nvmlDeviceGetSamples`: one sample per completed 10 ms tick, stamped
    /// (µs) at the tick's end, newer than `last_seen_us`, at most the newest
    /// `ring` of them, oldest first. `NVML_ERROR_NOT_FOUND` when there are
    /// none, as the real driver reports.
    pub(crate) fn samples(
        &self,
        gpu: usize,
        kind: sys::nvmlSamplingType_t,
        last_seen_us: u64,
        now: i64,
    ) -> Result<Vec<(u64, u32)>, Ret> {
        let value: fn(&GpuState) -> u32 = match kind {
            sys::nvmlSamplingType_enum_NVML_PROCESSOR_CLK_SAMPLES => {
                |s| s.sm_clock_mhz.round() as u32
            }
            sys::nvmlSamplingType_enum_NVML_MEMORY_CLK_SAMPLES => {
                |s| s.mem_clock_mhz.round() as u32
            }
            sys::nvmlSamplingType_enum_NVML_TOTAL_POWER_SAMPLES => {
                |s| (s.power_w.max(0.0) * 1000.0).round() as u32
            }
            _ => return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        };
        Ok(self
            .new_ticks(last_seen_us, now)?
            .map(|k| (tick_end_us(k), value(&self.state_at(gpu, k * TICK_MS))))
            .collect())
    }

    /// The driver's sample ring at `now`: the completed 10 ms ticks whose
    /// end (µs) is after `last_seen_us`, at most the newest `ring` of them;
    /// `NVML_ERROR_NOT_FOUND` when there are none.
    fn new_ticks(&self, last_seen_us: u64, now: i64) -> Result<std::ops::RangeInclusive<i64>, Ret> {
        let tick_us = (TICK_MS * 1000) as u64;
        // Newest completed tick: it ends at or before now.
        let newest = now.div_euclid(TICK_MS) - 1;
        // Tick k ends at (k + 1) * tick; it is new if that is > last_seen.
        let first_new = i64::try_from(last_seen_us / tick_us).unwrap_or(i64::MAX);
        let oldest = first_new.max(newest - self.config.ring as i64 + 1).max(0);
        if oldest > newest {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        }
        Ok(oldest..=newest)
    }

    /// GPU `gpu`'s time-slicing (`share`, the last entry for it), if any.
    pub(crate) fn shared(&self, gpu: usize) -> Option<&ShareSpec> {
        self.config.share.iter().rev().find(|sh| sh.gpu == gpu)
    }

    /// `nvmlDeviceGetComputeRunningProcesses_v3`: a shared GPU lists its
    /// `share` processes, each holding its part of the GPU's used memory;
    /// otherwise a GPU that runs a job in the plan has one process, PID
    /// `PID_BASE + gpu`, holding the GPU's used memory, and an idle GPU
    /// has none. (pid, used bytes).
    pub(crate) fn processes(&self, gpu: usize, now: i64) -> Vec<(u32, u64)> {
        if let Some(sh) = self.shared(gpu) {
            let used = self.memory(gpu, now).3;
            let total = u64::from(sh.total_percent().max(1));
            return sh
                .processes
                .iter()
                .map(|&(pid, pct)| (pid, used / total * u64::from(pct)))
                .collect();
        }
        match self.model.plans.get(gpu) {
            Some(plan) if plan.job.is_some() => {
                vec![(PID_BASE + gpu as u32, self.memory(gpu, now).3)]
            }
            _ => Vec::new(),
        }
    }

    /// `nvmlDeviceGetProcessUtilization`: on a shared GPU, one sample per
    /// `share` process per tick of the ring newer than `last_seen_us`,
    /// oldest first (then in the order the processes are given), its
    /// utilisations the process's part of the tick's activity
    /// ([`share::sample_sm_util`]). `NVML_ERROR_NOT_FOUND` when there is
    /// none (a GPU that is not shared has none); `NOT_SUPPORTED` on a card
    /// in MIG mode, as nvml.h says.
    pub(crate) fn process_samples(
        &self,
        gpu: usize,
        last_seen_us: u64,
        now: i64,
    ) -> Result<Vec<ProcessSample>, Ret> {
        if self.mig.layout_at(gpu, now).is_on() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        let sh = self
            .shared(gpu)
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        let mut out = Vec::new();
        for k in self.new_ticks(last_seen_us, now)? {
            let s = self.state_at(gpu, k * TICK_MS);
            out.extend(sh.processes.iter().map(|&(pid, pct)| ProcessSample {
                pid,
                ts_us: tick_end_us(k),
                sm_util: share::sample_sm_util(pct, &s),
                mem_util: share::sample_mem_util(pct, &s),
            }));
        }
        Ok(out)
    }

    /// `nvmlDeviceGetSupportedEventTypes`.
    pub(crate) fn supported_events(&self) -> Result<u64, Ret> {
        if self.config.events {
            Ok(SUPPORTED_EVENTS)
        } else {
            Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        }
    }

    /// `nvmlEventSetCreate`.
    pub(crate) fn event_set_create(&mut self, now: i64) -> Result<usize, Ret> {
        if self.event_sets.len() >= MAX_EVENT_SETS {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_MEMORY);
        }
        loop {
            self.next_event_set = (self.next_event_set + 1) % 0x10_0000;
            let handle = EVENT_SET_TAG + self.next_event_set;
            if let std::collections::hash_map::Entry::Vacant(e) = self.event_sets.entry(handle) {
                e.insert(EventSet {
                    created_ms: now,
                    ..EventSet::default()
                });
                return Ok(handle);
            }
        }
    }

    /// `nvmlEventSetFree`.
    pub(crate) fn event_set_free(&mut self, handle: usize) -> Result<(), Ret> {
        self.event_sets
            .remove(&handle)
            .map(|_| ())
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }

    /// `nvmlDeviceRegisterEvents`: unsupported bits are `NOT_SUPPORTED`,
    /// like the driver.
    pub(crate) fn register_events(
        &mut self,
        gpu: usize,
        types: u64,
        handle: usize,
    ) -> Result<(), Ret> {
        let supported = self.supported_events()?;
        if types & !supported != 0 {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        let set = self
            .event_sets
            .get_mut(&handle)
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        *set.registered.entry(gpu).or_insert(0) |= types;
        Ok(())
    }

    /// `nvmlEventSetWait_v2`: queues every configured XID whose time (after
    /// the fleet start) has passed on the fake clock, on a GPU registered
    /// for XIDs, and not older than the set; then delivers the oldest
    /// queued event, or `NVML_ERROR_TIMEOUT` at once (the fake never sleeps).
    pub(crate) fn event_wait(&mut self, handle: usize, now: i64) -> Result<EventOut, Ret> {
        let start = self.model.start_ms;
        let xid_type = u64::from(sys::nvmlEventTypeXidCriticalError);
        let set = self
            .event_sets
            .get_mut(&handle)
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        let mut due: Vec<(usize, i64)> = self
            .config
            .xids
            .iter()
            .enumerate()
            .filter(|(i, x)| {
                let at = start + x.at_ms;
                !set.queued.contains(i)
                    && at <= now
                    && at >= set.created_ms
                    && set
                        .registered
                        .get(&x.gpu)
                        .is_some_and(|t| t & xid_type != 0)
            })
            .map(|(i, x)| (i, start + x.at_ms))
            .collect();
        due.sort_by_key(|&(i, at)| (at, i));
        for (i, _) in due {
            let x = self.config.xids[i];
            set.queued.push(i);
            set.queue.push_back((x.gpu, xid_type, x.code));
        }
        match set.queue.pop_front() {
            Some((gpu, event_type, data)) => Ok(EventOut {
                gpu,
                event_type,
                data,
            }),
            None => Err(sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT),
        }
    }

    /// `nvmlGpmSampleAlloc`.
    pub(crate) fn gpm_alloc(&mut self) -> Result<usize, Ret> {
        if self.samples.len() >= MAX_LIVE_SAMPLES {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_MEMORY);
        }
        loop {
            self.next_sample = (self.next_sample + 1) % 0x10_0000;
            let handle = SAMPLE_TAG + self.next_sample;
            if let std::collections::hash_map::Entry::Vacant(e) = self.samples.entry(handle) {
                e.insert(None);
                return Ok(handle);
            }
        }
    }

    /// `nvmlGpmSampleFree`.
    pub(crate) fn gpm_free(&mut self, handle: usize) -> Result<(), Ret> {
        self.samples
            .remove(&handle)
            .map(|_| ())
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }

    /// Whether this process may use GPM: not on a GPU without it, and not
    /// without the permission (`gpm_permission=denied`), which the driver
    /// checks before it looks at the arguments.
    fn gpm_allowed(&self) -> Result<(), Ret> {
        if !self.config.gpm {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        if self.config.gpm_denied {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION);
        }
        Ok(())
    }

    /// `nvmlGpmSampleGet`: stamps the sample with (GPU, now).
    pub(crate) fn gpm_take(&mut self, gpu: usize, handle: usize, now: i64) -> Result<(), Ret> {
        self.stamp(handle, gpu, None, now)
    }

    /// `nvmlGpmMigSampleGet`: stamps the sample with (card, GPU instance,
    /// now); `NOT_FOUND` when the card has no such instance now.
    pub(crate) fn gpm_take_mig(
        &mut self,
        gpu: usize,
        gpu_instance: u32,
        handle: usize,
        now: i64,
    ) -> Result<(), Ret> {
        self.gpm_allowed()?;
        if self.mig.instance_at(gpu, gpu_instance, now).is_none() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        }
        self.stamp(handle, gpu, Some(gpu_instance), now)
    }

    fn stamp(
        &mut self,
        handle: usize,
        gpu: usize,
        gpu_instance: Option<u32>,
        now: i64,
    ) -> Result<(), Ret> {
        self.gpm_allowed()?;
        let slot = self
            .samples
            .get_mut(&handle)
            .ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        *slot = Some(Stamp {
            gpu,
            gpu_instance,
            t_ms: now,
        });
        Ok(())
    }

    /// The exact window two samples bracket (`nvmlGpmMetricsGet`).
    pub(crate) fn gpm_window(&self, first: usize, second: usize) -> Result<WindowMean, Ret> {
        self.gpm_allowed()?;
        let stamp = |h| match self.samples.get(&h) {
            Some(Some(s)) => Ok(*s),
            _ => Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        };
        let (a, b) = (stamp(first)?, stamp(second)?);
        if a.gpu != b.gpu || a.gpu_instance != b.gpu_instance || a.gpu >= self.model.gpu_count() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        let (from, to) = (a.t_ms.min(b.t_ms), a.t_ms.max(b.t_ms));
        Ok(match a.gpu_instance {
            None => self.window(a.gpu, from, to),
            Some(gi) => self.mig.instance_window(&self.model, a.gpu, gi, from, to),
        })
    }
}

/// One GPM metric's value over a window, in NVML's units: percent for the
/// utilizations, MiB/s for bandwidth (nvml.h `nvmlGpmMetricId_t`). The
/// graphics engine's is derived from SM activity
/// ([`derived::graphics_util`]).
pub(crate) fn gpm_value(w: &WindowMean, metric: u32) -> Result<f64, Ret> {
    let m = &w.mean;
    let pct = |x: f64| 100.0 * x;
    let link = |id: u32, first: u32| (id - first) % 2;
    Ok(match metric {
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => pct(derived::graphics_util(m)),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => pct(m.sm_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => pct(m.sm_occupancy),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL => pct(0.02 * m.sm_active),
        // Every simulated tensor instruction is an HMMA (FP16/BF16 GEMM).
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL
        | sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL => pct(m.tensor_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL
        | sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL => 0.0,
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => pct(m.dram_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL => pct(m.fp64_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL => pct(m.fp32_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL => pct(m.fp16_active),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => m.pcie_tx_bytes_s / MIB,
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => m.pcie_rx_bytes_s / MIB,
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => m.nvlink_rx_bytes_s / MIB,
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => m.nvlink_tx_bytes_s / MIB,
        // Per-link: ids alternate RX, TX from L0 RX; traffic spreads evenly.
        id @ sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC
            ..=sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC => {
            let first = sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC;
            let total = if link(id, first) == 0 {
                m.nvlink_rx_bytes_s
            } else {
                m.nvlink_tx_bytes_s
            };
            total / NVLINK_LINKS / MIB
        }
        _ => return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(spec: &str) -> Fake {
        Fake::new(FakeConfig::parse(spec).unwrap(), 1_000_000)
    }

    #[test]
    fn gpu_zero_follows_the_schedule_file() {
        let path = std::env::temp_dir().join(format!(
            "flopwatch-fake-nvml-state-schedule-{}.txt",
            std::process::id()
        ));
        std::fs::write(&path, "").unwrap();
        let mut f = fake(&format!("gpus=2,start_ms=0,schedule={}", path.display()));
        f.follow_schedule();
        assert_eq!(f.processes(0, 500).len(), 1, "the load owns GPU 0");
        assert_eq!(f.model.window(0, 0, 10_000).mean.tensor_active, 0.0);
        std::fs::write(&path, "2000 0.6\n4000 0\n").unwrap();
        f.follow_schedule();
        let busy = f.model.window(0, 2_000, 4_000).mean.tensor_active;
        assert!((busy - 0.6).abs() < 0.005, "{busy}");
        assert_eq!(f.model.window(0, 4_000, 9_000).mean.tensor_active, 0.0);
        // GPU 1 keeps its simulated job.
        assert!(f.model.window(1, 0, 10_000).mean.tensor_active > 0.1);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn handles_round_trip_and_reject_strays() {
        let f = fake("gpus=4");
        let h = f.handle_of(3).unwrap();
        assert_eq!(f.gpu(h, 0), Ok(3));
        assert!(f.handle_of(4).is_err());
        assert!(f.gpu(0, 0).is_err());
        assert!(f.gpu(DEVICE_TAG + 4, 0).is_err());
    }

    #[test]
    fn gpm_values_are_percent_and_mib_per_second() {
        let f = fake("seed=2,start_ms=0");
        let w = f.model.window(0, 5_000, 6_000);
        let tensor = gpm_value(&w, sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL).unwrap();
        assert!((tensor / 100.0 - w.mean.tensor_active).abs() < 1e-12);
        let nvl = gpm_value(
            &w,
            sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        )
        .unwrap();
        assert!((nvl * MIB - w.mean.nvlink_tx_bytes_s).abs() < 1e-3);
        let per_link: f64 = (0..18)
            .map(|l| {
                gpm_value(
                    &w,
                    sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_L0_TX_PER_SEC + 2 * l,
                )
                .unwrap()
            })
            .sum();
        assert!((per_link - nvl).abs() < 1e-6);
        assert!(gpm_value(&w, sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVDEC_0_UTIL).is_err());
    }

    #[test]
    fn the_counters_beyond_the_simulator_follow_the_config() {
        let f = fake("gpus=3,start_ms=0,enc_util=40,dec_util=7,remapped_rows=1:3:1:failed");
        let s = f.model.state_at(2, 5_000);
        assert_eq!(f.memory_temp(2, 5_000), Ok(derived::memory_temp_c(&s)));
        assert_eq!(f.video_util(true), (40, derived::VIDEO_SAMPLING_PERIOD_US));
        assert_eq!(f.video_util(false).0, 7);
        let r = f.remapped_rows(1);
        assert_eq!((r.correctable, r.uncorrectable, r.failure), (3, 1, true));
        assert_eq!(f.remapped_rows(0), RemapSpec::default());
        let w = f.model.window(0, 5_000, 6_000);
        let gr = gpm_value(&w, sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL).unwrap();
        assert!((gr / 100.0 - w.mean.sm_active.sqrt()).abs() < 1e-12);
        let gddr = fake("memory_temp=0");
        assert_eq!(
            gddr.memory_temp(0, 5_000),
            Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
    }

    #[test]
    fn gpm_disabled_is_not_supported() {
        let mut f = fake("gpm=0");
        let h = f.gpm_alloc().unwrap();
        assert_eq!(
            f.gpm_take(0, h, 1_000),
            Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
        assert_eq!(f.gpm_free(h), Ok(()));
        assert!(f.gpm_free(h).is_err());
    }

    #[test]
    fn energy_is_monotonic_integral_of_power() {
        let mut f = fake("start_ms=0");
        // The driver loaded at 1 000 000 (see `fake`); earlier reads are 0.
        assert_eq!(f.energy_mj(0, 999_000), 0);
        let two_s = f.energy_mj(0, 1_002_000);
        let expected = f.model.window(0, 1_000_000, 1_002_000).mean.power_w * 2000.0;
        assert_eq!(two_s, expected as u64);
        // Clock moved back: the counter does not.
        assert_eq!(f.energy_mj(0, 1_001_000), two_s);
    }

    #[test]
    fn clock_samples_cover_new_ticks_of_the_ring() {
        let f = fake("start_ms=0,ring=100");
        let kind = sys::nvmlSamplingType_enum_NVML_PROCESSOR_CLK_SAMPLES;
        // All history: the newest 100 ticks, stamped at their ends.
        let all = f.samples(0, kind, 0, 50_000).unwrap();
        assert_eq!(all.len(), 100);
        assert_eq!(all.first().unwrap().0, 49_010_000);
        assert_eq!(all.last().unwrap().0, 50_000_000);
        // After the last seen: exactly the ticks of [50 000, 50 250).
        let new = f.samples(0, kind, 50_000_000, 50_250).unwrap();
        assert_eq!(new.len(), 25);
        let mean = new.iter().map(|s| f64::from(s.1)).sum::<f64>() / 25.0;
        let truth = f.model.window(0, 50_000, 50_250).mean.sm_clock_mhz;
        assert!((mean - truth).abs() < 0.5, "{mean} vs {truth}");
        assert_eq!(
            f.samples(0, kind, 50_250_000, 50_250),
            Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
        );
        assert!(f.samples(0, 99, 0, 50_000).is_err());
    }

    #[test]
    fn busy_gpus_have_one_process() {
        let f = fake("start_ms=0");
        for g in 0..f.model.gpu_count() {
            let procs = f.processes(g, 5_000);
            if f.model.plans[g].job.is_some() {
                assert_eq!(procs.len(), 1);
                assert_eq!(procs[0].0, PID_BASE + g as u32);
            } else {
                assert!(procs.is_empty());
            }
        }
    }

    #[test]
    fn shared_gpus_list_their_processes_and_split_the_memory() {
        let f = fake("start_ms=0,gpus=4,share=1:4242/70+4343/30");
        let procs = f.processes(1, 5_000);
        assert_eq!(
            procs.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![4242, 4343]
        );
        let used = f.memory(1, 5_000).3;
        assert!(procs.iter().map(|p| p.1).sum::<u64>() <= used);
        assert!(procs[0].1 > 2 * procs[1].1);
        // The other GPUs keep the simulator's one process (or none).
        assert!(f.processes(2, 5_000).len() <= 1);
    }

    #[test]
    fn process_samples_are_the_shares_of_each_tick() {
        let f = fake("start_ms=0,gpus=4,share=1:4242/70+4343/30");
        // The ticks of [50 000, 50 500): 50 of them, two processes each.
        let got = f.process_samples(1, 50_000_000, 50_500).unwrap();
        assert_eq!(got.len(), 100);
        assert_eq!(got[0].ts_us, 50_010_000);
        assert_eq!(got[99].ts_us, 50_500_000);
        for tick in got.chunks(2) {
            assert_eq!((tick[0].pid, tick[1].pid), (4242, 4343));
            assert_eq!(tick[0].ts_us, tick[1].ts_us);
            let s = f.model.state_at(1, tick[0].ts_us as i64 / 1000 - TICK_MS);
            assert_eq!(tick[0].sm_util, share::sample_sm_util(70, &s));
            assert_eq!(tick[1].sm_util, share::sample_sm_util(30, &s));
        }
        for (pid, pct) in [(4242, 70), (4343, 30)] {
            let mine: Vec<f64> = got
                .iter()
                .filter(|p| p.pid == pid)
                .map(|p| f64::from(p.sm_util))
                .collect();
            let mean = mine.iter().sum::<f64>() / mine.len() as f64;
            let truth = share::process_sm_util(&f.model, 1, pct, 50_000, 50_500);
            assert!((mean - truth).abs() <= 0.5, "{pid}: {mean} vs {truth}");
        }
        // Nothing newer than the newest stamp, nor on an unshared GPU.
        let not_found = Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        assert_eq!(f.process_samples(1, 50_500_000, 50_500), not_found);
        assert_eq!(f.process_samples(1, 50_500_000, 50_509), not_found);
        assert_eq!(f.process_samples(1, 50_500_000, 50_510).unwrap().len(), 2);
        assert_eq!(f.process_samples(2, 0, 50_500), not_found);
        // All history: the ring's newest 100 ticks.
        assert_eq!(f.process_samples(1, 0, 50_500).unwrap().len(), 200);
    }

    #[test]
    fn a_mig_card_has_no_process_samples() {
        let f = fake("start_ms=0,gpus=2,mig_layout=0:3g.40gb,share=0:1/50+2/50");
        assert_eq!(
            f.process_samples(0, 0, 5_000),
            Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
        assert_eq!(f.processes(0, 5_000).len(), 2, "processes stay on the card");
    }

    #[test]
    fn xids_are_delivered_once_after_their_time() {
        let mut f = fake("start_ms=0,xid=2:79@1500;3:13@1200");
        let set = f.event_set_create(1_000).unwrap();
        let xid = u64::from(sys::nvmlEventTypeXidCriticalError);
        f.register_events(2, xid, set).unwrap();
        assert_eq!(
            f.event_wait(set, 1_400),
            Err(sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT)
        );
        assert_eq!(
            f.event_wait(set, 2_000),
            Ok(EventOut {
                gpu: 2,
                event_type: xid,
                data: 79
            }),
            "GPU 3 is not registered"
        );
        assert!(f.event_wait(set, 3_000).is_err());
        assert!(f.register_events(2, 1 << 40, set).is_err());
        assert_eq!(f.event_set_free(set), Ok(()));
        assert!(f.event_wait(set, 3_000).is_err());
        let mut off = fake("events=0");
        assert!(off.supported_events().is_err());
        let set = off.event_set_create(0).unwrap();
        assert!(off.register_events(0, xid, set).is_err());
    }

    #[test]
    fn gpm_window_is_between_the_two_stamps() {
        let mut f = fake("start_ms=0");
        let (a, b) = (f.gpm_alloc().unwrap(), f.gpm_alloc().unwrap());
        f.gpm_take(2, a, 10_000).unwrap();
        f.gpm_take(2, b, 11_000).unwrap();
        assert_eq!(
            f.gpm_window(a, b).unwrap(),
            f.model.window(2, 10_000, 11_000)
        );
        f.gpm_take(3, b, 11_000).unwrap();
        assert!(f.gpm_window(a, b).is_err(), "samples of two GPUs");
    }
}
