//! `flopwatch select` arguments and the selector run they ask for.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use flopwatch_selector::{
    CsvRun, Interpolation, Outputs, SelectError, SelectOptions, DEFAULT_DISTANCE_THRESHOLD,
    DEFAULT_VARIANCE_THRESHOLD,
};
use std::path::PathBuf;

/// `flopwatch select` arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SelectArgs {
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
    /// How values between samples are read onto the grid: `step` (hold the
    /// last sample) or `linear`.
    #[arg(
        long,
        default_value = "step",
        value_parser = PossibleValuesParser::new(["step", "linear"])
            .try_map(|s| s.parse::<Interpolation>())
    )]
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
    pub(crate) fn options(&self) -> Result<SelectOptions, SelectError> {
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

impl SelectArgs {
    /// What to write.
    pub(crate) fn outputs(&self) -> Outputs {
        Outputs {
            output: self.output.clone(),
            report: self.report.clone(),
            json: self.json,
        }
    }

    /// The CSV run (`--input`).
    pub(crate) fn csv_run(&self) -> Result<CsvRun, SelectError> {
        Ok(CsvRun {
            inputs: self.input.clone(),
            options: self.options()?,
            outputs: self.outputs(),
            progress: !self.no_progress,
        })
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
}
