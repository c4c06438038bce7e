//! Binary operators, as Prometheus 2.42's `VectorBinop`,
//! `VectorscalarBinop` and the set operators evaluate them, step by step:
//!
//! - arithmetic (`+ - * / % ^ atan2`) and comparisons (filtering, or 0/1
//!   with `bool`) between scalars, a vector and a scalar, or two vectors;
//!   `+ - * / % ^` and `bool` drop `__name__` (`atan2` and filtering
//!   comparisons keep it);
//! - two vectors match on their labels but `__name__`, on the `on(…)`
//!   labels, or on all but the `ignoring(…)` ones; one to one, or many to
//!   one with `group_left(…)` / `group_right(…)` (the listed labels copied
//!   from the "one" side); a match group with two series on the "one" side
//!   at a step, or two matches of a one-to-one, is Prometheus's error;
//! - `and`, `or`, `unless` keep the left side's series at the steps where
//!   the right side has (`and`) or has not (`unless`) a series of their
//!   match group, and `or` adds the right side's series at the steps
//!   where the left has none of their group.

use super::{check_unique, drop_name, label, Collect, Evaluator, StepSeries, Val};
use crate::promql::QueryError;
use crate::series::Labels;
use promql_parser::parser::{BinaryExpr, LabelModifier, VectorMatchCardinality};
use std::collections::{HashMap, HashSet};

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::promql) enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Atan2,
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
    And,
    Or,
    Unless,
}

impl Op {
    fn of(s: &str) -> Option<Self> {
        Some(match s {
            "+" => Self::Add,
            "-" => Self::Sub,
            "*" => Self::Mul,
            "/" => Self::Div,
            "%" => Self::Mod,
            "^" => Self::Pow,
            "atan2" => Self::Atan2,
            "==" => Self::Eq,
            "!=" => Self::Ne,
            ">" => Self::Gt,
            "<" => Self::Lt,
            ">=" => Self::Ge,
            "<=" => Self::Le,
            "and" => Self::And,
            "or" => Self::Or,
            "unless" => Self::Unless,
            _ => return None,
        })
    }

    fn is_comparison(self) -> bool {
        matches!(
            self,
            Self::Eq | Self::Ne | Self::Gt | Self::Lt | Self::Ge | Self::Le
        )
    }

    fn is_set(self) -> bool {
        matches!(self, Self::And | Self::Or | Self::Unless)
    }

    /// Prometheus 2.42's `shouldDropMetricName`: the arithmetic operators
    /// but `atan2`.
    fn drops_name(self) -> bool {
        matches!(
            self,
            Self::Add | Self::Sub | Self::Mul | Self::Div | Self::Mod | Self::Pow
        )
    }

    /// The value and whether it is kept (a comparison's truth), with `x`
    /// on the left (Prometheus's `vectorElemBinop`).
    pub(super) fn apply(self, x: f64, y: f64) -> (f64, bool) {
        match self {
            Self::Add => (x + y, true),
            Self::Sub => (x - y, true),
            Self::Mul => (x * y, true),
            Self::Div => (x / y, true),
            Self::Mod => (x % y, true),
            Self::Pow => (x.powf(y), true),
            Self::Atan2 => (x.atan2(y), true),
            Self::Eq => (x, x == y),
            Self::Ne => (x, x != y),
            Self::Gt => (x, x > y),
            Self::Lt => (x, x < y),
            Self::Ge => (x, x >= y),
            Self::Le => (x, x <= y),
            Self::And | Self::Or | Self::Unless => (x, true),
        }
    }
}

/// How two vectors' series are matched.
enum Matching<'a> {
    On(&'a [String]),
    Ignoring(&'a [String]),
}

impl Matching<'_> {
    /// The labels two series must share to match.
    fn signature(&self, l: &Labels) -> Labels {
        l.iter()
            .filter(|(k, _)| match self {
                Matching::On(on) => on.iter().any(|o| o == k),
                Matching::Ignoring(ign) => k != "__name__" && !ign.iter().any(|o| o == k),
            })
            .cloned()
            .collect()
    }
}

/// Series' signatures interned as small integers.
fn intern(sigs: &mut HashMap<Labels, usize>, s: Labels) -> usize {
    let n = sigs.len();
    *sigs.entry(s).or_insert(n)
}

/// `l` with label `name` set to `v` (removed when `v` is empty), sorted.
fn set_label(l: &mut Labels, name: &str, v: &str) {
    match l.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
        Ok(i) if v.is_empty() => {
            l.remove(i);
        }
        Ok(i) => l[i].1 = v.to_string(),
        Err(_) if v.is_empty() => {}
        Err(i) => l.insert(i, (name.to_string(), v.to_string())),
    }
}

impl Evaluator<'_> {
    pub(crate) fn binary(&self, b: &BinaryExpr) -> Result<Val, QueryError> {
        let name = b.op.to_string();
        let op = Op::of(&name)
            .ok_or_else(|| QueryError::BadData(format!("unknown binary operator {name}")))?;
        let want_bool = b.return_bool();
        let lhs = self.eval(&b.lhs)?;
        let rhs = self.eval(&b.rhs)?;
        match (lhs, rhs) {
            (Val::Scalar(l), Val::Scalar(r)) => {
                if op.is_set() {
                    return Err(QueryError::BadData(format!(
                        "set operator \"{name}\" not allowed in binary scalar expression"
                    )));
                }
                Ok(Val::Scalar(
                    l.into_iter()
                        .zip(r)
                        .map(|(x, y)| {
                            let (v, keep) = op.apply(x, y);
                            if op.is_comparison() {
                                f64::from(u8::from(keep))
                            } else {
                                v
                            }
                        })
                        .collect(),
                ))
            }
            (Val::Vector(v), Val::Scalar(s)) => self.vector_scalar(op, v, &s, false, want_bool),
            (Val::Scalar(s), Val::Vector(v)) => self.vector_scalar(op, v, &s, true, want_bool),
            (Val::Vector(l), Val::Vector(r)) => {
                let modifier = b.modifier.as_ref();
                let matching = match modifier.and_then(|m| m.matching.as_ref()) {
                    Some(LabelModifier::Include(on)) => Matching::On(&on.labels),
                    Some(LabelModifier::Exclude(ign)) => Matching::Ignoring(&ign.labels),
                    None => Matching::Ignoring(&[]),
                };
                if op.is_set() {
                    return Ok(Val::Vector(self.set_op(op, l, r, &matching)));
                }
                let card = modifier.map_or(&VectorMatchCardinality::OneToOne, |m| &m.card);
                self.vector_vector(op, l, r, &matching, card, want_bool)
            }
            _ => Err(QueryError::BadData(format!(
                "binary expression must contain only scalar and instant vector types (operator {name})"
            ))),
        }
    }

    fn vector_scalar(
        &self,
        op: Op,
        v: Vec<StepSeries>,
        s: &[f64],
        swap: bool,
        want_bool: bool,
    ) -> Result<Val, QueryError> {
        if op.is_set() {
            return Err(QueryError::BadData(
                "set operator not allowed in binary scalar expression".into(),
            ));
        }
        let mut out = Vec::with_capacity(v.len());
        for series in v {
            let mut vals = Vec::with_capacity(self.n);
            for (i, x) in series.vals.iter().enumerate() {
                let Some(x) = *x else {
                    vals.push(None);
                    continue;
                };
                let (l, r) = if swap { (s[i], x) } else { (x, s[i]) };
                let (mut value, mut keep) = op.apply(l, r);
                // A comparison keeps the vector's value, on either side.
                if op.is_comparison() && swap {
                    value = x;
                }
                if want_bool {
                    value = f64::from(u8::from(keep));
                    keep = true;
                }
                vals.push(keep.then_some(value));
            }
            if vals.iter().any(Option::is_some) {
                let labels = if op.drops_name() || want_bool {
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

    fn set_op(
        &self,
        op: Op,
        l: Vec<StepSeries>,
        r: Vec<StepSeries>,
        matching: &Matching,
    ) -> Vec<StepSeries> {
        let mut ids = HashMap::new();
        let lsig: Vec<usize> = l
            .iter()
            .map(|s| intern(&mut ids, matching.signature(&s.labels)))
            .collect();
        let rsig: Vec<usize> = r
            .iter()
            .map(|s| intern(&mut ids, matching.signature(&s.labels)))
            .collect();
        // Which signatures a side has at a step.
        let present = |side: &[StepSeries], sig: &[usize], i: usize| -> HashSet<usize> {
            side.iter()
                .zip(sig)
                .filter(|(s, _)| s.vals[i].is_some())
                .map(|(_, &g)| g)
                .collect()
        };
        let mut left = l;
        match op {
            Op::And | Op::Unless => {
                for i in 0..self.n {
                    let right = present(&r, &rsig, i);
                    for (s, g) in left.iter_mut().zip(&lsig) {
                        if s.vals[i].is_some() && right.contains(g) != (op == Op::And) {
                            s.vals[i] = None;
                        }
                    }
                }
                left.retain(|s| s.vals.iter().any(Option::is_some));
                left
            }
            _ => {
                let mut right = r;
                for i in 0..self.n {
                    let lhs = present(&left, &lsig, i);
                    for (s, g) in right.iter_mut().zip(&rsig) {
                        if lhs.contains(g) {
                            s.vals[i] = None;
                        }
                    }
                }
                right.retain(|s| s.vals.iter().any(Option::is_some));
                left.extend(right);
                left
            }
        }
    }

    fn vector_vector(
        &self,
        op: Op,
        l: Vec<StepSeries>,
        r: Vec<StepSeries>,
        matching: &Matching,
        card: &VectorMatchCardinality,
        want_bool: bool,
    ) -> Result<Val, QueryError> {
        let (include, one_to_one): (&[String], bool) = match card {
            VectorMatchCardinality::ManyToOne(ls) | VectorMatchCardinality::OneToMany(ls) => {
                (&ls.labels, false)
            }
            _ => (&[], true),
        };
        // The "one" side is the right, but for group_right.
        let swapped = matches!(card, VectorMatchCardinality::OneToMany(_));
        let (many, one) = if swapped { (r, l) } else { (l, r) };
        let mut ids = HashMap::new();
        let many_sig: Vec<usize> = many
            .iter()
            .map(|s| intern(&mut ids, matching.signature(&s.labels)))
            .collect();
        let one_sig: Vec<usize> = one
            .iter()
            .map(|s| intern(&mut ids, matching.signature(&s.labels)))
            .collect();
        let side = if swapped { "left" } else { "right" };
        let mut collect = Collect::new(self.n);
        let mut slots: HashMap<(usize, usize), usize> = HashMap::new();
        // The "one" side's series of each signature at a step.
        let mut one_at: Vec<Option<usize>> = vec![None; ids.len()];
        let mut matched = vec![false; ids.len()];
        for i in 0..self.n {
            self.model.budget.check()?;
            one_at.iter_mut().for_each(|x| *x = None);
            matched.iter_mut().for_each(|x| *x = false);
            for (j, s) in one.iter().enumerate() {
                if s.vals[i].is_none() {
                    continue;
                }
                if let Some(prev) = one_at[one_sig[j]].replace(j) {
                    return Err(QueryError::Execution(format!(
                        "found duplicate series for the match group {} on the {side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                        labels_text(&matching.signature(&s.labels)),
                        labels_text(&s.labels),
                        labels_text(&one[prev].labels),
                    )));
                }
            }
            for (k, s) in many.iter().enumerate() {
                let Some(x) = s.vals[i] else { continue };
                let g = many_sig[k];
                let Some(j) = one_at[g] else { continue };
                if one_to_one {
                    if matched[g] {
                        return Err(QueryError::Execution(
                            "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)".into(),
                        ));
                    }
                    matched[g] = true;
                }
                let y = one[j].vals[i].unwrap_or(f64::NAN);
                let (vl, vr) = if swapped { (y, x) } else { (x, y) };
                let (value, keep) = op.apply(vl, vr);
                let value = if want_bool {
                    f64::from(u8::from(keep))
                } else if keep {
                    value
                } else {
                    continue;
                };
                let slot = match slots.get(&(k, j)) {
                    Some(&s) => s,
                    None => {
                        let labels = result_labels(
                            &s.labels,
                            &one[j].labels,
                            op,
                            matching,
                            one_to_one,
                            include,
                            want_bool,
                        );
                        let s = collect.slot(labels);
                        slots.insert((k, j), s);
                        s
                    }
                };
                collect.set(slot, i, value).map_err(|_| {
                    QueryError::Execution(if one_to_one {
                        "vector cannot contain metrics with the same labelset".into()
                    } else {
                        "multiple matches for labels: grouping labels must ensure unique matches"
                            .into()
                    })
                })?;
            }
        }
        Ok(Val::Vector(collect.finish()))
    }
}

/// Prometheus's `resultMetric`: the "many" side's labels, `__name__`
/// dropped for arithmetic (and `bool`), reduced to the `on` labels (or
/// without the `ignoring` ones) one to one, and the `group_x` labels
/// taken from the "one" side.
fn result_labels(
    many: &Labels,
    one: &Labels,
    op: Op,
    matching: &Matching,
    one_to_one: bool,
    include: &[String],
    want_bool: bool,
) -> Labels {
    let mut l = many.clone();
    if op.drops_name() || want_bool {
        l.retain(|(k, _)| k != "__name__");
    }
    if one_to_one {
        match matching {
            Matching::On(on) => l.retain(|(k, _)| on.iter().any(|o| o == k)),
            Matching::Ignoring(ign) => l.retain(|(k, _)| !ign.iter().any(|o| o == k)),
        }
    }
    for name in include {
        set_label(&mut l, name, label(one, name));
    }
    l
}

/// A label set as Prometheus prints one: `{a="1", b="2"}`.
pub(in crate::promql) fn labels_text(l: &Labels) -> String {
    let parts: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn result_labels_follow_prometheus() {
        let many = l(&[("__name__", "x"), ("a", "1"), ("b", "2")]);
        let one = l(&[("__name__", "y"), ("a", "1"), ("c", "3")]);
        let on = vec!["a".to_string()];
        // One to one on(a): only a; arithmetic drops the name.
        assert_eq!(
            result_labels(&many, &one, Op::Add, &Matching::On(&on), true, &[], false),
            l(&[("a", "1")])
        );
        // A filtering comparison keeps it; ignoring drops the listed.
        let ign = vec!["b".to_string()];
        assert_eq!(
            result_labels(
                &many,
                &one,
                Op::Gt,
                &Matching::Ignoring(&ign),
                true,
                &[],
                false
            ),
            l(&[("__name__", "x"), ("a", "1")])
        );
        // group_left(c): the many side's labels plus c from the one side.
        let c = vec!["c".to_string(), "missing".to_string()];
        assert_eq!(
            result_labels(&many, &one, Op::Div, &Matching::On(&on), false, &c, false),
            l(&[("a", "1"), ("b", "2"), ("c", "3")])
        );
        // atan2 keeps the name.
        assert_eq!(
            result_labels(
                &many,
                &one,
                Op::Atan2,
                &Matching::Ignoring(&[]),
                true,
                &[],
                false
            ),
            many
        );
    }
}
