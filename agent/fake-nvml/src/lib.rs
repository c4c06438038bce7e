//! A fake `libnvidia-ml.so`, driven by the simulator.
//!
//! flopwatch's NVML source must run in CI, where there is no GPU
//! This crate builds a cdylib that exports, with the
//! exact C signatures and struct layouts of `nvml.h` (taken from
//! `nvml-wrapper-sys`), every NVML function the agent's NVML source calls.
//! The agent loads it through nvml-wrapper's library-path option, exactly as
//! it would load the real driver, so the whole FFI path is exercised.
//!
//! Behind the exports is one simulated node ([`flopwatch_sim::SimModel`]):
//! by default 8 H100 SXM GPUs ("NVIDIA H100 80GB HBM3"), node 0 of a
//! one-node fleet, seed 1, the regressing job slowing down 30 s after the
//! fleet starts (at `nvmlInit`). What each call returns, and why:
//!
//! * point reads (`nvmlDeviceGetClockInfo`, power, temperature, memory,
//!   throttle reasons) are the simulator's state at that instant;
//! * GPM (`nvmlGpmSampleGet` + `nvmlGpmMetricsGet`) records (GPU, time)
//!   per sample and answers with the simulator's *exact* mean between two
//!   samples, in NVML's units (percent, MiB/s). That is how real GPM works
//!   (two counter snapshots, the difference is the window average) and what
//!   lets tests compare OFU against ground truth (OFU paper eq. 1);
//! * `nvmlDeviceGetSamples(PROCESSOR_CLK)` returns one sample per 10 ms
//!   simulator tick from a bounded ring, so the mean of the new samples is
//!   the window-average SM clock (OFU paper §IV-C);
//! * `nvmlDeviceGetComputeRunningProcesses_v3`: a GPU running a job in the
//!   simulator's plan has one process, PID `10000 + gpu index`, holding the
//!   GPU's used memory; an idle GPU has none;
//! * shared GPUs ([`share`]): `share=2:4242/70+4343/30` time-slices GPU 2
//!   between PIDs 4242 and 4343, which get 70 % and 30 % of its SM time.
//!   The GPU lists those processes instead, and
//!   `nvmlDeviceGetProcessUtilization` gives one sample per process per
//!   10 ms tick (µs stamps on the fake clock, newer than
//!   `lastSeenTimeStamp`, from the `ring`; NVML's count query with a NULL
//!   buffer): its `smUtil` is its percent of the GPU's SM activity in that
//!   tick, whole percent. A GPU without the key has no samples
//!   (`NOT_FOUND`), a card in MIG mode answers `NOT_SUPPORTED`;
//!   [`share::process_sm_util`] is the ground truth over a window;
//! * events: `nvmlEventSetCreate` / `nvmlDeviceRegisterEvents` /
//!   `nvmlEventSetWait_v2` / `nvmlEventSetFree` deliver the XIDs scheduled
//!   with `xid=GPU:CODE@MS` once the fake clock passes them (once per set,
//!   only those after the set was created); `events=0` makes the GPUs
//!   support no events;
//! * MIG ([`mig`]): `nvmlDeviceGetMigMode` is `NOT_SUPPORTED` (no MIG)
//!   unless `mig=1` (MIG mode on every card, no instances) or the card has
//!   a layout: `mig_layout=0:3g.40gb+4g.40gb;1:1g.10gb*7` gives cards their
//!   GPU instances (H100 80GB profiles, with their SMs and memory), and
//!   `mig_reconfig=1:2g.20gb+2g.20gb@5000` changes a card's layout at a
//!   time after the start (`off` leaves MIG mode). The MIG devices answer
//!   `nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`,
//!   `nvmlDeviceGetUUID` (`MIG-…`), `nvmlDeviceGetGpuInstanceId`,
//!   `nvmlDeviceGetComputeInstanceId`, `nvmlDeviceGetAttributes_v2` and
//!   `nvmlDeviceGetName`; `nvmlGpmMigSampleGet` samples one GPU instance,
//!   which runs a simulated workload of its own, while the card's own
//!   readings (and its whole-GPU GPM sample) are the SM-weighted mix of its
//!   instances; a card in MIG mode has no utilization rates
//!   (`NOT_SUPPORTED`, as on the driver);
//! * `gpm=0` models a pre-Hopper GPU: no GPM support;
//! * `gpm_permission=denied` models a container without `CAP_SYS_ADMIN`:
//!   GPM is supported but `nvmlGpmSampleGet` and `nvmlGpmMetricsGet`
//!   answer `NVML_ERROR_NO_PERMISSION`;
//! * `schedule=PATH` makes GPU 0 follow a load generator's schedule file
//!   instead of its simulated job (the `schedule` module);
//! * NVLink and PCIe without GPM: `nvmlDeviceGetFieldValues` answers
//!   `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` with the integral (KiB) of
//!   the simulated NVLink throughput, per link (`scopeId` = link, traffic
//!   spread evenly) or summed (`scopeId` = `UINT_MAX`);
//!   `nvmlDeviceGetPcieThroughput` is the simulated PCIe rate over the
//!   last 20 ms in KiB/s; `nvmlDeviceGetNvLinkState` has links
//!   `0..nvlinks` (default 18) active; `nvmlDeviceGetNvLinkErrorCounter`
//!   counts `nvlink_replays` replays per active link and nothing else;
//!   `nvmlDeviceGetPcieReplayCounter` is 0;
//! * counters the simulator keeps no state for ([`derived`]):
//!   `NVML_GPM_METRIC_GRAPHICS_UTIL` is the square root of the window's SM
//!   activity; `nvmlDeviceGetFieldValues` answers
//!   `NVML_FI_DEV_MEMORY_TEMP` with the GPU temperature + 4 °C, or
//!   `NOT_SUPPORTED` in the field's own return with `memory_temp=0` (a
//!   GDDR card); `nvmlDeviceGetEncoderUtilization` /
//!   `nvmlDeviceGetDecoderUtilization` are `enc_util` / `dec_util` percent
//!   (default 0, an idle video engine); `nvmlDeviceGetRemappedRows` is what
//!   `remapped_rows=GPU:CORR:UNC[:pending][:failed]` says (default no
//!   remapped row); `nvmlDeviceGetMemoryInfo_v2` reserves 512 MiB;
//! * `hang_after=N`: after `N` device queries every further one blocks, as
//!   a wedged driver's would, until the fake is configured again (the
//!   `hang` module).
//!
//! Configuration comes from `FLOPWATCH_FAKE_NVML` at init
//! ([`config::FakeConfig`]) or, in tests, from the exported
//! `flopwatchFakeNvmlConfigure` / `flopwatchFakeNvmlSetTimeMs`, reached
//! through [`control`]. A test process may hold two copies of this crate
//! (the rlib it links and the .so nvml-wrapper dlopens), each with its own
//! globals; [`control`] therefore always goes through the .so.
//!
//! Unsafe code is confined to `exports` (C pointers in and out),
//! [`control`] (dlopen) and [`cpu`] (the thread CPU clock); the driver
//! logic in `state` is safe Rust.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod control;
pub mod cpu;
pub mod derived;
mod exports;
mod hang;
pub mod layout;
pub mod mig;
mod schedule;
pub mod share;
mod state;

use std::path::PathBuf;

/// File name of the built library on this platform
/// (`libflopwatch_fake_nvml.so` on Linux).
pub fn library_file_name() -> String {
    format!(
        "{}flopwatch_fake_nvml{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// Finds the built fake library next to the running executable: a test
/// binary in `target/<profile>/deps/` or a binary in `target/<profile>/`.
pub fn library_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let name = library_file_name();
    let mut candidates = vec![dir.join(&name), dir.join("deps").join(&name)];
    if dir.file_name().is_some_and(|n| n == "deps") {
        if let Some(profile) = dir.parent() {
            candidates.push(profile.join(&name));
        }
    }
    candidates.into_iter().find(|p| p.is_file())
}
