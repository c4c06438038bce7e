//! The engine over a small in-memory store: scope, names and labels, the
//! Grafana contract's corner cases, Prometheus's checks on a range.

use super::budget::Budget;
use super::guard::QueryLimits;
use super::model::{Model, Piece};
use super::query::{self, Ctx};
use super::{QueryError, RangeSeries, Sample, Value};
use crate::auth::Scope;
use crate::store::{
    memory::MemEngine, CommitSet, GpuRecord, JobRecord, NodeRecord, OfuSample, Store,
};
use flopwatch_proto::model::{Point, SeriesBatch};
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    /// Whether this test's queries keep every sample current for the whole
    /// lookback (`[prometheus_api] staleness = false`).
    static LOOKBACK_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// No limits, with the test's staleness setting.
fn no_limits() -> QueryLimits {
    QueryLimits {
        staleness: !LOOKBACK_ONLY.with(Cell::get),
        ..QueryLimits::default()
    }
}

/// `query::instant` with no limits.
fn instant(store: &Store, scope: &Scope, q: &str, t: i64) -> Result<Value, QueryError> {
    let (budget, limits) = (Budget::unlimited(), no_limits());
    let ctx = Ctx {
        store,
        scope,
        budget: &budget,
        limits: &limits,
        peers: None,
        base_only: false,
        specs: None,
    };
    query::instant(&ctx, q, t)
}

/// `query::range` with no limits.
fn range(
    store: &Store,
    scope: &Scope,
    q: &str,
    start: i64,
    end: i64,
    step: i64,
) -> Result<Value, QueryError> {
    let (budget, limits) = (Budget::unlimited(), no_limits());
    let ctx = Ctx {
        store,
        scope,
        budget: &budget,
        limits: &limits,
        peers: None,
        base_only: false,
        specs: None,
    };
    query::range(&ctx, q, start, end, step)
}

/// `query::series` with no limits.
fn series(
    store: &Store,
    scope: &Scope,
    sel: &[String],
    start: i64,
    end: i64,
) -> Result<Vec<crate::series::Labels>, QueryError> {
    let (budget, limits) = (Budget::unlimited(), no_limits());
    let ctx = Ctx {
        store,
        scope,
        budget: &budget,
        limits: &limits,
        peers: None,
        base_only: false,
        specs: None,
    };
    query::series(&ctx, sel, start, end)
}

fn points(f: impl Fn(i64) -> f64) -> Vec<Point> {
    (0..10)
        .map(|i| Point {
            ts_ms: 1_000 * i,
            value: f(i),
            peak: None,
            window_ms: Some(1_000),
        })
        .collect()
}

/// Tenant `a`: GPU `G1` on `n1`, running job `j1` from 5 s on; tenant `b`:
/// GPU `G2`. Power 100 + i W and energy (a counter) each second 0..9 s.
fn store() -> Store {
    let s = Store::new(Arc::new(MemEngine::new()), false);
    for (tenant, gpu, node) in [("a", "G1", "n1"), ("b", "G2", "n2")] {
        let set = CommitSet {
            series: vec![
                SeriesBatch {
                    gpu_uuid: gpu.into(),
                    metric: "power_w".into(),
                    points: points(|i| 100.0 + i as f64),
                },
                SeriesBatch {
                    gpu_uuid: gpu.into(),
                    metric: "energy_j".into(),
                    points: points(|i| (10 * i) as f64),
                },
            ],
            gpus: vec![GpuRecord {
                uuid: gpu.into(),
                node_id: node.into(),
                model: "H100".into(),
                ..Default::default()
            }],
            nodes: vec![NodeRecord {
                node_id: node.into(),
                hostname: format!("host-{node}"),
                ..Default::default()
            }],
            jobs: if tenant == "a" {
                vec![JobRecord {
                    job_id: "j1".into(),
                    gpu_uuid: gpu.into(),
                    first_seen_ms: 5_000,
                    last_seen_ms: 9_000,
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        s.commit(tenant, &set).unwrap();
    }
    s
}

fn labels(l: &[(&str, &str)]) -> Vec<(String, String)> {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn grafana_health_check_is_a_scalar() {
    let s = store();
    assert_eq!(
        instant(&s, &Scope::All, "1+1", 4_000).unwrap(),
        Value::Scalar {
            t_ms: 4_000,
            v: 2.0
        }
    );
}

#[test]
fn a_tenant_sees_its_series_with_the_labels_metrics_exports() {
    let s = store();
    let a = Scope::Tenant("a".into());
    let got = instant(&s, &a, "flopwatch_gpu_power_watts", 3_500).unwrap();
    assert_eq!(
        got,
        Value::Vector(vec![Sample {
            labels: labels(&[
                ("UUID", "G1"),
                ("__name__", "flopwatch_gpu_power_watts"),
                ("gpu", "0"),
                ("hostname", "host-n1"),
                ("modelName", "H100"),
                ("node", "n1"),
                ("tenant", "a"),
            ]),
            t_ms: 3_500,
            v: 103.0,
        }])
    );
    // The job's samples are another series (its label set has job_id).
    let got = instant(&s, &a, "flopwatch_gpu_power_watts{job_id=\"j1\"}", 9_500).unwrap();
    let Value::Vector(v) = got else { panic!() };
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].v, 109.0);
    // Every tenant's with Scope::All, told apart by `tenant`.
    let got = instant(
        &s,
        &Scope::All,
        "count by (tenant) (flopwatch_gpu_power_watts)",
        3_500,
    );
    let Ok(Value::Vector(v)) = got else { panic!() };
    assert_eq!(v.len(), 2);
    let names = series(&s, &a, &["{__name__=~\".+\"}".into()], 0, 10_000).unwrap();
    assert!(names
        .iter()
        .all(|l| l.contains(&("tenant".into(), "a".into()))));
    assert_eq!(names.len(), 4, "{names:?}");
}

#[test]
fn range_steps_start_at_start_and_rate_extrapolates() {
    let s = store();
    let b = Scope::Tenant("b".into());
    let got = range(
        &s,
        &b,
        "rate(flopwatch_gpu_energy_joules_total[2s])",
        2_500,
        4_500,
        1_000,
    )
    .unwrap();
    assert_eq!(
        got,
        Value::Matrix(vec![RangeSeries {
            labels: labels(&[
                ("UUID", "G2"),
                ("gpu", "0"),
                ("hostname", "host-n2"),
                ("modelName", "H100"),
                ("node", "n2"),
                ("tenant", "b"),
            ]),
            points: vec![(2_500, 10.0), (3_500, 10.0), (4_500, 10.0)],
        }])
    );
}

#[test]
fn prometheus_refusals_are_kept() {
    let s = store();
    let e = range(&s, &Scope::All, "1", 0, 11_001, 1).unwrap_err();
    assert_eq!(
        e,
        QueryError::BadData(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)".into()
        )
    );
    assert!(range(&s, &Scope::All, "1", 0, 11_000, 1).is_ok());
    // Functions newer than Prometheus 2.42 are unknown, as there.
    let e = instant(
        &s,
        &Scope::All,
        "mad_over_time(flopwatch_gpu_power_watts[1m])",
        5_000,
    )
    .unwrap_err();
    assert_eq!(e.http_status(), 400, "{e}");
    assert!(e.to_string().contains("mad_over_time"), "{e}");
    // Over series without `le`, or that the store does not hold, the
    // answer is as empty as Prometheus's (a dashboard panel on the
    // collector's own health).
    for q in [
        "histogram_quantile(0.9, flopwatch_gpu_power_watts)",
        "histogram_quantile(0.9, x)",
    ] {
        assert_eq!(
            instant(&s, &Scope::All, q, 5_000).unwrap(),
            Value::Vector(Vec::new()),
            "{q}"
        );
    }
    // Two series with one label set at a step: Prometheus's error.
    let e = instant(
        &s,
        &Scope::All,
        "rate({__name__=~\"flopwatch_gpu_(power_watts|energy_joules_total)\"}[5s])",
        5_000,
    )
    .unwrap_err();
    assert_eq!(e.http_status(), 422, "{e}");
    assert!(e.to_string().contains("same labelset"), "{e}");
    assert_eq!(
        instant(&s, &Scope::All, "sum(", 0)
            .unwrap_err()
            .http_status(),
        400
    );
    assert!(instant(
        &s,
        &Scope::All,
        "rate(flopwatch_gpu_energy_joules_total[1m0.1s])",
        5_000
    )
    .is_ok());
}

#[test]
fn time_and_one_to_one_vector_matching() {
    let s = store();
    let a = Scope::Tenant("a".into());
    assert_eq!(
        instant(&s, &a, "time() - 2", 4_500).unwrap(),
        Value::Scalar {
            t_ms: 4_500,
            v: 2.5
        }
    );
    // Power 104 W and energy 40 J at 4 s: matched on every label but the
    // name, the name dropped.
    let Value::Vector(v) = instant(
        &s,
        &a,
        "flopwatch_gpu_power_watts - flopwatch_gpu_energy_joules_total",
        4_500,
    )
    .unwrap() else {
        panic!("not a vector")
    };
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].v, 64.0);
    assert!(v[0].labels.iter().all(|(k, _)| k != "__name__"));
    // A comparison filters the left side and keeps its name.
    let Value::Vector(v) = instant(
        &s,
        &a,
        "flopwatch_gpu_power_watts > flopwatch_gpu_energy_joules_total",
        4_500,
    )
    .unwrap() else {
        panic!("not a vector")
    };
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].v, 104.0);
    assert!(v[0].labels.iter().any(|(k, _)| k == "__name__"));
    let Value::Vector(v) = instant(
        &s,
        &a,
        "flopwatch_gpu_power_watts < flopwatch_gpu_energy_joules_total",
        4_500,
    )
    .unwrap() else {
        panic!("not a vector")
    };
    assert!(v.is_empty());
    // on(): only the listed labels match and remain.
    let Value::Vector(v) = instant(
        &s,
        &Scope::All,
        "flopwatch_gpu_power_watts / on(UUID) flopwatch_gpu_energy_joules_total",
        4_500,
    )
    .unwrap() else {
        panic!("not a vector")
    };
    assert_eq!(v.len(), 2);
    assert!(v.iter().all(|x| x.labels.len() == 1 && x.v == 104.0 / 40.0));
    // Two left series on one right one: Prometheus's many-to-one error.
    let e = instant(
        &s,
        &Scope::All,
        "flopwatch_gpu_power_watts / on() flopwatch_gpu_energy_joules_total{UUID=\"G1\"}",
        4_500,
    )
    .unwrap_err();
    assert_eq!(e.http_status(), 422, "{e}");
    // group_left: the "many" side's labels, the name dropped.
    let Value::Vector(v) = instant(
        &s,
        &a,
        "flopwatch_gpu_power_watts / on(UUID) group_left flopwatch_gpu_energy_joules_total",
        4_500,
    )
    .unwrap() else {
        panic!("not a vector")
    };
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].v, 104.0 / 40.0);
    assert!(v[0].labels.iter().all(|(k, _)| k != "__name__"));
    assert!(v[0].labels.iter().any(|(k, v)| k == "node" && v == "n1"));
}

/// One GPU's OFU each second for three hours from `T0` (samples on every
/// minute and hour boundary), job `j1` from mid-minute to mid-minute;
/// compacted (hours sealed: rollups) or not (every sample in the head).
/// The series model over `s` for every tenant, with staleness on.
fn all_scope_model<'a>(s: &'a Store, budget: &'a Budget) -> Model<'a> {
    Model {
        store: s,
        reader: None,
        scope: &Scope::All,
        budget,
        remote: None,
        base_only: false,
        specs: None,
        staleness: true,
    }
}

fn ofu_store(compacted: bool) -> Store {
    const T0: i64 = 1_699_999_200_000;
    let s = Store::new(Arc::new(MemEngine::new()), false);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for hour in 0..3 {
        let samples = (0..3600)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                OfuSample {
                    ts_ms: T0 + hour * 3_600_000 + i * 1_000,
                    ofu: (x >> 11) as f64 / (1u64 << 53) as f64,
                    tensor_active: 0.5,
                    sm_clock_mhz: 1500.0,
                    window_ms: 1_000,
                }
            })
            .collect();
        let set = CommitSet {
            seq: hour as u64 + 1,
            ofu: vec![("G1".into(), Some("j1".into()), samples)],
            gpus: vec![GpuRecord {
                uuid: "G1".into(),
                node_id: "n1".into(),
                ..Default::default()
            }],
            jobs: vec![JobRecord {
                job_id: "j1".into(),
                gpu_uuid: "G1".into(),
                first_seen_ms: T0 + 1_234_567,
                last_seen_ms: T0 + 2 * 3_600_000 + 1_800_500,
                ..Default::default()
            }],
            ..Default::default()
        };
        s.commit("a", &set).unwrap();
    }
    if compacted {
        s.compact(T0 + 5 * 3_600_000, 0).unwrap();
    }
    s
}

/// Windows on whole minutes or hours read sealed buckets from the rollups,
/// and answer exactly what the samples do: closed windows (a sample on
/// the window's end counts), job spans that start and end mid-minute.
#[test]
fn rollup_buckets_answer_as_the_samples_do() {
    const T0: i64 = 1_699_999_200_000;
    const M: i64 = 60_000;
    const H: i64 = 3_600_000;
    let (sealed, head) = (ofu_store(true), ofu_store(false));
    let cases = [
        ("avg_over_time(flopwatch_ofu_ratio[1h])", H, 3 * H, H),
        (
            "avg_over_time(flopwatch_ofu_ratio{job_id=\"j1\"}[1h])",
            H,
            3 * H,
            H,
        ),
        ("sum_over_time(flopwatch_ofu_ratio[5m])", 5 * M, 3 * H, M),
        (
            "count_over_time(flopwatch_ofu_ratio{job_id=\"j1\"}[10m])",
            10 * M,
            3 * H,
            2 * M,
        ),
        ("min_over_time(flopwatch_ofu_ratio[1m])", M, 3 * H, 7 * M),
        (
            "max_over_time(flopwatch_ofu_ratio[2h])",
            2 * H,
            3 * H,
            5 * M,
        ),
        (
            "avg by (job_id) (avg_over_time(flopwatch_ofu_ratio[1h]))",
            H,
            3 * H,
            H,
        ),
        // Off the grid: samples only, the same either way.
        ("avg_over_time(flopwatch_ofu_ratio[1h])", H + 11, 3 * H, H),
        // Instant selectors on whole minutes: the buckets' last samples
        // (the job's series starts and ends mid-minute).
        ("flopwatch_ofu_ratio", 0, 3 * H, M),
        ("flopwatch_ofu_ratio{job_id=\"j1\"}", 0, 3 * H, 3 * M),
        ("avg by (job_id) (flopwatch_ofu_ratio)", 5 * M, 3 * H, 5 * M),
    ];
    for (q, from, to, step) in cases {
        let want = range(&head, &Scope::All, q, T0 + from, T0 + to, step).unwrap();
        let got = range(&sealed, &Scope::All, q, T0 + from, T0 + to, step).unwrap();
        let (Value::Matrix(want), Value::Matrix(got)) = (want, got) else {
            panic!("{q}: not matrices");
        };
        assert!(!want.is_empty(), "{q}");
        assert_eq!(want.len(), got.len(), "{q}");
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.labels, g.labels, "{q}");
            assert_eq!(w.points.len(), g.points.len(), "{q}");
            for (a, b) in w.points.iter().zip(&g.points) {
                assert_eq!(a.0, b.0, "{q}");
                assert!(
                    (a.1 - b.1).abs() <= 1e-9 * a.1.abs().max(1.0),
                    "{q} at {}: {} vs {}",
                    a.0,
                    a.1,
                    b.1
                );
            }
        }
    }
    // The sealed store answered from buckets; the other had none to give.
    let buckets = |s: &Store| {
        let budget = Budget::unlimited();
        let m = all_scope_model(s, &budget);
        let series = m.select(&[]).unwrap();
        let ofu = series
            .iter()
            .find(|s| {
                s.labels
                    .iter()
                    .any(|(k, v)| k == "__name__" && v == "flopwatch_ofu_ratio")
            })
            .unwrap();
        let pieces = m.ofu_buckets(ofu, T0, T0 + 3 * H, true).unwrap().unwrap();
        pieces
            .iter()
            .filter(|p| matches!(p, Piece::Bucket { .. }))
            .count()
    };
    assert!(buckets(&sealed) > 0);
    assert_eq!(buckets(&head), 0);
    // An instant selector on whole minutes reads a bucket a minute from
    // the sealed store, and every sample from the head.
    let read = |s: &Store| {
        let (budget, limits) = (Budget::unlimited(), no_limits());
        let ctx = Ctx {
            store: s,
            scope: &Scope::All,
            budget: &budget,
            limits: &limits,
            peers: None,
            base_only: false,
            specs: None,
        };
        query::range(&ctx, "flopwatch_ofu_ratio", T0 + H, T0 + 3 * H, M).unwrap();
        budget.samples_counted()
    };
    let (sealed_read, head_read) = (read(&sealed), read(&head));
    assert!(sealed_read * 10 < head_read, "{sealed_read} vs {head_read}");
}

/// Tenant `a`: GPUs `G1` (every 100 ms for 600 s) and `G2` (every 100 ms,
/// 50 ms later, for the first 60 s) on `n1`, both in job `j1` from 10 s to
/// 400 s; `G3` on `n2` (every second). Tenant `b`: `G4` on `n3`.
fn fleet_store() -> Store {
    let s = Store::new(Arc::new(MemEngine::new()), false);
    let ofu = |start: i64, every: i64, n: i64, f: &dyn Fn(i64) -> f64| -> Vec<OfuSample> {
        (0..n)
            .map(|i| OfuSample {
                ts_ms: start + i * every,
                ofu: f(i),
                tensor_active: 0.5,
                sm_clock_mhz: 1500.0,
                window_ms: every as u32,
            })
            .collect()
    };
    let gpu = |uuid: &str, node: &str, index: u32| GpuRecord {
        uuid: uuid.into(),
        node_id: node.into(),
        index,
        model: "H100".into(),
        ..Default::default()
    };
    let node = |id: &str| NodeRecord {
        node_id: id.into(),
        hostname: format!("host-{id}"),
        ..Default::default()
    };
    let job = |uuid: &str| JobRecord {
        job_id: "j1".into(),
        gpu_uuid: uuid.into(),
        first_seen_ms: 10_000,
        last_seen_ms: 400_000,
        ..Default::default()
    };
    let a = CommitSet {
        ofu: vec![
            (
                "G1".into(),
                None,
                ofu(0, 100, 6_000, &|i| (i % 97) as f64 / 100.0),
            ),
            (
                "G2".into(),
                None,
                ofu(50, 100, 600, &|i| (i % 13) as f64 / 20.0),
            ),
            ("G3".into(), None, ofu(0, 1_000, 600, &|_| 0.125)),
        ],
        gpus: vec![gpu("G1", "n1", 0), gpu("G2", "n1", 1), gpu("G3", "n2", 0)],
        nodes: vec![node("n1"), node("n2")],
        jobs: vec![job("G1"), job("G2")],
        ..Default::default()
    };
    s.commit("a", &a).unwrap();
    let b = CommitSet {
        ofu: vec![("G4".into(), None, ofu(0, 1_000, 600, &|_| 0.75))],
        gpus: vec![gpu("G4", "n3", 0)],
        nodes: vec![node("n3")],
        ..Default::default()
    };
    s.commit("b", &b).unwrap();
    s
}

fn matrix(s: &Store, scope: &Scope, q: &str, start: i64, end: i64, step: i64) -> Vec<RangeSeries> {
    match range(s, scope, q, start, end, step).unwrap() {
        Value::Matrix(m) => m,
        v => panic!("{q}: {v:?}"),
    }
}

/// The series without `__name__`.
fn unnamed(m: Vec<RangeSeries>) -> Vec<RangeSeries> {
    m.into_iter()
        .map(|mut s| {
            s.labels.retain(|(k, _)| k != "__name__");
            s
        })
        .collect()
}

/// The node and job families `/metrics` exports are series of the API
/// too: they answer as the mean (count) over the GPUs' series does, a GPU
/// dropping out 5 minutes after its last sample, and a GPU whose job
/// changed counting once (where `avg by` over the GPU series still sees
/// the series before the change for 5 minutes).
#[test]
fn node_and_job_series_are_their_gpus_mean() {
    // The lookback edges, with staleness off (the staleness test below
    // has it on).
    LOOKBACK_ONLY.with(|l| l.set(true));
    let s = fleet_store();
    // Steps off the sample grid, through G2's silence and the job's end.
    let (start, end, step) = (500, 700_500, 1_000);
    let pairs = [
        (
            "flopwatch_node_ofu_ratio",
            "avg by (tenant, node, hostname) (flopwatch_ofu_ratio)",
        ),
        (
            "flopwatch_job_ofu_ratio",
            "avg by (tenant, job_id) (flopwatch_ofu_ratio{job_id!=\"\"})",
        ),
        (
            "flopwatch_job_gpus",
            "count by (tenant, job_id) (flopwatch_ofu_ratio{job_id!=\"\"})",
        ),
    ];
    // Steps of n1 where a GPU's series before its job change is still
    // within the lookback, and `avg by` counts that GPU twice.
    let changing = |t: i64| (10_000..=310_000).contains(&t) || (400_000..=700_000).contains(&t);
    for (family, by_hand) in pairs {
        let got = unnamed(matrix(&s, &Scope::All, family, start, end, step));
        let want = unnamed(matrix(&s, &Scope::All, by_hand, start, end, step));
        assert_eq!(got.len(), want.len(), "{family}");
        assert!(!got.is_empty(), "{family}");
        for (g, w) in got.iter().zip(&want) {
            let (gl, gp, wl, wp) = (&g.labels, &g.points, &w.labels, &w.points);
            assert_eq!(gl, wl, "{family}");
            assert_eq!(gp.len(), wp.len(), "{family} {gl:?}");
            for (g, w) in gp.iter().zip(wp) {
                assert_eq!(g.0, w.0, "{family} {gl:?}");
                if family.contains("node")
                    && gl.contains(&("node".into(), "n1".into()))
                    && changing(g.0)
                {
                    continue;
                }
                assert!(
                    (g.1 - w.1).abs() <= 1e-12,
                    "{family} {gl:?} at {}: {} vs {}",
                    g.0,
                    g.1,
                    w.1
                );
            }
        }
    }
    let at = |q: &str, t: i64| match instant(&s, &Scope::All, q, t).unwrap() {
        Value::Vector(v) => v.iter().map(|x| x.v).collect::<Vec<_>>(),
        v => panic!("{v:?}"),
    };
    let close = |got: Vec<f64>, want: f64| {
        assert!(
            got.len() == 1 && (got[0] - want).abs() <= 1e-12,
            "{got:?} vs {want}"
        );
    };
    // Both GPUs at 30 s; G1 alone once G2 has been silent for 5 minutes.
    let g1 = |t: i64| ((t / 100) % 97) as f64 / 100.0;
    let g2 = |t: i64| (((t - 50) / 100) % 13) as f64 / 20.0;
    let n1 = "flopwatch_node_ofu_ratio{node=\"n1\"}";
    close(at(n1, 30_070), (g1(30_070) + g2(30_070)) / 2.0);
    // Into the job: each GPU once, its series before the job left out.
    close(at(n1, 10_070), (g1(10_070) + g2(10_070)) / 2.0);
    close(at(n1, 400_520), g1(400_520));
    close(at(n1, 359_940), (g1(359_940) + g2(59_950)) / 2.0);
    close(at(n1, 360_070), g1(360_070));
    close(at("flopwatch_job_gpus", 30_070), 2.0);
    close(at("flopwatch_job_gpus", 370_000), 1.0);
    // The job's series ends with its time (and the lookback after it).
    close(at("flopwatch_job_ofu_ratio", 400_000), g1(400_000));
    assert!(at("flopwatch_job_ofu_ratio", 700_001).is_empty());
    // Windowed functions read the derived points.
    let avg = at(
        "avg_over_time(flopwatch_node_ofu_ratio{node=\"n2\"}[1m])",
        120_000,
    );
    assert_eq!(avg, vec![0.125]);
    // A tenant sees its own nodes and jobs only.
    let b = matrix(
        &s,
        &Scope::Tenant("b".into()),
        "flopwatch_node_ofu_ratio",
        start,
        end,
        step,
    );
    assert_eq!(b.len(), 1);
    assert_eq!(
        b[0].labels,
        labels(&[
            ("__name__", "flopwatch_node_ofu_ratio"),
            ("hostname", "host-n3"),
            ("node", "n3"),
            ("tenant", "b"),
        ])
    );
    assert!(matrix(
        &s,
        &Scope::Tenant("b".into()),
        "flopwatch_job_ofu_ratio",
        start,
        end,
        step
    )
    .is_empty());
}

/// Node `n1` with three GPUs sampled every 10 s (at offsets 0, 3 and 7 s)
/// from `T0` for 20 minutes with pseudo-random OFU; GPU `G3` stops at 10
/// minutes, and from 15 minutes every GPU is idle (OFU 0).
fn node_store() -> Store {
    let s = Store::new(Arc::new(MemEngine::new()), false);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for (g, off) in [("G1", 0), ("G2", 3_000), ("G3", 7_000)] {
        let end = if g == "G3" { 60 } else { 120 };
        let samples: Vec<OfuSample> = (0..end)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let ts_ms = T0 + off + i * 10_000;
                OfuSample {
                    ts_ms,
                    ofu: if i >= 90 {
                        0.0
                    } else {
                        (x >> 11) as f64 / (1u64 << 53) as f64
                    },
                    tensor_active: 0.5,
                    sm_clock_mhz: 1500.0,
                    window_ms: 10_000,
                }
            })
            .collect();
        let set = CommitSet {
            ofu: vec![(g.into(), None, samples)],
            gpus: vec![GpuRecord {
                uuid: g.into(),
                node_id: "n1".into(),
                ..Default::default()
            }],
            nodes: vec![NodeRecord {
                node_id: "n1".into(),
                hostname: "host-n1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        s.commit("a", &set).unwrap();
    }
    s
}

const T0: i64 = 1_700_000_000_000;

/// The node series at `times` from a range query over `[start, end]` at
/// `step`, bit patterns by time.
fn node_bits(s: &Store, start: i64, end: i64, step: i64) -> Vec<(i64, u64)> {
    let Value::Matrix(m) =
        range(s, &Scope::All, "flopwatch_node_ofu_ratio", start, end, step).unwrap()
    else {
        panic!("not a matrix")
    };
    assert_eq!(m.len(), 1, "{m:?}");
    m[0].points.iter().map(|(t, v)| (*t, v.to_bits())).collect()
}

/// A node's series gives the same bits at an instant whatever the range
/// and step that reach it, equals `avg by (node)` of its GPUs, counts a
/// stopped GPU through exactly 5 minutes after its last sample, and is
/// exactly 0 when its GPUs are idle.
#[test]
fn derived_node_series_are_exact_at_every_instant() {
    let s = node_store();
    let whole = node_bits(&s, T0, T0 + 20 * 60_000, 1_000);
    for (start, step) in [
        (T0 + 7 * 60_000 + 123_000, 1_000),
        (T0 + 5_000, 5_000),
        (T0 + 61_000, 60_000),
        (T0 + 17 * 60_000, 2_000),
    ] {
        for (t, bits) in node_bits(&s, start, T0 + 20 * 60_000, step) {
            let want = whole.iter().find(|p| p.0 == t).map(|p| p.1);
            assert_eq!(Some(bits), want, "at {t} (from {start}, step {step})");
        }
    }
    // The same as averaging the GPU series at every step, within the
    // rounding of Prometheus's incremental mean.
    let Value::Matrix(avg) = range(
        &s,
        &Scope::All,
        "avg by (node) (flopwatch_ofu_ratio)",
        T0,
        T0 + 20 * 60_000,
        1_000,
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(avg[0].points.len(), whole.len());
    for ((t, v), (t2, bits)) in avg[0].points.iter().zip(&whole) {
        assert_eq!(t, t2);
        assert!((v - f64::from_bits(*bits)).abs() < 1e-15, "{t}");
    }
    // G3's last sample is at T0 + 597 s, sampled over 10 s windows: its
    // series is stale after 3 windows and 10 s, counted through T0 + 637 s.
    let count = |t: i64| match instant(&s, &Scope::All, "count(flopwatch_ofu_ratio)", t).unwrap() {
        Value::Vector(v) => v[0].v,
        _ => panic!(),
    };
    let edge = T0 + 597_000 + 40_000;
    assert_eq!((count(edge), count(edge + 1)), (3.0, 2.0));
    let node = |t: i64| match instant(&s, &Scope::All, "flopwatch_node_ofu_ratio", t).unwrap() {
        Value::Vector(v) => v[0].v,
        _ => panic!(),
    };
    let by = |t: i64| match instant(&s, &Scope::All, "avg(flopwatch_ofu_ratio)", t).unwrap() {
        Value::Vector(v) => v[0].v,
        _ => panic!(),
    };
    for t in [edge, edge + 1] {
        assert!((node(t) - by(t)).abs() < 1e-15, "{t}");
    }
    // Idle from 15 minutes (G3 long gone): exactly 0, never -1e-17.
    for t in [T0 + 16 * 60_000, T0 + 19 * 60_000 + 500] {
        let v = node(t);
        assert_eq!(v.to_bits(), 0.0f64.to_bits(), "{t}: {v:e}");
        let Value::Vector(z) =
            instant(&s, &Scope::All, "flopwatch_node_ofu_ratio == 0", t).unwrap()
        else {
            panic!()
        };
        assert_eq!(z.len(), 1);
    }
}

/// An aggregation over a selector folds each group on the thread that
/// reads its members (`selector_groups`); over any other expression it
/// aggregates the whole vector. Both give the same series, bit for bit,
/// for every simple aggregation, with groups read on several threads
/// (256 GPUs in 16 jobs), on whole-minute steps and off them.
#[test]
fn aggregations_over_a_selector_fold_as_over_a_vector() {
    let s = Store::new(Arc::new(MemEngine::new()), false);
    let mut set = CommitSet::default();
    for g in 0..256i64 {
        let uuid = format!("G{g:03}");
        // Uneven values and gaps: GPU g is silent for a while in the middle.
        let samples = (0..720i64)
            .filter(|i| !(300 + g..330 + g).contains(i))
            .map(|i| OfuSample {
                ts_ms: 60_000 + i * 5_000 + g,
                ofu: ((i * 7919 + g * 104_729) % 1_000) as f64 / 997.0,
                tensor_active: 0.5,
                sm_clock_mhz: 1500.0,
                window_ms: 5_000,
            })
            .collect();
        set.ofu.push((uuid.clone(), None, samples));
        set.gpus.push(GpuRecord {
            uuid: uuid.clone(),
            node_id: format!("n{}", g / 8),
            index: (g % 8) as u32,
            model: "H100".into(),
            ..Default::default()
        });
        set.jobs.push(JobRecord {
            job_id: format!("j{}", g % 16),
            gpu_uuid: uuid,
            first_seen_ms: 0,
            last_seen_ms: 4_000_000,
            ..Default::default()
        });
    }
    for n in 0..32 {
        set.nodes.push(NodeRecord {
            node_id: format!("n{n}"),
            hostname: format!("host-{n}"),
            ..Default::default()
        });
    }
    s.commit("a", &set).unwrap();
    let scope = Scope::Tenant("a".into());
    for op in [
        "sum", "avg", "min", "max", "count", "group", "stddev", "stdvar",
    ] {
        for grouping in ["by (job_id)", "by (node)", "without (UUID, gpu)"] {
            for (start, end, step) in [(0, 3_720_000, 60_000), (1_234, 3_700_000, 17_000)] {
                let folded = format!("{op} {grouping} (flopwatch_ofu_ratio)");
                let whole = format!("{op} {grouping} (flopwatch_ofu_ratio + 0)");
                type Bits = Vec<(i64, u64)>;
                let bits = |q: &str| -> Vec<(Vec<(String, String)>, Bits)> {
                    unnamed(matrix(&s, &scope, q, start, end, step))
                        .into_iter()
                        .map(|r| {
                            (
                                r.labels,
                                r.points.iter().map(|p| (p.0, p.1.to_bits())).collect(),
                            )
                        })
                        .collect()
                };
                let (a, b) = (bits(&folded), bits(&whole));
                assert!(a.len() >= 16, "{folded}: {} series", a.len());
                assert_eq!(a, b, "{folded} at {start}..{end} step {step}");
            }
        }
    }
}

/// A GPU's OFU every 7 s for four hours (a sample on a minute's start
/// every 7 minutes), in job `j1` and then `j2`: its series under `j1`
/// ends where its successor begins, 8 s before a minute its last sample
/// would still be current at. Sealed or not; with
/// a late sample committed into the sealed third hour, which reopens it.
fn minute_steps_store(seal: bool, reopen: bool) -> Store {
    const T0: i64 = 1_699_999_200_000;
    let s = Store::new(Arc::new(MemEngine::new()), false);
    let sample = |i: i64| OfuSample {
        ts_ms: T0 + i * 7_000,
        ofu: ((i * 37) % 101) as f64 / 100.0,
        tensor_active: 0.5,
        sm_clock_mhz: 1500.0,
        window_ms: 7_000,
    };
    let job = |id: &str, from: i64, to: i64| JobRecord {
        job_id: id.into(),
        gpu_uuid: "G1".into(),
        first_seen_ms: T0 + from,
        last_seen_ms: T0 + to,
        ..Default::default()
    };
    let set = CommitSet {
        seq: 1,
        ofu: vec![(
            "G1".into(),
            None,
            (0..4 * 3_600_000 / 7_000).map(sample).collect(),
        )],
        gpus: vec![GpuRecord {
            uuid: "G1".into(),
            node_id: "n1".into(),
            ..Default::default()
        }],
        jobs: vec![
            job("j1", 600_000, 5_985_000),
            job("j2", 5_992_000, 4 * 3_600_000),
        ],
        ..Default::default()
    };
    s.commit("a", &set).unwrap();
    if seal {
        s.compact(T0 + 6 * 3_600_000, 0).unwrap();
    }
    if reopen {
        let late = CommitSet {
            seq: 2,
            ofu: vec![(
                "G1".into(),
                None,
                vec![OfuSample {
                    ts_ms: T0 + 2 * 3_600_000 + 1_800_003,
                    ..sample(0)
                }],
            )],
            ..Default::default()
        };
        s.commit("a", &late).unwrap();
    }
    s
}

/// An instant selector at steps on whole minutes, read in one pass over
/// the minutes where the store hands them over in order and a slot per
/// minute where it does not (an hour reopened by late samples), gives
/// each step the sample the samples themselves give it: the one on the
/// step, else the newest before it while current, a job's series cut
/// where its successor begins.
#[test]
fn minute_steps_take_the_samples_the_samples_give() {
    use super::model::StepTimes;
    use super::points::newest_at;
    const T0: i64 = 1_699_999_200_000;
    const M: i64 = 60_000;
    for (seal, reopen) in [(false, false), (true, false), (true, true)] {
        let s = minute_steps_store(seal, reopen);
        let budget = Budget::unlimited();
        let m = all_scope_model(&s, &budget);
        let series: Vec<_> = m
            .select(&[])
            .unwrap()
            .into_iter()
            .filter(|s| super::syntax::label(&s.labels, "__name__") == "flopwatch_ofu_ratio")
            .collect();
        assert_eq!(series.len(), 3, "outside every job, j1 and j2");
        let mut in_order = 0;
        for every in [1, 5] {
            let times: Vec<i64> = (0..=260 / every)
                .map(|i| T0 - 5 * M + i * every * M)
                .collect();
            let (from, to) = (times[0] - super::LOOKBACK_MS, *times.last().unwrap());
            for x in &series {
                let tl = m.timeline(x, from, to).unwrap();
                let mut j = 0;
                let want: Vec<_> = times.iter().map(|&t| newest_at(&tl, t, &mut j)).collect();
                let got = m
                    .at_times(x, &StepTimes::new(times.clone()), from, to)
                    .unwrap();
                assert_eq!(
                    got, want,
                    "sealed {seal}, reopened {reopen}, {:?}",
                    x.labels
                );
                assert!(got.iter().any(Option::is_some));
                let src = match &x.source {
                    super::model::Source::Ofu { tenant, gpu, .. } => (tenant.clone(), gpu.clone()),
                    _ => unreachable!(),
                };
                let minute_end = (to.div_euclid(M) + 1) * M;
                in_order += m
                    .minutes_in_order(x, &src.0, &src.1, &times, from, to, minute_end)
                    .unwrap()
                    .is_some() as usize;
            }
        }
        // The reopened hour's samples come after the hour sealed after it
        // for j2's series, whose span holds both (j1's ends before them).
        let expected = if reopen { 4 } else { 6 };
        assert_eq!(in_order, expected, "sealed {seal}, reopened {reopen}");
    }
}

/// A GPU's series is selected where it holds a sample, and only there:
/// a GPU whose samples all lie in its job has no series outside it (its
/// OFU bounds say so without a read), one with samples after its job
/// has both, sealed or in the head. Every series selected holds a
/// sample, and every owner (job or none) a sample has is selected.
#[test]
fn only_series_that_can_hold_a_sample_are_selected() {
    use std::collections::BTreeSet;
    const T0: i64 = 1_699_999_200_000;
    const H: i64 = 3_600_000;
    for seal in [false, true] {
        let s = Store::new(Arc::new(MemEngine::new()), false);
        let samples: Vec<OfuSample> = (1..360)
            .map(|i| OfuSample {
                ts_ms: T0 + i * 10_000,
                ofu: 0.25,
                tensor_active: 0.5,
                sm_clock_mhz: 1500.0,
                window_ms: 10_000,
            })
            .collect();
        // G1's job holds its whole hour; G2's ends halfway through it.
        let jobs = [("G1", "j1", T0 + H - 1), ("G2", "j2", T0 + H / 2)];
        let set = CommitSet {
            seq: 1,
            ofu: jobs
                .iter()
                .map(|(g, _, _)| (g.to_string(), None, samples.clone()))
                .collect(),
            gpus: jobs
                .iter()
                .map(|(g, _, _)| GpuRecord {
                    uuid: g.to_string(),
                    node_id: "n1".into(),
                    ..Default::default()
                })
                .collect(),
            jobs: jobs
                .iter()
                .map(|&(g, j, last)| JobRecord {
                    job_id: j.into(),
                    gpu_uuid: g.into(),
                    first_seen_ms: T0,
                    last_seen_ms: last,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        s.commit("a", &set).unwrap();
        if seal {
            s.compact(T0 + 3 * H, 0).unwrap();
        }
        let budget = Budget::unlimited();
        let m = all_scope_model(&s, &budget);
        let name = promql_parser::label::Matcher::new(
            promql_parser::label::MatchOp::Equal,
            "__name__",
            "flopwatch_ofu_ratio",
        );
        let selected: BTreeSet<(String, String)> = m
            .select(&[name])
            .unwrap()
            .iter()
            .map(|x| {
                assert!(
                    !m.timeline(x, i64::MIN, i64::MAX).unwrap().is_empty(),
                    "sealed {seal}: {:?} holds no sample",
                    x.labels
                );
                let l = |k| super::syntax::label(&x.labels, k).to_string();
                (l("UUID"), l("job_id"))
            })
            .collect();
        let owners: BTreeSet<(String, String)> = jobs
            .iter()
            .flat_map(|&(g, j, last)| {
                samples.iter().map(move |x| {
                    let owner = if x.ts_ms <= last { j } else { "" };
                    (g.to_string(), owner.to_string())
                })
            })
            .collect();
        assert_eq!(selected, owners, "sealed {seal}");
        assert_eq!(selected.len(), 3, "sealed {seal}");
    }
}
