//! `collector.toml`.

use crate::{ConfigError, Validate};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The collector's configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectorConfig {
    /// gRPC listen address (ingest and query).
    pub listen: SocketAddr,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Name reported to agents; defaults to the hostname.
    pub collector_id: String,
    /// A GPU spec table replacing the built-in one.
    pub gpu_specs: Option<PathBuf>,
    /// Samples with timestamps further ahead than this are rejected.
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    /// Largest encoded batch accepted, bytes.
    pub max_batch_bytes: u32,
    /// fsync the RocksDB WAL before acknowledging. Off: an acked batch
    /// survives a process crash (kill -9) but not a power loss.
    pub sync_wal: bool,
    /// Data older than this is deleted and never returned.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Sampling policy pushed to agents.
    pub policy: PolicyConfig,
    /// Tenant used for connections without credentials; unset means
    /// credentials are required.
    pub anonymous_tenant: Option<String>,
    /// Tenants and their credentials.
    pub tenants: Vec<TenantConfig>,
    /// Provider (admin) query tokens, SHA-256 hex: read every tenant.
    pub admin_tokens_sha256: Vec<String>,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7070".parse().expect("literal address"),
            data_dir: PathBuf::from("/var/lib/flopwatch"),
            collector_id: String::new(),
            gpu_specs: None,
            max_future: Duration::from_secs(600),
            max_batch_bytes: 4 * 1024 * 1024,
            sync_wal: false,
            retention: Duration::from_secs(30 * 24 * 3600),
            policy: PolicyConfig::default(),
            anonymous_tenant: None,
            tenants: Vec::new(),
            admin_tokens_sha256: Vec::new(),
        }
    }
}

/// `[policy]`: what agents are told to do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Minimum sampling interval.
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
    /// Maximum (adaptive) sampling interval; at most 30 s.
    #[serde(with = "humantime_serde")]
    pub max_interval: Duration,
    /// Adaptive sampling.
    pub adaptive: bool,
    /// How often agents cut a batch.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// A selected metric set (`flopwatch select --output`) to hand to agents.
    pub metrics_file: Option<PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(30),
            adaptive: false,
            flush_interval: Duration::from_secs(1),
            metrics_file: None,
        }
    }
}

/// `[[tenants]]`: one tenant and its credentials.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant name.
    pub name: String,
    /// Agent bearer tokens, SHA-256 hex (never the tokens themselves).
    #[serde(default)]
    pub agent_tokens_sha256: Vec<String>,
    /// Read-only query tokens, SHA-256 hex.
    #[serde(default)]
    pub query_tokens: Vec<QueryToken>,
}

/// A query credential.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryToken {
    /// SHA-256 hex of the token.
    pub sha256: String,
}

fn check_hash(key: &str, h: &str) -> Result<(), ConfigError> {
    if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            "must be a SHA-256 hex digest (64 hex characters): `printf %s TOKEN | sha256sum`",
        ))
    }
}

impl Validate for CollectorConfig {
    const KEYS: &'static [&'static str] = &[
        "listen",
        "data_dir",
        "collector_id",
        "gpu_specs",
        "max_future",
        "max_batch_bytes",
        "sync_wal",
        "retention",
        "policy",
        "anonymous_tenant",
        "admin_tokens_sha256",
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        if self.max_batch_bytes < 1024 {
            return Err(ConfigError::invalid(
                "max_batch_bytes",
                "must be at least 1024",
            ));
        }
        let p = &self.policy;
        if p.min_interval < Duration::from_millis(10) {
            return Err(ConfigError::invalid(
                "policy.min_interval",
                "must be at least 10ms",
            ));
        }
        if p.max_interval < p.min_interval || p.max_interval > Duration::from_secs(30) {
            return Err(ConfigError::invalid(
                "policy.max_interval",
                "must lie between policy.min_interval and 30s (hardware counters average over at most 30 s)",
            ));
        }
        if p.flush_interval.is_zero() {
            return Err(ConfigError::invalid(
                "policy.flush_interval",
                "must be positive",
            ));
        }
        if self.retention < Duration::from_secs(3600) {
            return Err(ConfigError::invalid("retention", "must be at least 1h"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.name.is_empty() || t.name.len() > 64 || t.name.contains('\0') {
                return Err(ConfigError::invalid(
                    &format!("tenants[{i}].name"),
                    "must be 1-64 characters",
                ));
            }
            if !names.insert(&t.name) {
                return Err(ConfigError::invalid(
                    &format!("tenants[{i}].name"),
                    format!("duplicate tenant `{}`", t.name),
                ));
            }
            for (j, h) in t.agent_tokens_sha256.iter().enumerate() {
                check_hash(&format!("tenants[{i}].agent_tokens_sha256[{j}]"), h)?;
            }
            for (j, q) in t.query_tokens.iter().enumerate() {
                check_hash(&format!("tenants[{i}].query_tokens[{j}].sha256"), &q.sha256)?;
            }
        }
        for (j, h) in self.admin_tokens_sha256.iter().enumerate() {
            check_hash(&format!("admin_tokens_sha256[{j}]"), h)?;
        }
        if self.anonymous_tenant.is_none() && self.tenants.is_empty() {
            return Err(ConfigError::invalid(
                "tenants",
                "no tenant can connect: add [[tenants]] or set anonymous_tenant",
            ));
        }
        Ok(())
    }
}
