//! Mounting the services: on a TCP listener (ephemeral `127.0.0.1:0` in
//! tests and the demo), with gRPC health and reflection.

use crate::ingest::IngestService;
use crate::query::QueryService;
use crate::state::{Collector, Settings};
use crate::store::{rocks::RocksEngine, Store};
use crate::{auth::Auth, CollectorError};
use flopwatch_config::{CollectorConfig, SpecTable};
use flopwatch_proto::clock::Clock;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// Opens the RocksDB store under `dir` and builds a collector.
pub fn open(
    dir: &Path,
    config: &CollectorConfig,
    specs: SpecTable,
    auth: Auth,
    metrics: Vec<String>,
    clock: Arc<dyn Clock>,
) -> Result<Arc<Collector>, CollectorError> {
    let engine = RocksEngine::open(dir)?;
    let store = Store::new(Arc::new(engine), config.sync_wal);
    Collector::new(
        store,
        specs,
        auth,
        Settings::from_config(config, metrics),
        clock,
    )
}

/// Serves ingest, query, health and reflection on `listener`, and
/// `/metrics` on `metrics` when given, until `shutdown` resolves; then
/// flushes the store. Runs remote write when configured.
pub async fn serve(
    collector: Arc<Collector>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CollectorError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<flopwatch_proto::v1::ingest_server::IngestServer<IngestService>>()
        .await;
    health_reporter
        .set_serving::<flopwatch_proto::v1::query_server::QueryServer<QueryService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(flopwatch_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| CollectorError::Setup(e.to_string()))?;
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(?addr, "collector serving");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = metrics.map(|l| {
        tracing::info!(addr = ?l.local_addr().ok(), "serving /metrics");
        let registry = Arc::new(crate::exporter::registry(collector.clone()));
        let mut stop = stop_rx.clone();
        tokio::spawn(flopwatch_agent::metrics_http::serve(
            l,
            registry,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ))
    });
    let remote_task = match (&collector.settings.remote_write, &collector.remote) {
        (Some(cfg), Some(queue)) => {
            tracing::info!(url = %cfg.url, "remote write on");
            Some(tokio::spawn(crate::remote_write::run(
                cfg.clone(),
                queue.clone(),
                collector.clone(),
                stop_rx.clone(),
            )))
        }
        _ => None,
    };
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: ending agent streams");
        let _ = stop_tx.send(true);
    };
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(IngestService::new(collector.clone(), stop_rx).server())
        .add_service(QueryService::new(collector.clone()).server())
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| CollectorError::Setup(e.to_string()))?;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    if let Some(t) = remote_task {
        let _ = t.await;
    }
    let store = collector.store.clone();
    tokio::task::spawn_blocking(move || store.engine().flush())
        .await
        .map_err(|e| CollectorError::Setup(e.to_string()))??;
    Ok(())
}

/// A collector serving on an ephemeral loopback port in this process (the
/// demo, the bench and tests).
pub struct Loopback {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT/metrics`.
    pub metrics_url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), CollectorError>>,
}

impl Loopback {
    /// Serves `collector` on `127.0.0.1:0`.
    pub async fn start(collector: Arc<Collector>) -> Result<Self, CollectorError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CollectorError::Setup(format!("binding 127.0.0.1:0: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CollectorError::Setup(e.to_string()))?;
        let metrics = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CollectorError::Setup(format!("binding 127.0.0.1:0: {e}")))?;
        let metrics_addr = metrics
            .local_addr()
            .map_err(|e| CollectorError::Setup(e.to_string()))?;
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(collector, listener, Some(metrics), async move {
            let _ = rx.await;
        }));
        Ok(Self {
            url: format!("http://{addr}"),
            metrics_url: format!("http://{metrics_addr}/metrics"),
            stop,
            task,
        })
    }

    /// Ends agent streams, stops serving and flushes the store.
    pub async fn stop(self) -> Result<(), CollectorError> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| CollectorError::Setup(e.to_string()))?
    }
}
