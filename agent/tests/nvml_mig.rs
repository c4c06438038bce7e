//! MIG through the NVML source, against the fake `libnvidia-ml.so` with MIG
//! layouts (`mig_layout`, `mig_reconfig`): the inventory lists cards and
//! their instances, each instance reads its own GPM pipe metrics and the
//! card's clock (so OFU is per instance and matches the fake's ground
//! truth), the card leaves its compute to its instances, and a
//! reconfiguration is followed without reopening the source.
//!
//! All tests share the one library this process loads: each holds it
//! through [`fake::driver`] (`tests/fake`).

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::{Capture, GpuSource, INSTANCE_ACTIVITY};
use flopwatch_fake_nvml::config::ConfigError;
use flopwatch_fake_nvml::control::{self, ControlError};
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{GpuInfo, Mig, MigInstance};

use crate::fake;
use fake::{capture_at, driver, truth, value, T0};

/// Two MIG cards and a whole GPU.
const LAYOUT: &str = "gpus=3,seed=5,mig_layout=0:3g.40gb+4g.40gb;1:1g.10gb*7";

fn has_readings(c: &Capture, gpu: usize) -> bool {
    c.gpus
        .iter()
        .any(|g| g.gpu == gpu && !g.readings.is_empty())
}

fn instance(info: &GpuInfo) -> &MigInstance {
    info.mig
        .instance()
        .unwrap_or_else(|| panic!("{} is not a MIG instance", info.uuid))
}

/// Inventory position of instance `gi` of the card with UUID `parent`.
fn position(inv: &[GpuInfo], parent: &str, gi: u32) -> usize {
    inv.iter()
        .position(|g| {
            g.mig
                .instance()
                .is_some_and(|i| i.parent_uuid == parent && i.gpu_instance_id == gi)
        })
        .unwrap_or_else(|| panic!("no GI {gi} of {parent}"))
}

#[test]
fn cards_and_their_instances_are_listed() {
    let (_guard, path) = driver(LAYOUT, T0 + 1_000);
    let (model, mig) = truth(LAYOUT);
    let source = NvmlSource::open(Some(&path)).unwrap();
    let inv = source.inventory();
    // Each card, then its instances.
    assert_eq!(inv.len(), 1 + 2 + 1 + 7 + 1);
    let cards = [(0, 0usize), (1, 3), (2, 11)];
    for (card, pos) in cards {
        assert_eq!(inv[pos].uuid, model.uuid(card));
        assert_eq!(inv[pos].index, card as u32);
        assert_eq!(inv[pos].sm_count, 132);
    }
    assert_eq!(inv[0].mig, Mig::Card);
    assert_eq!(inv[3].mig, Mig::Card);
    assert_eq!(inv[11].mig, Mig::Off, "card 2 is not in MIG mode");
    assert!(source.mig_enabled(0) && source.mig_enabled(3));
    assert!(!source.mig_enabled(11));
    assert!(!source.mig_enabled(1), "an instance is not a MIG card");

    let expect = [
        (0, 1, "3g.40gb", 60, 40_320u64),
        (0, 2, "4g.40gb", 64, 40_320),
    ]
    .into_iter()
    .chain((1..=7).map(|gi| (1, gi, "1g.10gb", 16, 9_984)));
    for (k, (card, gi, profile, sms, mib)) in expect.enumerate() {
        let pos = if card == 0 { 1 + k } else { 2 + k };
        let info = &inv[pos];
        let card_info = &inv[cards[card].1];
        let want = mig.instance_at(card, gi, T0 + 1_000).unwrap();
        assert_eq!(
            instance(info),
            &MigInstance {
                parent_uuid: model.uuid(card),
                gpu_instance_id: gi,
                compute_instance_id: 0,
                profile: profile.to_string(),
            },
            "position {pos}"
        );
        assert_eq!(info.uuid, mig.uuid(&model.uuid(card), &want));
        assert!(info.uuid.starts_with("MIG-"), "{}", info.uuid);
        assert_eq!(info.sm_count, sms, "{profile}");
        assert_eq!(info.memory_total_bytes, mib << 20);
        assert_eq!(info.index, card as u32);
        assert_eq!(info.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(info.pci_bus_id, card_info.pci_bus_id);
        assert_eq!(info.driver_version, card_info.driver_version);
        assert_eq!(info.max_sm_clock_mhz, card_info.max_sm_clock_mhz);
        assert!(info.gpm_supported);
    }
    assert_eq!(source.gpm_permission_denied().len(), inv.len());
}

#[test]
fn each_instance_has_its_own_tensor_activity_and_ofu() {
    let t1 = T0 + 10_000;
    let (_guard, path) = driver(LAYOUT, t1);
    let (model, mig) = truth(LAYOUT);
    let f_max = f64::from(model.model.tensor_clock_mhz);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let first = source.capture(t1).unwrap();
    for g in 1..11 {
        assert!(
            value(&first, g, m::TENSOR_ACTIVE).is_none(),
            "no window yet"
        );
    }
    let instances: Vec<(usize, usize, u32)> = source
        .inventory()
        .iter()
        .enumerate()
        .filter_map(|(pos, g)| {
            let i = g.mig.instance()?;
            let card = (0..3).find(|&c| model.uuid(c) == i.parent_uuid)?;
            Some((pos, card, i.gpu_instance_id))
        })
        .collect();
    assert_eq!(instances.len(), 9);

    // Captures at the agent's pace (100 ms, and some shorter and longer);
    // OFU from the readings of each window (OFU eq. 1 on the window means)
    // against the fake's ground truth.
    let mut ofu_sum = vec![0.0; instances.len()];
    let mut distinct: Vec<f64> = Vec::new();
    let mut prev = t1;
    // The first window is as long as the driver's clock-sample ring (1 s):
    // its clock mean covers the window exactly.
    let windows = std::iter::once(1_000).chain([100, 50, 200, 100, 150].repeat(8));
    for dt in windows {
        let t = prev + dt;
        let c = capture_at(&mut source, t);
        for (k, &(pos, card, gi)) in instances.iter().enumerate() {
            let w = mig.instance_window(&model, card, gi, prev, t);
            let got = value(&c, pos, m::TENSOR_ACTIVE).unwrap();
            assert!(
                (got - w.mean.tensor_active).abs() < 1e-9,
                "{pos} (card {card} GI {gi}): {got} vs {}",
                w.mean.tensor_active
            );
            let clock = value(&c, pos, m::SM_CLOCK_AVG_MHZ).unwrap();
            assert!(
                (clock - w.mean.sm_clock_mhz).abs() < 1e-6,
                "{pos}: {clock} vs {}",
                w.mean.sm_clock_mhz
            );
            let card_pos = if card == 0 { 0 } else { 3 };
            assert_eq!(
                value(&c, pos, m::SM_CLOCK_MHZ),
                value(&c, card_pos, m::SM_CLOCK_MHZ),
                "the card's clock"
            );
            for metric in [m::SM_ACTIVE, m::DRAM_ACTIVE, m::FP32_ACTIVE] {
                assert!(value(&c, pos, metric).is_some(), "{pos} lacks {metric}");
            }
            let ofu = got * clock.min(f_max) / f_max;
            let want = w.mean.tensor_active * w.mean.sm_clock_mhz.min(f_max) / f_max;
            assert!((ofu - want).abs() < 1e-9, "{pos}: OFU {ofu} vs {want}");
            if dt != 1_000 {
                ofu_sum[k] += ofu * dt as f64;
            }
            distinct.push(got);
        }
        prev = t;
    }
    // Instances run workloads of their own.
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    assert!(distinct.len() > 100, "{}", distinct.len());
    // Over the whole span, the window-weighted OFU is close to the truth's,
    // computed tick by tick: apart by the covariance of activity and
    // clock inside a window (a window across a training step's compute
    // and all-reduce phases).
    let from = t1 + 1_000;
    for (k, &(pos, card, gi)) in instances.iter().enumerate() {
        let whole = mig.instance_window(&model, card, gi, from, prev).ofu;
        let mean = ofu_sum[k] / (prev - from) as f64;
        assert!(
            (mean - whole).abs() <= 0.03 * whole.max(0.01),
            "{pos}: {mean} vs {whole}"
        );
    }

    // At the driver's resolution (10 ms windows: one clock sample, one
    // tick each) the readings give the ground truth exactly, over a whole
    // training step.
    let from = prev;
    ofu_sum.fill(0.0);
    for _ in 0..120 {
        let t = prev + 10;
        let c = capture_at(&mut source, t);
        for (k, &(pos, _, _)) in instances.iter().enumerate() {
            let tensor = value(&c, pos, m::TENSOR_ACTIVE).unwrap();
            let clock = value(&c, pos, m::SM_CLOCK_AVG_MHZ).unwrap();
            ofu_sum[k] += tensor * clock.min(f_max) / f_max * 10.0;
        }
        prev = t;
    }
    for (k, &(pos, card, gi)) in instances.iter().enumerate() {
        let whole = mig.instance_window(&model, card, gi, from, prev).ofu;
        let mean = ofu_sum[k] / (prev - from) as f64;
        assert!((mean - whole).abs() < 1e-9, "{pos}: {mean} vs {whole}");
    }
}

#[test]
fn a_mig_card_reports_its_device_counters_but_no_compute() {
    let t1 = T0 + 5_000;
    let (_guard, path) = driver(LAYOUT, t1);
    let (model, mig) = truth(LAYOUT);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    let t2 = t1 + 1_000;
    let c = capture_at(&mut source, t2);
    for card in [0, 3] {
        for metric in INSTANCE_ACTIVITY {
            assert!(
                value(&c, card, metric).is_none(),
                "card {card} reports {metric}"
            );
        }
        for metric in [
            m::POWER_W,
            m::TEMP_C,
            m::MEM_USED_BYTES,
            m::MEM_CLOCK_MHZ,
            m::SM_CLOCK_MHZ,
            m::SM_CLOCK_AVG_MHZ,
            m::ENERGY_J,
            m::ECC_DBE_TOTAL,
            m::NVLINK_TX_BYTES_S,
            m::PCIE_RX_BYTES_S,
            m::NVLINK_LINKS_ACTIVE,
        ] {
            assert!(
                value(&c, card, metric).is_some(),
                "card {card} lacks {metric}"
            );
        }
    }
    // The card's power is the mix of its instances'.
    let power = value(&c, 0, m::POWER_W).unwrap();
    let want = mig.card_state_at(&model, 0, t2).power_w;
    assert!((power - want).abs() <= 0.0005 + 1e-9, "{power} vs {want}");
    // The whole GPU beside them reads its compute as before.
    let truth = model.window(2, t1, t2).mean.tensor_active;
    let got = value(&c, 11, m::TENSOR_ACTIVE).unwrap();
    assert!((got - truth).abs() < 1e-9, "{got} vs {truth}");
}

#[test]
fn a_reconfiguration_is_followed_without_reopening() {
    // Card 0: 2g+2g+3g; at +20 s GI 1 stays, GI 2 and 3 become 1g.10gb and
    // GI 4, 5 are created; at +40 s only GI 1 is left; at +60 s GI 2 is
    // created again as a 3g.40gb. Card 1 enters MIG mode at +20 s.
    let spec = "gpus=2,seed=7,mig_layout=0:2g.20gb+2g.20gb+3g.40gb,\
        mig_reconfig=0:2g.20gb+1g.10gb*4@20000;0:2g.20gb@40000;0:2g.20gb+3g.40gb@60000;1:7g.80gb@20000";
    let (_guard, path) = driver(spec, T0 + 10_000);
    let (model, mig) = truth(spec);
    let (card0, card1) = (model.uuid(0), model.uuid(1));
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    let read_ok = |c: &Capture, pos: usize, card: usize, gi: u32, from: i64, to: i64| {
        let want = mig
            .instance_window(&model, card, gi, from, to)
            .mean
            .tensor_active;
        let got = value(c, pos, m::TENSOR_ACTIVE)
            .unwrap_or_else(|| panic!("{pos} (card {card} GI {gi}) lacks tensor activity"));
        assert!((got - want).abs() < 1e-9, "{pos}: {got} vs {want}");
    };

    source.capture(T0 + 10_000).unwrap();
    let c = capture_at(&mut source, T0 + 15_000);
    {
        let inv = source.inventory();
        assert_eq!(inv.len(), 5);
        assert_eq!(inv[4].mig, Mig::Off, "card 1 starts as a whole GPU");
        for gi in 1..=3 {
            read_ok(
                &c,
                position(inv, &card0, gi),
                0,
                gi,
                T0 + 10_000,
                T0 + 15_000,
            );
        }
        assert!(value(&c, 4, m::TENSOR_ACTIVE).is_some());
    }
    let before: Vec<GpuInfo> = source.inventory().to_vec();

    // +21 s: the first reconfiguration, found by the periodic rescan.
    let c = capture_at(&mut source, T0 + 21_000);
    let inv = source.inventory().to_vec();
    assert_eq!(inv.len(), 8, "GI 4, 5 of card 0 and card 1's GI 1 appended");
    assert_eq!(inv[0], before[0], "entries keep their places");
    assert_eq!(inv[1], before[1], "GI 1 lives on unchanged");
    for pos in [2, 3] {
        assert_eq!(instance(&inv[pos]).profile, "1g.10gb", "changed in place");
        assert_eq!(inv[pos].sm_count, 16);
        assert_ne!(inv[pos].uuid, before[pos].uuid, "a new instance");
    }
    assert_eq!(inv[4].uuid, card1);
    assert_eq!(inv[4].mig, Mig::Card, "card 1 entered MIG mode");
    assert_eq!(instance(&inv[5]).gpu_instance_id, 4);
    assert_eq!(instance(&inv[6]).gpu_instance_id, 5);
    assert_eq!(instance(&inv[7]).parent_uuid, card1);
    assert_eq!(instance(&inv[7]).profile, "7g.80gb");
    assert_eq!(inv[7].sm_count, 132);
    assert_eq!(source.gpm_permission_denied().len(), 8);
    read_ok(&c, 1, 0, 1, T0 + 15_000, T0 + 21_000);
    assert!(
        value(&c, 4, m::TENSOR_ACTIVE).is_none(),
        "card 1's compute is its instance's"
    );

    let c = capture_at(&mut source, T0 + 22_000);
    for (pos, card, gi) in [
        (1, 0, 1),
        (2, 0, 2),
        (3, 0, 3),
        (5, 0, 4),
        (6, 0, 5),
        (7, 1, 1),
    ] {
        read_ok(&c, pos, card, gi, T0 + 21_000, T0 + 22_000);
    }

    // +40 s: GI 2..5 are destroyed. Before the next rescan, their GPM
    // samples find them gone; they give no readings from then on.
    capture_at(&mut source, T0 + 31_000);
    let c = capture_at(&mut source, T0 + 40_500);
    for pos in [2, 3, 5, 6] {
        assert!(!has_readings(&c, pos), "{pos} was destroyed");
    }
    read_ok(&c, 1, 0, 1, T0 + 31_000, T0 + 40_500);
    let c = capture_at(&mut source, T0 + 41_000);
    assert_eq!(
        source.inventory().len(),
        8,
        "destroyed instances stay listed"
    );
    for pos in [2, 3, 5, 6] {
        assert!(!has_readings(&c, pos), "{pos} was destroyed");
    }
    read_ok(&c, 1, 0, 1, T0 + 40_500, T0 + 41_000);
    read_ok(&c, 7, 1, 1, T0 + 40_500, T0 + 41_000);

    // +60 s: GI 2 is created again: its entry comes back, updated.
    capture_at(&mut source, T0 + 61_000);
    let inv = source.inventory().to_vec();
    assert_eq!(inv.len(), 8);
    assert_eq!(instance(&inv[2]).profile, "3g.40gb");
    assert_eq!(inv[2].sm_count, 60);
    let now = mig.instance_at(0, 2, T0 + 61_000).unwrap();
    assert_eq!(inv[2].uuid, mig.uuid(&card0, &now));
    let c = capture_at(&mut source, T0 + 62_000);
    read_ok(&c, 2, 0, 2, T0 + 61_000, T0 + 62_000);
    for pos in [3, 5, 6] {
        assert!(!has_readings(&c, pos), "{pos} stays gone");
    }
}

#[test]
fn a_bad_layout_is_refused_naming_its_key() {
    let _guard = fake::hold();
    for (spec, key) in [
        ("mig_layout=0:9g.90gb", "mig_layout"),
        ("mig_layout=0:4g.40gb+4g.40gb", "mig_layout"),
        ("mig_reconfig=0:1g.10gb", "mig_reconfig"),
    ] {
        match control::configure(spec) {
            Err(e @ ControlError::Config(ConfigError::BadValue { .. })) => {
                assert!(e.to_string().contains(&format!("`{key}`")), "{spec}: {e}");
            }
            other => panic!("{spec}: {other:?}"),
        }
    }
}
