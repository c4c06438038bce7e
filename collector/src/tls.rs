//! The gRPC port's TLS from `[tls]` (rustls through tonic): the
//! collector's certificate and, with `client_ca`, verified client
//! certificates (mTLS), optional or required. Files are read and parsed
//! before serving, so a bad one stops the collector naming its key and path.

use flopwatch_config::ServerTls;
use flopwatch_transport::channel::{read_certs, read_key, TlsFileError};
use std::path::Path;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Longest a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// tonic's server TLS config for `[tls]`; paths relative to `base` (the
/// config file's directory).
pub fn server_config(tls: &ServerTls, base: &Path) -> Result<ServerTlsConfig, TlsFileError> {
    let cert = read_certs("tls.cert", base, &tls.cert)?;
    let key = read_key("tls.key", base, &tls.key)?;
    let mut cfg = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = &tls.client_ca {
        let ca = read_certs("tls.client_ca", base, ca)?;
        cfg = cfg
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!tls.require_client_cert);
    }
    Ok(cfg)
}

/// The `/metrics` listener's TLS from `[exporter.tls]` (certificate and
/// key; scrapes authenticate with bearer tokens, not certificates).
pub fn metrics_config(
    tls: &ServerTls,
    base: &Path,
) -> Result<flopwatch_transport::metrics_http::MetricsTls, TlsFileError> {
    http_config(tls, base, "exporter.tls")
}

/// The Prometheus API listener's TLS from `[prometheus_api.tls]`
/// (certificate and key; requests authenticate with bearer tokens).
pub fn api_config(
    tls: &ServerTls,
    base: &Path,
) -> Result<flopwatch_transport::metrics_http::MetricsTls, TlsFileError> {
    http_config(tls, base, "prometheus_api.tls")
}

/// An HTTP listener's TLS from the section named `key`.
fn http_config(
    tls: &ServerTls,
    base: &Path,
    key: &str,
) -> Result<flopwatch_transport::metrics_http::MetricsTls, TlsFileError> {
    let cert = read_certs(&format!("{key}.cert"), base, &tls.cert)?;
    let key_pem = read_key(&format!("{key}.key"), base, &tls.key)?;
    flopwatch_transport::metrics_http::tls_config(&cert, &key_pem).map_err(|message| TlsFileError {
        key: key.into(),
        path: base.join(&tls.cert),
        message,
    })
}
