//! The `flopwatch` binary as users run it: collector, agent and query as
//! separate processes from the example configs; a collector killed with
//! SIGKILL and restarted over the same data dir still has every acked
//! sample.

use flopwatch_proto::clock::{Deadline, Stopwatch};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    start_collector_env(data, &[])
}

fn start_collector_env(data: &Path, env: &[(&str, &str)]) -> (Proc, String) {
    start_collector_config(&example("collector.toml"), data, env)
}

fn start_collector_config(config: &Path, data: &Path, env: &[(&str, &str)]) -> (Proc, String) {
    let mut child = Command::new(bin())
        .envs(env.iter().copied())
        .args(["collector", "--config"])
        .arg(config)
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
    start_sim_agent_env(url, gpus, node_id, &[])
}

fn start_sim_agent_env(url: &str, gpus: u32, node_id: Option<&str>, env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(bin());
    cmd.envs(env.iter().copied());
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
    let t = Stopwatch::start();
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
    // The scope as plain fields, not Rust debug text.
    let uuid = gpus[0]["uuid"].as_str().unwrap();
    let one = query(&url, &["ofu", "--gpu", uuid, "--since", "1h"]);
    assert_eq!(one["scope"]["kind"], "gpu", "{one}");
    assert_eq!(one["scope"]["gpu_uuid"], uuid, "{one}");
    assert!(one["samples"].as_u64().unwrap() > 0, "{one}");
    assert_eq!(before["scope"], serde_json::json!({"kind": "fleet"}));
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

/// `query jobs` / `query job` against processes: per-job OFU (eq. 11)
/// agrees with `query ofu --job`, the straggler shows in the spread across
/// GPUs, and an MFU report a job drops into the agent's `mfu_dir` reaches
/// the collector's cross-check.
#[test]
fn job_queries_and_an_mfu_file_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let mfu_dir = dir.path().join("mfu");
    std::fs::create_dir(&mfu_dir).unwrap();
    let (_collector, url) = start_collector_env(
        &dir.path().join("data"),
        &[("FLOPWATCH_ANALYSIS__WINDOW", "1s")],
    );
    let _agent = start_sim_agent_env(
        &url,
        8,
        Some("job-node"),
        &[("FLOPWATCH_ATTRIBUTION__MFU_DIR", mfu_dir.to_str().unwrap())],
    );
    std::thread::sleep(Duration::from_secs(3));
    // gemm-bench runs a steady GEMM well below 99 %: a job claiming 99 %
    // MFU has miscounted its FLOPs. The report covers the second before
    // the file's modification time.
    let tmp = mfu_dir.join(".gemm.tmp");
    std::fs::write(&tmp, r#"{"job_id": "gemm-bench", "mfu": 0.99}"#).unwrap();
    std::fs::rename(&tmp, mfu_dir.join("gemm-bench.json")).unwrap();
    // The agent scans every 5 s; windows close two windows late.
    let deadline = Deadline::after(Duration::from_secs(20));
    let flagged = loop {
        let ev = query(&url, &["events", "--kind", "mfu_mismatch", "--since", "1h"]);
        if let Some(e) = ev.as_array().and_then(|a| a.first()).cloned() {
            break e;
        }
        assert!(!deadline.passed(), "no mfu_mismatch event");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(flagged["job_id"], "gemm-bench");
    assert_eq!(flagged["value"], 0.99);
    let measured = flagged["baseline"].as_f64().unwrap();
    assert!(measured > 0.3 && measured < 0.89, "{flagged}");

    let jobs = query(&url, &["jobs", "--since", "1h"]);
    let jobs = jobs.as_array().unwrap();
    let find = |id: &str| {
        jobs.iter()
            .find(|j| j["job_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {jobs:?}"))
            .clone()
    };
    let llm = find("llm-pretrain");
    assert_eq!(llm["gpus"], 3);
    // GPU 1 straggles at 60 % of its peers: the 10th percentile across
    // GPUs sits well under the median.
    let (p50, p10) = (
        llm["p50_gpu"].as_f64().unwrap(),
        llm["p10_gpu"].as_f64().unwrap(),
    );
    assert!(p10 < 0.8 * p50, "{llm}");
    assert!(llm["p10_time"].as_f64().unwrap() <= llm["p50_time"].as_f64().unwrap());
    let gemm = find("gemm-bench");
    assert_eq!(gemm["reported_mfu"], 0.99);
    assert_eq!(gemm["mfu_mismatches"], 1);

    let one = query(
        &url,
        &["job", "llm-pretrain", "--since", "1h", "--step", "1s"],
    );
    let points = one["points"].as_array().unwrap();
    assert!(points.len() >= 3, "{one}");
    assert!(points.iter().all(|p| p["gpus"].as_u64().unwrap() <= 3));
    let ofu = query(&url, &["ofu", "--job", "llm-pretrain", "--since", "1h"]);
    // Same job, same range start: the same samples (the agent keeps
    // sending between the two queries, so allow a little drift).
    let (a, b) = (one["ofu"].as_f64().unwrap(), ofu["ofu"].as_f64().unwrap());
    assert!((a - b).abs() < 0.02, "{a} vs {b}");
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
    // A failure, not a usage error.
    assert_eq!(out.status.code(), Some(1));
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
    // The bursty inference service (bursts between idle gaps) can halve
    // its OFU in a 1 s window when a burst straddles the window's edges —
    // more likely on a loaded machine — so it is left out; every steady
    // job must stay unflagged, and finetune's drop is found once.
    let regressions: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("regression") && !l.contains("inference"))
        .collect();
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
    // moe-train reports an MFU 2.12× its true OFU (OFU paper §V-C):
    // flagged; llm-pretrain reports honestly: compared, not flagged.
    let mismatches: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("mfu_mismatch"))
        .collect();
    assert_eq!(mismatches.len(), 1, "{events}");
    assert!(mismatches[0].contains("moe-train"), "{events}");
    assert!(
        mismatches[0].contains("suspected FLOPs miscalculation"),
        "{events}"
    );
    let compared: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(" mfu ") && l.contains("llm-pretrain"))
        .collect();
    assert!(!compared.is_empty(), "{events}");
}

#[test]
fn demo_then_select_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(bin())
        // Log lines for sure (agents connecting), as JSON.
        .env("FLOPWATCH_LOG", "info")
        .env("FLOPWATCH_LOG_FORMAT", "json")
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
    // The live table is free of log lines: they are in the data dir's
    // demo.log, one JSON object per line, and not on stderr either.
    assert!(
        !text.contains("INFO") && !text.contains("\"level\""),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("INFO"), "{stderr}");
    let log = std::fs::read_to_string(data.join("demo.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(lines.iter().any(|l| l["level"] == "INFO"), "{log}");
    assert!(lines.iter().all(|l| l["fields"].is_object()), "{log}");
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
    // Node devices (docs/COUNTERS.md) reach the selector from the store:
    // a steady link's state is low-variance, a port's traffic is kept.
    assert!(dropped.contains(&"ib_port_active"), "{dropped:?}");
    let kept: Vec<&str> = kept.iter().map(|v| v.as_str().unwrap()).collect();
    assert!(
        kept.iter()
            .any(|m| m.starts_with("ib_") && m.ends_with("_bytes_s")),
        "{kept:?}"
    );
    assert!(kept.iter().any(|m| m.starts_with("host_")), "{kept:?}");
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
    assert_eq!(bad.status.code(), Some(1));
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

fn run(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Exit status 2 is the flag parser's (a usage error); a command that
/// fails at run time exits 1.
#[test]
fn usage_errors_exit_2_and_failures_exit_1() {
    let usage = run(&["query", "nodes", "--no-such-flag"], &[]);
    assert_eq!(usage.status.code(), Some(2));
    let bad_value = run(&["query", "events", "--limit", "many"], &[]);
    assert_eq!(bad_value.status.code(), Some(2));
    // Nothing listens on port 1.
    let down = run(
        &["query", "nodes", "--collector", "http://127.0.0.1:1"],
        &[],
    );
    assert_eq!(down.status.code(), Some(1));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let no_file = run(&["collector", "--config", missing.to_str().unwrap()], &[]);
    assert_eq!(no_file.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_file.stderr).contains("missing.toml"));
}

#[test]
fn unknown_log_format_is_a_clear_error() {
    let out = run(
        &["query", "nodes", "--collector", "http://127.0.0.1:1"],
        &[("FLOPWATCH_LOG_FORMAT", "yaml")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FLOPWATCH_LOG_FORMAT") && err.contains("yaml") && err.contains("json"),
        "{err}"
    );
}

/// A query token read from a file (not on the command line, where `ps`
/// shows it) opens a collector that refuses anonymous queries.
#[test]
fn token_file_authenticates_queries() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("collector.toml");
    // Query token `test2` (its SHA-256), tenant acme; no anonymous tenant.
    std::fs::write(
        &cfg,
        "plaintext = true\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
         data_dir = \"data\"\n[[tenants]]\nname = \"acme\"\n\
         query_tokens = [{ sha256 = \"60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752\" }]\n",
    )
    .unwrap();
    let (_collector, url) = start_collector_config(&cfg, &dir.path().join("data"), &[]);
    let token = dir.path().join("token");
    std::fs::write(&token, "test2\n").unwrap();
    let ok = run(
        &[
            "query",
            "nodes",
            "--json",
            "--collector",
            &url,
            "--token-file",
            token.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let nodes: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert!(nodes.is_array(), "{nodes}");
    let anonymous = run(&["query", "nodes", "--collector", &url], &[]);
    assert_eq!(anonymous.status.code(), Some(1));
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "nope").unwrap();
    let refused = run(
        &["query", "nodes", "--collector", &url],
        &[("FLOPWATCH_TOKEN_FILE", wrong.to_str().unwrap())],
    );
    assert_eq!(refused.status.code(), Some(1));
    // A missing file is named, before any connection is tried.
    let gone = dir.path().join("no-such-token");
    let missing = run(
        &[
            "query",
            "nodes",
            "--collector",
            "http://127.0.0.1:1",
            "--token-file",
            gone.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("--token-file") && err.contains("no-such-token"),
        "{err}"
    );
    // --token and --token-file exclude each other: a usage error.
    let both = run(
        &[
            "query",
            "nodes",
            "--token",
            "x",
            "--token-file",
            token.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn check_config_passes_good_files_and_names_the_key_of_bad_ones() {
    let agent = example("agent.toml");
    let collector = example("collector.toml");
    let ok = run(
        &[
            "check-config",
            agent.to_str().unwrap(),
            collector.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        text.contains(&format!("{}: OK (agent)", agent.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}: OK (collector)", collector.display())),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad-collector.toml");
    std::fs::write(
        &bad,
        "data_dir = \"/d\"\nanonymous_tenant = \"d\"\n[policy]\nmin_interval = \"1ms\"\n",
    )
    .unwrap();
    let out = run(&["check-config", bad.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad-collector.toml") && err.contains("policy.min_interval"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    // An agent file naming a token file that is not there.
    let agent_bad = dir.path().join("agent.toml");
    std::fs::write(
        &agent_bad,
        "collectors = [\"http://127.0.0.1:7070\"]\nsource = \"sim\"\ntoken_file = \"gone.token\"\n",
    )
    .unwrap();
    let out = run(&["check-config", agent_bad.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.toml") && err.contains("token_file") && err.contains("gone.token"),
        "{err}"
    );

    // Keys both configs share: --kind decides.
    let shared = dir.path().join("shared.toml");
    std::fs::write(&shared, "metrics_listen = \"127.0.0.1:9401\"\n").unwrap();
    let out = run(&["check-config", shared.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kind"));
    // As a collector config it lacks tenants; as an agent's it is whole
    // (every other key has a default).
    let out = run(
        &[
            "check-config",
            "--kind",
            "collector",
            shared.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("key `tenants`"), "{err}");
    let out = run(
        &["check-config", "--kind", "agent", shared.to_str().unwrap()],
        &[],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("shared.toml: OK (agent)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn completions_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell], &[]);
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in ["collector", "query", "check-config", "--token-file"] {
            assert!(script.contains(sub), "{shell}: {sub}");
        }
    }
    assert_eq!(run(&["completions", "tcsh"], &[]).status.code(), Some(2));
}
