//! Real `flopwatch` processes for the fault tests: collectors (a cluster
//! on loopback ports, each with the others as peers) and simulated agents,
//! killed with SIGKILL or stopped with SIGTERM, and counting what the
//! cluster stores.
//!
//! The binary is `target/<profile>/flopwatch` beside the test executable
//! (built by `cargo test --workspace` or `cargo build --workspace
//! --all-targets`), or the path in `FLOPWATCH_BIN`.

use flopwatch_proto::clock::Deadline;
use flopwatch_proto::metrics::CATALOG;
use flopwatch_proto::v1::{self, query_client::QueryClient};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::transport::Channel;

// ---------------------------------------------------------------------------
// Processes.

/// The `flopwatch` binary ([`crate::flopwatch_bin`]).
pub fn bin() -> PathBuf {
    crate::flopwatch_bin()
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A free loopback port below the kernel's ephemeral range (32768–60999
/// by default), checked by binding it. A port the kernel hands out (bind to
/// port 0) can be given next to any outbound connection of a test running
/// beside this one, and a collector restarted on its port after `kill -9`
/// then finds it taken; a port below the range is only ever taken by an
/// explicit bind. Each process starts at its own offset.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let port = (LOW + (base + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub type Lines = Arc<Mutex<Vec<String>>>;

pub fn pump(r: impl Read + Send + 'static, lines: Lines) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line);
        }
    });
}

/// A child process whose output lines are kept; killed when dropped.
pub struct Proc {
    pub name: String,
    pub child: std::process::Child,
    pub out: Lines,
    pub err: Lines,
}

impl Proc {
    /// `flopwatch ARGS`.
    pub fn spawn(name: &str, args: &[&str]) -> Self {
        Self::spawn_exe(&bin(), name, args)
    }

    /// `flopwatch-bench ARGS`.
    pub fn spawn_bench(name: &str, args: &[&str]) -> Self {
        Self::spawn_exe(&crate::bench_bin(), name, args)
    }

    fn spawn_exe(exe: &Path, name: &str, args: &[&str]) -> Self {
        let mut child = Command::new(exe)
            .args(args)
            .env("FLOPWATCH_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("flopwatch starts");
        let out: Lines = Default::default();
        let err: Lines = Default::default();
        pump(child.stdout.take().unwrap(), out.clone());
        pump(child.stderr.take().unwrap(), err.clone());
        Self {
            name: name.to_string(),
            child,
            out,
            err,
        }
    }

    /// The first output line containing `pat`, waiting up to `limit`.
    pub fn wait_line(&mut self, pat: &str, limit: Duration) -> String {
        let until = Deadline::after(limit);
        loop {
            for l in [&self.out, &self.err] {
                if let Some(x) = l.lock().unwrap().iter().find(|x| x.contains(pat)) {
                    return x.clone();
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "{} exited ({st}) before printing `{pat}`:\n{}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                !until.passed(),
                "{}: no `{pat}` within {limit:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        let e = self.err.lock().unwrap();
        let skip = e.len().saturating_sub(40);
        e[skip..].join("\n")
    }

    pub fn count_lines(&self, pat: &str) -> usize {
        self.err
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(pat))
            .count()
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; the exit status (waits up to `limit`, then SIGKILL).
    pub fn term(&mut self, limit: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let until = Deadline::after(limit);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if until.passed() {
                let _ = self.child.kill();
                panic!(
                    "{} did not stop within {limit:?} of SIGTERM:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `key=value` in a tracing line (`value` up to the next space).
pub fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Milliseconds of the day of a log line's RFC 3339 timestamp
/// (`2026-01-01T12:34:56.789012Z ...`).
pub fn log_time_ms(line: &str) -> Option<i64> {
    let t = line.split_whitespace().next()?;
    let time = t.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some((h * 3600 + m * 60) * 1000 + (s * 1000.0) as i64)
}

// ---------------------------------------------------------------------------
// Collectors and agents.

pub struct CollectorSpec {
    pub port: u16,
    pub dir: PathBuf,
    pub config: PathBuf,
}

impl CollectorSpec {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// `n` collectors on fixed loopback ports (kept across restarts), each
/// with the others as query peers.
pub fn cluster(root: &Path, n: usize) -> Vec<CollectorSpec> {
    cluster_with(root, n, "")
}

/// The bearer token collectors of [`cluster`] present to each other (the
/// provider credential of their Cluster service).
pub const PEER_TOKEN: &str = "peer-secret";

/// [`cluster`] with `extra` appended to each `[cluster]` section (e.g.
/// `limbo_timeout = "3s"`). Collectors settle batches two of them got
/// (limbo) every second.
pub fn cluster_with(root: &Path, n: usize, extra: &str) -> Vec<CollectorSpec> {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let token = root.join("peer-token");
    std::fs::write(&token, format!("{PEER_TOKEN}\n")).unwrap();
    let digest = flopwatch_collector::digest(PEER_TOKEN);
    (0..n)
        .map(|i| {
            let dir = root.join(format!("collector-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let peers: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| format!("\"http://127.0.0.1:{p}\""))
                .collect();
            let config = root.join(format!("collector-{i}.toml"));
            std::fs::write(
                &config,
                format!(
                    "listen = \"127.0.0.1:{}\"\nmetrics_listen = \"127.0.0.1:0\"\n\
                     data_dir = \"{}\"\nanonymous_tenant = \"default\"\nplaintext = true\npeers = [{}]\n\
                     admin_tokens_sha256 = [\"{digest}\"]\n\
                     [cluster]\npeer_token_file = \"{}\"\nreconcile_interval = \"1s\"\n{extra}\n",
                    ports[i],
                    dir.join("data").display(),
                    peers.join(", "),
                    token.display(),
                ),
            )
            .unwrap();
            CollectorSpec {
                port: ports[i],
                dir,
                config,
            }
        })
        .collect()
}

pub fn start_collector(c: &CollectorSpec, i: usize) -> Proc {
    let config = c.config.to_string_lossy().into_owned();
    // A restart right after a kill may find the port in TIME_WAIT or the
    // RocksDB lock still held for a moment: retry a few times.
    for attempt in 0..20 {
        let mut p = Proc::spawn(
            &format!("collector-{i}"),
            &["collector", "--config", &config],
        );
        let until = Deadline::after(Duration::from_secs(30));
        loop {
            if p.out
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("listening on"))
            {
                return p;
            }
            if let Ok(Some(_)) = p.child.try_wait() {
                break;
            }
            assert!(!until.passed(), "collector-{i} did not start:\n{}", p.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        if attempt == 19 {
            panic!("collector-{i} keeps failing to start:\n{}", p.log());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    unreachable!()
}

/// The address (`host:port`) of a collector's `/metrics`, from its log.
pub fn collector_metrics(p: &mut Proc) -> String {
    let line = p.wait_line("serving /metrics", Duration::from_secs(30));
    line.split("addr=Some(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect("metrics address in the log")
        .to_string()
}

pub struct AgentSpec {
    pub index: usize,
    pub config: PathBuf,
    pub spool: PathBuf,
}

#[derive(Clone, Copy)]
pub struct AgentShape {
    pub nodes: usize,
    pub gpus: usize,
    pub interval_ms: u64,
    pub flush_ms: u64,
    pub fsync_ms: u64,
}

pub fn agent_spec(root: &Path, i: usize, collectors: &[String], shape: AgentShape) -> AgentSpec {
    let spool = root.join(format!("agent-{i}-spool"));
    let config = root.join(format!("agent-{i}.toml"));
    let urls: Vec<String> = collectors.iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(
        &config,
        format!(
            "node_id = \"node-{i:02}\"\ncollectors = [{}]\nsource = \"sim\"\n\
             metrics_listen = \"127.0.0.1:0\"\ninterval = \"{}ms\"\nflush_interval = \"{}ms\"\n\
             max_in_flight = 64\n\
             [sim]\nnode_index = {i}\nnodes = {}\ngpus = {}\nnode_counters = false\n\
             [spool]\ndir = \"{}\"\nmax_bytes = 268435456\nfsync_interval = \"{}ms\"\n\
             [attribution]\nenabled = false\n",
            urls.join(", "),
            shape.interval_ms,
            shape.flush_ms,
            shape.nodes,
            shape.gpus,
            spool.display(),
            shape.fsync_ms,
        ),
    )
    .unwrap();
    AgentSpec {
        index: i,
        config,
        spool,
    }
}

pub struct RunningAgent {
    pub proc: Proc,
    pub metrics: String,
}

pub fn start_agent(a: &AgentSpec) -> RunningAgent {
    let config = a.config.to_string_lossy().into_owned();
    let mut proc = Proc::spawn(
        &format!("agent-{}", a.index),
        &["agent", "--config", &config],
    );
    let line = proc.wait_line("serving /metrics", Duration::from_secs(30));
    let metrics = line
        .split("addr=Some(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect("metrics address in the log")
        .to_string();
    RunningAgent { proc, metrics }
}

/// A counter or gauge from a `/metrics` page (0 when absent or the
/// process does not answer).
pub fn scrape(addr: &str, name: &str) -> f64 {
    scrape_opt(addr, name).unwrap_or(0.0)
}

/// A counter or gauge from a `/metrics` page; `None` when the process does
/// not answer or the page lacks it.
pub fn scrape_opt(addr: &str, name: &str) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines().find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        // Unlabelled series are written `name{} value`.
        (k.strip_suffix("{}").unwrap_or(k) == name).then(|| v.trim().parse().ok())?
    })
}

/// SIGTERM; (samples taken, samples acknowledged, batches left) from the
/// agent's last log line.
pub fn stop_agent(mut a: RunningAgent) -> (u64, u64, u64) {
    let st = a.proc.term(Duration::from_secs(60));
    assert!(st.success(), "agent exit status {st}:\n{}", a.proc.log());
    let line = a.proc.wait_line("agent stopped", Duration::from_secs(5));
    (
        field(&line, "samples").expect("samples="),
        field(&line, "acked_samples").expect("acked_samples="),
        field(&line, "unacked_batches").expect("unacked_batches="),
    )
}

// ---------------------------------------------------------------------------
// Counting what is stored.

pub async fn query(url: &str) -> QueryClient<Channel> {
    let until = Deadline::after(Duration::from_secs(30));
    loop {
        match QueryClient::connect(url.to_string()).await {
            Ok(c) => return c.max_decoding_message_size(256 << 20),
            Err(e) => {
                assert!(!until.passed(), "{url}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

pub fn local<T>(r: T, local: bool) -> tonic::Request<T> {
    let mut r = tonic::Request::new(r);
    if local {
        r.metadata_mut()
            .insert("x-flopwatch-local", "1".parse().unwrap());
    }
    r
}

/// GPU UUID → node id, as the cluster lists them.
pub async fn gpus(q: &mut QueryClient<Channel>) -> BTreeMap<String, String> {
    q.list_gpus(v1::ListRequest { since_ms: 0 })
        .await
        .unwrap()
        .into_inner()
        .gpus
        .into_iter()
        .map(|g| (g.info.unwrap().uuid, g.node_id))
        .collect()
}

pub async fn series_ts(
    q: &mut QueryClient<Channel>,
    gpu: &str,
    metric: &str,
    local_only: bool,
) -> Option<Vec<i64>> {
    let r = q
        .series(local(
            v1::SeriesRequest {
                gpu_uuid: gpu.to_string(),
                metric: metric.to_string(),
                start_ms: 1,
                end_ms: 0,
                limit: 1_000_000,
            },
            local_only,
        ))
        .await;
    match r {
        Ok(r) => {
            // A peer that did not answer would make the count short.
            assert!(
                r.metadata().get("x-flopwatch-partial").is_none(),
                "series {gpu} {metric}: partial answer (a peer did not answer)"
            );
            r.into_inner()
                .series
                .map(|s| s.timestamps_ms)
                .filter(|t| !t.is_empty())
        }
        Err(s) if s.code() == tonic::Code::NotFound => None,
        Err(s) => panic!("series {gpu} {metric}: {s}"),
    }
}

/// The catalog metrics `gpu` has data for (through the fan-out).
pub async fn metrics_of(q: &mut QueryClient<Channel>, gpu: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for m in CATALOG {
        if series_ts(q, gpu, m.name, false).await.is_some() {
            out.push(m.name);
        }
    }
    assert!(!out.is_empty(), "{gpu} has no data");
    out
}

/// Timestamps of the series `metrics` × `gpus`, through the fan-out
/// (`local_only = false`) or one collector's own data (`true`); queries
/// run 16 at a time.
pub async fn stored(
    q: &mut QueryClient<Channel>,
    gpus: &[String],
    local_only: bool,
    metrics: &[&'static str],
) -> BTreeMap<(String, &'static str), Vec<i64>> {
    let limit = Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = tokio::task::JoinSet::new();
    for g in gpus {
        for &m in metrics {
            let (mut q, g, limit) = (q.clone(), g.clone(), limit.clone());
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await.unwrap();
                let ts = series_ts(&mut q, &g, m, local_only).await;
                ((g, m), ts)
            });
        }
    }
    let mut out = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        let (k, ts) = r.unwrap();
        if let Some(ts) = ts {
            out.insert(k, ts);
        }
    }
    out
}

/// (points, points whose timestamp repeats within its series).
pub fn count(series: &BTreeMap<(String, &'static str), Vec<i64>>) -> (u64, u64) {
    let mut points = 0u64;
    let mut dups = 0u64;
    for ts in series.values() {
        let mut t = ts.clone();
        points += t.len() as u64;
        t.sort_unstable();
        dups += t.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    }
    (points, dups)
}
