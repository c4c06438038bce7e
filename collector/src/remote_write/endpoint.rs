//! The remote-write endpoint: its HTTP client (rustls; the system's roots
//! or `ca_file`), credentials (re-read from their files for every request)
//! and extra headers; one request per call, classified as the
//! specification asks (retry on a connection error, a 5xx or a 429, after
//! at least its `Retry-After`; drop on any other 4xx).

use super::wire::{self, RawPoint};
use super::{encode_request, metadata, WriteRequest};
use crate::stats::Failure;
use crate::{otlp, remote_write_v2 as v2, CollectorError};
use flopwatch_config::{RemoteWriteConfig, RemoteWriteProtocol};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a request's body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wire {
    V1,
    V2,
    Otlp,
}

/// A request encoded for its wire: CPU work, done off the async threads
/// (the sender's encoding thread).
#[derive(Debug)]
pub(super) struct Encoded {
    wire: Wire,
    body: Result<Vec<u8>, snap::Error>,
    samples: usize,
}

/// `points` as one request's body in `wire`'s format.
pub(super) fn encode(wire: Wire, points: &[RawPoint<'_>]) -> Encoded {
    let body = match wire {
        Wire::V1 => snap::raw::Encoder::new().compress_vec(&wire::request_v1(points)),
        Wire::V2 | Wire::Otlp => {
            // 2.0 and OTLP take the labels as strings: each series'
            // decoded once.
            let mut index: std::collections::HashMap<&[u8], usize> = Default::default();
            let mut owned: Vec<Vec<(String, String)>> = Vec::new();
            let at: Vec<usize> = points
                .iter()
                .map(|p| {
                    *index.entry(p.labels).or_insert_with(|| {
                        owned.push(wire::pairs(p.labels));
                        owned.len() - 1
                    })
                })
                .collect();
            let samples: Vec<v2::Sample<'_>> = points
                .iter()
                .zip(at)
                .map(|(p, i)| v2::Sample {
                    labels: &owned[i],
                    ts_ms: p.ts_ms,
                    value: p.value,
                })
                .collect();
            let meta = metadata();
            if wire == Wire::Otlp {
                Ok(otlp::encode_otlp(&samples, &meta))
            } else {
                v2::encode_v2(&samples, &meta)
            }
        }
    };
    Encoded {
        wire,
        body,
        samples: points.len(),
    }
}

/// A failed send: the endpoint's status and the first line of its answer,
/// or the connection error.
#[derive(Debug)]
pub struct SendError {
    pub(super) reason: Failure,
    /// What happened: the status and the first line of the response body,
    /// or the connection error.
    pub(super) message: String,
    /// The endpoint's `Retry-After` (429, 503): seconds, or an HTTP date.
    pub(super) retry_after: Option<Duration>,
    /// A 2.0 request refused as an unsupported media type (415).
    pub(super) unsupported: bool,
}

impl SendError {
    /// Whether the remote-write specification says to send the request
    /// again (a connection error, a 5xx, a 429), rather than drop it.
    pub fn retried(&self) -> bool {
        self.reason != Failure::ClientError
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "remote write ({}): {}",
            self.reason.label(),
            self.message
        )
    }
}

impl std::error::Error for SendError {}

/// A secret given inline or in a file read for every request (so that a
/// rotated token or password is picked up without a restart).
#[derive(Clone)]
enum Secret {
    Inline(String),
    File { key: &'static str, path: PathBuf },
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Inline(<redacted>)"),
            Secret::File { path, .. } => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl Secret {
    fn new(key: &'static str, inline: &Option<String>, file: &Option<PathBuf>) -> Option<Self> {
        match (inline, file) {
            (Some(s), _) => Some(Secret::Inline(s.clone())),
            (None, Some(p)) => Some(Secret::File {
                key,
                path: p.clone(),
            }),
            (None, None) => None,
        }
    }

    /// The value (a file's content with surrounding whitespace trimmed);
    /// the error names the key and the file.
    fn read(&self) -> Result<String, String> {
        match self {
            Secret::Inline(s) => Ok(s.clone()),
            Secret::File { key, path } => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("remote_write.{key} `{}`: cannot read: {e}", path.display())
                })?;
                let t = text.trim();
                if t.is_empty() {
                    return Err(format!("remote_write.{key} `{}` is empty", path.display()));
                }
                Ok(t.to_string())
            }
        }
    }
}

/// How requests authenticate.
#[derive(Debug, Clone)]
enum Credentials {
    None,
    Bearer(Secret),
    Basic { username: String, password: Secret },
}

/// The endpoint with its HTTP client (rustls; the system's roots or
/// `ca_file`), credentials and extra headers.
#[derive(Debug, Clone)]
pub struct Endpoint {
    client: reqwest::Client,
    pub(super) url: String,
    credentials: Credentials,
    headers: reqwest::header::HeaderMap,
    protocol: RemoteWriteProtocol,
    /// The endpoint answered a 2.0 request with 415: 1.0 from then on.
    v1_only: Arc<AtomicBool>,
}

impl Endpoint {
    /// Builds the client from `[remote_write]` (paths already resolved
    /// against the config file's directory). Reads `ca_file` and checks
    /// that the credential files can be read, so that a bad file stops the
    /// collector at start with an error naming the key and the file.
    pub fn new(cfg: &RemoteWriteConfig) -> Result<Self, CollectorError> {
        let setup = CollectorError::Setup;
        let mut builder = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("flopwatch/", env!("CARGO_PKG_VERSION")));
        if let Some(p) = &cfg.ca_file {
            let what = |m: String| setup(format!("remote_write.ca_file `{}`: {m}", p.display()));
            let pem = std::fs::read(p).map_err(|e| what(format!("cannot read: {e}")))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| what(format!("not a PEM certificate bundle: {e}")))?;
            if certs.is_empty() {
                return Err(what("holds no PEM certificate".into()));
            }
            builder = builder.tls_built_in_root_certs(false);
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if cfg.is_https() {
            builder = builder.https_only(true);
        }
        let client = builder
            .build()
            .map_err(|e| setup(format!("remote_write: cannot build the HTTP client: {e}")))?;
        let credentials = if let Some(t) = Secret::new(
            "bearer_token_file",
            &cfg.bearer_token,
            &cfg.bearer_token_file,
        ) {
            Credentials::Bearer(t)
        } else if let (Some(u), Some(p)) = (
            &cfg.username,
            Secret::new("password_file", &cfg.password, &cfg.password_file),
        ) {
            Credentials::Basic {
                username: u.clone(),
                password: p,
            }
        } else {
            Credentials::None
        };
        match &credentials {
            Credentials::Bearer(s) | Credentials::Basic { password: s, .. } => {
                s.read().map_err(setup)?;
            }
            Credentials::None => {}
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &cfg.headers {
            let bad = |m: String| setup(format!("remote_write.headers.{k}: {m}"));
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| bad(e.to_string()))?;
            let mut value =
                reqwest::header::HeaderValue::from_str(v).map_err(|e| bad(e.to_string()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Self {
            client,
            url: cfg.url.clone(),
            credentials,
            headers,
            protocol: cfg.wire(),
            v1_only: Arc::default(),
        })
    }

    /// The wire the next request goes out in: the configured protocol,
    /// or 1.0 once the endpoint refused 2.0.
    pub(super) fn wire(&self) -> Wire {
        match self.protocol {
            RemoteWriteProtocol::V1 => Wire::V1,
            RemoteWriteProtocol::Otlp => Wire::Otlp,
            RemoteWriteProtocol::V2 if self.v1_only.load(Ordering::Relaxed) => Wire::V1,
            RemoteWriteProtocol::V2 => Wire::V2,
        }
    }

    /// Posts an encoded request. A 2.0 request the endpoint refuses with
    /// 415 (it speaks 1.0 only) fails as `unsupported`, and every later
    /// request is encoded as 1.0 ([`Endpoint::wire`]): the caller encodes
    /// it again and sends it at once.
    pub(super) async fn post_encoded(&self, e: Encoded) -> Result<(), SendError> {
        let r = self.post(e.body, e.wire, e.samples).await;
        if let Err(err) = &r {
            if err.unsupported && !self.v1_only.swap(true, Ordering::Relaxed) {
                tracing::warn!(url = %self.url, "the endpoint does not take remote write 2.0 (415): sending 1.0");
            }
        }
        r
    }

    /// Sends `points` as one request in the configured protocol (again as
    /// 1.0 if the endpoint refused 2.0).
    #[cfg(test)]
    pub(super) async fn send(&self, points: &[RawPoint<'_>]) -> Result<(), SendError> {
        match self.post_encoded(encode(self.wire(), points)).await {
            Err(e) if e.unsupported => self.post_encoded(encode(self.wire(), points)).await,
            r => r,
        }
    }

    /// [`Endpoint::send`] of points built in a test.
    #[cfg(test)]
    pub(super) async fn send_points(&self, points: &[super::Point]) -> Result<(), SendError> {
        let body = super::encode_points(points);
        let mut raw = Vec::new();
        wire::read(&body, &mut raw).expect("points encode as a request");
        self.send(&raw).await
    }

    /// Sends `req` as the background sender sends its requests (headers,
    /// credentials, snappy); `Ok` on a 2xx. No retry: the caller decides
    /// ([`SendError::retried`]).
    pub async fn write(&self, req: &WriteRequest) -> Result<(), SendError> {
        self.post(encode_request(req), Wire::V1, 0).await
    }

    /// Posts `body` as `wire` says; for 2.0, `sent` samples, which the
    /// receiver's `…-Samples-Written` header is checked against.
    async fn post(
        &self,
        body: Result<Vec<u8>, snap::Error>,
        wire: Wire,
        sent: usize,
    ) -> Result<(), SendError> {
        let body = body.map_err(|e| SendError {
            // Cannot happen for a Vec; never worth a retry.
            reason: Failure::ClientError,
            message: format!("snappy: {e}"),
            retry_after: None,
            unsupported: false,
        })?;
        let mut req = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body);
        req = match wire {
            Wire::V1 => req
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0"),
            Wire::V2 => req
                .header("Content-Encoding", "snappy")
                .header("Content-Type", v2::CONTENT_TYPE)
                .header(v2::VERSION_HEADER, v2::VERSION),
            Wire::Otlp => req.header("Content-Type", otlp::CONTENT_TYPE),
        };
        let credentials = |message| SendError {
            reason: Failure::Credentials,
            message,
            retry_after: None,
            unsupported: false,
        };
        match &self.credentials {
            Credentials::None => {}
            Credentials::Bearer(t) => req = req.bearer_auth(t.read().map_err(credentials)?),
            Credentials::Basic { username, password } => {
                req = req.basic_auth(username, Some(password.read().map_err(credentials)?));
            }
        }
        let resp = req.send().await.map_err(|e| SendError {
            reason: Failure::Connection,
            message: error_chain(&e),
            retry_after: None,
            unsupported: false,
        })?;
        let status = resp.status();
        if status.is_success() {
            if wire == Wire::V2 {
                let h = resp.headers();
                let written = v2::written_headers(|k| {
                    h.get(k).and_then(|v| v.to_str().ok()).map(str::to_string)
                });
                if let Some((n, _, _)) = written.filter(|w| (w.0 as usize) < sent) {
                    tracing::warn!(url = %self.url, sent, written = n, "remote write 2.0: the endpoint wrote fewer samples than sent");
                }
            }
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, SystemTime::now()));
        let text = resp.text().await.unwrap_or_default();
        let message = format!("{status}: {}", first_line(&text));
        let reason = if status.as_u16() == 429 {
            Failure::TooManyRequests
        } else if status.is_client_error() {
            Failure::ClientError
        } else if status.is_server_error() {
            Failure::ServerError
        } else {
            // 1xx/3xx (redirects are not followed): an answer that is not
            // an acceptance; the endpoint is misconfigured, so retry like
            // an unreachable one.
            Failure::Connection
        };
        Err(SendError {
            reason,
            message,
            retry_after: retry_after.filter(|_| reason != Failure::ClientError),
            unsupported: wire == Wire::V2 && status.as_u16() == 415,
        })
    }
}

/// A `Retry-After` value: delay-seconds, or an HTTP date (RFC 9110
/// §10.2.3) counted from `now` (a date past gives no delay).
fn retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An error with its causes (reqwest's own message omits the TLS or
/// connection error underneath).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// The first non-blank line of a response body, at most 200 characters.
fn first_line(body: &str) -> String {
    let line = body.lines().map(str::trim).find(|l| !l.is_empty());
    let line = line.unwrap_or("(empty body)");
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

/// The delay before retry `attempt` (1, 2, ...): full jitter, uniform in
/// `[0, min(max_backoff, min_backoff * 2^(attempt-1))]`, and at least the
/// endpoint's `Retry-After` up to `max_backoff`.
pub(super) fn backoff(
    cfg: &RemoteWriteConfig,
    attempt: u32,
    retry_after: Option<Duration>,
) -> Duration {
    let bound = cfg
        .min_backoff
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(30))
        .min(cfg.max_backoff);
    let jittered = bound.mul_f64(rand::random::<f64>());
    match retry_after {
        Some(r) => jittered.max(r.min(cfg.max_backoff)),
        None => jittered,
    }
}

/// Logs each distinct error once at `warn` (later repeats at `debug`):
/// a refused batch's status and body line stay in the log without one
/// line per request.
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    /// Refusals (4xx) seen, for the process's life (bounded).
    refused: HashSet<String>,
    /// Retried errors since the last successful request.
    retried: HashSet<String>,
}

impl ErrorLog {
    const MAX: usize = 1024;

    pub(super) fn failed(&mut self, url: &str, e: &SendError, samples: usize) {
        let seen = if e.retried() {
            &mut self.retried
        } else {
            &mut self.refused
        };
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        let first = seen.insert(format!("{}|{}", e.reason.label(), e.message));
        match (e.retried(), first) {
            (true, true) => {
                tracing::warn!(url, reason = e.reason.label(), error = %e.message, "remote write failed; will retry (repeats of this error are logged at debug)")
            }
            (false, true) => {
                tracing::warn!(url, error = %e.message, samples, "remote write refused; samples dropped, not retried (repeats of this error are logged at debug)")
            }
            (true, false) => {
                tracing::debug!(url, reason = e.reason.label(), error = %e.message, "remote write failed; will retry")
            }
            (false, false) => {
                tracing::debug!(url, error = %e.message, samples, "remote write refused; samples dropped")
            }
        }
    }

    pub(super) fn succeeded(&mut self, url: &str, failed_attempts: u32) {
        if failed_attempts > 0 {
            tracing::info!(url, failed_attempts, "remote write recovered");
        }
        self.retried.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::stub::{fast, Stub};
    use super::super::Point;
    use super::*;
    #[tokio::test]
    async fn credentials_and_headers_are_sent_and_token_files_reread() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-token\n").unwrap();
        let stub = Stub::start(Vec::new()).await;
        let mut cfg = fast(&stub.url);
        cfg.bearer_token_file = Some(token.clone());
        cfg.headers = [("X-Scope-OrgID".to_string(), "team-a".to_string())].into();
        let endpoint = Endpoint::new(&cfg).unwrap();
        let points = vec![Point {
            labels: super::super::labels("flopwatch_ofu_ratio", &[("UUID".into(), "GPU-1".into())]),
            ts_ms: 1_000,
            value: 0.25,
        }];
        endpoint.send_points(&points).await.unwrap();
        std::fs::write(&token, "second-token").unwrap();
        endpoint.send_points(&points).await.unwrap();
        let reqs = stub.requests();
        assert!(
            reqs[0].0.contains("authorization: bearer first-token"),
            "{}",
            reqs[0].0
        );
        assert!(
            reqs[1].0.contains("authorization: bearer second-token"),
            "{}",
            reqs[1].0
        );
        assert!(reqs[0].0.contains("x-scope-orgid: team-a"), "{}", reqs[0].0);

        // Basic auth, the password from a file.
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret\n").unwrap();
        let mut cfg = fast(&stub.url);
        cfg.username = Some("flopwatch".into());
        cfg.password_file = Some(password.clone());
        let basic = Endpoint::new(&cfg).unwrap();
        basic.send_points(&points).await.unwrap();
        // base64("flopwatch:s3cret")
        let head = &stub.requests()[2].0;
        let want = "authorization: basic ZmxvcHdhdGNoOnMzY3JldA==".to_lowercase();
        assert!(head.contains(&want), "{head}");

        // The password file gone at send time: no request, retried.
        std::fs::remove_file(&password).unwrap();
        let e = basic.send_points(&points).await.unwrap_err();
        assert_eq!(e.reason, Failure::Credentials);
        assert!(e.retried());
        assert!(
            e.message.contains("remote_write.password_file"),
            "{}",
            e.message
        );
        assert_eq!(stub.requests().len(), 3);
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        // RFC 9110's example date, 10 s after `now`.
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
    }
    #[test]
    fn setup_errors_name_the_key_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let https = |f: &dyn Fn(&mut RemoteWriteConfig)| {
            let mut c = RemoteWriteConfig {
                url: "https://127.0.0.1:1/api/v1/write".into(),
                ..Default::default()
            };
            f(&mut c);
            Endpoint::new(&c).map(drop).unwrap_err().to_string()
        };
        let missing = dir.path().join("missing.pem");
        let e = https(&|c| c.ca_file = Some(missing.clone()));
        assert!(e.starts_with("remote_write.ca_file `"), "{e}");
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = https(&|c| c.ca_file = Some(junk.clone()));
        assert!(
            e.contains("remote_write.ca_file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = https(&|c| c.bearer_token_file = Some(missing.clone()));
        assert!(e.starts_with("remote_write.bearer_token_file `"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, " \n").unwrap();
        let e = https(&|c| {
            c.username = Some("u".into());
            c.password_file = Some(empty.clone());
        });
        assert!(
            e.contains("remote_write.password_file") && e.contains("is empty"),
            "{e}"
        );
    }

    #[test]
    fn backoff_has_full_jitter_below_a_doubling_capped_bound() {
        let cfg = RemoteWriteConfig {
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..Default::default()
        };
        for (attempt, bound) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (60, 1000),
        ] {
            let draws: Vec<Duration> = (0..200).map(|_| backoff(&cfg, attempt, None)).collect();
            let max = draws.iter().max().unwrap();
            let min = draws.iter().min().unwrap();
            assert!(*max <= Duration::from_millis(bound), "{attempt}: {max:?}");
            // Spread over the whole range, not a fixed delay.
            assert!(
                *min < Duration::from_millis(bound / 4),
                "{attempt}: {min:?}"
            );
            assert!(
                *max > Duration::from_millis(bound * 3 / 4),
                "{attempt}: {max:?}"
            );
        }
        // Retry-After is honoured, up to the cap.
        let d = backoff(&cfg, 1, Some(Duration::from_millis(700)));
        assert!(d >= Duration::from_millis(700) && d <= Duration::from_secs(1));
        assert_eq!(
            backoff(&cfg, 1, Some(Duration::from_secs(30))),
            cfg.max_backoff
        );
    }

    #[test]
    fn first_line_of_a_body() {
        assert_eq!(first_line("\n  out of order\nmore"), "out of order");
        assert_eq!(first_line(""), "(empty body)");
        assert_eq!(first_line(&"x".repeat(300)).chars().count(), 201);
    }

    /// One OFU point of GPU-1.
    fn points() -> Vec<Point> {
        vec![Point {
            labels: super::super::labels(
                "flopwatch_ofu_ratio",
                &[
                    ("UUID".into(), "GPU-1".into()),
                    ("hostname".into(), "h".into()),
                ],
            ),
            ts_ms: 1_000,
            value: 0.25,
        }]
    }

    #[tokio::test]
    async fn remote_write_2_0_and_its_fall_back_to_1_0_on_415() {
        use prost::Message;
        let stub = Stub::start(vec![(204, ""), (415, "unsupported"), (204, "")]).await;
        let mut cfg = fast(&stub.url);
        cfg.protocol = "2.0".into();
        let e = Endpoint::new(&cfg).unwrap();
        e.send_points(&points()).await.unwrap();
        let reqs = stub.requests();
        let head = &reqs[0].0;
        assert!(
            head.contains(
                "content-type: application/x-protobuf;proto=io.prometheus.write.v2.request"
            ),
            "{head}"
        );
        assert!(
            head.contains("x-prometheus-remote-write-version: 2.0.0"),
            "{head}"
        );
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&reqs[0].1)
            .unwrap();
        let req = v2::wire::Request::decode(&raw[..]).unwrap();
        assert!(req.symbols.iter().any(|s| s == "flopwatch_ofu_ratio"));
        assert_eq!(req.timeseries[0].samples[0].value, 0.25);
        // A receiver of 1.0 only: 415, then the same points as 1.0, and
        // 1.0 from then on.
        e.send_points(&points()).await.unwrap();
        e.send_points(&points()).await.unwrap();
        let reqs = stub.requests();
        assert_eq!(reqs.len(), 4);
        assert!(
            reqs[2]
                .0
                .contains("x-prometheus-remote-write-version: 0.1.0"),
            "{}",
            reqs[2].0
        );
        assert!(
            reqs[3]
                .0
                .contains("x-prometheus-remote-write-version: 0.1.0"),
            "{}",
            reqs[3].0
        );
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&reqs[3].1)
            .unwrap();
        let v1 = WriteRequest::decode(&raw[..]).unwrap();
        assert_eq!(v1.timeseries[0].samples[0].value, 0.25);
    }

    #[tokio::test]
    async fn otlp_goes_out_as_protobuf_export_requests() {
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use prost::Message;
        let stub = Stub::start(Vec::new()).await;
        let mut cfg = fast(&stub.url);
        cfg.protocol = "otlp".into();
        Endpoint::new(&cfg)
            .unwrap()
            .send_points(&points())
            .await
            .unwrap();
        let (head, body) = &stub.requests()[0];
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        assert!(!head.contains("content-encoding"), "{head}");
        let req = ExportMetricsServiceRequest::decode(&body[..]).unwrap();
        let names: Vec<String> = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.clone())
            .collect();
        assert_eq!(names, ["flopwatch.gpu.ofu"]);
    }
}
