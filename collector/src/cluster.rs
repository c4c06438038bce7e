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

mod held;
mod reconcile;
pub(crate) mod settings;

pub(crate) use held::{ClusterService, GrpcPeer, Peer};
pub(crate) use reconcile::run;
#[cfg(test)]
use reconcile::{PassReport, Reconciler};
#[cfg(test)]
use settings::other_peers;
pub(crate) use settings::read_peer_token;
pub(crate) use settings::{ClusterSettings, ClusterStats};

use flopwatch_proto::cluster::Holding;

/// What to do with one batch in limbo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
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
pub(crate) fn decide(
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

#[cfg(test)]
mod tests;
