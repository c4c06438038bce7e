//! PromQL's range-vector functions and the value helpers aggregations
//! share, as Prometheus 2.42 computes them (`promql/functions.go`,
//! `promql/quantile.go`; our own code, the same arithmetic).

/// A range-vector function this engine evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RangeFn {
    Avg,
    Min,
    Max,
    Sum,
    Count,
    Last,
    Quantile,
    Rate,
    Increase,
    Irate,
    Resets,
}

impl RangeFn {
    pub fn of(name: &str) -> Option<Self> {
        Some(match name {
            "avg_over_time" => Self::Avg,
            "min_over_time" => Self::Min,
            "max_over_time" => Self::Max,
            "sum_over_time" => Self::Sum,
            "count_over_time" => Self::Count,
            "last_over_time" => Self::Last,
            "quantile_over_time" => Self::Quantile,
            "rate" => Self::Rate,
            "increase" => Self::Increase,
            "irate" => Self::Irate,
            "resets" => Self::Resets,
            _ => return None,
        })
    }

    /// The function over the samples of one window `[t - range, t]`
    /// (non-empty, in time order); `q` is quantile_over_time's φ.
    pub fn apply(self, w: &[(i64, f64)], t: i64, range_ms: i64, q: f64) -> Option<f64> {
        let (_, first) = *w.first()?;
        Some(match self {
            Self::Avg => w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64,
            Self::Min => w
                .iter()
                .fold(first, |m, p| if p.1 < m || m.is_nan() { p.1 } else { m }),
            Self::Max => w
                .iter()
                .fold(first, |m, p| if p.1 > m || m.is_nan() { p.1 } else { m }),
            Self::Sum => w.iter().map(|p| p.1).sum(),
            Self::Count => w.len() as f64,
            Self::Last => w[w.len() - 1].1,
            Self::Quantile => {
                let mut v: Vec<f64> = w.iter().map(|p| p.1).collect();
                quantile(q, &mut v)
            }
            Self::Rate => extrapolated_rate(w, t, range_ms, true, true)?,
            Self::Increase => extrapolated_rate(w, t, range_ms, true, false)?,
            Self::Irate => irate(w)?,
            Self::Resets => w.windows(2).filter(|p| p[1].1 < p[0].1).count() as f64,
        })
    }
}

/// Count, sum, min and max of a window, merged from samples and rollup
/// buckets: what `avg|sum|count|min|max_over_time` need.
#[derive(Debug, Default)]
pub(super) struct WindowAcc {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl WindowAcc {
    /// Adds `count` samples with sum `sum`, minimum `min` and maximum `max`.
    pub fn add(&mut self, count: u64, sum: f64, min: f64, max: f64) {
        if count == 0 {
            return;
        }
        if self.count == 0 {
            (self.min, self.max) = (min, max);
        } else {
            // Prometheus replaces a NaN minimum or maximum by any number.
            if min < self.min || self.min.is_nan() {
                self.min = min;
            }
            if max > self.max || self.max.is_nan() {
                self.max = max;
            }
        }
        self.count += count;
        self.sum += sum;
    }

    /// `f`'s value (`None` for an empty window; `f` one of the five).
    pub fn value(&self, f: RangeFn) -> Option<f64> {
        (self.count > 0).then(|| match f {
            RangeFn::Avg => self.sum / self.count as f64,
            RangeFn::Sum => self.sum,
            RangeFn::Count => self.count as f64,
            RangeFn::Min => self.min,
            _ => self.max,
        })
    }
}

/// `rate`/`increase` (Prometheus's `extrapolatedRate`): the counter's
/// increase over the window, corrected for resets and extrapolated to the
/// window's edges (by at most 1.1 average sample spacings, never below
/// zero), per second for `rate`.
fn extrapolated_rate(
    w: &[(i64, f64)],
    t: i64,
    range_ms: i64,
    counter: bool,
    per_second: bool,
) -> Option<f64> {
    if w.len() < 2 {
        return None;
    }
    let (range_start, range_end) = (t - range_ms, t);
    let (t0, v0) = w[0];
    let (tn, vn) = w[w.len() - 1];
    let mut result = vn - v0;
    if counter {
        let mut last = 0.0;
        for &(_, v) in w {
            if v < last {
                result += last;
            }
            last = v;
        }
    }
    let mut to_start = (t0 - range_start) as f64 / 1000.0;
    let to_end = (range_end - tn) as f64 / 1000.0;
    let sampled = (tn - t0) as f64 / 1000.0;
    let avg_step = sampled / (w.len() - 1) as f64;
    if counter && result > 0.0 && v0 >= 0.0 {
        let to_zero = sampled * (v0 / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = avg_step * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        avg_step / 2.0
    };
    interval += if to_end < threshold {
        to_end
    } else {
        avg_step / 2.0
    };
    result *= interval / sampled;
    if per_second {
        result /= range_ms as f64 / 1000.0;
    }
    Some(result)
}

/// `irate`: the per-second change between the window's last two samples
/// (the last value alone after a reset).
fn irate(w: &[(i64, f64)]) -> Option<f64> {
    if w.len() < 2 {
        return None;
    }
    let (tp, vp) = w[w.len() - 2];
    let (tl, vl) = w[w.len() - 1];
    let change = if vl < vp { vl } else { vl - vp };
    let dt = tl - tp;
    if dt == 0 {
        return None;
    }
    Some(change / (dt as f64 / 1000.0))
}

/// Prometheus's φ-quantile: linear interpolation between the closest
/// ranks of the sorted values; −∞ below φ = 0, +∞ above 1, NaN for none.
pub(super) fn quantile(q: f64, v: &mut [f64]) -> f64 {
    if v.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    v[lower as usize] * (1.0 - weight) + v[upper as usize] * weight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_extrapolates_as_prometheus_does() {
        // A counter rising 1/s sampled every 10 s, window (t-60s, t] with
        // t 5 s after the last sample: extrapolated to both edges.
        let w: Vec<(i64, f64)> = (0..6)
            .map(|i| (1_000 + i * 10_000, 100.0 + i as f64 * 10.0))
            .collect();
        let t = 56_000;
        let r = RangeFn::Rate.apply(&w, t, 60_000, 0.0).unwrap();
        // sampled 50 s, to_start 5 s (t0 - (t - 60 s)) = 1-(-4) = 5 s,
        // to_end 5 s: increase 50 × 60/50 = 60 → 1/s.
        assert!((r - 1.0).abs() < 1e-12, "{r}");
        let inc = RangeFn::Increase.apply(&w, t, 60_000, 0.0).unwrap();
        assert!((inc - 60.0).abs() < 1e-9, "{inc}");
    }

    #[test]
    fn counter_resets_add_the_value_before_the_reset() {
        let w = [(0, 5.0), (1_000, 10.0), (2_000, 2.0), (3_000, 4.0)];
        assert_eq!(RangeFn::Resets.apply(&w, 3_000, 3_000, 0.0), Some(1.0));
        // 10 - 5 + (4 - 0 after the reset, counted from 10) = 4 - 5 + 10.
        let inc = extrapolated_rate(&w, 3_000, 3_000, true, false).unwrap();
        assert!((inc - 9.0).abs() < 1e-9, "{inc}");
        assert_eq!(RangeFn::Irate.apply(&w, 3_000, 3_000, 0.0), Some(2.0));
    }

    #[test]
    fn quantile_interpolates_between_ranks() {
        let mut v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(0.5, &mut v), 2.5);
        assert_eq!(quantile(0.0, &mut v), 1.0);
        assert_eq!(quantile(1.0, &mut v), 4.0);
        assert_eq!(quantile(-0.1, &mut v), f64::NEG_INFINITY);
        assert!(quantile(0.5, &mut []).is_nan());
    }
}
