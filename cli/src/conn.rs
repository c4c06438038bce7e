//! How the command-line clients (`query`, `top`) reach a collector: URL,
//! bearer token and TLS flags, shared so every client takes the same ones.

use anyhow::Context;
use flopwatch_config::ClientTls;
use flopwatch_proto::v1::query_client::QueryClient;
use flopwatch_transport::channel::TlsClient;
use std::path::PathBuf;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Connection flags of a client command.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct ConnArgs {
    /// Collector URL: http://HOST:PORT, or https://HOST:PORT for a collector
    /// serving TLS.
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:7070",
        env = "FLOPWATCH_COLLECTOR"
    )]
    pub collector: String,
    /// Bearer token for the collector (a tenant's query token or a
    /// provider token).
    /// A token given here shows in `ps` and the shell's history: prefer
    /// --token-file.
    #[arg(long, global = true, env = "FLOPWATCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (surrounding whitespace trimmed), e.g.
    /// a Kubernetes Secret mount.
    #[arg(
        long,
        global = true,
        env = "FLOPWATCH_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// CA bundle (PEM) the collector's certificate must chain to (https);
    /// default: the system's trust store.
    #[arg(long, global = true, env = "FLOPWATCH_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for collectors that require one.
    #[arg(long, global = true, env = "FLOPWATCH_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, global = true, env = "FLOPWATCH_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Name expected in the collector's certificate, when it differs from
    /// the URL's host (e.g. connecting by IP address).
    #[arg(long, global = true, env = "FLOPWATCH_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
}

/// Sends `authorization: Bearer <token>` on every call.
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// For `token` (none: no header).
    pub(crate) fn new(token: Option<&str>) -> anyhow::Result<Self> {
        let header = token
            .map(|t| MetadataValue::try_from(format!("Bearer {t}")))
            .transpose()
            .map_err(|_| anyhow::anyhow!("token is not valid header text"))?;
        Ok(Bearer(header))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.0 {
            r.metadata_mut().insert("authorization", h.clone());
        }
        Ok(r)
    }
}

/// A Query client with its bearer token.
pub(crate) type Client = QueryClient<InterceptedService<Channel, Bearer>>;

impl ConnArgs {
    /// Flags for a plaintext collector at `url` without credentials (the
    /// demo).
    #[cfg(all(feature = "agent", feature = "collector"))]
    pub(crate) fn plain(url: &str) -> Self {
        ConnArgs {
            collector: url.to_string(),
            token: None,
            token_file: None,
            ca: None,
            cert: None,
            key: None,
            tls_domain: None,
        }
    }

    /// The bearer token: --token, or the contents of --token-file.
    fn token(&self) -> anyhow::Result<Option<String>> {
        match (&self.token, &self.token_file) {
            (Some(t), _) => Ok(Some(t.clone())),
            (None, Some(f)) => {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("--token-file {}", f.display()))?;
                let t = text.trim();
                if t.is_empty() {
                    anyhow::bail!("--token-file {}: the file is empty", f.display());
                }
                Ok(Some(t.to_string()))
            }
            (None, None) => Ok(None),
        }
    }

    fn tls(&self) -> anyhow::Result<TlsClient> {
        let cfg = ClientTls {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            domain: self.tls_domain.clone(),
        };
        Ok(TlsClient::load(&cfg, std::path::Path::new(""), "")?)
    }

    /// A client connected now.
    pub(crate) async fn connect(&self) -> anyhow::Result<Client> {
        let url = &self.collector;
        // A missing token file is told before a collector that is not there.
        let bearer = Bearer::new(self.token()?.as_deref())?;
        let channel = self
            .tls()?
            .client_endpoint(url)?
            .connect()
            .await
            .with_context(|| format!("connecting to {url}"))?;
        Ok(QueryClient::with_interceptor(channel, bearer))
    }

    /// A client that connects on first use and reconnects by itself, every
    /// call bounded by `timeout`.
    #[cfg(feature = "tui")]
    pub(crate) fn lazy(&self, timeout: std::time::Duration) -> anyhow::Result<Client> {
        let endpoint = self
            .tls()?
            .endpoint(&self.collector)?
            .connect_timeout(timeout)
            .timeout(timeout);
        Ok(QueryClient::with_interceptor(
            endpoint.connect_lazy(),
            Bearer::new(self.token()?.as_deref())?,
        ))
    }
}

/// A failed call's gRPC status as an error: its code and message.
pub(crate) fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", s.code(), s.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "  s3cret\n").unwrap();
        let mut a = ConnArgs::plain("http://127.0.0.1:1");
        a.token_file = Some(f);
        assert_eq!(a.token().unwrap().as_deref(), Some("s3cret"));
    }

    #[test]
    fn missing_or_empty_token_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = ConnArgs::plain("http://127.0.0.1:1");
        a.token_file = Some(dir.path().join("nope"));
        let e = format!("{:#}", a.token().unwrap_err());
        assert!(e.contains("--token-file") && e.contains("nope"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        a.token_file = Some(empty);
        let e = format!("{:#}", a.token().unwrap_err());
        assert!(e.contains("empty"), "{e}");
    }
}
