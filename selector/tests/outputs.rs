//! End to end through CSV files: selected.toml, report directory, JSON.

use crate::common;

use common::*;
use flopwatch_selector::{run_csv, summary_json, CsvRun, Outputs, SelectOptions};

fn args(input: Vec<std::path::PathBuf>, dir: &std::path::Path) -> CsvRun {
    CsvRun {
        inputs: input,
        options: SelectOptions::default(),
        outputs: Outputs {
            output: dir.join("out/selected.toml"),
            report: Some(dir.join("report")),
            json: false,
        },
        progress: false,
    }
}

#[test]
fn writes_toml_report_plots_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let rows = known_truth_rows();
    // Split the workloads over two files.
    let (w1, w2): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.workload == "w1");
    let (p1, p2) = (dir.path().join("w1.csv"), dir.path().join("w2.csv"));
    write_csv(&p1, &w1);
    write_csv(&p2, &w2);
    let sel = run_csv(&args(vec![p1, p2], dir.path())).unwrap();

    let text = std::fs::read_to_string(dir.path().join("out/selected.toml")).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let metrics: Vec<&str> = parsed["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(metrics, sel.kept);
    assert_eq!(metrics.len(), expected_groups().len());
    let groups = parsed["groups"].as_array().unwrap();
    assert_eq!(groups.len(), sel.groups.len());
    assert!(groups[0].get("representative").is_some() && groups[0].get("members").is_some());

    let report = dir.path().join("report");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    for name in expected_dropped() {
        assert!(md.contains(name), "report lists dropped {name}");
    }
    assert!(md.contains("base_x1000"));
    for svg in ["heatmap.svg", "groups.svg", "pair-1.svg", "pair-2.svg"] {
        let body = std::fs::read_to_string(report.join(svg)).unwrap();
        assert!(body.starts_with("<svg"), "{svg} is an SVG");
    }

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        json,
        serde_json::from_str::<serde_json::Value>(&summary_json(&sel)).unwrap()
    );
    let obj = json.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["dropped_low_variance", "groups", "kept"]);
    assert_eq!(
        obj["dropped_low_variance"],
        serde_json::json!(expected_dropped())
    );
    assert!(obj["groups"][0]["representative"].is_string());
    assert!(obj["groups"][0]["members"].is_array());
}

#[test]
fn a_run_without_inputs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = args(vec![], dir.path());
    assert!(matches!(
        run_csv(&a),
        Err(flopwatch_selector::SelectError::NoInput)
    ));
}
