//! `flopwatch collector --config collector.toml`

use crate::shared::{read_metric_set, shutdown_signal};
use anyhow::Context;
use flopwatch_collector::{server, Auth};
use flopwatch_config::{load_file, CollectorConfig, SpecTable};
use flopwatch_proto::clock::SystemClock;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `collector`.
#[derive(clap::Args)]
pub(crate) struct CollectorArgs {
    /// Configuration file (see config/collector.toml); default:
    /// /etc/flopwatch/collector.toml.
    #[arg(long, env = "FLOPWATCH_CONFIG")]
    config: Option<PathBuf>,
    /// Override `listen`.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Override `data_dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Override `metrics_listen`.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
}

pub(crate) async fn run(mut args: CollectorArgs) -> anyhow::Result<()> {
    let config = crate::shared::config_path(
        args.config.take(),
        std::path::Path::new(crate::shared::DEFAULT_CONFIG_DIR),
        "collector",
    )?;
    let mut cfg: CollectorConfig = load_file(&config)?;
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(d) = args.data_dir {
        cfg.data_dir = d;
    }
    if let Some(m) = args.metrics_listen {
        cfg.metrics_listen = m;
    }
    if let Some(p) = cfg.cluster.peer_token_file.take() {
        cfg.cluster.peer_token_file = Some(flopwatch_config::relative_to(&config, &p));
    }
    if let Some(rw) = &mut cfg.remote_write {
        for p in [
            &mut rw.ca_file,
            &mut rw.bearer_token_file,
            &mut rw.password_file,
        ] {
            if let Some(f) = p.take() {
                *p = Some(flopwatch_config::relative_to(&config, &f));
            }
        }
        // Reads ca_file and the credential files now: a bad one stops the
        // collector here, naming the key and the file.
        flopwatch_collector::RemoteWriteEndpoint::new(rw)
            .with_context(|| config.display().to_string())?;
    }
    let specs = match &cfg.gpu_specs {
        Some(p) => SpecTable::load(&flopwatch_config::relative_to(&config, p))?,
        None => SpecTable::builtin(),
    };
    let metrics = match &cfg.policy.metrics_file {
        Some(p) => read_metric_set(&flopwatch_config::relative_to(&config, p))?,
        None => Vec::new(),
    };
    let base = crate::shared::config_dir(&config);
    let tls = match &cfg.tls {
        Some(t) => Some(
            flopwatch_collector::server_config(t, &base)
                .with_context(|| config.display().to_string())?,
        ),
        None => {
            if !cfg.listen.ip().is_loopback() {
                tracing::warn!(listen = %cfg.listen, "plaintext = true on a non-loopback address: tokens and data travel in clear");
            }
            None
        }
    };
    let metrics_tls = match &cfg.exporter.tls {
        Some(t) => Some(
            flopwatch_collector::metrics_config(t, &base)
                .with_context(|| config.display().to_string())?,
        ),
        None => None,
    };
    let api_tls = match &cfg.prometheus_api.tls {
        Some(t) => Some(
            flopwatch_collector::api_config(t, &base)
                .with_context(|| config.display().to_string())?,
        ),
        None => None,
    };
    let peer_tls = flopwatch_transport::channel::TlsClient::load(&cfg.peer_tls, &base, "peer_tls")
        .with_context(|| config.display().to_string())?;
    let collector = server::open(
        &cfg.data_dir,
        &cfg,
        specs,
        Auth::from_config(&cfg),
        metrics,
        Arc::new(SystemClock),
    )
    .with_context(|| format!("opening {}", cfg.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let metrics = tokio::net::TcpListener::bind(cfg.metrics_listen)
        .await
        .with_context(|| format!("binding metrics_listen {}", cfg.metrics_listen))?;
    let api = match cfg.prometheus_api.listen_addr() {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("binding prometheus_api.listen {a}"))?,
        ),
        None => None,
    };
    // The bound addresses, for scripts that ask for port 0 (the metrics
    // address is logged).
    println!("listening on {}", listener.local_addr()?);
    if let Some(a) = &api {
        let scheme = if api_tls.is_some() { "https" } else { "http" };
        println!("prometheus api on {scheme}://{}", a.local_addr()?);
    }
    let health = match cfg.health_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("binding health_listen {a}"))?,
        ),
        None => None,
    };
    let reloader = tokio::spawn(reload_on_sighup(collector.clone(), config.clone()));
    let peers = collector.settings.cluster.peers.clone();
    server::serve_cluster(
        collector,
        listener,
        Some(metrics),
        server::Serving {
            tls,
            peers,
            peer_tls,
            health,
            metrics_tls,
            api,
            api_tls,
        },
        shutdown_signal(),
    )
    .await?;
    reloader.abort();
    tracing::info!("collector stopped: streams ended, store flushed");
    Ok(())
}

/// On SIGHUP, reads the config file again and applies its credentials
/// (`tenants`, `admin_tokens_sha256`, `anonymous_tenant`) and `limits`:
/// a removed token stops working at once, open streams included. Other
/// keys need a restart. A file that does not load is logged and ignored.
async fn reload_on_sighup(collector: Arc<flopwatch_collector::Collector>, path: PathBuf) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match load_file::<CollectorConfig>(&path) {
                Ok(cfg) => {
                    collector.reload(
                        Auth::from_config(&cfg),
                        flopwatch_collector::LimitTable::from_config(&cfg),
                    );
                    tracing::info!(file = %path.display(), tenants = cfg.tenants.len(), "credentials and limits reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload failed; keeping the current credentials")
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (collector, path);
        std::future::pending::<()>().await;
    }
}
