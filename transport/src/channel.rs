//! gRPC channels to collectors, plain (`http://`) or TLS (`https://`,
//! rustls), with an optional client certificate (mTLS). Shared by the
//! agent, the command-line clients and collectors talking to their peers.
//!
//! TLS files are read and parsed here, so a bad file is reported with its
//! config key and path rather than as a failed handshake later.

use flopwatch_config::ClientTls;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("key `{key}`: {}: {message}", path.display())]
pub struct TlsFileError {
    /// Dotted config key (or flag).
    pub key: String,
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// A channel that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// A TLS file.
    #[error(transparent)]
    File(#[from] TlsFileError),
    /// The URL.
    #[error("collector URL `{url}`: {message}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads `path` (relative to `base`) as PEM certificates: at least one.
pub fn read_certs(key: &str, base: &Path, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let path = base.join(path);
    let err = |message: String| TlsFileError {
        key: key.into(),
        path: path.clone(),
        message,
    };
    let pem = std::fs::read(&path).map_err(|e| err(e.to_string()))?;
    let certs: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| err(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(err(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".into(),
        ));
    }
    Ok(pem)
}

/// Reads `path` (relative to `base`) as one PEM private key (PKCS#8,
/// PKCS#1 or SEC1).
pub fn read_key(key: &str, base: &Path, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let path = base.join(path);
    let err = |message: String| TlsFileError {
        key: key.into(),
        path: path.clone(),
        message,
    };
    let pem = std::fs::read(&path).map_err(|e| err(e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| err(format!("no usable PEM private key: {e}")))?;
    Ok(pem)
}

/// Client TLS, loaded once: the parsed form of a [`ClientTls`] section.
#[derive(Debug, Clone, Default)]
pub struct TlsClient {
    config: Option<ClientTlsConfig>,
}

impl TlsClient {
    /// Loads `tls`, paths relative to `base` (the config file's directory);
    /// `section` names the keys in errors (`tls`, `peer_tls`; empty for
    /// command-line flags, named `--ca`, `--cert`, `--key`).
    pub fn load(tls: &ClientTls, base: &Path, section: &str) -> Result<Self, TlsFileError> {
        let key = |name: &str| {
            if section.is_empty() {
                format!("--{name}")
            } else {
                format!("{section}.{name}")
            }
        };
        let mut cfg = ClientTlsConfig::new();
        cfg = match &tls.ca {
            Some(ca) => {
                cfg.ca_certificate(Certificate::from_pem(read_certs(&key("ca"), base, ca)?))
            }
            None => cfg.with_native_roots(),
        };
        if let (Some(c), Some(k)) = (&tls.cert, &tls.key) {
            cfg = cfg.identity(Identity::from_pem(
                read_certs(&key("cert"), base, c)?,
                read_key(&key("key"), base, k)?,
            ));
        }
        if let Some(d) = &tls.domain {
            cfg = cfg.domain_name(d.clone());
        }
        Ok(TlsClient { config: Some(cfg) })
    }

    /// An endpoint for `url`: TLS for `https://`, plain for `http://`.
    /// Connect and keepalive settings are the caller's.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, ChannelError> {
        let bad = |message: String| ChannelError::Url {
            url: url.to_string(),
            message,
        };
        let ep = Endpoint::from_shared(url.to_string()).map_err(|e| bad(e.to_string()))?;
        if url.starts_with("https://") {
            let cfg = self
                .config
                .clone()
                .unwrap_or_else(|| ClientTlsConfig::new().with_native_roots());
            ep.tls_config(cfg).map_err(|e| bad(e.to_string()))
        } else if url.starts_with("http://") {
            Ok(ep)
        } else {
            Err(bad("must start with http:// or https://".into()))
        }
    }

    /// [`Self::endpoint`] with the settings every flopwatch client uses: a
    /// 3 s connect timeout, no Nagle delay.
    pub fn client_endpoint(&self, url: &str) -> Result<Endpoint, ChannelError> {
        Ok(self
            .endpoint(url)?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true))
    }
}
