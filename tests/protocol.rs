//! The Ingest protocol from a raw gRPC client, as a client written in
//! another language from `proto/` alone would use it: Hello → Welcome,
//! Batch → Ack, a malformed batch → Reject with a precise code while the
//! stream goes on, replays acknowledged as duplicates and not stored twice.

use flopwatch_collector::{digest, Auth};
use flopwatch_config::{CollectorConfig, QueryToken, TenantConfig};
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::v1::{
    self, agent_message, collector_message, ingest_client::IngestClient, AgentMessage,
};
use flopwatch_tests::TestCollector;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn hello(node: &str, gpu: &str) -> AgentMessage {
    AgentMessage {
        msg: Some(agent_message::Msg::Hello(v1::Hello {
            agent_id: node.into(),
            node: Some(v1::NodeIdentity {
                node_id: node.into(),
                hostname: node.into(),
                boot_id: "boot-1".into(),
                labels: Default::default(),
            }),
            gpus: vec![v1::GpuInfo {
                uuid: gpu.into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                ..Default::default()
            }],
            protocol_version: 1,
            ..Default::default()
        })),
    }
}

fn batch(seq: u64, gpu: &str, t0: i64, tpa: &[f64]) -> AgentMessage {
    let ts: Vec<i64> = (0..tpa.len() as i64).map(|i| t0 + i * 100).collect();
    AgentMessage {
        msg: Some(agent_message::Msg::Batch(v1::Batch {
            seq,
            series: vec![
                v1::Series {
                    gpu_uuid: gpu.into(),
                    metric: "tensor_active".into(),
                    timestamps_ms: ts.clone(),
                    values: tpa.to_vec(),
                    window_ms: vec![100; tpa.len()],
                    ..Default::default()
                },
                v1::Series {
                    gpu_uuid: gpu.into(),
                    metric: "sm_clock_avg_mhz".into(),
                    timestamps_ms: ts,
                    values: vec![1830.0; tpa.len()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        })),
    }
}

async fn next(s: &mut tonic::Streaming<v1::CollectorMessage>) -> collector_message::Msg {
    s.message().await.unwrap().unwrap().msg.unwrap()
}

/// A stream opened with `hello`: its sender and what the collector sends.
async fn open(
    client: &mut IngestClient<tonic::transport::Channel>,
    hello: AgentMessage,
) -> (
    mpsc::Sender<AgentMessage>,
    tonic::Streaming<v1::CollectorMessage>,
) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(hello).await.unwrap();
    let inbound = client
        .stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, inbound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_rejects_and_replays_on_one_stream() {
    let dir = tempfile::tempdir().unwrap();
    let c = TestCollector::start(dir.path()).await;
    let mut client = IngestClient::connect(c.url.clone()).await.unwrap();
    let (tx, mut inbound) = open(&mut client, hello("n1", "GPU-a")).await;
    let collector_message::Msg::Welcome(w) = next(&mut inbound).await else {
        panic!("no welcome")
    };
    assert_eq!(w.acked_seq, 0);
    assert_eq!(w.tenant, "default");

    let now = SystemClock.now_ms();
    tx.send(batch(1, "GPU-a", now - 1000, &[0.5, 0.5, f64::NAN, 0.5]))
        .await
        .unwrap();
    let collector_message::Msg::Ack(a) = next(&mut inbound).await else {
        panic!()
    };
    assert_eq!((a.seq, a.accepted_samples, a.duplicate), (1, 7, false));
    assert_eq!(a.rejected[0].reason, "non_finite");

    // Malformed: values shorter than timestamps.
    let mut bad = batch(2, "GPU-a", now - 500, &[0.5, 0.5]);
    if let Some(agent_message::Msg::Batch(b)) = &mut bad.msg {
        b.series[0].values.pop();
    }
    tx.send(bad).await.unwrap();
    let collector_message::Msg::Reject(r) = next(&mut inbound).await else {
        panic!()
    };
    assert_eq!(
        (r.seq, r.code, r.reason.as_str()),
        (2, Code::InvalidArgument as i32, "malformed_batch")
    );
    assert!(r.message.contains("values"), "{}", r.message);

    // The stream goes on.
    tx.send(batch(3, "GPU-a", now - 400, &[1.0, 1.0]))
        .await
        .unwrap();
    let collector_message::Msg::Ack(a) = next(&mut inbound).await else {
        panic!()
    };
    assert_eq!((a.seq, a.accepted_samples), (3, 4));
    // A replay of an acked batch: acknowledged, not stored again.
    tx.send(batch(3, "GPU-a", now - 400, &[1.0, 1.0]))
        .await
        .unwrap();
    let collector_message::Msg::Ack(a) = next(&mut inbound).await else {
        panic!()
    };
    assert!(a.duplicate);
    drop(tx);

    let mut q = c.query().await;
    let r = q
        .ofu(v1::OfuRequest {
            scope: Some(v1::ofu_request::Scope::GpuUuid("GPU-a".into())),
            start_ms: now - 10_000,
            end_ms: 0,
            step_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let s = r.summary.unwrap();
    // 3 samples at 0.5 and 2 at 1.0, clock at the tensor peak: (1.5 + 2) / 5.
    assert_eq!(s.samples, 5);
    assert!((s.mean - 0.7).abs() < 1e-9, "{}", s.mean);

    // A new stream for the same agent and boot learns the acked seq.
    let (tx, rx) = mpsc::channel(8);
    tx.send(hello("n1", "GPU-a")).await.unwrap();
    let mut inbound = client
        .stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let collector_message::Msg::Welcome(w) = next(&mut inbound).await else {
        panic!()
    };
    assert_eq!(w.acked_seq, 3);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_own_data() {
    let cfg = CollectorConfig {
        tenants: vec![
            TenantConfig {
                name: "acme".into(),
                agent_tokens_sha256: vec![digest("acme-agent")],
                query_tokens: vec![QueryToken {
                    sha256: digest("acme-read"),
                }],
                ..Default::default()
            },
            TenantConfig {
                name: "beta".into(),
                agent_tokens_sha256: vec![digest("beta-agent")],
                query_tokens: vec![QueryToken {
                    sha256: digest("beta-read"),
                }],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let c = TestCollector::start_with(dir.path(), Auth::from_config(&cfg)).await;
    let mut client = IngestClient::connect(c.url.clone()).await.unwrap();

    // No credentials: refused, with no data in the message.
    let (tx, rx) = mpsc::channel(8);
    tx.send(hello("n0", "GPU-x")).await.unwrap();
    let e = client.stream(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(e.message(), "missing or invalid credentials");

    let now = SystemClock.now_ms();
    for (tenant, gpu) in [("acme", "GPU-acme"), ("beta", "GPU-beta")] {
        let (tx, rx) = mpsc::channel(8);
        tx.send(hello(&format!("{tenant}-node"), gpu))
            .await
            .unwrap();
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {tenant}-agent").parse().unwrap(),
        );
        let mut inbound = client.stream(req).await.unwrap().into_inner();
        let collector_message::Msg::Welcome(w) = next(&mut inbound).await else {
            panic!()
        };
        assert_eq!(w.tenant, tenant);
        tx.send(batch(1, gpu, now - 1000, &[0.4, 0.4]))
            .await
            .unwrap();
        assert!(matches!(
            next(&mut inbound).await,
            collector_message::Msg::Ack(_)
        ));
    }
    let mut q = c.query().await;
    let mut list = tonic::Request::new(v1::ListRequest::default());
    list.metadata_mut()
        .insert("authorization", "Bearer acme-read".parse().unwrap());
    let gpus = q.list_gpus(list).await.unwrap().into_inner().gpus;
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].info.as_ref().unwrap().uuid, "GPU-acme");
    let mut other = tonic::Request::new(v1::OfuRequest {
        scope: Some(v1::ofu_request::Scope::GpuUuid("GPU-beta".into())),
        ..Default::default()
    });
    other
        .metadata_mut()
        .insert("authorization", "Bearer acme-read".parse().unwrap());
    assert_eq!(q.ofu(other).await.unwrap_err().code(), Code::NotFound);
    let mut agent_token = tonic::Request::new(v1::ListRequest::default());
    agent_token
        .metadata_mut()
        .insert("authorization", "Bearer acme-agent".parse().unwrap());
    assert_eq!(
        q.list_gpus(agent_token).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    c.stop().await;
}

/// Past `max_agents` streams a new one is refused with RESOURCE_EXHAUSTED
/// (its agent fails over); a freed slot takes the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_max_agents_are_refused_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = CollectorConfig {
        data_dir: dir.path().to_path_buf(),
        anonymous_tenant: Some("default".into()),
        max_agents: 1,
        ..Default::default()
    };
    let c = TestCollector::start_config(&cfg, Auth::from_config(&cfg), Vec::new()).await;
    let mut client = IngestClient::connect(c.url.clone()).await.unwrap();
    let open = |client: &mut IngestClient<tonic::transport::Channel>, node: &'static str| {
        let mut client = client.clone();
        async move {
            let (tx, rx) = mpsc::channel(8);
            tx.send(hello(node, &format!("GPU-{node}"))).await.unwrap();
            let r = client.stream(ReceiverStream::new(rx)).await;
            (tx, r)
        }
    };
    let (first_tx, first) = open(&mut client, "n1").await;
    let mut first = first.unwrap().into_inner();
    assert!(matches!(
        next(&mut first).await,
        collector_message::Msg::Welcome(_)
    ));
    let (_tx, second) = open(&mut client, "n2").await;
    let err = second.expect_err("a second stream is over the limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("another collector"), "{err}");

    // The first agent goes away: its slot frees and the next one is served.
    drop(first_tx);
    drop(first);
    let deadline = Deadline::after(std::time::Duration::from_secs(10));
    loop {
        let (_tx, third) = open(&mut client, "n3").await;
        match third {
            Ok(s) => {
                let mut s = s.into_inner();
                assert!(matches!(
                    next(&mut s).await,
                    collector_message::Msg::Welcome(_)
                ));
                break;
            }
            Err(e) if e.code() == Code::ResourceExhausted => {
                assert!(!deadline.passed(), "slot never freed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    c.stop().await;
}

/// A collector stopped right after taking samples of hours already over
/// (a backfill) compacts those hours on its way out, instead of leaving
/// them in the head until its next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_compacts_the_sealed_hours() {
    use flopwatch_collector::store::{rocks::RocksEngine, Cf, Engine, Store, WINDOW_MS};
    use flopwatch_tests::raw::{self, RawAgent};
    let dir = tempfile::tempdir().unwrap();
    let c = TestCollector::start(dir.path()).await;
    let channel = tonic::transport::Endpoint::from_shared(c.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (mut a, _) = RawAgent::open(channel, None, raw::hello("n1", "n1", "GPU-1"))
        .await
        .unwrap();
    let now = SystemClock.now_ms();
    // Two hours ago, well past the 5 min seal delay.
    let t0 = now.div_euclid(WINDOW_MS) * WINDOW_MS - 2 * WINDOW_MS + 600_000;
    for seq in 1..=20u64 {
        let b = raw::batch(seq, "GPU-1", t0 + seq as i64 * 1000, 10, 0.5, 300.0, None);
        let r = a.call(b).await.unwrap();
        assert!(matches!(r, collector_message::Msg::Ack(_)), "{r:?}");
    }
    drop(a);
    // Well before the compactor's first scheduled pass (1 min).
    c.stop().await;
    let engine = std::sync::Arc::new(RocksEngine::open(dir.path()).unwrap());
    let count = |cf: Cf| {
        let mut n = 0;
        engine
            .scan(cf, &[], &[0xff; 8], &mut |_, _| {
                n += 1;
                true
            })
            .unwrap();
        n
    };
    assert_eq!(count(Cf::Head), 0, "the sealed hour left the head");
    assert_eq!(
        engine.family_bytes(Cf::Head),
        0,
        "no tombstones of its blocks on disk"
    );
    assert_eq!(count(Cf::Raw), 3, "one chunk per series");
    let store = Store::new(engine.clone(), false);
    let got = store
        .series("default", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
        .unwrap();
    assert_eq!(got.len(), 200);
}

/// An OFU range counts each sample for the part of its window inside the
/// range. With adaptive sampling the first sample after a workload change
/// can carry a long window of the workload before (the agent snaps at the
/// capture that shows the change, a sample stamped at its window's end):
/// a 5-s window at 90 % stamped 100 ms into a phase at 10 % must weigh
/// 100 ms there, not 5 s (what a real H200 showed: docs/GPU-VALIDATION.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ofu_range_counts_only_the_part_of_a_window_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = TestCollector::start(dir.path()).await;
    let mut client = IngestClient::connect(c.url.clone()).await.unwrap();
    let (tx, mut inbound) = open(&mut client, hello("n1", "GPU-a")).await;
    assert!(matches!(
        next(&mut inbound).await,
        collector_message::Msg::Welcome(_)
    ));
    // The phase starts at `p`: one long window ending 100 ms after it,
    // then nine 100-ms windows at 10 %.
    let p = SystemClock.now_ms() - 5_000;
    let ts: Vec<i64> = (1..=10).map(|i| p + i * 100).collect();
    let windows: Vec<u32> = std::iter::once(5_100).chain([100; 9]).collect();
    let tpa: Vec<f64> = std::iter::once(0.9).chain([0.1; 9]).collect();
    let mut b = batch(1, "GPU-a", p, &tpa);
    if let Some(agent_message::Msg::Batch(b)) = &mut b.msg {
        for s in &mut b.series {
            s.timestamps_ms = ts.clone();
        }
        b.series[0].window_ms = windows;
    }
    tx.send(b).await.unwrap();
    let collector_message::Msg::Ack(a) = next(&mut inbound).await else {
        panic!("no ack")
    };
    assert!(a.rejected.is_empty(), "{a:?}");
    let mut q = c.query().await;
    let gpu = || v1::ofu_request::Scope::GpuUuid("GPU-a".into());
    // The phase: 100 ms at 90 % and 900 ms at 10 % (clock at the tensor
    // peak, so OFU = TPA). Counting the whole window would give 0.78.
    let s = flopwatch_tests::ofu_summary(&mut q, gpu(), p, p + 1_001).await;
    assert_eq!(s.samples, 10);
    assert!((s.mean - 0.18).abs() < 1e-9, "{}", s.mean);
    // A range holding the whole window weighs all of it.
    let s = flopwatch_tests::ofu_summary(&mut q, gpu(), p - 5_000, p + 1_001).await;
    assert!((s.mean - 0.78).abs() < 1e-9, "{}", s.mean);
    drop(tx);
    c.stop().await;
}
