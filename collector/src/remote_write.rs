//! Prometheus remote write (protocol 1.0): OFU, tensor activity, SM clock
//! and selected counters of every GPU, under the names and base units of
//! the collector's `/metrics` ([`crate::series::family`]), pushed to a Prometheus-compatible
//! endpoint (Prometheus with `--web.enable-remote-write-receiver`, Mimir,
//! Thanos Receive, VictoriaMetrics, Grafana Cloud, Amazon Managed
//! Prometheus) — how storage scales past one collector.
//!
//! Off by default (`[remote_write]` in collector.toml). Ingest appends one
//! point per GPU and series per acknowledged batch (the batch's mean, at its
//! newest sample's time) to a bounded queue and never waits on the
//! endpoint; a background task sends snappy-compressed `WriteRequest`s every
//! `interval`, over TLS (rustls) for an `https://` URL, with a bearer token
//! or basic auth and extra headers when configured.
//!
//! As the remote-write specification asks, a request that fails with a
//! connection error, a 5xx or a 429 is retried (the samples stay queued)
//! after a delay with full jitter, capped at `max_backoff`; any other 4xx
//! drops the request's samples, since the endpoint will never take them.
//! Failures are counted by reason (`flopwatch_remote_write_failures_total`)
//! and dropped samples by cause (`flopwatch_remote_write_dropped_samples_total`:
//! a full queue drops the oldest, a 4xx the refused request's); each
//! distinct error is logged once with its status and the first line of the
//! response body.
//!
//! A series that stops — its GPU's input went stale ([`crate::staleness`]),
//! its agent went away, or its job ended and its labels changed — gets
//! Prometheus' staleness marker (the NaN with bits `0x7ff0000000000002`)
//! after its last sample, as a Prometheus scrape writes one for a series
//! that vanished from a target: the receiver then ends the series there
//! instead of extending its last value over its lookback.

use crate::live::GpuLive;
use crate::series::{family_of, gpu_labels, On};
use crate::stats::{Failure, Stats};
use crate::CollectorError;
use flopwatch_config::RemoteWriteConfig;
use prost::Message;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `prometheus.WriteRequest` (prompb/remote.proto), the fields flopwatch
/// sends.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// Series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Labels, sorted by name, `__name__` included.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples in time order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Message)]
pub struct Label {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Unix ms.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// One queued point.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    labels: Vec<Label>,
    ts_ms: i64,
    value: f64,
}

/// Prometheus' staleness marker: a NaN no computation produces.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// A series pushed and not yet ended.
#[derive(Debug, Clone)]
struct Sent {
    /// Its GPU.
    gpu: String,
    /// Its metric name.
    name: String,
    /// Its newest sample's time.
    last_ts: i64,
    /// Collector time after which it is stale.
    until_ms: i64,
}

/// The bounded queue between ingest and the sender.
#[derive(Debug)]
pub struct RemoteQueue {
    points: Mutex<VecDeque<Point>>,
    cap: usize,
    metrics: Vec<String>,
    /// The series pushed and not ended, by label set.
    sent: Mutex<BTreeMap<Vec<Label>, Sent>>,
}

fn labels(name: &str, base: &[(String, String)]) -> Vec<Label> {
    let mut l: Vec<Label> = base
        .iter()
        .map(|(k, v)| Label {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    l.push(Label {
        name: "__name__".into(),
        value: name.into(),
    });
    l.sort();
    l
}

impl RemoteQueue {
    /// A queue of at most `cap` points; `metrics` are the counters pushed
    /// besides the OFU series.
    pub fn new(cap: usize, metrics: Vec<String>) -> Self {
        Self {
            points: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            metrics,
            sent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Queued points.
    pub fn len(&self) -> usize {
        self.points.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a GPU's state after a batch: OFU, tensor activity and SM
    /// clock at `ofu_ts_ms` when the batch had OFU, and the configured
    /// counters' last values.
    pub fn push_gpu(&self, g: &GpuLive, ofu_ts_ms: Option<i64>, stats: &Stats) {
        let base = gpu_labels(g);
        let mut new = Vec::new();
        // (name, when it goes stale) of each point, in `new`'s order.
        let mut ends = Vec::new();
        if let (Some(ts), Some(ofu)) = (ofu_ts_ms, g.ofu) {
            for (name, v) in [
                ("flopwatch_ofu_ratio", ofu),
                ("flopwatch_ofu_tensor_active_ratio", g.tensor_active),
                ("flopwatch_ofu_sm_clock_hertz", g.sm_clock_mhz * 1e6),
            ] {
                new.push(Point {
                    labels: labels(name, &base),
                    ts_ms: ts,
                    value: v,
                });
                ends.push((name.to_string(), g.ofu_fresh.seen_ms + g.ofu_fresh.for_ms));
            }
        }
        // The same families, names and base units as on /metrics.
        for m in &self.metrics {
            if let (Some((ts, v)), Some(f)) = (g.counters.get(m), family_of(m, On::Gpu)) {
                let name = f.sample_name();
                new.push(Point {
                    labels: labels(&name, &base),
                    ts_ms: *ts,
                    value: v * f.scale,
                });
                let fresh = g.fresh.get(m).copied().unwrap_or_default();
                ends.push((name, fresh.seen_ms + fresh.for_ms));
            }
        }
        let markers = self.note_sent(&g.uuid, &new, ends);
        self.push(markers, stats);
        self.push(new, stats);
    }

    /// Records `new` as the GPU's current series, and returns the
    /// staleness markers of its series of the same names under other labels
    /// (a job that ended): those end where the new ones begin.
    fn note_sent(&self, gpu: &str, new: &[Point], ends: Vec<(String, i64)>) -> Vec<Point> {
        let Ok(mut sent) = self.sent.lock() else {
            return Vec::new();
        };
        let mut markers = Vec::new();
        for (p, (name, until_ms)) in new.iter().zip(ends) {
            let replaced: Vec<Vec<Label>> = sent
                .iter()
                .filter(|(l, s)| s.gpu == gpu && s.name == name && **l != p.labels)
                .map(|(l, _)| l.clone())
                .collect();
            for l in replaced {
                if let Some(s) = sent.remove(&l) {
                    markers.push(Point {
                        labels: l,
                        ts_ms: p.ts_ms.max(s.last_ts + 1),
                        value: f64::from_bits(STALE_NAN),
                    });
                }
            }
            sent.insert(
                p.labels.clone(),
                Sent {
                    gpu: gpu.to_string(),
                    name,
                    last_ts: p.ts_ms,
                    until_ms,
                },
            );
        }
        markers
    }

    /// Queues a staleness marker for every series gone stale by `now_ms`
    /// (collector clock), just after its last sample or at `now_ms`.
    pub fn expire(&self, now_ms: i64, stats: &Stats) {
        let markers: Vec<Point> = {
            let Ok(mut sent) = self.sent.lock() else {
                return;
            };
            let gone: Vec<Vec<Label>> = sent
                .iter()
                .filter(|(_, s)| s.until_ms < now_ms)
                .map(|(l, _)| l.clone())
                .collect();
            gone.into_iter()
                .filter_map(|l| {
                    let s = sent.remove(&l)?;
                    Some(Point {
                        labels: l,
                        ts_ms: now_ms.max(s.last_ts + 1),
                        value: f64::from_bits(STALE_NAN),
                    })
                })
                .collect()
        };
        self.push(markers, stats);
    }

    fn push(&self, new: Vec<Point>, stats: &Stats) {
        let Ok(mut q) = self.points.lock() else {
            return;
        };
        q.extend(new);
        let over = q.len().saturating_sub(self.cap);
        if over > 0 {
            q.drain(..over);
            stats
                .remote_write_dropped
                .fetch_add(over as u64, Ordering::Relaxed);
        }
    }

    /// Takes up to `n` of the oldest points.
    fn take(&self, n: usize) -> Vec<Point> {
        self.points
            .lock()
            .map(|mut q| {
                let k = n.min(q.len());
                q.drain(..k).collect()
            })
            .unwrap_or_default()
    }

    /// Puts points back at the front, after a failed send.
    fn restore(&self, points: Vec<Point>, stats: &Stats) {
        let Ok(mut q) = self.points.lock() else {
            return;
        };
        for p in points.into_iter().rev() {
            q.push_front(p);
        }
        let over = q.len().saturating_sub(self.cap);
        if over > 0 {
            // Drop the newest overflow: the restored points are older and
            // must go first to keep each series in time order.
            let keep = q.len() - over;
            q.truncate(keep);
            stats
                .remote_write_dropped
                .fetch_add(over as u64, Ordering::Relaxed);
        }
    }
}

/// A `WriteRequest` as it goes on the wire: protobuf, then snappy's block
/// format (remote-write 1.0). One encoder for the collector's sender and
/// for `flopwatch bench ingest --peer prometheus`.
pub fn encode_request(req: &WriteRequest) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(&req.encode_to_vec())
}

/// Groups points into a snappy-compressed `WriteRequest` body.
fn encode(points: &[Point]) -> Result<Vec<u8>, snap::Error> {
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut index: std::collections::BTreeMap<&[Label], usize> = Default::default();
    for p in points {
        let i = *index.entry(&p.labels[..]).or_insert_with(|| {
            series.push(TimeSeries {
                labels: p.labels.clone(),
                samples: Vec::new(),
            });
            series.len() - 1
        });
        series[i].samples.push(Sample {
            value: p.value,
            timestamp: p.ts_ms,
        });
    }
    for s in &mut series {
        s.samples.sort_by_key(|s| s.timestamp);
        s.samples.dedup_by_key(|s| s.timestamp);
    }
    encode_request(&WriteRequest { timeseries: series })
}

/// A failed send: the endpoint's status and the first line of its answer,
/// or the connection error.
#[derive(Debug)]
pub struct SendError {
    reason: Failure,
    /// What happened: the status and the first line of the response body,
    /// or the connection error.
    message: String,
    /// The endpoint's `Retry-After` (429, 503), in seconds.
    retry_after: Option<Duration>,
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
    url: String,
    credentials: Credentials,
    headers: reqwest::header::HeaderMap,
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
        })
    }

    /// Sends `points` as one `WriteRequest`.
    async fn send(&self, points: &[Point]) -> Result<(), SendError> {
        self.post(encode(points)).await
    }

    /// Sends `req` as the background sender sends its requests (headers,
    /// credentials, snappy); `Ok` on a 2xx. No retry: the caller decides
    /// ([`SendError::retried`]).
    pub async fn write(&self, req: &WriteRequest) -> Result<(), SendError> {
        self.post(encode_request(req)).await
    }

    async fn post(&self, body: Result<Vec<u8>, snap::Error>) -> Result<(), SendError> {
        let body = body.map_err(|e| SendError {
            // Cannot happen for a Vec; never worth a retry.
            reason: Failure::ClientError,
            message: format!("snappy: {e}"),
            retry_after: None,
        })?;
        let mut req = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .body(body);
        let credentials = |message| SendError {
            reason: Failure::Credentials,
            message,
            retry_after: None,
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
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
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
        })
    }
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
fn backoff(cfg: &RemoteWriteConfig, attempt: u32, retry_after: Option<Duration>) -> Duration {
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
struct ErrorLog {
    /// Refusals (4xx) seen, for the process's life (bounded).
    refused: HashSet<String>,
    /// Retried errors since the last successful request.
    retried: HashSet<String>,
}

impl ErrorLog {
    const MAX: usize = 1024;

    fn failed(&mut self, url: &str, e: &SendError, samples: usize) {
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

    fn succeeded(&mut self, url: &str, failed_attempts: u32) {
        if failed_attempts > 0 {
            tracing::info!(url, failed_attempts, "remote write recovered");
        }
        self.retried.clear();
    }
}

/// Sends queued points until `shutdown` flips, then makes one last attempt
/// to drain the queue.
pub async fn run(
    cfg: RemoteWriteConfig,
    queue: Arc<RemoteQueue>,
    stats: Arc<Stats>,
    clock: Arc<dyn flopwatch_proto::clock::Clock>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let endpoint = match Endpoint::new(&cfg) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "remote write disabled");
            return;
        }
    };
    sender(&endpoint, &cfg, &queue, &stats, &*clock, shutdown).await
}

/// The send loop: every `interval`, requests of at most
/// `max_samples_per_request` until the queue is empty. A retried failure
/// puts the samples back and waits [`backoff`]; a refusal (4xx other than
/// 429) drops them and goes on with the next request.
async fn sender(
    endpoint: &Endpoint,
    cfg: &RemoteWriteConfig,
    queue: &RemoteQueue,
    stats: &Stats,
    clock: &dyn flopwatch_proto::clock::Clock,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut log = ErrorLog::default();
    let mut failed_attempts = 0u32;
    let mut wait = cfg.interval;
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        wait = cfg.interval;
        queue.expire(clock.now_ms(), stats);
        loop {
            let points = queue.take(cfg.max_samples_per_request);
            if points.is_empty() {
                break;
            }
            match endpoint.send(&points).await {
                Ok(()) => {
                    log.succeeded(&endpoint.url, failed_attempts);
                    failed_attempts = 0;
                    stats
                        .remote_write_samples
                        .fetch_add(points.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.remote_write_failure(e.reason);
                    log.failed(&endpoint.url, &e, points.len());
                    if e.retried() {
                        queue.restore(points, stats);
                        failed_attempts = failed_attempts.saturating_add(1);
                        wait = backoff(cfg, failed_attempts, e.retry_after);
                        break;
                    }
                    stats
                        .remote_write_refused
                        .fetch_add(points.len() as u64, Ordering::Relaxed);
                }
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(ofu: f64) -> GpuLive {
        GpuLive {
            tenant: "t".into(),
            uuid: "GPU-1".into(),
            model: "H100".into(),
            hostname: "h".into(),
            node_id: "n".into(),
            ofu: Some(ofu),
            tensor_active: 0.5,
            sm_clock_mhz: 1800.0,
            counters: [("power_w".to_string(), (5, 300.0))].into(),
            // Current for as long as a test runs.
            ofu_fresh: crate::live::Freshness {
                seen_ms: i64::MAX / 2,
                for_ms: 0,
            },
            fresh: [(
                "power_w".to_string(),
                crate::live::Freshness {
                    seen_ms: i64::MAX / 2,
                    for_ms: 0,
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn encodes_sorted_labels_and_groups_series() {
        let stats = Stats::default();
        let q = RemoteQueue::new(100, vec!["power_w".into()]);
        q.push_gpu(&gpu(0.25), Some(1_000), &stats);
        q.push_gpu(&gpu(0.5), Some(2_000), &stats);
        assert_eq!(q.len(), 8);
        let points = q.take(100);
        let body = encode(&points).unwrap();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let req = WriteRequest::decode(&raw[..]).unwrap();
        // power_w's timestamp did not move, so it is sent once.
        assert_eq!(req.timeseries.len(), 4);
        let ofu = req
            .timeseries
            .iter()
            .find(|s| {
                s.labels
                    .iter()
                    .any(|l| l.name == "__name__" && l.value == "flopwatch_ofu_ratio")
            })
            .unwrap();
        let mut names: Vec<&str> = ofu.labels.iter().map(|l| l.name.as_str()).collect();
        let sorted = {
            let mut s = names.clone();
            s.sort();
            s
        };
        assert_eq!(names, sorted);
        names.retain(|n| *n == "UUID");
        assert_eq!(names.len(), 1);
        let values: Vec<(i64, f64)> = ofu.samples.iter().map(|s| (s.timestamp, s.value)).collect();
        assert_eq!(values, vec![(1_000, 0.25), (2_000, 0.5)]);
    }

    #[test]
    fn counters_go_out_under_their_family_in_base_units() {
        let stats = Stats::default();
        let mut g = gpu(0.25);
        g.counters.insert("energy_j".into(), (5, 1234.0));
        let q = RemoteQueue::new(100, vec!["power_w".into(), "energy_j".into()]);
        q.push_gpu(&g, Some(1_000), &stats);
        let named: Vec<(String, f64)> = q
            .take(100)
            .into_iter()
            .map(|p| {
                let name = p.labels.iter().find(|l| l.name == "__name__").unwrap();
                (name.value.clone(), p.value)
            })
            .collect();
        for want in [
            ("flopwatch_gpu_power_watts", 300.0),
            ("flopwatch_gpu_energy_joules_total", 1234.0),
            ("flopwatch_ofu_sm_clock_hertz", 1.8e9),
        ] {
            assert!(
                named.iter().any(|(n, v)| n == want.0 && *v == want.1),
                "{want:?} not in {named:?}"
            );
        }
        assert!(named.iter().all(|(n, _)| n != "flopwatch_gpu_metric"));
    }

    #[test]
    fn series_that_stop_get_staleness_markers() {
        use crate::live::Freshness;
        let stats = Stats::default();
        let q = RemoteQueue::new(100, vec!["power_w".into()]);
        let fresh = Freshness {
            seen_ms: 10_000,
            for_ms: 10_300,
        };
        let mut g = gpu(0.25);
        g.ofu_fresh = fresh;
        g.fresh.insert("power_w".into(), fresh);
        g.job = Some(flopwatch_proto::v1::JobAssignment {
            job_id: "train".into(),
            ..Default::default()
        });
        q.push_gpu(&g, Some(1_000), &stats);
        assert_eq!(q.take(100).len(), 4);
        // The job ended: the GPU's series lose the job's labels, and the
        // job's series end where the new ones begin.
        g.job = None;
        q.push_gpu(&g, Some(2_000), &stats);
        let pts = q.take(100);
        let stale: Vec<&Point> = pts
            .iter()
            .filter(|p| p.value.to_bits() == STALE_NAN)
            .collect();
        assert_eq!(stale.len(), 4, "{pts:?}");
        assert!(stale.iter().all(|p| p
            .labels
            .iter()
            .any(|l| l.name == "job_id" && l.value == "train")));
        // OFU's at the new sample's time; power's (its reading did not
        // move, at 5) just after its last.
        let name = |p: &Point| {
            p.labels
                .iter()
                .find(|l| l.name == "__name__")
                .map(|l| l.value.clone())
                .unwrap_or_default()
        };
        for p in &stale {
            let want = if name(p) == "flopwatch_gpu_power_watts" {
                6
            } else {
                2_000
            };
            assert_eq!(p.ts_ms, want, "{p:?}");
        }
        // Nothing more arrives: past their bound, the current ones end.
        q.expire(20_300, &stats);
        assert!(q.is_empty(), "still current");
        q.expire(20_301, &stats);
        let pts = q.take(100);
        assert_eq!(pts.len(), 4);
        assert!(pts
            .iter()
            .all(|p| p.value.to_bits() == STALE_NAN && p.ts_ms == 20_301));
        assert!(pts
            .iter()
            .all(|p| !p.labels.iter().any(|l| l.name == "job_id")));
        // Each series ends once.
        q.expire(30_000, &stats);
        assert!(q.is_empty());
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts() {
        let stats = Stats::default();
        let q = RemoteQueue::new(4, Vec::new());
        q.push_gpu(&gpu(0.1), Some(1), &stats);
        q.push_gpu(&gpu(0.2), Some(2), &stats);
        assert_eq!(q.len(), 4);
        assert_eq!(Stats::get(&stats.remote_write_dropped), 2);
        let p = q.take(10);
        assert_eq!(p[0].ts_ms, 1, "one point of the first push survives");
        assert_eq!(p[3].ts_ms, 2);
        q.restore(p.clone(), &stats);
        assert_eq!(q.take(10), p);
    }

    /// An HTTP endpoint answering with `script` in turn (then 200), one
    /// request per connection; records each request's head and body.
    struct Stub {
        url: String,
        seen: Arc<Mutex<Vec<Request>>>,
    }

    /// A request's head (lowercased) and body.
    type Request = (String, Vec<u8>);

    impl Stub {
        async fn start(script: Vec<(u16, &'static str)>) -> Stub {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/api/v1/write", l.local_addr().unwrap());
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = seen.clone();
            tokio::spawn(async move {
                let mut script = script.into_iter();
                while let Ok((mut c, _)) = l.accept().await {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let request = loop {
                        let n = c.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            break None;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break Some((head, buf[end + 4..end + 4 + len].to_vec()));
                        }
                    };
                    let Some(request) = request else {
                        continue;
                    };
                    record.lock().unwrap().push(request);
                    let (code, text) = script.next().unwrap_or((200, ""));
                    let resp = format!(
                        "HTTP/1.1 {code} Scripted\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = c.write_all(resp.as_bytes()).await;
                    let _ = c.shutdown().await;
                }
            });
            Stub { url, seen }
        }

        fn requests(&self) -> Vec<Request> {
            self.seen.lock().unwrap().clone()
        }
    }

    fn fast(url: &str) -> RemoteWriteConfig {
        RemoteWriteConfig {
            url: url.into(),
            interval: Duration::from_millis(20),
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            // One GPU's OFU, tensor activity and SM clock per request.
            max_samples_per_request: 3,
            ..Default::default()
        }
    }

    async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn retries_5xx_and_429_drops_other_4xx_without_retrying() {
        let stub = Stub::start(vec![
            (503, "overloaded"),
            (429, "slow down"),
            (400, "\nout of order sample\nsecond line"),
        ])
        .await;
        let cfg = fast(&stub.url);
        let stats = Arc::new(Stats::default());
        let queue = Arc::new(RemoteQueue::new(100, Vec::new()));
        queue.push_gpu(&gpu(0.25), Some(1_000), &stats);
        queue.push_gpu(&gpu(0.5), Some(2_000), &stats);
        let endpoint = Endpoint::new(&cfg).unwrap();
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = {
            let (stats, queue) = (stats.clone(), queue.clone());
            tokio::spawn(async move {
                sender(
                    &endpoint,
                    &cfg,
                    &queue,
                    &stats,
                    &flopwatch_proto::clock::SystemClock,
                    stop_rx,
                )
                .await
            })
        };
        wait_for("4 requests", || stub.requests().len() >= 4).await;
        // Many intervals and backoffs later: no request more.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let _ = stop.send(true);
        task.await.unwrap();
        let reqs = stub.requests();
        assert_eq!(reqs.len(), 4, "503, 429 (both retried), 400 (dropped), 200");
        assert_eq!(reqs[0].1, reqs[1].1, "the 503's batch was sent again");
        assert_eq!(reqs[1].1, reqs[2].1, "the 429's batch was sent again");
        assert_ne!(reqs[2].1, reqs[3].1, "the 400's batch was not sent again");
        for (head, _) in &reqs {
            assert!(head.contains("content-encoding: snappy"), "{head}");
            assert!(head.contains("x-prometheus-remote-write-version: 0.1.0"));
            assert!(!head.contains("authorization"), "{head}");
        }
        let f = |r| stats.remote_write_failures(r);
        assert_eq!(f(Failure::ServerError), 1);
        assert_eq!(f(Failure::TooManyRequests), 1);
        assert_eq!(f(Failure::ClientError), 1);
        assert_eq!(f(Failure::Connection), 0);
        assert_eq!(Stats::get(&stats.remote_write_refused), 3);
        assert_eq!(Stats::get(&stats.remote_write_samples), 3);
        assert_eq!(Stats::get(&stats.remote_write_dropped), 0);
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn connection_errors_keep_the_samples_queued() {
        // A port nothing listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v1/write", l.local_addr().unwrap());
        drop(l);
        let cfg = fast(&url);
        let stats = Stats::default();
        let queue = RemoteQueue::new(100, Vec::new());
        queue.push_gpu(&gpu(0.25), Some(1_000), &stats);
        let endpoint = Endpoint::new(&cfg).unwrap();
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let run = sender(
            &endpoint,
            &cfg,
            &queue,
            &stats,
            &flopwatch_proto::clock::SystemClock,
            stop_rx,
        );
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = stop.send(true);
        };
        tokio::join!(run, stopper);
        assert!(stats.remote_write_failures(Failure::Connection) >= 2);
        assert_eq!(stats.remote_write_failures(Failure::ClientError), 0);
        assert_eq!(queue.len(), 3, "nothing dropped");
    }

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
        let stats = Stats::default();
        let queue = RemoteQueue::new(100, Vec::new());
        queue.push_gpu(&gpu(0.25), Some(1_000), &stats);
        let points = queue.take(3);
        endpoint.send(&points).await.unwrap();
        std::fs::write(&token, "second-token").unwrap();
        endpoint.send(&points).await.unwrap();
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
        basic.send(&points).await.unwrap();
        // base64("flopwatch:s3cret")
        let head = &stub.requests()[2].0;
        let want = "authorization: basic ZmxvcHdhdGNoOnMzY3JldA==".to_lowercase();
        assert!(head.contains(&want), "{head}");

        // The password file gone at send time: no request, retried.
        std::fs::remove_file(&password).unwrap();
        let e = basic.send(&points).await.unwrap_err();
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
}
