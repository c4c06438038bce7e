//! How long batches on the wire may go unanswered before the client gives
//! up on its collector.
//!
//! A dead collector, a dead host or a stopped process is found by HTTP/2
//! keepalive pings within about 4 s, and a killed process resets the
//! connection at once; the acknowledgement deadline is for a collector
//! that is up but not answering. At [`ACK_TIMEOUT`] a collector that is only
//! slow (every core busy, acks seconds behind) would see every agent
//! reconnect at once, each with a new Hello, which makes it slower still.
//! So the deadline follows the gaps between the collector's answers that
//! this client has seen: [`FACTOR`] times the longest recent gap, never less
//! than [`ACK_TIMEOUT`] nor more than [`MAX_ACK_TIMEOUT`]. The longest gap
//! decays by an eighth at each answer, so a collector that is quick again
//! brings the deadline back to [`ACK_TIMEOUT`] within a few dozen answers.

use std::time::Duration;

/// The deadline while answers come quickly.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(4);
/// The longest deadline, however slow the collector has been.
pub const MAX_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times the longest recent gap between answers the deadline is.
pub const FACTOR: u32 = 4;

/// The acknowledgement deadline learned from a collector's answers.
#[derive(Debug, Clone, Default)]
pub struct AckDeadline {
    /// The longest recent gap between answers with batches on the wire,
    /// decayed at each answer.
    slow: Duration,
}

impl AckDeadline {
    /// A deadline of [`ACK_TIMEOUT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An answer came `gap` after the previous one (or after the first
    /// batch went out), with batches on the wire.
    pub fn answered_after(&mut self, gap: Duration) {
        self.slow = gap.max(self.slow.mul_f64(7.0 / 8.0));
    }

    /// How long the batches on the wire may now go unanswered.
    pub fn current(&self) -> Duration {
        (self.slow * FACTOR).clamp(ACK_TIMEOUT, MAX_ACK_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quick_answers_keep_the_four_second_deadline() {
        let mut d = AckDeadline::new();
        assert_eq!(d.current(), ACK_TIMEOUT);
        for _ in 0..100 {
            d.answered_after(50 * MS);
        }
        assert_eq!(d.current(), ACK_TIMEOUT);
        d.answered_after(999 * MS);
        assert_eq!(d.current(), ACK_TIMEOUT, "4 × 0.999 s is under 4 s");
    }

    #[test]
    fn a_slow_collector_gets_four_times_its_gap_up_to_thirty_seconds() {
        let mut d = AckDeadline::new();
        d.answered_after(3000 * MS);
        assert_eq!(d.current(), 12_000 * MS);
        d.answered_after(20_000 * MS);
        assert_eq!(d.current(), MAX_ACK_TIMEOUT);
    }

    #[test]
    fn the_deadline_comes_back_once_answers_are_quick_again() {
        let mut d = AckDeadline::new();
        d.answered_after(5000 * MS);
        assert_eq!(d.current(), 20_000 * MS);
        let mut answers = 0;
        while d.current() > ACK_TIMEOUT {
            d.answered_after(10 * MS);
            answers += 1;
            assert!(answers < 100, "still {:?}", d.current());
        }
        // 20 s × (7/8)^n ≤ 4 s: n = 13.
        assert_eq!(answers, 13);
    }
}
