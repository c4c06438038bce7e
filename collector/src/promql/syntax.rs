//! Small facts about a parsed query and label sets that the evaluator,
//! the selection and the cluster's reads all need: a selector's matchers,
//! offsets and `@` times, parentheses, label values.

use super::QueryError;
use crate::series::Labels;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{AtModifier, Expr, Offset, VectorSelector};

/// The selector's matchers, its metric name as a `__name__` matcher.
pub(super) fn matchers(vs: &VectorSelector) -> Result<Vec<Matcher>, QueryError> {
    if !vs.matchers.or_matchers.is_empty() {
        return Err(QueryError::BadData(
            "unexpected \"or\" in label matching: not PromQL of Prometheus 2.42".into(),
        ));
    }
    let mut m = vs.matchers.matchers.clone();
    if let Some(n) = &vs.name {
        m.push(Matcher::new(MatchOp::Equal, "__name__", n));
    }
    Ok(m)
}

/// An `offset` in ms (negative for `offset -5m`).
pub(super) fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        None => 0,
        Some(Offset::Pos(d)) => d.as_millis() as i64,
        Some(Offset::Neg(d)) => -(d.as_millis() as i64),
    }
}

pub(super) fn drop_name(mut l: Labels) -> Labels {
    l.retain(|(k, _)| k != "__name__");
    l
}

/// `e` without the parentheses around it.
pub(super) fn unwrap_parens(mut e: &Expr) -> &Expr {
    while let Expr::Paren(p) = e {
        e = &p.expr;
    }
    e
}

/// The value of label `name` in `l` ("" when absent).
pub(super) fn label<'l>(l: &'l Labels, name: &str) -> &'l str {
    l.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The time an `@` modifier names, in ms: `start()` and `end()` are
/// `query`'s start and end.
pub(super) fn at_ms(at: &Option<AtModifier>, query: (i64, i64)) -> Option<i64> {
    Some(match at.as_ref()? {
        AtModifier::Start => query.0,
        AtModifier::End => query.1,
        AtModifier::At(t) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        },
    })
}
