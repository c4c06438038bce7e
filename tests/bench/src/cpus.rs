//! CPU sets for `bench fleet --collector-cpus`: the collector on some
//! cores, the driver and its load generator (agents, sink) on the others,
//! so that a comparison of two collectors (remote write on and off, two
//! builds) is not decided by the load generator taking the collector's
//! core at the wrong moment.

use anyhow::{bail, Context};
use std::process::Command;

/// A set of CPUs, by number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CpuSet(Vec<usize>);

impl CpuSet {
    /// Parses a list as `taskset -c` takes it: `0`, `0,2`, `0-3,6`.
    pub(super) fn parse(s: &str) -> anyhow::Result<Self> {
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let a: usize = a
                .parse()
                .with_context(|| format!("CPU list {s:?}: {part:?}"))?;
            let b: usize = b
                .parse()
                .with_context(|| format!("CPU list {s:?}: {part:?}"))?;
            if b < a || b >= libc::CPU_SETSIZE as usize {
                bail!("CPU list {s:?}: {part:?} is not a range of CPU numbers");
            }
            v.extend(a..=b);
        }
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            bail!("CPU list {s:?} names no CPU");
        }
        Ok(Self(v))
    }

    /// The CPUs this process may run on.
    pub(super) fn allowed() -> anyhow::Result<Self> {
        // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>()
        // bytes into the zeroed set it is given.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
            }
            set
        };
        Ok(Self(
            (0..libc::CPU_SETSIZE as usize)
                // SAFETY: `i` is below CPU_SETSIZE.
                .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
                .collect(),
        ))
    }

    /// The CPUs of `self` that `other` does not hold.
    pub(super) fn without(&self, other: &Self) -> Self {
        Self(
            self.0
                .iter()
                .copied()
                .filter(|c| !other.0.contains(c))
                .collect(),
        )
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn raw(&self) -> libc::cpu_set_t {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET is given
        // numbers below CPU_SETSIZE (checked by `parse`, or read back
        // from the kernel).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &self.0 {
                libc::CPU_SET(c, &mut set);
            }
            set
        }
    }

    /// Binds every thread of this process to the set, and so every thread
    /// and process it starts from now on.
    pub(super) fn bind_process(&self) -> anyhow::Result<()> {
        let set = self.raw();
        for task in std::fs::read_dir("/proc/self/task").context("/proc/self/task")? {
            let Some(tid) = task?
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            // SAFETY: the set is a valid cpu_set_t of the size given.
            let r = unsafe {
                libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            // A thread that ended since the listing is no longer there.
            let e = std::io::Error::last_os_error();
            if r != 0 && e.raw_os_error() != Some(libc::ESRCH) {
                bail!("sched_setaffinity {self} (thread {tid}): {e}");
            }
        }
        Ok(())
    }

    /// Makes `cmd`'s process start bound to the set (whatever its parent
    /// is bound to).
    pub(super) fn bind_child(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let set = self.raw();
        // SAFETY: between fork and exec the closure makes one system call
        // (async-signal-safe) on a value copied in before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl std::fmt::Display for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.0.iter().map(usize::to_string).collect();
        write!(f, "{}", s.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_taskset_reads_them() {
        assert_eq!(CpuSet::parse("0").unwrap(), CpuSet(vec![0]));
        assert_eq!(CpuSet::parse("3,0-1, 1").unwrap(), CpuSet(vec![0, 1, 3]));
        assert_eq!(CpuSet::parse("2-4").unwrap().to_string(), "2,3,4");
        for bad in ["", "a", "3-1", "0-", "99999"] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_set_less_another_keeps_the_rest() {
        let all = CpuSet(vec![0, 1, 2, 3]);
        assert_eq!(all.without(&CpuSet(vec![0, 2])), CpuSet(vec![1, 3]));
        assert!(CpuSet(vec![0]).without(&CpuSet(vec![0])).is_empty());
    }

    #[test]
    fn this_process_runs_somewhere() {
        assert!(!CpuSet::allowed().unwrap().is_empty());
    }
}
