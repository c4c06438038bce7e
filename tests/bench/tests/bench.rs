//! `flopwatch-bench` run as a user runs it, small: `fleet` (50 agents over
//! the real delivery path on a real collector process, every stream
//! connected, samples stored, nothing lost: produced = acknowledged =
//! counted in the store; and forwarding to a slow remote-write receiver,
//! every point delivered once), `soak` (a warped hour folded and sealed), and
//! `ingest --peer` against Prometheus and VictoriaMetrics. These are the
//! bench package's own tests, so Cargo builds the binary before they run.

use flopwatch_tests::procs::Proc;
use flopwatch_tests::prom::tool;
use std::process::{Command, Stdio};
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

/// `flopwatch-bench fleet --remote-write sink` with a receiver that takes
/// 2 s to answer each request: every acknowledged batch's OFU points
/// arrive, each once, and nothing stored is lost.
#[test]
fn a_fleet_forwarding_to_a_slow_receiver_delivers_every_point_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fleet");
    let root = root.to_string_lossy();
    let mut p = Proc::spawn_bench(
        "bench-fleet-forward",
        &[
            "fleet",
            "--agents",
            "20",
            "--gpus",
            "2",
            "--interval",
            "2s",
            "--ramp",
            "1s",
            "--duration",
            "15s",
            "--verify-agents",
            "0",
            "--remote-write",
            "sink",
            "--sink-delay",
            "2s",
            "--dir",
            &root,
        ],
    );
    let line = p.wait_line("fleet result:", Duration::from_secs(240));
    assert_eq!(value(&line, "lost"), 0.0, "{line}");
    assert!(value(&line, "forward_expected") > 0.0, "{line}");
    assert_eq!(
        value(&line, "forwarded"),
        value(&line, "forward_expected"),
        "{line}"
    );
    assert_eq!(value(&line, "forward_repeats"), 0.0, "{line}");
    assert!(value(&line, "forwarded_per_s") > 0.0, "{line}");
    let _ = p.child.wait();
}

/// `flopwatch-bench soak`, small and fast: 6 agents on a clock 120 times
/// the wall clock for an hour of sample time starting 40 minutes into an
/// hour, so the run folds every GPU's head and seals the first hour GPU by
/// GPU (spread over 5 minutes); nothing is lost and the store holds every
/// sample produced.
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
            "6",
            "--warp",
            "120",
            "--hours",
            "1h",
            "--start-into-hour",
            "40m",
            // The first hour's seal spread over 5 minutes of sample time
            // (2.5 s of wall time), not the default 20: the seal then
            // finishes well inside the run however busy the machine is.
            "--seal-spread",
            "5m",
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
    assert_eq!(value(&line, "checked_agents"), 6.0, "{line}");
    assert_eq!(
        value(&line, "checked_stored"),
        value(&line, "checked_produced"),
        "{line}"
    );
    // The first hour (20 minutes of samples) was sealed.
    assert!(value(&line, "sealed_samples") > 0.0, "{line}");
    let _ = p.child.wait();
}

/// `flopwatch-bench ingest --peer prometheus,victoria-metrics`, small and
/// short: the three systems accepted samples (each peer's own count of
/// what it stored equal to what it answered 2xx for), and each ratio
/// printed is the quotient of the two rates printed (within their
/// rounding).
#[test]
fn bench_ingest_against_prometheus_prints_both_rates_and_their_ratio() {
    tool("prometheus");
    tool("victoria-metrics");
    let out = Command::new(flopwatch_tests::bench_bin())
        .args([
            "ingest",
            "--peer",
            "prometheus,victoria-metrics",
            "--duration",
            "2s",
        ])
        .args(["--streams", "2", "--gpus", "2", "--metrics", "5"])
        .args(["--points", "10", "--window", "2", "--query-days", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |peer: &str| -> Vec<String> {
        let prefix = format!("| ingest, samples/s accepted, against {peer}");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {peer} row in:\n{text}"))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let number = |s: &str| -> f64 {
        s.replace(',', "")
            .trim_end_matches('×')
            .parse()
            .unwrap_or_else(|e| panic!("`{s}`: {e}"))
    };
    let mut rates = Vec::new();
    for peer in ["Prometheus", "VictoriaMetrics"] {
        let cells = row(peer);
        let (ours, theirs, ratio) = (number(&cells[2]), number(&cells[3]), number(&cells[4]));
        assert!(ours > 0.0 && theirs > 0.0, "{cells:?}");
        // Rates print rounded to a sample, the ratio to 0.01.
        assert!(
            (ours / theirs - ratio).abs() <= 0.005 + ratio * 1e-3,
            "{ours} / {theirs} is not {ratio}: {cells:?}"
        );
        rates.push((ours, theirs));
    }
    let (ours, theirs) = rates[0];
    let row = format!("{rates:?}");
    // VictoriaMetrics' own rate line: the second `accepted` line.
    let vm_line = text
        .lines()
        .filter(|l| l.starts_with("accepted "))
        .nth(1)
        .unwrap_or_else(|| panic!("no VictoriaMetrics rate line in:\n{text}"));
    assert!(vm_line.contains("rows inserted"), "{vm_line}");
    let first = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{text}"))
    };
    for (line, rate) in [
        (first("acked "), ours),
        (first("accepted "), theirs),
        (vm_line, rates[1].1),
    ] {
        let printed: f64 = line
            .split(" = ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no rate in `{line}`"));
        assert!((printed - rate).abs() <= 1.0, "{line} against {row}");
    }
}
