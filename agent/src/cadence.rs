//! Slow metrics on a slower cadence than the capture interval.
//!
//! Cumulative counters (energy, ECC, NVLink and PCIe errors, InfiniBand
//! errors and discards) and the NVLink and InfiniBand link state lose
//! nothing when read once a second instead of every 100 ms: a counter's
//! increase between two reads is the same whether or not it was read in
//! between, and links go down far more rarely than that. They are also the
//! costly reads: the NVLink error counters alone are 4 NVML calls per link,
//! 18 links × 8 GPUs per capture, most of all the calls a capture makes.
//!
//! The host's counters are slow too. `host_cpu_util` is a window mean of
//! `/proc/stat`'s tick counters, exact over whatever span lies between two
//! reads; those count in ticks of 10 ms (`USER_HZ` 100), so a 100 ms
//! window holds 10 ticks per CPU and a 1 s one 100: the longer window is
//! the more precise. Memory and CPU frequency are context for the GPUs'
//! figures, not what OFU is made of. And `/proc/stat` is the dearest file
//! to read: the kernel prints every interrupt's count into it each time.
//!
//! [`SlowReads`] leaves
//! them out of the read plan except at the first capture of each period
//! (periods are aligned to the unix epoch, so every node reads them in the
//! same query buckets); a skipped counter read is simply not taken (see
//! [`PlanCarry`](crate::capture::PlanCarry)).

use crate::capture::ReadPlan;
use flopwatch_proto::metrics::{self as m, Aggregation};
use std::time::Duration;

/// Metrics read once per period: every counter of the catalog, the NVLink
/// link state (read in the same loop over the links as the NVLink error
/// counters, so one without the other saves nothing), the InfiniBand port
/// state and rate, the host's CPU and memory, the row-remap failure flag
/// (read in the same call as the remapped-row counters), and what
/// dcgm-exporter's page shows for context rather than for OFU: memory
/// temperature, reserved framebuffer (fixed by the driver), and the
/// encoder's and decoder's use (the driver's own averages over its
/// sampling period).
pub(crate) fn is_slow(metric: &str) -> bool {
    matches!(
        metric,
        m::NVLINK_LINKS_ACTIVE
            | m::IB_PORT_ACTIVE
            | m::IB_LINK_RATE_GBPS
            | m::HOST_CPU_UTIL
            | m::HOST_CPU_FREQ_MHZ
            | m::HOST_MEM_AVAILABLE_BYTES
            | m::ROW_REMAP_FAILURE
            | m::MEMORY_TEMP_C
            | m::MEM_RESERVED_BYTES
            | m::ENC_UTIL
            | m::DEC_UTIL
    ) || m::lookup(metric).is_some_and(|d| d.aggregation == Aggregation::Counter)
}

/// Decides, capture by capture, whether the slow metrics are read.
#[derive(Debug, Clone)]
pub(crate) struct SlowReads {
    period_ms: i64,
    /// When they were last read, unix ms.
    last_ms: Option<i64>,
    /// The slow metrics as a set ([`ReadPlan::set_of`]).
    set: u64,
    /// What is skipped between reads; made again only when the number of
    /// devices changes.
    skip: ReadPlan,
    devices: usize,
}

impl SlowReads {
    /// Slow metrics once every `period`; a period no longer than the
    /// capture interval reads them at every capture.
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period_ms: i64::try_from(period.as_millis()).unwrap_or(i64::MAX),
            last_ms: None,
            set: ReadPlan::set_of(m::CATALOG.iter().map(|d| d.name).filter(|n| is_slow(n))),
            skip: ReadPlan::all(),
            devices: 0,
        }
    }

    /// The same, reading `metrics` at every capture all the same: the
    /// energy counter under a sampler that holds sends back
    /// ([`crate::Sampler::holds_back`]), whose sends at a job's start and
    /// end then carry the counter's value there.
    pub(crate) fn exempting(mut self, metrics: &[&str]) -> Self {
        self.set &= !ReadPlan::set_of(metrics.iter().copied());
        self
    }

    /// `plan` for the capture at `now_ms` over `devices` series owners
    /// (GPUs, then node devices): the slow metrics are left out unless this
    /// is the first capture of a period.
    pub(crate) fn plan(&mut self, plan: ReadPlan, now_ms: i64, devices: usize) -> ReadPlan {
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
        if self.devices != devices {
            self.devices = devices;
            self.skip = ReadPlan::all();
            for d in 0..devices {
                self.skip.skip_set(d, self.set);
            }
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
            m::IB_PORT_ACTIVE,
            m::HOST_CPU_UTIL,
            m::HOST_MEM_AVAILABLE_BYTES,
        ] {
            assert!(is_slow(metric), "{metric}");
        }
        for metric in m::OFU_INPUTS.iter().chain(&[
            m::POWER_W,
            m::TEMP_C,
            m::GPU_UTIL,
            m::IB_RX_BYTES_S,
            m::NVLINK_TX_BYTES_S,
        ]) {
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
