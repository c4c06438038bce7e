//! Capturing a scraped page no more often than it refreshes.
//!
//! dcgm-exporter publishes what DCGM collected at its own interval (`-c`,
//! 30 s by default); scraping it every 100 ms (the agent's default
//! `interval`, right for NVML) reads the same page about 300 times per real
//! reading. [`RefreshPaced`] wraps the agent's sampler and stretches the
//! capture interval to the page's observed refresh period, learned from
//! the captures themselves (dcgm-exporter writes no sample timestamps):
//!
//! * **Changed or not.** Each capture's GPU readings (metric and exact
//!   value; node devices such as `/proc` counters excluded, since they
//!   change at every read) are hashed; a capture whose hash equals the
//!   previous one's read a page that has not refreshed. DCGM's energy
//!   counter moves at every collection, so a refreshed page practically
//!   always differs.
//! * **Learning.** Captures every `min` (1 s by default) until two gaps
//!   between changes are seen; the period is the shorter gap (rounding
//!   toward more captures, never fewer), within `[min, max]` (1 s–60 s).
//!   A page that does not change for `max` is taken to refresh every `max`.
//! * **Locked.** Captures every 0.9 × period. Capturing a little faster
//!   than the page refreshes can never skip a refresh (at most one lands
//!   between two captures), and it costs one repeated page in ten; the
//!   exact period would drift in and out of phase with the exporter and
//!   skip a refresh whenever the two come close.
//! * **Following a change.** Two unchanged captures in a row cannot happen
//!   at 0.9 × period: the page now refreshes more slowly (or not at all),
//!   so the period is learned again. Twenty changed captures in a row
//!   cannot happen either (every tenth or so repeats): the page refreshes
//!   at least as fast as it is captured, so it is learned again too.
//!
//! The wait before each capture is the longer of the inner sampler's and
//! this one, so an adaptive sampler still backs off beyond it. The agent
//! wraps its sampler only for the `dcgm-exporter` source with the default
//! capture interval: an interval the user chose is kept as it is.
//!
//! Time is the captures' own timestamps, so the tests are exact.

use crate::capture::{Capture, ReadPlan};
use crate::sampler::Sampler;
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tracing::info;

/// The shortest capture interval this pacing sets (and the interval while
/// learning).
pub const MIN_POLL: Duration = Duration::from_secs(1);
/// The longest.
pub const MAX_POLL: Duration = Duration::from_secs(60);
/// Gaps between changes measured before the period is trusted.
const LEARN_GAPS: usize = 2;
/// Changed captures in a row, while locked, that send it back to learning.
const RELEARN_CHANGED: u32 = 20;
/// Unchanged captures in a row, while locked, that do.
const RELEARN_UNCHANGED: u32 = 2;

/// What an observation changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Learned {
    /// Nothing.
    Nothing,
    /// The period is known: capture every `poll_ms`.
    Locked {
        /// The page's refresh period, ms.
        period_ms: i64,
        /// The capture interval now, ms.
        poll_ms: i64,
    },
    /// The page's refresh changed; learning again.
    Relearning {
        /// Why.
        why: &'static str,
    },
}

/// Learning or locked. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Learning {
        /// Since when (the baseline capture, or the switch back).
        since_ms: i64,
    },
    Locked {
        period_ms: i64,
        changed: u32,
        unchanged: u32,
    },
}

/// The page's refresh period, learned from capture hashes and times.
#[derive(Debug, Clone)]
pub(crate) struct RefreshEstimate {
    min_ms: i64,
    max_ms: i64,
    last: Option<u64>,
    last_change_ms: Option<i64>,
    gaps: Vec<i64>,
    state: State,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl RefreshEstimate {
    /// Periods within `[min, max]`; `min` is also the learning interval.
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        let min_ms = ms(min).max(1);
        Self {
            min_ms,
            max_ms: ms(max).max(min_ms),
            last: None,
            last_change_ms: None,
            gaps: Vec::with_capacity(LEARN_GAPS),
            state: State::Learning { since_ms: 0 },
        }
    }

    /// The capture interval now.
    pub(crate) fn poll(&self) -> Duration {
        let ms = match self.state {
            State::Learning { .. } => self.min_ms,
            State::Locked { period_ms, .. } => self.poll_for(period_ms),
        };
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }

    fn poll_for(&self, period_ms: i64) -> i64 {
        (period_ms / 10 * 9).clamp(self.min_ms, self.max_ms)
    }

    /// A capture at `ts_ms` whose readings hash to `hash`.
    pub(crate) fn observe(&mut self, ts_ms: i64, hash: u64) -> Learned {
        let changed = match self.last.replace(hash) {
            None => {
                // The baseline: no change can be seen yet.
                self.state = State::Learning { since_ms: ts_ms };
                return Learned::Nothing;
            }
            Some(prev) => prev != hash,
        };
        match &mut self.state {
            State::Learning { since_ms } => {
                let since_ms = *since_ms;
                if changed {
                    if let Some(c) = self.last_change_ms {
                        self.gaps.push(ts_ms.saturating_sub(c).max(0));
                    }
                    self.last_change_ms = Some(ts_ms);
                    if self.gaps.len() >= LEARN_GAPS {
                        let shortest = self.gaps.iter().copied().min().unwrap_or(self.min_ms);
                        return self.lock(shortest);
                    }
                } else {
                    let quiet_since = self.last_change_ms.unwrap_or(since_ms);
                    if ts_ms.saturating_sub(quiet_since) >= self.max_ms {
                        return self.lock(self.max_ms);
                    }
                }
                Learned::Nothing
            }
            State::Locked {
                period_ms,
                changed: in_row_changed,
                unchanged: in_row_unchanged,
            } => {
                if changed {
                    *in_row_changed += 1;
                    *in_row_unchanged = 0;
                } else {
                    *in_row_unchanged += 1;
                    *in_row_changed = 0;
                }
                let period_ms = *period_ms;
                if *in_row_unchanged >= RELEARN_UNCHANGED && period_ms < self.max_ms {
                    return self.relearn(ts_ms, "the page refreshes less often than it did");
                }
                if *in_row_changed >= RELEARN_CHANGED && self.poll_for(period_ms) > self.min_ms {
                    return self.relearn(ts_ms, "the page may refresh more often than it did");
                }
                Learned::Nothing
            }
        }
    }

    fn lock(&mut self, period_ms: i64) -> Learned {
        let period_ms = period_ms.clamp(self.min_ms, self.max_ms);
        self.gaps.clear();
        self.state = State::Locked {
            period_ms,
            changed: 0,
            unchanged: 0,
        };
        Learned::Locked {
            period_ms,
            poll_ms: self.poll_for(period_ms),
        }
    }

    fn relearn(&mut self, ts_ms: i64, why: &'static str) -> Learned {
        self.gaps.clear();
        // Changes seen at the locked interval are too coarse to measure.
        self.last_change_ms = None;
        self.state = State::Learning { since_ms: ts_ms };
        Learned::Relearning { why }
    }
}

/// The hash of the GPU readings (captures `0..gpus`) of `capture`.
pub(crate) fn readings_hash(capture: &Capture, gpus: usize) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for g in capture.gpus.iter().filter(|g| g.gpu < gpus) {
        g.gpu.hash(&mut h);
        for r in &g.readings {
            r.metric.hash(&mut h);
            r.value.to_bits().hash(&mut h);
        }
    }
    h.finish()
}

/// A sampler whose captures follow the page's refresh. See the module docs.
pub struct RefreshPaced {
    inner: Box<dyn Sampler>,
    gpus: usize,
    estimate: RefreshEstimate,
}

impl std::fmt::Debug for RefreshPaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefreshPaced")
            .field("gpus", &self.gpus)
            .field("estimate", &self.estimate)
            .finish_non_exhaustive()
    }
}

impl RefreshPaced {
    /// `inner`, its captures no more often than the page of a source with
    /// `gpus` GPUs refreshes, within [`MIN_POLL`] and [`MAX_POLL`].
    pub fn new(inner: Box<dyn Sampler>, gpus: usize) -> Self {
        Self::with_bounds(inner, gpus, MIN_POLL, MAX_POLL)
    }

    /// [`RefreshPaced::new`] within `[min, max]`.
    pub fn with_bounds(inner: Box<dyn Sampler>, gpus: usize, min: Duration, max: Duration) -> Self {
        Self {
            inner,
            gpus,
            estimate: RefreshEstimate::new(min, max),
        }
    }
}

impl Sampler for RefreshPaced {
    fn next_delay(&self) -> Duration {
        self.inner.next_delay().max(self.estimate.poll())
    }

    fn observe(&mut self, capture: &mut Capture) {
        let hash = readings_hash(capture, self.gpus);
        match self.estimate.observe(capture.ts_ms, hash) {
            Learned::Nothing => {}
            Learned::Locked { period_ms, poll_ms } => {
                let d = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
                info!(
                    refresh_s = period_ms as f64 / 1000.0,
                    capture_every_s = poll_ms as f64 / 1000.0,
                    "the source's page refreshes about every {:?}; capturing every {:?}",
                    d(period_ms),
                    d(poll_ms)
                )
            }
            Learned::Relearning { why } => info!(
                "{why}; capturing every {:?} to learn its refresh again",
                self.estimate.poll()
            ),
        }
        self.inner.observe(capture);
    }

    fn due(&self, at_ms: i64) -> ReadPlan {
        self.inner.due(at_ms)
    }

    fn intervals(&self) -> Vec<(usize, &'static str, u32)> {
        self.inner.intervals()
    }

    fn flush(&mut self, now_ms: i64) -> Capture {
        self.inner.flush(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};
    use crate::sampler::FixedSampler;

    /// A page refreshing every `period_ms`, `phase_ms` into a period at
    /// time 0: its version at `t` (≥ 0).
    fn version(t: i64, period_ms: i64, phase_ms: i64) -> u64 {
        ((t + phase_ms) / period_ms) as u64
    }

    /// Drives an estimate as the loop does: a capture, then the wait it
    /// asks for. `page(t)` is the page's version at `t`. Returns the
    /// capture times and what was learned when.
    fn drive(
        e: &mut RefreshEstimate,
        from_ms: i64,
        until_ms: i64,
        page: impl Fn(i64) -> u64,
    ) -> (Vec<i64>, Vec<(i64, Learned)>) {
        let (mut t, mut times, mut learned) = (from_ms, Vec::new(), Vec::new());
        while t < until_ms {
            times.push(t);
            match e.observe(t, page(t)) {
                Learned::Nothing => {}
                l => learned.push((t, l)),
            }
            t += e.poll().as_millis() as i64;
        }
        (times, learned)
    }

    fn estimate() -> RefreshEstimate {
        RefreshEstimate::new(MIN_POLL, MAX_POLL)
    }

    /// dcgm-exporter's default 30 s: learned within three periods, then
    /// captured every 27 s, and no refresh is ever skipped.
    #[test]
    fn a_thirty_second_page_is_captured_every_27_s_without_a_miss() {
        let mut e = estimate();
        let page = |t| version(t, 30_000, 12_345);
        let (times, learned) = drive(&mut e, 0, 3_600_000, page);
        let Some((at, Learned::Locked { period_ms, poll_ms })) = learned.first().cloned() else {
            panic!("{learned:?}");
        };
        assert!(at <= 3 * 30_000 + 12_345, "locked at {at}");
        assert_eq!((period_ms, poll_ms), (30_000, 27_000));
        assert_eq!(learned.len(), 1, "stays locked: {learned:?}");
        // An hour: about 60 + 3600/27 captures instead of 36,000.
        assert!(times.len() < 250, "{} captures", times.len());
        // Every refresh after the lock was seen: consecutive captures are
        // at most one version apart.
        for w in times.windows(2).filter(|w| w[0] >= at) {
            assert!(
                page(w[1]) - page(w[0]) <= 1,
                "skipped a refresh between {w:?}"
            );
        }
    }

    /// The exporter is reconfigured from 30 s to 5 s, then to 60 s: each
    /// change is followed.
    #[test]
    fn a_change_of_refresh_is_followed() {
        let mut e = estimate();
        let (_, learned) = drive(&mut e, 0, 600_000, |t| version(t, 30_000, 0));
        assert!(matches!(
            learned.last(),
            Some((
                _,
                Learned::Locked {
                    period_ms: 30_000,
                    ..
                }
            ))
        ));
        // Faster: every capture changes; twenty in a row send it back.
        let base = 1_000_000;
        let (_, learned) = drive(&mut e, 600_000, 1_800_000, |t| base + version(t, 5_000, 0));
        assert!(
            matches!(learned.first(), Some((_, Learned::Relearning { .. }))),
            "{learned:?}"
        );
        assert!(
            matches!(
                learned.last(),
                Some((
                    _,
                    Learned::Locked {
                        period_ms: 5_000,
                        poll_ms: 4_500
                    }
                ))
            ),
            "{learned:?}"
        );
        // Slower: two unchanged captures in a row send it back.
        let base = 2_000_000;
        let (_, learned) = drive(&mut e, 1_800_000, 3_000_000, |t| {
            base + version(t, 60_000, 0)
        });
        assert!(
            matches!(learned.first(), Some((_, Learned::Relearning { .. }))),
            "{learned:?}"
        );
        assert!(
            matches!(
                learned.last(),
                Some((
                    _,
                    Learned::Locked {
                        period_ms: 60_000,
                        poll_ms: 54_000
                    }
                ))
            ),
            "{learned:?}"
        );
    }

    /// A page that never changes is captured every 54 s (the 60 s bound),
    /// and stays so: it cannot be slower than the bound.
    #[test]
    fn a_static_page_is_captured_at_the_bound() {
        let mut e = estimate();
        let (times, learned) = drive(&mut e, 0, 3_600_000, |_| 7);
        assert_eq!(
            learned,
            vec![(
                60_000,
                Learned::Locked {
                    period_ms: 60_000,
                    poll_ms: 54_000
                }
            )]
        );
        assert!(times.len() < 61 + 3_600 / 54 + 1, "{}", times.len());
    }

    /// A page refreshing as fast as or faster than the bound is captured
    /// at the bound, without going back and forth.
    #[test]
    fn a_fast_page_is_captured_every_second() {
        let mut e = estimate();
        let (times, learned) = drive(&mut e, 0, 600_000, |t| version(t, 250, 0));
        assert_eq!(e.poll(), MIN_POLL);
        assert_eq!(learned.len(), 1, "{learned:?}");
        assert_eq!(times.len(), 600);
    }

    #[test]
    fn the_hash_reads_gpus_only() {
        let capture = |gpu_value: f64, host_value: f64| Capture {
            ts_ms: 0,
            gpus: vec![
                GpuCapture {
                    gpu: 0,
                    window_ms: 0,
                    readings: vec![Reading::new("power_w", gpu_value)],
                },
                GpuCapture {
                    gpu: 1,
                    window_ms: 0,
                    readings: vec![Reading::new("cpu_util", host_value)],
                },
            ],
            ..Default::default()
        };
        let h = |c: &Capture| readings_hash(c, 1);
        assert_eq!(h(&capture(300.0, 0.1)), h(&capture(300.0, 0.9)));
        assert_ne!(h(&capture(300.0, 0.1)), h(&capture(301.0, 0.1)));
    }

    /// The wrapper waits the longer of its pacing and the inner sampler's,
    /// and hands every capture on unchanged.
    #[test]
    fn the_wrapper_waits_the_longer_of_the_two() {
        let mut s = RefreshPaced::new(Box::new(FixedSampler::new(Duration::from_millis(100))), 1);
        assert_eq!(s.next_delay(), MIN_POLL);
        let mut slow = RefreshPaced::new(Box::new(FixedSampler::new(Duration::from_secs(5))), 1);
        assert_eq!(slow.next_delay(), Duration::from_secs(5));
        let mut c = Capture {
            ts_ms: 0,
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 0,
                readings: vec![Reading::new("power_w", 1.0)],
            }],
            ..Default::default()
        };
        let before = c.clone();
        s.observe(&mut c);
        slow.observe(&mut c);
        assert_eq!(c, before);
        assert_eq!(s.due(0), ReadPlan::all());
        assert!(s.intervals().is_empty());
    }
}
