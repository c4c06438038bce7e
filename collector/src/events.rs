//! Fleet events derived at ingest: OFU regressions (OFU paper §VI-A) and
//! stragglers (Moneo §1), next to the events agents report (XID, ECC).
//!
//! Each job's OFU is cut into windows of `analysis.window` by sample time.
//! Per window and GPU the window-weighted mean OFU and tensor activity are
//! kept; a job's window OFU is the mean over its GPUs (eq. 11 with equal
//! windows). A window closes once a sample of the job arrives two windows
//! later (one window of grace for other nodes' batches). On close:
//!
//! * **regression**: for `confirm_windows` windows in a row, the window's
//!   OFU times `regression_factor` is at or below the job's trailing
//!   baseline — the median of its last `baseline_windows` closed windows (at
//!   least 3), with the baseline at least `min_ofu`. Requiring consecutive
//!   windows keeps an inference service's idle gaps from counting. Raised
//!   once, at the end of the confirming window; re-armed when the job's OFU
//!   is back above baseline ÷ factor.
//! * **straggler**: in a job of at least 3 GPUs, a GPU whose tensor activity
//!   is below the job's median by more than `straggler_threshold` (a
//!   fraction of the median), with the median at least `min_ofu`. Raised
//!   once per GPU; re-armed when it is back within the threshold.
//!
//! * **mfu** / **mfu_mismatch** (OFU paper §V-C): a job's own MFU report
//!   ([`crate::mfu`]) waits until the windows it covers have closed, then is
//!   compared with the job's OFU over them (the mean of those windows' job
//!   OFU); the comparison is stored as an `mfu` event (value: reported MFU,
//!   baseline: measured OFU). When the two differ by more than
//!   `mfu_tolerance` (absolute), with either at least `min_ofu`, an
//!   `mfu_mismatch` event flags a suspected FLOPs miscalculation, with the
//!   ratio. Raised once; re-armed by a report within the tolerance.
//!
//! Events are stored with the batch that raised them, logged, counted on
//! `/metrics` and listed by the `ListEvents` query.

pub(crate) use crate::store::EventRecord;
use crate::store::OfuSample;
use flopwatch_config::AnalysisConfig;
use flopwatch_proto::stats::quantile;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;

/// Analysis settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisSettings {
    /// Window length, ms.
    pub window_ms: i64,
    /// Closed windows in the trailing baseline.
    pub baseline_windows: usize,
    /// A job regresses when baseline ≥ factor × window OFU.
    pub regression_factor: f64,
    /// ... for this many consecutive windows.
    pub confirm_windows: u32,
    /// A GPU straggles below median × (1 − threshold).
    pub straggler_threshold: f64,
    /// Baselines and medians below this are too idle to judge.
    pub min_ofu: f64,
    /// A reported MFU this far (absolute) from the measured OFU is flagged.
    pub mfu_tolerance: f64,
}

impl AnalysisSettings {
    /// From `[analysis]` of the config file.
    pub fn from_config(c: &AnalysisConfig) -> Self {
        Self {
            window_ms: i64::try_from(c.window.as_millis()).unwrap_or(i64::MAX),
            baseline_windows: c.baseline_windows,
            regression_factor: c.regression_factor,
            confirm_windows: c.confirm_windows,
            straggler_threshold: c.straggler_threshold,
            min_ofu: c.min_ofu,
            mfu_tolerance: c.mfu_tolerance,
        }
    }
}

/// The config file's defaults, which are kept in one place
/// ([`AnalysisConfig::default`]).
impl Default for AnalysisSettings {
    fn default() -> Self {
        Self::from_config(&AnalysisConfig::default())
    }
}

/// Events raised so far, per tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts {
    /// Regressions.
    pub regressions: u64,
    /// Stragglers.
    pub stragglers: u64,
    /// Reported MFU far from the measured OFU.
    pub mfu_mismatches: u64,
}

#[derive(Debug, Default)]
struct GpuAcc {
    node_id: String,
    ofu_w: f64,
    tensor_w: f64,
    w: f64,
}

#[derive(Debug, Default)]
struct JobTrack {
    open: BTreeMap<i64, HashMap<String, GpuAcc>>,
    history: VecDeque<f64>,
    regressed: bool,
    /// Consecutive windows below baseline ÷ factor.
    low: u32,
    straggling: HashSet<String>,
    /// Highest closed window index.
    closed: Option<i64>,
    /// Closed windows' job OFU by window index, the newest
    /// [`RECENT_WINDOWS`], for MFU comparisons.
    recent: VecDeque<(i64, f64)>,
    /// MFU reports waiting for the windows they cover to close.
    pending_mfu: Vec<PendingMfu>,
    /// An `mfu_mismatch` is raised and not yet re-armed.
    mfu_flagged: bool,
}

/// Closed windows kept per job for MFU comparisons.
const RECENT_WINDOWS: usize = 240;
/// Reports kept waiting per job; the oldest go first.
const MAX_PENDING_MFU: usize = 64;

#[derive(Debug, Clone, Copy)]
struct PendingMfu {
    start_ms: i64,
    end_ms: i64,
    mfu: f64,
}

/// The per-job analysis state.
#[derive(Debug, Default)]
pub struct Analyzer {
    settings: AnalysisSettings,
    jobs: Mutex<HashMap<(String, String), JobTrack>>,
    counts: Mutex<BTreeMap<String, EventCounts>>,
}

/// The median by the shared definition (Prometheus's): of an even number
/// of values, the mean of the middle two (0 for none).
fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5).unwrap_or(0.0)
}

impl Analyzer {
    /// An analyzer with `settings`.
    pub fn new(settings: AnalysisSettings) -> Self {
        Self {
            settings,
            ..Default::default()
        }
    }

    /// Events raised so far, per tenant.
    pub fn counts(&self) -> BTreeMap<String, EventCounts> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Folds one GPU's OFU samples of `job` in; returns the events raised
    /// by windows this closes.
    pub fn observe(
        &self,
        tenant: &str,
        node_id: &str,
        job_id: &str,
        gpu: &str,
        samples: &[OfuSample],
    ) -> Vec<EventRecord> {
        let w = self.settings.window_ms.max(1);
        let Ok(mut jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        let track = jobs
            .entry((tenant.to_string(), job_id.to_string()))
            .or_default();
        let mut newest = i64::MIN;
        for s in samples {
            if !s.ofu.is_finite() || !s.tensor_active.is_finite() {
                continue;
            }
            // A sample's timestamp ends its window: (t - 1) / w places a
            // sample ending exactly on a boundary in the window it covers.
            let idx = (s.ts_ms - 1).div_euclid(w);
            newest = newest.max(idx);
            // A window already closed takes no late samples.
            if track.closed.is_none_or(|c| idx > c) {
                let weight = f64::from(s.window_ms.max(1));
                let acc = track
                    .open
                    .entry(idx)
                    .or_default()
                    .entry(gpu.to_string())
                    .or_default();
                acc.node_id = node_id.to_string();
                acc.ofu_w += s.ofu * weight;
                acc.tensor_w += s.tensor_active * weight;
                acc.w += weight;
            }
        }
        let mut events = Vec::new();
        while let Some((&idx, _)) = track.open.iter().next() {
            if idx + 2 > newest {
                break;
            }
            let Some(window) = track.open.remove(&idx) else {
                break;
            };
            track.closed = Some(idx);
            events.extend(self.close(track, job_id, (idx + 1) * w, window));
            events.extend(self.compare_mfu(track, job_id));
        }
        drop(jobs);
        self.count(tenant, &events);
        events
    }

    /// Takes a job's own MFU (fraction, already checked by
    /// [`crate::mfu::reported_mfu`]) for `[start_ms, end_ms)`; `start_ms`
    /// 0 means one window before `end_ms`. Returns the events of a
    /// comparison that can already be made.
    pub fn report_mfu(
        &self,
        tenant: &str,
        job_id: &str,
        start_ms: i64,
        end_ms: i64,
        mfu: f64,
    ) -> Vec<EventRecord> {
        let w = self.settings.window_ms.max(1);
        let start_ms = if start_ms > 0 && start_ms < end_ms {
            start_ms
        } else {
            end_ms - w
        };
        let events = {
            let Ok(mut jobs) = self.jobs.lock() else {
                return Vec::new();
            };
            let track = jobs
                .entry((tenant.to_string(), job_id.to_string()))
                .or_default();
            if track.pending_mfu.len() >= MAX_PENDING_MFU {
                track.pending_mfu.remove(0);
            }
            track.pending_mfu.push(PendingMfu {
                start_ms,
                end_ms,
                mfu,
            });
            self.compare_mfu(track, job_id)
        };
        self.count(tenant, &events);
        events
    }

    fn count(&self, tenant: &str, events: &[EventRecord]) {
        if !events.is_empty() {
            if let Ok(mut c) = self.counts.lock() {
                let e = c.entry(tenant.to_string()).or_default();
                for ev in events {
                    match ev.kind.as_str() {
                        "regression" => e.regressions += 1,
                        "straggler" => e.stragglers += 1,
                        "mfu_mismatch" => e.mfu_mismatches += 1,
                        _ => {}
                    }
                }
            }
        }
    }

    /// Compares every pending MFU report whose windows have all closed with
    /// the job's OFU over those windows.
    fn compare_mfu(&self, track: &mut JobTrack, job_id: &str) -> Vec<EventRecord> {
        let s = &self.settings;
        let w = s.window_ms.max(1);
        let Some(closed) = track.closed else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let mut keep = Vec::new();
        for r in std::mem::take(&mut track.pending_mfu) {
            // Window indices covering [start, end), as samples are placed.
            let (first, last) = ((r.start_ms).div_euclid(w), (r.end_ms - 1).div_euclid(w));
            if last > closed {
                keep.push(r);
                continue;
            }
            let covered: Vec<f64> = track
                .recent
                .iter()
                .filter(|(i, _)| (first..=last).contains(i))
                .map(|(_, o)| *o)
                .collect();
            if covered.is_empty() {
                // Nothing measured over the report's period: no comparison.
                continue;
            }
            let ofu = covered.iter().sum::<f64>() / covered.len() as f64;
            let ratio = if ofu > 1e-9 {
                r.mfu / ofu
            } else {
                f64::INFINITY
            };
            let event = |kind: &str, detail: String| EventRecord {
                kind: kind.into(),
                ts_ms: r.end_ms,
                job_id: job_id.to_string(),
                gpu_uuid: String::new(),
                node_id: String::new(),
                value: r.mfu,
                baseline: ofu,
                detail,
            };
            events.push(event(
                "mfu",
                format!(
                    "job {job_id}: reported MFU {:.2}% vs measured OFU {:.2}% over {} window(s)",
                    r.mfu * 100.0,
                    ofu * 100.0,
                    covered.len()
                ),
            ));
            let off = (r.mfu - ofu).abs() > s.mfu_tolerance && r.mfu.max(ofu) >= s.min_ofu;
            if off && !track.mfu_flagged {
                track.mfu_flagged = true;
                events.push(event(
                    "mfu_mismatch",
                    format!(
                        "job {job_id}: reported MFU {:.2}% is {:.2}× the measured OFU {:.2}% \
                         (|Δ| {:.1} pp > {:.1} pp): suspected FLOPs miscalculation",
                        r.mfu * 100.0,
                        ratio,
                        ofu * 100.0,
                        (r.mfu - ofu).abs() * 100.0,
                        s.mfu_tolerance * 100.0
                    ),
                ));
            } else if !off {
                track.mfu_flagged = false;
            }
        }
        track.pending_mfu = keep;
        events
    }

    fn close(
        &self,
        track: &mut JobTrack,
        job_id: &str,
        end_ms: i64,
        window: HashMap<String, GpuAcc>,
    ) -> Vec<EventRecord> {
        let s = &self.settings;
        let mut events = Vec::new();
        let per_gpu: Vec<(&String, &GpuAcc)> = window.iter().filter(|(_, a)| a.w > 0.0).collect();
        if per_gpu.is_empty() {
            return events;
        }
        let job_ofu =
            per_gpu.iter().map(|(_, a)| a.ofu_w / a.w).sum::<f64>() / per_gpu.len() as f64;
        if track.history.len() >= 3 {
            let baseline = median(&mut track.history.iter().copied().collect::<Vec<_>>());
            let low = job_ofu * s.regression_factor <= baseline;
            track.low = if low { track.low + 1 } else { 0 };
            if baseline >= s.min_ofu {
                if !track.regressed && low && track.low >= s.confirm_windows.max(1) {
                    track.regressed = true;
                    events.push(EventRecord {
                        kind: "regression".into(),
                        ts_ms: end_ms,
                        job_id: job_id.to_string(),
                        gpu_uuid: String::new(),
                        node_id: String::new(),
                        value: job_ofu,
                        baseline,
                        detail: if job_ofu > 1e-4 {
                            format!(
                                "job {job_id}: OFU {:.1}% is {:.2}× below its baseline {:.1}%",
                                job_ofu * 100.0,
                                baseline / job_ofu,
                                baseline * 100.0
                            )
                        } else {
                            format!(
                                "job {job_id}: OFU fell to 0 from its baseline {:.1}%",
                                baseline * 100.0
                            )
                        },
                    });
                } else if track.regressed && job_ofu * s.regression_factor > baseline {
                    track.regressed = false;
                }
            }
        }
        track.history.push_back(job_ofu);
        if let Some(idx) = track.closed {
            track.recent.push_back((idx, job_ofu));
            while track.recent.len() > RECENT_WINDOWS {
                track.recent.pop_front();
            }
        }
        while track.history.len() > s.baseline_windows.max(3) {
            track.history.pop_front();
        }
        if per_gpu.len() >= 3 {
            let mut t: Vec<f64> = per_gpu.iter().map(|(_, a)| a.tensor_w / a.w).collect();
            let med = median(&mut t);
            if med >= s.min_ofu {
                let floor = med * (1.0 - s.straggler_threshold);
                for (gpu, a) in &per_gpu {
                    let v = a.tensor_w / a.w;
                    if v < floor {
                        if track.straggling.insert((*gpu).clone()) {
                            events.push(EventRecord {
                                kind: "straggler".into(),
                                ts_ms: end_ms,
                                job_id: job_id.to_string(),
                                gpu_uuid: (*gpu).clone(),
                                node_id: a.node_id.clone(),
                                value: v,
                                baseline: med,
                                detail: format!(
                                    "GPU {gpu} on {}: tensor activity {:.1}% vs job median {:.1}%",
                                    a.node_id,
                                    v * 100.0,
                                    med * 100.0
                                ),
                            });
                        }
                    } else {
                        track.straggling.remove(*gpu);
                    }
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(from_ms: i64, to_ms: i64, ofu: f64, tensor: f64) -> Vec<OfuSample> {
        (from_ms / 100..to_ms / 100)
            .map(|i| OfuSample {
                ts_ms: i * 100 + 100,
                ofu,
                tensor_active: tensor,
                sm_clock_mhz: 1830.0,
                window_ms: 100,
            })
            .collect()
    }

    fn settings() -> AnalysisSettings {
        AnalysisSettings {
            window_ms: 1_000,
            ..Default::default()
        }
    }

    #[test]
    fn settings_are_the_config_section_and_its_defaults() {
        let section: AnalysisConfig = toml::from_str("window = \"30s\"\nmin_ofu = 0.1\n").unwrap();
        let expect = AnalysisSettings {
            window_ms: 30_000,
            min_ofu: 0.1,
            ..AnalysisSettings::default()
        };
        assert_eq!(AnalysisSettings::from_config(&section), expect);
        // A file without the section runs the analyzer's defaults.
        let empty: AnalysisConfig = toml::from_str("").unwrap();
        assert_eq!(
            AnalysisSettings::from_config(&empty),
            AnalysisSettings::default()
        );
    }

    #[test]
    fn a_2_5x_drop_is_one_regression_and_a_1_8x_drop_is_none() {
        for (factor, expected) in [(2.5, 1), (1.8, 0)] {
            let a = Analyzer::new(settings());
            let mut events = Vec::new();
            for sec in 0..20 {
                let ofu = if sec < 10 { 0.5 } else { 0.5 / factor };
                let s = samples(sec * 1000, sec * 1000 + 1000, ofu, ofu);
                events.extend(a.observe("t", "n", "job", "GPU-0", &s));
            }
            let reg: Vec<_> = events.iter().filter(|e| e.kind == "regression").collect();
            assert_eq!(reg.len(), expected, "factor {factor}: {events:?}");
            if let Some(e) = reg.first() {
                assert_eq!(
                    e.ts_ms, 13_000,
                    "the third regressed window in a row ends at 13 s"
                );
                assert!((e.baseline - 0.5).abs() < 1e-9);
                assert_eq!(a.counts()["t"].regressions, 1);
            }
        }
    }

    #[test]
    fn a_slow_gpu_is_one_straggler_event() {
        let a = Analyzer::new(settings());
        let mut events = Vec::new();
        for sec in 0..6 {
            for (g, t) in [
                ("GPU-0", 0.6),
                ("GPU-1", 0.62),
                ("GPU-2", 0.3),
                ("GPU-3", 0.61),
            ] {
                let s = samples(sec * 1000, sec * 1000 + 1000, t * 0.9, t);
                events.extend(a.observe("t", "n", "job", g, &s));
            }
        }
        let st: Vec<_> = events.iter().filter(|e| e.kind == "straggler").collect();
        assert_eq!(st.len(), 1, "{events:?}");
        assert_eq!(st[0].gpu_uuid, "GPU-2");
        // The job median of four GPUs: the mean of the middle two.
        assert!((st[0].baseline - 0.605).abs() < 1e-9);
        assert!(events.iter().all(|e| e.kind != "regression"));
    }

    #[test]
    fn short_idle_gaps_are_not_regressions() {
        let a = Analyzer::new(settings());
        let mut events = Vec::new();
        for sec in 0..30 {
            // 3 s of work, 2 s idle, as an inference service.
            let ofu = if sec % 5 < 3 { 0.35 } else { 0.0 };
            events.extend(a.observe(
                "t",
                "n",
                "job",
                "GPU-0",
                &samples(sec * 1000, sec * 1000 + 1000, ofu, ofu),
            ));
        }
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn idle_jobs_raise_nothing() {
        let a = Analyzer::new(settings());
        let mut n = 0;
        for sec in 0..20 {
            let ofu = if sec < 10 { 0.02 } else { 0.001 };
            n += a
                .observe(
                    "t",
                    "n",
                    "job",
                    "GPU-0",
                    &samples(sec * 1000, sec * 1000 + 1000, ofu, ofu),
                )
                .len();
        }
        assert_eq!(n, 0);
    }

    #[test]
    fn an_mfu_twice_the_ofu_is_flagged_once_and_a_fair_one_re_arms() {
        let a = Analyzer::new(settings());
        let mut events = Vec::new();
        // The job runs at OFU 25.58 % (the paper's MoE job) on two GPUs.
        let feed = |a: &Analyzer, sec: i64, events: &mut Vec<EventRecord>| {
            for g in ["GPU-0", "GPU-1"] {
                let s = samples(sec * 1000, sec * 1000 + 1000, 0.2558, 0.3);
                events.extend(a.observe("t", "n", "moe", g, &s));
            }
        };
        for sec in 0..4 {
            feed(&a, sec, &mut events);
        }
        // Windows 0 and 1 are closed (samples of window 3 have arrived).
        // A report over [0, 2 s) is compared at once; one over [2, 4 s)
        // waits for windows 2 and 3.
        events.extend(a.report_mfu("t", "moe", 1, 2_000, 0.5427));
        let early = a.report_mfu("t", "moe", 2_000, 4_000, 0.5427);
        assert!(early.is_empty(), "{early:?}");
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["mfu", "mfu_mismatch"], "{events:?}");
        let m = &events[1];
        assert_eq!(m.job_id, "moe");
        assert!((m.value - 0.5427).abs() < 1e-12);
        assert!((m.baseline - 0.2558).abs() < 1e-9);
        assert!(m.detail.contains("2.12×"), "{}", m.detail);
        assert_eq!(a.counts()["t"].mfu_mismatches, 1);
        // Windows 2 and 3 close: the second report is compared, still off,
        // but the mismatch is not raised again.
        let mut later = Vec::new();
        for sec in 4..6 {
            feed(&a, sec, &mut later);
        }
        let kinds: Vec<&str> = later.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["mfu"], "{later:?}");
        // A fair report (tile overhead: OFU a little above MFU) re-arms;
        // the next inflated one is flagged again.
        let fair = a.report_mfu("t", "moe", 3_000, 4_000, 0.245);
        assert_eq!(fair.len(), 1);
        assert_eq!(fair[0].kind, "mfu");
        let again = a.report_mfu("t", "moe", 3_000, 4_000, 0.5427);
        assert_eq!(again.len(), 2, "{again:?}");
        assert_eq!(a.counts()["t"].mfu_mismatches, 2);
    }

    #[test]
    fn an_mfu_report_with_no_measured_window_compares_nothing() {
        let a = Analyzer::new(settings());
        for sec in 10..14 {
            a.observe(
                "t",
                "n",
                "job",
                "GPU-0",
                &samples(sec * 1000, sec * 1000 + 1000, 0.3, 0.3),
            );
        }
        // Before the job's first sample: nothing to compare with.
        assert!(a.report_mfu("t", "job", 1_000, 5_000, 0.9).is_empty());
        // An idle job reporting a tiny MFU is not judged.
        let idle = Analyzer::new(settings());
        for sec in 0..4 {
            idle.observe(
                "t",
                "n",
                "job",
                "GPU-0",
                &samples(sec * 1000, sec * 1000 + 1000, 0.001, 0.001),
            );
        }
        let ev = idle.report_mfu("t", "job", 1, 2_000, 0.04);
        assert_eq!(ev.iter().filter(|e| e.kind == "mfu_mismatch").count(), 0);
    }
}
