//! The adaptive sampler's trailing window of checked reads, per metric:
//! its peak and how many reads are at or above a level, asked at every
//! capture.
//!
//! Scanning the window for both (50 reads at a 5 s window and 100 ms
//! captures, for each metric checked) was the larger part of the sampler's
//! time in a profile of the agent. The peak is kept as a monotonic queue
//! (the reads that may still become the peak, in decreasing order: each
//! read enters and leaves it once), and the count at the level last asked
//! moves with each read in and out; a new level is counted once.

use std::collections::VecDeque;

/// Reads of the trailing window; see the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trailing {
    /// (time, value), oldest first.
    reads: VecDeque<(i64, f64)>,
    /// The reads that are not below a later one, decreasing: the first is
    /// the peak. NaN reads never enter (they are no peak).
    peaks: VecDeque<(i64, f64)>,
    /// The level last asked and how many reads are at or above it.
    above: Option<(f64, usize)>,
}

impl Trailing {
    /// Adds the read `v` at `now` and lets go of those at or before
    /// `now - window_ms`.
    pub(crate) fn push(&mut self, now: i64, v: f64, window_ms: i64) {
        self.reads.push_back((now, v));
        if let Some((lo, n)) = &mut self.above {
            *n += usize::from(v >= *lo);
        }
        if !v.is_nan() {
            while self.peaks.back().is_some_and(|b| b.1 <= v) {
                self.peaks.pop_back();
            }
            self.peaks.push_back((now, v));
        }
        let cut = now - window_ms;
        while let Some(&(t, x)) = self.reads.front() {
            if t > cut {
                break;
            }
            self.reads.pop_front();
            if let Some((lo, n)) = &mut self.above {
                *n -= usize::from(x >= *lo);
            }
        }
        while self.peaks.front().is_some_and(|f| f.0 <= cut) {
            self.peaks.pop_front();
        }
    }

    /// The highest read held; `f64::MIN` when none is.
    pub(crate) fn peak(&self) -> f64 {
        self.peaks.front().map_or(f64::MIN, |p| p.1)
    }

    /// Reads held.
    pub(crate) fn len(&self) -> usize {
        self.reads.len()
    }

    /// Whether no read is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }

    /// Reads held, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(i64, f64)> {
        self.reads.iter()
    }

    /// How many reads held are at or above `lo`.
    pub(crate) fn count_at_least(&mut self, lo: f64) -> usize {
        match self.above {
            Some((l, n)) if l.to_bits() == lo.to_bits() => n,
            _ => {
                let n = self.reads.iter().filter(|x| x.1 >= lo).count();
                self.above = Some((lo, n));
                n
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a scan of the window after every read, with levels that
        /// change now and then.
        #[test]
        fn peak_and_count_are_those_of_a_scan(
            reads in prop::collection::vec((1i64..300, prop_oneof![
                8 => (-5i32..20).prop_map(|x| f64::from(x) / 4.0),
                1 => Just(f64::NAN),
                1 => Just(-0.0),
            ]), 1..200),
            window in 100i64..2_000,
            levels in prop::collection::vec(-2i32..6, 1..5),
        ) {
            let mut t = Trailing::default();
            let mut now = 0;
            let mut held: Vec<(i64, f64)> = Vec::new();
            for (i, (step, v)) in reads.into_iter().enumerate() {
                now += step;
                t.push(now, v, window);
                held.push((now, v));
                held.retain(|x| x.0 > now - window);
                let peak = held.iter().map(|x| x.1).fold(f64::MIN, f64::max);
                prop_assert_eq!(t.peak(), peak);
                prop_assert_eq!(t.len(), held.len());
                let lo = f64::from(levels[i / 7 % levels.len()]);
                let n = held.iter().filter(|x| x.1 >= lo).count();
                prop_assert_eq!(t.count_at_least(lo), n);
            }
        }
    }

    #[test]
    fn an_empty_window_has_no_peak() {
        let mut t = Trailing::default();
        assert_eq!(t.peak(), f64::MIN);
        t.push(0, f64::NAN, 100);
        assert_eq!(t.peak(), f64::MIN);
        t.push(50, 3.0, 100);
        assert_eq!(t.peak(), 3.0);
        t.push(150, 1.0, 100);
        assert_eq!((t.peak(), t.len()), (1.0, 1));
    }
}
