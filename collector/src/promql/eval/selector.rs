//! Selectors and subqueries: what a query reads from the series model.

use super::{offset_ms, unwrap_parens, Evaluator, RangeInput, StepSeries, Val};
use crate::promql::model::{Model, SeriesRef, StepTimes};
use crate::promql::points::{window, Points};
use crate::promql::syntax::matchers;
use crate::promql::{QueryError, LOOKBACK_MS};
use crate::series::Labels;
use promql_parser::parser::{Expr, MatrixSelector, SubqueryExpr, VectorSelector};
use std::collections::HashMap;

pub(in crate::promql) use crate::promql::model::StepSamples;

/// A series' value at each step.
pub(in crate::promql) type StepValues = Vec<Option<f64>>;

/// A subquery's resolution when it names none: Prometheus's default
/// evaluation interval.
pub(in crate::promql) const DEFAULT_SUBQUERY_STEP_MS: i64 = 60_000;

/// Series a thread reads at the least: below twice this, one thread.
const SERIES_PER_THREAD: usize = 64;

/// What an instant selector reads ([`Evaluator::step_read`]).
struct StepRead {
    series: Vec<SeriesRef>,
    times: StepTimes,
    from: i64,
    to: i64,
    /// `@`: every step takes the sample at the one time.
    pinned: bool,
}

impl Evaluator<'_> {
    /// The times an `@`-pinned or ordinary selector reads at each step.
    fn read_times(&self, at: Option<i64>, off: i64) -> (i64, i64) {
        match at {
            Some(t) => (t - off, t - off),
            None => (self.start - off, self.end() - off),
        }
    }

    /// What an instant selector reads at the steps: its matchers, the
    /// times it takes a sample at, and the range it reads them from.
    fn step_read(&self, vs: &VectorSelector) -> Result<StepRead, QueryError> {
        let off = offset_ms(&vs.offset);
        let at = self.at_ms(&vs.at);
        let (first, last) = self.read_times(at, off);
        let times = StepTimes::new(match at {
            Some(t) => vec![t - off],
            None => (0..self.n).map(|i| self.t(i) - off).collect(),
        });
        Ok(StepRead {
            series: self.model.select(&matchers(vs)?)?,
            times,
            from: first - LOOKBACK_MS,
            to: last,
            pinned: at.is_some(),
        })
    }

    /// A selected series' sample (time and value) at every step — the
    /// newest in the lookback window before the step's time (less
    /// `offset`, or at the `@` time) — or `None` where it has none.
    fn read_steps(
        &self,
        model: &Model,
        r: &StepRead,
        s: &SeriesRef,
    ) -> Result<Option<StepSamples>, QueryError> {
        if model.nothing_in(s, r.from, r.to) {
            return Ok(None);
        }
        let mut vals = model.at_times(s, &r.times, r.from, r.to)?;
        if r.pinned {
            vals = vec![vals[0]; self.n];
        }
        if vals.iter().any(Option::is_some) {
            model.budget.samples(self.n)?;
            return Ok(Some(vals));
        }
        Ok(None)
    }

    /// Each selected series with its sample at every step
    /// ([`Evaluator::read_steps`]), turned by `each` into what the caller
    /// keeps, on the threads that read the series.
    pub(crate) fn selector_series<R: Send>(
        &self,
        vs: &VectorSelector,
        each: &(dyn Fn(SeriesRef, StepSamples) -> R + Sync),
    ) -> Result<Vec<R>, QueryError> {
        let mut r = self.step_read(vs)?;
        let series = std::mem::take(&mut r.series);
        // A part's series are read under one view of the store.
        let read = |part: Vec<SeriesRef>| -> Result<Vec<R>, QueryError> {
            self.model.reading(|model| {
                let mut out = Vec::new();
                for s in part {
                    if let Some(vals) = self.read_steps(model, &r, &s)? {
                        out.push(each(s, vals));
                    }
                }
                Ok(out)
            })?
        };
        let mut out = Vec::new();
        for part in crate::parallel::parts_in_parallel(series, SERIES_PER_THREAD, &read) {
            out.extend(part?);
        }
        Ok(out)
    }

    /// An instant selector's series in groups by `key`, each group's
    /// members read in selection order and folded into one `A` on the
    /// thread that reads them (`fold` takes a member's samples at every
    /// step), so no member's samples outlive its fold: what an
    /// aggregation of a selector reads. The groups come in the order of
    /// their first member with a sample, as an aggregation over
    /// [`Evaluator::selector_series`]' output finds them, and a group none
    /// of whose members has a sample is left out. `None` where the groups
    /// cannot keep every core busy; the caller then reads the series one
    /// by one.
    pub(crate) fn selector_groups<A: Send>(
        &self,
        vs: &VectorSelector,
        key: &(dyn Fn(&Labels) -> Labels + Sync),
        init: &(dyn Fn() -> A + Sync),
        fold: &(dyn Fn(&mut A, &StepSamples) + Sync),
    ) -> Result<Option<Vec<(Labels, A)>>, QueryError> {
        let r = self.step_read(vs)?;
        let mut groups: Vec<(Labels, Vec<usize>)> = Vec::new();
        let mut index: HashMap<Labels, usize> = HashMap::new();
        for (i, s) in r.series.iter().enumerate() {
            // Nothing to read: no member of any group.
            if self.model.nothing_in(s, r.from, r.to) {
                continue;
            }
            let k = key(&s.labels);
            let g = match index.get(&k) {
                Some(&g) => g,
                None => {
                    index.insert(k.clone(), groups.len());
                    groups.push((k, Vec::new()));
                    groups.len() - 1
                }
            };
            groups[g].1.push(i);
        }
        let to_read: usize = groups.iter().map(|g| g.1.len()).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // On every core, a group is read by one thread: too few groups,
        // or one with more than a core's share of the members, would
        // leave cores idle.
        let largest = groups.iter().map(|g| g.1.len()).max().unwrap_or(0);
        if cores > 1
            && to_read >= 2 * SERIES_PER_THREAD
            && (groups.len() < 4 * cores || largest * cores > to_read)
        {
            return Ok(None);
        }
        // Per group: its first member with a sample (for the order) and
        // its fold.
        // A group's members are read under one view of the store.
        let read = |(labels, members): (Labels, Vec<usize>)| {
            self.model.reading(|model| {
                let mut acc = init();
                let (mut first, mut read) = (None, 0usize);
                for m in members {
                    if let Some(vals) = self.read_steps(model, &r, &r.series[m])? {
                        first = first.or(Some(m));
                        read += 1;
                        fold(&mut acc, &vals);
                    }
                }
                Ok::<_, QueryError>(first.map(|f| (f, read, labels, acc)))
            })?
        };
        let mut out = Vec::with_capacity(groups.len());
        if to_read >= 2 * SERIES_PER_THREAD {
            // Largest groups first, each taken by the next free thread:
            // the threads finish together. The order is restored below.
            groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
            for g in crate::parallel::each_in_parallel(groups, &read) {
                out.extend(g?);
            }
        } else {
            for g in groups {
                out.extend(read(g)?);
            }
        }
        // As `eval` counts the selector's vector on the other path.
        let members: usize = out.iter().map(|g| g.1).sum();
        self.model.budget.samples(members.saturating_mul(self.n))?;
        out.sort_by_key(|g| g.0);
        Ok(Some(out.into_iter().map(|(_, _, l, a)| (l, a)).collect()))
    }

    pub(crate) fn instant_selector(&self, vs: &VectorSelector) -> Result<Val, QueryError> {
        Ok(Val::Vector(self.selector_series(vs, &|s, vals| {
            StepSeries {
                labels: s.labels,
                vals: vals.into_iter().map(|p| p.map(|p| p.1)).collect(),
            }
        })?))
    }

    /// A range argument (a range selector or a subquery, in parentheses or
    /// not) read for every step.
    pub(crate) fn range_input(&self, e: &Expr) -> Result<RangeInput, QueryError> {
        match unwrap_parens(e) {
            Expr::MatrixSelector(ms) => self.matrix(ms),
            Expr::Subquery(sq) => self.subquery(sq),
            _ => Err(QueryError::BadData(
                "expected type range vector in call to function".into(),
            )),
        }
    }

    /// A range selector's series and their samples in the windows of all
    /// steps.
    pub(crate) fn matrix(&self, ms: &MatrixSelector) -> Result<RangeInput, QueryError> {
        let m = matchers(&ms.vs)?;
        let offset = offset_ms(&ms.vs.offset);
        let range = ms.range.as_millis() as i64;
        let at = self.at_ms(&ms.vs.at);
        let (first, last) = self.read_times(at, offset);
        let mut series = Vec::new();
        for s in self.model.select(&m)? {
            let pts = self.model.samples(&s, first - range, last)?;
            if !pts.is_empty() {
                series.push((s.labels, pts));
            }
        }
        Ok(RangeInput {
            series,
            range,
            offset,
            at,
        })
    }

    /// A subquery: its expression evaluated at the steps of its resolution
    /// that lie in the windows of every outer step, as Prometheus's
    /// `evalSubquery` does (the first step is the first multiple of the
    /// resolution at or after the first window's start).
    pub(crate) fn subquery(&self, sq: &SubqueryExpr) -> Result<RangeInput, QueryError> {
        let offset = offset_ms(&sq.offset);
        let range = sq.range.as_millis() as i64;
        let step = sq
            .step
            .map_or(DEFAULT_SUBQUERY_STEP_MS, |d| d.as_millis() as i64);
        if step <= 0 {
            return Err(QueryError::BadData(
                "zero or negative subquery resolution".into(),
            ));
        }
        let at = self.at_ms(&sq.at);
        let (first, last) = self.read_times(at, offset);
        let from = first - range;
        let mut start = from.div_euclid(step) * step;
        if start < from {
            start += step;
        }
        if start > last {
            return Ok(RangeInput {
                series: Vec::new(),
                range,
                offset,
                at,
            });
        }
        let n = ((last - start) / step + 1) as usize;
        let inner = self.at_steps(start, step, n);
        let series = match inner.eval(&sq.expr)? {
            Val::Vector(v) => v
                .into_iter()
                .map(|s| {
                    let pts: Points = s
                        .vals
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| v.map(|v| (inner.t(i), v)))
                        .collect();
                    (s.labels, pts)
                })
                .filter(|(_, p): &(Labels, Points)| !p.is_empty())
                .collect(),
            Val::Scalar(v) => vec![(
                Vec::new(),
                v.iter()
                    .enumerate()
                    .map(|(i, v)| (inner.t(i), *v))
                    .collect(),
            )],
            Val::String(_) => {
                return Err(QueryError::BadData(
                    "subquery is only allowed on instant vector".into(),
                ))
            }
        };
        Ok(RangeInput {
            series,
            range,
            offset,
            at,
        })
    }

    /// `f` over each step's window `[t − offset − range, t − offset]` of
    /// every series of `input`; `f` gets the window, the step's
    /// evaluation time and the step's index. Series without a value at
    /// any step are left out.
    pub(crate) fn over_windows(
        &self,
        input: &RangeInput,
        mut f: impl FnMut(&[(i64, f64)], i64, usize) -> Option<f64>,
    ) -> Result<Vec<(usize, StepValues)>, QueryError> {
        let mut out = Vec::new();
        for (k, (_, pts)) in input.series.iter().enumerate() {
            self.model.budget.check()?;
            let vals = match input.at {
                Some(t) => {
                    let end = t - input.offset;
                    let w = window(pts, end - input.range, end);
                    let v = if w.is_empty() { None } else { f(w, t, 0) };
                    vec![v; self.n]
                }
                None => {
                    let mut vals = Vec::with_capacity(self.n);
                    let (mut lo, mut hi) = (0usize, 0usize);
                    for i in 0..self.n {
                        let t = self.t(i);
                        let end = t - input.offset;
                        while lo < pts.len() && pts[lo].0 < end - input.range {
                            lo += 1;
                        }
                        hi = hi.max(lo);
                        while hi < pts.len() && pts[hi].0 <= end {
                            hi += 1;
                        }
                        let w = &pts[lo..hi];
                        vals.push(if w.is_empty() { None } else { f(w, t, i) });
                    }
                    vals
                }
            };
            if vals.iter().any(Option::is_some) {
                self.model.budget.samples(self.n)?;
                out.push((k, vals));
            }
        }
        Ok(out)
    }

    /// At each step, whether `input` has any point in the step's window.
    pub(crate) fn any_in_windows(&self, input: &RangeInput) -> Vec<bool> {
        let mut any = vec![false; self.n];
        for (_, pts) in &input.series {
            for (i, a) in any.iter_mut().enumerate() {
                if *a {
                    continue;
                }
                let t = input.at.unwrap_or_else(|| self.t(i));
                let end = t - input.offset;
                *a = !window(pts, end - input.range, end).is_empty();
            }
        }
        any
    }
}
