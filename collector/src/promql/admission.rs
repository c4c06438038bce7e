//! Where a query runs: a turn among its tenant's queries, then a thread of
//! its own whose stack is sized for the deepest expression the shape
//! limits let through ([`super::guard`]), at a lower CPU priority than
//! ingest.
//!
//! - **Turns.** Each tenant (a provider's query over every tenant counts
//!   as the tenant `*`) evaluates at most `max_concurrent_queries` at
//!   once; up to `max_queued_queries` more wait for a turn (a Grafana
//!   dashboard sends a query per panel at once), and past that a query is
//!   refused with 429. One tenant's flood of queries therefore holds at
//!   most its own turns, never another tenant's, and never ingest's
//!   threads.
//! - **Stack.** Parsing, evaluation and the drop of the syntax tree all
//!   recurse once per level of the tree; the limit on depth bounds the
//!   levels, and [`QUERY_STACK_BYTES`] is measured to hold the deepest
//!   allowed tree of each shape (`tests::the_deepest_allowed_queries_fit_the_stack`).
//! - **Priority.** Query threads run at nice +5: ingest (nice 0) first,
//!   then queries, then compaction (+10).
//! - **Cancellation.** A query that outlives its `timeout`, or whose client
//!   goes away, is canceled: the evaluation stops at its next check and
//!   its thread ends; its turn is held until then, so canceled work still
//!   counts against its tenant.

use super::budget::Cancel;
use crate::stats::Stats;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// The stack of a query's thread. Reserved address space: only the pages
/// a query touches are ever backed by memory.
pub const QUERY_STACK_BYTES: usize = 64 * 1024 * 1024;

/// The nice value of query threads.
const NICE: i32 = 5;

/// Why a query did not get to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Its tenant has `max_concurrent_queries` running and
    /// `max_queued_queries` waiting.
    Busy,
    /// Its `timeout` passed while it waited for a turn, or while it ran.
    Timeout,
    /// No thread could be started for it.
    NoThread(String),
}

/// One tenant's turns.
#[derive(Debug)]
struct Turns {
    running: Arc<Semaphore>,
    waiting: usize,
}

/// Turns for every tenant, and the threads queries run on.
#[derive(Debug)]
pub struct Admission {
    per_tenant: usize,
    queue: usize,
    tenants: Mutex<HashMap<String, Turns>>,
    stats: Arc<Stats>,
}

/// A query's turn: held until its evaluation ends.
#[derive(Debug)]
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    stats: Arc<Stats>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.stats.queries_running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a waiting query while it waits.
struct Waiting<'a> {
    admission: &'a Admission,
    tenant: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.admission.tenants.lock() {
            if let Some(t) = m.get_mut(self.tenant) {
                t.waiting = t.waiting.saturating_sub(1);
            }
        }
        self.admission
            .stats
            .queries_queued
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Cancels a query's evaluation when dropped unless disarmed: the request
/// was dropped (client gone) or answered with a timeout.
struct CancelOnDrop(Option<Cancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.cancel();
        }
    }
}

impl Admission {
    /// `per_tenant` queries of a tenant at once, `queue` more waiting.
    pub fn new(per_tenant: usize, queue: usize, stats: Arc<Stats>) -> Self {
        Self {
            per_tenant: per_tenant.max(1),
            queue,
            tenants: Mutex::default(),
            stats,
        }
    }

    /// A turn for one of `tenant`'s queries, waiting at most `wait`.
    pub async fn turn(&self, tenant: &str, wait: Duration) -> Result<Turn, Refused> {
        let running = {
            let mut m = self.tenants.lock().map_err(|_| Refused::Busy)?;
            let t = m.entry(tenant.to_string()).or_insert_with(|| Turns {
                running: Arc::new(Semaphore::new(self.per_tenant)),
                waiting: 0,
            });
            if let Ok(p) = t.running.clone().try_acquire_owned() {
                return Ok(self.running(p));
            }
            if t.waiting >= self.queue {
                return Err(Refused::Busy);
            }
            t.waiting += 1;
            t.running.clone()
        };
        self.stats.queries_queued.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting {
            admission: self,
            tenant,
        };
        match tokio::time::timeout(wait, running.acquire_owned()).await {
            Ok(Ok(p)) => Ok(self.running(p)),
            Ok(Err(_)) => Err(Refused::Busy),
            Err(_) => Err(Refused::Timeout),
        }
    }

    fn running(&self, permit: OwnedSemaphorePermit) -> Turn {
        self.stats.queries_running.fetch_add(1, Ordering::Relaxed);
        self.stats.queries.fetch_add(1, Ordering::Relaxed);
        Turn {
            _permit: permit,
            stats: self.stats.clone(),
        }
    }
}

/// Runs `f` on a thread of its own with the query stack, at the query
/// threads' priority (for work that takes no tenant's turn: a peer's
/// `Query/Select`).
pub async fn on_query_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Refused> {
    let (tx, rx) = oneshot::channel();
    spawn(move || {
        let _ = tx.send(f());
    })?;
    rx.await
        .map_err(|_| Refused::NoThread("the query's thread failed".into()))
}

/// Starts `f` on a query thread.
fn spawn(f: impl FnOnce() + Send + 'static) -> Result<(), Refused> {
    std::thread::Builder::new()
        .name("flopwatch-query".into())
        .stack_size(QUERY_STACK_BYTES)
        .spawn(move || {
            flopwatch_transport::priority::lower_thread_priority(NICE, "query");
            f();
        })
        .map(|_| ())
        .map_err(|e| Refused::NoThread(e.to_string()))
}

/// Runs `f` on a query thread holding `turn`, answering within `timeout`:
/// past it (or when the caller stops waiting) `cancel` is set, and `f` is
/// expected to notice it and return early.
pub async fn run<T: Send + 'static>(
    turn: Turn,
    timeout: Duration,
    cancel: Cancel,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Refused> {
    let (tx, rx) = oneshot::channel();
    spawn(move || {
        let out = f();
        // The turn ends with the work, after the answer is sent.
        let _ = tx.send(out);
        drop(turn);
    })?;
    let mut guard = CancelOnDrop(Some(cancel));
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(out)) => {
            guard.0 = None;
            Ok(out)
        }
        // The thread panicked (it sent nothing): reported as no thread.
        Ok(Err(_)) => Err(Refused::NoThread("the query's thread failed".into())),
        Err(_) => Err(Refused::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_proto::clock::Deadline;

    #[tokio::test]
    async fn a_tenant_waits_for_its_own_turns_only() {
        let stats = Arc::new(Stats::default());
        let a = Admission::new(1, 1, stats.clone());
        let first = a.turn("t1", Duration::from_secs(1)).await.unwrap();
        // Another tenant is not held up.
        let other = a.turn("t2", Duration::from_millis(10)).await.unwrap();
        assert_eq!(stats.queries_running.load(Ordering::Relaxed), 2);
        // t1's second query waits, and its third finds the queue full.
        let second = a.turn("t1", Duration::from_millis(30));
        let third = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            a.turn("t1", Duration::from_millis(30)).await
        };
        let (second, third) = tokio::join!(second, third);
        assert_eq!(second.unwrap_err(), Refused::Timeout);
        assert_eq!(third.unwrap_err(), Refused::Busy);
        drop(first);
        drop(other);
        assert_eq!(stats.queries_running.load(Ordering::Relaxed), 0);
        assert_eq!(stats.queries_queued.load(Ordering::Relaxed), 0);
        a.turn("t1", Duration::from_millis(10)).await.unwrap();
    }

    #[tokio::test]
    async fn a_timed_out_query_is_canceled_and_keeps_its_turn_until_it_stops() {
        let stats = Arc::new(Stats::default());
        let a = Admission::new(1, 0, stats.clone());
        let cancel = Cancel::default();
        let seen = cancel.clone();
        let turn = a.turn("t", Duration::from_secs(1)).await.unwrap();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let r = run(turn, Duration::from_millis(20), cancel, move || {
            while !seen.is_canceled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = stopped_tx.send(());
        })
        .await;
        assert_eq!(r.unwrap_err(), Refused::Timeout);
        stopped_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        // The thread drops its turn right after it stops (with no queue, a
        // turn asked a moment before that is refused as busy).
        let deadline = Deadline::after(Duration::from_secs(5));
        loop {
            match a.turn("t", Duration::from_secs(5)).await {
                Ok(_) => break,
                Err(Refused::Busy) if !deadline.passed() => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => panic!("the turn was never given back: {e:?}"),
            }
        }
    }
}
