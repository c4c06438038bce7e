//! Domain types of the `Cluster` service (between the collectors of a
//! cluster) and their wire conversions.

use crate::convert::ConvertError;
use crate::v1;

/// One agent's batch, cluster-wide: its sequence number in
/// (tenant, agent id, boot id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchRef {
    /// Tenant (from the agent's credentials).
    pub tenant: String,
    /// Agent id.
    pub agent_id: String,
    /// Boot id.
    pub boot_id: String,
    /// Sequence number.
    pub seq: u64,
}

/// Whether a collector holds a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// Not stored there.
    Absent,
    /// Stored as a normal commit.
    Held,
    /// Stored in limbo, not yet settled.
    Limbo,
}

/// Most batches in one `Held` request.
pub const MAX_HELD_BATCHES: usize = 4096;

impl TryFrom<v1::BatchRef> for BatchRef {
    type Error = ConvertError;
    fn try_from(b: v1::BatchRef) -> Result<Self, ConvertError> {
        if b.seq == 0 {
            return Err(ConvertError::Missing("batch_ref.seq"));
        }
        if b.tenant.is_empty() {
            return Err(ConvertError::Missing("batch_ref.tenant"));
        }
        Ok(Self {
            tenant: b.tenant,
            agent_id: b.agent_id,
            boot_id: b.boot_id,
            seq: b.seq,
        })
    }
}

impl From<BatchRef> for v1::BatchRef {
    fn from(b: BatchRef) -> Self {
        Self {
            tenant: b.tenant,
            agent_id: b.agent_id,
            boot_id: b.boot_id,
            seq: b.seq,
        }
    }
}

impl From<Holding> for v1::Holding {
    fn from(h: Holding) -> Self {
        match h {
            Holding::Absent => v1::Holding::Absent,
            Holding::Held => v1::Holding::Held,
            Holding::Limbo => v1::Holding::Limbo,
        }
    }
}

impl Holding {
    /// From the wire; `None` for an unspecified or unknown value (treated
    /// as no answer, never as absent).
    pub fn from_wire(v: i32) -> Option<Self> {
        match v1::Holding::try_from(v).ok()? {
            v1::Holding::Absent => Some(Holding::Absent),
            v1::Holding::Held => Some(Holding::Held),
            v1::Holding::Limbo => Some(Holding::Limbo),
            v1::Holding::Unspecified => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_round_trip_and_unknown_values_are_no_answer() {
        for h in [Holding::Absent, Holding::Held, Holding::Limbo] {
            assert_eq!(Holding::from_wire(v1::Holding::from(h) as i32), Some(h));
        }
        assert_eq!(Holding::from_wire(0), None);
        assert_eq!(Holding::from_wire(99), None);
        let r = BatchRef {
            tenant: "t".into(),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq: 7,
        };
        assert_eq!(BatchRef::try_from(v1::BatchRef::from(r.clone())), Ok(r));
        assert!(BatchRef::try_from(v1::BatchRef::default()).is_err());
    }
}
