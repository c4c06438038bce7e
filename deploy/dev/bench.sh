#!/usr/bin/env bash
# Reproduces the figures of docs/BENCHMARKS.md on this machine:
#   1. collector durable ingest rate (flopwatch bench ingest);
#   2. agent RSS and CPU, 8 GPUs × every metric at 100 ms, with the sim
#      source and with the NVML source on the fake libnvidia-ml.
# Usage: deploy/dev/bench.sh [seconds per agent run, default 60]
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
secs="${1:-60}"
cargo build --quiet --release --bin flopwatch -p flopwatch-cli
cargo build --quiet --release -p flopwatch-fake-nvml
target="${CARGO_TARGET_DIR:-target}/release"
bin="$target/flopwatch"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

echo "## machine"
echo "$(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB RAM, $(uname -sr)"
echo
echo "## collector ingest"
"$bin" bench ingest --duration 20s --data-dir "$work/ingest"
du -sh "$work/ingest" | awk '{print "data dir after the run: " $1}'
rm -rf "$work/ingest"
echo

measure_agent() { # name source [env...]
  local name="$1" source="$2"; shift 2
  "$bin" collector --config config/collector.toml --listen 127.0.0.1:0 --data-dir "$work/c-$name" >"$work/c-$name.out" 2>/dev/null &
  local cpid=$!
  for _ in $(seq 50); do grep -q listening "$work/c-$name.out" 2>/dev/null && break; sleep 0.1; done
  local url="http://$(sed -n 's/^listening on //p' "$work/c-$name.out")"
  env "$@" FLOPWATCH_SIM__GPUS=8 FLOPWATCH_LOG=warn \
    "$bin" agent --config config/agent.toml --source "$source" --collector "$url" &
  local apid=$!
  sleep 5
  local hz t0 t1 rss hwm
  hz=$(getconf CLK_TCK)
  t0=$(awk '{print $14+$15}' /proc/$apid/stat)
  sleep "$secs"
  t1=$(awk '{print $14+$15}' /proc/$apid/stat)
  rss=$(awk '/VmRSS/{print $2}' /proc/$apid/status)
  hwm=$(awk '/VmHWM/{print $2}' /proc/$apid/status)
  kill -TERM $apid; wait $apid || true
  local stored
  stored=$("$bin" query ofu --collector "$url" --since 1h --json | awk -F: '/"samples"/{gsub(/[ ,]/,"",$2); print $2}')
  kill -TERM $cpid; wait $cpid || true
  awk -v n="$name" -v s="$secs" -v d="$((t1 - t0))" -v hz="$hz" -v rss="$rss" -v hwm="$hwm" -v st="$stored" 'BEGIN {
    printf "agent %-28s RSS %.1f MiB (peak %.1f MiB), CPU %.2f %% of one core over %d s; %s OFU samples stored\n",
      n, rss/1024, hwm/1024, 100*d/hz/s, s, st }'
}

echo "## agent footprint (8 GPUs, all metrics, 100 ms, 1 s batches)"
measure_agent "sim" sim
measure_agent "nvml (fake libnvidia-ml)" nvml \
  FLOPWATCH_NVML__LIBRARY_PATH="$target/libflopwatch_fake_nvml.so" FLOPWATCH_FAKE_NVML="gpus=8"
