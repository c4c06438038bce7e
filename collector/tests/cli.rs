//! The `flopwatch` binary as users run it: collector, agent and query as
//! separate processes from the example configs; a collector killed with
//! SIGKILL and restarted over the same data dir still has every acked
//! sample.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_flopwatch")
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
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

/// `flopwatch agent` from the example config with the sim source.
fn start_sim_agent(url: &str, gpus: u32, node_id: Option<&str>) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.args(["agent", "--config"])
        .arg(example("agent.toml"))
        .args(["--source", "sim", "--collector", url])
        .env("FLOPWATCH_SIM__GPUS", gpus.to_string())
        .env("FLOPWATCH_LOG", "warn");
    if let Some(n) = node_id {
        cmd.env("FLOPWATCH_NODE_ID", n);
    }
    Proc(cmd.spawn().unwrap())
}

fn query(url: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["query"])
        .args(args)
        .args(["--collector", url, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "query failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn signal(p: &Proc, sig: i32) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(p.0.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

fn wait_exit(p: &mut Proc, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(_)) = p.0.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn collector_agent_and_query_as_processes_and_kill_9_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut collector, url) = start_collector(&data);

    let mut agent = start_sim_agent(&url, 2, Some("proc-node"));
    std::thread::sleep(Duration::from_secs(3));
    // SIGTERM: the agent cuts its last batch and waits for its ack.
    signal(&agent, 15);
    assert!(
        wait_exit(&mut agent, Duration::from_secs(10)),
        "agent exits on SIGTERM"
    );

    let gpus = query(&url, &["gpus"]);
    assert_eq!(gpus.as_array().unwrap().len(), 2, "{gpus}");
    let nodes = query(&url, &["nodes"]);
    assert_eq!(nodes[0]["node_id"], "proc-node");
    let before = query(&url, &["ofu", "--since", "1h"]);
    let samples = before["samples"].as_u64().unwrap();
    assert!(samples > 20, "{before}");
    assert!(before["ofu"].as_f64().unwrap() > 0.0, "{before}");
    let tensor = query(
        &url,
        &[
            "series",
            "--gpu",
            gpus[0]["uuid"].as_str().unwrap(),
            "--metric",
            "tensor_active",
            "--since",
            "1h",
        ],
    );
    let tensor_n = tensor["values"].as_array().unwrap().len();
    assert!(tensor_n > 10);

    // kill -9, restart over the same data dir: every acked sample is there.
    signal(&collector, 9);
    assert!(wait_exit(&mut collector, Duration::from_secs(5)));
    let (_collector, url) = start_collector(&data);
    let after = query(&url, &["ofu", "--since", "1h"]);
    assert_eq!(after["samples"], before["samples"]);
    assert_eq!(after["ofu"], before["ofu"]);
    let tensor_after = query(
        &url,
        &[
            "series",
            "--gpu",
            gpus[0]["uuid"].as_str().unwrap(),
            "--metric",
            "tensor_active",
            "--since",
            "1h",
        ],
    );
    assert_eq!(tensor_after["values"].as_array().unwrap().len(), tensor_n);
}

#[test]
fn bad_config_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "anonymous_tenant = \"d\"\n[policy]\nmin_interval = \"1ms\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["collector", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("policy.min_interval"),
        "{err}"
    );
}

#[test]
fn agent_without_driver_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "source = \"nvml\"\n[nvml]\nlibrary_path = \"/nonexistent/libnvidia-ml.so.1\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["agent", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVIDIA driver not available") && err.contains("/nonexistent"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// The demo's regressing job (`finetune`, 2.5× slower after
/// --regress-after) and its straggling GPU (in `llm-pretrain`) show up as
/// events.
#[test]
fn demo_raises_regression_and_straggler_events() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args([
            "demo",
            "--nodes",
            "2",
            "--gpus",
            "4",
            "--duration",
            "14s",
            "--regress-after",
            "7s",
            "--analysis-window",
            "1s",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let events = text
        .split("\nevents (")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let lines: Vec<&str> = events.lines().collect();
    let regressions: Vec<&&str> = lines.iter().filter(|l| l.contains("regression")).collect();
    assert_eq!(regressions.len(), 1, "{events}");
    assert!(regressions[0].contains("finetune"), "{events}");
    // Raised after the regression starts (7 s), within a few windows.
    let t: i64 = regressions[0]
        .trim()
        .trim_start_matches("t=")
        .split('s')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((7..=11).contains(&t), "regression at {t} s: {events}");
    let stragglers: Vec<&&str> = lines.iter().filter(|l| l.contains("straggler")).collect();
    assert_eq!(stragglers.len(), 1, "{events}");
    assert!(stragglers[0].contains("llm-pretrain"), "{events}");
}

#[test]
fn demo_then_select_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(bin())
        .args([
            "demo",
            "--nodes",
            "1",
            "--gpus",
            "4",
            "--duration",
            "4s",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("summary"), "{text}");
    assert!(text.contains("llm-pretrain"), "{text}");
    let selected = dir.path().join("selected.toml");
    let out = Command::new(bin())
        .args(["select", "--store"])
        .arg(&data)
        .args(["--no-progress", "--json", "--output"])
        .arg(&selected)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = summary["kept"].as_array().unwrap();
    assert!(!kept.is_empty());
    // Near-constant counters of the simulator (memory clock, throttle
    // reasons, FP64 activity) are dropped as low-variance.
    let dropped: Vec<&str> = summary["dropped_low_variance"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        dropped.contains(&"mem_clock_mhz") && dropped.contains(&"fp64_active"),
        "{dropped:?}"
    );
    let toml_text = std::fs::read_to_string(&selected).unwrap();
    assert!(toml_text.contains("metrics"), "{toml_text}");
}

#[test]
fn tile_command_reports_overhead_and_adjusted_ofu() {
    let out = Command::new(bin())
        .args([
            "tile",
            "4096",
            "4096",
            "4096",
            "--kernel",
            "nvjet_sm90_hsh_256x160_64x4_2x1",
            "--ofu",
            "50%",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("overhead (eq. 2)      1.5625 %"), "{text}");
    assert!(text.contains("adjusted OFU (eq. 8)  49.2308 %"), "{text}");
    let bad = Command::new(bin())
        .args(["tile", "1", "1", "1", "--tile", "128x0x64"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("128x0x64"));
}

#[test]
fn sigterm_stops_a_collector_with_agents_connected() {
    let dir = tempfile::tempdir().unwrap();
    let (mut collector, url) = start_collector(&dir.path().join("data"));
    let _agent = start_sim_agent(&url, 1, None);
    std::thread::sleep(Duration::from_millis(1500));
    signal(&collector, 15);
    assert!(
        wait_exit(&mut collector, Duration::from_secs(10)),
        "collector exits on SIGTERM although an agent's stream is open"
    );
    assert!(collector.0.wait().unwrap().success());
}
