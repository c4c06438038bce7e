//! From a request to a result: parsing (durations as Grafana writes them
//! accepted), Prometheus's checks on the range and step, evaluation, and
//! the result shaped as Prometheus types it.

use super::budget::Budget;
use super::eval::{Evaluator, StepSeries, Val};
use super::guard::{self, QueryLimits};
use super::model::{matches, Model};
use super::{QueryError, RangeSeries, Sample, Value, MAX_POINTS};
use crate::auth::Scope;
use crate::series::Labels;
use crate::store::Store;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr};
use std::collections::BTreeMap;

/// Milliseconds of a duration such as `1m0.1s` or `1h30m` (Go's
/// `time.Duration` notation, which Grafana's `$__rate_interval` uses);
/// `None` when it is not one.
fn duration_ms(s: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let (unit, ms) = [
            ("ms", 1.0),
            ("s", 1e3),
            ("m", 60e3),
            ("h", 3_600e3),
            ("d", 86_400e3),
            ("w", 604_800e3),
            ("y", 31_536_000e3),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))?;
        total += num * ms;
        rest = &rest[unit.len()..];
    }
    Some(total)
}

/// `query` with every bracketed duration that has a fraction (`[1m0.1s]`)
/// rewritten in whole milliseconds (`[60100ms]`), which PromQL's grammar
/// accepts; quoted strings are left alone.
pub(super) fn normalize_durations(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    let mut chars = query.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                out.push(c);
                let mut escaped = false;
                for (_, d) in chars.by_ref() {
                    out.push(d);
                    if escaped {
                        escaped = false;
                    } else if d == '\\' && c != '`' {
                        escaped = true;
                    } else if d == c {
                        break;
                    }
                }
            }
            '[' => {
                let Some(len) = query[i + 1..].find(']') else {
                    out.push(c);
                    continue;
                };
                let inner = &query[i + 1..i + 1 + len];
                let parts: Vec<String> = inner
                    .split(':')
                    .map(|p| match duration_ms(p) {
                        Some(ms) if p.contains('.') => format!("{}ms", ms.round() as i64),
                        _ => p.to_string(),
                    })
                    .collect();
                out.push('[');
                out.push_str(&parts.join(":"));
                out.push(']');
                while chars.peek().is_some_and(|(j, _)| *j <= i + 1 + len) {
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// What one query reads and within which limits.
pub(super) struct Ctx<'a> {
    pub store: &'a Store,
    pub scope: &'a Scope,
    pub budget: &'a Budget,
    pub limits: &'a QueryLimits,
}

impl<'a> Ctx<'a> {
    fn model(&self) -> Model<'a> {
        Model {
            store: self.store,
            scope: self.scope,
            budget: self.budget,
        }
    }

    /// `query` parsed, once its shape passed the limits.
    fn parse(&self, query: &str) -> Result<Expr, QueryError> {
        guard::check(query, self.limits).map_err(|(_, e)| e)?;
        parse(query)
    }
}

fn parse(query: &str) -> Result<Expr, QueryError> {
    parser::parse(&normalize_durations(query)).map_err(QueryError::BadData)
}

/// `/api/v1/query`.
pub(super) fn instant(ctx: &Ctx, query: &str, t: i64) -> Result<Value, QueryError> {
    let expr = ctx.parse(query)?;
    let ev = Evaluator {
        model: ctx.model(),
        start: t,
        step: 1,
        n: 1,
    };
    if let Expr::MatrixSelector(ms) = &expr {
        // A range vector: the raw samples of `[t - range, t]`.
        let mut out: Vec<RangeSeries> = ev
            .range_samples(ms)?
            .into_iter()
            .filter_map(|(s, pts)| {
                let range = ms.range.as_millis() as i64;
                let off = match &ms.vs.offset {
                    Some(parser::Offset::Pos(d)) => d.as_millis() as i64,
                    Some(parser::Offset::Neg(d)) => -(d.as_millis() as i64),
                    None => 0,
                };
                let points: Vec<(i64, f64)> = pts
                    .into_iter()
                    .filter(|p| p.0 >= t - off - range && p.0 <= t - off)
                    .collect();
                (!points.is_empty()).then_some(RangeSeries {
                    labels: s.labels,
                    points,
                })
            })
            .collect();
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        return Ok(Value::Matrix(out));
    }
    Ok(match ev.eval(&expr)? {
        Val::Scalar(v) => Value::Scalar { t_ms: t, v: v[0] },
        Val::Vector(v) => Value::Vector(
            v.into_iter()
                .filter_map(|s| {
                    s.vals[0].map(|v| Sample {
                        labels: s.labels,
                        t_ms: t,
                        v,
                    })
                })
                .collect(),
        ),
    })
}

/// `/api/v1/query_range`, with Prometheus's checks and messages.
pub(super) fn range(
    ctx: &Ctx,
    query: &str,
    start: i64,
    end: i64,
    step: i64,
) -> Result<Value, QueryError> {
    if end < start {
        return Err(QueryError::BadData(
            "end timestamp must not be before start time".into(),
        ));
    }
    if step <= 0 {
        return Err(QueryError::BadData(
            "zero or negative query resolution step widths are not accepted. Try a positive integer"
                .into(),
        ));
    }
    if (end - start) / step > MAX_POINTS {
        return Err(QueryError::BadData(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)"
                .into(),
        ));
    }
    let expr = ctx.parse(query)?;
    if matches!(expr, Expr::MatrixSelector(_)) {
        return Err(QueryError::BadData(
            "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector"
                .into(),
        ));
    }
    let n = ((end - start) / step + 1) as usize;
    let ev = Evaluator {
        model: ctx.model(),
        start,
        step,
        n,
    };
    let times = |vals: &mut dyn Iterator<Item = (usize, f64)>| -> Vec<(i64, f64)> {
        vals.map(|(i, v)| (start + i as i64 * step, v)).collect()
    };
    Ok(Value::Matrix(match ev.eval(&expr)? {
        Val::Scalar(v) => vec![RangeSeries {
            labels: Vec::new(),
            points: times(&mut v.into_iter().enumerate()),
        }],
        Val::Vector(v) => {
            // Series with one label set (a job's spans, a topk's members
            // at different steps) are one series of the result.
            let mut merged: BTreeMap<Labels, BTreeMap<i64, f64>> = BTreeMap::new();
            for StepSeries { labels, vals } in v {
                let e = merged.entry(labels).or_default();
                for (t, v) in times(
                    &mut vals
                        .into_iter()
                        .enumerate()
                        .filter_map(|(i, v)| v.map(|v| (i, v))),
                ) {
                    e.insert(t, v);
                }
            }
            merged
                .into_iter()
                .map(|(labels, pts)| RangeSeries {
                    labels,
                    points: pts.into_iter().collect(),
                })
                .collect()
        }
    }))
}

/// `/api/v1/series`: the label sets of the series matching any selector
/// with a sample in `[start, end]`.
pub(super) fn series(
    ctx: &Ctx,
    selectors: &[String],
    start: i64,
    end: i64,
) -> Result<Vec<Labels>, QueryError> {
    let all = || vec![Matcher::new(MatchOp::NotEqual, "__name__", "")];
    let mut sets: Vec<Vec<Matcher>> = Vec::new();
    for s in selectors {
        match ctx.parse(s)? {
            Expr::VectorSelector(vs) => {
                if !vs.matchers.or_matchers.is_empty() {
                    return Err(QueryError::Unsupported(
                        "unsupported by flopwatch's PromQL engine: `or` inside a label selector"
                            .into(),
                    ));
                }
                let mut m = vs.matchers.matchers.clone();
                if let Some(n) = &vs.name {
                    m.push(Matcher::new(MatchOp::Equal, "__name__", n));
                }
                sets.push(m);
            }
            _ => {
                return Err(QueryError::BadData(format!(
                    "invalid parameter \"match[]\": {s} is not a series selector"
                )))
            }
        }
    }
    if sets.is_empty() {
        sets.push(all());
    }
    let model = ctx.model();
    // Series are listed once over all selectors, then matched.
    let candidates = model.select(&all())?;
    let mut out = Vec::new();
    for s in candidates {
        ctx.budget.check()?;
        if sets.iter().any(|m| matches(m, &s.labels)) && model.has_samples(&s, start, end)? {
            out.push(s.labels);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grafana_rate_intervals_are_accepted() {
        assert_eq!(
            normalize_durations("rate(x{a=\"[1.5s]\"}[1m0.1s])"),
            "rate(x{a=\"[1.5s]\"}[60100ms])"
        );
        assert_eq!(normalize_durations("x[5m:1.5s]"), "x[5m:1500ms]");
        assert_eq!(normalize_durations("x[5m]"), "x[5m]");
        assert!(parse("rate(x[1m0.1s])").is_ok());
        assert_eq!(duration_ms("1h30m"), Some(5_400_000.0));
        assert_eq!(duration_ms("1x"), None);
    }
}
