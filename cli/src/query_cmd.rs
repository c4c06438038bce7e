//! `flopwatch query ofu|nodes|gpus|jobs|job JOB|events|series --collector URL`

use crate::parse_ms;
use crate::query_jobs;
use crate::table::{self, Align, Table};
use flopwatch_proto::v1::{self, ofu_request};
use serde_json::json;

/// Arguments of `query`.
#[derive(clap::Args)]
pub(crate) struct QueryArgs {
    #[command(subcommand)]
    what: What,
    #[command(flatten)]
    conn: crate::conn::ConnArgs,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum What {
    /// OFU of a GPU, node, job or tenant (default: the whole visible fleet).
    Ofu {
        /// One job (OFU eq. 11 over its GPUs).
        #[arg(long, group = "scope")]
        job: Option<String>,
        /// One node.
        #[arg(long, group = "scope")]
        node: Option<String>,
        /// One GPU, by UUID.
        #[arg(long, group = "scope")]
        gpu: Option<String>,
        /// One tenant (provider credentials).
        #[arg(long, group = "scope")]
        tenant: Option<String>,
        /// How far back, e.g. 10m, 1h.
        #[arg(long, default_value = "10m")]
        since: String,
        #[command(flatten)]
        range: Range,
        /// Bucket width of the series, e.g. 10s; 0 for the summary only.
        /// Buckets start on multiples of the step (unix time), the first
        /// at or before `--since` (or at `--start`).
        #[arg(long, default_value = "0s")]
        step: String,
    },
    /// Nodes seen.
    Nodes,
    /// GPUs seen.
    Gpus,
    /// Jobs seen, with their OFU (eq. 11), its spread across GPUs and over
    /// time, their reported MFU and flags.
    Jobs {
        /// How far back, e.g. 1h.
        #[arg(long, default_value = "1h")]
        since: String,
    },
    /// One job: OFU summary and series, MFU cross-check, events.
    Job {
        /// Job id.
        job: String,
        /// How far back, e.g. 1h.
        #[arg(long, default_value = "1h")]
        since: String,
        /// Bucket width of the series, e.g. 1m; 0s for none.
        #[arg(long, default_value = "1m")]
        step: String,
    },
    /// Regressions, stragglers and agent-reported events (XID, ECC).
    Events {
        /// How far back, e.g. 1h.
        #[arg(long, default_value = "1h")]
        since: String,
        /// Only this kind: regression, straggler, xid, ecc_dbe, ...
        #[arg(long)]
        kind: Option<String>,
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// At most this many (the newest).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Raw samples of one GPU metric.
    Series {
        /// GPU UUID.
        #[arg(long)]
        gpu: String,
        /// Metric name, e.g. tensor_active.
        #[arg(long)]
        metric: String,
        /// How far back.
        #[arg(long, default_value = "10m")]
        since: String,
        #[command(flatten)]
        range: Range,
        /// Most samples.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
}

/// An explicit range `[start, end)` in unix ms, instead of `--since`.
#[derive(clap::Args)]
pub(crate) struct Range {
    /// Range start, unix ms (replaces --since).
    #[arg(long, value_name = "UNIX_MS")]
    start: Option<i64>,
    /// Range end, unix ms, exclusive (default: now).
    #[arg(long, value_name = "UNIX_MS", requires = "start")]
    end: Option<i64>,
}

impl Range {
    /// `(start_ms, end_ms)` for a request: `--start`/`--end`, or the last
    /// `since` before `now` (end 0: now, as the collector reads it).
    pub(crate) fn resolve(&self, since: &str, now: i64) -> anyhow::Result<(i64, i64)> {
        match self.start {
            Some(start) => {
                let end = self.end.unwrap_or(0);
                if start <= 0 || (end != 0 && end <= start) {
                    anyhow::bail!(
                        "--start {start} --end {end}: expected 0 < start < end (unix ms)"
                    );
                }
                Ok((start, end))
            }
            None => Ok((now - parse_ms(since)?, 0)),
        }
    }
}

pub(crate) async fn run(args: QueryArgs) -> anyhow::Result<()> {
    let mut c = args.conn.connect().await?;
    let now = flopwatch_proto::clock::Clock::now_ms(&flopwatch_proto::clock::SystemClock);
    match args.what {
        What::Ofu {
            job,
            node,
            gpu,
            tenant,
            since,
            range,
            step,
        } => {
            let scope = match (job, node, gpu, tenant) {
                (Some(j), ..) => ofu_request::Scope::JobId(j),
                (_, Some(n), ..) => ofu_request::Scope::NodeId(n),
                (_, _, Some(g), _) => ofu_request::Scope::GpuUuid(g),
                (_, _, _, Some(t)) => ofu_request::Scope::Tenant(t),
                _ => ofu_request::Scope::Fleet(true),
            };
            let step_ms = parse_ms(&step)?;
            let (mut start_ms, end_ms) = range.resolve(&since, now)?;
            // Buckets on the unix-time grid of the step, as dashboards
            // align them (and as the adaptive sampler cuts its sends),
            // unless --start names the first.
            if step_ms > 0 && range.start.is_none() {
                start_ms = start_ms.div_euclid(step_ms) * step_ms;
            }
            let req = v1::OfuRequest {
                scope: Some(scope.clone()),
                start_ms,
                end_ms,
                step_ms,
            };
            let r = c.ofu(req).await.map_err(crate::conn::status)?.into_inner();
            let s = r.summary.unwrap_or_default();
            if args.json {
                let out = json!({
                    "scope": scope_json(&scope),
                    "ofu": s.mean, "min": s.min, "max": s.max, "p50": s.p50, "p10": s.p10,
                    "samples": s.samples, "gpus": s.gpus,
                    "peak_tflops": s.peak_tflops, "achieved_tflops": s.achieved_tflops,
                    "points": r.points.iter().map(|p| json!({
                        "timestamp_ms": p.timestamp_ms, "ofu": p.ofu,
                        "tensor_active": p.tensor_active, "sm_clock_mhz": p.sm_clock_mhz, "gpus": p.gpus,
                    })).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                println!(
                    "OFU {:.2} %  (min {:.2} %, max {:.2} %, p50 GPU {:.2} %, p10 GPU {:.2} %)  {} GPUs, {} samples, {:.1} of {:.1} TFLOP/s",
                    s.mean * 100.0, s.min * 100.0, s.max * 100.0, s.p50 * 100.0, s.p10 * 100.0,
                    s.gpus, s.samples, s.achieved_tflops, s.peak_tflops
                );
                for p in &r.points {
                    println!(
                        "{}  {:>6.2} %  {}  TPA {:>5.1} %  SM {:>6.0} MHz  {} GPUs",
                        p.timestamp_ms,
                        p.ofu * 100.0,
                        table::bar(p.ofu, 20),
                        p.tensor_active * 100.0,
                        p.sm_clock_mhz,
                        p.gpus
                    );
                }
            }
        }
        What::Nodes => {
            let r = c
                .list_nodes(v1::ListRequest::default())
                .await
                .map_err(crate::conn::status)?
                .into_inner();
            if args.json {
                let v: Vec<_> = r.nodes.iter().map(|n| json!({"node_id": n.node_id, "hostname": n.hostname, "tenant": n.tenant, "gpus": n.gpus, "last_seen_ms": n.last_seen_ms})).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = Table::new(&[
                    ("NODE", Align::Left),
                    ("TENANT", Align::Left),
                    ("GPUS", Align::Right),
                    ("LAST SEEN", Align::Right),
                ]);
                for n in r.nodes {
                    t.row(vec![
                        n.node_id,
                        n.tenant,
                        n.gpus.to_string(),
                        ago(now, n.last_seen_ms),
                    ]);
                }
                t.print();
            }
        }
        What::Gpus => {
            let r = c
                .list_gpus(v1::ListRequest::default())
                .await
                .map_err(crate::conn::status)?
                .into_inner();
            if args.json {
                let v: Vec<_> = r.gpus.iter().map(|g| {
                    let i = g.info.clone().unwrap_or_default();
                    json!({"uuid": i.uuid, "model": i.model, "index": i.index, "node_id": g.node_id, "tenant": g.tenant, "job_id": g.job_id,
                           "driver_version": i.driver_version, "gpm_supported": i.gpm_supported,
                           "sm_count": i.sm_count, "max_sm_clock_mhz": i.max_sm_clock_mhz,
                           "mig": mig_json(&i), "shares": shares_json(&g.shares)})
                }).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = Table::new(&[
                    ("UUID", Align::Left),
                    ("MODEL", Align::Left),
                    ("NODE", Align::Left),
                    ("INDEX", Align::Right),
                    ("JOB", Align::Left),
                ]);
                for g in r.gpus {
                    let i = g.info.clone().unwrap_or_default();
                    t.row(vec![
                        i.uuid.clone(),
                        model_cell(&i),
                        g.node_id.clone(),
                        i.index.to_string(),
                        job_cell(&g),
                    ]);
                }
                t.print();
            }
        }
        What::Jobs { since } => {
            let start = now - parse_ms(&since)?;
            let r = c
                .list_jobs(v1::ListRequest { since_ms: start })
                .await
                .map_err(crate::conn::status)?
                .into_inner();
            let mut jobs = Vec::with_capacity(r.jobs.len());
            for entry in r.jobs {
                jobs.push(query_jobs::summarize(&mut c, entry, start, 0).await?);
            }
            if args.json {
                let v: Vec<_> = jobs.iter().map(|j| j.json(false)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                query_jobs::print_jobs(&jobs);
            }
        }
        What::Job { job, since, step } => {
            let start = now - parse_ms(&since)?;
            let entries: Vec<v1::JobEntry> = c
                .list_jobs(v1::ListRequest::default())
                .await
                .map_err(crate::conn::status)?
                .into_inner()
                .jobs
                .into_iter()
                .filter(|j| j.job_id == job)
                .collect();
            if entries.is_empty() {
                anyhow::bail!("no job `{job}`");
            }
            let mut out = Vec::new();
            for entry in entries {
                out.push(query_jobs::summarize(&mut c, entry, start, parse_ms(&step)?).await?);
            }
            if args.json {
                let v: Vec<_> = out.iter().map(|j| j.json(true)).collect();
                // One object for one job; a provider may see the same id in
                // several tenants.
                let v = if v.len() == 1 { v[0].clone() } else { json!(v) };
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for (i, j) in out.iter().enumerate() {
                    if i > 0 {
                        println!();
                    }
                    query_jobs::print_job(j, now);
                }
            }
        }
        What::Events {
            since,
            kind,
            job,
            limit,
        } => {
            let r = c
                .list_events(v1::EventsRequest {
                    start_ms: now - parse_ms(&since)?,
                    end_ms: 0,
                    kind: kind.unwrap_or_default(),
                    job_id: job.unwrap_or_default(),
                    limit,
                })
                .await
                .map_err(crate::conn::status)?
                .into_inner();
            if args.json {
                let v: Vec<_> = r
                    .events
                    .iter()
                    .map(|e| {
                        json!({"kind": e.kind, "timestamp_ms": e.timestamp_ms, "tenant": e.tenant,
                               "job_id": e.job_id, "gpu_uuid": e.gpu_uuid, "node_id": e.node_id,
                               "value": e.value, "baseline": e.baseline, "detail": e.detail})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = Table::new(&[
                    ("WHEN", Align::Right),
                    ("KIND", Align::Left),
                    ("TENANT", Align::Left),
                    ("JOB", Align::Left),
                    ("DETAIL", Align::Left),
                ]);
                for e in r.events {
                    t.row(vec![
                        ago(now, e.timestamp_ms),
                        e.kind,
                        e.tenant,
                        e.job_id,
                        e.detail,
                    ]);
                }
                t.print();
            }
        }
        What::Series {
            gpu,
            metric,
            since,
            range,
            limit,
        } => {
            let (start_ms, end_ms) = range.resolve(&since, now)?;
            let req = v1::SeriesRequest {
                gpu_uuid: gpu,
                metric,
                start_ms,
                end_ms,
                limit,
            };
            let s = c
                .series(req)
                .await
                .map_err(crate::conn::status)?
                .into_inner()
                .series
                .unwrap_or_default();
            if args.json {
                // Peaks and windows when the samples carry them (an
                // adaptive agent's aggregates).
                let mut out = json!({"timestamps_ms": s.timestamps_ms, "values": s.values});
                if !s.window_ms.is_empty() {
                    out["window_ms"] = json!(s.window_ms);
                }
                if !s.peaks.is_empty() {
                    out["peaks"] = json!(s.peaks);
                }
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                for (i, (t, v)) in s.timestamps_ms.iter().zip(&s.values).enumerate() {
                    let mut line = format!("{t} {v}");
                    if let Some(w) = s.window_ms.get(i) {
                        line += &format!(" window={w}ms");
                    }
                    if let Some(p) = s.peaks.get(i) {
                        line += &format!(" peak={p}");
                    }
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

/// `12s ago` for a unix-ms time before `now_ms`.
fn ago(now_ms: i64, t_ms: i64) -> String {
    format!("{}s ago", (now_ms - t_ms) / 1000)
}

/// A GPU's model, with its MIG profile for an instance (`NVIDIA H100 80GB
/// HBM3 (MIG 3g.40gb)`) and `(MIG card)` for a card counted through its
/// instances.
fn model_cell(i: &v1::GpuInfo) -> String {
    if !i.mig_parent_uuid.is_empty() {
        let profile = if i.mig_profile.is_empty() {
            format!("GI {}", i.gpu_instance_id)
        } else {
            i.mig_profile.clone()
        };
        format!("{} (MIG {profile})", i.model)
    } else if i.mig_enabled {
        format!("{} (MIG card)", i.model)
    } else {
        i.model.clone()
    }
}

/// A GPU's job, or the jobs sharing it with their apportioned shares
/// (`a 70% sm_util, b 30% sm_util`).
fn job_cell(g: &v1::GpuEntry) -> String {
    if g.shares.is_empty() {
        return g.job_id.clone();
    }
    g.shares
        .iter()
        .map(|s| {
            format!(
                "{} {:.0}% {}",
                s.job_id,
                f64::from(s.share_ppm) / 1e4,
                s.split
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A GPU's MIG identity as JSON: `null` for a whole GPU.
fn mig_json(i: &v1::GpuInfo) -> serde_json::Value {
    if !i.mig_parent_uuid.is_empty() {
        json!({"parent_uuid": i.mig_parent_uuid, "gpu_instance_id": i.gpu_instance_id,
               "compute_instance_id": i.compute_instance_id, "profile": i.mig_profile})
    } else if i.mig_enabled {
        json!({"card": true})
    } else {
        serde_json::Value::Null
    }
}

/// A shared GPU's jobs and their apportioned shares as JSON.
fn shares_json(shares: &[v1::JobShare]) -> serde_json::Value {
    shares
        .iter()
        .map(|s| json!({"job_id": s.job_id, "share": f64::from(s.share_ppm) / 1e6, "split": s.split}))
        .collect()
}

/// The scope of an OFU query as plain fields, named as in the other JSON
/// outputs: `{"kind": "gpu", "gpu_uuid": "GPU-…"}`, `{"kind": "job",
/// "job_id": …}`, `{"kind": "node", "node_id": …}`, `{"kind": "tenant",
/// "tenant": …}` or `{"kind": "fleet"}`.
fn scope_json(scope: &ofu_request::Scope) -> serde_json::Value {
    use ofu_request::Scope;
    match scope {
        Scope::JobId(j) => json!({"kind": "job", "job_id": j}),
        Scope::NodeId(n) => json!({"kind": "node", "node_id": n}),
        Scope::GpuUuid(g) => json!({"kind": "gpu", "gpu_uuid": g}),
        Scope::Tenant(t) => json!({"kind": "tenant", "tenant": t}),
        Scope::Fleet(_) => json!({"kind": "fleet"}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_instances_and_shared_gpus_say_so() {
        let whole = v1::GpuInfo {
            model: "NVIDIA A100-SXM4-80GB".into(),
            ..Default::default()
        };
        assert_eq!(model_cell(&whole), "NVIDIA A100-SXM4-80GB");
        assert_eq!(mig_json(&whole), serde_json::Value::Null);
        let instance = v1::GpuInfo {
            mig_parent_uuid: "GPU-1".into(),
            gpu_instance_id: 2,
            mig_profile: "3g.40gb".into(),
            ..whole.clone()
        };
        assert_eq!(model_cell(&instance), "NVIDIA A100-SXM4-80GB (MIG 3g.40gb)");
        assert_eq!(mig_json(&instance)["profile"], "3g.40gb");
        let card = v1::GpuInfo {
            mig_enabled: true,
            ..whole
        };
        assert_eq!(model_cell(&card), "NVIDIA A100-SXM4-80GB (MIG card)");
        let shared = v1::GpuEntry {
            shares: vec![
                v1::JobShare {
                    job_id: "a".into(),
                    share_ppm: 700_000,
                    split: "sm_util".into(),
                },
                v1::JobShare {
                    job_id: "b".into(),
                    share_ppm: 300_000,
                    split: "sm_util".into(),
                },
            ],
            ..Default::default()
        };
        assert_eq!(job_cell(&shared), "a 70% sm_util, b 30% sm_util");
        assert_eq!(shares_json(&shared.shares)[1]["share"], 0.3);
    }

    #[test]
    fn scopes_are_plain_fields() {
        let g = scope_json(&ofu_request::Scope::GpuUuid("GPU-1234".into()));
        assert_eq!(g, json!({"kind": "gpu", "gpu_uuid": "GPU-1234"}));
        let j = scope_json(&ofu_request::Scope::JobId("ns/pod".into()));
        assert_eq!(j, json!({"kind": "job", "job_id": "ns/pod"}));
        let f = scope_json(&ofu_request::Scope::Fleet(true));
        assert_eq!(f, json!({"kind": "fleet"}));
    }
}
