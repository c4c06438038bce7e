use std::path::PathBuf;

/// Why a configuration could not be used. Always names the file; names the
/// key whenever one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// File.
        file: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// TOML syntax or type error (the message carries line, column and key).
    #[error("{file}: {message}")]
    Parse {
        /// File.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A value parsed but is not acceptable.
    #[error("{file}: key `{key}`: {message}")]
    Invalid {
        /// File.
        file: PathBuf,
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment override could not be applied.
    #[error("environment variable {var}: {message}")]
    Env {
        /// Variable name.
        var: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// An `Invalid` error for `key`, with no file yet (filled in by the
    /// loader).
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: PathBuf::new(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn with_file(self, path: &std::path::Path) -> Self {
        match self {
            ConfigError::Invalid { key, message, .. } => ConfigError::Invalid {
                file: path.to_path_buf(),
                key,
                message,
            },
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                file: path.to_path_buf(),
                message,
            },
            other => other,
        }
    }
}
