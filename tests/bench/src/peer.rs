//! `flopwatch-bench ingest --peer prometheus,victoria-metrics`: flopwatch
//! against a real Prometheus (Debian's 2.42) and a real single-node
//! VictoriaMetrics (Debian's 1.79), each started here on a loopback port,
//! on the same machine, in the same run. VictoriaMetrics is fed exactly as
//! Prometheus is (its Prometheus remote-write endpoint), and its own
//! `vm_rows_inserted_total` must equal the samples answered 2xx. With
//! `--sustained` the collector's figure includes compaction (see
//! `bench ingest`).
//!
//! **Ingest.** First the collector, exactly as `bench ingest` measures it
//! (`--streams` agent streams, `--window` batches of `--gpus` × `--metrics`
//! × `--points` samples in flight each, only acknowledged samples counted).
//! Then Prometheus with `--web.enable-remote-write-receiver`, fed the same
//! samples ([`super::sample`]: the same series, values and timestamps) for
//! the same time, through the collector's own remote-write client
//! ([`RemoteWriteEndpoint::write`]: protobuf and snappy, as the collector
//! sends them): one HTTP client per stream and `--window` requests in
//! flight per stream, each request holding as many samples as a batch.
//! Only 2xx answers count. Prometheus' head refuses a sample older than the
//! newest one of its series, so, as Prometheus' own remote-write shards do,
//! no two requests in flight hold the same series: request slot `w` of a
//! stream owns every `window`-th series of it and sends `window` batches'
//! worth of their points at once. After the run the server's own
//! `prometheus_tsdb_head_samples_appended_total` must equal the samples
//! counted, so that nothing answered 2xx was dropped.
//!
//! What an answer means: flopwatch acknowledges a batch once it, its OFU
//! and the agent's sequence number are in one RocksDB write through the WAL
//! (written to the file, no fsync: `sync_wal = false`), and a replayed
//! batch is recognised. Prometheus answers 2xx once the samples are in its
//! in-memory head and its WAL record is written to the file (no fsync); a
//! replayed request is appended again. Both survive the process dying,
//! neither survives the machine losing power.
//!
//! **Query** (`--query-days`, 30 by default): one GPU's OFU at 100 ms for
//! the whole range, written to flopwatch by `bench storage`'s query
//! benchmark ([`super::storage::query_bench`]) and, the identical samples,
//! to Prometheus as TSDB blocks made by `promtool tsdb create-blocks-from
//! openmetrics` (54-hour blocks, the largest Prometheus' own compaction
//! makes at this retention). Then flopwatch's `Query/Ofu` at a 1 h step
//! against Prometheus' `query_range` of `avg_over_time(...[1h])` at a 1 h
//! step, for the GPU and for its job; the two answers are compared point
//! by point.

use super::prom_query::{start, QueryPeer};
use super::{gpu_uuid, sample, Accepted, IngestArgs};
use anyhow::{bail, Context};
use flopwatch_collector::prompb::{Label, Sample, TimeSeries, WriteRequest};
use flopwatch_collector::RemoteWriteEndpoint;
use flopwatch_config::RemoteWriteConfig;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::metrics::CATALOG;
use flopwatch_tests::procs::free_port;
use flopwatch_tests::prometheus_peer::{find_tool, LocalPrometheus, PrometheusOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A system measured beside flopwatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Peer {
    /// Prometheus (`prometheus` and `promtool` on PATH, Debian package).
    Prometheus,
    /// A single-node VictoriaMetrics (`victoria-metrics` on PATH, Debian
    /// package), fed over its Prometheus remote-write endpoint.
    VictoriaMetrics,
}

/// Runs `bench ingest` against each of `a.peer`.
pub(super) async fn run(a: &IngestArgs) -> anyhow::Result<()> {
    let with_prometheus = a.peer.contains(&Peer::Prometheus);
    let prometheus = if with_prometheus {
        Some(find_tool(&a.prometheus).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    let promtool = match &prometheus {
        Some(_) if a.query_days > 0 => Some(find_tool(&a.promtool).map_err(anyhow::Error::msg)?),
        _ => None,
    };
    let work = super::tempdir_path().with_extension("peer");
    std::fs::create_dir_all(&work)?;
    let start_ms = super::ingest_start_ms(a)?;

    println!("## flopwatch collector, durable ingest");
    let ours = super::ingest(a, start_ms).await?;
    // (name, accepted) of each peer, in the order asked.
    let mut peers: Vec<(String, Accepted)> = Vec::new();
    for p in &a.peer {
        println!();
        match p {
            Peer::Prometheus => {
                let binary = prometheus.clone().unwrap_or_default();
                let version = version(&binary)?;
                println!("## {version}, remote-write receiver");
                let theirs = prometheus_ingest(a, &binary, start_ms, &work.join("ingest")).await?;
                peers.push((version, theirs));
            }
            Peer::VictoriaMetrics => {
                println!("## VictoriaMetrics (single node), remote-write endpoint");
                let theirs = victoria_ingest(a, start_ms, &work.join("ingest-vm")).await?;
                peers.push(("VictoriaMetrics".to_string(), theirs));
            }
        }
        let _ = std::fs::remove_dir_all(work.join("ingest"));
        let _ = std::fs::remove_dir_all(work.join("ingest-vm"));
    }
    let query = match (&prometheus, &promtool) {
        (Some(prometheus), Some(promtool)) => {
            println!();
            println!("## 30-day query data");
            let peer = QueryPeer {
                prometheus: prometheus.clone(),
                promtool: promtool.clone(),
                work: work.join("query-prometheus"),
            };
            super::storage::query_bench(&work.join("query"), a.query_days, Some(&peer)).await?
        }
        _ => Vec::new(),
    };
    let _ = std::fs::remove_dir_all(&work);

    println!();
    println!("## flopwatch against its peers, same machine, same run");
    println!("| figure | flopwatch | peer | flopwatch / peer | goal |");
    println!("|---|---:|---:|---:|---|");
    let what = if a.sustained {
        "compaction included"
    } else {
        "accepted"
    };
    for (name, theirs) in &peers {
        let ratio = ours.per_second() / theirs.per_second();
        let goal = if name.starts_with("Prometheus") {
            3.0
        } else {
            1.5
        };
        println!(
            "| ingest, samples/s {what}, against {name} | {} | {} | {ratio:.2}× | ≥ {goal}×: {} |",
            thousands(ours.per_second()),
            thousands(theirs.per_second()),
            met(ratio >= goal)
        );
    }
    for row in &query {
        if let Some(p) = row.prometheus_ms {
            let faster = p / row.flopwatch_ms;
            let ratio = if faster >= 1.0 {
                format!("{faster:.0}× faster")
            } else {
                format!("{:.1}× slower", 1.0 / faster)
            };
            println!(
                "| {}, median, against Prometheus | {:.1} ms | {:.1} ms | {ratio} | ≥ 10× faster: {} |",
                row.label,
                row.flopwatch_ms,
                p,
                met(faster >= 10.0)
            );
        }
    }
    println!(
        "(accepted: flopwatch acks, each after one RocksDB write through the WAL, no fsync; Prometheus 2xx answers, each after its head append and WAL write, no fsync; VictoriaMetrics 2xx answers, each once its rows are buffered in memory (flushed to disk within a second, no WAL))"
    );
    Ok(())
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

/// `x` rounded, with thousands separators.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The first line of `prometheus --version`.
fn version(prometheus: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new(prometheus)
        .arg("--version")
        .output()
        .with_context(|| format!("running {prometheus} --version"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let line = text.lines().next().unwrap_or("prometheus").trim();
    // "prometheus, version 2.42.0+ds (branch: ...)" → "Prometheus 2.42.0+ds"
    Ok(match line.split_once("version ") {
        Some((_, v)) => format!("Prometheus {}", v.split_whitespace().next().unwrap_or(v)),
        None => line.to_string(),
    })
}

/// The samples Prometheus' head has appended (`/metrics`).
async fn appended(http: &reqwest::Client, prom: &LocalPrometheus) -> anyhow::Result<u64> {
    super::victoria::metric_sum(
        http,
        &prom.url(),
        "prometheus_tsdb_head_samples_appended_total",
    )
    .await
}

/// How far, in sample time, a request slot may run ahead of the slowest
/// (half of the hour Prometheus accepts behind its head's newest sample).
const MAX_LEAD_MS: i64 = 30 * 60 * 1000;

/// Requests answered by the slowest slot.
fn slowest(done: &[std::sync::atomic::AtomicUsize]) -> usize {
    done.iter()
        .map(|d| d.load(std::sync::atomic::Ordering::Relaxed))
        .min()
        .unwrap_or(0)
}

/// Request `k` (from 0) of slot `w` of `slots` of stream `node`: the
/// stream's series `j` with `j % slots == w`, each with the samples of
/// batches `1 + k * slots ..= (k + 1) * slots` (see [`super::batch`]).
#[allow(clippy::too_many_arguments)]
fn request(
    node: &str,
    w: usize,
    slots: usize,
    k: usize,
    gpus: usize,
    metrics: usize,
    points: usize,
    t0: i64,
) -> WriteRequest {
    let first = (1 + k * slots) * points;
    let label = |name: &str, value: String| Label {
        name: name.into(),
        value,
    };
    let timeseries = (w..gpus * metrics)
        .step_by(slots)
        .map(|j| {
            let (g, mi) = (j / metrics, j % metrics);
            let m = &CATALOG[mi];
            let mut labels = vec![
                label("__name__", m.name.into()),
                label("UUID", gpu_uuid(node, g)),
                label("gpu", g.to_string()),
                label("hostname", node.into()),
                label("modelName", "NVIDIA H100 80GB HBM3".into()),
            ];
            labels.sort();
            let samples = (first..first + slots * points)
                .map(|p| {
                    let (timestamp, value) = sample(p, g, mi, m.unit, t0);
                    Sample { value, timestamp }
                })
                .collect();
            TimeSeries { labels, samples }
        })
        .collect();
    WriteRequest {
        timeseries,
        ..Default::default()
    }
}

/// Prometheus' remote-write ingest of the samples `bench ingest` sends,
/// with the same batch size and as many requests in flight.
async fn prometheus_ingest(
    a: &IngestArgs,
    prometheus: &str,
    t0: i64,
    dir: &Path,
) -> anyhow::Result<Accepted> {
    let _ = std::fs::remove_dir_all(dir);
    let (prom, http) = start(PrometheusOptions {
        binary: prometheus.into(),
        remote_write_receiver: true,
        ..PrometheusOptions::new(dir, free_port())
    })
    .await?;
    let before = appended(&http, &prom).await?;
    let got = remote_write(a, &format!("{}/api/v1/write", prom.url()), t0).await?;
    let stored = appended(&http, &prom).await? - before;
    if stored != got.samples {
        bail!(
            "Prometheus answered 2xx for {} samples but its head appended {stored}",
            got.samples
        );
    }
    println!(
        "accepted {} samples in {:.2} s = {:.0} samples/s (2xx answers; head appended {stored}); server pid {}",
        got.samples,
        got.secs,
        got.per_second(),
        prom.pid()
    );
    Ok(got)
}

/// VictoriaMetrics' remote-write ingest of the same samples, with the same
/// batch size and as many requests in flight; its own count of rows
/// inserted must match the samples answered 2xx.
async fn victoria_ingest(a: &IngestArgs, t0: i64, dir: &Path) -> anyhow::Result<Accepted> {
    let _ = std::fs::remove_dir_all(dir);
    let vm = super::victoria::Victoria::start(&a.victoria_metrics, dir, 3650).await?;
    let http = reqwest::Client::new();
    let before = vm.rows_inserted(&http).await?;
    let got = remote_write(a, &format!("{}/api/v1/write", vm.url()), t0).await?;
    let stored = vm.rows_inserted(&http).await? - before;
    if stored != got.samples {
        bail!(
            "VictoriaMetrics answered 2xx for {} samples but counts {stored} rows inserted",
            got.samples
        );
    }
    println!(
        "accepted {} samples in {:.2} s = {:.0} samples/s (2xx answers; rows inserted {stored})",
        got.samples,
        got.secs,
        got.per_second(),
    );
    Ok(got)
}

/// Sends the samples `bench ingest` sends to the remote-write endpoint
/// `url` for `--duration`, with the same batch size and as many requests
/// in flight; counts the samples answered 2xx.
async fn remote_write(a: &IngestArgs, url: &str, t0: i64) -> anyhow::Result<Accepted> {
    let (streams, gpus, points, window) = (a.streams, a.gpus, a.points, a.window);
    let metrics = a.metrics.min(CATALOG.len());
    let duration = Duration::from_millis(crate::parse_ms(&a.duration)? as u64);
    let cfg = RemoteWriteConfig {
        url: url.to_string(),
        timeout: Duration::from_secs(120),
        ..Default::default()
    };
    let slots = window.clamp(1, (gpus * metrics).max(1));
    // Requests each slot has had answered. No slot runs more than `lead`
    // requests ahead of the slowest: Prometheus refuses a sample more than
    // an hour older than its head's newest ("out of bounds"), and the run
    // crosses hours of sample time per second, so slots left to drift
    // apart end the run with a 400. Prometheus' own remote write keeps its
    // shards together the same way: they read one time-ordered WAL.
    let done: Arc<Vec<std::sync::atomic::AtomicUsize>> =
        Arc::new((0..streams * slots).map(|_| Default::default()).collect());
    let lead = (MAX_LEAD_MS / (slots * points) as i64 / 100).max(1) as usize;
    let started = Stopwatch::start();
    let mut tasks = Vec::new();
    for s in 0..streams {
        // One client (connection pool) per stream, as each agent stream
        // is its own connection.
        let endpoint = Arc::new(RemoteWriteEndpoint::new(&cfg)?);
        for w in 0..slots {
            let endpoint = endpoint.clone();
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let node = format!("bench-{s:03}");
                let mut accepted = 0u64;
                let mut k = 0;
                let me = &done[s * slots + w];
                while started.elapsed() < duration {
                    while k > slowest(&done) + lead && started.elapsed() < duration {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let req = request(&node, w, slots, k, gpus, metrics, points, t0);
                    let n: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
                    endpoint
                        .write(&req)
                        .await
                        .with_context(|| format!("stream {s}, request slot {w}"))?;
                    accepted += n as u64;
                    k += 1;
                    me.store(k, std::sync::atomic::Ordering::Relaxed);
                }
                anyhow::Ok(accepted)
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "ingest: {streams} streams × {slots} requests in flight, {} samples/request ({} series × {} points), {} series in all",
        (gpus * metrics).div_ceil(slots) * slots * points,
        (gpus * metrics).div_ceil(slots),
        slots * points,
        streams * gpus * metrics,
    );
    Ok(Accepted {
        samples: total,
        secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_hold_disjoint_series_and_a_batch_of_samples() {
        // 2 GPUs × 5 metrics, 10 points a batch, 2 requests in flight.
        let (gpus, metrics, points, slots) = (2, 5, 10, 2);
        let mut seen = std::collections::BTreeMap::new();
        for w in 0..slots {
            for k in 0..3 {
                let req = request("n", w, slots, k, gpus, metrics, points, 0);
                let n: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
                assert_eq!(n, gpus * metrics * points, "a batch's worth");
                for t in &req.timeseries {
                    assert!(t.labels.windows(2).all(|p| p[0].name < p[1].name));
                    let key: Vec<String> = t.labels.iter().map(|l| l.value.clone()).collect();
                    let owner = seen.entry(key).or_insert(w);
                    assert_eq!(*owner, w, "a series belongs to one slot");
                }
            }
        }
        assert_eq!(seen.len(), gpus * metrics);
        // The same samples as the collector's batches: batch 1's first
        // series is request 0 of slot 0's first series, first points.
        let b = super::super::batch("n", 1, gpus, metrics, points, 0);
        let r = request("n", 0, slots, 0, gpus, metrics, points, 0);
        let s = &r.timeseries[0].samples;
        assert_eq!(s.len(), slots * points);
        for (i, (ts, v)) in b.series[0]
            .timestamps_ms
            .iter()
            .zip(&b.series[0].values)
            .enumerate()
        {
            assert_eq!((s[i].timestamp, s[i].value), (*ts, *v));
        }
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(2_687_250.4), "2,687,250");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
    }
}
