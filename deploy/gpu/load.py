#!/usr/bin/env python3
"""Tensor-core load with known FLOPs, for deploy/gpu/validate.sh.

Runs a fixed list of phases on one GPU and writes, per phase, its wall-clock
window (unix ms), the GEMMs it ran, their FLOPs (2·M·N·K each) and the
throughput measured with CUDA events:

* bf16 and fp16 GEMMs at 8192³, 4096³, 1024³ and 8192×8192×8200 (K off the
  tile grid: tile quantization, OFU paper eq. 2-4),
* an idle gap,
* an alternating pattern, 16384³ and 4096³ in turn (OFU paper Table I).

Each phase allocates its matrices and warms up before its window opens, and
synchronizes before it closes, so the window holds only the timed GEMMs. The
cuBLAS kernel of each shape is read once with torch.profiler (outside the
window) so the report can apply the tile padding of the kernel actually used.

--dry-run replaces the GPU by a CPU stand-in (pure Python GEMMs 128× smaller
in each dimension, timed with the wall clock) and appends each phase's
boundaries to --schedule, a file the fake libnvidia-ml follows
(FLOPWATCH_FAKE_NVML=schedule=PATH): its GPU 0 then shows a fixed stand-in
tensor activity while a phase runs and none in between. Nothing a dry run
writes is a GPU measurement.

Only the standard library, plus torch for a real run. This script never
changes clocks, power limits or MIG mode.
"""

import argparse
import json
import os
import sys
import time
from operator import mul

# The GPU phases: (name, dtype, [(m, n, k), ...]). One shape is a steady GEMM;
# two alternate every --alt-seconds.
GEMM_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (1024, 1024, 1024), (8192, 8192, 8200)]
ALTERNATING = [(16384, 16384, 16384), (4096, 4096, 4096)]

# Dry run: each dimension divided by this for the CPU stand-in (8200 -> 65
# keeps K off a multiple of the others), and the tensor activity the fake
# GPU shows while a shape runs. These levels are made up, picked to look
# like a GPU (large GEMMs near 75 %, small ones lower); they only check that
# windows, queries and the report line up.
DRY_SCALE = 128
DRY_LEVEL = {16384: 0.80, 8192: 0.76, 4096: 0.68, 1024: 0.35}


def now_ms():
    return time.time_ns() // 1_000_000


def shape_name(m, n, k):
    return f"{m}x{n}x{k}" if not (m == n == k) else f"{m}³"


def phase_list(precisions, include_idle=True, include_alt=True):
    phases = []
    for dt in precisions:
        for (m, n, k) in GEMM_SHAPES:
            phases.append({"name": f"{dt} {shape_name(m, n, k)}", "kind": "gemm", "dtype": dt,
                           "gpu_shapes": [[m, n, k]]})
    if include_idle:
        phases.append({"name": "idle gap", "kind": "idle", "dtype": None, "gpu_shapes": []})
    if include_alt:
        dt = precisions[0]
        a, b = ALTERNATING
        phases.append({"name": f"{dt} {shape_name(*a)} ⇄ {shape_name(*b)}", "kind": "alternating",
                       "dtype": dt, "gpu_shapes": [list(a), list(b)]})
    return phases


class Schedule:
    """The fake driver's schedule file (dry run only): `UNIX_MS LEVEL` lines."""

    def __init__(self, path):
        self.path = path
        if path:
            with open(path, "a", encoding="ascii"):
                pass

    def mark(self, t_ms, level):
        if not self.path:
            return
        # One short write per line: the fake reads whole lines only.
        with open(self.path, "a", encoding="ascii") as f:
            f.write(f"{t_ms} {level:.4f}\n")


# ---------------------------------------------------------------------------
# GPU: torch.


class Gpu:
    def __init__(self, index):
        import torch  # noqa: imported here so a dry run never needs it

        self.torch = torch
        if not torch.cuda.is_available():
            sys.exit("load.py: torch sees no CUDA device (torch.cuda.is_available() is False)")
        if index >= torch.cuda.device_count():
            sys.exit(f"load.py: no CUDA device {index} (torch sees {torch.cuda.device_count()})")
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        props = torch.cuda.get_device_properties(self.device)
        uuid = getattr(props, "uuid", None)
        self.info = {
            "name": props.name,
            "uuid": str(uuid) if uuid is not None else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cublas_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        }
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}

    def prepare(self, dtype, m, n, k):
        t = self.torch
        dt = self.dtypes[dtype]
        a = t.randn(m, k, device=self.device, dtype=dt)
        b = t.randn(k, n, device=self.device, dtype=dt)
        c = t.empty(m, n, device=self.device, dtype=dt)

        def step():
            t.matmul(a, b, out=c)

        for _ in range(3):
            step()
        t.cuda.synchronize()
        # Iterations per timed batch: about 0.2 s of work, so one host sync
        # per batch costs nothing measurable.
        e0, e1 = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(3):
            step()
        e1.record()
        e1.synchronize()
        per_iter_ms = max(e0.elapsed_time(e1) / 3, 1e-3)
        batch = max(1, min(int(200 / per_iter_ms), 10_000))
        return {"step": step, "batch": batch, "kernel": self.kernel_of(step), "keep": (a, b, c)}

    def kernel_of(self, step):
        """Name of the longest GPU kernel one call runs, or None."""
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                self.torch.cuda.synchronize()
            best = None
            for e in prof.events():
                if "cuda" not in str(getattr(e, "device_type", "")).lower():
                    continue
                dur = e.time_range.elapsed_us()
                if best is None or dur > best[0]:
                    best = (dur, e.name)
            return best[1] if best else None
        except Exception as e:  # profiler unavailable (no CUPTI): report without
            print(f"load.py: kernel name unavailable: {e}", file=sys.stderr)
            return None

    def run(self, prepared, seconds):
        """Runs batches until `seconds` pass; (iterations, GPU ms)."""
        t = self.torch
        iters, gpu_ms = 0, 0.0
        end = time.monotonic() + seconds
        while True:
            e0, e1 = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(prepared["batch"]):
                prepared["step"]()
            e1.record()
            e1.synchronize()
            gpu_ms += e0.elapsed_time(e1)
            iters += prepared["batch"]
            if time.monotonic() >= end:
                return iters, gpu_ms

    def sync(self):
        self.torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# Dry run: a CPU stand-in, pure Python.


class Cpu:
    def __init__(self):
        import platform

        self.info = {"name": f"CPU stand-in ({platform.processor() or platform.machine()}), pure Python",
                     "uuid": None, "torch": None, "cuda": None}

    def prepare(self, dtype, m, n, k):
        a = [[((i * 7 + j * 3) % 11) / 11.0 for j in range(k)] for i in range(m)]
        bt = [[((i * 5 + j) % 13) / 13.0 for i in range(k)] for j in range(n)]  # B transposed

        def step():
            return [[sum(map(mul, row, col)) for col in bt] for row in a]

        return {"step": step, "batch": 1, "kernel": None}

    def run(self, prepared, seconds):
        iters, busy_ns = 0, 0
        end = time.monotonic() + seconds
        while True:
            t0 = time.perf_counter_ns()
            prepared["step"]()
            busy_ns += time.perf_counter_ns() - t0
            iters += 1
            if time.monotonic() >= end:
                return iters, busy_ns / 1e6

    def sync(self):
        pass


# ---------------------------------------------------------------------------


def run_phase(dev, phase, args, schedule):
    dry = args.dry_run
    shapes = phase["gpu_shapes"]
    if phase["kind"] == "idle":
        dev.sync()
        start = now_ms()
        schedule.mark(start, 0.0)
        time.sleep(args.idle_seconds)
        end = now_ms()
        return {**phase, "start_ms": start, "end_ms": end, "parts": [], "flops": 0.0,
                "busy_ms": 0.0, "tflops": 0.0}
    run_shapes = [[max(1, -(-d // DRY_SCALE)) for d in s] for s in shapes] if dry else shapes
    prepared = [dev.prepare(phase["dtype"], *s) for s in run_shapes]
    parts = [{"m": s[0], "n": s[1], "k": s[2], "gpu_shape": g, "iterations": 0, "busy_ms": 0.0,
              "kernel": p["kernel"]} for s, g, p in zip(run_shapes, shapes, prepared)]
    if dry:
        for part in parts:
            part["stand_in_tpa"] = DRY_LEVEL.get(part["gpu_shape"][0], 0.5)
    if phase["kind"] == "gemm":
        segments = [(0, args.phase_seconds)]
    else:
        segments = [(i % 2, args.alt_seconds) for i in range(2 * args.alt_cycles)]
    dev.sync()
    start = now_ms()
    for n, (which, seconds) in enumerate(segments):
        t = start if n == 0 else now_ms()
        schedule.mark(t, parts[which].get("stand_in_tpa", 0.0))
        iters, busy_ms = dev.run(prepared[which], seconds)
        parts[which]["iterations"] += iters
        parts[which]["busy_ms"] += busy_ms
    dev.sync()
    end = now_ms()
    schedule.mark(end, 0.0)
    flops = sum(2.0 * p["m"] * p["n"] * p["k"] * p["iterations"] for p in parts)
    busy_ms = sum(p["busy_ms"] for p in parts)
    return {**phase, "start_ms": start, "end_ms": end, "parts": parts, "flops": flops,
            "busy_ms": busy_ms, "tflops": flops / (busy_ms / 1e3) / 1e12 if busy_ms > 0 else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for the phases")
    p.add_argument("--gpu", type=int, default=0, help="CUDA device index (PCI bus order)")
    p.add_argument("--precisions", default="bf16,fp16", help="comma-separated: bf16, fp16")
    p.add_argument("--phase-seconds", type=float, default=10.0, help="length of each GEMM phase")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="length of the idle gap")
    p.add_argument("--alt-seconds", type=float, default=5.0, help="length of one alternating segment")
    p.add_argument("--alt-cycles", type=int, default=2, help="16384/4096 pairs in the alternating phase")
    p.add_argument("--dry-run", action="store_true", help="CPU stand-in, no GPU (not a measurement)")
    p.add_argument("--schedule", help="dry run: the fake driver's schedule file to append to")
    args = p.parse_args()
    precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    bad = [x for x in precisions if x not in ("bf16", "fp16")]
    if bad or not precisions:
        sys.exit(f"load.py: --precisions {args.precisions!r}: expected bf16 and/or fp16")
    if min(args.phase_seconds, args.idle_seconds, args.alt_seconds) <= 0 or args.alt_cycles < 1:
        sys.exit("load.py: phase lengths must be positive and --alt-cycles at least 1")
    if args.schedule and not args.dry_run:
        sys.exit("load.py: --schedule drives the fake driver and goes only with --dry-run")

    dev = Cpu() if args.dry_run else Gpu(args.gpu)
    schedule = Schedule(args.schedule)
    out = {"mode": "dry-run" if args.dry_run else "gpu", "device": dev.info,
           "dry_scale": DRY_SCALE if args.dry_run else 1, "phases": []}
    for phase in phase_list(precisions):
        r = run_phase(dev, phase, args, schedule)
        out["phases"].append(r)
        secs = (r["end_ms"] - r["start_ms"]) / 1e3
        print(f"  {r['name']:<28} {secs:6.1f} s  {r['tflops']:12.6g} TFLOP/s", flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
