//! The sampling loop: source → sampler → batcher → outbox, one capture per
//! tick, and what paces it.
//!
//! [`Sampling`] is the loop's state and its three steps: [`Sampling::prepare`]
//! cuts a batch when one is due and plans the next capture,
//! [`CaptureJob::run`] reads the source (NVML calls block, and may hang),
//! [`Sampling::finish`] keeps what the capture read.
//!
//! Two drivers run the same steps and ask the sampler the same questions
//! ([`Pacing`]):
//!
//! * [`on_runtime`]: a tokio task on tokio's clock, the capture on the
//!   blocking pool, its result taken at the next tick, when it is long
//!   done, so that the task does not wait on it. It runs under paused
//!   time, so tests and `eval-sampling` drive the real loop through hours
//!   of simulated time. Each capture costs the runtime's thread two timer
//!   wakeups (tokio files a 100 ms sleep on its 64 ms wheel level and
//!   wakes once to move it down) and a hand-off to a blocking thread.
//! * [`on_thread`]: one long-lived thread that owns the source and sleeps
//!   to an absolute deadline on the monotonic clock: one wakeup per capture
//!   in all, and the runtime's thread wakes only for what the client does
//!   (a batch a second, its acknowledgement). A capture that hangs in the
//!   driver blocks this thread alone.

// `Pace` is this loop's injected monotonic clock: its real impl reads
// `Instant`, tests drive the loop on made-up time through it.
#![allow(clippy::disallowed_types)]

use crate::attribution::Attribution;
use crate::batcher::Batcher;
use crate::cadence::SlowReads;
use crate::capture::{Capture, ReadPlan};
use crate::client::ClientState;
use crate::filter::MetricFilter;
use crate::health::Health;
use crate::mfu::MfuInbox;
use crate::outbox::Outbox;
use crate::sampler::Sampler;
use crate::source::{GpuSource, SourceError};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::{GpuInfo, Hello, NodeIdentity};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// What paces the sampling loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pacing {
    /// A task on the tokio runtime, on tokio's clock (paused time in tests
    /// and evaluations), the captures on the blocking pool.
    #[default]
    Runtime,
    /// A dedicated thread that owns the source and sleeps on the monotonic
    /// clock: one wakeup per capture. What a node runs.
    Thread,
}

/// Counters of the sampling loop.
#[derive(Debug, Default)]
pub struct AgentStats {
    /// Captures taken.
    pub captures: AtomicU64,
    /// Samples handed to the outbox.
    pub samples: AtomicU64,
    /// Captures that failed.
    pub capture_errors: AtomicU64,
    /// Readings the sampler's read plans let the source skip.
    pub reads_skipped: AtomicU64,
    /// Times the source's GPU list changed while sampling.
    pub relists: AtomicU64,
    /// Each metric's current sampling interval when the last batch was cut:
    /// (GPU UUID, metric, ms).
    pub intervals: std::sync::Mutex<Vec<(String, &'static str, u32)>>,
    /// Per GPU, whether the driver refused its GPM samples at the last
    /// capture: (GPU UUID, refused). Empty for sources without GPM.
    pub gpm_denied: std::sync::Mutex<Vec<(String, bool)>>,
}

/// What the loop takes of the agent's options (`AgentOptions`).
#[derive(Debug, Clone)]
pub(crate) struct LoopOptions {
    pub node: NodeIdentity,
    pub flush_interval: Duration,
    pub max_batch_samples: usize,
    pub metrics: Option<std::collections::HashSet<String>>,
    pub slow_interval: Duration,
}

/// The loop's state between captures.
pub(crate) struct Sampling {
    /// The source and the MFU inbox, while no capture has them.
    source: Option<Box<dyn GpuSource>>,
    mfu: Option<MfuInbox>,
    sampler: Box<dyn Sampler>,
    attribution: Attribution,
    clock: Arc<dyn Clock>,
    outbox: Arc<Outbox>,
    stats: Arc<AgentStats>,
    health: Arc<Health>,
    state: watch::Receiver<ClientState>,
    node: NodeIdentity,
    inventory: Vec<GpuInfo>,
    /// GPUs, then node devices (InfiniBand ports, NUMA nodes, the host):
    /// series are keyed by GPU UUID or qualified device id alike.
    owners: Vec<GpuInfo>,
    flush_ms: i64,
    max_batch_samples: usize,
    batcher: Batcher,
    filter: MetricFilter,
    slow: SlowReads,
    last_flush: i64,
    /// Failing and recovering captures, for the log and the probes.
    outage: crate::outage::Watch,
    /// Where a changed GPU list goes, for the stream to open again with it.
    hello: Option<watch::Sender<Hello>>,
}

/// A capture to take off the runtime: the source and the MFU inbox travel
/// with it and come back with its result.
pub(crate) struct CaptureJob {
    at: i64,
    plan: ReadPlan,
    source: Box<dyn GpuSource>,
    mfu: MfuInbox,
}

/// What [`CaptureJob::run`] gives back.
pub(crate) struct Captured {
    at: i64,
    source: Box<dyn GpuSource>,
    mfu: MfuInbox,
    result: Result<Capture, SourceError>,
}

impl CaptureJob {
    /// Reads the source as planned and scans the jobs' MFU reports.
    pub(crate) fn run(mut self) -> Captured {
        let result = self.source.capture_planned(self.at, &self.plan);
        self.mfu.scan(self.at);
        Captured {
            at: self.at,
            source: self.source,
            mfu: self.mfu,
            result,
        }
    }
}

impl Sampling {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        source: Box<dyn GpuSource>,
        sampler: Box<dyn Sampler>,
        opts: &LoopOptions,
        attribution: Attribution,
        clock: Arc<dyn Clock>,
        outbox: Arc<Outbox>,
        stats: Arc<AgentStats>,
        health: Arc<Health>,
        state: watch::Receiver<ClientState>,
    ) -> Self {
        let inventory = source.inventory().to_vec();
        let owners = crate::source::series_owners(source.as_ref(), &opts.node.node_id);
        // Jobs' own MFU reports ride on the next batch (crate::mfu).
        let mfu = MfuInbox::new(attribution.options().mfu_dir.clone());
        info!(source = source.name(), gpus = inventory.len(), "sampling");
        let mut slow = SlowReads::new(opts.slow_interval);
        if sampler.holds_back() {
            slow = slow.exempting(&[flopwatch_proto::metrics::ENERGY_J]);
        }
        Self {
            source: Some(source),
            mfu: Some(mfu),
            sampler,
            attribution,
            last_flush: clock.now_ms(),
            clock,
            outbox,
            stats,
            state,
            node: opts.node.clone(),
            inventory,
            owners,
            flush_ms: opts.flush_interval.as_millis() as i64,
            max_batch_samples: opts.max_batch_samples,
            batcher: Batcher::default(),
            filter: MetricFilter::new(opts.metrics.clone()),
            slow,
            outage: crate::outage::Watch::new(
                crate::outage::Watched::Capture,
                crate::outage::REMIND_EVERY,
                health.clone(),
            ),
            health,
            hello: None,
        }
    }

    /// Publishes the GPU list to `hello` whenever the source's changes
    /// ([`GpuSource::inventory`]).
    pub(crate) fn publishing_hello(mut self, hello: watch::Sender<Hello>) -> Self {
        self.hello = Some(hello);
        self
    }

    /// The source's GPU list changed at `at` (a MIG instance created, a GPU
    /// that came up late): what was sampled under the old list goes out
    /// under it, then the new list is used and published, so that no batch
    /// naming a new GPU precedes the Hello that lists it.
    fn relist(&mut self, source: &dyn GpuSource, mfu: &mut MfuInbox, at: i64) {
        self.batcher.add_held(self.sampler.flush(at), &self.owners);
        if !self.batcher.is_empty() || mfu.has_reports() {
            self.cut(mfu, at);
        }
        let before = self.inventory.len();
        self.inventory = source.inventory().to_vec();
        self.owners = crate::source::series_owners(source, &self.node.node_id);
        info!(
            gpus = self.inventory.len(),
            added = self.inventory.len().saturating_sub(before),
            "the source's GPU list changed"
        );
        self.stats.relists.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.hello {
            let gpus = self.inventory.clone();
            tx.send_modify(|h| h.gpus = gpus);
        }
    }

    /// The wait before the next capture (told to the health probes too).
    pub(crate) fn next_delay(&self) -> Duration {
        let d = self.sampler.next_delay();
        self.health.pace(d);
        d
    }

    /// Takes back what a capture returned and keeps its readings;
    /// `Break` when the source has nothing more (a finished replay).
    pub(crate) fn finish(&mut self, c: Captured) -> ControlFlow<()> {
        let Captured {
            at,
            mut source,
            mut mfu,
            result,
        } = c;
        // Returned, read or failed: the loop is not stuck in the driver.
        self.health.progressed(result.is_ok());
        mfu.push(source.mfu_reports(at));
        let flow = match result {
            Ok(mut capture) => {
                self.outage.succeeded(at);
                if source.inventory() != self.inventory.as_slice() {
                    self.relist(source.as_ref(), &mut mfu, at);
                }
                note_gpm_denied(&self.stats, &self.inventory, source.gpm_permission_denied());
                // Lookups run in the background at most every refresh
                // interval; every capture carries the latest owners, then
                // the source's jobs, then the `job` label.
                self.attribution
                    .tick(at, &self.inventory, || source.processes());
                self.attribution.apply_with_util(
                    at,
                    &mut capture,
                    &self.inventory,
                    &source.process_utilization(),
                );
                self.filter.apply(&mut capture);
                if self.batcher.jobs_change(&capture.jobs, &self.owners) {
                    // A job started or ended: what was sampled before
                    // goes out with the attribution it was sampled under.
                    self.batcher.add_held(self.sampler.flush(at), &self.owners);
                    self.cut(&mut mfu, at);
                }
                self.sampler.observe(&mut capture);
                self.batcher.add(capture, &self.owners);
                // Counted once all it changed is in place: whoever sees the
                // count sees the gauges this capture set.
                self.stats.captures.fetch_add(1, Ordering::Release);
                ControlFlow::Continue(())
            }
            Err(SourceError::Exhausted) => {
                info!("source exhausted");
                ControlFlow::Break(())
            }
            Err(e) => {
                self.stats.capture_errors.fetch_add(1, Ordering::Relaxed);
                // Told as transitions: failing, a reminder a minute,
                // recovered (crate::outage).
                self.outage.failed(at, &e);
                ControlFlow::Continue(())
            }
        };
        self.source = Some(source);
        self.mfu = Some(mfu);
        flow
    }

    /// A capture panicked: the source and the MFU inbox went with it.
    pub(crate) fn lost(&mut self, why: &str) {
        warn!(error = %why, "capture task failed; stopping");
        self.mfu = Some(MfuInbox::new(None));
    }

    /// Cuts a batch when one is due, then plans the capture at the clock's
    /// now. `None` when a capture still holds the source.
    pub(crate) fn prepare(&mut self) -> Option<CaptureJob> {
        let (Some(source), Some(mut mfu)) = (self.source.take(), self.mfu.take()) else {
            return None;
        };
        let now = self.clock.now_ms();
        if self
            .batcher
            .due(now, self.last_flush, self.flush_ms, self.max_batch_samples)
        {
            self.cut(&mut mfu, now);
            self.last_flush = now;
        }
        // Only what the sampler needs and the filter keeps is read
        // (Sampler::due, MetricFilter::plan), slow counters once a period
        // (SlowReads::plan).
        if let Some(p) = self.state.borrow().policy.as_ref() {
            self.filter.set_policy(&p.metrics);
        }
        let plan = self.slow.plan(
            self.filter.plan(self.sampler.due(now)),
            now,
            self.owners.len(),
        );
        self.stats
            .reads_skipped
            .fetch_add(plan.skipped_count() as u64, Ordering::Relaxed);
        Some(CaptureJob {
            at: now,
            plan,
            source,
            mfu,
        })
    }

    /// What is still held goes out as one last batch (the sampler's pending
    /// samples, what the batcher holds, the MFU reports gathered since the
    /// last cut), and the outbox is closed.
    pub(crate) fn close(mut self) {
        let mut mfu = self.mfu.take().unwrap_or_else(|| MfuInbox::new(None));
        self.batcher
            .add_held(self.sampler.flush(self.clock.now_ms()), &self.owners);
        if !self.batcher.is_empty() || mfu.has_reports() {
            self.cut(&mut mfu, self.clock.now_ms());
        }
        self.outbox.close();
    }

    /// Takes what the batcher holds, with the jobs' MFU reports, the
    /// sampler's intervals and the outbox's backlog, and queues it: the one
    /// place a batch is made, in the loop and at shutdown alike.
    fn cut(&mut self, mfu: &mut MfuInbox, now: i64) {
        self.stats
            .samples
            .fetch_add(self.batcher.len() as u64, Ordering::Relaxed);
        let mut b = self
            .batcher
            .cut(&self.owners, &self.node.node_id, &self.node.boot_id, now);
        annotate(
            &mut b,
            self.sampler.as_ref(),
            &self.owners,
            &self.outbox,
            &self.stats,
        );
        b.mfu_reports = mfu.take();
        push_split(&self.outbox, &self.state, b.into());
    }
}

/// Whether the agent was asked to stop, or dropped.
fn stopping(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}

/// The loop as a task on the runtime, on tokio's clock.
pub(crate) async fn on_runtime(mut s: Sampling, mut shutdown: watch::Receiver<bool>) {
    let mut next = tokio::time::Instant::now();
    let mut pending: Option<tokio::task::JoinHandle<Captured>> = None;
    loop {
        let delay = s.next_delay();
        next += delay;
        let now = tokio::time::Instant::now();
        if next < now {
            // Fell behind (slow driver): skip missed ticks, do not burst.
            next = now + delay;
        }
        let stop = tokio::select! {
            _ = tokio::time::sleep_until(next) => stopping(&shutdown),
            _ = shutdown.changed() => true,
        };
        if let Some(capturing) = pending.take() {
            match capturing.await {
                Ok(c) => {
                    if s.finish(c).is_break() {
                        break;
                    }
                }
                Err(e) => {
                    s.lost(&e.to_string());
                    break;
                }
            }
        }
        if stop {
            break;
        }
        let Some(job) = s.prepare() else { break };
        pending = Some(tokio::task::spawn_blocking(move || job.run()));
    }
    s.close();
}

/// The sampling thread's clock and sleep, injected so that tests drive
/// the thread's loop on made-up time.
pub(crate) trait Pace {
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// Sleeps until `deadline`; `true` when the agent is stopping (then
    /// at once).
    fn wait_until(&mut self, deadline: Instant) -> bool;
}

/// The monotonic clock and `park_timeout`: [`Agent::stop`](crate::Agent)
/// sets the shutdown flag and unparks the thread.
pub(crate) struct Parked {
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl Pace for Parked {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wait_until(&mut self, deadline: Instant) -> bool {
        loop {
            if stopping(&self.shutdown) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // May return early (an unpark, or spuriously): the loop checks.
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// The loop on the calling thread, paced by `pace`; the captures run on
/// this thread too, and each is kept at once, while what it read is still
/// in the cache. The sampler is asked for the wait before it sees the
/// capture, as [`on_runtime`] asks before it takes the result at the next
/// tick: both pacings sample alike.
pub(crate) fn on_thread(mut s: Sampling, pace: &mut dyn Pace) {
    let mut next = pace.now();
    let mut delay = s.next_delay();
    loop {
        next += delay;
        let now = pace.now();
        if next < now {
            // Fell behind (slow driver): skip missed ticks, do not burst.
            next = now + delay;
        }
        if pace.wait_until(next) {
            break;
        }
        let Some(job) = s.prepare() else { break };
        let captured = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run())) {
            Ok(c) => c,
            Err(_) => {
                s.lost("the capture panicked");
                break;
            }
        };
        delay = s.next_delay();
        if s.finish(captured).is_break() {
            break;
        }
    }
    s.close();
}

/// Adds the sampler's current intervals and the outbox's backlog to a
/// batch (the collector exports them), and keeps the intervals for the
/// agent's own `/metrics`.
fn annotate(
    b: &mut flopwatch_proto::model::Batch,
    sampler: &dyn Sampler,
    inventory: &[GpuInfo],
    outbox: &Outbox,
    stats: &AgentStats,
) {
    let intervals: Vec<(String, &'static str, u32)> = sampler
        .intervals()
        .into_iter()
        .filter_map(|(gpu, metric, ms)| Some((inventory.get(gpu)?.uuid.clone(), metric, ms)))
        .collect();
    b.intervals = intervals
        .iter()
        .map(
            |(uuid, metric, ms)| flopwatch_proto::model::SamplingInterval {
                gpu_uuid: uuid.clone(),
                metric: metric.to_string(),
                interval_ms: *ms,
            },
        )
        .collect();
    b.pending_bytes = outbox.pending_bytes();
    b.pending_batches = outbox.len() as u32;
    if let Ok(mut v) = stats.intervals.lock() {
        *v = intervals;
    }
}

/// Keeps the source's GPM refusals for `/metrics`, touching the list only
/// when they change (they almost never do).
fn note_gpm_denied(stats: &AgentStats, inventory: &[GpuInfo], denied: &[bool]) {
    let Ok(mut noted) = stats.gpm_denied.lock() else {
        return;
    };
    if noted.iter().map(|(_, d)| d).eq(denied.iter()) {
        return;
    }
    *noted = inventory
        .iter()
        .zip(denied)
        .map(|(gpu, &d)| (gpu.uuid.clone(), d))
        .collect();
}

/// Queues `batch`, split to fit the collector's size limit (the last
/// Welcome's, or the default 4 MiB before any), with a margin for the
/// fields the outbox adds.
fn push_split(
    outbox: &Outbox,
    state: &watch::Receiver<ClientState>,
    batch: flopwatch_proto::v1::Batch,
) {
    let limit = match state.borrow().max_batch_bytes {
        0 => DEFAULT_MAX_BATCH_BYTES,
        n => n as usize,
    };
    for part in crate::split::split(batch, limit - limit / 16) {
        outbox.push(part);
    }
}

/// A collector's default `max_batch_bytes`, used until a Welcome says.
const DEFAULT_MAX_BATCH_BYTES: usize = 4 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::AttributionOptions;
    use crate::capture::{GpuCapture, Reading};
    use crate::sampler::FixedSampler;
    use flopwatch_proto::metrics::TENSOR_ACTIVE;
    use std::sync::atomic::AtomicI64;
    use std::sync::Mutex;

    /// The agent's default options for the loop (`AgentOptions::new`).
    fn loop_options() -> LoopOptions {
        LoopOptions {
            node: NodeIdentity::named("n", "b"),
            flush_interval: Duration::from_secs(1),
            max_batch_samples: 50_000,
            metrics: None,
            slow_interval: Duration::from_secs(1),
        }
    }

    /// Made-up monotonic time, ms since `base`, shared by the pace, the
    /// loop's clock and the source.
    #[derive(Clone)]
    struct FakeTime {
        base: Instant,
        ms: Arc<AtomicI64>,
    }

    impl FakeTime {
        fn ms(&self) -> i64 {
            self.ms.load(Ordering::SeqCst)
        }

        fn advance(&self, ms: i64) {
            self.ms.fetch_add(ms, Ordering::SeqCst);
        }
    }

    impl Clock for FakeTime {
        fn now_ms(&self) -> i64 {
            self.ms()
        }
    }

    /// Sleeps by moving the made-up time to the deadline; stops at the
    /// first deadline past `end_ms`. Keeps every deadline it was given.
    struct FakePace {
        time: FakeTime,
        end_ms: i64,
        deadlines: Vec<i64>,
    }

    impl Pace for FakePace {
        fn now(&self) -> Instant {
            self.time.base + Duration::from_millis(self.time.ms() as u64)
        }

        fn wait_until(&mut self, deadline: Instant) -> bool {
            let ms = deadline.duration_since(self.time.base).as_millis() as i64;
            self.deadlines.push(ms);
            if ms > self.end_ms {
                return true;
            }
            self.time.ms.fetch_max(ms, Ordering::SeqCst);
            false
        }
    }

    /// One GPU; the capture at `slow_at` takes `slow_ms` of made-up time.
    struct Timed {
        inventory: Vec<GpuInfo>,
        time: FakeTime,
        slow_at: i64,
        slow_ms: i64,
        taken: Arc<Mutex<Vec<i64>>>,
    }

    impl GpuSource for Timed {
        fn name(&self) -> &'static str {
            "timed"
        }

        fn inventory(&self) -> &[GpuInfo] {
            &self.inventory
        }

        fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
            self.taken.lock().unwrap().push(now_ms);
            if now_ms == self.slow_at {
                self.time.advance(self.slow_ms);
            }
            Ok(Capture {
                ts_ms: now_ms,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: vec![Reading::new(TENSOR_ACTIVE, 0.5)],
                }],
                ..Default::default()
            })
        }
    }

    /// The sampling thread's loop on made-up time: a capture every
    /// interval from the loop's start, and a capture that overruns its
    /// interval makes the loop skip the ticks it missed, not burst.
    #[test]
    fn the_thread_captures_on_the_interval_and_skips_what_a_slow_capture_missed() {
        let time = FakeTime {
            base: Instant::now(),
            ms: Arc::new(AtomicI64::new(0)),
        };
        let taken = Arc::new(Mutex::new(Vec::new()));
        let source = Timed {
            inventory: vec![GpuInfo {
                uuid: "GPU-0".into(),
                ..Default::default()
            }],
            time: time.clone(),
            slow_at: 300,
            slow_ms: 250,
            taken: taken.clone(),
        };
        let opts = LoopOptions {
            flush_interval: Duration::from_secs(3600),
            ..loop_options()
        };
        let outbox = Arc::new(Outbox::new(4));
        let stats = Arc::new(AgentStats::default());
        let (_state_tx, state) = watch::channel(ClientState::default());
        let sampling = Sampling::new(
            Box::new(source),
            Box::new(FixedSampler::new(Duration::from_millis(100))),
            &opts,
            Attribution::new(AttributionOptions::disabled(), None),
            Arc::new(time.clone()),
            outbox.clone(),
            stats.clone(),
            Arc::new(Health::default()),
            state,
        );
        let mut pace = FakePace {
            time,
            end_ms: 1_000,
            deadlines: Vec::new(),
        };
        on_thread(sampling, &mut pace);
        // The capture at 300 ms ends at 550: the ticks at 400 and 500 are
        // skipped and the next comes an interval after it ended.
        assert_eq!(
            *taken.lock().unwrap(),
            vec![100, 200, 300, 650, 750, 850, 950]
        );
        assert_eq!(
            pace.deadlines,
            vec![100, 200, 300, 650, 750, 850, 950, 1_050]
        );
        // Every capture, the last one included, reached the final batch.
        assert_eq!(stats.captures.load(Ordering::Relaxed), 7);
        assert!(outbox.is_closed());
        let b = &outbox.next_to_send(4)[0];
        assert_eq!(
            b.series[0].timestamps_ms,
            vec![100, 200, 300, 650, 750, 850, 950]
        );
    }

    /// A fixed 100 ms, noting at each question how many captures it had
    /// seen by then.
    struct Noting {
        seen: usize,
        asked: Arc<Mutex<Vec<usize>>>,
    }

    impl Sampler for Noting {
        fn next_delay(&self) -> Duration {
            self.asked.lock().unwrap().push(self.seen);
            Duration::from_millis(100)
        }

        fn observe(&mut self, _: &mut Capture) {
            self.seen += 1;
        }
    }

    fn noting_loop(clock: Arc<dyn Clock>, asked: &Arc<Mutex<Vec<usize>>>) -> Sampling {
        let time = FakeTime {
            base: Instant::now(),
            ms: Arc::new(AtomicI64::new(0)),
        };
        let (_state_tx, state) = watch::channel(ClientState::default());
        Sampling::new(
            Box::new(Timed {
                inventory: vec![GpuInfo::default()],
                time,
                slow_at: -1,
                slow_ms: 0,
                taken: Arc::default(),
            }),
            Box::new(Noting {
                seen: 0,
                asked: asked.clone(),
            }),
            &loop_options(),
            Attribution::new(AttributionOptions::disabled(), None),
            clock,
            Arc::new(Outbox::new(4)),
            Arc::new(AgentStats::default()),
            Arc::new(Health::default()),
            state,
        )
    }

    /// The thread keeps each capture at once, the runtime's task at the
    /// next tick; the sampler is asked for each wait at the same point of
    /// what it has seen either way (an adaptive sampler decides alike).
    #[test]
    fn both_pacings_ask_the_sampler_at_the_same_points() {
        let on_thread_asked = Arc::new(Mutex::new(Vec::new()));
        let time = FakeTime {
            base: Instant::now(),
            ms: Arc::new(AtomicI64::new(0)),
        };
        let s = noting_loop(Arc::new(time.clone()), &on_thread_asked);
        on_thread(
            s,
            &mut FakePace {
                time,
                end_ms: 1_000,
                deadlines: Vec::new(),
            },
        );

        let on_runtime_asked = Arc::new(Mutex::new(Vec::new()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let s = noting_loop(
                Arc::new(crate::clock::TokioClock::starting_at(0)),
                &on_runtime_asked,
            );
            let (stop, shutdown) = watch::channel(false);
            let task = tokio::spawn(on_runtime(s, shutdown));
            tokio::time::sleep(Duration::from_millis(1_050)).await;
            stop.send(true).unwrap();
            task.await.unwrap();
        });
        let (t, r) = (
            on_thread_asked.lock().unwrap().clone(),
            on_runtime_asked.lock().unwrap().clone(),
        );
        // Ten captures, the first wait asked before any.
        assert_eq!(t, vec![0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(r[..t.len()], t[..]);
    }
}
