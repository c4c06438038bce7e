//! MIG-partitioned GPUs end to end: dcgm-exporter pages of two A100s split
//! into instances, in the layouts dcgm-exporter writes (instance rows only;
//! card and instance rows, `-d g,i`), through an agent with the
//! dcgm-exporter source into a collector with RocksDB. Each instance is a
//! GPU with its share of the card's peak; node OFU weighs each instance by
//! its share of its card (docs/MIG.md); no layout counts a card twice; an
//! instance created while the agent runs is picked up without a restart.

use flopwatch_agent::{Agent, AgentOptions, FixedSampler, TokioClock};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::ofu_request;
use flopwatch_tests::{anonymous_collector, dcgm, list_gpus, ofu_summary, TestCollector};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CARD_A: &str = "GPU-5d0ab1c2-3e4f-4a5b-8c6d-7e8f9a0b1c2d";
const CARD_B: &str = "GPU-6e1bc2d3-4f5a-4b6c-9d7e-8f9a0b1c2d3e";
const MODEL: &str = "NVIDIA A100-SXM4-80GB";
/// A100 SXM: 108 SMs, dense FP16 108 × 2048 × 1410 MHz.
const CARD_SMS: f64 = 108.0;
const CARD_PEAK_TFLOPS: f64 = 108.0 * 2048.0 * 1410.0 * 1e6 / 1e12;

/// One MIG instance on a page.
#[derive(Clone)]
struct Instance {
    card: usize,
    gi: u32,
    profile: &'static str,
    /// SMs of the profile on an A100 (`nvidia-smi mig -lgip`).
    sms: f64,
    tensor: f64,
}

fn instances() -> Vec<Instance> {
    vec![
        Instance {
            card: 0,
            gi: 1,
            profile: "3g.40gb",
            sms: 42.0,
            tensor: 0.8,
        },
        Instance {
            card: 0,
            gi: 2,
            profile: "4g.40gb",
            sms: 56.0,
            tensor: 0.2,
        },
        Instance {
            card: 1,
            gi: 3,
            profile: "2g.20gb",
            sms: 28.0,
            tensor: 0.6,
        },
        Instance {
            card: 1,
            gi: 9,
            profile: "1g.10gb",
            sms: 14.0,
            tensor: 0.1,
        },
    ]
}

/// How dcgm-exporter lays a MIG GPU out.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Every row is an instance's (device fields repeated per instance).
    InstancesOnly,
    /// The card's rows (with DCGM's card-wide aggregate of the profiling
    /// fields) and the instances' (dcgm-exporter `-d g,i`).
    CardAndInstances,
}

/// A dcgm-exporter page of the two cards at SM clock 1410 MHz (the A100's
/// tensor clock: OFU equals tensor activity).
fn page(layout: Layout, instances: &[Instance]) -> String {
    let card_labels = |c: usize| {
        let uuid = [CARD_A, CARD_B][c];
        format!(
            "gpu=\"{c}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{c}\",modelName=\"{MODEL}\",Hostname=\"node-7\",DCGM_FI_DRIVER_VERSION=\"550.90.07\"",
            0x18 + c
        )
    };
    let mut out = String::new();
    let mut family = |name: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} x\n# TYPE {name} gauge\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{{{labels}}} {v}\n"));
        }
    };
    let inst = |i: &Instance| {
        format!(
            "{},GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"",
            card_labels(i.card),
            i.profile,
            i.gi
        )
    };
    let mut clock = Vec::new();
    let mut power = Vec::new();
    let mut tensor = Vec::new();
    for c in 0..2 {
        let mine: Vec<&Instance> = instances.iter().filter(|i| i.card == c).collect();
        match layout {
            Layout::CardAndInstances => {
                clock.push((card_labels(c), 1410.0));
                power.push((card_labels(c), 250.0));
                // DCGM's card-level profiling field: its instances' mean
                // over the card's SMs.
                let busy: f64 = mine.iter().map(|i| i.tensor * i.sms).sum();
                tensor.push((card_labels(c), busy / CARD_SMS));
            }
            Layout::InstancesOnly => {
                for i in &mine {
                    clock.push((inst(i), 1410.0));
                    power.push((inst(i), 250.0));
                }
            }
        }
        for i in mine {
            tensor.push((inst(i), i.tensor));
        }
    }
    family("DCGM_FI_DEV_SM_CLOCK", clock);
    family("DCGM_FI_DEV_POWER_USAGE", power);
    family("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", tensor);
    out
}

async fn agent(url: String, collector: &TestCollector, clock: Arc<TokioClock>) -> Agent {
    dcgm::agent(
        url,
        "node-7",
        &collector.url,
        Some(Duration::from_millis(300)),
        clock,
    )
    .await
}

/// Σ share × OFU / Σ share over `instances` (OFU = tensor activity at the
/// tensor clock).
fn weighted(instances: &[Instance]) -> f64 {
    let w: f64 = instances.iter().map(|i| i.sms).sum();
    instances.iter().map(|i| i.sms * i.tensor).sum::<f64>() / w
}

/// Two MIG-partitioned A100s, in either layout: the node has the four
/// instances as its GPUs, their peaks sum to their SMs' share of the
/// cards' (never the cards' twice), and node OFU is capacity-weighted.
#[tokio::test]
async fn two_partitioned_a100s_count_as_their_instances() {
    for layout in [Layout::InstancesOnly, Layout::CardAndInstances] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(TokioClock::new());
        let collector = anonymous_collector(dir.path(), clock.clone()).await;
        let all = instances();
        let url = dcgm::serve(Arc::new(Mutex::new(page(layout, &all)))).await;
        let start = clock.now_ms();
        let agent = agent(url, &collector, clock.clone()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        agent.stop().await;
        let end = clock.now_ms() + 1;
        let mut q = collector.query().await;
        let node = ofu_summary(
            &mut q,
            ofu_request::Scope::NodeId("node-7".into()),
            start,
            end,
        )
        .await;
        assert_eq!(node.gpus, 4, "{layout:?}: {node:?}");
        let want_peak = CARD_PEAK_TFLOPS * all.iter().map(|i| i.sms).sum::<f64>() / CARD_SMS;
        assert!(
            (node.peak_tflops - want_peak).abs() < 1e-6,
            "{layout:?}: peak {} TFLOP/s, want {want_peak} (two whole cards: {})",
            node.peak_tflops,
            2.0 * CARD_PEAK_TFLOPS
        );
        let want = weighted(&all);
        let unweighted = all.iter().map(|i| i.tensor).sum::<f64>() / 4.0;
        assert!(
            (node.mean - want).abs() < 1e-9,
            "{layout:?}: node OFU {}, want {want} capacity-weighted (plain mean {unweighted})",
            node.mean
        );
        // Delivered over capacity says the same.
        assert!((node.achieved_tflops / node.peak_tflops - want).abs() < 1e-9);
        // Each instance is listed with its identity; a card with listed
        // instances is there for its device counters, marked as a card.
        let gpus = list_gpus(&mut q).await;
        for i in &all {
            let uuid = format!("MIG-{}/{}", [CARD_A, CARD_B][i.card], i.gi);
            let g = gpus
                .iter()
                .filter_map(|g| g.info.as_ref())
                .find(|g| g.uuid == uuid)
                .unwrap_or_else(|| panic!("{layout:?}: {uuid} not listed"));
            assert_eq!(g.mig_parent_uuid, [CARD_A, CARD_B][i.card]);
            assert_eq!(
                (g.gpu_instance_id, g.mig_profile.as_str()),
                (i.gi, i.profile)
            );
        }
        let cards: Vec<_> = gpus
            .iter()
            .filter_map(|g| g.info.as_ref())
            .filter(|g| g.uuid.starts_with("GPU-"))
            .collect();
        match layout {
            Layout::InstancesOnly => assert!(cards.is_empty(), "{cards:?}"),
            Layout::CardAndInstances => {
                assert_eq!(cards.len(), 2, "{cards:?}");
                assert!(cards.iter().all(|c| c.mig_enabled), "{cards:?}");
            }
        }
        // /metrics: the node gauge is weighted the same way.
        let nodes = dcgm::scrape(&collector.collector, "flopwatch_node_ofu_ratio");
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        assert!((nodes[0].1 - want).abs() < 1e-9, "{layout:?}: {nodes:?}");
        collector.stop().await;
    }
}

/// An instance created while the agent runs is picked up at the next
/// scrape, without a restart: it is listed and has OFU, and the others go
/// on.
#[tokio::test]
async fn an_instance_created_while_the_agent_runs_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TokioClock::new());
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let all = instances();
    let first: Vec<Instance> = all.iter().filter(|i| i.gi != 9).cloned().collect();
    let text = Arc::new(Mutex::new(page(Layout::CardAndInstances, &first)));
    let url = dcgm::serve(text.clone()).await;
    let agent = agent(url, &collector, clock.clone()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let created = clock.now_ms();
    *text.lock().unwrap() = page(Layout::CardAndInstances, &all);
    tokio::time::sleep(Duration::from_secs(3)).await;
    agent.stop().await;
    let end = clock.now_ms() + 1;
    let mut q = collector.query().await;
    let uuid = format!("MIG-{CARD_B}/9");
    let gpus = list_gpus(&mut q).await;
    assert!(
        gpus.iter()
            .filter_map(|g| g.info.as_ref())
            .any(|g| g.uuid == uuid && g.mig_profile == "1g.10gb"),
        "the new instance is not listed: {gpus:?}"
    );
    let new = ofu_summary(&mut q, ofu_request::Scope::GpuUuid(uuid), created, end).await;
    assert!(new.samples >= 5, "{new:?}");
    assert!((new.mean - 0.1).abs() < 1e-9, "{new:?}");
    let node = ofu_summary(
        &mut q,
        ofu_request::Scope::NodeId("node-7".into()),
        created + 1_000,
        end,
    )
    .await;
    assert_eq!(node.gpus, 4, "{node:?}");
    assert!((node.mean - weighted(&all)).abs() < 1e-9, "{node:?}");
    collector.stop().await;
}

/// The NVML source on the fake driver with MIG: an H100 split 3g+4g that
/// is reconfigured to 3g+2g+1g while the agent runs, beside a whole H100.
/// Through agent, gRPC and RocksDB: the new instances are listed and
/// measured without a restart, each instance's OFU is its own workload's
/// (the fake's ground truth), and the node's peak is the cards' capacity
/// counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_mig_instances_and_a_reconfiguration_reach_the_collector() {
    let _driver = flopwatch_tests::fake_nvml().await;
    use flopwatch_agent::source::nvml::NvmlSource;
    use flopwatch_agent::source::GpuSource;
    use flopwatch_fake_nvml::config::FakeConfig;
    use flopwatch_fake_nvml::mig::MigNode;
    use flopwatch_sim::{FleetPlan, SimModel};

    let lib = flopwatch_fake_nvml::library_path().expect("fake libnvidia-ml built");
    let clock = Arc::new(TokioClock::new());
    let start = clock.now_ms();
    let reconfig_after = 2_000;
    let spec = format!(
        "gpus=2,seed=7,start_ms={start},regress_after_ms=600000,\
         mig_layout=0:3g.40gb+4g.40gb,mig_reconfig=0:3g.40gb+2g.20gb+1g.10gb@{reconfig_after}"
    );
    flopwatch_fake_nvml::control::configure(&spec).unwrap();
    let config = FakeConfig::parse(&spec).unwrap();
    let model = SimModel::new(&FleetPlan::new(1, 2, 600_000), 0, start, 7);
    let mig = MigNode::new(&config, start);
    let source = NvmlSource::open(Some(&lib)).unwrap();
    assert_eq!(source.inventory().len(), 4, "card, 2 instances, whole GPU");
    let dir = tempfile::tempdir().unwrap();
    let collector = anonymous_collector(dir.path(), clock.clone()).await;
    let mut opts = AgentOptions::new(
        NodeIdentity::named("h100-node", "boot"),
        vec![collector.url.clone()],
    );
    opts.flush_interval = Duration::from_millis(300);
    let agent = Agent::start(
        Box::new(source),
        Box::new(FixedSampler::new(Duration::from_millis(100))),
        opts,
        clock.clone(),
    );
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    agent.stop().await;
    let end = clock.now_ms();
    let mut q = collector.query().await;
    let gpus = list_gpus(&mut q).await;
    let infos: Vec<_> = gpus.iter().filter_map(|g| g.info.clone()).collect();
    let card0 = model.uuid(0);
    let card = infos.iter().find(|g| g.uuid == card0).expect("card 0");
    assert!(card.mig_enabled, "{card:?}");
    // After the change (seen at the next rescan of the MIG devices):
    // GPU instances 1 (3g), 2 (now 2g) and 3 (1g).
    let after = start + reconfig_after + flopwatch_agent::source::mig::RESCAN_MS + 1_000;
    let mut weighted = (0.0, 0.0);
    for (gi, profile, sms) in [
        (1, "3g.40gb", 60.0),
        (2, "2g.20gb", 32.0),
        (3, "1g.10gb", 16.0),
    ] {
        let want_uuid = mig.uuid(&card0, &mig.instance_at(0, gi, end).expect("live"));
        let g = infos
            .iter()
            .find(|g| g.uuid == want_uuid)
            .unwrap_or_else(|| panic!("GI {gi} ({want_uuid}) not listed: {infos:?}"));
        assert_eq!((g.mig_profile.as_str(), g.sm_count), (profile, sms as u32));
        let got = ofu_summary(
            &mut q,
            ofu_request::Scope::GpuUuid(want_uuid.clone()),
            after,
            end,
        )
        .await;
        assert!(got.samples >= 10, "GI {gi}: {got:?}");
        let truth = mig.instance_window(&model, 0, gi, after, end).ofu;
        // Per-window OFU (eq. 1 on window means) against the tick-by-tick
        // truth: a training step's phases inside one 100 ms window move
        // it by up to 1.5 points.
        assert!(
            (got.mean - truth).abs() < 0.02,
            "GI {gi}: OFU {} vs truth {truth}",
            got.mean
        );
        weighted.0 += sms * got.mean;
        weighted.1 += sms;
    }
    // The node after the change: card 0 through its instances (108 of its
    // 132 SMs in use), GPU 1 whole.
    let node = ofu_summary(
        &mut q,
        ofu_request::Scope::NodeId("h100-node".into()),
        after,
        end,
    )
    .await;
    let h100 = 132.0 * 4096.0 * 1830.0 * 1e6 / 1e12;
    let want_peak = h100 * (60.0 + 32.0 + 16.0) / 132.0 + h100;
    assert_eq!(node.gpus, 4, "{node:?}");
    assert!(
        (node.peak_tflops - want_peak).abs() < 1e-6,
        "{} vs {want_peak}",
        node.peak_tflops
    );
    let whole = ofu_summary(
        &mut q,
        ofu_request::Scope::GpuUuid(model.uuid(1)),
        after,
        end,
    )
    .await;
    // Capacity-weighted: instances by SMs / 132, the whole GPU by 1.
    let want = (weighted.0 / 132.0 + whole.mean) / (weighted.1 / 132.0 + 1.0);
    assert!((node.mean - want).abs() < 0.01, "{} vs {want}", node.mean);
    collector.stop().await;
}
