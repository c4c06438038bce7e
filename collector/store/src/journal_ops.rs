//! The store's reads and writes of remote write's journal
//! ([`super::journal`]).

use super::journal::{
    key, parse, seq_of, Entry, OpenEntries, Ticket, END, OPEN_END, OPEN_PREFIX, PREFIX,
};
use super::model::Store;
use super::{Cf, Op, Put, StoreError};
use std::sync::atomic::Ordering;

impl Store {
    /// The next journal sequence number (the journal's last on disk plus
    /// one, the first time), held in flight until the ticket is dropped.
    fn journal_seq(&self) -> Result<Ticket, StoreError> {
        let mut loaded = self
            .journal
            .loaded
            .lock()
            .map_err(|_| StoreError::Engine("journal lock poisoned".into()))?;
        if !*loaded {
            let mut last = None;
            self.engine.scan(Cf::Journal, PREFIX, END, &mut |k, _| {
                last = seq_of(k);
                true
            })?;
            self.journal
                .next
                .store(last.map_or(0, |s| s + 1), Ordering::SeqCst);
            *loaded = true;
        }
        drop(loaded);
        let mut inflight = self
            .journal
            .inflight
            .lock()
            .map_err(|_| StoreError::Engine("journal lock poisoned".into()))?;
        let seq = self.journal.next.fetch_add(1, Ordering::SeqCst);
        inflight.insert(seq);
        Ok(Ticket {
            journal: self.journal.clone(),
            seq,
        })
    }

    /// The put of a journal entry holding `value` ([`value`]), and its
    /// ticket, to be dropped once the write ended.
    pub(super) fn journal_put(&self, value: Vec<u8>) -> Result<(Put, Ticket), StoreError> {
        let t = self.journal_seq()?;
        Ok(((Cf::Journal, key(t.seq), value), t))
    }

    /// Appends an entry on its own (staleness markers, which belong to no
    /// batch).
    pub fn journal_append(&self, value: Vec<u8>) -> Result<(), StoreError> {
        let (put, _ticket) = self.journal_put(value)?;
        self.engine.write(vec![put], self.sync)
    }

    /// Appends the staleness markers in `value` and, in the same write,
    /// removes the open-series register entries `closed` of the series
    /// they end.
    pub fn journal_close(&self, value: Vec<u8>, closed: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let (put, _ticket) = self.journal_put(value)?;
        let mut ops = vec![Op::Put(put.0, put.1, put.2)];
        ops.extend(closed.into_iter().map(|k| Op::Delete(Cf::OpenSeries, k)));
        self.engine.apply(ops, self.sync)
    }

    /// Every entry of the open-series register: key and value.
    pub fn journal_open_series(&self) -> Result<OpenEntries, StoreError> {
        let mut out = Vec::new();
        self.engine
            .scan(Cf::OpenSeries, OPEN_PREFIX, OPEN_END, &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                true
            })?;
        Ok(out)
    }

    /// The oldest entries from sequence number `from` on, in order, until
    /// `max_points` points (at least one entry when there is one), and the
    /// cursor to read from next: past the last entry read, but not past a
    /// number whose write is still under way.
    pub fn journal_read(
        &self,
        from: u64,
        max_points: u64,
    ) -> Result<(Vec<Entry>, u64), StoreError> {
        let mut out = Vec::new();
        let mut points = 0u64;
        let mut bad = None;
        let mut next = from;
        // Taken before the scan: a write that ends during it is either seen
        // or still in flight here.
        let pending = self
            .journal
            .inflight
            .lock()
            .ok()
            .and_then(|f| f.first().copied());
        self.engine
            .scan(Cf::Journal, &key(from), END, &mut |k, v| {
                match parse(k, v) {
                    Some(e) => {
                        points += u64::from(e.points);
                        next = seq_of(k).map_or(next, |s| s + 1);
                        out.push(e);
                    }
                    None => bad = Some(k.to_vec()),
                }
                bad.is_none() && points < max_points
            })?;
        if let Some(k) = bad {
            // A malformed entry can never be sent: deleted, and said.
            tracing::error!(key = ?k, "malformed remote-write journal entry deleted");
            self.engine
                .apply(vec![Op::Delete(Cf::Journal, k)], self.sync)?;
            return Ok((out, from));
        }
        Ok((out, pending.map_or(next, |p| next.min(p))))
    }

    /// Deletes the entries with these keys (sent, or dropped by policy).
    pub fn journal_done(&self, keys: Vec<Vec<u8>>) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let ops = keys
            .into_iter()
            .map(|k| Op::Delete(Cf::Journal, k))
            .collect();
        self.engine.apply(ops, self.sync)
    }

    /// Entries and points in the journal, and its oldest point's time (a
    /// scan of the journal: at start, and for the gauges).
    pub fn journal_backlog(&self) -> Result<(u64, u64, Option<i64>), StoreError> {
        let (mut entries, mut points, mut oldest) = (0u64, 0u64, None::<i64>);
        self.engine.scan(Cf::Journal, PREFIX, END, &mut |k, v| {
            if let Some(e) = parse(k, v) {
                entries += 1;
                points += u64::from(e.points);
                oldest = Some(oldest.map_or(e.oldest_ms, |o| o.min(e.oldest_ms)));
            }
            true
        })?;
        Ok((entries, points, oldest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::value;
    use crate::memory::MemEngine;
    use crate::CommitSet;
    use std::sync::Arc;

    #[test]
    fn entries_come_back_in_order_and_numbers_continue_after_a_reopen() {
        let engine = Arc::new(MemEngine::new());
        let s = Store::new(engine.clone(), false);
        for i in 0..5u32 {
            s.journal_append(value(i + 1, 1_000 + i64::from(i), &[i as u8]))
                .unwrap();
        }
        let (got, next) = s.journal_read(0, 3).unwrap();
        // Stops once 3 points are in: entries of 1 and 2 points.
        assert_eq!(got.iter().map(|e| e.points).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(next, 2);
        let (rest, _) = s.journal_read(next, u64::MAX).unwrap();
        assert_eq!(rest.iter().map(|e| e.points).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(got[1].body, [1]);
        s.journal_done(got.iter().map(|e| e.key.clone()).collect())
            .unwrap();
        assert_eq!(s.journal_backlog().unwrap(), (3, 12, Some(1_002)));
        // A new store over the same engine (a restart) goes on numbering
        // after the last entry, so order holds.
        let again = Store::new(engine, false);
        again.journal_append(value(9, 5, &[9])).unwrap();
        let (all, _) = again.journal_read(0, u64::MAX).unwrap();
        assert_eq!(
            all.iter().map(|e| e.points).collect::<Vec<_>>(),
            [3, 4, 5, 9]
        );
    }

    #[test]
    fn a_commit_writes_its_entry_with_the_batch() {
        let s = Store::new(Arc::new(MemEngine::new()), false);
        let set = CommitSet {
            forward: value(2, 7, b"wr"),
            ..Default::default()
        };
        s.commit("t", &set).unwrap();
        let (got, _) = s.journal_read(0, u64::MAX).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].points, got[0].oldest_ms, &got[0].body[..]),
            (2, 7, &b"wr"[..])
        );
    }

    #[test]
    fn a_packed_entry_counts_its_points_without_the_flag() {
        let s = Store::new(Arc::new(MemEngine::new()), false);
        s.journal_append(value(3 | crate::journal::PACKED, 5, b"zz"))
            .unwrap();
        s.journal_append(value(2, 6, b"p")).unwrap();
        let (got, _) = s.journal_read(0, 3).unwrap();
        assert_eq!(got.len(), 1, "3 points reach max_points");
        assert_eq!((got[0].points, got[0].packed), (3, true));
        let (all, _) = s.journal_read(0, u64::MAX).unwrap();
        assert_eq!((all[1].points, all[1].packed), (2, false));
        assert_eq!(s.journal_backlog().unwrap(), (2, 5, Some(5)));
    }

    /// The keys of family `cf`.
    fn keys_of(e: &MemEngine, cf: Cf) -> Vec<Vec<u8>> {
        use crate::Engine;
        let mut out = Vec::new();
        e.scan(cf, &[], &[0xff, 0xff], &mut |k, _| {
            out.push(k.to_vec());
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn entries_and_the_register_keep_to_their_own_families() {
        let engine = Arc::new(MemEngine::new());
        let s = Store::new(engine.clone(), false);
        let open = crate::journal::open_key("GPU-1", "flopwatch_ofu_ratio");
        let set = CommitSet {
            forward: value(1, 7, b"p"),
            forward_open: vec![(open.clone(), b"labels".to_vec())],
            ..Default::default()
        };
        s.commit("t", &set).unwrap();
        // The metadata holds neither: their churn never rewrites it.
        assert!(keys_of(&engine, Cf::Meta)
            .iter()
            .all(|k| !k.starts_with(PREFIX) && !k.starts_with(OPEN_PREFIX)));
        assert_eq!(keys_of(&engine, Cf::Journal), [key(0)]);
        assert_eq!(
            keys_of(&engine, Cf::OpenSeries),
            std::slice::from_ref(&open)
        );
        assert_eq!(s.journal_open_series().unwrap().len(), 1);
        // The series' marker removes its register entry, in the marker's
        // write.
        s.journal_close(value(1, 8, b"m"), vec![open]).unwrap();
        assert!(keys_of(&engine, Cf::OpenSeries).is_empty());
        assert_eq!(keys_of(&engine, Cf::Journal), [key(0), key(1)]);
    }
}
