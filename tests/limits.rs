//! Per-tenant limits end to end (docs/SECURITY.md, "Limits"): a flooding
//! tenant cannot queue its writes ahead of another tenant's, a batch over
//! the ingest rate is deferred — not lost — and sent again by the agent,
//! and samples of series past `max_series` are refused by reason.

use flopwatch_agent::source::sim::SimSource;
use flopwatch_agent::AgentOptions;
use flopwatch_collector::server;
use flopwatch_collector::store::memory::MemEngine;
use flopwatch_collector::store::{Cf, Engine, Op, Store, StoreError, View};
use flopwatch_collector::{digest, Auth};
use flopwatch_collector::{Collector, Settings};
use flopwatch_config::{CollectorConfig, LimitsOverride, SpecTable, TenantConfig};
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::{self, collector_message};
use flopwatch_sim::FleetPlan;
use flopwatch_tests::raw::{self, RawAgent};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::Code;

/// An engine that takes one write at a time, each slow (as a disk under
/// load would), and records how many writes of the tenant `flooder` were
/// queued or in progress when each write of the tenant `quiet` arrived.
#[derive(Default)]
struct Queueing {
    one_at_a_time: Mutex<()>,
    flooder_inside: AtomicUsize,
    /// Most `flooder` writes inside at once.
    flooder_max: AtomicUsize,
    /// Most `flooder` writes ahead of one `quiet` write.
    quiet_saw_max: AtomicUsize,
    quiet_writes: AtomicU64,
}

fn tenant_of(ops: &[Op]) -> Option<&'static str> {
    let has = |k: &[u8], t: &[u8]| k.windows(t.len()).any(|w| w == t);
    ops.iter().find_map(|op| {
        let k = match op {
            Op::Put(_, k, _) | Op::Delete(_, k) | Op::DeleteRange(_, k, _) => k,
        };
        if has(k, b"flooder") {
            Some("flooder")
        } else if has(k, b"quiet") {
            Some("quiet")
        } else {
            None
        }
    })
}

impl OnWrite for Queueing {
    fn apply(&self, inner: &MemEngine, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        let who = tenant_of(&ops);
        match who {
            Some("flooder") => {
                let n = self.flooder_inside.fetch_add(1, Ordering::SeqCst) + 1;
                self.flooder_max.fetch_max(n, Ordering::SeqCst);
            }
            Some("quiet") => {
                let ahead = self.flooder_inside.load(Ordering::SeqCst);
                self.quiet_saw_max.fetch_max(ahead, Ordering::SeqCst);
                self.quiet_writes.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        let r = {
            let _one = self.one_at_a_time.lock().unwrap();
            std::thread::sleep(Duration::from_millis(3));
            inner.apply(ops, sync)
        };
        if who == Some("flooder") {
            self.flooder_inside.fetch_sub(1, Ordering::SeqCst);
        }
        r
    }
}

/// What a test engine does around each write; everything else goes
/// straight to the in-memory engine.
trait OnWrite: Send + Sync + 'static {
    fn apply(&self, inner: &MemEngine, ops: Vec<Op>, sync: bool) -> Result<(), StoreError>;
}

/// The in-memory engine with `W` around its writes.
struct TestEngine<W> {
    inner: MemEngine,
    on_write: W,
}

impl<W: Default> TestEngine<W> {
    fn new() -> Arc<Self> {
        Arc::new(TestEngine {
            inner: MemEngine::new(),
            on_write: W::default(),
        })
    }
}

impl<W> std::ops::Deref for TestEngine<W> {
    type Target = W;
    fn deref(&self) -> &W {
        &self.on_write
    }
}

impl<W: OnWrite> Engine for TestEngine<W> {
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        self.on_write.apply(&self.inner, ops, sync)
    }
    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.inner.view(f)
    }
    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.inner.compact_range(cf, from, to)
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(cf, key)
    }
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.scan(cf, from, to, f)
    }
    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.inner.delete_range(cf, from, to)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn disk_bytes(&self) -> u64 {
        0
    }
}

/// A raw agent of the tenant holding `token`, for `node` with one GPU.
async fn agent(url: &str, token: &str, node: &str, gpu: &str) -> (RawAgent, v1::Welcome) {
    RawAgent::open(channel(url).await, Some(token), raw::hello(node, node, gpu))
        .await
        .unwrap()
}

fn two_tenants(commits: u32) -> CollectorConfig {
    let t = |name: &str| TenantConfig {
        name: name.into(),
        agent_tokens_sha256: vec![digest(&format!("{name}-token"))],
        ..Default::default()
    };
    let mut cfg = CollectorConfig {
        tenants: vec![t("flooder"), t("quiet")],
        plaintext: true,
        ..Default::default()
    };
    cfg.limits.max_concurrent_commits = commits;
    cfg
}

async fn start(
    cfg: &CollectorConfig,
    engine: Arc<dyn Engine>,
) -> (Arc<Collector>, server::Loopback) {
    let c = Collector::new(
        Store::new(engine, false),
        SpecTable::builtin(),
        Auth::from_config(cfg),
        Settings::from_config(cfg, Vec::new()),
        Arc::new(SystemClock),
    )
    .unwrap();
    let l = server::Loopback::start(c.clone()).await.unwrap();
    (c, l)
}

async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Starts `streams` flooding agents that keep 4 batches in flight each,
/// until `stop` is set.
fn flood(
    url: String,
    streams: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..streams)
        .map(|i| {
            let url = url.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let node = format!("flood-node-{i}");
                let gpu = format!("GPU-flood-{i}");
                let (mut a, _) = agent(&url, "flooder-token", &node, &gpu).await;
                let now = SystemClock.now_ms();
                let (mut sent, mut acked) = (0u64, 0u64);
                while !stop.load(Ordering::SeqCst) {
                    while sent < acked + 4 {
                        sent += 1;
                        a.send(raw::batch(
                            sent,
                            &gpu,
                            now - 60_000 + sent as i64 * 1000,
                            50,
                            0.7,
                            500.0,
                            None,
                        ))
                        .await;
                    }
                    match a.next().await {
                        Ok(collector_message::Msg::Ack(_)) => acked += 1,
                        _ => break,
                    }
                }
                acked
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_cannot_queue_its_writes_ahead_of_another() {
    // With the default of 2 commit slots per tenant.
    let engine = TestEngine::<Queueing>::new();
    let cfg = two_tenants(2);
    let (_c, server) = start(&cfg, engine.clone()).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders = flood(server.url.clone(), 16, stop.clone());
    // The quiet tenant sends 30 batches, one at a time, while the flood
    // goes on.
    let (mut q, _) = agent(&server.url, "quiet-token", "quiet-node", "GPU-quiet").await;
    let now = SystemClock.now_ms();
    for seq in 1..=30u64 {
        let r = q
            .call(raw::batch(
                seq,
                "GPU-quiet",
                now - 60_000 + seq as i64 * 1000,
                50,
                0.4,
                300.0,
                None,
            ))
            .await
            .unwrap();
        assert!(matches!(r, collector_message::Msg::Ack(_)), "{r:?}");
    }
    stop.store(true, Ordering::SeqCst);
    let mut flood_acked = 0;
    for f in flooders {
        flood_acked += f.await.unwrap();
    }
    let quiet_max = engine.quiet_saw_max.load(Ordering::SeqCst);
    let flood_max = engine.flooder_max.load(Ordering::SeqCst);
    assert!(engine.quiet_writes.load(Ordering::SeqCst) >= 30);
    assert!(
        flood_acked > 16,
        "the flood made progress ({flood_acked} batches)"
    );
    // 2 commit slots, and 2 registration slots for its agents' Hellos.
    assert!(
        flood_max <= 4,
        "the flooder had {flood_max} writes in storage at once"
    );
    assert!(
        quiet_max <= 4,
        "a quiet write waited behind {quiet_max} of the flooder's"
    );
    server.stop().await.unwrap();

    // Control: with 16 slots the same flood does put more than 4 of its
    // writes ahead of the storage queue (so the measure above can fail).
    let engine = TestEngine::<Queueing>::new();
    let (_c, server) = start(&two_tenants(16), engine.clone()).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders = flood(server.url.clone(), 16, stop.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while engine.flooder_max.load(Ordering::SeqCst) <= 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for f in flooders {
        let _ = f.await;
    }
    assert!(
        engine.flooder_max.load(Ordering::SeqCst) > 4,
        "without the limit the flood never queued more than 4 writes"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_rate_is_deferred_then_accepted_in_order() {
    let mut cfg = two_tenants(2);
    // 100 samples/s with a bucket of 1,000: slow enough that the bucket
    // hardly refills while the first batches are answered.
    cfg.tenants[1].limits = LimitsOverride {
        ingest_rate: Some(100),
        ingest_burst: Some(1000),
        ..Default::default()
    };
    let (c, server) = start(&cfg, Arc::new(MemEngine::new())).await;
    let (mut a, _) = agent(&server.url, "quiet-token", "n", "GPU-q").await;
    let now = SystemClock.now_ms();
    // 150 samples a batch: 6 pass on the full bucket (900), the 7th waits.
    for seq in 1..=6u64 {
        let r = a
            .call(raw::batch(
                seq,
                "GPU-q",
                now - 50_000 + seq as i64 * 1000,
                50,
                0.4,
                300.0,
                None,
            ))
            .await
            .unwrap();
        assert!(matches!(r, collector_message::Msg::Ack(_)), "{seq}: {r:?}");
    }
    a.send(raw::batch(7, "GPU-q", now - 40_000, 50, 0.4, 300.0, None))
        .await;
    a.send(raw::batch(8, "GPU-q", now - 39_000, 50, 0.4, 300.0, None))
        .await;
    let r7 = a.next().await.unwrap();
    let r8 = a.next().await.unwrap();
    let (collector_message::Msg::Reject(r7), collector_message::Msg::Reject(r8)) = (r7, r8) else {
        panic!("expected two deferrals")
    };
    assert_eq!(
        (r7.seq, r7.code, r7.reason.as_str()),
        (7, Code::ResourceExhausted as i32, "rate_limited")
    );
    assert!(r7.retry_after_ms > 0 && r7.retry_after_ms <= 1500, "{r7:?}");
    // 8 comes behind the deferred 7: deferred too, not consumed.
    assert_eq!((r8.seq, r8.reason.as_str()), (8, "rate_limited"));
    assert!(r8.retry_after_ms > 0);
    tokio::time::sleep(Duration::from_millis(r7.retry_after_ms + 50)).await;
    // Sent again in order after the delay: both stored, none a duplicate.
    for seq in [7u64, 8] {
        match a
            .call(raw::batch(
                seq,
                "GPU-q",
                now - 47_000 + seq as i64 * 1000,
                50,
                0.4,
                300.0,
                None,
            ))
            .await
            .unwrap()
        {
            collector_message::Msg::Ack(ack) => {
                assert!(!ack.duplicate && ack.accepted_samples == 150, "{ack:?}")
            }
            collector_message::Msg::Reject(r) => {
                // The bucket refills 100/s: 8 waits for its own turn.
                tokio::time::sleep(Duration::from_millis(r.retry_after_ms + 50)).await;
                let again = a
                    .call(raw::batch(
                        seq,
                        "GPU-q",
                        now - 47_000 + seq as i64 * 1000,
                        50,
                        0.4,
                        300.0,
                        None,
                    ))
                    .await
                    .unwrap();
                assert!(
                    matches!(again, collector_message::Msg::Ack(ref k) if !k.duplicate),
                    "{again:?}"
                );
            }
            m => panic!("{m:?}"),
        }
    }
    let rejects = c.stats.batch_rejects();
    assert!(
        rejects
            .iter()
            .any(|((t, r), n)| t == "quiet" && r == "rate_limited" && *n >= 2),
        "{rejects:?}"
    );
    assert_eq!(c.stats.samples_accepted.load(Ordering::Relaxed), 8 * 150);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_past_the_tenant_cap_are_refused_by_reason() {
    let mut cfg = two_tenants(2);
    cfg.tenants[1].limits.max_series = Some(4);
    let (c, server) = start(&cfg, Arc::new(MemEngine::new())).await;
    let (mut a, _) = agent(&server.url, "quiet-token", "n", "GPU-q").await;
    let now = SystemClock.now_ms();
    // 3 series: all in.
    let ack = match a
        .call(raw::batch(1, "GPU-q", now - 5000, 10, 0.4, 300.0, None))
        .await
        .unwrap()
    {
        collector_message::Msg::Ack(k) => k,
        m => panic!("{m:?}"),
    };
    assert_eq!(ack.accepted_samples, 30);
    // 3 known + 2 new: one new fits, one is refused.
    let mut b = raw::batch(2, "GPU-q", now - 3000, 10, 0.4, 300.0, None);
    for m in ["dram_active", "temp_c"] {
        let mut s = b.series[2].clone();
        s.metric = m.into();
        s.values = vec![0.5; 10];
        b.series.push(s);
    }
    let ack = match a.call(b).await.unwrap() {
        collector_message::Msg::Ack(k) => k,
        m => panic!("{m:?}"),
    };
    assert_eq!(ack.accepted_samples, 40);
    assert_eq!(ack.rejected.len(), 1);
    assert_eq!(
        (ack.rejected[0].reason.as_str(), ack.rejected[0].samples),
        ("series_limit", 10)
    );
    assert!(c
        .stats
        .rejected_by_tenant()
        .iter()
        .any(|((t, r), n)| t == "quiet" && r.name() == "series_limit" && *n == 10));
    // The other tenant is not limited.
    let (mut f, _) = agent(&server.url, "flooder-token", "f", "GPU-f").await;
    let mut b = raw::batch(1, "GPU-f", now - 3000, 10, 0.4, 300.0, None);
    for m in ["dram_active", "temp_c"] {
        let mut s = b.series[2].clone();
        s.metric = m.into();
        s.values = vec![0.5; 10];
        b.series.push(s);
    }
    match f.call(b).await.unwrap() {
        collector_message::Msg::Ack(k) => assert_eq!(k.accepted_samples, 50),
        m => panic!("{m:?}"),
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_its_tenant_rate_slows_down_and_loses_nothing() {
    let mut cfg = CollectorConfig {
        anonymous_tenant: Some("default".into()),
        plaintext: true,
        ..Default::default()
    };
    // The sim node sends about 1,800 samples/s (8 GPUs): well over.
    cfg.limits.ingest_rate = 900;
    let (c, server) = start(&cfg, Arc::new(MemEngine::new())).await;
    let fleet = FleetPlan::new(1, 8, 60_000);
    let src = SimSource::new(&fleet, 0, SystemClock.now_ms(), 11);
    let agent = flopwatch_agent::Agent::start(
        Box::new(src),
        Box::new(flopwatch_agent::FixedSampler::new(Duration::from_millis(
            100,
        ))),
        AgentOptions {
            flush_interval: Duration::from_millis(500),
            max_in_flight: 1024,
            drain_timeout: Duration::from_secs(30),
            ..AgentOptions::new(
                NodeIdentity::named("rate-node", "b"),
                vec![server.url.clone()],
            )
        },
        Arc::new(flopwatch_agent::TokioClock::new()),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (outbox, stats, state) = (
        agent.outbox.clone(),
        agent.stats.clone(),
        agent.state.clone(),
    );
    agent.stop().await;
    let produced = stats.samples.load(Ordering::Relaxed);
    let throttled = state.borrow().throttled;
    assert!(throttled > 0, "the agent was never told to slow down");
    assert_eq!(outbox.stats.dropped_samples.load(Ordering::Relaxed), 0);
    assert_eq!(outbox.stats.rejected_batches.load(Ordering::Relaxed), 0);
    assert_eq!(outbox.stats.acked_samples.load(Ordering::Relaxed), produced);
    assert_eq!(
        c.stats.samples_accepted.load(Ordering::Relaxed),
        produced,
        "stored = produced"
    );
    server.stop().await.unwrap();
}

/// Writes wait while the test holds `gate`.
#[derive(Default)]
struct Gated {
    gate: std::sync::RwLock<()>,
}

impl OnWrite for Gated {
    fn apply(&self, inner: &MemEngine, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        let _open = self.gate.read().unwrap();
        inner.apply(ops, sync)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // the held write lock is the stalled disk
async fn batches_are_deferred_at_once_while_storage_is_behind_by_the_slot_wait() {
    let cfg = two_tenants(1);
    let engine = TestEngine::<Gated>::new();
    let (c, server) = start(&cfg, engine.clone()).await;
    let (mut a, _) = agent(&server.url, "quiet-token", "na", "GPU-a").await;
    let (mut b, _) = agent(&server.url, "quiet-token", "nb", "GPU-b").await;
    let (mut d, _) = agent(&server.url, "quiet-token", "nd", "GPU-d").await;
    let now = SystemClock.now_ms();
    let batch = |seq: u64, gpu: &str| {
        raw::batch(
            seq,
            gpu,
            now - 10_000 + seq as i64 * 1000,
            5,
            0.4,
            300.0,
            None,
        )
    };
    // The disk stalls: a's batch takes the tenant's only slot and waits
    // in storage; b's waits in the tenant's line.
    // Held across awaits on purpose: the write lock is the stalled disk.
    #[allow(clippy::readonly_write_lock)]
    let stalled = engine.gate.write().unwrap();
    a.send(batch(1, "GPU-a")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.send(batch(1, "GPU-b")).await;
    tokio::time::sleep(flopwatch_collector::SLOT_WAIT + Duration::from_millis(200)).await;
    // b's batch has waited past the slot wait: d's are deferred as they
    // arrive, well before the agent's ack timeout.
    let asked = Stopwatch::start();
    d.send(batch(1, "GPU-d")).await;
    d.send(batch(2, "GPU-d")).await;
    let (r1, r2) = (d.next().await.unwrap(), d.next().await.unwrap());
    let waited = asked.elapsed();
    let (collector_message::Msg::Reject(r1), collector_message::Msg::Reject(r2)) = (r1, r2) else {
        panic!("expected two deferrals");
    };
    assert!(waited < flopwatch_collector::SLOT_WAIT, "{waited:?}");
    assert_eq!(
        (r1.seq, r1.code, r1.reason.as_str()),
        (1, Code::ResourceExhausted as i32, "busy")
    );
    assert!((1000..2000).contains(&r1.retry_after_ms), "{r1:?}");
    // 2 comes behind the deferred 1: deferred too, not consumed.
    assert_eq!((r2.seq, r2.reason.as_str()), (2, "busy"));
    // The disk comes back: a's batch is stored, then b's, which waited in
    // line; d's, sent again, are stored.
    drop(stalled);
    for (who, x) in [("a", &mut a), ("b", &mut b)] {
        let r = x.next().await.unwrap();
        assert!(
            matches!(r, collector_message::Msg::Ack(ref k) if !k.duplicate && k.accepted_samples == 15),
            "{who}: {r:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(r1.retry_after_ms + 50)).await;
    for seq in [1, 2] {
        let r = d.call(batch(seq, "GPU-d")).await.unwrap();
        assert!(
            matches!(r, collector_message::Msg::Ack(ref k) if !k.duplicate && k.accepted_samples == 15),
            "{seq}: {r:?}"
        );
    }
    let rejects = c.stats.batch_rejects();
    assert!(
        rejects
            .iter()
            .any(|((t, r), n)| t == "quiet" && r == "busy" && *n == 2),
        "{rejects:?}"
    );
    server.stop().await.unwrap();
}

/// Writes take 30 ms each; counts the writes holding head blocks.
#[derive(Default)]
struct Slow {
    head_writes: AtomicUsize,
}

impl OnWrite for Slow {
    fn apply(&self, inner: &MemEngine, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        if ops.iter().any(|op| matches!(op, Op::Put(Cf::Head, ..))) {
            self.head_writes.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(30));
        inner.apply(ops, sync)
    }
}

/// With one commit slot and a slow disk, a tenant's batches that arrive
/// while a write runs go to storage together in the next one: twenty
/// agents' batches in a handful of writes, every one acknowledged and
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_waiting_for_storage_are_written_together() {
    let cfg = two_tenants(1);
    let engine = TestEngine::<Slow>::new();
    let (c, server) = start(&cfg, engine.clone()).await;
    let now = SystemClock.now_ms();
    let mut agents = Vec::new();
    for i in 0..20 {
        let (a, _) = agent(
            &server.url,
            "quiet-token",
            &format!("n{i}"),
            &format!("GPU-{i}"),
        )
        .await;
        agents.push(a);
    }
    let before = engine.head_writes.load(Ordering::SeqCst);
    for (i, a) in agents.iter_mut().enumerate() {
        a.send(raw::batch(
            1,
            &format!("GPU-{i}"),
            now - 5_000,
            5,
            0.4,
            300.0,
            None,
        ))
        .await;
    }
    for (i, a) in agents.iter_mut().enumerate() {
        let r = a.next().await.unwrap();
        assert!(
            matches!(r, collector_message::Msg::Ack(ref k) if !k.duplicate && k.accepted_samples == 15),
            "{i}: {r:?}"
        );
    }
    let writes = engine.head_writes.load(Ordering::SeqCst) - before;
    // One write per batch would be 20 (each 30 ms: 600 ms in all).
    assert!((1..=10).contains(&writes), "{writes} writes for 20 batches");
    assert_eq!(c.stats.samples_accepted.load(Ordering::Relaxed), 20 * 15);
    server.stop().await.unwrap();
}

/// One tenant's hostile queries (the shapes that used to overflow the
/// stack, and expensive range queries back to back) take its own turns
/// only: the collector stays up, every hostile query gets an answer, and
/// ingest acknowledges batches throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_leave_ingest_acknowledging() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = CollectorConfig {
        anonymous_tenant: Some("default".into()),
        data_dir: dir.path().join("data"),
        plaintext: true,
        ..Default::default()
    };
    let tc =
        flopwatch_tests::TestCollector::start_config(&cfg, Auth::anonymous("default"), Vec::new())
            .await;
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", api.local_addr().unwrap());
    let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(flopwatch_collector::promql::serve(
        tc.collector.clone(),
        api,
        None,
        async move {
            let _ = api_stopped.await;
        },
    ));
    let fleet = FleetPlan::new(1, 8, 60_000);
    let src = SimSource::new(&fleet, 0, SystemClock.now_ms(), 5);
    let agent = flopwatch_tests::agent(
        Box::new(src),
        "busy-node",
        &tc.url,
        Duration::from_millis(100),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    let nest = |f: &str, n: usize| format!("{}x{}", f.repeat(n), ")".repeat(n));
    let hostile: Vec<String> = vec![
        nest("abs(", 10_000),
        nest("sum(", 5_000),
        nest("(", 4_000),
        vec!["x"; 5_000].join(" + "),
        vec!["1"; 1_000].join("+"),
        "count_over_time({__name__=~\"flopwatch_.+\"}[1h])".into(),
        "sum by (UUID) (rate(flopwatch_gpu_energy_joules_total[1m]))".into(),
    ];
    let acked = |c: &Collector| c.stats.batches_acked.load(Ordering::Relaxed);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let mut senders = Vec::new();
    for k in 0..6 {
        let (url, stop, answers, hostile) = (
            api_url.clone(),
            stop.clone(),
            answers.clone(),
            hostile.clone(),
        );
        senders.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let now = SystemClock.now_ms() / 1000;
            let mut i = k;
            while !stop.load(Ordering::SeqCst) {
                let q = &hostile[i % hostile.len()];
                i += 1;
                let r = http
                    .post(format!("{url}/api/v1/query_range"))
                    .form(&[
                        ("query", q.as_str()),
                        ("start", &(now - 60).to_string()),
                        ("end", &now.to_string()),
                        ("step", "0.5"),
                    ])
                    .send()
                    .await
                    .unwrap();
                let code = r.status().as_u16();
                answers.lock().unwrap().push((q.len(), code));
            }
        }));
    }
    // Acknowledgements in every second of 5 s of hostile queries.
    let mut per_second = Vec::new();
    for _ in 0..5 {
        let before = acked(&tc.collector);
        tokio::time::sleep(Duration::from_secs(1)).await;
        per_second.push(acked(&tc.collector) - before);
    }
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.await.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    assert!(
        per_second.iter().all(|&n| n > 0),
        "acks per second under hostile queries: {per_second:?}"
    );
    assert!(answers.len() >= hostile.len(), "{answers:?}");
    for (len, code) in &answers {
        // The deep ones are refused before parsing; the heavy ones are
        // answered, refused by a limit or queued out — never a crash.
        assert!(
            [200, 400, 422, 429, 503].contains(code),
            "a query of {len} bytes got {code}"
        );
    }
    assert!(answers.iter().any(|(_, c)| *c == 400));
    eprintln!(
        "{} hostile queries answered; acks per second meanwhile: {per_second:?}",
        answers.len()
    );
    agent.stop().await;
    let _ = stop_api.send(());
    tc.stop().await;
}
