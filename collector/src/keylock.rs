//! Async locks by key, made when first asked for and removed when nobody
//! holds or waits for them: two tasks wait for each other only when their
//! keys meet. The node-ownership claims of Hellos use them
//! ([`crate::state::Collector::claim`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::OwnedMutexGuard;

type Lock = Arc<tokio::sync::Mutex<()>>;

/// A set of keyed locks.
#[derive(Default)]
pub(crate) struct KeyLocks {
    locks: Mutex<HashMap<String, Lock>>,
}

/// Keys held (or, while [`KeyLocks::lock`] is pending, waited for); dropping
/// it releases them and forgets locks nobody else wants.
pub struct Held<'a> {
    set: &'a KeyLocks,
    keys: Vec<(String, Lock, Option<OwnedMutexGuard<()>>)>,
}

impl KeyLocks {
    /// Locks every key of `keys`, in sorted order (so two callers never
    /// hold one key each while waiting for the other's).
    pub(crate) async fn lock(&self, mut keys: Vec<String>) -> Held<'_> {
        keys.sort_unstable();
        keys.dedup();
        let mut held = Held {
            set: self,
            keys: Vec::with_capacity(keys.len()),
        };
        for key in keys {
            let lock = self
                .locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.clone())
                .or_default()
                .clone();
            // Registered before waiting: a caller that gives up while
            // waiting still forgets the lock on drop.
            held.keys.push((key, lock.clone(), None));
            let guard = lock.lock_owned().await;
            if let Some(k) = held.keys.last_mut() {
                k.2 = Some(guard);
            }
        }
        held
    }

    /// Locks currently known (held or waited for); the tests check that
    /// released locks are forgotten.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no lock is held or waited for.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut locks = self.set.locks.lock().unwrap_or_else(|e| e.into_inner());
        for (key, lock, guard) in self.keys.drain(..) {
            drop(guard);
            drop(lock);
            // New references are only taken under `locks`, so a count of 1
            // (the map's own) stays 1 until this removal.
            if locks.get(&key).is_some_and(|l| Arc::strong_count(l) == 1) {
                locks.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn shared_keys_wait_and_disjoint_keys_do_not() {
        let locks = Arc::new(KeyLocks::default());
        let a = locks.lock(vec!["n1".into(), "g1".into()]).await;
        // Disjoint keys: granted at once.
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock(vec!["n2".into()]))
            .await
            .expect("disjoint keys must not wait");
        // A shared key waits until `a` is dropped.
        let l = locks.clone();
        let c = tokio::spawn(async move {
            let _h = l.lock(vec!["g1".into(), "n3".into()]).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!c.is_finished(), "a shared key was granted twice");
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), c)
            .await
            .expect("waiter granted after release")
            .unwrap();
        drop(b);
        assert!(locks.is_empty(), "{} locks left", locks.len());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_nothing_behind() {
        let locks = KeyLocks::default();
        let a = locks.lock(vec!["k".into()]).await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(20), locks.lock(vec!["k".into()])).await;
        assert!(gave_up.is_err());
        drop(a);
        assert!(locks.is_empty(), "{} locks left", locks.len());
        // Duplicated keys are one lock, not a self-deadlock.
        let _d = tokio::time::timeout(
            Duration::from_secs(1),
            locks.lock(vec!["k".into(), "k".into()]),
        )
        .await
        .expect("duplicate keys");
    }
}
