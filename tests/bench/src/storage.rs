//! `flopwatch-bench storage`: bytes per sample on disk against Prometheus,
//! and the 30-day hourly OFU query.
//!
//! 1. Samples: the simulator's traces (`agent/traces/*.csv`, 100 ms, five
//!    counters of one H100), each GPU starting on its own trace and going
//!    on through the others in turn (a trace never follows itself), tiled in time to
//!    `--hours`; once every capture as sent at a fixed 100 ms, once through
//!    the agent's adaptive sampler (irregular intervals).
//! 2. flopwatch: a collector in this process; every GPU is an agent stream
//!    over loopback gRPC sending 1 s batches, acked durably. Then the
//!    compactor seals every hour, RocksDB is flushed and fully compacted
//!    (every family, its last level included),
//!    and the whole data directory is measured (SST files, their indexes,
//!    MANIFEST, OPTIONS, logs; derived OFU and rollups included).
//!    Every series is then read back and compared bit for bit with what
//!    was sent (or, with `--precision`, with the values rounded as
//!    configured).
//! 3. Prometheus: the identical samples as an OpenMetrics file, turned
//!    into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`
//!    (blocks up to 24 h, its most compact setting), the output directory
//!    measured.
//! 4. VictoriaMetrics (`--victoria-metrics`, Debian's `victoria-metrics`):
//!    the identical samples imported into a real single-node
//!    VictoriaMetrics, flushed and force-merged, every value exported back
//!    and compared bit for bit (any difference is printed), its data
//!    directory measured.
//! 5. Query: one GPU with `--query-days` of OFU at 100 ms, compacted; the
//!    Query service's OFU of the GPU and of its job over the whole range
//!    at a 1 h step, timed over gRPC. `bench ingest --peer prometheus`
//!    runs the same with the identical samples in Prometheus and times
//!    its `query_range` beside each ([`super::prom_query`]).

use super::prom_query::{self as peer, QueryPeer, QueryRow};
use anyhow::{bail, Context};
use flopwatch_agent::source::replay::ReplaySource;
use flopwatch_agent::source::{Capture, GpuSource, SourceError};
use flopwatch_agent::AdaptiveSampler;
use flopwatch_agent::Batcher;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{PlanCarry, Sampler};
use flopwatch_collector::server;
use flopwatch_collector::store::{
    rocks::RocksEngine, round_decimals, Cf, CommitSet, GpuRecord, JobRecord, OfuSample, Store,
    WINDOW_MS,
};
use flopwatch_config::{CollectorConfig, SamplingConfig};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::metrics;
use flopwatch_proto::model::GpuInfo;
use flopwatch_proto::v1::{
    self, agent_message, collector_message, ingest_client::IngestClient, query_client::QueryClient,
    AgentMessage,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Arguments of `bench storage`.
#[derive(clap::Args)]
pub(super) struct StorageArgs {
    /// Trace files (timestamp_ms,gpu,metric,value); default: every
    /// `agent/traces/*.csv`.
    #[arg(long = "trace")]
    traces: Vec<PathBuf>,
    /// Simulated GPUs (one agent stream each).
    #[arg(long, default_value_t = 4)]
    gpus: usize,
    /// Hours of samples per GPU (the traces tiled in time).
    #[arg(long, default_value_t = 3)]
    hours: i64,
    /// Days of OFU for the query benchmark (0 skips it).
    #[arg(long, default_value_t = 30)]
    query_days: i64,
    /// Working directory (default: a temporary one, removed after).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// promtool binary.
    #[arg(long, default_value = "promtool")]
    promtool: String,
    /// VictoriaMetrics binary (Debian package `victoria-metrics`), the
    /// second peer; `none` leaves it out.
    #[arg(long, default_value = "victoria-metrics")]
    victoria_metrics: String,
    /// Also measure opt-in lossy storage: `METRIC=RESOLUTION` (a power of
    /// ten, as `[storage.precision]` takes it), repeatable. Prometheus then
    /// gets the values as flopwatch stores them.
    #[arg(long = "precision", value_parser = parse_precision)]
    precision: Vec<(String, f64)>,
}

fn parse_precision(s: &str) -> Result<(String, f64), String> {
    let (m, r) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected METRIC=RESOLUTION"))?;
    let r: f64 = r.parse().map_err(|e| format!("`{s}`: {e}"))?;
    flopwatch_config::resolution_decimals(r)
        .ok_or_else(|| format!("`{s}`: the resolution must be a power of ten"))?;
    Ok((m.to_string(), r))
}

/// One series' samples: (ts, value, window).
type Samples = BTreeMap<(String, &'static str), Vec<(i64, f64, u32)>>;

fn load_trace(path: &Path) -> anyhow::Result<Vec<Capture>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut src = ReplaySource::parse(&text, &path.display().to_string(), "NVIDIA H100 80GB HBM3")?;
    let mut caps = Vec::new();
    loop {
        match src.capture(0) {
            Ok(c) => caps.push(c),
            Err(SourceError::Exhausted) => return Ok(caps),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Captures of the traces from the `skip`-th of trace `first` on, one
/// whole trace after another (`first`, `first + 1`, … cycled), re-stamped
/// at the first trace's interval from `t0` for `hours`; GPU 0 only. A
/// trace follows a different one, never itself: a GPU repeating the same
/// ten minutes would hand a store that compresses blocks with a
/// dictionary coder (VictoriaMetrics' zstd, over blocks of up to 8,192
/// samples: 13.6 minutes at 100 ms) repeats no real GPU sends.
fn tiled(traces: &[Vec<Capture>], first: usize, skip: usize, t0: i64, hours: i64) -> Vec<Capture> {
    let step = match traces.get(first % traces.len().max(1)).map(Vec::as_slice) {
        Some([a, b, ..]) => (b.ts_ms - a.ts_ms).max(1),
        _ => 100,
    };
    let n = ((hours * WINDOW_MS) / step) as usize;
    let mut out = Vec::with_capacity(n);
    let (mut k, mut at) = (first, skip);
    while out.len() < n {
        let trace = &traces[k % traces.len()];
        if trace.is_empty() {
            break;
        }
        for c in trace.iter().skip(at % trace.len()) {
            if out.len() == n {
                break;
            }
            let mut c = c.clone();
            c.ts_ms = t0 + out.len() as i64 * step;
            c.gpus.retain(|g| g.gpu == 0);
            out.push(c);
        }
        (k, at) = (k + 1, 0);
    }
    out
}

/// What the bench's agents send: each GPU's batches, and the samples in
/// them.
struct Sent {
    batches: BTreeMap<String, Vec<v1::Batch>>,
    samples: Samples,
}

/// Each GPU's samples as its agent sends them: the sampler (with the read
/// plan applied as a field-by-field source would), then the agent's
/// [`Batcher`] (the pipeline's one reading → point conversion), cut every
/// second.
fn agents(traces: &[Vec<Capture>], gpus: usize, t0: i64, hours: i64, adaptive: bool) -> Sent {
    let mut out = Sent {
        batches: BTreeMap::new(),
        samples: Samples::new(),
    };
    for g in 0..gpus {
        let uuid = format!("GPU-bench-{g:03}");
        let inventory = [GpuInfo {
            uuid: uuid.clone(),
            model: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        }];
        let cfg = SamplingConfig {
            adaptive,
            ..Default::default()
        };
        let mut sampler = AdaptiveSampler::new(&cfg, g as u64 + 1);
        let mut carry = PlanCarry::default();
        let mut batcher = Batcher::default();
        let mut batches = Vec::new();
        let mut last_cut = t0;
        // The node `flopwatch_bytes` streams this GPU's batches as.
        let node = format!("bench-node-{g:03}");
        // GPUs sharing a trace start at different points of it.
        for mut c in tiled(traces, g, (g / traces.len()) * 997, t0, hours) {
            let plan = sampler.due(c.ts_ms);
            carry.apply(&plan, &mut c);
            sampler.observe(&mut c);
            let now = c.ts_ms;
            batcher.add(c, &inventory);
            if now - last_cut >= 1000 {
                batches.push(batcher.cut(&inventory, &node, "bench", now));
                last_cut = now;
            }
        }
        if !batcher.is_empty() {
            batches.push(batcher.cut(&inventory, &node, "bench", last_cut + 1000));
        }
        let mut wire = Vec::with_capacity(batches.len());
        for (i, mut b) in batches.into_iter().enumerate() {
            b.seq = i as u64 + 1;
            for series in &b.series {
                let Some(metric) = metrics::lookup(&series.metric).map(|d| d.name) else {
                    continue;
                };
                out.samples
                    .entry((uuid.clone(), metric))
                    .or_default()
                    .extend(
                        series
                            .points
                            .iter()
                            .map(|p| (p.ts_ms, p.value, p.window_ms.unwrap_or(0))),
                    );
            }
            wire.push(b.into());
        }
        out.batches.insert(uuid, wire);
    }
    out
}

/// Bytes under `p`.
pub(super) fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `p`'s bytes by kind: SST files, write-ahead logs, everything else
/// (MANIFEST, OPTIONS, info logs).
fn dir_kinds(p: &Path) -> (u64, u64, u64) {
    let mut k = (0, 0, 0);
    let Ok(rd) = std::fs::read_dir(p) else {
        return k;
    };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        if m.is_dir() {
            let (a, b, c) = dir_kinds(&e.path());
            k = (k.0 + a, k.1 + b, k.2 + c);
        } else if name.ends_with(".sst") {
            k.0 += m.len();
        } else if name.ends_with(".log") && name != "LOG" {
            k.1 += m.len();
        } else {
            k.2 += m.len();
        }
    }
    k
}

fn hello(node: &str, uuid: &str) -> v1::Hello {
    v1::Hello {
        agent_id: node.into(),
        node: Some(v1::NodeIdentity {
            node_id: node.into(),
            hostname: node.into(),
            boot_id: "bench".into(),
            labels: Default::default(),
        }),
        gpus: vec![v1::GpuInfo {
            index: 0,
            uuid: uuid.into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        }],
        protocol_version: 1,
        ..Default::default()
    }
}

async fn push(
    url: String,
    node: String,
    uuid: String,
    batches: Vec<v1::Batch>,
) -> anyhow::Result<u64> {
    let mut client = IngestClient::connect(url).await?;
    let (tx, rx) = mpsc::channel::<AgentMessage>(16);
    tx.send(AgentMessage {
        msg: Some(agent_message::Msg::Hello(hello(&node, &uuid))),
    })
    .await?;
    let mut inbound = client.stream(ReceiverStream::new(rx)).await?.into_inner();
    let _welcome = inbound.message().await?;
    let (mut acked, mut in_flight) = (0u64, 0usize);
    let mut it = batches.into_iter();
    loop {
        while in_flight < 8 {
            let Some(b) = it.next() else { break };
            tx.send(AgentMessage {
                msg: Some(agent_message::Msg::Batch(b)),
            })
            .await?;
            in_flight += 1;
        }
        if in_flight == 0 {
            return Ok(acked);
        }
        match inbound.message().await? {
            Some(v1::CollectorMessage {
                msg: Some(collector_message::Msg::Ack(a)),
            }) => {
                in_flight -= 1;
                acked += a.accepted_samples;
            }
            Some(other) => bail!("unexpected reply {other:?}"),
            None => bail!("stream closed"),
        }
    }
}

fn config(dir: &Path) -> CollectorConfig {
    CollectorConfig {
        data_dir: dir.to_path_buf(),
        anonymous_tenant: Some("default".into()),
        max_batch_bytes: 64 << 20,
        // The query benchmark's month, with room.
        retention: Duration::from_secs(40 * 24 * 3600),
        ..Default::default()
    }
}

/// `s` as stored under `precision` (metric → decimals).
fn rounded(s: &Samples, precision: &BTreeMap<String, i32>) -> Samples {
    let mut out = s.clone();
    for ((_, metric), pts) in out.iter_mut() {
        if let Some(&d) = precision.get(*metric) {
            for p in pts {
                p.1 = round_decimals(p.1, d);
            }
        }
    }
    out
}

/// Every series read back from `store` equals `expect` bit for bit.
fn check_stored(store: &Store, expect: &Samples) -> anyhow::Result<()> {
    for ((gpu, metric), pts) in expect {
        let got = store.series("default", gpu, metric, i64::MIN, i64::MAX, usize::MAX)?;
        let same = got.len() == pts.len()
            && got
                .iter()
                .zip(pts)
                .all(|(g, p)| g.ts_ms == p.0 && g.value.to_bits() == p.1.to_bits());
        if !same {
            bail!("{gpu} {metric}: the stored samples differ from those sent");
        }
    }
    Ok(())
}

/// flopwatch's bytes for `s`: ingested over gRPC, compacted, checked
/// against `expect` (what must be stored), measured.
async fn flopwatch_bytes(
    sent: &Sent,
    expect: &Samples,
    precision: &[(String, f64)],
    dir: &Path,
    now: i64,
) -> anyhow::Result<(u64, u64, f64)> {
    let _ = std::fs::remove_dir_all(dir);
    let clock = Arc::new(TokioClock::new());
    let mut cfg = config(dir);
    cfg.storage.precision = precision.iter().cloned().collect();
    let (collector, srv) = server::Loopback::open(&cfg, clock).await?;
    let started = Stopwatch::start();
    let mut tasks = Vec::new();
    for (i, (uuid, b)) in sent.batches.iter().enumerate() {
        tasks.push(tokio::spawn(push(
            srv.url.clone(),
            format!("bench-node-{i:03}"),
            uuid.clone(),
            b.clone(),
        )));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await??;
    }
    let ingest_s = started.elapsed().as_secs_f64();
    srv.stop().await?;
    let store = collector.store.clone();
    let e = store.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        e.compact(now + 2 * WINDOW_MS, 0)?;
        let engine = e.engine();
        engine.flush()?;
        for cf in Cf::ALL {
            engine.compact_fully(cf, u64::MAX)?;
        }
        engine.flush()?;
        Ok(())
    })
    .await??;
    check_stored(&store, expect)?;
    // What each column family holds, before RocksDB's own framing.
    let engine = store.engine();
    let mut parts = Vec::new();
    for cf in Cf::ALL {
        let (mut keys, mut bytes) = (0u64, 0u64);
        engine.scan(cf, &[], &[0xff; 600], &mut |k, v| {
            keys += 1;
            bytes += (k.len() + v.len()) as u64;
            true
        })?;
        if keys > 0 {
            parts.push(format!("{} {bytes} B in {keys} keys", cf.name()));
        }
    }
    println!("  keys and values: {}", parts.join(", "));
    drop(store);
    drop(collector);
    let (sst, wal, other) = dir_kinds(dir);
    println!("  data dir: {sst} B in SST files, {wal} B of write-ahead log, {other} B other");
    Ok((dir_bytes(dir), acked, ingest_s))
}

/// Prometheus' bytes for `s` (OpenMetrics → promtool → TSDB blocks).
fn prometheus_bytes(s: &Samples, work: &Path, name: &str, promtool: &str) -> anyhow::Result<u64> {
    let om = work.join(format!("{name}.om"));
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&om)?);
        let mut metrics: Vec<&'static str> = s.keys().map(|(_, m)| *m).collect();
        metrics.sort();
        metrics.dedup();
        for m in metrics {
            writeln!(f, "# TYPE {m} gauge")?;
            for ((gpu, _), pts) in s.iter().filter(|((_, mm), _)| *mm == m) {
                let labels = format!("gpu=\"{gpu}\"");
                for &(ts, v, _) in pts {
                    peer::om_sample(&mut f, m, &labels, ts, v)?;
                }
            }
        }
        writeln!(f, "# EOF")?;
        f.flush()?;
    }
    let out = work.join(format!("{name}-prometheus"));
    // promtool adds blocks to what is there: start empty.
    let _ = std::fs::remove_dir_all(&out);
    flopwatch_tests::prometheus_peer::create_blocks(promtool, &om, &out, "24h")
        .map_err(anyhow::Error::msg)?;
    let _ = std::fs::remove_file(&om);
    Ok(dir_bytes(&out))
}

/// VictoriaMetrics' bytes for `s`: the same samples imported into a real
/// single-node VictoriaMetrics (Prometheus text with millisecond
/// timestamps), flushed and force-merged, every series then exported and
/// compared value for value; returns the size of its data directory and
/// the samples that did not come back equal (missing, extra or changed).
async fn victoria_bytes(
    s: &Samples,
    work: &Path,
    name: &str,
    binary: &str,
) -> anyhow::Result<(u64, u64)> {
    use std::fmt::Write as _;
    let dir = work.join(format!("{name}-victoria"));
    let _ = std::fs::remove_dir_all(&dir);
    // Retention in days: the samples are hours old.
    let vm = super::victoria::Victoria::start(binary, &dir, 3650).await?;
    let http = reqwest::Client::new();
    let mut text = String::new();
    for ((gpu, m), pts) in s {
        for &(ts, v, _) in pts {
            let _ = writeln!(text, "{m}{{gpu=\"{gpu}\"}} {v:?} {ts}");
            if text.len() > 16 << 20 {
                vm.import(&http, std::mem::take(&mut text)).await?;
            }
        }
    }
    if !text.is_empty() {
        vm.import(&http, text).await?;
    }
    vm.settle(&http).await?;
    // Every series back, compared with what was sent.
    let body = http
        .get(format!("{}/api/v1/export", vm.url()))
        .query(&[("match[]", "{__name__!=\"\"}")])
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut back: BTreeMap<(String, String), Vec<(i64, f64)>> = BTreeMap::new();
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let j: serde_json::Value = serde_json::from_str(line).context("victoria-metrics export")?;
        let metric = j["metric"]["__name__"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let gpu = j["metric"]["gpu"].as_str().unwrap_or_default().to_string();
        let ts = j["timestamps"].as_array().cloned().unwrap_or_default();
        let vs = j["values"].as_array().cloned().unwrap_or_default();
        let e = back.entry((gpu, metric)).or_default();
        for (t, v) in ts.iter().zip(&vs) {
            e.push((
                t.as_i64().unwrap_or(i64::MIN),
                v.as_f64().unwrap_or(f64::NAN),
            ));
        }
    }
    let mut unequal = 0u64;
    let mut seen = 0usize;
    for ((gpu, m), pts) in s {
        let mut sent: Vec<(i64, f64)> = pts.iter().map(|&(t, v, _)| (t, v)).collect();
        sent.sort_by_key(|p| p.0);
        let mut got = back
            .get(&(gpu.clone(), m.to_string()))
            .cloned()
            .unwrap_or_default();
        got.sort_by_key(|p| p.0);
        seen += usize::from(!got.is_empty());
        unequal += sent.len().abs_diff(got.len()) as u64;
        unequal += sent
            .iter()
            .zip(&got)
            .filter(|(a, b)| a.0 != b.0 || a.1.to_bits() != b.1.to_bits())
            .count() as u64;
    }
    unequal += back.len().saturating_sub(seen) as u64;
    drop(vm);
    Ok((dir_bytes(&dir.join("data")), unequal))
}

/// One GPU's OFU samples of the hour starting at `h` (100 ms apart, the
/// first 100 ms in), from the generator state `x`.
fn query_hour(h: i64, x: &mut u64) -> Vec<OfuSample> {
    (0..36_000)
        .map(|i| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let tpa = (60_000 + (*x % 2000) as i64) as f64 / 1e5;
            OfuSample {
                ts_ms: h + i * 100 + 100,
                ofu: tpa * 1352.0 / 1830.0,
                tensor_active: tpa,
                sm_clock_mhz: 1352.0,
                window_ms: 100,
            }
        })
        .filter(|s| s.ts_ms < h + WINDOW_MS)
        .collect()
}

/// `days` of one GPU's OFU at 100 ms, compacted; then the hourly query
/// of the GPU (and of its job). With `peer`, the identical samples go to
/// Prometheus too (promtool blocks), and each query is compared with
/// Prometheus' `query_range` of `avg_over_time(...[1h])` at a 1 h step.
pub(super) async fn query_bench(
    dir: &Path,
    days: i64,
    peer: Option<&QueryPeer>,
) -> anyhow::Result<Vec<QueryRow>> {
    let now = flopwatch_proto::clock::SystemClock.now_ms();
    let end = now / WINDOW_MS * WINDOW_MS - WINDOW_MS;
    let start = end - days * 24 * WINDOW_MS;
    let (uuid, job) = ("GPU-query-000", "job-q");
    let _ = std::fs::remove_dir_all(dir);
    let built = Stopwatch::start();
    let mut total = 0u64;
    let mut blocks = peer
        .map(|p| peer::OfuBlocks::new(p, uuid, job))
        .transpose()?;
    let mut peer_s = 0.0;
    {
        let store = Store::new(Arc::new(RocksEngine::open(dir)?), false);
        let gpu = GpuRecord {
            uuid: uuid.into(),
            node_id: "query-node".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            last_seen_ms: end,
            ..Default::default()
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for (seq, h) in (start..end).step_by(WINDOW_MS as usize).enumerate() {
            let samples = query_hour(h, &mut x);
            total += samples.len() as u64;
            if let Some(b) = blocks.as_mut() {
                let t = Stopwatch::start();
                b.add(&samples)?;
                peer_s += t.elapsed().as_secs_f64();
            }
            store.commit(
                "default",
                &CommitSet {
                    seq: seq as u64 + 1,
                    ofu: vec![(uuid.into(), Some(job.into()), samples)],
                    derivations: super::h100_derivation(uuid),
                    gpus: if seq == 0 {
                        vec![gpu.clone()]
                    } else {
                        Vec::new()
                    },
                    jobs: if seq == 0 {
                        vec![JobRecord {
                            job_id: job.into(),
                            gpu_uuid: uuid.into(),
                            node_id: gpu.node_id.clone(),
                            first_seen_ms: start,
                            last_seen_ms: end,
                            ..Default::default()
                        }]
                    } else {
                        Vec::new()
                    },
                    ..Default::default()
                },
            )?;
            if seq % 24 == 23 {
                store.compact(h + 2 * WINDOW_MS, 0)?;
            }
        }
        store.compact(now + 2 * WINDOW_MS, 0)?;
        store.engine().flush()?;
    }
    let blocks = match blocks {
        Some(b) => {
            let t = Stopwatch::start();
            let (tsdb, n) = b.finish()?;
            peer_s += t.elapsed().as_secs_f64();
            if n != total {
                bail!("{n} samples to Prometheus, {total} to flopwatch");
            }
            Some(tsdb)
        }
        None => None,
    };
    println!(
        "query data: {days} days × 1 GPU of OFU at 100 ms = {total} samples, written and compacted in {:.1} s",
        built.elapsed().as_secs_f64() - peer_s
    );
    if let Some(tsdb) = &blocks {
        println!(
            "  the same samples as Prometheus TSDB blocks (OpenMetrics → promtool, 54 h blocks): {peer_s:.1} s, {} bytes",
            dir_bytes(tsdb)
        );
    }
    let clock = Arc::new(TokioClock::new());
    let (_collector, srv) = server::Loopback::open(&config(dir), clock).await?;
    let mut client = QueryClient::connect(srv.url.clone()).await?;
    let gpu_scope = v1::ofu_request::Scope::GpuUuid(uuid.into());
    let job_scope = v1::ofu_request::Scope::JobId(job.into());
    let gpu_q = format!("avg_over_time(flopwatch_ofu_ratio{{UUID=\"{uuid}\"}}[1h])");
    let job_q = format!("avg(avg_over_time(flopwatch_ofu_ratio{{job_id=\"{job}\"}}[1h]))");
    let cases = [
        (
            "1 h step, hour-aligned (hour rollups)",
            "30-day OFU of one GPU, 1 h step",
            &gpu_scope,
            &gpu_q,
            start,
            WINDOW_MS,
        ),
        (
            "1 h step, start 30 s past the hour (minute rollups)",
            "30-day OFU of one GPU, 1 h step, 30 s past the hour",
            &gpu_scope,
            &gpu_q,
            start + 30_000,
            WINDOW_MS,
        ),
        ("summary only", "", &gpu_scope, &gpu_q, start, 0),
        (
            "its job, 1 h step, hour-aligned",
            "30-day OFU of one job, 1 h step",
            &job_scope,
            &job_q,
            start,
            WINDOW_MS,
        ),
    ];
    let mut answers = Vec::new();
    for (label, _, scope, _, from, step) in &cases {
        // 50 runs, or at least 5 and then as many as fit 10 s.
        let began = Stopwatch::start();
        let mut times = Vec::new();
        let mut resp = None;
        while times.len() < 50 && (times.len() < 5 || began.elapsed() < Duration::from_secs(10)) {
            let t = Stopwatch::start();
            let req = v1::OfuRequest {
                scope: Some((*scope).clone()),
                start_ms: *from,
                end_ms: end,
                step_ms: *step,
            };
            let r = client.ofu(req).await?.into_inner();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            resp = Some(r);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let r = resp.context("no response")?;
        let samples = r.summary.as_ref().map_or(0, |s| s.samples);
        println!(
            "query {days} d of one GPU's OFU, {label}: {} points, {samples} samples; median {:.1} ms, p95 {:.1} ms, max {:.1} ms ({} runs, loopback gRPC)",
            r.points.len(),
            times[times.len() / 2],
            times[(times.len() * 95 / 100).min(times.len() - 1)],
            times[times.len() - 1],
            times.len(),
        );
        if *from == start && samples != total {
            bail!("query counted {samples} samples, {total} stored");
        }
        answers.push((times[times.len() / 2], r.points));
    }
    // The same month through the collector's Prometheus API, as Grafana
    // asks for it: `query_range` at a 1 h step, points at the end of each
    // hour (the rollups answer hours and minutes wholly inside a window).
    let http = reqwest::Client::new();
    let api_cases = [
        ("30-day OFU of one GPU, PromQL API, 1 h step", &gpu_q),
        ("30-day OFU of one job, PromQL API, 1 h step", &job_q),
    ];
    let api_range = (start + WINDOW_MS, end, WINDOW_MS);
    let mut api = Vec::new();
    for (row, q) in api_cases {
        // One run to size the rest: 5 to 50 runs, about 10 s in all.
        let (first, _) = peer::query_range(&http, &srv.api_url, q, api_range, 1).await?;
        let runs = ((10_000.0 / first[0].max(1.0)) as usize).clamp(5, 50);
        let (times, points) = peer::query_range(&http, &srv.api_url, q, api_range, runs).await?;
        let median = times[times.len() / 2];
        println!(
            "collector query_range `{q}`: {} points; median {median:.1} ms, p95 {:.1} ms, max {:.1} ms ({runs} runs, loopback HTTP)",
            points.len(),
            times[(times.len() * 95 / 100).min(times.len() - 1)],
            times[times.len() - 1],
        );
        api.push((row, q, median, points));
    }
    srv.stop().await?;
    let (Some(peer), Some(tsdb)) = (peer, blocks) else {
        return Ok(Vec::new());
    };
    let (prom, http) = peer::serve_blocks(peer, &tsdb, days).await?;
    let prom_url = prom.url().to_string();
    let mut rows = Vec::new();
    for ((_, row, _, q, from, step), (ours, points)) in cases.iter().zip(&answers) {
        if *step == 0 {
            continue;
        }
        // Prometheus' point at T averages (T - 1 h, T]: flopwatch's bucket
        // starting at T - 1 h.
        let runs = 5;
        let (times, theirs) =
            peer::query_range(&http, &prom_url, q, (from + step, end, *step), runs).await?;
        let (compared, worst) = agreement(
            points.iter().map(|p| (p.timestamp_ms + step, p.ofu)),
            &theirs,
        );
        let median = times[times.len() / 2];
        println!(
            "Prometheus query_range `{q}`, {row}: {} points; median {median:.1} ms, min {:.1} ms, max {:.1} ms ({runs} runs, loopback HTTP); {compared} points equal to flopwatch's within {worst:.1e}",
            theirs.len(),
            times[0],
            times[times.len() - 1],
        );
        // On the hour both answers hold the same samples. Off the hour
        // flopwatch moves a bucket edge inside a minute to the minute's
        // start (Store::ofu_pieces), so a bucket's mean moves slightly.
        let tolerance = if from % WINDOW_MS == 0 { 1e-9 } else { 1e-4 };
        if compared + 1 < points.len() || worst > tolerance {
            bail!("Prometheus and flopwatch answer `{row}` differently: {compared} of {} points compared, worst difference {worst}", points.len());
        }
        rows.push(QueryRow {
            label: row.replace("30-day", &format!("{days}-day")),
            flopwatch_ms: *ours,
            prometheus_ms: Some(median),
        });
    }
    // The API answers must be Prometheus' own, point for point.
    for (row, q, ours, points) in api {
        let runs = 5;
        let (times, theirs) = peer::query_range(&http, &prom_url, q, api_range, runs).await?;
        let (compared, worst) = agreement(points.iter().copied(), &theirs);
        let median = times[times.len() / 2];
        println!(
            "Prometheus query_range `{q}`: {} points; median {median:.1} ms, min {:.1} ms, max {:.1} ms ({runs} runs, loopback HTTP); {compared} points equal to the collector's within {worst:.1e}",
            theirs.len(),
            times[0],
            times[times.len() - 1],
        );
        if compared != points.len() || compared != theirs.len() || worst > 1e-9 {
            bail!("Prometheus and the collector's API answer `{q}` differently: {compared} points compared ({} and {}), worst difference {worst}", theirs.len(), points.len());
        }
        rows.push(QueryRow {
            label: row.replace("30-day", &format!("{days}-day")),
            flopwatch_ms: ours,
            prometheus_ms: Some(median),
        });
    }
    drop(prom);
    Ok(rows)
}

/// Points of `ours` (time, value) that `theirs` has at the same time, and
/// the largest difference between the two among them.
fn agreement(ours: impl Iterator<Item = (i64, f64)>, theirs: &[(i64, f64)]) -> (usize, f64) {
    let theirs: std::collections::HashMap<i64, f64> = theirs.iter().copied().collect();
    let (mut compared, mut worst) = (0, 0f64);
    for (t, v) in ours {
        if let Some(w) = theirs.get(&t) {
            worst = worst.max((v - w).abs());
            compared += 1;
        }
    }
    (compared, worst)
}

/// Runs the storage benchmark.
pub(super) async fn run(a: StorageArgs) -> anyhow::Result<()> {
    let mut traces = a.traces.clone();
    if traces.is_empty() {
        for e in std::fs::read_dir("agent/traces")
            .context("agent/traces (run from the repository root or pass --trace)")?
        {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "csv") {
                traces.push(p);
            }
        }
        traces.sort();
    }
    let loaded: Vec<Vec<Capture>> = traces
        .iter()
        .map(|p| load_trace(p))
        .collect::<anyhow::Result<_>>()?;
    if loaded.iter().all(|t| t.is_empty()) || a.gpus == 0 || a.hours <= 0 {
        bail!("nothing to measure: no trace samples, --gpus or --hours is 0");
    }
    let tmp = super::tempdir_path();
    let work = a.work_dir.clone().unwrap_or_else(|| tmp.clone());
    std::fs::create_dir_all(&work)?;
    let now = flopwatch_proto::clock::SystemClock.now_ms();
    // Whole hours ending an hour ago: inside retention, nothing ahead of now.
    let t0 = (now / WINDOW_MS - 1 - a.hours) * WINDOW_MS;
    println!(
        "storage: {} traces, {} GPUs × {} h; data dirs measured after compaction, flush and full RocksDB compaction",
        traces.len(),
        a.gpus,
        a.hours
    );
    println!("| sampling | samples | flopwatch bytes | B/sample | Prometheus bytes | B/sample | Prometheus / flopwatch | VictoriaMetrics bytes | B/sample | VictoriaMetrics / flopwatch | ingest |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let decimals: BTreeMap<String, i32> = a
        .precision
        .iter()
        .filter_map(|(m, r)| flopwatch_config::resolution_decimals(*r).map(|d| (m.clone(), d)))
        .collect();
    let lossy = a
        .precision
        .iter()
        .map(|(m, r)| format!("{m} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    for (name, adaptive) in [("fixed 100 ms", false), ("adaptive", true)] {
        let sent = agents(&loaded, a.gpus, t0, a.hours, adaptive);
        let s = &sent.samples;
        let n: u64 = s.values().map(|v| v.len() as u64).sum();
        let tag = if adaptive { "adaptive" } else { "fixed" };
        let mut runs = vec![("lossless".to_string(), Vec::new(), s.clone())];
        if !a.precision.is_empty() {
            runs.push((
                format!("precision {lossy}"),
                a.precision.clone(),
                rounded(s, &decimals),
            ));
        }
        for (kind, precision, stored) in runs {
            let dir = work.join(format!("{tag}-flopwatch"));
            let (ours, acked, ingest_s) =
                flopwatch_bytes(&sent, &stored, &precision, &dir, now).await?;
            if acked != n {
                bail!("{name}: {acked} samples acknowledged of {n} sent");
            }
            // The peers get the values as flopwatch stores them.
            let prom = prometheus_bytes(&stored, &work, tag, &a.promtool)?;
            let victoria = if a.victoria_metrics == "none" {
                "| - | - | - ".to_string()
            } else {
                let (vm, unequal) =
                    victoria_bytes(&stored, &work, tag, &a.victoria_metrics).await?;
                if unequal > 0 {
                    println!("  VictoriaMetrics gave back {unequal} samples unequal to those sent");
                }
                format!(
                    "| {vm} | {:.3} | {:.2}× ",
                    vm as f64 / n as f64,
                    vm as f64 / ours as f64
                )
            };
            println!(
                "| {name}, {kind} | {n} | {ours} | {:.3} | {prom} | {:.3} | {:.2}× {victoria}| {:.0} samples/s |",
                ours as f64 / n as f64,
                prom as f64 / n as f64,
                prom as f64 / ours as f64,
                n as f64 / ingest_s,
            );
        }
    }
    if a.query_days > 0 {
        query_bench(&work.join("query"), a.query_days, None).await?;
    }
    if work == tmp {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_agent::GpuCapture;

    /// A trace of `n` captures 100 ms apart, each marked `mark + i` (in
    /// its GPU's window, which the bench does not look at here).
    fn trace(mark: u32, n: u32) -> Vec<Capture> {
        (0..n)
            .map(|i| Capture {
                ts_ms: i64::from(i) * 100,
                gpus: vec![GpuCapture {
                    gpu: 0,
                    window_ms: mark + i,
                    readings: Vec::new(),
                }],
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn a_gpu_goes_on_through_the_other_traces_and_never_repeats_one_back_to_back() {
        let traces = [trace(0, 3), trace(10, 2)];
        let t0 = 7 * WINDOW_MS;
        let caps = tiled(&traces, 0, 1, t0, 1);
        assert_eq!(caps.len(), (WINDOW_MS / 100) as usize);
        let marks: Vec<u32> = caps.iter().map(|c| c.gpus[0].window_ms).collect();
        // From the second capture of the first trace, then the whole second
        // trace, then the first again from its start.
        assert_eq!(marks[..9], [1, 2, 10, 11, 0, 1, 2, 10, 11]);
        assert!(caps
            .iter()
            .enumerate()
            .all(|(i, c)| c.ts_ms == t0 + i as i64 * 100));
        // A GPU starting on the second trace.
        let caps = tiled(&traces, 1, 0, t0, 1);
        let marks: Vec<u32> = caps.iter().take(5).map(|c| c.gpus[0].window_ms).collect();
        assert_eq!(marks, [10, 11, 0, 1, 2]);
    }
}
