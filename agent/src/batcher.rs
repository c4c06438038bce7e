//! Groups captures into batches: samples per GPU × metric, columnar.

use crate::source::Capture;
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
                    .push(Point {
                        ts_ms: capture.ts_ms,
                        value: r.value,
                        peak: None,
                        window_ms: (g.window_ms > 0).then_some(g.window_ms),
                    });
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
