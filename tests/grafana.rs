//! Grafana's Prometheus data source against the collector's Prometheus
//! query API (`[prometheus_api]`): the requests Grafana 10 and 11 send, as
//! they send them, replayed against a collector whose data came in over
//! gRPC from two tenants' agents.
//!
//! - "Save & test": the instant query `1+1` at `time=4` (GET, and POST as
//!   the data source's default `httpMethod` sends it).
//! - Connection set-up: `/api/v1/status/buildinfo` (a Prometheus without
//!   `features`), `/api/v1/metadata`, `/api/v1/rules`, and the exemplar
//!   endpoint, which Grafana tolerates missing (404).
//! - The metric and label browser: `/api/v1/labels` and
//!   `/api/v1/label/__name__/values` with `start`/`end` in whole seconds,
//!   `/api/v1/series?match[]=`, GET and form POST.
//! - Dashboard variables: `label_values(metric, label)` becomes
//!   `/api/v1/label/<label>/values?match[]=<metric>&start&end`.
//! - Every range panel of `deploy/grafana/flopwatch.json` with Grafana's
//!   own arithmetic: the step from the panel width (maxDataPoints), the
//!   data source's `timeInterval` and the 11,000-point safety resolution,
//!   rounded as Grafana rounds it; start and end aligned down to the step;
//!   `$__rate_interval` as Grafana computes it; a form POST with the step
//!   in float seconds.
//! - The tenant matrix over every endpoint: a tenant's query token sees
//!   its tenant only, the provider token both, no token and a wrong token
//!   get 401; over plain HTTP and over TLS.
//!
//! Tests whose names end in `_values` assert what the engine answers
//! (series, labels, sample values); the others the HTTP contract.

use flopwatch_collector::server::{self, Serving};
use flopwatch_collector::{digest, Auth};
use flopwatch_config::{CollectorConfig, QueryToken, ServerTls, SpecTable, TenantConfig};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::v1::collector_message;
use flopwatch_tests::pki::Pki;
use flopwatch_tests::raw::{self, RawAgent};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

const PROVIDER: &str = "grafana-provider-token";

/// One tenant and the strings only its data contains.
struct Tenant {
    name: &'static str,
    agent_token: String,
    query_token: String,
    node: String,
    host: String,
    gpu: String,
    job: String,
    /// Tensor activity: the GPU's OFU (its SM clock is the H100's tensor
    /// peak clock, 1830 MHz).
    ofu: f64,
    power: f64,
}

impl Tenant {
    fn new(name: &'static str, tag: &str, ofu: f64, power: f64) -> Self {
        Tenant {
            name,
            agent_token: format!("agent-{tag}"),
            query_token: format!("grafana-{tag}"),
            node: format!("node-{tag}-g4f"),
            host: format!("host-{tag}-r8t"),
            gpu: format!("GPU-{tag}-0a1b-77cd"),
            job: format!("train-{tag}-x9"),
            ofu,
            power,
        }
    }

    /// Strings that reveal this tenant's data in an answer.
    fn markers(&self) -> Vec<String> {
        vec![
            self.name.to_string(),
            self.node.clone(),
            self.host.clone(),
            self.gpu.clone(),
            self.job.clone(),
            format!("{}", self.power),
        ]
    }
}

struct Env {
    _dir: tempfile::TempDir,
    server: server::Loopback,
    http: reqwest::Client,
    tenants: Vec<Tenant>,
    /// When the samples were sent, ms; they cover the 35 s to 5 s before.
    seeded_at: i64,
}

impl Env {
    /// A collector with tenants `tenant-a` and `tenant-b`, its API over TLS
    /// when `tls`, and one GPU of samples per tenant ingested over gRPC.
    async fn start(tls: bool) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let tenants = vec![
            Tenant::new("tenant-a", "aa", 0.5, 311.25),
            Tenant::new("tenant-b", "bb", 0.25, 322.75),
        ];
        let cfg = CollectorConfig {
            data_dir: dir.path().join("data"),
            admin_tokens_sha256: vec![digest(PROVIDER)],
            tenants: tenants
                .iter()
                .map(|t| TenantConfig {
                    name: t.name.into(),
                    agent_tokens_sha256: vec![digest(&t.agent_token)],
                    query_tokens: vec![QueryToken {
                        sha256: digest(&t.query_token),
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let collector = server::open(
            &cfg.data_dir,
            &cfg,
            SpecTable::builtin(),
            Auth::from_config(&cfg),
            Vec::new(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let mut http = reqwest::Client::builder();
        let mut serving = Serving::default();
        if tls {
            let pki = Pki::new(&dir.path().join("pki"), "grafana");
            let files = pki.server("api");
            let section = ServerTls {
                cert: files.cert,
                key: files.key,
                client_ca: None,
                require_client_cert: false,
            };
            serving.api_tls =
                Some(flopwatch_collector::api_config(&section, Path::new("")).unwrap());
            let ca = std::fs::read(pki.ca_file()).unwrap();
            http = http
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
        }
        let server = server::Loopback::start_serving(collector, serving)
            .await
            .unwrap();
        assert_eq!(
            server.api_url.starts_with("https://"),
            tls,
            "{}",
            server.api_url
        );
        let seeded_at = SystemClock.now_ms();
        for t in &tenants {
            let ch = tonic::transport::Channel::from_shared(server.url.clone())
                .unwrap()
                .connect()
                .await
                .unwrap();
            let (mut a, w) = RawAgent::open(
                ch,
                Some(t.agent_token.as_str()),
                raw::hello(&t.node, &t.host, &t.gpu),
            )
            .await
            .unwrap();
            assert_eq!(w.tenant, t.name);
            let reply = a
                .call(raw::batch(
                    1,
                    &t.gpu,
                    seeded_at - 35_000,
                    300,
                    t.ofu,
                    t.power,
                    Some(&t.job),
                ))
                .await
                .unwrap();
            assert!(
                matches!(reply, collector_message::Msg::Ack(ref ack) if ack.accepted_samples == 900),
                "{}: {reply:?}",
                t.name
            );
        }
        Env {
            _dir: dir,
            server,
            http: http.build().unwrap(),
            tenants,
            seeded_at,
        }
    }

    /// `GET path?params` as Grafana's client sends it, with `token`.
    async fn get(&self, path: &str, params: &[(&str, String)], token: Option<&str>) -> Reply {
        let mut r = self
            .http
            .get(format!("{}{path}", self.server.api_url))
            .query(params);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        Reply::of(r.send().await.unwrap()).await
    }

    /// A form POST, as Grafana sends queries (and labels and series with
    /// `httpMethod: POST`).
    async fn post(&self, path: &str, params: &[(&str, String)], token: Option<&str>) -> Reply {
        let mut r = self
            .http
            .post(format!("{}{path}", self.server.api_url))
            .form(params);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        Reply::of(r.send().await.unwrap()).await
    }

    /// `GET` of a URL written out in full (path and query string).
    async fn get_raw(&self, path_and_query: &str, token: &str) -> Reply {
        let r = self
            .http
            .get(format!("{}{path_and_query}", self.server.api_url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        Reply::of(r).await
    }

    /// Grafana's `start`/`end` of the metadata calls for the last `secs`:
    /// whole seconds, start rounded down and end up.
    fn browse_range(&self, secs: i64) -> [(&'static str, String); 2] {
        let now = SystemClock.now_ms();
        [
            ("start", ((now - secs * 1000) / 1000).to_string()),
            ("end", ((now + 999) / 1000).to_string()),
        ]
    }
}

/// An answer: status, content type and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    async fn of(r: reqwest::Response) -> Reply {
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Reply {
            status,
            content_type,
            body: r.text().await.unwrap(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// `data` of a success, checking the envelope.
    fn data(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        assert_eq!(self.content_type, "application/json");
        let v = self.json();
        assert_eq!(v["status"], "success", "{}", self.body);
        v["data"].clone()
    }

    /// The sorted strings of a success whose `data` is a string array.
    fn strings(&self) -> Vec<String> {
        let d = self.data();
        let a = d.as_array().unwrap_or_else(|| panic!("not an array: {d}"));
        let v: Vec<String> = a
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect();
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(v, sorted, "Prometheus sorts label names and values");
        v
    }

    /// An error answer in Prometheus's shape.
    fn assert_error(&self, status: u16, error_type: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        assert_eq!(v["status"], "error", "{}", self.body);
        assert_eq!(v["errorType"], error_type, "{}", self.body);
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}",
            self.body
        );
    }
}

// ---- Grafana's arithmetic --------------------------------------------

/// Grafana's rounding of a computed interval to a "nice" one
/// (grafana-plugin-sdk-go `gtime.RoundInterval`), in ms.
fn round_interval(ms: i64) -> i64 {
    const TABLE: &[(i64, i64)] = &[
        (15, 10),
        (35, 20),
        (75, 50),
        (150, 100),
        (350, 200),
        (750, 500),
        (1_500, 1_000),
        (3_500, 2_000),
        (7_500, 5_000),
        (12_500, 10_000),
        (17_500, 15_000),
        (25_000, 20_000),
        (45_000, 30_000),
        (90_000, 60_000),
        (210_000, 120_000),
        (450_000, 300_000),
        (750_000, 600_000),
        (1_050_000, 900_000),
        (1_500_000, 1_200_000),
        (2_700_000, 1_800_000),
        (5_400_000, 3_600_000),
        (9_000_000, 7_200_000),
        (16_200_000, 10_800_000),
        (32_400_000, 21_600_000),
        (86_400_000, 43_200_000),
        (172_800_000, 86_400_000),
        (604_800_000, 86_400_000),
        (1_814_400_000, 604_800_000),
    ];
    if let Some(&(_, r)) = TABLE.iter().find(|(limit, _)| ms <= *limit) {
        return r;
    }
    if ms < 3_628_800_000 {
        2_592_000_000
    } else {
        31_536_000_000
    }
}

/// The step of a range query over `[from, to]` ms (Grafana's
/// `calculatePrometheusInterval`): the range over the panel's
/// `max_data_points`, at least `min_interval` (the data source's
/// `timeInterval`), rounded; never finer than 11,000 points.
fn grafana_step(from: i64, to: i64, max_data_points: i64, min_interval: i64) -> i64 {
    let calculated = (to - from) / max_data_points;
    let calculated = if calculated < min_interval {
        min_interval
    } else {
        round_interval(calculated)
    };
    let safe = round_interval((to - from) / 11_000);
    calculated.max(safe)
}

/// Grafana's alignment of a range query's start and end: down to a
/// multiple of the step (`AlignTimeRange`, UTC).
fn align(t: i64, step: i64) -> i64 {
    t.div_euclid(step) * step
}

/// Seconds as Go's `strconv.FormatFloat(s, 'f', -1, 64)` writes them.
fn seconds(ms: i64) -> String {
    format!("{}", ms as f64 / 1000.0)
}

/// A Go `time.Duration.String()` of whole seconds (`$__rate_interval`).
fn go_duration(ms: i64) -> String {
    let s = ms / 1000;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

/// `$__rate_interval`: max(step + scrape interval, 4 × scrape interval).
fn rate_interval(step: i64, scrape: i64) -> i64 {
    (step + scrape).max(4 * scrape)
}

/// The data source's `timeInterval` (deploy/grafana/datasource.yml).
const TIME_INTERVAL_MS: i64 = 15_000;

#[test]
fn grafana_step_arithmetic_matches_grafanas_examples() {
    let h = 3_600_000;
    // The dashboard's default, last 6 hours, on a 1200-pixel panel:
    // 18 s rounds to 20 s.
    assert_eq!(grafana_step(0, 6 * h, 1200, TIME_INTERVAL_MS), 20_000);
    // Last hour: 3 s is below the scrape interval.
    assert_eq!(grafana_step(0, h, 1200, TIME_INTERVAL_MS), 15_000);
    // 30 days on 1000 pixels: 2592 s rounds to 30 min.
    assert_eq!(grafana_step(0, 720 * h, 1000, TIME_INTERVAL_MS), h / 2);
    // A wide panel over a year: 315 s would round to 5 min, but the
    // 11,000-point limit (2867 s, rounded to 1 h) decides.
    assert_eq!(grafana_step(0, 8760 * h, 100_000, 1), h);
    assert_eq!(align(1_700_000_017_000, 20_000), 1_700_000_000_000);
    assert_eq!(seconds(1_700_000_000_000), "1700000000");
    assert_eq!(seconds(500), "0.5");
    assert_eq!(go_duration(rate_interval(20_000, TIME_INTERVAL_MS)), "1m0s");
    assert_eq!(
        go_duration(rate_interval(3_600_000, TIME_INTERVAL_MS)),
        "1h0m15s"
    );
}

/// A request's parameters, in order.
type Form = Vec<(&'static str, String)>;

/// One request of a dashboard panel: a range query, or an instant one
/// at the range's end (a table's).
struct PanelQuery {
    title: String,
    expr: String,
    max_data_points: i64,
    instant: bool,
}

/// Every target of the dashboard's panels, variables at "All" (`.*`),
/// with the panel's width as its maxDataPoints (Grafana's default: one
/// point per pixel; 80 pixels per grid column on a 1920-pixel screen).
fn dashboard_panels() -> Vec<PanelQuery> {
    let path = flopwatch_tests::repo_root().join("deploy/grafana/flopwatch.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fn walk<'a>(ps: &'a Value, out: &mut Vec<&'a Value>) {
        for p in ps.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut panels = Vec::new();
    walk(&d["panels"], &mut panels);
    let mut out = Vec::new();
    for p in panels {
        let width = p["gridPos"]["w"].as_i64().unwrap_or(24);
        for t in p["targets"].as_array().into_iter().flatten() {
            let instant = t["instant"] == true;
            // Only a table sums over the dashboard's range at its end.
            assert_eq!(instant, p["type"] == "table", "{}", p["title"]);
            out.push(PanelQuery {
                title: format!("{} / {}", p["title"].as_str().unwrap_or("?"), t["refId"]),
                expr: t["expr"].as_str().unwrap().to_string(),
                max_data_points: width * 80,
                instant,
            });
        }
    }
    assert!(out.len() >= 20, "{} targets", out.len());
    out
}

/// `expr` as Grafana sends it: template variables at "All" (`.*`), its
/// own variables for `step`.
fn interpolate(expr: &str, step: i64, range_ms: i64) -> String {
    expr.replace("$tenant", ".*")
        .replace("$hostname", ".*")
        .replace("$job", ".*")
        .replace(
            "$__rate_interval",
            &go_duration(rate_interval(step, TIME_INTERVAL_MS)),
        )
        .replace("$__range", &format!("{}s", range_ms / 1000))
}

/// The form of a range panel's request over the last `range_ms`.
fn range_request(q: &PanelQuery, now: i64, range_ms: i64) -> (Form, i64) {
    let (from, to) = (now - range_ms, now);
    let step = grafana_step(from, to, q.max_data_points, TIME_INTERVAL_MS);
    let params = vec![
        ("query", interpolate(&q.expr, step, range_ms)),
        ("start", seconds(align(from, step))),
        ("end", seconds(align(to, step))),
        ("step", seconds(step)),
    ];
    (params, step)
}

// ---- The contract ------------------------------------------------------

/// "Save & test" of Grafana 10 and 11: `1+1` at `time=4` must answer the
/// scalar 2 at 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_and_test_values() {
    let env = Env::start(false).await;
    let want = r#"{"status":"success","data":{"resultType":"scalar","result":[4,"2"]}}"#;
    let r = env
        .get_raw("/api/v1/query?query=1%2B1&time=4", PROVIDER)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, want));
    let form = [("query", "1+1".to_string()), ("time", "4".to_string())];
    for t in [PROVIDER, &env.tenants[0].query_token] {
        let r = env.post("/api/v1/query", &form, Some(t)).await;
        assert_eq!((r.status, r.body.as_str()), (200, want));
    }
    // A query that does not parse is the client's fault: 400, not 422.
    let bad = [("query", "avg(".to_string()), ("time", "4".to_string())];
    env.post("/api/v1/query", &bad, Some(PROVIDER))
        .await
        .assert_error(400, "bad_data");
}

/// What the data source's settings page and the query editor ask before
/// any query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_setup_is_answered_as_by_prometheus() {
    let env = Env::start(true).await;
    let t = Some(env.tenants[0].query_token.as_str());
    let info = env.get("/api/v1/status/buildinfo", &[], t).await.data();
    assert_eq!(info["version"], flopwatch_collector::promql::API_VERSION);
    // Without `features`, Grafana takes it for a Prometheus (not Mimir,
    // Cortex or Thanos) of that version.
    assert!(info.get("features").is_none(), "{info}");
    for f in ["revision", "branch", "buildUser", "buildDate", "goVersion"] {
        assert!(info[f].is_string(), "{f}: {info}");
    }
    assert_eq!(
        env.get("/api/v1/metadata", &[], t).await.data(),
        serde_json::json!({})
    );
    let limited = [("limit", "1000".to_string())];
    assert_eq!(
        env.get("/api/v1/metadata", &limited, t).await.data(),
        serde_json::json!({})
    );
    assert_eq!(
        env.get("/api/v1/rules", &[], t).await.data(),
        serde_json::json!({"groups": []})
    );
    let now = SystemClock.now_ms();
    let ex = [
        ("query", "flopwatch_ofu_ratio".to_string()),
        ("start", seconds(now - 3_600_000)),
        ("end", seconds(now)),
    ];
    env.get("/api/v1/query_exemplars", &ex, t)
        .await
        .assert_error(404, "not_found");
    env.post("/api/v1/query_exemplars", &ex, t)
        .await
        .assert_error(404, "not_found");
}

/// The metric and label browser's requests are answered in Prometheus's
/// shape (sorted string arrays, label-set arrays), GET and POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsing_requests_are_answered_in_prometheus_shape() {
    let env = Env::start(false).await;
    let t = Some(PROVIDER);
    let range = env.browse_range(3600);
    env.get("/api/v1/labels", &range, t).await.strings();
    env.post("/api/v1/labels", &range, t).await.strings();
    env.get("/api/v1/label/__name__/values", &range, t)
        .await
        .strings();
    let mut series = range.to_vec();
    series.push(("match[]", "flopwatch_ofu_ratio".to_string()));
    for r in [
        env.get("/api/v1/series", &series, t).await,
        env.post("/api/v1/series", &series, t).await,
    ] {
        let d = r.data();
        for s in d.as_array().expect("an array of label sets") {
            assert!(s
                .as_object()
                .expect("a label set")
                .values()
                .all(Value::is_string));
        }
    }
    let mut var = range.to_vec();
    var.push(("match[]", "flopwatch_ofu_ratio".to_string()));
    env.get("/api/v1/label/job_id/values", &var, t)
        .await
        .strings();
    // Grafana retries a refused POST as a GET; a bad request is a 400.
    env.get("/api/v1/series", &range, t)
        .await
        .assert_error(400, "bad_data");
}

/// The browser and the variables see the ingested series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsing_and_variables_values() {
    let env = Env::start(false).await;
    let t = Some(PROVIDER);
    let range = env.browse_range(3600);
    let names = env.get("/api/v1/labels", &range, t).await.strings();
    for l in ["__name__", "tenant", "job_id", "hostname", "UUID", "gpu"] {
        assert!(names.iter().any(|n| n == l), "no label {l}: {names:?}");
    }
    let metrics = env
        .get("/api/v1/label/__name__/values", &range, t)
        .await
        .strings();
    for m in ["flopwatch_ofu_ratio", "flopwatch_gpu_power_watts"] {
        assert!(metrics.iter().any(|n| n == m), "no metric {m}: {metrics:?}");
    }
    let mut series = range.to_vec();
    series.push(("match[]", "flopwatch_ofu_ratio".to_string()));
    let sets = env.post("/api/v1/series", &series, t).await.data();
    let jobs: Vec<&str> = sets
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["__name__"], "flopwatch_ofu_ratio", "{s}");
            s["job_id"].as_str().unwrap_or_default()
        })
        .collect();
    for tn in &env.tenants {
        assert!(jobs.contains(&tn.job.as_str()), "{jobs:?}");
    }
    // label_values(flopwatch_ofu_ratio, job_id)
    let mut var = range.to_vec();
    var.push(("match[]", "flopwatch_ofu_ratio".to_string()));
    let want: Vec<String> = env.tenants.iter().map(|t| t.job.clone()).collect();
    assert_eq!(
        env.get("/api/v1/label/job_id/values", &var, t)
            .await
            .strings(),
        want
    );
    // label_values(flopwatch_ofu_ratio, tenant)
    let tenants = env
        .get("/api/v1/label/tenant/values", &var, t)
        .await
        .strings();
    assert_eq!(tenants, ["tenant-a", "tenant-b"]);
    // label_values(flopwatch_ofu_ratio{tenant=~"tenant-a"}, hostname)
    let mut one = range.to_vec();
    one.push((
        "match[]",
        r#"flopwatch_ofu_ratio{tenant=~"tenant-a"}"#.to_string(),
    ));
    assert_eq!(
        env.get("/api/v1/label/hostname/values", &one, t)
            .await
            .strings(),
        [env.tenants[0].host.clone()]
    );
    // label_values(job_id): no match[]
    assert_eq!(
        env.get("/api/v1/label/job_id/values", &range, t)
            .await
            .strings(),
        want
    );
}

/// Every panel of the dashboard, as Grafana requests it for the last 6
/// hours and the last hour: a matrix, points on the step grid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_panels_values() {
    let env = Env::start(true).await;
    let now = SystemClock.now_ms();
    for range_ms in [6 * 3_600_000, 3_600_000] {
        for q in dashboard_panels() {
            if q.instant {
                let params = vec![
                    ("query", interpolate(&q.expr, 15_000, range_ms)),
                    ("time", seconds(now)),
                ];
                let d = env
                    .post("/api/v1/query", &params, Some(PROVIDER))
                    .await
                    .data();
                assert_eq!(d["resultType"], "vector", "{}: {d}", q.title);
                continue;
            }
            let (params, step) = range_request(&q, now, range_ms);
            let d = env
                .post("/api/v1/query_range", &params, Some(PROVIDER))
                .await
                .data();
            assert_eq!(d["resultType"], "matrix", "{}: {d}", q.title);
            let start = align(now - range_ms, step);
            let end = align(now, step);
            for s in d["result"].as_array().unwrap() {
                for p in s["values"].as_array().unwrap() {
                    let t = (p[0].as_f64().unwrap() * 1000.0).round() as i64;
                    assert!(
                        t >= start && t <= end && (t - start) % step == 0,
                        "{}: {t}",
                        q.title
                    );
                    assert!(p[1].is_string(), "{}: {p}", q.title);
                }
            }
        }
    }
    // The fleet OFU panel: both GPUs' mean, (0.5 + 0.25) / 2, from the
    // first step after the samples on.
    let fleet = dashboard_panels()
        .into_iter()
        .find(|q| q.expr.starts_with("avg(flopwatch_ofu_ratio"))
        .unwrap();
    let (params, step) = range_request(&fleet, now, 3_600_000);
    let d = env
        .post("/api/v1/query_range", &params, Some(PROVIDER))
        .await
        .data();
    let values = d["result"][0]["values"]
        .as_array()
        .expect("a series")
        .clone();
    let last = values.last().expect("points");
    assert_eq!(last[1], "0.375", "{d}");
    let last_t = (last[0].as_f64().unwrap() * 1000.0).round() as i64;
    assert!(last_t >= env.seeded_at - step, "{d}");
    // The job and node panels read the derived series: one GPU each, so
    // each tenant's job and node hold that GPU's OFU. The seed's job
    // holds its GPU over the batch's 30 s; the panels are asked right
    // after it, while its samples are current (they go stale 10.3 s after
    // the last, docs/ATTRIBUTION.md).
    for family in ["flopwatch_job_ofu_ratio{", "flopwatch_node_ofu_ratio{"] {
        let q = dashboard_panels()
            .into_iter()
            .find(|q| q.expr.starts_with(family))
            .unwrap_or_else(|| panic!("no panel shows {family}"));
        let (params, _) = range_request(&q, env.seeded_at, 3_600_000);
        let d = env
            .post("/api/v1/query_range", &params, Some(PROVIDER))
            .await
            .data();
        let result = d["result"].as_array().expect("a matrix");
        assert_eq!(result.len(), env.tenants.len(), "{family}: {d}");
        for t in &env.tenants {
            let s = result
                .iter()
                .find(|s| s["metric"]["tenant"] == t.name)
                .unwrap_or_else(|| panic!("{family}: no series of {}: {d}", t.name));
            let label = if family.contains("job") {
                ("job_id", &t.job)
            } else {
                ("node", &t.node)
            };
            assert_eq!(s["metric"][label.0], label.1.as_str(), "{s}");
            let last = s["values"]
                .as_array()
                .unwrap()
                .last()
                .expect("points")
                .clone();
            assert_eq!(
                last[1].as_str().unwrap().parse::<f64>().unwrap(),
                t.ofu,
                "{s}"
            );
        }
    }
    // The ledger table: each tenant's job held GPU time over the range.
    let held = dashboard_panels()
        .into_iter()
        .find(|q| q.instant && q.expr.contains("flopwatch_ledger_held_seconds_total"))
        .expect("a ledger table");
    let params = vec![
        ("query", interpolate(&held.expr, 15_000, 3_600_000)),
        ("time", seconds(env.seeded_at + 60_000)),
    ];
    let d = env
        .post("/api/v1/query", &params, Some(PROVIDER))
        .await
        .data();
    let result = d["result"].as_array().expect("a vector");
    assert_eq!(result.len(), env.tenants.len(), "{d}");
    for t in &env.tenants {
        let s = result
            .iter()
            .find(|s| s["metric"]["tenant"] == t.name)
            .unwrap_or_else(|| panic!("no ledger row of {}: {d}", t.name));
        assert_eq!(s["metric"]["job_id"], t.job.as_str(), "{s}");
        let gpu_hours: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(gpu_hours > 0.0, "{s}");
    }
}

/// Grafana's health check is answered even when the engine refuses the
/// query: the error carries Prometheus's shape, never a 401 or a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_answer_in_prometheus_shape_success_or_error() {
    let env = Env::start(false).await;
    let now = SystemClock.now_ms();
    let r = env
        .get_raw("/api/v1/query?query=1%2B1&time=4", PROVIDER)
        .await;
    check_query_shape(&r, "scalar");
    for q in dashboard_panels().iter().take(4) {
        let (mut params, _) = range_request(q, now, 3_600_000);
        params.push(("timeout", "60s".to_string()));
        let r = env
            .post("/api/v1/query_range", &params, Some(PROVIDER))
            .await;
        check_query_shape(&r, "matrix");
    }
}

/// A success of `result_type`, or an error in Prometheus's shape (422 for
/// PromQL the engine does not evaluate).
fn check_query_shape(r: &Reply, result_type: &str) {
    assert_eq!(r.content_type, "application/json", "{r:?}");
    if r.status == 200 {
        assert_eq!(r.data()["resultType"], result_type, "{}", r.body);
    } else {
        assert!([400, 422, 503].contains(&r.status), "{r:?}");
        let e = r.json()["errorType"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        r.assert_error(r.status, &e);
    }
}

// ---- Tenant isolation ---------------------------------------------------

/// Every endpoint Grafana calls, as (method, path, params) for the last
/// hour.
fn endpoints(now: i64) -> Vec<(&'static str, &'static str, Form)> {
    let (start, end) = (seconds(now - 3_600_000), seconds(now));
    let range = vec![("start", start.clone()), ("end", end.clone())];
    let with = |extra: Vec<(&'static str, String)>| {
        let mut v = range.clone();
        v.extend(extra);
        v
    };
    let m = |s: &str| ("match[]", s.to_string());
    vec![
        (
            "GET",
            "/api/v1/query",
            vec![
                ("query", "flopwatch_ofu_ratio".into()),
                ("time", end.clone()),
            ],
        ),
        (
            "POST",
            "/api/v1/query",
            vec![
                ("query", "flopwatch_gpu_power_watts".into()),
                ("time", end.clone()),
            ],
        ),
        (
            "POST",
            "/api/v1/query_range",
            with(vec![
                ("query", "flopwatch_ofu_ratio".into()),
                ("step", "15".into()),
            ]),
        ),
        (
            "GET",
            "/api/v1/query_range",
            with(vec![
                (
                    "query",
                    "sum by (tenant, job_id, hostname, UUID) (flopwatch_gpu_power_watts)".into(),
                ),
                ("step", "60".into()),
            ]),
        ),
        (
            "GET",
            "/api/v1/series",
            with(vec![m("flopwatch_ofu_ratio")]),
        ),
        (
            "POST",
            "/api/v1/series",
            with(vec![m("{__name__=~\"flopwatch_.*\"}")]),
        ),
        ("GET", "/api/v1/labels", range.clone()),
        (
            "POST",
            "/api/v1/labels",
            with(vec![m("flopwatch_ofu_ratio")]),
        ),
        ("GET", "/api/v1/label/__name__/values", range.clone()),
        ("GET", "/api/v1/label/tenant/values", range.clone()),
        (
            "GET",
            "/api/v1/label/job_id/values",
            with(vec![m("flopwatch_ofu_ratio")]),
        ),
        ("GET", "/api/v1/label/hostname/values", range.clone()),
        ("GET", "/api/v1/label/UUID/values", range.clone()),
        ("GET", "/api/v1/status/buildinfo", vec![]),
        ("GET", "/api/v1/metadata", vec![]),
        ("GET", "/api/v1/rules", vec![]),
    ]
}

async fn call(
    env: &Env,
    method: &str,
    path: &str,
    p: &[(&str, String)],
    token: Option<&str>,
) -> Reply {
    match method {
        "GET" => env.get(path, p, token).await,
        _ => env.post(path, p, token).await,
    }
}

/// Which tenants' markers appear in `body`.
fn seen<'a>(env: &'a Env, body: &str) -> Vec<&'a str> {
    env.tenants
        .iter()
        .filter(|t| t.markers().iter().any(|m| body.contains(m.as_str())))
        .map(|t| t.name)
        .collect()
}

/// No token and wrong tokens get 401 on every endpoint; a tenant's token
/// gets nothing of the other tenant's, in answers or errors.
async fn isolation(tls: bool) {
    let env = Env::start(tls).await;
    let now = SystemClock.now_ms();
    let a_agent = env.tenants[0].agent_token.clone();
    let wrong: [Option<&str>; 4] = [None, Some("not-a-token"), Some(""), Some(a_agent.as_str())];
    let mut checked = 0;
    for (method, path, params) in endpoints(now) {
        for token in wrong {
            let r = call(&env, method, path, &params, token).await;
            r.assert_error(401, "unauthorized");
            assert!(
                seen(&env, &r.body).is_empty(),
                "{method} {path}: {}",
                r.body
            );
            checked += 1;
        }
        for (i, t) in env.tenants.iter().enumerate() {
            let r = call(&env, method, path, &params, Some(&t.query_token)).await;
            assert_ne!(r.status, 401, "{method} {path} {}: {}", t.name, r.body);
            let other = &env.tenants[1 - i];
            assert!(
                !seen(&env, &r.body).contains(&other.name),
                "{method} {path}: {} sees {}: {}",
                t.name,
                other.name,
                r.body
            );
            checked += 1;
        }
        let r = call(&env, method, path, &params, Some(PROVIDER)).await;
        assert_ne!(r.status, 401, "{method} {path} provider: {}", r.body);
    }
    assert!(checked >= 16 * 6, "{checked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_series_on_every_endpoint() {
    isolation(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_series_on_every_endpoint_over_tls() {
    isolation(true).await;
    // TLS only: a plain-HTTP request to the TLS port gets no answer.
    let env = Env::start(true).await;
    let plain = env.server.api_url.replacen("https://", "http://", 1);
    let got = reqwest::Client::new()
        .get(format!("{plain}/api/v1/labels"))
        .bearer_auth(PROVIDER)
        .send()
        .await;
    assert!(
        got.as_ref().map_or(true, |r| !r.status().is_success()),
        "{got:?}"
    );
}

/// Each tenant's token sees its own series on every data endpoint, the
/// provider both tenants'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_values() {
    let env = Env::start(true).await;
    let now = SystemClock.now_ms();
    for (method, path, params) in endpoints(now) {
        // Answers of names only (label names, metric names) carry no
        // tenant's strings.
        let names_only = ["status", "metadata", "rules", "/labels", "__name__"];
        if names_only.iter().any(|n| path.contains(n)) {
            continue;
        }
        for t in &env.tenants {
            let r = call(&env, method, path, &params, Some(&t.query_token)).await;
            r.data();
            assert_eq!(seen(&env, &r.body), [t.name], "{method} {path}: {}", r.body);
        }
        let r = call(&env, method, path, &params, Some(PROVIDER)).await;
        r.data();
        assert_eq!(
            seen(&env, &r.body),
            ["tenant-a", "tenant-b"],
            "{method} {path}: {}",
            r.body
        );
    }
}
