//! The `Cluster/Held` service, and peers as the reconciler asks them.

use crate::auth::{AuthError, Credentials, Scope};
use crate::state::Collector;
use crate::store::{AgentKey, StoreError};
use crate::CollectorError;
use flopwatch_proto::cluster::{BatchRef, Holding, MAX_HELD_BATCHES};
use flopwatch_proto::v1::{self, cluster_client::ClusterClient, cluster_server};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// How long a peer gets to answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// `flopwatch.v1.Cluster`: answers peers' questions from this store.
#[derive(Clone)]
pub(crate) struct ClusterService {
    c: Arc<Collector>,
    store_id: u64,
}

impl ClusterService {
    /// Serves `c`'s store, whose id is `store_id`.
    pub(crate) fn new(c: Arc<Collector>, store_id: u64) -> Self {
        Self { c, store_id }
    }

    /// As a tonic server.
    pub(crate) fn server(self) -> cluster_server::ClusterServer<Self> {
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
            .auth()
            .query(&Credentials::of(&request))
            .map_err(|e| {
                self.c.stats.auth_failure("cluster", &e);
                CollectorError::from(e)
            })?;
        if scope != Scope::All {
            self.c.stats.auth_failure("cluster", &AuthError::Denied);
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

pub(super) fn agent_key(r: &BatchRef) -> AgentKey {
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
pub(crate) trait Peer: Send + Sync {
    /// For logs.
    fn name(&self) -> &str;
    /// The peer's store id and, per batch (at most [`MAX_HELD_BATCHES`]),
    /// whether it holds it (`None`: no usable answer).
    async fn held(&self, refs: &[BatchRef]) -> Result<(u64, Vec<Option<Holding>>), String>;
}

/// A peer over gRPC, on the channel the query fan-out uses.
pub(crate) struct GrpcPeer {
    url: String,
    channel: Channel,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl GrpcPeer {
    /// Every peer of `settings`, `https://` ones through `tls`.
    pub(crate) fn all(
        settings: &super::ClusterSettings,
        tls: &flopwatch_transport::channel::TlsClient,
    ) -> Result<Vec<Box<dyn Peer>>, CollectorError> {
        let token = match &settings.peer_token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                CollectorError::Setup("cluster.peer_token_file: not valid header text".into())
            })?),
            None => None,
        };
        Ok(crate::fanout::peer_channels(&settings.peers, tls)?
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
