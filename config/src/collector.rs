//! `collector.toml`.

use crate::security::{check_name_pattern, ClientTls, Limits, LimitsOverride, ServerTls};
use crate::{ConfigError, Validate};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The collector's configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectorConfig {
    /// gRPC listen address (ingest and query).
    pub listen: SocketAddr,
    /// HTTP address of `/metrics` (Prometheus). What a scrape sees depends
    /// on its bearer token (`[exporter]`).
    pub metrics_listen: SocketAddr,
    /// What `/metrics` exports and how it is served.
    pub exporter: ExporterConfig,
    /// Prometheus's HTTP query API (`/api/v1/*`) over the store, for
    /// Grafana's Prometheus data source. Off unless `listen` is set.
    pub prometheus_api: PrometheusApiConfig,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Name reported to agents; defaults to the hostname.
    pub collector_id: String,
    /// A GPU spec table replacing the built-in one.
    pub gpu_specs: Option<PathBuf>,
    /// Samples with timestamps further ahead than this are rejected.
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    /// Largest encoded batch accepted, bytes.
    pub max_batch_bytes: u32,
    /// Most agent streams served at once; past it a new stream gets
    /// RESOURCE_EXHAUSTED and its agent fails over. With `max_batch_bytes`
    /// this bounds the memory ingest can hold.
    pub max_agents: u32,
    /// fsync the RocksDB WAL before acknowledging. Off: an acked batch
    /// survives a process crash (kill -9) but not a power loss.
    pub sync_wal: bool,
    /// Data older than this is deleted and never returned.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Per-tenant retention overriding `retention`.
    pub tenant_retention: BTreeMap<String, TenantRetention>,
    /// Sampling policy pushed to agents.
    pub policy: PolicyConfig,
    /// Tenant used for connections without credentials; unset means
    /// credentials are required.
    pub anonymous_tenant: Option<String>,
    /// Tenants and their credentials.
    pub tenants: Vec<TenantConfig>,
    /// Provider (admin) query tokens, SHA-256 hex: read every tenant.
    pub admin_tokens_sha256: Vec<String>,
    /// Regression and straggler detection.
    pub analysis: AnalysisConfig,
    /// Optional Prometheus remote write of OFU and selected counters.
    pub remote_write: Option<RemoteWriteConfig>,
    /// Query URLs of the other collectors of a cluster: a query sent to
    /// this one is answered for the whole fleet (fan-out). Empty: this
    /// collector answers for its own data only.
    pub peers: Vec<String>,
    /// Background compaction of the head into hourly chunks.
    pub storage: StorageConfig,
    /// TLS on the gRPC port (ingest and query); required unless
    /// `plaintext` is set.
    pub tls: Option<ServerTls>,
    /// A plaintext port serving only `grpc.health.v1` (no tenant data), for
    /// probes that cannot speak TLS (Kubernetes `grpc:` probes). Unset: none.
    pub health_listen: Option<SocketAddr>,
    /// Serve gRPC without TLS. Only for loopback and development: tokens
    /// and data travel in clear.
    pub plaintext: bool,
    /// TLS client settings for `https://` peers.
    pub peer_tls: ClientTls,
    /// Per-tenant ingest limits (defaults; `[tenants.limits]` overrides).
    pub limits: Limits,
    /// Settling batches that two collectors of a cluster may both hold.
    pub cluster: ClusterConfig,
}

/// `[exporter]`: the collector's `/metrics` page.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExporterConfig {
    /// Also export dcgm-exporter's `DCGM_FI_*` families, names, units and
    /// labels, so its dashboards and alerts work unchanged.
    pub dcgm_compat: bool,
    /// TLS on `metrics_listen` (certificate and key; client certificates
    /// are not asked for). Unset: plain HTTP.
    pub tls: Option<ServerTls>,
    /// Per-GPU and per-device families are on the page while a scrape's
    /// tenants hold at most this many GPUs; beyond, the page keeps node,
    /// job, tenant and health families (a scrape asks for the rest with
    /// `gpus=all`, or narrows itself with `tenant=`).
    pub max_gpus: usize,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        Self {
            dcgm_compat: false,
            tls: None,
            max_gpus: 1000,
        }
    }
}

/// `[prometheus_api]`: Prometheus's HTTP query API (`/api/v1/query`,
/// `/api/v1/query_range`, series, labels) over the collector's store, on
/// its own listener. Requests authenticate with a bearer token as `/metrics`
/// scrapes do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrometheusApiConfig {
    /// HTTP address of the API; empty (the default) turns it off.
    pub listen: String,
    /// TLS on `listen` (certificate and key; client certificates are not
    /// asked for). Unset: plain HTTP.
    pub tls: Option<ServerTls>,
    /// How long a query may run when its request names no `timeout`, and
    /// the most a request's `timeout` may ask for.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest query text, in bytes; a longer one is refused before it is
    /// parsed.
    pub max_query_bytes: usize,
    /// Deepest expression: the deepest bracket nesting plus the number of
    /// operators, checked before the query is parsed.
    pub max_query_depth: usize,
    /// Most samples one query may touch (stored points read plus points
    /// computed), as Prometheus's `--query.max-samples`.
    pub max_samples: u64,
    /// Most series one query may select.
    pub max_series: u64,
    /// Queries of one tenant evaluated at once.
    pub max_concurrent_queries: u32,
    /// Queries of one tenant waiting for a turn; past it a query is
    /// refused with 429.
    pub max_queued_queries: u32,
    /// A series ends three of its sampling windows and 10 s after its last
    /// sample, as a scraped series ends at its staleness marker; off: each
    /// sample stays current for the 5-minute lookback delta (Prometheus
    /// over blocks that carry no staleness markers).
    pub staleness: bool,
}

impl Default for PrometheusApiConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            tls: None,
            timeout: Duration::from_secs(120),
            max_query_bytes: 128 * 1024,
            max_query_depth: 256,
            max_samples: 50_000_000,
            max_series: 500_000,
            max_concurrent_queries: 4,
            max_queued_queries: 32,
            staleness: true,
        }
    }
}

/// The deepest `prometheus_api.max_query_depth` allowed: the collector
/// evaluates queries on a stack sized for it.
pub const MAX_QUERY_DEPTH: usize = 2048;

impl PrometheusApiConfig {
    /// The address to serve on; `None` when the API is off. Call after
    /// validation (an unparsable address is also `None`).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.parse().ok()
    }
}

/// `[cluster]`: batches an agent resent after a collector failed without
/// acknowledging them are kept in limbo until the peers (`peers`) say
/// whether one of them holds them (docs/RELIABILITY.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// File holding the bearer token this collector presents to its
    /// peers' Cluster service: a provider credential, whose SHA-256 must be
    /// in each peer's `admin_tokens_sha256`. Unset: batches are not put in
    /// limbo, and a batch two collectors got stays on both.
    pub peer_token_file: Option<PathBuf>,
    /// How often batches in limbo are checked with the peers.
    #[serde(with = "humantime_serde")]
    pub reconcile_interval: Duration,
    /// A batch in limbo that cannot be settled for this long (a peer does
    /// not answer) is kept as a normal commit, and counted.
    #[serde(with = "humantime_serde")]
    pub limbo_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            peer_token_file: None,
            reconcile_interval: Duration::from_secs(2),
            limbo_timeout: Duration::from_secs(3600),
        }
    }
}

/// `[tenant_retention.<tenant>]`: one tenant's retention.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRetention {
    /// Data of this tenant older than this is deleted and never returned.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

/// `[storage]`: compaction of acknowledged batches into hourly chunks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// How often the compactor looks for sealed hours.
    #[serde(with = "humantime_serde")]
    pub compaction_interval: Duration,
    /// An hour is sealed (compacted) this long after it ends, so batches
    /// still in flight land in the head first.
    #[serde(with = "humantime_serde")]
    pub seal_delay: Duration,
    /// Hours are sealed GPU by GPU over this span after `seal_delay`, each
    /// GPU at its own fixed phase, so no single pass seals the whole fleet.
    #[serde(with = "humantime_serde")]
    pub seal_spread: Duration,
    /// A GPU's newest head blocks are folded into one compressed block
    /// once the oldest is this old (each GPU at its own phase within it),
    /// so the head stays small while its hour is open. `0s`: off.
    #[serde(with = "humantime_serde")]
    pub fold_after: Duration,
    /// Opt-in lossy storage: metric name → resolution (a power of ten,
    /// e.g. `0.001` or `1`). At compaction the metric's values (and window
    /// peaks) are rounded to a multiple of it, like VictoriaMetrics'
    /// `-precisionBits`. Empty (the default): every value is kept bit for
    /// bit.
    pub precision: BTreeMap<String, f64>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            compaction_interval: Duration::from_secs(60),
            seal_delay: Duration::from_secs(300),
            seal_spread: Duration::from_secs(1200),
            fold_after: Duration::from_secs(120),
            precision: BTreeMap::new(),
        }
    }
}

impl StorageConfig {
    /// `precision` as decimal places per metric (resolution `10^-d`).
    pub fn precision_decimals(&self) -> BTreeMap<String, i32> {
        self.precision
            .iter()
            .filter_map(|(m, &r)| resolution_decimals(r).map(|d| (m.clone(), d)))
            .collect()
    }
}

/// `d` with `r == 10^-d` (−9 ≤ d ≤ 9), if `r` is such a power of ten.
pub fn resolution_decimals(r: f64) -> Option<i32> {
    if !(r.is_finite() && r > 0.0) {
        return None;
    }
    let d = -r.log10().round() as i32;
    let exact = 10f64.powi(-d);
    ((-9..=9).contains(&d) && ((r - exact) / exact).abs() < 1e-9).then_some(d)
}

/// `[analysis]`: events derived at ingest (OFU §VI-A regressions,
/// stragglers).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalysisConfig {
    /// Window over which a job's OFU is averaged before comparison.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Closed windows in a job's trailing baseline (its median).
    pub baseline_windows: usize,
    /// A job regresses when its baseline is this many times its window OFU
    /// ...
    pub regression_factor: f64,
    /// ... for this many consecutive windows.
    pub confirm_windows: u32,
    /// A GPU straggles when its tensor activity is below the job's median
    /// by more than this fraction of the median.
    pub straggler_threshold: f64,
    /// Baselines and medians below this OFU are too idle to judge.
    pub min_ofu: f64,
    /// A job's reported MFU this far (absolute fraction) from its measured
    /// OFU is flagged as a suspected FLOPs miscalculation (OFU §V-C).
    pub mfu_tolerance: f64,
}

impl Default for AnalysisConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            baseline_windows: 10,
            regression_factor: 2.0,
            confirm_windows: 3,
            straggler_threshold: 0.25,
            min_ofu: 0.05,
            mfu_tolerance: 0.10,
        }
    }
}

/// `[remote_write]`: push OFU and selected counters to a Prometheus
/// remote-write endpoint (Prometheus, Mimir, Thanos, VictoriaMetrics).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteWriteConfig {
    /// Endpoint, e.g. `http://prometheus:9090/api/v1/write`.
    pub url: String,
    /// How long points wait at most for a request's worth
    /// (`max_samples_per_request`) before they are sent anyway (as
    /// Prometheus' `batch_send_deadline`).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Samples waiting in the journal at most; past it the oldest are
    /// dropped and counted.
    pub max_queue_samples: usize,
    /// Samples in one request at most.
    pub max_samples_per_request: usize,
    /// Requests in flight at most (shards, each series in one): as many as
    /// the backlog fills, up to this.
    pub max_shards: usize,
    /// Samples older than this when their turn comes are dropped and
    /// counted instead of sent.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Labels added to every series that does not have them (a site or
    /// cluster name), as Prometheus' `external_labels`.
    pub external_labels: BTreeMap<String, String>,
    /// The wire format: `"1.0"` or `"2.0"` (Prometheus remote write), or
    /// `"otlp"` (OTLP/HTTP metrics, protobuf); see [`RemoteWriteProtocol`].
    pub protocol: String,
    /// What each batch sends per series: `"mean"` (one point, the batch's
    /// mean or a counter's newest value), `"summary"` (the mean plus the
    /// batch's `_max` and `_count`), `"full"` (every sample).
    pub fidelity: String,
    /// `fidelity` per metric (`"ofu"` for the three OFU series, or a
    /// catalog name such as `"power_w"`).
    pub fidelity_by_metric: BTreeMap<String, String>,
    /// Request timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Bearer token sent as `Authorization: Bearer`.
    pub bearer_token: Option<String>,
    /// File holding the bearer token (surrounding whitespace trimmed), read
    /// again for every request so that a rotated token is picked up.
    pub bearer_token_file: Option<PathBuf>,
    /// Basic-auth user name; needs `password` or `password_file`.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<String>,
    /// File holding the basic-auth password (surrounding whitespace
    /// trimmed), read again for every request.
    pub password_file: Option<PathBuf>,
    /// Extra HTTP headers sent with every request (e.g. `X-Scope-OrgID`,
    /// Mimir's tenant).
    pub headers: BTreeMap<String, String>,
    /// PEM CA bundle an `https://` endpoint's certificate must chain to.
    /// Unset: the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// Upper bound of the first retry delay (full jitter: the delay is
    /// drawn uniformly below the bound, which doubles per failed attempt).
    #[serde(with = "humantime_serde")]
    pub min_backoff: Duration,
    /// Cap of the retry delay bound.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Counters pushed besides OFU, tensor activity and SM clock (default:
    /// the policy's selected set, or none).
    pub metrics: Vec<String>,
}

/// The wire format of `[remote_write]` (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteWriteProtocol {
    /// `"1.0"`: Prometheus remote write 1.0 (`prometheus.WriteRequest`,
    /// snappy).
    V1,
    /// `"2.0"`: Prometheus remote write 2.0
    /// (`io.prometheus.write.v2.Request`, snappy); falls back to 1.0 when
    /// the receiver answers 415.
    V2,
    /// `"otlp"`: OTLP/HTTP metrics (`ExportMetricsServiceRequest`,
    /// protobuf), to an OTLP endpoint such as
    /// `http://otel-collector:4318/v1/metrics`.
    Otlp,
}

impl RemoteWriteProtocol {
    /// The protocol a `protocol` value names.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "1.0" => Some(Self::V1),
            "2.0" => Some(Self::V2),
            "otlp" => Some(Self::Otlp),
            _ => None,
        }
    }
}

/// Request headers `[remote_write.headers]` may not set: the protocol's
/// own, and `Authorization` (set by `bearer_token` or `username`).
const REMOTE_WRITE_RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "transfer-encoding",
    "user-agent",
    "x-prometheus-remote-write-version",
];

impl Default for RemoteWriteConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            interval: Duration::from_secs(5),
            max_queue_samples: 1_000_000,
            max_samples_per_request: 10_000,
            max_shards: 8,
            max_age: Duration::from_secs(24 * 3600),
            external_labels: BTreeMap::new(),
            protocol: "1.0".into(),
            fidelity: "mean".into(),
            fidelity_by_metric: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            bearer_token: None,
            bearer_token_file: None,
            username: None,
            password: None,
            password_file: None,
            headers: BTreeMap::new(),
            ca_file: None,
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            metrics: Vec::new(),
        }
    }
}

impl RemoteWriteConfig {
    /// Whether the endpoint is reached over TLS.
    pub fn is_https(&self) -> bool {
        self.url.starts_with("https://")
    }

    /// The wire format (`protocol`; 1.0 for a value [`Self::validate`]
    /// would refuse).
    pub fn wire(&self) -> RemoteWriteProtocol {
        RemoteWriteProtocol::parse(&self.protocol).unwrap_or(RemoteWriteProtocol::V1)
    }

    /// Checks values and combinations; errors name the key under
    /// `remote_write.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let key = |k: &str| format!("remote_write.{k}");
        let err = |k: &str, m: &str| Err(ConfigError::invalid(&key(k), m));
        if !(self.url.starts_with("http://") || self.is_https()) {
            return err("url", "must be an http:// or https:// URL");
        }
        if self.interval.is_zero() {
            return err("interval", "must be positive");
        }
        if self.timeout.is_zero() {
            return err("timeout", "must be positive");
        }
        if self.max_samples_per_request == 0 {
            return err("max_samples_per_request", "must be positive");
        }
        if self.max_queue_samples < self.max_samples_per_request {
            return err(
                "max_queue_samples",
                "must be at least max_samples_per_request",
            );
        }
        let fidelity_ok = |v: &str| matches!(v, "mean" | "summary" | "full");
        if !fidelity_ok(&self.fidelity) {
            return err("fidelity", "must be \"mean\", \"summary\" or \"full\"");
        }
        for (k, v) in &self.fidelity_by_metric {
            if !fidelity_ok(v) {
                return err(
                    &format!("fidelity_by_metric.{k}"),
                    "must be \"mean\", \"summary\" or \"full\"",
                );
            }
        }
        if RemoteWriteProtocol::parse(&self.protocol).is_none() {
            return err("protocol", "must be \"1.0\", \"2.0\" or \"otlp\"");
        }
        if self.max_shards == 0 || self.max_shards > 256 {
            return err("max_shards", "must be between 1 and 256");
        }
        if self.max_age.is_zero() {
            return err("max_age", "must be positive");
        }
        for (k, v) in &self.external_labels {
            let name_ok = k
                .chars()
                .enumerate()
                .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
            if k.is_empty() || !name_ok || k.starts_with("__") {
                return err(
                    &format!("external_labels.{k}"),
                    "is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)",
                );
            }
            if v.is_empty() {
                return err(&format!("external_labels.{k}"), "must not be empty");
            }
        }
        if self.min_backoff.is_zero() {
            return err("min_backoff", "must be positive");
        }
        if self.max_backoff < self.min_backoff {
            return err("max_backoff", "must be at least min_backoff");
        }
        for (k, v) in [
            ("bearer_token", &self.bearer_token),
            ("username", &self.username),
        ] {
            if v.as_ref().is_some_and(|v| v.is_empty()) {
                return err(k, "must not be empty (leave it out instead)");
            }
        }
        for (k, v) in [
            ("bearer_token_file", &self.bearer_token_file),
            ("password_file", &self.password_file),
            ("ca_file", &self.ca_file),
        ] {
            if v.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return err(k, "must not be empty (leave it out instead)");
            }
        }
        if self.bearer_token.is_some() && self.bearer_token_file.is_some() {
            return err(
                "bearer_token_file",
                "set either bearer_token or bearer_token_file, not both",
            );
        }
        let bearer = self.bearer_token.is_some() || self.bearer_token_file.is_some();
        let password = self.password.is_some() || self.password_file.is_some();
        if bearer && (self.username.is_some() || password) {
            return err(
                "username",
                "basic auth (username, password, password_file) and a bearer token (bearer_token, bearer_token_file) exclude each other: both set the Authorization header",
            );
        }
        if self.password.is_some() && self.password_file.is_some() {
            return err(
                "password_file",
                "set either password or password_file, not both",
            );
        }
        if password && self.username.is_none() {
            return err(
                "username",
                "must be set with password or password_file (basic auth)",
            );
        }
        if self.username.is_some() && !password {
            return err(
                "password",
                "username is set: basic auth needs password or password_file too",
            );
        }
        if self.ca_file.is_some() && !self.is_https() {
            return err(
                "ca_file",
                "applies to an https:// url only; url is not https://",
            );
        }
        for (name, value) in &self.headers {
            let k = key(&format!("headers.{name}"));
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || !name.chars().all(token) {
                return Err(ConfigError::invalid(&k, "not a valid HTTP header name"));
            }
            if REMOTE_WRITE_RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(ConfigError::invalid(
                    &k,
                    "is set by flopwatch itself (use bearer_token or username for Authorization)",
                ));
            }
            if value
                .chars()
                .any(|c| (c.is_control() && c != '\t') || c == '\u{7f}')
            {
                return Err(ConfigError::invalid(
                    &k,
                    "the value must not contain control characters",
                ));
            }
        }
        Ok(())
    }
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7070".parse().expect("literal address"),
            metrics_listen: "127.0.0.1:9400".parse().expect("literal address"),
            exporter: ExporterConfig::default(),
            prometheus_api: PrometheusApiConfig::default(),
            data_dir: PathBuf::from("/var/lib/flopwatch"),
            collector_id: String::new(),
            gpu_specs: None,
            max_future: Duration::from_secs(600),
            max_batch_bytes: 4 * 1024 * 1024,
            max_agents: 10_000,
            sync_wal: false,
            retention: Duration::from_secs(30 * 24 * 3600),
            tenant_retention: BTreeMap::new(),
            policy: PolicyConfig::default(),
            anonymous_tenant: None,
            tenants: Vec::new(),
            admin_tokens_sha256: Vec::new(),
            analysis: AnalysisConfig::default(),
            remote_write: None,
            peers: Vec::new(),
            storage: StorageConfig::default(),
            tls: None,
            health_listen: None,
            plaintext: false,
            peer_tls: ClientTls::default(),
            limits: Limits::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// `[policy]`: what agents are told to do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Minimum sampling interval.
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
    /// Maximum (adaptive) sampling interval; at most 30 s.
    #[serde(with = "humantime_serde")]
    pub max_interval: Duration,
    /// Adaptive sampling.
    pub adaptive: bool,
    /// How often agents cut a batch.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// A selected metric set (`flopwatch select --output`) to hand to agents.
    pub metrics_file: Option<PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(30),
            adaptive: false,
            flush_interval: Duration::from_secs(1),
            metrics_file: None,
        }
    }
}

/// `[[tenants]]`: one tenant and its credentials.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant name.
    pub name: String,
    /// Agent bearer tokens, SHA-256 hex (never the tokens themselves).
    #[serde(default)]
    pub agent_tokens_sha256: Vec<String>,
    /// Agent bearer tokens with a name and the nodes they may register.
    #[serde(default)]
    pub agent_tokens: Vec<AgentToken>,
    /// Agent client certificates accepted for this tenant, by subject:
    /// the certificate's common name or its whole RFC 4514 subject.
    /// `*` matches any characters; `{node}` binds the node id.
    #[serde(default)]
    pub agent_cert_subjects: Vec<String>,
    /// Agent client certificates accepted for this tenant, by subject
    /// alternative name (DNS, URI, e-mail or IP). Same patterns.
    #[serde(default)]
    pub agent_cert_sans: Vec<String>,
    /// Read-only query tokens, SHA-256 hex.
    #[serde(default)]
    pub query_tokens: Vec<QueryToken>,
    /// This tenant's limits, overriding `[limits]`.
    #[serde(default)]
    pub limits: LimitsOverride,
}

/// `[[tenants.agent_tokens]]`: an agent token with its own name (so that
/// a rotated token keeps the nodes it registered) and, optionally, the
/// node ids it may register.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentToken {
    /// SHA-256 hex of the token.
    pub sha256: String,
    /// Name of the credential; tokens sharing a name share their nodes.
    /// Unset: the digest's first 12 characters.
    #[serde(default)]
    pub name: Option<String>,
    /// Node ids this token may register (`*` matches any characters).
    /// Empty: any node not registered by another credential.
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// A query credential.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryToken {
    /// SHA-256 hex of the token.
    pub sha256: String,
}

fn check_hash(key: &str, h: &str) -> Result<(), ConfigError> {
    if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            "must be a SHA-256 hex digest (64 hex characters): `printf %s TOKEN | sha256sum`",
        ))
    }
}

impl Validate for CollectorConfig {
    const KEYS: &'static [&'static str] = &[
        "listen",
        "metrics_listen",
        "exporter",
        "prometheus_api",
        "data_dir",
        "collector_id",
        "gpu_specs",
        "max_future",
        "max_batch_bytes",
        "max_agents",
        "sync_wal",
        "retention",
        "tenant_retention",
        "policy",
        "anonymous_tenant",
        "admin_tokens_sha256",
        "analysis",
        "remote_write",
        "peers",
        "storage",
        "tls",
        "health_listen",
        "plaintext",
        "peer_tls",
        "limits",
        "cluster",
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        for (i, p) in self.peers.iter().enumerate() {
            if !(p.starts_with("http://") || p.starts_with("https://")) {
                return Err(ConfigError::invalid(
                    &format!("peers[{i}]"),
                    format!("`{p}` must start with http:// or https://"),
                ));
            }
        }
        if let Some(tls) = &self.exporter.tls {
            tls.validate("exporter.tls")?;
            if tls.client_ca.is_some() {
                return Err(ConfigError::invalid(
                    "exporter.tls.client_ca",
                    "client certificates are not checked on /metrics: scrapes authenticate with a bearer token",
                ));
            }
        }
        let api = &self.prometheus_api;
        if !api.listen.is_empty() && api.listen.parse::<SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                "prometheus_api.listen",
                "must be an address such as 127.0.0.1:9090, or empty to turn the API off",
            ));
        }
        for (k, v) in [
            ("timeout", api.timeout.as_millis() as u64),
            ("max_query_bytes", api.max_query_bytes as u64),
            ("max_query_depth", api.max_query_depth as u64),
            ("max_samples", api.max_samples),
            ("max_series", api.max_series),
            (
                "max_concurrent_queries",
                u64::from(api.max_concurrent_queries),
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(
                    &format!("prometheus_api.{k}"),
                    "must be more than 0",
                ));
            }
        }
        if api.max_query_depth > MAX_QUERY_DEPTH {
            return Err(ConfigError::invalid(
                "prometheus_api.max_query_depth",
                format!("must be at most {MAX_QUERY_DEPTH} (the query stack is sized for it)"),
            ));
        }
        if let Some(tls) = &api.tls {
            tls.validate("prometheus_api.tls")?;
            if tls.client_ca.is_some() {
                return Err(ConfigError::invalid(
                    "prometheus_api.tls.client_ca",
                    "client certificates are not checked on the Prometheus API: requests authenticate with a bearer token",
                ));
            }
            if api.listen.is_empty() {
                return Err(ConfigError::invalid(
                    "prometheus_api.tls",
                    "is set but prometheus_api.listen is empty (the API is off)",
                ));
            }
        }
        if self.max_agents == 0 {
            return Err(ConfigError::invalid("max_agents", "must be at least 1"));
        }
        if self.max_batch_bytes < 1024 {
            return Err(ConfigError::invalid(
                "max_batch_bytes",
                "must be at least 1024",
            ));
        }
        let p = &self.policy;
        if p.min_interval < Duration::from_millis(10) {
            return Err(ConfigError::invalid(
                "policy.min_interval",
                "must be at least 10ms",
            ));
        }
        if p.max_interval < p.min_interval || p.max_interval > Duration::from_secs(30) {
            return Err(ConfigError::invalid(
                "policy.max_interval",
                "must lie between policy.min_interval and 30s (hardware counters average over at most 30 s)",
            ));
        }
        if p.flush_interval.is_zero() {
            return Err(ConfigError::invalid(
                "policy.flush_interval",
                "must be positive",
            ));
        }
        let a = &self.analysis;
        if a.window < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "analysis.window",
                "must be at least 1s",
            ));
        }
        if !(a.regression_factor > 1.0 && a.regression_factor.is_finite()) {
            return Err(ConfigError::invalid(
                "analysis.regression_factor",
                "must be a number above 1 (the OFU paper's case is 2.5)",
            ));
        }
        if !(0.0..1.0).contains(&a.straggler_threshold) {
            return Err(ConfigError::invalid(
                "analysis.straggler_threshold",
                "must lie in [0, 1)",
            ));
        }
        if !(a.mfu_tolerance > 0.0 && a.mfu_tolerance <= 1.0) {
            return Err(ConfigError::invalid(
                "analysis.mfu_tolerance",
                "must lie in (0, 1] (a fraction: 0.10 is 10 percentage points)",
            ));
        }
        if !(0.0..=1.0).contains(&a.min_ofu) {
            return Err(ConfigError::invalid(
                "analysis.min_ofu",
                "must lie in [0, 1]",
            ));
        }
        if a.confirm_windows == 0 {
            return Err(ConfigError::invalid(
                "analysis.confirm_windows",
                "must be at least 1",
            ));
        }
        if a.baseline_windows < 3 {
            return Err(ConfigError::invalid(
                "analysis.baseline_windows",
                "must be at least 3",
            ));
        }
        if let Some(rw) = &self.remote_write {
            rw.validate()?;
        }
        if self.storage.compaction_interval < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "storage.compaction_interval",
                "must be at least 1s",
            ));
        }
        for (metric, &r) in &self.storage.precision {
            if metric.is_empty() || resolution_decimals(r).is_none() {
                return Err(ConfigError::invalid(
                    &format!("storage.precision.{metric}"),
                    format!("`{r}` must be a power of ten from 1e-9 to 1e9 (e.g. 0.001 or 1)"),
                ));
            }
        }
        let cl = &self.cluster;
        if cl
            .peer_token_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::invalid(
                "cluster.peer_token_file",
                "must not be empty (leave it unset instead)",
            ));
        }
        if cl.reconcile_interval < Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "cluster.reconcile_interval",
                "must be at least 1s",
            ));
        }
        if cl.limbo_timeout < cl.reconcile_interval {
            return Err(ConfigError::invalid(
                "cluster.limbo_timeout",
                "must be at least cluster.reconcile_interval",
            ));
        }
        if self.retention < Duration::from_secs(3600) {
            return Err(ConfigError::invalid("retention", "must be at least 1h"));
        }
        for (t, r) in &self.tenant_retention {
            if r.retention < Duration::from_secs(3600) {
                return Err(ConfigError::invalid(
                    &format!("tenant_retention.{t}.retention"),
                    "must be at least 1h",
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.name.is_empty() || t.name.len() > 64 || t.name.contains('\0') {
                return Err(ConfigError::invalid(
                    &format!("tenants[{i}].name"),
                    "must be 1-64 characters",
                ));
            }
            if !names.insert(&t.name) {
                return Err(ConfigError::invalid(
                    &format!("tenants[{i}].name"),
                    format!("duplicate tenant `{}`", t.name),
                ));
            }
            for (j, h) in t.agent_tokens_sha256.iter().enumerate() {
                check_hash(&format!("tenants[{i}].agent_tokens_sha256[{j}]"), h)?;
            }
            for (j, q) in t.query_tokens.iter().enumerate() {
                check_hash(&format!("tenants[{i}].query_tokens[{j}].sha256"), &q.sha256)?;
            }
            for (j, a) in t.agent_tokens.iter().enumerate() {
                let key = format!("tenants[{i}].agent_tokens[{j}]");
                check_hash(&format!("{key}.sha256"), &a.sha256)?;
                if a.name
                    .as_ref()
                    .is_some_and(|n| n.is_empty() || n.len() > 64)
                {
                    return Err(ConfigError::invalid(
                        &format!("{key}.name"),
                        "must be 1-64 characters",
                    ));
                }
                for (k, n) in a.nodes.iter().enumerate() {
                    if n.is_empty() || n.contains("{node}") {
                        return Err(ConfigError::invalid(
                            &format!("{key}.nodes[{k}]"),
                            "must be a node id, `*` matching any characters",
                        ));
                    }
                }
            }
            for (j, p) in t.agent_cert_subjects.iter().enumerate() {
                check_name_pattern(&format!("tenants[{i}].agent_cert_subjects[{j}]"), p)?;
            }
            for (j, p) in t.agent_cert_sans.iter().enumerate() {
                check_name_pattern(&format!("tenants[{i}].agent_cert_sans[{j}]"), p)?;
            }
            if !(t.agent_cert_subjects.is_empty() && t.agent_cert_sans.is_empty())
                && self.tls.as_ref().is_none_or(|t| t.client_ca.is_none())
            {
                return Err(ConfigError::invalid(
                    &format!("tenants[{i}].agent_cert_sans"),
                    "client certificates need `tls.client_ca`",
                ));
            }
            self.limits
                .with(&t.limits)
                .validate(&format!("tenants[{i}].limits"))?;
        }
        // One credential, one tenant: a digest listed twice would make a
        // token's tenant depend on the order of the file.
        let mut seen = std::collections::BTreeMap::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let agents = t
                .agent_tokens_sha256
                .iter()
                .chain(t.agent_tokens.iter().map(|a| &a.sha256));
            for h in agents.chain(t.query_tokens.iter().map(|q| &q.sha256)) {
                if let Some(other) = seen.insert(h.to_ascii_lowercase(), i) {
                    return Err(ConfigError::invalid(
                        &format!("tenants[{i}]"),
                        format!("a token digest is listed twice (also in tenants[{other}])"),
                    ));
                }
            }
        }
        for h in &self.admin_tokens_sha256 {
            if let Some(i) = seen.get(&h.to_ascii_lowercase()) {
                return Err(ConfigError::invalid(
                    "admin_tokens_sha256",
                    format!("a digest is also a credential of tenants[{i}]"),
                ));
            }
        }
        for (j, h) in self.admin_tokens_sha256.iter().enumerate() {
            check_hash(&format!("admin_tokens_sha256[{j}]"), h)?;
        }
        if self.anonymous_tenant.is_none() && self.tenants.is_empty() {
            return Err(ConfigError::invalid(
                "tenants",
                "no tenant can connect: add [[tenants]] or set anonymous_tenant",
            ));
        }
        self.limits.validate("limits")?;
        self.peer_tls.validate("peer_tls")?;
        match (&self.tls, self.plaintext) {
            (Some(t), false) => t.validate("tls")?,
            (None, true) => {}
            (Some(_), true) => {
                return Err(ConfigError::invalid(
                    "plaintext",
                    "`plaintext = true` and a [tls] section contradict each other; keep one",
                ))
            }
            (None, false) => {
                return Err(ConfigError::invalid(
                    "tls",
                    "gRPC is served over TLS: set [tls] cert and key, or `plaintext = true` for loopback and development",
                ))
            }
        }
        Ok(())
    }
}
