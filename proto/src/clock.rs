//! Time, injected. Everything that needs "now" takes a [`Clock`], so tests
//! run on manual time instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};

/// A source of wall-clock time in unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Now, unix ms.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// Starts at `ms`.
    pub fn new(ms: i64) -> Self {
        Self(AtomicI64::new(ms))
    }

    /// Sets the time.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves time forward.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How long some work took, on the monotonic clock: for reports, metrics
/// and tests' measurements, never to decide what time it is (that is a
/// [`Clock`]'s job).
// With `Deadline`, the one place outside tokio's clock that reads the
// monotonic clock.
#[allow(clippy::disallowed_types)]
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts now.
    #[allow(clippy::disallowed_types)]
    pub fn start() -> Self {
        Self(std::time::Instant::now())
    }

    /// Time since the start.
    pub fn elapsed(&self) -> std::time::Duration {
        self.0.elapsed()
    }
}

/// A moment on the monotonic clock after which bounded work gives up (a
/// shutdown pass, a wait for a process to come up).
#[allow(clippy::disallowed_types)]
#[derive(Debug, Clone, Copy)]
pub struct Deadline(std::time::Instant);

impl Deadline {
    /// `d` from now.
    #[allow(clippy::disallowed_types)]
    pub fn after(d: std::time::Duration) -> Self {
        Self(std::time::Instant::now() + d)
    }

    /// The deadline has passed.
    #[allow(clippy::disallowed_types)]
    pub fn passed(&self) -> bool {
        std::time::Instant::now() >= self.0
    }

    /// Time left (zero once passed).
    #[allow(clippy::disallowed_types)]
    pub fn remaining(&self) -> std::time::Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_deadline_passes_and_a_stopwatch_counts() {
        let w = Stopwatch::start();
        let d = Deadline::after(Duration::from_millis(20));
        assert!(!d.passed());
        assert!(d.remaining() > Duration::ZERO);
        std::thread::sleep(Duration::from_millis(25));
        assert!(d.passed());
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(w.elapsed() >= Duration::from_millis(25));
    }
}
