#!/usr/bin/env bash
# GPU validation in one command: flopwatch's OFU against a tensor-core load
# whose FLOPs are known, on a machine with an NVIDIA GPU, its driver and
# PyTorch.
#
#   deploy/gpu/validate.sh                     # builds flopwatch (release) and
#                                              # writes docs/GPU-VALIDATION.md
#   deploy/gpu/validate.sh --bin target/release/flopwatch --gpu 1
#   deploy/gpu/validate.sh --dry-run --out /tmp/dry.md   # no GPU (see below)
#
# For each pass (fixed 100 ms sampling, then adaptive sampling) it starts a
# collector on loopback (plaintext, an ephemeral port, RocksDB in a new
# temporary directory) and an agent reading the GPU through NVML every
# 100 ms, runs deploy/gpu/load.py (bf16 and fp16 GEMMs at 8192³, 4096³,
# 1024³ and 8192×8192×8200, an idle gap, 16384³ alternating with 4096³;
# each phase timed with CUDA events), then asks flopwatch for the OFU of
# every phase's window (`flopwatch query ofu --start --end`) and the raw
# series. deploy/gpu/report.py sets that against the load's MFU (peak from
# config/gpus.toml, with and without the tile padding of OFU eq. 2-4) and
# writes the report: OFU with the window-averaged and the point SM clock,
# the clocks, GPM availability and whether GPM needed extra permissions,
# the driver and the GPU model. A real run also reads `nvidia-smi` every
# 200 ms while the load runs (clock, power, temperature, clock event
# reasons such as the power cap) and the report gives them per phase.
#
# This script NEVER changes clocks, power limits or MIG mode and never
# resets the GPU: no `nvidia-smi -lgc/-rgc/-pl/-mig/-r/-pm`, only
# `nvidia-smi --query-gpu` and NVML reads through the agent. The GPU runs
# at whatever the machine's settings are, and the report shows the clocks
# it saw.
#
# --dry-run runs the same steps without a GPU: the agent loads the fake
# libnvidia-ml of the workspace (agent/fake-nvml), whose GPU 0 shows a
# made-up tensor activity while each phase of a CPU stand-in load runs
# (pure Python GEMMs). Its report says DRY RUN on top and goes to --out
# (default: a file under $TMPDIR), never to docs/GPU-VALIDATION.md.
#
# Options:
#   --dry-run              no GPU: fake NVML and a CPU stand-in (not a measurement)
#   --bin PATH             flopwatch binary to use (env FLOPWATCH_BIN); default:
#                          cargo build --release -p flopwatch-cli --bin flopwatch
#   --fake-nvml PATH       dry run: libflopwatch_fake_nvml.so (env FLOPWATCH_FAKE_NVML_LIB);
#                          default: beside the binary, else built with cargo
#   --out PATH             report file (env FLOPWATCH_VALIDATE_OUT)
#   --gpu N                GPU index as nvidia-smi and NVML number them (default 0)
#   --precisions LIST      bf16,fp16 (default both)
#   --phase-seconds S      length of each GEMM phase (default 10; dry run 2)
#   --idle-seconds S       length of the idle gap (default: --phase-seconds)
#   --alt-seconds S        one segment of the alternating phase (default 5; dry run 1)
#   --alt-cycles N         16384/4096 pairs in the alternating phase (default 2; dry run 1)
#   --passes LIST          fixed,adaptive (default both)
#   --guard-ms MS          skipped at each phase start before querying (default 200)
#   --tile TMxTNxTK:CMxCN  tile shape assumed when a kernel name carries none
#                          (default 256x128x64:2x1)
#   --python PATH          Python 3.11+ (env PYTHON; default python3)
#   --keep                 keep the working directory (configs, logs, JSON)
# Environment: NVIDIA_SMI (path of nvidia-smi), TMPDIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

die() {
    echo "validate.sh: error: $*" >&2
    exit 2
}

dry=0
bin=${FLOPWATCH_BIN:-}
fake_lib=${FLOPWATCH_FAKE_NVML_LIB:-}
out=${FLOPWATCH_VALIDATE_OUT:-}
gpu=0
precisions=bf16,fp16
phase_s=
idle_s=
alt_s=
alt_cycles=
passes=fixed,adaptive
guard_ms=200
tile=256x128x64:2x1
py=${PYTHON:-python3}
keep=0
nvidia_smi=${NVIDIA_SMI:-nvidia-smi}
cmdline="deploy/gpu/validate.sh $*"

need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --dry-run) dry=1 ;;
        --bin) need "$@"; bin=$2; shift ;;
        --fake-nvml) need "$@"; fake_lib=$2; shift ;;
        --out) need "$@"; out=$2; shift ;;
        --gpu) need "$@"; gpu=$2; shift ;;
        --precisions) need "$@"; precisions=$2; shift ;;
        --phase-seconds) need "$@"; phase_s=$2; shift ;;
        --idle-seconds) need "$@"; idle_s=$2; shift ;;
        --alt-seconds) need "$@"; alt_s=$2; shift ;;
        --alt-cycles) need "$@"; alt_cycles=$2; shift ;;
        --passes) need "$@"; passes=$2; shift ;;
        --guard-ms) need "$@"; guard_ms=$2; shift ;;
        --tile) need "$@"; tile=$2; shift ;;
        --python) need "$@"; py=$2; shift ;;
        --keep) keep=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown option \`$1' (see --help)" ;;
    esac
    shift
done

[[ $gpu =~ ^[0-9]+$ ]] || die "--gpu $gpu: expected an index (0, 1, ...)"
[[ $guard_ms =~ ^[0-9]+$ ]] || die "--guard-ms $guard_ms: expected milliseconds"
if [[ $dry == 1 ]]; then
    phase_s=${phase_s:-2}
    alt_s=${alt_s:-1}
    alt_cycles=${alt_cycles:-1}
else
    phase_s=${phase_s:-10}
    alt_s=${alt_s:-5}
    alt_cycles=${alt_cycles:-2}
fi
idle_s=${idle_s:-$phase_s}
IFS=, read -r -a pass_list <<<"$passes"
for p in "${pass_list[@]}"; do
    [[ $p == fixed || $p == adaptive ]] || die "--passes $passes: expected fixed and/or adaptive"
done

banner() {
    local line="DRY RUN: fake NVML and a CPU stand-in load. These numbers are NOT GPU measurements."
    echo "================================================================================"
    echo "  $line"
    echo "================================================================================"
}

# --- What this run needs, checked before anything starts. -------------------
if [[ $dry == 1 ]]; then
    banner
    out=${out:-${TMPDIR:-/tmp}/flopwatch-gpu-validation.dry-run.md}
    real_doc="$repo/docs/GPU-VALIDATION.md"
    [[ -d $(dirname "$out") ]] || die "--out $out: its directory does not exist"
    out_abs="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
    [[ $out_abs != "$real_doc" ]] ||
        die "a dry run never writes $real_doc (its numbers are not GPU measurements): give --out elsewhere"
else
    command -v "$nvidia_smi" >/dev/null 2>&1 ||
        die "nvidia-smi not found ($nvidia_smi): this validation needs an NVIDIA GPU and its driver. Without a GPU, run: deploy/gpu/validate.sh --dry-run"
    "$nvidia_smi" -L >/dev/null 2>&1 ||
        die "\`$nvidia_smi -L' failed: no working NVIDIA driver or GPU here. Without a GPU, run: deploy/gpu/validate.sh --dry-run"
    out=${out:-$repo/docs/GPU-VALIDATION.md}
fi
command -v "$py" >/dev/null 2>&1 || die "$py not found (Python 3.11+ is needed; --python PATH)"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$py is older than Python 3.11 (report.py reads config/gpus.toml with tomllib)"
if [[ $dry == 0 ]]; then
    "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null ||
        die "PyTorch with CUDA is needed for the load: \`$py -c \"import torch; print(torch.cuda.is_available())\"' must print True"
fi

# --- The binary (and, for a dry run, the fake libnvidia-ml). ----------------
if [[ -z $bin ]]; then
    command -v cargo >/dev/null 2>&1 || die "no --bin given and cargo not found to build flopwatch"
    echo "building flopwatch (release; a first build compiles RocksDB, minutes)..." >&2
    (cd "$repo" && cargo build --release --quiet -p flopwatch-cli --bin flopwatch)
    if [[ $dry == 1 && -z $fake_lib ]]; then
        (cd "$repo" && cargo build --release --quiet -p flopwatch-fake-nvml)
    fi
    target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
        "$py" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    bin=$target/release/flopwatch
fi
[[ -x $bin ]] || die "flopwatch binary $bin is missing or not executable"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
if [[ $dry == 1 ]]; then
    if [[ -z $fake_lib ]]; then
        for c in "$(dirname "$bin")/libflopwatch_fake_nvml.so" "$(dirname "$bin")/deps/libflopwatch_fake_nvml.so"; do
            [[ -f $c ]] && fake_lib=$c && break
        done
    fi
    [[ -n $fake_lib && -f $fake_lib ]] ||
        die "the fake libnvidia-ml was not found beside $bin: build it (cargo build -p flopwatch-fake-nvml) or give --fake-nvml PATH"
fi

# --- Working directory, and stopping what we started on any exit. -----------
work=$(mktemp -d "${TMPDIR:-/tmp}/flopwatch-gpu-validate.XXXXXX")
pids=()
stop_pid() {
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    for pid in "${pids[@]}"; do stop_pid "$pid"; done
    if [[ $rc != 0 ]]; then
        for log in "$work"/*/agent.log "$work"/*/collector.log; do
            [[ -f $log ]] || continue
            echo "--- last lines of $log:" >&2
            tail -n 15 "$log" >&2
        done
        echo "validate.sh: failed (exit $rc); configs and logs kept in $work" >&2
    elif [[ $keep == 1 ]]; then
        echo "working directory kept: $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits until FILE has a line matching PATTERN; fails if PID exits first.
wait_line() {
    local file=$1 pattern=$2 pid=$3 what=$4 limit=${5:-60} i
    for i in $(seq 1 $((limit * 10))); do
        grep -q -- "$pattern" "$file" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || die "$what exited before \`$pattern' (log: $file)"
        sleep 0.1
    done
    die "$what: no \`$pattern' within ${limit}s (log: $file)"
}

fw_query() { "$bin" query "$@" --collector "$url" --json; }

# --- GPU identity (real run): the UUID the agent will report. ---------------
gpu_uuid=
smi_file=
if [[ $dry == 0 ]]; then
    gpu_uuid=$("$nvidia_smi" -i "$gpu" --query-gpu=uuid --format=csv,noheader | tr -d ' ') ||
        die "nvidia-smi knows no GPU $gpu"
    smi_file=$work/nvidia-smi.csv
    fields=index,name,uuid,driver_version,pci.bus_id,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,mig.mode.current,compute_mode
    "$nvidia_smi" -i "$gpu" --query-gpu=$fields --format=csv >"$smi_file" 2>/dev/null ||
        "$nvidia_smi" -i "$gpu" --query-gpu=index,name,uuid,driver_version --format=csv >"$smi_file"
    # The load numbers CUDA devices as NVML does.
    export CUDA_DEVICE_ORDER=PCI_BUS_ID
    [[ -z ${CUDA_VISIBLE_DEVICES:-} ]] ||
        echo "validate.sh: warning: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES renumbers CUDA devices; the report compares the load's GPU UUID with the agent's" >&2
fi

# --- One pass: collector, agent, load, queries. ------------------------------
run_pass() {
    local name=$1 adaptive=$2 dir=$work/$1
    mkdir -p "$dir"
    echo "== pass: $name sampling" >&2
    cat >"$dir/collector.toml" <<EOF
listen = "127.0.0.1:0"
plaintext = true
metrics_listen = "127.0.0.1:0"
data_dir = "$dir/data"
anonymous_tenant = "default"
EOF
    FLOPWATCH_LOG=info NO_COLOR=1 "$bin" collector --config "$dir/collector.toml" \
        >"$dir/collector.out" 2>"$dir/collector.log" &
    local collector_pid=$!
    pids+=("$collector_pid")
    wait_line "$dir/collector.out" "listening on" "$collector_pid" "the collector"
    url="http://$(sed -n 's/^listening on //p' "$dir/collector.out" | head -n 1)"

    local fake_env=() node="gpu-validate-$name"
    {
        echo "node_id = \"$node\""
        echo "collectors = [\"$url\"]"
        echo 'metrics_listen = ""'
        echo 'source = "nvml"'
        echo 'interval = "100ms"'
        echo 'flush_interval = "500ms"'
        echo '[attribution]'
        echo 'enabled = false'
        if [[ $dry == 1 ]]; then
            echo '[nvml]'
            echo "library_path = \"$fake_lib\""
        fi
        echo '[sampling]'
        echo "adaptive = $adaptive"
        echo 'min_interval = "100ms"'
    } >"$dir/agent.toml"
    if [[ $dry == 1 ]]; then
        # One fake GPU that follows the load's schedule file.
        fake_env=("FLOPWATCH_FAKE_NVML=gpus=1,schedule=$dir/schedule.txt")
    fi
    env "${fake_env[@]}" FLOPWATCH_LOG=info NO_COLOR=1 "$bin" agent --config "$dir/agent.toml" \
        >"$dir/agent.out" 2>"$dir/agent.log" &
    local agent_pid=$!
    pids+=("$agent_pid")

    # The GPU as the collector lists it.
    local i uuid=
    for i in $(seq 1 300); do
        kill -0 "$agent_pid" 2>/dev/null || die "the agent exited (log: $dir/agent.log)"
        uuid=$(fw_query gpus 2>/dev/null | "$py" -c '
import json, sys
want_index, want_uuid, node = int(sys.argv[1]), sys.argv[2], sys.argv[3]
for g in json.load(sys.stdin):
    if g["node_id"] == node and (g["uuid"] == want_uuid if want_uuid else g["index"] == want_index):
        print(g["uuid"])
' "$([[ $dry == 1 ]] && echo 0 || echo "$gpu")" "$gpu_uuid" "$node" 2>/dev/null || true)
        [[ -n $uuid ]] && break
        sleep 0.1
    done
    [[ -n $uuid ]] || die "the agent did not report GPU ${gpu_uuid:-0} within 30 s (log: $dir/agent.log)"
    # GPM needs two samples before the first tensor activity.
    local n=0
    for i in $(seq 1 100); do
        n=$(fw_query series --gpu "$uuid" --metric tensor_active --since 1m 2>/dev/null |
            "$py" -c 'import json, sys; print(len(json.load(sys.stdin)["values"]))' 2>/dev/null || echo 0)
        [[ $n -gt 0 ]] && break
        sleep 0.1
    done
    if [[ $n == 0 ]]; then
        echo "validate.sh: warning: no tensor_active sample from $uuid after 10 s: GPM is unavailable or refused (see the report and $dir/agent.log)" >&2
    fi

    local load_args=(--out "$dir/phases.json" --gpu "$gpu" --precisions "$precisions"
        --phase-seconds "$phase_s" --idle-seconds "$idle_s" --alt-seconds "$alt_s" --alt-cycles "$alt_cycles")
    if [[ $dry == 1 ]]; then
        load_args+=(--dry-run --schedule "$dir/schedule.txt")
    fi
    # Clocks, power and clock event reasons while the load runs (reads only).
    local smi_pid= collect_smi=()
    if [[ $dry == 0 ]]; then
        "$nvidia_smi" -i "$gpu" --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
            --format=csv,noheader,nounits -lms 200 >"$dir/smi-trace.csv" 2>/dev/null &
        smi_pid=$!
        pids+=("$smi_pid")
        collect_smi=(--smi-trace "$dir/smi-trace.csv")
    fi
    echo "   load on $uuid:" >&2
    "$py" "$here/load.py" "${load_args[@]}" >&2 || die "the load failed"
    # Let the last samples reach the collector (flush_interval 500 ms).
    sleep 2
    [[ -z $smi_pid ]] || stop_pid "$smi_pid"
    "$py" "$here/report.py" collect --phases "$dir/phases.json" --bin "$bin" --collector "$url" \
        --gpu "$uuid" --gpus-toml "$repo/config/gpus.toml" --guard-ms "$guard_ms" --interval-ms 100 \
        --tile "$tile" "${collect_smi[@]}" --out "$dir/pass.json" || die "querying the $name pass failed"
    stop_pid "$agent_pid"
    stop_pid "$collector_pid"
}

for p in "${pass_list[@]}"; do
    if [[ $p == adaptive ]]; then run_pass adaptive true; else run_pass fixed false; fi
done

render_args=(--out "$out" --date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --host "$(hostname)"
    --commit "$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)" --command "$cmdline")
for p in "${pass_list[@]}"; do
    render_args+=(--pass "$p=$work/$p/pass.json" --agent-log "$work/$p/agent.log")
done
if [[ $dry == 1 ]]; then
    render_args+=(--dry-run)
fi
if [[ -n $smi_file ]]; then
    render_args+=(--nvidia-smi "$smi_file")
fi
"$py" "$here/report.py" render "${render_args[@]}" || die "writing the report failed"
if [[ $dry == 1 ]]; then
    banner
fi
echo "report written to $out"
