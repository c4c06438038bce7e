//! The counters of dcgm-exporter's default set that the NVML source reads
//! beyond OFU's inputs, against the fake `libnvidia-ml.so`: graphics-engine
//! activity (GPM, per MIG instance too), the video engines, the memory
//! temperature, free and reserved memory, the remapped rows and the last
//! XID. Each value is compared, in catalog units, with what the fake
//! derives from the simulator (`flopwatch_fake_nvml::derived`) or is
//! configured with.
//!
//! All tests share the one library this process loads: each holds it
//! through [`fake::driver`] (`tests/fake`).

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::{GpuSource, INSTANCE_ACTIVITY};
use flopwatch_agent::ReadPlan;
use flopwatch_fake_nvml::control;
use flopwatch_fake_nvml::derived;
use flopwatch_proto::metrics as m;

use crate::fake;
use fake::{capture_at, driver, truth, value, T0};

/// What the fake's `nvmlDeviceGetMemoryInfo_v2` reserves.
const RESERVED: f64 = (512u64 << 20) as f64;

fn close(got: Option<f64>, want: f64, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what}: no reading"));
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{what}: {got} vs {want}"
    );
}

#[test]
fn the_new_counters_carry_the_fakes_values_in_catalog_units() {
    let spec = "gpus=4,seed=2,enc_util=37,dec_util=12,remapped_rows=1:3:1;2:0:2:pending:failed";
    let t1 = T0 + 7_000;
    let (_guard, path) = driver(spec, t1);
    let (model, _) = truth(spec);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let first = source.capture(t1).unwrap();
    for g in 0..4 {
        // Window means need a window.
        for metric in [m::GR_ENGINE_ACTIVE, m::ENC_UTIL, m::DEC_UTIL] {
            assert!(value(&first, g, metric).is_none(), "gpu {g}: {metric}");
        }
        assert!(value(&first, g, m::MEMORY_TEMP_C).is_some());
    }

    let t2 = t1 + 1_000;
    let c = capture_at(&mut source, t2);
    let remapped = [
        (0.0, 0.0, 0.0),
        (3.0, 1.0, 0.0),
        (0.0, 2.0, 1.0),
        (0.0, 0.0, 0.0),
    ];
    for (g, (corr, unc, failed)) in remapped.into_iter().enumerate() {
        let what = |metric| format!("gpu {g} {metric}");
        // GPM GraphicsUtil (percent) → a fraction, the window's exact mean.
        let w = model.window(g, t1, t2).mean;
        close(
            value(&c, g, m::GR_ENGINE_ACTIVE),
            derived::graphics_util(&w),
            &what(m::GR_ENGINE_ACTIVE),
        );
        assert!(value(&c, g, m::GR_ENGINE_ACTIVE).unwrap() >= value(&c, g, m::SM_ACTIVE).unwrap());
        close(value(&c, g, m::ENC_UTIL), 0.37, &what(m::ENC_UTIL));
        close(value(&c, g, m::DEC_UTIL), 0.12, &what(m::DEC_UTIL));
        let now = model.state_at(g, t2);
        close(
            value(&c, g, m::MEMORY_TEMP_C),
            f64::from(derived::memory_temp_c(&now)),
            &what(m::MEMORY_TEMP_C),
        );
        // Used + free + reserved is the whole memory.
        let used = value(&c, g, m::MEM_USED_BYTES).unwrap();
        close(
            Some(used),
            now.mem_used_bytes.floor(),
            &what(m::MEM_USED_BYTES),
        );
        close(
            value(&c, g, m::MEM_RESERVED_BYTES),
            RESERVED,
            &what(m::MEM_RESERVED_BYTES),
        );
        close(
            value(&c, g, m::MEM_FREE_BYTES),
            (80u64 << 30) as f64 - RESERVED - used,
            &what(m::MEM_FREE_BYTES),
        );
        close(
            value(&c, g, m::REMAPPED_ROWS_CORRECTABLE_TOTAL),
            corr,
            &what(m::REMAPPED_ROWS_CORRECTABLE_TOTAL),
        );
        close(
            value(&c, g, m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL),
            unc,
            &what(m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL),
        );
        close(
            value(&c, g, m::ROW_REMAP_FAILURE),
            failed,
            &what(m::ROW_REMAP_FAILURE),
        );
        close(value(&c, g, m::XID_LAST), 0.0, &what(m::XID_LAST));
        // One reading per metric.
        for metric in [m::GR_ENGINE_ACTIVE, m::MEM_FREE_BYTES, m::XID_LAST] {
            let n = c.gpus[g]
                .readings
                .iter()
                .filter(|r| r.metric == metric)
                .count();
            assert_eq!(n, 1, "gpu {g} {metric}");
        }
    }
}

#[test]
fn a_gpu_without_a_memory_sensor_gives_no_memory_temperature_and_no_error() {
    let t1 = T0 + 2_000;
    let (_guard, path) = driver("gpus=2,seed=1,memory_temp=0", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    for t in [t1, t1 + 500, t1 + 1_000] {
        let c = capture_at(&mut source, t);
        for g in 0..2 {
            assert!(value(&c, g, m::MEMORY_TEMP_C).is_none(), "gpu {g} at {t}");
            for metric in [m::TEMP_C, m::MEM_FREE_BYTES, m::ROW_REMAP_FAILURE] {
                assert!(value(&c, g, metric).is_some(), "gpu {g} lacks {metric}");
            }
        }
    }
}

#[test]
fn xid_last_follows_the_xid_events() {
    // GPU 1's XID comes before the agent starts: NVML never tells of it.
    let spec = "gpus=4,seed=1,xid=1:13@500;2:79@1500;2:48@2500";
    let t1 = T0 + 1_000;
    let (_guard, path) = driver(spec, t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let c = source.capture(t1).unwrap();
    for g in 0..4 {
        assert_eq!(value(&c, g, m::XID_LAST), Some(0.0), "gpu {g}");
    }
    // The capture that takes the event off the set reports it.
    let c = capture_at(&mut source, T0 + 2_000);
    assert_eq!(c.events.len(), 1, "{:?}", c.events);
    let xid: Vec<_> = (0..4).map(|g| value(&c, g, m::XID_LAST)).collect();
    assert_eq!(xid, [Some(0.0), Some(0.0), Some(79.0), Some(0.0)]);
    let c = capture_at(&mut source, T0 + 3_000);
    assert_eq!(value(&c, 2, m::XID_LAST), Some(48.0));
    // It stays until another XID comes.
    let c = capture_at(&mut source, T0 + 4_000);
    assert!(c.events.is_empty());
    assert_eq!(value(&c, 2, m::XID_LAST), Some(48.0));
    assert_eq!(value(&c, 1, m::XID_LAST), Some(0.0));
}

#[test]
fn without_xid_events_there_is_no_last_xid() {
    let t1 = T0 + 1_000;
    let (_guard, path) = driver("gpus=2,seed=1,events=0,xid=1:79@1100", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    let c = capture_at(&mut source, t1 + 1_000);
    for g in 0..2 {
        assert!(value(&c, g, m::XID_LAST).is_none(), "gpu {g}");
        assert!(value(&c, g, m::POWER_W).is_some());
    }
}

#[test]
fn the_read_plan_decides_which_are_read() {
    let t1 = T0 + 3_000;
    let (_guard, path) = driver("gpus=2,seed=4,remapped_rows=0:2:2:failed;1:2:2:failed", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    let skipped = [
        m::MEMORY_TEMP_C,
        m::ENC_UTIL,
        m::DEC_UTIL,
        m::MEM_FREE_BYTES,
        m::MEM_RESERVED_BYTES,
        m::REMAPPED_ROWS_CORRECTABLE_TOTAL,
        m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL,
        m::XID_LAST,
    ];
    // GPU 1 skips them all but the remap failure flag, which comes alone
    // from the call that also has the (slow) counters.
    let plan = ReadPlan::skipping(skipped.iter().map(|&metric| (1, metric)));
    let t2 = t1 + 1_000;
    control::set_time_ms(t2).unwrap();
    let c = source.capture_planned(t2, &plan).unwrap();
    for metric in skipped {
        assert!(value(&c, 0, metric).is_some(), "GPU 0 reads {metric}");
        assert!(value(&c, 1, metric).is_none(), "GPU 1 skips {metric}");
    }
    assert_eq!(value(&c, 1, m::ROW_REMAP_FAILURE), Some(1.0));
    assert!(value(&c, 1, m::MEM_USED_BYTES).is_some());
    assert!(value(&c, 1, m::GR_ENGINE_ACTIVE).is_some());
}

#[test]
fn mig_instances_read_graphics_activity_and_the_card_keeps_its_device_counters() {
    let spec = "gpus=2,seed=5,mig_layout=0:3g.40gb+4g.40gb,enc_util=5,remapped_rows=0:1:0";
    let t1 = T0 + 6_000;
    let (_guard, path) = driver(spec, t1);
    let (model, mig) = truth(spec);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    // Card 0, its instances (GI 1 and 2), then the whole GPU 1.
    assert_eq!(source.inventory().len(), 4);
    source.capture(t1).unwrap();
    let t2 = t1 + 1_000;
    let c = capture_at(&mut source, t2);
    for (pos, gi) in [(1, 1), (2, 2)] {
        let w = mig.instance_window(&model, 0, gi, t1, t2).mean;
        close(
            value(&c, pos, m::GR_ENGINE_ACTIVE),
            derived::graphics_util(&w),
            &format!("instance GI {gi}"),
        );
        // Device-wide counters stay the card's.
        for metric in [
            m::MEMORY_TEMP_C,
            m::MEM_FREE_BYTES,
            m::ENC_UTIL,
            m::XID_LAST,
        ] {
            assert!(value(&c, pos, metric).is_none(), "GI {gi} reports {metric}");
        }
    }
    for metric in INSTANCE_ACTIVITY {
        assert!(value(&c, 0, metric).is_none(), "the card reports {metric}");
    }
    assert!(value(&c, 0, m::GR_ENGINE_ACTIVE).is_none());
    close(
        value(&c, 0, m::MEMORY_TEMP_C),
        f64::from(derived::memory_temp_c(&mig.card_state_at(&model, 0, t2))),
        "card memory temperature",
    );
    close(
        value(&c, 0, m::MEM_RESERVED_BYTES),
        RESERVED,
        "card reserved",
    );
    assert!(value(&c, 0, m::MEM_FREE_BYTES).is_some());
    close(value(&c, 0, m::ENC_UTIL), 0.05, "card encoder");
    close(
        value(&c, 0, m::REMAPPED_ROWS_CORRECTABLE_TOTAL),
        1.0,
        "card remapped rows",
    );
    close(value(&c, 0, m::XID_LAST), 0.0, "card last XID");
    // The whole GPU beside it reads its own graphics activity.
    close(
        value(&c, 3, m::GR_ENGINE_ACTIVE),
        derived::graphics_util(&model.window(1, t1, t2).mean),
        "whole GPU 1",
    );
}
