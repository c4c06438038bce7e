//! A wall clock driven by tokio's clock, so agents run under paused time in
//! tests and on real time in production with the same code.

use flopwatch_proto::clock::{Clock, SystemClock};
use tokio::time::Instant;

/// Unix ms = the system time at creation + tokio time elapsed since.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base_ms: i64,
    base: Instant,
}

impl TokioClock {
    /// Anchored at the system clock now.
    pub fn new() -> Self {
        Self::starting_at(SystemClock.now_ms())
    }

    /// Anchored at `ms`.
    pub fn starting_at(ms: i64) -> Self {
        Self {
            base_ms: ms,
            base: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.base_ms + self.base.elapsed().as_millis() as i64
    }
}
