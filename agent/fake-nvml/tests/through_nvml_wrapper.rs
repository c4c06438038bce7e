//! The built library, loaded by nvml-wrapper as the agent loads it.
//!
//! One test: every call in this process shares the one loaded library.

use flopwatch_fake_nvml::{control, library_path};
use flopwatch_sim::{FleetPlan, SimModel};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, Sampling, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::Nvml;

const T0: i64 = 1_700_000_000_000;

#[test]
fn nvml_wrapper_reads_the_simulated_node() {
    let path = library_path().expect("fake library built next to the test binary");
    control::set_time_ms(T0 + 5_000).unwrap();
    control::configure(&format!("gpus=4,seed=9,start_ms={T0},driver=535.104.05")).unwrap();
    let nvml = Nvml::builder().lib_path(path.as_os_str()).init().unwrap();
    let model = SimModel::new(&FleetPlan::new(1, 4, 30_000), 0, T0, 9);

    assert_eq!(nvml.sys_driver_version().unwrap(), "535.104.05");
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert!(matches!(
        nvml.device_by_index(4),
        Err(NvmlError::InvalidArg)
    ));
    let d = nvml.device_by_index(2).unwrap();
    assert_eq!(d.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(d.uuid().unwrap(), model.uuid(2));
    assert_eq!(d.pci_info().unwrap().bus_id, "00000000:1A:00.0");
    assert_eq!(d.attributes().unwrap().multiprocessor_count, 132);
    assert_eq!(d.max_clock_info(Clock::SM).unwrap(), 1980);
    let s = model.state_at(2, T0 + 5_000);
    assert_eq!(
        f64::from(d.clock_info(Clock::SM).unwrap()),
        s.sm_clock_mhz.round()
    );
    assert_eq!(
        f64::from(d.temperature(TemperatureSensor::Gpu).unwrap()),
        s.temp_c.round()
    );
    assert_eq!(d.memory_info().unwrap().total, 80 << 30);
    assert_eq!(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap(),
        0
    );
    assert!(d.gpm_support().unwrap());

    // GPM over one second: the exact window mean, in percent.
    let a = d.gpm_sample().unwrap();
    let clocks_seen = d.samples(Sampling::ProcessorClock, None).unwrap();
    assert_eq!(clocks_seen.len(), 100, "the ring holds one second of ticks");
    let last = clocks_seen.last().unwrap().timestamp;
    control::set_time_ms(T0 + 6_000).unwrap();
    let b = d.gpm_sample().unwrap();
    let r = gpm_metrics_get(
        &nvml,
        &a,
        &b,
        &[GpmMetricId::AnyTensorUtil, GpmMetricId::Nvdec0Util],
    )
    .unwrap();
    let truth = model.window(2, T0 + 5_000, T0 + 6_000).mean;
    let tensor = r[0].as_ref().unwrap();
    assert!((tensor.value / 100.0 - truth.tensor_active).abs() < 1e-9);
    assert_eq!(tensor.metric_info.unit, "%");
    assert!(matches!(r[1], Err(NvmlError::NotSupported)));

    // Clock samples after the last seen one: exactly the window's ticks.
    let new = d.samples(Sampling::ProcessorClock, last).unwrap();
    assert_eq!(new.len(), 100);
    let mean = new
        .iter()
        .map(|s| match s.value {
            SampleValue::U32(v) => f64::from(v),
            ref other => panic!("unexpected sample type {other:?}"),
        })
        .sum::<f64>()
        / 100.0;
    assert!((mean - truth.sm_clock_mhz).abs() < 0.5);
    let none = d.samples(Sampling::ProcessorClock, new.last().unwrap().timestamp);
    assert!(matches!(none, Err(NvmlError::NotFound)), "{none:?}");

    // Without GPM (pre-Hopper), sampling is refused but the rest works.
    control::configure(&format!("gpus=2,gpm=0,start_ms={T0}")).unwrap();
    let d = nvml.device_by_index(0).unwrap();
    assert!(!d.gpm_support().unwrap());
    assert!(matches!(d.gpm_sample(), Err(NvmlError::NotSupported)));
    assert!(d.power_usage().unwrap() > 0);

    // In a container without CAP_SYS_ADMIN: GPM is there but refused.
    control::configure(&format!("gpus=2,gpm_permission=denied,start_ms={T0}")).unwrap();
    let d = nvml.device_by_index(0).unwrap();
    assert!(d.gpm_support().unwrap());
    assert!(matches!(d.gpm_sample(), Err(NvmlError::NoPermission)));
    assert!(matches!(
        gpm_metrics_get(&nvml, &a, &b, &[GpmMetricId::AnyTensorUtil]),
        Err(NvmlError::NoPermission)
    ));
    assert!(d.power_usage().unwrap() > 0);
    drop((a, b));
    control::set_time_ms(0).unwrap();
}
