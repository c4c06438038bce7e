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
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id;
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

    // The counters the simulator keeps no state for (`derived`).
    control::configure(&format!(
        "gpus=4,seed=9,start_ms={T0},enc_util=25,dec_util=3,remapped_rows=2:4:1:failed"
    ))
    .unwrap();
    let d = nvml.device_by_index(2).unwrap();
    let enc = d.encoder_utilization().unwrap();
    assert_eq!((enc.utilization, enc.sampling_period), (25, 167_000));
    assert_eq!(d.decoder_utilization().unwrap().utilization, 3);
    let temp = d
        .field_values_for(&[FieldId(field_id::NVML_FI_DEV_MEMORY_TEMP)])
        .unwrap();
    let want = flopwatch_fake_nvml::derived::memory_temp_c(&model.state_at(2, T0 + 6_000));
    assert!(
        matches!(temp[0].as_ref().unwrap().value, Ok(SampleValue::U32(t)) if t == want),
        "{temp:?}"
    );
    let mi = d.memory_info().unwrap();
    assert_eq!(mi.reserved, 512 << 20);
    assert_eq!(mi.free + mi.used + mi.reserved, mi.total);
    control::configure(&format!("gpus=2,start_ms={T0},memory_temp=0")).unwrap();
    let d = nvml.device_by_index(0).unwrap();
    let temp = d
        .field_values_for(&[FieldId(field_id::NVML_FI_DEV_MEMORY_TEMP)])
        .unwrap();
    assert!(
        matches!(
            temp[0].as_ref().unwrap().value,
            Err(NvmlError::NotSupported)
        ),
        "a GDDR card: {temp:?}"
    );

    // A time-sliced GPU: nvml-wrapper's two calls (count, then fill) get
    // each process's samples since the last seen stamp.
    control::set_time_ms(T0 + 6_000).unwrap();
    control::configure(&format!(
        "gpus=4,seed=9,start_ms={T0},share=2:4242/70+4343/30"
    ))
    .unwrap();
    let d = nvml.device_by_index(2).unwrap();
    let pids: Vec<u32> = d
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(pids, vec![4242, 4343]);
    let all = d.process_utilization_stats(None).unwrap();
    assert_eq!(all.len(), 200, "two processes × the ring's 100 ticks");
    let seen = all.iter().map(|s| s.timestamp).max().unwrap();
    assert_eq!(seen, (T0 as u64 + 6_000) * 1000);
    assert!(matches!(
        d.process_utilization_stats(seen),
        Err(NvmlError::NotFound)
    ));
    control::set_time_ms(T0 + 6_500).unwrap();
    let new = d.process_utilization_stats(seen).unwrap();
    assert_eq!(new.len(), 100);
    for (pid, pct) in [(4242, 70), (4343, 30)] {
        let mine: Vec<f64> = new
            .iter()
            .filter(|s| s.pid == pid)
            .map(|s| f64::from(s.sm_util))
            .collect();
        assert_eq!(mine.len(), 50);
        let mean = mine.iter().sum::<f64>() / 50.0;
        let truth =
            flopwatch_fake_nvml::share::process_sm_util(&model, 2, pct, T0 + 6_000, T0 + 6_500);
        assert!((mean - truth).abs() <= 0.5, "{pid}: {mean} vs {truth}");
    }
    // The raw protocol: NULL asks the count; a short buffer gets whole
    // ticks, oldest first.
    {
        use nvml_wrapper_sys::bindings as sys;
        type ProcUtil = unsafe extern "C" fn(
            sys::nvmlDevice_t,
            *mut sys::nvmlProcessUtilizationSample_t,
            *mut std::ffi::c_uint,
            std::ffi::c_ulonglong,
        ) -> sys::nvmlReturn_t;
        // SAFETY: the fake library, already loaded; the symbol has nvml.h's
        // signature.
        let lib = unsafe { libloading::Library::new(&path) }.unwrap();
        let f = unsafe { lib.get::<ProcUtil>(b"nvmlDeviceGetProcessUtilization\0") }.unwrap();
        let handle = unsafe { d.handle() };
        let mut count = 0;
        let ret = unsafe { f(handle, std::ptr::null_mut(), &mut count, seen) };
        assert_eq!(ret, sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(count, 100);
        let zero = sys::nvmlProcessUtilizationSample_t {
            pid: 0,
            timeStamp: 0,
            smUtil: 0,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        };
        let mut buf = vec![zero; 5];
        count = 5;
        let ret = unsafe { f(handle, buf.as_mut_ptr(), &mut count, seen) };
        assert_eq!(ret, sys::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(count, 4, "two whole ticks");
        assert_eq!(buf[3].timeStamp, seen + 20_000);
        count = 1;
        let ret = unsafe { f(handle, buf.as_mut_ptr(), &mut count, seen) };
        assert_eq!(ret, sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(count, 100);
    }
    // Without the key: no samples.
    let other = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        other.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));

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
