//! Options of the selection pipeline and the outputs of a run, with the
//! defaults the command line shows.

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

/// What a run writes: the selected metric set, optionally a report
/// directory, and the JSON summary on stdout.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    /// The selected metric set (TOML).
    pub output: PathBuf,
    /// Directory for report.md, summary.json and SVG plots.
    pub report: Option<PathBuf>,
    /// Print the JSON summary on stdout.
    pub json: bool,
}

/// A selection over CSV files (`flopwatch select --input`).
#[derive(Debug, Clone, PartialEq)]
pub struct CsvRun {
    /// Long-form CSV files with header `workload,metric,timestamp_ms,value`.
    pub inputs: Vec<PathBuf>,
    /// Pipeline options (validated by the run).
    pub options: SelectOptions,
    /// What to write.
    pub outputs: Outputs,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

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
