//! Jobs' own MFU reports, forwarded to the collector for the OFU paper's
//! §V-C cross-check (a reported MFU far from the measured OFU is a
//! suspected FLOPs miscalculation).
//!
//! A job reports by dropping one JSON file per job into
//! `attribution.mfu_dir`, replacing it atomically (write, then rename):
//!
//! ```json
//! {"job_id": "moe-train", "mfu": 0.5427}
//! {"job_id": "moe-train", "tflops_by_precision": {"bf16": 310.5, "fp8": 120.0},
//!  "timestamp_ms": 1700000060000, "start_ms": 1700000000000}
//! ```
//!
//! `timestamp_ms` defaults to the file's modification time. The directory
//! is scanned at most every [`SCAN_INTERVAL_MS`]; a file is forwarded when
//! its content changed since it was last forwarded. A file that does not
//! parse is logged once per change and counted; it never stops the agent.
//! Sources may report too ([`crate::source::GpuSource::mfu_reports`]: the
//! simulator's jobs do).

use flopwatch_proto::model::MfuReport;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;
use tracing::warn;

/// The directory is scanned at most this often, ms.
pub(crate) const SCAN_INTERVAL_MS: i64 = 5_000;
/// Reports held for the next batch at most; the oldest go first.
pub(crate) const MAX_PENDING: usize = 256;
/// Largest report file read, bytes.
const MAX_FILE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportFile {
    job_id: String,
    #[serde(default)]
    mfu: Option<f64>,
    #[serde(default)]
    tflops_by_precision: BTreeMap<String, f64>,
    #[serde(default)]
    timestamp_ms: Option<i64>,
    #[serde(default)]
    start_ms: Option<i64>,
}

/// Why a report file was not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MfuFileError {
    /// Reading failed.
    #[error("{file}: {source}")]
    Io {
        /// File.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not a report.
    #[error("{file}: {message}")]
    Parse {
        /// File.
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// Parses one report file's text; `mtime_ms` stands in for a missing
/// `timestamp_ms`.
pub(crate) fn parse_report(
    text: &str,
    file: &Path,
    mtime_ms: i64,
) -> Result<MfuReport, MfuFileError> {
    let bad = |message: String| MfuFileError::Parse {
        file: file.display().to_string(),
        message,
    };
    let r: ReportFile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    if r.job_id.trim().is_empty() {
        return Err(bad("job_id is empty".into()));
    }
    if r.mfu.is_none() && r.tflops_by_precision.is_empty() {
        return Err(bad("needs mfu or tflops_by_precision".into()));
    }
    Ok(MfuReport {
        job_id: r.job_id,
        ts_ms: r.timestamp_ms.unwrap_or(mtime_ms),
        start_ms: r.start_ms.unwrap_or(0),
        mfu: r.mfu,
        tflops_by_precision: r.tflops_by_precision.into_iter().collect(),
    })
}

/// Collects reports between batches.
#[derive(Debug, Default)]
pub(crate) struct MfuInbox {
    dir: Option<PathBuf>,
    /// File → content last seen (forwarded or refused).
    seen: HashMap<PathBuf, String>,
    last_scan_ms: Option<i64>,
    pending: Vec<MfuReport>,
    /// Files refused so far.
    pub bad_files: u64,
}

impl MfuInbox {
    /// Reads `dir` when set.
    pub(crate) fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            ..Self::default()
        }
    }

    /// Adds reports (a source's own).
    pub(crate) fn push(&mut self, reports: impl IntoIterator<Item = MfuReport>) {
        self.pending.extend(reports);
        if self.pending.len() > MAX_PENDING {
            let excess = self.pending.len() - MAX_PENDING;
            self.pending.drain(..excess);
        }
    }

    /// Scans the directory if it is due at `now_ms` (blocking file IO: call
    /// from a blocking context).
    pub(crate) fn scan(&mut self, now_ms: i64) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        if self
            .last_scan_ms
            .is_some_and(|t| now_ms - t < SCAN_INTERVAL_MS)
        {
            return;
        }
        self.last_scan_ms = Some(now_ms);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut found = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "json") {
                found.push(path);
            }
        }
        found.sort();
        self.seen.retain(|p, _| found.contains(p));
        for path in found {
            match read(&path) {
                Ok((text, mtime_ms)) => {
                    if self.seen.get(&path) == Some(&text) {
                        continue;
                    }
                    match parse_report(&text, &path, mtime_ms) {
                        Ok(r) => self.push([r]),
                        Err(e) => {
                            self.bad_files += 1;
                            warn!(error = %e, "MFU report file skipped");
                        }
                    }
                    self.seen.insert(path, text);
                }
                Err(e) => {
                    self.bad_files += 1;
                    warn!(error = %e, "MFU report file unreadable");
                }
            }
        }
    }

    /// Whether reports wait for the next batch.
    pub(crate) fn has_reports(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The reports gathered since the last call.
    pub(crate) fn take(&mut self) -> Vec<MfuReport> {
        std::mem::take(&mut self.pending)
    }
}

fn read(path: &Path) -> Result<(String, i64), MfuFileError> {
    let io = |source| MfuFileError::Io {
        file: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(MfuFileError::Parse {
            file: path.display().to_string(),
            message: format!("larger than {MAX_FILE_BYTES} bytes"),
        });
    }
    let mtime_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    let text = std::fs::read_to_string(path).map_err(io)?;
    Ok((text, mtime_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_forwarded_once_per_change_and_bad_ones_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut inbox = MfuInbox::new(Some(dir.path().to_path_buf()));
        std::fs::write(
            dir.path().join("moe.json"),
            r#"{"job_id": "moe", "mfu": 0.5427, "timestamp_ms": 60000, "start_ms": 1}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("mixed.json"),
            r#"{"job_id": "mixed", "tflops_by_precision": {"bf16": 300, "fp8": 120.5}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("bad.json"), r#"{"mfu": 0.3}"#).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a report").unwrap();
        inbox.scan(0);
        let mut got = inbox.take();
        got.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].job_id, "mixed");
        assert_eq!(
            got[0].tflops_by_precision,
            vec![("bf16".to_string(), 300.0), ("fp8".to_string(), 120.5)]
        );
        assert!(got[0].ts_ms > 0, "the file's mtime stands in");
        assert_eq!(
            got[1],
            MfuReport {
                job_id: "moe".into(),
                ts_ms: 60_000,
                start_ms: 1,
                mfu: Some(0.5427),
                tflops_by_precision: Vec::new(),
            }
        );
        assert_eq!(inbox.bad_files, 1);
        // Not due yet, then due but unchanged: nothing new.
        inbox.scan(1_000);
        inbox.scan(SCAN_INTERVAL_MS);
        assert!(inbox.take().is_empty());
        assert_eq!(inbox.bad_files, 1, "a bad file is counted once per change");
        std::fs::write(
            dir.path().join("moe.json"),
            r#"{"job_id": "moe", "mfu": 0.31, "timestamp_ms": 120000}"#,
        )
        .unwrap();
        inbox.scan(2 * SCAN_INTERVAL_MS);
        let got = inbox.take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].mfu, Some(0.31));
        assert_eq!(got[0].start_ms, 0);
    }

    #[test]
    fn a_missing_directory_reads_nothing() {
        let mut inbox = MfuInbox::new(Some("/nonexistent/flopwatch-mfu".into()));
        inbox.scan(0);
        assert!(inbox.take().is_empty());
        let mut off = MfuInbox::new(None);
        off.push([MfuReport {
            job_id: "j".into(),
            ..Default::default()
        }]);
        assert_eq!(off.take().len(), 1);
    }
}
