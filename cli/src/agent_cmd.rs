//! `flopwatch agent --config agent.toml [--source nvml|sim|replay:FILE|dcgm-exporter:URL]`
//!
//! A source that does not answer yet (a dcgm-exporter starting next to the
//! agent) does not stop the agent: it serves its probes, not ready, and
//! retries ([`Agent::start_opening`]). A dcgm-exporter source at the
//! default capture interval is captured as often as its page refreshes
//! ([`flopwatch_agent::RefreshPaced`]).

use crate::shared::{config_dir, read_metric_set, shutdown_signal};
use anyhow::Context;
use flopwatch_agent::node_identity;
use flopwatch_agent::FixedSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{source, Agent, AgentOptions, StartError};
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
pub(crate) struct AgentArgs {
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

pub(crate) async fn run(mut args: AgentArgs) -> anyhow::Result<()> {
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
    let open: flopwatch_agent::OpenSource = {
        let (kind, cfg) = (kind.clone(), cfg.clone());
        Box::new(move |now| source::open(&kind, &cfg, now))
    };
    let allow: Option<std::collections::HashSet<String>> =
        (!metrics.is_empty()).then(|| metrics.into_iter().collect());
    let follow_refresh = follows_refresh(&kind, &cfg);
    let sampling = cfg.sampling.clone();
    let interval = cfg.interval;
    let sampler: flopwatch_agent::SamplerFor = Box::new(move |source| {
        let sampler: Box<dyn flopwatch_agent::Sampler> = if sampling.adaptive {
            let seed = flopwatch_proto::clock::SystemClock.now_ms() as u64;
            Box::new(flopwatch_agent::AdaptiveSampler::new(&sampling, seed))
        } else {
            Box::new(FixedSampler::new(interval))
        };
        if follow_refresh {
            Box::new(flopwatch_agent::RefreshPaced::new(
                sampler,
                source.inventory().len(),
            ))
        } else {
            sampler
        }
    });
    let tls = flopwatch_transport::channel::TlsClient::load(&cfg.tls, &config_dir(&config), "tls")
        .with_context(|| config.display().to_string())?;
    let node = node_identity(&cfg.node_id, cfg.labels.clone());
    let retry = flopwatch_agent::RetryOptions::new(&node.node_id);
    let opts = AgentOptions {
        node,
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
    let agent = match Agent::start_opening(open, sampler, opts, attribution, clock, delivery, retry)
    {
        Ok(a) => a,
        Err(StartError::Source(e)) => return Err(e.into()),
        Err(StartError::Spool(e)) => {
            return Err(anyhow::Error::new(e).context(match &cfg.spool.dir {
                Some(d) => format!("spool.dir {}", d.display()),
                None => "starting the agent".to_string(),
            }))
        }
    };
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

/// Whether the captures follow the source's page refresh: a dcgm-exporter
/// source at the default capture interval (`interval`, or
/// `sampling.min_interval` when adaptive). The default suits NVML; a page
/// that refreshes every 30 s would be read 300 times per reading. Another
/// interval is the user's choice and kept. (The example configs write the
/// default out, so its presence in the file is no choice.)
fn follows_refresh(kind: &SourceKind, cfg: &AgentConfig) -> bool {
    let defaults = AgentConfig::default();
    let at_default = if cfg.sampling.adaptive {
        cfg.sampling.min_interval == defaults.sampling.min_interval
    } else {
        cfg.interval == defaults.interval
    };
    matches!(kind, SourceKind::DcgmExporter(_)) && at_default
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a dcgm-exporter source at the default capture interval follows
    /// the page; an interval the user chose is kept.
    #[test]
    fn only_a_default_interval_follows_the_exporter() {
        let dcgm = SourceKind::DcgmExporter("http://127.0.0.1:9400/metrics".into());
        let mut cfg = AgentConfig::default();
        assert!(follows_refresh(&dcgm, &cfg));
        assert!(!follows_refresh(&SourceKind::Nvml, &cfg));
        assert!(!follows_refresh(&SourceKind::Sim, &cfg));
        cfg.interval = Duration::from_secs(1);
        assert!(!follows_refresh(&dcgm, &cfg));
        // Adaptive: `sampling.min_interval` is the capture interval.
        cfg.sampling.adaptive = true;
        assert!(follows_refresh(&dcgm, &cfg));
        cfg.sampling.min_interval = Duration::from_millis(500);
        assert!(!follows_refresh(&dcgm, &cfg));
    }
}
