//! Acknowledgement latency as the agent sees it: from a batch put on the
//! wire to its ack. A fixed log-scale histogram of atomic counters
//! (sixteen buckets per doubling, each 4.4 % wider than the one before,
//! 100 µs to about 28 min; 3 KiB), cheap enough to record every ack, fine
//! enough to tell two runs 10 % apart, and summable across agents
//! (`flopwatch-bench fleet` merges thousands).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bound of the first bucket.
const FIRST: Duration = Duration::from_micros(100);
/// Buckets per doubling.
const STEPS: f64 = 16.0;
/// Number of buckets (the last also takes everything above it).
pub const BUCKETS: usize = 384;

/// Latency histogram. See the module docs.
#[derive(Debug)]
pub struct LatencyHistogram {
    counts: Vec<AtomicU64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LatencyHistogram {
    /// Counts one latency.
    pub fn observe(&self, d: Duration) {
        self.counts[bucket(d)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts per bucket.
    pub fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

fn bucket(d: Duration) -> usize {
    let ratio = d.as_secs_f64() / FIRST.as_secs_f64();
    if ratio <= 1.0 {
        return 0;
    }
    ((ratio.log2() * STEPS).ceil() as usize).min(BUCKETS - 1)
}

/// Upper bound of bucket `i`.
pub fn upper_bound(i: usize) -> Duration {
    FIRST.mul_f64(2f64.powf(i as f64 / STEPS))
}

/// The `q` quantile (0 to 1) of `counts` (one histogram's, or several
/// summed): the upper bound of the bucket holding it, so at most 4.4 %
/// above the true value. `None` when nothing was counted.
pub fn quantile(counts: &[u64], q: f64) -> Option<Duration> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(upper_bound(i));
        }
    }
    Some(upper_bound(counts.len().saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_in_the_bucket_of_the_value() {
        let h = LatencyHistogram::default();
        for ms in 1..=100 {
            h.observe(Duration::from_millis(ms));
        }
        let c = h.counts();
        let p50 = quantile(&c, 0.5).unwrap();
        let p99 = quantile(&c, 0.99).unwrap();
        // The bucket's upper bound: at most 2^(1/16) (4.4 %) over.
        assert!(p50 >= Duration::from_millis(50) && p50 <= Duration::from_micros(52_200));
        assert!(p99 >= Duration::from_millis(99) && p99 <= Duration::from_micros(103_400));
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
        h.observe(Duration::from_secs(100_000));
        assert_eq!(h.counts()[BUCKETS - 1], 1);
        h.observe(Duration::ZERO);
        assert_eq!(h.counts()[0], 1);
    }
}
