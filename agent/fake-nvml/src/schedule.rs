//! A load schedule that GPU 0 follows (`schedule=PATH`, [`crate::config`]).
//!
//! A load generator on a machine without a GPU (the dry run of
//! `deploy/gpu/validate.sh`) appends a line `UNIX_MS TENSOR_ACTIVE` each
//! time it starts or ends a phase. The fake re-reads the file when its size
//! changes and GPU 0's workload becomes those steps
//! ([`flopwatch_sim::Workload::Steps`]): the agent then reads, through the
//! real NVML path, a GPU that is busy exactly while the load runs, so a
//! script's phase windows and queries can be checked end to end.
//!
//! Only whole lines count: a line still being written (no newline yet) is
//! read on a later call. Blank lines and `#` comments are skipped; a line
//! that does not parse is skipped and reported once on stderr, as the fake
//! reports a bad `FLOPWATCH_FAKE_NVML`.

use std::path::PathBuf;

/// The schedule file and what was last read from it.
#[derive(Debug)]
pub(crate) struct Schedule {
    path: PathBuf,
    /// File size at the last read (`None`: never read).
    seen_len: Option<u64>,
    /// Steps of whole lines, unix ms, in time order.
    steps: Vec<(i64, f64)>,
    /// Lines already reported as unreadable.
    warned: usize,
}

impl Schedule {
    /// Follows `path` (which may not exist yet: idle until it does).
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            seen_len: None,
            steps: Vec::new(),
            warned: 0,
        }
    }

    /// Re-reads the file when its size changed; the steps when they did.
    pub(crate) fn refresh(&mut self) -> Option<&[(i64, f64)]> {
        let len = std::fs::metadata(&self.path).map(|m| m.len()).ok();
        if len == self.seen_len {
            return None;
        }
        let text = match len {
            Some(_) => std::fs::read_to_string(&self.path).ok()?,
            None => String::new(),
        };
        // A partial last line is left for later: remember a size that
        // differs from the file's, so the next call reads again.
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        self.seen_len = if whole.len() == text.len() {
            len
        } else {
            Some(whole.len() as u64)
        };
        let (steps, bad) = parse(whole);
        for line in bad.iter().skip(self.warned) {
            eprintln!(
                "fake libnvidia-ml: schedule {}: skipping `{line}` (expected `UNIX_MS TENSOR_ACTIVE`)",
                self.path.display()
            );
        }
        self.warned = self.warned.max(bad.len());
        if steps == self.steps {
            return None;
        }
        self.steps = steps;
        Some(&self.steps)
    }
}

/// Steps (sorted by time, stable) and the lines that do not parse.
pub(crate) fn parse(text: &str) -> (Vec<(i64, f64)>, Vec<String>) {
    let mut steps = Vec::new();
    let mut bad = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let step = match (parts.next(), parts.next(), parts.next()) {
            (Some(t), Some(v), None) => t
                .parse::<i64>()
                .ok()
                .zip(v.parse::<f64>().ok())
                .filter(|(_, v)| (0.0..=1.0).contains(v)),
            _ => None,
        };
        match step {
            Some(s) => steps.push(s),
            None => bad.push(line.to_string()),
        }
    }
    steps.sort_by_key(|&(t, _)| t);
    (steps, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_steps_and_reports_bad_lines() {
        let (steps, bad) = parse("# phases\n2000 0.5\n1000 0.75\n\n3000 0\n3000 2\nx 1\n4000\n");
        assert_eq!(steps, vec![(1000, 0.75), (2000, 0.5), (3000, 0.0)]);
        assert_eq!(bad, vec!["3000 2", "x 1", "4000"]);
    }

    #[test]
    fn reads_whole_lines_as_the_file_grows() {
        let path = std::env::temp_dir().join(format!(
            "flopwatch-fake-nvml-schedule-{}.txt",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let mut s = Schedule::new(path.clone());
        assert_eq!(s.refresh(), None, "no file: idle, nothing new");
        std::fs::write(&path, "1000 0.5\n2000 0.2").unwrap();
        assert_eq!(s.refresh(), Some(&[(1000, 0.5)][..]), "partial line left");
        assert_eq!(s.refresh(), None);
        std::fs::write(&path, "1000 0.5\n2000 0.25\n").unwrap();
        assert_eq!(s.refresh(), Some(&[(1000, 0.5), (2000, 0.25)][..]));
        assert_eq!(s.refresh(), None, "unchanged size: not read again");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(s.refresh(), Some(&[][..]), "file gone: idle");
    }
}
