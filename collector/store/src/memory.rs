//! An in-memory engine with the same semantics as RocksDB's: ordered keys,
//! atomic write batches. For tests and for the conformance suite.

use super::{Cf, Engine, Op, StoreError, View};
use std::collections::BTreeMap;
use std::sync::RwLock;

/// One column family's ordered keys.
type Family = BTreeMap<Vec<u8>, Vec<u8>>;

/// Ordered maps behind a lock.
#[derive(Default)]
pub struct MemEngine {
    maps: RwLock<BTreeMap<Cf, Family>>,
}

impl MemEngine {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Engine("memory engine lock poisoned".into())
}

fn scan_maps(
    maps: &BTreeMap<Cf, Family>,
    cf: Cf,
    from: &[u8],
    to: &[u8],
    f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
) {
    if from >= to {
        return;
    }
    if let Some(m) = maps.get(&cf) {
        for (k, v) in m.range(from.to_vec()..to.to_vec()) {
            if !f(k, v) {
                break;
            }
        }
    }
}

/// A view holding the read lock: writers wait until it is dropped.
struct Locked<'a>(std::sync::RwLockReadGuard<'a, BTreeMap<Cf, Family>>);

impl View for Locked<'_> {
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        scan_maps(&self.0, cf, from, to, f);
        Ok(())
    }
}

impl Engine for MemEngine {
    fn apply(&self, ops: Vec<Op>, _sync: bool) -> Result<(), StoreError> {
        let mut maps = self.maps.write().map_err(poisoned)?;
        for op in ops {
            match op {
                Op::Put(cf, k, v) => {
                    maps.entry(cf).or_default().insert(k, v);
                }
                Op::Delete(cf, k) => {
                    if let Some(m) = maps.get_mut(&cf) {
                        m.remove(&k);
                    }
                }
                Op::DeleteRange(cf, from, to) => {
                    if let Some(m) = maps.get_mut(&cf) {
                        remove_range(m, &from, &to);
                    }
                }
            }
        }
        Ok(())
    }

    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let guard = self.maps.read().map_err(poisoned)?;
        f(&Locked(guard))
    }

    fn compact_range(&self, _cf: Cf, _from: &[u8], _to: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let maps = self.maps.read().map_err(poisoned)?;
        Ok(maps.get(&cf).and_then(|m| m.get(key)).cloned())
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let maps = self.maps.read().map_err(poisoned)?;
        scan_maps(&maps, cf, from, to, f);
        Ok(())
    }

    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        let mut maps = self.maps.write().map_err(poisoned)?;
        if let Some(m) = maps.get_mut(&cf) {
            remove_range(m, from, to);
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn disk_bytes(&self) -> u64 {
        0
    }
}

fn remove_range(m: &mut Family, from: &[u8], to: &[u8]) {
    if from >= to {
        return;
    }
    let doomed: Vec<Vec<u8>> = m
        .range(from.to_vec()..to.to_vec())
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        m.remove(&k);
    }
}
