//! The Ingest service: one bidirectional stream per agent.
//!
//! Protocol (see `proto/flopwatch/v1/flopwatch.proto`):
//! 1. the agent sends a Hello; the collector authenticates it, records the
//!    node and its GPUs, and answers with a Welcome carrying the highest
//!    durable sequence number of this (agent, boot) and the policy;
//! 2. each Batch is validated sample by sample, its OFU derived, and the
//!    whole lot committed in one durable write together with the new acked
//!    sequence number; only then is the Ack sent;
//! 3. a batch whose seq is already durable is acknowledged again
//!    (`duplicate`) and not stored twice;
//! 4. a batch refused as a whole gets a Reject with a gRPC code and the
//!    stream goes on; a storage failure ends the stream with UNAVAILABLE,
//!    and the agent resends everything after the last ack on reconnect.
//!
//! Batches of one stream are processed in order; the agent's in-flight
//! window bounds what the collector holds per stream.

use crate::auth::{AgentIdentity, AuthError, Credentials};
use crate::events::EventRecord;
use crate::inbound;
use crate::limits::{RetryAfter, StreamSeries};
use crate::live::{BatchOfu, BatchView};
use crate::ofu::{ofu, Mean};
use crate::state::Collector;
use crate::store::{AgentKey, CommitSet, Derivation, GpuRecord, JobRecord, NodeRecord, OfuSample};
use crate::validate::{validate, Reason, Rules};
use crate::CollectorError;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{Batch, Hello, SeriesBatch};
use flopwatch_proto::v1::{self, collector_message, CollectorMessage};
use flopwatch_proto::wire_batch::{AgentFrame, WireBatch};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::http;
use tonic::{Code, Request, Response, Status};
use tracing::{debug, info, warn, Instrument};

/// Messages queued towards one agent.
const OUTBOX: usize = 64;

/// How long the oldest batch of a tenant may wait for storage before the
/// tenant's new batches are told to come again later (RESOURCE_EXHAUSTED,
/// reason `busy`, with `retry_after_ms`): well inside the agent's 4 s
/// acknowledgement timeout, so a collector with a saturated disk slows its
/// agents down instead of looking dead to them.
pub const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The delay a `busy` deferral asks for, before a jitter of up to as much
/// again (so deferred agents do not come back together).
pub(crate) const BUSY_RETRY_MS: u64 = 1000;

/// Why a batch was deferred (refused unconsumed, with a delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defer {
    /// Over the tenant's ingest rate.
    Rate,
    /// Storage over [`SLOT_WAIT`] behind the tenant.
    Busy,
}

impl Defer {
    fn reason(self) -> &'static str {
        match self {
            Defer::Rate => "rate_limited",
            Defer::Busy => "busy",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Defer::Rate => "over the tenant's ingest rate",
            Defer::Busy => "storage is busy",
        }
    }
}

/// The tonic service.
#[derive(Clone)]
pub(crate) struct IngestService {
    collector: Arc<Collector>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// One permit per agent stream (`max_agents`).
    slots: Arc<tokio::sync::Semaphore>,
}

impl IngestService {
    /// Serves `collector`; when `shutdown` turns true, every stream finishes
    /// the batch it is committing, acks it, and ends with UNAVAILABLE so
    /// agents move on (a graceful server shutdown would otherwise wait for
    /// agents' never-ending streams).
    pub(crate) fn new(
        collector: Arc<Collector>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(
            collector.settings.max_agents.max(1) as usize,
        ));
        Self {
            collector,
            shutdown,
            slots,
        }
    }

    /// As a gRPC service, with the decoding limit above the batch limit so
    /// oversize batches get a Reject rather than a broken stream. The
    /// stream's wire is [`crate::inbound`]'s: no buffer is held between
    /// an agent's batches.
    pub(crate) fn server(self) -> IngestRoute {
        let limit = self.collector.settings.max_batch_bytes as usize;
        IngestRoute {
            service: self,
            max_message: limit.saturating_mul(2).max(16 << 20),
        }
    }

    /// Opens an agent's session on its stream of messages and returns the
    /// stream of answers.
    async fn open<S>(
        &self,
        request: Request<S>,
    ) -> Result<Response<ReceiverStream<Result<CollectorMessage, Status>>>, Status>
    where
        S: Stream<Item = Result<AgentFrame, Status>> + Unpin + Send + 'static,
    {
        let mut creds = Credentials::of(&request);
        let mut inbound = request.into_inner();
        let first = inbound
            .next()
            .await
            .transpose()?
            .ok_or_else(|| Status::invalid_argument("stream closed before Hello"))?;
        let AgentFrame::Hello(wire_hello) = first else {
            return Err(Status::invalid_argument(
                "the first message must be a Hello",
            ));
        };
        if creds.token.is_none() && !wire_hello.token.is_empty() {
            creds.token = Some(wire_hello.token.clone());
        }
        let auth = self.collector.auth();
        let identity = auth.agent(&creds).map_err(|e| {
            self.collector.stats.auth_failure("ingest", &e);
            CollectorError::from(e)
        })?;
        let hello = Hello::try_from(*wire_hello)
            .map_err(|e| Status::invalid_argument(format!("hello: {e}")))?;
        // Held for the stream's life: memory stays bounded by max_agents
        // streams × one batch each.
        let slot = self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "collector serves its maximum of {} agent streams; try another collector",
                self.collector.settings.max_agents
            ))
        })?;
        let mut session = Session::open(
            self.collector.clone(),
            identity,
            creds,
            auth.generation(),
            hello,
        )
        .await?;
        let (tx, rx) = mpsc::channel(OUTBOX);
        let welcome = v1::Welcome {
            collector_id: self.collector.settings.collector_id.clone(),
            acked_seq: session.acked,
            policy: Some(self.collector.settings.policy.clone().into()),
            max_batch_bytes: self.collector.settings.max_batch_bytes,
            tenant: session.tenant.clone(),
        };
        tx.send(msg(collector_message::Msg::Welcome(welcome)))
            .await
            .map_err(|_| Status::cancelled("agent went away"))?;
        let span =
            tracing::info_span!("agent", tenant = %session.tenant, agent = %session.agent.agent_id);
        let stats = self.collector.clone();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(
            async move {
                stats.stats.agents_connected.fetch_add(1, Ordering::Relaxed);
                loop {
                    let received = tokio::select! {
                        m = inbound.next() => Some(m.transpose()),
                        _ = shutdown.wait_for(|stop| *stop) => None,
                    };
                    let Some(received) = received else {
                        let _ = tx
                            .send(Err(Status::unavailable("collector shutting down")))
                            .await;
                        break;
                    };
                    let next = match received {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(e) => {
                            debug!(error = %e, "stream ended");
                            break;
                        }
                    };
                    let reply = match next {
                        AgentFrame::Batch(b) => session.batch(*b).await,
                        AgentFrame::Hello(_) => Err(Status::invalid_argument("Hello sent twice")),
                        AgentFrame::Empty => Err(Status::invalid_argument("empty message")),
                    };
                    let end = reply.is_err();
                    if tx.send(reply).await.is_err() || end {
                        break;
                    }
                }
                stats.stats.agents_connected.fetch_sub(1, Ordering::Relaxed);
                drop(slot);
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn msg(m: collector_message::Msg) -> Result<CollectorMessage, Status> {
    Ok(CollectorMessage { msg: Some(m) })
}

/// A GPU's tensor activity, averaged clock and point clock in one batch.
type OfuInputs<'a> = (
    Option<&'a [flopwatch_proto::model::Point]>,
    Option<&'a [flopwatch_proto::model::Point]>,
    Option<&'a [flopwatch_proto::model::Point]>,
);

/// One agent's session.
struct Session {
    c: Arc<Collector>,
    tenant: String,
    /// Who the stream authenticated as, what it presented, and the
    /// credential table's generation it was checked against.
    identity: AgentIdentity,
    creds: Credentials,
    auth_generation: u64,
    /// A batch refused for the tenant's rate, and until when: it and every
    /// later batch are refused (not consumed) until the agent sends it
    /// again.
    throttled: Option<(u64, i64, Defer)>,
    agent: AgentKey,
    hello: Hello,
    gpus: HashSet<String>,
    /// Ids of the node's devices (InfiniBand ports, NUMA nodes, the host).
    devices: HashSet<String>,
    acked: u64,
    /// Each GPU's one job, as of the last batch.
    jobs: HashMap<String, v1::JobAssignment>,
    /// The jobs of each GPU several share, with their shares (ppm, summing
    /// to at most 10⁶), as of the last batch.
    shared: HashMap<String, Vec<v1::JobAssignment>>,
    /// The series this stream has counted against the tenant's cap.
    series_seen: StreamSeries,
}

/// The Ingest service at the HTTP level: `/flopwatch.v1.Ingest/Stream`
/// read by [`crate::inbound`], everything else UNIMPLEMENTED.
#[derive(Clone)]
pub(crate) struct IngestRoute {
    service: IngestService,
    max_message: usize,
}

impl tonic::server::NamedService for IngestRoute {
    const NAME: &'static str = v1::ingest_server::SERVICE_NAME;
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for IngestRoute {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != "/flopwatch.v1.Ingest/Stream" {
            return Box::pin(async { Ok(inbound::unimplemented()) });
        }
        let service = self.service.clone();
        let max = self.max_message;
        Box::pin(async move {
            let response = match inbound::streaming_request::<AgentFrame>(request, max) {
                Ok(request) => service.open(request).await,
                Err(status) => Err(status),
            };
            Ok(inbound::streaming_response(response))
        })
    }
}

impl Session {
    async fn open(
        c: Arc<Collector>,
        identity: AgentIdentity,
        creds: Credentials,
        auth_generation: u64,
        hello: Hello,
    ) -> Result<Self, Status> {
        let tenant = identity.tenant.clone();
        let now = c.clock.now_ms();
        if hello.gpus.len() > 1024 {
            return Err(Status::invalid_argument("more than 1024 GPUs in Hello"));
        }
        if hello.devices.len() > 4096 {
            return Err(Status::invalid_argument("more than 4096 devices in Hello"));
        }
        let node_suffix = format!("@{}", hello.node.node_id);
        for d in &hello.devices {
            if d.id.is_empty()
                || d.id.len() > crate::validate::MAX_ID_LEN
                || hello.gpus.iter().any(|g| g.uuid == d.id)
                || !d.id.ends_with(&node_suffix)
            {
                return Err(Status::invalid_argument(format!(
                    "device id `{}` empty, too long, a GPU's UUID, or not `<name>@<node_id>` of this node",
                    d.id.chars()
                        .take(crate::validate::MAX_ID_LEN)
                        .collect::<String>()
                )));
            }
        }
        let agent = AgentKey {
            tenant: tenant.clone(),
            agent_id: hello.agent_id.clone(),
            boot_id: hello.node.boot_id.clone(),
        };
        let node = NodeRecord {
            node_id: hello.node.node_id.clone(),
            hostname: hello.node.hostname.clone(),
            boot_id: hello.node.boot_id.clone(),
            agent_id: hello.agent_id.clone(),
            // A card in MIG mode counts through its instances.
            gpus: hello.gpus.iter().filter(|g| !g.mig.is_card()).count() as u32,
            last_seen_ms: now,
            labels: hello.node.labels.clone(),
            devices: crate::store::DeviceRecord::from_hello(&hello.devices),
            owner: identity.principal.clone(),
        };
        let gpus: Vec<GpuRecord> = hello
            .gpus
            .iter()
            .map(|g| {
                let job_id = c.gpu(&tenant, &g.uuid).and_then(|r| r.job_id);
                GpuRecord::from_info(g, &hello.node.node_id, job_id, now)
            })
            .collect();
        for g in &gpus {
            if g.uuid.is_empty() || g.uuid.len() > crate::validate::MAX_ID_LEN {
                return Err(Status::invalid_argument("GPU uuid empty or too long"));
            }
            c.warn_if_unspecified(g);
        }
        let set = CommitSet {
            nodes: vec![node],
            gpus: gpus.clone(),
            ..Default::default()
        };
        // Ownership is checked and claimed under the node's and GPUs' locks,
        // so two agents racing for a new node cannot both win it; the write
        // takes one of the tenant's registration slots (crate::limits).
        let claims = c.claim(&tenant, &hello).await;
        let slot = c.limits.registration_slot(&tenant).await;
        crate::ownership::check(&c, &identity, &hello)
            .await
            .inspect_err(|e| {
                if let CollectorError::Auth(a) = e {
                    c.stats.auth_failure("ingest", a);
                }
                warn!(tenant = %tenant, node = %hello.node.node_id, principal = %identity.principal, "node registration refused: {e}");
            })?;
        let store = c.store.clone();
        let key = agent.clone();
        let t = tenant.clone();
        let acked = tokio::task::spawn_blocking(move || {
            store.commit(&t, &set)?;
            store.acked_seq(&key)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(CollectorError::from)?;
        // The GPUs are known in memory before the locks go: the next Hello
        // naming one of them finds it under this node (crate::ownership).
        c.remember_gpus(&tenant, &gpus);
        drop((slot, claims));
        info!(tenant = %tenant, agent = %agent.agent_id, gpus = gpus.len(), acked, "agent connected");
        Ok(Self {
            gpus: gpus.iter().map(|g| g.uuid.clone()).collect(),
            devices: hello.devices.iter().map(|d| d.id.clone()).collect(),
            c,
            tenant,
            identity,
            creds,
            auth_generation,
            throttled: None,
            agent,
            hello,
            acked,
            jobs: HashMap::new(),
            shared: HashMap::new(),
            series_seen: StreamSeries::default(),
        })
    }

    /// Checks the stream's credentials again after a reload of the
    /// credential table: a removed token or certificate rule, or one that
    /// now names another tenant or principal, ends the stream.
    fn reauthorize(&mut self) -> Result<(), Status> {
        let auth = self.c.auth();
        if auth.generation() == self.auth_generation {
            return Ok(());
        }
        match auth.agent(&self.creds) {
            Ok(id)
                if id.tenant == self.identity.tenant
                    && id.principal == self.identity.principal
                    && id.nodes.allows(&self.hello.node.node_id) =>
            {
                self.identity = id;
                self.auth_generation = auth.generation();
                Ok(())
            }
            Ok(_) => {
                warn!(agent = %self.agent.agent_id, "credentials changed by a reload: stream ended");
                self.c.stats.auth_failure("ingest", &AuthError::Denied);
                Err(CollectorError::Auth(AuthError::Denied).into())
            }
            Err(e) => {
                warn!(agent = %self.agent.agent_id, "credentials revoked by a reload: stream ended");
                self.c.stats.auth_failure("ingest", &e);
                Err(CollectorError::Auth(e).into())
            }
        }
    }

    fn reject(&self, seq: u64, code: Code, reason: &str, message: String) -> CollectorMessage {
        self.c.stats.batch_rejected(&self.tenant, reason);
        debug!(seq, reason, %message, "batch rejected");
        CollectorMessage {
            msg: Some(collector_message::Msg::Reject(v1::Reject {
                seq,
                code: code as i32,
                reason: reason.to_string(),
                message,
                retry_after_ms: 0,
            })),
        }
    }

    /// Refuses `seq` for the tenant's ingest rate without consuming it: the
    /// agent sends it (and what follows) again after `retry_after_ms`.
    fn throttle(
        &mut self,
        seq: u64,
        retry_after_ms: u64,
        now: i64,
        why: Defer,
    ) -> CollectorMessage {
        if self.throttled.is_none_or(|(t, _, _)| seq <= t) {
            self.throttled = Some((seq, now.saturating_add(retry_after_ms as i64), why));
        }
        self.c.stats.batch_rejected(&self.tenant, why.reason());
        debug!(seq, retry_after_ms, reason = why.reason(), "batch deferred");
        CollectorMessage {
            msg: Some(collector_message::Msg::Reject(v1::Reject {
                seq,
                code: Code::ResourceExhausted as i32,
                reason: why.reason().into(),
                message: format!(
                    "{}; send this batch again in {retry_after_ms} ms",
                    why.what()
                ),
                retry_after_ms,
            })),
        }
    }

    /// Marks `seq` consumed without data, so replays of a refused batch are
    /// recognised.
    async fn consume(&mut self, seq: u64) -> Result<(), Status> {
        if seq <= self.acked {
            return Ok(());
        }
        let _slot = self.c.limits.commit_slot(&self.tenant).await;
        let set = CommitSet {
            agent: Some(self.agent.clone()),
            seq,
            no_data: true,
            ..Default::default()
        };
        self.commit(set).await?;
        Ok(())
    }

    /// Writes `set` with whatever else of the tenant waits for storage
    /// (crate::group), and hands it back for what follows the write.
    async fn commit_in_line(&mut self, set: CommitSet) -> Result<CommitSet, Status> {
        let seq = set.seq;
        let started = Stopwatch::start();
        let gate = self.c.limits.commit_gate(&self.tenant);
        let mut pending = self.c.lines.submit(&self.tenant, gate, &self.c.store, set);
        let set = pending.written().await.map_err(CollectorError::from)?;
        let s = &self.c.stats;
        s.commit_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        s.batches_committed.fetch_add(1, Ordering::Relaxed);
        self.acked = self.acked.max(seq);
        Ok(set)
    }

    /// Writes `set` on its own (the caller holds a commit slot), and hands
    /// it back for what follows the write.
    async fn commit(&mut self, set: CommitSet) -> Result<CommitSet, Status> {
        let store = self.c.store.clone();
        let tenant = self.tenant.clone();
        let seq = set.seq;
        let started = Stopwatch::start();
        let set = tokio::task::spawn_blocking(move || store.commit(&tenant, &set).map(|()| set))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(CollectorError::from)?;
        let s = &self.c.stats;
        s.commit_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        s.batches_committed.fetch_add(1, Ordering::Relaxed);
        s.commit_writes.fetch_add(1, Ordering::Relaxed);
        self.acked = self.acked.max(seq);
        Ok(set)
    }

    /// Validates and commits one batch.
    async fn batch(&mut self, wire: WireBatch) -> Result<CollectorMessage, Status> {
        let arrived = Stopwatch::start();
        self.reauthorize()?;
        let seq = wire.batch.seq;
        let size = wire.len;
        if seq == 0 {
            return Ok(self.reject(
                0,
                Code::InvalidArgument,
                "malformed_batch",
                "batch.seq must be positive".into(),
            ));
        }
        if seq <= self.acked {
            self.c.stats.batches_acked.fetch_add(1, Ordering::Relaxed);
            self.c
                .stats
                .batches_duplicate
                .fetch_add(1, Ordering::Relaxed);
            return msg(collector_message::Msg::Ack(v1::Ack {
                seq,
                duplicate: true,
                ..Default::default()
            }));
        }
        let now = self.c.clock.now_ms();
        if let Some((t, until, why)) = self.throttled {
            if seq > t {
                return Ok(self.throttle(seq, (until - now).max(1) as u64, now, why));
            }
        }
        if size > self.c.settings.max_batch_bytes as usize {
            self.consume(seq).await?;
            return Ok(self.reject(
                seq,
                Code::ResourceExhausted,
                "batch_too_large",
                format!(
                    "batch of {size} bytes exceeds the limit of {} bytes; split it",
                    self.c.settings.max_batch_bytes
                ),
            ));
        }
        if (!wire.batch.agent_id.is_empty() && wire.batch.agent_id != self.agent.agent_id)
            || (!wire.batch.boot_id.is_empty() && wire.batch.boot_id != self.agent.boot_id)
        {
            self.consume(seq).await?;
            return Ok(self.reject(
                seq,
                Code::PermissionDenied,
                "identity_mismatch",
                "batch agent_id/boot_id differ from the stream's Hello".into(),
            ));
        }
        let samples = wire.samples;
        if let Err(RetryAfter(ms)) = self.c.limits.admit(&self.tenant, samples as u64, now) {
            return Ok(self.throttle(seq, ms, now, Defer::Rate));
        }
        if self.throttled.is_some_and(|(t, _, _)| t == seq) {
            self.throttled = None;
        }
        // Storage behind by more than SLOT_WAIT (the batch at the front of
        // the tenant's line has waited that long, crate::group): the agent
        // holds this batch and sends it again later, before any work is
        // spent on it.
        if self.c.lines.waited(&self.tenant) > SLOT_WAIT {
            let jitter = u64::from(arrived.elapsed().subsec_nanos()) % BUSY_RETRY_MS;
            return Ok(self.throttle(seq, BUSY_RETRY_MS + jitter, now, Defer::Busy));
        }
        let mut batch = match wire.malformed {
            None => wire.batch,
            Some(e) => {
                self.consume(seq).await?;
                return Ok(self.reject(
                    seq,
                    Code::InvalidArgument,
                    "malformed_batch",
                    e.to_string(),
                ));
            }
        };
        let rules = Rules {
            now_ms: now,
            max_future_ms: self.c.settings.max_future_ms,
            oldest_ms: self.c.store.cutoff(&self.tenant, now),
            gpus: &self.gpus,
            devices: &self.devices,
        };
        let mut rejected = validate(&mut batch, &rules);
        let over = self
            .c
            .limits
            .series(&self.tenant, &mut batch, now, &mut self.series_seen);
        if over > 0 {
            *rejected.entry(Reason::SeriesLimit).or_default() += over;
        }
        for (r, n) in &rejected {
            self.c.stats.reject(&self.tenant, *r, *n);
        }
        let accepted = batch.sample_count() as u64;
        let (mut set, batch_ofu) = self.commit_set(&batch, now);
        set.series = std::mem::take(&mut batch.series);
        // Another collector may hold this batch: limbo until the cluster
        // settles it (crate::cluster).
        let limbo = batch.uncertain && self.c.settings.cluster.limbo();
        set.limbo = limbo.then_some(now);
        let ofu_n: usize = set.ofu.iter().map(|(_, _, s)| s.len()).sum();
        // Remote write's points of this batch, journaled with it.
        if let Some(q) = &self.c.remote {
            let view = self.batch_view(&set.series, &batch, &batch_ofu);
            let gpus = crate::live::batch_gpus(&view, now, |m| q.forwards(m));
            (set.forward, set.forward_open) = q.forward(&gpus, &set);
        }
        let set = self.commit_in_line(set).await?;
        if let Some(q) = &self.c.remote {
            q.committed(&set.forward);
        }
        if limbo {
            self.c.cluster.committed();
            // Rare (only after a collector failed): worth a line each.
            info!(seq, "uncertain batch committed into limbo");
        }
        self.c.remember_gpus(&self.tenant, &set.gpus);
        for e in &set.events {
            match e.kind.as_str() {
                "regression" | "straggler" => {
                    warn!(kind = %e.kind, job = %e.job_id, gpu = %e.gpu_uuid, "{}", e.detail)
                }
                _ => info!(kind = %e.kind, gpu = %e.gpu_uuid, code = e.value, "agent event"),
            }
            if e.kind == "xid" {
                self.c.stats.xid(&self.tenant, &e.gpu_uuid, e.value as i64);
            }
        }
        self.record_live(&set.series, &batch, &batch_ofu, now);
        self.record_ledger(&set);
        let s = &self.c.stats;
        s.samples_accepted.fetch_add(accepted, Ordering::Relaxed);
        s.ofu_samples.fetch_add(ofu_n as u64, Ordering::Relaxed);
        s.batches_acked.fetch_add(1, Ordering::Relaxed);
        s.ack_latency.observe(arrived.elapsed().as_secs_f64());
        msg(collector_message::Msg::Ack(v1::Ack {
            seq,
            accepted_samples: accepted,
            rejected: rejected
                .into_iter()
                .map(|(r, n)| v1::RejectCount {
                    reason: r.name().to_string(),
                    samples: n,
                })
                .collect(),
            duplicate: false,
        }))
    }

    /// What a batch tells about its node, for the live view and remote
    /// write.
    fn batch_view<'a>(
        &'a self,
        series: &'a [SeriesBatch],
        batch: &'a Batch,
        batch_ofu: &'a HashMap<String, BatchOfu>,
    ) -> BatchView<'a> {
        BatchView {
            tenant: &self.tenant,
            agent_id: &self.agent.agent_id,
            node_id: &self.hello.node.node_id,
            hostname: &self.hello.node.hostname,
            gpus: self
                .hello
                .gpus
                .iter()
                .map(|g| (g.uuid.as_str(), g.index, g.model.as_str()))
                .collect(),
            devices: &self.hello.devices,
            jobs: &self.jobs,
            shared: &self.shared,
            ofu: batch_ofu,
            series,
            intervals: &batch.intervals,
            pending: (batch.pending_bytes, batch.pending_batches),
            sent_at_ms: batch.sent_at_ms,
        }
    }

    /// Adds a committed batch to the ledger's counters on `/metrics`.
    fn record_ledger(&self, set: &CommitSet) {
        let energy = |gpu: &str| {
            set.series
                .iter()
                .find(|s| s.gpu_uuid == gpu && s.metric == m::ENERGY_J)
                .map_or(&[][..], |s| &s.points[..])
        };
        let mut gpus: Vec<(&str, Option<&str>, &[crate::store::OfuSample])> = set
            .ofu
            .iter()
            .map(|(g, j, s)| (g.as_str(), j.as_deref(), &s[..]))
            .collect();
        for s in &set.series {
            if s.metric == m::ENERGY_J && !gpus.iter().any(|g| g.0 == s.gpu_uuid) {
                let job = self.jobs.get(&s.gpu_uuid).map(|j| j.job_id.as_str());
                gpus.push((&s.gpu_uuid, job.filter(|j| !j.is_empty()), &[]));
            }
        }
        let mut parts = Vec::with_capacity(gpus.len());
        for (gpu, job, samples) in gpus {
            // A job's share of a shared GPU: that GPU's peak and the job's
            // namespace there.
            let card = flopwatch_proto::model::shared_gpu(gpu);
            let namespace = match card {
                Some(card) => self
                    .shared
                    .get(card)
                    .and_then(|v| v.iter().find(|j| Some(j.job_id.as_str()) == job))
                    .map_or("", |j| j.namespace.as_str()),
                None => self.jobs.get(gpu).map_or("", |j| j.namespace.as_str()),
            };
            let peak = self
                .c
                .gpu(&self.tenant, card.unwrap_or(gpu))
                .map_or(0.0, |g| self.c.peak_tflops(&g));
            parts.push(crate::ledger::Observed {
                tenant: &self.tenant,
                gpu,
                job: job.map(|j| (j, namespace)),
                peak_tflops: peak,
                samples,
                energy: energy(gpu),
            });
        }
        self.c.ledger.observe(&parts);
    }

    /// Updates the live view after a commit.
    fn record_live(
        &self,
        series: &[SeriesBatch],
        batch: &Batch,
        batch_ofu: &HashMap<String, BatchOfu>,
        now: i64,
    ) {
        self.c
            .live
            .record(&self.batch_view(series, batch, batch_ofu), now);
    }

    /// The batch's MFU reports, checked against the spec of a GPU of this
    /// node that runs the job (any GPU of the node otherwise), into the
    /// analyzer's MFU cross-check ([`crate::mfu`]). A bad report is logged
    /// and skipped; it costs the batch nothing else.
    fn mfu_reports(&self, batch: &Batch, set: &mut CommitSet) {
        for r in &batch.mfu_reports {
            let on_job = self
                .gpus
                .iter()
                .find(|g| self.jobs.get(*g).is_some_and(|j| j.job_id == r.job_id));
            let record = on_job
                .or_else(|| self.gpus.iter().min())
                .and_then(|g| self.c.gpu(&self.tenant, g));
            let spec = record.as_ref().and_then(|g| self.c.spec(g));
            match crate::mfu::reported_mfu(r, spec) {
                Ok(mfu) => set.events.extend(self.c.events.report_mfu(
                    &self.tenant,
                    &r.job_id,
                    r.start_ms,
                    r.ts_ms,
                    mfu,
                )),
                Err(e) => {
                    tracing::warn!(agent = %self.agent.agent_id, error = %e, "MFU report skipped")
                }
            }
        }
    }

    /// A shared GPU's OFU `samples`, divided between its jobs: each job's
    /// share series ([`share_key`](flopwatch_proto::model::share_key))
    /// holds OFU × its share (so the jobs' OFU sums to the GPU's), with
    /// the job's record on it, so that the job's queries and ledger find
    /// it. The GPU's own series keeps the whole OFU and no job.
    fn apportion(&self, gpu: &str, samples: &[OfuSample], last_ts: i64, set: &mut CommitSet) {
        let Some(jobs) = self.shared.get(gpu) else {
            return;
        };
        for j in jobs.iter().filter(|j| !j.job_id.is_empty()) {
            let share = f64::from(j.share_ppm.min(1_000_000)) / 1e6;
            let key = flopwatch_proto::model::share_key(gpu, &j.job_id);
            let part: Vec<OfuSample> = samples
                .iter()
                .map(|x| OfuSample {
                    ofu: x.ofu * share,
                    tensor_active: x.tensor_active * share,
                    ..*x
                })
                .collect();
            set.jobs.push(JobRecord {
                job_id: j.job_id.clone(),
                gpu_uuid: key.clone(),
                node_id: self.hello.node.node_id.clone(),
                pod: j.pod.clone(),
                namespace: j.namespace.clone(),
                container: j.container.clone(),
                hpc_job: j.hpc_job.clone(),
                first_seen_ms: if j.since_ms > 0 { j.since_ms } else { last_ts },
                last_seen_ms: last_ts,
            });
            set.ofu.push((key, Some(j.job_id.clone()), part));
        }
    }

    /// Samples, OFU, job attribution, events and metadata of a validated
    /// batch, and each GPU's OFU over the batch.
    fn commit_set(&mut self, batch: &Batch, now: i64) -> (CommitSet, HashMap<String, BatchOfu>) {
        let mut set = CommitSet {
            agent: Some(self.agent.clone()),
            seq: batch.seq,
            ..Default::default()
        };
        let last_ts = batch
            .series
            .iter()
            .flat_map(|s| s.points.last())
            .map(|p| p.ts_ms)
            .max()
            .unwrap_or(now);
        // Job attribution: a batch carries the node's whole attribution as
        // of its last capture, so it replaces the last one: a GPU the batch
        // names no job for runs none (its job ended), from this batch on.
        // A GPU with several jobs (shares) has no one job: its OFU is
        // divided between them below.
        let (now_jobs, now_shared) = split_jobs(&batch.jobs);
        let changed: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| self.jobs.get(*g) != now_jobs.get(*g))
            .cloned()
            .collect();
        self.jobs = now_jobs;
        self.shared = now_shared;
        let mut batch_ofu = HashMap::new();
        let mut by_gpu: HashMap<&str, OfuInputs<'_>> = HashMap::new();
        for s in &batch.series {
            let e = by_gpu.entry(s.gpu_uuid.as_str()).or_default();
            match s.metric.as_str() {
                m::TENSOR_ACTIVE => e.0 = Some(&s.points[..]),
                m::SM_CLOCK_AVG_MHZ => e.1 = Some(&s.points[..]),
                m::SM_CLOCK_MHZ => e.2 = Some(&s.points[..]),
                _ => {}
            }
        }
        for (gpu, (tpa, avg, point)) in by_gpu {
            let Some(record) = self.c.gpu(&self.tenant, gpu) else {
                continue;
            };
            let job = self
                .jobs
                .get(gpu)
                .map(|j| j.job_id.clone())
                .filter(|j| !j.is_empty());
            let (Some(tpa), Some(fmax)) = (tpa, self.c.tensor_clock_mhz(&record)) else {
                continue;
            };
            // Prefer the window-averaged clock (OFU §IV-C); fall back to the
            // point reading taken at the same capture.
            let clocks: HashMap<i64, f64> = avg
                .or(point)
                .map(|c| c.iter().map(|p| (p.ts_ms, p.value)).collect())
                .unwrap_or_default();
            let clock = if avg.is_some() {
                m::SM_CLOCK_AVG_MHZ
            } else {
                m::SM_CLOCK_MHZ
            };
            let samples: Vec<OfuSample> = tpa
                .iter()
                .filter_map(|p| {
                    let clk = *clocks.get(&p.ts_ms)?;
                    Some(OfuSample {
                        ts_ms: p.ts_ms,
                        ofu: ofu(p.value, clk, fmax),
                        tensor_active: p.value,
                        sm_clock_mhz: clk,
                        window_ms: p.window_ms.unwrap_or(0),
                    })
                })
                .collect();
            let mut mean = Mean::default();
            for x in &samples {
                mean.add(x.ofu, x.tensor_active, x.sm_clock_mhz, x.window_ms);
            }
            if let (Some(o), Some(last)) = (mean.mean(), samples.iter().map(|x| x.ts_ms).max()) {
                batch_ofu.insert(
                    gpu.to_string(),
                    BatchOfu {
                        ofu: o,
                        tensor_active: mean.tensor_active(),
                        sm_clock_mhz: mean.sm_clock_mhz(),
                        ts_ms: last,
                    },
                );
            }
            if let Some(j) = &job {
                set.events.extend(self.c.events.observe(
                    &self.tenant,
                    &self.hello.node.node_id,
                    j,
                    gpu,
                    &samples,
                ));
            }
            self.apportion(gpu, &samples, last_ts, &mut set);
            // How OFU was derived, kept with the samples for compaction.
            if let Some(d) = Derivation::new(fmax, clock) {
                set.derivations.insert(gpu.to_string(), d);
            }
            set.ofu.push((gpu.to_string(), job, samples));
        }
        self.mfu_reports(batch, &mut set);
        for e in &batch.events {
            set.events.push(EventRecord {
                kind: e.kind.clone(),
                ts_ms: e.ts_ms,
                job_id: self
                    .jobs
                    .get(&e.gpu_uuid)
                    .map(|j| j.job_id.clone())
                    .unwrap_or_default(),
                gpu_uuid: e.gpu_uuid.clone(),
                node_id: self.hello.node.node_id.clone(),
                value: e.code as f64,
                baseline: 0.0,
                detail: e.detail.clone(),
            });
        }
        for uuid in &self.gpus {
            let Some(mut g) = self.c.gpu(&self.tenant, uuid) else {
                continue;
            };
            let job = self.jobs.get(uuid);
            let new_job = job.map(|j| j.job_id.clone()).filter(|j| !j.is_empty());
            let shares: Vec<(String, u32, String)> = self
                .shared
                .get(uuid)
                .into_iter()
                .flatten()
                .map(|j| (j.job_id.clone(), j.share_ppm, j.split.clone()))
                .collect();
            if job.is_some()
                || changed.contains(uuid)
                || g.job_id != new_job
                || g.shares != shares
                || now - g.last_seen_ms > 60_000
            {
                g.job_id = new_job;
                g.shares = shares;
                g.last_seen_ms = now;
                set.gpus.push(g);
            }
            if let Some(j) = job.filter(|j| !j.job_id.is_empty()) {
                set.jobs.push(JobRecord {
                    job_id: j.job_id.clone(),
                    gpu_uuid: uuid.clone(),
                    node_id: self.hello.node.node_id.clone(),
                    pod: j.pod.clone(),
                    namespace: j.namespace.clone(),
                    container: j.container.clone(),
                    hpc_job: j.hpc_job.clone(),
                    first_seen_ms: if j.since_ms > 0 { j.since_ms } else { last_ts },
                    last_seen_ms: last_ts,
                });
            }
        }
        set.nodes.push(NodeRecord {
            node_id: self.hello.node.node_id.clone(),
            hostname: self.hello.node.hostname.clone(),
            boot_id: self.hello.node.boot_id.clone(),
            agent_id: self.hello.agent_id.clone(),
            gpus: self.hello.gpus.iter().filter(|g| !g.mig.is_card()).count() as u32,
            last_seen_ms: now,
            labels: self.hello.node.labels.clone(),
            devices: crate::store::DeviceRecord::from_hello(&self.hello.devices),
            owner: self.identity.principal.clone(),
        });
        (set, batch_ofu)
    }
}

/// A batch's attribution: each GPU's one job, and the jobs of each GPU
/// several share (their shares made to sum to at most 10⁶ ppm: an agent's
/// rounding or garbage never gives a GPU more than its OFU).
#[allow(clippy::type_complexity)]
fn split_jobs(
    jobs: &[flopwatch_proto::model::JobAssignment],
) -> (
    HashMap<String, v1::JobAssignment>,
    HashMap<String, Vec<v1::JobAssignment>>,
) {
    let mut one = HashMap::new();
    let mut shared: HashMap<String, Vec<v1::JobAssignment>> = HashMap::new();
    for j in jobs {
        let w: v1::JobAssignment = j.clone().into();
        if j.share.is_some() {
            shared.entry(j.gpu_uuid.clone()).or_default().push(w);
        } else {
            one.insert(j.gpu_uuid.clone(), w);
        }
    }
    for (gpu, v) in &mut shared {
        one.remove(gpu);
        v.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        v.dedup_by(|a, b| a.job_id == b.job_id);
        let sum: u64 = v.iter().map(|j| u64::from(j.share_ppm)).sum();
        if sum > 1_000_000 {
            for j in v.iter_mut() {
                j.share_ppm = (u64::from(j.share_ppm) * 1_000_000 / sum) as u32;
            }
        }
    }
    (one, shared)
}
