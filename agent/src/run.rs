//! The agent: a sampling loop (source → sampler → batcher → outbox,
//! [`crate::sampling`]) and the client loop (outbox → collector), joined by
//! the bounded [`Outbox`]. Captures run off the runtime's thread, since
//! NVML calls block.
//!
//! An agent whose source cannot be opened yet ([`Agent::start_opening`],
//! [`crate::opening`]) exists at once, with its outbox, counters and
//! probes, and starts both loops when the source opens; until then it only
//! retries and answers the probes.

use crate::attribution::{Attribution, AttributionOptions, AttributionStats};
use crate::client::{self, ClientOptions, ClientState};
use crate::health::Health;
use crate::opening::{OpenSource, RetryOptions, SamplerFor, StartError};
use crate::outbox::Outbox;
use crate::sampler::Sampler;
pub(crate) use crate::sampling::AgentStats;
use crate::sampling::{LoopOptions, Pacing, Sampling};
use crate::source::GpuSource;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::{Hello, NodeIdentity};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tracing::warn;

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Node identity.
    pub node: NodeIdentity,
    /// Collector URLs.
    pub collectors: Vec<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// TLS for `https://` collectors.
    pub tls: flopwatch_transport::TlsClient,
    /// How often a batch is cut.
    pub flush_interval: Duration,
    /// Most samples per batch.
    pub max_batch_samples: usize,
    /// Outbox capacity, batches.
    pub max_in_flight: usize,
    /// Job label for GPUs the source does not attribute.
    pub job: Option<String>,
    /// Shutdown waits this long for acks.
    pub drain_timeout: Duration,
    /// Metrics to keep (all when `None`); the OFU inputs are always kept.
    pub metrics: Option<std::collections::HashSet<String>>,
    /// Cumulative counters and the NVLink link state are read at most this
    /// often ([`crate::cadence`]); zero reads them at every capture.
    pub slow_interval: Duration,
    /// What paces the captures: the runtime (tokio's clock, paused time in
    /// tests) or a thread of their own (what a node runs).
    pub pacing: Pacing,
}

/// The default [`AgentOptions::slow_interval`].
pub const SLOW_INTERVAL: Duration = Duration::from_secs(1);

impl AgentOptions {
    /// What the sampling loop takes of these options.
    pub(crate) fn loop_options(&self) -> LoopOptions {
        LoopOptions {
            node: self.node.clone(),
            flush_interval: self.flush_interval,
            max_batch_samples: self.max_batch_samples,
            metrics: self.metrics.clone(),
            slow_interval: self.slow_interval,
        }
    }

    /// `node` streaming to `collectors` with the configuration file's
    /// defaults: a batch every second of at most 50,000 samples, 64 batches
    /// in flight, every metric kept, counters read once a second, 5 s to
    /// drain at shutdown, no credentials, plaintext, captures paced by the
    /// runtime.
    pub fn new(node: NodeIdentity, collectors: Vec<String>) -> Self {
        Self {
            node,
            collectors,
            token: None,
            tls: Default::default(),
            flush_interval: Duration::from_secs(1),
            max_batch_samples: 50_000,
            max_in_flight: 64,
            job: None,
            drain_timeout: Duration::from_secs(5),
            metrics: None,
            slow_interval: SLOW_INTERVAL,
            pacing: Pacing::Runtime,
        }
    }
}

/// Delivery guarantees beyond the in-memory outbox.
#[derive(Debug, Clone, Default)]
pub struct DeliveryOptions {
    /// Write every batch ahead to this on-disk spool.
    pub spool: Option<crate::spool::SpoolOptions>,
    /// Most batches sent per second (the spool's drain rate).
    pub max_batches_per_second: Option<u32>,
}

/// A running agent.
pub struct Agent {
    /// Outbox, for its counters.
    pub outbox: Arc<Outbox>,
    /// Loop counters.
    pub stats: Arc<AgentStats>,
    /// Connection state.
    pub state: watch::Receiver<ClientState>,
    /// Job attribution counters.
    pub attribution: Arc<AttributionStats>,
    /// The sampling loop's progress, for `/healthz` and `/readyz`.
    pub health: Arc<Health>,
    shutdown: watch::Sender<bool>,
    phase: Phase,
}

/// Sampling and streaming.
struct Running {
    sampling: Loop,
    client: tokio::task::JoinHandle<()>,
}

/// Where an agent is.
enum Phase {
    Running(Running),
    /// The source is not open yet: `task` retries, then starts both loops
    /// and leaves them in `started`.
    Opening {
        task: tokio::task::JoinHandle<()>,
        started: Arc<Mutex<Option<Running>>>,
    },
}

/// The parts of [`Pending`] an [`Agent`] shows.
struct Handles {
    outbox: Arc<Outbox>,
    stats: Arc<AgentStats>,
    state: watch::Receiver<ClientState>,
    attribution: Arc<AttributionStats>,
    health: Arc<Health>,
}

impl Handles {
    fn agent(self, shutdown: watch::Sender<bool>, phase: Phase) -> Agent {
        Agent {
            outbox: self.outbox,
            stats: self.stats,
            state: self.state,
            attribution: self.attribution,
            health: self.health,
            shutdown,
            phase,
        }
    }
}

/// What sampling and streaming share, made before the source is open.
struct Pending {
    opts: AgentOptions,
    attribution: Attribution,
    clock: Arc<dyn Clock>,
    outbox: Arc<Outbox>,
    stats: Arc<AgentStats>,
    health: Arc<Health>,
    state_tx: watch::Sender<ClientState>,
    state: watch::Receiver<ClientState>,
    shutdown: watch::Receiver<bool>,
    max_batches_per_second: Option<u32>,
}

impl Pending {
    /// The shared parts; the sender stops the agent.
    fn new(
        opts: AgentOptions,
        attribution: AttributionOptions,
        clock: Arc<dyn Clock>,
        outbox: Arc<Outbox>,
        max_batches_per_second: Option<u32>,
    ) -> (Self, watch::Sender<bool>) {
        let attribution = Attribution::new(attribution, opts.job.clone());
        let (shutdown_tx, shutdown) = watch::channel(false);
        let (state_tx, state) = watch::channel(ClientState::default());
        let pending = Self {
            opts,
            attribution,
            clock,
            outbox,
            stats: Arc::new(AgentStats::default()),
            health: Arc::new(Health::default()),
            state_tx,
            state,
            shutdown,
            max_batches_per_second,
        };
        (pending, shutdown_tx)
    }

    /// What the agent shows of these parts.
    fn handles(&self) -> Handles {
        Handles {
            outbox: self.outbox.clone(),
            stats: self.stats.clone(),
            state: self.state.clone(),
            attribution: self.attribution.stats(),
            health: self.health.clone(),
        }
    }

    /// Starts streaming and sampling `source`.
    fn launch(self, source: Box<dyn GpuSource>, sampler: Box<dyn Sampler>) -> Running {
        let opts = &self.opts;
        let hello = Hello {
            token: None,
            agent_id: opts.node.node_id.clone(),
            node: opts.node.clone(),
            gpus: source.inventory().to_vec(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            metrics: Vec::new(),
            devices: source
                .devices()
                .iter()
                .map(|d| crate::source::qualify(d, &opts.node.node_id))
                .collect(),
        };
        // The sampling loop publishes a new Hello when the GPU list changes.
        let (hello_tx, hello_updates) = watch::channel(hello.clone());
        let client = tokio::spawn(client::run(
            ClientOptions {
                collectors: opts.collectors.clone(),
                token: opts.token.clone(),
                tls: opts.tls.clone(),
                hello,
                hello_updates: Some(hello_updates),
                drain_timeout: opts.drain_timeout,
                max_batches_per_second: self.max_batches_per_second,
            },
            self.outbox.clone(),
            self.state_tx,
        ));
        let sampling = Sampling::new(
            source,
            sampler,
            &opts.loop_options(),
            self.attribution,
            self.clock,
            self.outbox,
            self.stats,
            self.health.clone(),
            self.state,
        )
        .publishing_hello(hello_tx);
        self.health.started();
        let sampling = Loop::start(sampling, opts.pacing, self.shutdown);
        Running { sampling, client }
    }
}

/// The running sampling loop.
enum Loop {
    /// [`Pacing::Runtime`].
    Task(tokio::task::JoinHandle<()>),
    /// [`Pacing::Thread`]: `done` resolves when the thread ends.
    Thread {
        thread: std::thread::JoinHandle<()>,
        done: tokio::sync::oneshot::Receiver<()>,
    },
}

impl Loop {
    fn start(sampling: Sampling, pacing: Pacing, shutdown: watch::Receiver<bool>) -> Self {
        match pacing {
            Pacing::Runtime => Self::Task(tokio::spawn(crate::sampling::on_runtime(
                sampling, shutdown,
            ))),
            Pacing::Thread => {
                // Attribution starts its lookups on the runtime.
                let runtime = tokio::runtime::Handle::current();
                let (done_tx, done) = tokio::sync::oneshot::channel();
                let thread = std::thread::Builder::new()
                    .name("flopwatch-sampling".into())
                    .spawn(move || {
                        let _runtime = runtime.enter();
                        crate::sampling::on_thread(
                            sampling,
                            &mut crate::sampling::Parked { shutdown },
                        );
                        let _ = done_tx.send(());
                    })
                    .expect("spawning the sampling thread");
                Self::Thread { thread, done }
            }
        }
    }

    fn is_finished(&self) -> bool {
        match self {
            Self::Task(t) => t.is_finished(),
            Self::Thread { thread, .. } => thread.is_finished(),
        }
    }

    /// Waits for the loop's end (its last batch cut, the outbox closed).
    async fn join(self) {
        match self {
            Self::Task(t) => {
                let _ = t.await;
            }
            Self::Thread { thread, done } => {
                // Wakes it now rather than at its next capture.
                thread.thread().unpark();
                // An error: the thread ended without a word (it panicked).
                let _ = done.await;
            }
        }
    }
}

impl Agent {
    /// Starts sampling `source` and streaming to the collectors, with job
    /// attribution off (the source's own jobs, then `opts.job`).
    pub fn start(
        source: Box<dyn GpuSource>,
        sampler: Box<dyn Sampler>,
        opts: AgentOptions,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::start_with_attribution(source, sampler, opts, AttributionOptions::disabled(), clock)
    }

    /// [`Agent::start`] with job attribution per `attribution`
    /// ([`crate::attribution`]); `opts.job` stays the last fallback.
    pub fn start_with_attribution(
        source: Box<dyn GpuSource>,
        sampler: Box<dyn Sampler>,
        opts: AgentOptions,
        attribution: AttributionOptions,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let outbox = Arc::new(Outbox::new(opts.max_in_flight));
        Self::start_with_outbox(source, sampler, opts, attribution, clock, outbox, None)
    }

    /// [`Agent::start_with_attribution`] with a spool and a send rate
    /// ([`DeliveryOptions`]); fails when the spool cannot be opened.
    pub fn start_with_delivery(
        source: Box<dyn GpuSource>,
        sampler: Box<dyn Sampler>,
        opts: AgentOptions,
        attribution: AttributionOptions,
        clock: Arc<dyn Clock>,
        delivery: DeliveryOptions,
    ) -> std::io::Result<Self> {
        let outbox = outbox_for(&opts, clock.as_ref(), &delivery)?;
        Ok(Self::start_with_outbox(
            source,
            sampler,
            opts,
            attribution,
            clock,
            outbox,
            delivery.max_batches_per_second,
        ))
    }

    fn start_with_outbox(
        source: Box<dyn GpuSource>,
        sampler: Box<dyn Sampler>,
        opts: AgentOptions,
        attribution: AttributionOptions,
        clock: Arc<dyn Clock>,
        outbox: Arc<Outbox>,
        max_batches_per_second: Option<u32>,
    ) -> Self {
        let (pending, shutdown) =
            Pending::new(opts, attribution, clock, outbox, max_batches_per_second);
        let handles = pending.handles();
        // The source opened at once.
        handles.health.set_source_up(true);
        handles.agent(shutdown, Phase::Running(pending.launch(source, sampler)))
    }

    /// Opens the source with `open` and starts as
    /// [`Agent::start_with_delivery`] does, the sampler made by `sampler`
    /// for the open source. When the source cannot be opened yet for a
    /// reason that can pass ([`SourceError::is_transient`](crate::source::SourceError::is_transient):
    /// a dcgm-exporter not answering yet) the agent starts anyway and
    /// retries per `retry` ([`RetryOptions`]): `/healthz` live, `/readyz`
    /// not ready with the reason, until the source opens; sampling and
    /// streaming then start. Fails at once when the source cannot be
    /// opened for another reason, or the spool cannot be.
    #[allow(clippy::too_many_arguments)]
    pub fn start_opening(
        mut open: OpenSource,
        sampler: SamplerFor,
        opts: AgentOptions,
        attribution: AttributionOptions,
        clock: Arc<dyn Clock>,
        delivery: DeliveryOptions,
        retry: RetryOptions,
    ) -> Result<Self, StartError> {
        let first_ms = clock.now_ms();
        let first = match open(first_ms) {
            Ok(source) => {
                let sampler = sampler(source.as_ref());
                return Self::start_with_delivery(
                    source,
                    sampler,
                    opts,
                    attribution,
                    clock,
                    delivery,
                )
                .map_err(StartError::Spool);
            }
            Err(e) if !e.is_transient() => return Err(StartError::Source(e)),
            Err(e) => e,
        };
        let outbox = outbox_for(&opts, clock.as_ref(), &delivery).map_err(StartError::Spool)?;
        let (pending, shutdown) = Pending::new(
            opts,
            attribution,
            clock,
            outbox,
            delivery.max_batches_per_second,
        );
        let handles = pending.handles();
        let started: Arc<Mutex<Option<Running>>> = Arc::default();
        let slot = started.clone();
        let watch = crate::opening::first_failure(&first, first_ms, &retry, pending.health.clone());
        let (clock, stop) = (pending.clock.clone(), pending.shutdown.clone());
        let task = tokio::spawn(async move {
            let opened = crate::opening::open_with_retry(open, watch, retry, clock, stop).await;
            if let Some(source) = opened {
                let sampler = sampler(source.as_ref());
                let running = pending.launch(source, sampler);
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(running);
            }
        });
        Ok(handles.agent(shutdown, Phase::Opening { task, started }))
    }

    /// Asks the agent to stop: the last batch is cut and outstanding
    /// batches get up to the drain timeout to be acknowledged. An agent
    /// still waiting for its source stops waiting.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let running = match self.phase {
            Phase::Running(r) => Some(r),
            Phase::Opening { task, started } => {
                let _ = task.await;
                let r = started
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                r
            }
        };
        if let Some(Running { sampling, client }) = running {
            sampling.join().await;
            let _ = client.await;
        }
        if let Some(job) = self.outbox.spool_sync_job() {
            match tokio::task::spawn_blocking(move || job.run()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "final spool fsync failed"),
                Err(e) => warn!(error = %e, "final spool fsync failed"),
            }
        }
    }

    /// True once the sampling loop ended by itself (a finished replay).
    pub fn sampling_finished(&self) -> bool {
        match &self.phase {
            Phase::Running(r) => r.sampling.is_finished(),
            Phase::Opening { started, .. } => started
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(|r| r.sampling.is_finished()),
        }
    }

    /// True once the source is open and the loops run.
    pub fn source_opened(&self) -> bool {
        match &self.phase {
            Phase::Running(_) => true,
            Phase::Opening { started, .. } => started
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some(),
        }
    }
}

/// The outbox `delivery` asks for: in memory, or written ahead to a spool
/// (then fsynced in the background).
fn outbox_for(
    opts: &AgentOptions,
    clock: &dyn Clock,
    delivery: &DeliveryOptions,
) -> std::io::Result<Arc<Outbox>> {
    Ok(match &delivery.spool {
        Some(so) => {
            let mut spool =
                crate::spool::Spool::open(so, Arc::new(crate::spool::SpoolStats::default()))?;
            // Numbers of this run start above any an earlier run on
            // this boot can have used, even one whose spool is gone (a
            // recreated pod): 1000 per millisecond of wall clock.
            spool.reserve_below(
                u64::try_from(clock.now_ms())
                    .unwrap_or(0)
                    .saturating_mul(1000),
            );
            let outbox = Arc::new(Outbox::with_spool(opts.max_in_flight, spool));
            tokio::spawn(sync_spool(outbox.clone(), so.fsync_interval));
            outbox
        }
        None => Arc::new(Outbox::new(opts.max_in_flight)),
    })
}

/// fsyncs the spool every `every` (off the outbox's lock), while the
/// outbox is alive.
async fn sync_spool(outbox: Arc<Outbox>, every: Duration) {
    let weak = Arc::downgrade(&outbox);
    drop(outbox);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(o) = weak.upgrade() else { return };
        let Some(job) = o.spool_sync_job() else {
            return;
        };
        let stats = o.spool_stats();
        drop(o);
        match tokio::task::spawn_blocking(move || job.run()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if let Some(s) = stats {
                    s.io_errors.fetch_add(1, Ordering::Relaxed);
                }
                warn!(error = %e, "spool fsync failed");
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{Capture, GpuCapture, Reading};
    use crate::sampler::FixedSampler;
    use crate::source::SourceError;
    use flopwatch_proto::model::{GpuInfo, MfuReport};

    /// One GPU whose job reports its MFU at every capture.
    struct Reporting {
        inventory: Vec<GpuInfo>,
    }

    impl GpuSource for Reporting {
        fn name(&self) -> &'static str {
            "reporting"
        }

        fn inventory(&self) -> &[GpuInfo] {
            &self.inventory
        }

        fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
            Ok(Capture {
                ts_ms: now_ms,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: vec![Reading::new(flopwatch_proto::metrics::TENSOR_ACTIVE, 0.5)],
                }],
                ..Default::default()
            })
        }

        fn mfu_reports(&mut self, now_ms: i64) -> Vec<MfuReport> {
            vec![MfuReport {
                job_id: "job".into(),
                ts_ms: now_ms,
                mfu: Some(0.4),
                ..Default::default()
            }]
        }
    }

    /// One GPU whose source reads only what the plan wants: tensor
    /// activity and the energy counter.
    struct Planned {
        inventory: Vec<GpuInfo>,
    }

    impl GpuSource for Planned {
        fn name(&self) -> &'static str {
            "planned"
        }

        fn inventory(&self) -> &[GpuInfo] {
            &self.inventory
        }

        fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
            self.capture_planned(now_ms, &crate::capture::ReadPlan::all())
        }

        fn capture_planned(
            &mut self,
            now_ms: i64,
            plan: &crate::capture::ReadPlan,
        ) -> Result<Capture, SourceError> {
            use flopwatch_proto::metrics::{ENERGY_J, TENSOR_ACTIVE};
            Ok(Capture {
                ts_ms: now_ms,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: [TENSOR_ACTIVE, ENERGY_J]
                        .into_iter()
                        .filter(|m| plan.wants(0, m))
                        .map(|m| Reading::new(m, now_ms as f64))
                        .collect(),
                }],
                ..Default::default()
            })
        }
    }

    fn gpu0() -> GpuInfo {
        GpuInfo {
            uuid: "GPU-0".into(),
            ..Default::default()
        }
    }

    /// An agent on `source` at a fixed 100 ms whose batches all stay in the
    /// outbox (nothing listens at its collector's address; no cut before
    /// shutdown), its clock at 1,000,000 ms.
    fn offline(source: Box<dyn GpuSource>) -> Agent {
        Agent::start(
            source,
            Box::new(FixedSampler::new(Duration::from_millis(100))),
            AgentOptions {
                flush_interval: Duration::from_secs(3600),
                drain_timeout: Duration::from_millis(100),
                ..AgentOptions::new(
                    NodeIdentity::named("n", "b"),
                    vec!["http://127.0.0.1:9".into()],
                )
            },
            Arc::new(crate::clock::TokioClock::starting_at(1_000_000)),
        )
    }

    /// Counters are read at the first capture of each second, the OFU
    /// inputs at every capture.
    #[tokio::test(start_paused = true)]
    async fn counters_are_read_once_a_second() {
        let agent = offline(Box::new(Planned {
            inventory: vec![gpu0()],
        }));
        tokio::time::sleep(Duration::from_millis(3_050)).await;
        let outbox = agent.outbox.clone();
        agent.stop().await;
        let b = &outbox.next_to_send(16)[0];
        let times = |metric: &str| {
            let s = b.series.iter().find(|s| s.metric == metric).unwrap();
            s.timestamps_ms.clone()
        };
        assert_eq!(times(flopwatch_proto::metrics::TENSOR_ACTIVE).len(), 30);
        assert_eq!(
            times(flopwatch_proto::metrics::ENERGY_J),
            vec![1_000_100, 1_001_000, 1_002_000, 1_003_000]
        );
    }

    /// The batch cut at shutdown is made like every other: the MFU reports
    /// gathered since the last cut ride on it (they were once dropped).
    #[tokio::test(start_paused = true)]
    async fn the_last_batch_carries_pending_mfu_reports() {
        let agent = offline(Box::new(Reporting {
            inventory: vec![gpu0()],
        }));
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let outbox = agent.outbox.clone();
        agent.stop().await;
        let batches = outbox.next_to_send(16);
        assert_eq!(batches.len(), 1, "only the shutdown cut");
        let b = &batches[0];
        assert_eq!(b.series[0].timestamps_ms.len(), 10);
        assert_eq!(b.mfu_reports.len(), 10);
        assert_eq!(b.mfu_reports[0].job_id, "job");
    }
}
