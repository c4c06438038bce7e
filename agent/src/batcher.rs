//! Groups captures into batches: samples per GPU × metric, columnar.
//! Each reading becomes its stored point through
//! [`Reading::point`](crate::capture::Reading::point), the pipeline's one
//! conversion.

use crate::capture::Capture;
use flopwatch_proto::model::{Batch, Event, GpuInfo, JobAssignment, Point, SeriesBatch};
use std::collections::BTreeMap;

/// Accumulates captures until cut.
#[derive(Debug, Default)]
pub struct Batcher {
    series: BTreeMap<(usize, &'static str), Vec<Point>>,
    jobs: BTreeMap<usize, JobAssignment>,
    events: Vec<Event>,
    samples: usize,
}

impl Batcher {
    /// Adds a capture.
    pub fn add(&mut self, capture: Capture, inventory: &[GpuInfo]) {
        for g in capture.gpus {
            if g.gpu >= inventory.len() {
                continue;
            }
            for r in g.readings {
                self.series
                    .entry((g.gpu, r.metric))
                    .or_default()
                    .push(r.point(capture.ts_ms, g.window_ms));
                self.samples += 1;
            }
        }
        // The capture's attribution is the current one: a job that ended
        // disappears from the next batch.
        self.jobs.clear();
        for j in capture.jobs {
            if let Some(i) = inventory.iter().position(|g| g.uuid == j.gpu_uuid) {
                self.jobs.insert(i, j);
            }
        }
        self.events.extend(capture.events);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.samples == 0 && self.events.is_empty()
    }

    /// Takes everything as a batch (seq 0: numbered when first sent).
    pub fn cut(
        &mut self,
        inventory: &[GpuInfo],
        agent_id: &str,
        boot_id: &str,
        now_ms: i64,
    ) -> Batch {
        let series = std::mem::take(&mut self.series)
            .into_iter()
            .map(|((gpu, metric), points)| SeriesBatch {
                gpu_uuid: inventory[gpu].uuid.clone(),
                metric: metric.to_string(),
                points,
            })
            .collect();
        self.samples = 0;
        Batch {
            seq: 0,
            agent_id: agent_id.to_string(),
            boot_id: boot_id.to_string(),
            series,
            // Attribution rides on every batch: the collector needs no state
            // from earlier batches to attribute this one.
            jobs: self.jobs.values().cloned().collect(),
            events: std::mem::take(&mut self.events),
            sent_at_ms: now_ms,
            ..Batch::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};
    use flopwatch_proto::metrics;

    #[test]
    fn an_aggregated_reading_keeps_its_window_and_peak() {
        let inventory = vec![GpuInfo {
            uuid: "GPU-0".into(),
            ..Default::default()
        }];
        let mut r = Reading::new(metrics::TENSOR_ACTIVE, 0.3);
        r.window_ms = Some(6_400);
        r.peak = Some(0.8);
        let mut b = Batcher::default();
        b.add(
            Capture {
                ts_ms: 10_000,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: 100,
                    readings: vec![r, Reading::new(metrics::POWER_W, 300.0)],
                }],
                ..Default::default()
            },
            &inventory,
        );
        let batch = b.cut(&inventory, "n", "b", 10_000);
        let by_metric = |m: &str| batch.series.iter().find(|s| s.metric == m).unwrap().points[0];
        assert_eq!(
            by_metric(metrics::TENSOR_ACTIVE),
            Point {
                ts_ms: 10_000,
                value: 0.3,
                peak: Some(0.8),
                window_ms: Some(6_400)
            }
        );
        assert_eq!(by_metric(metrics::POWER_W).window_ms, Some(100));
    }
}
