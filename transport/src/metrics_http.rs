//! `/metrics` over HTTP for the agent and the collector: a
//! [`prometheus_client`] registry rendered on each scrape, in the
//! OpenMetrics text format when the scraper asks for it (Prometheus does)
//! and in the Prometheus text format 0.0.4 otherwise (curl, promtool, older
//! scrapers), as client_golang negotiates. A process with [`Probes`] also
//! answers `/healthz` (liveness) and `/readyz` (readiness) there: 200 `ok`,
//! or 503 with the reason.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The OpenMetrics text content type Prometheus negotiates.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Prometheus text format's content type.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Rewrites OpenMetrics text as Prometheus text 0.0.4: a counter family's
/// `# HELP`/`# TYPE` name gains the `_total` its samples carry, and the
/// OpenMetrics-only `# UNIT` and `# EOF` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
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
                let suffix = if counters.contains(name) && !name.ends_with("_total") {
                    "_total"
                } else {
                    ""
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

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
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
    let mut app = axum::Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let registry = registry.clone();
                async move {
                    let openmetrics = headers
                        .get(axum::http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|a| a.contains("application/openmetrics-text"));
                    let text = render(&registry);
                    if openmetrics {
                        ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], text)
                    } else {
                        (
                            [(CONTENT_TYPE, CONTENT_TYPE_TEXT)],
                            to_prometheus_text(&text),
                        )
                    }
                }
            }),
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
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_in_their_help_and_type_and_eof_goes() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total 3\n\
                  # HELP b Bytes.\n# TYPE b gauge\n# UNIT b bytes\nb{x=\"1\"} 2.5\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total 3\n\
             # HELP b Bytes.\n# TYPE b gauge\nb{x=\"1\"} 2.5\n"
        );
    }
}
