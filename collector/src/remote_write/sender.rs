//! The send loop: the journal's oldest entries, their points sharded by
//! series over concurrent requests, the entries deleted once every point
//! was delivered, refused or dropped by policy.
//!
//! One round reads at most `max_shards × max_samples_per_request` points
//! (at least one entry), drops those older than `max_age`, and splits the
//! rest by a hash of their labels into as many shards as the points fill
//! requests (up to `max_shards`): each series lies in one shard, in order,
//! and the shards send concurrently, each retrying its own request with
//! backoff until it is delivered or refused. A crash in a round sends that
//! round's points again after the restart: at most one round of
//! duplicates. A stop ends the round where it is and leaves its entries in
//! the journal.
//!
//! A round starts as soon as the journal holds a request's worth of
//! points (`max_samples_per_request`), else `interval` after the last:
//! at a fleet's rate, requests go out in even steps as points arrive, and
//! entries are deleted while still in RocksDB's memtable.
//!
//! The round's CPU work — its entries read back into points, each
//! request encoded — runs on the sender's own thread ([`Worker`]) in the
//! idle scheduling class; the async tasks only wait on it and on the
//! endpoint.

use super::endpoint::{backoff, encode, ErrorLog};
use super::queue::RemoteQueue;
use super::wire::{self, RawPoint, Span};
use super::Endpoint;
use crate::stats::Stats;
use flopwatch_config::RemoteWriteConfig;
use flopwatch_proto::clock::Clock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Sends the journal until `shutdown` flips.
pub(crate) async fn run(
    cfg: RemoteWriteConfig,
    queue: Arc<RemoteQueue>,
    stats: Arc<Stats>,
    clock: Arc<dyn Clock>,
    shutdown: watch::Receiver<bool>,
) {
    let endpoint = match Endpoint::new(&cfg) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "remote write disabled");
            return;
        }
    };
    sender(&endpoint, &cfg, &queue, &stats, &*clock, shutdown).await
}

/// Runs blocking store work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Which of `shards` the series with `labels` (as on the wire) goes to.
fn shard_of(labels: &[u8], shards: usize) -> usize {
    (wire::series_hash(labels) % shards.max(1) as u64) as usize
}

/// What a round's points came to.
#[derive(Debug, Default)]
struct Outcome {
    delivered: u64,
    refused: u64,
    /// A stop cut the round short.
    stopped: bool,
}

pub(super) async fn sender(
    endpoint: &Endpoint,
    cfg: &RemoteWriteConfig,
    queue: &RemoteQueue,
    stats: &Stats,
    clock: &dyn Clock,
    mut shutdown: watch::Receiver<bool>,
) {
    let log = Mutex::new(ErrorLog::default());
    let store = queue.store.clone();
    let worker = match Worker::start() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "remote write disabled: no encoding thread");
            return;
        }
    };
    // The backlog a previous run left.
    if let Ok((_, points, oldest)) = blocking({
        let s = store.clone();
        move || s.journal_backlog()
    })
    .await
    {
        queue
            .pending
            .store(i64::try_from(points).unwrap_or(i64::MAX), Ordering::Relaxed);
        queue
            .oldest_ms
            .store(oldest.unwrap_or(i64::MAX), Ordering::Relaxed);
        if points > 0 {
            tracing::info!(points, "remote write resumes with the journal's backlog");
        }
    }
    let window = (cfg.max_shards * cfg.max_samples_per_request) as u64;
    // A request's worth pending wakes the sender.
    queue.fill_at.store(
        i64::try_from(cfg.max_samples_per_request.max(1)).unwrap_or(i64::MAX),
        Ordering::Relaxed,
    );
    // Where the next read starts (`store::journal`).
    let mut cursor = 0u64;
    let max_age_ms = i64::try_from(cfg.max_age.as_millis()).unwrap_or(i64::MAX);
    let mut expired_at = i64::MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        // Staleness is judged at most once a second (a walk of the series
        // sent).
        let now = clock.now_ms();
        if now.saturating_sub(expired_at) >= 1_000 {
            expired_at = now;
            if let Err(e) = queue.expire(now) {
                tracing::warn!(error = %e, "remote write: staleness markers not journaled");
            }
        }
        // Past `max_queue_samples` pending: the oldest entries go.
        let over = queue.pending().saturating_sub(cfg.max_queue_samples as u64);
        let (entries, next) = match blocking({
            let s = store.clone();
            let from = cursor;
            move || s.journal_read(from, window.max(over.min(window * 4)))
        })
        .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "remote write: cannot read the journal");
                wait(&mut shutdown, cfg.interval).await;
                continue;
            }
        };
        if entries.is_empty() {
            cursor = next;
            if queue.pending() == 0 {
                queue.oldest_ms.store(i64::MAX, Ordering::Relaxed);
            }
            if !rest(&mut shutdown, queue, cfg.interval).await {
                return;
            }
            continue;
        }
        let now = clock.now_ms();
        let read: u64 = entries.iter().map(|e| u64::from(e.points)).sum();
        let keys: Vec<Vec<u8>> = entries.iter().map(|e| e.key.clone()).collect();
        let next_oldest = entries.last().map(|e| e.oldest_ms);
        let bodies: Vec<(bool, Vec<u8>)> =
            entries.into_iter().map(|e| (e.packed, e.body)).collect();
        let (per, max_shards) = (cfg.max_samples_per_request.max(1), cfg.max_shards.max(1));
        let Some((round, too_old, full)) = worker
            .run(move || Round::read(bodies, over, now, max_age_ms, per, max_shards))
            .await
        else {
            return;
        };
        if full > 0 {
            stats
                .remote_write_dropped
                .fetch_add(full, Ordering::Relaxed);
            tracing::warn!(
                samples = full,
                "remote write journal over max_queue_samples: oldest dropped"
            );
        }
        if too_old > 0 {
            stats
                .remote_write_expired
                .fetch_add(too_old, Ordering::Relaxed);
            tracing::warn!(
                samples = too_old,
                "remote write samples older than max_age dropped"
            );
        }
        let outcome = send_round(
            endpoint,
            &worker,
            cfg,
            stats,
            &log,
            Arc::new(round),
            &mut shutdown,
        )
        .await;
        if outcome.stopped {
            return;
        }
        stats
            .remote_write_samples
            .fetch_add(outcome.delivered, Ordering::Relaxed);
        stats
            .remote_write_refused
            .fetch_add(outcome.refused, Ordering::Relaxed);
        if let Err(e) = blocking({
            let s = store.clone();
            move || s.journal_done(keys)
        })
        .await
        {
            tracing::error!(error = %e, "remote write: sent entries not deleted; they will be sent again");
            wait(&mut shutdown, cfg.interval).await;
            continue;
        }
        cursor = next;
        queue
            .pending
            .fetch_sub(i64::try_from(read).unwrap_or(0), Ordering::Relaxed);
        if let Some(t) = next_oldest {
            // The next entries are at least as new as the last one sent.
            queue.oldest_ms.store(t, Ordering::Relaxed);
        }
        // Less than a full round: the journal is drained; what arrives
        // next goes out once it fills a request, or `interval` later. A
        // backlog goes out round after round.
        if read < window
            && queue.pending() < per as u64
            && !rest(&mut shutdown, queue, cfg.interval).await
        {
            return;
        }
    }
}

/// One round's points: their labels written out whole into one arena,
/// split by series into shards.
#[derive(Debug, Default)]
struct Round {
    arena: Vec<u8>,
    shards: Vec<Vec<Span>>,
}

impl Round {
    /// The points of the journal entries `bodies`, but the first `over`
    /// (past `max_queue_samples`) and those older than `max_age_ms` at
    /// `now`, over as many shards as they fill requests of `per` (at most
    /// `max_shards`); with how many were too old and how many over.
    fn read(
        bodies: Vec<(bool, Vec<u8>)>,
        mut over: u64,
        now: i64,
        max_age_ms: i64,
        per: usize,
        max_shards: usize,
    ) -> (Self, u64, u64) {
        let bytes: usize = bodies.iter().map(|(_, b)| b.len()).sum();
        let (mut arena, mut spans) = (Vec::with_capacity(bytes * 3), Vec::new());
        let mut full = 0u64;
        for (packed, body) in &bodies {
            let (from, bytes_from) = (spans.len(), arena.len());
            let expanded =
                wire::unpack(*packed, body).and_then(|b| wire::expand(&b, &mut arena, &mut spans));
            if expanded.is_none() {
                tracing::error!("malformed remote-write journal entry dropped");
                continue;
            }
            let n = (spans.len() - from) as u64;
            if over > 0 {
                over = over.saturating_sub(n);
                full += n;
                spans.truncate(from);
                arena.truncate(bytes_from);
            }
        }
        let before = spans.len();
        spans.retain(|x: &Span| now - x.ts_ms <= max_age_ms);
        let too_old = (before - spans.len()) as u64;
        let n = spans.len().div_ceil(per).clamp(1, max_shards);
        let mut shards: Vec<Vec<Span>> = vec![Vec::new(); n];
        for s in spans {
            let i = shard_of(&arena[s.labels.clone()], n);
            shards[i].push(s);
        }
        (Self { arena, shards }, too_old, full)
    }

    /// Points `at` of shard `shard`.
    fn points(&self, shard: usize, at: std::ops::Range<usize>) -> Vec<RawPoint<'_>> {
        self.shards[shard][at]
            .iter()
            .map(|s| RawPoint {
                labels: &self.arena[s.labels.clone()],
                ts_ms: s.ts_ms,
                value: s.value,
            })
            .collect()
    }
}

/// The sender's CPU work — reading entries back, encoding requests — on a
/// thread of its own in Linux's idle scheduling class
/// ([`flopwatch_transport::priority::idle_thread`]): a round of tens of
/// thousands of points never holds the threads that serve the agents'
/// streams, a thread of theirs that wakes takes the CPU from it at once,
/// and a busy machine acks batches before it forwards them (the journal
/// holds what waits; the pending gauges show it). Ends with its owner.
struct Worker {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Worker {
    fn start() -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("remote-write".into())
            .spawn(move || {
                flopwatch_transport::priority::idle_thread("remote write");
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        Ok(Self { jobs })
    }

    /// `f`'s result, run on the thread; `None` if the thread is gone.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .ok()?;
        rx.await.ok()
    }
}

/// Sends a round's shards concurrently, each in requests of at most
/// `max_samples_per_request` points, encoded on `worker`; each request is
/// retried until delivered or refused.
async fn send_round(
    endpoint: &Endpoint,
    worker: &Worker,
    cfg: &RemoteWriteConfig,
    stats: &Stats,
    log: &Mutex<ErrorLog>,
    round: Arc<Round>,
    shutdown: &mut watch::Receiver<bool>,
) -> Outcome {
    let per = cfg.max_samples_per_request.max(1);
    let stop = shutdown.clone();
    let results = futures::future::join_all((0..round.shards.len()).map(|shard| {
        let mut stop = stop.clone();
        let round = round.clone();
        async move {
            let mut out = Outcome::default();
            let len = round.shards[shard].len();
            for start in (0..len).step_by(per) {
                let at = start..(start + per).min(len);
                let n = at.len();
                let mut attempt = 0u32;
                loop {
                    let wire = endpoint.wire();
                    let (r, at) = (round.clone(), at.clone());
                    let Some(body) = worker.run(move || encode(wire, &r.points(shard, at))).await
                    else {
                        out.stopped = true;
                        return out;
                    };
                    match endpoint.post_encoded(body).await {
                        Ok(()) => {
                            if let Ok(mut l) = log.lock() {
                                l.succeeded(&endpoint.url, attempt);
                            }
                            out.delivered += n as u64;
                            break;
                        }
                        // 2.0 refused: at once again, as 1.0.
                        Err(e) if e.unsupported => {}
                        Err(e) => {
                            stats.remote_write_failure(e.reason);
                            if let Ok(mut l) = log.lock() {
                                l.failed(&endpoint.url, &e, n);
                            }
                            if !e.retried() {
                                out.refused += n as u64;
                                break;
                            }
                            attempt = attempt.saturating_add(1);
                            let delay = backoff(cfg, attempt, e.retry_after);
                            if !wait(&mut stop, delay).await {
                                out.stopped = true;
                                return out;
                            }
                        }
                    }
                }
            }
            out
        }
    }))
    .await;
    results.into_iter().fold(Outcome::default(), |mut a, o| {
        a.delivered += o.delivered;
        a.refused += o.refused;
        a.stopped |= o.stopped;
        a
    })
}

/// Waits until the journal's pending points fill a request, at most `d`
/// (as Prometheus' `batch_send_deadline`): at a fleet's rate the sender
/// sends a request's worth as it arrives, in even steps, rather than
/// `d`'s worth at once every `d`; `false` when `shutdown` flipped first.
async fn rest(shutdown: &mut watch::Receiver<bool>, queue: &RemoteQueue, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = queue.filled.notified() => true,
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

/// Waits `d`; `false` when `shutdown` flipped first.
async fn wait(shutdown: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = shutdown.wait_for(|s| *s) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::stub::{fast, run_until, Stub};
    use super::super::{labels, queue::entry_of, Point};
    use super::*;
    use crate::stats::Failure;
    use crate::store::memory::MemEngine;
    use crate::store::{CommitSet, Store};
    use flopwatch_proto::clock::{Stopwatch, SystemClock};
    use prost::Message;

    /// `n` points of GPU `gpu`'s OFU at 1 s, 2 s, …, committed as a batch
    /// would be (its entry with it).
    fn commit(q: &RemoteQueue, gpu: &str, n: i64, t0: i64) {
        let l = labels("flopwatch_ofu_ratio", &[("UUID".into(), gpu.into())]);
        let pts: Vec<Point> = (0..n)
            .map(|i| Point {
                labels: l.clone(),
                ts_ms: t0 + i * 1_000,
                value: 0.5,
            })
            .collect();
        let set = CommitSet {
            forward: entry_of(&pts),
            ..Default::default()
        };
        q.store.commit("t", &set).unwrap();
        q.committed(&set.forward);
    }

    fn queue(engine: Arc<MemEngine>) -> Arc<RemoteQueue> {
        Arc::new(RemoteQueue::new(
            Store::new(engine, false),
            Vec::new(),
            &Default::default(),
        ))
    }

    #[tokio::test]
    async fn retries_5xx_and_429_drops_other_4xx_without_retrying() {
        let stub = Stub::start(vec![
            (503, "overloaded"),
            (429, "slow down"),
            (400, "\nout of order sample\nsecond line"),
        ])
        .await;
        let mut cfg = fast(&stub.url);
        cfg.max_shards = 1;
        let stats = Arc::new(Stats::default());
        let q = queue(Arc::new(MemEngine::new()));
        let now = SystemClock.now_ms();
        commit(&q, "GPU-a", 3, now);
        commit(&q, "GPU-b", 3, now);
        run_until(&cfg, &q, &stats, || stub.requests().len() >= 4).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let reqs = stub.requests();
        assert_eq!(reqs.len(), 4, "503, 429 (both retried), 400 (dropped), 200");
        assert_eq!(reqs[0].1, reqs[1].1, "the 503's request was sent again");
        assert_eq!(reqs[1].1, reqs[2].1, "the 429's request was sent again");
        assert_ne!(reqs[2].1, reqs[3].1, "the 400's request was not sent again");
        for (head, _) in &reqs {
            assert!(head.contains("content-encoding: snappy"), "{head}");
            assert!(head.contains("x-prometheus-remote-write-version: 0.1.0"));
        }
        let f = |r| stats.remote_write_failures(r);
        assert_eq!(f(Failure::ServerError), 1);
        assert_eq!(f(Failure::TooManyRequests), 1);
        assert_eq!(f(Failure::ClientError), 1);
        assert_eq!(Stats::get(&stats.remote_write_refused), 3);
        assert_eq!(Stats::get(&stats.remote_write_samples), 3);
        assert!(q.store.journal_read(0, u64::MAX).unwrap().0.is_empty());
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test]
    async fn a_request_s_worth_goes_out_at_once_less_waits_for_the_interval() {
        let stub = Stub::start(Vec::new()).await;
        let mut cfg = fast(&stub.url);
        cfg.interval = Duration::from_secs(3_600);
        cfg.max_samples_per_request = 4;
        let endpoint = Endpoint::new(&cfg).unwrap();
        let stats = Arc::new(Stats::default());
        let q = queue(Arc::new(MemEngine::new()));
        let (stop, stop_rx) = watch::channel(false);
        let task = {
            let (cfg, q, stats) = (cfg.clone(), q.clone(), stats.clone());
            tokio::spawn(
                async move { sender(&endpoint, &cfg, &q, &stats, &SystemClock, stop_rx).await },
            )
        };
        // The sender has found the journal empty and rests.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = SystemClock.now_ms();
        // Three points: less than a request, so they wait (here, for an
        // hour).
        commit(&q, "GPU-a", 3, now);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stub.requests().is_empty(), "sent before a request filled");
        // The fourth fills a request: sent now, all four.
        commit(&q, "GPU-b", 1, now);
        super::super::stub::wait_for("the filled request", || {
            Stats::get(&stats.remote_write_samples) == 4
        })
        .await;
        assert_eq!(stub.requests().len(), 1);
        // And so on, batch after batch, without the interval between.
        commit(&q, "GPU-c", 5, now);
        super::super::stub::wait_for("the next request", || {
            Stats::get(&stats.remote_write_samples) == 9
        })
        .await;
        let _ = stop.send(true);
        task.await.unwrap();
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test]
    async fn the_journal_outlives_an_outage_and_a_restart() {
        // Nothing listens: every attempt fails, nothing is dropped.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let down = format!("http://{}/api/v1/write", l.local_addr().unwrap());
        drop(l);
        let engine = Arc::new(MemEngine::new());
        let stats = Arc::new(Stats::default());
        let q = queue(engine.clone());
        let now = SystemClock.now_ms();
        for g in ["GPU-a", "GPU-b", "GPU-c"] {
            commit(&q, g, 4, now);
        }
        run_until(&fast(&down), &q, &stats, || {
            stats.remote_write_failures(Failure::Connection) >= 2
        })
        .await;
        assert_eq!(q.store.journal_backlog().unwrap().1, 12, "nothing dropped");
        // A new collector over the same store (a restart) finds the
        // backlog and delivers all of it, each series whole and in order.
        let stub = Stub::start(Vec::new()).await;
        let q2 = queue(engine);
        let stats2 = Arc::new(Stats::default());
        run_until(&fast(&stub.url), &q2, &stats2, || {
            Stats::get(&stats2.remote_write_samples) >= 12
        })
        .await;
        assert_eq!(Stats::get(&stats2.remote_write_samples), 12);
        assert!(q2.store.journal_read(0, u64::MAX).unwrap().0.is_empty());
        let mut seen: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        for (_, body) in stub.requests() {
            let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
            let req = super::super::WriteRequest::decode(&raw[..]).unwrap();
            for s in req.timeseries {
                let uuid = s
                    .labels
                    .iter()
                    .find(|l| l.name == "UUID")
                    .unwrap()
                    .value
                    .clone();
                seen.entry(uuid)
                    .or_default()
                    .extend(s.samples.iter().map(|x| x.timestamp));
            }
        }
        assert_eq!(seen.len(), 3);
        for ts in seen.values() {
            assert_eq!(ts.len(), 4);
            assert!(ts.windows(2).all(|w| w[0] < w[1]), "{ts:?}");
        }
    }

    #[tokio::test]
    async fn old_points_and_a_journal_past_its_bound_are_dropped_and_counted() {
        let stub = Stub::start(Vec::new()).await;
        let mut cfg = fast(&stub.url);
        cfg.max_age = Duration::from_secs(3600);
        cfg.max_queue_samples = 6;
        let stats = Arc::new(Stats::default());
        let q = queue(Arc::new(MemEngine::new()));
        let now = SystemClock.now_ms();
        commit(&q, "GPU-old", 3, now - 7_200_000);
        commit(&q, "GPU-a", 3, now);
        commit(&q, "GPU-b", 3, now);
        commit(&q, "GPU-c", 3, now);
        run_until(&cfg, &q, &stats, || q.pending() == 0).await;
        // 12 pending, 6 allowed: the oldest 6 (GPU-old's and GPU-a's) go
        // as queue_full; the rest are sent.
        assert_eq!(Stats::get(&stats.remote_write_dropped), 6);
        assert_eq!(Stats::get(&stats.remote_write_samples), 6);
        // Within the bound, a point past max_age is dropped as such.
        let q = queue(Arc::new(MemEngine::new()));
        let stats = Arc::new(Stats::default());
        commit(&q, "GPU-old", 2, now - 7_200_000);
        commit(&q, "GPU-a", 2, now);
        run_until(&cfg, &q, &stats, || q.pending() == 0).await;
        assert_eq!(Stats::get(&stats.remote_write_expired), 2);
        assert_eq!(Stats::get(&stats.remote_write_samples), 2);
    }

    /// A receiver that answers every request 204 after `delay`, requests
    /// served concurrently; counts them.
    async fn slow_receiver(delay: Duration) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::AsyncWriteExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v1/write", l.local_addr().unwrap());
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = n.clone();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    if super::super::stub::read_request(&mut c).await.is_none() {
                        return;
                    }
                    tokio::time::sleep(delay).await;
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = c
                        .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                        .await;
                });
            }
        });
        (url, n)
    }

    #[tokio::test]
    async fn a_slow_receiver_is_fed_by_concurrent_shards() {
        // 400 ms an answer, 3 points a request, 24 points in the journal:
        // 8 requests. One at a time they take 3.2 s; over 8 shards, one
        // round of 400 ms.
        let (url, answered) = slow_receiver(Duration::from_millis(400)).await;
        let cfg = fast(&url);
        assert_eq!(cfg.max_shards, 8);
        let stats = Arc::new(Stats::default());
        let q = queue(Arc::new(MemEngine::new()));
        let now = SystemClock.now_ms();
        for g in 0..8 {
            commit(&q, &format!("GPU-{g}"), 3, now);
        }
        let started = Stopwatch::start();
        run_until(&cfg, &q, &stats, || q.pending() == 0).await;
        let took = started.elapsed();
        assert_eq!(Stats::get(&stats.remote_write_samples), 24);
        assert!(answered.load(Ordering::SeqCst) >= 8);
        assert!(
            took < Duration::from_millis(2_000),
            "8 requests of 400 ms took {took:?}: not concurrent"
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn encoding_runs_in_the_idle_class_and_ingest_does_not() {
        use flopwatch_transport::priority::is_idle_thread;
        let w = Worker::start().unwrap();
        let (idle, nice) = w
            .run(|| {
                let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()));
                (is_idle_thread(), nice.unwrap())
            })
            .await
            .unwrap();
        // The idle class, or nice 19 where a sandbox refuses it.
        assert!(
            idle || nice == 19,
            "encoding thread: idle {idle}, nice {nice}"
        );
        assert!(!is_idle_thread());
        drop(w);
    }

    #[test]
    fn a_series_keeps_to_one_shard_and_shards_fill() {
        let body = |g: usize, t: i64| {
            super::super::encode_points(&[Point {
                labels: labels("x", &[("UUID".into(), format!("GPU-{g}"))]),
                ts_ms: t,
                value: 1.0,
            }])
        };
        let shard = |b: &[u8]| {
            let mut raw = Vec::new();
            wire::read(b, &mut raw).unwrap();
            shard_of(raw[0].labels, 4)
        };
        let mut used = std::collections::BTreeSet::new();
        for g in 0..64 {
            let s = shard(&body(g, 1));
            assert_eq!(s, shard(&body(g, 2)));
            used.insert(s);
        }
        assert_eq!(used.len(), 4);
    }
}
