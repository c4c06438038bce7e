//! Thread CPU priorities: work that must not delay ingest (compaction,
//! query evaluation) runs on threads with a higher nice value, and work
//! that may wait for idle time (remote write's encoding) in the idle
//! scheduling class, so it uses the time ingest leaves.
//!
//! The crate's only `unsafe` code: the scheduling-class calls, which
//! rustix does not offer.

#![allow(unsafe_code)]

/// Lowers the calling thread's CPU priority to `nice` (on Linux a nice
/// value is a thread's own, set by its thread id); never raises it (a
/// process started niced further keeps its own). Refused (a sandbox
/// without the syscall, say): logged, and the thread runs as before.
pub fn lower_thread_priority(nice: i32, what: &str) {
    let tid = Some(rustix::thread::gettid());
    if rustix::process::getpriority_process(tid).is_ok_and(|now| now >= nice) {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(tid, nice) {
        tracing::warn!(error = %e, "{what} thread: cannot lower its CPU priority");
    }
}

/// Moves the calling thread into Linux's idle scheduling class
/// (`SCHED_IDLE`): it runs on CPU time no other thread wants, and a
/// thread of the normal class that wakes up takes the CPU from it at
/// once, where a high nice value still lets it finish its time slice (a
/// millisecond or more) ahead of the woken thread. For work that may fall
/// behind but must never delay ingest. Refused (or not Linux): lowered to
/// nice 19 instead.
pub fn idle_thread(what: &str) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler only reads `param`; pid 0 is the
        // calling thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
            return;
        }
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "{what} thread: idle scheduling class refused; nice 19 instead"
        );
    }
    lower_thread_priority(19, what);
}

/// Whether the calling thread is in the idle scheduling class.
pub fn is_idle_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments but the calling thread (pid 0).
        unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
    }
    #[cfg(not(target_os = "linux"))]
    false
}
