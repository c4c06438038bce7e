//! An in-memory engine with the same semantics as RocksDB's: ordered keys,
//! atomic write batches. For tests and for the conformance suite.

use super::{Cf, Engine, Put, StoreError};
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

impl Engine for MemEngine {
    fn write(&self, puts: Vec<Put>, _sync: bool) -> Result<(), StoreError> {
        let mut maps = self.maps.write().map_err(poisoned)?;
        for (cf, k, v) in puts {
            maps.entry(cf).or_default().insert(k, v);
        }
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
        if from >= to {
            return Ok(());
        }
        let maps = self.maps.read().map_err(poisoned)?;
        if let Some(m) = maps.get(&cf) {
            for (k, v) in m.range(from.to_vec()..to.to_vec()) {
                if !f(k, v) {
                    break;
                }
            }
        }
        Ok(())
    }

    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        if from >= to {
            return Ok(());
        }
        let mut maps = self.maps.write().map_err(poisoned)?;
        if let Some(m) = maps.get_mut(&cf) {
            let doomed: Vec<Vec<u8>> = m
                .range(from.to_vec()..to.to_vec())
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                m.remove(&k);
            }
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
