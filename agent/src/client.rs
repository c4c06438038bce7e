//! The agent's side of the Ingest stream: connect, Hello, Welcome, send
//! batches from the [`Outbox`], apply Acks and Rejects, reconnect with
//! backoff with full jitter ([`crate::backoff`]) on any failure.
//!
//! Collectors are tried in the node's rendezvous order
//! ([`crate::placement`]): the home collector first, then the next when a
//! stream fails, when a connection cannot be made, or when batches on the
//! wire get no acknowledgement in time ([`crate::deadline`]). While away from home
//! the client checks home every [`HOME_PROBE`] (a gRPC health check) and
//! goes back once it answers, after the batches on the wire are acknowledged (so a batch is
//! not sent to two collectors when it can be helped).

use crate::deadline::AckDeadline;
use crate::outbox::Outbox;
use crate::wire::{self, Outgoing};
use flopwatch_proto::model::{Hello, Policy};
use flopwatch_proto::v1::{self, collector_message};
use flopwatch_transport::TlsClient;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

/// Unacknowledged batches allowed on the wire.
pub const WINDOW: usize = 8;
/// Batches on the wire with no answer for this long (more while the
/// collector has been answering slowly, [`crate::deadline`]): the collector
/// is treated as dead and the next one is tried.
pub use crate::deadline::ACK_TIMEOUT;
/// How often a client away from its home collector checks whether home is
/// back.
pub const HOME_PROBE: Duration = Duration::from_secs(2);
/// Longest the session loop sleeps with nothing due.
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// HTTP/2 keepalive: a silent connection is declared dead after about
/// interval + timeout.
const KEEPALIVE: Duration = Duration::from_secs(2);

/// How the client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Collector URLs (their order is decided by rendezvous hashing of the
    /// node id).
    pub collectors: Vec<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// TLS for `https://` collectors.
    pub tls: flopwatch_transport::TlsClient,
    /// The Hello to open each stream with.
    pub hello: Hello,
    /// A newer Hello, when the node's GPU list changes (a MIG instance
    /// created): the stream ends and opens again with it, before any
    /// batch that names the new GPUs is sent.
    pub hello_updates: Option<watch::Receiver<Hello>>,
    /// How long a shutdown waits for outstanding acks.
    pub drain_timeout: Duration,
    /// Most batches put on the wire per second (a spool backlog drains at
    /// this rate); `None`: no limit beyond the window.
    pub max_batches_per_second: Option<u32>,
}

/// What the client learned from collectors.
#[derive(Debug, Clone, Default)]
pub struct ClientState {
    /// Collector currently connected, if any.
    pub connected_to: Option<String>,
    /// Tenant the credentials map to.
    pub tenant: String,
    /// Last policy received.
    pub policy: Option<Policy>,
    /// Streams opened (the first included).
    pub connections: u64,
    /// Times the client moved to another collector than its home.
    pub failovers: u64,
    /// Largest batch the collector accepts, bytes (0 before a Welcome).
    pub max_batch_bytes: u32,
    /// Batches refused for the tenant's ingest rate and sent again later.
    pub throttled: u64,
}

enum End {
    Shutdown,
    /// The stream failed; `welcomed` tells whether it got as far as a
    /// Welcome.
    Failed {
        why: String,
        welcomed: bool,
    },
    /// Home answers again.
    Home,
    /// The Hello changed: open the stream again with it.
    Relist,
}

/// Runs until the outbox is closed and drained, or, once it is closed,
/// until the drain timeout passes.
pub async fn run(opts: ClientOptions, outbox: Arc<Outbox>, state: watch::Sender<ClientState>) {
    let order = crate::placement::order(&opts.hello.node.node_id, &opts.collectors);
    if order.is_empty() {
        warn!("no collector configured; nothing is sent");
        return;
    }
    info!(home = %opts.collectors[order[0]], "home collector (rendezvous hashing)");
    let mut backoff = crate::backoff::Backoff::new(
        Duration::from_millis(100),
        Duration::from_secs(5),
        crate::backoff::seed_for(&opts.hello.node.node_id),
    );
    let mut i = 0usize;
    let mut failed_in_row = 0usize;
    let mut deadline: Option<Instant> = None;
    let mut ack = AckDeadline::new();
    loop {
        if outbox.is_closed() {
            if outbox.is_empty() {
                return;
            }
            let d = *deadline.get_or_insert_with(|| Instant::now() + opts.drain_timeout);
            if Instant::now() >= d {
                warn!(
                    batches = outbox.len(),
                    "shutdown: unacknowledged batches left (kept in the spool if there is one)"
                );
                return;
            }
        }
        let pos = i % order.len();
        let url = &opts.collectors[order[pos]];
        let home = (pos != 0).then(|| opts.collectors[order[0]].as_str());
        match session(&opts, url, home, &outbox, &state, &mut deadline, &mut ack).await {
            End::Shutdown => return,
            End::Relist => {
                state.send_modify(|s| s.connected_to = None);
                info!(collector = %url, "GPU list changed; opening the stream again with it");
                continue;
            }
            End::Home => {
                state.send_modify(|s| s.connected_to = None);
                info!(collector = %opts.collectors[order[0]], "home collector is back");
                i = 0;
                failed_in_row = 0;
                backoff.reset();
                continue;
            }
            End::Failed { why, welcomed } => {
                state.send_modify(|s| s.connected_to = None);
                if welcomed {
                    warn!(collector = %url, %why, "stream ended; trying the next collector");
                    failed_in_row = 0;
                    backoff.reset();
                } else {
                    debug!(collector = %url, %why, "cannot stream");
                    failed_in_row += 1;
                }
            }
        }
        i += 1;
        if failed_in_row >= order.len() {
            // Every collector refused: wait (jittered, so that a fleet
            // does not come back all at once), then start again from home.
            failed_in_row = 0;
            i = 0;
            tokio::time::sleep(backoff.next_wait()).await;
        }
    }
}

async fn connect(tls: &TlsClient, url: &str) -> Result<Channel, String> {
    tls.client_endpoint(url)
        .map_err(|e| e.to_string())?
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (`status` 1 is SERVING).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// Whether the collector at `url` answers its gRPC health check for the
/// Ingest service within a second (an open port alone is not enough: a
/// stalled process still completes TCP handshakes).
async fn answers(tls: &TlsClient, url: &str) -> bool {
    let probe = async {
        let channel = connect(tls, url).await.ok()?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.ok()?;
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        let reply = grpc
            .unary(
                tonic::Request::new(HealthCheckRequest {
                    service: "flopwatch.v1.Ingest".to_string(),
                }),
                path,
                codec,
            )
            .await
            .ok()?;
        Some(reply.into_inner().status == 1)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Some(true))
    )
}

fn failed(why: impl Into<String>) -> End {
    End::Failed {
        why: why.into(),
        welcomed: false,
    }
}

async fn session(
    opts: &ClientOptions,
    url: &str,
    home: Option<&str>,
    outbox: &Outbox,
    state: &watch::Sender<ClientState>,
    drain_deadline: &mut Option<Instant>,
    ack: &mut AckDeadline,
) -> End {
    let channel = match connect(&opts.tls, url).await {
        Ok(c) => c,
        Err(e) => return failed(format!("connect: {e}")),
    };
    let (tx, rx) = mpsc::channel::<Outgoing>(WINDOW + 2);
    let mut updates = opts.hello_updates.clone();
    let hello: v1::Hello = match updates.as_mut() {
        Some(u) => u.borrow_and_update().clone().into(),
        None => opts.hello.clone().into(),
    };
    let relisted = |u: &Option<watch::Receiver<Hello>>| {
        u.as_ref().is_some_and(|u| u.has_changed().unwrap_or(false))
    };
    if tx.send(Outgoing::Hello(Box::new(hello))).await.is_err() {
        return failed("stream closed");
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = &opts.token {
        match MetadataValue::try_from(format!("Bearer {t}")) {
            Ok(v) => {
                request.metadata_mut().insert("authorization", v);
            }
            Err(_) => return failed("token is not valid header text"),
        }
    }
    let mut inbound = match wire::open(channel, request, 16 << 20).await {
        Ok(r) => r,
        Err(s) => return failed(format!("{}: {}", s.code(), s.message())),
    };
    let welcome = match tokio::time::timeout(ack.current(), inbound.message()).await {
        Ok(Ok(Some(v1::CollectorMessage {
            msg: Some(collector_message::Msg::Welcome(w)),
        }))) => w,
        Ok(Ok(_)) => return failed("collector did not send a Welcome"),
        Ok(Err(s)) => return failed(format!("{}: {}", s.code(), s.message())),
        Err(_) => return failed("no Welcome in time"),
    };
    info!(collector = %url, id = %welcome.collector_id, acked = welcome.acked_seq, tenant = %welcome.tenant, "connected");
    outbox.welcome(welcome.acked_seq);
    state.send_modify(|s| {
        s.connected_to = Some(url.to_string());
        s.tenant = welcome.tenant.clone();
        s.policy = welcome.policy.clone().map(Into::into);
        s.max_batch_bytes = welcome.max_batch_bytes;
        s.connections += 1;
        if home.is_some() {
            s.failovers += 1;
        }
    });
    let end = |why: &str| End::Failed {
        why: why.to_string(),
        welcomed: true,
    };
    // Sending budget (token bucket, refilled at the rate limit).
    let rate = opts.max_batches_per_second.map(|r| f64::from(r.max(1)));
    let mut tokens = WINDOW as f64;
    let mut refilled = Instant::now();
    let mut last_answer = Instant::now();
    let mut next_probe = Instant::now() + HOME_PROBE;
    let mut going_home: Option<Instant> = None;
    // Set by a rate-limit refusal: nothing is sent before this.
    let mut hold_until: Option<Instant> = None;
    loop {
        if outbox.is_closed() {
            if outbox.is_empty() {
                return End::Shutdown;
            }
            let d = *drain_deadline.get_or_insert_with(|| Instant::now() + opts.drain_timeout);
            if Instant::now() >= d {
                warn!(
                    batches = outbox.len(),
                    "shutdown: unacknowledged batches left (kept in the spool if there is one)"
                );
                return End::Shutdown;
            }
        }
        let in_flight = outbox.in_flight();
        if let Some(since) = going_home {
            if in_flight == 0 || since.elapsed() > ACK_TIMEOUT {
                return End::Home;
            }
        }
        if in_flight == 0 {
            last_answer = Instant::now();
        } else if last_answer.elapsed() > ack.current() {
            return end("no acknowledgement in time");
        }
        if let Some(r) = rate {
            let now = Instant::now();
            tokens = (tokens + now.duration_since(refilled).as_secs_f64() * r).min(WINDOW as f64);
            refilled = now;
        }
        if hold_until.is_some_and(|t| Instant::now() >= t) {
            hold_until = None;
        }
        let budget = if going_home.is_some() || hold_until.is_some() {
            0
        } else if rate.is_some() {
            (tokens as usize).min(WINDOW)
        } else {
            WINDOW
        };
        if budget > 0 {
            let room = WINDOW.saturating_sub(in_flight).min(budget);
            let batches = if room > 0 {
                outbox.next_to_send(in_flight + room)
            } else {
                Vec::new()
            };
            // Checked after taking the batches: one cut after the change
            // may name a new GPU, and goes out after the new Hello (the
            // Welcome puts taken batches back).
            if relisted(&updates) {
                return End::Relist;
            }
            tokens -= batches.len() as f64;
            for b in batches {
                if tx.send(Outgoing::Batch(b)).await.is_err() {
                    return end("send failed");
                }
            }
        }
        if let Some(h) = home {
            if going_home.is_none() && Instant::now() >= next_probe {
                next_probe = Instant::now() + HOME_PROBE;
                if answers(&opts.tls, h).await {
                    going_home = Some(Instant::now());
                    continue;
                }
            }
        }
        // What the loop checks by itself (the drain deadline, the rate
        // limit, a deferral's end, the ack timeout, the home probe) wakes it
        // when due, and nothing else does: a fixed 200 ms tick woke an idle
        // agent five times a second. IDLE_WAKE bounds the wait all the same.
        let now = Instant::now();
        let mut wake = now + IDLE_WAKE;
        if in_flight > 0 {
            wake = wake.min(last_answer + ack.current());
        }
        for t in [
            *drain_deadline,
            hold_until,
            going_home.map(|t| t + ACK_TIMEOUT),
        ]
        .into_iter()
        .flatten()
        {
            wake = wake.min(t);
        }
        if home.is_some() && going_home.is_none() {
            wake = wake.min(next_probe);
        }
        if let Some(r) = rate.filter(|_| tokens < 1.0) {
            wake = wake.min(now + Duration::from_secs_f64((1.0 - tokens) / r));
        }
        tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(v1::CollectorMessage { msg: Some(m) })) => {
                    if outbox.in_flight() > 0 {
                        ack.answered_after(last_answer.elapsed());
                    }
                    last_answer = Instant::now();
                    match m {
                        collector_message::Msg::Ack(a) => outbox.ack(a.seq),
                        collector_message::Msg::Reject(r) if r.retry_after_ms > 0 => {
                            // Not consumed: this batch and the ones after it
                            // go again once the delay has passed.
                            debug!(seq = r.seq, retry_after_ms = r.retry_after_ms, reason = %r.reason, "batch deferred by the collector");
                            outbox.requeue_from(r.seq);
                            let until = Instant::now()
                                + Duration::from_millis(r.retry_after_ms.min(60_000));
                            hold_until = Some(hold_until.map_or(until, |h| h.max(until)));
                            state.send_modify(|s| s.throttled += 1);
                        }
                        collector_message::Msg::Reject(r) => {
                            warn!(seq = r.seq, code = r.code, reason = %r.reason, message = %r.message, "batch rejected");
                            outbox.reject(r.seq);
                        }
                        collector_message::Msg::Policy(p) => {
                            state.send_modify(|s| s.policy = Some(p.into()));
                        }
                        collector_message::Msg::Welcome(_) => {}
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return end("collector closed the stream"),
                Err(s) => return end(&format!("{}: {}", s.code(), s.message())),
            },
            _ = outbox.notified() => {}
            _ = changed(&mut updates) => return End::Relist,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Resolves when a newer Hello is published; never without updates, or
/// once their sender is gone.
async fn changed(updates: &mut Option<watch::Receiver<Hello>>) {
    let open = match updates {
        Some(u) => u.changed().await.is_ok(),
        None => false,
    };
    if !open {
        std::future::pending::<()>().await;
    }
}
