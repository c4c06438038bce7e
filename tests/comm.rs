//! Communication and host counters end to end: simulated nodes with their
//! InfiniBand ports, NUMA nodes and host (as `flopwatch demo` runs them) →
//! real gRPC → collector → RocksDB → `Series` queries and `/metrics`.

use flopwatch_agent::source::node::{NodeSource, SimDevices};
use flopwatch_agent::source::sim::SimSource;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::v1::{self, ofu_request};
use flopwatch_sim::{FleetPlan, IB_ALL_REDUCE_BYTES_S, IB_ALL_TO_ALL_BYTES_S};
use flopwatch_tests::{agent, series, TestCollector};
use std::time::Duration;

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moe_all_to_all_bursts_show_in_the_infiniband_series() {
    let dir = tempfile::tempdir().unwrap();
    let collector = TestCollector::start(dir.path()).await;
    let start = SystemClock.now_ms();
    let fleet = FleetPlan::new(2, 4, 600_000);
    let mut agents = Vec::new();
    for n in 0..2 {
        let src = SimSource::new(&fleet, n, start, 0x5eed + n as u64);
        let devices = SimDevices::new(src.model().clone());
        agents.push(agent(
            Box::new(NodeSource::new(Box::new(src), vec![Box::new(devices)])),
            &format!("sim-node-{n:02}"),
            &collector.url,
            Duration::from_millis(100),
        ));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for a in agents {
        a.stop().await;
    }
    let mut q = collector.query().await;
    let find = |job: &str| {
        (0..2)
            .flat_map(|n| (0..4).map(move |g| (n, g)))
            .find(|&(n, g)| fleet.gpu(n, g).job.as_deref() == Some(job))
            .unwrap()
    };
    let port = |(n, g): (usize, usize)| format!("ib:mlx5_{g}:1@sim-node-{n:02}");

    // The MoE GPU's port: all-to-all bursts near line rate, quiet between.
    let moe = series(&mut q, &port(find("moe-train")), "ib_rx_bytes_s")
        .await
        .values;
    assert!(moe.len() >= 30, "{} samples", moe.len());
    let peak = moe.iter().cloned().fold(0.0, f64::max);
    assert!(peak > 0.6 * IB_ALL_TO_ALL_BYTES_S, "peak {peak}");
    assert!(
        peak > 10.0 * median(&moe),
        "peak {peak}, median {}",
        median(&moe)
    );
    // Three exchanges per 1.6 s step: several bursts in 5 s.
    let bursts = moe
        .windows(2)
        .filter(|w| w[0] < 0.5 * peak && w[1] >= 0.5 * peak)
        .count();
    assert!(bursts >= 4, "{bursts} bursts: {moe:?}");

    // The data-parallel job's port: all-reduce traffic, below the bursts.
    let dp = series(&mut q, &port(find("llm-pretrain")), "ib_rx_bytes_s")
        .await
        .values;
    let dp_peak = dp.iter().cloned().fold(0.0, f64::max);
    assert!(dp_peak > 0.4 * IB_ALL_REDUCE_BYTES_S, "{dp_peak}");
    assert!(dp_peak < 0.8 * IB_ALL_TO_ALL_BYTES_S, "{dp_peak}");

    // Host counters are stored too; CPU utilization is a fraction.
    let util = series(&mut q, "numa:0@sim-node-00", "host_cpu_util")
        .await
        .values;
    assert!(!util.is_empty() && util.iter().all(|u| (0.0..=1.0).contains(u)));
    assert!(
        !series(&mut q, "host@sim-node-01", "host_mem_available_bytes")
            .await
            .values
            .is_empty()
    );

    // Devices are not GPUs: OFU and GPU lists count the 8 GPUs only.
    let gpus = q
        .list_gpus(v1::ListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .gpus;
    assert_eq!(gpus.len(), 8);
    let fleet_ofu =
        flopwatch_tests::ofu_summary(&mut q, ofu_request::Scope::Fleet(true), 1, 0).await;
    assert_eq!(fleet_ofu.gpus, 8);
    let err = q
        .series(v1::SeriesRequest {
            gpu_uuid: "ib:mlx5_9:1@sim-node-00".into(),
            metric: "ib_rx_bytes_s".into(),
            start_ms: 1,
            end_ms: 0,
            limit: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // /metrics exports the device counters with device labels.
    let text = reqwest::get(&collector.metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("flopwatch_device_ib_rx_bytes_per_second{")
                && l.contains("device=\"mlx5_3:1\"")
                && l.contains("node=\"sim-node-00\"")
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("kind=\"ib_port\""), "{line}");
    assert!(text
        .lines()
        .any(|l| l.starts_with("flopwatch_device_") && l.contains("kind=\"numa_node\"")));
    // No device shows up as a GPU.
    assert!(!text
        .lines()
        .any(|l| l.starts_with("flopwatch_gpu_") && l.contains("ib:")));
    collector.stop().await;

    // Devices are kept with their node's record: after a restart, with no
    // agent connected, the port's series still answers in full.
    let collector = TestCollector::start(dir.path()).await;
    let mut q = collector.query().await;
    let again = series(&mut q, &port(find("moe-train")), "ib_rx_bytes_s")
        .await
        .values;
    assert_eq!(again.len(), moe.len());
    collector.stop().await;
}
