//! A latency histogram carried on a child's status line as `hist=`:
//! written by the process that measures, read back by the bench.

use flopwatch_agent::latency::BUCKETS;

/// A latency histogram as a status line's `hist=` value (what [`hist`]
/// reads back): its non-empty buckets as `index:count`, comma-separated.
pub(super) fn fmt_hist(counts: &[u64]) -> String {
    let pairs: Vec<String> = counts
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| format!("{i}:{c}"))
        .collect();
    pairs.join(",")
}

/// The latency histogram of a status line.
pub(super) fn hist(line: &str) -> Vec<u64> {
    let mut h = vec![0u64; BUCKETS];
    let list = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("hist="))
        .unwrap_or("");
    for pair in list.split(',').filter(|p| !p.is_empty()) {
        if let Some((i, c)) = pair.split_once(':') {
            if let (Ok(i), Ok(c)) = (i.parse::<usize>(), c.parse::<u64>()) {
                if i < BUCKETS {
                    h[i] = c;
                }
            }
        }
    }
    h
}
