//! Settling batches two collectors of a cluster may both hold.
//!
//! When collector A commits a batch and dies before its ack reaches the
//! agent, the agent resends the batch to collector B flagged `uncertain`.
//! B commits it into limbo ([`crate::store::LimboBatch`]: durable,
//! acknowledged, readable, not compacted) and this module's reconciler
//! settles it by asking every peer through the `Cluster/Held` RPC whether
//! it holds the batch (exact membership, see `store::membership`):
//!
//! * a peer holds it as a normal commit → drop this copy;
//! * a peer holds it in limbo too and has the lower store id → drop this
//!   copy (that peer waits for ours to go, then keeps its own);
//! * every peer answers absent → keep it as a normal commit;
//! * otherwise (a peer unreachable, or in limbo with a higher id) → ask
//!   again next pass; after `cluster.limbo_timeout` keep it, counted.
//!
//! A copy is dropped only when another collector holds the batch normally
//! or a collector with a lower id holds it in limbo, which itself is
//! dropped only for a normal copy: some copy always stays. A batch is
//! kept only when every peer said absent, so two copies are both kept only
//! after a timeout. Each settlement is one atomic write; a crash between
//! passes leaves the batch in limbo for the next pass.

use crate::auth::{bearer, AuthError, Scope};
use crate::state::Collector;
use crate::store::{AgentKey, LimboBatch, Settle, Store, StoreError};
use crate::CollectorError;
use flopwatch_proto::cluster::{BatchRef, Holding, MAX_HELD_BATCHES};
use flopwatch_proto::v1::{self, cluster_client::ClusterClient, cluster_server};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

/// Batches looked at per pass.
const PASS_LIMIT: usize = 4096;
/// How long a peer gets to answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

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

impl ClusterSettings {
    /// From the config file; the token is read by [`read_peer_token`].
    pub fn from_config(c: &flopwatch_config::CollectorConfig) -> Self {
        Self {
            peers: c.peers.clone(),
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
pub fn read_peer_token(
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

// ---------------------------------------------------------------------------
// The Held service.

/// `flopwatch.v1.Cluster`: answers peers' questions from this store.
#[derive(Clone)]
pub struct ClusterService {
    c: Arc<Collector>,
    store_id: u64,
}

impl ClusterService {
    /// Serves `c`'s store, whose id is `store_id`.
    pub fn new(c: Arc<Collector>, store_id: u64) -> Self {
        Self { c, store_id }
    }

    /// As a tonic server.
    pub fn server(self) -> cluster_server::ClusterServer<Self> {
        cluster_server::ClusterServer::new(self)
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    async fn held(
        &self,
        request: Request<v1::HeldRequest>,
    ) -> Result<Response<v1::HeldResponse>, Status> {
        let scope = self
            .c
            .auth
            .query(bearer(request.metadata()).as_deref())
            .map_err(CollectorError::from)?;
        if scope != Scope::All {
            return Err(CollectorError::from(AuthError::Denied).into());
        }
        let batches = request.into_inner().batches;
        if batches.len() > MAX_HELD_BATCHES {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_HELD_BATCHES} batches per request"
            )));
        }
        let refs = batches
            .into_iter()
            .map(BatchRef::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let store = self.c.store.clone();
        let holdings = tokio::task::spawn_blocking(move || {
            refs.iter()
                .map(|r| store.holding(&agent_key(r), r.seq))
                .collect::<Result<Vec<_>, StoreError>>()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(CollectorError::from)?;
        Ok(Response::new(v1::HeldResponse {
            store_id: self.store_id,
            holdings: holdings
                .into_iter()
                .map(|h| v1::Holding::from(h) as i32)
                .collect(),
        }))
    }
}

fn agent_key(r: &BatchRef) -> AgentKey {
    AgentKey {
        tenant: r.tenant.clone(),
        agent_id: r.agent_id.clone(),
        boot_id: r.boot_id.clone(),
    }
}

// ---------------------------------------------------------------------------
// Peers.

/// Another collector, as the reconciler asks it.
#[tonic::async_trait]
pub trait Peer: Send + Sync {
    /// For logs.
    fn name(&self) -> &str;
    /// The peer's store id and, per batch (at most [`MAX_HELD_BATCHES`]),
    /// whether it holds it (`None`: no usable answer).
    async fn held(&self, refs: &[BatchRef]) -> Result<(u64, Vec<Option<Holding>>), String>;
}

/// A peer over gRPC, on the channel the query fan-out uses.
pub struct GrpcPeer {
    url: String,
    channel: Channel,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl GrpcPeer {
    /// Every peer of `settings`.
    pub fn all(settings: &ClusterSettings) -> Result<Vec<Box<dyn Peer>>, CollectorError> {
        let token = match &settings.peer_token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                CollectorError::Setup("cluster.peer_token_file: not valid header text".into())
            })?),
            None => None,
        };
        Ok(crate::fanout::peer_channels(&settings.peers)?
            .into_iter()
            .map(|(url, channel)| {
                Box::new(GrpcPeer {
                    url,
                    channel,
                    token: token.clone(),
                }) as Box<dyn Peer>
            })
            .collect())
    }
}

#[tonic::async_trait]
impl Peer for GrpcPeer {
    fn name(&self) -> &str {
        &self.url
    }

    async fn held(&self, refs: &[BatchRef]) -> Result<(u64, Vec<Option<Holding>>), String> {
        let mut req = Request::new(v1::HeldRequest {
            batches: refs.iter().cloned().map(Into::into).collect(),
        });
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        req.set_timeout(PEER_TIMEOUT);
        let mut client = ClusterClient::new(self.channel.clone());
        let r = tokio::time::timeout(PEER_TIMEOUT, client.held(req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
            .into_inner();
        if r.holdings.len() != refs.len() {
            return Err(format!(
                "{} answers for {} batches",
                r.holdings.len(),
                refs.len()
            ));
        }
        Ok((
            r.store_id,
            r.holdings.into_iter().map(Holding::from_wire).collect(),
        ))
    }
}

// ---------------------------------------------------------------------------
// Deciding.

/// What to do with one batch in limbo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Another collector keeps it: drop this copy.
    Drop,
    /// Every peer said absent: keep it.
    Keep,
    /// Not every peer answered within the limbo timeout: keep it.
    TimedOut,
    /// Ask again next pass.
    Wait,
}

/// The rule of the module docs, for a batch in limbo since `since_ms` in a
/// store of id `own_id`, given each peer's `(store id, holding)` or
/// `None` for no answer.
pub fn decide(
    own_id: u64,
    answers: &[Option<(u64, Holding)>],
    since_ms: i64,
    now_ms: i64,
    timeout_ms: i64,
) -> Decision {
    let mut blocked = false;
    for a in answers {
        match *a {
            Some((_, Holding::Held)) => return Decision::Drop,
            Some((id, Holding::Limbo)) if id < own_id => return Decision::Drop,
            Some((_, Holding::Absent)) => {}
            // In limbo at a higher id (it lets its copy go first), an equal
            // id (a cloned store: no safe order), or no answer.
            _ => blocked = true,
        }
    }
    if !blocked {
        Decision::Keep
    } else if now_ms.saturating_sub(since_ms) >= timeout_ms {
        Decision::TimedOut
    } else {
        Decision::Wait
    }
}

// ---------------------------------------------------------------------------
// Reconciling.

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
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
pub struct Reconciler {
    store: Store,
    store_id: u64,
    peers: Vec<Box<dyn Peer>>,
    timeout_ms: i64,
    stats: Arc<ClusterStats>,
}

impl Reconciler {
    /// For `store` (of id `store_id`) and its `peers`.
    pub fn new(
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
    pub async fn pass(&self, now_ms: i64) -> Result<PassReport, StoreError> {
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

/// Runs a pass every `reconcile_interval` until `stop` turns true.
pub async fn run(
    collector: Arc<Collector>,
    store_id: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let settings = &collector.settings.cluster;
    let peers = match GrpcPeer::all(settings) {
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

#[cfg(test)]
mod tests;
