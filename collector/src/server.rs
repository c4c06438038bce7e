//! Mounting the services: on a TCP listener (ephemeral `127.0.0.1:0` in
//! tests and the demo), with gRPC health and reflection.

use crate::ingest::IngestService;
use crate::query::QueryService;
use crate::state::{Collector, Settings};
use crate::store::{rocks::RocksEngine, Cf, Store};
use crate::{auth::Auth, CollectorError};
use flopwatch_config::{CollectorConfig, SpecTable};
use flopwatch_proto::clock::Clock;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

/// HTTP/2 receive window of one stream: what an agent may have sent that
/// the collector has not read yet. Explicit (it is hyper's default),
/// because with a slow disk every open stream can hold this much
/// (docs/RELIABILITY.md): an agent's 8 batches in flight fit below it
/// unless its batches are over 128 KiB. A 256 KiB window cut the
/// throughput of 8,000-sample batches (`flopwatch-bench tenants`).
pub const STREAM_WINDOW: u32 = 1024 * 1024;

/// HTTP/2 receive window of one connection (all its streams together;
/// an agent opens one stream per connection).
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW;

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
    let store = Store::new(Arc::new(engine), config.sync_wal)
        .with_retention(crate::store::Retention::from_config(config, clock.clone()))
        .with_compaction(
            config.storage.compaction_interval,
            config.storage.seal_delay,
        )
        .with_spread(config.storage.seal_spread, config.storage.fold_after)
        .with_precision(crate::store::Precision::new(
            config.storage.precision_decimals(),
        ));
    let mut settings = Settings::from_config(config, metrics);
    settings.cluster.peer_token = crate::cluster::read_peer_token(config)?;
    Collector::new(store, specs, auth, settings, clock)
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
    serve_cluster(collector, listener, metrics, Serving::default(), shutdown).await
}

/// How the gRPC port is served beyond the listener.
#[derive(Debug, Default)]
pub struct Serving {
    /// TLS on the port (`[tls]`, [`crate::tls::server_config`]); `None`
    /// serves plaintext.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Query URLs of the other collectors of a cluster.
    pub peers: Vec<String>,
    /// TLS client for `https://` peers (`[peer_tls]`).
    pub peer_tls: flopwatch_transport::channel::TlsClient,
    /// A plaintext listener serving only `grpc.health.v1` (`health_listen`),
    /// for probes that cannot speak TLS, such as Kubernetes' `grpc:` probes.
    pub health: Option<TcpListener>,
    /// TLS on the `/metrics` listener (`[exporter.tls]`,
    /// [`crate::tls::metrics_config`]); `None` serves plain HTTP.
    pub metrics_tls: Option<flopwatch_transport::metrics_http::MetricsTls>,
    /// A listener for Prometheus's query API (`[prometheus_api]`,
    /// [`crate::promql::serve`]); `None`: the API is off.
    pub api: Option<TcpListener>,
    /// TLS on the API listener (`[prometheus_api.tls]`,
    /// [`crate::tls::api_config`]); `None` serves plain HTTP.
    pub api_tls: Option<flopwatch_transport::metrics_http::MetricsTls>,
}

/// [`serve`] as a member of a cluster: queries are answered for the whole
/// fleet by fanning out to `peers` (the other collectors' query URLs, see
/// [`crate::fanout`]); with no peers, exactly [`serve`].
///
/// On `shutdown` (SIGTERM) the collector stops accepting connections, each
/// agent stream finishes and acknowledges the batch it is committing and
/// ends with UNAVAILABLE (agents move to another collector), in-flight
/// queries complete, and the store is flushed before returning.
pub async fn serve_cluster(
    collector: Arc<Collector>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    serving: Serving,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CollectorError> {
    let fanout = if serving.peers.is_empty() {
        None
    } else {
        tracing::info!(
            peers = serving.peers.len(),
            "queries fan out to the cluster"
        );
        Some(crate::fanout::FanoutQuery::new(
            QueryService::new(collector.clone()),
            &serving.peers,
            &serving.peer_tls,
        )?)
    };
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<crate::ingest::IngestRoute>()
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
    tracing::info!(?addr, tls = serving.tls.is_some(), "collector serving");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = metrics.map(|l| {
        tracing::info!(addr = ?l.local_addr().ok(), "serving /metrics");
        let c = collector.clone();
        let page: Arc<flopwatch_transport::metrics_http::PageFn> = Arc::new(
            move |scrape: &flopwatch_transport::metrics_http::Scrape<'_>| {
                crate::exporter::page(&c, scrape)
            },
        );
        let mut stop = stop_rx.clone();
        tokio::spawn(flopwatch_transport::metrics_http::serve_with(
            l,
            serving.metrics_tls.clone(),
            page,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ))
    });
    let mut engine = crate::promql::Engine::new(collector.clone());
    if !serving.peers.is_empty() {
        // The API answers for the whole cluster too.
        engine = engine.with_peers(Arc::new(crate::promql::peers::Peers::new(
            &serving.peers,
            &serving.peer_tls,
            tokio::runtime::Handle::current(),
        )?));
    }
    let api_task = serving.api.map(|l| {
        tracing::info!(addr = ?l.local_addr().ok(), tls = serving.api_tls.is_some(), "serving the Prometheus query API");
        let mut stop = stop_rx.clone();
        tokio::spawn(crate::promql::serve_engine(
            engine,
            l,
            serving.api_tls.clone(),
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
                collector.stats.clone(),
                collector.clock.clone(),
                stop_rx.clone(),
            )))
        }
        _ => None,
    };
    let compactor = tokio::spawn(crate::store::run_compactor(
        collector.store.clone(),
        collector.clock.clone(),
        stop_rx.clone(),
    ));
    let (cluster_service, reconciler) =
        cluster_parts(&collector, &serving.peer_tls, &stop_rx).await?;
    let (fatal_tx, fatal_rx) = tokio::sync::oneshot::channel::<String>();
    let watchdog = tokio::spawn(storage_watchdog(collector.clone(), fatal_tx));
    let fatal = Arc::new(std::sync::Mutex::new(None::<String>));
    let fatal_seen = fatal.clone();
    let shutdown = async move {
        tokio::select! {
            _ = shutdown => {}
            Ok(why) = fatal_rx => {
                tracing::error!(%why, "storage unwritable: stopping so the service manager restarts the collector");
                if let Ok(mut f) = fatal_seen.lock() {
                    *f = Some(why);
                }
            }
        }
        tracing::info!("shutting down: ending agent streams");
        let _ = stop_tx.send(true);
    };
    let mut builder = tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    if let Some(tls) = serving.tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| CollectorError::Setup(format!("tls: {e}")))?;
    }
    let health_task = serving.health.map(|l| {
        tracing::info!(addr = ?l.local_addr().ok(), "serving plaintext gRPC health");
        let svc = health.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), async move {
                    let _ = stop.wait_for(|s| *s).await;
                }),
        )
    });
    let router = builder
        .add_service(health)
        .add_service(reflection)
        .add_service(IngestService::new(collector.clone(), stop_rx).server());
    let router = match fanout {
        Some(f) => router.add_service(f.server()),
        None => router.add_service(QueryService::new(collector.clone()).server()),
    }
    .add_service(cluster_service.server());
    router
        .serve_with_incoming_shutdown(
            // No Nagle delay: a multi-segment reply (a query's points)
            // would otherwise wait for the client's delayed ACK (~40 ms).
            TcpListenerStream::new(listener).map(|s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            }),
            shutdown,
        )
        .await
        .map_err(|e| CollectorError::Setup(e.to_string()))?;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    if let Some(t) = api_task {
        let _ = t.await;
    }
    if let Some(t) = health_task {
        let _ = t.await;
    }
    if let Some(t) = remote_task {
        let _ = t.await;
    }
    let _ = compactor.await;
    if let Some(r) = reconciler {
        let _ = r.await;
    }
    watchdog.abort();
    if let Some(why) = fatal.lock().ok().and_then(|mut f| f.take()) {
        return Err(CollectorError::Setup(format!("storage unwritable: {why}")));
    }
    let store = collector.store.clone();
    tokio::task::spawn_blocking(move || {
        let engine = store.engine();
        engine.flush()?;
        // The head blocks of the hours compacted last are deleted: drop
        // their tombstones too, so a stopped collector's directory holds
        // its chunks and little else. Left to RocksDB's own compactions
        // (at the next start) when the head is large.
        engine
            .compact_fully(Cf::Head, HEAD_TIDY_MAX_BYTES)
            .map(|_| ())
    })
    .await
    .map_err(|e| CollectorError::Setup(e.to_string()))??;
    Ok(())
}

/// Largest head (bytes of its files) compacted fully at shutdown: about a
/// second of disk work on a small machine.
const HEAD_TIDY_MAX_BYTES: u64 = 64 << 20;

/// The Cluster service (peers ask what this store holds) and, when limbo
/// is on (`peers` and `cluster.peer_token_file` set), the reconciler.
async fn cluster_parts(
    collector: &Arc<Collector>,
    peer_tls: &flopwatch_transport::channel::TlsClient,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<
    (
        crate::cluster::ClusterService,
        Option<tokio::task::JoinHandle<()>>,
    ),
    CollectorError,
> {
    let store = collector.store.clone();
    let store_id = tokio::task::spawn_blocking(move || store.store_id())
        .await
        .map_err(|e| CollectorError::Setup(e.to_string()))??;
    let settings = &collector.settings.cluster;
    let reconciler = if settings.limbo() {
        Some(tokio::spawn(crate::cluster::run(
            collector.clone(),
            store_id,
            peer_tls.clone(),
            stop.clone(),
        )))
    } else {
        if !settings.peers.is_empty() {
            tracing::warn!("peers set without cluster.peer_token_file: batches two collectors got are not settled (copies stay)");
        }
        None
    };
    Ok((
        crate::cluster::ClusterService::new(collector.clone(), store_id),
        reconciler,
    ))
}

/// How often the watchdog writes its probe.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// Failed probes in a row after which the collector stops.
const PROBE_FAILURES: u32 = 3;

/// Probes the store with a small durable write every [`PROBE_EVERY`]. A
/// RocksDB write error (a full disk, an I/O error) is sticky: every later
/// write fails even once space is back. After [`PROBE_FAILURES`] failures
/// in a row the collector stops with an error, and its service manager
/// (systemd `Restart=on-failure`, Kubernetes) starts it again: the reopened
/// store replays its write-ahead log and takes writes again once there is
/// space. Meanwhile ingest answers UNAVAILABLE (retryable) and acks
/// nothing, so agents keep their batches.
async fn storage_watchdog(collector: Arc<Collector>, fatal: tokio::sync::oneshot::Sender<String>) {
    let mut failures = 0u32;
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let store = collector.store.clone();
        let now = collector.clock.now_ms();
        let r = tokio::task::spawn_blocking(move || {
            store.engine().write(
                vec![(
                    crate::store::Cf::Meta,
                    b"~watchdog".to_vec(),
                    now.to_be_bytes().to_vec(),
                )],
                false,
            )
        })
        .await;
        match r {
            Ok(Ok(())) => failures = 0,
            Ok(Err(e)) => {
                failures += 1;
                tracing::warn!(error = %e, failures, "storage probe failed");
                if failures >= PROBE_FAILURES {
                    let _ = fatal.send(e.to_string());
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// A collector serving on an ephemeral loopback port in this process (the
/// demo, the bench and tests).
pub struct Loopback {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT/metrics` (`https://` with metrics TLS).
    pub metrics_url: String,
    /// `http://127.0.0.1:PORT`, Prometheus's query API (`https://` with
    /// its TLS): Grafana's Prometheus data source URL.
    pub api_url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), CollectorError>>,
}

impl Loopback {
    /// A collector of `config` (RocksDB under its `data_dir`, credentials
    /// from it, the built-in GPU spec table) serving on `127.0.0.1:0`: how
    /// the demo, `eval-sampling` and the benches run one in-process.
    pub async fn open(
        config: &CollectorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Arc<Collector>, Self), CollectorError> {
        let collector = open(
            &config.data_dir,
            config,
            SpecTable::builtin(),
            Auth::from_config(config),
            Vec::new(),
            clock,
        )?;
        let server = Self::start(collector.clone()).await?;
        Ok((collector, server))
    }

    /// Serves `collector` on `127.0.0.1:0`.
    pub async fn start(collector: Arc<Collector>) -> Result<Self, CollectorError> {
        Self::start_serving(collector, Serving::default()).await
    }

    /// Serves `collector` on `127.0.0.1:0` as `serving` says (TLS, peers);
    /// the URL is `https://` with TLS. The Prometheus API is served on
    /// another `127.0.0.1:0` unless `serving` brings its own listener.
    pub async fn start_serving(
        collector: Arc<Collector>,
        mut serving: Serving,
    ) -> Result<Self, CollectorError> {
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
        let api = match serving.api.take() {
            Some(l) => l,
            None => TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| CollectorError::Setup(format!("binding 127.0.0.1:0: {e}")))?,
        };
        let api_addr = api
            .local_addr()
            .map_err(|e| CollectorError::Setup(e.to_string()))?;
        serving.api = Some(api);
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let scheme = |tls: bool| if tls { "https" } else { "http" };
        let metrics_scheme = scheme(serving.metrics_tls.is_some());
        let api_scheme = scheme(serving.api_tls.is_some());
        let scheme = scheme(serving.tls.is_some());
        let task = tokio::spawn(serve_cluster(
            collector,
            listener,
            Some(metrics),
            serving,
            async move {
                let _ = rx.await;
            },
        ));
        Ok(Self {
            url: format!("{scheme}://{addr}"),
            metrics_url: format!("{metrics_scheme}://{metrics_addr}/metrics"),
            api_url: format!("{api_scheme}://{api_addr}"),
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
