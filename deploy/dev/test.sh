#!/usr/bin/env bash
# Runs flopwatch's whole test suite (unit, property, end-to-end, process).
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
cargo fmt --all -- --check
# Lints: any clippy warning fails the run, in the full build and in the
# agent-only one below.
# `eval` (flopwatch eval-sampling) is off in the shipped build; its code
# is linted and tested here.
cargo clippy --workspace --all-targets --features flopwatch-cli/eval -- -D warnings
# One test thread more than cores: the process tests (collectors, agents,
# Prometheus on loopback) spend most of their time waiting on them.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-$(($(nproc) + 1))}"
cargo test --workspace --all-targets --features flopwatch-cli/eval "$@"
# The agent-only build (what a node runs) compiles without a warning
# (checked, not built: a build would rebuild the shared crates with the
# agent's features and overwrite target/debug/flopwatch), and carries no
# RocksDB, collector, selector or terminal view.
cargo clippy -p flopwatch-cli --no-default-features --features agent -- -D warnings
if cargo tree -p flopwatch-cli --no-default-features --features agent -e normal | grep -q rocksdb; then
    echo "error: the agent-only build (flopwatch-cli --no-default-features --features agent) depends on rocksdb" >&2
    exit 1
fi
# Only the store crate names RocksDB: the collector reaches it through
# flopwatch-store, never directly.
if cargo tree -p flopwatch-collector -e normal --depth 1 | grep -q rocksdb; then
    echo "error: flopwatch-collector depends on rocksdb directly (only flopwatch-store may)" >&2
    exit 1
fi
# The shipped binary (default features) carries no benchmark and no
# tokio test clock: benchmarks are `flopwatch-bench`, eval-sampling is
# behind `eval`.
if cargo tree -p flopwatch-cli -e normal,features -i tokio | grep -q test-util; then
    echo "error: the default flopwatch build enables tokio's test-util" >&2
    exit 1
fi
# The API docs build without a warning (a broken link fails the run; links
# from public docs to private items are how the modules document each
# other, and are allowed).
RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" cargo doc --workspace --no-deps --features flopwatch-cli/eval
