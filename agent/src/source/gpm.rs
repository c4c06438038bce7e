//! GPM reads without allocation: two samples per GPU taken in turn, and
//! one request reused for every `nvmlGpmMetricsGet`.
//!
//! nvml-wrapper's safe calls allocate a fresh sample per capture
//! (`nvmlGpmSampleAlloc`, then `nvmlGpmSampleFree` of the one before) and
//! turn every metric's three C strings (short name, long name, unit) into
//! `String`s on each `gpm_metrics_get`, over an 8 KiB request zeroed per
//! call: at 8 GPUs × 10 captures a second that was most of the agent's
//! allocations. Here each GPU owns two samples, allocated once through
//! nvml-wrapper, and each capture refills the older one; the metrics
//! request is allocated once and only its values and return codes are
//! read. A MIG GPU instance's pair is refilled the same way through
//! `nvmlGpmMigSampleGet` on its card ([`super::mig`]).
//!
//! The module also holds [`remapped_rows`] (`nvmlDeviceGetRemappedRows`,
//! which nvml-wrapper 0.13 does not wrap at all). It and [`super::mig`]
//! are the only modules of the crate with `unsafe` code: C calls
//! nvml-wrapper does not offer in the form needed.

#![allow(unsafe_code)]

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::{nvmlGpmMetricsGet_t, NVML_GPM_METRICS_GET_VERSION};
use std::ffi::c_uint;

/// One GPU's GPM state: the two samples and the reused request.
pub(super) struct GpmPair {
    nvml: &'static Nvml,
    /// Allocated on first use, then refilled in turn.
    samples: [Option<GpmSample<'static>>; 2],
    /// Which sample holds the newest good snapshot, and when it was taken
    /// (unix ms); `None` when no window can start from a kept sample.
    newest: Option<(usize, i64)>,
    request: Box<nvmlGpmMetricsGet_t>,
}

// SAFETY: the request holds raw sample handles and the C strings' pointers
// the driver wrote; it is only used by the thread that owns the pair (one
// capture at a time), as `GpmSample` is.
unsafe impl Send for GpmPair {}

impl GpmPair {
    /// No samples yet.
    pub(super) fn new(nvml: &'static Nvml) -> Self {
        // SAFETY: a plain C struct of integers, doubles and pointers, for
        // which all-zero bytes is a valid (empty) value.
        let request = Box::new(unsafe { std::mem::zeroed::<nvmlGpmMetricsGet_t>() });
        Self {
            nvml,
            samples: [None, None],
            newest: None,
            request,
        }
    }

    /// Takes a snapshot of `device` (with `gpu_instance`, of that MIG GPU
    /// instance of the card `device`) at `now_ms` into the older sample and
    /// returns when the previous good snapshot was taken (the start of the
    /// window [`GpmPair::metrics`] then reads), if there is one. A failure
    /// drops the previous snapshot too: no window can span it.
    pub(super) fn take(
        &mut self,
        device: &Device<'static>,
        gpu_instance: Option<u32>,
        now_ms: i64,
    ) -> Result<Option<i64>, NvmlError> {
        let previous = self.newest.take();
        let slot = previous.map_or(0, |(i, _)| 1 - i);
        let taken = match (&self.samples[slot], gpu_instance) {
            // The first two captures allocate through nvml-wrapper.
            (None, None) => device.gpm_sample().map(|s| {
                self.samples[slot] = Some(s);
            }),
            (None, Some(gi)) => device.gpm_mig_sample(gi).map(|s| {
                self.samples[slot] = Some(s);
            }),
            (Some(s), None) => {
                let get = nvml_sym(self.nvml.lib().nvmlGpmSampleGet.as_ref())?;
                // SAFETY: both handles are live (the device's for the
                // process, the sample until `self` drops it), as
                // nvmlGpmSampleGet requires.
                nvml_try(unsafe { get(device.handle(), s.handle()) })
            }
            (Some(s), Some(gi)) => {
                let get = nvml_sym(self.nvml.lib().nvmlGpmMigSampleGet.as_ref())?;
                // SAFETY: as above; the instance id is a plain integer the
                // driver checks.
                nvml_try(unsafe { get(device.handle(), gi, s.handle()) })
            }
        };
        taken?;
        self.newest = Some((slot, now_ms));
        Ok(previous.map(|(_, t)| t))
    }

    /// `ids` over the window between the previous snapshot and the newest,
    /// each with its own result (a metric the GPU lacks fails alone), into
    /// `out` (as many as `ids`). Call after [`GpmPair::take`] returned a
    /// start.
    pub(super) fn metrics(
        &mut self,
        ids: &[GpmMetricId],
        out: &mut [Result<f64, NvmlError>],
    ) -> Result<(), NvmlError> {
        let Some((newest, _)) = self.newest else {
            return Err(NvmlError::Uninitialized);
        };
        let (Some(first), Some(second)) = (&self.samples[1 - newest], &self.samples[newest]) else {
            return Err(NvmlError::Uninitialized);
        };
        let get = nvml_sym(self.nvml.lib().nvmlGpmMetricsGet.as_ref())?;
        let r = &mut *self.request;
        let n = ids.len().min(out.len()).min(r.metrics.len());
        r.version = NVML_GPM_METRICS_GET_VERSION;
        r.numMetrics = n as u32;
        // SAFETY: the handles are live samples of this pair.
        unsafe {
            r.sample1 = first.handle();
            r.sample2 = second.handle();
        }
        for (m, id) in r.metrics.iter_mut().zip(&ids[..n]) {
            m.metricId = id.as_c();
        }
        // SAFETY: a valid, versioned request we own exclusively for the
        // call; the driver writes only inside it.
        nvml_try(unsafe { get(r) })?;
        for (o, m) in out[..n].iter_mut().zip(&r.metrics) {
            *o = nvml_try(m.nvmlReturn).map(|()| m.value);
        }
        Ok(())
    }
}

/// Whether `e` says the GPU or driver lacks the call (not a failure).
pub(super) fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// The row remapper's state of a GPU (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RemappedRows {
    /// Rows remapped after correctable ECC errors (`corrRows`).
    pub correctable: u32,
    /// Rows remapped after uncorrectable ECC errors (`uncRows`).
    pub uncorrectable: u32,
    /// A remapping waits for the next GPU reset (`isPending`).
    pub pending: bool,
    /// A row could not be remapped (`failureOccurred`).
    pub failure: bool,
}

/// `nvmlDeviceGetRemappedRows` of `device` (Ampere and newer; older GPUs
/// answer NotSupported). Counts are over the GPU's life.
pub(super) fn remapped_rows(device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let get = nvml_sym(device.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
        (0, 0, 0, 0);
    // SAFETY: the handle is live for as long as `device` is, and each
    // out-pointer is valid for the one write the driver makes to it.
    nvml_try(unsafe {
        get(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}
