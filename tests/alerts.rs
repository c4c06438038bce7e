//! The alerting rules, checked by promtool, Prometheus's own rule checker
//! and unit-test runner:
//!
//! - `deploy/prometheus/flopwatch-rules.yml` passes `promtool check rules`
//!   and its unit tests (`flopwatch-rules.test.yml`: input series, the
//!   alerts expected from them) pass `promtool test rules`;
//! - every alert has a case where it fires and one where it must not;
//! - the Prometheus Operator's PrometheusRule in deploy/k8s/monitoring holds
//!   exactly the same groups.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn deploy_dir() -> PathBuf {
    flopwatch_tests::repo_root().join("deploy")
}

fn rules_file() -> PathBuf {
    deploy_dir().join("prometheus/flopwatch-rules.yml")
}

fn rules_test_file() -> PathBuf {
    deploy_dir().join("prometheus/flopwatch-rules.test.yml")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let de = serde_norway::Deserializer::from_str(&text);
    Value::deserialize(de).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs promtool with `args`; fails the test if it is not installed.
fn promtool(args: &[&str], dir: &Path) -> Output {
    Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool: {e}: run ./deploy/dev/setup.sh (installs Debian's prometheus package)"
            )
        })
}

fn report(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The alert names of a rules document.
fn alert_names(rules: &Value) -> BTreeSet<String> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn promtool_checks_the_rules() {
    let o = promtool(
        &["check", "rules", "flopwatch-rules.yml"],
        &deploy_dir().join("prometheus"),
    );
    assert!(o.status.success(), "{}", report(&o));
}

#[test]
fn the_rules_pass_their_unit_tests() {
    let o = promtool(
        &["test", "rules", "flopwatch-rules.test.yml"],
        &deploy_dir().join("prometheus"),
    );
    assert!(o.status.success(), "{}", report(&o));
}

/// promtool's exit status tells a wrong expectation apart: the unit tests
/// above could not pass by accident.
#[test]
fn promtool_fails_an_alert_that_does_not_fire_as_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(rules_file(), dir.path().join("flopwatch-rules.yml")).expect("copy rules");
    // A collector that is up: FlopwatchCollectorDown must not fire, and
    // this test says it does.
    std::fs::write(
        dir.path().join("wrong.test.yml"),
        r#"rule_files: [flopwatch-rules.yml]
tests:
  - interval: 1m
    input_series:
      - series: 'up{component="collector",instance="c:9400"}'
        values: '1x20'
    alert_rule_test:
      - eval_time: 15m
        alertname: FlopwatchCollectorDown
        exp_alerts:
          - exp_labels: { severity: critical, component: collector, instance: "c:9400" }
"#,
    )
    .expect("write test");
    let o = promtool(&["test", "rules", "wrong.test.yml"], dir.path());
    assert!(!o.status.success(), "{}", report(&o));
    assert!(
        report(&o).contains("FlopwatchCollectorDown"),
        "{}",
        report(&o)
    );
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let alerts = alert_names(&yaml(&rules_file()));
    assert!(alerts.len() >= 9, "{alerts:?}");
    let tests = yaml(&rules_test_file());
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for t in tests["tests"].as_array().expect("tests") {
        for case in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    for a in &alerts {
        assert!(fires.contains(a), "{a}: no case where it fires");
        assert!(silent.contains(a), "{a}: no case where it must not fire");
    }
    let unknown: Vec<&String> = fires
        .union(&silent)
        .filter(|a| !alerts.contains(*a))
        .collect();
    assert!(
        unknown.is_empty(),
        "tests of alerts that do not exist: {unknown:?}"
    );
}

#[test]
fn the_prometheus_rule_holds_the_same_groups_as_the_rules_file() {
    let crd = yaml(&deploy_dir().join("k8s/monitoring/prometheusrule.yaml"));
    assert_eq!(crd["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(crd["kind"], "PrometheusRule");
    let plain = yaml(&rules_file());
    assert!(!plain["groups"].as_array().expect("groups").is_empty());
    assert_eq!(crd["spec"]["groups"], plain["groups"]);
    // Nothing but `groups` in the plain file, nothing but `groups` in spec.
    assert_eq!(plain.as_object().map(|o| o.len()), Some(1));
    assert_eq!(crd["spec"].as_object().map(|o| o.len()), Some(1));
}
