//! A query's shape checked before it is parsed: its length and how deep
//! its syntax tree can be, so no expression reaches the parser, the
//! evaluator or a recursive drop deeper than the stack they run on was
//! sized for.
//!
//! The depth is bounded from the text alone, without parsing: every level
//! of a PromQL syntax tree is either an opening bracket (a parenthesis, a
//! function call's or aggregation's argument list, a range or subquery's
//! `[…]`, a selector's `{…}`) or an operator (a binary operator, a set
//! operator, a unary sign). So the deepest bracket nesting plus the number
//! of operator tokens is at least the tree's depth: `abs(abs(…))` counts
//! its parentheses, `x + x + …` (a left-leaning chain as deep as it is
//! long) its operators. Quoted strings and comments count nothing.
//! Over-counting (a `-` of a negative number, the `=` of a label matcher
//! is never counted, a `,` never) only errs towards refusing.

use super::QueryError;

/// How much one query may ask for: the shape limits checked before
/// parsing, and the work limits of evaluation ([`super::budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// Longest query text, in bytes.
    pub max_bytes: usize,
    /// Deepest syntax tree, bounded as the module describes.
    pub max_depth: usize,
    /// Most samples (stored points read and result points computed) one
    /// query may touch.
    pub max_samples: u64,
    /// Most series one query may select.
    pub max_series: u64,
    /// Series go stale after their last sample ([`crate::staleness`]).
    pub staleness: bool,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            max_bytes: 128 * 1024,
            max_depth: 256,
            max_samples: 50_000_000,
            max_series: 500_000,
            staleness: true,
        }
    }
}

impl QueryLimits {
    /// The limits `[prometheus_api]` sets.
    pub fn from_config(c: &flopwatch_config::PrometheusApiConfig) -> Self {
        Self {
            max_bytes: c.max_query_bytes,
            max_depth: c.max_query_depth,
            max_samples: c.max_samples,
            max_series: c.max_series,
            staleness: c.staleness,
        }
    }
}

/// Which shape limit a query passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeLimit {
    /// `max_query_bytes`.
    Bytes,
    /// `max_query_depth`.
    Depth,
}

/// Refuses `query` when it is longer than the limits allow or could parse
/// into a tree deeper than they allow (HTTP 400, naming the limit).
pub fn check(query: &str, limits: &QueryLimits) -> Result<(), (ShapeLimit, QueryError)> {
    if query.len() > limits.max_bytes {
        return Err((
            ShapeLimit::Bytes,
            QueryError::BadData(format!(
                "query is {} bytes long, more than the {} bytes max_query_bytes allows",
                query.len(),
                limits.max_bytes
            )),
        ));
    }
    let depth = depth_bound(query);
    if depth > limits.max_depth {
        return Err((
            ShapeLimit::Depth,
            QueryError::BadData(format!(
                "query nests too deep: its brackets and operators allow a depth of {depth}, more than the {} max_query_depth allows",
                limits.max_depth
            )),
        ));
    }
    Ok(())
}

/// The deepest bracket nesting plus the number of operator tokens of
/// `query` (see the module's description).
pub fn depth_bound(query: &str) -> usize {
    let b = query.as_bytes();
    let (mut i, mut open, mut deepest, mut operators) = (0, 0usize, 0usize, 0usize);
    // Label matchers (`{a="b"}`) hold no operators: braces are counted
    // but their `=`, `!=`, `=~`, `!~` are not.
    let mut braces = 0usize;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    if b[i] == b'\\' && c != b'`' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                open += 1;
                deepest = deepest.max(open);
                braces += usize::from(c == b'{');
            }
            b')' | b']' | b'}' => {
                open = open.saturating_sub(1);
                if c == b'}' {
                    braces = braces.saturating_sub(1);
                }
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'^' => operators += 1,
            b'=' | b'!' | b'<' | b'>' if braces == 0 => {
                operators += 1;
                // Two-character operators count once.
                if b.get(i + 1).is_some_and(|n| matches!(n, b'=' | b'~')) {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b':')) {
                    i += 1;
                }
                let word = &query[start..i];
                if ["and", "or", "unless", "atan2"]
                    .iter()
                    .any(|w| word.eq_ignore_ascii_case(w))
                {
                    operators += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    deepest + operators
}

#[cfg(test)]
mod tests {
    use super::*;
    use promql_parser::parser::{self, Expr};

    /// The depth of a parsed tree, counted iteratively (no recursion).
    fn tree_depth(e: &Expr) -> usize {
        let mut deepest = 0;
        let mut stack = vec![(e, 1usize)];
        while let Some((e, d)) = stack.pop() {
            deepest = deepest.max(d);
            let children: Vec<&Expr> = match e {
                Expr::Aggregate(a) => [Some(&*a.expr), a.param.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect(),
                Expr::Unary(u) => vec![&*u.expr],
                Expr::Binary(b) => vec![&*b.lhs, &*b.rhs],
                Expr::Paren(p) => vec![&*p.expr],
                Expr::Subquery(s) => vec![&*s.expr],
                Expr::Call(c) => c.args.args.iter().map(|a| &**a).collect(),
                _ => Vec::new(),
            };
            stack.extend(children.into_iter().map(|c| (c, d + 1)));
        }
        deepest
    }

    #[test]
    fn the_bound_is_at_least_the_parsed_depth() {
        for q in [
            "x",
            "abs(abs(abs(x)))",
            "x + x * x - x / x",
            "-(-(-x))",
            "sum by (a) (rate(x{a=~\"b|c\", d!=\"e\"}[5m]))",
            "max_over_time(rate(x[1m])[5m:30s])",
            "x and y or z unless w",
            "x atan2 y > bool 1",
            "1 ^ 2 ^ 3 ^ 4",
            "x offset -5m",
            "x @ start()",
            "sum(x) by (a) + on(a) group_left(b) y",
            "label_replace(x, \"a\", \"$1\", \"b\", \"(.*)\")",
        ] {
            let e = parser::parse(q).unwrap_or_else(|e| panic!("{q}: {e}"));
            assert!(
                depth_bound(q) >= tree_depth(&e) - 1,
                "{q}: bound {} < depth {}",
                depth_bound(q),
                tree_depth(&e)
            );
        }
    }

    #[test]
    fn quoted_text_and_comments_count_nothing() {
        assert_eq!(depth_bound("x{a=\"((((+-*\"}"), 1);
        assert_eq!(depth_bound("x{a='\\'(('}"), 1);
        assert_eq!(depth_bound("x # ((((\n"), 0);
        assert_eq!(depth_bound("x{a=`((`} != 1"), 2);
    }

    #[test]
    fn hostile_shapes_are_refused_before_parsing() {
        let l = QueryLimits::default();
        let nested = format!("{}x{}", "abs(".repeat(10_000), ")".repeat(10_000));
        let chain = vec!["x"; 5_000].join(" + ");
        let parens = format!("{}1{}", "(".repeat(4_000), ")".repeat(4_000));
        let ones = vec!["1"; 1_000].join("+");
        let minus = format!("{}x", "-".repeat(1_000));
        for q in [&nested, &chain, &parens, &ones, &minus] {
            let Err((ShapeLimit::Depth, QueryError::BadData(m))) = check(q, &l) else {
                panic!("{} not refused", &q[..20]);
            };
            assert!(m.contains("max_query_depth"), "{m}");
        }
        let long = format!("x{{a=\"{}\"}}", "a".repeat(200_000));
        assert!(matches!(check(&long, &l), Err((ShapeLimit::Bytes, _))));
        assert!(check("sum by (job_id) (rate(x[5m]))", &l).is_ok());
    }
}
