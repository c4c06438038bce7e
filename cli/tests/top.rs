//! `flopwatch top --once` as users run it: against a collector with two
//! simulated agents (separate processes from the example configs), and
//! against a collector that is not there.

use flopwatch_proto::clock::{Deadline, Stopwatch};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_flopwatch")
}

fn example(name: &str) -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("../config")
    .join(name)
}

/// Kills the child when dropped, so a failing test leaves no process.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_collector(data: &Path) -> (Proc, String) {
    let mut child = Command::new(bin())
        .args(["collector", "--config"])
        .arg(example("collector.toml"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data)
        .env("FLOPWATCH_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (Proc(child), format!("http://{addr}"))
}

/// Node `index` of a 2-node simulated fleet with 2 GPUs per node.
fn start_sim_agent(url: &str, node_id: &str, index: u32) -> Proc {
    Proc(
        Command::new(bin())
            .args(["agent", "--config"])
            .arg(example("agent.toml"))
            .args(["--source", "sim", "--collector", url])
            .env("FLOPWATCH_SIM__GPUS", "2")
            .env("FLOPWATCH_SIM__NODES", "2")
            .env("FLOPWATCH_SIM__NODE_INDEX", index.to_string())
            .env("FLOPWATCH_NODE_ID", node_id)
            .env("FLOPWATCH_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn top_once(url: &str) -> Output {
    Command::new(bin())
        .args(["top", "--collector", url, "--once", "--since", "1m"])
        .env("COLUMNS", "120")
        .env_remove("FLOPWATCH_TOKEN")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

/// A GPU row with an OFU figure: "… <bar> 41.2% …" after the node id.
fn has_gpu_figure(text: &str, node: &str) -> bool {
    text.lines()
        .any(|l| l.contains(node) && l.contains("H100") && l.contains('%'))
}

#[test]
fn top_once_shows_the_fleet_of_a_live_collector() {
    let dir = tempfile::tempdir().unwrap();
    let (_collector, url) = start_collector(&dir.path().join("data"));
    let _a = start_sim_agent(&url, "top-node-a", 0);
    let _b = start_sim_agent(&url, "top-node-b", 1);

    let deadline = Deadline::after(Duration::from_secs(25));
    let text = loop {
        let out = top_once(&url);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "top --once failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        if has_gpu_figure(&text, "top-node-a") && has_gpu_figure(&text, "top-node-b") {
            break text;
        }
        assert!(!deadline.passed(), "no OFU for both nodes in time:\n{text}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("fleet OFU "), "{text}");
    assert!(text.contains("4 GPUs · 2 nodes"), "{text}");
    // The simulator's jobs for a 2×2 fleet.
    for job in ["llm-pretrain", "gemm-bench", "finetune"] {
        assert!(text.contains(job), "{job} missing:\n{text}");
    }
    assert!(text.lines().all(|l| l.chars().count() <= 120), "{text}");
    assert!(!text.contains("\x1b["), "plain text, no escapes:\n{text}");
}

#[test]
fn top_once_names_an_unreachable_collector_and_fails() {
    let started = Stopwatch::start();
    let out = top_once("http://127.0.0.1:1");
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("collector unreachable") && err.contains("http://127.0.0.1:1"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn top_rejects_a_malformed_collector_url() {
    let out = top_once("not a url");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("collector URL `not a url`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn top_without_once_needs_a_terminal() {
    let out = Command::new(bin())
        .args(["top", "--collector", "http://127.0.0.1:1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use --once"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
