//! The reconciler: settles the store's limbo against its peers.

use super::{decide, ClusterStats, Decision, GrpcPeer, Peer};
use crate::state::Collector;
use crate::store::{LimboBatch, Settle, Store, StoreError};
use flopwatch_proto::cluster::{BatchRef, Holding};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// Batches looked at per pass.
const PASS_LIMIT: usize = 4096;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PassReport {
    /// Batches in limbo when the pass began.
    pub in_limbo: usize,
    /// Dropped: a peer holds them.
    pub dropped: u64,
    /// Kept: no peer holds them.
    pub kept: u64,
    /// Kept after the timeout.
    pub timed_out: u64,
    /// Left for the next pass.
    pub waiting: u64,
}

/// Settles the store's limbo against its peers.
pub(super) struct Reconciler {
    store: Store,
    store_id: u64,
    peers: Vec<Box<dyn Peer>>,
    timeout_ms: i64,
    pub(super) stats: Arc<ClusterStats>,
}

impl Reconciler {
    /// For `store` (of id `store_id`) and its `peers`.
    pub(super) fn new(
        store: Store,
        store_id: u64,
        peers: Vec<Box<dyn Peer>>,
        timeout_ms: i64,
        stats: Arc<ClusterStats>,
    ) -> Self {
        Self {
            store,
            store_id,
            peers,
            timeout_ms,
            stats,
        }
    }

    /// One pass at `now_ms`: asks every peer about every batch in limbo
    /// (up to [`PASS_LIMIT`]) and settles what can be settled.
    pub(super) async fn pass(&self, now_ms: i64) -> Result<PassReport, StoreError> {
        let store = self.store.clone();
        let (batches, total) = blocking(move || store.limbo(PASS_LIMIT)).await?;
        self.stats
            .limbo_batches
            .store(total as i64, Ordering::Relaxed);
        let mut report = PassReport {
            in_limbo: total,
            ..Default::default()
        };
        if batches.is_empty() {
            return Ok(report);
        }
        let refs: Vec<BatchRef> = batches
            .iter()
            .map(|b| BatchRef {
                tenant: b.agent.tenant.clone(),
                agent_id: b.agent.agent_id.clone(),
                boot_id: b.agent.boot_id.clone(),
                seq: b.seq,
            })
            .collect();
        let (refs_ref, stats) = (&refs, &self.stats);
        let answers = futures::future::join_all(self.peers.iter().map(|p| async move {
            match p.held(refs_ref).await {
                Ok(a) => Some(a),
                Err(e) => {
                    stats.peer_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(peer = %p.name(), error = %e, "cannot ask peer about limbo batches");
                    None
                }
            }
        }))
        .await;
        let mut todo: Vec<(LimboBatch, Decision)> = Vec::new();
        for (i, b) in batches.into_iter().enumerate() {
            let per_peer: Vec<Option<(u64, Holding)>> = answers
                .iter()
                .map(|a| a.as_ref().and_then(|(id, h)| Some((*id, h[i]?))))
                .collect();
            let d = decide(
                self.store_id,
                &per_peer,
                b.since_ms,
                now_ms,
                self.timeout_ms,
            );
            if d == Decision::Wait {
                report.waiting += 1;
            } else {
                todo.push((b, d));
            }
        }
        let store = self.store.clone();
        let done = blocking(move || {
            let mut done = Vec::new();
            for (b, d) in todo {
                let how = if d == Decision::Drop {
                    Settle::Drop
                } else {
                    Settle::Keep
                };
                if store.settle(&b.agent, b.seq, how)? {
                    done.push((b, d));
                }
            }
            Ok(done)
        })
        .await?;
        for (b, d) in done {
            let (counter, what) = match d {
                Decision::Drop => {
                    report.dropped += 1;
                    (&self.stats.dropped, "held by a peer: copy dropped")
                }
                Decision::Keep => {
                    report.kept += 1;
                    (&self.stats.kept, "held by no peer: kept")
                }
                _ => {
                    report.timed_out += 1;
                    warn!(tenant = %b.agent.tenant, agent = %b.agent.agent_id, seq = b.seq,
                        "limbo timeout: batch kept without every peer's answer (it may be stored twice)");
                    (&self.stats.timed_out, "limbo timeout: kept")
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            self.stats.limbo_batches.fetch_sub(1, Ordering::Relaxed);
            debug!(tenant = %b.agent.tenant, agent = %b.agent.agent_id, boot = %b.agent.boot_id, seq = b.seq, "limbo batch settled: {what}");
        }
        if report.dropped + report.kept + report.timed_out > 0 {
            info!(
                dropped = report.dropped,
                kept = report.kept,
                timed_out = report.timed_out,
                waiting = report.waiting,
                "limbo batches settled"
            );
        }
        Ok(report)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Engine(e.to_string()))?
}

/// Runs a pass every `reconcile_interval` until `stop` turns true; `tls`
/// reaches `https://` peers.
pub(crate) async fn run(
    collector: Arc<Collector>,
    store_id: u64,
    tls: flopwatch_transport::channel::TlsClient,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let settings = &collector.settings.cluster;
    let peers = match GrpcPeer::all(settings, &tls) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = %e, "limbo reconciler not started");
            return;
        }
    };
    info!(
        peers = peers.len(),
        store_id = %format!("{store_id:016x}"),
        "limbo reconciler running"
    );
    let r = Reconciler::new(
        collector.store.clone(),
        store_id,
        peers,
        settings.limbo_timeout_ms,
        collector.cluster.clone(),
    );
    let mut tick = tokio::time::interval(settings.reconcile_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(e) = r.pass(collector.clock.now_ms()).await {
            warn!(error = %e, "limbo pass failed; retried next interval");
        }
    }
}
