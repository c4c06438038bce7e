//! A wedged driver (`hang_after=N`): after `N` device queries, every
//! further one blocks until the fake is configured again.
//!
//! Real NVML calls can block indefinitely (a GPU fallen off the bus, a
//! driver waiting on a hung kernel); the agent's liveness check exists for
//! that case, and tests need a driver that does it on demand. The gate runs
//! before the state lock is taken, so a blocked call does not stop
//! `flopwatchFakeNvmlConfigure` from releasing it.

use std::sync::{Condvar, Mutex};

/// How many queries pass before the gate closes (`None`: never), how many
/// have passed, and a generation that every configure bumps.
#[derive(Debug)]
struct Gate {
    hang_after: Option<u64>,
    calls: u64,
    generation: u64,
    /// Calls blocked now.
    waiting: u64,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    hang_after: None,
    calls: 0,
    generation: 0,
    waiting: 0,
});
static OPENED: Condvar = Condvar::new();

/// Sets the gate for a new configuration and releases every blocked call.
pub(crate) fn arm(hang_after: Option<u64>) {
    let mut g = GATE.lock().unwrap_or_else(|e| e.into_inner());
    g.hang_after = hang_after;
    g.calls = 0;
    g.generation += 1;
    OPENED.notify_all();
}

/// Counts a device query and, once the budget is spent, blocks until the
/// next [`arm`].
pub(crate) fn pass() {
    let mut g = GATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(limit) = g.hang_after else { return };
    if g.calls < limit {
        g.calls += 1;
        return;
    }
    let generation = g.generation;
    g.waiting += 1;
    while g.generation == generation {
        g = OPENED.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.waiting -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn the_gate_blocks_after_its_budget_until_rearmed() {
        arm(Some(2));
        pass();
        pass();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let blocked = std::thread::spawn(move || {
            pass();
            d.store(true, Ordering::SeqCst);
        });
        // The third call waits on the condition variable, holding no lock.
        while GATE.lock().unwrap().waiting == 0 {
            std::thread::yield_now();
        }
        assert!(!done.load(Ordering::SeqCst));
        arm(None);
        blocked.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        pass();
    }
}
