//! The cluster's settings (peers, peer credential, timeouts) and counters:
//! what the collector's shared state holds of the cluster, apart from the
//! reconciler that uses them.

use crate::CollectorError;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// What the reconciler needs from the config.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    /// The other collectors' URLs (`peers`).
    pub peers: Vec<String>,
    /// Bearer token presented to peers (`cluster.peer_token_file`).
    pub peer_token: Option<String>,
    /// How often limbo is checked.
    pub reconcile_interval: Duration,
    /// Limbo batches older than this are kept without an answer, ms.
    pub limbo_timeout_ms: i64,
}

/// `peers` less this collector itself: an entry whose host is
/// `collector_id`, or a DNS name whose first label is (a StatefulSet's
/// pods, named `<set>-<ordinal>`, can then share one list of every
/// replica's `https://<pod>.<headless service>:7070`).
pub fn other_peers(peers: &[String], collector_id: &str) -> Vec<String> {
    peers
        .iter()
        .filter(|p| {
            let host = p
                .parse::<tonic::codegen::http::Uri>()
                .ok()
                .and_then(|u| u.host().map(str::to_string));
            host.is_none_or(|h| h.split('.').next() != Some(collector_id))
        })
        .cloned()
        .collect()
}

impl ClusterSettings {
    /// From the config file, for the collector named `collector_id`; the
    /// token is read by [`read_peer_token`].
    pub fn from_config(c: &flopwatch_config::CollectorConfig, collector_id: &str) -> Self {
        Self {
            peers: other_peers(&c.peers, collector_id),
            peer_token: None,
            reconcile_interval: c.cluster.reconcile_interval,
            limbo_timeout_ms: i64::try_from(c.cluster.limbo_timeout.as_millis())
                .unwrap_or(i64::MAX),
        }
    }

    /// Whether uncertain batches go to limbo: there are peers to ask and
    /// a credential to ask them with.
    pub fn limbo(&self) -> bool {
        !self.peers.is_empty() && self.peer_token.is_some()
    }
}

/// Reads `cluster.peer_token_file` (surrounding whitespace trimmed); errors
/// name the key and the file.
pub(crate) fn read_peer_token(
    c: &flopwatch_config::CollectorConfig,
) -> Result<Option<String>, CollectorError> {
    let Some(p) = &c.cluster.peer_token_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(p).map_err(|e| {
        CollectorError::Setup(format!("cluster.peer_token_file `{}`: {e}", p.display()))
    })?;
    let t = text.trim();
    if t.is_empty() {
        return Err(CollectorError::Setup(format!(
            "cluster.peer_token_file `{}` is empty",
            p.display()
        )));
    }
    Ok(Some(t.to_string()))
}

/// The cluster's counters (on `/metrics`).
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Batches in limbo: the count of the last pass, plus those committed
    /// since, less those settled since.
    pub limbo_batches: AtomicI64,
    /// Batches acknowledged into limbo.
    pub limbo_committed: AtomicU64,
    /// Limbo batches dropped because a peer holds them.
    pub dropped: AtomicU64,
    /// Limbo batches kept because no peer holds them.
    pub kept: AtomicU64,
    /// Limbo batches kept after `limbo_timeout` without every answer.
    pub timed_out: AtomicU64,
    /// Peer questions that failed (unreachable, refused, timed out).
    pub peer_errors: AtomicU64,
}

impl ClusterStats {
    /// A batch was committed into limbo.
    pub fn committed(&self) {
        self.limbo_committed.fetch_add(1, Ordering::Relaxed);
        self.limbo_batches.fetch_add(1, Ordering::Relaxed);
    }
}
