//! The PromQL compliance suite's query shapes (prometheus/compliance,
//! `promql/promql-test-queries.yml` and its variant lists), written anew
//! on flopwatch's metric names, answered by flopwatch's Prometheus API and
//! by a real Prometheus 2.42 (Debian package `prometheus`) holding the
//! same samples.
//!
//! The fixture is two hours of a 12-GPU fleet of two tenants, sampled
//! every 5 s: gauges that wander, a counter with resets, a clock that
//! steps, a constant, a family with 10-minute gaps, and a GPU that changes
//! jobs half-way. flopwatch gets it through gRPC ingest (a stream per
//! node); Prometheus as OpenMetrics turned into TSDB blocks, labelled as
//! flopwatch labels its series, with the OFU flopwatch derived.
//!
//! Each query is asked at three instants and over two ranges. An answer
//! agrees when both succeed with the same label sets, times and values
//! (within a relative 1e-6, NaN equal to NaN; the order too for `sort`),
//! or when both refuse the query. flopwatch may never answer 5xx, and at
//! least 95 % of the answers must agree; every disagreement is printed.

use flopwatch_collector::{digest, Auth};
use flopwatch_config::{CollectorConfig, TenantConfig};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::v1::{self, collector_message};
use flopwatch_tests::prom::{openmetrics_blocks, Prometheus};
use flopwatch_tests::promql::{canon_json, differ, Canon};
use flopwatch_tests::raw::RawAgent;
use flopwatch_tests::TestCollector;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

const STEP: i64 = 5_000;
const SAMPLES: i64 = 1_440;
const MIN: i64 = 60_000;

/// One GPU: tenant, node, index on the node, UUID.
struct Gpu {
    tenant: &'static str,
    node: String,
    index: usize,
    uuid: String,
}

fn gpus() -> Vec<Gpu> {
    let mut out = Vec::new();
    for (n, tenant) in ["tenant-a", "tenant-a", "tenant-b", "tenant-b"]
        .into_iter()
        .enumerate()
    {
        for index in 0..3 {
            out.push(Gpu {
                tenant,
                node: format!("n{}", n + 1),
                index,
                uuid: format!("GPU-{n}{index}"),
            });
        }
    }
    out
}

/// The job GPU `g` runs at sample `k`: id and start sample.
fn job(g: usize, k: i64) -> Option<(&'static str, i64)> {
    match g {
        0..=2 => Some(("train-1", 0)),
        3 if k < SAMPLES / 2 => Some(("infer-2", 0)),
        3 => Some(("train-3", SAMPLES / 2)),
        6..=8 => Some(("b-train", 0)),
        _ => None,
    }
}

/// A xorshift stream in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Catalog metric, OpenMetrics family, type, sample name.
const FAMILIES: [(&str, &str, &str, &str); 9] = [
    (
        "mem_used_bytes",
        "flopwatch_gpu_mem_used_bytes",
        "gauge",
        "flopwatch_gpu_mem_used_bytes",
    ),
    (
        "nvlink_links_active",
        "flopwatch_gpu_nvlink_links_active",
        "gauge",
        "flopwatch_gpu_nvlink_links_active",
    ),
    (
        "energy_j",
        "flopwatch_gpu_energy_joules",
        "counter",
        "flopwatch_gpu_energy_joules_total",
    ),
    (
        "temp_c",
        "flopwatch_gpu_temp_celsius",
        "gauge",
        "flopwatch_gpu_temp_celsius",
    ),
    (
        "sm_clock_mhz",
        "flopwatch_gpu_sm_clock_hertz",
        "gauge",
        "flopwatch_gpu_sm_clock_hertz",
    ),
    (
        "compute_processes",
        "flopwatch_gpu_compute_processes",
        "gauge",
        "flopwatch_gpu_compute_processes",
    ),
    (
        "power_w",
        "flopwatch_gpu_power_watts",
        "gauge",
        "flopwatch_gpu_power_watts",
    ),
    (
        "tensor_active",
        "flopwatch_gpu_tensor_active_ratio",
        "gauge",
        "flopwatch_gpu_tensor_active_ratio",
    ),
    (
        "sm_clock_avg_mhz",
        "flopwatch_gpu_sm_clock_avg_hertz",
        "gauge",
        "flopwatch_gpu_sm_clock_avg_hertz",
    ),
];

/// Sample `k` of GPU `g`'s catalog `metric` (in the catalog's unit), or
/// none (the gaps).
fn value(g: usize, metric: &str, k: i64, r: &mut Rng) -> Option<f64> {
    let gf = g as f64;
    Some(match metric {
        "mem_used_bytes" => (1e10 + 1e9 * gf + 4e9 * r.next()).round(),
        "nvlink_links_active" => {
            if g == 5 {
                12.0
            } else {
                18.0
            }
        }
        // Power integrated; GPUs 0..3 reset half-way through.
        "energy_j" => {
            let k = if g < 4 && k >= 700 { k - 700 } else { k };
            (k as f64 * (300.0 + 10.0 * gf) * 5.0).round()
        }
        "temp_c" => 40.0 + gf + 0.01 * k as f64 + (2.0 * r.next()).round() / 2.0,
        "sm_clock_mhz" => [1410.0, 1755.0, 1980.0][((k / 120 + g as i64) % 3) as usize],
        "compute_processes" if (k / 120) % 2 == 1 => return None,
        "compute_processes" => (1 + g % 3) as f64,
        "power_w" => (100.0 + 600.0 * r.next()).round(),
        "tensor_active" if g == 11 => 0.0,
        "tensor_active" => (r.next() * 1e4).round() / 1e4,
        "sm_clock_avg_mhz" => 1000.0 + (980.0 * r.next()).round(),
        _ => unreachable!("{metric}"),
    })
}

/// Every catalog metric the agents send.
const METRICS: [&str; 9] = [
    "mem_used_bytes",
    "nvlink_links_active",
    "energy_j",
    "temp_c",
    "sm_clock_mhz",
    "compute_processes",
    "power_w",
    "tensor_active",
    "sm_clock_avg_mhz",
];

/// The OpenMetrics label text of GPU `g` at sample `k`, as flopwatch
/// labels it.
fn labels(g: &Gpu, gi: usize, k: i64) -> String {
    let host = format!("host-{}", g.node);
    let gpu = g.index.to_string();
    let mut l: Vec<(&str, String)> = vec![
        ("UUID", g.uuid.clone()),
        ("gpu", gpu),
        ("hostname", host),
        ("modelName", "NVIDIA H100 80GB HBM3".into()),
        ("node", g.node.clone()),
        ("tenant", g.tenant.to_string()),
    ];
    if let Some((j, _)) = job(gi, k) {
        l.push(("job_id", j.into()));
        l.push(("namespace", "ml".into()));
        l.push(("pod", format!("{j}-pod")));
    }
    l.sort();
    let parts: Vec<String> = l.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{{{}}}", parts.join(","))
}

/// The query list: the compliance suite's shapes with its variant lists,
/// on flopwatch's names.
fn queries() -> Vec<String> {
    let g = "flopwatch_gpu_mem_used_bytes";
    let n = "flopwatch_gpu_nvlink_links_active";
    let c = "flopwatch_gpu_energy_joules_total";
    let d = "flopwatch_gpu_temp_celsius";
    let b = "flopwatch_gpu_sm_clock_hertz";
    let i = "flopwatch_gpu_compute_processes";
    let o = "flopwatch_ofu_ratio";
    let ranges = ["1s", "15s", "1m", "5m", "15m", "1h"];
    let offsets = ["1m", "5m", "10m"];
    let aggr = ["sum", "avg", "max", "min", "count", "stddev", "stdvar"];
    let quantiles = [
        "-0.5", "0.1", "0.5", "0.75", "0.95", "0.90", "0.99", "1", "1.5",
    ];
    let arith = ["+", "-", "*", "/", "%", "^"];
    let comp = ["==", "!=", "<", ">", "<=", ">="];
    let bin: Vec<&str> = arith.iter().chain(&comp).copied().collect();
    let math = [
        "abs", "ceil", "floor", "exp", "sqrt", "ln", "log2", "log10", "round",
    ];
    let dates = [
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "hour",
        "minute",
        "month",
        "year",
    ];
    let time_aggr = [
        "avg", "min", "max", "sum", "count", "stddev", "stdvar", "last", "present",
    ];
    let mut q: Vec<String> = Vec::new();
    let mut add = |s: String| q.push(s);
    // Scalar literals.
    for s in [
        "42", "1.234", ".123", "1.23e-3", "0x3d", "Inf", "+Inf", "-Inf", "NaN",
    ] {
        add(s.into());
    }
    // Selectors.
    for s in [
        g.to_string(),
        format!("{{__name__=\"{g}\"}}"),
        format!("{g}{{gpu=\"0\"}}"),
        format!("{g}{{gpu!=\"0\"}}"),
        format!("{g}{{node=~\"n.*\"}}"),
        format!("{g}{{node=~\"n\"}}"),
        format!("{g}{{node!~\".*1\"}}"),
        format!("{g}{{gpu=\"0\", node!=\"n1\"}}"),
        "{gpu=\"0\", node!=\"n1\"}".into(),
        "{__name__=~\".*\"}".into(),
        "nonexistent_metric_name".into(),
        i.to_string(),
        o.to_string(),
        format!("{o}{{job_id=\"infer-2\"}}"),
        format!("{g}{{tenant=\"tenant-b\", job_id=\"\"}}"),
    ] {
        add(s);
    }
    for off in offsets {
        add(format!("{g} offset {off}"));
        add(format!("{g} offset -{off}"));
    }
    // Aggregations.
    for a in aggr {
        for m in [
            format!("{a}({g})"),
            format!("{a}(nonexistent_metric_name)"),
            format!("{a} by() ({g})"),
            format!("{a} by(node) ({g})"),
            format!("{a} by(node, gpu) ({g})"),
            format!("{a} by(nonexistent) ({g})"),
            format!("{a} without() ({g})"),
            format!("{a} without(node) ({g})"),
            format!("{a} without(node, gpu) ({g})"),
            format!("{a} without(nonexistent) ({g})"),
        ] {
            add(m);
        }
    }
    for t in ["topk", "bottomk"] {
        add(format!("{t} (3, {g})"));
        add(format!("{t} by(node) (2, {g})"));
        add(format!("{t} without(node) (2, {g})"));
        add(format!("{t} without() (2, {g})"));
    }
    for p in quantiles {
        add(format!("quantile({p}, {g})"));
    }
    add(format!("avg(max by(gpu) ({g}))"));
    add(format!("group({g})"));
    add(format!("group by (tenant) ({g})"));
    add(format!("count_values(\"value\", {n})"));
    add(format!("count_values by (tenant) (\"links\", {n})"));
    // Binary operators.
    add("1 * 2 + 4 / 6 - 10 % 2 ^ 2".into());
    for op in comp {
        add(format!("{n} + (1 {op} bool 2)"));
        add(format!("{g} {op} bool 1.2345"));
        add(format!("1.2345 {op} bool {g}"));
        add(format!("{g} {op} bool on(tenant, node, gpu) {g}"));
    }
    for op in &bin {
        add(format!("{g} {op} 1.2345"));
        add(format!("0.12345 {op} {g}"));
        add(format!("(1 * 2 + 4 / 6 - (10%7)^2) {op} {g}"));
        add(format!("{g} {op} (1 * 2 + 4 / 6 - 10)"));
        add(format!("{g} {op} on(tenant, node, gpu) {g}"));
        add(format!(
            "sum by(tenant, node, gpu) ({g}) {op} on(tenant, node, gpu) group_left(UUID) {g}"
        ));
    }
    add(format!("timestamp({g} * 1)"));
    add(format!("timestamp(-{g})"));
    add(format!("{g} / on(tenant, node, gpu, __name__) {g}"));
    add(format!("sum without(UUID) ({g}) / on(node, gpu) {g}"));
    add(format!(
        "sum without(UUID) ({g}) / on(node, gpu) group_left {g}"
    ));
    add(format!(
        "sum without(UUID) ({g}) / on(node, gpu) group_left(UUID) {g}"
    ));
    add(format!(
        "{g} / on(tenant, node) group_left sum by (tenant, node) ({n})"
    ));
    add(format!(
        "sum by (tenant, node) ({n}) / on(tenant, node) group_right {g}"
    ));
    add(format!("{g} / on(tenant, node) group_left {n}"));
    add(format!("{g} / on(tenant, node, gpu, non_existent) {g}"));
    add(format!("{g} + on(node) {g}"));
    add(format!("{g} atan2 {n}"));
    add(format!("{g} atan2 1"));
    // Set operators.
    add(format!("{g} and {g}{{gpu=\"0\"}}"));
    add(format!("{g} and on(node) {i}"));
    add(format!("{g}{{node=\"n1\"}} or {n}"));
    add(format!("{g} unless {g}{{node=\"n1\"}}"));
    add(format!("{g} unless on(tenant) {g}{{tenant=\"tenant-a\"}}"));
    add(format!("{i} or {g}"));
    add(format!("sum({g}) or vector(0)"));
    add("sum(nonexistent_metric_name) or vector(0)".into());
    add(format!("{g} and ignoring(gpu, UUID) {i}"));
    // NaN and infinities.
    for v in ["Inf", "-Inf", "NaN"] {
        add(format!("{n} * {v}"));
    }
    // Unary expressions.
    add(format!("{g} + -(1)"));
    add(format!("-{g}"));
    add("-1 ^ 2".into());
    // Binary operators with non-constant scalars.
    for op in arith {
        add(format!("1 {op} time()"));
        add(format!("time() {op} 1"));
        add(format!("time() {op} time()"));
    }
    for op in comp {
        add(format!("time() {op} bool 1"));
        add(format!("1 {op} bool time()"));
        add(format!("time() {op} bool time()"));
    }
    for op in &bin {
        add(format!("time() {op} {g}"));
        add(format!("{g} {op} time()"));
    }
    // Functions.
    for f in time_aggr {
        for r in ranges {
            add(format!("{f}_over_time({g}[{r}])"));
        }
    }
    for p in ["0.1", "0.5", "0.75", "0.95", "0.99", "1"] {
        for r in ranges {
            add(format!("quantile_over_time({p}, {g}[{r}])"));
        }
    }
    add(format!("timestamp({n})"));
    add(format!("timestamp(timestamp({n}))"));
    for f in math {
        add(format!("{f}({g})"));
        add(format!("{f}(-{g})"));
    }
    for f in [
        "sgn", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh",
        "tan", "tanh", "deg", "rad",
    ] {
        add(format!("{f}({o})"));
    }
    add("pi()".into());
    add(format!("round({g}, 1000)"));
    for f in ["delta", "rate", "increase"] {
        add(format!("{f}(nonexistent_metric[5m])"));
        for r in ranges {
            add(format!("{f}({c}[{r}])"));
        }
    }
    for r in ranges {
        add(format!("deriv({d}[{r}])"));
        add(format!("predict_linear({d}[{r}], 600)"));
        add(format!("resets({c}[{r}])"));
        add(format!("changes({b}[{r}])"));
        add(format!("irate({c}[{r}])"));
        add(format!("idelta({c}[{r}])"));
        add(format!("holt_winters({d}[{r}], 0.5, 0.1)"));
    }
    add("time()".into());
    add(format!(
        "label_replace({n}, \"job_id\", \"destination-value-$1\", \"node\", \"n(.*)\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"destination-value-$1\", \"node\", \"host:(.*)\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"$1-$2\", \"UUID\", \"GPU-(.)(.*)\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"value-$1\", \"nonexistent-src\", \"source-value-(.*)\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"value-$1\", \"nonexistent-src\", \"(.*)\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"value-$1\", \"node\", \"non-matching-regex\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"\", \"dst\", \".*\")"
    ));
    add(format!(
        "label_replace({n}, \"job_id\", \"value-$1\", \"src\", \"(.*\")"
    ));
    add(format!(
        "label_replace({n}, \"\\xff\", \"\", \"src\", \"(.*)\")"
    ));
    add(format!("label_replace({n}, \"UUID\", \"\", \"\", \"\")"));
    add(format!(
        "label_join({n}, \"new_label\", \"-\", \"node\", \"gpu\")"
    ));
    add(format!(
        "label_join({n}, \"gpu\", \"-\", \"node\", \"gpu\")"
    ));
    add(format!("label_join({n}, \"gpu\", \"-\", \"node\")"));
    add(format!("label_join({n}, \"\\xff\", \"-\", \"node\")"));
    for f in dates {
        add(format!("{f}()"));
        for off in offsets {
            add(format!("{f}({b} offset {off})"));
        }
    }
    for f in ["clamp_min", "clamp_max"] {
        add(format!("{f}({g}, 2)"));
    }
    add(format!("clamp({g}, 0, 1)"));
    add(format!("clamp({g}, 0, 1000000000000)"));
    add(format!("clamp({g}, 1000000000000, 0)"));
    add(format!("clamp({g}, 1000000000000, 1000000000000)"));
    add("vector(1.23)".into());
    add("vector(time())".into());
    add(format!("scalar({g})"));
    add(format!("scalar(sum({g}))"));
    add(format!("sort({g})"));
    add(format!("sort_desc({g})"));
    for p in ["0.1", "0.5", "0.9", "0.99"] {
        add(format!(
            "histogram_quantile({p}, rate(nonexistent_bucket[1m]))"
        ));
    }
    add("histogram_quantile(0.9, nonexistent_metric)".into());
    add(format!("histogram_quantile(0.9, {g})"));
    add("histogram_quantile(0.9, {__name__=~\"flopwatch_gpu_.+\"})".into());
    add(format!("absent({g})"));
    add("absent(nonexistent_metric_name)".into());
    add("absent(nonexistent_metric_name{job_id=\"x\", node=~\"n.*\"})".into());
    add(format!("absent_over_time({g}[5m])"));
    add("absent_over_time(nonexistent_metric_name{node=\"n1\"}[5m])".into());
    add(format!("absent_over_time({i}[1m])"));
    // Subqueries and @.
    add(format!(
        "max_over_time((time() - max({b}) < 1000)[5m:10s] offset 5m)"
    ));
    add(format!("avg_over_time(rate({c}[1m])[2m:10s])"));
    add(format!("max_over_time({g}[10m:1m])"));
    add(format!("rate({c}[5m:30s])"));
    add(format!("min_over_time(sum by (node) ({g})[15m:])"));
    add(format!("sum_over_time({o}[30m:5m] offset 10m)"));
    add(format!("{g} @ start()"));
    add(format!("{g} @ end()"));
    add(format!("rate({c}[5m] @ end())"));
    add(format!("sum by (node) ({g} offset 1m @ start())"));
    q
}

/// `ms` as the API's seconds.
fn secs(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// An answer: success with its data reduced, or a refusal with its HTTP
/// status.
enum Answer {
    Data(Canon, Vec<Vec<(String, String)>>),
    Refused(u16, String),
}

async fn ask(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    form: &[(&str, String)],
    token: Option<&str>,
) -> Answer {
    let mut r = http.post(format!("{url}{path}")).form(form);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    let code = r.status().as_u16();
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    if body["status"] == "success" {
        let (c, order) = canon_json(&body["data"]);
        Answer::Data(c, order)
    } else {
        Answer::Refused(code, body["error"].as_str().unwrap_or("").to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compliance_queries_answer_as_prometheus_does() {
    let started = Stopwatch::start();
    let dir = tempfile::tempdir().unwrap();
    let now = SystemClock.now_ms();
    let t0 = now.div_euclid(3_600_000) * 3_600_000 - 3 * 3_600_000;
    let tenant = |name: &str| TenantConfig {
        name: name.into(),
        agent_tokens_sha256: vec![digest(&format!("{name}-agent"))],
        ..Default::default()
    };
    let mut cfg = CollectorConfig {
        data_dir: dir.path().join("data"),
        admin_tokens_sha256: vec![digest("provider")],
        tenants: vec![tenant("tenant-a"), tenant("tenant-b")],
        plaintext: true,
        ..Default::default()
    };
    // Prometheus holds the samples as blocks, without the staleness
    // markers a scrape writes when a series vanishes: its series stay
    // current for the whole lookback after their last sample, so
    // flopwatch's staleness from sampling windows is off here (it is
    // checked by tests/staleness.rs).
    cfg.prometheus_api.staleness = false;
    let tc = TestCollector::start_config(&cfg, Auth::from_config(&cfg), Vec::new()).await;
    let gpus = gpus();

    // flopwatch: a stream per node, a batch per 5 minutes.
    let ts = |k: i64| t0 + k * STEP + 37;
    let mut rngs: Vec<Rng> = (0..gpus.len())
        .map(|g| Rng(0x9e37_79b9_7f4a_7c15 ^ ((g as u64 + 1) * 0x1234_5678)))
        .collect();
    // values[g][metric] = per-sample values.
    let mut values: Vec<BTreeMap<&str, Vec<Option<f64>>>> = vec![BTreeMap::new(); gpus.len()];
    for (gi, r) in rngs.iter_mut().enumerate() {
        for k in 0..SAMPLES {
            for m in METRICS {
                let v = value(gi, m, k, r);
                values[gi].entry(m).or_default().push(v);
            }
        }
    }
    for node in ["n1", "n2", "n3", "n4"] {
        let members: Vec<usize> = (0..gpus.len()).filter(|&g| gpus[g].node == node).collect();
        let tenant = gpus[members[0]].tenant;
        let hello = v1::Hello {
            agent_id: node.into(),
            node: Some(v1::NodeIdentity {
                node_id: node.into(),
                hostname: format!("host-{node}"),
                boot_id: "boot-1".into(),
                labels: Default::default(),
            }),
            gpus: members
                .iter()
                .map(|&g| v1::GpuInfo {
                    uuid: gpus[g].uuid.clone(),
                    index: gpus[g].index as u32,
                    model: "NVIDIA H100 80GB HBM3".into(),
                    ..Default::default()
                })
                .collect(),
            protocol_version: 1,
            ..Default::default()
        };
        let channel = tonic::transport::Endpoint::from_shared(tc.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (mut a, _) = RawAgent::open(channel, Some(&format!("{tenant}-agent")), hello)
            .await
            .unwrap();
        for (seq, start) in (0..SAMPLES).step_by(60).enumerate() {
            let ks: Vec<i64> = (start..start + 60).collect();
            let mut series = Vec::new();
            let mut jobs = Vec::new();
            for &g in &members {
                for m in METRICS {
                    let (t, v): (Vec<i64>, Vec<f64>) = ks
                        .iter()
                        .filter_map(|&k| values[g][m][k as usize].map(|v| (ts(k), v)))
                        .unzip();
                    if t.is_empty() {
                        continue;
                    }
                    series.push(v1::Series {
                        gpu_uuid: gpus[g].uuid.clone(),
                        metric: m.into(),
                        window_ms: vec![STEP as u32; t.len()],
                        timestamps_ms: t,
                        values: v,
                        ..Default::default()
                    });
                }
                if let Some((j, since)) = job(g, start) {
                    jobs.push(v1::JobAssignment {
                        gpu_uuid: gpus[g].uuid.clone(),
                        job_id: j.into(),
                        pod: format!("{j}-pod"),
                        namespace: "ml".into(),
                        since_ms: ts(since),
                        ..Default::default()
                    });
                }
            }
            let r = a
                .call(v1::Batch {
                    seq: seq as u64 + 1,
                    series,
                    jobs,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(matches!(r, collector_message::Msg::Ack(_)), "{r:?}");
        }
    }

    // Prometheus: the same samples as OpenMetrics, OFU as flopwatch
    // derived and stored it.
    let mut families: BTreeMap<&str, (&str, String)> = BTreeMap::new();
    let mut line =
        |family: &'static str, kind: &'static str, name: &str, l: &str, t: i64, v: f64| {
            let e = families.entry(family).or_insert((kind, String::new()));
            let _ = writeln!(e.1, "{name}{l} {v:?} {}", secs(t));
        };
    for (gi, g) in gpus.iter().enumerate() {
        for (metric, family, kind, name) in FAMILIES {
            let scale = if metric.starts_with("sm_clock") {
                1e6
            } else {
                1.0
            };
            for k in 0..SAMPLES {
                if let Some(v) = values[gi][metric][k as usize] {
                    line(family, kind, name, &labels(g, gi, k), ts(k), v * scale);
                }
            }
        }
        let mut ofu = Vec::new();
        tc.collector
            .store
            .ofu(g.tenant, &g.uuid, i64::MIN, i64::MAX, None, &mut |x| {
                ofu.push(x)
            })
            .unwrap();
        assert_eq!(ofu.len() as i64, SAMPLES, "an OFU sample per sample");
        for x in ofu {
            let k = (x.ts_ms - t0) / STEP;
            let l = labels(g, gi, k);
            line(
                "flopwatch_ofu_ratio",
                "gauge",
                "flopwatch_ofu_ratio",
                &l,
                x.ts_ms,
                x.ofu,
            );
            line(
                "flopwatch_ofu_tensor_active_ratio",
                "gauge",
                "flopwatch_ofu_tensor_active_ratio",
                &l,
                x.ts_ms,
                x.tensor_active,
            );
            line(
                "flopwatch_ofu_sm_clock_hertz",
                "gauge",
                "flopwatch_ofu_sm_clock_hertz",
                &l,
                x.ts_ms,
                x.sm_clock_mhz * 1e6,
            );
        }
    }
    let mut om = String::new();
    for (family, (kind, lines)) in &families {
        let _ = write!(om, "# TYPE {family} {kind}\n{lines}");
    }
    om.push_str("# EOF\n");
    let om_file = dir.path().join("samples.om");
    std::fs::write(&om_file, om).unwrap();
    let tsdb = dir.path().join("tsdb");
    openmetrics_blocks(&om_file, &tsdb);
    let prom = Prometheus::serve(&tsdb, dir.path());
    let http = reqwest::Client::new();
    let deadline = Deadline::after(Duration::from_secs(30));
    while !http
        .get(format!("{}/-/ready", prom.url))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(!deadline.passed(), "prometheus not ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // flopwatch's Prometheus API, with a provider token (every tenant).
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fw = format!("http://{}", api.local_addr().unwrap());
    tokio::spawn(flopwatch_collector::promql::serve(
        tc.collector.clone(),
        api,
        None,
        std::future::pending(),
    ));

    let instants = [t0 + 65 * MIN + 17, t0 + 100 * MIN + 3, t0 + 119 * MIN + 55];
    let ranges = [
        (t0 + 40 * MIN + 11, t0 + 50 * MIN + 11, 10_000),
        (t0 + 10 * MIN + 11, t0 + 115 * MIN + 11, MIN),
    ];
    let queries = queries();
    let (mut agree, mut total) = (0usize, 0usize);
    // Answers agreeing with data in them, and refused by both.
    let (mut with_data, mut both_refused) = (0usize, 0usize);
    let mut disagree = Vec::new();
    let mut refused_by_us: BTreeMap<String, usize> = BTreeMap::new();
    for q in &queries {
        let mut asks: Vec<(&str, Vec<(&str, String)>)> = Vec::new();
        for t in instants {
            asks.push((
                "/api/v1/query",
                vec![("query", q.clone()), ("time", secs(t))],
            ));
        }
        for (s, e, st) in ranges {
            asks.push((
                "/api/v1/query_range",
                vec![
                    ("query", q.clone()),
                    ("start", secs(s)),
                    ("end", secs(e)),
                    ("step", secs(st)),
                ],
            ));
        }
        for (path, form) in asks {
            total += 1;
            let want = ask(&http, &prom.url, path, &form, None).await;
            let got = ask(&http, &fw, path, &form, Some("provider")).await;
            let what = format!("{path} {q} {:?}", &form[1..]);
            match (want, got) {
                (_, Answer::Refused(code, e)) if code >= 500 => {
                    panic!("{what}: flopwatch answered {code}: {e}")
                }
                (Answer::Data(w, wo), Answer::Data(g, go)) => match differ(&w, &g) {
                    Some(d) => disagree.push(format!("{what}: {d}")),
                    None if q.starts_with("sort") && wo != go => {
                        disagree.push(format!("{what}: order differs"))
                    }
                    None => {
                        agree += 1;
                        with_data += usize::from(!w.is_empty());
                    }
                },
                (Answer::Refused(..), Answer::Refused(..)) => {
                    agree += 1;
                    both_refused += 1;
                }
                (Answer::Data(..), Answer::Refused(code, e)) => {
                    *refused_by_us.entry(e.clone()).or_default() += 1;
                    disagree.push(format!("{what}: flopwatch refused ({code}) {e}"));
                }
                (Answer::Refused(code, e), Answer::Data(..)) => disagree.push(format!(
                    "{what}: prometheus refused ({code}) {e}, flopwatch answered"
                )),
            }
        }
    }
    let share = agree as f64 / total as f64;
    eprintln!(
        "{} queries, {total} answers: {agree} agree ({:.1} %; {with_data} with series, {both_refused} refused by both), {} differ, in {:?}",
        queries.len(),
        100.0 * share,
        disagree.len(),
        started.elapsed()
    );
    // The fixture is no empty world: most answers hold series.
    assert!(
        with_data * 10 >= total * 8,
        "{with_data} of {total} with data"
    );
    for d in &disagree {
        eprintln!("  {d}");
    }
    assert!(share >= 0.95, "{:.1} % agree", 100.0 * share);
    tc.stop().await;
}
