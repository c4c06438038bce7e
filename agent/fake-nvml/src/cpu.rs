//! The CPU time the fake library's own calls take: the cost of simulating
//! the hardware, which a real driver does not have. Every exported call is
//! timed on its thread's CPU clock; with `cpu_report=PATH` the running
//! total (nanoseconds) is written to PATH at most once a second, so that a
//! benchmark can subtract it from the agent's CPU time.

use crate::config::{FakeConfig, ENV_VAR};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// CPU nanoseconds spent inside exported calls so far.
static SPENT_NS: AtomicU64 = AtomicU64::new(0);

/// The report file and when it was last written.
type Report = Mutex<(PathBuf, Option<Instant>)>;
static REPORT: OnceLock<Option<Report>> = OnceLock::new();

/// This thread's CPU time, ns (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // every Linux kernel supports.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CPU nanoseconds the library's calls have taken so far.
pub fn spent_ns() -> u64 {
    SPENT_NS.load(Ordering::Relaxed)
}

/// Adds one call's CPU time, then writes the report if one is due.
pub fn account(ns: u64) {
    let total = SPENT_NS.fetch_add(ns, Ordering::Relaxed) + ns;
    let report = REPORT.get_or_init(|| {
        let spec = std::env::var(ENV_VAR).unwrap_or_default();
        FakeConfig::parse(&spec)
            .ok()
            .and_then(|c| c.cpu_report)
            .map(|p| Mutex::new((p, None)))
    });
    let Some(report) = report else { return };
    let Ok(mut r) = report.try_lock() else { return };
    if r.1.is_some_and(|t| t.elapsed().as_secs() < 1) {
        return;
    }
    r.1 = Some(Instant::now());
    // A failed write only loses one report; the next second tries again.
    let _ = std::fs::write(&r.0, format!("{total}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_grows_with_work() {
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns() > a);
        let before = spent_ns();
        account(5);
        assert!(spent_ns() >= before + 5);
    }
}
