//! Key layout: tenant → series → time, so range scans are cheap.
//!
//! Every string component is length-prefixed (u8 length, ≤ 255 bytes,
//! enforced by validation), which keeps keys of different tenants and
//! series from ever sharing a prefix by accident. Times are big-endian with
//! the sign bit flipped so byte order equals numeric order.
//!
//! | CF   | key                                                     | value |
//! |------|---------------------------------------------------------|-------|
//! | raw  | `tenant gpu metric last_ts seq`                         | codec block: value [, peak] columns |
//! | ofu  | `tenant gpu last_ts seq`                                | job id + codec block: ofu, tpa, clock |
//! | head | `'g' hour phase tenant gpu last_ts seq`                  | a batch's blocks of one GPU and hour, bundled (see `gpu_block`) |
//! | rollup | `'r' tenant gpu metric hour` / `'o' tenant gpu hour`   | hour (and minute) aggregates |
//! | rollup | `'l' tenant gpu hour`                                   | the hour's minute lasts (see `lasts`) |
//! | meta | `~format`                                               | the store's format version (u32 BE, see `format`) |
//! | meta | `'a' tenant agent boot`                                 | acked seq (u64 BE) |
//! | meta | `'m' tenant agent boot`                                 | held seq ranges (membership) |
//! | limbo | head / event keys, `'b' tenant agent boot seq`         | a batch another collector may hold (see `limbo`) |
//! | meta | `'n' tenant node`                                       | node record |
//! | meta | `'g' tenant gpu`                                        | GPU record |
//! | meta | `'j' tenant job gpu`                                    | job-on-GPU record |
//!
//! Blocks are keyed by their *last* timestamp: a scan for `[start, end)`
//! seeks to `start` and stops at the first block that begins at or after
//! `end`.
//!
//! The head leads with the hour (the start of the hour its bundle's
//! samples lie in, a time as [`put_ts`] writes it), then the GPU's seal
//! phase ([`seal_phase`]), then the GPU: an hour's bundles are one run of
//! keys, apart from the open hour's, so RocksDB's compactions of the open
//! hour do not rewrite the hours being sealed, and within the hour GPUs
//! sort in the order they are sealed, so the part of an hour already
//! sealed is one range of keys, compacted away while the seal goes on
//! (docs/STORAGE.md, *Head*).

/// Appends a length-prefixed string; strings over 255 bytes are cut
/// (validation rejects them before they get here).
pub fn put_str(k: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    k.push(b.len() as u8);
    k.extend_from_slice(b);
}

/// Appends a time so byte order is numeric order.
pub fn put_ts(k: &mut Vec<u8>, ts: i64) {
    k.extend_from_slice(&((ts as u64) ^ (1 << 63)).to_be_bytes());
}

/// Reads a time written by [`put_ts`].
pub fn get_ts(b: &[u8]) -> Option<i64> {
    let a: [u8; 8] = b.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(a) ^ (1 << 63)) as i64)
}

/// Reads a length-prefixed string at `pos`, advancing it.
pub fn get_str<'a>(b: &'a [u8], pos: &mut usize) -> Option<&'a str> {
    let len = *b.get(*pos)? as usize;
    let s = b.get(*pos + 1..*pos + 1 + len)?;
    *pos += 1 + len;
    std::str::from_utf8(s).ok()
}

/// Prefix of one raw series.
pub fn raw_prefix(tenant: &str, gpu: &str, metric: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + gpu.len() + metric.len() + 20);
    put_str(&mut k, tenant);
    put_str(&mut k, gpu);
    put_str(&mut k, metric);
    k
}

/// Prefix of one GPU's OFU series.
pub fn ofu_prefix(tenant: &str, gpu: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + gpu.len() + 18);
    put_str(&mut k, tenant);
    put_str(&mut k, gpu);
    k
}

/// A block key: prefix, last timestamp, sequence number.
pub fn block_key(prefix: &[u8], last_ts: i64, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 16);
    k.extend_from_slice(prefix);
    put_ts(&mut k, last_ts);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Bytes of a head key before its GPU: the kind byte, the hour and the
/// GPU's seal phase.
pub const HEAD_GPU_AT: usize = 11;

/// Start of an hour's run of head keys: `'g' · hour`.
pub fn head_hour(hour: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(HEAD_GPU_AT);
    k.push(KIND_GPU);
    put_ts(&mut k, hour);
    k
}

/// Start of the head keys of an hour's GPUs whose seal phase is `phase`
/// or later: `'g' · hour · phase`.
pub fn head_phase(hour: i64, phase: u16) -> Vec<u8> {
    let mut k = head_hour(hour);
    k.extend_from_slice(&phase.to_be_bytes());
    k
}

/// The place of the GPU `gpu` (tenant · gpu) in the order in which an
/// hour's GPUs are sealed, out of 65,536: the top bits of an FNV-1a hash
/// of its head GPU prefix (`'g' · tenant · gpu`) run through MurmurHash3's
/// 64-bit finalizer (FNV's top bits barely move between names that differ
/// only in their last characters), stable across builds,
/// processes and restarts, and spread evenly over any fleet. The seal
/// spreads GPUs over its span by this phase (`fold::phase`), and head keys
/// carry it before the GPU, so an hour's GPUs are sealed in key order.
pub fn seal_phase(gpu: &[u8]) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(&KIND_GPU).chain(gpu) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h >> 48) as u16
}

/// The seal phase a head key carries; `None` when it is too short.
pub fn head_key_phase(key: &[u8]) -> Option<u16> {
    let b: [u8; 2] = key.get(HEAD_GPU_AT - 2..HEAD_GPU_AT)?.try_into().ok()?;
    Some(u16::from_be_bytes(b))
}

/// Prefix of one GPU's head bundles of one hour: `'g' · hour · phase ·
/// tenant · gpu`, `gpu` being `tenant · gpu` (an [`ofu_prefix`]).
pub fn head_prefix(hour: i64, gpu: &[u8]) -> Vec<u8> {
    let mut k = head_phase(hour, seal_phase(gpu));
    k.extend_from_slice(gpu);
    k
}

/// Key of a GPU's head bundle whose latest sample is at `last_ts`: in the
/// run of that sample's hour.
pub fn head_key(gpu: &[u8], last_ts: i64, seq: u64) -> Vec<u8> {
    block_key(
        &head_prefix(super::hours::window_of(last_ts), gpu),
        last_ts,
        seq,
    )
}

/// Time bounds for scanning a series prefix from `start` on.
pub fn scan_bounds(prefix: &[u8], start: i64) -> (Vec<u8>, Vec<u8>) {
    let mut from = prefix.to_vec();
    put_ts(&mut from, start);
    let mut to = prefix.to_vec();
    to.extend_from_slice(&[0xff; 17]);
    (from, to)
}

/// Meta kind byte of an agent's acknowledged sequence number.
pub const META_AGENT: u8 = b'a';
/// Meta kind byte of a node record.
pub const META_NODE: u8 = b'n';
/// Meta kind byte of a GPU record.
pub const META_GPU: u8 = b'g';
/// Meta kind byte of a job-on-GPU record.
pub const META_JOB: u8 = b'j';
/// Meta kind byte of an event (regression, straggler, MFU mismatch).
pub const META_EVENT: u8 = b'e';
/// Meta kind byte of an agent's held sequence ranges (membership).
pub const META_HELD: u8 = b'm';
/// Kind byte of a limbo batch record (in the `limbo` family).
pub const LIMBO_RECORD: u8 = b'b';
/// The meta key of the store's format version (see `format`).
pub const FORMAT: &[u8] = b"~format";
/// The meta key of this store's id (see `Store::store_id`).
pub const STORE_ID: &[u8] = b"~store_id";

/// Kind byte of raw blocks in the head and rollups.
pub const KIND_RAW: u8 = b'r';
/// Kind byte of OFU blocks in the head and rollups.
pub const KIND_OFU: u8 = b'o';
/// Kind byte of GPU blocks (a batch's blocks of one GPU) in the head.
pub const KIND_GPU: u8 = b'g';
/// Kind byte of a GPU-hour's minute lasts in the rollup family
/// (`lasts.rs`).
pub const KIND_LAST: u8 = b'l';
/// Kind byte of a GPU-hour's job figures in the rollup family
/// (`job_hours.rs`).
pub const KIND_JOBS: u8 = b'j';

/// Prefix of a series in the `head` and `rollup` families: a kind byte,
/// then the series prefix of its own family.
pub fn kind_prefix(kind: u8, prefix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 1);
    k.push(kind);
    k.extend_from_slice(prefix);
    k
}

/// Length of the series prefix at the start of a key of `cf` (`raw`,
/// `ofu`, `head`, `rollup`), and the tenant; `None` when malformed.
pub fn series_prefix(cf: super::Cf, key: &[u8]) -> Option<(usize, &str)> {
    use super::Cf;
    let (mut pos, strings) = match cf {
        Cf::Raw => (0, 3),
        Cf::Ofu => (0, 2),
        Cf::Head | Cf::Limbo if key.first() == Some(&KIND_GPU) => {
            key.get(..HEAD_GPU_AT)?;
            (HEAD_GPU_AT, 2)
        }
        Cf::Head | Cf::Rollup | Cf::Limbo => match *key.first()? {
            KIND_RAW => (1, 3),
            KIND_OFU | KIND_LAST | KIND_JOBS => (1, 2),
            _ => return None,
        },
        Cf::Meta | Cf::Journal | Cf::OpenSeries => return None,
    };
    let tenant_at = pos;
    for _ in 0..strings {
        get_str(key, &mut pos)?;
    }
    let mut t = tenant_at;
    let tenant = get_str(key, &mut t)?;
    Some((pos, tenant))
}

/// Last timestamp of a block key with a series prefix of `prefix_len`.
pub fn key_ts(key: &[u8], prefix_len: usize) -> Option<i64> {
    get_ts(key.get(prefix_len..)?)
}

/// A meta key of `kind` over string parts.
pub fn meta_key(kind: u8, parts: &[&str]) -> Vec<u8> {
    let mut k = vec![kind];
    for p in parts {
        put_str(&mut k, p);
    }
    k
}

/// `[from, to)` covering every meta key of `kind` that starts with `parts`.
pub fn meta_range(kind: u8, parts: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let from = meta_key(kind, parts);
    let mut to = from.clone();
    to.push(0xff);
    // Length prefixes are ≤ 255 so no real key extends `from` with 0xff
    // followed by more than 255 bytes; append enough 0xff to be safe.
    to.extend_from_slice(&[0xff; 256]);
    (from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_order_is_byte_order() {
        let mut prev = Vec::new();
        for t in [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX] {
            let mut k = Vec::new();
            put_ts(&mut k, t);
            assert!(k > prev);
            assert_eq!(get_ts(&k), Some(t));
            prev = k;
        }
    }

    #[test]
    fn tenants_never_share_prefixes() {
        // "ab" + "c" vs "a" + "bc": length prefixes keep them apart.
        assert_ne!(raw_prefix("ab", "c", "m"), raw_prefix("a", "bc", "m"));
        let (from, to) = scan_bounds(&raw_prefix("a", "g", "m"), 0);
        let other = block_key(&raw_prefix("a", "g", "m2"), 5, 1);
        assert!(!(other >= from && other < to));
    }

    #[test]
    fn head_keys_lead_with_their_hour() {
        use crate::hours::WINDOW_MS;
        let h = 1_700_000_000_000 / WINDOW_MS * WINDOW_MS;
        let (a, z) = {
            let a = ofu_prefix("t", "GPU-a");
            let z = ofu_prefix("t", "GPU-z");
            // `a` is the GPU sealed first.
            if seal_phase(&a) <= seal_phase(&z) {
                (a, z)
            } else {
                (z, a)
            }
        };
        // Every GPU's bundles of an hour sort before any of the next hour.
        let late_a = head_key(&a, h + WINDOW_MS - 1, 9);
        let early_z = head_key(&z, h, 0);
        let next_a = head_key(&a, h + WINDOW_MS, 0);
        assert!(head_key(&a, h, 0) < late_a && late_a < early_z && early_z < next_a);
        assert!(late_a.starts_with(&head_prefix(h, &a)));
        assert!(next_a.starts_with(&head_prefix(h + WINDOW_MS, &a)));
        // The parse finds the GPU's prefix, its tenant and the time after it.
        let (plen, tenant) = series_prefix(super::super::Cf::Head, &late_a).unwrap();
        assert_eq!((plen, tenant), (head_prefix(h, &a).len(), "t"));
        assert_eq!(&late_a[HEAD_GPU_AT..plen], &a[..]);
        assert_eq!(key_ts(&late_a, plen), Some(h + WINDOW_MS - 1));
        assert_eq!(head_key_phase(&late_a), Some(seal_phase(&a)));
        assert!(late_a.starts_with(&head_phase(h, seal_phase(&a))));
        // A head key cut inside its hour is malformed, not misread.
        assert_eq!(series_prefix(super::super::Cf::Head, &late_a[..5]), None);
        assert_eq!(series_prefix(super::super::Cf::Head, &late_a[..10]), None);
    }

    #[test]
    fn an_hours_gpus_sort_in_the_order_they_are_sealed() {
        use crate::hours::WINDOW_MS;
        let h = 1_700_000_000_000 / WINDOW_MS * WINDOW_MS;
        let mut gpus: Vec<Vec<u8>> = (0..2000)
            .map(|i| ofu_prefix(&format!("tenant-{}", i % 7), &format!("GPU-{i}")))
            .collect();
        let mut keys: Vec<Vec<u8>> = gpus.iter().map(|g| head_key(g, h + 5, 0)).collect();
        keys.sort();
        gpus.sort_by_key(|g| seal_phase(g));
        let phases: Vec<u16> = keys.iter().map(|k| head_key_phase(k).unwrap()).collect();
        let sealed: Vec<u16> = gpus.iter().map(|g| seal_phase(g)).collect();
        assert_eq!(phases, sealed, "key order is seal order");
        // Spread over the phases: each eighth holds 9 to 16 % of the GPUs,
        // whatever their tenants.
        for q in 0..8u32 {
            let n = sealed
                .iter()
                .filter(|p| (u32::from(**p) * 8) >> 16 == q)
                .count();
            assert!((180..=320).contains(&n), "eighth {q}: {n}");
        }
    }
}
