//! The collector's `/metrics`: OFU per GPU with dcgm-exporter-style labels,
//! per node and per job, the selected raw counters, each agent's sampling
//! intervals and pending data, and the collector's own health.
//!
//! The page is the provider's view: it covers every tenant (each series
//! carries a `tenant` label) and is served on its own listener
//! (`metrics_listen`, loopback by default), apart from the authenticated
//! gRPC endpoint.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `flopwatch_ofu` | gauge, fraction 0..1 over the GPU's last batch | GPU labels |
//! | `flopwatch_tensor_active`, `flopwatch_sm_clock_mhz` | gauge | GPU labels |
//! | `flopwatch_gpu_metric` | gauge, last value | GPU labels + `metric` |
//! | `flopwatch_node_ofu` | gauge | `tenant`, `node`, `hostname` |
//! | `flopwatch_job_ofu`, `flopwatch_job_gpus` | gauge | `tenant`, `job_id` |
//! | `flopwatch_sampling_interval_seconds` | gauge | GPU labels + `metric` |
//! | `flopwatch_device_metric` | gauge, last value of a node device's counter | device labels + `metric` |
//! | `flopwatch_device_sampling_interval_seconds` | gauge | device labels + `metric` |
//! | `flopwatch_agent_backlog_bytes`, `flopwatch_agent_backlog_batches` | gauge | `tenant`, `agent`, `hostname` |
//! | `flopwatch_agents_connected` | gauge | |
//! | `flopwatch_storage_memory_bytes` | gauge, RocksDB memtables, block cache and table readers | |
//! | `flopwatch_ingest_samples_total`, `flopwatch_ingest_batches_total`, `flopwatch_ingest_duplicate_batches_total`, `flopwatch_ingest_rejected_batches_total`, `flopwatch_ofu_samples_total` | counter | |
//! | `flopwatch_ingest_rejected_samples_total` | counter | `reason` |
//! | `flopwatch_tenant_rejected_samples_total`, `flopwatch_tenant_rejected_batches_total` | counter | `tenant`, `reason` |
//! | `flopwatch_tenant_active_series` | gauge | `tenant` |
//! | `flopwatch_auth_failures_total` | counter | `service`, `kind` |
//! | `flopwatch_ack_latency_seconds` | histogram | |
//! | `flopwatch_regressions_total`, `flopwatch_stragglers_total`, `flopwatch_mfu_mismatches_total` | counter | `tenant` |
//! | `flopwatch_remote_write_samples_total` | counter | |
//! | `flopwatch_remote_write_failures_total` | counter | `reason` (`connection`, `5xx`, `429`, `4xx`, `credentials`) |
//! | `flopwatch_remote_write_dropped_samples_total` | counter | `reason` (`queue_full`, `4xx`) |
//! | `flopwatch_limbo_batches` | gauge | |
//! | `flopwatch_limbo_committed_batches_total`, `flopwatch_cluster_peer_errors_total` | counter | |
//! | `flopwatch_limbo_settled_batches_total` | counter | `outcome` (`dropped`, `kept`, `timed_out`) |
//!
//! GPU labels: `gpu` (index), `UUID`, `modelName`, `hostname`, `node`,
//! `tenant`, and `job_id`, `pod`, `namespace`, `container`, `hpc_job` when the
//! agent attributes the GPU.
//!
//! Device labels (InfiniBand ports, NUMA nodes, the host; docs/COUNTERS.md):
//! `kind` (`ib_port`, `numa_node`, `host`), `device` (name on the node:
//! `mlx5_0:1`, `0`, `host`), `device_id` (the series key), `hostname`,
//! `node`, `tenant`. Device counters are not GPU counters: they never
//! enter OFU, GPU gauges or GPU counts.

use crate::live::group_ofu;
use crate::series::{device_labels, gpu_labels, Labels};
use crate::state::Collector;
use crate::stats::{Failure, Stats};
use crate::validate::Reason;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The registry served on the collector's `/metrics`.
pub fn registry(collector: Arc<Collector>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Exporter { c: collector }));
    r
}

/// Encodes the collector's state on each scrape.
#[derive(Debug)]
struct Exporter {
    c: Arc<Collector>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("collector_id", &self.settings.collector_id)
            .finish_non_exhaustive()
    }
}

fn with(mut l: Labels, k: &str, v: &str) -> Labels {
    l.push((k.to_string(), v.to_string()));
    l
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn one(v: u64) -> Vec<(Labels, u64)> {
    vec![(Vec::new(), v)]
}

impl prometheus_client::collector::Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.c;
        let now = c.clock.now_ms();
        let gpus = c.live.gpus(now);
        let selected = &c.settings.policy.metrics;
        gauges(
            &mut enc,
            "flopwatch_ofu",
            "Overall FLOP Utilization (OFU eq. 1) over the GPU's last batch, fraction 0..1.",
            gpus.iter()
                .filter_map(|g| g.ofu.map(|o| (gpu_labels(g), o))),
        )?;
        gauges(
            &mut enc,
            "flopwatch_tensor_active",
            "Tensor pipe activity over the GPU's last batch, fraction 0..1.",
            gpus.iter()
                .filter(|g| g.ofu.is_some())
                .map(|g| (gpu_labels(g), g.tensor_active)),
        )?;
        gauges(
            &mut enc,
            "flopwatch_sm_clock_mhz",
            "SM clock over the GPU's last batch, MHz.",
            gpus.iter()
                .filter(|g| g.ofu.is_some())
                .map(|g| (gpu_labels(g), g.sm_clock_mhz)),
        )?;
        gauges(
            &mut enc,
            "flopwatch_gpu_metric",
            "Last value of a GPU counter (the policy's selected set, else every counter received).",
            gpus.iter().flat_map(|g| {
                g.counters
                    .iter()
                    .filter(|(m, _)| selected.is_empty() || selected.contains(m))
                    .map(|(m, (_, v))| (with(gpu_labels(g), "metric", m), *v))
            }),
        )?;
        gauges(
            &mut enc,
            "flopwatch_sampling_interval_seconds",
            "Current sampling interval of a metric on a GPU, as its agent last reported.",
            gpus.iter().flat_map(|g| {
                g.intervals
                    .iter()
                    .map(|(m, ms)| (with(gpu_labels(g), "metric", m), f64::from(*ms) / 1000.0))
            }),
        )?;
        let devices = c.live.devices(now);
        gauges(
            &mut enc,
            "flopwatch_device_metric",
            "Last value of a node device's counter (InfiniBand port, NUMA node, host; the policy's selected set, else every counter received).",
            devices.iter().flat_map(|d| {
                d.counters
                    .iter()
                    .filter(|(m, _)| selected.is_empty() || selected.contains(m))
                    .map(|(m, (_, v))| (with(device_labels(d), "metric", m), *v))
            }),
        )?;
        gauges(
            &mut enc,
            "flopwatch_device_sampling_interval_seconds",
            "Current sampling interval of a metric on a node device, as its agent last reported.",
            devices.iter().flat_map(|d| {
                d.intervals
                    .iter()
                    .map(|(m, ms)| (with(device_labels(d), "metric", m), f64::from(*ms) / 1000.0))
            }),
        )?;
        let nodes = group_ofu(&gpus, |g| {
            Some((g.tenant.clone(), g.node_id.clone(), g.hostname.clone()))
        });
        gauges(
            &mut enc,
            "flopwatch_node_ofu",
            "Mean OFU of a node's GPUs over their last batches, fraction 0..1.",
            nodes.iter().map(|((t, n, h), o)| {
                (
                    vec![
                        ("tenant".into(), t.clone()),
                        ("node".into(), n.clone()),
                        ("hostname".into(), h.clone()),
                    ],
                    o.ofu,
                )
            }),
        )?;
        let jobs = group_ofu(&gpus, |g| {
            g.job.as_ref().map(|j| (g.tenant.clone(), j.job_id.clone()))
        });
        let job_labels = |t: &str, j: &str| {
            vec![
                ("tenant".to_string(), t.to_string()),
                ("job_id".into(), j.into()),
            ]
        };
        gauges(
            &mut enc,
            "flopwatch_job_ofu",
            "OFU of a job (eq. 11: mean over its GPUs' last batches), fraction 0..1.",
            jobs.iter().map(|((t, j), o)| (job_labels(t, j), o.ofu)),
        )?;
        gauges(
            &mut enc,
            "flopwatch_job_gpus",
            "GPUs attributed to a job.",
            jobs.iter()
                .map(|((t, j), o)| (job_labels(t, j), f64::from(o.gpus))),
        )?;
        let agents = c.live.agents(now);
        let agent_labels = |a: &crate::live::AgentLive| {
            vec![
                ("tenant".to_string(), a.tenant.clone()),
                ("agent".into(), a.agent_id.clone()),
                ("hostname".into(), a.hostname.clone()),
            ]
        };
        gauges(
            &mut enc,
            "flopwatch_agent_backlog_bytes",
            "Bytes waiting in an agent for an acknowledgement (memory outbox and disk spool), as the agent reports it.",
            agents
                .iter()
                .map(|a| (agent_labels(a), a.pending_bytes as f64)),
        )?;
        gauges(
            &mut enc,
            "flopwatch_agent_backlog_batches",
            "Batches waiting in an agent for an acknowledgement, as the agent reports it.",
            agents
                .iter()
                .map(|a| (agent_labels(a), f64::from(a.pending_batches))),
        )?;
        let s: &Stats = &c.stats;
        gauges(
            &mut enc,
            "flopwatch_agents_connected",
            "Agents with an open ingest stream.",
            [(
                Vec::new(),
                s.agents_connected.load(Ordering::Relaxed) as f64,
            )],
        )?;
        let get = Stats::get;
        counter(
            &mut enc,
            "flopwatch_ingest_samples",
            "Samples stored.",
            one(get(&s.samples_accepted)),
        )?;
        counter(
            &mut enc,
            "flopwatch_ingest_batches",
            "Batches acknowledged, replays included.",
            one(get(&s.batches_acked)),
        )?;
        counter(
            &mut enc,
            "flopwatch_ingest_duplicate_batches",
            "Batches acknowledged as replays of stored ones (not stored again).",
            one(get(&s.batches_duplicate)),
        )?;
        counter(
            &mut enc,
            "flopwatch_ingest_rejected_batches",
            "Batches refused as a whole.",
            one(get(&s.batches_rejected)),
        )?;
        counter(
            &mut enc,
            "flopwatch_ingest_rejected_samples",
            "Samples dropped by validation, by reason.",
            Reason::ALL.iter().map(|r| {
                (
                    vec![("reason".to_string(), r.name().to_string())],
                    s.rejected(*r),
                )
            }),
        )?;
        counter(
            &mut enc,
            "flopwatch_tenant_rejected_samples",
            "Samples dropped by validation and limits, by tenant and reason.",
            s.rejected_by_tenant().into_iter().map(|((t, r), n)| {
                (
                    vec![
                        ("tenant".to_string(), t),
                        ("reason".to_string(), r.name().to_string()),
                    ],
                    n,
                )
            }),
        )?;
        counter(
            &mut enc,
            "flopwatch_tenant_rejected_batches",
            "Batches refused as a whole, by tenant and reason (rate_limited, batch_too_large, malformed_batch, identity_mismatch).",
            s.batch_rejects().into_iter().map(|((t, r), n)| {
                (
                    vec![("tenant".to_string(), t), ("reason".to_string(), r)],
                    n,
                )
            }),
        )?;
        counter(
            &mut enc,
            "flopwatch_auth_failures",
            "Refused credentials, by service (ingest, query) and kind (unauthenticated, permission_denied).",
            s.auth_failures().into_iter().map(|((svc, kind), n)| {
                (
                    vec![
                        ("service".to_string(), svc.to_string()),
                        ("kind".to_string(), kind.to_string()),
                    ],
                    n,
                )
            }),
        )?;
        gauges(
            &mut enc,
            "flopwatch_tenant_active_series",
            "Series with a sample in the last hour, per tenant (the max_series limit counts these).",
            c.limits.tenants().into_iter().map(|t| {
                let n = c.limits.active_series(&t, now) as f64;
                (vec![("tenant".to_string(), t)], n)
            }),
        )?;
        counter(
            &mut enc,
            "flopwatch_ofu_samples",
            "OFU samples derived.",
            one(get(&s.ofu_samples)),
        )?;
        s.ack_latency.encode(enc.encode_descriptor(
            "flopwatch_ack_latency_seconds",
            "Seconds from a batch's arrival to its acknowledgement (durable commit included).",
            None,
            MetricType::Histogram,
        )?)?;
        // Every tenant with live GPUs gets a row, zero until an event.
        let mut events = c.events.counts();
        for g in &gpus {
            events.entry(g.tenant.clone()).or_default();
        }
        counter(
            &mut enc,
            "flopwatch_regressions",
            "OFU regression events raised (a job's OFU fell by the configured factor against its own baseline).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.regressions)),
        )?;
        counter(
            &mut enc,
            "flopwatch_stragglers",
            "Straggler events raised (a GPU's tensor activity far from its job's median).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.stragglers)),
        )?;
        counter(
            &mut enc,
            "flopwatch_mfu_mismatches",
            "Jobs flagged for a reported MFU far from their measured OFU (suspected FLOPs miscalculation, OFU paper §V-C).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.mfu_mismatches)),
        )?;
        counter(
            &mut enc,
            "flopwatch_remote_write_samples",
            "Samples delivered to the remote-write endpoint.",
            one(get(&s.remote_write_samples)),
        )?;
        counter(
            &mut enc,
            "flopwatch_remote_write_failures",
            "Remote-write requests that failed, by reason: connection, 5xx, 429 and credentials (an unreadable token or password file) are retried; 4xx (other than 429) drops the request's samples.",
            Failure::ALL.iter().map(|&r| {
                (
                    vec![("reason".to_string(), r.label().to_string())],
                    s.remote_write_failures(r),
                )
            }),
        )?;
        counter(
            &mut enc,
            "flopwatch_remote_write_dropped_samples",
            "Samples never delivered to the remote-write endpoint, by reason: queue_full (the oldest, past max_queue_samples), 4xx (refused by the endpoint, not retried).",
            [
                ("queue_full", get(&s.remote_write_dropped)),
                ("4xx", get(&s.remote_write_refused)),
            ]
            .into_iter()
            .map(|(r, n)| (vec![("reason".to_string(), r.to_string())], n)),
        )?;
        gauges(
            &mut enc,
            "flopwatch_storage_memory_bytes",
            "Memory the storage engine holds for itself: memtables, block cache, table readers.",
            [(Vec::new(), c.store.engine().memory_bytes() as f64)],
        )?;
        cluster_metrics(&mut enc, &c.cluster)?;
        Ok(())
    }
}

/// Limbo and peer counters (crate::cluster).
fn cluster_metrics(
    enc: &mut DescriptorEncoder,
    s: &crate::cluster::ClusterStats,
) -> Result<(), std::fmt::Error> {
    let get = Stats::get;
    gauges(
        enc,
        "flopwatch_limbo_batches",
        "Batches in limbo: acknowledged, readable, waiting until the cluster's peers say whether one of them holds them too.",
        [(Vec::new(), s.limbo_batches.load(Ordering::Relaxed).max(0) as f64)],
    )?;
    counter(
        enc,
        "flopwatch_limbo_committed_batches",
        "Batches an agent resent after another collector failed to acknowledge them, committed into limbo.",
        one(get(&s.limbo_committed)),
    )?;
    counter(
        enc,
        "flopwatch_limbo_settled_batches",
        "Limbo batches settled, by outcome: dropped (a peer holds the batch), kept (no peer does), timed_out (kept after cluster.limbo_timeout without every peer's answer; it may be stored twice).",
        [
            ("dropped", &s.dropped),
            ("kept", &s.kept),
            ("timed_out", &s.timed_out),
        ]
        .into_iter()
        .map(|(o, c)| (vec![("outcome".to_string(), o.to_string())], get(c))),
    )?;
    counter(
        enc,
        "flopwatch_cluster_peer_errors",
        "Questions to a peer about limbo batches that failed (unreachable, refused, timed out); retried next pass.",
        one(get(&s.peer_errors)),
    )
}
