//! A storage engine whose writes are slow: a stand-in for a saturated
//! disk, for `bench backpressure` only (never reachable from a config
//! file).
//!
//! Every write waits for its turn on one virtual device that completes a
//! write every `delay`, in arrival order, then goes to the real engine.
//! Reads are not slowed.

// The virtual device runs on the real monotonic clock.
#![allow(clippy::disallowed_types)]

use flopwatch_collector::store::{Cf, Engine, Op, Step, StoreError, View};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Wraps an engine; writes complete at most one per `delay`.
pub(super) struct SlowEngine {
    inner: Arc<dyn Engine>,
    delay: Duration,
    /// When the virtual device is free again.
    free_at: Mutex<Instant>,
}

impl SlowEngine {
    /// `inner`, with writes serialised at one per `delay`.
    pub(super) fn new(inner: Arc<dyn Engine>, delay: Duration) -> Self {
        Self {
            inner,
            delay,
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// Blocks until this write's slot on the virtual device has passed.
    fn wait_turn(&self) {
        let done = {
            let mut free = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*free).max(Instant::now());
            *free = start + self.delay;
            *free
        };
        std::thread::sleep(done.saturating_duration_since(Instant::now()));
    }
}

impl Engine for SlowEngine {
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        self.wait_turn();
        self.inner.apply(ops, sync)
    }

    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.inner.view(f)
    }

    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.inner.compact_range(cf, from, to)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(cf, key)
    }

    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.scan(cf, from, to, f)
    }

    fn walk(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), StoreError> {
        self.inner.walk(cf, from, to, f)
    }

    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.wait_turn();
        self.inner.delete_range(cf, from, to)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }

    fn backlog(&self) -> flopwatch_collector::store::Backlog {
        self.inner.backlog()
    }
}
