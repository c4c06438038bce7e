//! Adaptive sampling keeps OFU, measured through the shipped pipeline: the
//! same simulated node sampled at a fixed 100 ms and adaptively, each agent
//! streaming over gRPC into its own collector with RocksDB, under paused
//! time. Per job and per GPU, OFU over every whole minute and over the
//! whole run must agree within 0.1 percentage points — with a job that
//! regresses 2.5× mid-run (finetune), a bursty one (inference), and
//! training jobs with communication dips (llm-pretrain, moe-train).

use flopwatch_agent::AdaptiveSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{source, Agent, AgentOptions};
use flopwatch_agent::{FixedSampler, Sampler};
use flopwatch_collector::Auth;
use flopwatch_config::{CollectorConfig, SamplingConfig};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::{self, ofu_request::Scope, query_client::QueryClient};
use flopwatch_sim::FleetPlan;
use flopwatch_tests::TestCollector;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// Start of the run, unix ms: not on a 100 ms phase of the minute, as a
/// real agent's captures are not.
const T0: i64 = 1_800_000_000_037;
/// Simulated time.
const RUN: Duration = Duration::from_secs(290);
/// The largest OFU difference allowed, as a fraction (0.1 pp).
const TOLERANCE: f64 = 0.001;

fn agent(fleet: &FleetPlan, sampler: Box<dyn Sampler>, url: &str, clock: Arc<TokioClock>) -> Agent {
    Agent::start(
        source::sim_node(fleet, 0, T0, 3, false),
        sampler,
        AgentOptions {
            drain_timeout: Duration::from_secs(30),
            ..AgentOptions::new(NodeIdentity::named("node-0", "boot"), vec![url.to_string()])
        },
        clock,
    )
}

async fn ofu(q: &mut QueryClient<Channel>, scope: Scope, start: i64, end: i64) -> (f64, u64) {
    let s = flopwatch_tests::ofu_summary(q, scope, start, end).await;
    (s.mean, s.samples)
}

/// The OFU-input samples stored for `gpu`, and the time its tensor
/// activity samples cover, ms.
async fn stored(q: &mut QueryClient<Channel>, gpu: &str) -> (usize, u64) {
    let (mut n, mut covered) = (0, 0);
    for m in flopwatch_proto::metrics::OFU_INPUTS {
        let s = q
            .series(v1::SeriesRequest {
                gpu_uuid: gpu.to_string(),
                metric: m.to_string(),
                start_ms: T0,
                end_ms: T0 + 3_600_000,
                limit: 1_000_000,
            })
            .await
            .unwrap()
            .into_inner()
            .series
            .unwrap();
        n += s.timestamps_ms.len();
        if m == flopwatch_proto::metrics::TENSOR_ACTIVE {
            covered = s.window_ms.iter().map(|&w| u64::from(w)).sum();
        }
    }
    (n, covered)
}

#[tokio::test(start_paused = true)]
async fn adaptive_and_fixed_sampling_give_the_same_ofu_per_job_and_gpu() {
    let clock = Arc::new(TokioClock::starting_at(T0));
    let (dir_f, dir_a) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let collector = |dir: &std::path::Path| CollectorConfig {
        data_dir: dir.to_path_buf(),
        anonymous_tenant: Some("default".into()),
        plaintext: true,
        ..Default::default()
    };
    let fixed_c = TestCollector::start_clocked(
        &collector(dir_f.path()),
        Auth::anonymous("default"),
        Vec::new(),
        clock.clone(),
    )
    .await;
    let adaptive_c = TestCollector::start_clocked(
        &collector(dir_a.path()),
        Auth::anonymous("default"),
        Vec::new(),
        clock.clone(),
    )
    .await;
    // One node of 8 GPUs runs every job; finetune slows 2.5× at 150 s.
    let fleet = FleetPlan::new(1, 8, 150_000);
    let sampling = SamplingConfig {
        adaptive: true,
        ..Default::default()
    };
    let fixed = agent(
        &fleet,
        Box::new(FixedSampler::new(sampling.min_interval)),
        &fixed_c.url,
        clock.clone(),
    );
    let adaptive = agent(
        &fleet,
        Box::new(AdaptiveSampler::new(&sampling, 7)),
        &adaptive_c.url,
        clock.clone(),
    );
    tokio::time::sleep(RUN).await;
    let end = clock.now_ms();
    // Both stop at the same instant, mid-minute: the adaptive agent then
    // holds back its latest samples, which it must send as it stops.
    tokio::join!(fixed.stop(), adaptive.stop());

    let mut qf = fixed_c.query().await;
    let mut qa = adaptive_c.query().await;
    let gpus: Vec<(String, String)> = qf
        .list_gpus(v1::ListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .gpus
        .into_iter()
        .map(|g| (g.info.unwrap().uuid, g.job_id))
        .collect();
    assert_eq!(gpus.len(), 8);
    let mut jobs: Vec<String> = gpus.iter().map(|g| g.1.clone()).collect();
    jobs.sort();
    jobs.dedup();
    for j in [
        "finetune",
        "inference",
        "llm-pretrain",
        "moe-train",
        "gemm-bench",
    ] {
        assert!(jobs.iter().any(|x| x == j), "{j} missing from {jobs:?}");
    }

    // The adaptive agent really backed off (otherwise this proves
    // nothing), and its samples cover the same time as the fixed agent's:
    // nothing it held back was lost at the stop.
    let (mut sf, mut sa) = (0, 0);
    for (g, _) in &gpus {
        let (nf, cf) = stored(&mut qf, g).await;
        let (na, ca) = stored(&mut qa, g).await;
        assert_eq!(ca, cf, "{g}: adaptive samples cover {ca} ms, fixed {cf} ms");
        sf += nf;
        sa += na;
    }
    assert!(
        sa * 3 < sf,
        "adaptive stored {sa} OFU-input samples, fixed {sf}"
    );

    let minute = 60_000;
    let first = (T0 + 100).div_euclid(minute) * minute + minute;
    let windows: Vec<(i64, i64)> = (0..)
        .map(|k| (first + k * minute, first + (k + 1) * minute))
        .take_while(|w| w.1 <= end)
        .chain([(T0, end + 1)])
        .collect();
    assert!(windows.len() >= 4, "{windows:?}");
    let scopes = jobs
        .iter()
        .map(|j| Scope::JobId(j.clone()))
        .chain(gpus.iter().map(|g| Scope::GpuUuid(g.0.clone())));
    let mut worst = (0.0f64, String::new());
    for scope in scopes {
        for &(a, b) in &windows {
            let (f, nf) = ofu(&mut qf, scope.clone(), a, b).await;
            let (x, na) = ofu(&mut qa, scope.clone(), a, b).await;
            assert!(nf > 0 && na > 0, "{scope:?} [{a}, {b}): no samples");
            let d = (f - x).abs();
            if d > worst.0 {
                worst = (
                    d,
                    format!("{scope:?} [{a}, {b}): fixed {f:.5}, adaptive {x:.5}"),
                );
            }
        }
    }
    assert!(
        worst.0 <= TOLERANCE,
        "OFU differs by {:.3} pp: {}",
        worst.0 * 100.0,
        worst.1
    );

    // The regression happened inside the run and both see it.
    let before = ofu(
        &mut qf,
        Scope::JobId("finetune".into()),
        windows[0].0,
        windows[0].1,
    )
    .await;
    let last = windows[windows.len() - 2];
    let after = ofu(&mut qa, Scope::JobId("finetune".into()), last.0, last.1).await;
    assert!(after.0 < before.0 * 0.6, "finetune {before:?} → {after:?}");
    fixed_c.stop().await;
    adaptive_c.stop().await;
}
