//! Hours and minutes: the widths of chunks and rollup buckets.

/// Width of a chunk: blocks never straddle an aligned hour, and each
/// series' blocks of one hour are compacted into one chunk.
pub const WINDOW_MS: i64 = 3_600_000;
/// Width of a minute rollup bucket.
pub const MINUTE_MS: i64 = 60_000;

/// Start of the hour holding `ts`.
pub(super) fn window_of(ts: i64) -> i64 {
    ts.div_euclid(WINDOW_MS) * WINDOW_MS
}

/// Splits `0..n` into runs whose timestamps fall in one hour.
pub(super) fn hour_runs(n: usize, ts: impl Fn(usize) -> i64) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut from = 0;
    for i in 1..=n {
        if i == n || window_of(ts(i)) != window_of(ts(from)) {
            runs.push(from..i);
            from = i;
        }
    }
    runs
}
