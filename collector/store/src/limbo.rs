//! Limbo: batches that another collector may hold too.
//!
//! An agent flags a batch `uncertain` when it resends it after the
//! collector it was on the wire to failed without acknowledging it (that
//! collector may have committed it just before). Such a batch is committed
//! durably and acknowledged as usual, but its blocks and events go to the
//! `limbo` family instead of `head` and `meta`, under the very keys they
//! would have there, with one record per batch:
//!
//! | CF      | key                                    | value |
//! |---------|----------------------------------------|-------|
//! | `limbo` | `g`… (a head bundle's key)             | the bundle, as it would be in `head` |
//! | `limbo` | `e`… (an event's meta key)             | the event, as it would be in `meta` |
//! | `limbo` | `b` · tenant · agent · boot · seq      | entered (unix ms, i64 BE) · the batch's keys |
//!
//! Reads scan `limbo` beside `head` and `meta` under the same snapshot, so
//! a batch in limbo is in every answer; the compactor never sees it. The
//! cluster's reconciler (the collector's cluster reconciler) then settles each batch with
//! one atomic write: [`Store::settle`] either deletes the limbo copy (a
//! peer holds the batch) or moves it to `head` and `meta` and adds its
//! number to the held ranges, which is exactly what a normal commit would
//! have written.

use super::keys::{self, get_str};
use super::membership::held_key;
use super::records::AgentKey;
use super::{corrupt, Cf, Op, Put, Store, StoreError, View};
use flopwatch_proto::cluster::Holding;

/// A batch in limbo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimboBatch {
    /// Whose batch.
    pub agent: AgentKey,
    /// Its sequence number.
    pub seq: u64,
    /// When it was committed into limbo, unix ms.
    pub since_ms: i64,
}

/// How a batch in limbo is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Another collector holds it: delete this copy.
    Drop,
    /// No other collector holds it: store it as a normal commit.
    Keep,
}

/// `b` · tenant · agent · boot · seq.
fn record_key(a: &AgentKey, seq: u64) -> Vec<u8> {
    let mut k = keys::meta_key(keys::LIMBO_RECORD, &[&a.tenant, &a.agent_id, &a.boot_id]);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn parse_record_key(k: &[u8]) -> Option<(AgentKey, u64)> {
    if k.first() != Some(&keys::LIMBO_RECORD) {
        return None;
    }
    let mut pos = 1;
    let tenant = get_str(k, &mut pos)?.to_string();
    let agent_id = get_str(k, &mut pos)?.to_string();
    let boot_id = get_str(k, &mut pos)?.to_string();
    let seq = u64::from_be_bytes(k.get(pos..)?.try_into().ok()?);
    Some((
        AgentKey {
            tenant,
            agent_id,
            boot_id,
        },
        seq,
    ))
}

/// The hour of a head block's key.
fn head_window(key: &[u8]) -> Option<i64> {
    let (plen, _) = keys::series_prefix(Cf::Head, key)?;
    keys::key_ts(key, plen).map(super::hours::window_of)
}

/// The family a limbo key settles into: blocks to `head`, events to
/// `meta`.
fn destination(key: &[u8]) -> Option<Cf> {
    match *key.first()? {
        keys::KIND_GPU => Some(Cf::Head),
        keys::META_EVENT => Some(Cf::Meta),
        _ => None,
    }
}

/// Rewrites the keys every limbo record names with `rekey` (those it
/// maps; the others stay), a batch of records per write. For a change of
/// the head's key layout (`format.rs`): the bundles themselves are moved
/// by the caller.
pub(crate) fn rekey_records(
    engine: &dyn super::Engine,
    rekey: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    batch: usize,
) -> Result<(), StoreError> {
    let mut start = vec![keys::LIMBO_RECORD];
    loop {
        let mut ops = Vec::new();
        let mut last = None;
        let mut bad = None;
        engine.scan(Cf::Limbo, &start, &[keys::LIMBO_RECORD + 1], &mut |k, v| {
            last = Some(k.to_vec());
            let Some((since, names)) = decode_record(v) else {
                bad = Some(corrupt(Cf::Limbo, "record"));
                return false;
            };
            let moved: Vec<Vec<u8>> = names
                .iter()
                .map(|n| rekey(n).unwrap_or_else(|| n.clone()))
                .collect();
            if moved != names {
                let refs: Vec<&[u8]> = moved.iter().map(Vec::as_slice).collect();
                ops.push(Op::Put(Cf::Limbo, k.to_vec(), encode_record(since, &refs)));
            }
            ops.len() < batch
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        let Some(mut next) = last else {
            return Ok(());
        };
        if !ops.is_empty() {
            engine.apply(ops, true)?;
        }
        next.push(0);
        start = next;
    }
}

fn encode_record(since_ms: i64, keys: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::with_capacity(12 + keys.iter().map(|k| k.len() + 2).sum::<usize>());
    v.extend_from_slice(&since_ms.to_be_bytes());
    for k in keys {
        // Keys are built from ≤ 255-byte strings: far below u16::MAX.
        v.extend_from_slice(&(k.len() as u16).to_le_bytes());
        v.extend_from_slice(k);
    }
    v
}

fn decode_record(v: &[u8]) -> Option<(i64, Vec<Vec<u8>>)> {
    let since = i64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let mut keys = Vec::new();
    let mut pos = 8;
    while pos < v.len() {
        let len = u16::from_le_bytes(v.get(pos..pos + 2)?.try_into().ok()?) as usize;
        keys.push(v.get(pos + 2..pos + 2 + len)?.to_vec());
        pos += 2 + len;
    }
    Some((since, keys))
}

/// Point lookup through a view.
fn view_get(view: &dyn View, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    let mut to = key.to_vec();
    to.push(0);
    let mut out = None;
    view.scan(cf, key, &to, &mut |_, v| {
        out = Some(v.to_vec());
        false
    })?;
    Ok(out)
}

impl Store {
    /// Turns a commit's puts into a limbo commit: blocks and events move
    /// to the `limbo` family under the same keys, and the batch's record
    /// lists them.
    pub(super) fn limbo_puts(&self, a: &AgentKey, seq: u64, now_ms: i64, puts: &mut [Put]) -> Put {
        let mut moved: Vec<&[u8]> = Vec::new();
        for (cf, k, _) in puts.iter_mut() {
            if destination(k) == Some(*cf) {
                *cf = Cf::Limbo;
                moved.push(k);
            }
        }
        (Cf::Limbo, record_key(a, seq), encode_record(now_ms, &moved))
    }

    /// Batches in limbo (at most `limit`, in key order) and how many there
    /// are in all.
    pub fn limbo(&self, limit: usize) -> Result<(Vec<LimboBatch>, usize), StoreError> {
        let (from, to) = ([keys::LIMBO_RECORD], [keys::LIMBO_RECORD + 1]);
        let mut out = Vec::new();
        let mut total = 0;
        let mut bad = None;
        self.engine.scan(Cf::Limbo, &from, &to, &mut |k, v| {
            total += 1;
            if out.len() < limit {
                match (parse_record_key(k), decode_record(v)) {
                    (Some((agent, seq)), Some((since_ms, _))) => out.push(LimboBatch {
                        agent,
                        seq,
                        since_ms,
                    }),
                    _ => bad = Some(k.to_vec()),
                }
            }
            true
        })?;
        if let Some(k) = bad {
            tracing::warn!(key = ?k, "malformed limbo record skipped");
        }
        Ok((out, total))
    }

    /// Whether this collector holds batch `seq` of `a`: as a normal commit
    /// (its held ranges), in limbo, or not at all. One consistent view, so
    /// a batch being settled is seen on one side of it.
    pub fn holding(&self, a: &AgentKey, seq: u64) -> Result<Holding, StoreError> {
        let mut answer = Holding::Absent;
        self.engine.view(&mut |view| {
            if let Some(v) = view_get(view, Cf::Meta, &held_key(a))? {
                let r = super::membership::SeqRanges::decode(&v)
                    .ok_or_else(|| corrupt(Cf::Meta, "held ranges"))?;
                if r.contains(seq) {
                    answer = Holding::Held;
                    return Ok(());
                }
            }
            if view_get(view, Cf::Limbo, &record_key(a, seq))?.is_some() {
                answer = Holding::Limbo;
            }
            Ok(())
        })?;
        Ok(answer)
    }

    /// Settles batch `seq` of `a` in one atomic write; false when it is
    /// not (or no longer) in limbo.
    pub fn settle(&self, a: &AgentKey, seq: u64, how: Settle) -> Result<bool, StoreError> {
        let _stripe = self.stripes.lock(a);
        let rkey = record_key(a, seq);
        let Some(rec) = self.engine.get(Cf::Limbo, &rkey)? else {
            return Ok(false);
        };
        let (_, keys) = decode_record(&rec).ok_or_else(|| corrupt(Cf::Limbo, "limbo record"))?;
        let mut ops = Vec::with_capacity(keys.len() * 2 + 2);
        for k in keys {
            if how == Settle::Keep {
                match (destination(&k), self.engine.get(Cf::Limbo, &k)?) {
                    (Some(cf), Some(v)) => ops.push(Op::Put(cf, k.clone(), v)),
                    _ => {
                        tracing::warn!(key = ?k, seq, "limbo entry missing or malformed; not kept")
                    }
                }
            }
            ops.push(Op::Delete(Cf::Limbo, k));
        }
        ops.push(Op::Delete(Cf::Limbo, rkey));
        if how == Settle::Keep {
            let (cf, k, v) = self.held_put(a, seq)?;
            ops.push(Op::Put(cf, k, v));
        }
        let head = ops
            .iter()
            .filter_map(|op| match op {
                Op::Put(Cf::Head, k, _) => head_window(k),
                _ => None,
            })
            .min();
        let hours = super::head_hours::of_keys(ops.iter().filter_map(|op| match op {
            Op::Put(Cf::Head, k, _) => Some(k.as_slice()),
            _ => None,
        }));
        self.engine.apply(ops, self.sync)?;
        self.head_hours.written(hours);
        if let Some(w) = head {
            self.head_written(w);
        }
        Ok(true)
    }

    /// This store's id: random, made when first asked and kept in `meta`
    /// (`~store_id`). Two collectors holding one batch in limbo compare
    /// ids: the higher lets its copy go. Asked once at start (not safe to
    /// race with itself on a new store).
    pub fn store_id(&self) -> Result<u64, StoreError> {
        if let Some(v) = self.engine.get(Cf::Meta, keys::STORE_ID)? {
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| corrupt(Cf::Meta, "store id"))?;
            return Ok(u64::from_be_bytes(b));
        }
        let id = random_u64();
        self.engine.write(
            vec![(Cf::Meta, keys::STORE_ID.to_vec(), id.to_be_bytes().to_vec())],
            true,
        )?;
        Ok(id)
    }
}

/// 64 random bits from the kernel's UUID source, mixed with the time and
/// the process id (SHA-256) where it is missing.
fn random_u64() -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(std::fs::read("/proc/sys/kernel/random/uuid").unwrap_or_default());
    h.update(std::process::id().to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(now.to_le_bytes());
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let a = AgentKey {
            tenant: "t".into(),
            agent_id: "agent".into(),
            boot_id: "boot".into(),
        };
        let k = record_key(&a, 42);
        assert_eq!(parse_record_key(&k), Some((a, 42)));
        let keys: Vec<&[u8]> = vec![b"r-one", b"o-two", b"e"];
        let v = encode_record(-5, &keys);
        let (since, back) = decode_record(&v).unwrap();
        assert_eq!(since, -5);
        assert_eq!(back, keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>());
        assert_eq!(decode_record(&v[..v.len() - 1]), None, "torn key list");
        // Per-series head keys are no layout of format 1.
        assert_eq!(destination(b"rx"), None);
        assert_eq!(destination(b"ox"), None);
        assert_eq!(destination(b"gx"), Some(Cf::Head));
        assert_eq!(destination(b"ex"), Some(Cf::Meta));
        assert_eq!(destination(b"nx"), None);
    }
}
