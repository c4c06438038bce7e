//! The NVML source honours the sampler's read plan (`Sampler::due`): the
//! fields it skips are not read, a skipped GPM sample widens the next
//! window (whose means stay exact), and the adaptive sampler's plans reach
//! the source through `capture_planned`. Runs against the fake
//! `libnvidia-ml.so`, whose clock is frozen between captures.

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::{Capture, GpuSource};
use flopwatch_agent::AdaptiveSampler;
use flopwatch_agent::{ReadPlan, Sampler};
use flopwatch_config::SamplingConfig;
use flopwatch_fake_nvml::{control, library_path};
use flopwatch_proto::metrics as m;
use flopwatch_sim::{FleetPlan, SimModel};

const T0: i64 = 1_700_000_000_000;

fn reading(c: &Capture, gpu: usize, metric: &str) -> Option<flopwatch_agent::source::Reading> {
    c.gpus[gpu]
        .readings
        .iter()
        .find(|r| r.metric == metric)
        .copied()
}

/// GPM metrics (one GPM sample gives them all).
const GPM: [&str; 12] = [
    m::TENSOR_ACTIVE,
    m::SM_ACTIVE,
    m::SM_OCCUPANCY,
    m::DRAM_ACTIVE,
    m::FP16_ACTIVE,
    m::FP32_ACTIVE,
    m::FP64_ACTIVE,
    m::GR_ENGINE_ACTIVE,
    m::NVLINK_TX_BYTES_S,
    m::NVLINK_RX_BYTES_S,
    m::PCIE_TX_BYTES_S,
    m::PCIE_RX_BYTES_S,
];

#[test]
fn skipped_fields_are_not_read_and_a_skipped_gpm_sample_widens_the_window() {
    // The one fake library of the process, held for the whole test.
    let _driver = crate::fake::hold();
    let path = library_path().expect("the fake NVML library is built next to this test");
    let t1 = T0 + 20_000;
    control::set_time_ms(t1).unwrap();
    control::configure(&format!("start_ms={T0},gpus=2,seed=3")).unwrap();
    let model = SimModel::new(&FleetPlan::new(1, 2, 30_000), 0, T0, 3);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();

    // GPU 1 skips every GPM metric and the power read; GPU 0 reads all.
    let mut skip: Vec<(usize, &'static str)> = GPM.iter().map(|&g| (1, g)).collect();
    skip.push((1, m::POWER_W));
    let plan = ReadPlan::skipping(skip);
    let t2 = t1 + 1_000;
    control::set_time_ms(t2).unwrap();
    let second = source.capture_planned(t2, &plan).unwrap();
    for metric in GPM.iter().chain([&m::POWER_W]) {
        assert!(
            reading(&second, 0, metric).is_some(),
            "GPU 0 reads {metric}"
        );
        assert!(
            reading(&second, 1, metric).is_none(),
            "GPU 1 skips {metric}"
        );
    }
    assert!(reading(&second, 1, m::TEMP_C).is_some(), "the rest is read");
    assert!(reading(&second, 1, m::SM_CLOCK_MHZ).is_some());

    // Everything due again: GPU 1's GPM window spans both captures (its
    // sample at t2 was never taken) and is the exact mean over it.
    let t3 = t2 + 2_000;
    control::set_time_ms(t3).unwrap();
    let third = source.capture_planned(t3, &ReadPlan::all()).unwrap();
    let wide = reading(&third, 1, m::SM_ACTIVE).unwrap();
    assert_eq!(wide.window_ms, Some(3_000));
    let truth = model.window(1, t1, t3).mean;
    assert!(
        (wide.value - truth.sm_active).abs() < 1e-6,
        "{} vs {}",
        wide.value,
        truth.sm_active
    );
    let tensor = reading(&third, 1, m::TENSOR_ACTIVE).unwrap();
    assert!((tensor.value - truth.tensor_active).abs() < 1e-6);
    // GPU 0 sampled at t2: its window is the capture's own.
    let narrow = reading(&third, 0, m::SM_ACTIVE).unwrap();
    assert_eq!(narrow.window_ms, None);
    assert_eq!(third.gpus[0].window_ms, 2_000);
    let truth0 = model.window(0, t2, t3).mean.sm_active;
    assert!((narrow.value - truth0).abs() < 1e-6);

    // The adaptive sampler's plans: on a steady GPU, once it has backed
    // off, captures exist where a non-trigger metric is not due, and the
    // trigger (OFU inputs) is always due.
    let cfg = SamplingConfig {
        adaptive: true,
        ..SamplingConfig::default()
    };
    let mut sampler = AdaptiveSampler::new(&cfg, 1);
    let mut t = t3;
    let mut skipped_power = 0;
    for _ in 0..1_200 {
        t += 100;
        control::set_time_ms(t).unwrap();
        let plan = sampler.due(t);
        for g in 0..2 {
            assert!(plan.wants(g, m::TENSOR_ACTIVE));
            assert!(plan.wants(g, m::SM_CLOCK_AVG_MHZ));
        }
        if !plan.wants(0, m::POWER_W) {
            skipped_power += 1;
        }
        let mut c = source.capture_planned(t, &plan).unwrap();
        for g in 0..2 {
            if !plan.wants(g, m::POWER_W) {
                assert!(
                    reading(&c, g, m::POWER_W).is_none(),
                    "a skipped field is not read"
                );
            }
        }
        sampler.observe(&mut c);
    }
    eprintln!("power read at {} of 1200 captures", 1200 - skipped_power);
    assert!(
        skipped_power > 600,
        "power was skipped at only {skipped_power} of 1200 captures"
    );
}
