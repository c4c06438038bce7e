//! `flopwatch`: one binary for every part.
//!
//! ```text
//! flopwatch demo       collector + simulated fleet, live OFU table
//! flopwatch collector  the gRPC collector with its RocksDB store
//! flopwatch agent      the node agent
//! flopwatch query      OFU, nodes, GPUs, jobs, series from a collector
//! flopwatch select     offline metric selection (Moneo §2.2)
//! flopwatch top        live terminal view
//! flopwatch check-config FILE   validate an agent or collector config
//! flopwatch completions SHELL   shell completion script
//! ```
//!
//! Exit status: 0 on success, 1 when a command fails, 2 for a usage error
//! (an unknown flag or a malformed value, reported by the flag parser).
//!
//! Each role is a Cargo feature (`agent`, `collector`, `select`, `tui`; all
//! on by default), so a node can run a `flopwatch` built with
//! `--no-default-features --features agent`: the agent and `query`, without
//! RocksDB, the collector, the selector or the terminal view.
//! `eval-sampling` is behind `eval` (off by default: it replays a trace on
//! tokio's test clock). Benchmarks and load generators are another binary,
//! `flopwatch-bench` (tests/bench).

#[cfg(feature = "agent")]
mod agent_cmd;
mod alloc;
mod check_config;
#[cfg(feature = "collector")]
mod collector_cmd;
mod conn;
#[cfg(all(feature = "agent", feature = "collector"))]
mod demo;
#[cfg(feature = "eval")]
mod eval;
mod logging;
mod query_cmd;
mod query_jobs;
mod report_cmd;
#[cfg(feature = "select")]
mod select_args;
#[cfg(all(feature = "select", feature = "collector"))]
mod select_store;
mod shared;
mod table;
#[cfg(feature = "collector")]
mod tile_cmd;
#[cfg(feature = "tui")]
mod top;

use clap::{CommandFactory, Parser, Subcommand};

/// Non-intrusive GPU fleet monitor: Overall FLOP Utilization (OFU) for every
/// GPU, job, node and tenant.
#[derive(Parser)]
#[command(name = "flopwatch", version, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: a large variant costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a collector with embedded RocksDB and a simulated fleet, with a
    /// live OFU table.
    #[cfg(all(feature = "agent", feature = "collector"))]
    Demo(demo::DemoArgs),
    /// Run a collector.
    #[cfg(feature = "collector")]
    Collector(collector_cmd::CollectorArgs),
    /// Run a node agent.
    #[cfg(feature = "agent")]
    Agent(agent_cmd::AgentArgs),
    /// Query a collector.
    Query(query_cmd::QueryArgs),
    /// The ledger: GPU-hours held and idle, delivered FLOPs, unused
    /// capacity and energy per job, tenant, namespace or node.
    Report(report_cmd::ReportArgs),
    /// Select a non-redundant metric set from recorded data (Moneo §2.2).
    #[cfg(feature = "select")]
    Select(select_args::SelectArgs),
    /// Compare adaptive with fixed-interval sampling on a trace (Moneo §2.3).
    #[cfg(feature = "eval")]
    EvalSampling(eval::EvalArgs),
    /// Tile-quantization overhead of a GEMM and the corrected OFU (OFU paper eq. 2-4, 8).
    #[cfg(feature = "collector")]
    Tile(tile_cmd::TileArgs),
    /// Live terminal view of nodes, GPUs and jobs with OFU bars.
    #[cfg(feature = "tui")]
    Top(top::TopArgs),
    /// Validate agent or collector config files: `FILE: OK`, or the error
    /// naming the file and the key (exit status 1).
    CheckConfig(check_config::CheckConfigArgs),
    /// Print a completion script, e.g.
    /// `flopwatch completions bash > /etc/bash_completion.d/flopwatch`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Usage errors exit 2 (the flag parser's own status); a command that
/// fails exits 1.
fn main() -> std::process::ExitCode {
    alloc::tune();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Its failures were printed file by file.
        Err(e) if e.is::<check_config::Failed>() => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        #[cfg(all(feature = "agent", feature = "collector"))]
        Command::Demo(a) => {
            // The demo routes its logs itself (to a file beside its store).
            runtime()?.block_on(demo::run(a))
        }
        #[cfg(feature = "collector")]
        Command::Collector(a) => {
            logging::to_stderr("info")?;
            runtime()?.block_on(collector_cmd::run(a))
        }
        #[cfg(feature = "agent")]
        Command::Agent(a) => {
            logging::to_stderr("info")?;
            // One node agent does little work: a single-threaded runtime
            // keeps its footprint small (captures run on a thread of their
            // own, AgentOptions::pacing).
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(2)
                .build()?
                .block_on(agent_cmd::run(a))
        }
        Command::Query(a) => {
            logging::to_stderr("warn")?;
            runtime()?.block_on(query_cmd::run(a))
        }
        Command::Report(a) => {
            logging::to_stderr("warn")?;
            runtime()?.block_on(report_cmd::run(a))
        }
        #[cfg(feature = "select")]
        Command::Select(a) => {
            logging::to_stderr("warn")?;
            run_select(a)
        }
        #[cfg(feature = "collector")]
        Command::Tile(a) => tile_cmd::run(a),
        #[cfg(feature = "tui")]
        Command::Top(a) => {
            // Log lines would tear the full-screen view: errors only.
            logging::to_stderr("error")?;
            runtime()?.block_on(top::run(a))
        }
        #[cfg(feature = "eval")]
        Command::EvalSampling(a) => {
            logging::to_stderr("warn")?;
            // Each run has its own paused-time runtime.
            eval::run(&a).map(|_| ())
        }
        Command::CheckConfig(a) => check_config::run(&a),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "flopwatch",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

#[cfg(feature = "select")]
fn run_select(a: select_args::SelectArgs) -> anyhow::Result<()> {
    if a.store.is_some() {
        #[cfg(feature = "collector")]
        return select_store::run(&a);
        #[cfg(not(feature = "collector"))]
        anyhow::bail!("--store reads a collector's RocksDB store: this flopwatch was built without the `collector` feature");
    }
    flopwatch_selector::run_csv(&a.csv_run()?)?;
    Ok(())
}

/// Parses "10m", "30s", "1h" into milliseconds.
pub(crate) fn parse_ms(s: &str) -> anyhow::Result<i64> {
    Ok(humantime::parse_duration(s)
        .map_err(|e| anyhow::anyhow!("`{s}`: {e}"))?
        .as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bash_completions_name_the_subcommands() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "flopwatch",
            &mut out,
        );
        let script = String::from_utf8(out).unwrap();
        for sub in ["query", "check-config", "completions", "agent"] {
            assert!(script.contains(sub), "{sub}");
        }
    }
}
