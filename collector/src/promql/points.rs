//! Samples of one series in time order, and the two ways a query reads
//! them: the newest sample within the lookback delta of a time (instant
//! selectors), and the samples in a closed window (range selectors).

use super::LOOKBACK_MS;

/// Samples of one series, in time order.
pub(super) type Points = Vec<(i64, f64)>;

/// The newest point of `pts` at or before `t`, if it is at most the
/// lookback delta old (`t − 5m ≤ ts ≤ t`, Prometheus 2.42's closed
/// lookback); `j` is a cursor kept between calls with rising `t`.
pub(super) fn newest_at(pts: &[(i64, f64)], t: i64, j: &mut usize) -> Option<(i64, f64)> {
    while *j < pts.len() && pts[*j].0 <= t {
        *j += 1;
    }
    j.checked_sub(1)
        .map(|k| pts[k])
        .filter(|p| p.0 >= t - LOOKBACK_MS)
}

/// The points of `pts` in `[from, to]`.
pub(super) fn window(pts: &[(i64, f64)], from: i64, to: i64) -> &[(i64, f64)] {
    let lo = pts.partition_point(|p| p.0 < from);
    let hi = pts.partition_point(|p| p.0 <= to);
    &pts[lo..hi.max(lo)]
}
