//! A GPU two pods share by time-slicing, end to end: a dcgm-exporter page
//! that shows the GPU once per pod (as dcgm-exporter does for a shared
//! GPU), an agent with the dcgm-exporter source, a collector with RocksDB.
//! Both jobs are listed on the GPU, each with its apportioned share (even:
//! the page has no per-process figure, and says so); each job's OFU on it
//! is its share of the GPU's, so the two sum to the GPU's; the node counts
//! the GPU once.

use flopwatch_agent::{Agent, AgentOptions, FixedSampler, TokioClock};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::{self, ofu_request};
use flopwatch_tests::{anonymous_collector, dcgm, list_gpus, list_jobs, ofu_summary};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHARED: &str = "GPU-7a1c2e3f-0b4d-4e5f-8a6b-1c2d3e4f5a6b";
const WHOLE: &str = "GPU-8b2d3f40-1c5e-4f60-9b7c-2d3e4f5a6b7c";

/// The page: GPU 0 time-sliced by pods `a` and `b` of namespace `ml`
/// (every field once per pod), GPU 1 held by pod `c`. SM clock 1830 MHz,
/// the H100's tensor clock: OFU is tensor activity.
fn page() -> String {
    let gpu = |i: usize, uuid: &str, pod: &str| {
        format!(
            "gpu=\"{i}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-9\",container=\"main\",namespace=\"ml\",pod=\"{pod}\"",
            0x18 + i
        )
    };
    let rows = [
        (gpu(0, SHARED, "a"), 0.6),
        (gpu(0, SHARED, "b"), 0.6),
        (gpu(1, WHOLE, "c"), 0.3),
    ];
    let mut out = String::new();
    for (name, value) in [
        ("DCGM_FI_DEV_SM_CLOCK", None),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Some(())),
    ] {
        out.push_str(&format!("# HELP {name} x\n# TYPE {name} gauge\n"));
        for (labels, tensor) in &rows {
            let v = if value.is_some() { *tensor } else { 1830.0 };
            out.push_str(&format!("{name}{{{labels}}} {v}\n"));
        }
    }
    out
}

#[tokio::test]
async fn a_time_sliced_gpu_shows_both_pods_with_ofu_apportioned() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TokioClock::new());
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let url = dcgm::serve(Arc::new(Mutex::new(page()))).await;
    let start = clock.now_ms();
    let agent = dcgm::agent(
        url,
        "node-9",
        &collector.url,
        Some(Duration::from_millis(300)),
        clock.clone(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // /metrics while the agent runs: both shares, and each job's OFU its
    // part of the GPU's.
    let shares = dcgm::scrape(&collector.collector, "flopwatch_gpu_job_share_ratio");
    assert_eq!(shares.len(), 2, "{shares:?}");
    for pod in ["ml/a", "ml/b"] {
        let (labels, v) = shares
            .iter()
            .find(|(l, _)| l.contains(&format!("job_id=\"{pod}\"")))
            .unwrap_or_else(|| panic!("{pod}: {shares:?}"));
        assert!(
            labels.contains("split=\"equal\"") && labels.contains(SHARED),
            "{labels}"
        );
        assert!((v - 0.5).abs() < 1e-9, "{v}");
    }
    let jobs = dcgm::scrape(&collector.collector, "flopwatch_job_ofu_ratio");
    let job = |id: &str| {
        jobs.iter()
            .find(|(l, _)| l.contains(&format!("job_id=\"{id}\"")))
            .map(|(_, v)| *v)
    };
    assert!((job("ml/a").unwrap() - 0.3).abs() < 1e-9, "{jobs:?}");
    assert!((job("ml/b").unwrap() - 0.3).abs() < 1e-9, "{jobs:?}");
    assert!((job("ml/c").unwrap() - 0.3).abs() < 1e-9, "{jobs:?}");
    agent.stop().await;
    let end = clock.now_ms() + 1;

    let mut q = collector.query().await;
    // The GPU lists both jobs and their shares, and no one job.
    let gpus = list_gpus(&mut q).await;
    let shared = gpus
        .iter()
        .find(|g| g.info.as_ref().is_some_and(|i| i.uuid == SHARED))
        .expect("the shared GPU");
    assert_eq!(shared.job_id, "");
    let listed: Vec<(&str, u32, &str)> = shared
        .shares
        .iter()
        .map(|s| (s.job_id.as_str(), s.share_ppm, s.split.as_str()))
        .collect();
    assert_eq!(
        listed,
        [("ml/a", 500_000, "equal"), ("ml/b", 500_000, "equal")]
    );
    assert_eq!(gpus.len(), 2, "a share is not a GPU: {gpus:?}");
    // Both jobs run on it.
    let jobs = list_jobs(&mut q).await;
    for id in ["ml/a", "ml/b"] {
        let j = jobs.iter().find(|j| j.job_id == id).expect(id);
        assert_eq!(j.gpu_uuids, [SHARED.to_string()], "{id}");
    }
    // Each job's OFU is its share of the GPU's; together they are the
    // GPU's.
    let gpu = ofu_summary(
        &mut q,
        ofu_request::Scope::GpuUuid(SHARED.into()),
        start,
        end,
    )
    .await;
    assert!((gpu.mean - 0.6).abs() < 1e-9, "{gpu:?}");
    let mut sum = 0.0;
    for id in ["ml/a", "ml/b"] {
        let j = ofu_summary(&mut q, ofu_request::Scope::JobId(id.into()), start, end).await;
        assert!(j.samples >= 5, "{id}: {j:?}");
        assert!((j.mean - 0.3).abs() < 1e-9, "{id}: {j:?}");
        sum += j.mean;
    }
    assert!((sum - gpu.mean).abs() < 1e-9);
    // The node counts the GPU once, at its whole OFU.
    let node = ofu_summary(
        &mut q,
        ofu_request::Scope::NodeId("node-9".into()),
        start,
        end,
    )
    .await;
    assert_eq!(node.gpus, 2, "{node:?}");
    assert!((node.mean - 0.45).abs() < 1e-9, "{node:?}");
    // The ledger: each job's delivered work on the GPU is its share,
    // marked apportioned.
    let ledger = q
        .ledger(v1::LedgerRequest {
            start_ms: start,
            end_ms: end,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let on_shared: Vec<&v1::LedgerEntry> = ledger
        .entries
        .iter()
        .filter(|e| e.gpu_uuid == SHARED)
        .collect();
    assert_eq!(on_shared.len(), 2, "{:?}", ledger.entries);
    for e in &on_shared {
        assert!(e.apportioned, "{e:?}");
        assert!(e.held_s > 1.0, "{e:?}");
        assert!((e.ofu_s / e.held_s - 0.3).abs() < 1e-6, "{e:?}");
    }
    let whole = ledger
        .entries
        .iter()
        .find(|e| e.gpu_uuid == WHOLE)
        .expect("pod c");
    assert!(!whole.apportioned);
    collector.stop().await;
}

/// The NVML source on the fake driver: GPU 0 time-sliced by two Slurm
/// jobs' processes (70 % and 30 % of its SM time), attributed through
/// their cgroups. Both jobs are on the GPU with shares apportioned by the
/// processes' SM utilisation (`sm_util`, 0.7 / 0.3), and their OFU on it
/// sums to the GPU's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_process_utilisation_apportions_a_shared_gpu() {
    use flopwatch_agent::attribution::AttributionOptions;
    use flopwatch_agent::source::nvml::NvmlSource;
    use flopwatch_agent::source::GpuSource;

    let proc_root = tempfile::tempdir().unwrap();
    for (pid, job) in [(4242, 4242), (4343, 4343)] {
        let dir = proc_root.path().join(pid.to_string());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"),
        )
        .unwrap();
    }
    let _driver = flopwatch_tests::fake_nvml().await;
    let lib = flopwatch_fake_nvml::library_path().expect("fake libnvidia-ml built");
    let clock = Arc::new(TokioClock::new());
    let start = clock.now_ms();
    flopwatch_fake_nvml::control::configure(&format!(
        "gpus=2,seed=11,start_ms={start},regress_after_ms=600000,share=0:4242/70+4343/30"
    ))
    .unwrap();
    let source = NvmlSource::open(Some(&lib)).unwrap();
    let gpu0 = source.inventory()[0].uuid.clone();
    let dir = tempfile::tempdir().unwrap();
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let mut opts = AgentOptions::new(
        NodeIdentity::named("node-s", "boot"),
        vec![collector.url.clone()],
    );
    opts.flush_interval = Duration::from_millis(300);
    let attribution = AttributionOptions {
        enabled: true,
        proc_root: proc_root.path().to_path_buf(),
        pod_resources_socket: None,
        mapping_dir: None,
        mfu_dir: None,
        refresh_interval: Duration::from_millis(200),
    };
    let agent = Agent::start_with_attribution(
        Box::new(source),
        Box::new(FixedSampler::new(Duration::from_millis(100))),
        opts,
        attribution,
        clock.clone(),
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let shares = dcgm::scrape(&collector.collector, "flopwatch_gpu_job_share_ratio");
    agent.stop().await;
    let end = clock.now_ms() + 1;
    assert_eq!(shares.len(), 2, "{shares:?}");
    for (job, want) in [("4242", 0.7), ("4343", 0.3)] {
        let (labels, v) = shares
            .iter()
            .find(|(l, _)| l.contains(&format!("job_id=\"{job}\"")))
            .unwrap_or_else(|| panic!("{job}: {shares:?}"));
        assert!(labels.contains("split=\"sm_util\""), "{labels}");
        // Whole percents of each tick's SM activity, averaged over a batch.
        assert!((v - want).abs() < 0.02, "{job}: share {v}, want {want}");
    }
    let mut q = collector.query().await;
    let gpus = list_gpus(&mut q).await;
    let g = gpus
        .iter()
        .find(|g| g.info.as_ref().is_some_and(|i| i.uuid == gpu0))
        .expect("GPU 0");
    let jobs: Vec<&str> = g.shares.iter().map(|s| s.job_id.as_str()).collect();
    assert_eq!(jobs, ["4242", "4343"]);
    assert!(g.shares.iter().all(|s| s.split == "sm_util"), "{g:?}");
    // Over the time both were attributed, the jobs' OFU on the GPU sums to
    // the GPU's (each job's series is OFU × its share of each batch).
    let from = start + 1_500;
    let whole = ofu_summary(&mut q, ofu_request::Scope::GpuUuid(gpu0), from, end).await;
    let mut sum = 0.0;
    for job in ["4242", "4343"] {
        let j = ofu_summary(&mut q, ofu_request::Scope::JobId(job.into()), from, end).await;
        assert!(j.samples >= 10, "{job}: {j:?}");
        sum += j.mean;
    }
    assert!(whole.mean > 0.05, "{whole:?}");
    assert!(
        (sum - whole.mean).abs() < 1e-6,
        "jobs {sum} vs GPU {}",
        whole.mean
    );
    collector.stop().await;
}
