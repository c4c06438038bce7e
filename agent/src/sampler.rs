//! When to read and what to send.
//!
//! The loop in [`crate::run`] asks a [`Sampler`] how long to wait before the
//! next capture and which readings of a capture to keep. [`FixedSampler`]
//! reads everything at a fixed interval; the adaptive sampler (Moneo §2.3)
//! implements the same trait.
//!
//! **Read savings.** Before a capture the loop may ask [`Sampler::due`]
//! which readings the sampler needs; a source that reads fields one by one
//! (NVML calls) can skip the others. A skipped window-mean metric must be
//! reported, when next read, as the mean over everything since its previous
//! read, with [`Reading::window_ms`](crate::source::Reading) set to that
//! span (counter deltas give this for free). A source that ignores the plan
//! and reads everything stays correct: the sampler then only saves samples.

use crate::capture::Capture;
pub(crate) use crate::capture::{PlanCarry, ReadPlan};
use std::time::Duration;

/// Decides the schedule and what is kept.
pub trait Sampler: Send {
    /// Delay until the next capture.
    fn next_delay(&self) -> Duration;

    /// Filters a capture in place: readings removed are not sent.
    fn observe(&mut self, capture: &mut Capture);

    /// What the capture about to be taken at `at_ms` (unix ms) must read.
    /// The default reads everything.
    fn due(&self, at_ms: i64) -> ReadPlan {
        let _ = at_ms;
        ReadPlan::all()
    }

    /// Whether sends are held back between captures (adaptive sampling):
    /// the agent then reads the energy counter at every capture, so that
    /// what is sent when a job starts or ends carries the counter's value
    /// at that instant ([`crate::cadence::SlowReads::exempting`]).
    fn holds_back(&self) -> bool {
        false
    }

    /// Each metric's current interval, ms, as (GPU index, metric, ms), for
    /// the collector and the agent's `/metrics`. Empty when the sampler has
    /// one interval for everything.
    fn intervals(&self) -> Vec<(usize, &'static str, u32)> {
        Vec::new()
    }

    /// Everything observed and not yet sent, as a capture at `now_ms`
    /// whose readings say where their windows end: called when the agent
    /// stops, so that a backed-off sampler's pending samples are not lost.
    /// The default holds nothing back.
    fn flush(&mut self, now_ms: i64) -> Capture {
        Capture {
            ts_ms: now_ms,
            ..Capture::default()
        }
    }
}

/// Fixed interval: every capture is sent as read.
#[derive(Debug, Clone)]
pub struct FixedSampler {
    interval: Duration,
}

impl FixedSampler {
    /// Every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self { interval }
    }
}

impl Sampler for FixedSampler {
    fn next_delay(&self) -> Duration {
        self.interval
    }

    fn observe(&mut self, _capture: &mut Capture) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};

    #[test]
    fn fixed_sends_every_capture_as_read() {
        let mut s = FixedSampler::new(Duration::from_millis(100));
        let mut c = Capture {
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 100,
                readings: vec![Reading::new("power_w", 1.0), Reading::new("temp_c", 2.0)],
            }],
            ..Default::default()
        };
        let before = c.clone();
        s.observe(&mut c);
        assert_eq!(c, before);
        assert_eq!(s.next_delay(), Duration::from_millis(100));
        assert_eq!(s.due(100), ReadPlan::all());
    }
}
