//! Terminal rendering helpers: bars, and tables whose columns are as wide
//! as their widest cell (job ids such as `namespace/pod-name-7f9c` would
//! overflow any fixed width and shift every column after them).

/// A bar of `width` cells for a fraction 0..=1.
pub(crate) fn bar(frac: f64, width: usize) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let cells = f * width as f64;
    let full = cells.floor() as usize;
    let partial = ((cells - full as f64) * 8.0).round() as usize;
    let blocks = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let mut s = "█".repeat(full);
    if full < width {
        s.push(blocks[partial.min(8)]);
        s.push_str(&" ".repeat(width - full - 1));
    }
    s
}

/// How a column's cells sit in its width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    /// Text: names, ids.
    Left,
    /// Numbers.
    Right,
}

/// A table with a header row; columns are separated by two spaces.
pub(crate) struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and alignments.
    pub(crate) fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            header: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub(crate) fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as lines, each ending in a newline, without trailing
    /// spaces.
    pub(crate) fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.header.iter().map(|h| width(h)).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(width(c));
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(c));
                match self.align[i] {
                    Align::Left => {
                        line.push_str(c);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(c);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Prints the table to stdout.
    pub(crate) fn print(&self) {
        print!("{}", self.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_have_fixed_width() {
        for f in [0.0, 0.013, 0.5, 0.999, 1.0, 2.0, f64::NAN] {
            assert_eq!(bar(f, 20).chars().count(), 20, "{f}");
        }
        assert_eq!(bar(0.5, 4), "██  ");
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&[
            ("JOB", Align::Left),
            ("OFU%", Align::Right),
            ("FLAGS", Align::Left),
        ]);
        t.row(vec!["a".into(), "1.0".into(), "straggler×1".into()]);
        let long = "research-namespace/llm-pretrain-worker-7f9c4d";
        t.row(vec![long.into(), "42.5".into(), String::new()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // The second column starts at the same character in every row,
        // right after the longest job id.
        let col = long.chars().count() + 2;
        for l in &lines {
            let c: Vec<char> = l.chars().collect();
            assert_eq!(c[col - 1], ' ', "{text}");
            assert_ne!(c[col + 3], ' ', "{l:?} in\n{text}");
        }
        assert!(lines[0].starts_with(&format!("JOB{}  OFU%", " ".repeat(col - 5))));
        assert!(lines[1].contains("   1.0  straggler×1"), "{text}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{text}");
    }
}
