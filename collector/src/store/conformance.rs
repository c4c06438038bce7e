//! One conformance suite, run against every engine.

use super::memory::MemEngine;
use super::rocks::RocksEngine;
use super::*;
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

#[test]
fn engine_scan_is_ordered_bounded_and_stoppable() {
    for (name, e, _dir) in engines() {
        let puts = (0u8..10)
            .rev()
            .map(|i| (Cf::Raw, vec![b'k', i], vec![i]))
            .chain([(Cf::Ofu, vec![b'k', 3], vec![99])])
            .collect();
        e.write(puts, true).unwrap();
        let mut seen = Vec::new();
        e.scan(Cf::Raw, &[b'k', 2], &[b'k', 7], &mut |k, v| {
            assert_eq!(k[1], v[0]);
            seen.push(v[0]);
            true
        })
        .unwrap();
        assert_eq!(seen, vec![2, 3, 4, 5, 6], "{name}");
        let mut n = 0;
        e.scan(Cf::Raw, &[], &[0xff], &mut |_, _| {
            n += 1;
            n < 3
        })
        .unwrap();
        assert_eq!(n, 3, "{name}");
        assert_eq!(
            e.get(Cf::Ofu, &[b'k', 3]).unwrap(),
            Some(vec![99]),
            "{name}"
        );
        assert_eq!(e.get(Cf::Meta, &[b'k', 3]).unwrap(), None, "{name}");
        e.delete_range(Cf::Raw, &[b'k', 0], &[b'k', 5]).unwrap();
        let mut left = Vec::new();
        e.scan(Cf::Raw, &[], &[0xff], &mut |_, v| {
            left.push(v[0]);
            true
        })
        .unwrap();
        assert_eq!(left, vec![5, 6, 7, 8, 9], "{name}");
        e.flush().unwrap();
    }
}

fn series(gpu: &str, metric: &str, ts: &[i64]) -> SeriesBatch {
    SeriesBatch {
        gpu_uuid: gpu.into(),
        metric: metric.into(),
        points: ts
            .iter()
            .map(|&t| Point {
                ts_ms: t,
                value: t as f64 / 10.0,
                peak: None,
                window_ms: Some(100),
            })
            .collect(),
    }
}

#[test]
fn store_round_trips_and_isolates_tenants() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e, false);
        let agent = AgentKey {
            tenant: "t1".into(),
            agent_id: "node-a".into(),
            boot_id: "b1".into(),
        };
        assert_eq!(store.acked_seq(&agent).unwrap(), 0, "{name}");
        for seq in 1..=3u64 {
            let base = seq as i64 * 1000;
            let ts: Vec<i64> = (0..10).map(|i| base + i * 100).collect();
            let set = CommitSet {
                agent: Some(agent.clone()),
                seq,
                series: vec![
                    series("GPU-1", "tensor_active", &ts),
                    series("GPU-1", "power_w", &ts),
                ],
                ofu: vec![(
                    "GPU-1".into(),
                    Some(if seq < 3 { "job-a" } else { "job-b" }.into()),
                    ts.iter()
                        .map(|&t| OfuSample {
                            ts_ms: t,
                            ofu: 0.5,
                            tensor_active: 0.6,
                            sm_clock_mhz: 1525.0,
                            window_ms: 100,
                        })
                        .collect(),
                )],
                gpus: vec![GpuRecord {
                    uuid: "GPU-1".into(),
                    node_id: "node-a".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            store.commit("t1", &set).unwrap();
        }
        assert_eq!(store.acked_seq(&agent).unwrap(), 3, "{name}");
        // [1500, 3200): batch 1's second half, all of batch 2, batch 3's first two.
        let pts = store
            .series("t1", "GPU-1", "tensor_active", 1500, 3200, 1000)
            .unwrap();
        assert_eq!(pts.len(), 5 + 10 + 2, "{name}");
        assert!(pts.windows(2).all(|w| w[0].ts_ms < w[1].ts_ms), "{name}");
        assert_eq!(pts[0].value, 150.0, "{name}");
        assert_eq!(pts[0].window_ms, Some(100), "{name}");
        assert!(store
            .series("t2", "GPU-1", "tensor_active", 0, i64::MAX, 10)
            .unwrap()
            .is_empty());
        let mut a = 0;
        store
            .ofu("t1", "GPU-1", 0, i64::MAX, Some("job-a"), &mut |_| a += 1)
            .unwrap();
        assert_eq!(a, 20, "{name}");
        let mut all = 0;
        store
            .ofu("t1", "GPU-1", 0, i64::MAX, None, &mut |_| all += 1)
            .unwrap();
        assert_eq!(all, 30, "{name}");
        assert_eq!(store.gpus(Some("t1")).unwrap().len(), 1, "{name}");
        assert!(store.gpus(Some("t2")).unwrap().is_empty(), "{name}");
        assert!(
            store.gpus(Some("t")).unwrap().is_empty(),
            "prefix tenant, {name}"
        );
        assert_eq!(store.gpus(None).unwrap()[0].0, "t1", "{name}");
    }
}
