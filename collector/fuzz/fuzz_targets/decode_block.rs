//! Fuzzes the chunk decoder: any bytes must decode or fail with an error,
//! never panic or allocate without bound; whatever decodes must survive a
//! re-encode (both the head and the sealed-chunk forms) bit for bit.
//!
//! The codec is its own crate (`flopwatch-codec`, depending only on
//! `thiserror` and `constriction`), so this target does not build RocksDB.

#![no_main]

use flopwatch_codec::Block;
use libfuzzer_sys::fuzz_target;

fn same(a: &Block, b: &Block) -> bool {
    a.ts == b.ts
        && a.windows == b.windows
        && a.cols.len() == b.cols.len()
        && a.cols.iter().zip(&b.cols).all(|(x, y)| {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

fuzz_target!(|data: &[u8]| {
    // A chunk sharing another's timestamps, given some that may not fit.
    let n = data.len() / 4;
    let ts: Vec<i64> = (0..n as i64).map(|i| i * 100).collect();
    if Block::shares_time(data) {
        if let Ok(b) = Block::decode_shared(data, &ts, &vec![100; n]) {
            let bytes = b.encode_compact_shared().expect("a decoded block encodes");
            let again = Block::decode_shared(&bytes, &b.ts, &b.windows).expect("it decodes");
            assert!(same(&b, &again), "round trip changed the block");
        }
    }
    let Ok(b) = Block::decode(data) else { return };
    for bytes in [b.encode(), b.encode_compact()] {
        let bytes = bytes.expect("a decoded block encodes");
        let again = Block::decode(&bytes).expect("an encoded block decodes");
        assert!(same(&b, &again), "round trip changed the block");
    }
});
