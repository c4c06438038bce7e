//! PromQL's functions and the value helpers aggregations share, as
//! Prometheus 2.42 computes them (`promql/functions.go`,
//! `promql/quantile.go`; our own code, the same arithmetic):
//!
//! - range-vector functions over one window of samples ([`RangeFn`]);
//! - instant-vector and scalar functions ([`instant`]);
//! - `histogram_quantile` over classic buckets ([`histogram`]).

pub(super) mod histogram;
pub(super) mod instant;

/// A range-vector function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RangeFn {
    Avg,
    Min,
    Max,
    Sum,
    Count,
    Last,
    Present,
    Stddev,
    Stdvar,
    Quantile,
    Rate,
    Increase,
    Delta,
    Irate,
    Idelta,
    Deriv,
    PredictLinear,
    HoltWinters,
    Changes,
    Resets,
}

impl RangeFn {
    pub(super) fn of(name: &str) -> Option<Self> {
        Some(match name {
            "avg_over_time" => Self::Avg,
            "min_over_time" => Self::Min,
            "max_over_time" => Self::Max,
            "sum_over_time" => Self::Sum,
            "count_over_time" => Self::Count,
            "last_over_time" => Self::Last,
            "present_over_time" => Self::Present,
            "stddev_over_time" => Self::Stddev,
            "stdvar_over_time" => Self::Stdvar,
            "quantile_over_time" => Self::Quantile,
            "rate" => Self::Rate,
            "increase" => Self::Increase,
            "delta" => Self::Delta,
            "irate" => Self::Irate,
            "idelta" => Self::Idelta,
            "deriv" => Self::Deriv,
            "predict_linear" => Self::PredictLinear,
            "holt_winters" => Self::HoltWinters,
            "changes" => Self::Changes,
            "resets" => Self::Resets,
            _ => return None,
        })
    }

    /// Where the range argument is among the function's arguments.
    pub(super) fn range_arg(self) -> usize {
        usize::from(self == Self::Quantile)
    }

    /// Whether the function keeps `__name__` (2.42: `last_over_time` only).
    pub(super) fn keeps_name(self) -> bool {
        self == Self::Last
    }

    /// The function over the samples of one window (non-empty, in time
    /// order) ending at `t − offset`, evaluated at `t`; `range_ms` and
    /// `offset_ms` are the window's; `p` are the other (scalar) arguments
    /// at this step.
    pub(super) fn apply(
        self,
        w: &[(i64, f64)],
        t: i64,
        range_ms: i64,
        offset_ms: i64,
        p: &[f64],
    ) -> Option<f64> {
        let (_, first) = *w.first()?;
        let arg = |i: usize| p.get(i).copied().unwrap_or(f64::NAN);
        Some(match self {
            Self::Avg => avg(w),
            Self::Min => w
                .iter()
                .fold(first, |m, p| if p.1 < m || m.is_nan() { p.1 } else { m }),
            Self::Max => w
                .iter()
                .fold(first, |m, p| if p.1 > m || m.is_nan() { p.1 } else { m }),
            Self::Sum => kahan_sum(w.iter().map(|p| p.1)),
            Self::Count => w.len() as f64,
            Self::Last => w[w.len() - 1].1,
            Self::Present => 1.0,
            Self::Stddev => variance(w).sqrt(),
            Self::Stdvar => variance(w),
            Self::Quantile => {
                let mut v: Vec<f64> = w.iter().map(|p| p.1).collect();
                quantile(arg(0), &mut v)
            }
            Self::Rate | Self::Increase | Self::Delta => {
                let (start, end) = (t - range_ms - offset_ms, t - offset_ms);
                extrapolated_rate(
                    w,
                    start,
                    end,
                    self != Self::Delta,
                    self == Self::Rate,
                    range_ms,
                )?
            }
            Self::Irate | Self::Idelta => instant_value(w, self == Self::Irate)?,
            Self::Deriv => {
                if w.len() < 2 {
                    return None;
                }
                linear_regression(w, w[0].0).0
            }
            Self::PredictLinear => {
                if w.len() < 2 {
                    return None;
                }
                let (slope, intercept) = linear_regression(w, t);
                slope * arg(0) + intercept
            }
            Self::HoltWinters => holt_winters(w, arg(0), arg(1))?,
            Self::Changes => w
                .windows(2)
                .filter(|p| p[1].1 != p[0].1 && !(p[1].1.is_nan() && p[0].1.is_nan()))
                .count() as f64,
            Self::Resets => w.windows(2).filter(|p| p[1].1 < p[0].1).count() as f64,
        })
    }
}

/// Neumaier's compensated sum (Prometheus's `kahanSumInc`).
fn kahan_inc(inc: f64, sum: f64, c: f64) -> (f64, f64) {
    let t = sum + inc;
    let c = if t.is_infinite() {
        0.0
    } else if sum.abs() >= inc.abs() {
        c + ((sum - t) + inc)
    } else {
        c + ((inc - t) + sum)
    };
    (t, c)
}

fn kahan_sum(v: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut c) = (0.0, 0.0);
    for x in v {
        (sum, c) = kahan_inc(x, sum, c);
    }
    sum + c
}

/// `avg_over_time`: an incremental mean, infinities kept as they come.
fn avg(w: &[(i64, f64)]) -> f64 {
    let (mut mean, mut count, mut c) = (0.0f64, 0.0, 0.0);
    for &(_, v) in w {
        count += 1.0;
        if mean.is_infinite() {
            if v.is_infinite() && (mean > 0.0) == (v > 0.0) {
                continue;
            }
            if !v.is_infinite() && !v.is_nan() {
                continue;
            }
        }
        (mean, c) = kahan_inc(v / count - mean / count, mean, c);
    }
    if mean.is_infinite() {
        mean
    } else {
        mean + c
    }
}

/// Population variance, Welford's way with compensated sums.
fn variance(w: &[(i64, f64)]) -> f64 {
    let (mut count, mut mean, mut c_mean, mut aux, mut c_aux) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(_, v) in w {
        count += 1.0;
        let delta = v - (mean + c_mean);
        (mean, c_mean) = kahan_inc(delta / count, mean, c_mean);
        (aux, c_aux) = kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux);
    }
    (aux + c_aux) / count
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
    pub(super) fn add(&mut self, count: u64, sum: f64, min: f64, max: f64) {
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
    pub(super) fn value(&self, f: RangeFn) -> Option<f64> {
        (self.count > 0).then(|| match f {
            RangeFn::Avg => self.sum / self.count as f64,
            RangeFn::Sum => self.sum,
            RangeFn::Count => self.count as f64,
            RangeFn::Min => self.min,
            _ => self.max,
        })
    }
}

/// `rate`/`increase`/`delta` (Prometheus's `extrapolatedRate`): the
/// change over the window `[start, end]` (corrected for counter resets
/// when `counter`), extrapolated to the window's edges by at most 1.1
/// average sample spacings (for a counter never below zero), per second
/// of `range_ms` for `rate`.
fn extrapolated_rate(
    w: &[(i64, f64)],
    start: i64,
    end: i64,
    counter: bool,
    per_second: bool,
    range_ms: i64,
) -> Option<f64> {
    if w.len() < 2 {
        return None;
    }
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
    let mut to_start = (t0 - start) as f64 / 1000.0;
    let to_end = (end - tn) as f64 / 1000.0;
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

/// `irate`/`idelta`: the change between the window's last two samples
/// (for `irate`, the last value alone after a reset, per second).
fn instant_value(w: &[(i64, f64)], rate: bool) -> Option<f64> {
    if w.len() < 2 {
        return None;
    }
    let (tp, vp) = w[w.len() - 2];
    let (tl, vl) = w[w.len() - 1];
    let change = if rate && vl < vp { vl } else { vl - vp };
    let dt = tl - tp;
    if dt == 0 {
        return None;
    }
    Some(if rate {
        change / (dt as f64 / 1000.0)
    } else {
        change
    })
}

/// Least-squares slope and intercept of the window against time in
/// seconds from `intercept_ms` (Prometheus's `linearRegression`: a
/// constant series has slope 0).
fn linear_regression(w: &[(i64, f64)], intercept_ms: i64) -> (f64, f64) {
    let init = w[0].1;
    let constant = w.iter().all(|p| p.1 == init);
    if constant {
        if init.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        return (0.0, init);
    }
    let n = w.len() as f64;
    let (mut sx, mut cx, mut sy, mut cy) = (0.0, 0.0, 0.0, 0.0);
    let (mut sxy, mut cxy, mut sx2, mut cx2) = (0.0, 0.0, 0.0, 0.0);
    for &(t, v) in w {
        let x = (t - intercept_ms) as f64 / 1e3;
        (sx, cx) = kahan_inc(x, sx, cx);
        (sy, cy) = kahan_inc(v, sy, cy);
        (sxy, cxy) = kahan_inc(x * v, sxy, cxy);
        (sx2, cx2) = kahan_inc(x * x, sx2, cx2);
    }
    let (sx, sy, sxy, sx2) = (sx + cx, sy + cy, sxy + cxy, sx2 + cx2);
    let cov = sxy - sx * sy / n;
    let var = sx2 - sx * sx / n;
    let slope = cov / var;
    (slope, sy / n - slope * sx / n)
}

/// `holt_winters(v, sf, tf)`: double exponential smoothing; `None` for
/// fewer than two samples. Factors outside (0, 1) are Prometheus's
/// errors, checked by the caller.
fn holt_winters(w: &[(i64, f64)], sf: f64, tf: f64) -> Option<f64> {
    if w.len() < 2 {
        return None;
    }
    let (mut s0, mut s1) = (0.0, w[0].1);
    let mut b = w[1].1 - w[0].1;
    for (i, &(_, v)) in w.iter().enumerate().skip(1) {
        let x = sf * v;
        if i > 1 {
            b = tf * (s1 - s0) + (1.0 - tf) * b;
        }
        let y = (1.0 - sf) * (s1 + b);
        (s0, s1) = (s1, x + y);
    }
    Some(s1)
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
        // A counter rising 1/s sampled every 10 s, window [t-60s, t] with
        // t 5 s after the last sample: extrapolated to both edges.
        let w: Vec<(i64, f64)> = (0..6)
            .map(|i| (1_000 + i * 10_000, 100.0 + i as f64 * 10.0))
            .collect();
        let t = 56_000;
        let r = RangeFn::Rate.apply(&w, t, 60_000, 0, &[]).unwrap();
        assert!((r - 1.0).abs() < 1e-12, "{r}");
        let inc = RangeFn::Increase.apply(&w, t, 60_000, 0, &[]).unwrap();
        assert!((inc - 60.0).abs() < 1e-9, "{inc}");
        // delta does not correct resets nor stop at zero.
        let d = RangeFn::Delta.apply(&w, t, 60_000, 0, &[]).unwrap();
        assert!((d - 60.0).abs() < 1e-9, "{d}");
    }

    #[test]
    fn counter_resets_add_the_value_before_the_reset() {
        let w = [(0, 5.0), (1_000, 10.0), (2_000, 2.0), (3_000, 4.0)];
        assert_eq!(RangeFn::Resets.apply(&w, 3_000, 3_000, 0, &[]), Some(1.0));
        let inc = extrapolated_rate(&w, 0, 3_000, true, false, 3_000).unwrap();
        assert!((inc - 9.0).abs() < 1e-9, "{inc}");
        assert_eq!(RangeFn::Irate.apply(&w, 3_000, 3_000, 0, &[]), Some(2.0));
        assert_eq!(RangeFn::Idelta.apply(&w, 3_000, 3_000, 0, &[]), Some(2.0));
        assert_eq!(RangeFn::Changes.apply(&w, 3_000, 3_000, 0, &[]), Some(3.0));
    }

    #[test]
    fn regression_smoothing_and_spread() {
        // v = 2 + 0.5·t (t in s).
        let w: Vec<(i64, f64)> = (0..5).map(|i| (i * 1000, 2.0 + 0.5 * i as f64)).collect();
        assert_eq!(RangeFn::Deriv.apply(&w, 4_000, 5_000, 0, &[]), Some(0.5));
        // 10 s after the last sample: 4 + 5.
        let p = RangeFn::PredictLinear
            .apply(&w, 4_000, 5_000, 0, &[10.0])
            .unwrap();
        assert!((p - 9.0).abs() < 1e-12, "{p}");
        // A straight line is smoothed onto itself.
        let h = RangeFn::HoltWinters
            .apply(&w, 4_000, 5_000, 0, &[0.5, 0.5])
            .unwrap();
        assert!((h - 4.0).abs() < 1e-12, "{h}");
        let v = [
            (0, 2.0),
            (1, 4.0),
            (2, 4.0),
            (3, 4.0),
            (4, 5.0),
            (5, 5.0),
            (6, 7.0),
            (7, 9.0),
        ];
        assert!((RangeFn::Stddev.apply(&v, 7, 10, 0, &[]).unwrap() - 2.0).abs() < 1e-12);
        assert!((RangeFn::Stdvar.apply(&v, 7, 10, 0, &[]).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(RangeFn::Avg.apply(&v, 7, 10, 0, &[]), Some(5.0));
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
