//! When compaction and retention run, and on which thread.
//!
//! [`run_compactor`] runs a compaction pass ([`Store::compact`]) every
//! compaction interval and retention ([`Store::expire`]) every hour. A
//! pass over the head of a collector holding 10,000 agents walks about 1.7
//! million series, and retention walks each family's series: seconds of
//! one core. Run beside ingest at the same priority they take the core
//! the acknowledgements need, and the agents' ack latency goes from
//! milliseconds to seconds for as long as the pass lasts
//! (docs/BENCHMARKS.md, fleet). So the passes run on a thread of their
//! own, `flopwatch-compact`, at a lower CPU priority (nice +10): they use
//! the time ingest leaves, and still get a tenth of a core's share when
//! ingest wants every core, so the head never stops being compacted.
//! Their writes are applied on a second thread at ingest's priority
//! (`handoff.rs`): a write holds RocksDB's write queue, which a preempted
//! low-priority thread must not.

use super::handoff::{jobs_thread, HandOff, Job, Writer};
use super::hours::WINDOW_MS;
use super::{CompactionReport, Store, StoreError};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::{Deadline, Stopwatch};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest the compaction pass at shutdown runs.
const SHUTDOWN_PASS: Duration = Duration::from_secs(10);

/// The nice value of the compactor's thread (ingest runs at the process'
/// own, normally 0).
const NICE: i32 = 10;

/// The compactor's thread.
struct Worker {
    jobs: std::sync::mpsc::SyncSender<Job>,
}

impl Worker {
    /// Starts the thread; `None` (logged) when the system refuses one, and
    /// the passes then run on tokio's blocking pool.
    fn start() -> Option<Self> {
        match jobs_thread("flopwatch-compact", lower_priority) {
            Ok(jobs) => Some(Self { jobs }),
            Err(e) => {
                tracing::warn!(error = %e, "no compactor thread; compaction runs at ingest's priority");
                None
            }
        }
    }
}

/// Lowers the compactor thread's CPU priority to [`NICE`].
fn lower_priority() {
    flopwatch_transport::priority::lower_thread_priority(NICE, "compactor");
}

/// Runs `f` on the compactor's thread (on tokio's blocking pool without
/// one); `None` when it panicked.
async fn run<T: Send + 'static>(
    worker: Option<&Worker>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let Some(w) = worker else {
        return tokio::task::spawn_blocking(f).await.ok();
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    // One job at a time: the queue's one slot is always free here.
    w.jobs
        .send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .ok()?;
    rx.await.ok()
}

/// Runs folding and compaction on the store's schedule
/// ([`Store::with_compaction`], [`Store::with_spread`]) and retention
/// every hour, until `stop` turns true, which also interrupts a running
/// pass between two GPU-hours; then one last compaction pass (at most
/// 10 s), so hours sealed by then leave the head before the
/// store is closed (and flushed) rather than at the next start. Failures
/// are logged and retried on the next round.
pub async fn run_compactor(
    store: Store,
    clock: Arc<dyn Clock>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (every, seal_delay) = store.schedule;
    let seal_ms = i64::try_from(seal_delay.as_millis()).unwrap_or(i64::MAX);
    let worker = Worker::start();
    // Without the low-priority thread the passes run at ingest's priority
    // and write themselves.
    let store = match worker.as_ref().and(Writer::start()) {
        Some(writer) => Store {
            engine: Arc::new(HandOff::new(store.engine.clone(), writer)),
            ..store
        },
        None => store,
    };
    let mut last_expiry = i64::MIN;
    // Set when a stop arrives during a pass: the pass ends between two
    // GPU-hours (each one write, so nothing is left half done).
    let cancel = Arc::new(AtomicBool::new(false));
    // A pass starts every interval; one that ran past the next start is
    // followed at once by the next (folding fills what a pass leaves of
    // its interval, so a backlog keeps the thread busy, not idle).
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = ticks.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopping {
            let now = clock.now_ms();
            let s = store.clone();
            // Bounded, so a backlog cannot hold up the shutdown.
            let deadline = Deadline::after(SHUTDOWN_PASS);
            let pass = move || s.compact_within(now, seal_ms, Some(deadline));
            match run(worker.as_ref(), pass).await {
                Some(Ok(r)) if r.chunks > 0 => tracing::info!(?r, "compaction at shutdown"),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "compaction at shutdown failed"),
                None => tracing::warn!("compaction task failed"),
            }
            return;
        }
        let now = clock.now_ms();
        let expire = now.saturating_sub(last_expiry) >= WINDOW_MS;
        let s = store.clone();
        let halt = cancel.clone();
        let pass = run(worker.as_ref(), move || {
            let halted = || halt.load(Ordering::SeqCst);
            let started = Stopwatch::start();
            // Sealing first: an hour due is sealed from its bundles as
            // they are, folded or not, and a GPU-hour sealed unfolded
            // costs less than one folded and then sealed. On a machine
            // short of CPU the fold is what waits (docs/STORAGE.md).
            let mut r: CompactionReport = s.compact_until(now, seal_ms, &halted)?;
            let compacted = started.elapsed();
            if expire && !halted() {
                r.expired_ranges = s.expire()?.expired_ranges;
            }
            let expired = started.elapsed() - compacted;
            // Then folding, until the next pass is due; the GPUs it did
            // not reach wait in the queue.
            let next = Deadline::after(every.saturating_sub(started.elapsed()));
            let folded = s.fold(now, &|| halted() || next.passed())?;
            let fold_time = started.elapsed() - compacted - expired;
            Ok::<_, StoreError>((folded, r, fold_time, compacted, expired))
        });
        tokio::pin!(pass);
        let done = tokio::select! {
            r = &mut pass => Some(r),
            _ = stop.wait_for(|s| *s) => None,
        };
        let r = match done {
            Some(r) => r,
            None => {
                // Interrupt the pass; the loop then makes the bounded last
                // one.
                cancel.store(true, Ordering::SeqCst);
                pass.await
            }
        };
        match r {
            Some(Ok((folded, r, fold_time, compacted, expired))) => {
                if expire {
                    last_expiry = now;
                }
                // A pass that holds a core for seconds is worth a line.
                if fold_time + compacted + expired >= Duration::from_secs(1) {
                    tracing::info!(
                        ?folded,
                        ?r,
                        ?fold_time,
                        ?compacted,
                        ?expired,
                        "compaction pass"
                    );
                } else if r.chunks > 0 || r.expired_ranges > 0 || folded.folded > 0 {
                    tracing::debug!(?folded, ?r, ?fold_time, ?compacted, ?expired, "compaction");
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "compaction failed"),
            None => tracing::warn!("compaction task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_reads_below_ingest_and_writes_at_its_priority() {
        use crate::conformance::gpu_batch;
        use crate::tap::Tap;
        let e = Arc::new(Tap::default());
        let store =
            Store::new(e.clone(), false).with_compaction(Duration::from_millis(10), Duration::ZERO);
        // An hour long sealed.
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % WINDOW_MS;
        store.commit("t1", &gpu_batch(1, t0)).unwrap();
        let committed = e.writes.lock().unwrap().len();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let clock: Arc<dyn Clock> = Arc::new(flopwatch_proto::clock::SystemClock);
        let task = tokio::spawn(run_compactor(store.clone(), clock, stopped));
        let compacted = || {
            let mut head = 0;
            super::super::Engine::scan(
                &*e,
                super::super::Cf::Head,
                &[],
                &[0xff; 8],
                &mut |_, _| {
                    head += 1;
                    true
                },
            )
            .unwrap();
            head == 0
        };
        for _ in 0..500 {
            if compacted() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        assert!(compacted(), "the pass compacted the sealed hour");
        let writes = e.writes.lock().unwrap()[committed..].to_vec();
        let reads = e.reads.lock().unwrap().clone();
        assert!(!writes.is_empty());
        let ingest = rustix::process::getpriority_process(None).unwrap();
        for w in &writes {
            assert_eq!(w.name, "flopwatch-compact-write", "{writes:?}");
            assert_eq!(w.nice, ingest, "{writes:?}");
        }
        let pass: Vec<_> = reads
            .iter()
            .filter(|r| r.name == "flopwatch-compact")
            .collect();
        assert!(!pass.is_empty(), "{reads:?}");
        // NICE, or more where the tests themselves run niced further.
        assert!(pass.iter().all(|r| r.nice >= NICE), "{reads:?}");
        let samples = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 100)
            .unwrap();
        assert_eq!(samples.len(), 10);
    }

    #[test]
    fn the_compactor_thread_runs_below_ingest_and_survives_a_panic() {
        let w = Worker::start().expect("a thread");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let nice = rt.block_on(run(Some(&w), || {
            rustix::process::getpriority_process(Some(rustix::thread::gettid()))
        }));
        // NICE, or more where the tests themselves run niced further.
        assert!(nice.unwrap().unwrap() >= NICE);
        assert_eq!(
            rt.block_on(run(Some(&w), || panic!("a pass failed"))),
            None::<()>
        );
        assert_eq!(
            rt.block_on(run(Some(&w), || 7)),
            Some(7),
            "the next job runs"
        );
    }
}
