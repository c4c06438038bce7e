//! Pieces more than one command uses: config-relative paths, metric set
//! files, the shutdown signal.

use anyhow::Context;
use std::path::PathBuf;

/// The directory relative paths of a config file are resolved against.
pub fn config_dir(config: &std::path::Path) -> PathBuf {
    config.parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

/// Reads the metric set a `metrics_file` names (`metrics = [...]`).
pub fn read_metric_set(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Set {
        metrics: Vec<String>,
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let set: Set = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    for m in &set.metrics {
        if flopwatch_proto::metrics::lookup(m).is_none() {
            anyhow::bail!("{}: key `metrics`: unknown metric `{m}`", path.display());
        }
    }
    Ok(set.metrics)
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
