//! Thread CPU priorities: work that must not delay ingest (compaction,
//! query evaluation) runs on threads with a higher nice value, so it uses
//! the time ingest leaves.

/// Lowers the calling thread's CPU priority to `nice` (on Linux a nice
/// value is a thread's own, set by its thread id). Refused (a sandbox
/// without the syscall, say): logged, and the thread runs as before.
pub fn lower_thread_priority(nice: i32, what: &str) {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
        tracing::warn!(error = %e, "{what} thread: cannot lower its CPU priority");
    }
}
