//! From a request to a result: parsing (durations as Grafana writes them
//! accepted), Prometheus's checks on the range and step, evaluation, and
//! the result shaped as Prometheus types it.

use super::budget::Budget;
use super::eval::{unwrap_parens, Evaluator, StepSeries, Val};
use super::guard::{self, QueryLimits};
use super::model::{matches, Model};
use super::peers::{reads, Peers, Read, Remote};
use super::points::window;
use super::syntax::matchers as selector_matchers;
use super::{QueryError, RangeSeries, Sample, Value, MAX_POINTS};
use crate::auth::Scope;
use crate::series::Labels;
use crate::store::Store;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr};
use std::collections::btree_map::Entry;
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
    /// The cluster's other collectors, and the caller's token for them.
    pub peers: Option<(&'a Peers, Option<&'a str>)>,
    /// Stored series only (a peer's answer to `Query/Select`).
    pub base_only: bool,
    /// The GPU spec table: the peaks the ledger's FLOP counters use.
    pub specs: Option<&'a flopwatch_config::SpecTable>,
}

impl<'a> Ctx<'a> {
    fn model<'r>(&self, remote: Option<&'r Remote>) -> Model<'r>
    where
        'a: 'r,
    {
        Model {
            store: self.store,
            reader: None,
            scope: self.scope,
            budget: self.budget,
            remote,
            base_only: self.base_only,
            specs: self.specs,
            staleness: self.limits.staleness,
        }
    }

    /// The peers' series for `reads`, their failures noted as warnings.
    fn fetch(&self, reads: &[Read], labels_only: bool) -> Option<Remote> {
        let (peers, token) = self.peers?;
        let remote = peers.fetch(token, reads, labels_only);
        for w in &remote.warnings {
            self.budget.warn(w.clone());
        }
        Some(remote)
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
fn evaluator<'r>(
    ctx: &Ctx<'r>,
    remote: Option<&'r Remote>,
    start: i64,
    step: i64,
    n: usize,
    end: i64,
) -> Evaluator<'r> {
    Evaluator {
        model: ctx.model(remote),
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
    let remote = ctx.fetch(&reads(&expr, t, t, (t, t)), false);
    let ev = evaluator(ctx, remote.as_ref(), t, 1, 1, t);
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
    let remote = ctx.fetch(&reads(&expr, start, end, (start, end)), false);
    let ev = evaluator(ctx, remote.as_ref(), start, step, n, end);
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
            let mut merged: BTreeMap<Labels, Vec<Option<f64>>> = BTreeMap::new();
            for StepSeries { labels, vals } in v {
                match merged.entry(labels) {
                    Entry::Vacant(e) => {
                        e.insert(vals);
                    }
                    // The later series' value wins at a step both have.
                    Entry::Occupied(mut e) => {
                        for (m, v) in e.get_mut().iter_mut().zip(vals) {
                            if v.is_some() {
                                *m = v;
                            }
                        }
                    }
                }
            }
            merged
                .into_iter()
                .map(|(labels, vals)| RangeSeries {
                    labels,
                    points: times(
                        &mut vals
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, v)| v.map(|v| (i, v))),
                    ),
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
    let mut sets: Vec<Vec<Matcher>> = Vec::new();
    for s in selectors {
        match ctx.parse(s)? {
            Expr::VectorSelector(vs) => sets.push(selector_matchers(&vs)?),
            _ => {
                return Err(QueryError::BadData(format!(
                    "invalid parameter \"match[]\": {s} is not a series selector"
                )))
            }
        }
    }
    if sets.is_empty() {
        sets.push(vec![Matcher::new(MatchOp::NotEqual, "__name__", "")]);
    }
    let reads: Vec<Read> = sets
        .iter()
        .map(|m| Read {
            matchers: m.clone(),
            from: start,
            to: end,
        })
        .collect();
    let remote = ctx.fetch(&reads, true);
    let model = ctx.model(remote.as_ref());
    let mut out = Vec::new();
    for m in &sets {
        for s in model.select(m)? {
            ctx.budget.check()?;
            if model.has_samples(&s, start, end)? {
                out.push(s.labels);
            }
        }
    }
    // The peers' series in range (they answered with label sets only).
    if let Some(r) = &remote {
        for (labels, _) in &r.series {
            let tenant = labels
                .iter()
                .find(|(k, _)| k == "tenant")
                .map_or("", |(_, v)| v.as_str());
            if ctx.scope.allows(tenant) && sets.iter().any(|m| matches(m, labels)) {
                out.push(labels.clone());
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `Query/Select` on this collector: the stored series `selectors` pick,
/// with their points in `[start, end]`, or (`labels_only`) the label sets
/// of those with a point there.
pub(super) fn select_local(
    ctx: &Ctx,
    selectors: &[String],
    start: i64,
    end: i64,
    labels_only: bool,
) -> Result<Vec<super::SelectedSeries>, QueryError> {
    let model = ctx.model(None);
    let mut out: BTreeMap<Labels, Vec<(i64, f64, i64)>> = BTreeMap::new();
    for s in selectors {
        let m = match ctx.parse(s)? {
            Expr::VectorSelector(vs) => selector_matchers(&vs)?,
            _ => return Err(QueryError::BadData(format!("{s} is not a series selector"))),
        };
        for series in model.select(&m)? {
            if out.contains_key(&series.labels) {
                continue;
            }
            if labels_only {
                if model.has_samples(&series, start, end)? {
                    out.insert(series.labels, Vec::new());
                }
            } else {
                let pts = model.timeline(&series, start, end)?;
                if !pts.is_empty() {
                    out.insert(series.labels, pts);
                }
            }
        }
    }
    Ok(out.into_iter().collect())
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
