//! One conformance suite, run against every engine.

use super::memory::MemEngine;
use super::rocks::RocksEngine;
use super::*;
use flopwatch_codec::Block;
use flopwatch_proto::clock::Deadline;
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

#[test]
fn engine_walk_seeks_forward_and_never_back() {
    for (name, e, _dir) in engines() {
        let puts = (0u8..20)
            .map(|i| (Cf::Head, vec![b'k', i], vec![i]))
            .collect();
        e.write(puts, true).unwrap();
        let mut seen = Vec::new();
        e.walk(Cf::Head, &[b'k', 1], &[b'k', 18], &mut |k, v| {
            assert_eq!(k[1], v[0]);
            seen.push(k[1]);
            match k[1] {
                2 => Step::Seek(vec![b'k', 7]),
                // Back, or to itself: on to the next key.
                7 => Step::Seek(vec![b'k', 3]),
                8 => Step::Seek(vec![b'k', 8]),
                // Between keys: the next one after.
                9 => Step::Seek(vec![b'k', 11, 0]),
                // Past the bound: the end.
                13 => Step::Seek(vec![b'k', 40]),
                _ => Step::Next,
            }
        })
        .unwrap();
        assert_eq!(seen, vec![1, 2, 7, 8, 9, 12, 13], "{name}");
        let mut seen = Vec::new();
        e.walk(Cf::Head, &[], &[0xff], &mut |k, _| {
            seen.push(k[1]);
            if k[1] == 4 {
                Step::Stop
            } else {
                Step::Next
            }
        })
        .unwrap();
        assert_eq!(seen, vec![0, 1, 2, 3, 4], "{name}");
        let mut none = 0;
        e.walk(Cf::Head, &[b'k', 5], &[b'k', 5], &mut |_, _| {
            none += 1;
            Step::Next
        })
        .unwrap();
        assert_eq!(none, 0, "an empty range, {name}");
    }
}

#[test]
fn a_pass_walks_the_head_only_once_an_hour_it_holds_is_sealed() {
    for (name, e, _dir) in engines() {
        let walks = Arc::new(super::tap::Tap::new(e.clone()));
        let store = Store::new(walks.clone(), false);
        // 10 s of hour 2, 10 min into it (seal delay 5 min): not sealed.
        let now = T0 + 2 * H + 600_000;
        let seq = ingest(&store, "t1", T0 + 2 * H, 10, 0);
        // Opened on a head it knows nothing of: the first pass walks it.
        assert_eq!(store.compact(now, 300_000).unwrap().chunks, 0, "{name}");
        let first = walks.walks();
        assert!(first > 0, "{name}");
        // Nothing written since, or newer than the sealed hours: skipped.
        store.compact(now, 300_000).unwrap();
        let seq = ingest(&store, "t1", T0 + 2 * H + 10_000, 10, seq);
        store.compact(now + 60_000, 300_000).unwrap();
        assert_eq!(walks.walks(), first, "no walk while hour 2 is open, {name}");
        // Hour 2 sealed: the blocks the first pass passed over, and the
        // later ones, are compacted.
        let r = store.compact(T0 + 3 * H + 600_000, 300_000).unwrap();
        assert_eq!(r.samples, 2 * 200, "raw and OFU of 20 s, {name}");
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        let after = walks.walks();
        assert!(after > first, "{name}");
        store.compact(T0 + 3 * H + 660_000, 300_000).unwrap();
        assert_eq!(walks.walks(), after, "{name}");
        // Late data for a sealed hour makes the next pass walk.
        ingest(&store, "t1", T0 + 1000, 2, seq);
        let r = store.compact(T0 + 3 * H + 720_000, 300_000).unwrap();
        assert_eq!(r.samples, 2 * 20, "{name}");
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
    }
}

#[test]
fn a_pass_reads_nothing_of_the_open_hour_and_has_a_sealed_hours_files_compacted_once() {
    for (name, e, _dir) in engines() {
        let tap = Arc::new(super::tap::Tap::new(e.clone()));
        let store = Store::new(tap.clone(), false);
        // One GPU's second of hour 1; 100 GPUs' seconds of hour 2, open.
        let of = gpu_batch_of;
        store.commit("t1", &of("GPU-0", 1, T0 + H)).unwrap();
        for g in 0..100 {
            store
                .commit("t1", &of(&format!("GPU-{g}"), g + 2, T0 + 2 * H))
                .unwrap();
        }
        let r = store.compact(T0 + 2 * H + 600_000, 300_000).unwrap();
        assert_eq!(r.blocks, 1, "{name}");
        assert_eq!(count(&*e, Cf::Head), 100, "{name}");
        // The sealed bundle, and the open hour's first: one seek past it.
        assert!(tap.walked() <= 3, "{} entries walked, {name}", tap.walked());
        // Every hour before hour 2 is sealed: the head's files holding
        // them are compacted, once.
        let asked = tap.compactions.lock().unwrap().clone();
        assert_eq!(
            asked,
            vec![(Cf::Head, vec![keys::KIND_GPU], keys::head_hour(T0 + 2 * H))],
            "{name}"
        );
        ingest(&store, "t1", T0 + 2 * H + 1000, 1, 200);
        store.compact(T0 + 2 * H + 660_000, 300_000).unwrap();
        assert_eq!(tap.compactions.lock().unwrap().len(), 1, "{name}");
        // Hour 2 sealed: once more, up to hour 3.
        let r = store.compact(T0 + 3 * H + 600_000, 300_000).unwrap();
        assert_eq!(r.blocks, 101, "{name}");
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(
            tap.compactions.lock().unwrap().last().unwrap().2,
            keys::head_hour(T0 + 3 * H),
            "{name}"
        );
    }
}

#[test]
fn a_reader_of_one_gpu_steps_over_no_bundle_of_the_gpus_sealed_before_it() {
    // RocksDB keeps a deleted key as a tombstone until a compaction drops
    // it: a seek to an hour's first key would step over the deleted
    // bundles of every GPU sealed before the first one left.
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
    let dir = tempfile::tempdir().unwrap();
    let e: Arc<dyn Engine> = Arc::new(RocksEngine::open(dir.path()).unwrap());
    let store = Store::new(e.clone(), false);
    let hour = T0 + 2 * H;
    let mut seq = 0;
    for g in 0..200 {
        for b in 0..5 {
            seq += 1;
            let set = gpu_batch_of(&format!("GPU-{g:03}"), seq, hour + b * 1000);
            store.commit("t1", &set).unwrap();
        }
    }
    // The GPU whose bundles sort last in the hour (the last sealed).
    let last = (0..200)
        .map(|g| format!("GPU-{g:03}"))
        .max_by_key(|g| {
            let gpu = keys::ofu_prefix("t1", g);
            (keys::seal_phase(&gpu), gpu)
        })
        .unwrap();
    // A running collector knows the head's hours long before.
    let before = store.series("t1", &last, "power_w", hour, hour + H, usize::MAX);
    assert_eq!(before.unwrap().len(), 50);
    // What a seal of every GPU but the last leaves of the hour.
    let mut sealed = Vec::new();
    e.scan(Cf::Head, &[], &[0xff; 8], &mut |k, _| {
        sealed.push(Op::Delete(Cf::Head, k.to_vec()));
        true
    })
    .unwrap();
    sealed.truncate(sealed.len() - 5);
    assert_eq!(sealed.len(), 995);
    e.apply(sealed, false).unwrap();
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut perf = PerfContext::default();
    perf.reset();
    let points = store
        .series("t1", &last, "power_w", hour, hour + H, usize::MAX)
        .unwrap();
    let skipped = perf.metric(PerfMetric::InternalDeleteSkippedCount);
    let mut ofu = 0;
    store
        .ofu("t1", &last, hour, hour + H, None, &mut |_| ofu += 1)
        .unwrap();
    let skipped_ofu = perf.metric(PerfMetric::InternalDeleteSkippedCount) - skipped;
    set_perf_stats(PerfStatsLevel::Disable);
    assert_eq!((points.len(), ofu), (50, 50));
    assert!(skipped < 10, "{skipped} deleted entries stepped over");
    assert!(
        skipped_ofu < 10,
        "{skipped_ofu} deleted entries stepped over"
    );
}

#[test]
fn an_hours_sealed_gpus_give_their_head_space_back_while_the_seal_goes_on() {
    // Within an hour the GPUs sort in the order they are sealed: those
    // sealed so far are one range of keys, compacted as the seal goes on
    // rather than once the hour's last GPU is sealed.
    let dir = tempfile::tempdir().unwrap();
    let e: Arc<dyn Engine> = Arc::new(RocksEngine::open(dir.path()).unwrap());
    let store = Store::new(e.clone(), false).with_spread(
        std::time::Duration::from_secs(1200),
        std::time::Duration::ZERO,
    );
    let hour = T0 + 2 * H;
    let gpus: Vec<String> = (0..300).map(|g| format!("GPU-{g:03}")).collect();
    let mut seq = 0;
    for g in &gpus {
        for b in 0..5 {
            seq += 1;
            store
                .commit("t1", &gpu_batch_of(g, seq, hour + b * 1000))
                .unwrap();
        }
    }
    e.flush().unwrap();
    let full = e.family_bytes(Cf::Head);
    let read = |s: &Store| -> Vec<usize> {
        gpus.iter()
            .map(|g| {
                s.series("t1", g, "power_w", hour, hour + H, usize::MAX)
                    .unwrap()
                    .len()
            })
            .collect()
    };
    let before = read(&store);
    assert!(before.iter().all(|n| *n == 50));
    // Halfway through the seal's spread about half the GPUs are sealed,
    // and about half the head's bytes are left.
    let r = store.compact(hour + H + 600_000, 0).unwrap();
    let sealed = r.blocks / 5;
    assert!((100..=200).contains(&sealed), "{sealed} of 300 GPUs sealed");
    let left = e.family_bytes(Cf::Head);
    assert!(
        left * 10 < full * 7,
        "{left} of {full} head bytes left with {sealed} of 300 GPUs sealed"
    );
    assert_eq!(read(&store), before, "every sample once");
    // A late batch of a GPU sealed already lands in the range compacted:
    // kept, and sealed by the next pass.
    let first = gpus
        .iter()
        .min_by_key(|g| keys::seal_phase(&keys::ofu_prefix("t1", g)))
        .unwrap();
    seq += 1;
    store
        .commit("t1", &gpu_batch_of(first, seq, hour + 10_000))
        .unwrap();
    store.compact(hour + H + 900_000, 0).unwrap();
    let points = |g: &str| {
        store
            .series("t1", g, "power_w", hour, hour + H, usize::MAX)
            .unwrap()
            .len()
    };
    assert_eq!(points(first), 60);
    // The spread's end: every GPU sealed, nothing left in the head.
    store.compact(hour + H + 1_200_000, 0).unwrap();
    let mut head = 0;
    e.scan(Cf::Head, &[], &[0xff; 8], &mut |_, _| {
        head += 1;
        true
    })
    .unwrap();
    assert_eq!(head, 0);
    assert_eq!(points(first), 60);
    assert_eq!(read(&store).iter().sum::<usize>(), 300 * 50 + 10);
}

#[test]
fn readers_look_in_the_hours_the_head_holds_through_writes_seals_and_late_batches() {
    use super::gpu_block::BundleHours;
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let points = |s: &Store| {
            s.series("t1", "GPU-1", "power_w", T0, T0 + 4 * H, usize::MAX)
                .unwrap()
                .len()
        };
        let seq = ingest(&store, "t1", T0 + H, 2, 0);
        assert_eq!(points(&store), 20, "{name}");
        // Known from the first read on; a write adds its hour.
        let seq = ingest(&store, "t1", T0 + 2 * H, 1, seq);
        assert_eq!(
            store.bundle_hours(Cf::Head),
            BundleHours::Held(vec![T0 + H, T0 + 2 * H]),
            "{name}"
        );
        assert_eq!(points(&store), 30, "{name}");
        // Both hours sealed and their files compacted: forgotten.
        store.compact(T0 + 3 * H + 600_000, 300_000).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(store.bundle_hours(Cf::Head), BundleHours::Held(vec![]));
        assert_eq!(points(&store), 30, "{name}");
        // A late batch of a forgotten hour is read at once.
        ingest(&store, "t1", T0 + H + 5000, 1, seq);
        assert_eq!(
            store.bundle_hours(Cf::Head),
            BundleHours::Held(vec![T0 + H])
        );
        assert_eq!(points(&store), 40, "{name}");
        // A store opened on a head finds its hours.
        let reopened = Store::new(e.clone(), false);
        assert_eq!(points(&reopened), 40, "{name}");
        assert_eq!(
            reopened.bundle_hours(Cf::Head),
            BundleHours::Held(vec![T0 + H]),
            "{name}"
        );
    }
}

/// [`gpu_batch`] of the GPU `gpu`.
pub(super) fn gpu_batch_of(gpu: &str, seq: u64, from: i64) -> CommitSet {
    let mut set = gpu_batch(seq, from);
    for s in &mut set.series {
        s.gpu_uuid = gpu.into();
    }
    for o in &mut set.ofu {
        o.0 = gpu.into();
    }
    set
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

const H: i64 = WINDOW_MS;
const T0: i64 = 1_700_000_000_000 / H * H;

fn ofu_at(ts: &[i64], job: &str, gpu: &str) -> (String, Option<String>, Vec<OfuSample>) {
    (
        gpu.into(),
        Some(job.into()),
        ts.iter()
            .map(|&t| OfuSample {
                ts_ms: t,
                ofu: ((t / 100) % 7) as f64 / 10.0,
                tensor_active: 0.6,
                sm_clock_mhz: 1525.0,
                window_ms: 100,
            })
            .collect(),
    )
}

/// Batches of 1 s at 100 ms from `from` for `secs` seconds, one raw series
/// and OFU per batch, sequence numbers from `seq`.
fn ingest(store: &Store, tenant: &str, from: i64, secs: i64, seq: u64) -> u64 {
    let mut seq = seq;
    for s in 0..secs {
        let ts: Vec<i64> = (0..10).map(|i| from + s * 1000 + i * 100).collect();
        seq += 1;
        let set = CommitSet {
            seq,
            series: vec![series("GPU-1", "power_w", &ts)],
            ofu: vec![ofu_at(
                &ts,
                if s % 2 == 0 { "job-a" } else { "job-b" },
                "GPU-1",
            )],
            ..Default::default()
        };
        store.commit(tenant, &set).unwrap();
    }
    seq
}

fn count(e: &dyn Engine, cf: Cf) -> usize {
    let mut n = 0;
    e.scan(cf, &[], &[0xff; 8], &mut |_, _| {
        n += 1;
        true
    })
    .unwrap();
    n
}

fn ofu_all(store: &Store, tenant: &str, job: Option<&str>) -> Vec<(i64, u64)> {
    let mut v = Vec::new();
    store
        .ofu(tenant, "GPU-1", 0, i64::MAX, job, &mut |s| {
            v.push((s.ts_ms, s.ofu.to_bits()))
        })
        .unwrap();
    v.sort();
    v
}

#[test]
fn compaction_turns_sealed_hours_into_one_chunk_per_series() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        // The last 30 s of hour 0, the first 30 s of hour 1 (the batch
        // crossing the hour is split), then 10 s of hour 2.
        let seq = ingest(&store, "t1", T0 + H - 30_000 - 50, 60, 0);
        ingest(&store, "t1", T0 + 2 * H, 10, seq);
        let raw_before = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap();
        let ofu_before = ofu_all(&store, "t1", None);
        let job_a = ofu_all(&store, "t1", Some("job-a"));
        assert_eq!(raw_before.len(), 700, "{name}");
        assert_eq!(ofu_before.len(), 700, "{name}");

        // Now: 10 min into hour 2 with a 5 min seal delay: hours 0 and 1
        // are sealed, hour 2 is not.
        let r = store.compact(T0 + 2 * H + 600_000, 300_000).unwrap();
        assert_eq!(r.chunks, 4, "raw and OFU of hours 0 and 1, {name}");
        assert_eq!(r.samples, 1200, "{name}");
        // Hour 0 and 1: one raw chunk each; OFU: one chunk per job.
        assert_eq!(count(&*e, Cf::Raw), 2, "{name}");
        assert_eq!(count(&*e, Cf::Ofu), 4, "{name}");
        // A rollup per series-hour, and minute lasts and job figures per
        // OFU hour.
        assert_eq!(count(&*e, Cf::Rollup), 8, "{name}");
        assert_eq!(
            count(&*e, Cf::Head),
            10,
            "hour 2 stays in the head, a bundle per batch, {name}"
        );
        assert_eq!(
            store
                .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
                .unwrap(),
            raw_before,
            "{name}"
        );
        assert_eq!(ofu_all(&store, "t1", None), ofu_before, "{name}");
        assert_eq!(ofu_all(&store, "t1", Some("job-a")), job_a, "{name}");
        // A range inside one chunk.
        let mid = store
            .series("t1", "GPU-1", "power_w", T0 + H - 1000, T0 + H + 1000, 100)
            .unwrap();
        assert_eq!(mid.len(), 20, "{name}");

        // Nothing new: a second pass does nothing.
        assert_eq!(
            store.compact(T0 + 2 * H + 600_000, 300_000).unwrap().chunks,
            0
        );

        // Late data for sealed hour 0 lands in the head and is merged into
        // the hour's chunk by the next pass.
        ingest(&store, "t1", T0 + 1000, 2, 1000);
        let with_late = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap();
        assert_eq!(with_late.len(), 720, "{name}");
        let r = store.compact(T0 + 2 * H + 600_000, 300_000).unwrap();
        assert_eq!(r.chunks, 2, "{name}");
        assert_eq!(count(&*e, Cf::Raw), 2, "{name}");
        assert_eq!(
            store
                .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
                .unwrap(),
            with_late,
            "{name}"
        );
        // Limits keep the earliest samples.
        let first = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 5)
            .unwrap();
        assert_eq!(first.len(), 5);
        assert_eq!(first[0].ts_ms, T0 + 1000, "{name}");
    }
}

/// Batch `seq` (from 1) of one GPU: 10 points at 100 ms of tensor
/// activity, the averaged SM clock and power, and the OFU they give.
/// OFU derived as ingest derives it: f_max 1830 MHz, the averaged clock.
fn derived(gpu: &str) -> std::collections::HashMap<String, super::Derivation> {
    let d = super::Derivation::new(1830.0, "sm_clock_avg_mhz").unwrap();
    [(gpu.to_string(), d)].into_iter().collect()
}

pub(super) fn gpu_batch(seq: u64, from: i64) -> CommitSet {
    let ts: Vec<i64> = (0..10).map(|i| from + i * 100).collect();
    let value = |t: i64, k: i64| ((t / 100 + k) % 13) as f64;
    let series = |metric: &str, f: &dyn Fn(i64) -> f64| SeriesBatch {
        gpu_uuid: "GPU-1".into(),
        metric: metric.into(),
        points: ts
            .iter()
            .map(|&t| Point {
                ts_ms: t,
                value: f(t),
                peak: None,
                window_ms: Some(100),
            })
            .collect(),
    };
    let tpa = |t: i64| value(t, 0) / 13.0;
    let clk = |t: i64| 1300.0 + value(t, 5);
    CommitSet {
        seq,
        series: vec![
            series("tensor_active", &tpa),
            series("sm_clock_avg_mhz", &clk),
            series("power_w", &|t| 300.0 + value(t, 3)),
        ],
        ofu: vec![(
            "GPU-1".into(),
            Some("job-a".into()),
            ts.iter()
                .map(|&t| OfuSample {
                    ts_ms: t,
                    ofu: flopwatch_proto::ofu::ofu(tpa(t), clk(t), 1830.0),
                    tensor_active: tpa(t),
                    sm_clock_mhz: clk(t),
                    window_ms: 100,
                })
                .collect(),
        )],
        derivations: derived("GPU-1"),
        ..Default::default()
    }
}

#[test]
fn readers_see_every_sample_once_while_compacting() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e, false);
        ingest(&store, "t1", T0, 300, 0);
        ingest(&store, "t1", T0 + H, 300, 1000);
        let expect = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 3 {
                    let got = store
                        .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
                        .unwrap();
                    let mut n = 0;
                    store
                        .ofu("t1", "GPU-1", 0, i64::MAX, None, &mut |_| n += 1)
                        .unwrap();
                    assert_eq!(got.len(), 6000);
                    assert_eq!(n, 6000);
                    reads += 1;
                }
                reads
            })
        };
        store.compact(T0 + 3 * H, 0).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() >= 3, "{name}");
        assert_eq!(
            store
                .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
                .unwrap(),
            expect,
            "{name}"
        );
    }
}

#[test]
fn retention_hides_then_deletes_expired_hours_per_tenant() {
    use flopwatch_proto::clock::{Clock, ManualClock};
    for (name, e, _dir) in engines() {
        let clock = Arc::new(ManualClock::new(T0));
        let retention = Retention {
            default_ms: 3 * H,
            tenants: [("short".to_string(), H)].into_iter().collect(),
            clock: clock.clone(),
        };
        let store = Store::new(e.clone(), false).with_retention(retention);
        for t in ["long", "short"] {
            let mut seq = 0;
            for h in 0..4 {
                seq = ingest(&store, t, T0 + h * H, 5, seq);
            }
            store
                .commit(
                    t,
                    &CommitSet {
                        events: vec![serde_json::from_str(&format!(
                            r#"{{"kind": "xid", "ts_ms": {}}}"#,
                            T0 + 10
                        ))
                        .unwrap()],
                        ..Default::default()
                    },
                )
                .unwrap();
        }
        clock.set(T0 + 4 * H + 30 * 60_000);
        store.compact(clock.now_ms(), 0).unwrap();
        // Cutoffs: long at T0 + 1.5 h, short at T0 + 3.5 h.
        let long = store
            .series("long", "GPU-1", "power_w", 0, i64::MAX, 1000)
            .unwrap();
        let short = store
            .series("short", "GPU-1", "power_w", 0, i64::MAX, 1000)
            .unwrap();
        assert!(long.iter().all(|p| p.ts_ms >= T0 + H + H / 2), "{name}");
        assert_eq!(long.len(), 100, "hours 2 and 3, {name}");
        assert!(short.is_empty(), "hour 3 began before the cutoff, {name}");
        let mut n = 0;
        store
            .ofu("short", "GPU-1", 0, i64::MAX, None, &mut |_| n += 1)
            .unwrap();
        assert_eq!(n, 0, "{name}");
        let raw_keys = count(&*e, Cf::Raw);
        let r = store.expire().unwrap();
        // RocksDB drops the expired keys as it rewrites their files (its
        // compaction filter); the memory engine has them deleted.
        assert_eq!(store.expired_in_engine, name == "rocksdb");
        assert_eq!(r.expired_ranges > 0, !store.expired_in_engine, "{name}");
        for cf in [Cf::Raw, Cf::Ofu, Cf::Head, Cf::Rollup] {
            e.compact_range(cf, &[], &[0xff; 8]).unwrap();
        }
        // long keeps hours 1..=3 (hour 1 is only partly expired), short
        // keeps hour 3: 4 of the 8 raw chunks remain.
        assert_eq!(raw_keys, 8, "{name}");
        assert_eq!(count(&*e, Cf::Raw), 4, "{name}");
        assert_eq!(count(&*e, Cf::Rollup), 16, "{name}");
        assert!(
            store.events("long", 0, i64::MAX, 10).unwrap().is_empty(),
            "{name}"
        );
        assert_eq!(
            store
                .series("long", "GPU-1", "power_w", 0, i64::MAX, 1000)
                .unwrap(),
            long,
            "{name}"
        );
    }
}

/// A store of tenant `t1` with 90 s of GPU-1 in each of five hours from
/// `T0` (7 s to 97 s into the hour), hours 0..=3 sealed, 4 in the head.
fn five_hours_four_sealed(e: Arc<dyn Engine>) -> Store {
    let store = Store::new(e, false);
    let mut seq = 0;
    for h in 0..5 {
        seq = ingest(&store, "t1", T0 + h * H + 7_000, 90, seq);
    }
    store.compact(T0 + 4 * H, 0).unwrap();
    store
}

#[test]
fn rollups_answer_coarse_queries_with_the_same_totals() {
    for (name, e, _dir) in engines() {
        let store = five_hours_four_sealed(e);
        let of_job = |job: Option<&str>, start: i64, end: i64, step: Option<i64>| {
            let (mut total, mut aggs) = (flopwatch_proto::ofu::Mean::default(), 0);
            store
                .ofu_pieces("t1", "GPU-1", start, end, job, step, &mut |p| match p {
                    OfuPiece::Sample(x) => {
                        total.add(x.ofu, x.tensor_active, x.sm_clock_mhz, x.window_ms);
                    }
                    OfuPiece::Agg {
                        agg, ts_ms, len_ms, ..
                    } => {
                        assert!(ts_ms >= start && ts_ms + len_ms <= end);
                        if let Some(st) = step.filter(|&st| st > 0 && st < H) {
                            assert_eq!((ts_ms - start) / st, (ts_ms + len_ms - 1 - start) / st);
                        }
                        aggs += 1;
                        total.merge(&agg);
                    }
                })
                .unwrap();
            (total.count, aggs, total.mean().unwrap_or(f64::NAN))
        };
        let sum = |start: i64, end: i64, step: Option<i64>| of_job(None, start, end, step);
        let (n_raw, a_raw, m_raw) = sum(T0, T0 + 5 * H, None);
        assert_eq!((n_raw, a_raw), (4500, 0), "{name}");
        // Aligned hourly steps: four hour rollups, hour 4 from the head.
        let (n, aggs, m) = sum(T0, T0 + 5 * H, Some(H));
        assert_eq!((n, aggs), (4500, 4), "{name}");
        assert!((m - m_raw).abs() < 1e-12, "{name}");
        // Unaligned start: edge hours fall back to minutes and samples.
        let start = T0 + 30_500;
        let (n2, aggs2, _) = sum(start, T0 + 5 * H, Some(H));
        let (n2_raw, _, _) = sum(start, T0 + 5 * H, None);
        assert_eq!(n2, n2_raw, "{name}");
        // Samples lie in minutes 0 and 1 of each hour: at a 1 h step both
        // come from the minute rollups (hour 0's minute 0 starts before
        // `start` and is read sample by sample).
        assert_eq!(aggs2, 7, "minute buckets used, {name}");
        // Below an hour, a minute holding a step edge is read as samples.
        let (n3, aggs3, _) = sum(start, T0 + 5 * H, Some(20 * 60_000));
        assert_eq!(n3, n2_raw, "{name}");
        assert_eq!(aggs3, 4, "{name}");
        // A job's query answers from its own entries of the rollups, with
        // the totals of its samples; a job that never ran has none.
        let (nj, aj, mj) = of_job(Some("job-a"), T0, T0 + 5 * H, None);
        assert_eq!((nj, aj), (2250, 0), "{name}");
        let (nj2, aj2, mj2) = of_job(Some("job-a"), T0, T0 + 5 * H, Some(H));
        assert_eq!(nj2, 2250, "{name}");
        assert_eq!(aj2, 4, "one hour bucket per sealed hour, {name}");
        assert!((mj2 - mj).abs() < 1e-12, "{name}");
        let (nj3, _, _) = of_job(Some("job-a"), start, T0 + 5 * H, Some(H));
        assert_eq!(
            nj3,
            of_job(Some("job-a"), start, T0 + 5 * H, None).0,
            "{name}"
        );
        assert_eq!(
            of_job(Some("job-z"), T0, T0 + 5 * H, Some(H)).0,
            0,
            "{name}"
        );
    }
}

/// The hour rollups of every series in the store.
fn hour_rollups(e: &dyn Engine) -> Vec<flopwatch_proto::ofu::Mean> {
    let mut out = Vec::new();
    e.scan(Cf::Rollup, &[], &[0xff; 8], &mut |_, v| {
        out.push(super::rollup::Rollup::decode(v).unwrap().gpu().hour.mean);
        true
    })
    .unwrap();
    out
}

#[test]
fn raw_rollups_weigh_each_sample_by_its_window() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        // Adaptive sampling: a 100 ms burst at 400 W, then 900 ms of quiet
        // sent as one backed-off sample at 100 W.
        let points = [(T0 + 100, 400.0, 100), (T0 + 1000, 100.0, 900)]
            .map(|(ts_ms, value, w)| Point {
                ts_ms,
                value,
                peak: None,
                window_ms: Some(w),
            })
            .to_vec();
        let set = CommitSet {
            seq: 1,
            series: vec![SeriesBatch {
                gpu_uuid: "GPU-1".into(),
                metric: "power_w".into(),
                points,
            }],
            ..Default::default()
        };
        store.commit("t1", &set).unwrap();
        store.compact(T0 + 2 * H, 0).unwrap();
        let rollups = hour_rollups(&*e);
        assert_eq!(rollups.len(), 1, "{name}");
        let hour = rollups[0];
        assert_eq!(hour.count, 2, "{name}");
        // (400 · 100 + 100 · 900) / 1000, not the plain mean 250.
        assert_eq!(hour.mean(), Some(130.0), "{name}");
        assert_eq!((hour.min(), hour.max()), (100.0, 400.0), "{name}");
    }
}

#[test]
fn compacted_chunks_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let before;
    {
        let store = Store::new(Arc::new(RocksEngine::open(dir.path()).unwrap()), false);
        ingest(&store, "t1", T0, 100, 0);
        ingest(&store, "t1", T0 + H, 100, 500);
        store.compact(T0 + H + 1, 0).unwrap();
        before = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap();
        assert_eq!(before.len(), 2000);
    }
    let e = Arc::new(RocksEngine::open(dir.path()).unwrap());
    let store = Store::new(e.clone(), false);
    assert_eq!(
        store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap(),
        before
    );
    assert_eq!(count(&*e, Cf::Raw), 1);
    assert_eq!(count(&*e, Cf::Head), 100, "the bundles of hour 1");
}

#[test]
fn derived_ofu_is_dropped_from_chunks_and_recomputed_exactly() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let samples: Vec<OfuSample> = (0..3600)
            .map(|i| {
                let tpa = (60_000 + (i * 7919) % 2000) as f64 / 1e5;
                let clk = if i % 10 == 0 {
                    1980.0
                } else {
                    1352.0 + (i % 64) as f64
                };
                OfuSample {
                    ts_ms: T0 + i * 1000,
                    ofu: flopwatch_proto::ofu::ofu(tpa, clk, 1830.0),
                    tensor_active: tpa,
                    sm_clock_mhz: clk,
                    window_ms: 1000,
                }
            })
            .collect();
        let set = CommitSet {
            seq: 1,
            ofu: vec![("GPU-1".into(), None, samples.clone())],
            derivations: derived("GPU-1"),
            ..Default::default()
        };
        store.commit("t1", &set).unwrap();
        let head = ofu_all(&store, "t1", None);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(ofu_all(&store, "t1", None), head, "{name}");
        let mut got = Vec::new();
        store
            .ofu("t1", "GPU-1", 0, i64::MAX, None, &mut |s| got.push(s))
            .unwrap();
        assert_eq!(got, samples, "{name}");
        let mut bytes = 0;
        e.scan(Cf::Ofu, &[], &[0xff; 8], &mut |_, v| {
            bytes += v.len();
            true
        })
        .unwrap();
        // TPA (≈12 bits), clock (≈7 bits), 1 bit of timestamp; no OFU column.
        assert!(bytes < 3600 * 4, "{bytes} bytes, {name}");
    }
}

/// Compaction uses the derivation recorded at ingest, checked, and never
/// looks for one: OFU without a derivation, or with one that does not
/// hold, keeps its OFU column and reads back exactly.
#[test]
fn ofu_is_derived_only_as_recorded() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let samples: Vec<OfuSample> = (0..3600)
            .map(|i| {
                let tpa = (60_000 + (i * 7919) % 2000) as f64 / 1e5;
                let clk = 1352.0 + (i % 64) as f64;
                OfuSample {
                    ts_ms: T0 + i * 1000,
                    ofu: flopwatch_proto::ofu::ofu(tpa, clk, 1830.0),
                    tensor_active: tpa,
                    sm_clock_mhz: clk,
                    window_ms: 1000,
                }
            })
            .collect();
        let wrong = super::Derivation::new(1755.0, "sm_clock_avg_mhz").unwrap();
        let set = CommitSet {
            seq: 1,
            ofu: ["GPU-1", "GPU-2", "GPU-3"]
                .iter()
                .map(|g| (g.to_string(), None, samples.clone()))
                .collect(),
            derivations: derived("GPU-1")
                .into_iter()
                .chain([("GPU-3".to_string(), wrong)])
                .collect(),
            ..Default::default()
        };
        store.commit("t1", &set).unwrap();
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        let mut bytes = Vec::new();
        for gpu in ["GPU-1", "GPU-2", "GPU-3"] {
            let mut got = Vec::new();
            store
                .ofu("t1", gpu, 0, i64::MAX, None, &mut |s| got.push(s))
                .unwrap();
            assert_eq!(got, samples, "{gpu}, {name}");
            let prefix = keys::ofu_prefix("t1", gpu);
            let mut to = prefix.clone();
            to.extend_from_slice(&[0xff; 16]);
            let mut n = 0;
            e.scan(Cf::Ofu, &prefix, &to, &mut |_, v| {
                n += v.len();
                true
            })
            .unwrap();
            bytes.push(n);
        }
        // The OFU column (≈ 6 bytes a sample) is gone only where recorded.
        assert!(bytes[0] + 3600 * 4 < bytes[1], "{bytes:?}, {name}");
        assert!(bytes[0] + 3600 * 4 < bytes[2], "{bytes:?}, {name}");
    }
}

#[test]
fn ofu_chunks_refer_to_the_raw_series_they_came_from() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let mut expect = Vec::new();
        for b in 0..120i64 {
            let ts: Vec<i64> = (0..10).map(|i| T0 + b * 1000 + i * 100).collect();
            let tpa: Vec<f64> = ts
                .iter()
                .map(|t| (60_000 + (t * 7919) % 2000) as f64 / 1e5)
                .collect();
            let clk: Vec<f64> = ts
                .iter()
                .map(|t| 1352.0 + ((t / 100) % 64) as f64)
                .collect();
            let point = |m: &str, v: &[f64]| SeriesBatch {
                gpu_uuid: "GPU-1".into(),
                metric: m.into(),
                points: ts
                    .iter()
                    .zip(v)
                    .map(|(&t, &v)| Point {
                        ts_ms: t,
                        value: v,
                        peak: None,
                        window_ms: Some(100),
                    })
                    .collect(),
            };
            let ofu: Vec<OfuSample> = (0..10)
                .map(|i| OfuSample {
                    ts_ms: ts[i],
                    ofu: flopwatch_proto::ofu::ofu(tpa[i], clk[i], 1830.0),
                    tensor_active: tpa[i],
                    sm_clock_mhz: clk[i],
                    window_ms: 100,
                })
                .collect();
            expect.extend(ofu.iter().copied());
            let set = CommitSet {
                seq: b as u64 + 1,
                series: vec![
                    point("tensor_active", &tpa),
                    point("sm_clock_avg_mhz", &clk),
                    point("power_w", &clk),
                ],
                ofu: vec![("GPU-1".into(), Some("job".into()), ofu)],
                derivations: derived("GPU-1"),
                ..Default::default()
            };
            store.commit("t1", &set).unwrap();
        }
        let read = |store: &Store| {
            let mut got = Vec::new();
            store
                .ofu("t1", "GPU-1", 0, i64::MAX, Some("job"), &mut |s| {
                    got.push(s)
                })
                .unwrap();
            got.sort_by_key(|s| s.ts_ms);
            got
        };
        assert_eq!(read(&store), expect, "{name}");
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(read(&store), expect, "{name}");
        let mut bytes = 0;
        e.scan(Cf::Ofu, &[], &[0xff; 8], &mut |_, v| {
            bytes += v.len();
            true
        })
        .unwrap();
        // Timestamps and windows only: well under a byte per sample.
        assert!(bytes < 1200 / 2, "{bytes} bytes, {name}");
        // Rollups from the referenced values are the samples' aggregate.
        let mut aggs = 0;
        store
            .ofu_pieces("t1", "GPU-1", T0, T0 + H, None, Some(H), &mut |p| {
                if let OfuPiece::Agg { agg, .. } = p {
                    aggs += agg.count;
                }
            })
            .unwrap();
        assert_eq!(aggs, 1200, "{name}");
    }
}

#[test]
fn precision_rounds_at_compaction_and_ofu_follows() {
    for (name, e, _dir) in engines() {
        let precision =
            Precision::new([("tensor_active".to_string(), 3), ("power_w".to_string(), 0)].into());
        let store = Store::new(e.clone(), false).with_precision(precision);
        let ts: Vec<i64> = (0..600).map(|i| T0 + i * 100).collect();
        let tpa: Vec<f64> = ts
            .iter()
            .map(|t| (60_000 + (t / 100 * 7919) % 2000) as f64 / 1e5)
            .collect();
        let clk: Vec<f64> = ts
            .iter()
            .map(|t| 1352.0 + ((t / 100) % 64) as f64)
            .collect();
        let power: Vec<f64> = ts.iter().map(|t| 585.0 + (t % 997) as f64 / 1e3).collect();
        let batch = |m: &str, v: &[f64]| SeriesBatch {
            gpu_uuid: "GPU-1".into(),
            metric: m.into(),
            points: ts
                .iter()
                .zip(v)
                .map(|(&t, &v)| Point {
                    ts_ms: t,
                    value: v,
                    peak: None,
                    window_ms: Some(100),
                })
                .collect(),
        };
        let ofu: Vec<OfuSample> = (0..ts.len())
            .map(|i| OfuSample {
                ts_ms: ts[i],
                ofu: flopwatch_proto::ofu::ofu(tpa[i], clk[i], 1830.0),
                tensor_active: tpa[i],
                sm_clock_mhz: clk[i],
                window_ms: 100,
            })
            .collect();
        let set = CommitSet {
            seq: 1,
            series: vec![
                batch("tensor_active", &tpa),
                batch("sm_clock_avg_mhz", &clk),
                batch("power_w", &power),
            ],
            ofu: vec![("GPU-1".into(), Some("job".into()), ofu)],
            derivations: derived("GPU-1"),
            ..Default::default()
        };
        store.commit("t1", &set).unwrap();
        // The head keeps what was received.
        let got = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, usize::MAX)
            .unwrap();
        assert_eq!(got[1].value, power[1], "{name}");
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        let values = |m: &str| -> Vec<f64> {
            store
                .series("t1", "GPU-1", m, 0, i64::MAX, usize::MAX)
                .unwrap()
                .iter()
                .map(|p| p.value)
                .collect()
        };
        let tpa3: Vec<f64> = tpa.iter().map(|v| (v * 1e3).round() / 1e3).collect();
        assert_eq!(values("tensor_active"), tpa3, "{name}");
        assert_ne!(tpa3, tpa, "{name}: the test data needs rounding");
        let p0: Vec<f64> = power.iter().map(|v| v.round()).collect();
        assert_eq!(values("power_w"), p0, "{name}");
        assert_eq!(values("sm_clock_avg_mhz"), clk, "{name}");
        // OFU: from the rounded tensor activity, still referring to the raw
        // series (timestamps and windows only in the OFU chunk).
        let mut got = Vec::new();
        store
            .ofu("t1", "GPU-1", 0, i64::MAX, Some("job"), &mut |s| {
                got.push(s)
            })
            .unwrap();
        got.sort_by_key(|s| s.ts_ms);
        assert_eq!(got.len(), ts.len(), "{name}");
        for (i, s) in got.iter().enumerate() {
            assert_eq!(s.tensor_active, tpa3[i], "{name}");
            assert_eq!(
                s.ofu,
                flopwatch_proto::ofu::ofu(tpa3[i], clk[i], 1830.0),
                "{name}"
            );
        }
        let mut bytes = 0;
        e.scan(Cf::Ofu, &[], &[0xff; 8], &mut |_, v| {
            bytes += v.len();
            true
        })
        .unwrap();
        assert!(bytes < 100, "{bytes} bytes, {name}");
    }
}

/// The raw chunk of `metric` on GPU-1 in hour `w`, if any.
fn raw_chunk(e: &dyn Engine, tenant: &str, metric: &str, w: i64) -> Option<Vec<u8>> {
    let prefix = keys::raw_prefix(tenant, "GPU-1", metric);
    let (from, to) = keys::scan_bounds(&prefix, w);
    let mut out = None;
    e.scan(Cf::Raw, &from, &to, &mut |_, v| {
        out = Some(v.to_vec());
        false
    })
    .unwrap();
    out
}

#[test]
fn raw_chunks_share_the_timestamps_of_their_read_group() {
    // Irregular instants, as the adaptive sampler sends them, with windows.
    let instants = |from: i64, n: usize| -> Vec<(i64, u32)> {
        let mut t = from;
        (0..n)
            .map(|i| {
                let w = [100u32, 200, 400, 800, 100, 300][i % 6];
                t += i64::from(w);
                (t, w)
            })
            .collect()
    };
    let batch = |metric: &str, pts: &[(i64, u32)], scale: f64| SeriesBatch {
        gpu_uuid: "GPU-1".into(),
        metric: metric.into(),
        points: pts
            .iter()
            .map(|&(t, w)| Point {
                ts_ms: t,
                value: ((t / 100) % 97) as f64 * scale,
                peak: None,
                window_ms: Some(w),
            })
            .collect(),
    };
    let metrics = ["sm_clock_mhz", "power_w", "tensor_active", "temperature_c"];
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let group = instants(T0, 2000);
        let other = instants(T0 + 50, 1500);
        let mut seq = 0;
        for (g, o) in group.chunks(100).zip(other.chunks(75)) {
            seq += 1;
            let set = CommitSet {
                seq,
                series: vec![
                    batch("tensor_active", g, 0.01),
                    batch("sm_clock_mhz", g, 7.0),
                    batch("temperature_c", g, 1.0),
                    batch("power_w", o, 3.0),
                ],
                ..Default::default()
            };
            store.commit("t1", &set).unwrap();
        }
        let all = |store: &Store| -> Vec<Vec<Point>> {
            metrics
                .iter()
                .map(|m| {
                    store
                        .series("t1", "GPU-1", m, 0, i64::MAX, 1 << 20)
                        .unwrap()
                })
                .collect()
        };
        let shares = |m: &str| Block::shares_time(&raw_chunk(&*e, "t1", m, T0).unwrap());
        let mut expect = all(&store);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(all(&store), expect, "{name}");
        assert!(shares("sm_clock_mhz") && shares("temperature_c"), "{name}");
        assert!(!shares("tensor_active") && !shares("power_w"), "{name}");

        // Late data for the reference series alone: the sharers of its
        // old timestamps are re-encoded on their own, in the same write.
        let late = instants(T0 + 1_000_000, 3);
        let mut commit = |series: Vec<SeriesBatch>| {
            seq += 1;
            store
                .commit(
                    "t1",
                    &CommitSet {
                        seq,
                        series,
                        ..Default::default()
                    },
                )
                .unwrap();
        };
        commit(vec![batch("tensor_active", &late, 0.01)]);
        expect = all(&store);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(all(&store), expect, "{name}");
        assert!(
            !shares("sm_clock_mhz") && !shares("temperature_c"),
            "{name}"
        );

        // The same instants for one sharer: it shares again.
        commit(vec![batch("sm_clock_mhz", &late, 7.0)]);
        expect = all(&store);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(all(&store), expect, "{name}");
        assert!(shares("sm_clock_mhz") && !shares("temperature_c"), "{name}");

        // Late data for the whole group in one batch: compacted together,
        // still shared; the series compacted before the reference in key
        // order waits for it.
        let late = instants(T0 + 2_000_000, 4);
        commit(vec![
            batch("tensor_active", &late, 0.01),
            batch("sm_clock_mhz", &late, 7.0),
        ]);
        expect = all(&store);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(all(&store), expect, "{name}");
        assert!(shares("sm_clock_mhz"), "{name}");

        // Late data for a sharer alone: it stops sharing, the reference
        // is untouched.
        let before = raw_chunk(&*e, "t1", "tensor_active", T0);
        commit(vec![batch(
            "sm_clock_mhz",
            &instants(T0 + 3_000_000, 2),
            7.0,
        )]);
        expect = all(&store);
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(all(&store), expect, "{name}");
        assert!(!shares("sm_clock_mhz"), "{name}");
        assert_eq!(raw_chunk(&*e, "t1", "tensor_active", T0), before, "{name}");
        // Every clock sample is there once.
        assert_eq!(expect[0].len(), 2000 + 3 + 4 + 2, "{name}");
    }
}

#[test]
fn ofu_chunks_share_the_timestamps_of_the_tensor_series() {
    let at = |from: i64, n: usize| -> Vec<(i64, u32)> {
        let mut t = from;
        (0..n)
            .map(|i| {
                let w = [100u32, 300, 700, 100][i % 4];
                t += i64::from(w);
                (t, w)
            })
            .collect()
    };
    let set = |seq: u64, pts: &[(i64, u32)], with_clock: bool| {
        let tpa: Vec<f64> = pts
            .iter()
            .map(|(t, _)| (60_000 + (t * 7919) % 2000) as f64 / 1e5)
            .collect();
        let clk: Vec<f64> = pts.iter().map(|(t, _)| 1352.0 + (t % 64) as f64).collect();
        let batch = |m: &str, v: &[f64]| SeriesBatch {
            gpu_uuid: "GPU-1".into(),
            metric: m.into(),
            points: pts
                .iter()
                .zip(v)
                .map(|(&(t, w), &v)| Point {
                    ts_ms: t,
                    value: v,
                    peak: None,
                    window_ms: Some(w),
                })
                .collect(),
        };
        let ofu = pts
            .iter()
            .enumerate()
            .map(|(i, &(t, w))| OfuSample {
                ts_ms: t,
                ofu: flopwatch_proto::ofu::ofu(tpa[i], clk[i], 1830.0),
                tensor_active: tpa[i],
                sm_clock_mhz: clk[i],
                window_ms: w,
            })
            .collect();
        let mut series = vec![batch("tensor_active", &tpa)];
        if with_clock {
            series.push(batch("sm_clock_avg_mhz", &clk));
        }
        CommitSet {
            seq,
            series,
            ofu: if with_clock {
                vec![("GPU-1".into(), Some("job".into()), ofu)]
            } else {
                Vec::new()
            },
            derivations: derived("GPU-1"),
            ..Default::default()
        }
    };
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        let pts = at(T0, 3000);
        for (i, c) in pts.chunks(50).enumerate() {
            store.commit("t1", &set(i as u64 + 1, c, true)).unwrap();
        }
        let read = |store: &Store| ofu_all(store, "t1", Some("job"));
        let ofu_shares = || {
            let mut v = Vec::new();
            e.scan(Cf::Ofu, &[], &[0xff; 8], &mut |_, x| {
                v.push(x.to_vec());
                true
            })
            .unwrap();
            assert_eq!(v.len(), 1, "{name}");
            let at = super::ofu_chunk::ofu_block_start(&v[0]).unwrap();
            Block::shares_time(&v[0][at..])
        };
        let expect = read(&store);
        assert_eq!(expect.len(), 3000, "{name}");
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(read(&store), expect, "{name}");
        assert!(ofu_shares(), "{name}");

        // A late tensor sample without OFU: the OFU chunk takes its own
        // timestamps back in the tensor chunk's write.
        store
            .commit("t1", &set(1000, &at(T0 + 2_000_000, 1), false))
            .unwrap();
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(read(&store), expect, "{name}");
        assert!(!ofu_shares(), "{name}");

        // A late batch of everything at new instants: OFU and tensor
        // match again only if the lone tensor sample has its OFU too, so
        // the chunk keeps its own timestamps; every sample reads back.
        let late = at(T0 + 2_500_000, 5);
        store.commit("t1", &set(1001, &late, true)).unwrap();
        let expect = read(&store);
        assert_eq!(expect.len(), 3005, "{name}");
        store.compact(T0 + 2 * H, 0).unwrap();
        assert_eq!(read(&store), expect, "{name}");
        assert!(!ofu_shares(), "{name}");
    }
}

#[test]
fn a_compaction_pass_past_its_deadline_leaves_the_rest_for_the_next() {
    for (name, e, _dir) in engines() {
        let store = Store::new(e.clone(), false);
        ingest(&store, "t1", T0, 20, 0);
        let before = store
            .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
            .unwrap();
        let past = Deadline::after(std::time::Duration::ZERO);
        let r = store.compact_within(T0 + 2 * H, 0, Some(past)).unwrap();
        assert_eq!(r.chunks, 0, "{name}");
        assert_eq!(count(&*e, Cf::Head), 20, "a bundle per batch, {name}");
        let r = store.compact_within(T0 + 2 * H, 0, None).unwrap();
        assert!(r.chunks > 0, "{name}");
        assert_eq!(count(&*e, Cf::Head), 0, "{name}");
        assert_eq!(
            store
                .series("t1", "GPU-1", "power_w", 0, i64::MAX, 1 << 20)
                .unwrap(),
            before,
            "{name}"
        );
    }
}

/// Per minute: the newest sample (time, OFU bits) and the OFU bits of a
/// sample on the minute's start, as an instant selector reads them.
type Minutes = std::collections::BTreeMap<i64, ((i64, u64), Option<u64>)>;

fn fold_minute(out: &mut Minutes, minute: i64, last: (i64, f64), at_start: Option<f64>) {
    let e = out.entry(minute).or_insert(((i64::MIN, 0), None));
    if last.0 >= e.0 .0 {
        e.0 = (last.0, last.1.to_bits());
    }
    if let Some(v) = at_start {
        e.1 = Some(v.to_bits());
    }
}

#[test]
fn minute_lasts_answer_as_the_samples_do_at_the_ranges_edges() {
    for (name, e, _dir) in engines() {
        let store = five_hours_four_sealed(e);
        // Ranges whose ends fall on, before and after a minute's samples:
        // 30.5 s into a minute with samples after it, 0.5 s past a
        // minute's last sample (96.9 s), on a whole minute, in the head.
        for (start, end) in [
            (T0, T0 + 5 * H),
            (T0 + 30_500, T0 + 3 * H + 30_500),
            (T0 + 60_000, T0 + 3 * H + 97_400),
            (T0 + 61_000, T0 + 2 * H + 120_000),
            (T0 + 2 * H + 59_000, T0 + 4 * H + 50_000),
            (T0 + H + 97_500, T0 + 4 * H + 20_000),
        ] {
            let mut want = Minutes::new();
            store
                .ofu("t1", "GPU-1", start, end, None, &mut |s| {
                    let minute = s.ts_ms.div_euclid(60_000) * 60_000;
                    let on = (s.ts_ms == minute).then_some(s.ofu);
                    fold_minute(&mut want, minute, (s.ts_ms, s.ofu), on);
                })
                .unwrap();
            let (mut got, mut hours) = (Minutes::new(), 0);
            let mut from_lasts = std::collections::BTreeSet::new();
            store
                .ofu_lasts("t1", "GPU-1", start, end, &mut |p| match p {
                    LastsPiece::Sample(s) => {
                        let minute = s.ts_ms.div_euclid(60_000) * 60_000;
                        let on = (s.ts_ms == minute).then_some(s.ofu);
                        fold_minute(&mut got, minute, (s.ts_ms, s.ofu), on);
                    }
                    LastsPiece::Hour(h) => {
                        hours += 1;
                        h.for_each(|m| {
                            assert!(m.last.0 >= start && m.last.0 < end, "{name}");
                            // A minute the range starts inside gives no
                            // sample on its start.
                            assert!(m.minute >= start || m.at_start.is_none(), "{name}");
                            from_lasts.insert(m.minute);
                            fold_minute(&mut got, m.minute, m.last, m.at_start);
                        });
                    }
                })
                .unwrap();
            assert_eq!(got, want, "{name}: [{start}, {end})");
            assert!(hours >= 2, "{name}: minute lasts read for [{start}, {end})");
            // The minute the range ends in comes from the minute lasts
            // when its samples all lie before the end, else from samples.
            let end_minute = end.div_euclid(60_000) * 60_000;
            if end == T0 + 3 * H + 97_400 {
                assert!(from_lasts.contains(&end_minute), "{name}");
            }
            if end == T0 + 3 * H + 30_500 {
                assert!(!from_lasts.contains(&end_minute), "{name}");
            }
            // The minute it starts inside, when its newest sample lies in
            // the range.
            if start == T0 + 30_500 || start == T0 + 61_000 {
                let start_minute = start.div_euclid(60_000) * 60_000;
                assert!(from_lasts.contains(&start_minute), "{name}");
            }
        }
    }
}
