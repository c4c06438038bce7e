//! Batches waiting to be sent or acknowledged, bounded.
//!
//! A batch gets its sequence number when it is first put on the wire, from
//! a counter that starts above the collector's acked number (Welcome): an
//! agent restarted on the same boot continues the sequence instead of
//! colliding with what the collector already holds. A sent batch keeps its
//! number for every resend, so the collector can drop replays.
//!
//! When full, the oldest *unsent* batch is dropped and counted; batches
//! already on the wire are kept until acknowledged or rejected.

use flopwatch_proto::v1;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::Notify;

struct Entry {
    batch: v1::Batch,
    sent: bool,
}

#[derive(Default)]
struct Inner {
    entries: VecDeque<Entry>,
    next_seq: u64,
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
            }),
            capacity: capacity.max(1),
            notify: Notify::new(),
            stats: OutboxStats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (no
        // multi-step invariants span an unwind), so recover it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a batch (unnumbered).
    pub fn push(&self, batch: v1::Batch) {
        {
            let mut inner = self.lock();
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
            inner.entries.push_back(Entry { batch, sent: false });
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
    /// the rest for resending, continues numbering above `acked`.
    pub fn welcome(&self, acked: u64) {
        let mut inner = self.lock();
        let before = inner.entries.len();
        inner.entries.retain(|e| !(e.sent && e.batch.seq <= acked));
        let durable = (before - inner.entries.len()) as u64;
        self.stats
            .acked_batches
            .fetch_add(durable, Ordering::Relaxed);
        for e in inner.entries.iter_mut() {
            e.sent = false;
        }
        inner.next_seq = inner.next_seq.max(acked + 1);
    }

    /// The next batches to put on the wire, keeping at most `window`
    /// unacknowledged; numbers them if new.
    pub fn next_to_send(&self, window: usize) -> Vec<v1::Batch> {
        let mut inner = self.lock();
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
            if e.batch.seq == 0 {
                e.batch.seq = next_seq;
                next_seq += 1;
            }
            e.sent = true;
            in_flight += 1;
            out.push(e.batch.clone());
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
            inner.entries.pop_front();
            self.stats.acked_batches.fetch_add(1, Ordering::Relaxed);
            self.stats.acked_samples.fetch_add(n, Ordering::Relaxed);
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
        }
        drop(inner);
        self.notify.notify_one();
    }

    /// Encoded bytes of the batches held (sent or not): what the agent
    /// would lose if it died now.
    pub fn pending_bytes(&self) -> u64 {
        use prost::Message;
        self.lock()
            .entries
            .iter()
            .map(|e| e.batch.encoded_len() as u64)
            .sum()
    }

    /// Batches held (sent or not).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
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
