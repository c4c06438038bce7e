//! Function calls: every function of Prometheus 2.42's PromQL, by kind.
//!
//! - range-vector functions ([`RangeFn`]) over each step's window, their
//!   scalar arguments read per step; `__name__` dropped (kept by
//!   `last_over_time`); the windowed aggregates of the OFU ratio answered
//!   from rollups where the windows align ([`super::rollup`]);
//! - functions of each value ([`ValueFn`]; date functions default to
//!   `vector(time())`), `__name__` dropped;
//! - `timestamp` (a selector's sample times, else the step's), `sort`,
//!   `sort_desc`, `label_replace`, `label_join`, `vector`, `scalar`,
//!   `time`, `pi`, `absent`, `absent_over_time`, `histogram_quantile`;
//! - the native-histogram functions (`histogram_count`, `histogram_sum`,
//!   `histogram_fraction`) find no native histograms in the store and
//!   answer with nothing, as Prometheus does over float series.
//!
//! Functions Prometheus added after 2.42 are refused as unknown (400).

use super::{
    check_unique, drop_name, label, unwrap_parens, Evaluator, RangeInput, StepSeries, Val,
};
use crate::promql::functions::histogram::{bucket_quantile, parse_le};
use crate::promql::functions::instant::{label_replace, with_label, ValueFn};
use crate::promql::functions::RangeFn;
use crate::promql::syntax::matchers;
use crate::promql::QueryError;
use crate::series::Labels;
use promql_parser::label::MatchOp;
use promql_parser::parser::{Call, Expr};
use std::collections::HashMap;

/// The functions of Prometheus 2.42 evaluated here by name, besides
/// [`RangeFn`] and [`ValueFn`].
const OTHER: [&str; 15] = [
    "time",
    "pi",
    "vector",
    "scalar",
    "timestamp",
    "sort",
    "sort_desc",
    "label_replace",
    "label_join",
    "absent",
    "absent_over_time",
    "histogram_quantile",
    "histogram_count",
    "histogram_sum",
    "histogram_fraction",
];

/// The labels `absent` gives: the selector's equality matchers (but the
/// name), a label matched twice left out.
fn absent_labels(e: &Expr) -> Labels {
    let vs = match unwrap_parens(e) {
        Expr::VectorSelector(vs) => vs,
        Expr::MatrixSelector(ms) => &ms.vs,
        _ => return Vec::new(),
    };
    let Ok(m) = matchers(vs) else {
        return Vec::new();
    };
    let mut out: Labels = Vec::new();
    let mut drop: Vec<&str> = Vec::new();
    for x in &m {
        if x.name == "__name__" {
            continue;
        }
        if matches!(x.op, MatchOp::Equal) && !out.iter().any(|(k, _)| *k == x.name) {
            out.push((x.name.clone(), x.value.clone()));
        } else {
            drop.push(&x.name);
        }
    }
    out.retain(|(k, _)| !drop.contains(&k.as_str()));
    out.sort();
    out
}

impl Evaluator<'_> {
    pub(crate) fn call(&self, c: &Call) -> Result<Val, QueryError> {
        let name = c.func.name;
        let args: Vec<&Expr> = c.args.args.iter().map(|a| unwrap_parens(a)).collect();
        if let Some(f) = RangeFn::of(name) {
            return self.range_call(f, &args);
        }
        if let Some(f) = ValueFn::of(name) {
            return self.value_call(f, &args);
        }
        if !OTHER.contains(&name) {
            return Err(QueryError::BadData(format!(
                "unknown function with name {name:?} (not in Prometheus 2.42)"
            )));
        }
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .ok_or_else(|| QueryError::BadData(format!("{name}(): missing argument {i}")))
        };
        match name {
            "time" => Ok(Val::Scalar(
                (0..self.n).map(|i| self.t(i) as f64 / 1000.0).collect(),
            )),
            "pi" => Ok(Val::Scalar(vec![std::f64::consts::PI; self.n])),
            "vector" => {
                let v = self.scalar_arg(arg(0)?, name)?;
                Ok(Val::Vector(vec![StepSeries {
                    labels: Vec::new(),
                    vals: v.into_iter().map(Some).collect(),
                }]))
            }
            "scalar" => {
                let v = self.vector_arg(arg(0)?, name)?;
                Ok(Val::Scalar(
                    (0..self.n)
                        .map(|i| {
                            let mut at = v.iter().filter_map(|s| s.vals[i]);
                            match (at.next(), at.next()) {
                                (Some(x), None) => x,
                                _ => f64::NAN,
                            }
                        })
                        .collect(),
                ))
            }
            "timestamp" => self.timestamp(arg(0)?),
            "sort" | "sort_desc" => {
                let mut v = self.vector_arg(arg(0)?, name)?;
                // Order only matters to an instant query's vector: by
                // value, NaN first either way (Prometheus's heaps).
                if self.n == 1 {
                    let desc = name == "sort_desc";
                    v.sort_by(|a, b| {
                        let (x, y) = (a.vals[0].unwrap_or(f64::NAN), b.vals[0].unwrap_or(f64::NAN));
                        match (x.is_nan(), y.is_nan()) {
                            (true, false) => std::cmp::Ordering::Less,
                            (false, true) => std::cmp::Ordering::Greater,
                            _ if desc => y.total_cmp(&x),
                            _ => x.total_cmp(&y),
                        }
                    });
                }
                Ok(Val::Vector(v))
            }
            "label_replace" => self.label_replace(&args),
            "label_join" => self.label_join(&args),
            "absent" => {
                let v = self.vector_arg(arg(0)?, name)?;
                let labels = absent_labels(arg(0)?);
                let vals: Vec<Option<f64>> = (0..self.n)
                    .map(|i| (!v.iter().any(|s| s.vals[i].is_some())).then_some(1.0))
                    .collect();
                Ok(Val::Vector(absent_series(labels, vals)))
            }
            "absent_over_time" => {
                let input = self.range_input(arg(0)?)?;
                let any = self.any_in_windows(&input);
                let vals = any.into_iter().map(|a| (!a).then_some(1.0)).collect();
                Ok(Val::Vector(absent_series(absent_labels(arg(0)?), vals)))
            }
            "histogram_quantile" => {
                let q = self.scalar_arg(arg(0)?, name)?;
                let v = self.vector_arg(arg(1)?, name)?;
                self.histogram_quantile(&q, v)
            }
            // No native histograms are stored.
            "histogram_count" | "histogram_sum" => {
                self.vector_arg(arg(0)?, name)?;
                Ok(Val::Vector(Vec::new()))
            }
            "histogram_fraction" => {
                self.scalar_arg(arg(0)?, name)?;
                self.scalar_arg(arg(1)?, name)?;
                self.vector_arg(arg(2)?, name)?;
                Ok(Val::Vector(Vec::new()))
            }
            _ => Err(QueryError::BadData(format!("unknown function {name}"))),
        }
    }

    fn range_call(&self, f: RangeFn, args: &[&Expr]) -> Result<Val, QueryError> {
        let ri = f.range_arg();
        let range_arg = args
            .get(ri)
            .ok_or_else(|| QueryError::BadData("expected a range vector argument".into()))?;
        // The other arguments are scalars, read at every step.
        let mut params: Vec<Vec<f64>> = Vec::new();
        for (i, a) in args.iter().enumerate() {
            if i != ri {
                params.push(self.scalar_arg(a, "call to function")?);
            }
        }
        if f == RangeFn::HoltWinters {
            for (i, what) in [(0, "smoothing"), (1, "trend")] {
                if let Some(&x) = params.get(i).and_then(|p| p.first()) {
                    if x <= 0.0 || x >= 1.0 {
                        return Err(QueryError::Execution(format!(
                            "invalid {what} factor. Expected: 0 < sf < 1, got: {x}"
                        )));
                    }
                }
            }
        }
        if let Some(v) = self.rollup_call(f, range_arg)? {
            return Ok(v);
        }
        let input = self.range_input(range_arg)?;
        let mut p = vec![0.0; params.len()];
        let rows = self.over_windows(&input, |w, t, i| {
            for (k, col) in params.iter().enumerate() {
                p[k] = col[i];
            }
            f.apply(w, t, input.range, input.offset, &p)
        })?;
        let out = self.range_output(&input, rows, f.keeps_name());
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    /// Series of a range function's result, labelled from its input.
    fn range_output(
        &self,
        input: &RangeInput,
        rows: Vec<(usize, Vec<Option<f64>>)>,
        keep_name: bool,
    ) -> Vec<StepSeries> {
        rows.into_iter()
            .map(|(k, vals)| {
                let labels = input.series[k].0.clone();
                StepSeries {
                    labels: if keep_name { labels } else { drop_name(labels) },
                    vals,
                }
            })
            .collect()
    }

    fn value_call(&self, f: ValueFn, args: &[&Expr]) -> Result<Val, QueryError> {
        let v = match args.first() {
            Some(a) => self.vector_arg(a, "call to function")?,
            None if f.is_date() => vec![StepSeries {
                labels: Vec::new(),
                vals: (0..self.n)
                    .map(|i| Some(self.t(i) as f64 / 1000.0))
                    .collect(),
            }],
            None => {
                return Err(QueryError::BadData(
                    "expected an instant vector argument".into(),
                ))
            }
        };
        let mut params: Vec<Vec<f64>> = Vec::new();
        for a in args.iter().skip(1) {
            params.push(self.scalar_arg(a, "call to function")?);
        }
        let mut out = Vec::with_capacity(v.len());
        let mut p = vec![0.0; params.len()];
        for s in v {
            let mut vals = Vec::with_capacity(self.n);
            for (i, x) in s.vals.iter().enumerate() {
                for (k, col) in params.iter().enumerate() {
                    p[k] = col[i];
                }
                // clamp with max below min gives no series at that step.
                if f == ValueFn::Clamp && p[1] < p[0] {
                    vals.push(None);
                    continue;
                }
                vals.push(x.map(|x| f.apply(x, &p)));
            }
            if vals.iter().any(Option::is_some) {
                out.push(StepSeries {
                    labels: drop_name(s.labels),
                    vals,
                });
            }
        }
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    /// `timestamp(v)`: the time of each sample in seconds — a selector's
    /// samples' own times, any other expression's step times.
    fn timestamp(&self, e: &Expr) -> Result<Val, QueryError> {
        let out: Vec<StepSeries> = match e {
            Expr::VectorSelector(vs) => self.selector_series(vs, &|s, vals| StepSeries {
                labels: drop_name(s.labels),
                vals: vals
                    .into_iter()
                    .map(|p| p.map(|p| p.0 as f64 / 1000.0))
                    .collect(),
            })?,
            _ => self
                .vector_arg(e, "timestamp")?
                .into_iter()
                .map(|s| StepSeries {
                    labels: drop_name(s.labels),
                    vals: s
                        .vals
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.map(|_| self.t(i) as f64 / 1000.0))
                        .collect(),
                })
                .collect(),
        };
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    fn label_replace(&self, args: &[&Expr]) -> Result<Val, QueryError> {
        let [v, dst, repl, src, re] = args else {
            return Err(QueryError::BadData(
                "label_replace() takes 5 arguments".into(),
            ));
        };
        let s = |e| self.string_arg(e, "label_replace");
        let (dst, repl, src, re_text) = (s(dst)?, s(repl)?, s(src)?, s(re)?);
        let re = regex::Regex::new(&format!("^(?:{re_text})$")).map_err(|_| {
            QueryError::Execution(format!(
                "invalid regular expression in label_replace(): {re_text}"
            ))
        })?;
        if !super::aggregate::is_label_name(&dst) {
            return Err(QueryError::Execution(format!(
                "invalid destination label name in label_replace(): {dst}"
            )));
        }
        let v = self.vector_arg(v, "label_replace")?;
        let out: Vec<StepSeries> = v
            .into_iter()
            .map(|s| StepSeries {
                labels: label_replace(&s.labels, &dst, &repl, &src, &re),
                vals: s.vals,
            })
            .collect();
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    fn label_join(&self, args: &[&Expr]) -> Result<Val, QueryError> {
        let [v, dst, sep, srcs @ ..] = args else {
            return Err(QueryError::BadData(
                "label_join() takes at least 3 arguments".into(),
            ));
        };
        let dst = self.string_arg(dst, "label_join")?;
        let sep = self.string_arg(sep, "label_join")?;
        let srcs = srcs
            .iter()
            .map(|e| self.string_arg(e, "label_join"))
            .collect::<Result<Vec<_>, _>>()?;
        if !super::aggregate::is_label_name(&dst) {
            return Err(QueryError::Execution(format!(
                "invalid destination label name in label_join(): {dst}"
            )));
        }
        let v = self.vector_arg(v, "label_join")?;
        let out: Vec<StepSeries> = v
            .into_iter()
            .map(|s| {
                let joined: Vec<&str> = srcs.iter().map(|k| label(&s.labels, k)).collect();
                StepSeries {
                    labels: with_label(&s.labels, &dst, &joined.join(&sep)),
                    vals: s.vals,
                }
            })
            .collect();
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    /// `histogram_quantile(φ, buckets)`: series with an `le` grouped by
    /// their other labels (name included), each group's quantile labelled
    /// without `le` and `__name__`.
    fn histogram_quantile(&self, q: &[f64], v: Vec<StepSeries>) -> Result<Val, QueryError> {
        let mut groups: Vec<(Labels, Vec<(f64, usize)>)> = Vec::new();
        let mut index: HashMap<Labels, usize> = HashMap::new();
        for (k, s) in v.iter().enumerate() {
            let Some(le) = parse_le(label(&s.labels, "le")) else {
                continue;
            };
            let sig: Labels = s
                .labels
                .iter()
                .filter(|(n, _)| n != "le")
                .cloned()
                .collect();
            let g = *index.entry(sig.clone()).or_insert_with(|| {
                let out: Labels = sig.into_iter().filter(|(n, _)| n != "__name__").collect();
                groups.push((out, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((le, k));
        }
        let mut out = Vec::with_capacity(groups.len());
        for (labels, members) in groups {
            let vals: Vec<Option<f64>> = (0..self.n)
                .map(|i| {
                    let b: Vec<(f64, f64)> = members
                        .iter()
                        .filter_map(|&(le, k)| v[k].vals[i].map(|c| (le, c)))
                        .collect();
                    (!b.is_empty()).then(|| bucket_quantile(q[i], b))
                })
                .collect();
            if vals.iter().any(Option::is_some) {
                out.push(StepSeries { labels, vals });
            }
        }
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }
}

/// The one series `absent` and `absent_over_time` give, if any step has a
/// value.
fn absent_series(labels: Labels, vals: Vec<Option<f64>>) -> Vec<StepSeries> {
    if vals.iter().any(Option::is_some) {
        vec![StepSeries { labels, vals }]
    } else {
        Vec::new()
    }
}
