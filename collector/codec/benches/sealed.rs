//! Sealed-chunk (format 3) encoding and decoding speed on series shaped like
//! the agents' (`cargo bench -p flopwatch-codec`): an hour at a fixed
//! 100 ms, adaptive window means with their peaks, and the short blocks a
//! fold encodes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flopwatch_codec::Block;
use std::hint::black_box;

/// A small deterministic generator (xorshift).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `-k..=k`.
    fn around(&mut self, k: i64) -> i64 {
        (self.next() % (2 * k as u64 + 1)) as i64 - k
    }
}

/// `n` samples at 100 ms of a reading printed with `decimals` decimals:
/// a level that drifts and jumps now and then, plus noise.
fn fixed(n: usize, decimals: i32, seed: u64) -> Block {
    let mut r = Noise(seed);
    let scale = 10f64.powi(decimals);
    let mut level = 300 * 10i64.pow(decimals as u32);
    let (mut ts, mut col) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if r.next().is_multiple_of(600) {
            level = (r.next() % 700) as i64 * 10i64.pow(decimals as u32);
        }
        level += r.around(3);
        ts.push(1_700_000_000_000 + 100 * i as i64);
        col.push((level + r.around(40)) as f64 / scale);
    }
    Block {
        ts,
        cols: vec![col],
        windows: Vec::new(),
    }
}

/// `n` adaptive samples: means of 1 to 32 five-decimal readings at 100 ms
/// and their peaks, windows as long as the gaps.
fn adaptive(n: usize, seed: u64) -> Block {
    let mut r = Noise(seed);
    let (mut ts, mut mean, mut peak, mut windows) = (vec![], vec![], vec![], vec![]);
    let mut t = 1_700_000_000_000i64;
    for i in 0..n {
        let k = [1u64, 2, 4, 8, 16, 32][i % 6];
        let (mut svw, mut sw, mut top) = (0.0, 0u64, f64::MIN);
        for _ in 0..k {
            let v = (62_000 + (r.next() % 1000) as i64) as f64 / 1e5;
            svw += v * 100.0;
            sw += 100;
            top = top.max(v);
        }
        t += sw as i64;
        ts.push(t);
        mean.push(svw / sw as f64);
        peak.push(top);
        windows.push(sw as u32);
    }
    Block {
        ts,
        cols: vec![mean, peak],
        windows,
    }
}

fn encode(c: &mut Criterion) {
    let cases = [
        ("hour_100ms_1_decimal", fixed(36_000, 1, 7)),
        ("hour_100ms_3_decimals", fixed(36_000, 3, 11)),
        ("adaptive_means_and_peaks", adaptive(3_000, 13)),
        ("fold_60_samples", fixed(60, 2, 17)),
        ("fold_17_samples", fixed(17, 2, 19)),
    ];
    // Sealed chunks, and a fold's blocks with the predictor fixed.
    type Encode = fn(&Block) -> Result<Vec<u8>, flopwatch_codec::CodecError>;
    let encoders: [(&str, Encode); 2] = [
        ("sealed_encode", Block::encode_compact),
        ("sealed_encode_quick", Block::encode_compact_quick),
    ];
    for (group, encode) in encoders {
        let mut g = c.benchmark_group(group);
        for (name, block) in &cases {
            g.throughput(Throughput::Elements(block.len() as u64));
            g.bench_with_input(BenchmarkId::from_parameter(name), block, |b, block| {
                b.iter(|| encode(black_box(block)).unwrap())
            });
        }
        g.finish();
    }
    let mut g = c.benchmark_group("sealed_decode");
    for (name, block) in &cases {
        let bytes = block.encode_compact().unwrap();
        g.throughput(Throughput::Elements(block.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &bytes, |b, bytes| {
            b.iter(|| Block::decode(black_box(bytes)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
