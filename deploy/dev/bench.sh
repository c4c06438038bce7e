#!/usr/bin/env bash
# Reproduces the figures of docs/BENCHMARKS.md on this machine:
#   1. collector durable ingest rate (flopwatch-bench ingest);
#   2. agent RSS and CPU, 8 GPUs × every metric at 100 ms, with the sim
#      source and with the NVML source on the fake libnvidia-ml, on the
#      agent-only build a node runs; the fake library's own CPU time (the
#      simulated hardware) is reported apart, and the agent's resident set
#      is broken down by mapping.
# Usage: deploy/dev/bench.sh [seconds per agent run, default 60]
#   AGENT_ONLY=1: part 2 only (no ingest run);
#   COLLECTOR_BIN=PATH: the collector the agents stream to, any flopwatch
#   build with the collector (a debug build will do: only the agent is
#   measured), instead of building the full release binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/dev/setup.sh
secs="${1:-60}"
target="${CARGO_TARGET_DIR:-target}/release"
# The agent-only build a node runs (no RocksDB, collector, selector or
# TUI), with the agent's own profile (Cargo.toml `[profile.agent]`).
cargo build --quiet --profile agent -p flopwatch-cli --no-default-features --features agent
if [ -z "${COLLECTOR_BIN:-}" ]; then
  cargo build --quiet --release --bin flopwatch -p flopwatch-cli
fi
cargo build --quiet --release -p flopwatch-fake-nvml
[ -n "${AGENT_ONLY:-}" ] || cargo build --quiet --release -p flopwatch-bench
bin="${COLLECTOR_BIN:-$target/flopwatch}"
agent_bin="${CARGO_TARGET_DIR:-target}/agent/flopwatch"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

echo "## machine"
echo "$(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB RAM, $(uname -sr)"
echo
if [ -z "${AGENT_ONLY:-}" ]; then
  echo "## collector ingest"
  "$target/flopwatch-bench" ingest --duration 20s --data-dir "$work/ingest"
  du -sh "$work/ingest" | awk '{print "data dir after the run: " $1}'
  rm -rf "$work/ingest"
  echo
fi

# Resident set of PID by mapping: the binary, each shared library, heap
# and anonymous memory (allocator arenas, thread stacks, tokio's buffers),
# in KiB, largest first.
rss_breakdown() {
  python3 - "$1" <<'PY'
import re, sys
from collections import defaultdict
kb = defaultdict(int)
name = None
for line in open(f"/proc/{sys.argv[1]}/smaps"):
    m = re.match(r"^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ \S+\s*(.*)$", line)
    if m:
        perms, path = m.group(1), m.group(2).strip()
        if not path:
            name = "anonymous (heap arenas, thread stacks)"
        elif path.startswith("["):
            name = path
        else:
            kind = "code" if "x" in perms else "data"
            name = f"{path.rsplit('/', 1)[-1]} ({kind})"
        continue
    if line.startswith("Rss:") and name:
        kb[name] += int(line.split()[1])
total = sum(kb.values())
print(f"  resident {total / 1024:.1f} MiB:", ", ".join(
    f"{n} {v / 1024:.1f}" for n, v in sorted(kb.items(), key=lambda x: -x[1]) if v >= 64))
PY
  echo "  threads: $(ls /proc/$1/task | wc -l)"
}

measure_agent() { # name source [env...]
  local name="$1" source="$2"; shift 2
  "$bin" collector --config config/collector.toml --listen 127.0.0.1:0 --data-dir "$work/c-$name" >"$work/c-$name.out" 2>/dev/null &
  local cpid=$!
  for _ in $(seq 50); do grep -q listening "$work/c-$name.out" 2>/dev/null && break; sleep 0.1; done
  local url="http://$(sed -n 's/^listening on //p' "$work/c-$name.out")"
  local report="$work/fake-cpu-${source}"
  rm -f "$report"
  env "$@" FLOPWATCH_SIM__GPUS=8 FLOPWATCH_LOG=warn \
    "$agent_bin" agent --config config/agent.toml --source "$source" --collector "$url" &
  local apid=$!
  sleep 5
  local t0 t1 f0 f1 rss hwm
  # Each thread's exact time on CPU (ns, the first field of its
  # schedstat), not utime + stime, which count whole clock ticks: at this
  # load those move by ±0.04 points from run to run.
  threads_ns() { for f in /proc/$apid/task/*/schedstat; do echo "${f%/schedstat} $(cut -d' ' -f1 "$f")"; done 2>/dev/null; }
  t0=$(threads_ns)
  f0=$(cat "$report" 2>/dev/null || echo 0)
  sleep "$secs"
  t1=$(threads_ns)
  f1=$(cat "$report" 2>/dev/null || echo 0)
  rss=$(awk '/VmRSS/{print $2}' /proc/$apid/status)
  hwm=$(awk '/VmHWM/{print $2}' /proc/$apid/status)
  rss_breakdown $apid
  kill -TERM $apid; wait $apid || true
  local stored
  stored=$("$bin" query ofu --collector "$url" --since 1h --json | awk -F: '/"samples"/{gsub(/[ ,]/,"",$2); print $2}')
  kill -TERM $cpid; wait $cpid || true
  # What each thread ran in the window: a thread started meanwhile counts
  # from its start, one that ended meanwhile (an idle blocking-pool thread)
  # is left out.
  local d
  d=$(awk 'NR == FNR { t0[$1] = $2; next } { d += $2 - ($1 in t0 ? t0[$1] : 0) } END { print d + 0 }' \
    <(echo "$t0") <(echo "$t1"))
  awk -v n="$name" -v s="$secs" -v d="$d" -v rss="$rss" -v hwm="$hwm" -v st="$stored" \
      -v fake="$(( (f1 - f0) ))" 'BEGIN {
    all = 100*d/1e9/s; sim = 100*fake/1e9/s
    printf "agent %-28s RSS %.1f MiB (peak %.1f MiB), CPU %.2f %% of one core over %d s", n, rss/1024, hwm/1024, all, s
    if (fake > 0) printf " (fake libnvidia-ml %.2f %%, the agent %.2f %%)", sim, all - sim
    printf "; %s OFU samples stored\n", st }'
}

echo "## agent footprint (agent-only build; 8 GPUs, all metrics, 100 ms, 1 s batches)"
measure_agent "sim" sim
fake=(FLOPWATCH_NVML__LIBRARY_PATH="$target/libflopwatch_fake_nvml.so" FLOPWATCH_FAKE_NVML="gpus=8,cpu_report=$work/fake-cpu-nvml")
measure_agent "nvml (fake libnvidia-ml)" nvml "${fake[@]}"
measure_agent "sim, adaptive" sim FLOPWATCH_SAMPLING__ADAPTIVE=true
measure_agent "nvml, adaptive" nvml "${fake[@]}" FLOPWATCH_SAMPLING__ADAPTIVE=true
