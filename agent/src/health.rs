//! Whether the sampling loop is alive and has read the GPUs: what the
//! agent's `/healthz` and `/readyz` answer (served next to `/metrics`).
//!
//! An NVML call can block for good (a GPU fallen off the bus, a wedged
//! driver). The process then looks healthy from outside, its gRPC stream
//! and `/metrics` still answering, while no sample is taken. Liveness
//! therefore tracks the loop itself: every capture that returns, read or
//! failed, is progress; none for [`STALL_CAPTURES`] capture intervals (and
//! at least the probe's floor) means the loop is stuck and the kubelet
//! should restart the pod. A failing read is not a stall: restarting does
//! not fix a GPU that answers with an error, and the error is counted.
//!
//! Readiness: the first capture has been read, and the loop is not stuck.
//!
//! The source itself: an agent whose source cannot be opened yet (a
//! dcgm-exporter that starts after it, [`crate::opening`]) is live (it
//! serves, and retries with backoff: restarting it would not make the
//! exporter answer sooner) and not ready, with the reason. Once sampling, a
//! source that has failed [`NOT_READY_FAILURES`] captures in a row over at
//! least the probe's floor makes the agent not ready until a capture reads
//! again ([`crate::outage`] tells the log).

use flopwatch_proto::clock::Stopwatch;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Capture intervals without a returned capture before the loop counts as
/// stuck.
pub(crate) const STALL_CAPTURES: u32 = 20;

/// Failed captures in a row (over at least the probe's floor) after which
/// the agent is not ready.
pub(crate) const NOT_READY_FAILURES: u64 = 3;

/// Why the source does not answer: what `/readyz` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceProblem {
    /// The source has never been opened (else: its captures fail).
    pub opening: bool,
    /// Failed attempts or captures in a row.
    pub failures: u64,
    /// Time from the first of them to the latest, ms.
    pub for_ms: u64,
    /// The latest error.
    pub error: String,
}

/// The sampling loop's progress, written by the loop, read by the probes.
#[derive(Debug)]
pub struct Health {
    start: Stopwatch,
    /// When the last capture returned (or the loop started), ms after
    /// `start`.
    last_progress_ms: AtomicU64,
    /// The loop's current capture interval, ms.
    interval_ms: AtomicU64,
    /// A capture has been read.
    read: AtomicBool,
    /// The source is open and its last capture read.
    source_up: AtomicBool,
    /// Failed attempts to open the source.
    open_errors: AtomicU64,
    /// Set while the source cannot be opened or its captures fail.
    problem: Mutex<Option<SourceProblem>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            start: Stopwatch::start(),
            last_progress_ms: AtomicU64::new(0),
            interval_ms: AtomicU64::new(0),
            read: AtomicBool::new(false),
            source_up: AtomicBool::new(false),
            open_errors: AtomicU64::new(0),
            problem: Mutex::new(None),
        }
    }
}

impl Health {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The loop waits `interval` before its next capture.
    pub fn pace(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.interval_ms.store(ms, Ordering::Relaxed);
    }

    /// A capture returned; `read` when it produced readings.
    pub fn progressed(&self, read: bool) {
        self.last_progress_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
        if read {
            self.read.store(true, Ordering::Relaxed);
        }
    }

    /// The sampling loop starts now: the stall limit counts from here,
    /// not from the agent's start (its source may have taken minutes to
    /// open).
    pub fn started(&self) {
        self.last_progress_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
    }

    /// The current capture interval.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// An attempt to open the source failed: `failures` in a row over
    /// `for_ms`, the latest with `error`.
    pub fn open_failed(&self, failures: u64, for_ms: u64, error: &str) {
        self.open_errors.fetch_add(1, Ordering::Relaxed);
        self.set_problem(true, failures, for_ms, error);
    }

    /// A capture failed: `failures` in a row over `for_ms`, the latest with
    /// `error`.
    pub fn capture_failed(&self, failures: u64, for_ms: u64, error: &str) {
        self.set_problem(false, failures, for_ms, error);
    }

    fn set_problem(&self, opening: bool, failures: u64, for_ms: u64, error: &str) {
        self.source_up.store(false, Ordering::Relaxed);
        let mut p = self.problem.lock().unwrap_or_else(PoisonError::into_inner);
        match p.as_mut() {
            Some(p) if p.opening == opening => {
                p.failures = failures;
                p.for_ms = for_ms;
                if p.error != error {
                    p.error = error.to_string();
                }
            }
            _ => {
                *p = Some(SourceProblem {
                    opening,
                    failures,
                    for_ms,
                    error: error.to_string(),
                })
            }
        }
    }

    /// The source answers again (it opened, or a capture read).
    pub fn source_answers(&self) {
        *self.problem.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether the source is open and its last capture read.
    pub fn source_up(&self) -> bool {
        self.source_up.load(Ordering::Relaxed)
    }

    /// Sets [`Health::source_up`].
    pub fn set_source_up(&self, up: bool) {
        self.source_up.store(up, Ordering::Relaxed);
    }

    /// Failed attempts to open the source, in all.
    pub fn open_errors(&self) -> u64 {
        self.open_errors.load(Ordering::Relaxed)
    }

    /// Why the source does not answer, while it does not.
    pub fn source_problem(&self) -> Option<SourceProblem> {
        self.problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Time since the last returned capture (or the start).
    pub fn since_progress(&self) -> Duration {
        let last = self.last_progress_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }

    /// How long the loop may go without a returned capture: a capture that
    /// takes a little longer than usual is no stall.
    pub fn stall_limit(&self, floor: Duration) -> Duration {
        let interval = Duration::from_millis(self.interval_ms.load(Ordering::Relaxed));
        (interval * STALL_CAPTURES).max(floor)
    }

    /// The probes' view, the stall limit at least `floor`.
    pub fn probe(self: &Arc<Self>, floor: Duration) -> HealthProbe {
        HealthProbe {
            health: self.clone(),
            floor,
        }
    }
}

/// `/healthz` and `/readyz` of one agent.
#[derive(Debug, Clone)]
pub struct HealthProbe {
    health: Arc<Health>,
    floor: Duration,
}

impl HealthProbe {
    /// `Err(why)` when the sampling loop has been stuck longer than the
    /// stall limit. Waiting for the source to open is no stall.
    pub fn live(&self) -> Result<(), String> {
        if self.health.source_problem().is_some_and(|p| p.opening) {
            return Ok(());
        }
        let since = self.health.since_progress();
        let limit = self.health.stall_limit(self.floor);
        if since > limit {
            return Err(format!(
                "no capture returned for {} ms (limit {} ms): the GPU driver may be stuck",
                since.as_millis(),
                limit.as_millis()
            ));
        }
        Ok(())
    }

    /// `Err(why)` while the source cannot be opened, before the first
    /// capture is read, while the source has failed
    /// [`NOT_READY_FAILURES`] captures in a row over at least the floor, or
    /// while stuck.
    pub fn ready(&self) -> Result<(), String> {
        let problem = self.health.source_problem();
        if let Some(p) = problem.as_ref().filter(|p| p.opening) {
            return Err(format!(
                "source not ready: {} ({} failed attempts over {:.1} s; retrying)",
                p.error,
                p.failures,
                p.for_ms as f64 / 1000.0
            ));
        }
        if !self.health.read.load(Ordering::Relaxed) {
            return Err("no capture read yet".to_string());
        }
        let floor_ms = u64::try_from(self.floor.as_millis()).unwrap_or(u64::MAX);
        if let Some(p) =
            problem.filter(|p| p.failures >= NOT_READY_FAILURES && p.for_ms >= floor_ms)
        {
            return Err(format!(
                "source failing: {} ({} captures in a row over {:.1} s)",
                p.error,
                p.failures,
                p.for_ms as f64 / 1000.0
            ));
        }
        self.live()
    }
}

impl flopwatch_transport::metrics_http::Probes for HealthProbe {
    fn live(&self) -> Result<(), String> {
        HealthProbe::live(self)
    }

    fn ready(&self) -> Result<(), String> {
        HealthProbe::ready(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_limit_is_intervals_with_a_floor() {
        let h = Health::default();
        h.pace(Duration::from_millis(100));
        assert_eq!(h.stall_limit(Duration::ZERO), Duration::from_secs(2));
        assert_eq!(
            h.stall_limit(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn ready_only_after_a_read_capture() {
        let h = Arc::new(Health::default());
        let p = h.probe(Duration::from_secs(3600));
        assert!(p.live().is_ok());
        assert!(p.ready().is_err());
        h.progressed(false);
        assert!(p.ready().is_err(), "a failed capture reads nothing");
        h.progressed(true);
        assert!(p.ready().is_ok());
    }

    /// While the source cannot be opened the agent is live (waiting is no
    /// stall, however long) and not ready, saying why; once the loop
    /// starts, the stall limit counts from then.
    #[test]
    fn waiting_for_the_source_is_live_and_not_ready() {
        let h = Arc::new(Health::default());
        let p = h.probe(Duration::ZERO);
        h.pace(Duration::from_millis(1));
        h.open_failed(1, 0, "dcgm-exporter http://x/metrics: connection refused");
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.live().is_ok());
        let why = p.ready().unwrap_err();
        assert!(
            why.contains("source not ready") && why.contains("connection refused"),
            "{why}"
        );
        h.open_failed(2, 1_500, "HTTP status 500");
        assert!(p
            .ready()
            .unwrap_err()
            .contains("2 failed attempts over 1.5 s"));
        assert_eq!(h.open_errors(), 2);
        assert!(!h.source_up());
        // Opened: the loop starts and reads.
        h.source_answers();
        h.pace(Duration::from_secs(1));
        h.started();
        assert!(p.live().is_ok());
        assert!(p.ready().is_err(), "no capture read yet");
        h.progressed(true);
        h.set_source_up(true);
        assert!(p.ready().is_ok());
    }

    /// A source that fails a capture or two is still ready; one failing
    /// for NOT_READY_FAILURES captures over the floor is not, until a
    /// capture reads again.
    #[test]
    fn a_failing_source_is_not_ready_after_a_bound() {
        let h = Arc::new(Health::default());
        let p = h.probe(Duration::from_secs(10));
        h.pace(Duration::from_secs(1));
        h.progressed(true);
        h.capture_failed(1, 0, "HTTP status 500");
        h.capture_failed(2, 5_000, "HTTP status 500");
        assert!(p.ready().is_ok());
        h.capture_failed(3, 9_999, "HTTP status 500");
        assert!(p.ready().is_ok(), "not yet the floor");
        h.capture_failed(4, 10_000, "HTTP status 500");
        let why = p.ready().unwrap_err();
        assert!(
            why.contains("source failing: HTTP status 500 (4 captures"),
            "{why}"
        );
        assert!(p.live().is_ok(), "a failing source is no stall");
        h.source_answers();
        assert!(p.ready().is_ok());
    }
}
