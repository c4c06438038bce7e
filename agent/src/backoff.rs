//! Reconnect backoff with full jitter: each wait is drawn uniformly from
//! zero to a ceiling that doubles after every failed round, up to a cap.
//! Thousands of agents that lost the same collector then come back spread
//! over the whole ceiling instead of all at its end ("Exponential Backoff
//! And Jitter", AWS Architecture Blog, 2015: full jitter does the least
//! work of the schemes compared there).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Exponential backoff with full jitter. See the module docs.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    ceiling: Duration,
    rng: SmallRng,
}

impl Backoff {
    /// Ceilings from `first`, doubling up to `cap`; `seed` seeds the draws
    /// (agents seed it with their own identity and the time, so no two
    /// draw alike).
    pub(crate) fn new(first: Duration, cap: Duration, seed: u64) -> Self {
        Self {
            first,
            cap: cap.max(first),
            ceiling: first,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The wait before the next round: uniform in `[0, ceiling]`; the
    /// ceiling then doubles (at most to the cap).
    pub(crate) fn next_wait(&mut self) -> Duration {
        let ms = u64::try_from(self.ceiling.as_millis()).unwrap_or(u64::MAX);
        let wait = Duration::from_millis(self.rng.random_range(0..=ms));
        self.ceiling = (self.ceiling * 2).min(self.cap);
        wait
    }

    /// Back to the first ceiling (a stream was welcomed).
    pub(crate) fn reset(&mut self) {
        self.ceiling = self.first;
    }
}

/// A seed that differs between agents and between runs of one agent.
pub(crate) fn seed_for(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_spread_below_a_doubling_capped_ceiling() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), 7);
        let mut ceiling = 100;
        for _ in 0..12 {
            let w = b.next_wait().as_millis() as u64;
            assert!(w <= ceiling, "{w} above {ceiling}");
            ceiling = (ceiling * 2).min(5_000);
        }
        // At the cap, 1,000 agents' waits cover the whole ceiling: no
        // tenth of it holds more than twice its share.
        let mut bins = [0u32; 10];
        for seed in 0..1_000 {
            let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(5), seed);
            bins[(b.next_wait().as_millis() as usize * 10 / 5_001).min(9)] += 1;
        }
        assert!(bins.iter().all(|&n| (50..=200).contains(&n)), "{bins:?}");
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }

    #[test]
    fn agents_seed_differently() {
        assert_ne!(seed_for("node-1"), seed_for("node-2"));
    }
}
