//! `histogram_quantile` over classic histograms (Prometheus 2.42's
//! `bucketQuantile`): the cumulative buckets of one histogram, by upper
//! bound (`le`), with duplicate bounds merged and counts made monotonic.

/// One cumulative bucket: upper bound and count.
pub(in crate::promql) type Bucket = (f64, f64);

/// The φ-quantile of the buckets' observations, interpolated linearly
/// inside the bucket it falls in; NaN without a +Inf bucket or with
/// fewer than two buckets or no observations.
pub(in crate::promql) fn bucket_quantile(q: f64, mut b: Vec<Bucket>) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    if b.last().is_none_or(|l| l.0 != f64::INFINITY) {
        return f64::NAN;
    }
    // Buckets of one bound (a histogram scraped twice) are summed.
    let mut merged: Vec<Bucket> = Vec::with_capacity(b.len());
    for (le, c) in b {
        match merged.last_mut() {
            Some(last) if last.0 == le => last.1 += c,
            _ => merged.push((le, c)),
        }
    }
    let mut b = merged;
    // A count below its predecessor's (a bucket scraped at another time)
    // is raised to it.
    let mut max = f64::NEG_INFINITY;
    for x in &mut b {
        if x.1 > max {
            max = x.1;
        } else if x.1 < max {
            x.1 = max;
        }
    }
    if b.len() < 2 {
        return f64::NAN;
    }
    let observations = b[b.len() - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let i = b[..b.len() - 1].partition_point(|x| x.1 < rank);
    if i == b.len() - 1 {
        return b[b.len() - 2].0;
    }
    if i == 0 && b[0].0 <= 0.0 {
        return b[0].0;
    }
    let (mut start, end, mut count) = (0.0, b[i].0, b[i].1);
    if i > 0 {
        start = b[i - 1].0;
        count -= b[i - 1].1;
        rank -= b[i - 1].1;
    }
    start + (end - start) * (rank / count)
}

/// An `le` label's value as Go's `strconv.ParseFloat` reads it.
pub(in crate::promql) fn parse_le(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "+inf" | "inf" | "+infinity" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ if s.contains('_') => None,
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let b = vec![(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (f64::INFINITY, 40.0)];
        // Rank 20 lies half-way through (0.1, 0.5].
        assert!((bucket_quantile(0.5, b.clone()) - 0.3).abs() < 1e-12);
        // The top falls in +Inf: the highest finite bound.
        assert_eq!(bucket_quantile(1.0, b.clone()), 1.0);
        assert_eq!(bucket_quantile(-1.0, b.clone()), f64::NEG_INFINITY);
        assert!(bucket_quantile(0.5, vec![(1.0, 3.0)]).is_nan());
        // Non-monotonic counts are fixed.
        let b = vec![(1.0, 5.0), (2.0, 4.0), (f64::INFINITY, 10.0)];
        assert!((bucket_quantile(0.5, b) - 1.0).abs() < 1e-12);
        assert_eq!(parse_le("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_le("0.25"), Some(0.25));
        assert_eq!(parse_le("x"), None);
    }
}
