//! `/metrics` over HTTP for the agent and the collector: a
//! [`prometheus_client`] registry rendered on each scrape, in the
//! OpenMetrics text format when the scraper asks for it (Prometheus does)
//! and in the Prometheus text format 0.0.4 otherwise (curl, promtool, older
//! scrapers), as client_golang negotiates. A process with [`Probes`] also
//! answers `/healthz` (liveness) and `/readyz` (readiness) there: 200 `ok`,
//! or 503 with the reason.
//!
//! What a scrape sees may depend on its bearer token ([`serve_with`]: the
//! collector shows each tenant only its own series), and the page may be
//! served over TLS ([`tls_config`]).

use axum::http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;

/// The OpenMetrics text content type Prometheus negotiates.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Prometheus text format's content type.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Rewrites OpenMetrics text as Prometheus text 0.0.4: a counter family's
/// `# HELP`/`# TYPE` name gains the `_total` its samples carry (not when
/// they carry the bare family name, as dcgm-exporter's counters do), the
/// OpenMetrics type `unknown` is called `untyped`, and the OpenMetrics-only
/// `# UNIT` and `# EOF` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let samples: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name)
                    && !name.ends_with("_total")
                    && !samples.contains(name)
                {
                    "_total"
                } else {
                    ""
                };
                let tail = if p == "# TYPE " && tail == "unknown" {
                    "untyped"
                } else {
                    tail
                };
                out.push_str(&format!("{p}{name}{suffix} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Renders `registry` as OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Encoding into a String cannot fail for lack of space; an error here
    // would be a collector's own bug, reported as a comment.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        out = format!("# encoding failed: {e}\n# EOF\n");
    }
    out
}

/// Where [`Probes::live`] is served.
pub const LIVENESS_PATH: &str = "/healthz";

/// Where [`Probes::ready`] is served.
pub const READINESS_PATH: &str = "/readyz";

/// Liveness and readiness of the process serving `/metrics`.
pub trait Probes: Send + Sync + 'static {
    /// `Err(why)` when the process is stuck and should be restarted.
    fn live(&self) -> Result<(), String>;
    /// `Err(why)` while the process cannot do its work yet.
    fn ready(&self) -> Result<(), String>;
}

/// 200 `ok`, or 503 with the reason.
fn probe_answer(r: Result<(), String>) -> axum::response::Response {
    match r {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{why}\n"),
        )
            .into_response(),
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves: the
/// same page for every scraper.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_probes(listener, registry, None, shutdown).await
}

/// [`serve`], and `GET /healthz` and `/readyz` answered by `probes`.
pub async fn serve_with_probes(
    listener: TcpListener,
    registry: Arc<Registry>,
    probes: Option<Arc<dyn Probes>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let page: Arc<PageFn> = Arc::new(move |_: &Scrape<'_>| Some(render(&registry)));
    serve_page(listener, None, page, probes, shutdown).await
}

/// What a scrape presented and asked for.
#[derive(Debug, Clone, Copy)]
pub struct Scrape<'a> {
    /// Its bearer token (`Some("")` for an `authorization` header that
    /// holds none).
    pub token: Option<&'a str>,
    /// The URL's query parameters, decoded, in order (e.g. Prometheus'
    /// `params` of a scrape job).
    pub params: &'a [(String, String)],
}

impl Scrape<'_> {
    /// The values of parameter `name`.
    pub fn param<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s str> + 's {
        self.params
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Renders the page (OpenMetrics text) for a scrape, or `None` to refuse
/// it (401).
pub type PageFn = dyn Fn(&Scrape<'_>) -> Option<String> + Send + Sync;

/// The bearer token of an `authorization` header value: `Some("")` for a
/// header that is there but is no bearer token, so that a malformed
/// credential is refused rather than taken for none.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?;
    let t = v
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    Some(t.to_string())
}

/// Serves `GET /metrics` on `listener`, over TLS when `tls` is given, until
/// `shutdown` resolves; `page` decides what each scrape sees from its
/// bearer token.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<MetricsTls>,
    page: Arc<PageFn>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_page(listener, tls, page, None, shutdown).await
}

/// `/metrics` from `page`, the probes when given, over TLS when given.
async fn serve_page(
    listener: TcpListener,
    tls: Option<MetricsTls>,
    page: Arc<PageFn>,
    probes: Option<Arc<dyn Probes>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut app = axum::Router::new()
        .route(
            "/metrics",
            get(
                move |headers: axum::http::HeaderMap, query: axum::extract::RawQuery| {
                    let page = page.clone();
                    async move {
                        let params: Vec<(String, String)> = query
                            .0
                            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                            .unwrap_or_default();
                        let openmetrics = headers
                            .get(axum::http::header::ACCEPT)
                            .and_then(|v| v.to_str().ok())
                            .is_some_and(|a| a.contains("application/openmetrics-text"));
                        let token = bearer(&headers);
                        let scrape = Scrape {
                            token: token.as_deref(),
                            params: &params,
                        };
                        let Some(text) = page(&scrape) else {
                            return (
                                StatusCode::UNAUTHORIZED,
                                [(WWW_AUTHENTICATE, "Bearer")],
                                "missing or invalid credentials\n",
                            )
                                .into_response();
                        };
                        if openmetrics {
                            ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], text).into_response()
                        } else {
                            (
                                [(CONTENT_TYPE, CONTENT_TYPE_TEXT)],
                                to_prometheus_text(&text),
                            )
                                .into_response()
                        }
                    }
                },
            ),
        )
        .route(
            "/",
            get(|| async { "flopwatch: see /metrics\n".into_response() }),
        );
    if let Some(p) = probes {
        let r = p.clone();
        app = app
            .route(
                LIVENESS_PATH,
                get(move || async move { probe_answer(p.live()) }),
            )
            .route(
                READINESS_PATH,
                get(move || async move { probe_answer(r.ready()) }),
            );
    }
    serve_router(listener, tls, app, shutdown).await
}

/// Serves any axum `app` on `listener`, over TLS when `tls` is given (each
/// handshake in its own task, bounded by a timeout), until `shutdown`
/// resolves: the one way the collector's HTTP listeners (`/metrics`, the
/// Prometheus query API) are served.
pub async fn serve_router(
    listener: TcpListener,
    tls: Option<MetricsTls>,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(cfg) => {
            axum::serve(TlsListener::new(listener, cfg), app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

/// TLS of a `/metrics` listener.
pub type MetricsTls = Arc<ServerConfig>;

/// Longest a TLS handshake on the metrics port may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes waiting to be served; past this, new connections wait in
/// the kernel's accept queue.
const HANDSHAKES_QUEUED: usize = 64;

/// The server side of TLS for `/metrics` from PEM files (as read by
/// [`crate::channel::read_certs`] and [`crate::channel::read_key`]).
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<MetricsTls, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("no usable PEM private key: {e}"))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not fit: {e}"))?;
    Ok(Arc::new(cfg))
}

/// A listener handing axum connections whose TLS handshake is done. Each
/// handshake runs in its own task, so a client that stalls its handshake
/// holds up no one else's scrape.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: std::io::Result<SocketAddr>,
    accept: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    fn new(listener: TcpListener, cfg: Arc<ServerConfig>) -> Self {
        let addr = listener.local_addr();
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let (tx, rx) = tokio::sync::mpsc::channel(HANDSHAKES_QUEUED);
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(_) => {
                        // Out of descriptors and the like: wait, as axum does.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                    {
                        let _ = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        Self { rx, addr, accept }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task is gone only when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.addr
            .as_ref()
            .copied()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_in_their_help_and_type_and_eof_goes() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total 3\n\
                  # HELP b Bytes.\n# TYPE b gauge\n# UNIT b bytes\nb{x=\"1\"} 2.5\n\
                  # HELP C_X A counter under a foreign name.\n# TYPE C_X unknown\nC_X 7\n\
                  # HELP D_X A counter under its bare name.\n# TYPE D_X counter\nD_X{g=\"0\"} 9\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total 3\n\
             # HELP b Bytes.\n# TYPE b gauge\nb{x=\"1\"} 2.5\n\
             # HELP C_X A counter under a foreign name.\n# TYPE C_X untyped\nC_X 7\n\
             # HELP D_X A counter under its bare name.\n# TYPE D_X counter\nD_X{g=\"0\"} 9\n"
        );
    }
}
