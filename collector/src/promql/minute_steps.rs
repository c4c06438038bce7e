//! An instant selector's samples at steps on whole minutes, built in one
//! pass from a series' minutes handed over in time order: what
//! [`super::model::Model::at_minutes`] does without a slot per minute
//! when the store hands its minutes over in order (sealed hours' minute
//! lasts, then the few samples of unsealed hours).
//!
//! The sample a step at `t` (on a whole minute) takes is the one on `t`
//! if there is one, else the newest of the minutes before `t` while it is
//! current. So each minute, once no later piece can change it, settles
//! the steps up to its own start and becomes the newest for the steps
//! after it.

use crate::store::{HourLasts, WholeHour, MINUTE_MS};

/// A series' sample (time and value) at each of a query's steps.
pub(super) type StepSamples = Vec<Option<(i64, f64)>>;

/// A minute's newest sample (time, value, last instant current) and the
/// value of a sample on its start.
#[derive(Clone, Copy)]
struct Minute {
    start_ms: i64,
    last: (i64, f64, i64),
    on_start: Option<f64>,
}

/// The steps' samples, built from minutes in time order.
pub(super) struct InOrder<'t> {
    times: &'t [i64],
    /// A sample per step answered so far (its length is the next step to
    /// answer): filled in step order, so nothing is written twice.
    out: StepSamples,
    /// The minute pieces still arrive for.
    open: Option<Minute>,
    /// The newest sample of the minutes settled.
    newest: Option<(i64, f64, i64)>,
    /// The start of the last minute settled: no piece may come for it or
    /// an earlier one.
    floor: i64,
}

/// The steps of `times` not yet answered (from `out.len()` on) that lie
/// at or before `t` take `newest` while it is current (time, value, last
/// instant current; none when the time is `i64::MAX`), a step on `t`
/// itself the sample on `t` where there is one (`on_t`).
#[inline(always)]
fn settle_to(
    times: &[i64],
    out: &mut StepSamples,
    (nt, nv, nu): (i64, f64, i64),
    t: i64,
    on_t: Option<f64>,
) {
    while let Some(&s) = times.get(out.len()) {
        if s > t {
            break;
        }
        out.push(match on_t {
            Some(v) if s == t => Some((t, v)),
            _ => (nt <= s && s <= nu).then_some((nt, nv)),
        });
    }
}

/// No newest sample: never current.
const NONE: (i64, f64, i64) = (i64::MAX, 0.0, i64::MIN);

/// A piece arrived for a minute before one already settled: the minutes
/// were not handed over in order.
#[derive(Debug, PartialEq)]
pub(super) struct OutOfOrder;

impl<'t> InOrder<'t> {
    /// For steps at `times` (ascending, each on a whole minute).
    pub(super) fn new(times: &'t [i64]) -> Self {
        Self {
            times,
            out: Vec::with_capacity(times.len()),
            open: None,
            newest: None,
            floor: i64::MIN,
        }
    }

    /// A sample (time, value, last instant current) of the minute
    /// starting at `start_ms`, which is that minute's newest if no later
    /// piece of it is newer; `on_start`: the value of a sample on the
    /// minute's start.
    pub(super) fn put(
        &mut self,
        start_ms: i64,
        last: (i64, f64, i64),
        on_start: Option<f64>,
    ) -> Result<(), OutOfOrder> {
        match &mut self.open {
            Some(m) if m.start_ms == start_ms => {
                if last.0 >= m.last.0 {
                    m.last = last;
                }
                if on_start.is_some() {
                    m.on_start = on_start;
                }
                return Ok(());
            }
            Some(m) if m.start_ms > start_ms => return Err(OutOfOrder),
            None if start_ms <= self.floor => return Err(OutOfOrder),
            _ => {}
        }
        self.settle();
        self.open = Some(Minute {
            start_ms,
            last,
            on_start,
        });
        Ok(())
    }

    /// The minutes of a sealed hour ([`HourLasts`]), each as
    /// [`InOrder::put`] takes it, current for `stays(window)` ms after
    /// its time (`None`: window not recorded) and never after `cut`:
    /// settled as they come. An hour handed over whole (nearly every one)
    /// is walked entry by entry in one loop whose state lives in
    /// registers.
    pub(super) fn put_hour(
        &mut self,
        h: &HourLasts<'_>,
        stays: impl Fn(Option<u32>) -> i64,
        cut: i64,
    ) -> Result<(), OutOfOrder> {
        let hour = h.hour();
        // An hour after every minute so far, handed over whole, takes the
        // one loop; any other the checks of `put`, minute by minute.
        let after = self.open.is_none_or(|m| m.start_ms < hour) && hour > self.floor;
        let Some(x) = h.whole().filter(|_| after) else {
            let until = |t: i64, w: Option<u32>| t.saturating_add(stays(w)).min(cut);
            let mut r = Ok(());
            h.for_each(|m| {
                if r.is_ok() {
                    let (t, v) = m.last;
                    r = self.put(m.minute, (t, v, until(t, m.window_ms)), m.at_start);
                }
            });
            return r;
        };
        self.settle();
        let times = self.times;
        let out = &mut self.out;
        let (mut nt, mut nv, mut nu) = self.newest.unwrap_or(NONE);
        // A window's staleness, kept for the next minute's (one window
        // per series, nearly always).
        let (mut seen, mut stay) = (None, 0i64);
        let (mut bits, mut last_minute) = (x.have, None);
        let (mut entries, mut starts) = (x.entries.iter(), x.starts.iter());
        while bits != 0 {
            let m = bits.trailing_zeros();
            bits &= bits - 1;
            let Some(e) = entries.next() else { break };
            let minute = hour + i64::from(m) * MINUTE_MS;
            let on = match x.on_start >> m & 1 != 0 {
                true => starts.next().map(|s| f64::from_le_bytes(*s)),
                false => None,
            };
            settle_to(times, out, (nt, nv, nu), minute, on);
            let (off, v, w) = WholeHour::entry(e);
            if seen != Some(w) {
                (seen, stay) = (Some(w), stays(Some(w)));
            }
            nt = hour + i64::from(off);
            nv = v;
            nu = nt.saturating_add(stay).min(cut);
            last_minute = Some(minute);
        }
        if let Some(m) = last_minute {
            self.newest = Some((nt, nv, nu));
            self.floor = m;
        }
        Ok(())
    }

    /// A sample at `ts` (value `v`, current until `until`).
    pub(super) fn sample(&mut self, ts: i64, v: f64, until: i64) -> Result<(), OutOfOrder> {
        let start = ts.div_euclid(MINUTE_MS) * MINUTE_MS;
        self.put(start, (ts, v, until), (ts == start).then_some(v))
    }

    /// Settles the open minute: the steps before it take the newest
    /// sample so far, a step on its start its sample there (or that
    /// newest), and it becomes the newest.
    fn settle(&mut self) {
        let Some(m) = self.open.take() else {
            return;
        };
        let newest = self.newest.unwrap_or(NONE);
        settle_to(self.times, &mut self.out, newest, m.start_ms, m.on_start);
        self.newest = Some(m.last);
        self.floor = m.start_ms;
    }

    /// The samples at every step.
    pub(super) fn finish(mut self) -> StepSamples {
        self.settle();
        let newest = self.newest.unwrap_or(NONE);
        settle_to(self.times, &mut self.out, newest, i64::MAX, None);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The steps' samples by their definition: for each step, the sample
    /// on it, else the newest before it while current.
    fn by_definition(samples: &[(i64, f64, i64)], times: &[i64]) -> StepSamples {
        times
            .iter()
            .map(|&t| {
                if let Some(s) = samples.iter().rev().find(|s| s.0 == t) {
                    return Some((t, s.1));
                }
                samples
                    .iter()
                    .filter(|s| s.0 < t)
                    .max_by_key(|s| s.0)
                    .filter(|s| t <= s.2)
                    .map(|s| (s.0, s.1))
            })
            .collect()
    }

    #[test]
    fn a_step_takes_the_sample_on_it_or_the_newest_before_while_current() {
        let times: Vec<i64> = (0..5).map(|i| i * MINUTE_MS).collect();
        let mut b = InOrder::new(&times);
        // Minute 0: on its start and later; minute 2: one sample, stale
        // before the step at minute 4.
        b.sample(0, 1.0, 100_000).unwrap();
        b.sample(30_000, 2.0, 100_000).unwrap();
        b.sample(150_000, 3.0, 200_000).unwrap();
        assert_eq!(
            b.finish(),
            vec![
                Some((0, 1.0)),
                Some((30_000, 2.0)),
                None,
                Some((150_000, 3.0)),
                None
            ]
        );
    }

    #[test]
    fn a_piece_for_a_settled_minute_is_refused() {
        let times = [0, MINUTE_MS];
        let mut b = InOrder::new(&times);
        b.sample(70_000, 1.0, i64::MAX).unwrap();
        // The same minute still takes pieces, in any order.
        b.sample(61_000, 1.0, i64::MAX).unwrap();
        assert_eq!(b.sample(59_000, 1.0, i64::MAX), Err(OutOfOrder));
    }

    proptest! {
        /// Samples in time order give what the definition gives, at any
        /// steps on whole minutes.
        #[test]
        fn in_order_samples_give_the_steps_the_definition_gives(
            gaps in prop::collection::vec((0i64..150_000, 0i64..400_000), 0..60),
            first_step in -3i64..5,
            every in 1i64..4,
            steps in 1usize..40,
        ) {
            let mut ts = 0i64;
            let mut samples = Vec::new();
            for (k, (gap, current)) in gaps.into_iter().enumerate() {
                // Some samples fall on a minute's start.
                ts += if k % 5 == 0 { MINUTE_MS - ts.rem_euclid(MINUTE_MS) } else { gap + 1 };
                samples.push((ts, k as f64, ts + current));
            }
            let times: Vec<i64> = (0..steps as i64)
                .map(|i| (first_step + i * every) * MINUTE_MS)
                .collect();
            let mut b = InOrder::new(&times);
            for &(t, v, until) in &samples {
                b.sample(t, v, until).unwrap();
            }
            prop_assert_eq!(b.finish(), by_definition(&samples, &times));
        }
    }
}
