//! The series model: the series `/metrics` exports, with its names and
//! labels, backed by the stored samples instead of the live state.
//!
//! - `flopwatch_ofu_ratio`, `flopwatch_ofu_tensor_active_ratio` and
//!   `flopwatch_ofu_sm_clock_hertz` per GPU, from the stored OFU samples.
//! - one family per catalog metric per GPU (`flopwatch_gpu_…`) and per node
//!   device (`flopwatch_device_…`), from the raw series, in the family's
//!   base unit ([`crate::series::family`]: the stored value × `scale`).
//!
//! Labels are [`crate::series::gpu_labels`]' and
//! [`crate::series::device_labels`]'. Job labels (`job_id`, `pod`, …):
//! a GPU sample carries those of the job whose stored record covers its
//! time (`first_seen_ms ≤ t ≤ last_seen_ms`; the latest started wins where
//! two overlap), none outside every job. So a GPU's series changes its
//! label set when its job changes, as a relabelled target's does in
//! Prometheus: one series per (GPU, family, job), each holding only the
//! samples of its job's time.
//!
//! `flopwatch_node_ofu_ratio` (`tenant`, `node`, `hostname`),
//! `flopwatch_job_ofu_ratio` and `flopwatch_job_gpus` (`tenant`,
//! `job_id`) are derived from their GPUs' OFU series ([`derived`]): at a
//! time `t`, the exact mean (or the number) of the newest values of the
//! GPUs whose newest sample at or before `t` is still current. An instant
//! selector reads them at its step's time itself; range functions read
//! their points, one at each sample time of their GPUs. A job's GPU counts
//! over its job's time only (the spans of its `job_id` series).
//!
//! A sample is current until its series goes stale
//! ([`crate::staleness`], by its window) or the same stored series goes
//! on under other labels (the GPU's job changed): [`Model::timeline`].
//! With `staleness` off, for the whole lookback delta.

use super::budget::Budget;
use super::derived::{self, Across};
use super::minute_steps::InOrder;
use super::points::{newest_at, window, Points, Timeline};

/// A series' sample (time and value) at each of a query's times.
pub(super) use super::minute_steps::StepSamples;

/// A query's step times (ascending), and whether every one lies on a
/// whole minute (checked once per query, not per series).
pub(super) struct StepTimes {
    pub(super) at: Vec<i64>,
    on_minutes: bool,
}

impl StepTimes {
    pub(super) fn new(at: Vec<i64>) -> Self {
        let on_minutes = at.iter().all(|t| t.rem_euclid(MINUTE_MS) == 0);
        Self { at, on_minutes }
    }
}

/// One minute of [`Model::at_minutes`]: its newest sample, the last
/// instant that sample is current, and the value of a sample on the
/// minute's start (when one is there).
#[derive(Clone, Copy)]
struct Minute {
    ts: i64,
    v: f64,
    until: i64,
    start: f64,
}

impl Minute {
    const EMPTY: Self = Self {
        ts: i64::MIN,
        v: f64::NAN,
        until: i64::MIN,
        start: f64::NAN,
    };
}
use super::{QueryError, LOOKBACK_MS};
use crate::auth::Scope;
use crate::series::Labels;
use crate::store::{LastsPiece, OfuPiece, Reader, Store, MINUTE_MS};
use promql_parser::label::Matcher;

/// Which column of a GPU's OFU samples a series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OfuCol {
    Ofu,
    Tensor,
    Clock,
}

/// Where a series' samples are stored.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Source {
    Ofu {
        tenant: String,
        gpu: String,
        col: OfuCol,
    },
    Raw {
        tenant: String,
        key: String,
        metric: String,
        scale: f64,
    },
    /// A node's or job's series, from its GPUs' OFU series (`members`,
    /// each with its spans).
    Across { members: Vec<SeriesRef>, op: Across },
    /// A peer's series, read before evaluation ([`super::peers`]).
    Loaded(std::sync::Arc<Timeline>),
    /// One label set's parts on several collectors (or a GPU's series of
    /// several jobs): their points merged, one per timestamp.
    Union(Vec<SeriesRef>),
    /// A ledger counter of one job on one GPU ([`crate::ledger`]): its
    /// figure since the job's first sample, at the end of each minute.
    Ledger {
        tenant: String,
        job: Box<crate::store::JobRecord>,
        col: LedgerCol,
        /// The GPU's dense FP16 tensor peak, FLOP/s (0: not in the table).
        peak_flops: f64,
    },
}

/// Which figure a ledger counter series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LedgerCol {
    Held,
    Idle,
    Delivered,
    Unused,
    Energy,
}

impl LedgerCol {
    /// The series' value from a holding's figures.
    fn value(self, f: &crate::ledger::Figures, peak_flops: f64) -> f64 {
        match self {
            LedgerCol::Held => f.held_ms / 1000.0,
            LedgerCol::Idle => f.idle_ms / 1000.0,
            LedgerCol::Delivered => f.ofu_ms / 1000.0 * peak_flops,
            LedgerCol::Unused => (f.held_ms - f.ofu_ms).max(0.0) / 1000.0 * peak_flops,
            LedgerCol::Energy => f.energy_j,
        }
    }
}

/// One series: its labels, where its samples are, and the time spans
/// (`[from, to)`) whose samples are its own (job attribution).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SeriesRef {
    /// Sorted by name, `__name__` included.
    pub labels: Labels,
    pub source: Source,
    pub spans: Vec<(i64, i64)>,
}

/// A matcher of a selector: `name op value` on one label (absent = "").
pub(super) fn matches(m: &[Matcher], labels: &Labels) -> bool {
    m.iter().all(|m| {
        let v = labels
            .iter()
            .find(|(k, _)| *k == m.name)
            .map_or("", |(_, v)| v.as_str());
        m.is_match(v)
    })
}

/// The series visible to a scope ([`super::select`] finds them).
#[derive(Clone, Copy)]
pub(super) struct Model<'a> {
    pub store: &'a Store,
    /// Where the series' samples are read: one view shared by the reads of
    /// many series ([`Model::reading`]), or a view per read.
    pub reader: Option<&'a Reader<'a>>,
    pub scope: &'a Scope,
    /// Counts the series selected and samples read.
    pub budget: &'a Budget,
    /// The peers' series, in a cluster.
    pub remote: Option<&'a super::peers::Remote>,
    /// Stored series only, no derived ones (a peer's answer).
    pub base_only: bool,
    /// The GPU spec table: the peaks the ledger's FLOP counters use.
    pub specs: Option<&'a flopwatch_config::SpecTable>,
    /// Series go stale three windows and 10 s after their last sample
    /// ([`crate::staleness`]); off: each sample is current for the
    /// lookback delta.
    pub staleness: bool,
}

impl Model<'_> {
    /// `f` with this model reading every series under one view of the
    /// store: a reading thread's group of series.
    pub(super) fn reading<R>(&self, f: impl FnOnce(&Model<'_>) -> R) -> Result<R, QueryError> {
        if self.reader.is_some() {
            return Ok(f(self));
        }
        Ok(self.store.reading(|r| {
            f(&Model {
                reader: Some(r),
                ..*self
            })
        })?)
    }

    /// The samples of `s` with `from ≤ t ≤ to`, in time order, in the
    /// family's unit.
    pub(super) fn samples(&self, s: &SeriesRef, from: i64, to: i64) -> Result<Points, QueryError> {
        Ok(super::points::points(&self.timeline(s, from, to)?))
    }

    /// The last instant a sample at `ts` sampled over `window_ms` is
    /// current.
    fn current_until(&self, ts: i64, window_ms: Option<u32>) -> i64 {
        ts.saturating_add(self.stays_current(window_ms))
    }

    /// How long after its time a sample sampled over `window_ms` stays
    /// current.
    fn stays_current(&self, window_ms: Option<u32>) -> i64 {
        let w = window_ms.filter(|_| self.staleness);
        crate::staleness::stale_after_ms(w).min(LOOKBACK_MS)
    }

    /// [`Model::samples`], each with the last instant it is current.
    pub(super) fn timeline(
        &self,
        s: &SeriesRef,
        from: i64,
        to: i64,
    ) -> Result<Timeline, QueryError> {
        self.budget.check()?;
        match &s.source {
            Source::Across { members, op } => {
                // Range functions read a derived series' points; an
                // instant selector computes it at its time instead.
                return Ok(self
                    .across(members, *op, from, to)?
                    .into_iter()
                    .map(|(t, v)| (t, v, t + LOOKBACK_MS))
                    .collect());
            }
            Source::Loaded(pts) => {
                let w = window(pts, from, to).to_vec();
                self.budget.samples(w.len())?;
                return Ok(w);
            }
            Source::Ledger {
                tenant,
                job,
                col,
                peak_flops,
            } => {
                let pts = crate::ledger::cumulative(self.store, tenant, job, from, to)?;
                self.budget.samples(pts.len())?;
                return Ok(pts
                    .into_iter()
                    .map(|(t, f)| (t, col.value(&f, *peak_flops), t + LOOKBACK_MS))
                    .collect());
            }
            Source::Union(parts) => {
                let mut out = Vec::new();
                for p in parts {
                    out.extend(self.timeline(p, from, to)?);
                }
                // A point stored on two collectors counts once.
                out.sort_by_key(|p| p.0);
                out.dedup_by_key(|p| p.0);
                return Ok(out);
            }
            _ => {}
        }
        let mut out: Timeline = Vec::new();
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            let first = out.len();
            match &s.source {
                Source::Ofu { tenant, gpu, col } => {
                    self.store
                        .ofu_in(self.reader, tenant, gpu, lo, hi, None, &mut |x| {
                            out.push((
                                x.ts_ms,
                                ofu_column(*col, x.ofu, x.tensor_active, x.sm_clock_mhz),
                                self.current_until(x.ts_ms, Some(x.window_ms)),
                            ));
                        })?;
                }
                Source::Raw {
                    tenant,
                    key,
                    metric,
                    scale,
                } => {
                    for p in self.store.series_in(
                        self.reader,
                        tenant,
                        key,
                        metric,
                        lo,
                        hi,
                        usize::MAX,
                    )? {
                        out.push((
                            p.ts_ms,
                            p.value * scale,
                            self.current_until(p.ts_ms, p.window_ms),
                        ));
                    }
                }
                Source::Across { .. }
                | Source::Loaded(_)
                | Source::Union(_)
                | Source::Ledger { .. } => {
                    unreachable!("answered above")
                }
            }
            // Only a span with samples that ends inside the range can be
            // cut short by its successor (past `to` nothing reads it).
            if out.len() > first && b <= to {
                if let Some(next) = self.relabelled_at(s, b, to)? {
                    for p in &mut out[first..] {
                        p.2 = p.2.min(next - 1);
                    }
                }
            }
        }
        self.budget.samples(out.len())?;
        out.sort_by_key(|p| p.0);
        Ok(out)
    }

    /// When the stored series under `s` goes on under other labels after
    /// `s`'s span ending at `end` (its GPU changed jobs, or its job ended):
    /// the time of its first sample in `[end, min(end + lookback, until)]`. A series
    /// ends where its relabelled successor begins, as a scraped series
    /// whose target's labels change gets its staleness marker at that
    /// scrape.
    fn relabelled_at(
        &self,
        s: &SeriesRef,
        end: i64,
        until: i64,
    ) -> Result<Option<i64>, QueryError> {
        if end == i64::MAX || !self.staleness {
            return Ok(None);
        }
        // A successor past `until` (the last instant read) changes nothing.
        let to = end.saturating_add(LOOKBACK_MS).min(until.saturating_add(1));
        Ok(match &s.source {
            Source::Ofu { tenant, gpu, .. } => {
                let mut next = None;
                self.store
                    .ofu_in(self.reader, tenant, gpu, end, to, None, &mut |x| {
                        next = Some(next.map_or(x.ts_ms, |n: i64| n.min(x.ts_ms)));
                    })?;
                next
            }
            Source::Raw {
                tenant,
                key,
                metric,
                ..
            } => self
                .store
                .series_in(self.reader, tenant, key, metric, end, to, 1)?
                .first()
                .map(|p| p.ts_ms),
            _ => None,
        })
    }

    /// A derived series' points with `from ≤ t ≤ to` ([`derived::points`]).
    fn across(
        &self,
        members: &[SeriesRef],
        op: Across,
        from: i64,
        to: i64,
    ) -> Result<Points, QueryError> {
        let lists = members
            .iter()
            .map(|m| self.timeline(m, from.saturating_sub(LOOKBACK_MS), to))
            .collect::<Result<Vec<_>, _>>()?;
        let out = derived::points(&lists, op, from, to);
        self.budget.samples(out.len())?;
        Ok(out)
    }

    /// The sample of `s` an instant selector takes at each of `times`
    /// (ascending): the newest at or before `t` while it is current
    /// ([`super::points`]), read from the samples in `[from, to]`; for a
    /// derived series, its value at `t` itself ([`derived::at_times`]).
    pub(super) fn at_times(
        &self,
        s: &SeriesRef,
        steps: &StepTimes,
        from: i64,
        to: i64,
    ) -> Result<StepSamples, QueryError> {
        let times = steps.at.as_slice();
        if let Source::Across { members, op } = &s.source {
            let lists = members
                .iter()
                .map(|m| self.timeline(m, from, to))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(derived::at_times(&lists, *op, times));
        }
        if self.nothing_in(s, from, to) {
            return Ok(vec![None; times.len()]);
        }
        if steps.on_minutes {
            if let Some(v) = self.at_minutes(s, times, from, to)? {
                return Ok(v);
            }
        }
        let pts = self.timeline(s, from, to)?;
        let mut j = 0;
        Ok(times.iter().map(|&t| newest_at(&pts, t, &mut j)).collect())
    }

    /// Whether `s` has, for certain, no sample of its own in `[from, to]`:
    /// a GPU's series under an owner it did not have in the range (the
    /// common case of a fleet-wide selector: each GPU's series without
    /// its job). Nothing is read to tell.
    pub(super) fn nothing_in(&self, s: &SeriesRef, from: i64, to: i64) -> bool {
        matches!(s.source, Source::Ofu { .. } | Source::Raw { .. })
            && s.spans
                .iter()
                .all(|&(a, b)| a.max(from) >= b.min(to.saturating_add(1)))
    }

    /// [`Model::at_times`] of an OFU ratio series at times on whole
    /// minutes, from the sealed hours' minute lasts ([`Store::ofu_lasts`]):
    /// the newest sample at or before `t` is the sample on `t` if there is
    /// one, else the last of the minutes (and samples) before `t`. `None`
    /// for other times or another column.
    ///
    /// [`Store::ofu_lasts`]: crate::store::Store::ofu_lasts
    fn at_minutes(
        &self,
        s: &SeriesRef,
        times: &[i64],
        from: i64,
        to: i64,
    ) -> Result<Option<StepSamples>, QueryError> {
        let Source::Ofu {
            tenant,
            gpu,
            col: OfuCol::Ofu,
        } = &s.source
        else {
            return Ok(None);
        };
        self.budget.check()?;
        // Per minute of the range: its newest sample (time, value, last
        // instant current), and the value of a sample on its start (where
        // the minute's bit in `has_start` is set).
        // Reads run to the end of the last step's minute: its later
        // samples set only that minute's newest, which no step reads (a
        // step reads its own minute's sample on the start, and the newest
        // of the minutes before), and a minute wholly inside the read
        // comes from the minute lasts instead of its hour's chunk.
        let minute_end = (to.div_euclid(MINUTE_MS) + 1).saturating_mul(MINUTE_MS);
        // The series' samples lie in its spans: the minutes kept are those
        // from the first span's start in the range to the last one's end
        // (a GPU's series without its job often holds only the lookback
        // before its job began).
        let (lo_all, hi_all) = s
            .spans
            .iter()
            .filter(|&&(a, b)| a.max(from) < b.min(to.saturating_add(1)))
            .fold((i64::MAX, i64::MIN), |(l, h), &(a, b)| {
                (l.min(a.max(from)), h.max(b.min(minute_end)))
            });
        if lo_all >= hi_all {
            return Ok(Some(vec![None; times.len()]));
        }
        if let Some(v) = self.minutes_in_order(s, tenant, gpu, times, from, to, minute_end)? {
            return Ok(Some(v));
        }
        // Minutes handed over out of order (a sealed hour reopened by late
        // samples): a slot per minute, filled in any order.
        let m0 = lo_all.div_euclid(MINUTE_MS) * MINUTE_MS;
        let n = usize::try_from((hi_all - 1 - m0) / MINUTE_MS + 1).unwrap_or(0);
        let mut minutes: Vec<Minute> = vec![Minute::EMPTY; n];
        let mut has_start: Vec<u64> = vec![0; n.div_ceil(64)];
        let mut read = 0usize;
        let slot = |ts: i64| usize::try_from((ts - m0).div_euclid(MINUTE_MS)).ok();
        for &(a, b) in &s.spans {
            if a.max(from) >= b.min(to.saturating_add(1)) {
                continue;
            }
            let (lo, hi) = (a.max(from), b.min(minute_end));
            // The minutes this span set lie in `set` (their newest came
            // from it).
            let mut set = (usize::MAX, 0usize);
            let mut put = |i: usize, last: (i64, f64), window: Option<u32>, start: Option<f64>| {
                let Some(m) = minutes.get_mut(i) else {
                    return;
                };
                if last.0 >= m.ts {
                    *m = Minute {
                        ts: last.0,
                        v: last.1,
                        until: self.current_until(last.0, window),
                        start: m.start,
                    };
                    set = (set.0.min(i), set.1.max(i + 1));
                }
                if let Some(v) = start {
                    m.start = v;
                    has_start[i / 64] |= 1 << (i % 64);
                }
            };
            self.store
                .ofu_lasts_in(self.reader, tenant, gpu, lo, hi, &mut |p| match p {
                    LastsPiece::Sample(x) => {
                        read += 1;
                        let on = (x.ts_ms.rem_euclid(MINUTE_MS) == 0).then_some(x.ofu);
                        if let Some(i) = slot(x.ts_ms) {
                            put(i, (x.ts_ms, x.ofu), Some(x.window_ms), on);
                        }
                    }
                    LastsPiece::Hour(h) => {
                        read += h.len();
                        // The hour's first minute, in slots (before the
                        // range's first minute where the range starts inside
                        // the hour: those minutes are not handed over).
                        let first = (h.hour() - m0).div_euclid(MINUTE_MS);
                        h.for_each(|m| {
                            let k = (m.minute - h.hour()) / MINUTE_MS;
                            if let Ok(i) = usize::try_from(first + k) {
                                put(i, m.last, m.window_ms, m.at_start);
                            }
                        });
                    }
                })?;
            // A span that ends inside the range ends where its successor
            // under other labels begins.
            if set.0 < set.1 && b <= to {
                if let Some(next) = self.relabelled_at(s, b, to)? {
                    for m in &mut minutes[set.0..set.1] {
                        if (lo..hi).contains(&m.ts) {
                            m.until = m.until.min(next - 1);
                        }
                    }
                }
            }
        }
        self.budget.samples(read)?;
        let mut out = Vec::with_capacity(times.len());
        // The newest sample of the minutes before the one at `t`: the
        // last minute before it with one (a minute's samples lie in it).
        let (mut before, mut upto) = (None::<&Minute>, 0usize);
        for &t in times {
            // Before the first minute kept, the series has no sample.
            if t < m0 {
                out.push(None);
                continue;
            }
            // `t` lies on a whole minute at or after `m0`.
            let i = ((t - m0) as u64 / MINUTE_MS as u64).min(n as u64) as usize;
            while upto < i {
                let m = &minutes[upto];
                if m.ts != i64::MIN {
                    before = Some(m);
                }
                upto += 1;
            }
            out.push(if i < n && has_start[i / 64] & (1 << (i % 64)) != 0 {
                Some((t, minutes[i].start))
            } else {
                before.filter(|b| t <= b.until).map(|b| (b.ts, b.v))
            });
        }
        Ok(Some(out))
    }

    /// [`Model::at_minutes`] in one pass over the minutes
    /// ([`InOrder`]): each span's sealed hours come in time order, and
    /// its samples (hours not sealed, or sealed before minute lasts were
    /// kept), sorted, after them. `None` where a sample lies before a
    /// minute already handed over; the caller then fills a slot per
    /// minute.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn minutes_in_order(
        &self,
        s: &SeriesRef,
        tenant: &str,
        gpu: &str,
        times: &[i64],
        from: i64,
        to: i64,
        minute_end: i64,
    ) -> Result<Option<StepSamples>, QueryError> {
        let mut steps = InOrder::new(times);
        let mut read = 0usize;
        let mut samples: Vec<(i64, f64, i64)> = Vec::new();
        let mut order = Ok(());
        for &(a, b) in &s.spans {
            if a.max(from) >= b.min(to.saturating_add(1)) {
                continue;
            }
            let (lo, hi) = (a.max(from), b.min(minute_end));
            // A span that ends inside the range ends where its successor
            // under other labels begins.
            let cut = match b <= to {
                true => self.relabelled_at(s, b, to)?.map_or(i64::MAX, |n| n - 1),
                false => i64::MAX,
            };
            let stays = |window: Option<u32>| self.stays_current(window);
            let until = |ts: i64, window: Option<u32>| ts.saturating_add(stays(window)).min(cut);
            samples.clear();
            self.store
                .ofu_lasts_in(self.reader, tenant, gpu, lo, hi, &mut |p| match p {
                    LastsPiece::Sample(x) => {
                        read += 1;
                        samples.push((x.ts_ms, x.ofu, until(x.ts_ms, Some(x.window_ms))));
                    }
                    LastsPiece::Hour(h) => {
                        read += h.len();
                        if order.is_ok() {
                            order = steps.put_hour(&h, stays, cut);
                        }
                    }
                })?;
            samples.sort_by_key(|p| p.0);
            for &(t, v, until) in &samples {
                if order.is_ok() {
                    order = steps.sample(t, v, until);
                }
            }
            if order.is_err() {
                break;
            }
        }
        self.budget.samples(read)?;
        Ok(order.ok().map(|()| steps.finish()))
    }

    /// The pieces of an OFU ratio series `s` with `from ≤ t ≤ to`, in
    /// time order, for the windowed aggregates: sealed minutes (and hours,
    /// with `hours`) lying wholly inside the range and a job span as
    /// [`Piece::Bucket`]s, the rest as samples. `None` where the rollups
    /// cannot answer: another column (the rollups keep min and max of OFU
    /// only), or a bucket rolled up before the store kept unweighted sums
    /// and first samples.
    pub(super) fn ofu_buckets(
        &self,
        s: &SeriesRef,
        from: i64,
        to: i64,
        hours: bool,
    ) -> Result<Option<Vec<Piece>>, QueryError> {
        self.budget.check()?;
        let Source::Ofu {
            tenant,
            gpu,
            col: OfuCol::Ofu,
        } = &s.source
        else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let mut known = true;
        let mut take = |p: OfuPiece| match p {
            OfuPiece::Sample(x) => out.push(Piece::Sample(x.ts_ms, x.ofu)),
            OfuPiece::Agg {
                ts_ms, agg, first, ..
            } => match (agg.plain_sum(), first) {
                (Some(sum), Some(first)) => out.push(Piece::Bucket {
                    ts: ts_ms,
                    count: agg.count,
                    sum,
                    min: agg.min(),
                    max: agg.max(),
                    first,
                }),
                _ => known = false,
            },
        };
        // Buckets start on whole minutes: the partial minutes at a span's
        // ends are read as samples, and buckets of the rest align with
        // the windows (minutes only, unless `hours`).
        let grain = if hours { 0 } else { MINUTE_MS };
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            let mid_lo = lo.div_euclid(MINUTE_MS) * MINUTE_MS
                + MINUTE_MS * i64::from(lo.rem_euclid(MINUTE_MS) != 0);
            let mid_hi = hi.div_euclid(MINUTE_MS) * MINUTE_MS;
            if mid_lo >= mid_hi {
                self.store
                    .ofu_pieces(tenant, gpu, lo, hi, None, None, &mut take)?;
                continue;
            }
            self.store
                .ofu_pieces(tenant, gpu, lo, mid_lo, None, None, &mut take)?;
            self.store
                .ofu_pieces(tenant, gpu, mid_lo, mid_hi, None, Some(grain), &mut take)?;
            self.store
                .ofu_pieces(tenant, gpu, mid_hi, hi, None, None, &mut take)?;
        }
        if !known {
            return Ok(None);
        }
        self.budget.samples(out.len())?;
        out.sort_by_key(Piece::ts);
        Ok(Some(out))
    }

    /// Whether `s` has a sample in `[from, to]`.
    pub(super) fn has_samples(
        &self,
        s: &SeriesRef,
        from: i64,
        to: i64,
    ) -> Result<bool, QueryError> {
        self.budget.check()?;
        match &s.source {
            Source::Across { members: parts, .. } | Source::Union(parts) => {
                for m in parts {
                    if self.has_samples(m, from, to)? {
                        return Ok(true);
                    }
                }
                return Ok(false);
            }
            Source::Loaded(pts) => return Ok(!window(pts, from, to).is_empty()),
            Source::Ledger { .. } => return Ok(!self.timeline(s, from, to)?.is_empty()),
            _ => {}
        }
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            let found = match &s.source {
                Source::Ofu { tenant, gpu, .. } => {
                    let mut any = false;
                    self.store
                        .ofu_pieces(tenant, gpu, lo, hi, None, Some(0), &mut |p| {
                            any |= match p {
                                OfuPiece::Sample(_) => true,
                                OfuPiece::Agg { agg, .. } => agg.count > 0,
                            }
                        })?;
                    any
                }
                Source::Raw {
                    tenant,
                    key,
                    metric,
                    ..
                } => !self
                    .store
                    .series(tenant, key, metric, lo, hi, 1)?
                    .is_empty(),
                Source::Across { .. }
                | Source::Loaded(_)
                | Source::Union(_)
                | Source::Ledger { .. } => {
                    unreachable!("answered above")
                }
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A piece of an OFU ratio series, for the windowed aggregates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Piece {
    /// One sample: time and value.
    Sample(i64, f64),
    /// A sealed minute or hour starting at `ts`: its samples' count,
    /// unweighted sum, min and max, and its first sample.
    Bucket {
        ts: i64,
        count: u64,
        sum: f64,
        min: f64,
        max: f64,
        first: (i64, f64),
    },
}

impl Piece {
    pub(super) fn ts(&self) -> i64 {
        match *self {
            Self::Sample(ts, _) | Self::Bucket { ts, .. } => ts,
        }
    }
}

/// A column of an OFU sample or aggregate, in the family's unit.
pub(super) fn ofu_column(col: OfuCol, ofu: f64, tensor_active: f64, sm_clock_mhz: f64) -> f64 {
    match col {
        OfuCol::Ofu => ofu,
        OfuCol::Tensor => tensor_active,
        OfuCol::Clock => sm_clock_mhz * 1e6,
    }
}
