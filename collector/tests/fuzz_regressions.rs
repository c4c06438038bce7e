//! The fuzz targets' inputs worth keeping, run as ordinary tests: every
//! file under `collector/fuzz/regressions/<target>/` (inputs that once
//! crashed a target, or exercised a path worth pinning), plus hostile
//! batches built here. The same checks as the targets: no panic, and
//! whatever validation keeps satisfies `validate::check_kept`.

use flopwatch_collector::Block;
use flopwatch_collector::{check_kept, decode_and_validate, Rules};
use flopwatch_proto::v1::{self, agent_message, AgentMessage};
use prost::Message;
use std::collections::HashSet;

const NOW: i64 = 1_700_000_000_000;

fn check(bytes: &[u8]) -> Result<(), String> {
    let gpus: HashSet<String> = ["GPU-0", "GPU-1", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let devices: HashSet<String> = ["ib:mlx5_0:1@n1", "host@n1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rules = Rules {
        now_ms: NOW,
        max_future_ms: 600_000,
        oldest_ms: NOW - 30 * 86_400_000,
        gpus: &gpus,
        devices: &devices,
    };
    match decode_and_validate(bytes, &rules) {
        Ok((batch, _)) => check_kept(&batch, &rules),
        Err(_) => Ok(()),
    }
}

fn encode(b: v1::Batch) -> Vec<u8> {
    AgentMessage {
        msg: Some(agent_message::Msg::Batch(b)),
    }
    .encode_to_vec()
}

fn series(gpu: &str, metric: &str, ts: Vec<i64>, values: Vec<f64>) -> v1::Series {
    v1::Series {
        gpu_uuid: gpu.into(),
        metric: metric.into(),
        timestamps_ms: ts,
        values,
        ..Default::default()
    }
}

/// The same block, bit for bit.
fn same_block(b: &Block, c: &Block) -> bool {
    b.ts == c.ts
        && b.windows == c.windows
        && b.cols.len() == c.cols.len()
        && b.cols.iter().zip(&c.cols).all(|(x, y)| {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

/// The `decode_block` target's check: decode, and whatever decodes
/// re-encodes (head and sealed forms) to the identical block.
fn check_block(bytes: &[u8]) -> Result<(), String> {
    if Block::shares_time(bytes) {
        let n = bytes.len() / 4;
        let ts: Vec<i64> = (0..n as i64).map(|i| i * 100).collect();
        if let Ok(b) = Block::decode_shared(bytes, &ts, &vec![100; n]) {
            let again = b
                .encode_compact_shared()
                .map_err(|e| format!("a decoded block does not encode: {e}"))?;
            let c = Block::decode_shared(&again, &b.ts, &b.windows)
                .map_err(|e| format!("an encoded block does not decode: {e}"))?;
            if !same_block(&b, &c) {
                return Err("round trip changed the block".into());
            }
        }
    }
    let Ok(b) = Block::decode(bytes) else {
        return Ok(());
    };
    for again in [b.encode(), b.encode_compact()] {
        let again = again.map_err(|e| format!("a decoded block does not encode: {e}"))?;
        let c =
            Block::decode(&again).map_err(|e| format!("an encoded block does not decode: {e}"))?;
        if !same_block(&b, &c) {
            return Err("round trip changed the block".into());
        }
    }
    Ok(())
}

/// Runs `f` on every kept input of `target`; how many there were.
fn kept(target: &str, f: fn(&[u8]) -> Result<(), String>) -> usize {
    let dir = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("fuzz/regressions")
    .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        f(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        n += 1;
    }
    n
}

#[test]
fn kept_batch_inputs_pass() {
    assert!(kept("validate_batch", check) > 0);
}

#[test]
fn kept_block_inputs_pass() {
    assert!(kept("decode_block", check_block) > 0);
}

#[test]
fn hostile_batches_keep_only_what_validation_guarantees() {
    let t = NOW - 1000;
    let cases = vec![
        // Arrays of different lengths: refused whole.
        v1::Batch {
            seq: 1,
            series: vec![series("GPU-0", "tensor_active", vec![t, t + 1], vec![0.5])],
            ..Default::default()
        },
        // Peaks and windows of the wrong length.
        v1::Batch {
            seq: 1,
            series: vec![v1::Series {
                peaks: vec![1.0; 3],
                window_ms: vec![100; 5],
                ..series("GPU-0", "power_w", vec![t, t + 1], vec![1.0, 2.0])
            }],
            ..Default::default()
        },
        // Non-finite, out of range, repeated and decreasing timestamps,
        // extremes of i64, unknown names, a long metric name.
        v1::Batch {
            seq: u64::MAX,
            series: vec![
                series(
                    "GPU-0",
                    "tensor_active",
                    vec![t, t, t - 5, i64::MIN, i64::MAX, t + 7, t + 8, t + 9],
                    vec![0.5, 0.6, 0.7, 0.1, 0.1, f64::NAN, f64::INFINITY, 1.5],
                ),
                series("GPU-1", "power_w", vec![t, t + 100], vec![-1.0, f64::MAX]),
                series("GPU-9", "power_w", vec![t], vec![1.0]),
                series("GPU-0", "no_such_metric", vec![t], vec![1.0]),
                series("GPU-0", &"m".repeat(10_000), vec![t], vec![1.0]),
                series("", "temp_c", vec![t], vec![-0.0]),
                series("host@n1", "host_cpu_util", vec![t], vec![0.5]),
            ],
            jobs: vec![
                v1::JobAssignment {
                    gpu_uuid: "GPU-0".into(),
                    job_id: "j".repeat(1000),
                    ..Default::default()
                },
                v1::JobAssignment {
                    gpu_uuid: "GPU-7".into(),
                    job_id: "j".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
    ];
    for b in cases {
        check(&encode(b)).unwrap();
    }
    // Truncations and bit flips of a valid batch.
    let good = encode(v1::Batch {
        seq: 3,
        series: vec![series(
            "GPU-0",
            "tensor_active",
            vec![t, t + 100, t + 200],
            vec![0.1, 0.2, 0.3],
        )],
        ..Default::default()
    });
    for cut in 0..good.len() {
        check(&good[..cut]).unwrap();
    }
    for i in 0..good.len() * 8 {
        let mut b = good.clone();
        b[i / 8] ^= 1 << (i % 8);
        check(&b).unwrap();
    }
}
