//! Samples of one series in time order, and the two ways a query reads
//! them: the newest current sample at a time (instant selectors), and the
//! samples in a closed window (range selectors).
//!
//! A sample is current from its time until the series goes stale
//! ([`crate::staleness`]: three of its sampling windows and 10 s later,
//! at most the lookback delta), or until a newer sample replaces it: an
//! instant selector at `t` takes the newest sample at or before `t` if it
//! is still current at `t` — Prometheus' rule, where a series that
//! stopped ends at its staleness marker and one that did not at the
//! lookback delta (`t − 5m ≤ ts ≤ t`, 2.42's closed lookback).

/// Samples of one series, in time order.
pub(super) type Points = Vec<(i64, f64)>;

/// Samples of one series in time order, each with the last instant it is
/// current (inclusive).
pub(super) type Timeline = Vec<(i64, f64, i64)>;

/// A timestamped sample.
pub(super) trait Stamped: Copy {
    /// Its time, unix ms.
    fn ts(&self) -> i64;
}

impl Stamped for (i64, f64) {
    fn ts(&self) -> i64 {
        self.0
    }
}

impl Stamped for (i64, f64, i64) {
    fn ts(&self) -> i64 {
        self.0
    }
}

/// The newest sample of `pts` at or before `t`, if it is still current
/// at `t`; `j` is a cursor kept between calls with rising `t`.
pub(super) fn newest_at(pts: &[(i64, f64, i64)], t: i64, j: &mut usize) -> Option<(i64, f64)> {
    while *j < pts.len() && pts[*j].0 <= t {
        *j += 1;
    }
    j.checked_sub(1)
        .map(|k| pts[k])
        .filter(|p| t <= p.2)
        .map(|p| (p.0, p.1))
}

/// The points of `pts` in `[from, to]`.
pub(super) fn window<T: Stamped>(pts: &[T], from: i64, to: i64) -> &[T] {
    let lo = pts.partition_point(|p| p.ts() < from);
    let hi = pts.partition_point(|p| p.ts() <= to);
    &pts[lo..hi.max(lo)]
}

/// The samples of a timeline, without their ends.
pub(super) fn points(tl: &[(i64, f64, i64)]) -> Points {
    tl.iter().map(|p| (p.0, p.1)).collect()
}
