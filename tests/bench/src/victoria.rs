//! A real single-node VictoriaMetrics on a loopback port, the stronger
//! peer of the query benchmarks (Debian package `victoria-metrics`): its
//! own storage directory, samples imported in Prometheus' text format
//! with timestamps (`/api/v1/import/prometheus`), flushed so that queries
//! see them, and queried through its Prometheus-compatible
//! `/api/v1/query_range`.

use anyhow::{bail, Context};
use flopwatch_proto::clock::Deadline;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running VictoriaMetrics; killed (and reaped) when dropped.
pub(super) struct Victoria {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Victoria {
    /// Starts `binary` with its data under `dir`, keeping `retention_days`,
    /// and waits until it answers `/health`.
    pub(super) async fn start(
        binary: &str,
        dir: &Path,
        retention_days: i64,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let port = flopwatch_tests::procs::free_port();
        let log = dir.join("victoria-metrics.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .arg(format!("-storageDataPath={}", dir.join("data").display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!("-retentionPeriod={retention_days}d"))
            // Samples are an hour old and more: no need to hide the
            // newest 30 s from queries, as VictoriaMetrics does by default.
            .arg("-search.latencyOffset=0s")
            .arg("-loggerLevel=ERROR")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| {
                format!("starting {binary} (Debian package `victoria-metrics`: apt-get install victoria-metrics)")
            })?;
        let mut v = Self { child, log, port };
        let http = reqwest::Client::new();
        let deadline = Deadline::after(Duration::from_secs(60));
        loop {
            if let Ok(Some(status)) = v.child.try_wait() {
                bail!("victoria-metrics exited ({status}): {}", v.log_tail());
            }
            if let Ok(r) = http.get(format!("{}/health", v.url())).send().await {
                if r.status().is_success() {
                    return Ok(v);
                }
            }
            if deadline.passed() {
                bail!("victoria-metrics not ready: {}", v.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = &mut v;
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Imports `text` (Prometheus' exposition format, one sample per line
    /// with a millisecond timestamp).
    pub(super) async fn import(&self, http: &reqwest::Client, text: String) -> anyhow::Result<()> {
        let r = http
            .post(format!("{}/api/v1/import/prometheus", self.url()))
            .body(text)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!(
                "victoria-metrics import: {}: {}",
                r.status(),
                r.text().await?
            );
        }
        Ok(())
    }

    /// Makes everything imported searchable and merged, as a store that
    /// has run for a while has it.
    pub(super) async fn settle(&self, http: &reqwest::Client) -> anyhow::Result<()> {
        for path in ["/internal/force_flush", "/internal/force_merge"] {
            let r = http.get(format!("{}{path}", self.url())).send().await?;
            if !r.status().is_success() {
                bail!("victoria-metrics {path}: {}", r.status());
            }
        }
        Ok(())
    }

    /// Rows VictoriaMetrics has inserted (`vm_rows_inserted_total`, every
    /// ingestion type).
    pub(super) async fn rows_inserted(&self, http: &reqwest::Client) -> anyhow::Result<u64> {
        metric_sum(http, &self.url(), "vm_rows_inserted_total").await
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for Victoria {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of every series of the family `name` on the `/metrics` page of
/// the server at `url` (a peer's own count of what it stored).
pub(super) async fn metric_sum(
    http: &reqwest::Client,
    url: &str,
    name: &str,
) -> anyhow::Result<u64> {
    let page = http
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(page
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}
