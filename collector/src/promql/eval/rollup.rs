//! The windowed aggregates of the OFU ratio from the store's rollups:
//! `avg|sum|count|min|max_over_time` over a range selector whose windows
//! `[t − range, t]` all start and end on whole minutes (or hours) read
//! sealed minute (hour) buckets instead of their samples
//! (docs/PROMQL.md, *Rollups*). The answer is exact: buckets hold
//! unweighted sums, counts, minima and maxima.

use super::{check_unique, drop_name, offset_ms, Evaluator, StepSeries, Val};
use crate::promql::functions::{RangeFn, WindowAcc};
use crate::promql::model::Piece;
use crate::promql::points::window;
use crate::promql::syntax::matchers;
use crate::promql::QueryError;
use crate::store::{MINUTE_MS, WINDOW_MS};
use promql_parser::parser::Expr;

impl Evaluator<'_> {
    /// `f` over `arg` from the rollups, or `None` where they cannot
    /// answer (another function, a subquery, `@`, windows off the grain).
    pub(crate) fn rollup_call(&self, f: RangeFn, arg: &Expr) -> Result<Option<Val>, QueryError> {
        let Expr::MatrixSelector(ms) = arg else {
            return Ok(None);
        };
        if ms.vs.at.is_some() {
            return Ok(None);
        }
        let off = offset_ms(&ms.vs.offset);
        let range = ms.range.as_millis() as i64;
        let Some(hours) = self.bucket_grain(f, range, off) else {
            return Ok(None);
        };
        let m = matchers(&ms.vs)?;
        let (from, to) = (self.start - off - range, self.end() - off);
        let mut out = Vec::new();
        for s in self.model.select(&m)? {
            let vals = match self.model.ofu_buckets(&s, from, to, hours)? {
                Some(pieces) => self.bucket_windows(f, &pieces, range, off),
                None => {
                    let pts = self.model.samples(&s, from, to)?;
                    (0..self.n)
                        .map(|i| {
                            let end = self.t(i) - off;
                            let w = window(&pts, end - range, end);
                            if w.is_empty() {
                                None
                            } else {
                                f.apply(w, self.t(i), range, off, &[])
                            }
                        })
                        .collect()
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
        Ok(Some(Val::Vector(out)))
    }

    /// Whether `f`'s windows can be answered from rollup buckets, and at
    /// which grain: every window `[t - range, t]` starts and ends on a
    /// whole hour (`Some(true)`) or minute (`Some(false)`), and `f` needs
    /// only counts, sums, minima and maxima.
    fn bucket_grain(&self, f: RangeFn, range: i64, off: i64) -> Option<bool> {
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
}
