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
//! The process' other memory settings (glibc's malloc for RocksDB's own
//! allocations, transparent huge pages off) are
//! `flopwatch_transport::memory`'s, which the benchmarks that run the
//! collector in their own process apply too.

/// Applies the process' memory settings; call first thing in `main`,
/// before any thread starts.
pub(crate) fn tune() {
    flopwatch_transport::memory::tune();
}

/// The collector's allocator (see the module docs).
#[cfg(feature = "collector")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
