//! `flopwatch-bench fleet`, small: 50 agents over the real delivery path
//! on a real collector process, every stream connected, samples stored,
//! nothing lost (produced = acknowledged = counted in the store).

use flopwatch_tests::procs::Proc;
use std::time::Duration;

fn value(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` in `{line}`"))
}

#[test]
fn fifty_agents_connect_store_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fleet");
    let root = root.to_string_lossy();
    let mut p = Proc::spawn_bench(
        "bench-fleet",
        &[
            "fleet",
            "--agents",
            "50",
            "--interval",
            "2s",
            "--ramp",
            "1s",
            "--duration",
            "4s",
            "--verify-agents",
            "0",
            "--scrape",
            "--dir",
            &root,
        ],
    );
    // 400 GPUs, under `[exporter] max_gpus`: the default page lists them;
    // `gpus=all` lists them too.
    for query in ["/metrics:", "/metrics?gpus=all:"] {
        let scrape = p.wait_line(&format!("scrape {query}"), Duration::from_secs(120));
        assert!(scrape.contains("GPUs omitted 0;"), "{scrape}");
        let mb: f64 = scrape
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no size in `{scrape}`"));
        assert!(mb > 0.1, "{scrape}");
    }
    let line = p.wait_line("fleet result:", Duration::from_secs(120));
    assert_eq!(value(&line, "connected"), 50.0, "{line}");
    assert!(value(&line, "stored_per_s") > 0.0, "{line}");
    assert!(value(&line, "produced") > 0.0, "{line}");
    assert_eq!(value(&line, "lost"), 0.0, "{line}");
    assert_eq!(value(&line, "checked_agents"), 50.0, "{line}");
    assert_eq!(
        value(&line, "checked_stored"),
        value(&line, "checked_produced"),
        "{line}"
    );
    let _ = p.child.wait();
}

/// `flopwatch-bench soak`, small and fast: 20 agents on a clock 120 times
/// the wall clock for an hour of sample time starting 40 minutes into an
/// hour, so the run folds every GPU's head and seals the first hour GPU by
/// GPU; nothing is lost and the store holds every sample produced.
#[test]
fn a_warped_hour_folds_and_seals_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("soak");
    let root = root.to_string_lossy();
    let mut p = Proc::spawn_bench(
        "bench-soak",
        &[
            "soak",
            "--agents",
            "20",
            "--warp",
            "120",
            "--hours",
            "1h",
            "--start-into-hour",
            "40m",
            "--ramp",
            "1s",
            "--verify-agents",
            "0",
            "--dir",
            &root,
        ],
    );
    let line = p.wait_line("soak result:", Duration::from_secs(240));
    assert!(value(&line, "windows") >= 4.0, "{line}");
    assert_eq!(value(&line, "lost"), 0.0, "{line}");
    assert!(value(&line, "produced") > 0.0, "{line}");
    assert_eq!(value(&line, "checked_agents"), 20.0, "{line}");
    assert_eq!(
        value(&line, "checked_stored"),
        value(&line, "checked_produced"),
        "{line}"
    );
    // The first hour (20 minutes of samples) was sealed.
    assert!(value(&line, "sealed_samples") > 0.0, "{line}");
    let _ = p.child.wait();
}
