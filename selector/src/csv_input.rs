//! Long-form CSV input: `workload,metric,timestamp_ms,value`.
//!
//! Columns may come in any order but all four must be there and nothing
//! else; every problem is reported with the file and the 1-based line.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;

use crate::samples::{check_sample, SampleSet};
use crate::SelectError;

/// The expected header, in canonical order.
pub const COLUMNS: [&str; 4] = ["workload", "metric", "timestamp_ms", "value"];

/// How often (in records) the progress bar is advanced.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Read every file into `set`, advancing `progress` by bytes read.
pub fn read_csv_files(
    paths: &[PathBuf],
    set: &mut SampleSet,
    progress: &ProgressBar,
) -> Result<(), SelectError> {
    let total: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    progress.set_length(total);
    progress.set_position(0);
    progress.set_message("reading CSV");
    let mut done = 0;
    for path in paths {
        let file = File::open(path).map_err(|e| SelectError::io(path, e))?;
        let bytes = read_csv(file, path, set, |pos| progress.set_position(done + pos))?;
        done += bytes;
        progress.set_position(done);
    }
    Ok(())
}

/// Read one CSV stream into `set`. `file` only labels errors. `on_progress`
/// gets the byte offset now and then. Returns the bytes consumed.
pub fn read_csv<R: Read>(
    reader: R,
    file: &Path,
    set: &mut SampleSet,
    mut on_progress: impl FnMut(u64),
) -> Result<u64, SelectError> {
    let err = |line: u64, message: String| SelectError::Csv {
        file: file.to_path_buf(),
        line,
        message,
    };
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(1 << 16)
        .from_reader(Tracked::new(reader));
    // Byte records: names are checked as UTF-8 once per field, numbers are
    // ASCII; this is the hot loop for multi-GB inputs.
    let mut record = csv::ByteRecord::new();

    let read = |rdr: &mut csv::Reader<Tracked<R>>, record: &mut csv::ByteRecord| {
        rdr.read_byte_record(record).map_err(|e| {
            let line = e
                .position()
                .map(|p| p.line())
                .unwrap_or_else(|| rdr.position().line());
            err(line, format!("unreadable CSV: {e}"))
        })
    };

    if !read(&mut rdr, &mut record)? {
        return Err(err(
            1,
            format!("empty file: expected header {}", COLUMNS.join(",")),
        ));
    }
    let header_line = record_line(&rdr);
    let order = parse_header(&record).map_err(|m| err(header_line, m))?;

    let mut count = 0u64;
    while read(&mut rdr, &mut record)? {
        if record.len() != COLUMNS.len() {
            return Err(err(
                record_line(&rdr),
                format!(
                    "expected {} fields ({}), found {}",
                    COLUMNS.len(),
                    COLUMNS.join(","),
                    record.len()
                ),
            ));
        }
        match parse_fields(&record, &order) {
            Ok((workload, metric, timestamp_ms, value)) => {
                set.push_unchecked(workload, metric, timestamp_ms, value)
            }
            Err(message) => return Err(err(record_line(&rdr), message)),
        }
        count += 1;
        if count.is_multiple_of(PROGRESS_EVERY) {
            on_progress(rdr.position().byte());
        }
    }
    Ok(rdr.position().byte())
}

/// A reader that keeps its last few chunks and the newline count before
/// them, so the line of the record just read can be told exactly from
/// csv's byte position (csv's own record position points *before* any
/// blank lines it skipped, and its line count lags behind CRLF).
struct Tracked<R> {
    inner: R,
    /// Bytes handed out so far.
    total: u64,
    /// The most recent chunks: (start offset, newlines before it, bytes).
    recent: VecDeque<(u64, u64, Vec<u8>)>,
    /// Newlines in everything handed out.
    newlines: u64,
}

/// Chunks kept; csv asks for positions inside its read-ahead buffer, i.e.
/// in the last chunk or the one before.
const KEEP_CHUNKS: usize = 4;

impl<R> Tracked<R> {
    fn new(inner: R) -> Self {
        Tracked {
            inner,
            total: 0,
            recent: VecDeque::with_capacity(KEEP_CHUNKS),
            newlines: 0,
        }
    }

    /// Newlines at offsets below `byte` (which lies in a kept chunk).
    fn newlines_before(&self, byte: u64) -> u64 {
        match self
            .recent
            .iter()
            .rev()
            .find(|(start, _, _)| *start <= byte)
        {
            Some((start, before, bytes)) => {
                let upto = ((byte - start) as usize).min(bytes.len());
                before + count_newlines(&bytes[..upto])
            }
            None => 0,
        }
    }
}

fn count_newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            let mut chunk = if self.recent.len() == KEEP_CHUNKS {
                self.recent.pop_front().map(|c| c.2).unwrap_or_default()
            } else {
                Vec::new()
            };
            chunk.clear();
            chunk.extend_from_slice(&buf[..n]);
            self.recent.push_back((self.total, self.newlines, chunk));
            self.newlines += count_newlines(&buf[..n]);
            self.total += n as u64;
        }
        Ok(n)
    }
}

/// 1-based line of the last byte of the record just read (its terminator
/// excluded): the reader stands just past the record.
fn record_line<R: Read>(rdr: &csv::Reader<Tracked<R>>) -> u64 {
    let end = rdr.position().byte();
    1 + rdr.get_ref().newlines_before(end.saturating_sub(1))
}

/// One data record's fields, trimmed and parsed.
fn parse_fields<'r>(
    record: &'r csv::ByteRecord,
    order: &[usize; 4],
) -> Result<(&'r str, &'r str, i64, f64), String> {
    let text = |i: usize| {
        let field = record.get(order[i]).unwrap_or(b"").trim_ascii();
        std::str::from_utf8(field).map_err(|_| format!("{} is not valid UTF-8", COLUMNS[i]))
    };
    let (workload, metric) = (text(0)?, text(1)?);
    let ts = text(2)?;
    let timestamp_ms: i64 = ts
        .parse()
        .map_err(|_| format!("timestamp_ms {ts:?} is not an integer (milliseconds)"))?;
    let v = text(3)?;
    let value: f64 = v
        .parse()
        .map_err(|_| format!("value {v:?} is not a number"))?;
    if let Some(reason) = check_sample(workload, metric, value) {
        return Err(reason.to_owned());
    }
    Ok((workload, metric, timestamp_ms, value))
}

/// Map canonical column index → position in the file's records.
fn parse_header(record: &csv::ByteRecord) -> Result<[usize; 4], String> {
    let expected = COLUMNS.join(",");
    let names: Vec<String> = record
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let f = String::from_utf8_lossy(f.trim_ascii());
            let f = if i == 0 {
                f.trim_start_matches('\u{feff}')
            } else {
                &f
            };
            f.to_owned()
        })
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    if !names.iter().any(|n| COLUMNS.contains(n)) {
        return Err(format!(
            "missing header: expected {expected}, found {:?}",
            names.join(",")
        ));
    }
    let mut order = [usize::MAX; 4];
    for (pos, name) in names.iter().enumerate() {
        match COLUMNS.iter().position(|c| c == name) {
            None => return Err(format!("unknown column {name:?} (expected {expected})")),
            Some(i) if order[i] != usize::MAX => {
                return Err(format!("duplicate column {name:?}"));
            }
            Some(i) => order[i] = pos,
        }
    }
    if let Some(i) = order.iter().position(|&p| p == usize::MAX) {
        return Err(format!(
            "missing column {:?} (expected {expected})",
            COLUMNS[i]
        ));
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SampleSet, SelectError> {
        let mut set = SampleSet::new();
        read_csv(text.as_bytes(), Path::new("in.csv"), &mut set, |_| {})?;
        Ok(set)
    }

    fn line_of(text: &str) -> (u64, String) {
        match parse(text) {
            Err(SelectError::Csv {
                file,
                line,
                message,
            }) => {
                assert_eq!(file, Path::new("in.csv"));
                (line, message)
            }
            other => panic!("expected a CSV error, got {other:?}"),
        }
    }

    #[test]
    fn reads_columns_in_any_order() {
        let set = parse("value,timestamp_ms,metric,workload\n1.5,10,m,w\n2.5,20,m,w\n").unwrap();
        assert_eq!(set.rows(), 2);
        assert_eq!(set.series(0, 0).unwrap().values, vec![1.5, 2.5]);
    }

    #[test]
    fn error_lines_point_at_the_record() {
        let ok = "workload,metric,timestamp_ms,value\nw,m,1,1\n";
        assert_eq!(line_of(&format!("{ok}w,m,2,abc\n")).0, 3);
        assert_eq!(line_of(&format!("{ok}w,m,2,NaN\n")).0, 3);
        assert_eq!(line_of(&format!("{ok}w,m,2.5,1\n")).0, 3);
        assert_eq!(line_of(&format!("{ok}w,m,2\n")).0, 3);
        assert_eq!(line_of("").0, 1);
        // Blank lines, CRLF and a missing final newline do not shift lines.
        assert_eq!(line_of(&format!("{ok}\n\nw,m,2,abc\n")).0, 5);
        assert_eq!(line_of(&format!("{ok}\n\nw,m,2,abc")).0, 5);
        assert_eq!(
            line_of("workload,metric,timestamp_ms,value\r\nw,m,1,1\r\n\r\nw,m,2,x\r\n").0,
            4
        );
        assert_eq!(line_of("\n\nw,m,1,1\n").0, 3);
        assert_eq!(line_of("w,m,1,1\n").0, 1);
        assert!(line_of("workload,metric,timestamp_ms,value,extra\n")
            .1
            .contains("unknown column"));
        assert!(line_of("workload,metric,value\n")
            .1
            .contains("missing column \"timestamp_ms\""));
    }
}
