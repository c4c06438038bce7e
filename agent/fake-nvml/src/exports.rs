//! The C ABI: NVML functions with nvml.h's exact signatures.
//!
//! Each export checks its pointers, asks [`crate::state`] for the answer and
//! writes it back. Nothing unwinds into C: every body runs under
//! `catch_unwind` and a panic becomes `NVML_ERROR_UNKNOWN`.
//!
//! Safety contract of every export (the one nvml.h states): pointer
//! arguments are either null (rejected with `NVML_ERROR_INVALID_ARGUMENT`)
//! or valid for writes of the documented type, and string buffers are valid
//! for `length` bytes. Device and GPM-sample handles are opaque integers the
//! fake hands out (as are event sets); they are looked up, never dereferenced.

#![allow(non_snake_case)]

use crate::state::{self, gpm_value, Dev, Fake, Ret};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const INVALID: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

/// Runs an export's body; a panic becomes `NVML_ERROR_UNKNOWN`.
fn run(body: impl FnOnce() -> Result<(), Ret>) -> Ret {
    // The call's CPU time is the simulated hardware's (crate::cpu).
    crate::cpu::timed(|| match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    })
}

/// Resolves `device` on the initialized state and calls `f(fake, gpu, now)`.
fn on_device<R>(
    device: sys::nvmlDevice_t,
    f: impl FnOnce(&mut Fake, usize, i64) -> Result<R, Ret>,
) -> Result<R, Ret> {
    // A wedged driver blocks here, holding no lock (`hang_after`).
    crate::hang::pass();
    let now = state::now_ms();
    state::with(|fake| {
        let gpu = fake.gpu(device.addr(), now)?;
        f(fake, gpu, now)
    })
}

/// Like [`on_device`] for the calls that also take a MIG device handle.
fn on_any_device<R>(
    device: sys::nvmlDevice_t,
    f: impl FnOnce(&mut Fake, Dev, i64) -> Result<R, Ret>,
) -> Result<R, Ret> {
    crate::hang::pass();
    let now = state::now_ms();
    state::with(|fake| {
        let dev = fake.device(device.addr(), now)?;
        f(fake, dev, now)
    })
}

/// Writes `value` through an out-pointer.
///
/// # Safety
/// `ptr` is null or valid for a write of `T`.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), Ret> {
    if ptr.is_null() {
        return Err(INVALID);
    }
    // SAFETY: non-null, and valid for writes by this function's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a caller's buffer of `length` bytes.
///
/// # Safety
/// `buf` is null or valid for writes of `length` bytes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID);
    }
    if s.len() + 1 > length as usize {
        return Err(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is valid for `length` bytes and `s.len() + 1 <= length`;
    // the source is a distinct Rust string, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Copies `s` NUL-terminated into a fixed C array (truncating).
fn fill(dst: &mut [c_char], s: &str) {
    dst.fill(0);
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// `nvmlInit_v2`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlInit_v2() -> Ret {
    run(|| match state::init() {
        SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlInitWithFlags`: flags (no GPUs / no attach) change nothing here.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    run(|| match state::init() {
        SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlShutdown`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlShutdown() -> Ret {
    run(|| match state::shutdown() {
        SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlErrorString`: a static string, never freed by the caller.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        sys::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        sys::nvmlReturn_enum_NVML_ERROR_MEMORY => c"Insufficient Memory",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    run(|| {
        let v = state::with(|f| Ok(f.config.driver.clone()))?;
        // SAFETY: the caller's buffer holds `length` bytes (module contract).
        unsafe { put_str(version, length, &v) }
    })
}

/// `nvmlSystemGetNVMLVersion`: "12." + the driver version, like real NVML.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    run(|| {
        let v = state::with(|f| Ok(format!("12.{}", f.config.driver)))?;
        // SAFETY: the caller's buffer holds `length` bytes (module contract).
        unsafe { put_str(version, length, &v) }
    })
}

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    run(|| {
        let n = state::with(|f| Ok(f.model.gpu_count() as c_uint))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(count, n) }
    })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    run(|| {
        let h = state::with(|f| f.handle_of(index as usize))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(device, std::ptr::without_provenance_mut(h)) }
    })
}

/// `nvmlDeviceGetName`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    run(|| {
        // A MIG device is named after its card and profile, as the driver
        // names it ("NVIDIA H100 80GB HBM3 MIG 3g.40gb").
        let n = on_any_device(device, |f, d, _| {
            let card = f.model.model.name.clone();
            Ok(match d {
                Dev::Card(_) => card,
                Dev::Mig(_, i) => format!("{card} MIG {}", i.profile.name),
            })
        })?;
        // SAFETY: the caller's buffer holds `length` bytes (module contract).
        unsafe { put_str(name, length, &n) }
    })
}

/// `nvmlDeviceGetUUID`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    run(|| {
        let u = on_any_device(device, |f, d, _| {
            Ok(match d {
                Dev::Card(g) => f.model.uuid(g),
                Dev::Mig(g, i) => f.mig.uuid(&f.model.uuid(g), &i),
            })
        })?;
        // SAFETY: the caller's buffer holds `length` bytes (module contract).
        unsafe { put_str(uuid, length, &u) }
    })
}

/// `nvmlDeviceGetPciInfo_v3`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    run(|| {
        let p = on_device(device, |f, g, _| Ok(f.pci(g)))?;
        let mut out = sys::nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain: 0,
            bus: p.bus,
            device: 0,
            pciDeviceId: p.device_id,
            pciSubSystemId: p.subsystem_id,
            busId: [0; 32],
        };
        fill(&mut out.busIdLegacy, &p.bus_id_legacy);
        fill(&mut out.busId, &p.bus_id);
        // SAFETY: out-pointer per the module contract.
        unsafe { put(pci, out) }
    })
}

/// `nvmlDeviceGetAttributes_v2`: an H100 SXM's SM count and slices, or a
/// MIG device's from its profile ([`crate::mig::PROFILES`]).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: sys::nvmlDevice_t,
    attributes: *mut sys::nvmlDeviceAttributes_t,
) -> Ret {
    run(|| {
        let (sms, slices, memory_mb) = on_any_device(device, |f, d, _| {
            let m = &f.model.model;
            Ok(match d {
                Dev::Card(_) => (m.sm_count, 7, m.memory_total_bytes >> 20),
                Dev::Mig(_, i) => (i.profile.sm_count, i.profile.slices, i.profile.memory_mb),
            })
        })?;
        let out = sys::nvmlDeviceAttributes_t {
            multiprocessorCount: sms,
            sharedCopyEngineCount: slices.min(8),
            sharedDecoderCount: slices,
            sharedEncoderCount: 0,
            sharedJpegCount: slices,
            sharedOfaCount: u32::from(slices == 7),
            gpuInstanceSliceCount: slices,
            computeInstanceSliceCount: slices,
            memorySizeMB: memory_mb,
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(attributes, out) }
    })
}

/// `nvmlDeviceGetClockInfo`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: sys::nvmlDevice_t,
    kind: sys::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    run(|| {
        let c = on_device(device, |f, g, now| f.clock(g, kind, now))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(clock, c) }
    })
}

/// `nvmlDeviceGetMaxClockInfo`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: sys::nvmlDevice_t,
    kind: sys::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    run(|| {
        let c = on_device(device, |f, _, _| f.max_clock(kind))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(clock, c) }
    })
}

/// `nvmlDeviceGetPowerUsage`, mW.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: sys::nvmlDevice_t,
    power: *mut c_uint,
) -> Ret {
    run(|| {
        let p = on_device(device, |f, g, now| Ok(f.power_mw(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(power, p) }
    })
}

/// `nvmlDeviceGetTemperature`: only the GPU die sensor exists.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: sys::nvmlDevice_t,
    sensor: sys::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    run(|| {
        if sensor != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID);
        }
        let t = on_device(device, |f, g, now| Ok(f.temperature(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(temp, t) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: checks the struct version like the driver.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    run(|| {
        if memory.is_null() {
            return Err(INVALID);
        }
        // SAFETY: non-null and valid for reads (the caller sets `version`).
        let version = unsafe { (*memory).version };
        let expected = (std::mem::size_of::<sys::nvmlMemory_v2_t>() | (2 << 24)) as c_uint;
        if version != expected {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, free, used) = on_device(device, |f, g, now| Ok(f.memory(g, now)))?;
        let out = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved,
            free,
            used,
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(memory, out) }
    })
}

/// `nvmlDeviceGetMemoryInfo` (v1): reserved memory counts as used.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_t,
) -> Ret {
    run(|| {
        let (total, reserved, free, used) = on_device(device, |f, g, now| Ok(f.memory(g, now)))?;
        let out = sys::nvmlMemory_t {
            total,
            free,
            used: used + reserved,
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(memory, out) }
    })
}

/// `nvmlDeviceGetUtilizationRates`, percent.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: sys::nvmlDevice_t,
    utilization: *mut sys::nvmlUtilization_t,
) -> Ret {
    run(|| {
        let (gpu, memory) = on_device(device, |f, g, now| f.utilization(g, now))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(utilization, sys::nvmlUtilization_t { gpu, memory }) }
    })
}

/// `nvmlDeviceGetSamples`. With `samples == NULL` it only reports how many
/// samples are available (NVML's count query, `NVML_SUCCESS`); otherwise it
/// fills at most `*sampleCount` of them, oldest first, and sets the count
/// written. No new samples: `NVML_ERROR_NOT_FOUND`, as the driver says.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetSamples(
    device: sys::nvmlDevice_t,
    kind: sys::nvmlSamplingType_t,
    last_seen_us: c_ulonglong,
    value_type: *mut sys::nvmlValueType_t,
    sample_count: *mut c_uint,
    samples: *mut sys::nvmlSample_t,
) -> Ret {
    run(|| {
        if value_type.is_null() || sample_count.is_null() {
            return Err(INVALID);
        }
        let got = on_device(device, |f, g, now| f.samples(g, kind, last_seen_us, now))?;
        // SAFETY: both checked non-null; valid per the module contract.
        unsafe { value_type.write(sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT) };
        if samples.is_null() {
            // SAFETY: checked non-null above.
            unsafe { sample_count.write(got.len() as c_uint) };
            return Ok(());
        }
        // SAFETY: checked non-null above; the caller set the buffer length.
        let capacity = unsafe { sample_count.read() } as usize;
        let n = capacity.min(got.len());
        for (i, &(ts, v)) in got.iter().take(n).enumerate() {
            let mut value = sys::nvmlValue_t { ullVal: 0 };
            value.uiVal = v;
            let sample = sys::nvmlSample_t {
                timeStamp: ts,
                sampleValue: value,
            };
            // SAFETY: `samples` holds `capacity` elements and `i < n <= capacity`.
            unsafe { samples.add(i).write(sample) };
        }
        // SAFETY: checked non-null above.
        unsafe { sample_count.write(n as c_uint) };
        Ok(())
    })
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let r = on_device(device, |f, g, now| Ok(f.throttle_reasons(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(reasons, r) }
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`: the newer name of the above.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let r = on_device(device, |f, g, now| Ok(f.throttle_reasons(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(reasons, r) }
    })
}

/// `nvmlDeviceGetTotalEccErrors`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: sys::nvmlDevice_t,
    error_type: sys::nvmlMemoryErrorType_t,
    counter: sys::nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let n = on_device(device, |f, _, _| f.ecc_errors(error_type, counter))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(count, n) }
    })
}

/// `nvmlDeviceGetTotalEnergyConsumption`, mJ.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: sys::nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let e = on_device(device, |f, g, now| Ok(f.energy_mj(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(energy, e) }
    })
}

/// `nvmlGpmQueryDeviceSupport`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: sys::nvmlDevice_t,
    support: *mut sys::nvmlGpmSupport_t,
) -> Ret {
    run(|| {
        if support.is_null() {
            return Err(INVALID);
        }
        // SAFETY: non-null and valid for reads (the caller sets `version`).
        let version = unsafe { (*support).version };
        if version != sys::NVML_GPM_SUPPORT_VERSION {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let on = on_device(device, |f, _, _| Ok(f.config.gpm))?;
        let out = sys::nvmlGpmSupport_t {
            version,
            isSupportedDevice: c_uint::from(on),
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(support, out) }
    })
}

/// `nvmlGpmSampleAlloc`: device-independent, so it works without GPM too.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut sys::nvmlGpmSample_t) -> Ret {
    run(|| {
        if sample.is_null() {
            return Err(INVALID);
        }
        let h = state::with(|f| f.gpm_alloc())?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(sample, std::ptr::without_provenance_mut(h)) }
    })
}

/// `nvmlGpmSampleFree`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmSampleFree(sample: sys::nvmlGpmSample_t) -> Ret {
    run(|| state::with(|f| f.gpm_free(sample.addr())))
}

/// `nvmlGpmSampleGet`: stamps the sample with the device and the time.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmSampleGet(
    device: sys::nvmlDevice_t,
    sample: sys::nvmlGpmSample_t,
) -> Ret {
    run(|| on_device(device, |f, g, now| f.gpm_take(g, sample.addr(), now)))
}

/// `nvmlGpmMigSampleGet`: stamps the sample with the card, the GPU
/// instance and the time (`NOT_FOUND` for an instance the card lacks).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: sys::nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: sys::nvmlGpmSample_t,
) -> Ret {
    run(|| {
        on_device(device, |f, g, now| {
            f.gpm_take_mig(g, gpu_instance_id, sample.addr(), now)
        })
    })
}

/// `nvmlGpmMetricsGet`: each requested metric over the two samples' window,
/// with its own return code (unknown metrics: `NVML_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut sys::nvmlGpmMetricsGet_t) -> Ret {
    run(|| {
        if request.is_null() {
            return Err(INVALID);
        }
        // SAFETY: non-null, aligned and exclusively ours for this call (module
        // contract: the caller passes its own nvmlGpmMetricsGet_t).
        let req = unsafe { &mut *request };
        if req.version != sys::NVML_GPM_METRICS_GET_VERSION {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let n = req.numMetrics as usize;
        if n > req.metrics.len() {
            return Err(INVALID);
        }
        let (first, second) = (req.sample1.addr(), req.sample2.addr());
        let window = state::with(|f| f.gpm_window(first, second))?;
        for m in &mut req.metrics[..n] {
            let (short, long, unit) = metric_info(m.metricId);
            m.metricInfo = sys::nvmlGpmMetric_t__bindgen_ty_1 {
                shortName: short.as_ptr().cast_mut(),
                longName: long.as_ptr().cast_mut(),
                unit: unit.as_ptr().cast_mut(),
            };
            match gpm_value(&window, m.metricId) {
                Ok(v) => {
                    m.value = v;
                    m.nvmlReturn = SUCCESS;
                }
                Err(code) => {
                    m.value = 0.0;
                    m.nvmlReturn = code;
                }
            }
        }
        Ok(())
    })
}

/// Names and units reported with a GPM metric (static, never freed).
fn metric_info(id: c_uint) -> (&'static CStr, &'static CStr, &'static CStr) {
    match id {
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => {
            (c"ANY_TENSOR_UTIL", c"Any tensor pipe utilization", c"%")
        }
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => (c"SM_UTIL", c"SM utilization", c"%"),
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => {
            (c"SM_OCCUPANCY", c"SM occupancy", c"%")
        }
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => {
            (c"DRAM_BW_UTIL", c"DRAM bandwidth utilization", c"%")
        }
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC
        | sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
            (c"PCIE_BW", c"PCIe bandwidth", c"MiB/sec")
        }
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
            ..=sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC => {
            (c"NVLINK_BW", c"NVLink bandwidth", c"MiB/sec")
        }
        _ => (c"UTIL", c"Utilization", c"%"),
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`, with NVML's count query:
/// `*infoCount` too small (or `infos` null) with processes running sets the
/// count needed and returns `NVML_ERROR_INSUFFICIENT_SIZE`; no processes is
/// `NVML_SUCCESS` with a count of 0. Otherwise fills the array and sets the
/// count written.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: sys::nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> Ret {
    run(|| {
        if info_count.is_null() {
            return Err(INVALID);
        }
        let procs = on_device(device, |f, g, now| Ok(f.processes(g, now)))?;
        // SAFETY: checked non-null; valid per the module contract.
        let capacity = unsafe { info_count.read() } as usize;
        // SAFETY: as above.
        unsafe { info_count.write(procs.len() as c_uint) };
        if procs.is_empty() {
            return Ok(());
        }
        if infos.is_null() || capacity < procs.len() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, &(pid, used)) in procs.iter().enumerate() {
            let info = sys::nvmlProcessInfo_t {
                pid,
                usedGpuMemory: used,
                // Not a MIG device: NVML's "no value".
                gpuInstanceId: 0xFFFF_FFFF,
                computeInstanceId: 0xFFFF_FFFF,
            };
            // SAFETY: `infos` holds `capacity` elements and `i < procs.len() <= capacity`.
            unsafe { infos.add(i).write(info) };
        }
        Ok(())
    })
}

/// `nvmlDeviceGetProcessUtilization`, with nvml.h's two calls:
/// `utilization == NULL` sets `*processSamplesCount` to the samples newer
/// than `lastSeenTimeStamp` and returns `NVML_ERROR_INSUFFICIENT_SIZE`;
/// with a buffer of `*processSamplesCount` entries it writes the oldest
/// samples that fit, whole ticks only (the rest come at the next call,
/// after the newest stamp written), sets the count written and returns
/// `NVML_SUCCESS`, or `NVML_ERROR_INSUFFICIENT_SIZE` with the count needed
/// when not even one tick fits. No samples: `NVML_ERROR_NOT_FOUND`
/// ([`crate::share`]).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: sys::nvmlDevice_t,
    utilization: *mut sys::nvmlProcessUtilizationSample_t,
    process_samples_count: *mut c_uint,
    last_seen_timestamp: c_ulonglong,
) -> Ret {
    run(|| {
        if process_samples_count.is_null() {
            return Err(INVALID);
        }
        let got = on_device(device, |f, g, now| {
            f.process_samples(g, last_seen_timestamp, now)
        })?;
        let insufficient = || {
            // SAFETY: checked non-null; valid per the module contract.
            unsafe { process_samples_count.write(got.len() as c_uint) };
            Err(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE)
        };
        if utilization.is_null() {
            return insufficient();
        }
        // SAFETY: checked non-null; the caller set the buffer length.
        let capacity = unsafe { process_samples_count.read() } as usize;
        let mut n = capacity.min(got.len());
        // A tick is written whole or not at all: the caller resumes after
        // the newest stamp it saw.
        while n > 0 && n < got.len() && got[n].ts_us == got[n - 1].ts_us {
            n -= 1;
        }
        if n == 0 {
            return insufficient();
        }
        for (i, p) in got.iter().take(n).enumerate() {
            let sample = sys::nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: p.ts_us,
                smUtil: p.sm_util,
                memUtil: p.mem_util,
                encUtil: 0,
                decUtil: 0,
            };
            // SAFETY: `utilization` holds `capacity` elements and `i < n <= capacity`.
            unsafe { utilization.add(i).write(sample) };
        }
        // SAFETY: checked non-null above.
        unsafe { process_samples_count.write(n as c_uint) };
        Ok(())
    })
}

/// `nvmlDeviceGetMigMode`: `NOT_SUPPORTED` on a card without MIG (neither
/// `mig=1` nor named by `mig_layout` / `mig_reconfig`), else its mode now
/// (current and pending alike: a change takes effect at once).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    run(|| {
        if current.is_null() || pending.is_null() {
            return Err(INVALID);
        }
        let on = on_device(device, |f, g, now| f.mig_mode(g, now))?;
        // SAFETY: both checked non-null; out-pointers per the module contract.
        unsafe {
            put(current, on)?;
            put(pending, on)
        }
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 7 on a card in MIG mode, else 0.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    run(|| {
        let n = on_device(device, |f, g, now| Ok(f.max_mig_devices(g, now)))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(count, n) }
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: the card's `index`-th MIG device
/// now (`NOT_FOUND` past the last one).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    mig_device: *mut sys::nvmlDevice_t,
) -> Ret {
    run(|| {
        let h = on_device(device, |f, g, now| f.mig_handle(g, index, now))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(mig_device, std::ptr::without_provenance_mut(h)) }
    })
}

/// `nvmlDeviceIsMigDeviceHandle`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: sys::nvmlDevice_t,
    is_mig: *mut c_uint,
) -> Ret {
    run(|| {
        let m = on_any_device(device, |_, d, _| Ok(matches!(d, Dev::Mig(..))))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(is_mig, c_uint::from(m)) }
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the MIG device's card.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: sys::nvmlDevice_t,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    run(|| {
        let h = on_any_device(mig_device, |f, d, _| match d {
            Dev::Mig(g, _) => f.handle_of(g),
            Dev::Card(_) => Err(INVALID),
        })?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(device, std::ptr::without_provenance_mut(h)) }
    })
}

/// `nvmlDeviceGetGpuInstanceId`: a MIG device's GPU instance id
/// (`NOT_SUPPORTED` on a card).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    run(|| {
        let i = on_any_device(device, |_, d, _| match d {
            Dev::Mig(_, i) => Ok(i.gpu_instance_id),
            Dev::Card(_) => Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        })?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(id, i) }
    })
}

/// `nvmlDeviceGetComputeInstanceId`: a MIG device's compute instance id
/// (`NOT_SUPPORTED` on a card).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    run(|| {
        let i = on_any_device(device, |_, d, _| match d {
            Dev::Mig(_, i) => Ok(i.compute_instance_id),
            Dev::Card(_) => Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        })?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(id, i) }
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: XID and ECC events, unless `events=0`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: sys::nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let t = on_device(device, |f, _, _| f.supported_events())?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(event_types, t) }
    })
}

/// `nvmlEventSetCreate`: an opaque handle, looked up, never dereferenced.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> Ret {
    run(|| {
        if set.is_null() {
            return Err(INVALID);
        }
        let now = state::now_ms();
        let h = state::with(|f| f.event_set_create(now))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(set, std::ptr::without_provenance_mut(h)) }
    })
}

/// `nvmlDeviceRegisterEvents`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    event_types: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> Ret {
    run(|| {
        on_device(device, |f, g, _| {
            f.register_events(g, event_types, set.addr())
        })
    })
}

/// `nvmlEventSetWait_v2`: never sleeps; no event is `NVML_ERROR_TIMEOUT`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    _timeout_ms: c_uint,
) -> Ret {
    run(|| {
        if data.is_null() {
            return Err(INVALID);
        }
        let now = state::now_ms();
        let (event, handle) = state::with(|f| {
            let e = f.event_wait(set.addr(), now)?;
            Ok((e, f.handle_of(e.gpu)?))
        })?;
        let out = sys::nvmlEventData_t {
            device: std::ptr::without_provenance_mut(handle),
            eventType: event.event_type,
            eventData: event.data,
            gpuInstanceId: 0xFFFF_FFFF,
            computeInstanceId: 0xFFFF_FFFF,
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(data, out) }
    })
}

/// `nvmlEventSetFree`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> Ret {
    run(|| state::with(|f| f.event_set_free(set.addr())))
}

/// Test hook: replaces the simulated node with `spec` (the
/// `FLOPWATCH_FAKE_NVML` syntax). Returns 0, or -1 for a null, non-UTF-8
/// or invalid spec.
#[no_mangle]
pub(crate) unsafe extern "C" fn flopwatchFakeNvmlConfigure(spec: *const c_char) -> c_int {
    catch_unwind(|| {
        if spec.is_null() {
            return -1;
        }
        // SAFETY: non-null and NUL-terminated per this hook's contract.
        let spec = unsafe { CStr::from_ptr(spec) };
        match spec.to_str().map(state::configure) {
            Ok(Ok(())) => 0,
            _ => -1,
        }
    })
    .unwrap_or(-1)
}

/// Test hook: freezes the fake clock at `ms` (unix ms); 0 returns to the
/// wall clock.
#[no_mangle]
pub(crate) unsafe extern "C" fn flopwatchFakeNvmlSetTimeMs(ms: i64) {
    state::set_time_ms(ms);
}

/// `nvmlDeviceGetFieldValues`: the NVLink data counters
/// (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX`, KiB) and the memory
/// temperature (`NVML_FI_DEV_MEMORY_TEMP`, °C). For the NVLink counters
/// `scopeId` `UINT_MAX` asks for the sum over all links, any other value
/// for that link (the simulated traffic is spread evenly over the active
/// links). Other fields, and the memory temperature of a GPU without the
/// sensor (`memory_temp=0`), answer `NOT_SUPPORTED` in their own
/// `nvmlReturn`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: sys::nvmlDevice_t,
    values_count: c_int,
    values: *mut sys::nvmlFieldValue_t,
) -> Ret {
    run(|| {
        let n = usize::try_from(values_count).map_err(|_| INVALID)?;
        if values.is_null() && n > 0 {
            return Err(INVALID);
        }
        let (counters, links, memory_temp, now) = on_device(device, |f, g, now| {
            Ok((
                f.nvlink_kib(g, now),
                f.config.nvlinks,
                f.memory_temp(g, now),
                now,
            ))
        })?;
        for i in 0..n {
            // SAFETY: `values` is valid for `values_count` elements per the
            // NVML contract, and `i` is below it.
            let v = unsafe { &mut *values.add(i) };
            v.timestamp = now.saturating_mul(1000);
            v.latencyUsec = 0;
            let total = match v.fieldId {
                sys::field_id::NVML_FI_DEV_MEMORY_TEMP => {
                    match memory_temp {
                        Ok(t) => {
                            v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                            v.value = sys::nvmlValue_t { uiVal: t };
                            v.nvmlReturn = SUCCESS;
                        }
                        Err(code) => v.nvmlReturn = code,
                    }
                    continue;
                }
                sys::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => counters.map(|c| c.0),
                sys::field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => counters.map(|c| c.1),
                _ => {
                    v.nvmlReturn = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
                    continue;
                }
            };
            let value = match total {
                None => None,
                Some(t) if v.scopeId == c_uint::MAX => Some(t),
                Some(t) if v.scopeId < links => Some(t / u64::from(links)),
                Some(_) => None,
            };
            match value {
                Some(x) => {
                    v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    v.value = sys::nvmlValue_t { ullVal: x };
                    v.nvmlReturn = SUCCESS;
                }
                None => v.nvmlReturn = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            }
        }
        Ok(())
    })
}

/// `nvmlDeviceGetPcieThroughput`, KiB/s.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: sys::nvmlDevice_t,
    counter: sys::nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> Ret {
    run(|| {
        let v = on_device(device, |f, g, now| f.pcie_kib_s(g, counter, now))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(value, v) }
    })
}

/// `nvmlDeviceGetPcieReplayCounter`: no replays on the simulated link.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: sys::nvmlDevice_t,
    value: *mut c_uint,
) -> Ret {
    run(|| {
        on_device(device, |_, _, _| Ok(()))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(value, 0) }
    })
}

/// `nvmlDeviceGetNvLinkState`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    is_active: *mut sys::nvmlEnableState_t,
) -> Ret {
    run(|| {
        let on = on_device(device, |f, _, _| f.nvlink_active(link))?;
        let state = if on {
            sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
        } else {
            sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
        };
        // SAFETY: out-pointer per the module contract.
        unsafe { put(is_active, state) }
    })
}

/// `nvmlDeviceGetNvLinkErrorCounter`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: sys::nvmlDevice_t,
    link: c_uint,
    counter: sys::nvmlNvLinkErrorCounter_t,
    counter_value: *mut c_ulonglong,
) -> Ret {
    run(|| {
        let n = on_device(device, |f, _, _| f.nvlink_errors(link, counter))?;
        // SAFETY: out-pointer per the module contract.
        unsafe { put(counter_value, n) }
    })
}

/// `nvmlDeviceGetEncoderUtilization`, percent, and its sampling period (µs).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: sys::nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    // SAFETY: out-pointers per the module contract.
    unsafe { video_util(device, true, utilization, sampling_period_us) }
}

/// `nvmlDeviceGetDecoderUtilization`, percent, and its sampling period (µs).
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: sys::nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    // SAFETY: out-pointers per the module contract.
    unsafe { video_util(device, false, utilization, sampling_period_us) }
}

/// The encoder's or decoder's utilization.
///
/// # Safety
/// The pointers are null or valid for a write of a `c_uint`.
unsafe fn video_util(
    device: sys::nvmlDevice_t,
    encoder: bool,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    run(|| {
        if utilization.is_null() || sampling_period_us.is_null() {
            return Err(INVALID);
        }
        let (pct, period) = on_device(device, |f, _, _| Ok(f.video_util(encoder)))?;
        // SAFETY: out-pointers per this function's contract.
        unsafe {
            put(utilization, pct)?;
            put(sampling_period_us, period)
        }
    })
}

/// `nvmlDeviceGetRemappedRows`.
#[no_mangle]
pub(crate) unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: sys::nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> Ret {
    run(|| {
        let out = [corr_rows, unc_rows, is_pending, failure_occurred];
        if out.iter().any(|p| p.is_null()) {
            return Err(INVALID);
        }
        let r = on_device(device, |f, g, _| Ok(f.remapped_rows(g)))?;
        let values = [
            r.correctable,
            r.uncorrectable,
            c_uint::from(r.pending),
            c_uint::from(r.failure),
        ];
        for (ptr, value) in out.into_iter().zip(values) {
            // SAFETY: out-pointers per the module contract, checked non-null.
            unsafe { put(ptr, value)? };
        }
        Ok(())
    })
}
