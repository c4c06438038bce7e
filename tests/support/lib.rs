//! The harness of the end-to-end tests and of `flopwatch-bench`: an
//! in-process collector on an ephemeral loopback port, simulated agents,
//! query clients, and real peers (Prometheus, promtool) started as
//! processes.

pub mod dcgm;
pub mod pki;
pub mod procs;
pub mod prom;
pub mod prometheus_peer;
pub mod promql;
pub mod raw;

use flopwatch_agent::source::GpuSource;
use flopwatch_agent::FixedSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{Agent, AgentOptions};
use flopwatch_collector::{server, Auth, Collector};
use flopwatch_config::{CollectorConfig, SpecTable};
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::query_client::QueryClient;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// A collector serving on 127.0.0.1:0.
pub struct TestCollector {
    /// Its state.
    pub collector: Arc<Collector>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT/metrics`.
    pub metrics_url: String,
    server: server::Loopback,
}

impl TestCollector {
    /// Opens RocksDB under `dir` and serves it with anonymous access.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, Auth::anonymous("default")).await
    }

    /// As `start`, with the given credentials.
    pub async fn start_with(dir: &Path, auth: Auth) -> Self {
        Self::start_full(dir, auth, Vec::new()).await
    }

    /// As `start_with`, pushing `metrics` to agents in the policy.
    pub async fn start_full(dir: &Path, auth: Auth, metrics: Vec<String>) -> Self {
        let cfg = CollectorConfig {
            data_dir: dir.to_path_buf(),
            anonymous_tenant: Some("default".into()),
            ..Default::default()
        };
        Self::start_config(&cfg, auth, metrics).await
    }

    /// From a full configuration (its `data_dir`).
    pub async fn start_config(cfg: &CollectorConfig, auth: Auth, metrics: Vec<String>) -> Self {
        Self::start_clocked(cfg, auth, metrics, Arc::new(TokioClock::new())).await
    }

    /// As `start_config`, on `clock` (a clock anchored where the test's
    /// agents are, under paused time).
    pub async fn start_clocked(
        cfg: &CollectorConfig,
        auth: Auth,
        metrics: Vec<String>,
        clock: Arc<dyn flopwatch_proto::clock::Clock>,
    ) -> Self {
        let dir = &cfg.data_dir;
        let collector = server::open(dir, cfg, SpecTable::builtin(), auth, metrics, clock)
            .expect("collector opens");
        let server = server::Loopback::start(collector.clone()).await.unwrap();
        Self {
            collector,
            url: server.url.clone(),
            metrics_url: server.metrics_url.clone(),
            server,
        }
    }

    /// Stops serving and flushes the store.
    pub async fn stop(self) {
        self.server.stop().await.unwrap();
    }

    /// A query client.
    pub async fn query(&self) -> QueryClient<Channel> {
        QueryClient::connect(self.url.clone()).await.unwrap()
    }
}

/// Starts an agent over `source` sending to `url` every `interval`.
pub fn agent(source: Box<dyn GpuSource>, node: &str, url: &str, interval: Duration) -> Agent {
    agent_with(source, Box::new(FixedSampler::new(interval)), node, url)
}

/// Starts an agent over `source` with `sampler`, flushing every 500 ms.
pub fn agent_with(
    source: Box<dyn GpuSource>,
    sampler: Box<dyn flopwatch_agent::Sampler>,
    node: &str,
    url: &str,
) -> Agent {
    Agent::start(
        source,
        sampler,
        AgentOptions {
            flush_interval: Duration::from_millis(500),
            ..AgentOptions::new(
                NodeIdentity::named(node, "test-boot"),
                vec![url.to_string()],
            )
        },
        Arc::new(TokioClock::new()),
    )
}

/// Every stored sample of one series (a GPU's or a node device's metric).
pub async fn series(
    q: &mut QueryClient<Channel>,
    id: &str,
    metric: &str,
) -> flopwatch_proto::v1::Series {
    q.series(flopwatch_proto::v1::SeriesRequest {
        gpu_uuid: id.into(),
        metric: metric.into(),
        start_ms: 1,
        end_ms: 0,
        limit: 0,
    })
    .await
    .unwrap()
    .into_inner()
    .series
    .unwrap()
}

/// The repository's root, found at run time: `cargo test` names the
/// package being tested in `CARGO_MANIFEST_DIR`, so a test binary reused
/// from a build of another checkout (a shared target directory) still
/// reads this checkout's files.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("..")
}

/// The fake `libnvidia-ml.so` is loaded once per process and configured
/// for the whole process: a test that configures it holds this guard for
/// its whole run, so the test binary's NVML tests take turns.
pub async fn fake_nvml() -> tokio::sync::MutexGuard<'static, ()> {
    static DRIVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    DRIVER.lock().await
}

/// The `flopwatch` binary next to the test executable (built by
/// `cargo build --workspace --all-targets`), or `FLOPWATCH_BIN`.
pub fn flopwatch_bin() -> std::path::PathBuf {
    built_bin("flopwatch", "FLOPWATCH_BIN")
}

/// The `flopwatch-bench` binary (benchmarks and load generators) next to
/// the test executable, or `FLOPWATCH_BENCH_BIN`.
pub fn bench_bin() -> std::path::PathBuf {
    built_bin("flopwatch-bench", "FLOPWATCH_BENCH_BIN")
}

fn built_bin(name: &str, env: &str) -> std::path::PathBuf {
    if let Ok(p) = std::env::var(env) {
        return p.into();
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/NAME-HASH → target/<profile>/NAME
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join(name))
        .expect("target directory");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --workspace --all-targets` (or set {env})",
        p.display()
    );
    p
}

/// The OFU summary of `scope` over `[start, end)` (end 0: now).
pub async fn ofu_summary(
    q: &mut QueryClient<Channel>,
    scope: flopwatch_proto::v1::ofu_request::Scope,
    start: i64,
    end: i64,
) -> flopwatch_proto::v1::OfuSummary {
    q.ofu(flopwatch_proto::v1::OfuRequest {
        scope: Some(scope),
        start_ms: start,
        end_ms: end,
        step_ms: 0,
    })
    .await
    .unwrap()
    .into_inner()
    .summary
    .unwrap()
}

/// Every GPU the collector lists (`Query/ListGpus`).
pub async fn list_gpus(q: &mut QueryClient<Channel>) -> Vec<flopwatch_proto::v1::GpuEntry> {
    q.list_gpus(flopwatch_proto::v1::ListRequest::default())
        .await
        .expect("ListGpus")
        .into_inner()
        .gpus
}

/// Every job the collector lists (`Query/ListJobs`).
pub async fn list_jobs(q: &mut QueryClient<Channel>) -> Vec<flopwatch_proto::v1::JobEntry> {
    q.list_jobs(flopwatch_proto::v1::ListRequest::default())
        .await
        .expect("ListJobs")
        .into_inner()
        .jobs
}

/// A collector with RocksDB under `dir`, plain gRPC, anonymous access as
/// tenant `default`, on `clock`.
pub async fn anonymous_collector(
    dir: &Path,
    clock: Arc<dyn flopwatch_proto::clock::Clock>,
) -> TestCollector {
    let cfg = CollectorConfig {
        data_dir: dir.to_path_buf(),
        anonymous_tenant: Some("default".into()),
        plaintext: true,
        ..Default::default()
    };
    TestCollector::start_clocked(&cfg, Auth::anonymous("default"), Vec::new(), clock).await
}
