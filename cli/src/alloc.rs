//! The allocators of a long-running process.
//!
//! A build with the collector allocates its Rust memory with mimalloc. A
//! collector under a fleet allocates and frees a few thousand small
//! blocks per batch (a batch's decoded series, keys and values of its
//! write, acknowledgements), from many tasks on a few threads; with
//! glibc's malloc a third of its CPU went to `malloc`, `free` and
//! `malloc_consolidate` at 10,000 agent streams (docs/BENCHMARKS.md,
//! fleet). The agent-only build keeps the C allocator: a node agent
//! allocates little, and every resident page counts there.
//!
//! RocksDB's own C++ allocations (memtables, block cache) stay with the C
//! allocator, whose settings follow.
//!
//! glibc's malloc raises its mmap threshold every time a large block is
//! freed (up to 32 MiB), so after RocksDB's first memtables are flushed
//! and freed, later large buffers come from the heap arenas, where freed
//! space is kept rather than returned: the collector's resident memory
//! then grows with time even when what it holds does not. Measured with
//! `flopwatch-bench backpressure` (200 streams open throughout, RocksDB's
//! own memory cycling between 5 and 84 MiB): with glibc's defaults the
//! rest of the resident memory went from 106 to 173 MiB in 86 s; with a
//! fixed threshold (64 KiB or 1 MiB) and 2 arenas it stayed between 66
//! and 76 MiB (docs/BENCHMARKS.md). Each setting is left alone when its glibc
//! environment variable (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_ARENA_MAX`)
//! is set, so an operator can still choose.

/// Applies the settings; call first thing in `main`, before any thread
/// starts.
pub(crate) fn tune() {
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

/// The collector's allocator (see the module docs).
#[cfg(feature = "collector")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
