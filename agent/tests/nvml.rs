//! The NVML source against the fake `libnvidia-ml.so` (crate
//! `flopwatch-fake-nvml`), loaded through nvml-wrapper exactly like the
//! real driver. The fake's clock is frozen, so every window is exact and
//! the readings can be compared with the simulator's ground truth.
//!
//! All tests share the one library this process loads: each holds it
//! through [`fake::driver`] (`tests/fake`).

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::{GpuSource, SourceError};
use flopwatch_fake_nvml::control;
use flopwatch_proto::metrics as m;
use flopwatch_sim::{FleetPlan, SimModel};
use std::path::Path;

use crate::fake;
use fake::{driver, value, T0};

#[test]
fn inventory_lists_the_simulated_h100s() {
    let (_guard, path) = driver("gpus=8,nodes=1,node=0,seed=1", T0 + 1_000);
    let source = NvmlSource::open(Some(&path)).unwrap();
    let model = SimModel::new(&FleetPlan::new(1, 8, 30_000), 0, T0, 1);
    assert_eq!(source.name(), "nvml");
    let inv = source.inventory();
    assert_eq!(inv.len(), 8);
    for (g, info) in inv.iter().enumerate() {
        assert_eq!(info.index, g as u32);
        assert_eq!(info.uuid, model.uuid(g));
        assert_eq!(info.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(info.sm_count, 132);
        assert_eq!(info.max_sm_clock_mhz, 1980);
        assert_eq!(info.max_mem_clock_mhz, 2619);
        assert_eq!(info.driver_version, "550.54.15");
        assert_eq!(info.pci_bus_id, format!("00000000:{:02X}:00.0", 0x18 + g));
        assert!(info.gpm_supported);
        assert_eq!(info.memory_total_bytes, 80 << 30);
    }
}

#[test]
fn windows_carry_exact_gpm_and_clock_means() {
    let t1 = T0 + 12_340;
    let (_guard, path) = driver("gpus=8,seed=1", t1);
    let model = SimModel::new(&FleetPlan::new(1, 8, 30_000), 0, T0, 1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();

    let first = source.capture(t1).unwrap();
    assert_eq!(first.ts_ms, t1);
    for g in &first.gpus {
        assert_eq!(g.window_ms, 0);
        assert!(
            value(&first, g.gpu, m::TENSOR_ACTIVE).is_none(),
            "no window on the first capture"
        );
        assert!(value(&first, g.gpu, m::SM_CLOCK_AVG_MHZ).is_none());
        assert!(value(&first, g.gpu, m::SM_CLOCK_MHZ).is_some());
    }

    let t2 = t1 + 1_000;
    control::set_time_ms(t2).unwrap();
    let second = source.capture(t2).unwrap();
    for g in 0..8 {
        assert_eq!(second.gpus[g].window_ms, 1_000);
        let truth = model.window(g, t1, t2).mean;
        let now = model.state_at(g, t2);
        let tensor = value(&second, g, m::TENSOR_ACTIVE).unwrap();
        assert!(
            (tensor - truth.tensor_active).abs() < 1e-6,
            "gpu {g}: {tensor} vs {}",
            truth.tensor_active
        );
        let avg = value(&second, g, m::SM_CLOCK_AVG_MHZ).unwrap();
        assert!(
            (avg - truth.sm_clock_mhz).abs() < 1.0,
            "gpu {g}: {avg} vs {}",
            truth.sm_clock_mhz
        );
        let point = value(&second, g, m::SM_CLOCK_MHZ).unwrap();
        assert!(
            (point - now.sm_clock_mhz).abs() <= 0.5 + 1e-9,
            "gpu {g}: {point} vs {}",
            now.sm_clock_mhz
        );
        // Units: percent → fraction, MiB/s → bytes/s, mW → W.
        let close = |metric, want: f64| {
            let got = value(&second, g, metric).unwrap();
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "gpu {g} {metric}: {got} vs {want}"
            );
        };
        close(m::SM_ACTIVE, truth.sm_active);
        close(m::DRAM_ACTIVE, truth.dram_active);
        close(m::NVLINK_TX_BYTES_S, truth.nvlink_tx_bytes_s);
        close(m::PCIE_RX_BYTES_S, truth.pcie_rx_bytes_s);
        let power = value(&second, g, m::POWER_W).unwrap();
        assert!((power - now.power_w).abs() <= 0.0005 + 1e-9);
        for metric in [
            m::TEMP_C,
            m::MEM_USED_BYTES,
            m::MEM_CLOCK_MHZ,
            m::GPU_UTIL,
            m::THROTTLE_REASONS,
            m::ENERGY_J,
        ] {
            assert!(
                value(&second, g, metric).is_some(),
                "gpu {g} lacks {metric}"
            );
        }
        assert_eq!(value(&second, g, m::ECC_DBE_TOTAL), Some(0.0));
    }

    // A backed-off interval loses no tensor average: 5 s in one window.
    let t3 = t2 + 5_000;
    control::set_time_ms(t3).unwrap();
    let third = source.capture(t3).unwrap();
    for g in 0..8 {
        let truth = model.window(g, t2, t3).mean.tensor_active;
        assert!((value(&third, g, m::TENSOR_ACTIVE).unwrap() - truth).abs() < 1e-6);
        assert_eq!(third.gpus[g].window_ms, 5_000);
    }
}

#[test]
fn without_gpm_there_is_no_tensor_activity_but_the_rest_flows() {
    let t1 = T0 + 3_000;
    let (_guard, path) = driver("gpus=4,seed=3,gpm=0", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    assert_eq!(source.inventory().len(), 4);
    assert!(source.inventory().iter().all(|g| !g.gpm_supported));
    source.capture(t1).unwrap();
    control::set_time_ms(t1 + 500).unwrap();
    let c = source.capture(t1 + 500).unwrap();
    for g in 0..4 {
        assert!(value(&c, g, m::TENSOR_ACTIVE).is_none());
        assert!(value(&c, g, m::SM_ACTIVE).is_none());
        for metric in [
            m::SM_CLOCK_AVG_MHZ,
            m::SM_CLOCK_MHZ,
            m::POWER_W,
            m::GPU_UTIL,
            m::ENERGY_J,
        ] {
            assert!(value(&c, g, metric).is_some(), "gpu {g} lacks {metric}");
        }
    }
}

#[test]
fn a_missing_library_is_no_driver() {
    let missing = Path::new("/nonexistent/flopwatch/libnvidia-ml.so.1");
    match NvmlSource::open(Some(missing)) {
        Err(SourceError::NoDriver(message)) => {
            assert!(
                message.contains("/nonexistent/flopwatch/libnvidia-ml.so.1"),
                "{message}"
            );
        }
        other => panic!("expected NoDriver, got {other:?}"),
    }
}

#[test]
fn busy_gpus_report_their_compute_processes() {
    let t1 = T0 + 2_000;
    let (_guard, path) = driver("gpus=8,seed=1", t1);
    let model = SimModel::new(&FleetPlan::new(1, 8, 30_000), 0, T0, 1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    assert!(
        source.last_pids().iter().all(|(_, pids)| pids.is_empty()),
        "no PIDs before the first capture"
    );
    let c = source.capture(t1).unwrap();
    let pids = source.last_pids();
    assert_eq!(pids.len(), 8);
    let mut busy = 0;
    for (g, (uuid, gpu_pids)) in pids.iter().enumerate() {
        assert_eq!(*uuid, model.uuid(g));
        if model.plans[g].job.is_some() {
            busy += 1;
            assert_eq!(value(&c, g, m::COMPUTE_PROCESSES), Some(1.0), "gpu {g}");
            assert_eq!(*gpu_pids, vec![10_000 + g as u32]);
        } else {
            assert_eq!(value(&c, g, m::COMPUTE_PROCESSES), Some(0.0), "gpu {g}");
            assert!(gpu_pids.is_empty());
        }
        assert!(!source.mig_enabled(g), "the fake has no MIG");
    }
    assert!(busy > 0, "the simulated node runs at least one job");
}

#[test]
fn an_xid_is_reported_once_as_an_event() {
    let t1 = T0 + 1_000;
    let (_guard, path) = driver("gpus=4,seed=1,xid=2:79@1500", t1);
    let model = SimModel::new(&FleetPlan::new(1, 4, 30_000), 0, T0, 1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    assert!(source.capture(t1).unwrap().events.is_empty(), "not yet");

    let t2 = T0 + 2_000;
    control::set_time_ms(t2).unwrap();
    let c = source.capture(t2).unwrap();
    assert_eq!(c.events.len(), 1, "{:?}", c.events);
    let e = &c.events[0];
    assert_eq!(e.gpu_uuid, model.uuid(2));
    assert_eq!(e.kind, "xid");
    assert_eq!(e.code, 79);
    assert_eq!(e.ts_ms, t2);
    assert!(e.detail.contains("79"), "{}", e.detail);

    control::set_time_ms(t2 + 1_000).unwrap();
    assert!(source.capture(t2 + 1_000).unwrap().events.is_empty());
}

#[test]
fn without_event_support_captures_still_flow() {
    let t1 = T0 + 1_000;
    let (_guard, path) = driver("gpus=2,seed=1,events=0,xid=1:79@1100", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    control::set_time_ms(t1 + 1_000).unwrap();
    let c = source.capture(t1 + 1_000).unwrap();
    assert!(c.events.is_empty());
    assert_eq!(c.gpus.len(), 2);
    assert!(value(&c, 0, m::POWER_W).is_some());
}

#[test]
fn mig_mode_is_read_at_open() {
    let (_guard, path) = driver("gpus=2,seed=1,mig=1", T0 + 1_000);
    let source = NvmlSource::open(Some(&path)).unwrap();
    assert!(source.mig_enabled(0) && source.mig_enabled(1));
    assert!(!source.mig_enabled(2), "no such GPU");
}

/// Without GPM, NVLink throughput comes from the NVLink data counters
/// (field values, link 0 × links up) and PCIe from the driver's 20 ms
/// throughput sample; link state and error counters come on every GPU.
#[test]
fn without_gpm_nvlink_and_pcie_come_from_field_values_and_counters() {
    let t1 = T0 + 4_000;
    let (_guard, path) = driver("gpus=8,seed=1,gpm=0,nvlinks=12,nvlink_replays=3", t1);
    let model = SimModel::new(&FleetPlan::new(1, 8, 30_000), 0, T0, 1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let first = source.capture(t1).unwrap();
    assert!(
        value(&first, 0, m::NVLINK_TX_BYTES_S).is_none(),
        "no window yet"
    );
    let t2 = t1 + 1_000;
    control::set_time_ms(t2).unwrap();
    let c = source.capture(t2).unwrap();
    for g in 0..8 {
        let truth = model.window(g, t1, t2).mean;
        for (metric, want) in [
            (m::NVLINK_TX_BYTES_S, truth.nvlink_tx_bytes_s),
            (m::NVLINK_RX_BYTES_S, truth.nvlink_rx_bytes_s),
        ] {
            let got = value(&c, g, metric).unwrap_or_else(|| panic!("gpu {g} lacks {metric}"));
            // Whole KiB per link: at most 13 KiB off over one second.
            assert!(
                (got - want).abs() < 1e-5 * want + 14.0 * 1024.0,
                "gpu {g} {metric}: {got} vs {want}"
            );
        }
        let pcie = model.window(g, t2 - 20, t2).mean;
        for (metric, want) in [
            (m::PCIE_TX_BYTES_S, pcie.pcie_tx_bytes_s),
            (m::PCIE_RX_BYTES_S, pcie.pcie_rx_bytes_s),
        ] {
            let got = value(&c, g, metric).unwrap();
            assert!(
                (got - want).abs() <= 1024.0,
                "gpu {g} {metric}: {got} vs {want}"
            );
        }
        assert_eq!(value(&c, g, m::NVLINK_LINKS_ACTIVE), Some(12.0));
        assert_eq!(value(&c, g, m::NVLINK_ERRORS_TOTAL), Some(36.0));
        assert_eq!(value(&c, g, m::PCIE_REPLAY_TOTAL), Some(0.0));
    }
    // The all-reduce of the data-parallel GPUs shows on NVLink.
    let busy = (0..8)
        .map(|g| value(&c, g, m::NVLINK_TX_BYTES_S).unwrap())
        .fold(0.0, f64::max);
    assert!(busy > 1e10, "{busy}");
}

#[test]
fn with_gpm_link_state_comes_alongside_gpm_throughput() {
    let t1 = T0 + 5_000;
    let (_guard, path) = driver("gpus=2,seed=1,nvlinks=18", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    control::set_time_ms(t1 + 500).unwrap();
    let c = source.capture(t1 + 500).unwrap();
    for g in 0..2 {
        let n = c.gpus[g]
            .readings
            .iter()
            .filter(|r| r.metric == m::NVLINK_TX_BYTES_S)
            .count();
        assert_eq!(n, 1, "one NVLink rate, from GPM");
        assert_eq!(value(&c, g, m::NVLINK_LINKS_ACTIVE), Some(18.0));
        assert_eq!(value(&c, g, m::NVLINK_ERRORS_TOTAL), Some(0.0));
    }
}
