//! Round trips, sizes and robustness of every block format.

use super::*;
use proptest::prelude::*;

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

proptest! {
    #[test]
    fn round_trips(
        start in -1_000_000_000_000i64..4_000_000_000_000i64,
        deltas in prop::collection::vec(0i64..40_000, 0..300),
        vals in prop::collection::vec(any::<f64>(), 300),
        windows in prop::collection::vec(any::<u32>(), 300),
        with_windows in any::<bool>(),
    ) {
        let mut ts = vec![start];
        for d in &deltas { ts.push(ts.last().unwrap() + d); }
        let n = ts.len();
        let b = Block {
            ts,
            cols: vec![vals[..n].to_vec(), vals[..n].iter().map(|v| v * 0.5).collect()],
            windows: if with_windows { windows[..n].to_vec() } else { Vec::new() },
        };
        let d = Block::decode(&b.encode().unwrap()).unwrap();
        prop_assert_eq!(&d.ts, &b.ts);
        prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
        prop_assert!(same_bits(&d.cols[1], &b.cols[1]));
        prop_assert_eq!(&d.windows, &b.windows);
    }

    /// The bit writer and reader move whole bytes at a time; the stream
    /// they make is the one of writing (reading) bit by bit, high first.
    #[test]
    fn bits_are_written_high_first_one_by_one(
        fields in prop::collection::vec((any::<u64>(), 0u8..=64), 0..60),
    ) {
        let mut w = bits::BitWriter { out: Vec::new(), used: 0 };
        let mut one_by_one: Vec<bool> = Vec::new();
        for &(v, n) in &fields {
            w.bits(v, n);
            one_by_one.extend((0..n).rev().map(|i| (v >> i) & 1 == 1));
        }
        let mut expected = vec![0u8; one_by_one.len().div_ceil(8)];
        for (i, b) in one_by_one.iter().enumerate() {
            expected[i / 8] |= u8::from(*b) << (7 - i % 8);
        }
        prop_assert_eq!(&w.out, &expected);
        let mut r = bits::BitReader { buf: &w.out, bit: 0 };
        for &(v, n) in &fields {
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            prop_assert_eq!(r.bits(n).unwrap(), v & mask);
        }
        prop_assert!(r.bits(8).is_err(), "reads past the end");
    }

    #[test]
    fn decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Block::decode(&bytes);
    }
}

#[test]
fn regular_series_is_compact() {
    let n = 1000;
    let b = Block {
        ts: (0..n).map(|i| 1_700_000_000_000 + i * 100).collect(),
        cols: vec![(0..n)
            .map(|i| if i % 50 < 40 { 0.62 } else { 0.04 })
            .collect()],
        windows: vec![100; n as usize],
    };
    let bytes = b.encode().unwrap();
    // A bit per regular timestamp, a bit per repeated value, a few
    // bytes for the constant windows: well under a byte per sample.
    assert!(bytes.len() < 600, "{}", bytes.len());
    assert_eq!(Block::decode(&bytes).unwrap(), b);
}

proptest! {
    #[test]
    fn compact_round_trips_bit_exactly(
        start in 0i64..4_000_000_000_000i64,
        deltas in prop::collection::vec(1i64..5_000, 0..200),
        ints in prop::collection::vec(-10_000_000i64..10_000_000, 200),
        scale in 0u32..7,
        noise in prop::collection::vec(any::<f64>(), 200),
        decimal in any::<bool>(),
        wins in prop::collection::vec(any::<u32>(), 200),
        window_kind in 0u8..3,
    ) {
        let mut ts = vec![start];
        for d in &deltas { ts.push(ts.last().unwrap() + d); }
        let n = ts.len();
        let p = 10f64.powi(scale as i32);
        let col: Vec<f64> = if decimal {
            ints[..n].iter().map(|&i| i as f64 / p).collect()
        } else {
            noise[..n].to_vec()
        };
        let windows: Vec<u32> = match window_kind {
            0 => vec![100; n],
            // As a sampler sends them: the gap, sometimes off by a little.
            1 => (0..n)
                .map(|i| if i == 0 { 100 } else { (ts[i] - ts[i - 1]) as u32 + wins[i] % 3 })
                .collect(),
            _ => wins[..n].to_vec(),
        };
        // A second column: a peak at or above the value, as a sampler's.
        let peak: Vec<f64> = col.iter().zip(&ints).map(|(v, i)| v + (i % 7).abs() as f64 / p).collect();
        let b = Block { ts, cols: vec![col, peak], windows };
        for bytes in [
            b.encode_compact().unwrap(),
            b.encode_compact_quick().unwrap(),
            b.encode_v2().unwrap(),
        ] {
            let d = Block::decode(&bytes).unwrap();
            prop_assert_eq!(&d.ts, &b.ts);
            prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
            prop_assert!(same_bits(&d.cols[1], &b.cols[1]));
            prop_assert_eq!(&d.windows, &b.windows);
            prop_assert_eq!(Block::decode_time(&bytes).unwrap(), (b.ts.clone(), b.windows.clone()));
            prop_assert!(!Block::shares_time(&bytes));
        }
        // Without timestamps: the values come back with the ones given.
        let shared = b.encode_compact_shared().unwrap();
        prop_assert!(Block::shares_time(&shared));
        prop_assert!(shared.len() <= b.encode_compact().unwrap().len());
        prop_assert_eq!(Block::decode(&shared), Err(CodecError::SharedTime));
        prop_assert_eq!(Block::decode_time(&shared), Err(CodecError::SharedTime));
        let d = Block::decode_shared(&shared, &b.ts, &b.windows).unwrap();
        prop_assert_eq!(&d.ts, &b.ts);
        prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
        prop_assert!(same_bits(&d.cols[1], &b.cols[1]));
        prop_assert_eq!(&d.windows, &b.windows);
        // Timestamps of another length do not fit.
        if n > 1 {
            prop_assert!(Block::decode_shared(&shared, &b.ts[1..], &b.windows[1..]).is_err());
            prop_assert!(Block::decode_shared(&shared, &b.ts, &[]).is_err());
        }
    }

    /// Adaptive-sampling means (Σ v·w / Σ w of decimal readings, as the
    /// agent computes them) mixed with single readings, NaN, −0.0,
    /// infinities and arbitrary bits, at arbitrary timestamps.
    #[test]
    fn sealed_means_and_escapes_round_trip_bit_exactly(
        start in any::<i64>(),
        deltas in prop::collection::vec(prop_oneof![Just(100i64), 0i64..100_000, any::<i64>()], 0..150),
        ints in prop::collection::vec(-2_000_000i64..2_000_000, 40 * 150),
        spans in prop::collection::vec(1usize..40, 150),
        odd in prop::collection::vec(prop_oneof![
            8 => Just(None),
            1 => any::<f64>().prop_map(Some),
            1 => prop::sample::select(vec![f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE / 3.0]).prop_map(Some),
        ], 150),
        decimals in 0u32..7,
        wins in prop::collection::vec(prop_oneof![Just(100u32), any::<u32>()], 150),
    ) {
        let mut ts = vec![start];
        for d in &deltas { ts.push(ts.last().unwrap().wrapping_add(*d)); }
        let n = ts.len();
        let p = 10f64.powi(decimals as i32);
        let (mut col, mut windows) = (Vec::new(), Vec::new());
        for i in 0..n {
            let k = spans[i];
            let w = wins[i];
            let reads = &ints[i * 40..i * 40 + k];
            let (mut svw, mut sw) = (0.0, 0u64);
            for &x in reads {
                svw += x as f64 / p * f64::from(w);
                sw += u64::from(w);
            }
            col.push(odd[i].unwrap_or(if sw == 0 { 0.0 } else { svw / sw as f64 }));
            windows.push(u32::try_from(sw).unwrap_or(u32::MAX));
        }
        let b = Block { ts, cols: vec![col], windows };
        for bytes in [b.encode_compact().unwrap(), b.encode_compact_quick().unwrap()] {
            let d = Block::decode(&bytes).unwrap();
            prop_assert_eq!(&d.ts, &b.ts);
            prop_assert!(same_bits(&d.cols[0], &b.cols[0]));
            prop_assert_eq!(&d.windows, &b.windows);
        }
    }

    #[test]
    fn sealed_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut b = bytes;
        if let Some(x) = b.first_mut() { *x = 3; }
        let _ = Block::decode(&b);
        let _ = Block::decode_time(&b);
        let ts: Vec<i64> = (0..b.len() as i64).collect();
        let w = vec![100u32; b.len()];
        for n in [0, b.len().min(1), b.len() / 2, b.len()] {
            let _ = Block::decode_shared(&b, &ts[..n], &w[..n]);
            let _ = Block::decode_shared(&b, &ts[..n], &[]);
        }
    }

    /// A valid chunk with bytes flipped: an error or some block, never a
    /// panic.
    #[test]
    fn corrupted_sealed_chunks_never_panic(
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let n = 500;
        let b = Block {
            ts: (0..n as i64).map(|i| 1_700_000_000_000 + i * 100 + (i % 7) * 300).collect(),
            cols: vec![
                (0..n).map(|i| (62_000 + (i * 7919) % 900) as f64 / 1e5).collect(),
                (0..n).map(|i| if i % 50 == 0 { f64::NAN } else { (i % 13) as f64 }).collect(),
            ],
            windows: (0..n as u32).map(|i| 100 + (i % 3) * 100).collect(),
        };
        let mut bytes = b.encode_compact().unwrap();
        for (at, x) in flips {
            let len = bytes.len();
            bytes[at % len] ^= x;
        }
        let _ = Block::decode(&bytes);
    }
}

/// Means of `k` five-decimal readings at 100 ms, as the adaptive sampler
/// sends them, with noise like the simulator's.
fn agent_means(n: usize) -> Block {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ts, mut col, mut windows) = (Vec::new(), Vec::new(), Vec::new());
    let mut t = 1_700_000_000_000i64;
    for i in 0..n {
        let k = [1u64, 2, 4, 8, 16, 32][i % 6];
        let (mut svw, mut sw) = (0.0, 0u64);
        for _ in 0..k {
            let v = (62_000 + (next() % 1000) as i64) as f64 / 1e5;
            svw += v * 100.0;
            sw += 100;
        }
        t += sw as i64;
        ts.push(t);
        col.push(svw / sw as f64);
        windows.push(sw as u32);
    }
    Block {
        ts,
        cols: vec![col],
        windows,
    }
}

#[test]
fn window_means_of_decimals_are_stored_as_integers() {
    let b = agent_means(3000);
    let v2 = b.encode_v2().unwrap();
    let v3 = b.encode_compact().unwrap();
    // The means are full-precision doubles: format 2 XORs them (~7 bytes
    // each); as integer sums they take ~2 bytes.
    assert!(v3.len() < 3 * b.len(), "{} bytes", v3.len());
    assert!(v3.len() * 3 < v2.len(), "{} vs {}", v3.len(), v2.len());
    let d = Block::decode(&v3).unwrap();
    assert!(same_bits(&d.cols[0], &b.cols[0]));
    assert_eq!(d.windows, b.windows);
    assert_eq!(d.ts, b.ts);
}

#[test]
fn a_quick_encoding_is_the_best_one_with_its_predictor_fixed() {
    // Short blocks as a fold writes them, and an hour's worth.
    for n in [17, 60, 600] {
        let b = agent_means(n);
        let (best, quick) = (
            b.encode_compact().unwrap(),
            b.encode_compact_quick().unwrap(),
        );
        let d = Block::decode(&quick).unwrap();
        assert!(same_bits(&d.cols[0], &b.cols[0]));
        assert_eq!((d.ts, d.windows), (b.ts.clone(), b.windows.clone()));
        // The trials only ever pick a smaller stream; a fixed level on
        // noisy means costs little more.
        assert!(
            best.len() <= quick.len(),
            "{n}: {} > {}",
            best.len(),
            quick.len()
        );
        assert!(
            quick.len() * 10 <= best.len() * 12,
            "{n}: quick {} against {}",
            quick.len(),
            best.len()
        );
    }
}

#[test]
fn regular_timestamps_and_windows_cost_almost_nothing() {
    let n = 36_000;
    let b = Block {
        ts: (0..n as i64).map(|i| 1_700_000_000_000 + i * 100).collect(),
        cols: vec![vec![0.0; n]],
        windows: vec![100; n],
    };
    let bytes = b.encode_compact().unwrap();
    // An hour at 100 ms of a constant: a few bytes per thousand samples.
    assert!(bytes.len() < 200, "{}", bytes.len());
    assert_eq!(Block::decode(&bytes).unwrap(), b);
}

#[test]
fn format_two_chunks_still_decode() {
    // A format-2 chunk as the previous release wrote it: three samples, a
    // decimal column, an XOR column (with NaN), windows run-length coded.
    let bytes = [
        2u8, 1, 2, 3, 208, 15, 3, 178, 44, 128, 1, 2, 50, 3, 13, 150, 64, 0, 20, 63, 211, 51, 51,
        51, 51, 51, 51, 212, 15, 135, 232, 3, 102, 102, 102, 102, 102, 102, 96, 100, 2, 200, 1, 1,
    ];
    let d = Block::decode(&bytes).unwrap();
    assert_eq!(d.ts, vec![1_000, 1_100, 1_300]);
    assert!(same_bits(&d.cols[0], &[0.25, 0.5, 0.75]));
    assert!(same_bits(&d.cols[1], &[0.3, 0.6, f64::NAN]));
    assert_eq!(d.windows, vec![100, 100, 200]);
    // The same block written today is format 3 and decodes the same.
    let v3 = d.encode_compact().unwrap();
    assert_eq!(v3[0], 3);
    let again = Block::decode(&v3).unwrap();
    assert_eq!(again.ts, d.ts);
    assert!(same_bits(&again.cols[1], &d.cols[1]));
}

#[test]
fn decimals_pack_smaller_than_xor() {
    // Five-decimal readings with noise, as the simulator's traces.
    let n = 3600;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let col: Vec<f64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (62_000 + (x % 1000) as i64) as f64 / 1e5
        })
        .collect();
    let b = Block {
        ts: (0..n as i64).map(|i| 1_700_000_000_000 + i * 100).collect(),
        cols: vec![col, vec![-0.0; n], vec![f64::NAN; n]],
        windows: vec![],
    };
    let xor = b.encode().unwrap();
    let dec = b.encode_compact().unwrap();
    assert!(
        dec.len() * 3 < xor.len() * 2,
        "{} vs {}",
        dec.len(),
        xor.len()
    );
    let d = Block::decode(&dec).unwrap();
    for c in 0..3 {
        assert!(same_bits(&d.cols[c], &b.cols[c]), "column {c}");
    }
}

#[test]
fn empty_blocks_round_trip() {
    let b = Block {
        ts: vec![],
        cols: vec![vec![], vec![]],
        windows: vec![],
    };
    assert_eq!(Block::decode(&b.encode().unwrap()).unwrap(), b);
    assert_eq!(Block::decode(&b.encode_compact().unwrap()).unwrap(), b);
}

#[test]
fn truncation_is_an_error() {
    let b = Block {
        ts: vec![1, 2, 3],
        cols: vec![vec![1.0, 2.0, 3.0]],
        windows: vec![],
    };
    for bytes in [b.encode().unwrap(), b.encode_compact().unwrap()] {
        for cut in 0..bytes.len() {
            assert!(Block::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
    }
}
