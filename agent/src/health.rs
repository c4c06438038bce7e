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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Capture intervals without a returned capture before the loop counts as
/// stuck.
pub const STALL_CAPTURES: u32 = 20;

/// The sampling loop's progress, written by the loop, read by the probes.
#[derive(Debug)]
pub struct Health {
    start: Instant,
    /// When the last capture returned (or the loop started), ms after
    /// `start`.
    last_progress_ms: AtomicU64,
    /// The loop's current capture interval, ms.
    interval_ms: AtomicU64,
    /// A capture has been read.
    read: AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            interval_ms: AtomicU64::new(0),
            read: AtomicBool::new(false),
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
    /// stall limit.
    pub fn live(&self) -> Result<(), String> {
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

    /// `Err(why)` before the first capture is read or while stuck.
    pub fn ready(&self) -> Result<(), String> {
        if !self.health.read.load(Ordering::Relaxed) {
            return Err("no capture read yet".to_string());
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
}
