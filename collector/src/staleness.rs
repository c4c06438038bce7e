//! When a series' value stops being current: one rule for `/metrics`,
//! remote write, `flopwatch top` and the PromQL API.
//!
//! A sample covers the window its agent sampled it over (`window_ms`: the
//! sampling interval, or the backed-off interval of adaptive sampling). A
//! series is **stale** once [`STALE_INTERVALS`] such windows and
//! [`STALE_GRACE_MS`] have passed without a newer sample: the next sample
//! was due one window later, the grace covers a flush and the network.
//! With the default 100 ms sampling that is 10.3 s; with adaptive
//! sampling's 30 s cap, 100 s; never more than the lookback delta of
//! [`STALE_MAX_MS`] (5 min), which also bounds samples whose window is not
//! known.
//!
//! Where: `/metrics` and remote write judge by the collector's clock (when
//! the collector last received a sample of the series); the PromQL API
//! judges stored samples by their own timestamps, so a query about the
//! past gives the same answer as one at the time did — the way
//! Prometheus' staleness markers, written when a scraped series vanishes,
//! end a series.

/// Prometheus' staleness marker (the value remote write and OTLP send to
/// end a series): a NaN no computation produces.
pub(crate) const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// Windows a series may miss before it is stale.
pub(crate) const STALE_INTERVALS: i64 = 3;
/// Added to those windows, ms.
pub(crate) const STALE_GRACE_MS: i64 = 10_000;
/// The longest a sample stays current (Prometheus' default lookback), ms.
pub(crate) const STALE_MAX_MS: i64 = 5 * 60 * 1000;

/// How long after its sample a series with windows of `window_ms` stays
/// current; `None` or 0 (window unknown): [`STALE_MAX_MS`].
pub(crate) fn stale_after_ms(window_ms: Option<u32>) -> i64 {
    match window_ms {
        Some(w) if w > 0 => (STALE_INTERVALS * i64::from(w) + STALE_GRACE_MS).min(STALE_MAX_MS),
        _ => STALE_MAX_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_windows_and_ten_seconds_at_most_five_minutes() {
        assert_eq!(stale_after_ms(Some(100)), 10_300);
        assert_eq!(stale_after_ms(Some(30_000)), 100_000);
        assert_eq!(stale_after_ms(Some(u32::MAX)), STALE_MAX_MS);
        assert_eq!(stale_after_ms(None), STALE_MAX_MS);
        assert_eq!(stale_after_ms(Some(0)), STALE_MAX_MS);
    }
}
