//! The Prometheus text exposition format, as dcgm-exporter writes it.

/// One sample line of a Prometheus text page.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels, in page order, values unescaped.
    pub labels: Vec<(String, String)>,
    /// Value (`NaN` and `±Inf` included).
    pub value: f64,
    /// Timestamp, unix ms, when the line has one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first non-empty value among labels `names`.
    pub(super) fn first_label(&self, names: &[&str]) -> Option<&str> {
        names
            .iter()
            .filter_map(|n| self.label(n))
            .find(|v| !v.is_empty())
    }
}

/// A malformed line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a page of the Prometheus text exposition format (0.0.4): blank
/// lines and `#` lines (`# HELP`, `# TYPE`, anything else) are skipped;
/// every other line is `name[{label="value",...}] value [timestamp]`, with
/// `\\`, `\"` and `\n` escapes in label values. The first malformed line is
/// the error.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let sample = parse_line(trimmed).map_err(|message| ParseError {
            line: i + 1,
            message,
        })?;
        out.push(sample);
    }
    Ok(out)
}

/// A cursor over one line; `pos` is always on a char boundary.
pub(super) struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.pos..)?.chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.pos += 1;
        }
        self.pos > start
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if !f(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        self.s.get(start..self.pos).unwrap_or_default()
    }

    fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or_default()
    }
}

pub(super) fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Shortens `s` for an error message.
pub(super) fn excerpt(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", s.get(..i).unwrap_or_default()),
        None => s.to_string(),
    }
}

pub(super) fn parse_line(line: &str) -> Result<Sample, String> {
    let mut c = Cursor { s: line, pos: 0 };
    if !c.peek().is_some_and(is_name_start) {
        return Err(format!("expected a metric name at `{}`", excerpt(line)));
    }
    let name = c.take_while(is_name_char).to_string();
    c.skip_ws();
    let mut labels = Vec::new();
    if c.eat('{') {
        loop {
            c.skip_ws();
            if c.eat('}') {
                break;
            }
            if !c
                .peek()
                .is_some_and(|ch| ch.is_ascii_alphabetic() || ch == '_')
            {
                return Err(format!(
                    "expected a label name or `}}` at `{}`",
                    excerpt(c.rest())
                ));
            }
            let key = c
                .take_while(|ch| ch.is_ascii_alphanumeric() || ch == '_')
                .to_string();
            c.skip_ws();
            if !c.eat('=') {
                return Err(format!("expected `=` after label `{key}`"));
            }
            c.skip_ws();
            if !c.eat('"') {
                return Err(format!("label `{key}`: expected a quoted value"));
            }
            let mut value = String::new();
            loop {
                match c.bump() {
                    None => return Err(format!("label `{key}`: unterminated value")),
                    Some('"') => break,
                    Some('\\') => match c.bump() {
                        Some('n') => value.push('\n'),
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some(other) => {
                            value.push('\\');
                            value.push(other);
                        }
                        None => return Err(format!("label `{key}`: unterminated value")),
                    },
                    Some(ch) => value.push(ch),
                }
            }
            labels.push((key, value));
            c.skip_ws();
            if c.eat(',') {
                continue;
            }
            if c.eat('}') {
                break;
            }
            return Err(format!(
                "expected `,` or `}}` after a label at `{}`",
                excerpt(c.rest())
            ));
        }
        c.skip_ws();
    }
    let raw = c.take_while(|ch| ch != ' ' && ch != '\t');
    if raw.is_empty() {
        return Err(format!("`{name}` has no value"));
    }
    let value =
        parse_value(raw).ok_or_else(|| format!("value `{}` is not a number", excerpt(raw)))?;
    c.skip_ws();
    let ts = c.take_while(|ch| ch != ' ' && ch != '\t');
    let timestamp_ms = if ts.is_empty() {
        None
    } else {
        Some(
            ts.parse::<i64>()
                .map_err(|_| format!("timestamp `{}` is not an integer", excerpt(ts)))?,
        )
    };
    c.skip_ws();
    if !c.rest().is_empty() {
        return Err(format!(
            "unexpected `{}` after the value",
            excerpt(c.rest())
        ));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// A sample value: a float, `NaN`, `+Inf` or `-Inf`.
pub(super) fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}
