//! The compactor's writes, applied at ingest's priority.
//!
//! The compactor reads and encodes on a thread at a lower CPU priority
//! (`compactor.rs`), but its writes go through the same write queue as
//! ingest's commits: RocksDB writes a group of batches together, the
//! group's leader switches full memtables under the database's mutex, and
//! the group ends when every member has inserted its part. A low-priority
//! thread that is preempted there (on two busy cores a nice +10 thread
//! waits tens of milliseconds to run again) holds up every commit queued
//! behind it. Measured with `flopwatch-bench fleet --agents 10000` across an
//! hour's seal: while the pass ran, the agents' ack p99 went from 15 ms to
//! 0.3–2.3 s (docs/BENCHMARKS.md, fleet).
//!
//! [`HandOff`] is an [`Engine`] that reads through the engine it wraps on
//! the caller's thread and hands every write to [`Writer`]'s thread, which
//! runs at the process' own priority: the low-priority thread then waits
//! for its writes without holding anything ingest needs.

use super::{Cf, Engine, Op, Step, StoreError, View};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

/// A job for a [`jobs_thread`].
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Starts a thread named `name` that runs `setup` and then each job sent
/// to it, one at a time; an error when the system refuses a thread. A job's
/// panic is the job's (its caller sees its answer dropped), not the
/// thread's: the next job still runs.
pub(super) fn jobs_thread(name: &str, setup: fn()) -> std::io::Result<SyncSender<Job>> {
    let (jobs, queue) = sync_channel::<Job>(1);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            setup();
            for job in queue {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })?;
    Ok(jobs)
}

/// A thread that applies writes for a lower-priority one.
#[derive(Debug, Clone)]
pub(super) struct Writer {
    jobs: SyncSender<Job>,
}

impl Writer {
    /// Starts the thread (at the calling thread's priority); `None`
    /// (logged) when the system refuses one.
    pub(super) fn start() -> Option<Self> {
        match jobs_thread("flopwatch-compact-write", || {}) {
            Ok(jobs) => Some(Self { jobs }),
            Err(e) => {
                tracing::warn!(error = %e, "no compaction writer thread; the compactor writes itself");
                None
            }
        }
    }

    /// Runs `f` on the writer's thread and waits for its answer.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = sync_channel(1);
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .ok()?;
        rx.recv().ok()
    }
}

/// An engine whose writes run on a [`Writer`]'s thread.
pub(super) struct HandOff {
    inner: Arc<dyn Engine>,
    writer: Writer,
}

impl HandOff {
    pub(super) fn new(inner: Arc<dyn Engine>, writer: Writer) -> Self {
        Self { inner, writer }
    }

    fn write_with(
        &self,
        f: impl FnOnce(&dyn Engine) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        self.writer
            .run(move || f(inner.as_ref()))
            .unwrap_or_else(|| Err(StoreError::Engine("the compaction writer stopped".into())))
    }
}

impl Engine for HandOff {
    fn apply(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        self.write_with(move |e| e.apply(ops, sync))
    }

    fn delete_range(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        let (from, to) = (from.to_vec(), to.to_vec());
        self.write_with(move |e| e.delete_range(cf, &from, &to))
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

    fn compact_fully(&self, cf: Cf, max_bytes: u64) -> Result<bool, StoreError> {
        self.inner.compact_fully(cf, max_bytes)
    }

    fn expire_by_compaction(&self, expired: std::sync::Arc<super::Expiry>) -> bool {
        self.inner.expire_by_compaction(expired)
    }

    fn family_bytes(&self, cf: Cf) -> u64 {
        self.inner.family_bytes(cf)
    }

    fn last_key(&self, cf: Cf, from: &[u8], to: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.last_key(cf, from, to)
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

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }

    fn backlog(&self) -> super::Backlog {
        self.inner.backlog()
    }

    fn files(&self, cf: Cf) -> Vec<super::FileStat> {
        self.inner.files(cf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tap::{caller, Tap};

    #[test]
    fn writes_run_on_the_writer_thread_and_reads_see_them() {
        let inner = Arc::new(Tap::default());
        let e = HandOff::new(inner.clone(), Writer::start().expect("a thread"));
        e.apply(vec![Op::Put(Cf::Head, b"a".to_vec(), b"1".to_vec())], false)
            .unwrap();
        e.write(vec![(Cf::Head, b"b".to_vec(), b"2".to_vec())], false)
            .unwrap();
        e.delete_range(Cf::Head, b"a", b"b").unwrap();
        assert_eq!(e.get(Cf::Head, b"a").unwrap(), None);
        assert_eq!(e.get(Cf::Head, b"b").unwrap(), Some(b"2".to_vec()));
        let writes = inner.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 3);
        assert!(writes.iter().all(|c| c.name == "flopwatch-compact-write"));
        // At the priority of the thread that started the writer.
        assert!(writes.iter().all(|c| c.nice == caller().nice));
    }

    #[test]
    fn an_engine_error_comes_back_to_the_caller() {
        let inner = Arc::new(Tap::default());
        *inner.fail.lock().unwrap() = Some("no space left".into());
        let e = HandOff::new(inner, Writer::start().unwrap());
        let r = e.apply(vec![], false);
        assert!(matches!(r, Err(StoreError::Engine(m)) if m == "no space left"));
    }
}
