//! `flopwatch-bench backpressure`: the collector's memory while agents
//! push more than it can store.
//!
//! Three processes (this binary each time):
//!
//! 1. the driver (what the user runs) starts the other two, samples the
//!    collector's `VmRSS` and `VmHWM` from `/proc/<pid>/status` and its
//!    `/metrics`, and prints a table and a summary;
//! 2. a collector (RocksDB under `--dir`) whose every storage write waits
//!    for one virtual device completing a write per `--write-delay`, in
//!    arrival order: a saturated disk ([`super::slow_engine`]);
//! 3. `--agents` agents in one process, each the real agent's delivery
//!    path (outbox, disk spool, client with its 8-batch window, ack
//!    timeout and 50/s drain rate) fed one batch per `--flush`.
//!
//! With more offered than stored, agents' spools grow while the collector's
//! memory should stay flat: each stream holds one batch in commit and at
//! most an HTTP/2 window of unread data (docs/RELIABILITY.md,
//! Backpressure).

use anyhow::{bail, Context};
use flopwatch_agent::client::{self, ClientOptions, ClientState};
use flopwatch_agent::Outbox;
use flopwatch_agent::{Spool, SpoolOptions, SpoolStats};
use flopwatch_collector::store::{rocks::RocksEngine, Retention, Store};
use flopwatch_collector::{server, Auth, Collector, Settings};
use flopwatch_config::{CollectorConfig, SpecTable};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use prost::Message;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arguments of `bench backpressure`.
#[derive(clap::Args)]
pub(super) struct BackpressureArgs {
    /// Simulated agents (one Ingest stream each, all in a second process).
    #[arg(long, default_value_t = 200)]
    agents: usize,
    /// GPUs per agent.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Metrics per GPU (from the catalog).
    #[arg(long, default_value_t = 20)]
    metrics: usize,
    /// Samples per series per batch.
    #[arg(long, default_value_t = 10)]
    points: usize,
    /// How often each agent cuts a batch.
    #[arg(long, default_value = "1s")]
    flush: String,
    /// Every storage write of the collector takes this long, one at a
    /// time (a saturated disk).
    #[arg(long, default_value = "20ms")]
    write_delay: String,
    /// How long the agents push.
    #[arg(long, default_value = "120s")]
    duration: String,
    /// How often the collector's memory and `/metrics` are sampled.
    #[arg(long, default_value = "2s")]
    sample_every: String,
    /// Working directory (collector store, agent spools); default: a
    /// temporary one, removed after.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Which of the three processes this is.
    #[arg(long, hide = true, value_enum, default_value_t = Role::Driver)]
    role: Role,
    /// The collector's URL (agents process).
    #[arg(long, hide = true)]
    collector: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    Driver,
    Collector,
    Agents,
}

pub(super) fn ms(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_millis(crate::parse_ms(s)?.max(0) as u64))
}

pub(super) async fn run(a: BackpressureArgs) -> anyhow::Result<()> {
    match a.role {
        Role::Driver => driver(a).await,
        Role::Collector => collector(a).await,
        Role::Agents => agents(a).await,
    }
}

// ---------------------------------------------------------------------------
// The collector process.

async fn collector(a: BackpressureArgs) -> anyhow::Result<()> {
    let dir = a.dir.context("--dir")?;
    let cfg = CollectorConfig {
        data_dir: dir.clone(),
        anonymous_tenant: Some("default".into()),
        ..Default::default()
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let rocks = RocksEngine::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let engine = super::slow_engine::SlowEngine::new(Arc::new(rocks), ms(&a.write_delay)?);
    let store = Store::new(Arc::new(engine), cfg.sync_wal)
        .with_retention(Retention::from_config(&cfg, clock.clone()))
        .with_compaction(cfg.storage.compaction_interval, cfg.storage.seal_delay);
    let collector = Collector::new(
        store,
        SpecTable::builtin(),
        Auth::anonymous("default"),
        Settings::from_config(&cfg, Vec::new()),
        clock,
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?);
    println!("metrics on {}", metrics.local_addr()?);
    server::serve_cluster(
        collector,
        listener,
        Some(metrics),
        server::Serving::default(),
        flopwatch_transport::shutdown_signal(),
    )
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The agents process.

async fn agents(a: BackpressureArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().context("--dir")?;
    let url = a.collector.clone().context("--collector")?;
    let flush = ms(&a.flush)?;
    let duration = ms(&a.duration)?;
    let metrics = a.metrics.min(flopwatch_proto::metrics::CATALOG.len());
    let produced = Arc::new(AtomicU64::new(0));
    let batch_bytes = Arc::new(AtomicU64::new(0));
    let mut fleet = Vec::new();
    for i in 0..a.agents {
        let node = format!("bp-{i:04}");
        let spool = Spool::open(
            &SpoolOptions {
                dir: dir.join(&node),
                max_bytes: 1 << 30,
                fsync_interval: Duration::from_secs(1),
            },
            Arc::new(SpoolStats::default()),
        )?;
        // The agent's defaults: 64 batches in memory, the rest on disk.
        let outbox = Arc::new(Outbox::with_spool(64, spool));
        let hello = flopwatch_proto::model::Hello::try_from(super::hello(&node, a.gpus))
            .map_err(|e| anyhow::anyhow!("hello: {e}"))?;
        let (state, watch) = tokio::sync::watch::channel(ClientState::default());
        tokio::spawn(client::run(
            ClientOptions {
                hello_updates: None,
                collectors: vec![url.clone()],
                token: None,
                hello,
                drain_timeout: Duration::from_secs(1),
                max_batches_per_second: Some(50),
                tls: Default::default(),
            },
            outbox.clone(),
            state,
        ));
        let (o, produced, bytes) = (outbox.clone(), produced.clone(), batch_bytes.clone());
        let (gpus, points) = (a.gpus, a.points);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(flush);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for k in 0u64.. {
                tick.tick().await;
                let t0 = SystemClock.now_ms() - points as i64 * 100;
                let mut b = super::batch(&node, k + 1, gpus, metrics, points, t0);
                b.seq = 0;
                bytes.store(b.encoded_len() as u64, Ordering::Relaxed);
                o.push(b);
                produced.fetch_add(1, Ordering::Relaxed);
            }
        });
        fleet.push((outbox, watch));
    }
    let started = Stopwatch::start();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() < duration {
        tick.tick().await;
        let acked: u64 = fleet
            .iter()
            .map(|(o, _)| o.stats.acked_batches.load(Ordering::Relaxed))
            .sum();
        let pending: usize = fleet.iter().map(|(o, _)| o.len()).sum();
        let spooled: u64 = fleet.iter().map(|(o, _)| o.pending_bytes()).sum();
        let connected = fleet
            .iter()
            .filter(|(_, w)| w.borrow().connected_to.is_some())
            .count();
        let failovers: u64 = fleet
            .iter()
            .map(|(_, w)| w.borrow().connections.saturating_sub(1))
            .sum();
        println!(
            "agents t={:.1} produced={} acked={acked} pending={pending} pending_bytes={spooled} connected={connected} reconnects={failovers} batch_bytes={}",
            started.elapsed().as_secs_f64(),
            produced.load(Ordering::Relaxed),
            batch_bytes.load(Ordering::Relaxed),
        );
    }
    println!("agents done");
    std::io::stdout().flush()?;
    // The spools stay on disk; nothing more to deliver in a benchmark.
    std::process::exit(0)
}

// ---------------------------------------------------------------------------
// The driver.

/// Stdout lines of a child, kept as they come.
pub(super) fn lines(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    if let Some(stdout) = child.stdout.take() {
        let o = out.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                o.lock().unwrap_or_else(|e| e.into_inner()).push(l);
            }
        });
    }
    out
}

/// The newest of `lines` that starts with `prefix`, or "".
pub(super) fn last_line(lines: &Mutex<Vec<String>>, prefix: &str) -> String {
    lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .rev()
        .find(|l| l.starts_with(prefix))
        .cloned()
        .unwrap_or_default()
}

pub(super) fn wait_for(
    lines: &Mutex<Vec<String>>,
    prefix: &str,
    limit: Duration,
) -> anyhow::Result<String> {
    let until = Deadline::after(limit);
    loop {
        if let Some(l) = lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
        {
            return Ok(l.trim().to_string());
        }
        if until.passed() {
            bail!("no `{prefix}` line within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `VmRSS`, `VmHWM` (KiB) and thread count of `pid`.
pub(super) fn memory(pid: u32) -> Option<(u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = |key: &str| -> Option<u64> {
        s.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((value("VmRSS:")?, value("VmHWM:")?, value("Threads:")?))
}

/// A `/metrics` page (`None` when the collector does not answer). The
/// page lists every GPU's counters: fetched once per sample, it costs the
/// collector some CPU and transient memory, as any Prometheus scrape does.
pub(super) fn scrape_page(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// An unlabelled value of a `/metrics` page.
pub(super) fn value(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        // Unlabelled series are written `name{} value`.
        (k.strip_suffix("{}").unwrap_or(k) == name).then(|| v.trim().parse().ok())?
    })
}

/// `key=value` of a status line.
pub(super) fn field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

struct Sample {
    t: f64,
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
    /// Batches the collector acknowledged (its `/metrics`), if it answered.
    committed: Option<f64>,
    /// Its open agent streams.
    streams: f64,
    /// Its storage engine's own memory, bytes.
    store_bytes: f64,
    /// The agents' last status line.
    agents: String,
}

/// This binary as `bench <bench> --role <role>`, stdout piped, stderr to
/// `log`.
pub(super) fn spawn(bench: &str, role: &str, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let exe = std::env::current_exe()?;
    let err = std::fs::File::create(log)?;
    Command::new(exe)
        .args([bench, "--role", role])
        .args(args)
        .env("FLOPWATCH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting the {role} process"))
}

pub(super) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn driver(a: BackpressureArgs) -> anyhow::Result<()> {
    let tmp = a.dir.is_none();
    let root = a.dir.clone().unwrap_or_else(super::tempdir_path);
    std::fs::create_dir_all(&root)?;
    let duration = ms(&a.duration)?;
    let every = ms(&a.sample_every)?.max(Duration::from_millis(100));
    let mut col = spawn(
        "backpressure",
        "collector",
        &[
            "--dir".into(),
            root.join("collector").display().to_string(),
            "--write-delay".into(),
            a.write_delay.clone(),
        ],
        &root.join("collector.log"),
    )?;
    let col_out = lines(&mut col);
    let addr = wait_for(&col_out, "listening on ", Duration::from_secs(60))?;
    let metrics = wait_for(&col_out, "metrics on ", Duration::from_secs(5))?;
    let pid = col.id();
    let (rss0, _, _) = memory(pid).context("reading /proc/PID/status")?;
    let mut ag = spawn(
        "backpressure",
        "agents",
        &[
            "--dir".into(),
            root.join("agents").display().to_string(),
            "--collector".into(),
            format!("http://{addr}"),
            "--agents".into(),
            a.agents.to_string(),
            "--gpus".into(),
            a.gpus.to_string(),
            "--metrics".into(),
            a.metrics.to_string(),
            "--points".into(),
            a.points.to_string(),
            "--flush".into(),
            a.flush.clone(),
            "--duration".into(),
            a.duration.clone(),
        ],
        &root.join("agents.log"),
    )?;
    let ag_out = lines(&mut ag);
    println!(
        "backpressure: {} agents × {} GPUs × {} metrics × {} points per {} batch; collector writes one per {} (at most {:.0} batches/s); collector pid {pid}, VmRSS before agents {:.1} MiB",
        a.agents,
        a.gpus,
        a.metrics,
        a.points,
        a.flush,
        a.write_delay,
        1.0 / ms(&a.write_delay)?.as_secs_f64().max(1e-9),
        mib(rss0)
    );
    println!(
        "{:>5} {:>8} {:>8} {:>9} {:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "t s",
        "RSS MiB",
        "HWM MiB",
        "store MiB",
        "threads",
        "streams",
        "agents",
        "stored/s",
        "produced",
        "acked",
        "pending",
        "spool MiB"
    );
    let started = Stopwatch::start();
    let mut samples: Vec<Sample> = Vec::new();
    let mut printed = 0.0;
    loop {
        std::thread::sleep(every);
        let Some((rss, hwm, threads)) = memory(pid) else {
            bail!(
                "the collector exited; see {}",
                root.join("collector.log").display()
            );
        };
        let t = started.elapsed().as_secs_f64();
        let agents = last_line(&ag_out, "agents t=");
        let page = scrape_page(&metrics).unwrap_or_default();
        let s = Sample {
            t,
            rss_kib: rss,
            hwm_kib: hwm,
            threads,
            committed: value(&page, "flopwatch_ingest_batches_total"),
            streams: value(&page, "flopwatch_agents_connected").unwrap_or(f64::NAN),
            store_bytes: value(&page, "flopwatch_storage_memory_bytes").unwrap_or(f64::NAN),
            agents,
        };
        if t - printed >= 10.0 || samples.is_empty() {
            // Stored batches per second over the last ~10 s.
            let rate = s.committed.and_then(|now| {
                let back = samples
                    .iter()
                    .rev()
                    .find(|b| b.committed.is_some() && t - b.t >= 9.5)?;
                Some((now - back.committed?) / (t - back.t))
            });
            println!(
                "{t:>5.0} {:>8.1} {:>8.1} {:>9.1} {threads:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9.1}",
                mib(rss),
                mib(hwm),
                s.store_bytes / 1048576.0,
                s.streams,
                field(&s.agents, "connected"),
                rate.map(|r| format!("{r:.1}")).unwrap_or_else(|| "-".into()),
                field(&s.agents, "produced"),
                field(&s.agents, "acked"),
                field(&s.agents, "pending"),
                field(&s.agents, "pending_bytes") / 1048576.0
            );
            printed = t;
        }
        samples.push(s);
        let done = ag_out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|l| l == "agents done");
        if done || started.elapsed() > duration + Duration::from_secs(30) {
            break;
        }
    }
    let _ = ag.kill();
    let _ = ag.wait();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = col.wait();
    summarize(&a, &samples, rss0)?;
    if tmp {
        let _ = std::fs::remove_dir_all(&root);
    } else {
        println!("logs and data under {}", root.display());
    }
    Ok(())
}

fn summarize(a: &BackpressureArgs, samples: &[Sample], rss0: u64) -> anyhow::Result<()> {
    let Some(last) = samples.last() else {
        bail!("no samples");
    };
    let at = |f: f64| {
        let t = last.t * f;
        samples.iter().find(|s| s.t >= t).unwrap_or(last)
    };
    let half = at(0.5);
    let peak = samples.iter().map(|s| s.hwm_kib).max().unwrap_or(0);
    let slope = (mib(last.rss_kib) - mib(half.rss_kib)) / ((last.t - half.t) / 60.0).max(1e-9);
    println!(
        "collector VmRSS: {:.1} MiB before the agents; {:.1} / {:.1} / {:.1} / {:.1} MiB at 25 / 50 / 75 / 100 % of the run; peak VmHWM {:.1} MiB; second half {slope:+.1} MiB/min",
        mib(rss0),
        mib(at(0.25).rss_kib),
        mib(half.rss_kib),
        mib(at(0.75).rss_kib),
        mib(last.rss_kib),
        mib(peak),
    );
    let finite_max = |f: fn(&Sample) -> f64| {
        samples
            .iter()
            .map(f)
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
    };
    println!(
        "collector: at most {} threads and {} agent streams open at once; storage engine's own memory at most {:.1} MiB (memtables, block cache, table readers)",
        samples.iter().map(|s| s.threads).max().unwrap_or(0),
        finite_max(|s| s.streams),
        finite_max(|s| s.store_bytes) / 1048576.0
    );
    let known: Vec<&Sample> = samples.iter().filter(|s| s.committed.is_some()).collect();
    let stored = match (known.first(), known.last()) {
        (Some(x), Some(y)) if y.t > x.t => {
            (y.committed.unwrap_or(0.0) - x.committed.unwrap_or(0.0)) / (y.t - x.t)
        }
        _ => f64::NAN,
    };
    let produced = field(&last.agents, "produced");
    let acked = field(&last.agents, "acked");
    let secs = field(&last.agents, "t").max(1e-9);
    let spool_half = field(&half.agents, "pending_bytes");
    let spool_end = field(&last.agents, "pending_bytes");
    let batch = field(&last.agents, "batch_bytes");
    println!(
        "agents: {produced} batches produced ({:.1}/s), {acked} acknowledged ({:.1}/s; collector stored {stored:.1} batches/s), {} pending at the end, {:.1} MiB waiting (spool), growing {:.2} MiB/s over the second half; {} reconnects",
        produced / secs,
        acked / secs,
        field(&last.agents, "pending"),
        spool_end / 1048576.0,
        (spool_end - spool_half) / 1048576.0 / (last.t - half.t).max(1e-9),
        field(&last.agents, "reconnects"),
    );
    // What one stream may hold (docs/RELIABILITY.md): the agent's window
    // of 8 batches, within one HTTP/2 stream window of unread data, plus
    // the batch in commit.
    let window = f64::from(server::STREAM_WINDOW);
    let per_stream = (8.0 * batch).min(window) + batch;
    println!(
        "bound per stream: min(8 batches, HTTP/2 window {:.0} KiB) + the batch in commit = {:.0} KiB for {:.0} KiB batches -> {} agents: {:.0} MiB",
        window / 1024.0,
        per_stream / 1024.0,
        batch / 1024.0,
        a.agents,
        a.agents as f64 * per_stream / 1048576.0
    );
    Ok(())
}
