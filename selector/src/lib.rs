//! # flopwatch-selector — offline, data-driven metric selection
//!
//! Implements Moneo §2.2 (the Moneo paper's metric selection): from time series of
//! every metric recorded across several workloads, drop the metrics that
//! are almost constant, then keep one metric of each group of near-identical
//! series. The output (`selected.toml`) is the metric set agents collect.
//!
//! ## Pipeline
//!
//! 1. **Input.** Long-form rows `workload,metric,timestamp_ms,value`, from
//!    CSV files ([`run_csv`], [`csv_input`]) or any iterator of [`Row`]s
//!    ([`select`]) — e.g. the collector's store. Metrics may be sampled at
//!    different, irregular times. Rows sharing a timestamp: the last wins.
//! 2. **Alignment** ([`align`]). Per workload, every metric with at least
//!    two samples is read onto one regular grid covering the window all of
//!    them have data for (latest first sample to earliest last sample), so
//!    nothing is extrapolated. Step: `--step-ms`, default the median over
//!    metrics of each metric's median sampling step. Interpolation:
//!    step-hold (default: the last sample at or before the grid point, as a
//!    scraper shows it; never invents values) or linear.
//! 3. **Variance filter** ([`variance`]). The unit-free measure is the
//!    *relative variance* `v = Var(x) / max_t x_t²` ∈ [0, 1]: scale-free,
//!    bounded even when the mean is near zero (unlike the coefficient of
//!    variation), and — unlike variance over range² — it sees that a clock
//!    jittering 1980 ± 1 MHz is near-constant. A metric is dropped only if
//!    `v < --variance-threshold` (default 1e-4, σ under 1 % of the peak) in
//!    *every* workload where it exists; constant in one workload but varying
//!    in another means kept. A metric with under two samples everywhere is
//!    dropped as well (one sample has no variance).
//! 4. **Distance** ([`distance`]). Moneo eq. 1,
//!    `( Σ_t |(x_t − y_t) / max_t{x_t, y_t}|² )^½`, applied to series
//!    min-max normalized to [0, 1] so that units and scale do not matter
//!    (a ×1000 copy, or any `a·x + b` with `a > 0`, is at distance 0). The
//!    threshold applies to its **RMS form** `d = eq1 / √T` ∈ [0, 1] — the
//!    root-mean-square gap between the normalized curves — so one threshold
//!    works for any trace length. In a workload where a metric is
//!    near-constant it is taken as flat (all zeros) rather than having its
//!    jitter stretched to full range. All pairs of one workload come from
//!    one Gram product `MᵀM` of the `T × m` normalized matrix
//!    (`‖a−b‖² = ‖a‖² + ‖b‖² − 2a·b`); workloads run in parallel.
//! 5. **Redundancy and groups** ([`cluster`]). Two metrics are redundant only
//!    if `d < --distance-threshold` (default 0.05) in **every** workload where
//!    both exist, i.e. the pair distance is the *max* over shared workloads
//!    (`∞` if they never share one). The max-distance matrix is clustered by
//!    linfa-hierarchical with **complete linkage** and a distance cutoff, so
//!    every pair inside a group is under the threshold (no chaining).
//! 6. **Representatives.** Per group: the first metric of the `--prefer`
//!    list that is a member; else the highest relative variance (max over
//!    workloads); ties by name.
//! 7. **Output** ([`output`], [`report`], [`plot`]). `selected.toml`
//!    (`metrics = [..]` plus `[[groups]]`), and optionally a report
//!    directory: `report.md`, `summary.json`, `heatmap.svg` (distances
//!    ordered by group), `groups.svg`, `pair-N.svg` (example series pairs).
//!    The JSON summary has keys `kept`, `dropped_low_variance`, `groups`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod align;
pub mod cluster;
pub mod csv_input;
pub mod distance;
mod error;
mod options;
pub mod output;
mod par;
mod pipeline;
pub mod plot;
mod progress;
pub mod report;
mod samples;
pub mod synth;
pub mod variance;

use std::io::Write;

pub use align::{Grid, Interpolation};
pub use error::SelectError;
pub use indicatif::ProgressBar;
pub use options::{
    CsvRun, Outputs, SelectOptions, DEFAULT_DISTANCE_THRESHOLD, DEFAULT_MAX_GRID_CELLS,
    DEFAULT_VARIANCE_THRESHOLD,
};
pub use output::{selected_toml, summary_json, write_outputs};
pub use pipeline::{
    select, select_samples, Details, ExamplePair, Group, MetricInfo, Selection, WorkloadInfo,
};
pub use progress::progress_bar;
pub use samples::{Row, SampleSet};

/// The whole CSV path of `flopwatch select`: read the input files,
/// select, write the outputs, print the JSON summary if asked.
pub fn run_csv(run: &CsvRun) -> Result<Selection, SelectError> {
    if run.inputs.is_empty() {
        return Err(SelectError::NoInput);
    }
    run.options.validate()?;
    let bar = progress_bar(run.progress);
    progress::bytes_style(&bar);
    let mut samples = SampleSet::new();
    let result = csv_input::read_csv_files(&run.inputs, &mut samples, &bar).and_then(|()| {
        progress::steps_style(&bar);
        select_samples(&mut samples, &run.options, &bar)
    });
    bar.finish_and_clear();
    let selection = result?;
    finish(&run.outputs, &selection)?;
    Ok(selection)
}

/// Writes what `outputs` asks for. The binary's `--store` path calls this
/// after [`select`].
pub fn finish(outputs: &Outputs, selection: &Selection) -> Result<(), SelectError> {
    write_outputs(selection, &outputs.output, outputs.report.as_deref())?;
    if outputs.json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", summary_json(selection)).map_err(|e| SelectError::io("<stdout>", e))?;
    }
    Ok(())
}
