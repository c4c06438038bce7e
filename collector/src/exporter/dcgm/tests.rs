//! The compat page against what dcgm-exporter writes: its families and
//! their types, units, labels, MIG instances and the XID family.

use super::*;
use flopwatch_proto::metrics::lookup;
use flopwatch_proto::model::{GpuInfo, Mig, MigInstance};
use flopwatch_proto::v1::JobAssignment;
use std::collections::HashSet;

/// dcgm-exporter 4.5.3-4.8.2's default counters file, family and type,
/// less `DCGM_FI_DEV_VGPU_LICENSE_STATUS` (module docs) and the
/// `DCGM_FI_DRIVER_VERSION` label.
const DEFAULT_FAMILIES: [(&str, &str); 24] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
];

fn live(counters: &[(&str, f64)]) -> GpuLive {
    GpuLive {
        tenant: "t".into(),
        uuid: "GPU-1".into(),
        index: 3,
        model: "NVIDIA H100 80GB HBM3".into(),
        node_id: "node-1".into(),
        hostname: "h1".into(),
        counters: counters
            .iter()
            .map(|(k, v)| (k.to_string(), (1, *v)))
            .collect(),
        ..Default::default()
    }
}

fn id() -> Identity {
    Identity {
        pci_bus_id: "00000000:19:00.0".into(),
        driver_version: "550.90.07".into(),
        memory_total_bytes: 80 << 30,
        mig: None,
    }
}

/// Every catalog metric the compat page reads, with a value.
fn everything() -> Vec<(&'static str, f64)> {
    vec![
        (m::SM_CLOCK_MHZ, 1980.0),
        (m::MEM_CLOCK_MHZ, 2619.0),
        (m::MEMORY_TEMP_C, 48.0),
        (m::TEMP_C, 44.0),
        (m::POWER_W, 612.5),
        (m::ENERGY_J, 2.5),
        (m::PCIE_REPLAY_TOTAL, 1.0),
        (m::GPU_UTIL, 0.42),
        (m::MEM_COPY_UTIL, 0.25),
        (m::ENC_UTIL, 0.0),
        (m::DEC_UTIL, 0.125),
        (m::MEM_USED_BYTES, 3.0 * MIB),
        (m::MEM_RESERVED_BYTES, 537.0 * MIB),
        (m::NVLINK_TX_BYTES_S, 4.0e9),
        (m::NVLINK_RX_BYTES_S, 1.0e9),
        (m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL, 2.0),
        (m::REMAPPED_ROWS_CORRECTABLE_TOTAL, 5.0),
        (m::ROW_REMAP_FAILURE, 0.0),
        (m::GR_ENGINE_ACTIVE, 0.97),
        (m::TENSOR_ACTIVE, 0.5),
        (m::DRAM_ACTIVE, 0.3),
        (m::PCIE_TX_BYTES_S, 1e6),
        (m::PCIE_RX_BYTES_S, 2e6),
    ]
}

#[derive(Debug)]
struct Page(Vec<(GpuLive, Identity)>, BTreeMap<(String, String), Xid>);

impl prometheus_client::collector::Collector for Page {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let gpus: Vec<Gpu<'_>> = self.0.iter().map(|(live, id)| Gpu { live, id }).collect();
        encode(&mut enc, &gpus, &self.1, &|_| true)
    }
}

fn render(gpus: Vec<(GpuLive, Identity)>, xids: BTreeMap<(String, String), Xid>) -> String {
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(Page(gpus, xids)));
    flopwatch_transport::metrics_http::render(&r)
}

/// The full label set of GPU 3 on `h1`, without the XID family's.
const LABELS: &str = r#"gpu="3",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",DCGM_FI_DRIVER_VERSION="550.90.07",instance="h1",tenant="t""#;

#[test]
fn every_metric_field_comes_from_a_catalog_metric_of_the_same_kind() {
    let mut names = HashSet::new();
    for f in FIELDS {
        assert!(
            f.name.starts_with("DCGM_FI_") && f.name != XID_FAMILY && names.insert(f.name),
            "{}",
            f.name
        );
        if let Value::Metric(metric, scale) = f.value {
            let def = lookup(metric).unwrap_or_else(|| panic!("{metric} not in the catalog"));
            assert_eq!(
                f.counter,
                def.aggregation == m::Aggregation::Counter,
                "{}",
                f.name
            );
            assert!(scale > 0.0);
        }
    }
}

#[test]
fn every_default_family_is_written_with_dcgm_exporters_type() {
    let text = render(vec![(live(&everything()), id())], BTreeMap::new());
    for (name, kind) in DEFAULT_FAMILIES {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind} missing:\n{text}"
        );
        // Bare names, counters too: no `_total` sample, one row.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .count(),
            1,
            "{name}:\n{text}"
        );
        assert!(!text.contains(&format!("{name}_total")), "{text}");
    }
    assert!(!text.contains(" unknown\n"), "{text}");
}

#[test]
fn units_are_dcgm_exporters() {
    let text = render(vec![(live(&everything()), id())], BTreeMap::new());
    let l = LABELS;
    for want in [
        format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{l}}} 2500.0\n"),
        format!("DCGM_FI_DEV_GPU_UTIL{{{l}}} 42.0\n"),
        format!("DCGM_FI_DEV_DEC_UTIL{{{l}}} 12.5\n"),
        format!("DCGM_FI_DEV_FB_USED{{{l}}} 3.0\n"),
        format!("DCGM_FI_DEV_FB_RESERVED{{{l}}} 537.0\n"),
        // No free reading: total − used − reserved.
        format!("DCGM_FI_DEV_FB_FREE{{{l}}} {:?}\n", 81920.0 - 3.0 - 537.0),
        format!("DCGM_FI_DEV_FB_TOTAL{{{l}}} 81920.0\n"),
        format!("DCGM_FI_DEV_MEMORY_TEMP{{{l}}} 48.0\n"),
        format!("DCGM_FI_DEV_SM_CLOCK{{{l}}} 1980.0\n"),
        // MB/s, transmit plus receive.
        format!("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{l}}} 5000.0\n"),
        format!("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{l}}} 2.0\n"),
        format!("DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{l}}} 0.97\n"),
    ] {
        assert!(text.contains(&want), "{want} missing:\n{text}");
    }
    // The agent's own free reading wins.
    let mut c = everything();
    c.push((m::MEM_FREE_BYTES, 1000.0 * MIB));
    let text = render(vec![(live(&c), id())], BTreeMap::new());
    assert!(
        text.contains(&format!("DCGM_FI_DEV_FB_FREE{{{l}}} 1000.0\n")),
        "{text}"
    );
}

#[test]
fn only_families_with_data_are_written() {
    let no_memory = Identity {
        memory_total_bytes: 0,
        ..id()
    };
    let text = render(
        vec![(live(&[(m::SM_CLOCK_MHZ, 1410.0)]), no_memory)],
        BTreeMap::new(),
    );
    for absent in [
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ] {
        assert!(!text.contains(absent), "{absent}:\n{text}");
    }
    assert!(text.contains("DCGM_FI_DEV_SM_CLOCK{"), "{text}");
    assert!(text.contains("DCGM_FI_DEV_XID_ERRORS{"), "{text}");
}

#[test]
fn labels_are_dcgm_exporters_with_the_pod_and_flopwatchs_own() {
    let mut g = live(&[(m::POWER_W, 300.0)]);
    g.job = Some(JobAssignment {
        job_id: "ml/trainer-0".into(),
        pod: "trainer-0".into(),
        namespace: "ml".into(),
        container: "main".into(),
        ..Default::default()
    });
    let text = render(vec![(g, id())], BTreeMap::new());
    let want = r#"DCGM_FI_DEV_POWER_USAGE{gpu="3",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",DCGM_FI_DRIVER_VERSION="550.90.07",container="main",namespace="ml",pod="trainer-0",instance="h1",tenant="t"} 300.0"#;
    assert!(text.contains(want), "{text}");
}

#[test]
fn a_mig_instance_has_its_cards_uuid_and_its_profile_and_id() {
    let mut g = live(&[(m::TENSOR_ACTIVE, 0.5)]);
    g.uuid = "MIG-GPU-1/2".into();
    let mig = Identity {
        mig: Some(("GPU-1".into(), "3g.40gb".into(), 2)),
        ..id()
    };
    let text = render(
        vec![(live(&[(m::TENSOR_ACTIVE, 0.25)]), id()), (g, mig)],
        BTreeMap::new(),
    );
    let instance = r#"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="3",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="h1",DCGM_FI_DRIVER_VERSION="550.90.07",instance="h1",tenant="t"} 0.5"#;
    assert!(text.contains(instance), "{text}");
    // The card itself: no instance labels.
    assert!(
        text.contains(&format!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{LABELS}}} 0.25")),
        "{text}"
    );
}

#[test]
fn a_mig_record_gives_the_instance_labels() {
    let info = GpuInfo {
        uuid: "MIG-GPU-1/2".into(),
        pci_bus_id: "00000000:19:00.0".into(),
        driver_version: "550.90.07".into(),
        memory_total_bytes: 40 << 30,
        mig: Mig::Instance(MigInstance {
            parent_uuid: "GPU-1".into(),
            gpu_instance_id: 2,
            compute_instance_id: 0,
            profile: "3g.40gb".into(),
        }),
        ..Default::default()
    };
    let r = GpuRecord::from_info(&info, "node-1", None, 0);
    assert_eq!(
        Identity::of(&r),
        Identity {
            memory_total_bytes: 40 << 30,
            mig: Some(("GPU-1".into(), "3g.40gb".into(), 2)),
            ..id()
        }
    );
    let card = GpuRecord::from_info(
        &GpuInfo {
            mig: Mig::Card,
            ..info.clone()
        },
        "node-1",
        None,
        0,
    );
    assert_eq!(Identity::of(&card).mig, None);
}

#[test]
fn the_xid_family_has_the_last_xid_with_its_code_and_message() {
    let xid_row = |text: &str| -> String {
        text.lines()
            .find(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{"))
            .unwrap_or_default()
            .to_string()
    };
    let at = |code: &str, msg: &str| {
        format!(
            r#"DCGM_FI_DEV_XID_ERRORS{{gpu="3",UUID="GPU-1",pci_bus_id="00000000:19:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",DCGM_FI_DRIVER_VERSION="550.90.07",err_code="{code}",err_msg="{msg}",instance="h1",tenant="t"}} {code}.0"#
        )
    };
    // Nothing yet: 0, "No Error".
    let text = render(vec![(live(&[]), id())], BTreeMap::new());
    assert_eq!(xid_row(&text), at("0", "No Error"));
    // An XID event since the collector started.
    let mut xids = BTreeMap::new();
    xids.insert(
        ("t".to_string(), "GPU-1".to_string()),
        Xid { count: 2, last: 79 },
    );
    let text = render(vec![(live(&[]), id())], xids.clone());
    assert_eq!(xid_row(&text), at("79", "GPU has fallen off the bus"));
    // The agent's reading (the XID set before it started) wins.
    let text = render(vec![(live(&[(m::XID_LAST, 48.0)]), id())], xids);
    assert_eq!(xid_row(&text), at("48", "Double-bit ECC error"));
    assert!(
        text.contains("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"),
        "{text}"
    );
    assert_eq!(xid_text(999), "Unknown Error");
}

#[test]
fn the_instance_label_is_the_node() {
    let mut g = live(&[(m::TEMP_C, 40.0)]);
    g.hostname = String::new();
    let text = render(vec![(g, id())], BTreeMap::new());
    let row = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{"))
        .unwrap();
    assert!(row.contains(r#"instance="node-1""#), "{row}");
    assert!(!row.contains("Hostname"), "{row}");
}
