//! Which batches of an agent a collector holds: exact membership, not a
//! high-water mark.
//!
//! The acked number (`a` · tenant · agent · boot) says "everything up to
//! here is durable *somewhere*" and is what the Welcome reports. It does
//! not say what this collector stores: an agent that failed over and came
//! back home raises its home's number above batches only the other
//! collector got. The cluster's reconciler needs the exact answer, so each
//! normal commit also adds its sequence number to the agent's ranges of
//! held numbers (`m` · tenant · agent · boot), in the batch's own write.
//!
//! The record is read, extended and written under a lock striped by agent,
//! so concurrent commits of one agent (an old stream still finishing while
//! a new one starts) and the reconciler's promotions never lose an update.

use super::keys;
use super::records::AgentKey;
use super::{corrupt, Cf, Put, Store, StoreError};
use std::sync::{Mutex, MutexGuard};

/// Ranges kept per agent and boot. Each failover away and back adds one;
/// past the cap the oldest are forgotten. Forgetting can only make this
/// collector answer "absent" for a batch it holds, so a peer keeps its own
/// limbo copy: a copy too many, never a batch lost. Limbo batches are
/// settled within `cluster.limbo_timeout`, long before that.
const MAX_RANGES: usize = 4096;

/// Sorted, disjoint, non-adjacent inclusive ranges of sequence numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqRanges(Vec<(u64, u64)>);

impl SeqRanges {
    /// From the stored form: (first, last) pairs, u64 big-endian.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if !b.len().is_multiple_of(16) {
            return None;
        }
        let u = |c: &[u8]| u64::from_be_bytes(c.try_into().unwrap_or([0; 8]));
        let v: Vec<(u64, u64)> = b
            .chunks_exact(16)
            .map(|c| (u(&c[..8]), u(&c[8..])))
            .collect();
        let ordered = v.iter().all(|(lo, hi)| lo <= hi)
            && v.windows(2).all(|w| w[0].1.saturating_add(1) < w[1].0);
        ordered.then_some(Self(v))
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() * 16);
        for (lo, hi) in &self.0 {
            out.extend_from_slice(&lo.to_be_bytes());
            out.extend_from_slice(&hi.to_be_bytes());
        }
        out
    }

    /// Whether `seq` is in a range.
    pub fn contains(&self, seq: u64) -> bool {
        let i = self.0.partition_point(|(_, hi)| *hi < seq);
        self.0.get(i).is_some_and(|(lo, _)| *lo <= seq)
    }

    /// Adds `seq`, merging neighbours; false when it was there already.
    pub fn insert(&mut self, seq: u64) -> bool {
        let i = self.0.partition_point(|(_, hi)| *hi < seq);
        if self.0.get(i).is_some_and(|(lo, _)| *lo <= seq) {
            return false;
        }
        let joins_left = i > 0 && self.0[i - 1].1 + 1 == seq;
        let joins_right = self.0.get(i).is_some_and(|(lo, _)| seq + 1 == *lo);
        match (joins_left, joins_right) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 = seq,
            (false, true) => self.0[i].0 = seq,
            (false, false) => self.0.insert(i, (seq, seq)),
        }
        if self.0.len() > MAX_RANGES {
            let excess = self.0.len() - MAX_RANGES;
            self.0.drain(..excess);
        }
        true
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Locks striped by agent: one agent's membership record is changed by
/// one writer at a time, different agents' in parallel.
pub(super) struct Stripes(Vec<Mutex<()>>);

impl Default for Stripes {
    fn default() -> Self {
        Self((0..64).map(|_| Mutex::new(())).collect())
    }
}

impl Stripes {
    fn index(&self, a: &AgentKey) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        a.hash(&mut h);
        (h.finish() % self.0.len() as u64) as usize
    }

    fn lock_at(&self, i: usize) -> MutexGuard<'_, ()> {
        // The guarded data is the store's record, not this unit value: a
        // panic elsewhere leaves nothing inconsistent here.
        self.0[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock(&self, a: &AgentKey) -> MutexGuard<'_, ()> {
        self.lock_at(self.index(a))
    }

    /// The stripes of every agent in `agents`, each once, taken in
    /// ascending order (so two holders of several never wait on each
    /// other in a cycle).
    pub(super) fn lock_all<'a>(
        &self,
        agents: impl Iterator<Item = &'a AgentKey>,
    ) -> Vec<MutexGuard<'_, ()>> {
        let mut at: Vec<usize> = agents.map(|a| self.index(a)).collect();
        at.sort_unstable();
        at.dedup();
        at.into_iter().map(|i| self.lock_at(i)).collect()
    }
}

/// `m` · tenant · agent · boot.
pub(super) fn held_key(a: &AgentKey) -> Vec<u8> {
    keys::meta_key(keys::META_HELD, &[&a.tenant, &a.agent_id, &a.boot_id])
}

impl Store {
    /// The sequence numbers of `a` this collector holds as normal commits.
    pub fn held_ranges(&self, a: &AgentKey) -> Result<SeqRanges, StoreError> {
        match self.engine.get(Cf::Meta, &held_key(a))? {
            None => Ok(SeqRanges::default()),
            Some(v) => SeqRanges::decode(&v).ok_or_else(|| corrupt(Cf::Meta, "held ranges")),
        }
    }

    /// The put that adds `seq` to `a`'s held ranges; the caller holds
    /// `a`'s stripe lock until the write carrying it is applied.
    pub(super) fn held_put(&self, a: &AgentKey, seq: u64) -> Result<Put, StoreError> {
        let mut r = self.held_ranges(a)?;
        r.insert(seq);
        Ok((Cf::Meta, held_key(a), r.encode()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_merge_and_answer_exactly() {
        let mut r = SeqRanges::default();
        for s in [5, 7, 6, 1, 10, 9] {
            assert!(r.insert(s));
        }
        assert!(!r.insert(6), "already held");
        assert_eq!(r.0, vec![(1, 1), (5, 7), (9, 10)]);
        for (s, want) in [
            (0, false),
            (1, true),
            (2, false),
            (5, true),
            (7, true),
            (8, false),
        ] {
            assert_eq!(r.contains(s), want, "{s}");
        }
        assert!(r.insert(8));
        assert_eq!(r.0, vec![(1, 1), (5, 10)]);
        assert_eq!(SeqRanges::decode(&r.encode()), Some(r));
        assert_eq!(SeqRanges::decode(&[0; 15]), None);
        // Overlapping or unordered stored ranges are corrupt.
        let bad = SeqRanges(vec![(5, 9), (8, 12)]).encode();
        assert_eq!(SeqRanges::decode(&bad), None);
    }

    #[test]
    fn past_the_cap_the_oldest_ranges_are_forgotten() {
        let mut r = SeqRanges::default();
        for i in 0..(MAX_RANGES as u64 + 3) {
            r.insert(i * 2 + 1);
        }
        assert_eq!(r.len(), MAX_RANGES);
        assert!(!r.contains(1) && !r.contains(5), "oldest forgotten");
        assert!(r.contains(7) && r.contains(MAX_RANGES as u64 * 2 + 5));
    }

    proptest! {
        #[test]
        fn ranges_hold_exactly_what_was_inserted(seqs in proptest::collection::vec(1u64..200, 0..120)) {
            let mut r = SeqRanges::default();
            let mut set = std::collections::BTreeSet::new();
            for s in &seqs {
                prop_assert_eq!(r.insert(*s), set.insert(*s));
            }
            for s in 0..210 {
                prop_assert_eq!(r.contains(s), set.contains(&s));
            }
            prop_assert_eq!(SeqRanges::decode(&r.encode()), Some(r));
        }
    }
}
