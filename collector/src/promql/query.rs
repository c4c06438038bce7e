//! From a request to a result: parsing (durations as Grafana writes them
//! accepted), Prometheus's checks on the range and step, evaluation, and
//! the result shaped as Prometheus types it.

use super::budget::Budget;
use super::eval::{unwrap_parens, Evaluator, StepSeries, Val};
use super::guard::{self, QueryLimits};
use super::model::{matches, Model};
use super::points::window;
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

/// Functions of Prometheus 2.42 the parser knows under another name or
/// not at all, made known to it once: `holt_winters` (renamed
/// `double_exponential_smoothing` in Prometheus 3).
fn register_functions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use promql_parser::parser::function::{register_extra_functions, Function};
        use promql_parser::parser::value::ValueType;
        let holt_winters = Function::new(
            "holt_winters",
            vec![ValueType::Matrix, ValueType::Scalar, ValueType::Scalar],
            0,
            ValueType::Vector,
            false,
        );
        if let Err(e) = register_extra_functions(vec![holt_winters]) {
            tracing::warn!(error = %e, "holt_winters is not known to the PromQL parser");
        }
    });
}

fn parse(query: &str) -> Result<Expr, QueryError> {
    register_functions();
    parser::parse(&normalize_durations(query)).map_err(QueryError::BadData)
}

/// An evaluator of `ctx`'s query over `n` steps from `start`.
fn evaluator<'a>(ctx: &Ctx<'a>, start: i64, step: i64, n: usize, end: i64) -> Evaluator<'a> {
    Evaluator {
        model: ctx.model(),
        start,
        step,
        n,
        query_start: start,
        query_end: end,
    }
}

/// `/api/v1/query`.
pub(super) fn instant(ctx: &Ctx, query: &str, t: i64) -> Result<Value, QueryError> {
    let expr = ctx.parse(query)?;
    let ev = evaluator(ctx, t, 1, 1, t);
    let top = unwrap_parens(&expr);
    if matches!(top, Expr::MatrixSelector(_) | Expr::Subquery(_)) {
        // A range vector: the points of each series in `[t − offset −
        // range, t − offset]` (or at the `@` time).
        let input = ev.range_input(top)?;
        let end = input.at.unwrap_or(t) - input.offset;
        let mut out: Vec<RangeSeries> = input
            .series
            .into_iter()
            .filter_map(|(labels, pts)| {
                let points = window(&pts, end - input.range, end).to_vec();
                (!points.is_empty()).then_some(RangeSeries { labels, points })
            })
            .collect();
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        return Ok(Value::Matrix(out));
    }
    Ok(match ev.eval(&expr)? {
        Val::Scalar(v) => Value::Scalar { t_ms: t, v: v[0] },
        Val::String(v) => Value::String { t_ms: t, v },
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
    let kind = match unwrap_parens(&expr) {
        Expr::MatrixSelector(_) | Expr::Subquery(_) => Some("range vector"),
        Expr::StringLiteral(_) => Some("string"),
        _ => None,
    };
    if let Some(kind) = kind {
        return Err(QueryError::BadData(format!(
            "invalid expression type \"{kind}\" for range query, must be Scalar or instant Vector"
        )));
    }
    let n = ((end - start) / step + 1) as usize;
    let ev = evaluator(ctx, start, step, n, end);
    let times = |vals: &mut dyn Iterator<Item = (usize, f64)>| -> Vec<(i64, f64)> {
        vals.map(|(i, v)| (start + i as i64 * step, v)).collect()
    };
    Ok(Value::Matrix(match ev.eval(&expr)? {
        Val::String(_) => return Err(QueryError::BadData(
            "invalid expression type \"string\" for range query, must be Scalar or instant Vector"
                .into(),
        )),
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
