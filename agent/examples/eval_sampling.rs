//! `flopwatch eval-sampling` as an example binary:
//! `cargo run --release -p flopwatch-agent --example eval_sampling -- --trace agent/traces/steady_gemm.csv`.

use clap::Parser;

fn main() {
    let args = flopwatch_agent::eval::EvalArgs::parse();
    if let Err(e) = flopwatch_agent::eval::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
