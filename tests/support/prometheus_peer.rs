//! A real Prometheus on a loopback port, as the peer flopwatch is checked
//! and measured against: the end-to-end tests (scrapes, remote write, TLS
//! and basic auth; tests/prometheus.rs) and the benchmarks that run it in
//! the same run as flopwatch (`flopwatch-bench ingest --peer prometheus`).
//! The server is Debian's `prometheus` package (2.42), installed by
//! deploy/dev/setup.sh.
//!
//! Part of the test and bench harness: the collector never starts a
//! Prometheus; only the benchmarks and the tests do.

use flopwatch_proto::clock::Deadline;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `promtool tsdb create-blocks-from openmetrics` of the OpenMetrics file
/// `om` into the TSDB directory `out`, blocks of at most `max_block` (`24h`).
pub fn create_blocks(promtool: &str, om: &Path, out: &Path, max_block: &str) -> Result<(), String> {
    let status = Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(format!("--max-block-duration={max_block}"))
        .arg(om)
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("running {promtool} (Debian package `prometheus`): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{promtool} tsdb create-blocks-from openmetrics failed: {status}"
        ))
    }
}

/// `name` when the shell finds it on `PATH` (or `name` is a path to it),
/// else an error that says how to install it.
pub fn find_tool(name: &str) -> Result<String, String> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v '{name}'")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if found {
        Ok(name.to_string())
    } else {
        Err(format!(
            "`{name}` not found: run ./deploy/dev/setup.sh (installs Debian's prometheus package)"
        ))
    }
}

/// How to start a [`LocalPrometheus`].
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// The server binary.
    pub binary: String,
    /// Where `prometheus.yml` and the server's log (`prometheus.log`) go.
    pub dir: PathBuf,
    /// `--storage.tsdb.path` (a directory of TSDB blocks, e.g. made by
    /// `promtool tsdb create-blocks-from`, or a new one).
    pub tsdb: PathBuf,
    /// Loopback port of `--web.listen-address`.
    pub port: u16,
    /// The content of `prometheus.yml`.
    pub config: String,
    /// `--web.enable-remote-write-receiver`.
    pub remote_write_receiver: bool,
    /// Further flags (`--web.config.file=...`, `--storage.tsdb.retention.time=...`).
    pub args: Vec<String>,
}

impl PrometheusOptions {
    /// `prometheus` on `port`, its files and TSDB under `dir`, no scrape
    /// targets, no receiver.
    pub fn new(dir: &Path, port: u16) -> Self {
        Self {
            binary: "prometheus".into(),
            dir: dir.to_path_buf(),
            tsdb: dir.join("tsdb"),
            port,
            config: "global:\n  scrape_interval: 15s\n".into(),
            remote_write_receiver: false,
            args: Vec::new(),
        }
    }
}

/// A running Prometheus; killed (and reaped) when dropped.
#[derive(Debug)]
pub struct LocalPrometheus {
    child: Child,
    log: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl LocalPrometheus {
    /// Writes the config and starts the server; its output goes to
    /// `prometheus.log` in `dir`. Does not wait for it to be ready.
    pub fn spawn(o: &PrometheusOptions) -> std::io::Result<Self> {
        std::fs::create_dir_all(&o.dir)?;
        let config = o.dir.join("prometheus.yml");
        std::fs::write(&config, &o.config)?;
        let log = o.dir.join("prometheus.log");
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&o.binary);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", o.tsdb.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{}", o.port));
        if o.remote_write_receiver {
            cmd.arg("--web.enable-remote-write-receiver");
        }
        let child = cmd
            .args(&o.args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Self {
            child,
            log,
            port: o.port,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `ready()` (a request to `/-/ready`, with whatever TLS
    /// and credentials the server wants) answers 2xx. Fails at `timeout`
    /// or as soon as the server exits, with the end of its log.
    pub async fn wait_ready(
        &mut self,
        ready: impl Fn() -> reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = Deadline::after(timeout);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("prometheus exited ({status}): {}", self.log_tail()));
            }
            if let Ok(r) = ready().send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if deadline.passed() {
                return Err(format!(
                    "prometheus not ready after {timeout:?}: {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for LocalPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
