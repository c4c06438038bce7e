//! Job hours: for each sealed GPU-hour, each job's ledger figures — its
//! samples' held time, Σ OFU × window, held time in idle minutes, its first
//! sample's time and window and its last sample's time. What the ledger
//! (the collector's ledger) needs of an hour a job held wholly, in about 60 bytes
//! where the hour's rollup is 61 aggregates of 80: a month of a fleet's
//! holdings reads a few megabytes, not gigabytes.
//!
//! Written by compaction with the rollup (key kind [`keys::KIND_JOBS`] in
//! the rollup family, the same series prefix and hour), so retention and
//! the rewrite of an hour that late samples reopen treat all three alike.
//!
//! Layout (little-endian): the number of jobs (u32); per job, its id
//! (u32 length, UTF-8), the sample count (u32), held ms, Σ OFU × window
//! (ms) and idle ms (f64 each), the first sample's time (i64) and window
//! (u32), the last sample's time (i64). Samples outside every job are
//! not kept.
//!
//! [`keys::KIND_JOBS`]: super::keys::KIND_JOBS

use super::gpu_block;
use super::hours::{window_of, MINUTE_MS, WINDOW_MS};
use super::keys;
use super::scan::scan_series;
use super::{corrupt, Cf, OfuSample, Store, StoreError};
use flopwatch_proto::ofu::Mean;
use std::collections::HashSet;

/// A held minute is idle when its mean tensor activity is below this
/// fraction (docs/LEDGER.md).
pub const IDLE_TENSOR_ACTIVE: f64 = 0.01;

/// One job's figures over one GPU-hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobHour {
    /// Samples.
    pub count: u32,
    /// Σ window, ms (a window-less sample weighs 1 ms, as in [`Mean`]).
    pub held_ms: f64,
    /// Σ OFU × window, ms.
    pub ofu_ms: f64,
    /// Held ms of the minutes whose mean tensor activity is below
    /// [`IDLE_TENSOR_ACTIVE`].
    pub idle_ms: f64,
    /// The first sample's time and window.
    pub first: (i64, u32),
    /// The last sample's time.
    pub last_ms: i64,
}

impl JobHour {
    /// The figures of one job's samples of an hour, in time order.
    pub fn of(samples: &[OfuSample]) -> Option<Self> {
        let (first, last) = (samples.first()?, samples.last()?);
        let mut h = JobHour {
            count: 0,
            held_ms: 0.0,
            ofu_ms: 0.0,
            idle_ms: 0.0,
            first: (first.ts_ms, first.window_ms),
            last_ms: last.ts_ms,
        };
        let mut minute = Mean::default();
        let mut at = i64::MIN;
        for s in samples {
            let m = s.ts_ms.div_euclid(MINUTE_MS);
            if m != at {
                h.close(&minute);
                minute = Mean::default();
                at = m;
            }
            minute.add(s.ofu, s.tensor_active, s.sm_clock_mhz, s.window_ms);
        }
        h.close(&minute);
        Some(h)
    }

    /// Adds one minute's aggregate.
    fn close(&mut self, m: &Mean) {
        let Some(ofu) = m.mean() else { return };
        let held = m.parts().1[0];
        self.count += m.count as u32;
        self.held_ms += held;
        self.ofu_ms += ofu * held;
        if m.tensor_active() < IDLE_TENSOR_ACTIVE {
            self.idle_ms += held;
        }
    }
}

/// A GPU-hour's record: its jobs' figures.
pub(super) fn encode(jobs: &[(&str, JobHour)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + jobs.len() * 64);
    out.extend_from_slice(&(jobs.len() as u32).to_le_bytes());
    for (job, h) in jobs {
        out.extend_from_slice(&(job.len() as u32).to_le_bytes());
        out.extend_from_slice(job.as_bytes());
        out.extend_from_slice(&h.count.to_le_bytes());
        for f in [h.held_ms, h.ofu_ms, h.idle_ms] {
            out.extend_from_slice(&f.to_le_bytes());
        }
        out.extend_from_slice(&h.first.0.to_le_bytes());
        out.extend_from_slice(&h.first.1.to_le_bytes());
        out.extend_from_slice(&h.last_ms.to_le_bytes());
    }
    out
}

/// `job`'s figures in a record: `Some(None)` where the job has none,
/// `None` for a malformed record.
pub(super) fn decode_job(b: &[u8], job: &str) -> Option<Option<JobHour>> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    let u32_at = |s: &[u8]| s.try_into().ok().map(u32::from_le_bytes);
    let n = u32_at(take(4)?)?;
    for _ in 0..n {
        let len = u32_at(take(4)?)? as usize;
        let id = take(len)?;
        let body = take(4 + 24 + 8 + 4 + 8)?;
        if id != job.as_bytes() {
            continue;
        }
        let f = |i: usize| -> Option<f64> {
            Some(f64::from_le_bytes(
                body.get(4 + i * 8..12 + i * 8)?.try_into().ok()?,
            ))
        };
        let i64_at = |at: usize| -> Option<i64> {
            Some(i64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
        };
        return Some(Some(JobHour {
            count: u32_at(&body[..4])?,
            held_ms: f(0)?,
            ofu_ms: f(1)?,
            idle_ms: f(2)?,
            first: (i64_at(28)?, u32_at(body.get(36..40)?)?),
            last_ms: i64_at(40)?,
        }));
    }
    (pos == b.len()).then_some(None)
}

impl Store {
    /// `job`'s hours on GPU `gpu` of `tenant` within `[from, to)` that a
    /// job-hour record answers: sealed, wholly inside the range and with
    /// nothing in the head or limbo (late samples reopen an hour, which is
    /// then read sample by sample). `f` gets each such hour in which the
    /// job has samples, with its figures; returned are all the hours
    /// answered, with or without the job's samples.
    pub fn job_hours(
        &self,
        tenant: &str,
        gpu: &str,
        job: &str,
        from: i64,
        to: i64,
        f: &mut dyn FnMut(i64, JobHour),
    ) -> Result<Vec<i64>, StoreError> {
        let from = self.clamp(tenant, from);
        let prefix = keys::ofu_prefix(tenant, gpu);
        let records = keys::kind_prefix(keys::KIND_JOBS, &prefix);
        let mut answered = Vec::new();
        let head = self.bundle_hours(Cf::Head);
        self.engine.view(&mut |view| {
            // Hours with blocks in the head or limbo (no block decoded).
            let mut open = HashSet::new();
            for cf in [Cf::Head, Cf::Limbo] {
                gpu_block::scan_bundles(view, cf, head.of(cf), &prefix, from, to, &mut |w, _| {
                    open.insert(w);
                    Ok(true)
                })?;
            }
            scan_series(
                view,
                Cf::Rollup,
                &records,
                window_of(from),
                to,
                &mut |w, v| {
                    if w < from || w + WINDOW_MS > to || open.contains(&w) {
                        return Ok(true);
                    }
                    let h = decode_job(v, job).ok_or_else(|| corrupt(Cf::Rollup, "job hours"))?;
                    answered.push(w);
                    if let Some(h) = h {
                        f(w, h);
                    }
                    Ok(true)
                },
            )
        })?;
        Ok(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts_ms: i64, tpa: f64) -> OfuSample {
        OfuSample {
            ts_ms,
            ofu: tpa * 0.9,
            tensor_active: tpa,
            sm_clock_mhz: 1600.0,
            window_ms: 1000,
        }
    }

    /// Held, OFU and idle time by minute; the record gives each job back
    /// and refuses a cut one.
    #[test]
    fn figures_round_trip_per_job() {
        // Minute 0 busy; minute 1 idle but for one busy second out of 60
        // (mean 0.5/60 < 1 %); minute 2 one sample.
        let mut s: Vec<OfuSample> = (1..=60).map(|i| sample(i * 1000 - 500, 0.5)).collect();
        s.extend((61..=120).map(|i| sample(i * 1000 - 500, if i == 61 { 0.5 } else { 0.0 })));
        s.push(sample(120_500, 0.0));
        let h = JobHour::of(&s).unwrap();
        assert_eq!(h.count, 121);
        assert_eq!(h.held_ms, 121_000.0);
        assert_eq!(h.idle_ms, 61_000.0);
        assert!((h.ofu_ms - 61.0 * 0.45 * 1000.0).abs() < 1e-6);
        assert_eq!(h.first, (500, 1000));
        assert_eq!(h.last_ms, 120_500);
        assert_eq!(JobHour::of(&[]), None);
        let b = encode(&[("a", h), ("job-b", h)]);
        assert_eq!(decode_job(&b, "job-b"), Some(Some(h)));
        assert_eq!(decode_job(&b, "a"), Some(Some(h)));
        assert_eq!(decode_job(&b, "c"), Some(None));
        for cut in 0..b.len() {
            assert_eq!(decode_job(&b[..cut], "c"), None, "cut at {cut}");
        }
    }
}
