//! The ledger's counters on `/metrics`: per job, what this collector has
//! ingested since it started — GPU time held and idle, delivered and
//! unused FLOPs, energy — added up batch by batch as they are
//! acknowledged, so a scrape reads them without touching the store.
//!
//! The same rules as the stored ledger ([`super`]): held time is the OFU
//! samples' windows, a held minute is idle when its mean tensor activity
//! is below [`super::IDLE_TENSOR_ACTIVE`] (counted when the minute
//! closes: at the GPU's first sample of a later minute, or when its job
//! changes), energy is the GPU's energy counter's increase between two
//! readings, counted for the job of the batch that carries the later
//! reading. They are counters from this collector's start (a restart
//! starts them again, as any exporter's); the exact figures over any
//! period are `flopwatch report` and the PromQL API's.

use super::IDLE_TENSOR_ACTIVE;
use crate::ofu::Mean;
use crate::store::{OfuSample, MINUTE_MS};
use flopwatch_proto::model::Point;
use std::collections::HashMap;
use std::sync::Mutex;

/// Jobs kept at the most; beyond, those seen longest ago leave first.
const MAX_JOBS: usize = 100_000;
/// A job not seen for this long leaves the page.
const FORGET_AFTER_MS: i64 = 3_600_000;

/// One job's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTotals {
    /// The job's namespace, as last reported.
    pub namespace: String,
    /// GPU time held, ms.
    pub held_ms: f64,
    /// Held time in idle minutes, ms.
    pub idle_ms: f64,
    /// Σ OFU × window × peak, TFLOP (TFLOP/s × s).
    pub delivered_tflop: f64,
    /// Σ window × peak, TFLOP: the capacity held.
    pub capacity_tflop: f64,
    /// Energy, joules.
    pub energy_j: f64,
    /// The newest sample's time, unix ms.
    pub last_ms: i64,
}

/// The job on a GPU and the minute it is in.
#[derive(Debug, Default)]
struct GpuState {
    /// (tenant, job) the open minute belongs to.
    job: Option<(String, String)>,
    minute: i64,
    mean: Mean,
    /// The newest energy counter reading: time and value.
    energy: Option<(i64, f64)>,
}

#[derive(Debug, Default)]
struct Inner {
    jobs: HashMap<(String, String), JobTotals>,
    gpus: HashMap<(String, String), GpuState>,
}

/// The counters of every job ingested lately.
#[derive(Debug, Default)]
pub struct Live {
    inner: Mutex<Inner>,
}

/// One GPU's part of an acknowledged batch.
pub struct Observed<'a> {
    /// The GPU's tenant.
    pub tenant: &'a str,
    /// The GPU's UUID.
    pub gpu: &'a str,
    /// The job that held the GPU over the batch, and its namespace.
    pub job: Option<(&'a str, &'a str)>,
    /// The GPU's dense FP16 tensor peak, TFLOP/s.
    pub peak_tflops: f64,
    /// The batch's OFU samples of the GPU.
    pub samples: &'a [OfuSample],
    /// The batch's energy counter readings of the GPU.
    pub energy: &'a [Point],
}

impl Live {
    /// Adds a batch's GPUs' parts, under one lock.
    pub fn observe(&self, parts: &[Observed<'_>]) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let Inner { jobs, gpus } = &mut *inner;
        for o in parts {
            observe_one(jobs, gpus, o);
        }
        forget(jobs);
    }

    /// Every job's counters, with its tenant and id.
    pub fn jobs(&self) -> Vec<((String, String), JobTotals)> {
        self.inner
            .lock()
            .map(|i| i.jobs.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

/// Adds one GPU's part of a batch.
fn observe_one(
    jobs: &mut HashMap<(String, String), JobTotals>,
    gpus: &mut HashMap<(String, String), GpuState>,
    o: &Observed<'_>,
) {
    let key = o.job.map(|(j, _)| (o.tenant.to_string(), j.to_string()));
    let state = gpus
        .entry((o.tenant.to_string(), o.gpu.to_string()))
        .or_default();
    if state.job != key {
        close_minute(jobs, state);
        state.job = key.clone();
    }
    for s in o.samples {
        let minute = s.ts_ms.div_euclid(MINUTE_MS);
        if minute != state.minute {
            close_minute(jobs, state);
            state.minute = minute;
        }
        state
            .mean
            .add(s.ofu, s.tensor_active, s.sm_clock_mhz, s.window_ms);
        if let Some(k) = &key {
            let t = jobs.entry(k.clone()).or_default();
            let w = f64::from(s.window_ms.max(1)) / 1000.0;
            t.held_ms += w * 1000.0;
            t.delivered_tflop += s.ofu * w * o.peak_tflops;
            t.capacity_tflop += w * o.peak_tflops;
            t.last_ms = t.last_ms.max(s.ts_ms);
        }
    }
    for p in o.energy.iter().filter(|p| p.value.is_finite()) {
        if let (Some((t, v)), Some(k)) = (state.energy, &key) {
            if p.ts_ms > t && p.value >= v {
                jobs.entry(k.clone()).or_default().energy_j += p.value - v;
            }
        }
        if state.energy.is_none_or(|(t, _)| p.ts_ms > t) {
            state.energy = Some((p.ts_ms, p.value));
        }
    }
    if let (Some(k), Some((_, ns))) = (&key, o.job) {
        if let Some(t) = jobs.get_mut(k) {
            if t.namespace != ns {
                t.namespace = ns.to_string();
            }
        }
    }
}

/// Counts the open minute's time as idle when its tensor activity was.
fn close_minute(jobs: &mut HashMap<(String, String), JobTotals>, state: &mut GpuState) {
    let m = std::mem::take(&mut state.mean);
    let Some(k) = &state.job else { return };
    if m.count > 0 && m.tensor_active() < IDLE_TENSOR_ACTIVE {
        if let Some(t) = jobs.get_mut(k) {
            t.idle_ms += m.parts().1[0];
        }
    }
}

/// Drops jobs not seen for [`FORGET_AFTER_MS`], and the oldest beyond
/// [`MAX_JOBS`].
fn forget(jobs: &mut HashMap<(String, String), JobTotals>) {
    if jobs.len() <= MAX_JOBS / 2 {
        return;
    }
    let newest = jobs.values().map(|t| t.last_ms).max().unwrap_or(0);
    jobs.retain(|_, t| newest - t.last_ms <= FORGET_AFTER_MS);
    if jobs.len() > MAX_JOBS {
        let mut ages: Vec<i64> = jobs.values().map(|t| t.last_ms).collect();
        ages.sort_unstable();
        let cut = ages[jobs.len() - MAX_JOBS];
        jobs.retain(|_, t| t.last_ms >= cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(from_s: i64, n: i64, tpa: f64) -> Vec<OfuSample> {
        (1..=n)
            .map(|i| OfuSample {
                ts_ms: (from_s + i) * 1000,
                ofu: tpa * 0.8,
                tensor_active: tpa,
                sm_clock_mhz: 1500.0,
                window_ms: 1000,
            })
            .collect()
    }

    fn energy(at_s: &[(i64, f64)]) -> Vec<Point> {
        at_s.iter()
            .map(|&(t, v)| Point {
                ts_ms: t * 1000,
                value: v,
                peak: None,
                window_ms: None,
            })
            .collect()
    }

    /// A busy minute, then an idle one, then the job leaves: held, idle
    /// (counted when the minute closes), FLOPs and energy per job.
    #[test]
    fn counters_follow_the_batches() {
        let live = Live::default();
        let obs = |job: Option<(&'static str, &'static str)>, s: &[OfuSample], e: &[Point]| {
            live.observe(&[Observed {
                tenant: "t",
                gpu: "G1",
                job,
                peak_tflops: 1000.0,
                samples: s,
                energy: e,
            }])
        };
        let a = Some(("a", "ns"));
        obs(
            a,
            &samples(59, 60, 0.5),
            &energy(&[(60, 100.0), (119, 30_100.0)]),
        );
        obs(a, &samples(119, 60, 0.0), &energy(&[(179, 33_100.0)]));
        let jobs = live.jobs();
        let t = &jobs[0].1;
        assert_eq!(t.held_ms, 120_000.0);
        // The idle minute is still open.
        assert_eq!(t.idle_ms, 0.0);
        assert!((t.delivered_tflop - 60.0 * 0.4 * 1000.0).abs() < 1e-6);
        assert_eq!(t.capacity_tflop, 120.0 * 1000.0);
        assert_eq!(t.energy_j, 33_000.0);
        // Job b takes the GPU: a's idle minute closes; the counter's
        // increase since a's last reading is b's.
        obs(
            Some(("b", "ns")),
            &samples(179, 1, 0.5),
            &energy(&[(180, 33_400.0)]),
        );
        let jobs: HashMap<_, _> = live.jobs().into_iter().collect();
        let a = &jobs[&("t".to_string(), "a".to_string())];
        assert_eq!(a.idle_ms, 60_000.0, "{a:?}");
        let b = &jobs[&("t".to_string(), "b".to_string())];
        assert_eq!(b.energy_j, 300.0);
        assert_eq!(b.namespace, "ns");
    }
}
