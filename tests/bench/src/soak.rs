//! `flopwatch-bench soak`: hours of a collector's life in minutes.
//!
//! The real collector (RocksDB in a fresh directory, its compactor,
//! folding, sealing and retention as shipped; the in-process server that
//! `bench ingest` and the demo use) runs on a clock that goes `--warp`
//! times faster than the wall clock, and so do the agents of `bench
//! fleet` (the real batcher, outbox, spool and client, in their own
//! processes) that feed it: 24 hours of sample time pass in an hour at
//! `--warp 24`. Everything the collector schedules by its clock — hours
//! sealing, retention — comes `--warp` times as often; its compaction
//! interval is divided by `--warp` too, so a pass looks at the same
//! stretch of sample time as it would in real time. What the warp cannot
//! compress is the work: at `--warp 10`, 1,000 agents send what 10,000
//! send in real time, and every hour of theirs is folded, sealed and
//! expired in six minutes — but an hour of theirs is a tenth of the
//! 10,000's, so the head is a tenth as large: its size, and what it costs
//! RocksDB, are only measured at full size with the fleet's own number of
//! agents (`--warp 1`).
//!
//! Every `--window` (5 s of wall time) one line: the agents' ack latency
//! in that window (p50, p99), the collector's RSS, the store's head and
//! sealed families on disk, the head's bytes per sample it holds (samples
//! acknowledged, less those sealed), the compaction lag (how long the
//! earliest hour still in the head is overdue) and the GPUs with bundles
//! not folded yet; then the commits, the storage writes that carried them
//! and their mean time from joining the tenant's line to written, the
//! batches the collector deferred (no commit slot
//! in time) and saw again (replays), and the storage engine's debt: files in
//! level 0, bytes its compactions owe, and whether writes are held back
//! (RocksDB's stall). The summary counts the windows over 250 ms, and samples lost:
//! produced less acknowledged over every agent (an ack means durable),
//! and, when retention kept everything, the store's count of
//! `--verify-agents` agents' samples against what they produced.

use super::backpressure::{field, memory, mib, ms};
use super::fleet::{count_stored, cpu_seconds, fmt_ms, Generators, Load, Warp};
use super::hist_line::hist;
use anyhow::Context;
use flopwatch_agent::latency::quantile;
use flopwatch_collector::server;
use flopwatch_collector::store::Cf;
use flopwatch_config::CollectorConfig;
use flopwatch_proto::clock::{Clock, SystemClock};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `bench soak`.
#[derive(clap::Args)]
pub(super) struct SoakArgs {
    /// Agents (one connection and Ingest stream each).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// GPUs per agent.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Metrics per GPU (from the catalog).
    #[arg(long, default_value_t = 20)]
    metrics: usize,
    /// Each series' sampling interval, sample time (the adaptive
    /// sampler's, backed off).
    #[arg(long, default_value = "7s")]
    interval: String,
    /// Sample time runs this many times faster than the wall clock.
    #[arg(long, default_value_t = 10.0)]
    warp: f64,
    /// Sample time to run (e.g. `2h30m`, `24h`).
    #[arg(long, default_value = "2h30m")]
    hours: String,
    /// Agents start spread over this long (wall time).
    #[arg(long, default_value = "20s")]
    ramp: String,
    /// Each line's window (wall time).
    #[arg(long, default_value = "5s")]
    window: String,
    /// Sample time starts this far into its hour (e.g. `40m`: the first
    /// hour holds 20 minutes and seals soon); default: the wall clock's.
    #[arg(long)]
    start_into_hour: Option<String>,
    /// The collector's retention (sample time).
    #[arg(long, default_value = "30d")]
    retention: String,
    /// The collector's `storage.seal_spread` (sample time; default: the
    /// collector's).
    #[arg(long)]
    seal_spread: Option<String>,
    /// The collector's `storage.fold_after` (sample time; `0s`: off;
    /// default: the collector's).
    #[arg(long)]
    fold_after: Option<String>,
    /// Agents whose every stored sample is counted after the run (0: all).
    #[arg(long, default_value_t = 200)]
    verify_agents: usize,
    /// Working directory (store, agent spools, logs); default: a
    /// temporary one, removed after.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Where the agents' spools go (a directory made in it, removed
    /// after); default: the working directory. A tmpfs (e.g. `/dev/shm`)
    /// keeps 10,000 agents' writes off the disk the collector syncs its
    /// write-ahead log to, as each agent's own node's disk would.
    #[arg(long)]
    spools: Option<PathBuf>,
    /// Each agent's spool cap (`spool.max_bytes`; segments roll at an
    /// eighth of it and go once acknowledged): 10,000 agents over hours
    /// of sample time would otherwise keep up to 16 MiB each.
    #[arg(long, default_value_t = 2 << 20)]
    spool_max_bytes: u64,
}

/// What the windows saw, for the summary.
#[derive(Default)]
struct Seen {
    windows: usize,
    over_250: usize,
    worst_p99: Option<Duration>,
    rss_max_kib: u64,
    head_max: u64,
    sealed_max: u64,
    head_bps_max: f64,
    lag_max_ms: i64,
    /// Most files in a family's level 0.
    l0_max: u64,
    /// Windows that ended with the engine's writes delayed or stopped.
    stalled: usize,
}

pub(super) async fn run(a: SoakArgs) -> anyhow::Result<()> {
    let tmp = a.dir.is_none();
    let root = a.dir.clone().unwrap_or_else(super::tempdir_path);
    std::fs::create_dir_all(&root)?;
    let spools = a
        .spools
        .as_ref()
        .map(|d| d.join(format!("flopwatch-spools-{}", std::process::id())));
    let outcome = soak(&a, &root, spools.as_deref()).await;
    if let Some(s) = &spools {
        let _ = std::fs::remove_dir_all(s);
    }
    if tmp {
        let _ = std::fs::remove_dir_all(&root);
    } else {
        println!("logs and data under {}", root.display());
    }
    outcome
}

async fn soak(
    a: &SoakArgs,
    root: &std::path::Path,
    spools: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let warp = a.warp.max(1e-3);
    let epoch_ms = SystemClock.now_ms();
    let origin_ms = match &a.start_into_hour {
        Some(m) => {
            let into = ms(m)?.as_millis() as i64;
            epoch_ms - epoch_ms.rem_euclid(3_600_000) + into.min(3_599_999)
        }
        None => epoch_ms,
    };
    let clock = Warp {
        epoch_ms,
        origin_ms,
        warp,
    };
    let span = ms(&a.hours)?;
    let window = ms(&a.window)?;
    let dur = |s: &str| -> anyhow::Result<String> { Ok(format!("{}ms", ms(s)?.as_millis())) };
    let every = Duration::from_secs(60)
        .div_f64(warp)
        .max(Duration::from_secs(1));
    let mut storage = format!("compaction_interval = \"{}ms\"\n", every.as_millis());
    if let Some(s) = &a.seal_spread {
        storage += &format!("seal_spread = \"{}\"\n", dur(s)?);
    }
    if let Some(f) = &a.fold_after {
        storage += &format!("fold_after = \"{}\"\n", dur(f)?);
    }
    let text = format!(
        "data_dir = \"{}\"\nanonymous_tenant = \"default\"\nplaintext = true\n\
         max_agents = {}\nretention = \"{}\"\n\n[storage]\n{storage}",
        root.join("collector").display(),
        a.agents + 16,
        dur(&a.retention)?,
    );
    let path = root.join("collector.toml");
    std::fs::write(&path, &text)?;
    let cfg: CollectorConfig = flopwatch_config::parse_str(&text, &path)?;
    let (collector, server) = server::Loopback::open(&cfg, Arc::new(clock))
        .await
        .with_context(|| format!("opening {}", cfg.data_dir.display()))?;
    let store = collector.store.clone();
    let pid = std::process::id();
    let (rss0, _, _) = memory(pid).unwrap_or_default();
    let load = Load {
        agents: a.agents,
        gpus: a.gpus,
        metrics: a.metrics,
        interval: a.interval.clone(),
        ramp: a.ramp.clone(),
        spools: spools.map(std::path::Path::to_path_buf),
        spool_max_bytes: a.spool_max_bytes,
    };
    let extra = [
        "--warp".to_string(),
        warp.to_string(),
        "--epoch-ms".to_string(),
        clock.epoch_ms.to_string(),
        "--origin-ms".to_string(),
        clock.origin_ms.to_string(),
    ];
    let mut gen = Generators::start(root, &server.url, &load, &extra)?;
    println!(
        "soak: {} agents × {} GPUs × {} metrics, one point per series per {} of sample time; warp {warp}× ({} of sample time in {:.0} s of wall time); compaction every {:?} (wall); seal spread {}, fold after {} (sample time); retention {}; RSS before the agents {:.1} MiB; root {}; agents' spools {} (each ≤ {} B)",
        a.agents,
        a.gpus,
        a.metrics,
        a.interval,
        a.hours,
        clock.wall(span.as_millis() as i64).as_secs_f64(),
        every,
        a.seal_spread.as_deref().unwrap_or("default"),
        a.fold_after.as_deref().unwrap_or("default"),
        a.retention,
        mib(rss0),
        root.display(),
        spools.map_or_else(|| "in the root".to_string(), |s| s.display().to_string()),
        a.spool_max_bytes,
    );
    let start_ms = clock.now_ms();
    let wall0 = tokio::time::Instant::now();
    let mut seen = Seen::default();
    let mut from = hist(&gen.status());
    let mut next = wall0 + window;
    let mut cpu_from = (cpu_seconds(pid).unwrap_or(0.0), gen.cpu_seconds());
    // Batches the collector deferred (no commit slot in time, or over the
    // rate) and batches it saw again (already durable), so far.
    let deferred = || -> u64 {
        collector
            .stats
            .batch_rejects()
            .into_iter()
            .filter(|((_, why), _)| why == "busy" || why == "rate_limited")
            .map(|(_, n)| n)
            .sum()
    };
    let duplicates = || collector.stats.batches_duplicate.load(Ordering::Relaxed);
    let mut retried_from = (deferred(), duplicates());
    // Commits so far, their summed time from joining the line to written
    // (µs), and the writes that carried them.
    let commits = || {
        (
            collector.stats.batches_committed.load(Ordering::Relaxed),
            collector.stats.commit_micros.load(Ordering::Relaxed),
            collector.stats.commit_writes.load(Ordering::Relaxed),
        )
    };
    let mut commits_from = commits();
    let run = async {
        while clock.now_ms() - start_ms < span.as_millis() as i64 {
            tokio::time::sleep_until(next).await;
            next += window;
            let status = gen.status();
            let h = hist(&status);
            let d: Vec<u64> = h
                .iter()
                .zip(&from)
                .map(|(x, y)| x.saturating_sub(*y))
                .collect();
            from = h;
            let now = clock.now_ms();
            let cpu = (cpu_seconds(pid).unwrap_or(0.0), gen.cpu_seconds());
            let secs = window.as_secs_f64();
            let (cpu_collector, cpu_agents) = (
                (cpu.0 - cpu_from.0) / secs * 100.0,
                (cpu.1 - cpu_from.1) / secs * 100.0,
            );
            cpu_from = cpu;
            let (rss, _, _) = memory(pid).unwrap_or_default();
            let engine = store.engine();
            let head = engine.family_bytes(Cf::Head);
            let sealed: u64 = [Cf::Raw, Cf::Ofu, Cf::Rollup]
                .iter()
                .map(|cf| engine.family_bytes(*cf))
                .sum();
            let acked = field(&status, "acked") as u64;
            let in_head = acked.saturating_sub(store.sealed_raw_samples());
            let bps = head as f64 / in_head.max(1) as f64;
            let lag = store.compaction_lag_ms(now);
            let retried = (deferred(), duplicates());
            let (deferred_n, duplicate_n) = (
                retried.0 - retried_from.0,
                retried.1.saturating_sub(retried_from.1),
            );
            retried_from = retried;
            let c = commits();
            let (commit_n, commit_us, writes) = (
                c.0 - commits_from.0,
                c.1 - commits_from.1,
                c.2 - commits_from.2,
            );
            commits_from = c;
            let commit_mean_ms = commit_us as f64 / 1000.0 / commit_n.max(1) as f64;
            let backlog = engine.backlog();
            seen.l0_max = seen.l0_max.max(backlog.l0_files);
            let stall = if backlog.writes_stopped {
                "stopped".to_string()
            } else if backlog.delayed_write_rate > 0 {
                format!("delayed@{:.1}MB/s", backlog.delayed_write_rate as f64 / 1e6)
            } else {
                "no".to_string()
            };
            seen.stalled += usize::from(stall != "no");
            let p99 = quantile(&d, 0.99);
            let count: u64 = d.iter().sum();
            if count > 0 {
                seen.windows += 1;
                if p99.is_some_and(|p| p > Duration::from_millis(250)) {
                    seen.over_250 += 1;
                }
                seen.worst_p99 = seen.worst_p99.max(p99);
            }
            seen.rss_max_kib = seen.rss_max_kib.max(rss);
            seen.head_max = seen.head_max.max(head);
            seen.sealed_max = seen.sealed_max.max(sealed);
            // Once the head holds a few minutes, not while it fills.
            if now - start_ms > 600_000 {
                seen.head_bps_max = seen.head_bps_max.max(bps);
            }
            seen.lag_max_ms = seen.lag_max_ms.max(lag);
            let t = (now - start_ms) / 1000;
            println!(
                "soak wall={:.0}s sample={}:{:02}:{:02} acks={count} p50={} p99={} rss={:.0}MiB head={:.1}MB ({bps:.2} B/sample of {in_head}) sealed={:.1}MB lag={:.0}s unfolded_gpus={} connected={} acked={acked} cpu_collector={cpu_collector:.0}% cpu_agents={cpu_agents:.0}% commits={commit_n} writes={writes} commit_mean={commit_mean_ms:.2}ms deferred={deferred_n} duplicates={duplicate_n} l0={}{} pending_compaction={:.0}MB compactions={} stall={stall}",
                wall0.elapsed().as_secs_f64(),
                t / 3600,
                t / 60 % 60,
                t % 60,
                fmt_ms(quantile(&d, 0.5)),
                fmt_ms(p99),
                mib(rss),
                head as f64 / 1e6,
                sealed as f64 / 1e6,
                lag as f64 / 1000.0,
                store.fold_backlog(),
                field(&status, "connected"),
                backlog.l0_files,
                backlog.l0_family.map_or(String::new(), |f| format!("({})", f.name())),
                backlog.pending_compaction_bytes as f64 / 1e6,
                backlog.running_compactions,
            );
            // Once a minute: where the head's bytes sit.
            if t % 60 < window.as_secs().max(1) as i64 {
                println!("{}", head_files(&engine.files(Cf::Head), now));
            }
        }
        anyhow::Ok(())
    };
    let result = run.await;
    // Whatever happened: stop the agents' sources and let them drain.
    let drained = gen.drain(Duration::from_secs(240));
    gen.kill();
    result?;
    let done = drained.context("the agents did not drain")?;
    let produced = field(&done, "produced");
    let acked = field(&done, "acked");
    let kept_all = ms(&a.retention)? > span + Duration::from_secs(3600);
    let (checked, counted, stored) = if kept_all {
        count_stored(&store, &gen.produced()?, a.gpus, a.metrics, a.verify_agents)?
    } else {
        (0, 0, 0)
    };
    let sealed_samples = store.sealed_raw_samples();
    drop(store);
    drop(collector);
    server.stop().await?;
    let lost = ((produced - acked).max(0.0) as u64).max(counted.saturating_sub(stored));
    println!(
        "soak result: agents={} warp={warp} sample_time={} wall={:.0}s windows={} over_250ms={} worst_p99={} rss_max={:.0}MiB head_max={:.1}MB sealed_max={:.1}MB sealed_samples={} head_max_bytes_per_sample={:.2} lag_max={:.0}s l0_max={} stalled_windows={} produced={produced} acked={acked} lost={lost} checked_agents={checked} checked_produced={counted} checked_stored={stored}{}",
        a.agents,
        a.hours,
        wall0.elapsed().as_secs_f64(),
        seen.windows,
        seen.over_250,
        fmt_ms(seen.worst_p99),
        mib(seen.rss_max_kib),
        seen.head_max as f64 / 1e6,
        seen.sealed_max as f64 / 1e6,
        sealed_samples,
        seen.head_bps_max,
        seen.lag_max_ms as f64 / 1000.0,
        seen.l0_max,
        seen.stalled,
        if kept_all {
            ""
        } else {
            " (retention shorter than the run: the store count is skipped, lost = produced − acknowledged)"
        },
    );
    Ok(())
}

/// One line on the head's files: per level, files, MB and the share of
/// deletions among their entries; and MB by the hours they hold (before
/// the open hour, the open hour, or both).
fn head_files(files: &[flopwatch_collector::store::FileStat], now_ms: i64) -> String {
    let open = now_ms - now_ms.rem_euclid(3_600_000);
    let hour = |k: &[u8]| {
        k.get(1..9)
            .and_then(flopwatch_collector::store::keys::get_ts)
    };
    let mut levels: std::collections::BTreeMap<u32, (u64, u64, u64, u64)> = Default::default();
    let (mut before, mut current, mut both) = (0u64, 0u64, 0u64);
    for f in files {
        let l = levels.entry(f.level).or_default();
        l.0 += 1;
        l.1 += f.bytes;
        l.2 += f.entries;
        l.3 += f.deletions;
        match (hour(&f.first), hour(&f.last)) {
            (_, Some(h)) if h < open => before += f.bytes,
            (Some(h), _) if h >= open => current += f.bytes,
            _ => both += f.bytes,
        }
    }
    let mb = |b: u64| b as f64 / 1e6;
    let per_level: Vec<String> = levels
        .iter()
        .map(|(l, (n, b, e, d))| {
            format!(
                "L{l}:{n}f/{:.0}MB/{:.0}%del",
                mb(*b),
                *d as f64 * 100.0 / (*e).max(1) as f64
            )
        })
        .collect();
    format!(
        "soak head: {} hours_before={:.0}MB open_hour={:.0}MB spanning={:.0}MB",
        per_level.join(" "),
        mb(before),
        mb(current),
        mb(both)
    )
}
