//! `flopwatch check-config FILE... [--kind agent|collector]`: loads each
//! file as `flopwatch agent` or `flopwatch collector` would, validates it
//! and the files it names (token, metric set, GPU specs), and prints
//! `FILE: OK` or the error naming the file and the key. Exit status 1 when
//! any file fails.
//!
//! Only the file is checked: `FLOPWATCH_*` environment overrides are not
//! applied, so the verdict does not depend on the shell it runs in.

use crate::shared::read_metric_set;
use flopwatch_config::{
    load_file_with, relative_to, AgentConfig, CollectorConfig, SpecTable, Validate,
};
use std::path::{Path, PathBuf};

/// Arguments of `check-config`.
#[derive(clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// Config files to check.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// What the files configure (default: told from their keys).
    #[arg(long, value_enum)]
    kind: Option<Kind>,
}

/// Which config a file is.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Agent,
    Collector,
}

/// Some file failed; each failure was printed already.
#[derive(Debug)]
pub(crate) struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("config check failed")
    }
}

impl std::error::Error for Failed {}

pub(crate) fn run(a: &CheckConfigArgs) -> anyhow::Result<()> {
    let mut failed = false;
    for f in &a.files {
        match check(f, a.kind) {
            Ok(kind) => println!("{}: OK ({})", f.display(), kind.name()),
            Err(e) => {
                eprintln!("{e:#}");
                failed = true;
            }
        }
    }
    if failed {
        return Err(Failed.into());
    }
    Ok(())
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Agent => "agent",
            Kind::Collector => "collector",
        }
    }
}

/// Checks one file; the error names the file.
fn check(path: &Path, kind: Option<Kind>) -> anyhow::Result<Kind> {
    let kind = match kind {
        Some(k) => k,
        None => detect(path)?,
    };
    // No environment: the file alone.
    let env: Vec<(String, String)> = Vec::new();
    match kind {
        Kind::Agent => {
            let cfg: AgentConfig = load_file_with(path, &env)?;
            if let Some(t) = &cfg.token_file {
                readable(path, "token_file", &relative_to(path, t))?;
            }
            if let Some(m) = &cfg.metrics_file {
                read_metric_set(&relative_to(path, m))
                    .map_err(|e| named(path, "metrics_file", e))?;
            }
        }
        Kind::Collector => {
            let cfg: CollectorConfig = load_file_with(path, &env)?;
            if let Some(s) = &cfg.gpu_specs {
                SpecTable::load(&relative_to(path, s))
                    .map_err(|e| named(path, "gpu_specs", e.into()))?;
            }
            if let Some(m) = &cfg.policy.metrics_file {
                read_metric_set(&relative_to(path, m))
                    .map_err(|e| named(path, "policy.metrics_file", e))?;
            }
            if let Some(t) = &cfg.cluster.peer_token_file {
                readable(path, "cluster.peer_token_file", &relative_to(path, t))?;
            }
        }
    }
    Ok(kind)
}

fn named(file: &Path, key: &str, e: anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: key `{key}`: {e:#}", file.display())
}

fn readable(file: &Path, key: &str, target: &Path) -> anyhow::Result<()> {
    std::fs::read(target)
        .map(|_| ())
        .map_err(|e| named(file, key, anyhow::anyhow!("{}: {e}", target.display())))
}

/// Tells an agent config from a collector config by the top-level keys
/// only one of them has.
fn detect(path: &Path) -> anyhow::Result<Kind> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    kind_of(&doc).ok_or_else(|| {
        anyhow::anyhow!(
            "{}: cannot tell an agent config from a collector config by its keys: give --kind agent or --kind collector",
            path.display()
        )
    })
}

fn kind_of(doc: &toml::Table) -> Option<Kind> {
    // `labels` and `tenants` are file-only keys (no environment override).
    let agent = |k: &str| AgentConfig::KEYS.contains(&k) || k == "labels";
    let collector = |k: &str| CollectorConfig::KEYS.contains(&k) || k == "tenants";
    let (mut a, mut c) = (0, 0);
    for k in doc.keys() {
        match (agent(k), collector(k)) {
            (true, false) => a += 1,
            (false, true) => c += 1,
            _ => {}
        }
    }
    match a.cmp(&c) {
        std::cmp::Ordering::Greater => Some(Kind::Agent),
        std::cmp::Ordering::Less => Some(Kind::Collector),
        std::cmp::Ordering::Equal => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> toml::Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn kind_is_told_by_keys_only_one_config_has() {
        assert_eq!(
            kind_of(&doc("collectors = [\"http://c:7070\"]\nsource = \"sim\"")),
            Some(Kind::Agent)
        );
        assert_eq!(
            kind_of(&doc("data_dir = \"/d\"\n[policy]\nadaptive = true")),
            Some(Kind::Collector)
        );
        // metrics_listen and tls belong to both.
        assert_eq!(kind_of(&doc("metrics_listen = \"127.0.0.1:1\"")), None);
        assert_eq!(kind_of(&doc("")), None);
    }

    #[test]
    fn the_example_configs_pass() {
        let dir = std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR")
                .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
        )
        .join("../config");
        assert_eq!(check(&dir.join("agent.toml"), None).unwrap(), Kind::Agent);
        assert_eq!(
            check(&dir.join("collector.toml"), None).unwrap(),
            Kind::Collector
        );
    }
}
