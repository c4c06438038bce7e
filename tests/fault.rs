//! Fault tests with real processes: the `flopwatch` binary as collectors
//! and simulated agents on ephemeral loopback ports, killed with SIGKILL
//! or stopped with SIGTERM, samples counted end to end.
//!
//! The binary is `target/<profile>/flopwatch` beside this test (built by
//! `cargo test --workspace` or `cargo build --workspace --all-targets`), or
//! the path in `FLOPWATCH_BIN`.
//!
//! Figures from these tests are in docs/RELIABILITY.md.

use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::v1;
use flopwatch_tests::procs::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

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

/// Limbo activity from collectors' logs, summed over processes.
#[derive(Default)]
struct LimboLog {
    committed: u64,
    dropped: u64,
    kept: u64,
    timed_out: u64,
}

impl LimboLog {
    fn add(&mut self, p: &Proc) {
        self.committed += p.count_lines("uncertain batch committed into limbo") as u64;
        for l in p.err.lock().unwrap().iter() {
            if l.contains("limbo batches settled") {
                self.dropped += field(l, "dropped").unwrap_or(0);
                self.kept += field(l, "kept").unwrap_or(0);
                self.timed_out += field(l, "timed_out").unwrap_or(0);
            }
        }
    }
}

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
    let started = Stopwatch::start();
    let mut kills = 0;
    let mut victim = 0;
    let mut limbo = LimboLog::default();
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
            limbo.add(&p);
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
    // Batches two collectors got are in limbo on one of them until its
    // reconciler has asked the others: wait (bounded) until none is left.
    let metrics: Vec<String> = collectors
        .iter_mut()
        .flatten()
        .map(collector_metrics)
        .collect();
    let settling = Stopwatch::start();
    let limbo_left = || -> Option<f64> {
        metrics
            .iter()
            .map(|m| scrape_opt(m, "flopwatch_limbo_batches"))
            .sum()
    };
    while limbo_left() != Some(0.0) {
        assert!(
            settling.elapsed() < Duration::from_secs(90),
            "limbo not settled within 90 s: {:?} batches left",
            limbo_left()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let settled_in = settling.elapsed();
    for c in collectors.iter().flatten() {
        limbo.add(c);
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
        eprintln!("fault (a): points in the collectors' own answers together: {total_local}");
        // Series of one GPU share their capture times: one shorter than
        // its siblings points at what is missing.
        let mut by_gpu: std::collections::BTreeMap<&str, Vec<(&str, &Vec<i64>)>> =
            Default::default();
        for ((g, m), ts) in &fleet {
            by_gpu.entry(g.as_str()).or_default().push((m, ts));
        }
        for (g, series) in by_gpu {
            let longest = series.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
            let full = series
                .iter()
                .find(|(_, t)| t.len() == longest)
                .map(|(_, t)| *t);
            for (m, ts) in &series {
                if ts.len() + 1 < longest {
                    let have: std::collections::BTreeSet<i64> = ts.iter().copied().collect();
                    let missing: Vec<i64> = full
                        .into_iter()
                        .flatten()
                        .filter(|t| !have.contains(t))
                        .copied()
                        .take(20)
                        .collect();
                    eprintln!(
                        "short series {g} {m}: {} of {longest}, missing {missing:?}",
                        ts.len()
                    );
                }
            }
        }
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
    eprintln!(
        "fault (a): limbo empty {settled_in:?} after the agents stopped; over every collector \
         process: {} batches committed into limbo, {} dropped (a peer held them), {} kept, \
         {} timed out",
        limbo.committed, limbo.dropped, limbo.kept, limbo.timed_out
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
    assert_eq!(copies, 0, "no sample stays stored on two collectors");
    assert_eq!(limbo.timed_out, 0);
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
    let down = Stopwatch::start();
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
    let until = Deadline::after(Duration::from_secs(60));
    while !until.passed() {
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
    let home = flopwatch_agent::order("node-00", &urls)[0];
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
    let until = Deadline::after(Duration::from_secs(60));
    let status = loop {
        if let Ok(Some(st)) = collector.child.try_wait() {
            break st;
        }
        assert!(
            !until.passed(),
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
    let until = Deadline::after(Duration::from_secs(60));
    while scrape(&agent.metrics, "flopwatch_agent_outbox_batches") > 2.0 {
        assert!(
            !until.passed(),
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
    let until = Deadline::after(Duration::from_secs(30));
    while scrape(&a.metrics, "flopwatch_agent_acked_batches_total") < 10.0 {
        assert!(!until.passed(), "agent does not deliver:\n{}", a.proc.log());
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
