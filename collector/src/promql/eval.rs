//! The evaluator: a `promql-parser` AST evaluated at every step of a range
//! (an instant query is a range of one step), as Prometheus 2.42's engine
//! evaluates it (`promql/engine.go`): each node yields its value at all
//! steps, series by series.
//!
//! Semantics kept from Prometheus 2.42:
//! - an instant selector takes, at `t`, the newest sample in
//!   `[t - 5m, t]` (the lookback delta) and reports it at `t`;
//! - a range selector's window is `[t - range, t]` (closed in 2.x);
//! - range-vector functions (but `last_over_time`) and arithmetic drop
//!   `__name__`; comparisons
//!   filter (or give 0/1 with `bool`, dropping `__name__`); `without`
//!   drops `__name__`, `by` keeps only the listed labels;
//! - `offset` shifts a selector back in time;
//! - two instant vectors match one to one (`on`/`ignoring`), and
//!   `time()` is the step's time in seconds.
//!
//! Anything else is refused with [`QueryError::Unsupported`] naming the
//! part (HTTP 422).

use super::functions::WindowAcc;
use super::functions::{quantile, RangeFn};
use super::model::{Model, Piece, SeriesRef};
use super::{QueryError, LOOKBACK_MS};
use crate::series::Labels;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, MatrixSelector, Offset,
    VectorMatchCardinality, VectorSelector,
};
use std::collections::HashMap;

/// One series' values at the steps (`None`: no sample at that step).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StepSeries {
    pub labels: Labels,
    pub vals: Vec<Option<f64>>,
}

/// Samples of one series, in time order.
pub(super) type Points = Vec<(i64, f64)>;

/// A node's value at every step.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Scalar(Vec<f64>),
    Vector(Vec<StepSeries>),
}

/// Steps `start, start + step, … ≤ end`.
pub(super) struct Evaluator<'a> {
    pub model: Model<'a>,
    pub start: i64,
    pub step: i64,
    pub n: usize,
}

fn unsupported(what: impl std::fmt::Display) -> QueryError {
    QueryError::Unsupported(format!("unsupported by flopwatch's PromQL engine: {what}"))
}

fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        None => 0,
        Some(Offset::Pos(d)) => d.as_millis() as i64,
        Some(Offset::Neg(d)) => -(d.as_millis() as i64),
    }
}

/// The selector's matchers, its metric name as a `__name__` matcher.
fn matchers(vs: &VectorSelector) -> Result<Vec<Matcher>, QueryError> {
    if vs.at.is_some() {
        return Err(unsupported("the @ modifier"));
    }
    if !vs.matchers.or_matchers.is_empty() {
        return Err(unsupported("`or` inside a label selector"));
    }
    let mut m = vs.matchers.matchers.clone();
    if let Some(n) = &vs.name {
        m.push(Matcher::new(MatchOp::Equal, "__name__", n));
    }
    Ok(m)
}

pub(super) fn drop_name(mut l: Labels) -> Labels {
    l.retain(|(k, _)| k != "__name__");
    l
}

impl Evaluator<'_> {
    fn t(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }

    fn end(&self) -> i64 {
        self.t(self.n.saturating_sub(1))
    }

    /// `e`'s value at every step. Each node checks the query's budget
    /// (canceled?) and counts the points it computes; selectors and range
    /// functions count theirs series by series as they read.
    pub fn eval(&self, e: &Expr) -> Result<Val, QueryError> {
        self.model.budget.check()?;
        let v = self.eval_node(e)?;
        if !matches!(
            e,
            Expr::VectorSelector(_) | Expr::Paren(_) | Expr::Call(_) | Expr::MatrixSelector(_)
        ) {
            self.model.budget.samples(match &v {
                Val::Scalar(_) => self.n,
                Val::Vector(v) => v.len().saturating_mul(self.n),
            })?;
        }
        Ok(v)
    }

    fn eval_node(&self, e: &Expr) -> Result<Val, QueryError> {
        match e {
            Expr::NumberLiteral(x) => Ok(Val::Scalar(vec![x.val; self.n])),
            Expr::Paren(p) => self.eval(&p.expr),
            Expr::Unary(u) => Ok(match self.eval(&u.expr)? {
                Val::Scalar(v) => Val::Scalar(v.into_iter().map(|x| -x).collect()),
                Val::Vector(v) => Val::Vector(
                    v.into_iter()
                        .map(|s| StepSeries {
                            labels: drop_name(s.labels),
                            vals: s.vals.into_iter().map(|x| x.map(|x| -x)).collect(),
                        })
                        .collect(),
                ),
            }),
            Expr::VectorSelector(vs) => self.instant_selector(vs),
            Expr::MatrixSelector(_) => Err(QueryError::BadData(
                "a range vector is only a valid result of an instant query".into(),
            )),
            Expr::Call(c) => self.call(c),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) => self.binary(b),
            Expr::StringLiteral(_) => Err(unsupported("string literals")),
            Expr::Subquery(_) => Err(unsupported("subqueries")),
            Expr::Extension(_) => Err(unsupported("extension expressions")),
        }
    }

    fn instant_selector(&self, vs: &VectorSelector) -> Result<Val, QueryError> {
        let m = matchers(vs)?;
        let off = offset_ms(&vs.offset);
        let mut out = Vec::new();
        for s in self.model.select(&m)? {
            let pts = self
                .model
                .samples(&s, self.start - off - LOOKBACK_MS, self.end() - off)?;
            let mut vals = Vec::with_capacity(self.n);
            let mut j = 0;
            for i in 0..self.n {
                let r = self.t(i) - off;
                while j < pts.len() && pts[j].0 <= r {
                    j += 1;
                }
                vals.push(
                    j.checked_sub(1)
                        .map(|k| pts[k])
                        .filter(|p| p.0 >= r - LOOKBACK_MS)
                        .map(|p| p.1),
                );
            }
            if vals.iter().any(Option::is_some) {
                self.model.budget.samples(self.n)?;
                out.push(StepSeries {
                    labels: s.labels,
                    vals,
                });
            }
        }
        Ok(Val::Vector(out))
    }

    /// The samples of each series a range selector picks, read once for
    /// all steps.
    pub fn range_samples(
        &self,
        ms: &MatrixSelector,
    ) -> Result<Vec<(SeriesRef, Points)>, QueryError> {
        let m = matchers(&ms.vs)?;
        let off = offset_ms(&ms.vs.offset);
        let range = ms.range.as_millis() as i64;
        let mut out = Vec::new();
        for s in self.model.select(&m)? {
            let pts = self
                .model
                .samples(&s, self.start - off - range, self.end() - off)?;
            if !pts.is_empty() {
                out.push((s, pts));
            }
        }
        Ok(out)
    }

    fn scalar_arg(&self, e: &Expr, what: &str) -> Result<Vec<f64>, QueryError> {
        match self.eval(e)? {
            Val::Scalar(v) => Ok(v),
            Val::Vector(_) => Err(QueryError::BadData(format!(
                "{what} expects a scalar parameter"
            ))),
        }
    }

    fn call(&self, c: &Call) -> Result<Val, QueryError> {
        let name = c.func.name;
        if name == "time" {
            // The evaluation time, in seconds (Grafana's `time() - x`).
            return Ok(Val::Scalar(
                (0..self.n).map(|i| self.t(i) as f64 / 1000.0).collect(),
            ));
        }
        let Some(f) = RangeFn::of(name) else {
            return self.other_call(c);
        };
        let args = &c.args.args;
        let (q, arg) = if f == RangeFn::Quantile {
            let [q, m] = args.as_slice() else {
                return Err(QueryError::BadData(format!("{name}() takes two arguments")));
            };
            (Some(self.scalar_arg(q, name)?), m)
        } else {
            let [m] = args.as_slice() else {
                return Err(QueryError::BadData(format!("{name}() takes one argument")));
            };
            (None, m)
        };
        let ms = match arg.as_ref() {
            Expr::MatrixSelector(ms) => ms,
            Expr::Subquery(_) => return Err(unsupported("subqueries")),
            _ => {
                return Err(QueryError::BadData(format!(
                    "{name}() expects a range vector"
                )))
            }
        };
        let off = offset_ms(&ms.vs.offset);
        let range = ms.range.as_millis() as i64;
        let mut out = Vec::new();
        // Windows whose ends lie on whole minutes (or hours) take sealed
        // buckets from the rollups, series by series where they can.
        if let Some(hours) = self.bucket_grain(f, range, off) {
            let m = matchers(&ms.vs)?;
            let (from, to) = (self.start - off - range, self.end() - off);
            for s in self.model.select(&m)? {
                let vals = match self.model.ofu_buckets(&s, from, to, hours)? {
                    Some(pieces) => self.bucket_windows(f, &pieces, range, off),
                    None => {
                        let pts = self.model.samples(&s, from, to)?;
                        self.sample_windows(f, &pts, range, off, None)
                    }
                };
                if vals.iter().any(Option::is_some) {
                    self.model.budget.samples(self.n)?;
                    out.push(StepSeries {
                        labels: drop_name(s.labels),
                        vals,
                    });
                }
            }
            check_unique(&out)?;
            return Ok(Val::Vector(out));
        }
        for (s, pts) in self.range_samples(ms)? {
            let vals = self.sample_windows(f, &pts, range, off, q.as_deref());
            if vals.iter().any(Option::is_some) {
                // Prometheus 2.42 keeps the name through last_over_time
                // only.
                let labels = if f == RangeFn::Last {
                    s.labels
                } else {
                    drop_name(s.labels)
                };
                self.model.budget.samples(self.n)?;
                out.push(StepSeries { labels, vals });
            }
        }
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    /// Whether `f`'s windows can be answered from rollup buckets, and at
    /// which grain: every window `[t - range, t]` starts and ends on a
    /// whole hour (`Some(true)`) or minute (`Some(false)`), and `f` needs
    /// only counts, sums, minima and maxima.
    fn bucket_grain(&self, f: RangeFn, range: i64, off: i64) -> Option<bool> {
        use crate::store::{MINUTE_MS, WINDOW_MS};
        if !matches!(
            f,
            RangeFn::Avg | RangeFn::Sum | RangeFn::Count | RangeFn::Min | RangeFn::Max
        ) {
            return None;
        }
        let aligned = |g: i64| {
            (self.start - off).rem_euclid(g) == 0
                && range % g == 0
                && (self.n < 2 || self.step % g == 0)
        };
        if aligned(WINDOW_MS) {
            Some(true)
        } else if aligned(MINUTE_MS) {
            Some(false)
        } else {
            None
        }
    }

    /// `f` over each step's window `[t - range, t]` from buckets and
    /// samples: a bucket starting in `[t - range, t)` lies wholly inside
    /// (the grain guarantees it), one starting at `t` gives its first
    /// sample if that sample is at `t` (the window is closed).
    fn bucket_windows(
        &self,
        f: RangeFn,
        pieces: &[Piece],
        range: i64,
        off: i64,
    ) -> Vec<Option<f64>> {
        let mut vals = Vec::with_capacity(self.n);
        let mut lo = 0;
        for i in 0..self.n {
            let t = self.t(i) - off;
            while lo < pieces.len() && pieces[lo].ts() < t - range {
                lo += 1;
            }
            let mut acc = WindowAcc::default();
            for p in &pieces[lo..] {
                match *p {
                    _ if p.ts() > t => break,
                    Piece::Sample(_, v) => acc.add(1, v, v, v),
                    Piece::Bucket {
                        ts,
                        count,
                        sum,
                        min,
                        max,
                        first,
                    } => {
                        if ts < t {
                            acc.add(count, sum, min, max);
                        } else if first.0 == t {
                            acc.add(1, first.1, first.1, first.1);
                        }
                    }
                }
            }
            vals.push(acc.value(f));
        }
        vals
    }

    /// `f` over each step's window `[t - range, t]` of `pts`.
    fn sample_windows(
        &self,
        f: RangeFn,
        pts: &Points,
        range: i64,
        off: i64,
        q: Option<&[f64]>,
    ) -> Vec<Option<f64>> {
        let mut vals = Vec::with_capacity(self.n);
        let (mut lo, mut hi) = (0usize, 0usize);
        for i in 0..self.n {
            let t = self.t(i) - off;
            while lo < pts.len() && pts[lo].0 < t - range {
                lo += 1;
            }
            hi = hi.max(lo);
            while hi < pts.len() && pts[hi].0 <= t {
                hi += 1;
            }
            let w = &pts[lo..hi];
            let qi = q.map_or(0.0, |q| q[i]);
            vals.push(if w.is_empty() {
                None
            } else {
                f.apply(w, t, range, qi)
            });
        }
        vals
    }

    /// A function this engine does not evaluate: refused (422), unless
    /// every series it would read is absent (its instant-vector arguments
    /// are empty), when the answer is as empty as Prometheus's: a panel on
    /// a metric the store does not hold (the collector's own health, say)
    /// shows no data rather than an error.
    fn other_call(&self, c: &Call) -> Result<Val, QueryError> {
        let name = c.func.name;
        let mut vectors = 0;
        for a in &c.args.args {
            match a.as_ref() {
                Expr::MatrixSelector(_) | Expr::Subquery(_) | Expr::StringLiteral(_) => {
                    return Err(unsupported(format_args!("function {name}()")))
                }
                e => match self.eval(e)? {
                    Val::Vector(v) if v.is_empty() => vectors += 1,
                    Val::Vector(_) => return Err(unsupported(format_args!("function {name}()"))),
                    Val::Scalar(_) => {}
                },
            }
        }
        if vectors == 0 {
            return Err(unsupported(format_args!("function {name}()")));
        }
        Ok(Val::Vector(Vec::new()))
    }

    fn aggregate(&self, a: &AggregateExpr) -> Result<Val, QueryError> {
        let op = a.op.to_string();
        let param = match (&a.param, op.as_str()) {
            (Some(p), "topk" | "bottomk" | "quantile") => Some(self.scalar_arg(p, &op)?),
            (None, "sum" | "avg" | "min" | "max" | "count") => None,
            _ => return Err(unsupported(format_args!("aggregation {op}"))),
        };
        let Val::Vector(input) = self.eval(&a.expr)? else {
            return Err(QueryError::BadData(format!(
                "expected an instant vector in aggregation {op}"
            )));
        };
        // Group key of each input series.
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
        if matches!(op.as_str(), "topk" | "bottomk") {
            let k = param.unwrap_or_default();
            let mut keep = vec![vec![false; self.n]; input.len()];
            for (_, members) in &groups {
                for (i, &kf) in k.iter().enumerate() {
                    let k = kf as i64;
                    if k < 1 {
                        continue;
                    }
                    let mut vals: Vec<(usize, f64)> = members
                        .iter()
                        .filter_map(|&m| input[m].vals[i].map(|v| (m, v)))
                        .collect();
                    // NaN ranks last either way, as in Prometheus's heaps.
                    vals.sort_by(|a, b| {
                        let (x, y) = (a.1, b.1);
                        match (x.is_nan(), y.is_nan()) {
                            (true, false) => std::cmp::Ordering::Greater,
                            (false, true) => std::cmp::Ordering::Less,
                            _ if op == "topk" => y.total_cmp(&x),
                            _ => x.total_cmp(&y),
                        }
                    });
                    for &(m, _) in vals.iter().take(k as usize) {
                        keep[m][i] = true;
                    }
                }
            }
            let out = input
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
                .collect();
            return Ok(Val::Vector(out));
        }
        let mut out = Vec::new();
        for (labels, members) in groups {
            let mut vals = Vec::with_capacity(self.n);
            for i in 0..self.n {
                let mut v: Vec<f64> = members.iter().filter_map(|&m| input[m].vals[i]).collect();
                if v.is_empty() {
                    vals.push(None);
                    continue;
                }
                let x = match op.as_str() {
                    "sum" => v.iter().sum(),
                    "avg" => v.iter().sum::<f64>() / v.len() as f64,
                    "count" => v.len() as f64,
                    "min" => v[1..]
                        .iter()
                        .fold(v[0], |m, &x| if m > x || m.is_nan() { x } else { m }),
                    "max" => v[1..]
                        .iter()
                        .fold(v[0], |m, &x| if m < x || m.is_nan() { x } else { m }),
                    _ => quantile(param.as_ref().map_or(f64::NAN, |p| p[i]), &mut v),
                };
                vals.push(Some(x));
            }
            out.push(StepSeries { labels, vals });
        }
        Ok(Val::Vector(out))
    }

    fn binary(&self, b: &BinaryExpr) -> Result<Val, QueryError> {
        let op = b.op.to_string();
        if matches!(op.as_str(), "and" | "or" | "unless") {
            return Err(unsupported(format_args!("set operator {op}")));
        }
        let is_cmp = matches!(op.as_str(), "==" | "!=" | ">" | "<" | ">=" | "<=");
        let want_bool = b.return_bool();
        let lhs = self.eval(&b.lhs)?;
        let rhs = self.eval(&b.rhs)?;
        let f = |x: f64, y: f64| -> Result<(f64, bool), QueryError> {
            Ok(match op.as_str() {
                "+" => (x + y, true),
                "-" => (x - y, true),
                "*" => (x * y, true),
                "/" => (x / y, true),
                "%" => (x % y, true),
                "^" => (x.powf(y), true),
                "atan2" => (x.atan2(y), true),
                "==" => (x, x == y),
                "!=" => (x, x != y),
                ">" => (x, x > y),
                "<" => (x, x < y),
                ">=" => (x, x >= y),
                "<=" => (x, x <= y),
                _ => return Err(unsupported(format_args!("operator {op}"))),
            })
        };
        match (lhs, rhs) {
            (Val::Scalar(l), Val::Scalar(r)) => {
                let mut out = Vec::with_capacity(self.n);
                for (x, y) in l.into_iter().zip(r) {
                    let (v, keep) = f(x, y)?;
                    out.push(if is_cmp { f64::from(u8::from(keep)) } else { v });
                }
                Ok(Val::Scalar(out))
            }
            (Val::Vector(v), Val::Scalar(s)) => {
                self.vector_scalar(v, &s, false, is_cmp, want_bool, &f)
            }
            (Val::Scalar(s), Val::Vector(v)) => {
                self.vector_scalar(v, &s, true, is_cmp, want_bool, &f)
            }
            (Val::Vector(l), Val::Vector(r)) => self.vector_vector(b, l, r, is_cmp, want_bool, &f),
        }
    }

    /// Two instant vectors, matched one to one on their labels but
    /// `__name__` (or on the `on(…)` labels, or all but the `ignoring(…)`
    /// ones), as Prometheus's `VectorBinop` with one-to-one cardinality:
    /// series without a partner are dropped; two on one side with the same
    /// match labels at one step are an error; `group_left`/`group_right`
    /// are refused.
    #[allow(clippy::too_many_arguments)]
    fn vector_vector(
        &self,
        b: &BinaryExpr,
        l: Vec<StepSeries>,
        r: Vec<StepSeries>,
        is_cmp: bool,
        want_bool: bool,
        f: &dyn Fn(f64, f64) -> Result<(f64, bool), QueryError>,
    ) -> Result<Val, QueryError> {
        let matching = b.modifier.as_ref().and_then(|m| {
            if !matches!(m.card, VectorMatchCardinality::OneToOne) {
                return Some(Err(unsupported("group_left / group_right")));
            }
            m.matching.as_ref().map(Ok)
        });
        let matching = matching.transpose()?;
        let key = |labels: &Labels| -> Labels {
            labels
                .iter()
                .filter(|(k, _)| match matching {
                    Some(LabelModifier::Include(on)) => on.labels.iter().any(|o| o == k),
                    Some(LabelModifier::Exclude(ign)) => {
                        k != "__name__" && !ign.labels.iter().any(|o| o == k)
                    }
                    None => k != "__name__",
                })
                .cloned()
                .collect()
        };
        let mut right: HashMap<Labels, Vec<usize>> = HashMap::new();
        for (i, s) in r.iter().enumerate() {
            right.entry(key(&s.labels)).or_default().push(i);
        }
        let keys: Vec<Labels> = l.iter().map(|s| key(&s.labels)).collect();
        let mut out = Vec::new();
        for (li, ls) in l.iter().enumerate() {
            let Some(partners) = right.get(&keys[li]) else {
                continue;
            };
            let mut vals = Vec::with_capacity(self.n);
            for i in 0..self.n {
                let mut rv = partners.iter().filter_map(|&j| r[j].vals[i]);
                let (Some(x), Some(y)) = (ls.vals[i], rv.next()) else {
                    vals.push(None);
                    continue;
                };
                if rv.next().is_some() {
                    return Err(QueryError::BadData(
                        "found duplicate series for the match group on the right hand-side of the operation; many-to-many matching not allowed: matching labels must be unique on one side".into(),
                    ));
                }
                let twins = keys
                    .iter()
                    .enumerate()
                    .filter(|&(k, key)| k != li && *key == keys[li] && l[k].vals[i].is_some())
                    .count();
                if twins > 0 {
                    return Err(QueryError::BadData(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)".into(),
                    ));
                }
                let (value, keep) = f(x, y)?;
                vals.push(if !is_cmp {
                    Some(value)
                } else if want_bool {
                    Some(f64::from(u8::from(keep)))
                } else {
                    keep.then_some(x)
                });
            }
            if vals.iter().any(Option::is_some) {
                let mut labels = if !is_cmp || want_bool {
                    drop_name(ls.labels.clone())
                } else {
                    ls.labels.clone()
                };
                match matching {
                    Some(LabelModifier::Include(on)) => {
                        labels.retain(|(k, _)| on.labels.iter().any(|o| o == k))
                    }
                    Some(LabelModifier::Exclude(ign)) => {
                        labels.retain(|(k, _)| !ign.labels.iter().any(|o| o == k))
                    }
                    None => {}
                }
                out.push(StepSeries { labels, vals });
            }
        }
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }

    #[allow(clippy::too_many_arguments)]
    fn vector_scalar(
        &self,
        v: Vec<StepSeries>,
        s: &[f64],
        swap: bool,
        is_cmp: bool,
        want_bool: bool,
        f: &dyn Fn(f64, f64) -> Result<(f64, bool), QueryError>,
    ) -> Result<Val, QueryError> {
        let mut out = Vec::with_capacity(v.len());
        for series in v {
            let mut vals = Vec::with_capacity(self.n);
            for (i, x) in series.vals.iter().enumerate() {
                let Some(x) = *x else {
                    vals.push(None);
                    continue;
                };
                let (l, r) = if swap { (s[i], x) } else { (x, s[i]) };
                let (mut value, mut keep) = f(l, r)?;
                if is_cmp && swap {
                    value = x;
                }
                if want_bool {
                    value = f64::from(u8::from(keep));
                    keep = true;
                }
                vals.push(keep.then_some(value));
            }
            if vals.iter().any(Option::is_some) {
                let labels = if !is_cmp || want_bool {
                    drop_name(series.labels)
                } else {
                    series.labels
                };
                out.push(StepSeries { labels, vals });
            }
        }
        check_unique(&out)?;
        Ok(Val::Vector(out))
    }
}

/// Prometheus refuses a result where two series share a label set at one
/// step (after `__name__` was dropped).
fn check_unique(v: &[StepSeries]) -> Result<(), QueryError> {
    let mut seen: HashMap<&Labels, &StepSeries> = HashMap::new();
    for s in v {
        if let Some(o) = seen.insert(&s.labels, s) {
            if o.vals
                .iter()
                .zip(&s.vals)
                .any(|(a, b)| a.is_some() && b.is_some())
            {
                return Err(QueryError::Unsupported(
                    "vector cannot contain metrics with the same labelset".into(),
                ));
            }
        }
    }
    Ok(())
}
