//! `flopwatch query jobs` and `flopwatch query job JOB`: per-job OFU
//! (OFU paper eq. 11) with its spread across GPUs and over time, the job's
//! own MFU where it reports one, and its events.

use crate::table::{self, Table};
use flopwatch_proto::v1::{self, ofu_request};
use serde_json::{json, Value};

/// The events shown with a job, newest last.
const JOB_EVENTS: usize = 50;

/// One job's figures over the queried range.
pub(crate) struct JobSummary {
    pub entry: v1::JobEntry,
    pub ofu: v1::OfuSummary,
    pub points: Vec<v1::OfuPoint>,
    /// Latest `mfu` comparison: (reported MFU, measured OFU).
    pub mfu: Option<(f64, f64)>,
    /// Events of the job over the range, oldest first.
    pub events: Vec<v1::EventEntry>,
}

impl JobSummary {
    fn flagged(&self, kind: &str) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }

    pub(crate) fn json(&self, with_series: bool) -> Value {
        let s = &self.ofu;
        let mut v = json!({
            "job_id": self.entry.job_id,
            "tenant": self.entry.tenant,
            "gpus": self.entry.gpu_uuids.len(),
            "nodes": self.entry.node_ids,
            "first_seen_ms": self.entry.first_seen_ms,
            "last_seen_ms": self.entry.last_seen_ms,
            "ofu": s.mean, "min": s.min, "max": s.max,
            "p50_gpu": s.p50, "p10_gpu": s.p10,
            "p50_time": s.p50_over_time, "p10_time": s.p10_over_time,
            "samples": s.samples,
            "peak_tflops": s.peak_tflops, "achieved_tflops": s.achieved_tflops,
            "reported_mfu": self.mfu.map(|m| m.0),
            "mfu_vs_ofu": self.mfu.map(|m| if m.1 > 0.0 { m.0 / m.1 } else { f64::NAN }),
            "regressions": self.flagged("regression"),
            "stragglers": self.flagged("straggler"),
            "mfu_mismatches": self.flagged("mfu_mismatch"),
        });
        if with_series {
            v["gpu_uuids"] = json!(self.entry.gpu_uuids);
            v["points"] = self
                .points
                .iter()
                .map(|p| json!({"timestamp_ms": p.timestamp_ms, "ofu": p.ofu,
                    "tensor_active": p.tensor_active, "sm_clock_mhz": p.sm_clock_mhz, "gpus": p.gpus}))
                .collect();
            v["events"] = self
                .events
                .iter()
                .map(|e| {
                    json!({"kind": e.kind, "timestamp_ms": e.timestamp_ms,
                    "gpu_uuid": e.gpu_uuid, "node_id": e.node_id, "value": e.value,
                    "baseline": e.baseline, "detail": e.detail})
                })
                .collect();
        }
        v
    }
}

/// Fetches `job`'s figures over `[start_ms, now)`; `step_ms` 0 leaves the
/// series out.
pub(crate) async fn summarize<I: tonic::service::Interceptor>(
    c: &mut v1::query_client::QueryClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, I>,
    >,
    entry: v1::JobEntry,
    start_ms: i64,
    step_ms: i64,
) -> anyhow::Result<JobSummary> {
    let r = c
        .ofu(v1::OfuRequest {
            scope: Some(ofu_request::Scope::JobId(entry.job_id.clone())),
            start_ms,
            end_ms: 0,
            step_ms,
        })
        .await
        .map_err(crate::conn::status)?
        .into_inner();
    let mut events = c
        .list_events(v1::EventsRequest {
            start_ms,
            end_ms: 0,
            kind: String::new(),
            job_id: entry.job_id.clone(),
            limit: 10_000,
        })
        .await
        .map_err(crate::conn::status)?
        .into_inner()
        .events;
    // A provider sees every tenant: keep this job's tenant only.
    events.retain(|e| e.tenant == entry.tenant);
    let mfu = events
        .iter()
        .rev()
        .find(|e| e.kind == "mfu")
        .map(|e| (e.value, e.baseline));
    Ok(JobSummary {
        entry,
        ofu: r.summary.unwrap_or_default(),
        points: r.points,
        mfu,
        events,
    })
}

fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}

/// The `query jobs` table.
pub(crate) fn print_jobs(jobs: &[JobSummary]) {
    jobs_table(jobs).print();
}

fn jobs_table(jobs: &[JobSummary]) -> Table {
    use table::Align::{Left, Right};
    let mut t = Table::new(&[
        ("JOB", Left),
        ("TENANT", Left),
        ("GPUS", Right),
        ("OFU%", Right),
        ("p50GPU", Right),
        ("p10GPU", Right),
        ("p50time", Right),
        ("p10time", Right),
        ("MFU%", Right),
        ("MFU/OFU", Right),
        ("FLAGS", Left),
    ]);
    for j in jobs {
        let s = &j.ofu;
        let (mfu, ratio) = match j.mfu {
            Some((m, o)) if o > 0.0 => (pct(m), format!("{:.2}", m / o)),
            Some((m, _)) => (pct(m), "-".into()),
            None => ("-".into(), "-".into()),
        };
        let mut flags = Vec::new();
        for (kind, name) in [
            ("regression", "regression"),
            ("straggler", "straggler"),
            ("mfu_mismatch", "mfu-mismatch"),
        ] {
            let n = j.flagged(kind);
            if n > 0 {
                flags.push(format!("{name}×{n}"));
            }
        }
        t.row(vec![
            j.entry.job_id.clone(),
            j.entry.tenant.clone(),
            j.entry.gpu_uuids.len().to_string(),
            pct(s.mean),
            pct(s.p50),
            pct(s.p10),
            pct(s.p50_over_time),
            pct(s.p10_over_time),
            mfu,
            ratio,
            flags.join(" "),
        ]);
    }
    t
}

/// The `query job JOB` report.
pub(crate) fn print_job(j: &JobSummary, now_ms: i64) {
    let s = &j.ofu;
    println!(
        "job {}  tenant {}  {} GPUs on {}",
        j.entry.job_id,
        j.entry.tenant,
        j.entry.gpu_uuids.len(),
        j.entry.node_ids.join(", ")
    );
    println!(
        "OFU {:.2} %  (min {:.2} %, max {:.2} %)  {} samples, {:.1} of {:.1} TFLOP/s",
        s.mean * 100.0,
        s.min * 100.0,
        s.max * 100.0,
        s.samples,
        s.achieved_tflops,
        s.peak_tflops
    );
    println!(
        "across GPUs: p50 {:.2} %, p10 {:.2} %   over time: p50 {:.2} %, p10 {:.2} %",
        s.p50 * 100.0,
        s.p10 * 100.0,
        s.p50_over_time * 100.0,
        s.p10_over_time * 100.0
    );
    match j.mfu {
        Some((m, o)) => println!(
            "reported MFU {:.2} % vs measured OFU {:.2} % (ratio {:.2}){}",
            m * 100.0,
            o * 100.0,
            if o > 0.0 { m / o } else { f64::NAN },
            if j.flagged("mfu_mismatch") > 0 {
                "  ← suspected FLOPs miscalculation"
            } else {
                ""
            }
        ),
        None => println!("no MFU reported"),
    }
    if !j.points.is_empty() {
        println!();
        for p in &j.points {
            println!(
                "{:>6}s ago  {:>6.2} %  {}  {} GPUs",
                (now_ms - p.timestamp_ms) / 1000,
                p.ofu * 100.0,
                table::bar(p.ofu, 30),
                p.gpus
            );
        }
    }
    let shown: Vec<_> = j.events.iter().filter(|e| e.kind != "mfu").collect();
    if !shown.is_empty() {
        println!();
        let skip = shown.len().saturating_sub(JOB_EVENTS);
        for e in &shown[skip..] {
            println!(
                "{:>6}s ago  {:<12} {}",
                (now_ms - e.timestamp_ms) / 1000,
                e.kind,
                e.detail
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, tenant: &str, mean: f64) -> JobSummary {
        JobSummary {
            entry: v1::JobEntry {
                job_id: id.into(),
                tenant: tenant.into(),
                gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
                ..Default::default()
            },
            ofu: v1::OfuSummary {
                mean,
                ..Default::default()
            },
            points: Vec::new(),
            mfu: None,
            events: Vec::new(),
        }
    }

    /// A Kubernetes job id (namespace/pod) longer than any fixed width
    /// keeps every other column in line.
    #[test]
    fn a_long_job_id_keeps_the_columns_aligned() {
        let jobs = [
            job("short", "default", 0.5),
            job(
                "research-team-a/llm-pretrain-70b-worker-0-7f9c4d8b5-x2k9q",
                "tenant-with-a-long-name",
                0.125,
            ),
        ];
        let text = jobs_table(&jobs).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // Each column ends at the same character in every line.
        let end_of = |l: &str, cell: &str| {
            let at = l.find(cell).unwrap_or_else(|| panic!("{cell} in {l}"));
            l[..at].chars().count() + cell.chars().count()
        };
        assert_eq!(end_of(lines[0], "OFU%"), end_of(lines[1], "50.0"), "{text}");
        assert_eq!(end_of(lines[0], "OFU%"), end_of(lines[2], "12.5"), "{text}");
        let tenant_at = |l: &str, t: &str| l[..l.find(t).unwrap()].chars().count();
        assert_eq!(
            tenant_at(lines[0], "TENANT"),
            tenant_at(lines[1], "default")
        );
        assert_eq!(
            tenant_at(lines[0], "TENANT"),
            tenant_at(lines[2], "tenant-with-a-long-name")
        );
    }
}
