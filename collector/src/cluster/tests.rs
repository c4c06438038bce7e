//! The settlement rule, passes over two in-memory stores with time passed
//! in, and the Held service's credentials.

use super::held::agent_key;
use super::*;
use crate::state::Collector;
use crate::store::memory::MemEngine;
use crate::store::{AgentKey, Store};
use crate::store::{CommitSet, OfuSample};
use flopwatch_proto::cluster::BatchRef;
use flopwatch_proto::model::{Point, SeriesBatch};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const NOW: i64 = 1_700_000_000_000;
const TIMEOUT: i64 = 3_600_000;

#[test]
fn the_rule_drops_for_a_holder_keeps_when_all_are_absent_and_waits_otherwise() {
    use Holding::*;
    let d = |answers: &[Option<(u64, Holding)>]| decide(5, answers, NOW, NOW, TIMEOUT);
    assert_eq!(d(&[]), Decision::Keep, "no peers: nothing to wait for");
    assert_eq!(d(&[Some((9, Absent)), Some((1, Absent))]), Decision::Keep);
    assert_eq!(d(&[Some((9, Absent)), Some((1, Held))]), Decision::Drop);
    assert_eq!(d(&[None, Some((9, Held))]), Decision::Drop, "held wins");
    assert_eq!(d(&[Some((4, Limbo))]), Decision::Drop, "lower id keeps");
    assert_eq!(d(&[Some((6, Limbo))]), Decision::Wait, "higher id lets go");
    assert_eq!(
        d(&[Some((5, Limbo))]),
        Decision::Wait,
        "equal ids: no order"
    );
    assert_eq!(d(&[Some((9, Absent)), None]), Decision::Wait);
    let late = |answers: &[Option<(u64, Holding)>]| decide(5, answers, NOW, NOW + TIMEOUT, TIMEOUT);
    assert_eq!(late(&[None]), Decision::TimedOut);
    assert_eq!(late(&[Some((6, Limbo))]), Decision::TimedOut);
    assert_eq!(late(&[None, Some((6, Held))]), Decision::Drop);
    assert_eq!(
        decide(5, &[None], NOW, NOW + TIMEOUT - 1, TIMEOUT),
        Decision::Wait
    );
}

fn agent() -> AgentKey {
    AgentKey {
        tenant: "t".into(),
        agent_id: "node-1".into(),
        boot_id: "boot".into(),
    }
}

fn batch(seq: u64, limbo: bool) -> CommitSet {
    let ts: Vec<i64> = (0..5)
        .map(|i| NOW - 60_000 + seq as i64 * 1000 + i * 100)
        .collect();
    CommitSet {
        agent: Some(agent()),
        seq,
        series: vec![SeriesBatch {
            gpu_uuid: "GPU-1".into(),
            metric: "power_w".into(),
            points: ts
                .iter()
                .map(|&t| Point {
                    ts_ms: t,
                    value: 300.0,
                    peak: None,
                    window_ms: Some(100),
                })
                .collect(),
        }],
        ofu: vec![(
            "GPU-1".into(),
            None,
            ts.iter()
                .map(|&t| OfuSample {
                    ts_ms: t,
                    ofu: 0.4,
                    tensor_active: 0.5,
                    sm_clock_mhz: 1464.0,
                    window_ms: 100,
                })
                .collect(),
        )],
        limbo: limbo.then_some(NOW),
        ..Default::default()
    }
}

fn store() -> Store {
    Store::new(Arc::new(MemEngine::new()), false)
}

/// A peer answering from a store in this process, or failing.
struct Local {
    store: Option<Store>,
    id: u64,
}

#[tonic::async_trait]
impl Peer for Local {
    fn name(&self) -> &str {
        "local"
    }
    async fn held(&self, refs: &[BatchRef]) -> Result<(u64, Vec<Option<Holding>>), String> {
        let s = self.store.as_ref().ok_or("unreachable")?;
        let h = refs
            .iter()
            .map(|r| s.holding(&agent_key(r), r.seq).map(Some))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        Ok((self.id, h))
    }
}

fn reconciler(s: &Store, id: u64, peer: Option<(&Store, u64)>) -> Reconciler {
    let peer = match peer {
        Some((p, pid)) => Local {
            store: Some(p.clone()),
            id: pid,
        },
        None => Local { store: None, id: 0 },
    };
    Reconciler::new(
        s.clone(),
        id,
        vec![Box::new(peer)],
        TIMEOUT,
        Arc::new(ClusterStats::default()),
    )
}

fn points(s: &Store) -> usize {
    s.series("t", "GPU-1", "power_w", 0, i64::MAX, 1000)
        .unwrap()
        .len()
}

#[tokio::test]
async fn commit_then_die_leaves_one_copy_and_a_lost_batch_is_kept() {
    // A committed 1 and died before acking; 2 never reached it. The agent
    // resent both to B, flagged.
    let (a, b) = (store(), store());
    a.commit("t", &batch(1, false)).unwrap();
    b.commit("t", &batch(1, true)).unwrap();
    b.commit("t", &batch(2, true)).unwrap();
    assert_eq!(points(&b), 10, "limbo is readable");
    let r = reconciler(&b, 2, Some((&a, 1)));
    let report = r.pass(NOW).await.unwrap();
    assert_eq!(
        (report.in_limbo, report.dropped, report.kept, report.waiting),
        (2, 1, 1, 0)
    );
    assert_eq!(b.holding(&agent(), 1).unwrap(), Holding::Absent);
    assert_eq!(b.holding(&agent(), 2).unwrap(), Holding::Held);
    assert_eq!(points(&a) + points(&b), 10, "each sample on one collector");
    assert_eq!(r.stats.dropped.load(Ordering::Relaxed), 1);
    assert_eq!(r.stats.kept.load(Ordering::Relaxed), 1);
    assert_eq!(r.stats.limbo_batches.load(Ordering::Relaxed), 0);
    assert_eq!(r.pass(NOW).await.unwrap(), PassReport::default());
}

#[tokio::test]
async fn two_limbo_copies_settle_to_one_in_either_order() {
    for low_first in [true, false] {
        let (low, high) = (store(), store());
        low.commit("t", &batch(3, true)).unwrap();
        high.commit("t", &batch(3, true)).unwrap();
        let r_low = reconciler(&low, 10, Some((&high, 20)));
        let r_high = reconciler(&high, 20, Some((&low, 10)));
        if low_first {
            assert_eq!(r_low.pass(NOW).await.unwrap().waiting, 1, "waits for high");
        }
        assert_eq!(r_high.pass(NOW).await.unwrap().dropped, 1);
        assert_eq!(r_low.pass(NOW).await.unwrap().kept, 1);
        assert_eq!(low.holding(&agent(), 3).unwrap(), Holding::Held);
        assert_eq!(high.holding(&agent(), 3).unwrap(), Holding::Absent);
        assert_eq!(points(&low) + points(&high), 5);
    }
}

#[tokio::test]
async fn an_unreachable_peer_holds_limbo_until_the_timeout() {
    let b = store();
    b.commit("t", &batch(1, true)).unwrap();
    let r = reconciler(&b, 2, None);
    let report = r.pass(NOW + TIMEOUT - 1).await.unwrap();
    assert_eq!((report.waiting, report.timed_out), (1, 0));
    assert_eq!(r.stats.peer_errors.load(Ordering::Relaxed), 1);
    assert_eq!(b.holding(&agent(), 1).unwrap(), Holding::Limbo);
    let report = r.pass(NOW + TIMEOUT).await.unwrap();
    assert_eq!((report.waiting, report.timed_out), (0, 1));
    assert_eq!(b.holding(&agent(), 1).unwrap(), Holding::Held);
    assert_eq!(r.stats.timed_out.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn held_answers_provider_credentials_only() {
    use crate::auth::{digest, Auth};
    use flopwatch_config::{CollectorConfig, QueryToken, SpecTable, TenantConfig};
    let cfg = CollectorConfig {
        admin_tokens_sha256: vec![digest("provider")],
        tenants: vec![TenantConfig {
            name: "t".into(),
            query_tokens: vec![QueryToken {
                sha256: digest("tenant-reader"),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let s = store();
    s.commit("t", &batch(1, false)).unwrap();
    s.commit("t", &batch(2, true)).unwrap();
    let c = Collector::new(
        s,
        SpecTable::builtin(),
        Auth::from_config(&cfg),
        crate::Settings::from_config(&cfg, Vec::new()),
        Arc::new(flopwatch_proto::clock::ManualClock::new(NOW)),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ClusterService::new(c, 77).server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let peer = |token: Option<&str>| {
        GrpcPeer::all(
            &ClusterSettings {
                peers: vec![url.clone()],
                peer_token: token.map(String::from),
                ..Default::default()
            },
            &Default::default(),
        )
        .unwrap()
        .remove(0)
    };
    let refs: Vec<BatchRef> = (1..=3)
        .map(|seq| BatchRef {
            tenant: "t".into(),
            agent_id: "node-1".into(),
            boot_id: "boot".into(),
            seq,
        })
        .collect();
    let (id, h) = peer(Some("provider")).held(&refs).await.unwrap();
    assert_eq!(id, 77);
    assert_eq!(
        h,
        vec![
            Some(Holding::Held),
            Some(Holding::Limbo),
            Some(Holding::Absent)
        ]
    );
    let e = peer(None).held(&refs).await.unwrap_err();
    assert!(e.contains("Unauthenticated"), "{e}");
    let e = peer(Some("tenant-reader")).held(&refs).await.unwrap_err();
    assert!(e.contains("PermissionDenied"), "{e}");
}

#[test]
fn a_collector_is_not_its_own_peer() {
    let peers: Vec<String> = [
        "https://flopwatch-collector-0.flopwatch-collector-headless.flopwatch.svc:7070",
        "https://flopwatch-collector-1.flopwatch-collector-headless.flopwatch.svc:7070",
        "http://flopwatch-collector-10:7070",
        "http://10.0.0.5:7070",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let others = other_peers(&peers, "flopwatch-collector-1");
    assert_eq!(others.len(), 3);
    assert!(others.iter().all(|p| !p.contains("collector-1.")));
    assert_eq!(other_peers(&peers, "flopwatch-collector-10").len(), 3);
    assert_eq!(other_peers(&peers, "elsewhere"), peers);
}
