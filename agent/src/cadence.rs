//! Slow metrics on a slower cadence than the capture interval.
//!
//! Cumulative counters (energy, ECC, NVLink and PCIe errors, InfiniBand
//! errors and discards) and the NVLink link state lose nothing when read
//! once a second instead of every 100 ms: a counter's increase between two
//! reads is the same whether or not it was read in between, and links go
//! down far more rarely than that. They are also the costly reads: the
//! NVLink error counters alone are 4 NVML calls per link, 18 links × 8 GPUs
//! per capture, most of all the calls a capture makes. [`SlowReads`] leaves
//! them out of the read plan except at the first capture of each period
//! (periods are aligned to the unix epoch, so every node reads them in the
//! same query buckets); a skipped counter read is simply not taken (see
//! [`PlanCarry`](crate::capture::PlanCarry)).

use crate::capture::ReadPlan;
use flopwatch_proto::metrics::{self as m, Aggregation};
use std::time::Duration;

/// Metrics read once per period: every counter of the catalog, and the
/// NVLink link state (read in the same loop over the links as the NVLink
/// error counters, so one without the other saves nothing).
pub fn is_slow(metric: &str) -> bool {
    metric == m::NVLINK_LINKS_ACTIVE
        || m::lookup(metric).is_some_and(|d| d.aggregation == Aggregation::Counter)
}

/// Decides, capture by capture, whether the slow metrics are read.
#[derive(Debug, Clone)]
pub struct SlowReads {
    period_ms: i64,
    /// The slow metrics of the catalog, for the plan's (device, metric) pairs.
    metrics: Vec<&'static str>,
    /// When they were last read, unix ms.
    last_ms: Option<i64>,
    /// The pairs skipped between reads, sorted; made again only when the
    /// number of devices changes.
    skip: Vec<(usize, &'static str)>,
    devices: usize,
}

impl SlowReads {
    /// Slow metrics once every `period`; a period no longer than the
    /// capture interval reads them at every capture.
    pub fn new(period: Duration) -> Self {
        Self {
            period_ms: i64::try_from(period.as_millis()).unwrap_or(i64::MAX),
            metrics: m::CATALOG
                .iter()
                .map(|d| d.name)
                .filter(|n| is_slow(n))
                .collect(),
            last_ms: None,
            skip: Vec::new(),
            devices: 0,
        }
    }

    /// `plan` for the capture at `now_ms` over `devices` series owners
    /// (GPUs, then node devices): the slow metrics are left out unless this
    /// is the first capture of a period.
    pub fn plan(&mut self, plan: ReadPlan, now_ms: i64, devices: usize) -> ReadPlan {
        if self.period_ms <= 0 {
            return plan;
        }
        let period = now_ms.div_euclid(self.period_ms);
        if self
            .last_ms
            .is_none_or(|t| t.div_euclid(self.period_ms) != period)
        {
            self.last_ms = Some(now_ms);
            return plan;
        }
        if self.devices != devices || self.skip.is_empty() {
            self.devices = devices;
            self.skip = (0..devices)
                .flat_map(|d| self.metrics.iter().map(move |&metric| (d, metric)))
                .collect();
            self.skip.sort_unstable();
        }
        plan.also_skipping(&self.skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_link_state_are_slow_the_ofu_inputs_are_not() {
        for metric in [
            m::ENERGY_J,
            m::ECC_SBE_TOTAL,
            m::ECC_DBE_TOTAL,
            m::NVLINK_ERRORS_TOTAL,
            m::NVLINK_LINKS_ACTIVE,
            m::PCIE_REPLAY_TOTAL,
            m::IB_LINK_ERRORS_TOTAL,
        ] {
            assert!(is_slow(metric), "{metric}");
        }
        for metric in m::OFU_INPUTS.iter().chain(&[m::POWER_W, m::TEMP_C]) {
            assert!(!is_slow(metric), "{metric}");
        }
    }

    #[test]
    fn slow_metrics_are_read_at_the_first_capture_of_each_period() {
        let mut slow = SlowReads::new(Duration::from_secs(1));
        let read = |slow: &mut SlowReads, now: i64| {
            slow.plan(ReadPlan::all(), now, 2)
                .wants(1, m::NVLINK_ERRORS_TOTAL)
        };
        // 100 ms captures, a little late: one read per unix second.
        let reads: Vec<i64> = (0..30)
            .map(|i| 10_050 + i * 100)
            .filter(|&now| read(&mut slow, now))
            .collect();
        assert_eq!(reads, vec![10_050, 11_050, 12_050]);
        let plan = slow.plan(ReadPlan::all(), 13_010, 2);
        assert!(plan.wants(0, m::ENERGY_J), "a new period");
        let plan = slow.plan(ReadPlan::all(), 13_110, 2);
        assert!(!plan.wants(0, m::ENERGY_J) && !plan.wants(1, m::NVLINK_LINKS_ACTIVE));
        assert!(plan.wants(0, m::TENSOR_ACTIVE) && plan.wants(0, m::POWER_W));
    }

    #[test]
    fn a_zero_period_reads_them_every_capture() {
        let mut slow = SlowReads::new(Duration::ZERO);
        for now in [0, 100, 200] {
            assert_eq!(slow.plan(ReadPlan::all(), now, 8), ReadPlan::all());
        }
    }
}
