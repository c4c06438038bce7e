//! A real Prometheus for tests (Debian package `prometheus`, installed by
//! deploy/dev/setup.sh): finding its tools, turning an OpenMetrics file into
//! TSDB blocks, and serving a TSDB directory.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `name` (`prometheus`, `promtool`) on the PATH, or a panic saying how to
/// install it.
pub fn tool(name: &str) -> String {
    crate::prometheus_peer::find_tool(name).unwrap_or_else(|e| panic!("{e}"))
}

/// `promtool tsdb create-blocks-from openmetrics` of `om` into `out`.
pub fn openmetrics_blocks(om: &Path, out: &Path) {
    crate::prometheus_peer::create_blocks(&tool("promtool"), om, out, "24h")
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A Prometheus process, killed when dropped.
pub struct Prometheus {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Prometheus {
    /// Serves the TSDB at `tsdb` (blocks kept for a year, so backfilled
    /// blocks survive) on a free loopback port, scraping nothing.
    pub fn serve(tsdb: &Path, dir: &Path) -> Self {
        let port = crate::procs::free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, "global:\n  scrape_interval: 1h\n").unwrap();
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg("--storage.tsdb.retention.time=365d")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
