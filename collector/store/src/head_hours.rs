//! The hours in which the head holds bundles, kept in memory.
//!
//! The head's keys lead with the hour ([`super::gpu_block`]), so a reader
//! of one GPU goes hour by hour. Found on disk, the next hour the head
//! holds is a seek to the hour's first key — and while that hour is being
//! sealed GPU by GPU, the first key still there comes after the deleted
//! bundles of every GPU sealed so far, which the seek steps over one by
//! one until RocksDB compacts them away. A seal reading a GPU's tensor
//! activity and clocks did that three times per GPU-hour, so sealing an
//! hour cost the square of its GPUs (docs/BENCHMARKS.md, sustained
//! ingest). With the hours known, a reader seeks straight to the GPU's
//! run in each.
//!
//! Invariant: every hour holding a bundle that was acknowledged (or
//! otherwise written before a reader started) is in the set. The set may
//! hold more: an hour whose bundles have all been sealed costs a reader
//! one seek that finds nothing.
//!
//! * Loaded from the engine when first asked for (one walk over the
//!   hours), under the write lock.
//! * A write to the head adds its hours **after** the write and before the
//!   write's caller returns (so before the batch is acknowledged).
//! * An hour leaves the set only once the engine holds nothing in it,
//!   checked under the write lock ([`HeadHours::forget_empty`]); a write
//!   landing after that check adds the hour back before it returns, since
//!   its own addition waits for the lock and then finds the hour gone.

use super::gpu_block::{self, BundleHours};
use super::hours::WINDOW_MS;
use super::keys;
use super::{Cf, Engine, StoreError};
use std::collections::BTreeSet;
use std::sync::RwLock;

/// The head's hours (module docs).
#[derive(Debug, Default)]
pub(super) struct HeadHours {
    /// `None` until loaded.
    set: RwLock<Option<BTreeSet<i64>>>,
}

impl HeadHours {
    /// The hours to read the head's bundles in, loading the set first if
    /// needed. A failed load falls back to seeking (and is retried next
    /// time).
    pub(super) fn held(&self, engine: &dyn Engine) -> BundleHours {
        if let Some(set) = self.set.read().ok().and_then(|g| g.clone()) {
            return BundleHours::Held(set.into_iter().collect());
        }
        let Ok(mut g) = self.set.write() else {
            return BundleHours::Discover;
        };
        if g.is_none() {
            match load(engine) {
                Ok(set) => *g = Some(set),
                Err(e) => {
                    tracing::warn!(error = %e, "head hours not loaded; readers seek them");
                    return BundleHours::Discover;
                }
            }
        }
        g.as_ref().map_or(BundleHours::Discover, |s| {
            BundleHours::Held(s.iter().copied().collect())
        })
    }

    /// Bundles of these hours were written to the head (called after the
    /// write, before its caller returns). Nothing to do before the set is
    /// loaded: the load reads the write.
    pub(super) fn written(&self, hours: impl IntoIterator<Item = i64>) {
        let mut missing: Vec<i64> = Vec::new();
        if let Ok(g) = self.set.read() {
            let Some(set) = g.as_ref() else { return };
            missing.extend(hours.into_iter().filter(|h| !set.contains(h)));
        }
        if missing.is_empty() {
            return;
        }
        if let Ok(mut g) = self.set.write() {
            if let Some(set) = g.as_mut() {
                set.extend(missing);
            }
        }
    }

    /// Forgets the hours before `before` in which the engine holds no
    /// bundle any more.
    pub(super) fn forget_empty(&self, engine: &dyn Engine, before: i64) -> Result<(), StoreError> {
        let Ok(mut g) = self.set.write() else {
            return Ok(());
        };
        let Some(set) = g.as_mut() else {
            return Ok(());
        };
        let old: Vec<i64> = set.range(..before).copied().collect();
        for h in old {
            if !holds(engine, h)? {
                set.remove(&h);
            }
        }
        Ok(())
    }
}

/// Whether the head holds a key of the hour starting at `hour`.
fn holds(engine: &dyn Engine, hour: i64) -> Result<bool, StoreError> {
    let to = match hour.checked_add(WINDOW_MS) {
        Some(next) => keys::head_hour(next),
        None => vec![keys::KIND_GPU + 1],
    };
    let mut found = false;
    engine.scan(Cf::Head, &keys::head_hour(hour), &to, &mut |_, _| {
        found = true;
        false
    })?;
    Ok(found)
}

/// Every hour the head holds a key in.
fn load(engine: &dyn Engine) -> Result<BTreeSet<i64>, StoreError> {
    let mut set = BTreeSet::new();
    engine.view(&mut |view| {
        let mut hour = i64::MIN;
        while let Some(h) = gpu_block::next_hour(view, Cf::Head, hour)? {
            set.insert(h);
            match h.checked_add(WINDOW_MS) {
                Some(next) => hour = next,
                None => break,
            }
        }
        Ok(())
    })?;
    Ok(set)
}

/// The hours of the head keys among `keys` (each `'g' · hour · …`).
pub(super) fn of_keys<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> BTreeSet<i64> {
    keys.into_iter()
        .filter(|k| k.first() == Some(&keys::KIND_GPU))
        .filter_map(|k| keys::get_ts(k.get(1..)?))
        .collect()
}
