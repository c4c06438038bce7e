//! What `flopwatch top` shows, built from the Query service's answers.
//!
//! Pure data and no I/O: `fetch` fills [`Responses`], [`Snapshot::build`]
//! turns them into rows, and `render` draws rows, so the whole view is
//! tested without a collector.

use flopwatch_proto::v1;
use std::cmp::Ordering;
use std::collections::HashMap;

/// OFU of one scope over a range (OFU eq. 1 per sample, averaged as eq. 11).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Ofu {
    /// Mean OFU, 0..1.
    pub mean: f64,
    /// 10th percentile of the per-GPU means (a job's stragglers).
    pub p10: f64,
    /// Mean tensor pipe activity, 0..1, when the answer had a point.
    pub tensor_active: Option<f64>,
    /// Mean SM clock, MHz, when the answer had a point.
    pub sm_clock_mhz: Option<f64>,
    /// GPUs that had samples.
    pub gpus: u32,
    /// Peak dense TFLOP/s of those GPUs.
    pub peak_tflops: f64,
    /// TFLOP/s implied by OFU.
    pub achieved_tflops: f64,
}

impl Ofu {
    /// The summary of an answer; `None` when the range held no sample.
    pub(super) fn from_response(r: &v1::OfuResponse) -> Option<Self> {
        let s = r.summary.as_ref()?;
        if s.samples == 0 {
            return None;
        }
        // `fetch` asks for one bucket over the window, so one point carries
        // the window's tensor activity and clock; should there be more,
        // weigh them by their GPU count.
        let weight: f64 = r.points.iter().map(|p| f64::from(p.gpus.max(1))).sum();
        let avg = |f: fn(&v1::OfuPoint) -> f64| {
            (weight > 0.0).then(|| {
                r.points
                    .iter()
                    .map(|p| f(p) * f64::from(p.gpus.max(1)))
                    .sum::<f64>()
                    / weight
            })
        };
        Some(Self {
            mean: s.mean,
            p10: s.p10,
            tensor_active: avg(|p| p.tensor_active),
            sm_clock_mhz: avg(|p| p.sm_clock_mhz),
            gpus: s.gpus,
            peak_tflops: s.peak_tflops,
            achieved_tflops: s.achieved_tflops,
        })
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NodeRow {
    pub node_id: String,
    pub gpus: u32,
    pub last_seen_ms: i64,
    pub ofu: Option<Ofu>,
    /// Asked for, and no OFU sample in the window: its inputs are stale.
    pub stale: bool,
}

/// One job.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct JobRow {
    pub job_id: String,
    pub gpus: usize,
    pub nodes: usize,
    pub ofu: Option<Ofu>,
    /// Asked for, and no OFU sample in the window: it ended (or its GPUs'
    /// inputs are stale).
    pub ended: bool,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GpuRow {
    pub node_id: String,
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// Empty when the GPU runs no job.
    pub job_id: String,
    pub ofu: Option<Ofu>,
    /// Asked for, and no OFU sample in the window: its OFU input is stale
    /// (the profiling fields left, or its agent stopped).
    pub stale: bool,
}

/// The raw answers of one refresh.
#[derive(Debug, Default)]
pub(super) struct Responses {
    pub nodes: Vec<v1::NodeEntry>,
    pub gpus: Vec<v1::GpuEntry>,
    pub jobs: Vec<v1::JobEntry>,
    /// Fleet over the window, one bucket.
    pub fleet_now: Option<v1::OfuResponse>,
    /// Fleet over `--since`, bucketed for the sparkline.
    pub fleet_series: Option<v1::OfuResponse>,
    /// By node id, job id and GPU UUID; a scope whose call failed is absent.
    pub node_ofu: HashMap<String, v1::OfuResponse>,
    pub job_ofu: HashMap<String, v1::OfuResponse>,
    pub gpu_ofu: HashMap<String, v1::OfuResponse>,
    /// GPUs whose OFU was asked for (the rest show no figure).
    pub gpus_queried: usize,
}

/// Everything one frame shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Snapshot {
    /// Collector URL.
    pub collector: String,
    /// When the answers were asked for, unix ms; 0 before the first.
    pub taken_ms: i64,
    /// Length of the "now" window, ms.
    pub window_ms: i64,
    /// Length of the sparkline's range, ms.
    pub since_ms: i64,
    /// Fleet over the window.
    pub fleet_now: Option<Ofu>,
    /// Fleet over `since_ms`.
    pub fleet_since: Option<Ofu>,
    /// Fleet OFU per bucket over `since_ms`, oldest first.
    pub fleet_series: Vec<f64>,
    pub nodes: Vec<NodeRow>,
    pub jobs: Vec<JobRow>,
    pub gpus: Vec<GpuRow>,
    /// GPUs whose OFU was asked for.
    pub gpus_queried: usize,
    /// Why the last refresh failed (the rows are then from an earlier one).
    pub error: Option<String>,
}

impl Snapshot {
    /// Nothing yet: before the first answer.
    pub(super) fn empty(collector: &str, window_ms: i64, since_ms: i64) -> Self {
        Self {
            collector: collector.to_string(),
            window_ms,
            since_ms,
            ..Self::default()
        }
    }

    /// The rows of one refresh taken at `taken_ms`.
    pub(super) fn build(
        collector: &str,
        taken_ms: i64,
        window_ms: i64,
        since_ms: i64,
        r: Responses,
    ) -> Self {
        let ofu =
            |m: &HashMap<String, v1::OfuResponse>, k: &str| m.get(k).and_then(Ofu::from_response);
        let stale = |m: &HashMap<String, v1::OfuResponse>, k: &str| {
            m.get(k).is_some_and(|r| Ofu::from_response(r).is_none())
        };
        let nodes = r
            .nodes
            .iter()
            .map(|n| NodeRow {
                node_id: n.node_id.clone(),
                gpus: n.gpus,
                last_seen_ms: n.last_seen_ms,
                ofu: ofu(&r.node_ofu, &n.node_id),
                stale: stale(&r.node_ofu, &n.node_id),
            })
            .collect();
        let jobs = r
            .jobs
            .iter()
            .map(|j| JobRow {
                job_id: j.job_id.clone(),
                gpus: j.gpu_uuids.len(),
                nodes: j.node_ids.len(),
                ofu: ofu(&r.job_ofu, &j.job_id),
                ended: stale(&r.job_ofu, &j.job_id),
            })
            .collect();
        let gpus = r
            .gpus
            .iter()
            .map(|g| {
                let info = g.info.clone().unwrap_or_default();
                GpuRow {
                    node_id: g.node_id.clone(),
                    index: info.index,
                    ofu: ofu(&r.gpu_ofu, &info.uuid),
                    stale: stale(&r.gpu_ofu, &info.uuid),
                    uuid: info.uuid,
                    model: info.model,
                    job_id: g.job_id.clone(),
                }
            })
            .collect();
        let fleet_series = r
            .fleet_series
            .as_ref()
            .map(|s| settled(&s.points))
            .unwrap_or_default();
        Self {
            collector: collector.to_string(),
            taken_ms,
            window_ms,
            since_ms,
            fleet_now: r.fleet_now.as_ref().and_then(Ofu::from_response),
            fleet_since: r.fleet_series.as_ref().and_then(Ofu::from_response),
            fleet_series,
            nodes,
            jobs,
            gpus,
            gpus_queried: r.gpus_queried,
            error: None,
        }
    }
}

/// OFU of the buckets, less the newest ones still filling: agents flush
/// every second or so, so the last bucket may hold only some GPUs and
/// swing. Trailing buckets with fewer GPUs than the series' best are
/// dropped, at most two, so a node that stops still shows within two.
fn settled(points: &[v1::OfuPoint]) -> Vec<f64> {
    let most = points.iter().map(|p| p.gpus).max().unwrap_or(0);
    let mut n = points.len();
    for _ in 0..2 {
        if n > 1 && points[n - 1].gpus < most {
            n -= 1;
        }
    }
    points[..n].iter().map(|p| p.ofu).collect()
}

/// Row order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Sort {
    /// Highest OFU first.
    #[default]
    OfuDesc,
    /// Lowest OFU first: the idle and the stragglers.
    OfuAsc,
    /// By node and GPU index, job id.
    Name,
}

impl Sort {
    /// The next order (`s`).
    pub(super) fn next(self) -> Self {
        match self {
            Sort::OfuDesc => Sort::OfuAsc,
            Sort::OfuAsc => Sort::Name,
            Sort::Name => Sort::OfuDesc,
        }
    }

    /// For the footer and titles.
    pub(super) fn label(self) -> &'static str {
        match self {
            Sort::OfuDesc => "OFU desc",
            Sort::OfuAsc => "OFU asc",
            Sort::Name => "name",
        }
    }

    /// Orders two rows by OFU (rows without a figure last, either way),
    /// then by name.
    fn cmp(self, a: Option<&Ofu>, b: Option<&Ofu>, by_name: Ordering) -> Ordering {
        let by_ofu = match (a, b) {
            (Some(a), Some(b)) => {
                let o = a.mean.total_cmp(&b.mean);
                match self {
                    Sort::OfuDesc => o.reverse(),
                    Sort::OfuAsc => o,
                    Sort::Name => Ordering::Equal,
                }
            }
            _ if self == Sort::Name => Ordering::Equal,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        by_ofu.then(by_name)
    }
}

/// What the user chose: scroll position and order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ViewState {
    /// First GPU row shown.
    pub scroll: usize,
    pub sort: Sort,
}

/// GPU rows in `sort` order.
pub(super) fn sorted_gpus(s: &Snapshot, sort: Sort) -> Vec<&GpuRow> {
    let mut v: Vec<&GpuRow> = s.gpus.iter().collect();
    v.sort_by(|a, b| {
        sort.cmp(
            a.ofu.as_ref(),
            b.ofu.as_ref(),
            (&a.node_id, a.index, &a.uuid).cmp(&(&b.node_id, b.index, &b.uuid)),
        )
    });
    v
}

/// Job rows in `sort` order.
pub(super) fn sorted_jobs(s: &Snapshot, sort: Sort) -> Vec<&JobRow> {
    let mut v: Vec<&JobRow> = s.jobs.iter().collect();
    v.sort_by(|a, b| sort.cmp(a.ofu.as_ref(), b.ofu.as_ref(), a.job_id.cmp(&b.job_id)));
    v
}

/// Node rows in `sort` order.
pub(super) fn sorted_nodes(s: &Snapshot, sort: Sort) -> Vec<&NodeRow> {
    let mut v: Vec<&NodeRow> = s.nodes.iter().collect();
    v.sort_by(|a, b| sort.cmp(a.ofu.as_ref(), b.ofu.as_ref(), a.node_id.cmp(&b.node_id)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(mean: f64, tensor: f64, clock: f64) -> v1::OfuResponse {
        v1::OfuResponse {
            points: vec![v1::OfuPoint {
                timestamp_ms: 1,
                ofu: mean,
                tensor_active: tensor,
                sm_clock_mhz: clock,
                gpus: 1,
            }],
            summary: Some(v1::OfuSummary {
                mean,
                p10: mean,
                samples: 10,
                gpus: 1,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn an_answer_without_samples_has_no_figure() {
        let empty = v1::OfuResponse {
            points: vec![],
            summary: Some(v1::OfuSummary::default()),
        };
        assert_eq!(Ofu::from_response(&empty), None);
        let o = Ofu::from_response(&answer(0.4, 0.5, 1584.0)).unwrap();
        assert_eq!(o.tensor_active, Some(0.5));
        assert_eq!(o.sm_clock_mhz, Some(1584.0));
    }

    #[test]
    fn the_filling_buckets_leave_the_sparkline() {
        let p = |ofu, gpus| v1::OfuPoint {
            ofu,
            gpus,
            ..Default::default()
        };
        let pts = [p(0.4, 4), p(0.5, 4), p(0.9, 2), p(0.1, 1)];
        assert_eq!(settled(&pts), [0.4, 0.5]);
        let pts = [p(0.4, 4), p(0.5, 2), p(0.6, 2), p(0.7, 2)];
        assert_eq!(settled(&pts), [0.4, 0.5], "at most two dropped");
        assert_eq!(settled(&[p(0.3, 1)]), [0.3]);
        assert!(settled(&[]).is_empty());
    }

    #[test]
    fn rows_without_ofu_sort_last_both_ways() {
        let mut r = Responses::default();
        for (i, uuid) in ["a", "b", "c"].into_iter().enumerate() {
            r.gpus.push(v1::GpuEntry {
                info: Some(v1::GpuInfo {
                    index: i as u32,
                    uuid: uuid.into(),
                    ..Default::default()
                }),
                node_id: "n".into(),
                ..Default::default()
            });
        }
        r.gpu_ofu.insert("a".into(), answer(0.1, 0.1, 1000.0));
        r.gpu_ofu.insert("c".into(), answer(0.9, 0.9, 1000.0));
        let s = Snapshot::build("u", 1, 60_000, 300_000, r);
        let ids = |sort| {
            sorted_gpus(&s, sort)
                .iter()
                .map(|g| g.uuid.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(Sort::OfuDesc), ["c", "a", "b"]);
        assert_eq!(ids(Sort::OfuAsc), ["a", "c", "b"]);
        assert_eq!(ids(Sort::Name), ["a", "b", "c"]);
        assert_eq!(Sort::OfuDesc.next().next().next(), Sort::OfuDesc);
    }
}
