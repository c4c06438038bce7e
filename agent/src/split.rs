//! Splitting a batch to stay under the collector's size limit
//! (`Welcome.max_batch_bytes`): a collector refuses a larger batch as a
//! whole, so the agent cuts it first.
//!
//! The collector derives OFU from a GPU's tensor activity and SM clock at
//! the same timestamps *within one batch*, so a split keeps each GPU's (or
//! device's) series together: whole GPUs are packed into parts; a GPU too
//! large on its own is cut by time, every one of its series at the same
//! instants. Attribution rides on every part (a batch's jobs are the
//! node's whole attribution: a part without them would end every job);
//! events, intervals and MFU reports on the first.

use flopwatch_proto::v1;
use prost::Message;
use std::collections::BTreeMap;

/// Splits `batch` into batches of at most `max_bytes` encoded bytes where
/// the data allows (a single sample larger than the limit stays whole and
/// is refused by the collector). `max_bytes` of 0 means no limit.
pub(crate) fn split(batch: v1::Batch, max_bytes: usize) -> Vec<v1::Batch> {
    if max_bytes == 0 || batch.encoded_len() <= max_bytes {
        return vec![batch];
    }
    let mut head = batch;
    let series = std::mem::take(&mut head.series);
    // Room for the series of a part: the limit less the first part's
    // metadata (later parts carry less), less the length prefixes.
    let meta = head.encoded_len();
    let room = max_bytes.saturating_sub(meta).max(1);
    let mut groups: BTreeMap<String, Vec<v1::Series>> = BTreeMap::new();
    for s in series {
        groups.entry(s.gpu_uuid.clone()).or_default().push(s);
    }
    let mut pieces: Vec<Vec<v1::Series>> = Vec::new();
    for (_, group) in groups {
        if size(&group) <= room {
            pieces.push(group);
        } else {
            pieces.extend(by_time(group, room));
        }
    }
    // Pack pieces into parts, first fit in order.
    let mut parts: Vec<Vec<v1::Series>> = Vec::new();
    let mut current: Vec<v1::Series> = Vec::new();
    for p in pieces {
        if !current.is_empty() && size(&current) + size(&p) > room {
            parts.push(std::mem::take(&mut current));
        }
        current.extend(p);
    }
    if !current.is_empty() {
        parts.push(current);
    }
    let tail = v1::Batch {
        agent_id: head.agent_id.clone(),
        boot_id: head.boot_id.clone(),
        sent_at_ms: head.sent_at_ms,
        from_spool: head.from_spool,
        pending_bytes: head.pending_bytes,
        pending_batches: head.pending_batches,
        jobs: head.jobs.clone(),
        ..Default::default()
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(i, series)| {
            let mut b = if i == 0 { head.clone() } else { tail.clone() };
            b.series = series;
            b
        })
        .collect()
}

/// Encoded bytes of series inside a batch (field tag and length included).
fn size(series: &[v1::Series]) -> usize {
    series
        .iter()
        .map(|s| {
            let n = s.encoded_len();
            1 + prost::length_delimiter_len(n) + n
        })
        .sum()
}

/// Cuts one GPU's series at common instants into pieces of at most `room`
/// bytes each (as far as single instants allow).
fn by_time(group: Vec<v1::Series>, room: usize) -> Vec<Vec<v1::Series>> {
    let mut instants: Vec<i64> = group
        .iter()
        .flat_map(|s| s.timestamps_ms.iter().copied())
        .collect();
    instants.sort_unstable();
    instants.dedup();
    let total = size(&group);
    let mut k = total.div_ceil(room).max(2);
    loop {
        let cuts: Vec<i64> = (1..k).map(|i| instants[i * instants.len() / k]).collect();
        let pieces = cut_at(&group, &cuts);
        if pieces.iter().all(|p| size(p) <= room) || k >= instants.len() {
            return pieces;
        }
        k = (k * 2).min(instants.len());
    }
}

/// The group's points in `[-∞, c0)`, `[c0, c1)`, …, `[cn, ∞)`; empty
/// pieces dropped.
fn cut_at(group: &[v1::Series], cuts: &[i64]) -> Vec<Vec<v1::Series>> {
    let mut bounds = vec![i64::MIN];
    bounds.extend(cuts.iter().copied());
    bounds.push(i64::MAX);
    bounds.dedup();
    bounds
        .windows(2)
        .map(|w| {
            group
                .iter()
                .filter_map(|s| slice(s, w[0], w[1]))
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// The points of `s` with `from <= t < to` (`to` of `i64::MAX` includes
/// it), or `None` when there are none.
fn slice(s: &v1::Series, from: i64, to: i64) -> Option<v1::Series> {
    let idx: Vec<usize> = s
        .timestamps_ms
        .iter()
        .enumerate()
        .filter(|(_, &t)| t >= from && (t < to || to == i64::MAX))
        .map(|(i, _)| i)
        .collect();
    if idx.is_empty() {
        return None;
    }
    let pick_f = |v: &[f64]| -> Vec<f64> {
        if v.len() == s.timestamps_ms.len() {
            idx.iter().map(|&i| v[i]).collect()
        } else {
            Vec::new()
        }
    };
    Some(v1::Series {
        gpu_uuid: s.gpu_uuid.clone(),
        metric: s.metric.clone(),
        timestamps_ms: idx.iter().map(|&i| s.timestamps_ms[i]).collect(),
        values: pick_f(&s.values),
        peaks: pick_f(&s.peaks),
        window_ms: if s.window_ms.len() == s.timestamps_ms.len() {
            idx.iter().map(|&i| s.window_ms[i]).collect()
        } else {
            Vec::new()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn series(gpu: &str, metric: &str, n: usize, t0: i64) -> v1::Series {
        v1::Series {
            gpu_uuid: gpu.into(),
            metric: metric.into(),
            timestamps_ms: (0..n as i64).map(|i| t0 + i * 100).collect(),
            values: (0..n).map(|i| i as f64 * 1.37).collect(),
            peaks: Vec::new(),
            window_ms: vec![100; n],
        }
    }

    fn batch(gpus: usize, metrics: &[&str], n: usize) -> v1::Batch {
        v1::Batch {
            seq: 0,
            agent_id: "a".into(),
            boot_id: "b".into(),
            series: (0..gpus)
                .flat_map(|g| {
                    metrics
                        .iter()
                        .map(move |m| series(&format!("GPU-{g}"), m, n, 1_000))
                })
                .collect(),
            jobs: vec![v1::JobAssignment {
                gpu_uuid: "GPU-0".into(),
                job_id: "j".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// (gpu, metric, ts) → value of every point.
    fn points(bs: &[v1::Batch]) -> Vec<(String, String, i64, u64)> {
        let mut v: Vec<_> = bs
            .iter()
            .flat_map(|b| b.series.iter())
            .flat_map(|s| {
                s.timestamps_ms
                    .iter()
                    .zip(&s.values)
                    .map(|(t, x)| (s.gpu_uuid.clone(), s.metric.clone(), *t, x.to_bits()))
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_small_batch_is_left_alone() {
        let b = batch(2, &["tensor_active"], 10);
        assert_eq!(split(b.clone(), 1 << 20), vec![b.clone()]);
        assert_eq!(split(b.clone(), 0), vec![b]);
    }

    #[test]
    fn whole_gpus_are_packed_and_metadata_rides_first() {
        let b = batch(8, &["tensor_active", "sm_clock_avg_mhz", "power_w"], 200);
        let limit = b.encoded_len() / 3;
        let parts = split(b.clone(), limit);
        assert!(parts.len() >= 3);
        for p in &parts {
            assert!(p.encoded_len() <= limit, "{} > {limit}", p.encoded_len());
            // Every GPU of a part has all three metrics.
            let mut per_gpu: BTreeMap<&str, usize> = BTreeMap::new();
            for s in &p.series {
                *per_gpu.entry(&s.gpu_uuid).or_default() += 1;
            }
            assert!(per_gpu.values().all(|&n| n == 3), "{per_gpu:?}");
        }
        assert_eq!(parts[0].jobs.len(), 1);
        assert!(parts.iter().all(|p| p.jobs == parts[0].jobs));
        assert_eq!(points(&parts), points(&[b]));
    }

    #[test]
    fn one_large_gpu_is_cut_at_common_instants() {
        let b = batch(1, &["tensor_active", "sm_clock_avg_mhz"], 5_000);
        let limit = b.encoded_len() / 4;
        let parts = split(b.clone(), limit);
        assert!(parts.len() >= 4);
        for p in &parts {
            assert!(p.encoded_len() <= limit);
            assert_eq!(p.series.len(), 2);
            assert_eq!(p.series[0].timestamps_ms, p.series[1].timestamps_ms);
        }
        assert_eq!(points(&parts), points(&[b]));
    }

    proptest! {
        #[test]
        fn no_point_is_lost_or_duplicated(gpus in 1usize..6, n in 1usize..400, div in 1usize..20) {
            let b = batch(gpus, &["tensor_active", "power_w"], n);
            let limit = (b.encoded_len() / div).max(64);
            let parts = split(b.clone(), limit);
            prop_assert_eq!(points(&parts), points(&[b]));
        }
    }
}
