//! `flopwatch agent --config agent.toml [--source nvml|sim|replay:FILE|dcgm-exporter:URL]`

use crate::shared::{config_dir, read_metric_set, shutdown_signal};
use anyhow::Context;
use flopwatch_agent::node_identity;
use flopwatch_agent::FixedSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{source, Agent, AgentOptions};
use flopwatch_config::{load_file, AgentConfig, SourceKind};
use flopwatch_proto::clock::Clock;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The shortest stall `/healthz` reports: a capture interval of 100 ms
/// alone would call a two-second hiccup (a GPU reset, a slow attribution
/// scan) a hang.
const HEALTH_STALL_FLOOR: Duration = Duration::from_secs(10);

/// Arguments of `agent`.
#[derive(clap::Args)]
pub struct AgentArgs {
    /// Configuration file (see config/agent.toml); default:
    /// /etc/flopwatch/agent.toml.
    #[arg(long, env = "FLOPWATCH_CONFIG")]
    config: Option<PathBuf>,
    /// Override `source`: nvml, sim, replay:FILE or dcgm-exporter:URL.
    #[arg(long)]
    source: Option<String>,
    /// Override `collectors` (repeatable).
    #[arg(long = "collector")]
    collectors: Vec<String>,
    /// Override `metrics_listen` (empty: no /metrics).
    #[arg(long)]
    metrics_listen: Option<String>,
}

pub async fn run(mut args: AgentArgs) -> anyhow::Result<()> {
    let config = crate::shared::config_path(
        args.config.take(),
        std::path::Path::new(crate::shared::DEFAULT_CONFIG_DIR),
        "agent",
    )?;
    let mut cfg: AgentConfig = load_file(&config)?;
    if let Some(s) = args.source {
        cfg.source = s;
    }
    if let Some(m) = args.metrics_listen {
        cfg.metrics_listen = m;
    }
    if !args.collectors.is_empty() {
        cfg.collectors = args.collectors;
    }
    let kind: SourceKind = cfg
        .source
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--source: {e}"))?;
    let token = match (&cfg.token, &cfg.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => {
            let p = flopwatch_config::relative_to(&config, f);
            Some(
                std::fs::read_to_string(&p)
                    .with_context(|| format!("token_file {}", p.display()))?
                    .trim()
                    .to_string(),
            )
        }
        (None, None) => None,
    };
    let mut metrics = cfg.metrics.clone();
    if let Some(f) = &cfg.metrics_file {
        metrics.extend(read_metric_set(&flopwatch_config::relative_to(&config, f))?);
    }
    let clock = Arc::new(TokioClock::new());
    let source = source::open(&kind, &cfg, clock.now_ms())?;
    let allow: Option<std::collections::HashSet<String>> =
        (!metrics.is_empty()).then(|| metrics.into_iter().collect());
    let sampler: Box<dyn flopwatch_agent::Sampler> = if cfg.sampling.adaptive {
        let seed = flopwatch_proto::clock::SystemClock.now_ms() as u64;
        Box::new(flopwatch_agent::AdaptiveSampler::new(&cfg.sampling, seed))
    } else {
        Box::new(FixedSampler::new(cfg.interval))
    };
    let tls = flopwatch_transport::channel::TlsClient::load(&cfg.tls, &config_dir(&config), "tls")
        .with_context(|| config.display().to_string())?;
    let opts = AgentOptions {
        node: node_identity(&cfg.node_id, cfg.labels.clone()),
        collectors: cfg.collectors.clone(),
        token,
        tls,
        flush_interval: cfg.flush_interval,
        max_batch_samples: cfg.max_batch_samples as usize,
        max_in_flight: cfg.max_in_flight,
        job: cfg.job.clone(),
        drain_timeout: Duration::from_secs(5),
        metrics: allow,
        slow_interval: flopwatch_agent::SLOW_INTERVAL,
        // One wakeup per capture: the captures' own thread sleeps to each
        // deadline, and the runtime wakes for the client alone.
        pacing: flopwatch_agent::Pacing::Thread,
    };
    let attribution = flopwatch_agent::attribution::AttributionOptions::from_settings(&cfg);
    let delivery = flopwatch_agent::DeliveryOptions {
        spool: cfg
            .spool
            .dir
            .as_ref()
            .map(|d| flopwatch_agent::SpoolOptions {
                dir: flopwatch_config::relative_to(&config, d),
                max_bytes: cfg.spool.max_bytes,
                fsync_interval: cfg.spool.fsync_interval,
            }),
        max_batches_per_second: cfg.spool.dir.as_ref().map(|_| cfg.spool.drain_rate),
    };
    let agent = Agent::start_with_delivery(source, sampler, opts, attribution, clock, delivery)
        .with_context(|| match &cfg.spool.dir {
            Some(d) => format!("spool.dir {}", d.display()),
            None => "starting the agent".to_string(),
        })?;
    let (metrics_stop, metrics_rx) = tokio::sync::oneshot::channel::<()>();
    let metrics_addr = if cfg.metrics_listen.is_empty() {
        None
    } else {
        Some(
            cfg.metrics_listen
                .parse::<std::net::SocketAddr>()
                .with_context(|| format!("metrics_listen `{}`", cfg.metrics_listen))?,
        )
    };
    let metrics_task = match metrics_addr {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!(addr = ?l.local_addr().ok(), "serving /metrics, /healthz, /readyz");
                let registry = Arc::new(flopwatch_agent::registry(&agent));
                let probes = Arc::new(agent.health.probe(HEALTH_STALL_FLOOR));
                Some(tokio::spawn(
                    flopwatch_transport::metrics_http::serve_with_probes(
                        l,
                        registry,
                        Some(probes),
                        async move {
                            let _ = metrics_rx.await;
                        },
                    ),
                ))
            }
            // Monitoring goes on without the agent's own page.
            Err(e) => {
                tracing::error!(%addr, error = %e, "cannot serve /metrics (metrics_listen)");
                None
            }
        },
        None => None,
    };
    let replay = matches!(kind, SourceKind::Replay(_));
    if replay {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = wait_sampling_done(&agent) => {}
        }
    } else {
        shutdown_signal().await;
    }
    let stats = agent.outbox.clone();
    let loop_stats = agent.stats.clone();
    agent.stop().await;
    let _ = metrics_stop.send(());
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    let acked = stats
        .stats
        .acked_samples
        .load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        samples = loop_stats
            .samples
            .load(std::sync::atomic::Ordering::Relaxed),
        acked_samples = acked,
        unacked_batches = stats.len(),
        "agent stopped"
    );
    Ok(())
}

/// Resolves when a replay has no more rows and everything was acked.
async fn wait_sampling_done(agent: &Agent) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if agent.sampling_finished() && agent.outbox.is_empty() {
            return;
        }
    }
}
