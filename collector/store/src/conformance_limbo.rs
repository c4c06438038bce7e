//! Limbo and held ranges, run against every engine.

use super::memory::MemEngine;
use super::rocks::RocksEngine;
use super::*;
use crate::EventRecord;
use flopwatch_proto::cluster::Holding;
use flopwatch_proto::model::{Point, SeriesBatch};
use std::sync::Arc;

fn engines() -> Vec<(&'static str, Arc<dyn Engine>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let rocks = RocksEngine::open(dir.path()).unwrap();
    vec![
        ("memory", Arc::new(MemEngine::new()), None),
        ("rocksdb", Arc::new(rocks), Some(dir)),
    ]
}

/// A second engine of the same kind.
fn twin(name: &str) -> (Arc<dyn Engine>, Option<tempfile::TempDir>) {
    if name == "memory" {
        return (Arc::new(MemEngine::new()), None);
    }
    let dir = tempfile::tempdir().unwrap();
    (Arc::new(RocksEngine::open(dir.path()).unwrap()), Some(dir))
}

const H: i64 = WINDOW_MS;
const T0: i64 = 1_700_000_000_000 / H * H;

fn agent() -> AgentKey {
    AgentKey {
        tenant: "t1".into(),
        agent_id: "node-a".into(),
        boot_id: "b1".into(),
    }
}

/// Batch `seq`: 10 samples at 100 ms from `from` of one raw series and its
/// OFU, one XID event.
fn batch(seq: u64, from: i64) -> CommitSet {
    let ts: Vec<i64> = (0..10).map(|i| from + i * 100).collect();
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
                    value: (t % 977) as f64,
                    peak: None,
                    window_ms: Some(100),
                })
                .collect(),
        }],
        ofu: vec![(
            "GPU-1".into(),
            Some("job-a".into()),
            ts.iter()
                .map(|&t| OfuSample {
                    ts_ms: t,
                    ofu: ((t / 100) % 7) as f64 / 10.0,
                    tensor_active: 0.6,
                    sm_clock_mhz: 1525.0,
                    window_ms: 100,
                })
                .collect(),
        )],
        events: vec![EventRecord {
            kind: "xid".into(),
            ts_ms: from,
            job_id: String::new(),
            gpu_uuid: "GPU-1".into(),
            node_id: "node-a".into(),
            value: seq as f64,
            baseline: 0.0,
            detail: String::new(),
        }],
        ..Default::default()
    }
}

fn limbo(mut set: CommitSet, since: i64) -> CommitSet {
    set.limbo = Some(since);
    set
}

fn raw_ts(s: &Store) -> Vec<i64> {
    s.series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
        .unwrap()
        .iter()
        .map(|p| p.ts_ms)
        .collect()
}

fn ofu_ts(s: &Store) -> Vec<i64> {
    let mut v = Vec::new();
    s.ofu("t1", "GPU-1", 0, i64::MAX, None, &mut |x| v.push(x.ts_ms))
        .unwrap();
    v.sort_unstable();
    v
}

/// Samples counted through the rollup path (hour buckets).
fn ofu_bucketed(s: &Store) -> u64 {
    let mut n = 0;
    s.ofu_pieces("t1", "GPU-1", T0, T0 + 3 * H, None, Some(H), &mut |p| {
        n += match p {
            OfuPiece::Sample(_) => 1,
            OfuPiece::Agg { agg, .. } => agg.count,
        }
    })
    .unwrap();
    n
}

fn events(s: &Store) -> Vec<i64> {
    s.events("t1", 0, i64::MAX, 100)
        .unwrap()
        .iter()
        .map(|e| e.ts_ms)
        .collect()
}

fn dump(e: &dyn Engine) -> Vec<(Cf, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for cf in Cf::ALL {
        e.scan(cf, &[], &[0xff; 8], &mut |k, v| {
            out.push((cf, k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
    }
    out
}

#[test]
fn limbo_batches_are_read_not_compacted_and_kept_exactly_as_a_normal_commit() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        store.commit("t1", &batch(1, T0 + 1000)).unwrap();
        store
            .commit("t1", &limbo(batch(2, T0 + 2000), T0 + 5000))
            .unwrap();
        store.commit("t1", &batch(3, T0 + 3000)).unwrap();
        // Acknowledged: the acked number covers it; readable everywhere.
        assert_eq!(store.acked_seq(&agent()).unwrap(), 3, "{name}");
        assert_eq!(raw_ts(&store).len(), 30, "{name}");
        assert_eq!(ofu_ts(&store).len(), 30, "{name}");
        assert_eq!(events(&store), vec![T0 + 1000, T0 + 2000, T0 + 3000]);
        assert_eq!(store.holding(&agent(), 1).unwrap(), Holding::Held);
        assert_eq!(store.holding(&agent(), 2).unwrap(), Holding::Limbo);
        assert_eq!(store.holding(&agent(), 4).unwrap(), Holding::Absent);
        let (listed, total) = store.limbo(10).unwrap();
        assert_eq!(total, 1, "{name}");
        assert_eq!(listed[0].seq, 2);
        assert_eq!(listed[0].since_ms, T0 + 5000);
        assert_eq!(listed[0].agent, agent());

        // The compactor seals the hour without touching limbo; reads, the
        // rollup path included, still count every sample once.
        let r = store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(r.samples, 40, "batches 1 and 3, raw and OFU, {name}");
        assert!(dump(&*e).iter().any(|(cf, _, _)| *cf == Cf::Limbo));
        assert_eq!(raw_ts(&store).len(), 30, "{name}");
        assert_eq!(ofu_ts(&store).len(), 30, "{name}");
        assert_eq!(ofu_bucketed(&store), 30, "{name}");

        // Kept: moved to head and meta in one write, held from now on.
        assert!(store.settle(&agent(), 2, Settle::Keep).unwrap());
        assert!(!store.settle(&agent(), 2, Settle::Keep).unwrap(), "once");
        assert_eq!(store.holding(&agent(), 2).unwrap(), Holding::Held);
        assert_eq!(store.limbo(10).unwrap().1, 0);
        assert_eq!(raw_ts(&store).len(), 30, "{name}");
        assert_eq!(ofu_bucketed(&store), 30, "{name}");
        assert_eq!(events(&store).len(), 3, "{name}");
        store.compact(T0 + 2 * H, 0).unwrap();

        // Byte for byte what a store that got all three normally holds.
        let (e2, _dir2) = twin(name);
        let plain = Store::new(e2.clone(), false);
        for seq in 1..=3 {
            plain
                .commit("t1", &batch(seq, T0 + seq as i64 * 1000))
                .unwrap();
        }
        plain.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(dump(&*e), dump(&*e2), "{name}");
    }
}

#[test]
fn dropped_limbo_batches_leave_nothing_behind() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        store.commit("t1", &batch(1, T0 + 1000)).unwrap();
        let before = dump(&*e);
        store
            .commit("t1", &limbo(batch(2, T0 + 2000), T0 + 5000))
            .unwrap();
        assert_eq!(raw_ts(&store).len(), 20, "{name}");
        assert!(store.settle(&agent(), 2, Settle::Drop).unwrap());
        assert_eq!(store.holding(&agent(), 2).unwrap(), Holding::Absent);
        assert_eq!(raw_ts(&store).len(), 10, "{name}");
        assert_eq!(ofu_ts(&store).len(), 10, "{name}");
        assert_eq!(events(&store), vec![T0 + 1000], "{name}");
        // Only the acked number moved: a replay is still a duplicate.
        assert_eq!(store.acked_seq(&agent()).unwrap(), 2, "{name}");
        let after: Vec<_> = dump(&*e)
            .into_iter()
            .filter(|(cf, k, _)| !(*cf == Cf::Meta && k[0] == b'a'))
            .collect();
        let before: Vec<_> = before
            .into_iter()
            .filter(|(cf, k, _)| !(*cf == Cf::Meta && k[0] == b'a'))
            .collect();
        assert_eq!(after, before, "{name}");
    }
}

#[test]
fn held_ranges_are_exact_after_a_failover_and_return() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e, false);
        // 1..3 here, 4..6 went to another collector, 7..8 here again.
        for seq in [1, 2, 3, 7, 8] {
            store
                .commit("t1", &batch(seq, T0 + seq as i64 * 1000))
                .unwrap();
        }
        // A refused batch consumes its number without being held.
        store
            .commit(
                "t1",
                &CommitSet {
                    agent: Some(agent()),
                    seq: 9,
                    no_data: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(store.acked_seq(&agent()).unwrap(), 9, "{name}");
        for (seq, want) in [
            (1, Holding::Held),
            (3, Holding::Held),
            (4, Holding::Absent),
            (6, Holding::Absent),
            (7, Holding::Held),
            (9, Holding::Absent),
        ] {
            assert_eq!(store.holding(&agent(), seq).unwrap(), want, "{seq} {name}");
        }
        let other = AgentKey {
            boot_id: "b2".into(),
            ..agent()
        };
        assert_eq!(store.holding(&other, 1).unwrap(), Holding::Absent);
        assert_eq!(store.held_ranges(&agent()).unwrap().len(), 2, "{name}");
    }
}

/// `set` as agent `node-b`'s, of its GPU `GPU-2`.
fn of_node_b(mut set: CommitSet) -> CommitSet {
    set.agent = Some(AgentKey {
        agent_id: "node-b".into(),
        ..agent()
    });
    set.series[0].gpu_uuid = "GPU-2".into();
    set.ofu[0].0 = "GPU-2".into();
    set.events[0].gpu_uuid = "GPU-2".into();
    set.events[0].node_id = "node-b".into();
    set
}

#[test]
fn a_group_write_stores_exactly_what_one_write_per_batch_stores() {
    for (name, e, _dir) in engines() {
        let (twin, _twin_dir) = twin(name);
        let sets = vec![
            batch(1, T0 + 1000),
            of_node_b(batch(1, T0 + 1500)),
            batch(2, T0 + 2000),
            of_node_b(limbo(batch(2, T0 + 2500), T0 + 3000)),
            CommitSet {
                agent: Some(agent()),
                seq: 3,
                no_data: true,
                ..Default::default()
            },
        ];
        let one_by_one = Store::new(e.clone(), false);
        for set in &sets {
            one_by_one.commit("t1", set).unwrap();
        }
        let tap = Arc::new(super::tap::Tap::new(twin.clone()));
        let grouped = Store::new(tap.clone(), false);
        grouped.commit_all("t1", &sets).unwrap();
        // node-a's batches each start a write after its first: 1 with
        // node-b's 1; 2 with node-b's 2; the refused 3 alone.
        assert_eq!(tap.writes.lock().unwrap().len(), 3, "{name}");
        assert_eq!(dump(&*twin), dump(&*e), "{name}");
        assert_eq!(grouped.acked_seq(&agent()).unwrap(), 3, "{name}");
        assert_eq!(grouped.held_ranges(&agent()).unwrap().len(), 1, "{name}");
        for (seq, want) in [(1, Holding::Held), (2, Holding::Held), (3, Holding::Absent)] {
            assert_eq!(
                grouped.holding(&agent(), seq).unwrap(),
                want,
                "{seq} {name}"
            );
        }
        assert_eq!(raw_ts(&grouped), raw_ts(&one_by_one), "{name}");
    }
}

#[test]
fn limbo_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::new(Arc::new(RocksEngine::open(dir.path()).unwrap()), false);
        store
            .commit("t1", &limbo(batch(1, T0 + 1000), T0 + 5000))
            .unwrap();
        assert_ne!(store.store_id().unwrap(), 0);
    }
    let store = Store::new(Arc::new(RocksEngine::open(dir.path()).unwrap()), false);
    let (listed, _) = store.limbo(10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(raw_ts(&store).len(), 10);
    let id = store.store_id().unwrap();
    assert_eq!(store.store_id().unwrap(), id, "kept");
    assert!(store.settle(&agent(), 1, Settle::Keep).unwrap());
    assert_eq!(store.holding(&agent(), 1).unwrap(), Holding::Held);
}

#[test]
fn a_format_2_or_3_store_has_its_head_and_limbo_rekeyed_when_opened_for_writing() {
    // Format 2 had neither the hour nor the seal phase in the head's keys
    // (`'g' · tenant · gpu · …`), format 3 the hour but not the phase.
    for (version, cut) in [(2u32, 1..keys::HEAD_GPU_AT), (3, 9..keys::HEAD_GPU_AT)] {
        for (name, e, _dir) in engines() {
            let name = format!("{name}, format {version}");
            let store = Store::new(e.clone(), false);
            let stamp = |v: u32| {
                e.write(
                    vec![(Cf::Meta, keys::FORMAT.to_vec(), v.to_be_bytes().to_vec())],
                    true,
                )
                .unwrap()
            };
            stamp(FORMAT);
            store.commit("t1", &batch(1, T0 + 1000)).unwrap();
            store
                .commit("t1", &limbo(batch(2, T0 + H + 2000), T0 + 5000))
                .unwrap();
            store.commit("t1", &batch(3, T0 + H + 3000)).unwrap();
            let want = dump(&*e);
            let reads = (raw_ts(&store), ofu_ts(&store));
            // The same store as that format wrote it, in the head's keys and
            // those limbo's records name.
            let old = |k: &[u8]| -> Option<Vec<u8>> {
                (k.first() == Some(&keys::KIND_GPU))
                    .then(|| [&k[..cut.start], &k[cut.end..]].concat())
            };
            for cf in [Cf::Head, Cf::Limbo] {
                let mut ops = Vec::new();
                e.scan(cf, &[keys::KIND_GPU], &[keys::KIND_GPU + 1], &mut |k, v| {
                    ops.push(Op::Delete(cf, k.to_vec()));
                    ops.push(Op::Put(cf, old(k).unwrap(), v.to_vec()));
                    true
                })
                .unwrap();
                assert!(!ops.is_empty(), "{name} {cf:?}");
                e.apply(ops, true).unwrap();
            }
            crate::limbo::rekey_records(&*e, &old, 1).unwrap();
            stamp(version);
            assert_ne!(dump(&*e), want, "{name}");

            // Read-only it is refused; opened for writing it is carried over,
            // byte for byte, and again (a carry-over cut short) changes nothing.
            let err = crate::format::settle(&*e, false).unwrap_err().to_string();
            assert!(
                err.contains(&format!("format {version}")) && err.contains("for writing"),
                "{err}"
            );
            crate::format::settle(&*e, true).unwrap();
            assert_eq!(dump(&*e), want, "{name}");
            stamp(version);
            crate::format::settle(&*e, true).unwrap();
            assert_eq!(dump(&*e), want, "{name}");
            assert_eq!((raw_ts(&store), ofu_ts(&store)), reads, "{name}");

            // The batch in limbo is found under its new key when kept.
            assert!(store.settle(&agent(), 2, Settle::Keep).unwrap(), "{name}");
            assert_eq!(raw_ts(&store).len(), 30, "{name}");
            let r = store.compact(T0 + 3 * H, 0).unwrap();
            assert_eq!(r.samples, 60, "three batches, raw and OFU, {name}");
        }
    }
}
