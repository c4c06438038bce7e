#!/usr/bin/env bash
# Fixed against adaptive sampling, end to end with the real binaries: two
# collectors, each fed by one `flopwatch agent --source sim` with the same
# simulated node (4 GPUs, seed 3, 100 ms) except `[sampling] adaptive`,
# started together; then each job's OFU from each collector, over the whole
# run and over every whole minute of it.
#
#   deploy/dev/compare-sampling.sh [SECONDS]      (default 45)
#
# CONTROL=1 runs both agents at a fixed 100 ms: what two processes started
# together differ by with the same sampling (their simulated fleets start
# milliseconds apart, and their captures fall at other instants).
#
# FLOPWATCH_BIN names the binary (default: target/release/flopwatch, built
# if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-45}"
bin="${FLOPWATCH_BIN:-target/release/flopwatch}"
if [ ! -x "$bin" ]; then
  ./deploy/dev/setup.sh
  cargo build --release -p flopwatch-cli --bin flopwatch
fi
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

declare -A url
for kind in fixed adaptive; do
  port="$(free_port)"
  url[$kind]="http://127.0.0.1:$port"
  cat >"$work/$kind-collector.toml" <<TOML
listen = "127.0.0.1:$port"
plaintext = true
metrics_listen = "127.0.0.1:$(free_port)"
data_dir = "$work/$kind-data"
anonymous_tenant = "default"
TOML
  adaptive=false
  [ "$kind" = adaptive ] && [ -z "${CONTROL:-}" ] && adaptive=true
  cat >"$work/$kind-agent.toml" <<TOML
node_id = "node-$kind"
collectors = ["${url[$kind]}"]
metrics_listen = ""
source = "sim"
interval = "100ms"
[sim]
gpus = 4
seed = 3
[sampling]
adaptive = $adaptive
TOML
  "$bin" collector --config "$work/$kind-collector.toml" >"$work/$kind-collector.log" 2>&1 &
  pids+=($!)
done
sleep 2
for kind in fixed adaptive; do
  "$bin" agent --config "$work/$kind-agent.toml" >"$work/$kind-agent.log" 2>&1 &
  pids+=($!)
done
started_ms=$(($(date +%s%3N)))
sleep "$secs"
# Stop the agents (they drain), keep the collectors for the queries.
kill -TERM "${pids[2]}" "${pids[3]}"
wait "${pids[2]}" "${pids[3]}" || true
ended_ms=$(($(date +%s%3N)))

jobs=$("$bin" query jobs --collector "${url[fixed]}" --json | python3 -c 'import json,sys; print(" ".join(sorted({j["job_id"] for j in json.load(sys.stdin)})))')
printf '| job | window | fixed 100 ms | adaptive | difference (pp) |\n|---|---|---:|---:|---:|\n'
worst=0
for job in $jobs; do
  f=$("$bin" query ofu --collector "${url[fixed]}" --job "$job" --since 10m --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ofu"])')
  a=$("$bin" query ofu --collector "${url[adaptive]}" --job "$job" --since 10m --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ofu"])')
  python3 -c "f,a=$f,$a; print(f'| $job | whole run | {100*f:.2f} % | {100*a:.2f} % | {100*(a-f):+.3f} |')"
  fs=$("$bin" query ofu --collector "${url[fixed]}" --job "$job" --since 10m --step 1m --json)
  as=$("$bin" query ofu --collector "${url[adaptive]}" --job "$job" --since 10m --step 1m --json)
  python3 - "$fs" "$as" "$started_ms" "$ended_ms" "$job" <<'PY'
import json, sys
f, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
start, end, job = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
fp = {p["timestamp_ms"]: p["ofu"] for p in f.get("points", [])}
ap = {p["timestamp_ms"]: p["ofu"] for p in a.get("points", [])}
for ts in sorted(set(fp) & set(ap)):
    # Whole minutes of the run only.
    if ts % 60000 == 0 and ts >= start and ts + 60000 <= end:
        print(f"| {job} | minute {ts // 1000} | {100*fp[ts]:.2f} % | {100*ap[ts]:.2f} % | {100*(ap[ts]-fp[ts]):+.3f} |")
PY
done
