//! `flopwatch agent --source dcgm-exporter:URL` started before its
//! exporter, as a DaemonSet's two containers start: the process does not
//! exit, answers `/readyz` 503 with the reason, and once the exporter
//! answers it opens the source, captures and becomes ready. A SIGTERM while
//! it still waits stops it at once.
//!
//! The exporter stand-in is a plain `std::net` server on a port reserved
//! (bound, then released) before the agent starts, so the agent first
//! meets refused connections.

use flopwatch_proto::clock::{Deadline, Stopwatch};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the child when dropped, so a failing test leaves no process.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on (any more).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One A100 on a dcgm-exporter page, its energy counter at `n`.
fn page(n: u64) -> String {
    let labels = "gpu=\"0\",UUID=\"GPU-5d4f6a0e-2c3b-8f61-07a4-1e9c2b6d3f70\",pci_bus_id=\"00000000:07:00.0\",\
                  device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\",\
                  DCGM_FI_DRIVER_VERSION=\"550.90.07\",container=\"\",namespace=\"\",pod=\"\"";
    format!(
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n\
         DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1410\n\
         # HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n\
         # TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n\
         DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {}\n\
         # HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.\n\
         # TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n\
         DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.42\n",
        8_123_456_789 + 90_000 * n
    )
}

/// Serves `page` on `port` from a thread, for the test's life.
fn serve_exporter(port: u16) {
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("the reserved port is free");
    std::thread::spawn(move || {
        let mut n = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            // The request line and headers, up to the blank line.
            while reader.read_line(&mut line).is_ok_and(|r| r > 0) && line != "\r\n" {
                line.clear();
            }
            n += 1;
            let body = page(n);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// `GET http://127.0.0.1:port/path`: status and body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// `flopwatch agent` on `dcgm-exporter:http://127.0.0.1:exporter/metrics`,
/// its probes on `metrics`, its log in `dir/agent.log`.
fn start_agent(dir: &Path, exporter: u16, metrics: u16) -> Proc {
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "collectors = [\"http://127.0.0.1:9\"]\n[host]\ninfiniband = false\ncpu_memory = false\n",
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("agent.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_flopwatch"))
        .args(["agent", "--config"])
        .arg(&cfg)
        .arg("--source")
        .arg(format!("dcgm-exporter:http://127.0.0.1:{exporter}/metrics"))
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{metrics}"))
        .env("FLOPWATCH_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc(child)
}

/// Polls `path` until `want` holds of its answer, for at most `limit`.
fn until(
    port: u16,
    path: &str,
    limit: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let give_up = Deadline::after(limit);
    loop {
        let got = get(port, path).unwrap_or((0, String::new()));
        if want(got.0, &got.1) || give_up.passed() {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_agent_started_before_its_exporter_waits_then_captures() {
    let dir = tempfile::tempdir().unwrap();
    let (exporter, metrics) = (free_port(), free_port());
    let mut agent = start_agent(dir.path(), exporter, metrics);

    // Waiting: serving, live, not ready with the reason.
    let (status, why) = until(metrics, "/readyz", Duration::from_secs(10), |s, _| s != 0);
    assert_eq!(status, 503, "{why}");
    assert!(
        why.contains("source not ready") && why.contains("refused"),
        "{why}"
    );
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent exited: {}",
        std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
    );
    assert_eq!(get(metrics, "/healthz").map(|g| g.0), Some(200));
    assert_eq!(get(metrics, "/readyz").map(|g| g.0), Some(503));

    // The exporter starts: the agent opens it, captures, becomes ready.
    serve_exporter(exporter);
    let (status, why) = until(metrics, "/readyz", Duration::from_secs(30), |s, _| s == 200);
    assert_eq!(status, 200, "{why}");
    let (_, page) = get(metrics, "/metrics").unwrap();
    let captures: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("flopwatch_agent_captures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(captures >= 1.0, "{page}");
    assert!(page.contains("flopwatch_agent_source_up 1"), "{page}");
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(log.contains("cannot be opened yet"), "{log}");
    assert!(log.contains("source opened after"), "{log}");
}

#[test]
fn sigterm_stops_an_agent_waiting_for_its_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let (exporter, metrics) = (free_port(), free_port());
    let mut agent = start_agent(dir.path(), exporter, metrics);
    let (status, _) = until(metrics, "/readyz", Duration::from_secs(10), |s, _| s != 0);
    assert_eq!(status, 503);
    let killed = Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let asked = Stopwatch::start();
    while asked.elapsed() < Duration::from_secs(5) {
        if let Some(code) = agent.0.try_wait().unwrap() {
            assert!(code.success(), "{code}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the agent did not stop within 5 s of SIGTERM");
}
