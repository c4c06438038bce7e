//! Aggregations, as Prometheus 2.42's `aggregation` computes them at each
//! step: `sum`, `avg` (an incremental mean), `min`, `max` (a NaN replaced
//! by any number), `count`, `group`, `stddev`, `stdvar` (Welford's
//! running variance, population), `quantile`, `topk`, `bottomk` (the
//! input series themselves, name kept) and `count_values` (a series per
//! distinct value, labelled with it). `by (…)` keeps only the listed
//! labels, `without (…)` drops them and `__name__`.

use super::{unsupported, unwrap_parens, Collect, Evaluator, StepSeries, Val};
use crate::promql::float::format_scalar;
use crate::promql::functions::quantile;
use crate::promql::QueryError;
use crate::series::Labels;
use promql_parser::parser::{AggregateExpr, Expr, LabelModifier};
use std::collections::HashMap;

/// A group's running state at one step.
#[derive(Debug, Clone, Copy)]
struct Acc {
    count: f64,
    value: f64,
    mean: f64,
}

/// What an [`Acc`] keeps, decided once per aggregation (not per sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sum,
    Avg,
    Max,
    Min,
    Count,
    Group,
    Stddev,
    Stdvar,
}

/// Input points (series × steps) from which an aggregation folds its
/// groups on every core: below, a thread costs more than it saves.
const PARALLEL_POINTS: usize = 1 << 16;

impl Kind {
    fn of(op: &str) -> Self {
        match op {
            "avg" => Self::Avg,
            "max" => Self::Max,
            "min" => Self::Min,
            "count" => Self::Count,
            "group" => Self::Group,
            "stddev" => Self::Stddev,
            "stdvar" => Self::Stdvar,
            _ => Self::Sum,
        }
    }
}

impl Acc {
    #[inline(always)]
    fn first(v: f64, op: Kind) -> Self {
        Acc {
            count: 1.0,
            value: if matches!(op, Kind::Stddev | Kind::Stdvar) {
                0.0
            } else {
                v
            },
            mean: v,
        }
    }

    #[inline(always)]
    fn add(&mut self, v: f64, op: Kind) {
        self.count += 1.0;
        match op {
            Kind::Sum => self.value += v,
            Kind::Avg => {
                if self.mean.is_infinite() {
                    // An infinite mean stays as it is unless a NaN or an
                    // infinity of the other sign arrives (Prometheus).
                    if v.is_infinite() && (self.mean > 0.0) == (v > 0.0) {
                        return;
                    }
                    if !v.is_infinite() && !v.is_nan() {
                        return;
                    }
                }
                self.mean += v / self.count - self.mean / self.count;
            }
            Kind::Max if self.value < v || self.value.is_nan() => self.value = v,
            Kind::Min if self.value > v || self.value.is_nan() => self.value = v,
            Kind::Stddev | Kind::Stdvar => {
                let delta = v - self.mean;
                self.mean += delta / self.count;
                self.value += delta * (v - self.mean);
            }
            _ => {}
        }
    }

    fn result(&self, op: Kind) -> f64 {
        match op {
            Kind::Avg => self.mean,
            Kind::Count => self.count,
            Kind::Group => 1.0,
            Kind::Stdvar => self.value / self.count,
            Kind::Stddev => (self.value / self.count).sqrt(),
            _ => self.value,
        }
    }
}

/// One member's values at every step added to its group's running
/// states.
fn fold(acc: &mut [Option<Acc>], vals: impl Iterator<Item = Option<f64>>, op: Kind) {
    // One loop per kind, each with its arithmetic inlined: the kind is
    // not matched again at every step.
    match op {
        Kind::Sum => fold_as(acc, vals, Kind::Sum),
        Kind::Avg => fold_as(acc, vals, Kind::Avg),
        Kind::Max => fold_as(acc, vals, Kind::Max),
        Kind::Min => fold_as(acc, vals, Kind::Min),
        Kind::Count => fold_as(acc, vals, Kind::Count),
        Kind::Group => fold_as(acc, vals, Kind::Group),
        Kind::Stddev => fold_as(acc, vals, Kind::Stddev),
        Kind::Stdvar => fold_as(acc, vals, Kind::Stdvar),
    }
}

#[inline(always)]
fn fold_as(acc: &mut [Option<Acc>], vals: impl Iterator<Item = Option<f64>>, op: Kind) {
    for (a, v) in acc.iter_mut().zip(vals) {
        if let Some(v) = v {
            match a {
                None => *a = Some(Acc::first(v, op)),
                Some(a) => a.add(v, op),
            }
        }
    }
}

/// Whether `name` is a valid label name (Prometheus 2.42's syntax).
pub(in crate::promql) fn is_label_name(name: &str) -> bool {
    let mut c = name.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

impl Evaluator<'_> {
    pub(crate) fn aggregate(&self, a: &AggregateExpr) -> Result<Val, QueryError> {
        let op = a.op.to_string();
        let op = op.as_str();
        if !matches!(
            op,
            "sum"
                | "avg"
                | "min"
                | "max"
                | "count"
                | "group"
                | "stddev"
                | "stdvar"
                | "quantile"
                | "topk"
                | "bottomk"
                | "count_values"
        ) {
            return Err(unsupported(format_args!(
                "aggregation {op} (not in Prometheus 2.42)"
            )));
        }
        let mut param = None;
        let mut label_param = None;
        if let Some(p) = &a.param {
            if op == "count_values" {
                let l = self.string_arg(p, "count_values")?;
                if !is_label_name(&l) {
                    return Err(QueryError::Execution(format!("invalid label name {l:?}")));
                }
                label_param = Some(l);
            } else {
                param = Some(self.scalar_arg(p, op)?);
            }
        }
        let key = |l: &Labels| -> Labels {
            match &a.modifier {
                None => Vec::new(),
                Some(LabelModifier::Include(by)) => l
                    .iter()
                    .filter(|(k, _)| by.labels.iter().any(|b| b == k))
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(without)) => l
                    .iter()
                    .filter(|(k, _)| k != "__name__" && !without.labels.iter().any(|b| b == k))
                    .cloned()
                    .collect(),
            }
        };
        // Over a selector, the simple aggregations fold each group on the
        // thread that reads its members: no member's values are kept.
        if !matches!(op, "topk" | "bottomk" | "count_values" | "quantile") {
            if let Expr::VectorSelector(vs) = unwrap_parens(&a.expr) {
                let kind = Kind::of(op);
                self.model.budget.check()?;
                let groups = self.selector_groups(
                    vs,
                    &key,
                    &|| vec![None; self.n],
                    &|acc: &mut Vec<Option<Acc>>, vals| {
                        fold(acc, vals.iter().map(|p| p.map(|p| p.1)), kind)
                    },
                )?;
                if let Some(groups) = groups {
                    return Ok(Val::Vector(
                        groups
                            .into_iter()
                            .map(|(labels, acc)| StepSeries {
                                labels,
                                vals: acc.into_iter().map(|a| a.map(|a| a.result(kind))).collect(),
                            })
                            .collect(),
                    ));
                }
            }
        }
        let input = self.vector_arg(&a.expr, &format!("aggregation {op}"))?;
        // Each input series' group, groups in order of first appearance.
        let mut groups: Vec<(Labels, Vec<usize>)> = Vec::new();
        let mut index: HashMap<Labels, usize> = HashMap::new();
        for (i, s) in input.iter().enumerate() {
            let k = key(&s.labels);
            let g = *index.entry(k.clone()).or_insert_with(|| {
                groups.push((k, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        match op {
            "topk" | "bottomk" => self.top(op, input, &groups, &param.unwrap_or_default()),
            "count_values" => self.count_values(&input, &groups, &label_param.unwrap_or_default()),
            "quantile" => {
                let q = param.unwrap_or_default();
                let mut out = Vec::with_capacity(groups.len());
                for (labels, members) in groups {
                    let vals = (0..self.n)
                        .map(|i| {
                            let mut v: Vec<f64> =
                                members.iter().filter_map(|&m| input[m].vals[i]).collect();
                            (!v.is_empty()).then(|| quantile(q[i], &mut v))
                        })
                        .collect();
                    out.push(StepSeries { labels, vals });
                }
                Ok(Val::Vector(out))
            }
            _ => {
                let op = Kind::of(op);
                let fold = |(labels, members): (Labels, Vec<usize>)| {
                    // Member by member over all steps (each series read in
                    // order); at every step the members still arrive in
                    // the same order, so the arithmetic is the same.
                    let mut acc: Vec<Option<Acc>> = vec![None; self.n];
                    for &m in &members {
                        fold(&mut acc, input[m].vals.iter().copied(), op);
                    }
                    let vals = acc.into_iter().map(|a| a.map(|a| a.result(op))).collect();
                    Ok::<_, std::convert::Infallible>(StepSeries { labels, vals })
                };
                // Groups are independent: large aggregations fold them on
                // every core, each group still on one thread in order.
                let per_thread = if input.len() * self.n >= PARALLEL_POINTS {
                    1
                } else {
                    groups.len().max(1)
                };
                let mut out = Vec::with_capacity(groups.len());
                for part in crate::parallel::in_parallel(groups, per_thread, &fold) {
                    let Ok(part) = part;
                    out.extend(part);
                }
                Ok(Val::Vector(out))
            }
        }
    }

    /// `topk`/`bottomk`: at each step, the `k` largest (smallest) members
    /// of each group, NaN ranking last either way.
    fn top(
        &self,
        op: &str,
        input: Vec<StepSeries>,
        groups: &[(Labels, Vec<usize>)],
        k: &[f64],
    ) -> Result<Val, QueryError> {
        let mut keep = vec![vec![false; self.n]; input.len()];
        for (i, &kf) in k.iter().enumerate().take(self.n) {
            if !(kf.is_finite() || kf.is_nan()) || kf.abs() >= 9.2e18 {
                return Err(QueryError::Execution(format!(
                    "Scalar value {kf} overflows int64"
                )));
            }
            let kk = kf as i64;
            if kk < 1 {
                continue;
            }
            for (_, members) in groups {
                let mut vals: Vec<(usize, f64)> = members
                    .iter()
                    .filter_map(|&m| input[m].vals[i].map(|v| (m, v)))
                    .collect();
                vals.sort_by(|a, b| {
                    let (x, y) = (a.1, b.1);
                    match (x.is_nan(), y.is_nan()) {
                        (true, false) => std::cmp::Ordering::Greater,
                        (false, true) => std::cmp::Ordering::Less,
                        _ if op == "topk" => y.total_cmp(&x),
                        _ => x.total_cmp(&y),
                    }
                });
                for &(m, _) in vals.iter().take(kk.min(vals.len() as i64) as usize) {
                    keep[m][i] = true;
                }
            }
        }
        Ok(Val::Vector(
            input
                .into_iter()
                .zip(keep)
                .filter_map(|(s, keep)| {
                    let vals: Vec<Option<f64>> = s
                        .vals
                        .iter()
                        .zip(keep)
                        .map(|(v, k)| v.filter(|_| k))
                        .collect();
                    vals.iter().any(Option::is_some).then_some(StepSeries {
                        labels: s.labels,
                        vals,
                    })
                })
                .collect(),
        ))
    }

    /// `count_values("label", v)`: per group and step, a series for each
    /// distinct value (the value in `label`), counting its members.
    fn count_values(
        &self,
        input: &[StepSeries],
        groups: &[(Labels, Vec<usize>)],
        name: &str,
    ) -> Result<Val, QueryError> {
        let mut collect = Collect::new(self.n);
        for (labels, members) in groups {
            for i in 0..self.n {
                let mut counts: Vec<(String, f64)> = Vec::new();
                for &m in members {
                    if let Some(v) = input[m].vals[i] {
                        let text = format_scalar(v);
                        match counts.iter_mut().find(|(t, _)| *t == text) {
                            Some(c) => c.1 += 1.0,
                            None => counts.push((text, 1.0)),
                        }
                    }
                }
                for (text, c) in counts {
                    let mut l: Labels = labels.iter().filter(|(k, _)| k != name).cloned().collect();
                    let at = l.partition_point(|(k, _)| k.as_str() < name);
                    l.insert(at, (name.to_string(), text));
                    let slot = collect.slot(l);
                    collect.set(slot, i, c)?;
                }
            }
        }
        Ok(Val::Vector(collect.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: &str, v: &[f64]) -> f64 {
        let op = Kind::of(op);
        let mut a = Acc::first(v[0], op);
        for &x in &v[1..] {
            a.add(x, op);
        }
        a.result(op)
    }

    #[test]
    fn accumulators_match_prometheus() {
        let v = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(run("sum", &v), 40.0);
        assert_eq!(run("avg", &v), 5.0);
        assert_eq!(run("count", &v), 8.0);
        assert_eq!(run("stddev", &v), 2.0);
        assert_eq!(run("stdvar", &v), 4.0);
        assert_eq!(run("min", &[f64::NAN, 3.0, 1.0]), 1.0);
        assert_eq!(run("max", &[f64::NAN, 3.0, 1.0]), 3.0);
        assert_eq!(run("avg", &[f64::INFINITY, 1.0]), f64::INFINITY);
        assert!(run("avg", &[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        assert_eq!(run("group", &v), 1.0);
    }
}
