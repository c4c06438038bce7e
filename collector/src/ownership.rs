//! Node ownership: an agent credential writes only for the nodes it may
//! register (docs/SECURITY.md, "Isolation").
//!
//! Two rules, checked when a stream's Hello arrives:
//! * **static**: the credential's node rule — a certificate name matched by
//!   a `{node}` pattern allows exactly that node (as Kubernetes binds a
//!   kubelet to its Node by `system:node:<name>`); an agent token's `nodes`
//!   patterns allow the node ids they match;
//! * **first registration**: a node id, and the GPUs listed under it, belong
//!   to the principal that registered them first in the tenant; another
//!   principal claiming them is refused with PERMISSION_DENIED. Tokens
//!   sharing a `name` share a principal, so a rotated token keeps its nodes.
//!
//! The ingest service holds the locks of the Hello's node and GPUs over
//! this check and the write that records the owner
//! ([`Collector::claim`]), so two agents racing for a new node or GPU
//! cannot both win it.

use crate::auth::{AgentIdentity, AuthError};
use crate::state::Collector;
use crate::CollectorError;
use flopwatch_proto::model::Hello;

/// Checks that `id` may register `hello`'s node and GPUs.
pub(crate) async fn check(
    c: &Collector,
    id: &AgentIdentity,
    hello: &Hello,
) -> Result<(), CollectorError> {
    let node_id = &hello.node.node_id;
    if !id.nodes.allows(node_id) {
        return Err(AuthError::Denied.into());
    }
    let store = c.store.clone();
    let tenant = id.tenant.clone();
    let node = node_id.clone();
    // GPUs of this Hello already known under another node of the tenant.
    let moved: Vec<String> = hello
        .gpus
        .iter()
        .filter_map(|g| c.gpu(&id.tenant, &g.uuid))
        .filter(|r| &r.node_id != node_id)
        .map(|r| r.node_id)
        .collect();
    let owners = tokio::task::spawn_blocking(move || {
        let mut owners = Vec::new();
        for n in std::iter::once(node).chain(moved) {
            if let Some(r) = store.node(&tenant, &n)? {
                owners.push(r.owner);
            }
        }
        Ok::<_, crate::store::StoreError>(owners)
    })
    .await
    .map_err(|e| CollectorError::Setup(e.to_string()))??;
    if owners.iter().any(|o| !o.is_empty() && *o != id.principal) {
        return Err(AuthError::Denied.into());
    }
    Ok(())
}
