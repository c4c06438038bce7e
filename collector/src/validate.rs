//! Sample validation. Bad samples are dropped one by one and counted by a
//! stable reason name; good samples of the same batch are kept.
//!
//! Ordering rule: within one series of one batch, timestamps must strictly
//! increase; a sample at or before the previous kept one is `out_of_order`.
//! Across batches there is no rule: a batch replayed from an agent's spool
//! may carry older data than one already stored, and is accepted.

use flopwatch_proto::metrics::{self, Aggregation};
use flopwatch_proto::model::Batch;
use std::collections::{BTreeMap, HashSet};

/// Longest identifier (GPU UUID, metric, job id) accepted, bytes.
pub(crate) const MAX_ID_LEN: usize = 128;

/// Why a sample was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Value or peak is NaN or infinite.
    NonFinite,
    /// Timestamp too far in the future.
    FutureTimestamp,
    /// Timestamp older than retention.
    TooOld,
    /// Metric not in the catalog.
    UnknownMetric,
    /// GPU not in the agent's hello inventory.
    UnknownGpu,
    /// Not after the previous sample of the series in this batch.
    OutOfOrder,
    /// A ratio outside [0, 1] or a negative rate.
    OutOfRange,
    /// An identifier longer than [`MAX_ID_LEN`].
    StringTooLong,
    /// A new series past the tenant's `max_series` ([`crate::limits`]).
    SeriesLimit,
}

impl Reason {
    /// Every reason, for exporting zero counters.
    pub const ALL: [Reason; 9] = [
        Reason::NonFinite,
        Reason::FutureTimestamp,
        Reason::TooOld,
        Reason::UnknownMetric,
        Reason::UnknownGpu,
        Reason::OutOfOrder,
        Reason::OutOfRange,
        Reason::StringTooLong,
        Reason::SeriesLimit,
    ];

    /// Stable name (wire, logs, `/metrics`).
    pub fn name(self) -> &'static str {
        match self {
            Reason::NonFinite => "non_finite",
            Reason::FutureTimestamp => "future_timestamp",
            Reason::TooOld => "too_old",
            Reason::UnknownMetric => "unknown_metric",
            Reason::UnknownGpu => "unknown_gpu",
            Reason::OutOfOrder => "out_of_order",
            Reason::OutOfRange => "out_of_range",
            Reason::StringTooLong => "string_too_long",
            Reason::SeriesLimit => "series_limit",
        }
    }
}

/// What validation needs to know.
pub struct Rules<'a> {
    /// Collector's now, unix ms.
    pub now_ms: i64,
    /// Largest accepted lead over `now_ms`.
    pub max_future_ms: i64,
    /// Oldest accepted timestamp.
    pub oldest_ms: i64,
    /// GPUs of the agent's inventory.
    pub gpus: &'a HashSet<String>,
    /// Ids of the agent's node devices (InfiniBand ports, NUMA nodes, the
    /// host): their series are accepted like a GPU's; jobs are not.
    pub devices: &'a HashSet<String>,
}

/// Drops invalid samples from `batch` in place; returns counts by reason.
pub(crate) fn validate(batch: &mut Batch, rules: &Rules<'_>) -> BTreeMap<Reason, u64> {
    let mut rejected: BTreeMap<Reason, u64> = BTreeMap::new();
    let drop_all = |n: usize, r: Reason, rejected: &mut BTreeMap<Reason, u64>| {
        if n > 0 {
            *rejected.entry(r).or_default() += n as u64;
        }
    };
    batch.series.retain_mut(|s| {
        let n = s.points.len();
        if s.gpu_uuid.len() > MAX_ID_LEN || s.metric.len() > MAX_ID_LEN {
            drop_all(n, Reason::StringTooLong, &mut rejected);
            return false;
        }
        let Some(def) = metrics::lookup(&s.metric) else {
            drop_all(n, Reason::UnknownMetric, &mut rejected);
            return false;
        };
        if !rules.gpus.contains(&s.gpu_uuid) && !rules.devices.contains(&s.gpu_uuid) {
            drop_all(n, Reason::UnknownGpu, &mut rejected);
            return false;
        }
        let ratio = def.unit == "ratio";
        let mut last = i64::MIN;
        s.points.retain(|p| {
            let reason = if !p.value.is_finite() || p.peak.is_some_and(|v| !v.is_finite()) {
                Some(Reason::NonFinite)
            } else if p.ts_ms > rules.now_ms.saturating_add(rules.max_future_ms) {
                Some(Reason::FutureTimestamp)
            } else if p.ts_ms < rules.oldest_ms {
                Some(Reason::TooOld)
            } else if p.ts_ms <= last {
                Some(Reason::OutOfOrder)
            } else if (ratio && !(-1e-9..=1.0 + 1e-9).contains(&p.value))
                || (def.aggregation != Aggregation::Point && p.value < 0.0 && !ratio)
            {
                Some(Reason::OutOfRange)
            } else {
                None
            };
            match reason {
                Some(r) => {
                    *rejected.entry(r).or_default() += 1;
                    false
                }
                None => {
                    last = p.ts_ms;
                    true
                }
            }
        });
        !s.points.is_empty()
    });
    let before = batch.jobs.len();
    batch.jobs.retain(|j| {
        j.job_id.len() <= MAX_ID_LEN
            && j.pod.len() <= 253
            && j.namespace.len() <= 253
            && j.container.len() <= 253
            && j.hpc_job.len() <= MAX_ID_LEN
            && rules.gpus.contains(&j.gpu_uuid)
    });
    drop_all(
        before - batch.jobs.len(),
        Reason::StringTooLong,
        &mut rejected,
    );
    rejected
}

/// Decodes bytes as the ingest service receives an agent message and
/// validates its batch, as the service does: the path `collector/fuzz`
/// drives with arbitrary bytes. Returns the kept batch and the counts of
/// dropped samples, or why the message is refused as a whole.
pub fn decode_and_validate(
    bytes: &[u8],
    rules: &Rules<'_>,
) -> Result<(Batch, BTreeMap<Reason, u64>), String> {
    use flopwatch_proto::v1::{agent_message, AgentMessage};
    use prost::Message;
    let msg = AgentMessage::decode(bytes).map_err(|e| format!("undecodable: {e}"))?;
    let Some(agent_message::Msg::Batch(wire)) = msg.msg else {
        return Err("not a batch".into());
    };
    let mut batch = Batch::try_from(wire).map_err(|e| format!("malformed_batch: {e}"))?;
    let rejected = validate(&mut batch, rules);
    Ok((batch, rejected))
}

/// What validation guarantees of what it keeps: every series' metric is
/// known and its GPU or device in the inventory, its timestamps strictly
/// increase inside the accepted window, values and peaks are finite,
/// ratios lie in [0, 1], identifiers are short, and no series is empty.
/// The fuzz target asserts this on every input.
pub fn check_kept(batch: &Batch, rules: &Rules<'_>) -> Result<(), String> {
    for s in &batch.series {
        let def = metrics::lookup(&s.metric).ok_or("unknown metric kept")?;
        if !rules.gpus.contains(&s.gpu_uuid) && !rules.devices.contains(&s.gpu_uuid) {
            return Err("unknown GPU kept".into());
        }
        if s.points.is_empty() {
            return Err("empty series kept".into());
        }
        let mut last = i64::MIN;
        for p in &s.points {
            if p.ts_ms <= last {
                return Err("out-of-order sample kept".into());
            }
            last = p.ts_ms;
            if !p.value.is_finite() || p.peak.is_some_and(|v| !v.is_finite()) {
                return Err("non-finite value kept".into());
            }
            if p.ts_ms < rules.oldest_ms
                || p.ts_ms > rules.now_ms.saturating_add(rules.max_future_ms)
            {
                return Err("sample outside the time window kept".into());
            }
            if def.unit == "ratio" && !(-1e-9..=1.0 + 1e-9).contains(&p.value) {
                return Err("ratio out of range kept".into());
            }
        }
    }
    if batch
        .jobs
        .iter()
        .any(|j| j.job_id.len() > MAX_ID_LEN || !rules.gpus.contains(&j.gpu_uuid))
    {
        return Err("bad job assignment kept".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_proto::model::{Point, SeriesBatch};

    fn s(gpu: &str, metric: &str, pts: &[(i64, f64)]) -> SeriesBatch {
        SeriesBatch {
            gpu_uuid: gpu.into(),
            metric: metric.into(),
            points: pts.iter().map(|&(t, v)| Point::new(t, v)).collect(),
        }
    }

    #[test]
    fn drops_each_bad_sample_and_keeps_the_rest() {
        let gpus: HashSet<String> = ["GPU-1".to_string()].into();
        let devices: HashSet<String> = ["ib:mlx5_0:1@n1".to_string()].into();
        let rules = Rules {
            now_ms: 1_000_000,
            max_future_ms: 600_000,
            oldest_ms: 10_000,
            gpus: &gpus,
            devices: &devices,
        };
        let mut b = Batch {
            seq: 1,
            series: vec![
                s(
                    "GPU-1",
                    "tensor_active",
                    &[
                        (100_000, 0.5),
                        (100_100, f64::NAN),
                        (100_100, 0.4),
                        (100_050, 0.4),
                        (5_000, 0.4),
                        (2_000_000, 0.4),
                        (100_200, 1.5),
                        (100_300, 0.3),
                    ],
                ),
                s("GPU-1", "bogus", &[(100_000, 1.0)]),
                s("GPU-9", "power_w", &[(100_000, 1.0), (100_100, 1.0)]),
                s("GPU-1", "power_w", &[(100_000, 300.0)]),
                s("GPU-1", &"x".repeat(200), &[(100_000, 1.0)]),
                s("ib:mlx5_0:1@n1", "ib_rx_bytes_s", &[(100_000, 4e10)]),
                s("ib:mlx5_9:1@n1", "ib_rx_bytes_s", &[(100_000, 4e10)]),
            ],
            ..Default::default()
        };
        let r = validate(&mut b, &rules);
        assert_eq!(r.get(&Reason::NonFinite), Some(&1));
        assert_eq!(r.get(&Reason::OutOfOrder), Some(&1));
        assert_eq!(r.get(&Reason::TooOld), Some(&1));
        assert_eq!(r.get(&Reason::FutureTimestamp), Some(&1));
        assert_eq!(r.get(&Reason::OutOfRange), Some(&1));
        assert_eq!(r.get(&Reason::UnknownMetric), Some(&1));
        assert_eq!(r.get(&Reason::UnknownGpu), Some(&3));
        assert_eq!(r.get(&Reason::StringTooLong), Some(&1));
        assert_eq!(b.series.len(), 3);
        assert_eq!(b.series[2].gpu_uuid, "ib:mlx5_0:1@n1");
        let kept: Vec<i64> = b.series[0].points.iter().map(|p| p.ts_ms).collect();
        assert_eq!(kept, vec![100_000, 100_100, 100_300]);
        assert_eq!(b.sample_count(), 5);
    }
}
