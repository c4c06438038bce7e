//! The core number in a harsher world, through the shipped path: a
//! simulated node whose `gemm-bench` runs as jobs that end and start on the
//! same GPUs (40 s each, 20 s apart) and whose profiling fields leave from
//! 70 s to 200 s (DCGM's profiling module stopped; power and the other
//! device fields stay), sampled at a fixed 100 ms and adaptively, each
//! agent streaming over gRPC into its own collector with RocksDB, under
//! paused time.
//!
//! - Per-job OFU (`Query/Ofu` by job) equals the ground truth computed
//!   from each job's own time on its GPUs (the simulator's exact window
//!   means, less the outage) within 0.1 percentage points.
//! - A job's GPUs are free when it ends: no job label on `/metrics`, no
//!   job in `query gpus`, no member in the job's PromQL series once it is
//!   stale.
//! - No stale value is served past the stated bound (three sampling
//!   windows and 10 s, docs/ATTRIBUTION.md): OFU and tensor activity leave
//!   `/metrics` and the PromQL API, node OFU is computed over fresh GPUs
//!   only, and what stays (power) stays.

use flopwatch_agent::source::sim::{SimHarshness, SimSource};
use flopwatch_agent::{AdaptiveSampler, FixedSampler, Sampler, TokioClock};
use flopwatch_agent::{Agent, AgentOptions};
use flopwatch_collector::promql::{Engine, Value};
use flopwatch_collector::Scope;
use flopwatch_config::SamplingConfig;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::ofu_request;
use flopwatch_sim::{FleetPlan, SimModel, Turns};
use flopwatch_tests::{anonymous_collector, dcgm, list_gpus, list_jobs, TestCollector};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Start of the run, unix ms (not on a 100 ms phase of the minute).
const T0: i64 = 1_800_000_000_037;
/// Simulated time.
const RUN_MS: i64 = 240_000;
/// The profiling outage, ms after the start.
const OUTAGE: (i64, i64) = (70_000, 200_000);
/// The largest OFU difference allowed, as a fraction (0.1 pp).
const TOLERANCE: f64 = 0.001;
/// A series' staleness bound with 100 ms windows: 3 windows and 10 s.
const BOUND_100MS: i64 = 10_300;
/// The longest bound: adaptive sampling's 30 s cap (3 × 30 s + 10 s).
const BOUND_MAX: i64 = 100_000;

fn fleet() -> FleetPlan {
    FleetPlan::new(1, 8, 10 * RUN_MS).with_turns(Turns {
        run_ms: 40_000,
        gap_ms: 20_000,
    })
}

fn source() -> SimSource {
    SimSource::new(&fleet(), 0, T0, 3).with_harshness(SimHarshness {
        profiling_outages: vec![(T0 + OUTAGE.0, T0 + OUTAGE.1)],
        ..Default::default()
    })
}

/// One sampler's run: its collector and agent.
struct Run {
    name: &'static str,
    collector: TestCollector,
    agent: Option<Agent>,
    /// A current OFU value is allowed this long after the outage starts.
    bound: i64,
}

/// The `/metrics` page's samples of `family`: (labels, value).
fn scrape(c: &TestCollector, family: &str) -> Vec<(String, f64)> {
    dcgm::scrape(&c.collector, family)
}

/// An instant PromQL query's samples at `t`.
fn promql(c: &TestCollector, q: &str, t: i64) -> Vec<(Vec<(String, String)>, f64)> {
    match Engine::new(c.collector.clone()).instant(&Scope::All, q, t) {
        Ok(Value::Vector(v)) => v.into_iter().map(|s| (s.labels, s.v)).collect(),
        other => panic!("{q}: {other:?}"),
    }
}

/// A job's time on its GPUs less the outage: a capture at `t` covers
/// `(t − 100 ms, t]`, and captures in the outage have no tensor activity,
/// so `(start + 69.9 s, start + 199.9 s]` is not sampled.
fn sampled(from: i64, to: i64) -> Vec<(i64, i64)> {
    let hole = (T0 + OUTAGE.0 - 100, T0 + OUTAGE.1 - 100);
    [(from, to.min(hole.0)), (from.max(hole.1), to)]
        .into_iter()
        .filter(|(a, b)| b > a)
        .collect()
}

/// Ground truth over `[from, to)` of `gpus`, less the outage, weighted by
/// time as flopwatch averages (OFU eq. 11): the true OFU (tensor activity
/// × clock tick by tick, OFU eq. 1), and what OFU eq. 1 gives from each
/// 100 ms capture's window means (the simulator's exact GPM-like means) —
/// the number flopwatch must reproduce when every sample goes to its own
/// job.
fn truth(model: &SimModel, gpus: &[usize], from: i64, to: i64) -> (f64, f64) {
    let f_max = f64::from(model.model.tensor_clock_mhz);
    let (mut exact, mut windowed, mut len) = (0.0, 0.0, 0.0);
    for &g in gpus {
        for (a, b) in sampled(from, to) {
            exact += model.window(g, a, b).ofu * (b - a) as f64;
            len += (b - a) as f64;
            let mut t = a;
            while t < b {
                let m = model.window(g, t, t + 100).mean;
                windowed += m.tensor_active * m.sm_clock_mhz.min(f_max) / f_max * 100.0;
                t += 100;
            }
        }
    }
    (exact / len, windowed / len)
}

#[tokio::test(start_paused = true)]
async fn jobs_end_inputs_go_quiet_and_per_job_ofu_stays_true() {
    let clock = Arc::new(TokioClock::starting_at(T0));
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let sampling = SamplingConfig {
        adaptive: true,
        ..Default::default()
    };
    let samplers: [(&str, Box<dyn Sampler>, i64); 2] = [
        (
            "fixed",
            Box::new(FixedSampler::new(sampling.min_interval)),
            BOUND_100MS,
        ),
        (
            "adaptive",
            Box::new(AdaptiveSampler::new(&sampling, 7)),
            BOUND_MAX,
        ),
    ];
    let mut runs = Vec::new();
    for ((name, sampler, bound), dir) in samplers.into_iter().zip(&dirs) {
        let collector = anonymous_collector(dir.path(), clock.clone()).await;
        let agent = Agent::start(
            Box::new(source()),
            sampler,
            AgentOptions {
                drain_timeout: Duration::from_secs(30),
                ..AgentOptions::new(
                    NodeIdentity::named("node-0", "boot"),
                    vec![collector.url.clone()],
                )
            },
            clock.clone(),
        );
        runs.push(Run {
            name,
            collector,
            agent: Some(agent),
            bound,
        });
    }
    let model = source().model().clone();
    let gemm: Vec<usize> = (0..8)
        .filter(|&g| model.plans[g].job.as_deref() == Some("gemm-bench"))
        .collect();
    assert!(!gemm.is_empty());
    let sleep_to = |t: i64| {
        tokio::time::sleep_until(
            tokio::time::Instant::now() + Duration::from_millis((t - clock.now_ms()).max(0) as u64),
        )
    };

    // 50 s: gemm-bench-1 ended at 40 s, the next starts at 60 s. Its GPUs
    // carry no job on /metrics (ended one batch after the end at most).
    sleep_to(T0 + 52_000).await;
    for r in &runs {
        let ofu = scrape(&r.collector, "flopwatch_ofu_ratio");
        assert_eq!(ofu.len(), 8, "{}: {ofu:?}", r.name);
        assert!(
            ofu.iter().all(|(l, _)| !l.contains("gemm-bench")),
            "{}: a finished job keeps its GPUs: {ofu:?}",
            r.name
        );
    }
    // 65 s: the next job holds the GPUs.
    sleep_to(T0 + 65_000).await;
    for r in &runs {
        let ofu = scrape(&r.collector, "flopwatch_ofu_ratio");
        let on_gemm = ofu
            .iter()
            .filter(|(l, _)| l.contains("job_id=\"gemm-bench-2\""))
            .count();
        assert_eq!(on_gemm, gemm.len(), "{}: {ofu:?}", r.name);
    }
    // The profiling fields left at 70 s: past the bound, no OFU or tensor
    // activity on /metrics or in PromQL; power stays; node OFU has no
    // GPU left.
    for at in [
        T0 + OUTAGE.0 + BOUND_100MS + 500,
        T0 + OUTAGE.0 + BOUND_MAX + 500,
    ] {
        sleep_to(at).await;
        for r in runs.iter().filter(|r| at >= T0 + OUTAGE.0 + r.bound) {
            let now = clock.now_ms();
            for family in [
                "flopwatch_ofu_ratio",
                "flopwatch_ofu_tensor_active_ratio",
                "flopwatch_node_ofu_ratio",
            ] {
                let s = scrape(&r.collector, family);
                assert!(
                    s.is_empty(),
                    "{} at {} s: {family} still served: {s:?}",
                    r.name,
                    (now - T0) / 1000
                );
                let q = promql(&r.collector, family, now);
                assert!(
                    q.is_empty(),
                    "{} at {} s: PromQL {family}: {q:?}",
                    r.name,
                    (now - T0) / 1000
                );
            }
            assert_eq!(
                scrape(&r.collector, "flopwatch_gpu_power_watts").len(),
                8,
                "{}",
                r.name
            );
            assert_eq!(
                promql(&r.collector, "flopwatch_gpu_power_watts", now).len(),
                8,
                "{}",
                r.name
            );
        }
    }
    // Back after the outage, within one send at adaptive sampling's 30 s
    // cap.
    sleep_to(T0 + OUTAGE.1 + 35_000).await;
    for r in &runs {
        assert_eq!(
            scrape(&r.collector, "flopwatch_ofu_ratio").len(),
            8,
            "{}",
            r.name
        );
    }
    sleep_to(T0 + RUN_MS).await;
    let end = clock.now_ms();
    let agents: Vec<Agent> = runs.iter_mut().filter_map(|r| r.agent.take()).collect();
    futures::future::join_all(agents.into_iter().map(Agent::stop)).await;

    // Per job, over its own time: the ground truth within 0.1 pp.
    let mut spans: BTreeMap<String, (Vec<usize>, i64, i64)> = BTreeMap::new();
    for g in 0..8 {
        let mut t = T0;
        while t < end {
            if let Some((job, since)) = model.job_at(g, t) {
                let e = spans.entry(job).or_insert((Vec::new(), since, since));
                if !e.0.contains(&g) {
                    e.0.push(g);
                }
                e.2 = e.2.max((t + 1_000).min(end));
            }
            t += 1_000;
        }
    }
    assert!(spans.contains_key("gemm-bench-3"), "{:?}", spans.keys());
    for r in &runs {
        let mut q = r.collector.query().await;
        let listed: Vec<String> = list_jobs(&mut q)
            .await
            .into_iter()
            .map(|j| j.job_id)
            .collect();
        let (mut worst, mut worst_true) = ((0.0f64, String::new()), 0.0f64);
        for (job, (gpus, from, to)) in &spans {
            assert!(listed.contains(job), "{}: {job} not in {listed:?}", r.name);
            let got = flopwatch_tests::ofu_summary(
                &mut q,
                ofu_request::Scope::JobId(job.clone()),
                T0,
                end + 1,
            )
            .await;
            let (exact, windowed) = truth(&model, gpus, *from, *to);
            let d = (got.mean - windowed).abs();
            if d > worst.0 {
                worst = (
                    d,
                    format!(
                        "{job}: {:.5} measured, {windowed:.5} from its own windows",
                        got.mean
                    ),
                );
            }
            worst_true = worst_true.max((got.mean - exact).abs());
        }
        assert!(
            worst.0 <= TOLERANCE,
            "{}: per-job OFU off by {:.3} pp: {}",
            r.name,
            worst.0 * 100.0,
            worst.1
        );
        // OFU eq. 1 from window means against the tick-by-tick truth: the
        // estimator's own error (a training step's compute and
        // communication phases inside one 100 ms window), as in e2e.rs.
        assert!(
            worst_true <= 0.005,
            "{}: {:.3} pp from the true OFU",
            r.name,
            worst_true * 100.0
        );
        eprintln!(
            "{}: per-job OFU within {:.4} pp of its own windows, {:.4} pp of the true OFU",
            r.name,
            worst.0 * 100.0,
            worst_true * 100.0
        );
        // The first job's PromQL series has a member while it runs, none
        // once its last sample (at 40 s) is stale.
        let series = "flopwatch_job_gpus{job_id=\"gemm-bench-1\"}";
        assert_eq!(
            promql(&r.collector, series, T0 + 39_000).len(),
            1,
            "{}",
            r.name
        );
        assert!(
            promql(&r.collector, series, T0 + 40_000 + r.bound + 1).is_empty(),
            "{}",
            r.name
        );
        // The ended jobs' GPUs are gemm-bench-3's now; no GPU names an
        // ended job.
        let gpus = list_gpus(&mut q).await;
        assert!(
            gpus.iter()
                .all(|g| g.job_id != "gemm-bench-1" && g.job_id != "gemm-bench-2"),
            "{}: {gpus:?}",
            r.name
        );
    }
    for r in runs {
        r.collector.stop().await;
    }
}

/// One H100 GPU of a page, with the pod while it runs.
fn gpu(tensor: f64, pod: Option<&str>) -> dcgm::PageGpu {
    dcgm::PageGpu {
        uuid: "GPU-2f6c7d38-0b7a-4b2e-9c41-6a1d6f0e9b11".into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        tensor,
        sm_clock_mhz: 1755.0,
        pod: pod.map(str::to_string),
    }
}

/// A pod ends on a real-format dcgm-exporter page: its labels leave and
/// tensor activity drops to 0. The job's OFU over its own time is the
/// page's while it ran, whatever follows; its GPU is free within a batch
/// after the next scrape.
#[tokio::test]
async fn a_pod_that_ends_on_a_dcgm_exporter_page_lets_go_of_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TokioClock::new());
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let page = Arc::new(std::sync::Mutex::new(dcgm::page(&[gpu(
        0.45,
        Some("llm-0"),
    )])));
    let url = dcgm::serve(page.clone()).await;
    let agent = dcgm::agent(url, "node-7", &collector.url, None, clock.clone()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ended = clock.now_ms();
    *page.lock().unwrap() = dcgm::page(&[gpu(0.0, None)]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Within a scrape and a batch (200 ms + 1 s): the GPU has no job on
    // /metrics and in `query gpus`.
    let ofu = scrape(&collector, "flopwatch_ofu_ratio");
    assert_eq!(ofu.len(), 1, "{ofu:?}");
    assert!(
        !ofu[0].0.contains("job_id"),
        "the ended pod keeps its GPU: {ofu:?}"
    );
    let mut q = collector.query().await;
    let gpus = list_gpus(&mut q).await;
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].job_id, "", "{gpus:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.stop().await;
    let end = clock.now_ms();
    // The job's OFU over all time is the page's while it ran: 0.45 × the
    // clock over the tensor peak clock (1755 / 1830), not diluted by the
    // idle time after.
    let job = flopwatch_tests::ofu_summary(
        &mut q,
        ofu_request::Scope::JobId("ml/llm-0".into()),
        0,
        end + 1,
    )
    .await;
    let want = 0.45 * 1755.0 / 1830.0;
    assert!(job.samples > 5, "{job:?}");
    assert!(
        (job.mean - want).abs() < 1e-9,
        "job OFU {} vs {want}",
        job.mean
    );
    let jobs = list_jobs(&mut q).await;
    let j = jobs
        .iter()
        .find(|j| j.job_id == "ml/llm-0")
        .expect("the pod's job");
    assert!(
        j.last_seen_ms <= ended + 1_500,
        "the job's span runs past its end: last seen {} ms after",
        j.last_seen_ms - ended
    );
    collector.stop().await;
}

/// H100 PCIe and NVL pages, their model names as dcgm-exporter prints them
/// and with `--replace-blanks-in-model-name`: each GPU's OFU uses its own
/// tensor peak clock (PCIe 1620 MHz, NVL 1544 MHz), never the SXM part's
/// 1830.
#[tokio::test]
async fn h100_pcie_and_nvl_pages_use_their_own_peak_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TokioClock::new());
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let models = [
        ("NVIDIA H100 PCIe", 1620.0),
        ("NVIDIA-H100-PCIe", 1620.0),
        ("NVIDIA H100 NVL", 1544.0),
        ("NVIDIA-H100-NVL", 1544.0),
        ("NVIDIA-H100-80GB-HBM3", 1830.0),
    ];
    let gpus: Vec<dcgm::PageGpu> = models
        .iter()
        .enumerate()
        .map(|(i, (model, _))| dcgm::PageGpu {
            uuid: format!("GPU-00000000-0000-4000-8000-00000000000{i}"),
            model: model.to_string(),
            tensor: 0.5,
            sm_clock_mhz: 1500.0,
            pod: None,
        })
        .collect();
    let url = dcgm::serve(Arc::new(std::sync::Mutex::new(dcgm::page(&gpus)))).await;
    let agent = dcgm::agent(url, "node-7", &collector.url, None, clock.clone()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ofu = scrape(&collector, "flopwatch_ofu_ratio");
    assert_eq!(ofu.len(), models.len(), "{ofu:?}");
    for (i, (model, f_max)) in models.iter().enumerate() {
        let uuid = &gpus[i].uuid;
        let (_, got) = ofu
            .iter()
            .find(|(l, _)| l.contains(uuid.as_str()))
            .unwrap_or_else(|| panic!("{model}: no OFU in {ofu:?}"));
        let want = 0.5 * 1500.0 / f_max;
        assert!(
            (got - want).abs() < 1e-9,
            "{model}: OFU {got}, want {want} (f_max {f_max} MHz)"
        );
    }
    agent.stop().await;
    collector.stop().await;
}
