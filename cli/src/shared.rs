//! Pieces more than one command uses: config-relative paths, metric set
//! files, the shutdown signal.

use anyhow::Context;
use std::path::PathBuf;

/// The directory relative paths of a config file are resolved against.
pub(crate) fn config_dir(config: &std::path::Path) -> PathBuf {
    config.parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

/// Where `flopwatch agent` and `flopwatch collector` look for their
/// config file when `--config` is not given.
pub(crate) const DEFAULT_CONFIG_DIR: &str = "/etc/flopwatch";

/// The config file to load: `explicit` (--config or FLOPWATCH_CONFIG), else
/// `DEFAULT_CONFIG_DIR/<role>.toml` if it exists.
pub(crate) fn config_path(
    explicit: Option<PathBuf>,
    default_dir: &std::path::Path,
    role: &str,
) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let p = default_dir.join(format!("{role}.toml"));
    if p.is_file() {
        Ok(p)
    } else {
        anyhow::bail!(
            "no --config given and {} does not exist (see config/{role}.toml for an example)",
            p.display()
        )
    }
}

/// Reads the metric set a `metrics_file` names (`metrics = [...]`).
pub(crate) fn read_metric_set(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
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

pub(crate) use flopwatch_transport::shutdown_signal;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_path_falls_back_to_the_default_dir() {
        let dir = tempfile::tempdir().unwrap();
        let given = PathBuf::from("/x/agent.toml");
        assert_eq!(
            config_path(Some(given.clone()), dir.path(), "agent").unwrap(),
            given
        );
        let e = config_path(None, dir.path(), "agent")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--config") && e.contains("agent.toml"), "{e}");
        std::fs::write(dir.path().join("agent.toml"), "").unwrap();
        assert_eq!(
            config_path(None, dir.path(), "agent").unwrap(),
            dir.path().join("agent.toml")
        );
        // The collector's file is its own.
        assert!(config_path(None, dir.path(), "collector").is_err());
    }
}
