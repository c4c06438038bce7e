//! Fuzzes what an agent can send: arbitrary bytes decoded as an
//! `AgentMessage` the way the ingest service receives it, its batch
//! converted and validated (collector/src/validate.rs, compiled in
//! directly so RocksDB is not built). Nothing may panic, and whatever
//! validation keeps must satisfy `check_kept`: known metrics and GPUs,
//! strictly increasing timestamps inside the accepted window, finite
//! values, ratios in range.

#![no_main]

#[path = "../../src/validate.rs"]
#[allow(dead_code)]
mod validate;

use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::sync::OnceLock;

fn inventory() -> &'static (HashSet<String>, HashSet<String>) {
    static INV: OnceLock<(HashSet<String>, HashSet<String>)> = OnceLock::new();
    INV.get_or_init(|| {
        (
            ["GPU-0", "GPU-1", ""].iter().map(|s| s.to_string()).collect(),
            ["ib:mlx5_0:1@n1", "host@n1"].iter().map(|s| s.to_string()).collect(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let (gpus, devices) = inventory();
    let rules = validate::Rules {
        now_ms: 1_700_000_000_000,
        max_future_ms: 600_000,
        oldest_ms: 1_700_000_000_000 - 30 * 86_400_000,
        gpus,
        devices,
    };
    if let Ok((batch, _rejected)) = validate::decode_and_validate(data, &rules) {
        if let Err(e) = validate::check_kept(&batch, &rules) {
            panic!("validation kept a bad sample: {e}");
        }
    }
});
