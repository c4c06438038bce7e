//! The built-in GPU spec table (`config/gpus.toml`): real NVML product
//! names, in NVML's spelling and in dcgm-exporter's blank-replaced one, map
//! to the right row; PCIe and NVL parts never map to an SXM row; and every
//! row is sane, cites a source, and reproduces the dense peaks it says
//! NVIDIA publishes.

use flopwatch_config::{Precision, SpecTable};

/// NVML product names (as nvidia-smi and dcgm-exporter print them) and the
/// row each must select.
const NAMES: &[(&str, &str)] = &[
    // Ampere
    ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie"),
    ("NVIDIA A800-SXM4-80GB", "a800-sxm"),
    ("NVIDIA A800 80GB PCIe", "a800-pcie"),
    ("NVIDIA A800 40GB Active", "a800-pcie"),
    ("NVIDIA A30", "a30"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A2", "a2"),
    // Ada Lovelace
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40", "l40"),
    ("NVIDIA L40S", "l40s"),
    // Hopper
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H800", "h800-sxm"),
    ("NVIDIA H800 PCIe", "h800-pcie"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA GH200 144G HBM3e", "gh200"),
    // Blackwell
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA B300", "b300"),
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GB300", "gb300"),
    (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "rtx-pro-6000-server",
    ),
];

/// The spellings a name arrives in: as NVML gives it, with
/// dcgm-exporter's `--replace-blanks-in-model-name` (blanks → `-`), with
/// `_`, upper- and lower-cased, with doubled blanks, without "NVIDIA".
fn spellings(name: &str) -> Vec<String> {
    vec![
        name.to_string(),
        name.replace(' ', "-"),
        name.replace(' ', "_"),
        name.to_uppercase(),
        name.to_lowercase().replace(' ', "-"),
        name.replace(' ', "  "),
        name.trim_start_matches("NVIDIA ").to_string(),
    ]
}

fn key_of(t: &SpecTable, name: &str) -> Option<String> {
    t.lookup(name).map(|s| s.key.clone())
}

#[test]
fn every_known_name_maps_to_its_row_in_every_spelling() {
    let t = SpecTable::builtin();
    for (name, key) in NAMES {
        for s in spellings(name) {
            assert_eq!(key_of(&t, &s).as_deref(), Some(*key), "{s:?}");
        }
    }
}

#[test]
fn every_row_is_reached_by_some_name() {
    let t = SpecTable::builtin();
    for s in t.all() {
        assert!(
            NAMES.iter().any(|(_, k)| *k == s.key),
            "{}: no product name in this test selects it",
            s.key
        );
    }
}

#[test]
fn short_names_do_not_capture_longer_ones() {
    let t = SpecTable::builtin();
    for (name, key) in [
        ("NVIDIA A10", "a10"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA B300", "b300"),
        ("NVIDIA GB300", "gb300"),
    ] {
        assert_eq!(key_of(&t, name).as_deref(), Some(key), "{name}");
    }
    // Unknown parts that contain a known name as a prefix stay unknown.
    for name in [
        "NVIDIA A10G",
        "NVIDIA A16",
        "NVIDIA L20",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "Tesla K80",
        "",
    ] {
        assert_eq!(key_of(&t, name), None, "{name:?}");
    }
}

#[test]
fn pcie_and_nvl_parts_never_map_to_an_sxm_row() {
    let t = SpecTable::builtin();
    let bases = [
        "A100",
        "A100 80GB",
        "A800",
        "H100",
        "H100 80GB HBM3",
        "H100 SXM5",
        "H800",
        "H20",
        "H200",
        "GH200",
        "B200",
        "GB200",
        "B300",
        "GB300",
    ];
    for base in bases {
        for (suffix, form) in [(" PCIe", "pcie"), ("-PCIE-80GB", "pcie"), (" NVL", "nvl")] {
            for s in spellings(&format!("NVIDIA {base}{suffix}")) {
                if let Some(k) = key_of(&t, &s) {
                    assert!(k.ends_with(form), "{s:?} mapped to {k}");
                }
            }
        }
    }
    // The blank-replaced names seen on real dcgm-exporter pages.
    assert_eq!(key_of(&t, "NVIDIA-H100-PCIe").as_deref(), Some("h100-pcie"));
    assert_eq!(key_of(&t, "NVIDIA-H100-NVL").as_deref(), Some("h100-nvl"));
    assert_eq!(
        key_of(&t, "NVIDIA-H100-80GB-HBM3").as_deref(),
        Some("h100-sxm")
    );
}

#[test]
fn keys_still_select_their_row() {
    let t = SpecTable::builtin();
    for s in t.all() {
        assert_eq!(key_of(&t, &s.key).as_deref(), Some(s.key.as_str()));
    }
}

#[test]
fn every_row_is_sane() {
    let t = SpecTable::builtin();
    let mut keys = std::collections::BTreeSet::new();
    let mut patterns = std::collections::BTreeMap::new();
    for s in t.all() {
        assert!(keys.insert(s.key.clone()), "duplicate key {}", s.key);
        assert!(s.sm_count > 0 && s.boost_clock_mhz > 0, "{}", s.key);
        // f_max is at most the SM boost clock (OFU eq. 1 clamps f_SM to it).
        assert!(
            s.tensor_clock_mhz <= s.boost_clock_mhz,
            "{}: tensor clock above boost",
            s.key
        );
        assert!(
            s.flops_per_clock_per_sm.values().all(|v| *v > 0),
            "{}",
            s.key
        );
        // Per-precision ratios of every architecture in the table: BF16 as
        // FP16, TF32 half of FP16, FP8 and INT8 twice FP16.
        let rate = |p| s.flops_per_clock_per_sm.get(&p).copied();
        let fp16 = rate(Precision::Fp16).unwrap();
        assert_eq!(rate(Precision::Bf16), Some(fp16), "{}", s.key);
        assert_eq!(rate(Precision::Tf32), Some(fp16 / 2), "{}", s.key);
        for p in [Precision::Fp8, Precision::Int8] {
            if let Some(r) = rate(p) {
                assert_eq!(r, fp16 * 2, "{}: {p:?}", s.key);
            }
        }
        for m in &s.matches {
            let norm = m.to_ascii_lowercase().replace(['-', '_'], " ");
            if let Some(other) = patterns.insert(norm, s.key.clone()) {
                panic!("pattern {m:?} in both {other} and {}", s.key);
            }
        }
    }
    assert!(t.all().len() >= 25, "{} rows", t.all().len());
}

#[test]
fn every_row_cites_a_source() {
    let t = SpecTable::builtin();
    for s in t.all() {
        assert!(
            s.source.contains("NVIDIA") || s.source.contains("OFU paper"),
            "{}: source {:?}",
            s.key,
            s.source
        );
    }
    // Each `[[gpu]]` block of the file text has its `source =` line.
    let text = flopwatch_config::DEFAULT_SPEC_TABLE;
    let blocks: Vec<&str> = text.split("[[gpu]]").skip(1).collect();
    assert_eq!(blocks.len(), t.all().len());
    for b in blocks {
        assert!(b.lines().any(|l| l.starts_with("source = \"")), "{b}");
    }
}

#[test]
fn every_row_reproduces_its_published_dense_peaks_within_1_percent() {
    let t = SpecTable::builtin();
    for s in t.all() {
        assert!(
            !s.published_dense_tflops.is_empty(),
            "{}: no published peak",
            s.key
        );
        for (p, published) in &s.published_dense_tflops {
            let ours = s
                .peak_tflops(*p)
                .unwrap_or_else(|| panic!("{}: {p:?} published but no rate", s.key));
            assert!(
                (ours / published - 1.0).abs() < 0.01,
                "{}: {p:?} {ours:.2} vs published {published}",
                s.key
            );
        }
    }
}
