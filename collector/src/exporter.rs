//! The collector's `/metrics`: OFU per GPU with dcgm-exporter-style labels,
//! per node and per job, one family per catalog counter in base units, each
//! agent's sampling intervals and pending data, and the collector's own
//! health.
//!
//! What a scrape sees depends on its bearer token ([`page`]), as for the
//! query API: a tenant's query token sees that tenant's series, a provider
//! (admin) token every tenant's, no token the `anonymous_tenant`'s when one
//! is configured and otherwise only the collector's own health (the rows
//! marked *health* below, which name no tenant); an unknown or malformed
//! token is refused with 401, so a scrape misconfiguration shows as a failed
//! target rather than as missing series.
//!
//! The page stays bounded as the fleet grows: the per-GPU and per-device
//! families (GPU labels and device labels below, `DCGM_FI_*`) are listed
//! only while the scrape's tenants hold at most `[exporter] max_gpus`
//! GPUs (default 1,000; a 10,000-agent collector's page listing 80,000
//! GPUs was 339 MB and doubled its memory), and the node, job, agent and
//! tenant families are computed from a copy of each GPU without its
//! counters. A scrape chooses with its URL's parameters ([`Selection`]):
//! `gpus=all` (every GPU family, whatever the size), `gpus=none`, and
//! `tenant=NAME` (repeatable) to narrow itself to tenants its token may
//! read. `flopwatch_exporter_gpus_omitted` (gauge, no labels) says how
//! many GPUs a page left off.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `flopwatch_ofu_ratio` | gauge, OFU (eq. 1) over the GPU's last batch, 0..1 | GPU labels |
//! | `flopwatch_ofu_tensor_active_ratio`, `flopwatch_ofu_sm_clock_hertz` | gauge, OFU's inputs over the GPU's last batch | GPU labels |
//! | `flopwatch_gpu_<metric>_<unit>` | one per catalog metric ([`crate::series::family`]): gauge, or counter (`_total`) for the catalog's counters; last value, in base units | GPU labels |
//! | `flopwatch_gpu_last_sample_timestamp_seconds` | gauge, newest sample of the GPU | GPU labels |
//! | `flopwatch_gpu_xid_errors_total` | counter, XID errors its agent reported since this collector started | GPU labels |
//! | `flopwatch_gpu_job_share_ratio` | gauge, a shared GPU's apportioned share of each job (docs/ATTRIBUTION.md, *Shared GPUs*) | GPU labels + job labels + `split` |
//! | `flopwatch_node_ofu_ratio` | gauge, capacity-weighted (docs/MIG.md) | `tenant`, `node`, `hostname` |
//! | `flopwatch_job_ofu_ratio`, `flopwatch_job_gpus` | gauge; a shared GPU counts with the job's apportioned part | `tenant`, `job_id` |
//! | `flopwatch_sampling_interval_seconds` | gauge | GPU labels + `metric` |
//! | `flopwatch_device_<metric>_<unit>` | one per catalog metric of a node device, as for GPUs | device labels |
//! | `flopwatch_device_sampling_interval_seconds` | gauge | device labels + `metric` |
//! | `DCGM_FI_*` | with `[exporter] dcgm_compat`, dcgm-exporter's families, types and units ([`dcgm`], docs/EXPORTER.md) | dcgm-exporter's, plus `instance` (the node) and `tenant` |
//! | `flopwatch_agent_backlog_bytes`, `flopwatch_agent_backlog_batches` | gauge | `tenant`, `agent`, `hostname` |
//! | `flopwatch_tenant_rejected_samples_total`, `flopwatch_tenant_rejected_batches_total` | counter | `tenant`, `reason` |
//! | `flopwatch_tenant_active_series` | gauge | `tenant` |
//! | `flopwatch_regressions_total`, `flopwatch_stragglers_total`, `flopwatch_mfu_mismatches_total` | counter | `tenant` |
//! | *health:* `flopwatch_agents_connected` | gauge | |
//! | *health:* `flopwatch_storage_memory_bytes` | gauge, RocksDB memtables, block cache and table readers | |
//! | *health:* `flopwatch_storage_level0_files` | gauge, files in level 0 of the family with the most | `family` |
//! | *health:* `flopwatch_storage_pending_compaction_bytes` | gauge, bytes RocksDB's compactions still owe | |
//! | *health:* `flopwatch_storage_write_stall` | gauge, 0 none, 1 writes delayed, 2 writes stopped | |
//! | *health:* `flopwatch_ingest_samples_total`, `flopwatch_ingest_batches_total`, `flopwatch_ingest_duplicate_batches_total`, `flopwatch_ingest_commit_writes_total`, `flopwatch_ingest_rejected_batches_total`, `flopwatch_ofu_samples_total` | counter | |
//! | *health:* `flopwatch_ingest_rejected_samples_total` | counter | `reason` |
//! | *health:* `flopwatch_auth_failures_total` | counter | `service` (`ingest`, `query`, `metrics`, `prometheus_api`), `kind` |
//! | *health:* `flopwatch_ack_latency_seconds` | histogram | |
//! | `flopwatch_tenant_query_limited_total` | counter, Prometheus API queries refused or stopped by a limit | `tenant` (`*`: a provider's), `limit` |
//! | *health:* `flopwatch_queries_total` | counter | |
//! | *health:* `flopwatch_query_limited_total` | counter | `limit` (`max_query_bytes`, `max_query_depth`, `max_samples`, `max_series`, `max_concurrent_queries`, `timeout`) |
//! | *health:* `flopwatch_queries_running`, `flopwatch_queries_queued` | gauge | |
//! | *health:* `flopwatch_remote_write_samples_total` | counter | |
//! | *health:* `flopwatch_remote_write_failures_total` | counter | `reason` (`connection`, `5xx`, `429`, `4xx`, `credentials`) |
//! | *health:* `flopwatch_remote_write_dropped_samples_total` | counter | `reason` (`queue_full`, `max_age`, `4xx`) |
//! | *health:* `flopwatch_remote_write_pending_samples` | gauge | (with remote write on) |
//! | *health:* `flopwatch_remote_write_oldest_pending_age_seconds` | gauge | (with remote write on) |
//! | *health:* `flopwatch_limbo_batches` | gauge | |
//! | *health:* `flopwatch_limbo_committed_batches_total`, `flopwatch_cluster_peer_errors_total` | counter | |
//! | *health:* `flopwatch_limbo_settled_batches_total` | counter | `outcome` (`dropped`, `kept`, `timed_out`) |
//! | *health:* `flopwatch_build_info`, `process_*` | [`flopwatch_transport::process`] | `component` = `collector`, `version`, `arch`, `os` |
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

mod dcgm;

use crate::auth::Scope;
use crate::live::group_ofu;
use crate::series::{device_labels, family_of, gpu_labels, Family, Labels, On};
use crate::state::Collector;
use crate::stats::{Failure, Stats};
use crate::validate::Reason;
use flopwatch_transport::metrics_http::Scrape;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The page a scrape gets, as OpenMetrics text; `None` refuses it (401).
/// Its bearer token (`Some("")` for an `authorization` header that holds
/// none) decides which tenants it may read, its parameters what of them
/// it gets ([`Selection`]). See the module's description.
pub fn page(collector: &Arc<Collector>, scrape: &Scrape<'_>) -> Option<String> {
    let scope = match collector.bearer_scope(scrape.token, "metrics") {
        Ok(s) => Some(s),
        // No token and no anonymous tenant: the collector's health only.
        Err(_) if scrape.token.is_none() => None,
        Err(_) => return None,
    };
    Some(flopwatch_transport::metrics_http::render(&registry(
        collector.clone(),
        scope,
        Selection::of(scrape),
    )))
}

/// Whether a page lists per-GPU and per-device families.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum GpuFamilies {
    /// While the scrape's tenants hold at most `[exporter] max_gpus` GPUs
    /// (the default).
    #[default]
    Auto,
    /// Always (`gpus=all`): the page grows with the fleet.
    All,
    /// Never (`gpus=none`).
    Omit,
}

/// What a scrape asked for with its URL's parameters, within what its
/// token may read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selection {
    /// `tenant=` (repeatable): only these tenants; none: every tenant the
    /// token may read.
    pub tenants: Vec<String>,
    /// `gpus=all|none|auto`.
    pub gpus: GpuFamilies,
}

impl Selection {
    /// From a scrape's parameters (unknown ones and values are ignored,
    /// as Prometheus' own `/federate` does).
    pub(crate) fn of(scrape: &Scrape<'_>) -> Self {
        let gpus = match scrape.param("gpus").last() {
            Some("all") => GpuFamilies::All,
            Some("none") => GpuFamilies::Omit,
            _ => GpuFamilies::Auto,
        };
        Self {
            tenants: scrape.param("tenant").map(str::to_string).collect(),
            gpus,
        }
    }
}

/// The registry of one scrape: the series `scope` may read (none but the
/// collector's health when `None`), as `selection` narrows them.
pub(crate) fn registry(
    collector: Arc<Collector>,
    scope: Option<Scope>,
    selection: Selection,
) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Exporter {
        c: collector,
        scope,
        selection,
    }));
    r.register_collector(Box::new(
        flopwatch_transport::process::ProcessCollector::new("collector"),
    ));
    r
}

/// Encodes the collector's state on each scrape.
#[derive(Debug)]
struct Exporter {
    c: Arc<Collector>,
    scope: Option<Scope>,
    selection: Selection,
}

impl Exporter {
    /// Whether this scrape may see `tenant`'s series, and asked for them.
    fn allows(&self, tenant: &str) -> bool {
        self.scope.as_ref().is_some_and(|s| s.allows(tenant))
            && (self.selection.tenants.is_empty()
                || self.selection.tenants.iter().any(|t| t == tenant))
    }
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

/// A counter family of fractional values.
fn float_counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&str>,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let unit = unit.map(|u| Unit::Other(u.to_string()));
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes catalog families: `rows` are (catalog metric, labels, value in
/// the catalog's unit), any order; one family per metric that has rows.
fn families(
    enc: &mut DescriptorEncoder,
    on: On,
    rows: impl IntoIterator<Item = (String, Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut by: BTreeMap<String, Vec<(Labels, f64)>> = BTreeMap::new();
    for (m, l, v) in rows {
        by.entry(m).or_default().push((l, v));
    }
    for (m, rows) in by {
        // Names the collector accepted are in the catalog; a stored name
        // from an older catalog is skipped rather than exported unitless.
        let Some(f) = family_of(&m, on) else {
            continue;
        };
        family(enc, &f, rows)?;
    }
    Ok(())
}

/// One catalog family, values scaled into its base unit.
fn family(
    enc: &mut DescriptorEncoder,
    f: &Family,
    rows: Vec<(Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let unit = f.unit.map(|u| Unit::Other(u.to_string()));
    let kind = if f.counter {
        MetricType::Counter
    } else {
        MetricType::Gauge
    };
    let mut m = enc.encode_descriptor(&f.stem, &f.help, unit.as_ref(), kind)?;
    for (labels, v) in rows {
        let v = v * f.scale;
        if f.counter {
            ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
        } else {
            ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn one(v: u64) -> Vec<(Labels, u64)> {
    vec![(Vec::new(), v)]
}

impl prometheus_client::collector::Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.scope.is_some() {
            self.encode_tenants(&mut enc)?;
        }
        self.encode_health(&mut enc)
    }
}

impl Exporter {
    /// The ledger's counters per job (docs/LEDGER.md), since this
    /// collector started: the PromQL API's `flopwatch_ledger_*` families
    /// (there per job and GPU, since each job's start) summed per job.
    fn encode_ledger(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut jobs = self.c.ledger.jobs();
        jobs.retain(|((t, _), _)| self.allows(t));
        jobs.sort_by(|a, b| a.0.cmp(&b.0));
        let labels = |t: &str, j: &str, ns: &str| -> Labels {
            let mut l = vec![
                ("tenant".to_string(), t.to_string()),
                ("job_id".to_string(), j.to_string()),
            ];
            if !ns.is_empty() {
                l.push(("namespace".to_string(), ns.to_string()));
            }
            l
        };
        type Figure = fn(&crate::ledger::JobTotals) -> f64;
        let families: [(&str, &str, Option<&str>, Figure); 5] = [
            (
                "flopwatch_ledger_held",
                "GPU time the job held (its OFU samples' windows), since this collector started.",
                Some("seconds"),
                |t| t.held_ms / 1000.0,
            ),
            (
                "flopwatch_ledger_idle",
                "Held GPU time in minutes whose mean tensor activity was below 1 %, since this collector started.",
                Some("seconds"),
                |t| t.idle_ms / 1000.0,
            ),
            (
                "flopwatch_ledger_delivered_flop",
                "FLOPs delivered: OFU x dense FP16 tensor peak x time, since this collector started.",
                None,
                |t| t.delivered_tflop * 1e12,
            ),
            (
                "flopwatch_ledger_unused_flop",
                "Tensor capacity held and not used: (1 - OFU) x peak x time, since this collector started.",
                None,
                |t| (t.capacity_tflop - t.delivered_tflop).max(0.0) * 1e12,
            ),
            (
                "flopwatch_ledger_energy",
                "Energy the job's GPUs used (their energy counters), since this collector started.",
                Some("joules"),
                |t| t.energy_j,
            ),
        ];
        for (name, help, unit, f) in families {
            float_counter(
                enc,
                name,
                help,
                unit,
                jobs.iter()
                    .map(|((t, j), v)| (labels(t, j, &v.namespace), f(v))),
            )?;
        }
        Ok(())
    }

    /// The per-GPU and per-device families of `gpus` (and of the scrape's
    /// node devices).
    fn encode_gpus(
        &self,
        enc: &mut DescriptorEncoder,
        gpus: &[crate::live::GpuLive],
        now: i64,
    ) -> Result<(), std::fmt::Error> {
        let c = &self.c;
        let selected = &c.settings.policy.metrics;
        let shown = |m: &String| selected.is_empty() || selected.contains(m);
        gauges(
            enc,
            "flopwatch_ofu_ratio",
            "Overall FLOP Utilization (OFU eq. 1) over the GPU's last batch, fraction 0..1.",
            gpus.iter()
                .filter_map(|g| g.ofu.map(|o| (gpu_labels(g), o))),
        )?;
        // A shared GPU's jobs: each one's apportioned share of its work
        // (`split` says how; not a per-job measurement).
        gauges(
            enc,
            "flopwatch_gpu_job_share_ratio",
            "Share of a shared GPU's work apportioned to a job (time-slicing, MPS), fraction 0..1; split=\"sm_util\": by its processes' SM utilisation, \"equal\": evenly.",
            gpus.iter().filter(|g| g.job.is_none()).flat_map(|g| {
                g.shares.iter().map(move |j| {
                    let mut l = gpu_labels(g);
                    crate::series::push_job_labels(
                        &mut l,
                        [&j.job_id, &j.pod, &j.namespace, &j.container, &j.hpc_job],
                    );
                    l.push(("split".into(), j.split.clone()));
                    (l, f64::from(j.share_ppm.min(1_000_000)) / 1e6)
                })
            }),
        )?;
        gauges(
            enc,
            "flopwatch_ofu_tensor_active_ratio",
            "Tensor pipe activity over the GPU's last batch (OFU's input), fraction 0..1.",
            gpus.iter()
                .filter(|g| g.ofu.is_some())
                .map(|g| (gpu_labels(g), g.tensor_active)),
        )?;
        gauges(
            enc,
            "flopwatch_ofu_sm_clock_hertz",
            "SM clock over the GPU's last batch (OFU's input), in hertz.",
            gpus.iter()
                .filter(|g| g.ofu.is_some())
                .map(|g| (gpu_labels(g), g.sm_clock_mhz * 1e6)),
        )?;
        families(
            enc,
            On::Gpu,
            gpus.iter().flat_map(|g| {
                g.counters
                    .iter()
                    .filter(|(m, _)| shown(m))
                    .map(|(m, (_, v))| (m.clone(), gpu_labels(g), *v))
            }),
        )?;
        gauges(
            enc,
            "flopwatch_gpu_last_sample_timestamp_seconds",
            "Time of the GPU's newest sample, seconds since the epoch: `time() - this` is how long the GPU has been silent (a GPU leaves the page 5 minutes after its last batch).",
            gpus.iter()
                .filter(|g| g.ts_ms > 0)
                .map(|g| (gpu_labels(g), g.ts_ms as f64 / 1000.0)),
        )?;
        let xids = c.stats.xids();
        counter(
            enc,
            "flopwatch_gpu_xid_errors",
            "XID errors the GPU's agent reported (NVML critical XID events, DCGM XID changes), since this collector started.",
            gpus.iter().map(|g| {
                let n = xids
                    .get(&(g.tenant.clone(), g.uuid.clone()))
                    .map_or(0, |x| x.count);
                (gpu_labels(g), n)
            }),
        )?;
        gauges(
            enc,
            "flopwatch_sampling_interval_seconds",
            "Current sampling interval of a metric on a GPU, as its agent last reported.",
            gpus.iter().flat_map(|g| {
                g.intervals
                    .iter()
                    .map(|(m, ms)| (with(gpu_labels(g), "metric", m), f64::from(*ms) / 1000.0))
            }),
        )?;
        if c.settings.dcgm_compat {
            let ids: Vec<dcgm::Identity> = gpus
                .iter()
                .map(|g| {
                    c.gpu(&g.tenant, &g.uuid)
                        .map(|r| dcgm::Identity::of(&r))
                        .unwrap_or_default()
                })
                .collect();
            let page: Vec<dcgm::Gpu<'_>> = gpus
                .iter()
                .zip(&ids)
                .map(|(live, id)| dcgm::Gpu { live, id })
                .collect();
            dcgm::encode(enc, &page, &xids, &shown)?;
        }
        let mut devices = c.live.devices(now);
        devices.retain(|d| self.allows(&d.tenant));
        families(
            enc,
            On::Device,
            devices.iter().flat_map(|d| {
                d.counters
                    .iter()
                    .filter(|(m, _)| shown(m))
                    .map(|(m, (_, v))| (m.clone(), device_labels(d), *v))
            }),
        )?;
        gauges(
            enc,
            "flopwatch_device_sampling_interval_seconds",
            "Current sampling interval of a metric on a node device, as its agent last reported.",
            devices.iter().flat_map(|d| {
                d.intervals
                    .iter()
                    .map(|(m, ms)| (with(device_labels(d), "metric", m), f64::from(*ms) / 1000.0))
            }),
        )?;
        Ok(())
    }

    /// The series of the tenants this scrape may read.
    fn encode_tenants(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.c;
        let now = c.clock.now_ms();
        // Per-GPU and per-device families: while the scrape's GPUs are
        // few enough, or when asked for (`gpus=all`).
        let listed = self.c.live.count_gpus(now, |t| self.allows(t));
        let per_gpu = match self.selection.gpus {
            GpuFamilies::All => true,
            GpuFamilies::Omit => false,
            GpuFamilies::Auto => listed <= c.settings.exporter_max_gpus,
        };
        let mut gpus = if per_gpu {
            c.live.gpus(now)
        } else {
            c.live.gpus_light(now)
        };
        gpus.retain(|g| self.allows(&g.tenant));
        gauges(
            enc,
            "flopwatch_exporter_gpus_omitted",
            "GPUs of this scrape whose per-GPU and per-device families were left off the page (more than [exporter] max_gpus; ask with gpus=all or narrow with tenant=).",
            [(Vec::new(), if per_gpu { 0.0 } else { listed as f64 })],
        )?;
        if per_gpu {
            self.encode_gpus(enc, &gpus, now)?;
        }
        self.encode_ledger(enc)?;
        // Weighted by capacity: a MIG instance by its share of the card.
        let share = |g: &crate::live::GpuLive| {
            c.gpu(&g.tenant, &g.uuid)
                .map_or(1.0, |r| c.capacity_share(&r))
        };
        let nodes = group_ofu(
            &gpus,
            |g| {
                vec![(
                    (g.tenant.clone(), g.node_id.clone(), g.hostname.clone()),
                    g.ofu.unwrap_or(0.0),
                )]
            },
            share,
        );
        gauges(
            enc,
            "flopwatch_node_ofu_ratio",
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
        // A shared GPU counts for each of its jobs with the job's
        // apportioned part.
        let jobs = group_ofu(
            &gpus,
            |g| {
                crate::live::job_parts(g)
                    .into_iter()
                    .map(|(j, o)| ((g.tenant.clone(), j), o))
                    .collect()
            },
            share,
        );
        let job_labels = |t: &str, j: &str| {
            vec![
                ("tenant".to_string(), t.to_string()),
                ("job_id".into(), j.into()),
            ]
        };
        gauges(
            enc,
            "flopwatch_job_ofu_ratio",
            "OFU of a job (eq. 11: mean over its GPUs' last batches), fraction 0..1.",
            jobs.iter().map(|((t, j), o)| (job_labels(t, j), o.ofu)),
        )?;
        gauges(
            enc,
            "flopwatch_job_gpus",
            "GPUs attributed to a job.",
            jobs.iter()
                .map(|((t, j), o)| (job_labels(t, j), f64::from(o.gpus))),
        )?;
        let mut agents = c.live.agents(now);
        agents.retain(|a| self.allows(&a.tenant));
        let agent_labels = |a: &crate::live::AgentLive| {
            vec![
                ("tenant".to_string(), a.tenant.clone()),
                ("agent".into(), a.agent_id.clone()),
                ("hostname".into(), a.hostname.clone()),
            ]
        };
        gauges(
            enc,
            "flopwatch_agent_backlog_bytes",
            "Bytes waiting in an agent for an acknowledgement (memory outbox and disk spool), as the agent reports it.",
            agents
                .iter()
                .map(|a| (agent_labels(a), a.pending_bytes as f64)),
        )?;
        gauges(
            enc,
            "flopwatch_agent_backlog_batches",
            "Batches waiting in an agent for an acknowledgement, as the agent reports it.",
            agents
                .iter()
                .map(|a| (agent_labels(a), f64::from(a.pending_batches))),
        )?;
        let s: &Stats = &c.stats;
        counter(
            enc,
            "flopwatch_tenant_rejected_samples",
            "Samples dropped by validation and limits, by tenant and reason.",
            s.rejected_by_tenant()
                .into_iter()
                .filter(|((t, _), _)| self.allows(t))
                .map(|((t, r), n)| {
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
            enc,
            "flopwatch_tenant_rejected_batches",
            "Batches refused as a whole, by tenant and reason (rate_limited, batch_too_large, malformed_batch, identity_mismatch).",
            s.batch_rejects()
                .into_iter()
                .filter(|((t, _), _)| self.allows(t))
                .map(|((t, r), n)| {
                    (
                        vec![("tenant".to_string(), t), ("reason".to_string(), r)],
                        n,
                    )
                }),
        )?;
        counter(
            enc,
            "flopwatch_tenant_query_limited",
            "Prometheus API queries refused or stopped by a limit, by tenant (* for a provider's query over every tenant) and limit (max_query_bytes, max_query_depth, max_samples, max_series, max_concurrent_queries, timeout).",
            s.query_limits()
                .into_iter()
                .filter(|((t, _), _)| self.allows(t))
                .map(|((t, l), n)| {
                    (
                        vec![("tenant".to_string(), t), ("limit".to_string(), l.to_string())],
                        n,
                    )
                }),
        )?;
        gauges(
            enc,
            "flopwatch_tenant_active_series",
            "Series with a sample in the last hour, per tenant (the max_series limit counts these).",
            c.limits
                .tenants()
                .into_iter()
                .filter(|t| self.allows(t))
                .map(|t| {
                    let n = c.limits.active_series(&t, now) as f64;
                    (vec![("tenant".to_string(), t)], n)
                }),
        )?;
        // Every tenant with live GPUs gets a row, zero until an event.
        let mut events = c.events.counts();
        events.retain(|t, _| self.allows(t));
        for g in &gpus {
            events.entry(g.tenant.clone()).or_default();
        }
        counter(
            enc,
            "flopwatch_regressions",
            "OFU regression events raised (a job's OFU fell by the configured factor against its own baseline).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.regressions)),
        )?;
        counter(
            enc,
            "flopwatch_stragglers",
            "Straggler events raised (a GPU's tensor activity far from its job's median).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.stragglers)),
        )?;
        counter(
            enc,
            "flopwatch_mfu_mismatches",
            "Jobs flagged for a reported MFU far from their measured OFU (suspected FLOPs miscalculation, OFU paper §V-C).",
            events
                .iter()
                .map(|(t, n)| (vec![("tenant".to_string(), t.clone())], n.mfu_mismatches)),
        )
    }

    /// The collector's own health: no tenant's names or labels.
    fn encode_health(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.c;
        let s: &Stats = &c.stats;
        gauges(
            enc,
            "flopwatch_agents_connected",
            "Agents with an open ingest stream.",
            [(
                Vec::new(),
                s.agents_connected.load(Ordering::Relaxed) as f64,
            )],
        )?;
        let get = Stats::get;
        counter(
            enc,
            "flopwatch_ingest_samples",
            "Samples stored.",
            one(get(&s.samples_accepted)),
        )?;
        counter(
            enc,
            "flopwatch_ingest_batches",
            "Batches acknowledged, replays included.",
            one(get(&s.batches_acked)),
        )?;
        counter(
            enc,
            "flopwatch_ingest_commit_writes",
            "Storage writes of acknowledged batches (one write carries every batch of a tenant waiting for storage).",
            one(get(&s.commit_writes)),
        )?;
        counter(
            enc,
            "flopwatch_ingest_duplicate_batches",
            "Batches acknowledged as replays of stored ones (not stored again).",
            one(get(&s.batches_duplicate)),
        )?;
        counter(
            enc,
            "flopwatch_ingest_rejected_batches",
            "Batches refused as a whole.",
            one(get(&s.batches_rejected)),
        )?;
        counter(
            enc,
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
            enc,
            "flopwatch_auth_failures",
            "Refused credentials, by service (ingest, query, metrics) and kind (unauthenticated, permission_denied).",
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
        counter(
            enc,
            "flopwatch_queries",
            "Prometheus API queries evaluated (answered, failed or stopped by a limit).",
            one(get(&s.queries)),
        )?;
        let mut limited: BTreeMap<&'static str, u64> = BTreeMap::new();
        for ((_, l), n) in s.query_limits() {
            *limited.entry(l).or_default() += n;
        }
        counter(
            enc,
            "flopwatch_query_limited",
            "Prometheus API queries refused or stopped by a limit, every tenant together, by limit.",
            limited
                .into_iter()
                .map(|(l, n)| (vec![("limit".to_string(), l.to_string())], n)),
        )?;
        gauges(
            enc,
            "flopwatch_queries_running",
            "Prometheus API queries evaluating now.",
            [(
                Vec::new(),
                s.queries_running.load(Ordering::Relaxed).max(0) as f64,
            )],
        )?;
        gauges(
            enc,
            "flopwatch_queries_queued",
            "Prometheus API queries waiting for their tenant's turn now.",
            [(
                Vec::new(),
                s.queries_queued.load(Ordering::Relaxed).max(0) as f64,
            )],
        )?;
        counter(
            enc,
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
        counter(
            enc,
            "flopwatch_remote_write_samples",
            "Samples delivered to the remote-write endpoint.",
            one(get(&s.remote_write_samples)),
        )?;
        counter(
            enc,
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
            enc,
            "flopwatch_remote_write_dropped_samples",
            "Samples never delivered to the remote-write endpoint, by reason: queue_full (the oldest, past max_queue_samples), max_age (older than max_age when their turn came), 4xx (refused by the endpoint, not retried).",
            [
                ("queue_full", get(&s.remote_write_dropped)),
                ("max_age", get(&s.remote_write_expired)),
                ("4xx", get(&s.remote_write_refused)),
            ]
            .into_iter()
            .map(|(r, n)| (vec![("reason".to_string(), r.to_string())], n)),
        )?;
        if let Some(q) = &c.remote {
            gauges(
                enc,
                "flopwatch_remote_write_pending_samples",
                "Samples in the remote-write journal, waiting to be delivered (durable: they survive a restart).",
                [(Vec::new(), q.pending() as f64)],
            )?;
            let now = c.clock.now_ms();
            gauges(
                enc,
                "flopwatch_remote_write_oldest_pending_age_seconds",
                "Age of the oldest sample waiting in the remote-write journal (0 when none).",
                [(
                    Vec::new(),
                    q.oldest_ms()
                        .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0),
                )],
            )?;
        }
        gauges(
            enc,
            "flopwatch_storage_memory_bytes",
            "Memory the storage engine holds for itself: memtables, block cache, table readers.",
            [(Vec::new(), c.store.engine().memory_bytes() as f64)],
        )?;
        let b = c.store.engine().backlog();
        gauges(
            enc,
            "flopwatch_storage_level0_files",
            "Files in level 0 of the storage family with the most; writes slow down past 20 and stop at 36.",
            [(
                vec![(
                    "family".to_string(),
                    b.l0_family.map_or("", |f| f.name()).to_string(),
                )],
                b.l0_files as f64,
            )],
        )?;
        gauges(
            enc,
            "flopwatch_storage_pending_compaction_bytes",
            "Bytes the storage engine's compactions estimate they still have to rewrite.",
            [(Vec::new(), b.pending_compaction_bytes as f64)],
        )?;
        gauges(
            enc,
            "flopwatch_storage_write_stall",
            "Whether the storage engine holds writes back until its compactions catch up: 0 no, 1 delayed, 2 stopped.",
            [(
                Vec::new(),
                if b.writes_stopped {
                    2.0
                } else if b.delayed_write_rate > 0 {
                    1.0
                } else {
                    0.0
                },
            )],
        )?;
        cluster_metrics(enc, &c.cluster)
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
