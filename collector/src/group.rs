//! Group commit: a tenant's batches waiting for storage are written
//! together, in one write.
//!
//! A write holds one of the tenant's commit slots (`crate::limits`) for
//! as long as storage takes, and it costs about as much for one batch as
//! for several: a blocking thread woken, a write-ahead-log append, a turn
//! in RocksDB's write queue. Written one batch at a time, a tenant is
//! capped at `max_concurrent_commits` ÷ the time of a write: at 10,000
//! agents on two busy cores, about 2,000 batches a second against the
//! ~950 the agents send. Whenever the machine slows the writes down
//! (compactions, folding, a noisy neighbour) the cap drops below what the
//! agents send; batches wait out [`crate::SLOT_WAIT`], are deferred and
//! come back, which is more work on the same cores, and acks can fall to
//! a few a second and stay there (docs/BENCHMARKS.md, soak).
//!
//! So each tenant has a line. A batch ready for storage joins it, and
//! whoever drains the line — one task per tenant, alive while the line is
//! not empty — takes everything waiting, up to [`GROUP_SAMPLES`] samples,
//! each time it gets one of the tenant's slots, and writes it as one
//! ([`Store::commit_all`]) on a blocking thread that answers every batch
//! of the group and gives the slot back. Only that task waits for the
//! tenant's slots (not every stream with a batch in line). A stream that
//! leaves (its agent gone) takes its batch out of the line if no write has
//! taken it yet. The busier storage is, the more each write
//! carries; the slots still bound how many writes a tenant has in storage
//! at once, and the sample cap how long another tenant's write can wait
//! behind one of them. While the batch at the front of a tenant's line has
//! waited longer than `SLOT_WAIT`, the tenant's new batches are deferred
//! before any work is spent on them (`crate::ingest`): the line is bounded
//! by time, and by one batch per stream.

use crate::limits::CommitGate;
use crate::stats::Stats;
use crate::store::{CommitSet, Store, StoreError};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Most samples one group write carries (a single larger batch still goes
/// alone): about 70 batches of a 10,000-agent fleet's (160–320 samples
/// each), two of a flood's 8,000-sample batches.
pub(crate) const GROUP_SAMPLES: usize = 16_384;

/// What a write gives back: the batch, or the storage failure.
type Written = Result<CommitSet, StoreError>;

struct Waiting {
    id: u64,
    /// When it joined the line.
    since: tokio::time::Instant,
    samples: usize,
    set: CommitSet,
    done: oneshot::Sender<Written>,
}

#[derive(Default)]
struct Queue {
    next_id: u64,
    waiting: VecDeque<Waiting>,
    /// A task is draining the line.
    draining: bool,
}

/// One tenant's line.
#[derive(Default)]
struct Line {
    queue: Mutex<Queue>,
}

impl Line {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change to the queue is one push or one removal: nothing is
        // left half done by a panic elsewhere.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the batches at the front, up to [`GROUP_SAMPLES`] samples
    /// (at least one); `None` when the line is empty, and then the
    /// draining task stops.
    fn take(&self) -> Option<Vec<Waiting>> {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q.draining = false;
            return None;
        }
        let mut group = Vec::new();
        let mut samples = 0;
        while let Some(w) = q.waiting.front() {
            if !group.is_empty() && samples + w.samples > GROUP_SAMPLES {
                break;
            }
            samples += w.samples;
            group.extend(q.waiting.pop_front());
        }
        Some(group)
    }
}

/// Every tenant's line.
pub(crate) struct Lines {
    tenants: Mutex<HashMap<String, Arc<Line>>>,
    /// Counts the writes (`commit_writes`).
    stats: Arc<Stats>,
}

/// A batch in its tenant's line; dropped before it is written, it leaves
/// the line unless a write has taken it (then it is written all the same,
/// and acknowledged as a duplicate if the agent sends it again).
pub(crate) struct Pending {
    line: Arc<Line>,
    id: u64,
    done: oneshot::Receiver<Written>,
}

impl Pending {
    /// Waits until the batch is written.
    pub(crate) async fn written(&mut self) -> Written {
        (&mut self.done).await.unwrap_or_else(|_| {
            Err(StoreError::Engine(
                "the write of this batch was abandoned".into(),
            ))
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut q = self.line.lock();
        // The line is in id order (pushed in order, removed in order or
        // one by one): a search, not a walk, on every batch's way out.
        if let Ok(at) = q.waiting.binary_search_by_key(&self.id, |w| w.id) {
            q.waiting.remove(at);
        }
    }
}

impl Lines {
    /// No line yet; writes counted in `stats`.
    pub(crate) fn new(stats: Arc<Stats>) -> Self {
        Self {
            tenants: Mutex::default(),
            stats,
        }
    }

    /// How long the batch at the front of `tenant`'s line has waited (zero
    /// when the line is empty): how far storage is behind the tenant.
    pub(crate) fn waited(&self, tenant: &str) -> std::time::Duration {
        let line = {
            let m = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(tenant) {
                Some(l) => l.clone(),
                None => return std::time::Duration::ZERO,
            }
        };
        let q = line.lock();
        q.waiting
            .front()
            .map_or(std::time::Duration::ZERO, |w| w.since.elapsed())
    }

    /// Puts `set` in `tenant`'s line, starting a task to drain it through
    /// `gate` into `store` unless one runs.
    pub(crate) fn submit(
        &self,
        tenant: &str,
        gate: CommitGate,
        store: &Store,
        set: CommitSet,
    ) -> Pending {
        let line = {
            let mut m = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(tenant) {
                Some(l) => l.clone(),
                None => m.entry(tenant.to_string()).or_default().clone(),
            }
        };
        let (tx, rx) = oneshot::channel();
        let samples = set.series.iter().map(|s| s.points.len()).sum::<usize>();
        let (id, start) = {
            let mut q = line.lock();
            let id = q.next_id;
            q.next_id += 1;
            q.waiting.push_back(Waiting {
                id,
                since: tokio::time::Instant::now(),
                samples,
                set,
                done: tx,
            });
            (id, !std::mem::replace(&mut q.draining, true))
        };
        if start {
            let to = (store.clone(), self.stats.clone());
            tokio::spawn(drain(line.clone(), tenant.to_string(), gate, to));
        }
        Pending { line, id, done: rx }
    }
}

/// Writes `line`'s batches, a group per slot, until it is empty.
async fn drain(
    line: Arc<Line>,
    tenant: String,
    gate: CommitGate,
    (store, stats): (Store, Arc<Stats>),
) {
    loop {
        let Some(slot) = gate.acquire().await else {
            // The semaphores are never closed; should they be, nothing
            // could be written: fail what waits.
            let mut q = line.lock();
            q.draining = false;
            for w in q.waiting.drain(..) {
                let _ = w
                    .done
                    .send(Err(StoreError::Engine("commit slots closed".into())));
            }
            return;
        };
        let Some(group) = line.take() else {
            return;
        };
        stats.commit_writes.fetch_add(1, Ordering::Relaxed);
        let (store, tenant) = (store.clone(), tenant.clone());
        // The blocking thread answers every batch and gives the slot back;
        // a panic in storage drops the senders, and their streams hear
        // "abandoned".
        tokio::task::spawn_blocking(move || {
            let (sets, done): (Vec<CommitSet>, Vec<oneshot::Sender<Written>>) =
                group.into_iter().map(|w| (w.set, w.done)).unzip();
            match store.commit_all(&tenant, &sets) {
                Ok(()) => {
                    for (set, tx) in sets.into_iter().zip(done) {
                        let _ = tx.send(Ok(set));
                    }
                }
                Err(e) => {
                    for tx in done {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}
