//! Batches waiting to be sent or acknowledged, bounded.
//!
//! Without a spool, a batch gets its sequence number when it is first put
//! on the wire, from a counter that starts above the collector's acked
//! number (Welcome): an agent restarted on the same boot continues the
//! sequence instead of colliding with what the collector already holds.
//! When full, the oldest *unsent* batch is dropped and counted; batches
//! already on the wire are kept until acknowledged or rejected.
//!
//! With a [`Spool`], every batch is numbered and written to disk when it is
//! pushed (write-ahead); memory holds at most `capacity` of them and the
//! rest are read back from the spool, in order, as room frees up. Numbers
//! survive restarts, so a resend is always recognised as a replay.
//!
//! Either way a sent batch keeps its number for every resend, so the
//! collector can drop replays, and batches go out in number order.
//!
//! A batch that was on the wire when its stream ended without an
//! acknowledgement may be stored by that collector (it committed, then
//! died before acking); so may a batch a previous run spooled and perhaps
//! sent. Such batches are resent flagged `uncertain`, and a collector of a
//! cluster keeps them in limbo until its peers say whether one of them
//! holds them (docs/RELIABILITY.md).

use crate::spool::{Spool, SpoolStats, SyncJob};
use flopwatch_proto::v1;
use prost::Message;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tracing::warn;

struct Entry {
    /// Shared with the stream that sends it ([`crate::wire::Outgoing`]):
    /// put on the wire without a copy.
    batch: Arc<v1::Batch>,
    /// Its encoded size when queued (asked at every batch cut, for
    /// [`Outbox::pending_bytes`]: measured once, not at every ask).
    bytes: u64,
    sent: bool,
    /// When it was last put on the wire (for [`OutboxStats::ack_latency`]).
    sent_at: Option<tokio::time::Instant>,
    /// Some collector may hold it already (sent on a stream that ended
    /// without its ack, or spooled by an earlier run): sent flagged so.
    uncertain: bool,
}

#[derive(Default)]
struct Inner {
    entries: VecDeque<Entry>,
    next_seq: u64,
    spool: Option<Spool>,
    /// With a spool: every batch numbered up to this one is in `entries`
    /// or acknowledged; those above wait on disk.
    mem_upto: u64,
    /// With a spool: batches numbered up to this one were written by an
    /// earlier run, which may have sent them.
    uncertain_upto: u64,
}

/// Counters of the outbox.
#[derive(Debug, Default)]
pub struct OutboxStats {
    /// Batches dropped because the outbox was full.
    pub dropped_batches: AtomicU64,
    /// Samples in those batches.
    pub dropped_samples: AtomicU64,
    /// Batches acknowledged.
    pub acked_batches: AtomicU64,
    /// Samples acknowledged.
    pub acked_samples: AtomicU64,
    /// Batches rejected by the collector.
    pub rejected_batches: AtomicU64,
    /// From a batch put on the wire (the last time) to its ack.
    pub ack_latency: crate::latency::LatencyHistogram,
}

/// The bounded outbox, shared by the sampling loop and the client.
pub struct Outbox {
    closed: std::sync::atomic::AtomicBool,
    inner: Mutex<Inner>,
    capacity: usize,
    notify: Notify,
    /// Counters.
    pub stats: OutboxStats,
}

fn samples(b: &v1::Batch) -> u64 {
    b.series.iter().map(|s| s.timestamps_ms.len() as u64).sum()
}

impl Outbox {
    /// Holds at most `capacity` batches.
    pub fn new(capacity: usize) -> Self {
        Self {
            closed: std::sync::atomic::AtomicBool::new(false),
            inner: Mutex::new(Inner {
                entries: VecDeque::new(),
                next_seq: 1,
                spool: None,
                mem_upto: 0,
                uncertain_upto: 0,
            }),
            capacity: capacity.max(1),
            notify: Notify::new(),
            stats: OutboxStats::default(),
        }
    }

    /// Holds at most `capacity` batches in memory, every batch on disk in
    /// `spool` until acknowledged; what the spool kept from an earlier run
    /// is sent first.
    pub fn with_spool(capacity: usize, spool: Spool) -> Self {
        let o = Self::new(capacity);
        {
            let mut inner = o.lock();
            inner.mem_upto = spool.acked();
            inner.next_seq = spool.next_seq();
            inner.uncertain_upto = spool.last_seq();
            inner.spool = Some(spool);
        }
        o
    }

    /// The spool's counters, when there is a spool.
    pub fn spool_stats(&self) -> Option<Arc<SpoolStats>> {
        self.lock().spool.as_ref().map(|s| s.stats())
    }

    /// The fsync of the spool, to run off the lock (`None` without one).
    pub fn spool_sync_job(&self) -> Option<SyncJob> {
        self.lock().spool.as_ref().map(|s| s.prepare_sync())
    }

    /// Fills memory from the spool, in order.
    fn refill(&self, inner: &mut Inner) {
        let room = self.capacity.saturating_sub(inner.entries.len());
        let after = inner.mem_upto;
        let Some(spool) = inner.spool.as_mut() else {
            return;
        };
        if room == 0 || after >= spool.last_seq() {
            return;
        }
        let read = spool.read_after(after, room);
        if read.is_empty() {
            // Unreadable: skip that segment (counted as an I/O error).
            inner.mem_upto = inner.mem_upto.max(spool.segment_end_after(after));
            return;
        }
        for b in read {
            inner.mem_upto = b.seq;
            inner.entries.push_back(Entry {
                uncertain: b.seq <= inner.uncertain_upto,
                bytes: b.encoded_len() as u64,
                batch: Arc::new(b),
                sent: false,
                sent_at: None,
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (no
        // multi-step invariants span an unwind), so recover it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a batch (unnumbered; numbered and written ahead with a
    /// spool).
    pub fn push(&self, mut batch: v1::Batch) {
        {
            let mut inner = self.lock();
            let inner = &mut *inner;
            if let Some(spool) = inner.spool.as_mut() {
                // Nothing waits on disk: this batch is next in line.
                let in_order = spool.count_after(inner.mem_upto) == 0;
                let written = spool.append(&mut batch);
                inner.next_seq = spool.next_seq();
                match written {
                    Ok(()) => {
                        if in_order && inner.entries.len() < self.capacity {
                            inner.mem_upto = batch.seq;
                            inner.entries.push_back(Entry {
                                bytes: batch.encoded_len() as u64,
                                batch: Arc::new(batch),
                                sent: false,
                                sent_at: None,
                                uncertain: false,
                            });
                        }
                        // Otherwise it waits on disk for its turn.
                        self.notify.notify_one();
                        return;
                    }
                    Err(e) => {
                        warn!(error = %e, seq = batch.seq, "cannot write the spool; batch kept in memory only");
                        inner.mem_upto = inner.mem_upto.max(batch.seq);
                    }
                }
            }
            while inner.entries.len() >= self.capacity {
                match inner.entries.iter().position(|e| !e.sent) {
                    Some(i) => {
                        let dropped = inner
                            .entries
                            .remove(i)
                            .map(|e| samples(&e.batch))
                            .unwrap_or(0);
                        self.stats.dropped_batches.fetch_add(1, Ordering::Relaxed);
                        self.stats
                            .dropped_samples
                            .fetch_add(dropped, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
            if inner.entries.len() >= self.capacity {
                // Everything held is on the wire: drop the new one.
                self.stats.dropped_batches.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .dropped_samples
                    .fetch_add(samples(&batch), Ordering::Relaxed);
                return;
            }
            inner.entries.push_back(Entry {
                bytes: batch.encoded_len() as u64,
                batch: Arc::new(batch),
                sent: false,
                sent_at: None,
                uncertain: false,
            });
        }
        self.notify.notify_one();
    }

    /// No more batches will be pushed (the sampling loop ended).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Whether [`Outbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits until something may be sendable.
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// A new stream was welcomed with `acked`: drops what is durable, marks
    /// the rest for resending (what was on the wire as uncertain: the
    /// collector it went to may hold it), continues numbering above
    /// `acked`.
    pub fn welcome(&self, acked: u64) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let spooled = inner.spool.is_some();
        let before = inner.entries.len();
        let mut durable_samples = 0;
        inner.entries.retain(|e| {
            // With a spool every held batch is numbered: one at or below
            // the collector's number is durable there (sent in an earlier
            // run, or to this collector before a failover).
            let durable = (e.sent || (spooled && e.batch.seq != 0)) && e.batch.seq <= acked;
            if durable {
                durable_samples += samples(&e.batch);
            }
            !durable
        });
        let durable = (before - inner.entries.len()) as u64;
        self.stats
            .acked_batches
            .fetch_add(durable, Ordering::Relaxed);
        self.stats
            .acked_samples
            .fetch_add(durable_samples, Ordering::Relaxed);
        for e in inner.entries.iter_mut() {
            e.uncertain |= e.sent;
            e.sent = false;
        }
        inner.next_seq = inner.next_seq.max(acked + 1);
        if let Some(spool) = inner.spool.as_mut() {
            spool.reserve_below(acked + 1);
            inner.next_seq = spool.next_seq();
            if inner.entries.front().is_none_or(|e| e.batch.seq > acked) {
                spool.ack(acked.min(spool.last_seq()));
            }
            inner.mem_upto = inner.mem_upto.max(acked.min(spool.last_seq()));
        }
    }

    /// The next batches to put on the wire, keeping at most `window`
    /// unacknowledged; numbers them if new.
    /// The batches are shared with the outbox, which keeps them until
    /// they are acknowledged.
    pub fn next_to_send(&self, window: usize) -> Vec<Arc<v1::Batch>> {
        let mut inner = self.lock();
        self.refill(&mut inner);
        let mut in_flight = inner.entries.iter().filter(|e| e.sent).count();
        let mut out = Vec::new();
        let mut next_seq = inner.next_seq;
        for e in inner.entries.iter_mut() {
            if in_flight >= window {
                break;
            }
            if e.sent {
                continue;
            }
            if e.batch.seq == 0 || e.batch.uncertain != e.uncertain {
                // Copies only if a stream that ended still holds it.
                let b = Arc::make_mut(&mut e.batch);
                if b.seq == 0 {
                    b.seq = next_seq;
                    next_seq += 1;
                }
                b.uncertain = e.uncertain;
            }
            e.sent = true;
            e.sent_at = Some(tokio::time::Instant::now());
            in_flight += 1;
            out.push(Arc::clone(&e.batch));
        }
        inner.next_seq = next_seq;
        out
    }

    /// Every batch up to `seq` is durable.
    pub fn ack(&self, seq: u64) {
        let mut inner = self.lock();
        while let Some(e) = inner.entries.front() {
            if !(e.sent && e.batch.seq <= seq) {
                break;
            }
            let n = samples(&e.batch);
            if let Some(t) = e.sent_at {
                self.stats.ack_latency.observe(t.elapsed());
            }
            inner.entries.pop_front();
            self.stats.acked_batches.fetch_add(1, Ordering::Relaxed);
            self.stats.acked_samples.fetch_add(n, Ordering::Relaxed);
        }
        // The spool may forget everything below the oldest batch still
        // waiting.
        let keep_from = inner.entries.front().map(|e| e.batch.seq);
        if let Some(spool) = inner.spool.as_mut() {
            let upto = match keep_from {
                Some(s) if s != 0 => (s - 1).min(seq),
                _ => seq,
            };
            spool.ack(upto.min(spool.last_seq()));
        }
        drop(inner);
        self.notify.notify_one();
    }

    /// The collector deferred `seq` without consuming it (rate limit):
    /// it and every batch after it that is on the wire go out again, in
    /// order.
    pub fn requeue_from(&self, seq: u64) {
        let mut inner = self.lock();
        for e in inner.entries.iter_mut() {
            if e.sent && e.batch.seq >= seq {
                e.sent = false;
            }
        }
        drop(inner);
        self.notify.notify_one();
    }

    /// The collector refused `seq` as a whole; it will never be accepted.
    pub fn reject(&self, seq: u64) {
        let mut inner = self.lock();
        if let Some(i) = inner
            .entries
            .iter()
            .position(|e| e.sent && e.batch.seq == seq)
        {
            inner.entries.remove(i);
            self.stats.rejected_batches.fetch_add(1, Ordering::Relaxed);
            // The collector consumed the number: the spool may forget it
            // once nothing older waits.
            let keep_from = inner.entries.front().map(|e| e.batch.seq);
            if let Some(spool) = inner.spool.as_mut() {
                let upto = match keep_from {
                    Some(s) if s != 0 => s - 1,
                    _ => seq.max(spool.acked()),
                };
                spool.ack(upto.min(seq).min(spool.last_seq()));
            }
        }
        drop(inner);
        self.notify.notify_one();
    }

    /// Encoded bytes of the batches held (sent or not): what the agent
    /// would lose if it died now.
    pub fn pending_bytes(&self) -> u64 {
        let inner = self.lock();
        let mem: u64 = inner.entries.iter().map(|e| e.bytes).sum();
        match &inner.spool {
            // What is on disk is not lost by a crash; report the larger.
            Some(s) => mem.max(s.bytes()),
            None => mem,
        }
    }

    /// Batches held (sent or not), on disk included.
    pub fn len(&self) -> usize {
        let inner = self.lock();
        let disk = inner
            .spool
            .as_ref()
            .map(|s| s.count_after(inner.mem_upto))
            .unwrap_or(0);
        inner.entries.len() + disk as usize
    }

    /// Batches on the wire, not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.lock().entries.iter().filter(|e| e.sent).count()
    }

    /// Unsent batches in memory or on disk.
    pub fn has_unsent(&self) -> bool {
        let inner = self.lock();
        inner.entries.iter().any(|e| !e.sent)
            || inner
                .spool
                .as_ref()
                .is_some_and(|s| s.last_seq() > inner.mem_upto)
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> v1::Batch {
        v1::Batch {
            series: vec![v1::Series {
                timestamps_ms: vec![0; n],
                values: vec![0.0; n],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn numbers_on_first_send_above_the_collectors_ack() {
        let o = Outbox::new(8);
        o.push(batch(1));
        o.push(batch(1));
        o.welcome(41);
        let sent = o.next_to_send(1);
        assert_eq!(sent.iter().map(|b| b.seq).collect::<Vec<_>>(), vec![42]);
        assert!(o.next_to_send(1).is_empty(), "window of one");
        o.ack(42);
        assert_eq!(o.next_to_send(4)[0].seq, 43);
        // Reconnect: 43 was not acked, it is resent with the same number.
        o.welcome(42);
        assert_eq!(o.next_to_send(4)[0].seq, 43);
        o.welcome(43);
        assert!(o.is_empty());
        assert_eq!(o.stats.acked_batches.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn pending_bytes_are_the_held_batches_until_acked() {
        let o = Outbox::new(8);
        assert_eq!(o.pending_bytes(), 0);
        let (a, b) = (batch(3), batch(500));
        let want = (a.encoded_len() + b.encoded_len()) as u64;
        o.push(a);
        o.push(b);
        assert_eq!(o.pending_bytes(), want);
        o.welcome(0);
        let sent = o.next_to_send(1);
        assert_eq!(o.pending_bytes(), want, "sent is still held");
        o.ack(sent[0].seq);
        assert_eq!(o.pending_bytes(), batch(500).encoded_len() as u64);
    }

    fn spooled(dir: &std::path::Path, capacity: usize) -> Outbox {
        let spool = Spool::open(
            &crate::spool::SpoolOptions {
                dir: dir.to_path_buf(),
                max_bytes: 1 << 20,
                fsync_interval: std::time::Duration::from_secs(1),
            },
            Arc::new(SpoolStats::default()),
        )
        .unwrap();
        Outbox::with_spool(capacity, spool)
    }

    #[test]
    fn spooled_batches_beyond_memory_are_read_back_in_order() {
        let d = tempfile::tempdir().unwrap();
        let o = spooled(d.path(), 2);
        for _ in 0..5 {
            o.push(batch(1));
        }
        assert_eq!(o.len(), 5, "two in memory, three on disk");
        o.welcome(0);
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![1, 2]);
        o.ack(2);
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![3, 4]);
        o.ack(4);
        assert_eq!(o.next_to_send(8)[0].seq, 5);
        o.ack(5);
        assert!(o.is_empty());
        assert_eq!(o.stats.acked_samples.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_restarted_agent_resends_unacked_batches_with_their_numbers() {
        let d = tempfile::tempdir().unwrap();
        {
            let o = spooled(d.path(), 8);
            for _ in 0..4 {
                o.push(batch(1));
            }
            o.welcome(0);
            assert_eq!(o.next_to_send(8).len(), 4);
            o.ack(2);
            // Dies here (no fsync of the state: the spool still says 0).
        }
        let o = spooled(d.path(), 8);
        assert_eq!(o.len(), 4);
        // The collector knows 1..2 are durable: they are not resent.
        o.welcome(2);
        o.push(batch(1));
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![3, 4, 5], "old numbers kept, new ones above");
        o.ack(5);
        assert!(o.is_empty());
    }

    #[test]
    fn a_new_run_numbers_above_the_last_and_sends_the_old_backlog_first() {
        let d = tempfile::tempdir().unwrap();
        {
            let o = spooled(d.path(), 8);
            for _ in 0..3 {
                o.push(batch(1));
            }
        }
        let spool = Spool::open(
            &crate::spool::SpoolOptions {
                dir: d.path().to_path_buf(),
                max_bytes: 1 << 20,
                fsync_interval: std::time::Duration::from_secs(1),
            },
            Arc::new(SpoolStats::default()),
        )
        .unwrap();
        let mut spool = spool;
        spool.reserve_below(1_000_000);
        let o = Outbox::with_spool(8, spool);
        o.push(batch(1));
        o.push(batch(1));
        assert_eq!(o.len(), 5);
        o.welcome(0);
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![1, 2, 3, 1_000_000, 1_000_001]);
        o.ack(1_000_001);
        assert!(o.is_empty());
    }

    #[test]
    fn failover_to_a_collector_that_knows_less_resends_only_unacked() {
        let d = tempfile::tempdir().unwrap();
        let o = spooled(d.path(), 8);
        for _ in 0..6 {
            o.push(batch(1));
        }
        o.welcome(0);
        o.next_to_send(8);
        o.ack(3);
        // Home dies with 4..6 unacknowledged; the next collector has
        // older numbers of this agent only.
        o.welcome(1);
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![4, 5, 6]);
        // Home is back and had committed 4 and 5 before dying.
        o.welcome(5);
        let sent: Vec<u64> = o.next_to_send(8).iter().map(|b| b.seq).collect();
        assert_eq!(sent, vec![6]);
    }

    fn flags(sent: &[Arc<v1::Batch>]) -> Vec<(u64, bool)> {
        sent.iter().map(|b| (b.seq, b.uncertain)).collect()
    }

    #[test]
    fn batches_on_the_wire_when_a_stream_ends_are_resent_uncertain() {
        let o = Outbox::new(8);
        for _ in 0..5 {
            o.push(batch(1));
        }
        o.welcome(0);
        let first = o.next_to_send(3);
        assert_eq!(flags(&first), vec![(1, false), (2, false), (3, false)]);
        o.ack(1);
        // The stream ends with 2 and 3 unacknowledged; the next collector
        // knows nothing of this agent.
        o.welcome(0);
        let sent = o.next_to_send(8);
        assert_eq!(
            flags(&sent),
            vec![(2, true), (3, true), (4, false), (5, false)],
            "only what was on the wire is uncertain"
        );
        o.ack(2);
        // Ends again: 3 stays uncertain, 4 and 5 become so.
        o.welcome(2);
        let sent = o.next_to_send(8);
        assert_eq!(flags(&sent), vec![(3, true), (4, true), (5, true)]);
        o.ack(5);
        o.push(batch(1));
        assert_eq!(flags(&o.next_to_send(8)), vec![(6, false)]);
    }

    #[test]
    fn batches_an_earlier_run_spooled_are_sent_uncertain() {
        let d = tempfile::tempdir().unwrap();
        {
            let o = spooled(d.path(), 8);
            for _ in 0..3 {
                o.push(batch(1));
            }
            o.welcome(0);
            o.next_to_send(8);
            // Dies: it may or may not have reached a collector.
        }
        let o = spooled(d.path(), 2);
        o.push(batch(1));
        o.welcome(0);
        let mut sent = o.next_to_send(8);
        o.ack(2);
        sent.extend(o.next_to_send(8));
        assert_eq!(
            flags(&sent),
            vec![(1, true), (2, true), (3, true), (4, false)],
            "read back from disk in order; the new batch is certain"
        );
    }

    #[test]
    fn full_outbox_drops_oldest_unsent_and_counts() {
        let o = Outbox::new(2);
        o.push(batch(3));
        let _ = o.next_to_send(1);
        o.push(batch(5));
        o.push(batch(7));
        assert_eq!(o.len(), 2);
        assert_eq!(o.stats.dropped_batches.load(Ordering::Relaxed), 1);
        assert_eq!(o.stats.dropped_samples.load(Ordering::Relaxed), 5);
        o.reject(1);
        assert_eq!(o.len(), 1);
        assert_eq!(o.stats.rejected_batches.load(Ordering::Relaxed), 1);
    }
}
