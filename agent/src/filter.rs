//! Which metrics an agent keeps: its own allow-list (`metrics`,
//! `metrics_file` in agent.toml) and the metric set of the collector's
//! policy (a set chosen by `flopwatch select`), both at once. The OFU
//! inputs are always kept: without them the collector cannot compute OFU.
//!
//! The one place the allow-lists are applied: a metric either list drops
//! is removed from every capture, and once seen it is left out of the read
//! plan ([`MetricFilter::plan`]), so a field-by-field source (NVML) does
//! not read it at all.

use crate::capture::{Capture, ReadPlan};
use flopwatch_proto::metrics::OFU_INPUTS;
use std::collections::HashSet;

/// The agent's metric filter. See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct MetricFilter {
    /// The agent's own list (all metrics when `None`).
    config: Option<HashSet<String>>,
    /// The collector policy's list (all metrics when empty).
    policy: Vec<String>,
    /// (gpu, metric) pairs seen and dropped.
    dropped: ReadPlan,
}

impl MetricFilter {
    /// Keeps `config` (every metric when `None`).
    pub(crate) fn new(config: Option<HashSet<String>>) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The collector's policy names `metrics` (empty: no restriction). A
    /// new list forgets what the old one dropped, so its metrics are read
    /// again.
    pub(crate) fn set_policy(&mut self, metrics: &[String]) {
        if self.policy != metrics {
            self.policy = metrics.to_vec();
            self.dropped = ReadPlan::all();
        }
    }

    /// Whether `metric` is kept.
    pub(crate) fn keeps(&self, metric: &str) -> bool {
        OFU_INPUTS.contains(&metric)
            || (self.config.as_ref().is_none_or(|c| c.contains(metric))
                && (self.policy.is_empty() || self.policy.iter().any(|m| m == metric)))
    }

    /// Removes the readings that are not kept from `capture`.
    pub(crate) fn apply(&mut self, capture: &mut Capture) {
        if self.config.is_none() && self.policy.is_empty() {
            return;
        }
        for g in &mut capture.gpus {
            let gpu = g.gpu;
            let mut dropped = std::mem::take(&mut self.dropped);
            g.readings.retain(|r| {
                let keep = self.keeps(r.metric);
                if !keep {
                    dropped.skip(gpu, r.metric);
                }
                keep
            });
            self.dropped = dropped;
        }
    }

    /// `plan` without the readings this filter drops.
    pub(crate) fn plan(&self, plan: ReadPlan) -> ReadPlan {
        plan.also_skipping(&self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};
    use flopwatch_proto::metrics;

    fn capture() -> Capture {
        Capture {
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 100,
                readings: vec![
                    Reading::new(metrics::POWER_W, 1.0),
                    Reading::new(metrics::TEMP_C, 2.0),
                    Reading::new(metrics::TENSOR_ACTIVE, 0.5),
                ],
            }],
            ..Default::default()
        }
    }

    fn names(c: &Capture) -> Vec<&'static str> {
        c.gpus[0].readings.iter().map(|r| r.metric).collect()
    }

    #[test]
    fn both_lists_apply_and_ofu_inputs_stay() {
        let mut f = MetricFilter::new(Some([metrics::POWER_W.to_string()].into()));
        let mut c = capture();
        f.apply(&mut c);
        assert_eq!(names(&c), [metrics::POWER_W, metrics::TENSOR_ACTIVE]);
        // The policy's list narrows further; the OFU inputs still stay.
        f.set_policy(&[metrics::TEMP_C.to_string()]);
        let mut c = capture();
        f.apply(&mut c);
        assert_eq!(names(&c), [metrics::TENSOR_ACTIVE]);
    }

    #[test]
    fn dropped_metrics_leave_the_read_plan_until_the_policy_changes() {
        let mut f = MetricFilter::new(None);
        assert_eq!(f.plan(ReadPlan::all()), ReadPlan::all());
        f.set_policy(&[metrics::POWER_W.to_string()]);
        f.apply(&mut capture());
        let plan = f.plan(ReadPlan::all());
        assert!(!plan.wants(0, metrics::TEMP_C));
        assert!(plan.wants(0, metrics::POWER_W));
        assert!(plan.wants(1, metrics::TEMP_C));
        // A sampler's own skips are kept.
        let plan = f.plan(ReadPlan::skipping(vec![(0, metrics::POWER_W)]));
        assert!(!plan.wants(0, metrics::POWER_W) && !plan.wants(0, metrics::TEMP_C));
        f.set_policy(&[]);
        assert!(f.plan(ReadPlan::all()).wants(0, metrics::TEMP_C));
        let mut c = capture();
        f.apply(&mut c);
        assert_eq!(c.gpus[0].readings.len(), 3);
    }
}
