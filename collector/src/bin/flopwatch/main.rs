//! `flopwatch`: one binary for every part.
//!
//! ```text
//! flopwatch demo       collector + simulated fleet, live OFU table
//! flopwatch collector  the gRPC collector with its RocksDB store
//! flopwatch agent      the node agent
//! flopwatch query      OFU, nodes, GPUs, jobs, series from a collector
//! flopwatch select     offline metric selection (Moneo §2.2)
//! ```

mod agent_cmd;
mod alloc;
mod bench;
mod collector_cmd;
mod conn;
mod demo;
mod eval;
mod query_cmd;
mod query_jobs;
mod select_store;
mod table;
mod tile_cmd;
mod top;

use clap::{Parser, Subcommand};

/// Non-intrusive GPU fleet monitor: Overall FLOP Utilization (OFU) for every
/// GPU, job, node and tenant.
#[derive(Parser)]
#[command(name = "flopwatch", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a collector with embedded RocksDB and a simulated fleet, with a
    /// live OFU table.
    Demo(demo::DemoArgs),
    /// Run a collector.
    Collector(collector_cmd::CollectorArgs),
    /// Run a node agent.
    Agent(agent_cmd::AgentArgs),
    /// Query a collector.
    Query(query_cmd::QueryArgs),
    /// Select a non-redundant metric set from recorded data (Moneo §2.2).
    Select(flopwatch_selector::SelectArgs),
    /// Compare adaptive with fixed-interval sampling on a trace (Moneo §2.3).
    EvalSampling(eval::EvalArgs),
    /// Measure the collector (see docs/BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// Tile-quantization overhead of a GEMM and the corrected OFU (OFU paper eq. 2-4, 8).
    Tile(tile_cmd::TileArgs),
    /// Live terminal view of nodes, GPUs and jobs with OFU bars.
    Top(top::TopArgs),
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOPWATCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    alloc::tune();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => {
            init_tracing("warn");
            runtime().and_then(|rt| rt.block_on(demo::run(a)))
        }
        Command::Collector(a) => {
            init_tracing("info");
            runtime().and_then(|rt| rt.block_on(collector_cmd::run(a)))
        }
        Command::Agent(a) => {
            init_tracing("info");
            // One node agent does little work: a single-threaded runtime
            // keeps its footprint small (captures run on the blocking pool).
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(2)
                .build()
                .map_err(Into::into)
                .and_then(|rt| rt.block_on(agent_cmd::run(a)))
        }
        Command::Query(a) => {
            init_tracing("warn");
            runtime().and_then(|rt| rt.block_on(query_cmd::run(a)))
        }
        Command::Select(a) => {
            init_tracing("warn");
            run_select(a)
        }
        Command::Bench(a) => {
            init_tracing("warn");
            runtime().and_then(|rt| rt.block_on(bench::run(a)))
        }
        Command::Tile(a) => tile_cmd::run(a),
        Command::Top(a) => {
            // Log lines would tear the full-screen view: errors only.
            init_tracing("error");
            runtime().and_then(|rt| rt.block_on(top::run(a)))
        }
        Command::EvalSampling(a) => {
            init_tracing("warn");
            // Each run has its own paused-time runtime.
            eval::run(&a).map(|_| ())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn run_select(a: flopwatch_selector::SelectArgs) -> anyhow::Result<()> {
    if a.store.is_some() {
        return select_store::run(&a);
    }
    flopwatch_selector::run_csv(&a)?;
    Ok(())
}

/// Parses "10m", "30s", "1h" into milliseconds.
pub(crate) fn parse_ms(s: &str) -> anyhow::Result<i64> {
    Ok(humantime::parse_duration(s)
        .map_err(|e| anyhow::anyhow!("`{s}`: {e}"))?
        .as_millis() as i64)
}
