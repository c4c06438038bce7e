//! Bounded work per query, over a real listener: hostile shapes refused
//! before parsing, the deepest allowed ones evaluated on the query stack,
//! the sample and series limits, cancellation at the timeout, each
//! counted on `/metrics`; and generated expressions that never get a 5xx
//! nor take the API down.

use super::*;
use crate::auth::{digest, Auth};
use crate::store::{memory::MemEngine, CommitSet, GpuRecord, NodeRecord, Store};
use crate::store::{Cf, Engine as StoreEngine, Op, StoreError, View};
use flopwatch_config::{CollectorConfig, QueryToken, SpecTable, TenantConfig, MAX_QUERY_DEPTH};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::model::{Point, SeriesBatch};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

const T: i64 = 1_700_000_000_000;

/// Tenant `acme`: `gpus` GPUs of one node, power and energy each second
/// for a minute before `T`.
fn store(engine: Arc<dyn StoreEngine>, gpus: usize) -> Store {
    let s = Store::new(engine, false);
    let points = |f: &dyn Fn(i64) -> f64| -> Vec<Point> {
        (0..60)
            .map(|i| Point {
                ts_ms: T - 60_000 + 1_000 * i,
                value: f(i),
                peak: None,
                window_ms: Some(1_000),
            })
            .collect()
    };
    for g in 0..gpus {
        let uuid = format!("GPU-{g}");
        let set = CommitSet {
            series: vec![
                SeriesBatch {
                    gpu_uuid: uuid.clone(),
                    metric: "power_w".into(),
                    points: points(&|i| 100.0 + i as f64),
                },
                SeriesBatch {
                    gpu_uuid: uuid.clone(),
                    metric: "energy_j".into(),
                    points: points(&|i| (10 * i) as f64),
                },
            ],
            gpus: vec![GpuRecord {
                uuid,
                index: g as u32,
                node_id: "n1".into(),
                model: "H100".into(),
                ..Default::default()
            }],
            nodes: vec![NodeRecord {
                node_id: "n1".into(),
                hostname: "host-1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        s.commit("acme", &set).unwrap();
    }
    s
}

/// A collector over `store` with `api`'s settings; its API on
/// `127.0.0.1:0`. Tokens: `acme-read` (tenant `acme`), `provider`.
async fn serve_with(
    store: Store,
    api: flopwatch_config::PrometheusApiConfig,
) -> (String, Arc<Collector>) {
    let cfg = CollectorConfig {
        admin_tokens_sha256: vec![digest("provider")],
        tenants: vec![TenantConfig {
            name: "acme".into(),
            query_tokens: vec![QueryToken {
                sha256: digest("acme-read"),
            }],
            ..Default::default()
        }],
        prometheus_api: api,
        ..Default::default()
    };
    let c = Collector::new(
        store,
        SpecTable::builtin(),
        Auth::from_config(&cfg),
        crate::Settings::from_config(&cfg, Vec::new()),
        Arc::new(flopwatch_proto::clock::ManualClock::new(T)),
    )
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(serve(c.clone(), l, None, std::future::pending()));
    (url, c)
}

async fn query(url: &str, path: &str, form: &[(&str, &str)]) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth("acme-read")
        .form(form)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn instant(url: &str, q: &str) -> (u16, String) {
    let t = (T / 1000).to_string();
    query(url, "/api/v1/query", &[("query", q), ("time", &t)]).await
}

/// The value of `name{labels}` on the collector's `/metrics` page (0 when
/// absent).
fn metric(c: &Arc<Collector>, line_start: &str) -> f64 {
    let scrape = flopwatch_transport::metrics_http::Scrape {
        token: Some("provider"),
        params: &[],
    };
    let page = crate::exporter::page(c, &scrape).unwrap();
    page.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// The shapes that overflowed the stack before the limits, and the API
/// still answering afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_shapes_get_a_400_naming_the_limit_and_the_api_keeps_answering() {
    let (url, c) = serve_with(store(Arc::new(MemEngine::new()), 2), Default::default()).await;
    let nest =
        |f: &str, n: usize| format!("{}flopwatch_gpu_power_watts{}", f.repeat(n), ")".repeat(n));
    let hostile = [
        nest("abs(", 10_000),
        nest("sum(", 5_000),
        nest("(", 4_000),
        vec!["x"; 5_000].join(" + "),
        vec!["1"; 1_000].join("+"),
        vec!["x"; 20_000].join(" + "),
        format!("{}1", "-".repeat(3_000)),
    ];
    let started = Stopwatch::start();
    for q in &hostile {
        let (code, body) = instant(&url, q).await;
        assert_eq!(code, 400, "{}…: {body}", &q[..30]);
        assert!(body.contains("max_query_depth"), "{body}");
        let t = (T / 1000).to_string();
        let (code, body) = query(
            &url,
            "/api/v1/query_range",
            &[("query", q), ("start", &t), ("end", &t), ("step", "15")],
        )
        .await;
        assert_eq!(code, 400, "{body}");
    }
    // Checked before parsing: the whole batch is answered at once.
    eprintln!(
        "{} hostile queries refused in {:?}",
        2 * hostile.len(),
        started.elapsed()
    );
    let long = format!(
        "flopwatch_gpu_power_watts{{UUID=\"{}\"}}",
        "x".repeat(200_000)
    );
    let (code, body) = instant(&url, &long).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("max_query_bytes"), "{body}");
    // Series selectors are checked too.
    let deep = nest("(", 300);
    let (code, body) = query(&url, "/api/v1/series", &[("match[]", &deep)]).await;
    assert_eq!(code, 400, "{body}");
    // Still answering, and every refusal counted.
    let (code, body) = instant(&url, "sum(flopwatch_gpu_power_watts)").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        metric(
            &c,
            "flopwatch_query_limited_total{limit=\"max_query_depth\"}"
        ),
        (2 * hostile.len() + 1) as f64
    );
    assert_eq!(
        metric(
            &c,
            "flopwatch_tenant_query_limited_total{tenant=\"acme\",limit=\"max_query_bytes\"}"
        ),
        1.0
    );
}

/// Each shape at the deepest depth the configuration accepts, parsed,
/// evaluated and dropped on a query thread: none overflows its stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deepest_allowed_queries_fit_the_stack() {
    let api = flopwatch_config::PrometheusApiConfig {
        max_query_depth: MAX_QUERY_DEPTH,
        ..Default::default()
    };
    let (url, _c) = serve_with(store(Arc::new(MemEngine::new()), 2), api).await;
    let x = "flopwatch_gpu_power_watts";
    // Each within MAX_QUERY_DEPTH by the guard's count.
    let d = MAX_QUERY_DEPTH;
    let nest =
        |open: &str, close: &str, n: usize| format!("{}{x}{}", open.repeat(n), close.repeat(n));
    let shapes = [
        nest("abs(", ")", d - 1),
        nest("sum(", ")", d - 1),
        nest("(", ")", d - 1),
        nest("-(", ")", d / 2 - 1),
        nest("sum by (node) (", ")", d / 2 - 1),
        nest("max_over_time(", "[1m:10s])", d / 2 - 1),
        nest(
            "label_replace(",
            ", \"a\", \"$1\", \"node\", \"(.*)\")",
            d - 1,
        ),
        vec![x; d].join(" + "),
        vec![x; d].join(" and "),
        vec!["2"; d].join(" ^ "),
        format!("{}{x}", "-".repeat(d - 1)),
    ];
    for q in &shapes {
        assert!(guard::depth_bound(q) <= d, "{}…", &q[..40]);
        let (code, body) = instant(&url, q).await;
        // Answered or refused as a query, never a crash or a 5xx.
        assert!(code < 500, "{}…: {code} {body}", &q[..40]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_and_series_limits_stop_a_query_with_a_422() {
    let api = flopwatch_config::PrometheusApiConfig {
        max_series: 3,
        max_samples: 200,
        ..Default::default()
    };
    let (url, c) = serve_with(store(Arc::new(MemEngine::new()), 4), api).await;
    // Four GPUs' power: more series than allowed.
    let (code, body) = instant(&url, "flopwatch_gpu_power_watts").await;
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("max_series"), "{body}");
    // Two GPUs' minute of power at 1 s steps: 120 samples read and 122
    // points computed, over 200 in all.
    let t = (T / 1000).to_string();
    let from = (T / 1000 - 60).to_string();
    let (code, body) = query(
        &url,
        "/api/v1/query_range",
        &[
            ("query", "flopwatch_gpu_power_watts{gpu=~\"0|1\"}"),
            ("start", &from),
            ("end", &t),
            ("step", "1"),
        ],
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("too many samples"), "{body}");
    // Within the limits.
    let (code, body) = instant(&url, "flopwatch_gpu_power_watts{gpu=\"0\"}").await;
    assert_eq!(code, 200, "{body}");
    for (limit, n) in [("max_series", 1.0), ("max_samples", 1.0)] {
        let line =
            format!("flopwatch_tenant_query_limited_total{{tenant=\"acme\",limit=\"{limit}\"}}");
        assert_eq!(metric(&c, &line), n, "{limit}");
    }
}

/// Every scan sleeps, and is counted.
#[derive(Default)]
struct Slow {
    inner: MemEngine,
    scans: AtomicU64,
}

impl StoreEngine for Slow {
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        self.inner.apply(ops, sync)
    }
    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        self.inner.view(f)
    }
    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.inner.compact_range(cf, from, to)
    }
    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.inner.delete_range(cf, from, to)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(cf, key)
    }
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        self.inner.scan(cf, from, to, f)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_timeout_gets_a_503_and_stops_working() {
    let slow = Arc::new(Slow::default());
    let (url, c) = serve_with(store(slow.clone(), 40), Default::default()).await;
    // Each series read takes several slow scans: 40 GPUs × 2 families
    // take well over a second.
    let t = (T / 1000).to_string();
    let (code, body) = query(
        &url,
        "/api/v1/query",
        &[
            (
                "query",
                "count_over_time({__name__=~\"flopwatch_gpu_.*\"}[1m])",
            ),
            ("time", &t),
            ("timeout", "0.2"),
        ],
    )
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"errorType\":\"timeout\""), "{body}");
    // The evaluation notices at its next check and ends: its turn is
    // given back, and it scans no more.
    let deadline = Deadline::after(Duration::from_secs(10));
    while c.stats.queries_running.load(Ordering::Relaxed) > 0 {
        assert!(!deadline.passed(), "the query kept running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = slow.scans.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(slow.scans.load(Ordering::SeqCst), after);
    assert_eq!(
        metric(
            &c,
            "flopwatch_tenant_query_limited_total{tenant=\"acme\",limit=\"timeout\"}"
        ),
        1.0
    );
}

/// PromQL text: real expressions built from the language's parts, some
/// deep, some long, some broken.
fn expr() -> impl Strategy<Value = String> {
    let selector = prop_oneof![
        Just("flopwatch_gpu_power_watts".to_string()),
        Just("flopwatch_gpu_energy_joules_total".to_string()),
        Just("flopwatch_ofu_ratio".to_string()),
        Just("{__name__=~\"flopwatch_.+\"}".to_string()),
        Just("flopwatch_gpu_power_watts{gpu=~\"0|1\", node!=\"x\"}".to_string()),
        Just("nope".to_string()),
        Just("{a=\"b\"}".to_string()),
    ];
    let range = prop_oneof![
        Just("[1m]"),
        Just("[5s]"),
        Just("[1m:10s]"),
        Just("[0s]"),
        Just("[30d]")
    ];
    let leaf = prop_oneof![
        selector.clone(),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        Just("time()".to_string()),
        Just("vector(1)".to_string()),
        Just("\"s\"".to_string()),
        (selector.clone(), range.clone()).prop_map(|(s, r)| format!("{s}{r}")),
    ];
    let funcs = [
        "abs",
        "absent",
        "ceil",
        "exp",
        "floor",
        "ln",
        "sqrt",
        "rate",
        "irate",
        "increase",
        "delta",
        "deriv",
        "resets",
        "changes",
        "avg_over_time",
        "max_over_time",
        "quantile_over_time",
        "histogram_quantile",
        "label_replace",
        "sort",
        "scalar",
        "timestamp",
        "round",
        "clamp",
        "holt_winters",
        "predict_linear",
        "absent_over_time",
    ];
    let aggs = [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "topk",
        "bottomk",
        "quantile",
        "stddev",
        "group",
        "count_values",
    ];
    let ops = [
        "+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless",
        "atan2",
    ];
    leaf.prop_recursive(6, 64, 4, move |inner| {
        prop_oneof![
            (
                proptest::sample::select(funcs.to_vec()),
                proptest::collection::vec(inner.clone(), 0..4)
            )
                .prop_map(|(f, a)| format!("{f}({})", a.join(", "))),
            (
                proptest::sample::select(aggs.to_vec()),
                inner.clone(),
                inner.clone(),
                any::<bool>()
            )
                .prop_map(|(a, p, e, by)| {
                    let m = if by { " by (node)" } else { " without (gpu)" };
                    if matches!(a, "topk" | "bottomk" | "quantile" | "count_values") {
                        format!("{a}{m} ({p}, {e})")
                    } else {
                        format!("{a}{m} ({e})")
                    }
                }),
            (
                inner.clone(),
                proptest::sample::select(ops.to_vec()),
                inner.clone(),
                0..4u8
            )
                .prop_map(|(l, o, r, m)| {
                    let m = ["", " bool", " on (gpu)", " ignoring (gpu) group_left"][m as usize];
                    format!("{l} {o}{m} {r}")
                }),
            inner.clone().prop_map(|e| format!("({e})")),
            inner.clone().prop_map(|e| format!("-{e}")),
            (inner.clone(), range.clone()).prop_map(|(e, r)| format!("({e}){r}")),
            inner.clone().prop_map(|e| format!("{e} offset 1m")),
            inner.clone().prop_map(|e| format!("{e} @ 1700000000")),
            // Deep and long, past the limits or near them.
            (inner.clone(), 1..400usize).prop_map(|(e, n)| format!(
                "{}{e}{}",
                "abs(".repeat(n),
                ")".repeat(n)
            )),
            (inner.clone(), 1..400usize).prop_map(|(e, n)| vec![e; n].join(" + ")),
            // Broken text.
            (inner.clone(), any::<usize>(), any::<u8>()).prop_map(|(e, at, c)| {
                let mut b = e.into_bytes();
                let at = at % (b.len() + 1);
                b.insert(at, c % 128);
                String::from_utf8_lossy(&b).into_owned()
            }),
            (inner, any::<usize>()).prop_map(|(e, at)| {
                let cut = at % (e.len() + 1);
                e.chars().take(cut).collect::<String>()
            }),
        ]
    })
}

/// Generated expressions through the HTTP query path: every answer is
/// Prometheus-shaped JSON, none is a 5xx, and the API answers afterwards.
#[test]
fn generated_queries_never_get_a_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (url, _c) = rt.block_on(serve_with(
        store(Arc::new(MemEngine::new()), 3),
        Default::default(),
    ));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    // At most 300 kB: past max_query_bytes, within the HTTP body limit.
    let text = expr().prop_map(|q| q.chars().take(300_000).collect::<String>());
    runner
        .run(&(text, any::<bool>()), |(q, ranged)| {
            let t = (T / 1000).to_string();
            let from = (T / 1000 - 120).to_string();
            let (code, body) = rt.block_on(async {
                if ranged {
                    query(
                        &url,
                        "/api/v1/query_range",
                        &[("query", &q), ("start", &from), ("end", &t), ("step", "10")],
                    )
                    .await
                } else {
                    instant(&url, &q).await
                }
            });
            prop_assert!(code < 500, "{q}: {code} {body}");
            let v: serde_json::Value = serde_json::from_str(&body)
                .map_err(|e| TestCaseError::fail(format!("{q}: {e}: {body}")))?;
            prop_assert!(v["status"] == "success" || v["status"] == "error", "{body}");
            Ok(())
        })
        .unwrap();
    let (code, _) = rt.block_on(instant(&url, "1+1"));
    assert_eq!(code, 200);
}
