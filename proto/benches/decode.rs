//! Decoding an agent's batch (`cargo bench -p flopwatch-proto --bench
//! decode`): the generated code and the conversion to the model, against
//! [`flopwatch_proto::wire_batch`], on the batches agents send: a
//! backed-off agent's (8 GPUs × 20 metrics, one point a series with its
//! window, every 7 s: what `bench fleet` sends) and a fixed-100 ms
//! agent's (70 points a series).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flopwatch_proto::model::Batch;
use flopwatch_proto::v1;
use flopwatch_proto::wire_batch::AgentFrame;
use prost::Message;
use std::hint::black_box;

/// An agent message holding a batch of `gpus` × `metrics` series of
/// `points` points each, with windows, and a job per GPU.
fn message(gpus: usize, metrics: usize, points: usize) -> Vec<u8> {
    let t0 = 1_800_000_000_000i64;
    let series = (0..gpus)
        .flat_map(|g| {
            (0..metrics).map(move |m| v1::Series {
                gpu_uuid: format!("GPU-{g:08x}-1a2b-3c4d-5e6f-0123456789ab"),
                metric: format!("metric_{m:02}_ratio"),
                timestamps_ms: (0..points).map(|i| t0 + 100 * i as i64).collect(),
                values: (0..points)
                    .map(|i| (g * 31 + m * 7 + i) as f64 / 997.0)
                    .collect(),
                peaks: vec![],
                window_ms: vec![if points == 1 { 7_000 } else { 100 }; points],
            })
        })
        .collect();
    let jobs = (0..gpus)
        .map(|g| v1::JobAssignment {
            gpu_uuid: format!("GPU-{g:08x}-1a2b-3c4d-5e6f-0123456789ab"),
            job_id: "train-llm-7b".into(),
            pod: "trainer-0".into(),
            namespace: "research".into(),
            since_ms: t0,
            ..Default::default()
        })
        .collect();
    v1::AgentMessage {
        msg: Some(v1::agent_message::Msg::Batch(v1::Batch {
            seq: 42,
            agent_id: "node-0001".into(),
            boot_id: "3f2a9c1e-0000-4444-8888-123456789abc".into(),
            series,
            jobs,
            sent_at_ms: t0 + 7_000,
            pending_bytes: 4_096,
            pending_batches: 1,
            ..Default::default()
        })),
    }
    .encode_to_vec()
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_batch");
    for (name, points) in [("backed_off_160x1", 1usize), ("fixed_100ms_160x70", 70)] {
        let bytes = message(8, 20, points);
        g.throughput(Throughput::Elements(160 * points as u64));
        g.bench_with_input(
            BenchmarkId::new("generated_then_converted", name),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    let m = v1::AgentMessage::decode(black_box(bytes.as_slice())).unwrap();
                    let Some(v1::agent_message::Msg::Batch(w)) = m.msg else {
                        unreachable!()
                    };
                    black_box(Batch::try_from(w).unwrap())
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("wire_batch", name), &bytes, |b, bytes| {
            b.iter(|| black_box(AgentFrame::decode(black_box(bytes.as_slice())).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
