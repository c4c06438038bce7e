//! `flopwatch demo`: a collector on an ephemeral loopback port with RocksDB
//! under `--data-dir`, and `--nodes` × `--gpus` simulated agents talking
//! real gRPC to it; a live table of OFU per job and node; a summary.

use crate::shared::shutdown_signal;
use crate::{parse_ms, table};
use anyhow::Context;
use flopwatch_agent::boot_id;
use flopwatch_agent::FixedSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{source, Agent, AgentOptions};
use flopwatch_collector::{server, Stats};
use flopwatch_config::CollectorConfig;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::{self, ofu_request};
use flopwatch_sim::{FleetPlan, Turns};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `demo`.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// How long to run, e.g. 60s, 5m.
    #[arg(long, default_value = "60s")]
    duration: String,
    /// RocksDB directory (default: a new directory under the system temp dir, printed).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Sampling interval.
    #[arg(long, default_value = "100ms")]
    interval: String,
    /// When the regressing job slows down (default: half the duration).
    #[arg(long)]
    regress_after: Option<String>,
    /// Window over which regressions and stragglers are judged.
    #[arg(long, default_value = "5s")]
    analysis_window: String,
}

struct Row {
    name: String,
    ofu: f64,
    tpa: f64,
    clk: f64,
    gpus: u32,
}

async fn ofu_rows<S>(
    q: &mut v1::query_client::QueryClient<S>,
    scopes: Vec<(String, ofu_request::Scope)>,
    start_ms: i64,
    end_ms: i64,
) -> Vec<Row>
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut rows = Vec::new();
    for (name, scope) in scopes {
        let req = v1::OfuRequest {
            scope: Some(scope),
            start_ms,
            end_ms,
            step_ms: end_ms - start_ms,
        };
        if let Ok(r) = q.ofu(req).await {
            let r = r.into_inner();
            let s = r.summary.unwrap_or_default();
            let (tpa, clk) = r
                .points
                .first()
                .map(|p| (p.tensor_active, p.sm_clock_mhz))
                .unwrap_or_default();
            rows.push(Row {
                name,
                ofu: s.mean,
                tpa,
                clk,
                gpus: s.gpus,
            });
        }
    }
    rows
}

/// The job, node and fleet sections as one table, so that their columns
/// line up with each other.
fn render(sections: &[(&str, &[Row])]) -> String {
    use table::Align::{Left, Right};
    let head = |title: &str| {
        vec![
            title.to_string(),
            "OFU".into(),
            String::new(),
            "TPA".into(),
            "SM clk".into(),
            "GPUs".into(),
        ]
    };
    let mut t = table::Table::new(&[
        ("", Left),
        ("", Right),
        ("", Left),
        ("", Right),
        ("", Right),
        ("", Right),
    ]);
    for (i, (title, rows)) in sections.iter().enumerate() {
        if i > 0 {
            t.row(Vec::new());
        }
        t.row(head(title));
        for r in *rows {
            if r.gpus == 0 {
                // No sample in the window: a job that ended, a node whose
                // inputs went stale.
                let why = if *title == "job" { "ended" } else { "stale" };
                t.row(vec![
                    r.name.clone(),
                    why.to_string(),
                    String::new(),
                    "-".into(),
                    "-".into(),
                    "0".into(),
                ]);
                continue;
            }
            t.row(vec![
                r.name.clone(),
                format!("{:.1}%", r.ofu * 100.0),
                table::bar(r.ofu, 20),
                format!("{:.1}%", r.tpa * 100.0),
                format!("{:.0} MHz", r.clk),
                r.gpus.to_string(),
            ]);
        }
    }
    // The empty header line is the table's own, not a section's.
    t.render()
        .split_once('\n')
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default()
}

pub(crate) async fn run(a: DemoArgs) -> anyhow::Result<()> {
    if a.nodes == 0 || a.gpus == 0 || a.gpus > 64 {
        anyhow::bail!("--nodes must be positive and --gpus between 1 and 64");
    }
    let duration = parse_ms(&a.duration).context("--duration")?;
    let interval =
        Duration::from_millis(parse_ms(&a.interval).context("--interval")?.max(10) as u64);
    let regress_after = match &a.regress_after {
        Some(s) => parse_ms(s).context("--regress-after")?,
        None => duration / 2,
    };
    let data_dir = match a.data_dir {
        Some(d) => d,
        None => {
            let stamp = flopwatch_proto::clock::SystemClock.now_ms();
            std::env::temp_dir().join(format!("flopwatch-demo-{}-{stamp}", std::process::id()))
        }
    };
    println!(
        "flopwatch demo: {} nodes × {} GPUs, {} of simulated load",
        a.nodes, a.gpus, a.duration
    );
    println!("data dir: {}", data_dir.display());
    // Log lines on the terminal would land in the middle of the live table
    // (and be wiped by its next redraw): they go to a file in the data dir,
    // kept for after the run, whether or not stdout is a terminal.
    std::fs::create_dir_all(&data_dir).with_context(|| data_dir.display().to_string())?;
    let log = data_dir.join("demo.log");
    crate::logging::to_file("warn", &log)?;
    println!("log:      {}", log.display());

    let cfg = CollectorConfig {
        data_dir: data_dir.clone(),
        anonymous_tenant: Some("default".into()),
        // A short run: judge regressions and stragglers over short windows.
        analysis: flopwatch_config::AnalysisConfig {
            window: Duration::from_millis(
                parse_ms(&a.analysis_window)
                    .context("--analysis-window")?
                    .max(1000) as u64,
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    let clock = Arc::new(TokioClock::new());
    let (collector, server) = server::Loopback::open(&cfg, clock.clone())
        .await
        .with_context(|| format!("opening {}", data_dir.display()))?;
    let url = server.url.clone();
    println!("collector: {url}  (try: flopwatch query ofu --collector {url} --job llm-pretrain)");
    println!(
        "metrics:   {}  (try: flopwatch top --collector {url})",
        server.metrics_url
    );
    println!(
        "grafana:   Prometheus data source URL {}  (try: curl '{}/api/v1/query?query=flopwatch_job_ofu_ratio')",
        server.api_url, server.api_url
    );

    let start = clock.now_ms();
    // gemm-bench runs as batch jobs that end, one after another on the
    // same GPUs: each job's OFU is its own time's, and its GPUs are free
    // between two.
    let run_ms = (duration / 3).max(5_000);
    let fleet = FleetPlan::new(a.nodes, a.gpus, regress_after).with_turns(Turns {
        run_ms,
        gap_ms: run_ms * 3 / 5,
    });
    // The MoE job's all-to-all bursts show on its GPUs' InfiniBand ports.
    if let Some((n, g)) = (0..a.nodes)
        .flat_map(|n| (0..a.gpus).map(move |g| (n, g)))
        .find(|&(n, g)| fleet.gpu(n, g).job.as_deref() == Some("moe-train"))
    {
        println!(
            "moe-train: flopwatch query series --collector {url} --gpu ib:mlx5_{g}:1@sim-node-{n:02} --metric ib_rx_bytes_s"
        );
    }
    let boot = boot_id();
    let agents: Vec<Agent> = (0..a.nodes)
        .map(|n| {
            let name = format!("sim-node-{n:02}");
            // One seed for the fleet (the model mixes in the node): each
            // node can then model its peers, as the simulated jobs' MFU
            // reports need.
            // Simulated InfiniBand ports (one per GPU), NUMA nodes and host.
            let source = source::sim_node(&fleet, n, start, 0x5eed, true);
            Agent::start(
                source,
                Box::new(FixedSampler::new(interval)),
                AgentOptions::new(NodeIdentity::named(&name, &boot), vec![url.clone()]),
                clock.clone(),
            )
        })
        .collect();

    let mut q = crate::conn::ConnArgs::plain(&url).connect().await?;
    let tty = std::io::stdout().is_terminal();
    let stats: &Stats = &collector.stats;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = tokio::time::sleep(Duration::from_millis(duration as u64));
    tokio::pin!(deadline);
    let ctrl_c = shutdown_signal();
    tokio::pin!(ctrl_c);
    let mut last_samples = 0u64;
    let mut seconds = 0u64;
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = &mut ctrl_c => { println!("interrupted"); break; }
            _ = tick.tick() => {}
        }
        seconds += 1;
        let now = clock.now_ms();
        let samples = Stats::get(&stats.samples_accepted);
        let rate = samples - last_samples;
        last_samples = samples;
        if !tty && !seconds.is_multiple_of(10) {
            continue;
        }
        let jobs = q
            .list_jobs(v1::ListRequest::default())
            .await
            .map(|r| r.into_inner().jobs)
            .unwrap_or_default();
        let job_scopes = jobs
            .iter()
            .map(|j| {
                (
                    j.job_id.clone(),
                    ofu_request::Scope::JobId(j.job_id.clone()),
                )
            })
            .collect();
        let node_scopes = (0..a.nodes)
            .map(|n| {
                let id = format!("sim-node-{n:02}");
                (id.clone(), ofu_request::Scope::NodeId(id))
            })
            .collect();
        let window = 10_000.min(now - start).max(1_000);
        let job_rows = ofu_rows(&mut q, job_scopes, now - window, now).await;
        let node_rows = ofu_rows(&mut q, node_scopes, now - window, now).await;
        let fleet_rows = ofu_rows(
            &mut q,
            vec![("fleet".into(), ofu_request::Scope::Fleet(true))],
            now - window,
            now,
        )
        .await;
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[2J\x1b[H");
        }
        out.push_str(&format!(
            "flopwatch demo  t={:>3}s/{}s  {} agents  {} samples/s  {} stored  {} batches acked  (last {} s)\n\n",
            (now - start) / 1000, duration / 1000,
            stats.agents_connected.load(std::sync::atomic::Ordering::Relaxed),
            rate, samples, Stats::get(&stats.batches_acked), window / 1000
        ));
        out.push_str(&render(&[
            ("job", &job_rows),
            ("node", &node_rows),
            ("", &fleet_rows),
        ]));
        let recent = q
            .list_events(v1::EventsRequest {
                limit: 5,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().events)
            .unwrap_or_default();
        if !recent.is_empty() {
            out.push_str("\nrecent events\n");
            for e in &recent {
                out.push_str(&format!(
                    "  t={:>3}s  {:<10} {}\n",
                    (e.timestamp_ms - start) / 1000,
                    e.kind,
                    e.detail
                ));
            }
        }
        print!("{out}");
        let _ = std::io::stdout().flush();
    }

    for agent in agents {
        agent.stop().await;
    }
    let end = clock.now_ms();
    // Summary: whole run per job, and first half vs second half so the
    // regressing job shows.
    let jobs = q
        .list_jobs(v1::ListRequest::default())
        .await
        .map(|r| r.into_inner().jobs)
        .unwrap_or_default();
    let mid = start + regress_after.min(end - start);
    println!(
        "\nsummary ({} s, OFU per job over the whole run; before/after {} s)",
        (end - start) / 1000,
        (mid - start) / 1000
    );
    use table::Align::{Left, Right};
    let mut summary = table::Table::new(&[
        ("job", Left),
        ("OFU", Right),
        ("before", Right),
        ("after", Right),
        ("ratio", Right),
        ("GPUs", Right),
        ("ran", Left),
        ("", Left),
    ]);
    for j in &jobs {
        let scope = || {
            vec![(
                j.job_id.clone(),
                ofu_request::Scope::JobId(j.job_id.clone()),
            )]
        };
        let all = ofu_rows(&mut q, scope(), start, end + 1).await;
        let before = ofu_rows(&mut q, scope(), start, mid).await;
        let after = ofu_rows(&mut q, scope(), mid, end + 1).await;
        let Some(a) = all.first() else { continue };
        // A job of one half only has no ratio.
        let half = |r: &[Row]| r.first().filter(|r| r.gpus > 0).map(|r| r.ofu);
        let (b, c) = (half(&before), half(&after));
        let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.2}%", v * 100.0));
        let ratio = match (b, c) {
            (Some(b), Some(c)) if c > 0.0 => Some(b / c),
            _ => None,
        };
        let ended = j.last_seen_ms < end - 5_000;
        let flag = match (ratio.is_some_and(|r| r > 1.5), ended) {
            (true, _) => "← regressed",
            (false, true) => "ended",
            (false, false) => "",
        };
        summary.row(vec![
            j.job_id.clone(),
            pct(Some(a.ofu)),
            pct(b),
            pct(c),
            ratio.map_or("–".to_string(), |r| format!("{r:.2}×")),
            a.gpus.to_string(),
            format!(
                "{}–{} s",
                (j.first_seen_ms - start).max(0) / 1000,
                (j.last_seen_ms - start).max(0) / 1000
            ),
            flag.to_string(),
        ]);
    }
    summary.print();
    // The ledger of the run: what the fleet held, used and burned, and
    // the jobs that held GPUs idle.
    if let Ok(r) = q
        .ledger(v1::LedgerRequest {
            start_ms: start,
            end_ms: end + 1,
            ..Default::default()
        })
        .await
    {
        use crate::report_cmd::{rows, By};
        let entries = r.into_inner().entries;
        let idle: Vec<String> = rows(&entries, By::Job, None)
            .into_iter()
            .filter(|r| r.idle_gpu_hours > 0.5 * r.gpu_hours)
            .map(|r| {
                let job = r.key.split_once('/').map_or(r.key.as_str(), |(_, j)| j);
                format!("{job} {:.3} GPU-h", r.idle_gpu_hours)
            })
            .collect();
        if let Some(f) = rows(&entries, By::Fleet, None).first() {
            println!(
                "\nledger: {:.3} GPU-h held, {:.3} idle{}, {:.1} PFLOP delivered, {:.3} GPU-h unused, {:.3} kWh ({})",
                f.gpu_hours,
                f.idle_gpu_hours,
                if idle.is_empty() {
                    String::new()
                } else {
                    format!(" (held idle: {})", idle.join(", "))
                },
                f.delivered_pflop,
                f.unused_gpu_hours,
                f.energy_joules / 3.6e6,
                f.joules_per_pflop
                    .map_or("nothing delivered".to_string(), |j| format!("{j:.0} J/PFLOP")),
            );
            println!(
                "        per job: flopwatch report --data-dir {} --since 1h --by job",
                data_dir.display()
            );
        }
    }
    let events = q
        .list_events(v1::EventsRequest::default())
        .await
        .map(|r| r.into_inner().events)
        .unwrap_or_default();
    println!("\nevents ({})", events.len());
    for e in &events {
        println!(
            "  t={:>3}s  {:<10} {:<14} {}",
            (e.timestamp_ms - start) / 1000,
            e.kind,
            e.job_id,
            e.detail
        );
    }
    server.stop().await.context("collector")?;
    let disk = collector.store.engine().disk_bytes();
    let samples = Stats::get(&stats.samples_accepted);
    println!(
        "\n{} samples stored in {} ({:.1} MiB on disk, WAL and logs included), {} batches acked, {} rejected",
        samples,
        data_dir.display(),
        disk as f64 / (1024.0 * 1024.0),
        Stats::get(&stats.batches_acked),
        Stats::get(&stats.batches_rejected)
    );
    Ok(())
}
