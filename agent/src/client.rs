//! The agent's side of the Ingest stream: connect, Hello, Welcome, send
//! batches from the [`Outbox`], apply Acks and Rejects, reconnect with
//! backoff on any failure, trying each configured collector in turn.

use crate::outbox::Outbox;
use flopwatch_proto::model::{Hello, Policy};
use flopwatch_proto::v1::{self, agent_message, collector_message, AgentMessage};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

/// Unacknowledged batches allowed on the wire.
pub const WINDOW: usize = 8;

/// How the client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Collector URLs, in preference order.
    pub collectors: Vec<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// The Hello to open each stream with.
    pub hello: Hello,
    /// How long a shutdown waits for outstanding acks.
    pub drain_timeout: Duration,
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
}

enum End {
    Shutdown,
    Failed(String),
}

/// Runs until the outbox is closed and drained, or, once it is closed,
/// until the drain timeout passes.
pub async fn run(opts: ClientOptions, outbox: Arc<Outbox>, state: watch::Sender<ClientState>) {
    let mut backoff = Duration::from_millis(100);
    let mut i = 0usize;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        if outbox.is_closed() {
            if outbox.is_empty() {
                return;
            }
            let d =
                *deadline.get_or_insert_with(|| tokio::time::Instant::now() + opts.drain_timeout);
            if tokio::time::Instant::now() >= d {
                warn!(
                    batches = outbox.len(),
                    "shutdown: unacknowledged batches left"
                );
                return;
            }
        }
        let url = &opts.collectors[i % opts.collectors.len()];
        match session(&opts, url, &outbox, &state, &mut deadline).await {
            End::Shutdown => return,
            End::Failed(why) => {
                state.send_modify(|s| s.connected_to = None);
                debug!(collector = %url, %why, "stream ended");
            }
        }
        i += 1;
        if i.is_multiple_of(opts.collectors.len()) {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

async fn connect(url: &str) -> Result<Channel, String> {
    Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())
}

async fn session(
    opts: &ClientOptions,
    url: &str,
    outbox: &Outbox,
    state: &watch::Sender<ClientState>,
    drain_deadline: &mut Option<tokio::time::Instant>,
) -> End {
    let channel = match connect(url).await {
        Ok(c) => c,
        Err(e) => return End::Failed(format!("connect: {e}")),
    };
    let mut client =
        v1::ingest_client::IngestClient::new(channel).max_decoding_message_size(16 << 20);
    let (tx, rx) = mpsc::channel::<AgentMessage>(WINDOW + 2);
    let hello: v1::Hello = opts.hello.clone().into();
    if tx
        .send(AgentMessage {
            msg: Some(agent_message::Msg::Hello(hello)),
        })
        .await
        .is_err()
    {
        return End::Failed("stream closed".into());
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = &opts.token {
        match MetadataValue::try_from(format!("Bearer {t}")) {
            Ok(v) => {
                request.metadata_mut().insert("authorization", v);
            }
            Err(_) => return End::Failed("token is not valid header text".into()),
        }
    }
    let mut inbound = match client.stream(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return End::Failed(format!("{}: {}", s.code(), s.message())),
    };
    let welcome = match inbound.message().await {
        Ok(Some(v1::CollectorMessage {
            msg: Some(collector_message::Msg::Welcome(w)),
        })) => w,
        Ok(_) => return End::Failed("collector did not send a Welcome".into()),
        Err(s) => return End::Failed(format!("{}: {}", s.code(), s.message())),
    };
    info!(collector = %url, id = %welcome.collector_id, acked = welcome.acked_seq, tenant = %welcome.tenant, "connected");
    outbox.welcome(welcome.acked_seq);
    state.send_modify(|s| {
        s.connected_to = Some(url.to_string());
        s.tenant = welcome.tenant.clone();
        s.policy = welcome.policy.clone().map(Into::into);
    });
    loop {
        if outbox.is_closed() {
            if outbox.is_empty() {
                return End::Shutdown;
            }
            let d = *drain_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + opts.drain_timeout);
            if tokio::time::Instant::now() >= d {
                warn!(
                    batches = outbox.len(),
                    "shutdown: unacknowledged batches left"
                );
                return End::Shutdown;
            }
        }
        for b in outbox.next_to_send(WINDOW) {
            if tx
                .send(AgentMessage {
                    msg: Some(agent_message::Msg::Batch(b)),
                })
                .await
                .is_err()
            {
                return End::Failed("send failed".into());
            }
        }
        tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(v1::CollectorMessage { msg: Some(m) })) => match m {
                    collector_message::Msg::Ack(a) => outbox.ack(a.seq),
                    collector_message::Msg::Reject(r) => {
                        warn!(seq = r.seq, code = r.code, reason = %r.reason, message = %r.message, "batch rejected");
                        outbox.reject(r.seq);
                    }
                    collector_message::Msg::Policy(p) => {
                        state.send_modify(|s| s.policy = Some(p.into()));
                    }
                    collector_message::Msg::Welcome(_) => {}
                },
                Ok(Some(_)) => {}
                Ok(None) => return End::Failed("collector closed the stream".into()),
                Err(s) => return End::Failed(format!("{}: {}", s.code(), s.message())),
            },
            _ = outbox.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)), if drain_deadline.is_some() => {}
        }
    }
}
