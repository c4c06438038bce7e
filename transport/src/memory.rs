//! The memory settings of a long-running flopwatch process, applied first
//! thing in `main` by the shipped binary and by the benchmarks that run
//! the collector in their own process, so both are measured alike.
//!
//! **glibc's malloc** (RocksDB's own C++ allocations — memtables, block
//! cache — and everything of the agent-only build) raises its mmap
//! threshold every time a large block is freed (up to 32 MiB), so after
//! RocksDB's first memtables are flushed and freed, later large buffers
//! come from the heap arenas, where freed space is kept rather than
//! returned: the collector's resident memory then grows with time even
//! when what it holds does not. Measured with `flopwatch-bench
//! backpressure` (200 streams open throughout, RocksDB's own memory
//! cycling between 5 and 84 MiB): with glibc's defaults the rest of the
//! resident memory went from 106 to 173 MiB in 86 s; with a fixed
//! threshold (64 KiB or 1 MiB) and 2 arenas it stayed between 66 and 76
//! MiB (docs/BENCHMARKS.md). Each setting is left alone when its glibc
//! environment variable (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_ARENA_MAX`) is
//! set, so an operator can still choose.
//!
//! **Transparent huge pages** are turned off for the process
//! (`prctl(PR_SET_THP_DISABLE)`, inherited by what it starts). mimalloc,
//! the collector's allocator, asks the kernel for huge pages on its
//! memory (`madvise(MADV_HUGEPAGE)`) by default, which even a system set
//! to `madvise` honours: a 2 MiB page is then resident whole as soon as
//! one byte of it is touched. At 10,000 agent streams (`bench soak`),
//! 1,010 MiB of the collector's 1,352 MiB resident were huge pages, and
//! without them its resident memory was 14 % lower over the same minutes
//! of the run (docs/BENCHMARKS.md, around the clock). Left alone when
//! `MIMALLOC_ALLOW_THP` is set
//! (mimalloc's own switch: `1` keeps huge pages, `0` turns them off as
//! here).

#![allow(unsafe_code)]

/// Applies the settings; call first thing in `main`, before any thread
/// starts. A setting the system refuses is left as it was.
pub fn tune() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        huge_pages_off();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set = |env: &str, param: libc::c_int, value: libc::c_int| {
            if std::env::var_os(env).is_none() {
                // SAFETY: mallopt only changes the allocator's parameters;
                // called before any other thread exists.
                unsafe {
                    libc::mallopt(param, value);
                }
            }
        };
        set(
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            1024 * 1024,
        );
        set("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2);
    }
}

/// Turns transparent huge pages off for the process and what it starts
/// from now on (pages already huge stay so). Refused: left as it was.
pub fn huge_pages_off() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// Whether transparent huge pages are off for this process (`None`: the
/// system cannot say).
pub fn huge_pages_disabled() -> Option<bool> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        rustix::thread::transparent_huge_pages_are_disabled().ok()
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_go_off_for_the_whole_process() {
        // The test binary's own process: nothing else in it reads the flag.
        let before = huge_pages_disabled();
        huge_pages_off();
        if before.is_some() {
            assert_eq!(huge_pages_disabled(), Some(true));
            // The flag is the process's, not the calling thread's.
            let other = std::thread::spawn(huge_pages_disabled).join();
            assert_eq!(other.ok().flatten(), Some(true));
        }
    }
}
