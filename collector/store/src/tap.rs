//! A test engine that forwards to another and records how it was used:
//! the thread of every write and read, the walks, the entries scanned and
//! walked, the ranges compacted, and an error to answer writes with.

use super::memory::MemEngine;
use super::{Cf, Engine, Op, Step, StoreError, View};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Where an engine call ran: the thread's name and nice value.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Caller {
    pub name: String,
    pub nice: i32,
}

/// The calling thread.
pub(super) fn caller() -> Caller {
    let t = std::thread::current();
    Caller {
        name: t.name().unwrap_or("").to_string(),
        nice: rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0),
    }
}

/// A family and a key range of it.
pub(super) type Range = (Cf, Vec<u8>, Vec<u8>);

/// `inner`, recorded.
pub(super) struct Tap {
    inner: Arc<dyn Engine>,
    pub writes: Mutex<Vec<Caller>>,
    pub reads: Mutex<Vec<Caller>>,
    walks: AtomicUsize,
    /// Entries handed to `scan`'s callers.
    scanned: AtomicUsize,
    /// Entries handed to `walk`'s callers.
    walked: AtomicUsize,
    /// The ranges `compact_range` was asked for.
    pub compactions: Mutex<Vec<Range>>,
    /// Every write fails with this.
    pub fail: Mutex<Option<String>>,
}

impl Default for Tap {
    /// Over memory.
    fn default() -> Self {
        Self::new(Arc::new(MemEngine::new()))
    }
}

impl Tap {
    pub(super) fn new(inner: Arc<dyn Engine>) -> Self {
        Self {
            inner,
            writes: Mutex::default(),
            reads: Mutex::default(),
            walks: AtomicUsize::new(0),
            scanned: AtomicUsize::new(0),
            walked: AtomicUsize::new(0),
            compactions: Mutex::default(),
            fail: Mutex::default(),
        }
    }

    /// Walks so far.
    pub(super) fn walks(&self) -> usize {
        self.walks.load(Ordering::SeqCst)
    }

    /// Entries walks have handed out so far.
    pub(super) fn walked(&self) -> usize {
        self.walked.load(Ordering::SeqCst)
    }

    /// Entries scans have handed out so far.
    pub(super) fn scanned(&self) -> usize {
        self.scanned.load(Ordering::SeqCst)
    }

    fn wrote(&self) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push(caller());
        match self.fail.lock().unwrap().clone() {
            Some(m) => Err(StoreError::Engine(m)),
            None => Ok(()),
        }
    }
}

impl Engine for Tap {
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        self.wrote()?;
        self.inner.apply(ops, sync)
    }
    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.wrote()?;
        self.inner.delete_range(cf, from, to)
    }
    fn view(
        &self,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.reads.lock().unwrap().push(caller());
        self.inner.view(f)
    }
    fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.reads.lock().unwrap().push(caller());
        self.inner.scan(cf, from, to, &mut |k, v| {
            self.scanned.fetch_add(1, Ordering::SeqCst);
            f(k, v)
        })
    }
    fn walk(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), StoreError> {
        self.walks.fetch_add(1, Ordering::SeqCst);
        self.reads.lock().unwrap().push(caller());
        self.inner.walk(cf, from, to, &mut |k, v| {
            self.walked.fetch_add(1, Ordering::SeqCst);
            f(k, v)
        })
    }
    fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.compactions
            .lock()
            .unwrap()
            .push((cf, from.to_vec(), to.to_vec()));
        self.inner.compact_range(cf, from, to)
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(cf, key)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }
}
