//! The node and job series, derived from their GPUs' OFU series: at a time
//! `t`, the mean (or the number) of the newest values of the GPUs whose
//! newest sample at or before `t` is still current at `t` (not stale,
//! [`super::points`]; at most the lookback delta old, `t − 5m ≤ ts ≤ t`,
//! Prometheus 2.42's closed lookback) — what `avg by (node)
//! (flopwatch_ofu_ratio)` answers at `t`. A GPU whose input stopped
//! leaves its node's and job's value when its series goes stale.
//!
//! The sum is exact: the GPUs' values go into an exact accumulator (xsum)
//! and leave it as GPUs change value or age out, and the mean is the
//! correctly rounded sum divided by the count. So a node's value at a
//! time depends only on its GPUs' values then — never on where the
//! query's range or steps began or in which order samples arrived — and
//! an idle node is exactly 0.

use super::points::{Points, Timeline};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use xsum::{Xsum, XsumSmall};

/// The derived families: a node's OFU, a job's OFU and its GPUs.
pub(super) const NODE_OFU: &str = "flopwatch_node_ofu_ratio";
pub(super) const JOB_OFU: &str = "flopwatch_job_ofu_ratio";
pub(super) const JOB_GPUS: &str = "flopwatch_job_gpus";

/// How a derived series combines its GPUs' newest values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Across {
    Mean,
    Count,
}

/// The members' newest values as time advances.
struct Sweep<'a> {
    lists: &'a [Timeline],
    next: BinaryHeap<Reverse<(i64, usize)>>,
    cursor: Vec<usize>,
    newest: Vec<Option<(i64, f64, i64)>>,
    /// Live members by their newest sample's time.
    live: BTreeSet<(i64, usize)>,
    /// Live members by the last instant their newest sample is current.
    ends: BTreeSet<(i64, usize)>,
    sum: XsumSmall,
    nan: usize,
    pos_inf: usize,
    neg_inf: usize,
}

impl<'a> Sweep<'a> {
    fn new(lists: &'a [Timeline]) -> Self {
        Sweep {
            lists,
            next: lists
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.first().map(|p| Reverse((p.0, i))))
                .collect(),
            cursor: vec![0; lists.len()],
            newest: vec![None; lists.len()],
            live: BTreeSet::new(),
            ends: BTreeSet::new(),
            sum: XsumSmall::new(),
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
        }
    }

    fn account(&mut self, v: f64, sign: f64) {
        if v.is_nan() {
            self.nan = (self.nan as f64 + sign) as usize;
        } else if v == f64::INFINITY {
            self.pos_inf = (self.pos_inf as f64 + sign) as usize;
        } else if v == f64::NEG_INFINITY {
            self.neg_inf = (self.neg_inf as f64 + sign) as usize;
        } else {
            self.sum.add(sign * v);
        }
    }

    fn leave(&mut self, i: usize) {
        if let Some((ts, v, end)) = self.newest[i].take() {
            self.live.remove(&(ts, i));
            self.ends.remove(&(end, i));
            self.account(v, -1.0);
        }
    }

    /// The time of the next member sample, if any.
    fn peek(&self) -> Option<i64> {
        self.next.peek().map(|r| r.0 .0)
    }

    /// The first instant a live member is no longer current, if any.
    fn peek_end(&self) -> Option<i64> {
        self.ends.first().map(|e| e.0.saturating_add(1))
    }

    /// Takes in every member sample at or before `t` and ages out members
    /// whose newest sample is no longer current at `t`.
    fn advance(&mut self, t: i64) {
        while let Some(Reverse((ts, i))) = self.next.peek().copied() {
            if ts > t {
                break;
            }
            self.next.pop();
            let (_, v, end) = self.lists[i][self.cursor[i]];
            self.leave(i);
            self.newest[i] = Some((ts, v, end));
            self.live.insert((ts, i));
            self.ends.insert((end, i));
            self.account(v, 1.0);
            self.cursor[i] += 1;
            if let Some(p) = self.lists[i].get(self.cursor[i]) {
                self.next.push(Reverse((p.0, i)));
            }
        }
        while let Some(&(end, i)) = self.ends.first() {
            if end >= t {
                break;
            }
            self.leave(i);
        }
    }

    /// The derived value now, with the newest live sample's time; `None`
    /// when no member is live.
    fn value(&mut self, op: Across) -> Option<(i64, f64)> {
        let newest = self.live.last()?.0;
        let n = self.live.len() as f64;
        let v = match op {
            Across::Count => n,
            Across::Mean => {
                let total = if self.nan > 0 || (self.pos_inf > 0 && self.neg_inf > 0) {
                    f64::NAN
                } else if self.pos_inf > 0 {
                    f64::INFINITY
                } else if self.neg_inf > 0 {
                    f64::NEG_INFINITY
                } else {
                    // An exact zero is +0.
                    self.sum.sum() + 0.0
                };
                total / n
            }
        };
        Some((newest, v))
    }
}

/// A derived series' points with `from ≤ t ≤ to`: one at each time any
/// member has a sample, and one when a member goes stale while others
/// stay current. `lists` hold each member's samples (those of its spans)
/// from `from − lookback` on.
pub(super) fn points(lists: &[Timeline], op: Across, from: i64, to: i64) -> Points {
    let mut s = Sweep::new(lists);
    let mut out = Vec::new();
    loop {
        let t = match (s.peek(), s.peek_end()) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        if t > to {
            break;
        }
        let sample = s.peek() == Some(t);
        let before = s.live.len();
        s.advance(t);
        // A member going stale changes the value only if others remain;
        // a member's sample always makes a point.
        if t >= from && (sample || s.live.len() != before) {
            if let Some((_, v)) = s.value(op) {
                out.push((t, v));
            }
        }
    }
    out
}

/// The derived value at each of `times` (ascending), with the newest
/// member sample's time.
pub(super) fn at_times(lists: &[Timeline], op: Across, times: &[i64]) -> Vec<Option<(i64, f64)>> {
    let mut s = Sweep::new(lists);
    times
        .iter()
        .map(|&t| {
            s.advance(t);
            s.value(op)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::promql::LOOKBACK_MS;

    /// Samples current for the lookback delta (no staleness known).
    fn timeline(pts: &[(i64, f64)]) -> Timeline {
        pts.iter().map(|&(t, v)| (t, v, t + LOOKBACK_MS)).collect()
    }

    /// Two GPUs: one sampled every second until 10 s, one from 5 s on.
    fn lists() -> Vec<Timeline> {
        vec![
            timeline(
                &(0..=10)
                    .map(|s| (s * 1000, 0.1 * s as f64))
                    .collect::<Vec<_>>(),
            ),
            timeline(&(5..=20).map(|s| (s * 1000, 0.3)).collect::<Vec<_>>()),
        ]
    }

    #[test]
    fn values_do_not_depend_on_where_a_query_starts() {
        let l = lists();
        let all = points(&l, Across::Mean, 0, 20_000);
        for from in [0, 3_000, 7_000, 10_000] {
            let part = points(&l, Across::Mean, from, 20_000);
            let tail: Vec<_> = all.iter().filter(|p| p.0 >= from).copied().collect();
            // Bit for bit.
            assert_eq!(
                part.iter()
                    .map(|p| (p.0, p.1.to_bits()))
                    .collect::<Vec<_>>(),
                tail.iter()
                    .map(|p| (p.0, p.1.to_bits()))
                    .collect::<Vec<_>>()
            );
        }
        let steps: Vec<i64> = (0..=20).map(|s| s * 1000).collect();
        let at = at_times(&l, Across::Mean, &steps);
        for (t, v) in &all {
            let i = (*t / 1000) as usize;
            assert_eq!(at[i].map(|p| p.1.to_bits()), Some(v.to_bits()), "{t}");
        }
    }

    #[test]
    fn a_member_counts_until_its_sample_is_exactly_the_lookback_old() {
        let l = lists();
        // GPU 0's last sample is at 10 s: it counts through 310 s.
        let t0 = 10_000 + LOOKBACK_MS;
        let at = at_times(&l, Across::Count, &[t0, t0 + 1]);
        // GPU 1 (last at 20 s) is live at both.
        assert_eq!(at[0].map(|p| p.1), Some(2.0));
        assert_eq!(at[1].map(|p| p.1), Some(1.0));
        let at = at_times(&l, Across::Count, &[20_000 + LOOKBACK_MS + 1]);
        assert_eq!(at[0], None);
    }

    #[test]
    fn a_member_whose_input_stopped_leaves_when_it_goes_stale() {
        // GPU 0 sampled every second with 1 s windows until 10 s: current
        // until 10 s + 3 windows + 10 s = 23 s. GPU 1 runs on.
        let stale = |t: i64| t + crate::staleness::stale_after_ms(Some(1000));
        let l = vec![
            (0..=10).map(|s| (s * 1000, 0.5, stale(s * 1000))).collect(),
            (0..=60)
                .map(|s| (s * 1000, 0.1, stale(s * 1000)))
                .collect::<Timeline>(),
        ];
        let at = at_times(&l, Across::Mean, &[23_000, 23_001]);
        assert_eq!(at[0].map(|p| p.1), Some(0.3));
        assert_eq!(at[1].map(|p| p.1), Some(0.1));
        // The range form has a point where it leaves, between samples.
        let p = points(&l, Across::Count, 22_500, 24_000);
        assert_eq!(p, vec![(23_000, 2.0), (23_001, 1.0), (24_000, 1.0)]);
        // Once every member is stale, nothing.
        let at = at_times(&l, Across::Count, &[stale(60_000), stale(60_000) + 1]);
        assert_eq!(at[0].map(|p| p.1), Some(1.0));
        assert_eq!(at[1], None);
    }

    #[test]
    fn an_idle_node_is_exactly_zero() {
        let l: Vec<Timeline> = vec![
            timeline(&[(0, 0.1), (1000, 0.0)]),
            timeline(&[(0, 0.2), (1000, 0.0)]),
            timeline(&[(0, 0.7), (1000, 0.0)]),
        ];
        let p = points(&l, Across::Mean, 0, 1000);
        assert_eq!(p[1], (1000, 0.0));
        assert!(p[1].1.is_sign_positive());
    }
}
