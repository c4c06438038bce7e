//! `flopwatch-bench fleet`: one collector under a fleet of agents, and
//! optionally a reconnect storm (the collector killed with SIGKILL and
//! restarted on its data directory).
//!
//! Three kinds of process (this binary each time):
//!
//! 1. the driver (what the user runs) writes a collector configuration,
//!    starts the collector and the agents, samples the collector's
//!    `/proc/PID/status` and `/proc/PID/stat` (memory, threads, CPU) and
//!    the agents' status lines, and prints a summary;
//! 2. the collector: `flopwatch collector --config` with RocksDB in a
//!    fresh directory, exactly as shipped, on a fixed loopback port so a
//!    restarted one is found where the killed one was;
//! 3. the load generator: `--agents` agents in as few processes as the
//!    open-files limit allows (each agent holds its connection and its
//!    spool file; 20,000 files a process fit about 9,800 agents), each the
//!    real agent's delivery
//!    path: the [`Batcher`] and its cut policy, an [`Outbox`] over a disk
//!    [`Spool`], and [`client::run`] (its 8-batch window, ack timeout,
//!    jittered reconnect backoff, 50/s drain rate), one gRPC connection
//!    and Ingest stream each.
//!
//! The agents are fed by a cheap synthetic source that sends what the
//! adaptive sampler sends on steady and periodic-training work
//! (docs/BENCHMARKS.md, adaptive sampling: 70.4× fewer samples than fixed
//! 100 ms, one sample per series about every 7 s): every `--gpus` ×
//! `--metrics` series gets one point per `--interval` (± 20 %, each agent
//! at its own phase), carrying its window (`window_ms` = the interval) as
//! the sampler's aggregated points do, so the batch cut policy sees the
//! rate a backed-off agent sees. Running the sampler itself at 100 ms for
//! 10,000 agents would take the machine's two cores from the collector.
//!
//! Ack latency is measured on the agents' side, from a batch put on the
//! wire to its ack (`OutboxStats::ack_latency`); samples stored are the
//! samples the agents had acknowledged (an ack means durable in the
//! collector's WAL). After the run the driver stops the agents' sources,
//! waits until every outbox is empty, stops the collector and counts, in
//! its store, every sample of `--verify-agents` agents: lost = produced −
//! stored (and produced − acknowledged over all agents).
//!
//! With `--remote-write URL` the collector forwards to that endpoint; with
//! `--remote-write sink` to a fourth process, [`super::sink`], a receiver
//! that only decodes and counts (in the idle scheduling class by default,
//! `--sink-idle`: standing in for a store on machines of its own) and
//! answers after `--sink-delay`. After the agents
//! drain, the driver waits for the sink to hold one new point per
//! acknowledged batch for each GPU's three OFU series, and prints what
//! arrived, repeats included, and the delivery lag.
//!
//! The collector's `/metrics` is not scraped during the steady state;
//! `--scrape` scrapes it once after, as served by default (bounded: no
//! per-GPU families past `[exporter] max_gpus`) and with `gpus=all` (every
//! GPU), measuring the page and the collector's memory.

use super::backpressure::{field, last_line, lines, memory, mib, ms, spawn, wait_for};
use super::cpus::CpuSet;
use super::hist_line::{fmt_hist, hist};
use anyhow::{bail, Context};
use flopwatch_agent::client::{self, ClientOptions, ClientState};
use flopwatch_agent::latency::{quantile, BUCKETS};
use flopwatch_agent::{Batcher, Capture, GpuCapture, Outbox, Reading};
use flopwatch_agent::{Spool, SpoolOptions, SpoolStats};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::metrics::CATALOG;
use flopwatch_proto::model::GpuInfo;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arguments of `bench fleet`.
#[derive(clap::Args)]
pub(super) struct FleetArgs {
    /// Agents (one connection and Ingest stream each, all in one process).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// GPUs per agent.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Metrics per GPU (from the catalog).
    #[arg(long, default_value_t = 20)]
    metrics: usize,
    /// Each series' sampling interval (the adaptive sampler's, backed off).
    #[arg(long, default_value = "7s")]
    interval: String,
    /// Agents start spread over this long.
    #[arg(long, default_value = "20s")]
    ramp: String,
    /// How long the steady state is measured, once every agent is
    /// connected and has sent for one interval.
    #[arg(long, default_value = "60s")]
    duration: String,
    /// After the steady state, kill the collector with SIGKILL, restart it
    /// on its data directory and measure the agents' return.
    #[arg(long)]
    storm: bool,
    /// The collector's `[limits] max_concurrent_commits` (batches of one
    /// tenant committed at once; every agent here is one tenant). Default:
    /// the collector's own default.
    #[arg(long)]
    commit_slots: Option<u32>,
    /// Agents whose every stored sample is counted after the run (0: all).
    #[arg(long, default_value_t = 500)]
    verify_agents: usize,
    /// After the steady state, scrape the collector's `/metrics` once as
    /// served by default and once with `gpus=all`: page size, time, and
    /// the collector's RSS before, at its peak during, and after.
    #[arg(long)]
    scrape: bool,
    /// Forward to a remote-write endpoint (the collector's
    /// `[remote_write] url`), or `sink`: a receiver of this bench's own in
    /// a process of its own (`--sink-idle`, see [`super::sink`]), whose counts are
    /// checked after the run against what the agents had acknowledged.
    #[arg(long)]
    remote_write: Option<String>,
    /// How long the `sink` takes to answer each request (a slow receiver).
    #[arg(long, default_value = "0s")]
    sink_delay: String,
    /// The `sink`'s nice value, with `--sink-idle false`: 19 (the lowest
    /// priority) by default.
    #[arg(long, default_value_t = 19)]
    sink_nice: i32,
    /// Runs the `sink` in Linux's idle scheduling class (`SCHED_IDLE`),
    /// every thread of it: on shared cores it takes only the CPU time the
    /// collector and the agents leave, and gives it up at once when one
    /// of theirs wakes, as a receiver on machines of its own would. With
    /// `false`, at `--sink-nice`. (Before 2026-12-06, late, only the
    /// sink's main thread was niced; its runtime's threads ran at nice 0.)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sink_idle: bool,
    /// Working directory (collector store, agent spools, logs); default:
    /// a temporary one, removed after.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Where the agents' spools go (a directory made in it, removed
    /// after); default: the working directory. On a fleet each agent
    /// writes its spool to its own node's disk; a tmpfs here (e.g.
    /// `/dev/shm`) keeps 10,000 agents' writes off the disk the
    /// collector's write-ahead log syncs to, where ext4 would make the
    /// collector's fsyncs wait for them.
    #[arg(long)]
    spools: Option<PathBuf>,
    /// Each agent's spool cap (`spool.max_bytes`); its segments roll at
    /// an eighth of it (16 KiB to 16 MiB), and a segment is deleted once
    /// rolled and acknowledged, so an agent holds about a segment.
    #[arg(long, default_value_t = 1 << 30)]
    spool_max_bytes: u64,
    /// Runs the collector on these CPUs (a list as `taskset -c` takes it,
    /// e.g. `0`) and this driver, the load generator and the sink on the
    /// others: the collector's figures are then its own, not decided by
    /// the load generator taking its core. Default: all share every CPU.
    #[arg(long)]
    collector_cpus: Option<String>,
    /// The sink's port (sink process).
    #[arg(long, hide = true, default_value_t = 0)]
    sink_port: u16,
    /// Which process this is.
    #[arg(long, hide = true, value_enum, default_value_t = Role::Driver)]
    role: Role,
    /// The collector's URL (agents process).
    #[arg(long, hide = true)]
    collector: Option<String>,
    /// The number of this process' first agent (agents process).
    #[arg(long, hide = true, default_value_t = 0)]
    first: usize,
    /// Sample time runs this many times faster than the wall clock
    /// (agents process of `bench soak`; see [`Warp`]).
    #[arg(long, hide = true, default_value_t = 1.0)]
    warp: f64,
    /// The wall clock's unix ms at which sample time starts (with
    /// `--warp`).
    #[arg(long, hide = true)]
    epoch_ms: Option<i64>,
    /// Sample time at `--epoch-ms` (default: the same instant).
    #[arg(long, hide = true)]
    origin_ms: Option<i64>,
}

impl FleetArgs {
    /// What the process does before its runtime's threads start, so that
    /// they inherit it: the sink's scheduling (`--sink-idle`,
    /// `--sink-nice`).
    pub(super) fn before_runtime(&self) {
        if !matches!(self.role, Role::Sink) {
            return;
        }
        if self.sink_idle {
            flopwatch_transport::priority::idle_thread("sink");
        } else {
            flopwatch_transport::priority::lower_thread_priority(self.sink_nice, "sink");
        }
    }
}

/// Sample time that starts at `origin_ms` when the wall clock reads
/// `epoch_ms` and runs `warp` times faster than it: how `bench soak`
/// compresses hours into minutes, the collector and every agent process
/// reading the same time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Warp {
    pub(super) epoch_ms: i64,
    pub(super) origin_ms: i64,
    pub(super) warp: f64,
}

impl Clock for Warp {
    fn now_ms(&self) -> i64 {
        let wall = SystemClock.now_ms();
        self.origin_ms + ((wall - self.epoch_ms) as f64 * self.warp) as i64
    }
}

impl Warp {
    /// The wall-clock time that `ms` of sample time take.
    pub(super) fn wall(&self, ms: i64) -> Duration {
        Duration::from_millis((ms.max(0) as f64 / self.warp) as u64)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    Driver,
    Agents,
    Sink,
}

pub(super) async fn run(a: FleetArgs) -> anyhow::Result<()> {
    match a.role {
        Role::Driver => driver(a).await,
        Role::Agents => agents(a).await,
        Role::Sink => super::sink::run(a.sink_port, ms(&a.sink_delay)?).await,
    }
}

/// Raises the open-file limit to `want` (10,000 agents need a socket
/// each, and a spool segment each on the agents' side): the soft limit to
/// the hard one, and the hard one too where the process may. Children
/// inherit it. Returns the soft limit in force.
fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur >= want {
            return lim.rlim_cur;
        }
        let up = libc::rlimit {
            rlim_cur: want.max(lim.rlim_max),
            rlim_max: want.max(lim.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &up) == 0 {
            return up.rlim_cur;
        }
        let soft = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) == 0 {
            return soft.rlim_cur;
        }
        lim.rlim_cur
    }
}

// ---------------------------------------------------------------------------
// The agents process.

/// What the agents process counts, over all agents.
#[derive(Default)]
struct Produced {
    samples: AtomicU64,
    batches: AtomicU64,
}

/// One synthetic agent's source: every series one point per `interval`
/// (± 20 %), cut by the agent's batch policy and queued in its outbox.
#[allow(clippy::too_many_arguments)]
async fn feed(
    node: String,
    inventory: Vec<GpuInfo>,
    metrics: usize,
    interval: Duration,
    outbox: Arc<Outbox>,
    produced: Arc<Produced>,
    mine: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    clock: Warp,
) {
    let flush_ms = 1_000;
    let interval_ms = interval.as_millis() as i64;
    let mut batcher = Batcher::default();
    let mut seed = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.hash(&mut h);
        h.finish() | 1
    };
    let mut draw = move |span: i64| {
        // xorshift: cheap, and the agents' phases need no more.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % span.max(1) as u64) as i64
    };
    let start = clock.now_ms();
    let mut next_sample = start + draw(interval_ms);
    let mut last_cut = start;
    let mut k = 0u64;
    let cut = |batcher: &mut Batcher, now: i64| {
        let n = batcher.len() as u64;
        let b = batcher.cut(&inventory, &node, "bench", now);
        outbox.push(b.into());
        produced.samples.fetch_add(n, Ordering::Relaxed);
        produced.batches.fetch_add(1, Ordering::Relaxed);
        mine.fetch_add(n, Ordering::Relaxed);
    };
    loop {
        let now = clock.now_ms();
        if stop.load(Ordering::Relaxed) {
            if !batcher.is_empty() {
                cut(&mut batcher, now);
            }
            return;
        }
        if now >= next_sample {
            k += 1;
            batcher.add(
                capture(now, &inventory, metrics, interval_ms, k),
                &inventory,
            );
            next_sample = now + interval_ms * 4 / 5 + draw(interval_ms * 2 / 5);
        }
        if batcher.due(now, last_cut, flush_ms, 50_000) {
            cut(&mut batcher, now);
            last_cut = now;
        }
        let due = batcher.due_at(last_cut, flush_ms).min(next_sample);
        let wait = clock
            .wall(due - clock.now_ms())
            .clamp(Duration::from_millis(10), Duration::from_millis(1_000));
        tokio::time::sleep(wait).await;
    }
}

/// What a backed-off adaptive sampler sends at `ts`: one aggregated point
/// per series, its window the interval, its peak above its mean.
fn capture(ts: i64, inventory: &[GpuInfo], metrics: usize, window_ms: i64, k: u64) -> Capture {
    Capture {
        ts_ms: ts,
        gpus: (0..inventory.len())
            .map(|g| GpuCapture {
                gpu: g,
                window_ms: 100,
                readings: CATALOG
                    .iter()
                    .take(metrics)
                    .enumerate()
                    .map(|(mi, m)| {
                        let phase = ((k as usize + g + mi) % 12 < 10) as u8 as f64;
                        let value = match m.unit {
                            "ratio" => 0.05 + 0.6 * phase,
                            "MHz" => 1352.0 + ((k as usize * 7 + g + mi) % 5) as f64,
                            _ => 300.0 + 250.0 * phase,
                        };
                        let mut r = Reading::new(m.name, value);
                        r.window_ms = Some(window_ms as u32);
                        r.peak = Some(value * 1.05);
                        r
                    })
                    .collect(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn agents(a: FleetArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().context("--dir")?;
    let url = a.collector.clone().context("--collector")?;
    raise_nofile(a.agents as u64 * 3 + 1024);
    let interval = ms(&a.interval)?;
    let ramp = ms(&a.ramp)?;
    let metrics = a.metrics.min(CATALOG.len());
    let produced = Arc::new(Produced::default());
    let stop = Arc::new(AtomicBool::new(false));
    let epoch_ms = a.epoch_ms.unwrap_or_else(|| SystemClock.now_ms());
    let clock = Warp {
        epoch_ms,
        origin_ms: a.origin_ms.unwrap_or(epoch_ms),
        warp: a.warp.max(1e-3),
    };
    let mut fleet = Vec::new();
    let started = tokio::time::Instant::now();
    for i in 0..a.agents {
        let node = format!("fleet-{:05}", a.first + i);
        let spool = Spool::open(
            &SpoolOptions {
                dir: a.spools.as_deref().unwrap_or(&dir).join(&node),
                max_bytes: a.spool_max_bytes,
                fsync_interval: Duration::from_secs(1),
            },
            Arc::new(SpoolStats::default()),
        )?;
        let outbox = Arc::new(Outbox::with_spool(64, spool));
        let wire = super::hello(&node, a.gpus);
        let inventory: Vec<GpuInfo> = wire
            .gpus
            .iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                ..Default::default()
            })
            .collect();
        let hello = flopwatch_proto::model::Hello::try_from(wire)
            .map_err(|e| anyhow::anyhow!("hello: {e}"))?;
        let (state, watch) = tokio::sync::watch::channel(ClientState::default());
        let mine = Arc::new(AtomicU64::new(0));
        let at = ramp.mul_f64(i as f64 / a.agents.max(1) as f64);
        let (o, p, m, s) = (outbox.clone(), produced.clone(), mine.clone(), stop.clone());
        let url = url.clone();
        let node_id = node.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(started + at).await;
            tokio::spawn(client::run(
                ClientOptions {
                    hello_updates: None,
                    collectors: vec![url],
                    token: None,
                    hello,
                    drain_timeout: Duration::from_secs(1),
                    max_batches_per_second: Some(50),
                    tls: Default::default(),
                },
                o.clone(),
                state,
            ));
            feed(node_id, inventory, metrics, interval, o, p, m, s, clock).await;
        });
        fleet.push((node, outbox, watch, mine));
    }
    let status = |label: &str| {
        let mut hist = vec![0u64; BUCKETS];
        let (mut acked, mut acked_batches, mut pending, mut connected, mut connections) =
            (0u64, 0u64, 0usize, 0usize, 0u64);
        for (_, o, w, _) in &fleet {
            acked += o.stats.acked_samples.load(Ordering::Relaxed);
            acked_batches += o.stats.acked_batches.load(Ordering::Relaxed);
            pending += o.len();
            let st = w.borrow();
            connected += usize::from(st.connected_to.is_some());
            connections += st.connections;
            for (h, c) in hist.iter_mut().zip(o.stats.ack_latency.counts()) {
                *h += c;
            }
        }
        let hist = fmt_hist(&hist);
        println!(
            "{label} t={:.2} produced={} produced_batches={} acked={acked} acked_batches={acked_batches} pending={pending} connected={connected} connections={connections} hist={}",
            started.elapsed().as_secs_f64(),
            produced.samples.load(Ordering::Relaxed),
            produced.batches.load(Ordering::Relaxed),
            hist,
        );
        let _ = std::io::stdout().flush();
        pending
    };
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Until the driver asks to stop: sources stop, outboxes drain.
    loop {
        tick.tick().await;
        status("agents");
        if dir.join("stop").exists() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let until = Deadline::after(Duration::from_secs(180));
    while status("agents") > 0 && !until.passed() {
        tick.tick().await;
    }
    let mut out = String::new();
    for (node, _, _, mine) in &fleet {
        out.push_str(&format!("{node}\t{}\n", mine.load(Ordering::Relaxed)));
    }
    std::fs::write(dir.join("produced.tsv"), out)?;
    status("agents done");
    // The spools stay on disk; nothing more to deliver in a benchmark.
    std::process::exit(0)
}

// ---------------------------------------------------------------------------
// The driver.

/// Scrapes `/metrics{query}` of the collector `pid` serving on `port`
/// once over plain HTTP/1.1, sampling its RSS every 10 ms meanwhile, and
/// prints the page's size, the time and the RSS before, at its peak and
/// after.
fn scrape(pid: u32, port: u16, query: &str) -> anyhow::Result<()> {
    use std::io::Read;
    let before = memory(pid).map_or(0, |m| m.0);
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some((rss, _, _)) = memory(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let started = Stopwatch::start();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(
        conn,
        "GET /metrics{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut page = Vec::new();
    conn.read_to_end(&mut page)?;
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    std::thread::sleep(Duration::from_secs(2));
    let after = memory(pid).map_or(0, |m| m.0);
    let text = String::from_utf8_lossy(&page);
    let series = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("HTTP/"))
        .count();
    let omitted = text
        .lines()
        .find_map(|l| l.strip_prefix("flopwatch_exporter_gpus_omitted"))
        .and_then(|v| v.trim_start_matches("{}").trim().parse::<f64>().ok())
        .map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
    println!(
        "scrape /metrics{query}: {:.2} MB, about {series} lines, {:.0} ms; GPUs omitted {omitted}; collector VmRSS {:.1} MiB before, {:.1} MiB at its peak during, {:.1} MiB 2 s after",
        page.len() as f64 / 1e6,
        took.as_secs_f64() * 1000.0,
        mib(before),
        mib(peak.load(Ordering::Relaxed)),
        mib(after),
    );
    Ok(())
}

/// `utime + stime` of `pid`, seconds.
pub(super) fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3).
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The collector's CPUs of `--collector-cpus`: binds this process (and
/// so the load generator and the sink it starts) to the other CPUs and
/// says which.
fn pin(list: Option<&str>) -> anyhow::Result<Option<CpuSet>> {
    let Some(list) = list else {
        return Ok(None);
    };
    let collector = CpuSet::parse(list)?;
    let rest = CpuSet::allowed()?.without(&collector);
    if rest.is_empty() {
        bail!("--collector-cpus {list} leaves no CPU for the load generator");
    }
    rest.bind_process()?;
    println!("CPUs: collector on {collector}, driver, load generator and sink on {rest}");
    Ok(Some(collector))
}

/// The collector's CPUs of `--collector-cpus`, parsed.
fn pin_of(a: &FleetArgs) -> anyhow::Result<Option<CpuSet>> {
    a.collector_cpus.as_deref().map(CpuSet::parse).transpose()
}

/// The collector process (and what it prints).
struct Collector {
    child: Child,
}

fn start_collector(config: &Path, log: &Path, cpus: Option<&CpuSet>) -> anyhow::Result<Collector> {
    // Right after a kill the port or the store's lock may still be held
    // for a moment: retry.
    for _ in 0..100 {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut cmd = Command::new(super::flopwatch_exe()?);
        cmd.args(["collector", "--config"])
            .arg(config)
            // Warnings, and the compaction passes long enough to matter.
            .env("FLOPWATCH_LOG", "warn,flopwatch_collector::store=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err);
        if let Some(c) = cpus {
            c.bind_child(&mut cmd);
        }
        let mut child = cmd.spawn().context("starting the collector")?;
        let out = lines(&mut child);
        let until = Deadline::after(Duration::from_secs(60));
        loop {
            if out
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|l| l.starts_with("listening on"))
            {
                return Ok(Collector { child });
            }
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if until.passed() {
                let _ = child.kill();
                bail!("the collector did not start; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the collector keeps failing to start; see {}",
        log.display()
    )
}

/// The agents' status lines so far.
type Lines = Arc<Mutex<Vec<String>>>;

fn last_status(l: &Lines) -> String {
    last_line(l, "agents t=")
}

/// The load generator's processes: each child, its directory and its
/// output.
#[derive(Default)]
pub(super) struct Generators {
    procs: Vec<(Child, PathBuf, Lines)>,
}

/// The fleet a load generator runs.
pub(super) struct Load {
    pub(super) agents: usize,
    pub(super) gpus: usize,
    pub(super) metrics: usize,
    /// Each series' interval (sample time).
    pub(super) interval: String,
    /// Agents start spread over this long (wall time).
    pub(super) ramp: String,
    /// Where the agents' spools go (default: with each process' files).
    pub(super) spools: Option<PathBuf>,
    /// Each agent's spool cap, bytes.
    pub(super) spool_max_bytes: u64,
}

impl Generators {
    /// Starts `load`'s agents against `url`, in as many processes as the
    /// open-files limit asks for (each agent holds about two files: its
    /// connection and its spool), each with `extra` arguments.
    pub(super) fn start(
        root: &Path,
        url: &str,
        load: &Load,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let n = load.agents;
        let nofile = raise_nofile(n as u64 * 3 + 1024);
        let per_process = (nofile.saturating_sub(256) / 2) as usize;
        if per_process == 0 {
            bail!(
                "the open-files limit ({nofile}) leaves no room for agents (raise it: ulimit -n)"
            );
        }
        let processes = n.div_ceil(per_process).max(1);
        let mut gen = Generators::default();
        for j in 0..processes {
            let (first, end) = (n * j / processes, n * (j + 1) / processes);
            let dir = root.join("agents").join(format!("p{j}"));
            std::fs::create_dir_all(&dir)?;
            let mut args: Vec<String> = vec![
                "--dir".into(),
                dir.display().to_string(),
                "--collector".into(),
                url.into(),
                "--agents".into(),
                (end - first).to_string(),
                "--first".into(),
                first.to_string(),
                "--gpus".into(),
                load.gpus.to_string(),
                "--metrics".into(),
                load.metrics.to_string(),
                "--interval".into(),
                load.interval.clone(),
                "--ramp".into(),
                load.ramp.clone(),
                "--spool-max-bytes".into(),
                load.spool_max_bytes.to_string(),
            ];
            if let Some(spools) = &load.spools {
                let spools = spools.join(format!("p{j}"));
                std::fs::create_dir_all(&spools)?;
                args.extend(["--spools".into(), spools.display().to_string()]);
            }
            args.extend_from_slice(extra);
            let mut child = spawn(
                "fleet",
                "agents",
                &args,
                &root.join(format!("agents-{j}.log")),
            )?;
            let out = lines(&mut child);
            gen.procs.push((child, dir, out));
        }
        Ok(gen)
    }

    /// One status line for all processes: their last ones' counts summed
    /// (the latency histograms bucket by bucket).
    pub(super) fn status(&self) -> String {
        Self::combine(self.procs.iter().map(|(_, _, l)| last_status(l)))
    }

    fn combine(lines: impl Iterator<Item = String>) -> String {
        const KEYS: [&str; 7] = [
            "produced",
            "produced_batches",
            "acked",
            "acked_batches",
            "pending",
            "connected",
            "connections",
        ];
        let mut sums = [0f64; KEYS.len()];
        let mut h = vec![0u64; BUCKETS];
        for l in lines {
            for (s, k) in sums.iter_mut().zip(KEYS) {
                *s += field(&l, k);
            }
            for (a, b) in h.iter_mut().zip(hist(&l)) {
                *a += b;
            }
        }
        let mut out = String::from("agents t=0");
        for (s, k) in sums.iter().zip(KEYS) {
            out += &format!(" {k}={s}");
        }
        let h: Vec<String> = h
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| format!("{i}:{c}"))
            .collect();
        out + " hist=" + &h.join(",")
    }

    /// What each agent produced (`produced.tsv` of every process, written
    /// once it drained).
    pub(super) fn produced(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let mut produced = String::new();
        for (_, dir, _) in &self.procs {
            let tsv = dir.join("produced.tsv");
            produced += &std::fs::read_to_string(&tsv)
                .with_context(|| format!("reading {}", tsv.display()))?;
        }
        Ok(produced
            .lines()
            .filter_map(|l| {
                let (node, n) = l.split_once('\t')?;
                Some((node.to_string(), n.parse().ok()?))
            })
            .collect())
    }

    /// Kills every process.
    pub(super) fn kill(&mut self) {
        for (child, _, _) in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// CPU seconds of all processes.
    pub(super) fn cpu_seconds(&self) -> f64 {
        self.procs
            .iter()
            .filter_map(|(c, _, _)| cpu_seconds(c.id()))
            .sum()
    }

    /// Stops the sources and waits until every process has drained: the
    /// final status of all, combined.
    pub(super) fn drain(&self, limit: Duration) -> anyhow::Result<String> {
        for (_, dir, _) in &self.procs {
            std::fs::write(dir.join("stop"), b"")?;
        }
        let mut done = Vec::new();
        for (_, _, l) in &self.procs {
            done.push(format!("agents {}", wait_for(l, "agents done ", limit)?));
        }
        Ok(Self::combine(done.into_iter()))
    }
}

pub(super) fn fmt_ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// A duration as a `key=value` field's value: milliseconds, `-` for none.
fn ms_field(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// The median (the lower middle one of an even count) and the largest of
/// the windows' figures that exist.
fn median_and_max(v: &[Option<Duration>]) -> (Option<Duration>, Option<Duration>) {
    let mut v: Vec<Duration> = v.iter().flatten().copied().collect();
    v.sort_unstable();
    let median = v.get(v.len().saturating_sub(1) / 2).copied();
    (median, v.last().copied())
}

/// Sockets `pid` holds open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .map(|t| t.to_string_lossy().starts_with("socket:"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

async fn driver(a: FleetArgs) -> anyhow::Result<()> {
    let tmp = a.dir.is_none();
    let root = a.dir.clone().unwrap_or_else(super::tempdir_path);
    std::fs::create_dir_all(&root)?;
    let _ = std::fs::remove_file(root.join("stop"));
    let n = a.agents;
    let cpus = pin(a.collector_cpus.as_deref())?;
    let spools = a
        .spools
        .as_ref()
        .map(|d| d.join(format!("flopwatch-spools-{}", std::process::id())));
    // Before the collector starts, so that it inherits the limit too.
    raise_nofile(n as u64 * 3 + 1024);
    // Below the kernel's ephemeral range (the harness's ports), so that
    // none of the agents' outbound connections holds one when the
    // collector restarts.
    let port = flopwatch_tests::procs::free_port();
    let metrics_port = flopwatch_tests::procs::free_port();
    let config = root.join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\ndata_dir = \"{}\"\n\
             anonymous_tenant = \"default\"\nplaintext = true\nmax_agents = {}\n{}",
            root.join("collector").display(),
            n + 16,
            a.commit_slots
                .map(|c| format!("\n[limits]\nmax_concurrent_commits = {c}\n"))
                .unwrap_or_default(),
        ),
    )?;
    let mut sink = None;
    if let Some(to) = &a.remote_write {
        let url = if to == "sink" {
            let s = Sink::start(&root, &a.sink_delay, (a.sink_idle, a.sink_nice))?;
            let url = s.url.clone();
            sink = Some(s);
            url
        } else {
            to.clone()
        };
        let mut f = std::fs::OpenOptions::new().append(true).open(&config)?;
        writeln!(f, "\n[remote_write]\nurl = \"{url}\"")?;
    }
    let log = root.join("collector.log");
    let mut col = start_collector(&config, &log, cpus.as_ref())?;
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, _, threads0) = memory(col.child.id()).context("reading /proc/PID/status")?;
    let load = Load {
        agents: n,
        gpus: a.gpus,
        metrics: a.metrics,
        interval: a.interval.clone(),
        ramp: a.ramp.clone(),
        spools: spools.clone(),
        spool_max_bytes: a.spool_max_bytes,
    };
    let gen = Generators::start(&root, &format!("http://127.0.0.1:{port}"), &load, &[])?;
    let mut gen = gen;
    let result = run_phases(
        &a,
        &root,
        &config,
        &log,
        &mut col,
        rss0,
        threads0,
        &gen,
        sink.as_ref(),
    )
    .and_then(|steady| {
        if a.scrape {
            for query in ["", "?gpus=all"] {
                scrape(col.child.id(), metrics_port, query)?;
            }
        }
        Ok(steady)
    });
    let outcome = finish(&a, &root, &mut col, &mut gen, sink.as_mut(), result);
    if let Some(s) = &spools {
        let _ = std::fs::remove_dir_all(s);
    }
    // A temporary root goes whatever happened: a failed run of 10,000
    // agents leaves gigabytes of spools and store behind.
    if tmp {
        let _ = std::fs::remove_dir_all(&root);
    } else {
        println!("logs and data under {}", root.display());
    }
    outcome
}

/// Stops the agents (letting them drain) and the collector, then counts
/// what was produced, acknowledged and stored.
fn finish(
    a: &FleetArgs,
    root: &Path,
    col: &mut Collector,
    gen: &mut Generators,
    sink: Option<&mut Sink>,
    result: anyhow::Result<Steady>,
) -> anyhow::Result<()> {
    let n = a.agents;
    // Whatever happened: stop the agents' sources and let them drain.
    let drained = gen.drain(Duration::from_secs(240));
    gen.kill();
    // What the collector forwards: one point per acknowledged batch for
    // each of its GPUs' three OFU series (`fidelity = "mean"`).
    let forwarded = match (&sink, &drained) {
        (Some(s), Ok(done)) => {
            let expected = field(done, "acked_batches") as u64 * a.gpus as u64 * 3;
            Some((expected, s.settle(expected, Duration::from_secs(180))))
        }
        _ => None,
    };
    let _ = Command::new("kill")
        .args(["-TERM", &col.child.id().to_string()])
        .status();
    let _ = col.child.wait();
    // The receiver goes after the collector, which would log its going.
    if let Some(s) = sink {
        s.kill();
    }
    let steady = result?;
    let done = drained.context("the agents did not drain")?;
    let produced = field(&done, "produced");
    let acked = field(&done, "acked");
    let pending = field(&done, "pending");
    let (checked, counted, stored) = verify(root, gen, a.gpus, a.metrics, a.verify_agents)?;
    // Unacknowledged over all agents, missing from the store over those
    // checked: the larger is what was lost.
    let lost = ((produced - acked).max(0.0) as u64).max(counted.saturating_sub(stored));
    println!(
        "after the run: {produced} samples produced, {acked} acknowledged, {pending} batches pending; store checked for {checked} agents: {counted} produced, {stored} stored"
    );
    let forward = forwarded
        .map(|(expected, l)| {
            let h = hist(&l);
            println!(
                "remote write: {} requests ({:.1} MB), {} new points (expected {expected}: the acknowledged batches × GPUs × 3 OFU series), {} repeats, {} staleness markers, {} series; delivery lag (point's time to its request's arrival) p50 {} p99 {} max {}; steady state {:.0} points/s",
                field(&l, "requests"),
                field(&l, "bytes") / 1e6,
                field(&l, "new"),
                field(&l, "repeats"),
                field(&l, "markers"),
                field(&l, "series"),
                fmt_ms(quantile(&h, 0.5)),
                fmt_ms(quantile(&h, 0.99)),
                fmt_ms(quantile(&h, 1.0)),
                steady.forwarded_per_s,
            );
            format!(
                " forwarded={} forward_expected={expected} forward_repeats={} forwarded_per_s={:.0}",
                field(&l, "new"),
                field(&l, "repeats"),
                steady.forwarded_per_s
            )
        })
        .unwrap_or_default();
    println!(
        "fleet result: agents={n} connected={} stored_per_s={:.0} ack_p50_ms={} ack_p99_ms={} window_p99_median_ms={} window_p99_max_ms={} lost={lost} produced={produced} acked={acked} checked_agents={checked} checked_produced={counted} checked_stored={stored}{forward}",
        steady.connected,
        steady.stored_per_s,
        ms_field(steady.p50),
        ms_field(steady.p99),
        ms_field(steady.window_median),
        ms_field(steady.window_max),
    );
    Ok(())
}

/// The `sink` receiver's process (`--remote-write sink`).
struct Sink {
    child: Child,
    out: Lines,
    url: String,
}

impl Sink {
    fn start(root: &Path, delay: &str, (idle, nice): (bool, i32)) -> anyhow::Result<Self> {
        let port = flopwatch_tests::procs::free_port();
        let mut child = spawn(
            "fleet",
            "sink",
            &[
                "--sink-port".into(),
                port.to_string(),
                "--sink-delay".into(),
                delay.into(),
                "--sink-nice".into(),
                nice.to_string(),
                "--sink-idle".into(),
                idle.to_string(),
            ],
            &root.join("sink.log"),
        )?;
        let out = lines(&mut child);
        wait_for(&out, "sink listening", Duration::from_secs(30))?;
        Ok(Self {
            child,
            out,
            url: format!("http://127.0.0.1:{port}/api/v1/write"),
        })
    }

    /// Its last status line.
    fn status(&self) -> String {
        last_line(&self.out, "sink requests=")
    }

    /// Waits until `expected` new points have arrived, or none for 20 s,
    /// or `limit`: the last status line.
    fn settle(&self, expected: u64, limit: Duration) -> String {
        let until = Deadline::after(limit);
        let (mut seen, mut since) = (0.0, Stopwatch::start());
        loop {
            let l = self.status();
            let new = field(&l, "new");
            if new as u64 >= expected || since.elapsed() > Duration::from_secs(20) || until.passed()
            {
                return l;
            }
            if new > seen {
                (seen, since) = (new, Stopwatch::start());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts, in the stopped collector's store, every sample of `k` agents
/// spread over the fleet (all when `k` is 0), against what each produced.
pub(super) fn verify(
    root: &Path,
    gen: &Generators,
    gpus: usize,
    metrics: usize,
    k: usize,
) -> anyhow::Result<(usize, u64, u64)> {
    use flopwatch_collector::store::{rocks::RocksEngine, Store};
    let dir = root.join("collector");
    let engine = RocksEngine::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let store = Store::new(Arc::new(engine), false);
    count_stored(&store, &gen.produced()?, gpus, metrics, k)
}

/// [`verify`] over an open store: `(agents checked, samples they
/// produced, samples of theirs stored)`.
pub(super) fn count_stored(
    store: &flopwatch_collector::store::Store,
    rows: &[(String, u64)],
    gpus: usize,
    metrics: usize,
    k: usize,
) -> anyhow::Result<(usize, u64, u64)> {
    let step = if k == 0 || k >= rows.len() {
        1
    } else {
        rows.len() / k
    };
    let (mut checked, mut counted, mut stored) = (0usize, 0u64, 0u64);
    for (node, n) in rows.iter().step_by(step.max(1)) {
        checked += 1;
        counted += n;
        for g in 0..gpus {
            let uuid = format!("GPU-{node}-{g:02}");
            for m in CATALOG.iter().take(metrics) {
                stored += store
                    .series("default", &uuid, m.name, i64::MIN, i64::MAX, usize::MAX)?
                    .len() as u64;
            }
        }
    }
    Ok((checked, counted, stored))
}

/// What the steady state measured, for the result line.
#[derive(Default)]
struct Steady {
    connected: f64,
    stored_per_s: f64,
    /// New points the sink received per second (`--remote-write sink`).
    forwarded_per_s: f64,
    /// Ack latency over the steady state: p50, p99.
    p50: Option<Duration>,
    p99: Option<Duration>,
    /// The 5 s windows' p99s: their median and worst.
    window_median: Option<Duration>,
    window_max: Option<Duration>,
}

/// Connect, steady state, storm (each printed as it ends).
#[allow(clippy::too_many_arguments)]
fn run_phases(
    a: &FleetArgs,
    root: &Path,
    config: &Path,
    log: &Path,
    col: &mut Collector,
    rss0: u64,
    threads0: u64,
    ag: &Generators,
    sink: Option<&Sink>,
) -> anyhow::Result<Steady> {
    let n = a.agents;
    let interval = ms(&a.interval)?;
    let ramp = ms(&a.ramp)?;
    let duration = ms(&a.duration)?;
    let say = |s: String| println!("{s}");
    say(format!(
        "fleet: {n} agents × {} GPUs × {} metrics, one point per series per {} (± 20 %), started over {}, in {} load-generator process(es); collector pid {}, VmRSS before the agents {:.1} MiB, {threads0} threads; root {}; agents' spools {}",
        a.gpus,
        a.metrics,
        a.interval,
        a.ramp,
        ag.procs.len(),
        col.child.id(),
        mib(rss0),
        root.display(),
        a.spools
            .as_ref()
            .map_or("with the agents' files".into(), |d| format!("under {}", d.display())),
    ));
    // 1. Every agent connected.
    let t0 = Stopwatch::start();
    let limit = ramp + Duration::from_secs(180);
    let all_at = loop {
        std::thread::sleep(Duration::from_millis(250));
        let s = ag.status();
        if field(&s, "connected") as usize >= n {
            break t0.elapsed();
        }
        if memory(col.child.id()).is_none() {
            bail!("the collector exited; see {}", log.display());
        }
        if t0.elapsed() > limit {
            bail!(
                "only {} of {n} agents connected after {:.0} s",
                field(&s, "connected"),
                limit.as_secs_f64()
            );
        }
    };
    say(format!(
        "connected: all {n} streams after {:.1} s (agents started over {:.0} s)",
        all_at.as_secs_f64(),
        ramp.as_secs_f64()
    ));
    // 2. The steady state, after one interval for every agent to send
    // (batches wait at most MAX_BATCH_AGE).
    std::thread::sleep(interval.min(Duration::from_secs(10)) + Duration::from_secs(2));
    let pid = col.child.id();
    let first = ag.status();
    let (c0, g0) = (cpu_seconds(pid).unwrap_or(0.0), ag.cpu_seconds());
    let sunk0 = sink.map_or(0.0, |s| field(&s.status(), "new"));
    let w0 = Stopwatch::start();
    let (mut rss_max, mut threads_max, mut min_connected) = (0u64, 0u64, n);
    let mut rss_sum = 0.0;
    let mut samples = 0u32;
    // The ack latency's p99 over each 5 s of the steady state: a stall
    // (a compaction pass, a flush) shows as one slow stretch.
    let mut stretches: Vec<Option<Duration>> = Vec::new();
    let mut stretch_from = hist(&first);
    while w0.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1));
        let Some((rss, _, threads)) = memory(pid) else {
            bail!("the collector exited; see {}", log.display());
        };
        rss_max = rss_max.max(rss);
        threads_max = threads_max.max(threads);
        rss_sum += rss as f64;
        samples += 1;
        let now = ag.status();
        min_connected = min_connected.min(field(&now, "connected") as usize);
        if samples.is_multiple_of(5) {
            let h = hist(&now);
            let d: Vec<u64> = h
                .iter()
                .zip(&stretch_from)
                .map(|(x, y)| x.saturating_sub(*y))
                .collect();
            stretches.push(quantile(&d, 0.99));
            stretch_from = h;
        }
    }
    let secs = w0.elapsed().as_secs_f64();
    let last = ag.status();
    let (c1, g1) = (cpu_seconds(pid).unwrap_or(0.0), ag.cpu_seconds());
    let forwarded_per_s = sink.map_or(0.0, |s| (field(&s.status(), "new") - sunk0) / secs);
    let (rss_end, hwm, _) = memory(pid).unwrap_or_default();
    let socks = sockets(pid);
    let h: Vec<u64> = hist(&last)
        .iter()
        .zip(hist(&first))
        .map(|(x, y)| x.saturating_sub(y))
        .collect();
    let stored = (field(&last, "acked") - field(&first, "acked")) / secs;
    let batches = (field(&last, "acked_batches") - field(&first, "acked_batches")) / secs;
    let rss_mean = rss_sum / f64::from(samples.max(1));
    say(format!(
        "steady state, {secs:.0} s: streams connected {} of {n} (at least {min_connected} throughout; collector holds {socks} sockets); stored {stored:.0} samples/s in {batches:.1} batches/s",
        field(&last, "connected"),
    ));
    say(format!(
        "ack latency (agents' side, sent to acked, {} acks): p50 {} p99 {} max {}",
        h.iter().sum::<u64>(),
        fmt_ms(quantile(&h, 0.5)),
        fmt_ms(quantile(&h, 0.99)),
        fmt_ms(quantile(&h, 1.0)),
    ));
    let shown: Vec<String> = stretches.iter().map(|d| fmt_ms(*d)).collect();
    say(format!("ack latency p99 per 5 s: {}", shown.join(", ")));
    let (window_median, window_max) = median_and_max(&stretches);
    say(format!(
        "ack latency p99 of the 5 s windows: median {}, worst {}",
        fmt_ms(window_median),
        fmt_ms(window_max)
    ));
    say(format!(
        "collector: VmRSS {:.1} MiB at the end, {:.1} MiB mean, {:.1} MiB max, VmHWM {:.1} MiB; beyond the {:.1} MiB before the agents: {:.1} KiB per stream (mean); threads at most {threads_max}",
        mib(rss_end),
        rss_mean / 1024.0,
        mib(rss_max),
        mib(hwm),
        mib(rss0),
        (rss_mean - rss0 as f64) / n.max(1) as f64,
    ));
    say(format!(
        "CPU (% of one core, of 2 cores = 200 %): collector {:.1} %, load generator (agents) {:.1} %; load generator's share of the two {:.0} %",
        (c1 - c0) / secs * 100.0,
        (g1 - g0) / secs * 100.0,
        (g1 - g0) / (c1 - c0 + g1 - g0).max(1e-9) * 100.0,
    ));
    let steady = Steady {
        connected: field(&last, "connected"),
        stored_per_s: stored,
        forwarded_per_s,
        p50: quantile(&h, 0.5),
        p99: quantile(&h, 0.99),
        window_median,
        window_max,
    };
    if !a.storm {
        return Ok(steady);
    }
    // 3. The storm.
    let before = ag.status();
    let killed = Stopwatch::start();
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    let _ = col.child.wait();
    *col = start_collector(config, log, pin_of(a)?.as_ref())?;
    let restarted = killed.elapsed();
    let pid = col.child.id();
    let mut arrivals: Vec<(f64, usize)> = Vec::new();
    let mut peak = 0u64;
    let mut dropped = false;
    let back = loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Some((_, hwm, _)) = memory(pid) {
            peak = peak.max(hwm);
        }
        let s = ag.status();
        let c = field(&s, "connected") as usize;
        arrivals.push((killed.elapsed().as_secs_f64(), c));
        // The agents' status is at most half a second old: count the
        // return only once they have seen the collector go.
        dropped |= c < n;
        if dropped && c >= n {
            break Some(killed.elapsed());
        }
        if killed.elapsed() > Duration::from_secs(180) {
            break None;
        }
        if memory(pid).is_none() {
            bail!("the restarted collector exited; see {}", log.display());
        }
    };
    // The fleet's catch-up: spooled batches drain at 50/s per agent.
    std::thread::sleep(Duration::from_secs(10));
    if let Some((_, hwm, _)) = memory(pid) {
        peak = peak.max(hwm);
    }
    let when = |share: f64| {
        arrivals
            .iter()
            .find(|(_, c)| *c as f64 >= share * n as f64)
            .map(|(t, _)| format!("{t:.1} s"))
            .unwrap_or_else(|| "-".into())
    };
    let after = ag.status();
    say(format!(
        "storm: collector killed (SIGKILL) with {} streams open, restarted and listening {:.1} s later; all {n} back {} after the kill; 10 % / 50 % / 90 % back at {} / {} / {}; {} streams opened; peak VmHWM of the restarted collector {:.1} MiB",
        field(&before, "connected"),
        restarted.as_secs_f64(),
        back.map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| "NOT within 180 s".into()),
        when(0.1),
        when(0.5),
        when(0.9),
        field(&after, "connections") - field(&before, "connections"),
        mib(peak),
    ));
    Ok(steady)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_windows_median_is_the_lower_middle_and_empty_windows_do_not_count() {
        let d = |ms| Some(Duration::from_millis(ms));
        assert_eq!(median_and_max(&[d(30), None, d(10), d(20)]), (d(20), d(30)));
        assert_eq!(
            median_and_max(&[d(40), d(10), d(30), d(20)]),
            (d(20), d(40))
        );
        assert_eq!(median_and_max(&[None]), (None, None));
        assert_eq!(ms_field(d(1500)), "1500.0");
        assert_eq!(ms_field(None), "-");
    }
}
