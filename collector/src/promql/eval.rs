//! The evaluator: a `promql-parser` AST evaluated at every step of a range
//! (an instant query is a range of one step), as Prometheus 2.42's engine
//! evaluates it (`promql/engine.go`): each node yields its value at all
//! steps, series by series.
//!
//! - selectors ([`selector`]): an instant selector takes, at `t`, the
//!   newest sample in `[t − 5m, t]` (the lookback delta); a range
//!   selector's window is `[t − range, t]` (closed in 2.x); `offset`
//!   shifts both back, `@` pins them to one time for every step;
//! - subqueries ([`selector::Evaluator::subquery`]) evaluate their
//!   expression at their own steps, aligned to multiples of their
//!   resolution (1 minute by default, Prometheus's default evaluation
//!   interval), and are read as a range selector is;
//! - functions ([`call`], arithmetic in [`crate::promql::functions`]),
//!   aggregations ([`aggregate`]) and operators ([`binary`]) as the
//!   modules describe, each with Prometheus 2.42's rules for `__name__`
//!   and its errors;
//! - a vector whose series share a label set at one step is refused
//!   (`vector cannot contain metrics with the same labelset`).
//!
//! Every node counts what it computes against the query's [`Budget`]
//! (and so stops when the query is canceled); recursion follows the
//! syntax tree, whose depth the shape limits bound
//! ([`crate::promql::guard`]).
//!
//! [`Budget`]: crate::promql::budget::Budget

mod aggregate;
mod binary;
mod call;
mod rollup;
mod selector;

pub(super) use super::syntax::{drop_name, label, offset_ms, unwrap_parens};

use super::model::Model;
use super::points::Points;
use super::QueryError;
use crate::series::Labels;
use promql_parser::parser::{AtModifier, Expr};
use std::collections::HashMap;

/// One series' values at the steps (`None`: no sample at that step).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StepSeries {
    pub labels: Labels,
    pub vals: Vec<Option<f64>>,
}

/// A node's value at every step.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Scalar(Vec<f64>),
    Vector(Vec<StepSeries>),
    String(String),
}

/// A range vector, as a function reads it: each series' points, and the
/// window `[t − offset − range, t − offset]` each step `t` reads (`t` the
/// `@` time at every step, when one is given).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RangeInput {
    pub series: Vec<(Labels, Points)>,
    pub range: i64,
    pub offset: i64,
    pub at: Option<i64>,
}

/// Steps `start, start + step, … ≤ end`.
pub(super) struct Evaluator<'a> {
    pub model: Model<'a>,
    pub start: i64,
    pub step: i64,
    pub n: usize,
    /// The query's own start and end: `@ start()` and `@ end()`.
    pub query_start: i64,
    pub query_end: i64,
}

pub(super) fn unsupported(what: impl std::fmt::Display) -> QueryError {
    QueryError::Unsupported(format!("unsupported by flopwatch's PromQL engine: {what}"))
}

impl Evaluator<'_> {
    pub(super) fn t(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }

    pub(super) fn end(&self) -> i64 {
        self.t(self.n.saturating_sub(1))
    }

    /// An evaluator of the same query over other steps.
    fn at_steps(&self, start: i64, step: i64, n: usize) -> Evaluator<'_> {
        Evaluator {
            model: self.model,
            start,
            step,
            n,
            query_start: self.query_start,
            query_end: self.query_end,
        }
    }

    /// The time an `@` modifier names, in ms.
    pub(super) fn at_ms(&self, at: &Option<AtModifier>) -> Option<i64> {
        super::syntax::at_ms(at, (self.query_start, self.query_end))
    }

    /// `e`'s value at every step. Each node checks the query's budget
    /// (canceled?) and counts the points it computes.
    pub(super) fn eval(&self, e: &Expr) -> Result<Val, QueryError> {
        self.model.budget.check()?;
        let v = match e {
            Expr::NumberLiteral(x) => Val::Scalar(vec![x.val; self.n]),
            Expr::StringLiteral(s) => Val::String(s.val.clone()),
            Expr::Paren(p) => return self.eval(&p.expr),
            Expr::Unary(u) => self.negate(self.eval(&u.expr)?)?,
            Expr::VectorSelector(vs) => self.instant_selector(vs)?,
            Expr::MatrixSelector(_) | Expr::Subquery(_) => {
                return Err(QueryError::BadData(
                    "a range vector is only valid as the argument of a function or as the result of an instant query".into(),
                ))
            }
            Expr::Call(c) => self.call(c)?,
            Expr::Aggregate(a) => self.aggregate(a)?,
            Expr::Binary(b) => self.binary(b)?,
            Expr::Extension(_) => return Err(unsupported("extension expressions")),
        };
        self.model.budget.samples(match &v {
            Val::Scalar(_) => self.n,
            Val::Vector(v) => v.len().saturating_mul(self.n),
            Val::String(_) => 1,
        })?;
        Ok(v)
    }

    /// `e` as a scalar at every step (a function's or aggregation's
    /// number parameter).
    pub(super) fn scalar_arg(&self, e: &Expr, what: &str) -> Result<Vec<f64>, QueryError> {
        match self.eval(e)? {
            Val::Scalar(v) => Ok(v),
            _ => Err(QueryError::BadData(format!(
                "expected type scalar in {what}"
            ))),
        }
    }

    /// `e` as an instant vector.
    pub(super) fn vector_arg(&self, e: &Expr, what: &str) -> Result<Vec<StepSeries>, QueryError> {
        match self.eval(e)? {
            Val::Vector(v) => Ok(v),
            _ => Err(QueryError::BadData(format!(
                "expected type instant vector in {what}"
            ))),
        }
    }

    /// `e` as a string.
    pub(super) fn string_arg(&self, e: &Expr, what: &str) -> Result<String, QueryError> {
        match unwrap_parens(e) {
            Expr::StringLiteral(s) => Ok(s.val.clone()),
            _ => Err(QueryError::BadData(format!(
                "expected type string in {what}"
            ))),
        }
    }

    /// Unary minus: values negated, `__name__` dropped.
    fn negate(&self, v: Val) -> Result<Val, QueryError> {
        Ok(match v {
            Val::Scalar(v) => Val::Scalar(v.into_iter().map(|x| -x).collect()),
            Val::Vector(v) => {
                let out: Vec<StepSeries> = v
                    .into_iter()
                    .map(|s| StepSeries {
                        labels: drop_name(s.labels),
                        vals: s.vals.into_iter().map(|x| x.map(|x| -x)).collect(),
                    })
                    .collect();
                check_unique(&out)?;
                Val::Vector(out)
            }
            Val::String(_) => {
                return Err(QueryError::BadData(
                    "unary expression only allowed on expressions of type scalar or instant vector"
                        .into(),
                ))
            }
        })
    }
}

/// Prometheus refuses a result where two series share a label set at one
/// step.
pub(super) fn check_unique(v: &[StepSeries]) -> Result<(), QueryError> {
    let mut seen: HashMap<&Labels, usize> = HashMap::with_capacity(v.len());
    for (i, s) in v.iter().enumerate() {
        if let Some(o) = seen.insert(&s.labels, i) {
            if v[o]
                .vals
                .iter()
                .zip(&s.vals)
                .any(|(a, b)| a.is_some() && b.is_some())
            {
                return Err(same_labelset());
            }
        }
    }
    Ok(())
}

pub(super) fn same_labelset() -> QueryError {
    QueryError::Execution("vector cannot contain metrics with the same labelset".into())
}

/// Series of one label set gathered from per-step results: where several
/// results of a step yield one label set, that is the error Prometheus
/// gives; otherwise each label set is one series.
pub(super) struct Collect {
    n: usize,
    index: HashMap<Labels, usize>,
    out: Vec<StepSeries>,
}

impl Collect {
    pub(super) fn new(n: usize) -> Self {
        Self {
            n,
            index: HashMap::new(),
            out: Vec::new(),
        }
    }

    /// The series for `labels`' position.
    pub(super) fn slot(&mut self, labels: Labels) -> usize {
        let n = self.n;
        let out = &mut self.out;
        *self.index.entry(labels).or_insert_with_key(|l| {
            out.push(StepSeries {
                labels: l.clone(),
                vals: vec![None; n],
            });
            out.len() - 1
        })
    }

    /// Sets the value of series `slot` at step `i`; an error if it has one.
    pub(super) fn set(&mut self, slot: usize, i: usize, v: f64) -> Result<(), QueryError> {
        let cell = &mut self.out[slot].vals[i];
        if cell.is_some() {
            return Err(same_labelset());
        }
        *cell = Some(v);
        Ok(())
    }

    pub(super) fn finish(self) -> Vec<StepSeries> {
        self.out
    }
}
