//! Where log lines go and in which form: `FLOPWATCH_LOG` filters them (a
//! tracing filter), `FLOPWATCH_LOG_FORMAT` picks `text` (the default) or
//! `json` (one object per line, for log shippers).

use tracing_subscriber::EnvFilter;

/// The form of log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Json,
}

impl Format {
    /// `FLOPWATCH_LOG_FORMAT`'s value; unset or empty is `text`.
    pub(crate) fn parse(value: Option<&str>) -> anyhow::Result<Self> {
        match value.map(str::trim) {
            None | Some("") | Some("text") => Ok(Format::Text),
            Some("json") => Ok(Format::Json),
            Some(other) => {
                anyhow::bail!("FLOPWATCH_LOG_FORMAT=`{other}`: expected `text` or `json`")
            }
        }
    }

    fn from_env() -> anyhow::Result<Self> {
        Format::parse(std::env::var("FLOPWATCH_LOG_FORMAT").ok().as_deref())
    }
}

fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_env("FLOPWATCH_LOG").unwrap_or_else(|_| EnvFilter::new(default))
}

/// Logs to stderr at `default` level unless `FLOPWATCH_LOG` says otherwise.
pub(crate) fn to_stderr(default: &str) -> anyhow::Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(default))
        .with_writer(std::io::stderr);
    match Format::from_env()? {
        Format::Text => builder.init(),
        Format::Json => builder.json().init(),
    }
    Ok(())
}

/// Logs to `file` (appended, no colour codes), for commands whose stdout
/// is a live view that stray lines on the terminal would tear.
#[cfg(all(feature = "agent", feature = "collector"))]
pub(crate) fn to_file(default: &str, file: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .with_context(|| format!("log file {}", file.display()))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(default))
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(f));
    match Format::from_env()? {
        Format::Text => builder.init(),
        Format::Json => builder.json().init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_unknown_ones_are_named() {
        assert_eq!(Format::parse(None).unwrap(), Format::Text);
        assert_eq!(Format::parse(Some("")).unwrap(), Format::Text);
        assert_eq!(Format::parse(Some("text")).unwrap(), Format::Text);
        assert_eq!(Format::parse(Some("json")).unwrap(), Format::Json);
        let e = Format::parse(Some("yaml")).unwrap_err().to_string();
        assert!(
            e.contains("FLOPWATCH_LOG_FORMAT") && e.contains("yaml"),
            "{e}"
        );
    }
}
