//! Command-line arguments of `flopwatch select` and the options they map to.

use std::path::PathBuf;

use serde::Serialize;

use crate::align::Interpolation;
use crate::SelectError;

/// Default for `--variance-threshold`: a metric whose standard deviation is
/// under 1 % of its peak magnitude in every workload is near-constant.
pub const DEFAULT_VARIANCE_THRESHOLD: f64 = 1e-4;
/// Default for `--distance-threshold`: two metrics whose normalized curves
/// differ by under 5 % of their range (RMS) in every workload are redundant.
pub const DEFAULT_DISTANCE_THRESHOLD: f64 = 0.05;
/// Bound on grid points × metrics per workload (8 bytes each).
pub const DEFAULT_MAX_GRID_CELLS: usize = 200_000_000;

/// `flopwatch select` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SelectArgs {
    /// Long-form CSV file(s) with header `workload,metric,timestamp_ms,value`.
    #[arg(long, value_name = "FILE", num_args = 1.., required_unless_present = "store", conflicts_with = "store")]
    pub input: Vec<PathBuf>,
    /// Read samples from a collector store directory instead of CSV.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// With --store: only samples at or after this long ago (e.g. 6h).
    #[arg(long, value_name = "AGO", requires = "store")]
    pub since: Option<String>,
    /// With --store: only samples before this long ago (e.g. 10m).
    #[arg(long, value_name = "AGO", requires = "store")]
    pub until: Option<String>,
    /// Where to write the selected metric set (TOML).
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Directory for report.md, summary.json and SVG plots.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Print the JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// Drop a metric if Var(x)/max|x|² is under this in every workload.
    #[arg(long, value_name = "V", default_value_t = DEFAULT_VARIANCE_THRESHOLD)]
    pub variance_threshold: f64,
    /// Group metrics whose RMS eq. 1 distance (0..1) is under this in every workload.
    #[arg(long, value_name = "D", default_value_t = DEFAULT_DISTANCE_THRESHOLD)]
    pub distance_threshold: f64,
    /// Alignment grid step in ms [default: median sampling step, per workload].
    #[arg(long, value_name = "MS")]
    pub step_ms: Option<i64>,
    /// How values between samples are read onto the grid.
    #[arg(long, value_enum, default_value = "step")]
    pub interpolation: Interpolation,
    /// Prefer this metric as its group's representative (repeatable; first wins).
    #[arg(long, value_name = "METRIC")]
    pub prefer: Vec<String>,
    /// Do not draw a progress bar on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

impl SelectArgs {
    /// The pipeline options these arguments ask for (validated).
    pub fn options(&self) -> Result<SelectOptions, SelectError> {
        let opts = SelectOptions {
            variance_threshold: self.variance_threshold,
            distance_threshold: self.distance_threshold,
            step_ms: self.step_ms,
            interpolation: self.interpolation,
            prefer: self.prefer.clone(),
            ..SelectOptions::default()
        };
        opts.validate()?;
        Ok(opts)
    }
}

/// Options of the selection pipeline; defaults match the CLI's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectOptions {
    /// Threshold on the relative variance `Var(x)/max|x|²` (see [`crate::variance`]).
    pub variance_threshold: f64,
    /// Threshold on the RMS form of eq. 1 (see [`crate::distance`]); strict `<`.
    pub distance_threshold: f64,
    /// Grid step; `None` = median sampling step of each workload.
    pub step_ms: Option<i64>,
    /// Step-hold or linear alignment.
    pub interpolation: Interpolation,
    /// Preferred representatives, in order.
    pub prefer: Vec<String>,
    /// Bound on grid points × metrics per workload.
    pub max_grid_cells: usize,
}

impl Default for SelectOptions {
    fn default() -> Self {
        Self {
            variance_threshold: DEFAULT_VARIANCE_THRESHOLD,
            distance_threshold: DEFAULT_DISTANCE_THRESHOLD,
            step_ms: None,
            interpolation: Interpolation::Step,
            prefer: Vec::new(),
            max_grid_cells: DEFAULT_MAX_GRID_CELLS,
        }
    }
}

impl SelectOptions {
    /// Reject thresholds and steps that cannot mean anything.
    pub fn validate(&self) -> Result<(), SelectError> {
        let bad = |name, reason: String| Err(SelectError::InvalidOption { name, reason });
        let v = self.variance_threshold;
        if !(0.0..=1.0).contains(&v) {
            return bad(
                "--variance-threshold",
                format!("{v} is not in [0, 1] (Var(x)/max|x|² lies in [0, 1])"),
            );
        }
        let d = self.distance_threshold;
        if !(d > 0.0 && d <= 1.0) {
            return bad(
                "--distance-threshold",
                format!("{d} is not in (0, 1] (the RMS distance lies in [0, 1])"),
            );
        }
        if let Some(s) = self.step_ms {
            if s <= 0 {
                return bad("--step-ms", format!("{s} is not positive"));
            }
        }
        if self.max_grid_cells == 0 {
            return bad("max_grid_cells", "must be positive".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SelectArgs,
    }

    #[test]
    fn parses_the_documented_surface() {
        let cli = Cli::try_parse_from([
            "select",
            "--input",
            "a.csv",
            "b.csv",
            "--output",
            "sel.toml",
            "--prefer",
            "x",
            "--prefer",
            "y",
            "--interpolation",
            "linear",
            "--step-ms",
            "100",
            "--json",
        ])
        .unwrap();
        assert_eq!(cli.args.input.len(), 2);
        assert_eq!(cli.args.prefer, vec!["x", "y"]);
        let opts = cli.args.options().unwrap();
        assert_eq!(opts.interpolation, Interpolation::Linear);
        assert_eq!(opts.step_ms, Some(100));
    }

    #[test]
    fn command_is_well_formed_and_defaults_hold() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["s", "--input", "a", "--output", "o"]).unwrap();
        assert_eq!(cli.args.options().unwrap(), SelectOptions::default());
        assert!(!cli.args.no_progress && !cli.args.json);
    }

    #[test]
    fn input_and_store_conflict_and_output_is_required() {
        assert!(
            Cli::try_parse_from(["s", "--input", "a", "--store", "d", "--output", "o"]).is_err()
        );
        assert!(Cli::try_parse_from(["s", "--input", "a"]).is_err());
        assert!(Cli::try_parse_from(["s", "--output", "o"]).is_err());
        assert!(
            Cli::try_parse_from(["s", "--store", "d", "--since", "1h", "--output", "o"]).is_ok()
        );
    }

    #[test]
    fn rejects_out_of_range_thresholds() {
        let mut o = SelectOptions::default();
        assert!(o.validate().is_ok());
        o.distance_threshold = 0.0;
        assert!(o.validate().is_err());
        o.distance_threshold = f64::NAN;
        assert!(o.validate().is_err());
        o = SelectOptions {
            step_ms: Some(0),
            ..SelectOptions::default()
        };
        assert!(o.validate().is_err());
    }
}
