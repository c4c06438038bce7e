//! Fault tests with real processes: the `flopwatch` binary as collectors
//! and simulated agents on ephemeral loopback ports, killed with SIGKILL
//! or stopped with SIGTERM, samples counted end to end.
//!
//! The binary is `target/<profile>/flopwatch` beside this test (built by
//! `cargo test --workspace` or `cargo build --workspace --all-targets`), or
//! the path in `FLOPWATCH_BIN`.
//!
//! Figures from these tests are in docs/RELIABILITY.md.

use flopwatch_proto::metrics::CATALOG;
use flopwatch_proto::v1::{self, query_client::QueryClient};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::Channel;

// ---------------------------------------------------------------------------
// Processes.

fn bin() -> PathBuf {
    if let Ok(p) = std::env::var("FLOPWATCH_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/fault-HASH → target/<profile>/flopwatch
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("flopwatch"))
        .expect("target directory");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --workspace --all-targets` (or set FLOPWATCH_BIN)",
        p.display()
    );
    p
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

type Lines = Arc<Mutex<Vec<String>>>;

fn pump(r: impl Read + Send + 'static, lines: Lines) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line);
        }
    });
}

/// A child process whose output lines are kept; killed when dropped.
struct Proc {
    name: String,
    child: std::process::Child,
    out: Lines,
    err: Lines,
}

impl Proc {
    fn spawn(name: &str, args: &[&str]) -> Self {
        let mut child = Command::new(bin())
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
    fn wait_line(&mut self, pat: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
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
                Instant::now() < until,
                "{}: no `{pat}` within {limit:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        let e = self.err.lock().unwrap();
        let skip = e.len().saturating_sub(40);
        e[skip..].join("\n")
    }

    fn count_lines(&self, pat: &str) -> usize {
        self.err
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(pat))
            .count()
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; the exit status (waits up to `limit`, then SIGKILL).
    fn term(&mut self, limit: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if Instant::now() > until {
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
fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Milliseconds of the day of a log line's RFC 3339 timestamp
/// (`2026-01-01T12:34:56.789012Z ...`).
fn log_time_ms(line: &str) -> Option<i64> {
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

struct CollectorSpec {
    port: u16,
    dir: PathBuf,
    config: PathBuf,
}

impl CollectorSpec {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// `n` collectors on fixed loopback ports (kept across restarts), each
/// with the others as query peers.
fn cluster(root: &Path, n: usize) -> Vec<CollectorSpec> {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
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
                     data_dir = \"{}\"\nanonymous_tenant = \"default\"\nplaintext = true\npeers = [{}]\n",
                    ports[i],
                    dir.join("data").display(),
                    peers.join(", ")
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

fn start_collector(c: &CollectorSpec, i: usize) -> Proc {
    let config = c.config.to_string_lossy().into_owned();
    // A restart right after a kill may find the port in TIME_WAIT or the
    // RocksDB lock still held for a moment: retry a few times.
    for attempt in 0..20 {
        let mut p = Proc::spawn(
            &format!("collector-{i}"),
            &["collector", "--config", &config],
        );
        let until = Instant::now() + Duration::from_secs(30);
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
            assert!(
                Instant::now() < until,
                "collector-{i} did not start:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if attempt == 19 {
            panic!("collector-{i} keeps failing to start:\n{}", p.log());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    unreachable!()
}

struct AgentSpec {
    index: usize,
    config: PathBuf,
    spool: PathBuf,
}

#[derive(Clone, Copy)]
struct AgentShape {
    nodes: usize,
    gpus: usize,
    interval_ms: u64,
    flush_ms: u64,
    fsync_ms: u64,
}

fn agent_spec(root: &Path, i: usize, collectors: &[String], shape: AgentShape) -> AgentSpec {
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

struct RunningAgent {
    proc: Proc,
    metrics: String,
}

fn start_agent(a: &AgentSpec) -> RunningAgent {
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

/// A counter or gauge from an agent's `/metrics` (0 when absent or the
/// agent does not answer).
fn scrape(addr: &str, name: &str) -> f64 {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0.0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0.0)
}

/// SIGTERM; (samples taken, samples acknowledged, batches left) from the
/// agent's last log line.
fn stop_agent(mut a: RunningAgent) -> (u64, u64, u64) {
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

async fn query(url: &str) -> QueryClient<Channel> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match QueryClient::connect(url.to_string()).await {
            Ok(c) => return c.max_decoding_message_size(256 << 20),
            Err(e) => {
                assert!(Instant::now() < until, "{url}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn local<T>(r: T, local: bool) -> tonic::Request<T> {
    let mut r = tonic::Request::new(r);
    if local {
        r.metadata_mut()
            .insert("x-flopwatch-local", "1".parse().unwrap());
    }
    r
}

/// GPU UUID → node id, as the cluster lists them.
async fn gpus(q: &mut QueryClient<Channel>) -> BTreeMap<String, String> {
    q.list_gpus(v1::ListRequest { since_ms: 0 })
        .await
        .unwrap()
        .into_inner()
        .gpus
        .into_iter()
        .map(|g| (g.info.unwrap().uuid, g.node_id))
        .collect()
}

async fn series_ts(
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
        Ok(r) => r
            .into_inner()
            .series
            .map(|s| s.timestamps_ms)
            .filter(|t| !t.is_empty()),
        Err(s) if s.code() == tonic::Code::NotFound => None,
        Err(s) => panic!("series {gpu} {metric}: {s}"),
    }
}

/// The catalog metrics `gpu` has data for (through the fan-out).
async fn metrics_of(q: &mut QueryClient<Channel>, gpu: &str) -> Vec<&'static str> {
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
async fn stored(
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
fn count(series: &BTreeMap<(String, &'static str), Vec<i64>>) -> (u64, u64) {
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

/// The tests here start many processes and watch timings of seconds: they
/// run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// (a) kill -9 a collector of three, again and again, under load.

#[test]
fn killing_collectors_again_and_again_loses_and_duplicates_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 3);
    let urls: Vec<String> = specs.iter().map(CollectorSpec::url).collect();
    let mut collectors: Vec<Option<Proc>> = specs
        .iter()
        .enumerate()
        .map(|(i, c)| Some(start_collector(c, i)))
        .collect();
    let shape = AgentShape {
        nodes: 20,
        gpus: 2,
        interval_ms: 25,
        flush_ms: 250,
        fsync_ms: 200,
    };
    let agents: Vec<AgentSpec> = (0..20)
        .map(|i| agent_spec(root.path(), i, &urls, shape))
        .collect();
    let running: Vec<RunningAgent> = agents.iter().map(start_agent).collect();
    let target = 1_050_000.0;
    let started = Instant::now();
    let mut kills = 0;
    let mut victim = 0;
    // Sample until the agents together took more than a million samples,
    // killing one collector every 4 s and bringing it back 1.5 s later.
    loop {
        std::thread::sleep(Duration::from_millis(2500));
        let taken: f64 = running
            .iter()
            .map(|a| scrape(&a.metrics, "flopwatch_agent_samples_total"))
            .sum();
        if taken >= target {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "agents took only {taken} samples in {:?}",
            started.elapsed()
        );
        if let Some(p) = collectors[victim].take() {
            p.kill9();
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(1500));
        collectors[victim] = Some(start_collector(&specs[victim], victim));
        victim = (victim + 1) % 3;
    }
    let sampling = started.elapsed();
    let failovers: f64 = running
        .iter()
        .map(|a| scrape(&a.metrics, "flopwatch_agent_failovers_total"))
        .sum();
    // Every collector is up: agents drain, then stop.
    // Failover times from the agents' logs: a stream's end to the next
    // collector's Welcome (reported, not asserted).
    let mut failover_ms: Vec<i64> = Vec::new();
    for a in &running {
        let mut ended: Option<i64> = None;
        for l in a.proc.err.lock().unwrap().iter() {
            let Some(t) = log_time_ms(l) else { continue };
            if l.contains("stream ended") {
                ended = Some(t);
            } else if l.contains("connected collector=") {
                if let Some(e) = ended.take() {
                    failover_ms.push(t - e);
                }
            }
        }
    }
    failover_ms.sort_unstable();
    let mut taken = 0;
    let mut acked = 0;
    let mut warnings = Vec::new();
    for a in running {
        if let Ok(dir) = std::env::var("FLOPWATCH_FAULT_LOGS") {
            let name = a.proc.name.clone();
            let err = a.proc.err.clone();
            let (s, k, left) = stop_agent(a);
            std::fs::write(
                Path::new(&dir).join(format!("{name}.log")),
                err.lock().unwrap().join("\n"),
            )
            .unwrap();
            taken += s;
            acked += k;
            assert_eq!(left, 0);
            continue;
        }
        warnings.extend(
            a.proc
                .err
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .cloned(),
        );
        let (s, k, left) = stop_agent(a);
        assert_eq!(left, 0, "an agent stopped with unacknowledged batches");
        taken += s;
        acked += k;
    }
    let rt = runtime();
    let (fleet, fleet_dups, per_collector_dups, copies) = rt.block_on(async {
        let mut q = query(&urls[0]).await;
        let gpus: Vec<String> = gpus(&mut q).await.into_keys().collect();
        assert_eq!(
            gpus.len(),
            40,
            "every agent's GPUs are listed by the cluster"
        );
        let metrics = metrics_of(&mut q, &gpus[0]).await;
        let fleet = stored(&mut q, &gpus, false, &metrics).await;
        let mut shown = 0;
        for ((g, m), ts) in &fleet {
            let gaps: Vec<(i64, i64)> = ts
                .windows(2)
                .filter(|w| w[1] - w[0] > 8 * shape.interval_ms as i64)
                .map(|w| (w[0], w[1] - w[0]))
                .collect();
            if !gaps.is_empty() && shown < 6 {
                shown += 1;
                eprintln!("gaps in {g} {m} ({} points): {gaps:?}", ts.len());
            }
        }
        let mut per_dups = 0;
        let mut total_local = 0;
        for u in &urls {
            let mut q = query(u).await;
            let local_series = stored(&mut q, &gpus, true, &metrics).await;
            let (n, d) = count(&local_series);
            per_dups += d;
            total_local += n;
        }
        let (n, d) = count(&fleet);
        (n, d, per_dups, total_local.saturating_sub(n))
    });
    for c in collectors.iter_mut().flatten() {
        assert!(c.term(Duration::from_secs(30)).success());
    }
    eprintln!(
        "fault (a): failover (stream end to the next Welcome) over {} failovers: median {} ms, max {} ms",
        failover_ms.len(),
        failover_ms.get(failover_ms.len() / 2).copied().unwrap_or(0),
        failover_ms.last().copied().unwrap_or(0)
    );
    eprintln!(
        "fault (a): {taken} samples taken by 20 agents in {sampling:?}, {kills} collector kills, \
         {failovers} failovers; acked {acked}; stored (fleet) {fleet}, duplicates in the fleet \
         answer {fleet_dups}, within a collector {per_collector_dups}, copies of a sample on \
         two collectors {copies}"
    );
    if fleet != taken {
        for w in warnings.iter().take(40) {
            eprintln!("agent: {w}");
        }
        for c in collectors.iter().flatten() {
            eprintln!("collector {}: {}", c.name, c.log());
        }
    }
    assert!(kills >= 3, "collectors were killed {kills} times");
    assert!(taken >= 1_000_000);
    assert!(
        acked >= taken,
        "everything taken was acknowledged before the agents stopped"
    );
    assert_eq!(fleet, taken, "every sample taken is stored exactly once");
    assert_eq!(fleet_dups, 0);
    assert_eq!(per_collector_dups, 0);
}

// ---------------------------------------------------------------------------
// (b) every collector down while agents sample; one agent killed meanwhile.

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("FLOPWATCH_FAULT_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

#[test]
fn full_outage_with_an_agent_killed_leaves_no_gap_beyond_the_batch_in_progress() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 3);
    let urls: Vec<String> = specs.iter().map(CollectorSpec::url).collect();
    let mut collectors: Vec<Proc> = specs
        .iter()
        .enumerate()
        .map(|(i, c)| start_collector(c, i))
        .collect();
    let shape = AgentShape {
        nodes: 4,
        gpus: 2,
        interval_ms: 100,
        flush_ms: 500,
        fsync_ms: 1000,
    };
    let agents: Vec<AgentSpec> = (0..4)
        .map(|i| agent_spec(root.path(), i, &urls, shape))
        .collect();
    let mut running: Vec<Option<RunningAgent>> =
        agents.iter().map(|a| Some(start_agent(a))).collect();
    std::thread::sleep(Duration::from_secs(4));
    for c in collectors.drain(..) {
        c.kill9();
    }
    let outage = outage();
    let down = Instant::now();
    std::thread::sleep(outage / 2);
    // kill -9 agent 0 in the middle of the outage, restart it 2 s later.
    let spooled_before = std::fs::read_dir(&agents[0].spool).unwrap().count();
    running[0].take().unwrap().proc.kill9();
    let killed_at = now_ms();
    std::thread::sleep(Duration::from_secs(2));
    running[0] = Some(start_agent(&agents[0]));
    let restarted_at = now_ms();
    std::thread::sleep(outage.saturating_sub(down.elapsed()));
    let collectors: Vec<Proc> = specs
        .iter()
        .enumerate()
        .map(|(i, c)| start_collector(c, i))
        .collect();
    // Backlogs drain at up to 50 batches/s; give them time, then stop.
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(1));
        let left: f64 = running
            .iter()
            .flatten()
            .map(|a| scrape(&a.metrics, "flopwatch_agent_outbox_batches"))
            .sum();
        if left <= 4.0 {
            break;
        }
    }
    for a in running.into_iter().flatten() {
        let (_, _, left) = stop_agent(a);
        assert_eq!(left, 0, "an agent stopped with unacknowledged batches");
    }
    let rt = runtime();
    let series = rt.block_on(async {
        let mut q = query(&urls[1]).await;
        let gpus = gpus(&mut q).await;
        assert_eq!(gpus.len(), 8);
        let mut out = Vec::new();
        for (uuid, node) in gpus {
            let ts = series_ts(&mut q, &uuid, "power_w", false)
                .await
                .expect("power_w stored");
            out.push((node, uuid, ts));
        }
        out
    });
    drop(collectors);
    let interval = shape.interval_ms as i64;
    let mut worst_loss = 0;
    for (node, uuid, ts) in &series {
        let gaps: Vec<(i64, i64)> = ts
            .windows(2)
            .filter(|w| w[1] - w[0] > 10 * interval)
            .map(|w| (w[0], w[1]))
            .collect();
        if node == "node-00" {
            // One gap: the agent was dead from the kill to its restart.
            assert_eq!(gaps.len(), 1, "{uuid}: gaps {gaps:?}");
            let (last, first) = gaps[0];
            let lost = killed_at - last;
            worst_loss = worst_loss.max(lost);
            assert!(
                lost <= shape.flush_ms as i64 + 2 * interval + 500,
                "{uuid}: samples up to {lost} ms before the kill are missing"
            );
            assert!(
                first >= restarted_at - 2000,
                "{uuid}: data after the restart"
            );
        } else {
            assert!(gaps.is_empty(), "{uuid} ({node}): gaps {gaps:?}");
        }
        // The outage itself is covered.
        let covered = ts
            .iter()
            .filter(|&&t| t > killed_at - outage.as_millis() as i64 / 2 && t < killed_at)
            .count();
        assert!(covered > 0, "{uuid}: nothing stored from the outage");
    }
    eprintln!(
        "fault (b): outage {outage:?}, agent killed {} ms into the outage (spool held {spooled_before} files); \
         samples lost before the kill: at most {worst_loss} ms (flush_interval {} ms)",
        outage.as_millis() / 2,
        shape.flush_ms
    );
}

// ---------------------------------------------------------------------------
// Backpressure: a collector that stalls (SIGSTOP) without closing anything.

fn signal(p: &Proc, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(p.child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn stalled_collector_makes_agents_fail_over_and_loses_nothing() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 2);
    let urls: Vec<String> = specs.iter().map(CollectorSpec::url).collect();
    let collectors: Vec<Proc> = specs
        .iter()
        .enumerate()
        .map(|(i, c)| start_collector(c, i))
        .collect();
    let shape = AgentShape {
        nodes: 4,
        gpus: 2,
        interval_ms: 50,
        flush_ms: 250,
        fsync_ms: 100,
    };
    let agents: Vec<AgentSpec> = (0..4)
        .map(|i| agent_spec(root.path(), i, &urls, shape))
        .collect();
    let running: Vec<RunningAgent> = agents.iter().map(start_agent).collect();
    std::thread::sleep(Duration::from_secs(3));
    // Agent 0's home collector stops answering: connections stay open,
    // nothing is acknowledged.
    let home = flopwatch_agent::placement::order("node-00", &urls)[0];
    signal(&collectors[home], "STOP");
    std::thread::sleep(Duration::from_secs(12));
    let failovers = scrape(&running[0].metrics, "flopwatch_agent_failovers_total");
    let acked_while_stalled = scrape(&running[0].metrics, "flopwatch_agent_acked_batches_total");
    signal(&collectors[home], "CONT");
    std::thread::sleep(Duration::from_secs(6));
    let mut taken = 0;
    for a in running {
        let (s, _, left) = stop_agent(a);
        assert_eq!(left, 0);
        taken += s;
    }
    let rt = runtime();
    let (n, d) = rt.block_on(async {
        let mut q = query(&urls[1 - home]).await;
        let gpus: Vec<String> = gpus(&mut q).await.into_keys().collect();
        assert_eq!(gpus.len(), 8);
        let metrics = metrics_of(&mut q, &gpus[0]).await;
        count(&stored(&mut q, &gpus, false, &metrics).await)
    });
    drop(collectors);
    eprintln!(
        "stall: home of node-00 stopped for 12 s: {failovers} failover(s), {acked_while_stalled} batches \
         acknowledged by then; {n} of {taken} samples stored, {d} duplicates"
    );
    assert!(failovers >= 1.0, "agent 0 left its stalled home");
    assert_eq!(d, 0);
    assert_eq!(n, taken);
}

// ---------------------------------------------------------------------------
// (c) the collector's data volume full.

/// A size-capped tmpfs mounted over a directory (root only); unmounted
/// when dropped.
struct SmallVolume(PathBuf);

impl SmallVolume {
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallVolume(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success(), "remount failed");
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn full_data_volume_answers_retryably_acks_nothing_and_recovers() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 1);
    let urls = vec![specs[0].url()];
    let Some(volume) = SmallVolume::mount(&specs[0].dir, "2m") else {
        eprintln!(
            "fault (c) not run: cannot mount a size-capped tmpfs here (needs root); \
             see docs/RELIABILITY.md for the figures of a run"
        );
        return;
    };
    let shape = AgentShape {
        nodes: 1,
        gpus: 8,
        interval_ms: 25,
        flush_ms: 250,
        fsync_ms: 100,
    };
    let spec = agent_spec(root.path(), 0, &urls, shape);
    let mut collector = start_collector(&specs[0], 0);
    let agent = start_agent(&spec);
    // The volume fills up: writes fail with ENOSPC.
    collector.wait_line("storage error", Duration::from_secs(120));
    let acked_at_error = scrape(&agent.metrics, "flopwatch_agent_acked_batches_total");
    // The collector answers UNAVAILABLE ("retry"), acks nothing more, and
    // its watchdog stops it with a failure status for the service manager.
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Ok(Some(st)) = collector.child.try_wait() {
            break st;
        }
        assert!(
            Instant::now() < until,
            "collector still running:\n{}",
            collector.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !status.success(),
        "a collector that cannot write exits with a failure"
    );
    let acked_after = scrape(&agent.metrics, "flopwatch_agent_acked_batches_total");
    let spooled = scrape(&agent.metrics, "flopwatch_agent_spool_bytes");
    assert!(
        agent.proc.count_lines("storage unavailable, retry") > 0,
        "agent saw UNAVAILABLE:\n{}",
        agent.proc.log()
    );
    // Space returns; the service manager (here the test) restarts it.
    volume.resize("256m");
    drop(collector);
    let collector = start_collector(&specs[0], 0);
    let until = Instant::now() + Duration::from_secs(60);
    while scrape(&agent.metrics, "flopwatch_agent_outbox_batches") > 2.0 {
        assert!(
            Instant::now() < until,
            "backlog does not drain:\n{}",
            agent.proc.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (taken, _, left) = stop_agent(agent);
    assert_eq!(left, 0);
    let rt = runtime();
    let count_all = || {
        rt.block_on(async {
            let mut q = query(&urls[0]).await;
            let gpus: Vec<String> = gpus(&mut q).await.into_keys().collect();
            let metrics = metrics_of(&mut q, &gpus[0]).await;
            count(&stored(&mut q, &gpus, false, &metrics).await)
        })
    };
    let (n, d) = count_all();
    // A clean stop, a reopen: the same data (nothing corrupt).
    let mut collector = collector;
    assert!(collector.term(Duration::from_secs(30)).success());
    drop(collector);
    let collector = start_collector(&specs[0], 0);
    let (n2, d2) = count_all();
    drop(collector);
    eprintln!(
        "fault (c): volume full after {acked_at_error} acked batches ({acked_after} when the collector \
         stopped; {spooled} bytes spooled meanwhile); after space returned: {n} of {taken} samples \
         stored, {d} duplicates; after a reopen {n2}"
    );
    assert_eq!(
        acked_after, acked_at_error,
        "nothing acked while the volume is full"
    );
    assert!(spooled > 0.0);
    assert_eq!(d, 0);
    assert_eq!(n, taken, "every sample taken is stored once space returns");
    assert_eq!((n2, d2), (n, d));
}

// ---------------------------------------------------------------------------
// (d) a truncated or corrupt spool.

/// (offset, length, samples) of each record of a spool segment.
fn records(data: &[u8]) -> Vec<(usize, usize, u64)> {
    use prost::Message;
    let mut out = Vec::new();
    let mut off = 0;
    while off + 12 <= data.len() {
        assert_eq!(&data[off..off + 4], b"FWS1");
        let len = u32::from_le_bytes(data[off + 4..off + 8].try_into().unwrap()) as usize;
        let b = v1::Batch::decode(&data[off + 12..off + 12 + len]).unwrap();
        let n = b.series.iter().map(|s| s.timestamps_ms.len() as u64).sum();
        out.push((off, 12 + len, n));
        off += 12 + len;
    }
    out
}

#[test]
fn corrupt_and_truncated_spool_records_are_set_aside_and_counted() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 1);
    let urls = vec![specs[0].url()];
    let shape = AgentShape {
        nodes: 1,
        gpus: 2,
        interval_ms: 100,
        flush_ms: 300,
        fsync_ms: 100,
    };
    let spec = agent_spec(root.path(), 0, &urls, shape);
    // First run: no collector, everything goes to the spool.
    let a = start_agent(&spec);
    std::thread::sleep(Duration::from_secs(3));
    let (first_samples, first_acked, _) = stop_agent(a);
    assert_eq!(first_acked, 0);
    let segs: Vec<PathBuf> = std::fs::read_dir(&spec.spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "spool"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    let mut data = std::fs::read(&segs[0]).unwrap();
    let recs = records(&data);
    assert!(recs.len() >= 4, "{} records", recs.len());
    // Flip a payload byte of the second record, cut the last one in half.
    let (off, len, bad_a) = recs[1];
    data[off + 12 + len / 2 - 6] ^= 0x5A;
    let (off, len, bad_b) = *recs.last().unwrap();
    data.truncate(off + len / 2);
    std::fs::write(&segs[0], &data).unwrap();

    let collector = start_collector(&specs[0], 0);
    let a = start_agent(&spec);
    let until = Instant::now() + Duration::from_secs(30);
    while scrape(&a.metrics, "flopwatch_agent_acked_batches_total") < 10.0 {
        assert!(
            Instant::now() < until,
            "agent does not deliver:\n{}",
            a.proc.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let bad = scrape(&a.metrics, "flopwatch_agent_spool_bad_records_total");
    let aside = std::fs::read_dir(&spec.spool)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".bad")
        })
        .count();
    let (second_samples, _, left) = stop_agent(a);
    assert_eq!(left, 0);
    let rt = runtime();
    let stored_points = rt.block_on(async {
        let mut q = query(&urls[0]).await;
        let gpus: Vec<String> = gpus(&mut q).await.into_keys().collect();
        let metrics = metrics_of(&mut q, &gpus[0]).await;
        count(&stored(&mut q, &gpus, false, &metrics).await)
    });
    drop(collector);
    eprintln!(
        "fault (d): {} records, 2 damaged ({} samples); bad records counted {bad}, files set aside {aside}; \
         stored {} of {} samples",
        recs.len(),
        bad_a + bad_b,
        stored_points.0,
        first_samples + second_samples
    );
    assert_eq!(bad, 2.0);
    assert_eq!(aside, 2);
    assert_eq!(stored_points.1, 0);
    assert_eq!(
        stored_points.0,
        first_samples + second_samples - bad_a - bad_b,
        "everything but the two damaged records is delivered"
    );
}

// ---------------------------------------------------------------------------
// SIGTERM: a collector acknowledges what it holds and exits 0; an agent
// flushes its last batch to the spool.

#[test]
fn sigterm_flushes_collector_and_agent() {
    let _serial = serial();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster(root.path(), 1);
    let urls = vec![specs[0].url()];
    let shape = AgentShape {
        nodes: 2,
        gpus: 2,
        interval_ms: 50,
        flush_ms: 250,
        fsync_ms: 100,
    };
    let mut c = start_collector(&specs[0], 0);
    let specs_a: Vec<AgentSpec> = (0..2)
        .map(|i| agent_spec(root.path(), i, &urls, shape))
        .collect();
    let agents: Vec<RunningAgent> = specs_a.iter().map(start_agent).collect();
    std::thread::sleep(Duration::from_secs(3));
    let st = c.term(Duration::from_secs(30));
    assert!(st.success(), "collector exit status {st}:\n{}", c.log());
    assert_eq!(c.count_lines("collector stopped"), 1, "{}", c.log());
    drop(c);
    // Collector gone: agents keep sampling into their spools, then stop.
    std::thread::sleep(Duration::from_secs(2));
    let mut taken = 0;
    for a in agents {
        let (s, _, _) = stop_agent(a);
        taken += s;
    }
    // Restarted, they deliver what the spool holds (and a little more).
    let c = start_collector(&specs[0], 0);
    let agents: Vec<RunningAgent> = specs_a.iter().map(start_agent).collect();
    std::thread::sleep(Duration::from_secs(3));
    for a in agents {
        let (s, _, left) = stop_agent(a);
        assert_eq!(left, 0);
        taken += s;
    }
    let rt = runtime();
    let (n, d) = rt.block_on(async {
        let mut q = query(&urls[0]).await;
        let gpus: Vec<String> = gpus(&mut q).await.into_keys().collect();
        let metrics = metrics_of(&mut q, &gpus[0]).await;
        count(&stored(&mut q, &gpus, false, &metrics).await)
    });
    drop(c);
    eprintln!("sigterm: taken {taken}, stored {n}, duplicates {d}");
    assert_eq!(d, 0);
    assert_eq!(n, taken, "nothing taken before either SIGTERM is lost");
}
