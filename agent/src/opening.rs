//! Opening a source that is not there yet.
//!
//! On Kubernetes the agent and the dcgm-exporter it scrapes often start
//! together (two containers of one pod, or two DaemonSets), and the
//! exporter answers only once DCGM has started: refused connections, HTTP
//! 500s, pages without GPUs for a while. An agent that exited on the first
//! refusal crash-looped with the kubelet's growing back-off. So
//! [`Agent::start_opening`](crate::Agent::start_opening) opens the source
//! once, and when that fails for a reason that can pass
//! ([`SourceError::is_transient`]: the exporter does not answer, or answers
//! badly; a driver call failed) the agent starts anyway: `/healthz` live,
//! `/readyz` not ready with the reason, `flopwatch_agent_source_up` 0 and
//! `flopwatch_agent_source_open_errors_total` counting, while
//! [`open_with_retry`] tries again with exponential backoff and full
//! jitter ([`Backoff`]: 1 s doubling to 30 s by default) until the source
//! opens. Sampling and streaming then start exactly as if it had opened at
//! once. A reason that cannot pass (a bad URL, a missing driver library, a
//! bad trace) still fails the start at once, with the error.
//!
//! Each attempt runs on the blocking pool (opening scrapes the exporter or
//! loads the driver); the waits are on tokio's clock, so tests run them
//! under paused time, and a shutdown ends the wait at once.

use crate::backoff::Backoff;
use crate::health::Health;
use crate::outage::{Watch, Watched};
use crate::source::{GpuSource, SourceError};
use flopwatch_proto::clock::Clock;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Opens the source; called with the clock's now (unix ms), on the
/// blocking pool, once per attempt.
pub type OpenSource = Box<dyn FnMut(i64) -> Result<Box<dyn GpuSource>, SourceError> + Send>;

/// Builds the sampler once the source is open (it may depend on the
/// source's GPUs).
pub type SamplerFor = Box<dyn FnOnce(&dyn GpuSource) -> Box<dyn crate::Sampler> + Send>;

/// How a source that cannot be opened yet is retried.
#[derive(Debug, Clone)]
pub struct RetryOptions {
    /// Backoff ceiling after the first failure.
    pub first: Duration,
    /// Largest ceiling.
    pub cap: Duration,
    /// Seed of the jitter (agents seed it with their identity and the
    /// time, so that a fleet whose exporters restart together does not
    /// retry in step).
    pub seed: u64,
    /// A source that keeps failing is mentioned in the log this often.
    pub remind_every: Duration,
}

impl RetryOptions {
    /// 1 s doubling to 30 s, jitter seeded from `node_id`, a reminder a
    /// minute.
    pub fn new(node_id: &str) -> Self {
        Self {
            first: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            seed: crate::backoff::seed_for(node_id),
            remind_every: crate::outage::REMIND_EVERY,
        }
    }
}

/// Why an agent did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The source cannot be opened, and retrying would not help.
    #[error(transparent)]
    Source(SourceError),
    /// The spool cannot be opened.
    #[error(transparent)]
    Spool(std::io::Error),
}

/// Whether the agent was asked to stop, or dropped.
fn stopping(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}

/// The watch over the attempts to open a source whose first attempt
/// failed with `first` at `first_ms`: the probes and the log are told at
/// once.
pub(crate) fn first_failure(
    first: &SourceError,
    first_ms: i64,
    retry: &RetryOptions,
    health: Arc<Health>,
) -> Watch {
    let mut watch = Watch::new(Watched::Open, retry.remind_every, health);
    watch.failed(first_ms, first);
    watch
}

/// Retries `open` after a first failure (told to `watch`), until it opens
/// (`Some`) or the agent stops (`None`). Every failure is told to `watch`:
/// the probes and the log ([`crate::outage`]).
pub(crate) async fn open_with_retry(
    mut open: OpenSource,
    mut watch: Watch,
    retry: RetryOptions,
    clock: Arc<dyn Clock>,
    mut shutdown: watch::Receiver<bool>,
) -> Option<Box<dyn GpuSource>> {
    let mut backoff = Backoff::new(retry.first, retry.cap, retry.seed);
    loop {
        let wait = backoff.next_wait();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
        if stopping(&shutdown) {
            return None;
        }
        let now = clock.now_ms();
        let attempt = tokio::task::spawn_blocking(move || {
            let result = open(now);
            (open, result)
        });
        let (back, result) = tokio::select! {
            r = attempt => match r {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "opening the source panicked; no more attempts");
                    return None;
                }
            },
            // The attempt ends by itself (the exporter's timeouts bound
            // it); its result is not wanted any more.
            _ = shutdown.changed() => return None,
        };
        open = back;
        let now = clock.now_ms();
        match result {
            Ok(source) => {
                watch.succeeded(now);
                return Some(source);
            }
            Err(e) => watch.failed(now, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Capture;
    use flopwatch_proto::model::GpuInfo;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Nothing(Vec<GpuInfo>);

    impl GpuSource for Nothing {
        fn name(&self) -> &'static str {
            "nothing"
        }

        fn inventory(&self) -> &[GpuInfo] {
            &self.0
        }

        fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
            Ok(Capture {
                ts_ms: now_ms,
                ..Default::default()
            })
        }
    }

    fn refused() -> SourceError {
        SourceError::Exporter {
            url: "http://127.0.0.1:9400/metrics".into(),
            message: "connection refused".into(),
        }
    }

    fn retry() -> RetryOptions {
        RetryOptions {
            first: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            seed: 7,
            remind_every: Duration::from_secs(60),
        }
    }

    /// Opens on the `n`th attempt, noting each attempt's time.
    fn opens_at(n: usize, times: Arc<std::sync::Mutex<Vec<i64>>>) -> OpenSource {
        let tries = Arc::new(AtomicUsize::new(0));
        Box::new(move |now| {
            times.lock().unwrap().push(now);
            if tries.fetch_add(1, Ordering::SeqCst) + 1 >= n {
                Ok(Box::new(Nothing(vec![GpuInfo::default()])))
            } else {
                Err(refused())
            }
        })
    }

    /// Waits grow under a doubling ceiling capped at 30 s; the probes say
    /// why until the source opens, then nothing.
    #[tokio::test(start_paused = true)]
    async fn retries_with_capped_backoff_until_it_opens() {
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::TokioClock::starting_at(0));
        let health = Arc::new(Health::default());
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (_stop, shutdown) = watch::channel(false);
        let watch = first_failure(&refused(), 0, &retry(), health.clone());
        let opened =
            open_with_retry(opens_at(9, times.clone()), watch, retry(), clock, shutdown).await;
        assert!(opened.is_some());
        let times = times.lock().unwrap().clone();
        assert_eq!(times.len(), 9);
        let mut ceiling = 1_000;
        let mut prev = 0;
        for t in times {
            assert!(
                t - prev <= ceiling,
                "waited {} ms, ceiling {ceiling}",
                t - prev
            );
            ceiling = (ceiling * 2).min(30_000);
            prev = t;
        }
        // The first attempt (before the retries) and eight retries failed.
        assert_eq!(health.open_errors(), 9);
        assert!(health.source_problem().is_none());
        assert!(health.source_up());
    }

    /// A shutdown while waiting ends the wait at once.
    #[tokio::test(start_paused = true)]
    async fn a_shutdown_ends_the_wait() {
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::TokioClock::starting_at(0));
        let health = Arc::new(Health::default());
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop, shutdown) = watch::channel(false);
        let watch = first_failure(&refused(), 0, &retry(), health.clone());
        let task = tokio::spawn(open_with_retry(
            opens_at(usize::MAX, times.clone()),
            watch,
            RetryOptions {
                first: Duration::from_secs(3600),
                cap: Duration::from_secs(3600),
                ..retry()
            },
            clock,
            shutdown,
        ));
        tokio::task::yield_now().await;
        let asked = tokio::time::Instant::now();
        stop.send(true).unwrap();
        assert!(task.await.unwrap().is_none());
        assert!(asked.elapsed() < Duration::from_secs(1));
        let p = health.source_problem().expect("still not open");
        assert!(p.opening && p.error.contains("connection refused"), "{p:?}");
    }
}
