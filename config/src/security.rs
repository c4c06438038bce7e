//! TLS and per-tenant limits: the sections the collector, the agent and the
//! command-line clients share (docs/SECURITY.md).

use crate::ConfigError;
use serde::Deserialize;
use std::path::PathBuf;

/// `[tls]` of collector.toml: the certificate the gRPC port serves, and
/// optionally the CA that agents' client certificates must chain to (mTLS).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain of this collector.
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to. Unset: client
    /// certificates are not asked for (tokens only).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Refuse connections without a client certificate (needs `client_ca`).
    /// Off: a certificate is optional and tokens still work.
    #[serde(default)]
    pub require_client_cert: bool,
}

impl ServerTls {
    /// Checks paths and combinations; `key` is the section's dotted name.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for (name, p) in [("cert", &self.cert), ("key", &self.key)] {
            if p.as_os_str().is_empty() {
                return Err(ConfigError::invalid(
                    &format!("{key}.{name}"),
                    "must name a PEM file",
                ));
            }
        }
        if self.require_client_cert && self.client_ca.is_none() {
            return Err(ConfigError::invalid(
                &format!("{key}.require_client_cert"),
                "needs `client_ca` (the CA client certificates chain to)",
            ));
        }
        Ok(())
    }
}

/// A TLS client: `[tls]` of agent.toml, `[peer_tls]` of collector.toml, the
/// `--ca`/`--cert`/`--key` flags of the command-line clients. Used for
/// `https://` URLs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA bundle the server's certificate must chain to. Unset: the
    /// system's trust store.
    pub ca: Option<PathBuf>,
    /// PEM client certificate (mTLS). Needs `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// Name expected in the server's certificate when it differs from the
    /// URL's host (e.g. connecting by IP).
    pub domain: Option<String>,
}

impl ClientTls {
    /// Checks combinations; `key` is the section's dotted name.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(ConfigError::invalid(
                &format!("{key}.key"),
                "`cert` is set: the key of the client certificate is needed too",
            )),
            (None, Some(_)) => Err(ConfigError::invalid(
                &format!("{key}.cert"),
                "`key` is set: the client certificate is needed too",
            )),
            _ => Ok(()),
        }?;
        if self.domain.as_ref().is_some_and(|d| d.is_empty()) {
            return Err(ConfigError::invalid(
                &format!("{key}.domain"),
                "must not be empty (leave it out instead)",
            ));
        }
        Ok(())
    }
}

/// `[limits]`: what one tenant may ingest (defaults for every tenant;
/// `[tenants.limits]` overrides per tenant). 0 means unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Samples per second the tenant may ingest on this collector; a batch
    /// past it is refused with RESOURCE_EXHAUSTED and a retry delay, and its
    /// agent sends it again after the delay.
    pub ingest_rate: u64,
    /// Samples the tenant may send at once above the rate (the token
    /// bucket's size). 0: one second at `ingest_rate`.
    pub ingest_burst: u64,
    /// Series (GPU or device × metric) with a sample in the last hour the
    /// tenant may have on this collector; samples of further series are
    /// refused (`series_limit`).
    pub max_series: u64,
    /// Batches of the tenant committed at once. Keeps a flooding tenant's
    /// writes from queueing ahead of other tenants' in storage.
    pub max_concurrent_commits: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ingest_rate: 0,
            ingest_burst: 0,
            max_series: 0,
            max_concurrent_commits: 2,
        }
    }
}

/// `[tenants.limits]`: one tenant's limits; unset keys take `[limits]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsOverride {
    /// See [`Limits::ingest_rate`].
    pub ingest_rate: Option<u64>,
    /// See [`Limits::ingest_burst`].
    pub ingest_burst: Option<u64>,
    /// See [`Limits::max_series`].
    pub max_series: Option<u64>,
    /// See [`Limits::max_concurrent_commits`].
    pub max_concurrent_commits: Option<u32>,
}

impl Limits {
    /// These limits with `o`'s keys applied.
    pub fn with(&self, o: &LimitsOverride) -> Limits {
        Limits {
            ingest_rate: o.ingest_rate.unwrap_or(self.ingest_rate),
            ingest_burst: o.ingest_burst.unwrap_or(self.ingest_burst),
            max_series: o.max_series.unwrap_or(self.max_series),
            max_concurrent_commits: o
                .max_concurrent_commits
                .unwrap_or(self.max_concurrent_commits),
        }
    }

    /// Checks values; `key` is the section's dotted name.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_concurrent_commits == 0 {
            return Err(ConfigError::invalid(
                &format!("{key}.max_concurrent_commits"),
                "must be at least 1",
            ));
        }
        if self.ingest_burst > 0 && self.ingest_rate == 0 {
            return Err(ConfigError::invalid(
                &format!("{key}.ingest_burst"),
                "needs `ingest_rate`",
            ));
        }
        Ok(())
    }
}

/// Checks a certificate-name pattern: `*` matches any run of characters,
/// `{node}` (at most once) matches the node id the agent must announce.
pub(crate) fn check_name_pattern(key: &str, p: &str) -> Result<(), ConfigError> {
    if p.is_empty() {
        return Err(ConfigError::invalid(key, "must not be empty"));
    }
    if p.matches("{node}").count() > 1 {
        return Err(ConfigError::invalid(key, "`{node}` may appear once"));
    }
    if p.contains("{node}") && p.contains('*') {
        return Err(ConfigError::invalid(
            key,
            "`{node}` and `*` cannot be combined in one pattern",
        ));
    }
    if p.replace("{node}", "").contains(['{', '}']) {
        return Err(ConfigError::invalid(
            key,
            "the only placeholder is `{node}`",
        ));
    }
    Ok(())
}
