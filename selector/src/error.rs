//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while selecting metrics.
///
/// Bad input is always an error, never a panic: CSV problems name the file
/// and the 1-based line, row problems name the series and the timestamp.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A CSV file is malformed (header, column, number, NaN, ...).
    #[error("{}:{line}: {message}", file.display())]
    Csv {
        /// The file being read.
        file: PathBuf,
        /// 1-based line number of the offending record (1 = header).
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path being read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A row handed to [`crate::select`] is invalid (non-finite value, empty name).
    #[error("invalid row (workload {workload:?}, metric {metric:?}, timestamp_ms {timestamp_ms}): {reason}")]
    InvalidRow {
        /// The row's workload.
        workload: String,
        /// The row's metric.
        metric: String,
        /// The row's timestamp.
        timestamp_ms: i64,
        /// What is wrong with it.
        reason: String,
    },
    /// There was nothing to select from.
    #[error("no input rows")]
    NoData,
    /// `run_csv` was called without `--input` files (e.g. with `--store`).
    #[error("no --input files given (the --store path is handled by the flopwatch binary)")]
    NoInput,
    /// An option is out of range.
    #[error("invalid option {name}: {reason}")]
    InvalidOption {
        /// The option's name, as on the command line.
        name: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// A workload's metrics do not share a time window long enough for a grid.
    #[error("workload {workload:?}: {reason}")]
    Grid {
        /// The workload.
        workload: String,
        /// What is wrong with its time window or grid.
        reason: String,
    },
    /// linfa-hierarchical rejected the clustering parameters.
    #[error("clustering failed: {0}")]
    Cluster(String),
    /// An output could not be produced (TOML/JSON serialisation, SVG drawing).
    #[error("{}: {message}", path.display())]
    Output {
        /// The output file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl SelectError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SelectError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn output(path: impl Into<PathBuf>, message: impl ToString) -> Self {
        SelectError::Output {
            path: path.into(),
            message: message.to_string(),
        }
    }
}
