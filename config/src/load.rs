//! Reading a config file, applying environment overrides, validating.

use crate::ConfigError;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Where environment overrides come from: the process environment in
/// production, a fixed list in tests.
pub trait EnvSource {
    /// All `(name, value)` pairs.
    fn vars(&self) -> Vec<(String, String)>;
}

/// The real process environment.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars().collect()
    }
}

impl EnvSource for Vec<(String, String)> {
    fn vars(&self) -> Vec<(String, String)> {
        self.clone()
    }
}

/// A config file type: its top-level keys (for environment overrides) and
/// its checks.
pub trait Validate {
    /// Top-level keys an environment variable may override.
    const KEYS: &'static [&'static str];

    /// Checks values; errors name the key.
    fn validate(&self) -> Result<(), ConfigError>;
}

/// Reads, overrides and validates `path` with the process environment.
pub fn load_file<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    load_file_with(path, &ProcessEnv)
}

/// Reads, overrides from `env` and validates `path`.
pub fn load_file_with<T: DeserializeOwned + Validate>(
    path: &Path,
    env: &dyn EnvSource,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse_with(&text, path, env)
}

/// Parses TOML text (no environment overrides); `path` names it in errors.
pub fn parse_str<T: DeserializeOwned + Validate>(
    text: &str,
    path: &Path,
) -> Result<T, ConfigError> {
    parse_with(text, path, &Vec::new())
}

fn parse_with<T: DeserializeOwned + Validate>(
    text: &str,
    path: &Path,
    env: &dyn EnvSource,
) -> Result<T, ConfigError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
        file: path.to_path_buf(),
        message: e.to_string(),
    })?;
    apply_env(&mut doc, env, T::KEYS)?;
    let value: T = toml::Value::Table(doc)
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            file: path.to_path_buf(),
            message: e.to_string(),
        })?;
    value.validate().map_err(|e| e.with_file(path))?;
    Ok(value)
}

/// `FLOPWATCH_A__B=v` sets key `a.b` to `v`, parsed as a TOML value when it
/// parses (numbers, booleans, arrays) and as a string otherwise.
fn apply_env(doc: &mut toml::Table, env: &dyn EnvSource, keys: &[&str]) -> Result<(), ConfigError> {
    let mut vars = env.vars();
    vars.sort();
    for (name, raw) in vars {
        let Some(rest) = name.strip_prefix("FLOPWATCH_") else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        // Only keys the file type declares: other FLOPWATCH_* variables
        // (FLOPWATCH_LOG, ...) are not overrides.
        if !keys.contains(&path[0].as_str()) {
            continue;
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let (last, parents) = path.split_last().ok_or_else(|| ConfigError::Env {
            var: name.clone(),
            message: "empty key".into(),
        })?;
        let mut table = &mut *doc;
        for p in parents {
            let entry = table
                .entry(p.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = entry.as_table_mut().ok_or_else(|| ConfigError::Env {
                var: name.clone(),
                message: format!("`{p}` is not a table"),
            })?;
        }
        table.insert(last.clone(), value);
    }
    Ok(())
}

/// Resolves `p` against the directory of the config file `base`.
pub fn relative_to(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.parent().unwrap_or(Path::new(".")).join(p)
    }
}
