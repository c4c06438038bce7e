//! The CPU time the fake library's own calls take: the cost of simulating
//! the hardware, which a real driver does not have. With `cpu_report=PATH`
//! one exported call in [`SAMPLE_EVERY`] is timed on its thread's CPU
//! clock (a system call, so timing every call would itself cost as much as
//! the simulation), less what an empty timed span reads (the clock reads'
//! own share), and the estimate of the total (nanoseconds) is written to
//! PATH at most once a second, and a benchmark subtracts it from the
//! agent's CPU time. The timing's own clock reads and the report's writes
//! are the library's work too (a real driver does neither), so they are
//! counted in the total. Without `cpu_report` nothing is timed.

// A fake driver times its own CPU cost on the real clock.
#![allow(clippy::disallowed_types)]

use crate::config::{FakeConfig, ENV_VAR};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// One call in this many is timed.
pub const SAMPLE_EVERY: u64 = 16;

/// CPU nanoseconds spent inside exported calls so far (estimated).
static SPENT_NS: AtomicU64 = AtomicU64::new(0);

/// Exported calls so far.
static CALLS: AtomicU64 = AtomicU64::new(0);

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

fn report() -> Option<&'static Report> {
    REPORT
        .get_or_init(|| {
            let spec = std::env::var(ENV_VAR).unwrap_or_default();
            FakeConfig::parse(&spec)
                .ok()
                .and_then(|c| c.cpu_report)
                .map(|p| Mutex::new((p, None)))
        })
        .as_ref()
}

/// Runs one exported call's `body`, timing it when it is a sampled call
/// and a report is asked for.
pub fn timed<R>(body: impl FnOnce() -> R) -> R {
    if report().is_none()
        || !CALLS
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SAMPLE_EVERY)
    {
        return body();
    }
    let overhead = timer_overhead_ns();
    let start = thread_cpu_ns();
    let r = body();
    let spent = thread_cpu_ns()
        .saturating_sub(start)
        .saturating_sub(overhead);
    // The sampled call's share of the simulation, scaled to every call,
    // and the two clock reads this call alone paid for (an empty span
    // reads about one of them).
    account(spent * SAMPLE_EVERY + 2 * overhead);
    r
}

/// What timing a call costs by itself: the part of the two clock reads
/// (system calls) that falls between the two readings, measured once on
/// empty spans (the least of 64, so that what is subtracted is never more
/// than the timing's own cost). Without it, a cheap call was reported at
/// the cost of the timing, and the estimate grew with the number of calls
/// rather than with the simulation's work.
fn timer_overhead_ns() -> u64 {
    static OVERHEAD: OnceLock<u64> = OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        (0..64)
            .map(|_| {
                let a = thread_cpu_ns();
                thread_cpu_ns().saturating_sub(a)
            })
            .min()
            .unwrap_or(0)
    })
}

/// Adds `ns` of CPU time, then writes the report if one is due.
pub fn account(ns: u64) {
    let total = SPENT_NS.fetch_add(ns, Ordering::Relaxed) + ns;
    let Some(report) = report() else { return };
    let Ok(mut r) = report.try_lock() else { return };
    if r.1.is_some_and(|t| t.elapsed().as_secs() < 1) {
        return;
    }
    r.1 = Some(Instant::now());
    let start = thread_cpu_ns();
    // A failed write only loses one report; the next second tries again.
    let _ = std::fs::write(&r.0, format!("{total}\n"));
    // Writing the report (open, truncate, write, close) is the library's
    // time too: it goes into the next report.
    SPENT_NS.fetch_add(
        thread_cpu_ns().saturating_sub(start) + timer_overhead_ns(),
        Ordering::Relaxed,
    );
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
