//! `flopwatch bench fleet`, small: 50 agents over the real delivery path
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
    let mut p = Proc::spawn(
        "bench-fleet",
        &[
            "bench",
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
            "--dir",
            &root,
        ],
    );
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
