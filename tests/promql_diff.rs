//! Differential test of the PromQL engine against a real Prometheus 2.42
//! (Debian package `prometheus`): the same samples go into flopwatch
//! through ingest (a raw agent stream per node) and into Prometheus as
//! OpenMetrics turned into TSDB blocks by promtool; a corpus of instant and
//! range queries (every supported function, aggregation and operator,
//! matchers, steps of 100 ms to 1 h, ranges of 1 s to 30 days) is answered
//! by both, and the answers must agree: the same label sets, values within
//! a relative 1e-6, NaN equal to NaN.
//!
//! Samples lie at ≡ 37 ms (mod 100 ms) and queries are evaluated at ≡ 11 ms
//! or on whole minutes and hours (where the engine reads rollup buckets),
//! so no window edge falls on a sample: Prometheus 2.x's closed windows and
//! a left-open one agree.

use flopwatch_collector::promql::Engine;
use flopwatch_collector::Scope;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::v1::{self, collector_message};
use flopwatch_tests::prom::{openmetrics_blocks, Prometheus};
use flopwatch_tests::promql::{canon_json, canon_value, differ};
use flopwatch_tests::raw::{self, RawAgent};
use flopwatch_tests::TestCollector;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// One GPU of the fixture: node, hostname, UUID, job, pod.
const GPUS: [(&str, &str, &str, &str, &str); 2] = [
    ("n1", "host-1", "GPU-a", "train-1", "p1"),
    ("n2", "host-2", "GPU-b", "train-2", "p2"),
];

/// A pseudo-random stream (xorshift) in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The raw samples of one GPU: timestamps and per metric values.
struct Samples {
    ts: Vec<i64>,
    window: Vec<u32>,
    tpa: Vec<f64>,
    clock: Vec<f64>,
    power: Vec<f64>,
    energy: Vec<f64>,
}

/// 30 days at 10 min from `base`, then 10 minutes at 100 ms, each at
/// ≡ 37 ms; the energy counter resets twice.
fn samples(base: i64, seed: u64) -> Samples {
    let mut r = Rng(seed);
    let mut s = Samples {
        ts: Vec::new(),
        window: Vec::new(),
        tpa: Vec::new(),
        clock: Vec::new(),
        power: Vec::new(),
        energy: Vec::new(),
    };
    let mut e = 1_000.0;
    let mut push = |s: &mut Samples, t: i64, w: u32, reset: bool| {
        let p = 100.0 + 600.0 * r.next();
        e = if reset {
            p
        } else {
            e + p * f64::from(w) / 1000.0
        };
        s.ts.push(t);
        s.window.push(w);
        s.tpa.push(r.next());
        s.clock.push(1_000.0 + (980.0 * r.next()).round());
        s.power.push(p);
        s.energy.push(e);
    };
    for k in 0..30 * 144 {
        push(&mut s, base + k * 600_000 + 37, 600_000, k == 2_000);
    }
    let dense = base + 30 * DAY + 600_000;
    for i in 0..6_000 {
        push(&mut s, dense + i * 100 + 37, 100, i == 3_000);
    }
    s
}

fn batch(
    seq: u64,
    gpu: &str,
    job: &str,
    pod: &str,
    since: i64,
    s: &Samples,
    r: std::ops::Range<usize>,
) -> v1::Batch {
    let series = |metric: &str, v: &[f64]| v1::Series {
        gpu_uuid: gpu.into(),
        metric: metric.into(),
        timestamps_ms: s.ts[r.clone()].to_vec(),
        values: v[r.clone()].to_vec(),
        window_ms: s.window[r.clone()].to_vec(),
        ..Default::default()
    };
    v1::Batch {
        seq,
        series: vec![
            series("tensor_active", &s.tpa),
            series("sm_clock_avg_mhz", &s.clock),
            series("power_w", &s.power),
            series("energy_j", &s.energy),
        ],
        jobs: vec![v1::JobAssignment {
            gpu_uuid: gpu.into(),
            job_id: job.into(),
            pod: pod.into(),
            namespace: "ml".into(),
            since_ms: since,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn labels_text(l: &[(&str, &str)]) -> String {
    let parts: Vec<String> = l.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{{{}}}", parts.join(","))
}

/// The corpus: queries over ranges `{r}`.
const QUERIES: &[&str] = &[
    "flopwatch_ofu_ratio",
    "flopwatch_gpu_power_watts{node=\"n1\"}",
    "{__name__=~\"flopwatch_ofu_.*\", node!=\"n1\"}",
    "flopwatch_gpu_power_watts{job_id=~\"train-.*\", pod!~\"p2\"}",
    "flopwatch_gpu_sm_clock_avg_hertz offset 1m",
    "avg_over_time(flopwatch_ofu_ratio[{r}])",
    "min_over_time(flopwatch_gpu_power_watts[{r}])",
    "max_over_time(flopwatch_ofu_tensor_active_ratio[{r}])",
    "sum_over_time(flopwatch_gpu_tensor_active_ratio[{r}])",
    "count_over_time(flopwatch_ofu_sm_clock_hertz[{r}])",
    "sum_over_time(flopwatch_ofu_ratio[{r}])",
    "min_over_time(flopwatch_ofu_ratio{job_id=\"train-2\"}[{r}])",
    "count_over_time(flopwatch_ofu_ratio[{r}]) > 1",
    "last_over_time(flopwatch_gpu_power_watts[{r}])",
    "quantile_over_time(0.9, flopwatch_gpu_power_watts[{r}])",
    "rate(flopwatch_gpu_energy_joules_total[{r}])",
    "increase(flopwatch_gpu_energy_joules_total[{r}])",
    "irate(flopwatch_gpu_energy_joules_total[{r}])",
    "resets(flopwatch_gpu_energy_joules_total[{r}])",
    "sum by (node) (flopwatch_gpu_power_watts)",
    "avg without (UUID, gpu) (flopwatch_ofu_ratio)",
    "min(flopwatch_ofu_sm_clock_hertz)",
    "max by (job_id) (flopwatch_ofu_tensor_active_ratio)",
    "count({__name__=~\"flopwatch_gpu_(power|energy).*\"})",
    // The node, job and ledger families are derived by the collector (a
    // Prometheus has them from scraping `/metrics`), not in the samples
    // both stores were given.
    "count by (__name__) ({__name__=~\"flopwatch_.*\", __name__!~\"flopwatch_(node|job|ledger)_.*\"})",
    "quantile(0.25, flopwatch_gpu_power_watts)",
    "topk(1, flopwatch_gpu_power_watts)",
    "bottomk(1, avg_over_time(flopwatch_ofu_ratio[{r}]))",
    "avg by (job_id) (avg_over_time(flopwatch_ofu_ratio[{r}]))",
    "flopwatch_ofu_ratio * 100",
    "2 * flopwatch_gpu_power_watts - 1",
    "flopwatch_gpu_power_watts > 400",
    "500 < flopwatch_gpu_power_watts",
    "flopwatch_gpu_power_watts > bool 400",
    "-flopwatch_ofu_ratio",
    "1 + 1",
    "2 ^ 3 % 5",
    "sum(rate(flopwatch_gpu_energy_joules_total[{r}])) / 2",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promql_answers_as_prometheus_does() {
    let started = Stopwatch::start();
    let dir = tempfile::tempdir().unwrap();
    let now = SystemClock.now_ms();
    let base = now.div_euclid(HOUR) * HOUR - 31 * DAY;
    let mut cfg = flopwatch_config::CollectorConfig {
        data_dir: dir.path().join("data"),
        anonymous_tenant: Some("default".into()),
        retention: Duration::from_secs(60 * 24 * 3600),
        ..Default::default()
    };
    // Prometheus reads the samples from blocks, which carry no staleness
    // markers: each series stays current for the whole lookback there, so
    // here too (staleness itself: tests/job_churn.rs).
    cfg.prometheus_api.staleness = false;
    let tc = TestCollector::start_config(
        &cfg,
        flopwatch_collector::Auth::anonymous("default"),
        Vec::new(),
    )
    .await;

    // flopwatch: through ingest, one raw agent stream per node.
    let mut om = String::new();
    let mut families: BTreeMap<&str, (&str, String)> = BTreeMap::new();
    for (i, (node, host, gpu, job, pod)) in GPUS.into_iter().enumerate() {
        let s = samples(base, 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
        let channel = tonic::transport::Endpoint::from_shared(tc.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (mut a, _) = RawAgent::open(channel, None, raw::hello(node, host, gpu))
            .await
            .unwrap();
        let mut seq = 0;
        for chunk in (0..s.ts.len()).collect::<Vec<_>>().chunks(1_000) {
            seq += 1;
            let b = batch(
                seq,
                gpu,
                job,
                pod,
                base,
                &s,
                chunk[0]..chunk[chunk.len() - 1] + 1,
            );
            let r = a.call(b).await.unwrap();
            assert!(matches!(r, collector_message::Msg::Ack(_)), "{r:?}");
        }
        drop(a);

        // Prometheus: the same samples, labelled as /metrics labels them;
        // OFU as the collector derived and stored it.
        let labels = labels_text(&[
            ("UUID", gpu),
            ("gpu", "0"),
            ("hostname", host),
            ("job_id", job),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("namespace", "ml"),
            ("node", node),
            ("pod", pod),
            ("tenant", "default"),
        ]);
        let mut add = |family: &'static str, kind: &'static str, name: &str, t: i64, v: f64| {
            let e = families.entry(family).or_insert((kind, String::new()));
            let _ = writeln!(e.1, "{name}{labels} {v:?} {}.{:03}", t / 1000, t % 1000);
        };
        for (j, &t) in s.ts.iter().enumerate() {
            add(
                "flopwatch_gpu_power_watts",
                "gauge",
                "flopwatch_gpu_power_watts",
                t,
                s.power[j],
            );
            add(
                "flopwatch_gpu_tensor_active_ratio",
                "gauge",
                "flopwatch_gpu_tensor_active_ratio",
                t,
                s.tpa[j],
            );
            add(
                "flopwatch_gpu_sm_clock_avg_hertz",
                "gauge",
                "flopwatch_gpu_sm_clock_avg_hertz",
                t,
                s.clock[j] * 1e6,
            );
            add(
                "flopwatch_gpu_energy_joules",
                "counter",
                "flopwatch_gpu_energy_joules_total",
                t,
                s.energy[j],
            );
        }
        let mut ofu = Vec::new();
        tc.collector
            .store
            .ofu("default", gpu, i64::MIN, i64::MAX, None, &mut |x| {
                ofu.push(x)
            })
            .unwrap();
        assert_eq!(ofu.len(), s.ts.len(), "an OFU sample per sample");
        for x in ofu {
            add(
                "flopwatch_ofu_ratio",
                "gauge",
                "flopwatch_ofu_ratio",
                x.ts_ms,
                x.ofu,
            );
            add(
                "flopwatch_ofu_tensor_active_ratio",
                "gauge",
                "flopwatch_ofu_tensor_active_ratio",
                x.ts_ms,
                x.tensor_active,
            );
            add(
                "flopwatch_ofu_sm_clock_hertz",
                "gauge",
                "flopwatch_ofu_sm_clock_hertz",
                x.ts_ms,
                x.sm_clock_mhz * 1e6,
            );
        }
    }
    for (family, (kind, lines)) in &families {
        let _ = writeln!(om, "# TYPE {family} {kind}\n{lines}");
    }
    om = om.replace("\n\n", "\n");
    om.push_str("# EOF\n");
    let om_file = dir.path().join("samples.om");
    std::fs::write(&om_file, om).unwrap();
    let tsdb = dir.path().join("tsdb");
    openmetrics_blocks(&om_file, &tsdb);
    let prom = Prometheus::serve(&tsdb, dir.path());
    let http = reqwest::Client::new();
    let deadline = Deadline::after(Duration::from_secs(30));
    loop {
        let ready = http
            .get(format!("{}/-/ready", prom.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(!deadline.passed(), "prometheus not ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every hour sealed: chunks and rollups, as a month-old store has them.
    tc.collector.store.compact(now, 0).unwrap();
    let engine = Engine::new(tc.collector.clone());
    let dense = base + 30 * DAY + 600_000;
    // (instant time, range start, end, step, range of `{r}`); the last two
    // put window ends on whole hours and minutes, where the engine answers
    // from the rollups' buckets.
    let scenarios: [(i64, i64, i64, i64, &str); 6] = [
        (dense + 420_011, dense + 60_011, dense + 120_011, 100, "1s"),
        (dense + 300_011, dense + 11, dense + 600_011, 1_000, "1m"),
        (
            base + 20 * DAY + 3 * HOUR + 311,
            base + 10 * DAY + 11,
            base + 11 * DAY + 11,
            60_000,
            "1h",
        ),
        (
            base + 30 * DAY + 1_234_511,
            base + 300_011,
            base + 30 * DAY + 300_011,
            HOUR,
            "30d",
        ),
        (base + 25 * DAY, base + 2 * DAY, base + 29 * DAY, HOUR, "1h"),
        (
            base + 30 * DAY + 5 * 60_000,
            base + 29 * DAY,
            base + 30 * DAY + 600_000,
            5 * 60_000,
            "20m",
        ),
    ];
    let secs = |ms: i64| format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000));
    let mut failures = Vec::new();
    let mut compared = 0;
    for (t, start, end, step, r) in scenarios {
        for q in QUERIES {
            let q = q.replace("{r}", r);
            let want: String = http
                .get(format!("{}/api/v1/query", prom.url))
                .query(&[("query", q.as_str()), ("time", &secs(t))])
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let want: serde_json::Value = serde_json::from_str(&want).unwrap();
            assert_eq!(want["status"], "success", "{q}: {want}");
            let got = engine
                .instant(&Scope::All, &q, t)
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            if let Some(d) = differ(&canon_json(&want["data"]).0, &canon_value(got)) {
                failures.push(format!("instant {q} @{t}: {d}"));
            }
            let want: String = http
                .get(format!("{}/api/v1/query_range", prom.url))
                .query(&[
                    ("query", q.as_str()),
                    ("start", &secs(start)),
                    ("end", &secs(end)),
                    ("step", &secs(step)),
                ])
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let want: serde_json::Value = serde_json::from_str(&want).unwrap();
            assert_eq!(want["status"], "success", "{q}: {want}");
            let got = engine
                .range(&Scope::All, &q, start, end, step)
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            let want = canon_json(&want["data"]).0;
            // On whole hours the 10-minute grid leaves no sample in an
            // instant selector's 5-minute lookback: empty is the answer.
            let lookback_only = step >= HOUR && start % HOUR == 0 && !q.contains('[');
            if want.is_empty() && !q.contains('>') && !q.contains('<') && !lookback_only {
                failures.push(format!("{q}: prometheus found nothing over {start}..{end}"));
            }
            if let Some(d) = differ(&want, &canon_value(got)) {
                failures.push(format!("range {q} {start}..{end} step {step}: {d}"));
            }
            compared += 2;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    tc.stop().await;
    eprintln!("{compared} answers agree in {:?}", started.elapsed());
}
