//! The agent's own `/metrics`: what it samples and how often, what it has
//! sent, what waits for an acknowledgement, and job attribution.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `flopwatch_agent_sample_interval_seconds` | gauge | `UUID`, `metric` |
//! | `flopwatch_agent_captures_total`, `…_capture_errors_total`, `…_samples_total`, `…_reads_skipped_total` | counter | |
//! | `flopwatch_agent_capture_interval_seconds` | gauge | |
//! | `flopwatch_agent_source_up` | gauge 0/1 | |
//! | `flopwatch_agent_source_open_errors_total` | counter | |
//! | `flopwatch_agent_outbox_batches`, `flopwatch_agent_pending_bytes` | gauge | |
//! | `flopwatch_agent_acked_batches_total`, `…_acked_samples_total`, `…_rejected_batches_total`, `…_dropped_batches_total`, `…_dropped_samples_total` | counter | |
//! | `flopwatch_agent_connected` | gauge 0/1 | |
//! | `flopwatch_agent_connections_total`, `…_failovers_total` | counter | |
//! | `flopwatch_agent_spool_bytes` | gauge | |
//! | `flopwatch_agent_spool_written_batches_total`, `…_spool_dropped_batches_total`, `…_spool_dropped_bytes_total`, `…_spool_bad_records_total`, `…_spool_io_errors_total` | counter | |
//! | `flopwatch_agent_attribution_refreshes_total` | counter | |
//! | `flopwatch_agent_gpm_permission_denied` | gauge 0/1 | `UUID` |
//! | `flopwatch_build_info` | gauge, always 1 | `component` (`agent`), `version`, `arch`, `os` |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_start_time_seconds`, `process_open_fds`, `process_max_fds` | counter, gauges | |

use crate::attribution::AttributionStats;
use crate::client::ClientState;
use crate::outbox::Outbox;
use crate::run::{Agent, AgentStats};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// The registry served on the agent's `/metrics`.
pub fn registry(agent: &Agent) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(AgentExporter {
        stats: agent.stats.clone(),
        outbox: agent.outbox.clone(),
        state: agent.state.clone(),
        attribution: agent.attribution.clone(),
        health: agent.health.clone(),
    }));
    r.register_collector(Box::new(
        flopwatch_transport::process::ProcessCollector::new("agent"),
    ));
    r
}

struct AgentExporter {
    stats: Arc<AgentStats>,
    outbox: Arc<Outbox>,
    state: watch::Receiver<ClientState>,
    attribution: Arc<AttributionStats>,
    health: Arc<crate::health::Health>,
}

impl std::fmt::Debug for AgentExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentExporter").finish_non_exhaustive()
    }
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, c: &AtomicU64) -> std::fmt::Result {
    ConstCounter::new(c.load(Ordering::Relaxed)).encode(enc.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl prometheus_client::collector::Collector for AgentExporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let intervals = self
            .stats
            .intervals
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        {
            let mut m = enc.encode_descriptor(
                "flopwatch_agent_sample_interval_seconds",
                "Current sampling interval of a metric on a GPU (adaptive sampling backs off per metric).",
                None,
                MetricType::Gauge,
            )?;
            for (uuid, metric, ms) in &intervals {
                let labels = [("UUID", uuid.as_str()), ("metric", *metric)];
                ConstGauge::new(f64::from(*ms) / 1000.0).encode(m.encode_family(&labels)?)?;
            }
        }
        let s = &self.stats;
        counter(
            &mut enc,
            "flopwatch_agent_captures",
            "Captures (reads of every GPU) taken.",
            &s.captures,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_capture_errors",
            "Captures that failed.",
            &s.capture_errors,
        )?;
        gauge(
            &mut enc,
            "flopwatch_agent_capture_interval_seconds",
            "Current wait between captures (0 before the first).",
            self.health.interval().as_secs_f64(),
        )?;
        gauge(
            &mut enc,
            "flopwatch_agent_source_up",
            "1 while the source is open and its last capture read; 0 while it cannot be opened yet or its captures fail.",
            if self.health.source_up() { 1.0 } else { 0.0 },
        )?;
        ConstCounter::new(self.health.open_errors()).encode(enc.encode_descriptor(
            "flopwatch_agent_source_open_errors",
            "Failed attempts to open the source (retried with backoff).",
            None,
            MetricType::Counter,
        )?)?;
        counter(
            &mut enc,
            "flopwatch_agent_samples",
            "Samples handed to the outbox.",
            &s.samples,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_reads_skipped",
            "Readings the adaptive sampler's read plans let the source skip (no driver call).",
            &s.reads_skipped,
        )?;
        gauge(
            &mut enc,
            "flopwatch_agent_outbox_batches",
            "Batches held until acknowledged.",
            self.outbox.len() as f64,
        )?;
        gauge(
            &mut enc,
            "flopwatch_agent_pending_bytes",
            "Encoded bytes of the batches held until acknowledged.",
            self.outbox.pending_bytes() as f64,
        )?;
        let o = &self.outbox.stats;
        counter(
            &mut enc,
            "flopwatch_agent_acked_batches",
            "Batches acknowledged by a collector.",
            &o.acked_batches,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_acked_samples",
            "Samples acknowledged by a collector.",
            &o.acked_samples,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_rejected_batches",
            "Batches a collector refused.",
            &o.rejected_batches,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_dropped_batches",
            "Batches dropped because the outbox was full.",
            &o.dropped_batches,
        )?;
        counter(
            &mut enc,
            "flopwatch_agent_dropped_samples",
            "Samples dropped because the outbox was full.",
            &o.dropped_samples,
        )?;
        let connected = self.state.borrow().connected_to.is_some();
        gauge(
            &mut enc,
            "flopwatch_agent_connected",
            "1 while a collector stream is open.",
            if connected { 1.0 } else { 0.0 },
        )?;
        {
            let st = self.state.borrow();
            let (conns, fails) = (st.connections, st.failovers);
            drop(st);
            ConstCounter::new(conns).encode(enc.encode_descriptor(
                "flopwatch_agent_connections",
                "Collector streams opened.",
                None,
                MetricType::Counter,
            )?)?;
            ConstCounter::new(fails).encode(enc.encode_descriptor(
                "flopwatch_agent_failovers",
                "Streams opened to a collector other than the node's home.",
                None,
                MetricType::Counter,
            )?)?;
        }
        if let Some(sp) = self.outbox.spool_stats() {
            gauge(
                &mut enc,
                "flopwatch_agent_spool_bytes",
                "Bytes in the on-disk spool.",
                sp.bytes.load(Ordering::Relaxed) as f64,
            )?;
            counter(
                &mut enc,
                "flopwatch_agent_spool_written_batches",
                "Batches written to the spool.",
                &sp.written_batches,
            )?;
            counter(
                &mut enc,
                "flopwatch_agent_spool_dropped_batches",
                "Unacknowledged batches dropped because the spool was full (spool.max_bytes).",
                &sp.dropped_batches,
            )?;
            counter(
                &mut enc,
                "flopwatch_agent_spool_dropped_bytes",
                "Bytes dropped because the spool was full.",
                &sp.dropped_bytes,
            )?;
            counter(
                &mut enc,
                "flopwatch_agent_spool_bad_records",
                "Truncated or corrupt spool records set aside at startup.",
                &sp.bad_records,
            )?;
            counter(
                &mut enc,
                "flopwatch_agent_spool_io_errors",
                "Spool write, read or fsync failures.",
                &sp.io_errors,
            )?;
        }
        counter(
            &mut enc,
            "flopwatch_agent_attribution_refreshes",
            "Job attribution refreshes.",
            &self.attribution.refreshes,
        )?;
        let denied = self
            .stats
            .gpm_denied
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        if !denied.is_empty() {
            let mut m = enc.encode_descriptor(
                "flopwatch_agent_gpm_permission_denied",
                "1 while the driver refuses the GPU's GPM samples (NVML_ERROR_NO_PERMISSION: a container without CAP_SYS_ADMIN); tensor activity and OFU are then missing.",
                None,
                MetricType::Gauge,
            )?;
            for (uuid, d) in &denied {
                let labels = [("UUID", uuid.as_str())];
                ConstGauge::new(if *d { 1.0 } else { 0.0 }).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
