//! Time the selection pipeline on synthetic data at several sizes.
//!
//! `cargo run --release -p flopwatch-selector --example scale -- [POINTS] [WORKLOADS] [METRICS...]`
//! (defaults: 36000 points, 4 workloads, 50 100 200 300 metrics).
//! With `SCALE_FULL=1` the largest size is also run through the row-iterator
//! entry (`select`) and end to end through a CSV file (`run_csv`, report included).

// A benchmark example: it times real work on the real clock.
#![allow(clippy::disallowed_types)]

use std::io::Write;
use std::time::Instant;

use flopwatch_selector::{
    run_csv, select, select_samples, synth, CsvRun, Outputs, ProgressBar, Row, SelectOptions,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let points = num(0, 36_000);
    let workloads = num(1, 4);
    let mut sizes: Vec<usize> = args.iter().skip(2).filter_map(|s| s.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![50, 100, 200, 300];
    }
    println!(
        "threads available: {}",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    println!(
        "metrics | workloads | points | samples | build (s) | select_samples (s) | kept | dropped"
    );
    let mut last = None;
    for &m in &sizes {
        let t = Instant::now();
        let mut set = synth::fleet_like(m, workloads, points, 1);
        let build = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let sel = select_samples(&mut set, &SelectOptions::default(), &ProgressBar::hidden())
            .expect("selection");
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{m} | {workloads} | {points} | {} | {build:.2} | {secs:.2} | {} | {}",
            set.rows(),
            sel.kept.len(),
            sel.dropped_low_variance.len()
        );
        last = Some(set);
    }
    if std::env::var_os("SCALE_FULL").is_none() {
        return;
    }
    let set = last.expect("at least one size");

    let rows: Vec<Row> = set
        .iter()
        .map(|(w, m, t, v)| Row {
            workload: w.to_owned(),
            metric: m.to_owned(),
            timestamp_ms: t,
            value: v,
        })
        .collect();
    let t = Instant::now();
    let sel = select(rows, &SelectOptions::default(), &ProgressBar::hidden()).expect("selection");
    println!(
        "select(rows): {:.2} s (kept {})",
        t.elapsed().as_secs_f64(),
        sel.kept.len()
    );

    let dir = std::env::temp_dir().join("flopwatch-selector-scale");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let csv = dir.join("samples.csv");
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&csv).expect("create csv"));
        writeln!(out, "workload,metric,timestamp_ms,value").expect("write");
        for (w, m, t, v) in set.iter() {
            writeln!(out, "{w},{m},{t},{v}").expect("write");
        }
    }
    drop(set);
    let bytes = std::fs::metadata(&csv).map_or(0, |m| m.len());
    let args = CsvRun {
        inputs: vec![csv.clone()],
        options: SelectOptions::default(),
        outputs: Outputs {
            output: dir.join("selected.toml"),
            report: Some(dir.join("report")),
            json: false,
        },
        progress: false,
    };
    let t = Instant::now();
    let mut parsed = flopwatch_selector::SampleSet::new();
    flopwatch_selector::csv_input::read_csv_files(
        &args.inputs,
        &mut parsed,
        &ProgressBar::hidden(),
    )
    .expect("read csv");
    println!(
        "CSV parse only: {:.2} s ({} rows)",
        t.elapsed().as_secs_f64(),
        parsed.rows()
    );
    drop(parsed);
    let t = Instant::now();
    let sel = run_csv(&args).expect("run_csv");
    println!(
        "run_csv ({:.2} GB CSV, report included): {:.2} s (kept {})",
        bytes as f64 / 1e9,
        t.elapsed().as_secs_f64(),
        sel.kept.len()
    );
    let _ = std::fs::remove_file(&csv);
}
