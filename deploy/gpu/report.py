#!/usr/bin/env python3
"""Compares a load's measured throughput with flopwatch's OFU, per phase.

Used by deploy/gpu/validate.sh in two steps:

  report.py collect  --phases P.json --bin FLOPWATCH --collector URL --gpu UUID ... --out PASS.json
      while a pass's collector runs: for each phase of the load, flopwatch's
      OFU (`flopwatch query ofu --start --end`, OFU eq. 1 with the
      window-averaged SM clock, eq. 11 window-weighted mean) and the raw
      series (tensor_active, sm_clock_mhz, sm_clock_avg_mhz) over the phase's
      window; the tile padding of each GEMM (`flopwatch tile`, eq. 2-4).

  report.py render --pass NAME=PASS.json ... --out REPORT.md
      the markdown report.

The query window of a phase is [start + guard, end): with fixed sampling
every sample in it covers only time inside the phase (a sample is stamped at
the end of its window). Samples whose window starts before the phase (long
adaptive windows) are counted in the report.

Peak TFLOP/s and the tensor-core clock f_max come from the GPU spec table
the collector uses (config/gpus.toml), looked up the way the collector
looks a model up (key, then case-insensitive substring, first entry wins).

Standard library only (Python 3.11+: tomllib).
"""

import argparse
import json
import math
import re
import subprocess
import sys
import tomllib

METRICS = ("tensor_active", "sm_clock_mhz", "sm_clock_avg_mhz")

PASS_TEXT = {
    "fixed": "Agent `interval = \"100ms\"`: every capture sent, one sample per 100 ms.",
    "adaptive": "Agent `[sampling] adaptive = true`, `min_interval = \"100ms\"`: sends back off while "
                "peaks are stable, each sample carrying its window's mean (Moneo §2.3).",
}


def fail(msg):
    sys.exit(f"report.py: {msg}")


# ---------------------------------------------------------------------------
# GPU spec table.


FORM_FACTOR_TOKENS = ("pcie", "nvl")


def _tokens(s):
    """A model name's words, as config/src/specs.rs splits them."""
    t = [w.lower() for w in re.split(r"[\s_-]+", s) if w]
    return t[1:] if t[:1] == ["nvidia"] else t


def _token_matches(p, n):
    return n == p or (p[-1:].isalpha() and n.startswith(p) and n[len(p):].isdigit())


def _specificity(pattern, name):
    if not all(any(_token_matches(p, n) for n in name) for p in pattern):
        return None
    if not all(n in pattern for n in name if n in FORM_FACTOR_TOKENS):
        return None
    return len(pattern)


def spec_for(table_path, model):
    """The collector's own rule (SpecTable::lookup): an exact key, else the
    row whose pattern matches most words (ties: the earlier row)."""
    with open(table_path, "rb") as f:
        table = tomllib.load(f)
    entries = table.get("gpu", [])
    m = model.lower()
    for e in entries:
        if e.get("key") == m:
            return e
    name = _tokens(model)
    best = None
    for e in entries:
        scores = [x for x in (_specificity(_tokens(p), name) for p in e.get("match", [])) if x is not None]
        if scores and (best is None or max(scores) > best[0]):
            best = (max(scores), e)
    return best[1] if best else None


def peak_tflops(spec, precision):
    """OFU paper eq. 5: SMs × FLOPs/cycle/SM × f_max."""
    fpc = spec["flops_per_clock_per_sm"].get(precision)
    if fpc is None:
        return None
    return spec["sm_count"] * fpc * spec["tensor_clock_mhz"] * 1e6 / 1e12


def ofu_eq1(tpa, clk, fmax):
    """OFU eq. 1 with the collector's clamp (proto/src/ofu.rs)."""
    return min(max(tpa, 0.0), 1.0) * min(max(clk, 0.0), fmax) / fmax


# ---------------------------------------------------------------------------
# flopwatch CLI.


class Flopwatch:
    def __init__(self, binary, collector):
        self.binary = binary
        self.collector = collector

    def run(self, *args):
        r = subprocess.run([self.binary, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"flopwatch {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r.stdout

    def query(self, *args):
        return json.loads(self.run("query", *args, "--collector", self.collector, "--json"))

    def series(self, gpu, metric, start, end):
        try:
            s = self.query("series", "--gpu", gpu, "--metric", metric, "--start", start, "--end", end,
                           "--limit", 1_000_000)
        except RuntimeError as e:
            if "NotFound" in str(e):
                return []
            raise
        ts, vals = s.get("timestamps_ms", []), s.get("values", [])
        win = s.get("window_ms") or [None] * len(ts)
        return list(zip(ts, vals, win))

    def tile(self, m, n, k, kernel, fallback):
        """(padded / theoretical FLOPs, where the tile shape came from).

        torch multiplies row-major matrices; cuBLAS sees the column-major
        transpose (C^T = B^T A^T), so the kernel's M is torch's N: the
        problem is passed to `flopwatch tile` as N M K."""
        tries = []
        if kernel:
            tries.append((["--kernel", kernel], "kernel name"))
            t = re.search(r"tilesize(\d+)x(\d+)x(\d+)", kernel)
            if t:
                tries.append((["--tile", "x".join(t.groups())], "kernel name tile size (cluster 1x1 assumed)"))
        tile, _, cluster = fallback.partition(":")
        tries.append((["--tile", tile] + (["--cluster", cluster] if cluster else []),
                      f"assumed {fallback} (no tile shape in the kernel name)" if kernel
                      else f"assumed {fallback} (kernel unknown)"))
        for args, source in tries:
            try:
                out = self.run("tile", n, m, k, *args)
            except RuntimeError:
                continue
            theo = re.search(r"^2MNK\s+([0-9.eE+-]+) FLOPs", out, re.M)
            pad = re.search(r"^padded \(eq\. 3-4\)\s+([0-9.eE+-]+) FLOPs", out, re.M)
            shape = re.search(r"^tile (\S+), cluster (\S+)", out, re.M)
            if theo and pad:
                ratio = float(pad.group(1)) / float(theo.group(1))
                desc = f"{shape.group(1)} cluster {shape.group(2)}" if shape else "?"
                return ratio, f"{desc}, {source}"
        return None, "flopwatch tile failed"


# ---------------------------------------------------------------------------
# collect


def weighted(rows, interval_ms, start=None):
    """rows: (ts, value, window_ms|None) → (Σw·v/Σw, Σw) or (None, 0).

    With `start`, a window counts only from there, as the collector's OFU
    query counts it (collector/src/query.rs: a sample is stamped at its
    window's end, and the first one of a range can cover time before it)."""
    num = den = 0.0
    for t, v, w in rows:
        w = w if w else interval_ms
        if start is not None:
            w = min(w, t - start)
        w = max(w, 1)
        num += w * v
        den += w
    return (num / den if den else None), den


def collect(a):
    with open(a.phases, encoding="utf-8") as f:
        load = json.load(f)
    fw = Flopwatch(a.bin, a.collector)
    gpus = fw.query("gpus")
    gpu = next((g for g in gpus if g["uuid"] == a.gpu), None)
    if gpu is None:
        fail(f"GPU {a.gpu} unknown to the collector (it lists {[g['uuid'] for g in gpus]})")
    spec = spec_for(a.gpus_toml, gpu["model"])
    if spec is None:
        fail(f"no entry of {a.gpus_toml} matches the GPU model {gpu['model']!r}: add it there")
    fmax = float(spec["tensor_clock_mhz"])
    first = min(p["start_ms"] for p in load["phases"])
    last = max(p["end_ms"] for p in load["phases"])
    all_tpa = fw.series(a.gpu, "tensor_active", first, last)
    out = {
        "load": {k: v for k, v in load.items() if k != "phases"},
        "gpu": gpu,
        "spec": {"key": spec["key"], "name": spec.get("name"), "sm_count": spec["sm_count"],
                 "tensor_clock_mhz": fmax,
                 "peak_tflops": {p: peak_tflops(spec, p) for p in ("bf16", "fp16")}},
        "collector_peak_tflops": None,
        "tensor_active_samples": len(all_tpa),
        "guard_ms": a.guard_ms,
        "interval_ms": a.interval_ms,
        "phases": [],
    }
    smi = read_smi_trace(a.smi_trace) if a.smi_trace else []
    tiles = {}
    for ph in load["phases"]:
        start, end = ph["start_ms"], ph["end_ms"]
        qa, qb = start + a.guard_ms, end
        r = {"name": ph["name"], "kind": ph["kind"], "dtype": ph["dtype"], "start_ms": start,
             "end_ms": end, "query_start_ms": qa, "query_end_ms": qb, "tflops": ph["tflops"],
             "flops": ph["flops"], "busy_ms": ph["busy_ms"], "parts": ph["parts"]}
        peak = out["spec"]["peak_tflops"].get(ph["dtype"]) if ph["dtype"] else None
        r["peak_tflops"] = peak
        r["mfu"] = ph["tflops"] / peak if peak else (0.0 if ph["kind"] == "idle" else None)
        # Tile padding (eq. 2-4) per GEMM shape, weighted by its FLOPs.
        padded, sources = 0.0, []
        for part in ph["parts"]:
            key = (part["m"], part["n"], part["k"], part.get("kernel"))
            if key not in tiles:
                tiles[key] = fw.tile(part["m"], part["n"], part["k"], part.get("kernel"), a.tile)
            ratio, src = tiles[key]
            part["tile"] = src
            part["padding"] = ratio
            sources.append(src)
            if ratio is None:
                padded = None
            elif padded is not None:
                padded += ratio * 2.0 * part["m"] * part["n"] * part["k"] * part["iterations"]
        r["mfu_padded"] = (r["mfu"] * padded / ph["flops"]
                           if r["mfu"] is not None and padded is not None and ph["flops"] > 0
                           else (0.0 if ph["kind"] == "idle" else None))
        if qb - qa <= 0:
            r["error"] = "phase shorter than the guard"
            out["phases"].append(r)
            continue
        o = fw.query("ofu", "--gpu", a.gpu, "--start", qa, "--end", qb)
        r["ofu_flopwatch"] = o["ofu"] if o.get("samples") else None
        r["ofu_samples"] = o.get("samples", 0)
        if o.get("peak_tflops"):
            out["collector_peak_tflops"] = o["peak_tflops"]
        s = {m: fw.series(a.gpu, m, qa, qb) for m in METRICS}
        tpa = s["tensor_active"]
        pt = {t: v for t, v, _ in s["sm_clock_mhz"]}
        avg = {t: v for t, v, _ in s["sm_clock_avg_mhz"]}
        r["samples"] = len(tpa)
        r["tpa"], covered = weighted(tpa, a.interval_ms, qa)
        r["coverage"] = covered / (qb - qa) if tpa and all(w for _, _, w in tpa) else None
        r["early_samples"] = sum(1 for t, _, w in tpa if w and t - w < start)
        r["ofu_point"], _ = weighted([(t, ofu_eq1(v, pt[t], fmax), w) for t, v, w in tpa if t in pt],
                                     a.interval_ms, qa)
        # The collector's rule (collector/src/ingest.rs): the averaged clock,
        # else the point clock of the same capture. A check on the stored OFU.
        r["ofu_recomputed"], _ = weighted(
            [(t, ofu_eq1(v, avg.get(t, pt.get(t)), fmax), w) for t, v, w in tpa if t in avg or t in pt],
            a.interval_ms, qa)
        # The same with the SM boost clock NVML reports as the
        # denominator instead of the tensor clock f_max: how far the
        # paper's tensor-clock domain (§IV-D) explains what this GPU does.
        fboost = float(gpu.get("max_sm_clock_mhz") or 0)
        if fboost > 0:
            r["ofu_boost"], _ = weighted(
                [(t, ofu_eq1(v, avg.get(t, pt.get(t)), fboost), w) for t, v, w in tpa if t in avg or t in pt],
                a.interval_ms, qa)
        if smi:
            r["smi"] = smi_phase(smi, start, end)
        r["clock_point_mhz"], _ = weighted(s["sm_clock_mhz"], a.interval_ms, qa)
        r["clock_avg_mhz"], _ = weighted(s["sm_clock_avg_mhz"], a.interval_ms, qa)
        if load.get("mode") == "dry-run":
            r["stand_in_tpa"] = stand_in_level(ph)
        out["phases"].append(r)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)


# Clock event ("throttle") reasons as nvidia-smi reports them (NVML's
# nvmlClocksEventReasons bits).
EVENT_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
    0x100: "display clock setting",
}


def read_smi_trace(path):
    """`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,
    clocks_event_reasons.active --format=csv,noheader,nounits -lms N` lines →
    [(unix ms, clock MHz, power W, temperature C, reasons bitmask)]."""
    from datetime import datetime, timezone
    rows = []
    try:
        f = open(path, encoding="utf-8")
    except OSError:
        return rows
    with f:
        for line in f:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) < 5:
                continue
            try:
                t = datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").astimezone(timezone.utc)
                rows.append((int(t.timestamp() * 1000), float(cells[1]), float(cells[2]), float(cells[3]),
                             int(cells[4], 16)))
            except ValueError:
                continue
    return rows


def smi_phase(rows, start, end):
    """Mean clock, power and temperature over a phase, and the clock event
    reasons seen with the share of readings showing each."""
    inside = [r for r in rows if start <= r[0] < end]
    if not inside:
        return None
    n = len(inside)
    reasons = {}
    for bit, name in EVENT_REASONS.items():
        k = sum(1 for r in inside if r[4] & bit)
        if k:
            reasons[name] = k / n
    return {"readings": n, "clock_mhz": sum(r[1] for r in inside) / n,
            "power_w": sum(r[2] for r in inside) / n, "temperature_c": max(r[3] for r in inside),
            "reasons": reasons}


def stand_in_level(ph):
    """The tensor activity the dry run told the fake GPU, time-weighted."""
    if ph["kind"] == "idle" or not ph["parts"]:
        return 0.0
    num = den = 0.0
    for p in ph["parts"]:
        num += p["stand_in_tpa"] * p["busy_ms"]
        den += p["busy_ms"]
    return num / den if den else None


# ---------------------------------------------------------------------------
# render


def pct(x, digits=2):
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f} %"


def num(x, fmt="{:.0f}"):
    return "n/a" if x is None or not math.isfinite(x) else fmt.format(x)


def tflops(x):
    if x is None:
        return "n/a"
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def render(a):
    passes = []
    for spec in a.passes:
        name, _, path = spec.partition("=")
        with open(path, encoding="utf-8") as f:
            passes.append((name, json.load(f)))
    if not passes:
        fail("no --pass given")
    dry = a.dry_run
    p0 = passes[0][1]
    lines = []
    w = lines.append
    w("# GPU validation: flopwatch OFU against a measured tensor-core load")
    w("")
    if dry:
        w("> **DRY RUN — NOT A GPU MEASUREMENT.** The agent read a fake")
        w("> libnvidia-ml (the workspace's `agent/fake-nvml`), whose GPU 0 showed a")
        w("> made-up tensor activity while each phase of a CPU stand-in load ran. The")
        w("> numbers below check that the script, the windows and the queries line up;")
        w("> they say nothing about any GPU. A real run (`deploy/gpu/validate.sh` on a")
        w("> machine with an NVIDIA GPU) writes docs/GPU-VALIDATION.md.")
        w("")
    w(f"- Date: {a.date}; host: `{a.host}`; flopwatch `{a.commit}`")
    w(f"- Command: `{a.command}`")
    g = p0["gpu"]
    w(f"- GPU (NVML, as the agent reported it): {g['model']}, `{g['uuid']}`, driver {g.get('driver_version') or '?'}, "
      f"{g.get('sm_count') or '?'} SMs, max SM clock {g.get('max_sm_clock_mhz') or '?'} MHz")
    if a.nvidia_smi:
        with open(a.nvidia_smi, encoding="utf-8") as f:
            smi = [l.rstrip() for l in f if l.strip()]
        w("- `nvidia-smi --query-gpu` before the run:")
        w("")
        w("  ```")
        for l in smi:
            w(f"  {l}")
        w("  ```")
    dev = p0["load"]["device"]
    if dry:
        w(f"- Load: {dev['name']}; each GEMM is the GPU shape divided by {p0['load'].get('dry_scale')} "
          "in every dimension, timed with the wall clock")
    else:
        w(f"- Load: PyTorch {dev.get('torch')}, CUDA {dev.get('cuda')}, `torch.matmul` on {dev.get('name')}, "
          "timed with CUDA events")
        if dev.get("uuid") and dev["uuid"].lower().removeprefix("gpu-") != g["uuid"].lower().removeprefix("gpu-"):
            w(f"- **The load ran on CUDA device `{dev['uuid']}`, not on the GPU the agent read "
              f"(`{g['uuid']}`): the comparison is void.**")
    s = p0["spec"]
    pk = s["peak_tflops"]
    w(f"- Peak (config/gpus.toml entry `{s['key']}`, OFU paper eq. 5): {s['sm_count']} SMs × FLOPs/clock/SM × "
      f"{s['tensor_clock_mhz']:.0f} MHz tensor clock = {num(pk.get('bf16'), '{:.1f}')} TFLOP/s bf16, "
      f"{num(pk.get('fp16'), '{:.1f}')} TFLOP/s fp16 (dense)")
    cp = next((p["collector_peak_tflops"] for _, p in passes if p.get("collector_peak_tflops")), None)
    if cp is not None and pk.get("fp16") and abs(cp - pk["fp16"]) > 0.05:
        w(f"- **The collector's peak ({cp:.1f} TFLOP/s) differs from config/gpus.toml's "
          f"({pk['fp16']:.1f}): it was built with another table.**")
    w("- GPM (tensor pipe activity, Hopper and newer): " + gpm_line(passes, a))
    w("")
    w("Per phase: **MFU** = load TFLOP/s (2·M·N·K per GEMM) ÷ peak; **MFU padded** counts the FLOPs the")
    w("tensor cores executed with the tile padding of OFU eq. 2–4 (`flopwatch tile`, tile shape from the")
    w("cuBLAS kernel name where it carries one); **OFU (avg clock)** is flopwatch's stored OFU")
    w("(`flopwatch query ofu --gpu UUID --start --end`: eq. 1 with the window-averaged SM clock, eq. 11")
    w("window-weighted, a window counting only from the query's start); **OFU (point clock)** is eq. 1")
    w(f"with the instantaneous SM clock, from the raw series. Query window: [phase start + {p0['guard_ms']} ms,")
    w("phase end); **Coverage** is the time the samples' windows cover inside the query window. OFU")
    w("counts padded FLOPs, so it should track MFU padded (OFU paper Table II: ≤ 2 pp after the")
    w("correction on H100). **TPA × f/f_boost** is not flopwatch's OFU: eq. 1 with the SM boost clock")
    w("NVML reports in place of the tensor clock f_max, to show how much of a gap the tensor clock")
    w("domain of §IV-D explains on this GPU.")
    for name, p in passes:
        w("")
        w(f"## Pass: {name}")
        w("")
        w(PASS_TEXT.get(name, ""))
        w("")
        hdr = ["Phase", "Window (s)", "Samples", "Coverage", "Load TFLOP/s", "MFU", "MFU padded",
               "OFU (avg clock)", "OFU (point clock)", "TPA", "SM clock avg (MHz)", "SM clock point (MHz)",
               "OFU − MFU padded (pp)", "TPA × f/f_boost", "f_boost − MFU padded (pp)"]
        if dry:
            hdr.append("Stand-in TPA")
        w("| " + " | ".join(hdr) + " |")
        w("|" + "|".join(["---"] + ["---:"] * (len(hdr) - 1)) + "|")
        errs = []
        for r in p["phases"]:
            d = None
            if r.get("ofu_flopwatch") is not None and r.get("mfu_padded") is not None:
                d = 100 * (r["ofu_flopwatch"] - r["mfu_padded"])
            db = None
            if r.get("ofu_boost") is not None and r.get("mfu_padded") is not None:
                db = 100 * (r["ofu_boost"] - r["mfu_padded"])
            row = [r["name"], f"{(r['end_ms'] - r['start_ms']) / 1e3:.1f}", str(r.get("samples", 0)),
                   pct(r.get("coverage"), 0), tflops(r.get("tflops")), pct(r.get("mfu"), 4 if dry else 2),
                   pct(r.get("mfu_padded"), 4 if dry else 2), pct(r.get("ofu_flopwatch")),
                   pct(r.get("ofu_point")), pct(r.get("tpa")), num(r.get("clock_avg_mhz")),
                   num(r.get("clock_point_mhz")), num(d, "{:+.2f}"), pct(r.get("ofu_boost")),
                   num(db, "{:+.2f}")]
            if dry:
                row.append(pct(r.get("stand_in_tpa")))
            w("| " + " | ".join(row) + " |")
            if r.get("error"):
                errs.append(f"{r['name']}: {r['error']}")
            if r["kind"] != "idle" and r.get("busy_ms") and r["end_ms"] > r["start_ms"]:
                busy = r["busy_ms"] / (r["end_ms"] - r["start_ms"])
                if busy < 0.98:
                    errs.append(f"{r['name']}: the timed GEMMs cover only {100 * busy:.1f} % of the window "
                                "(host gaps between batches)")
            if r.get("early_samples"):
                errs.append(f"{r['name']}: {r['early_samples']} sample(s) whose window starts before the phase")
            ofu, rec = r.get("ofu_flopwatch"), r.get("ofu_recomputed")
            if ofu is not None and rec is not None and abs(ofu - rec) > 0.001:
                errs.append(f"{r['name']}: stored OFU {pct(ofu)} differs from eq. 1 recomputed from the raw "
                            f"series ({pct(rec)})")
        gemm = [r for r in p["phases"] if r["kind"] != "idle" and r.get("ofu_flopwatch") is not None]
        if gemm:
            def mae(key):
                xs = [abs(r["ofu_flopwatch"] - r[key]) for r in gemm if r.get(key) is not None]
                return f"{100 * sum(xs) / len(xs):.2f} pp" if xs else "n/a"
            w("")
            w(f"Mean absolute error (OFU paper eq. 9) over the {len(gemm)} busy phases: OFU vs MFU {mae('mfu')}, "
              f"OFU vs MFU padded {mae('mfu_padded')}. tensor_active samples in the pass: "
              f"{p['tensor_active_samples']}.")
            xs = [abs(r["ofu_boost"] - r["mfu_padded"]) for r in gemm
                  if r.get("ofu_boost") is not None and r.get("mfu_padded") is not None]
            if xs:
                w("")
                w(f"With the SM boost clock as the denominator (TPA × f/f_boost, not flopwatch's OFU): "
                  f"{100 * sum(xs) / len(xs):.2f} pp against MFU padded.")
        smi_rows = [(r["name"], r["smi"]) for r in p["phases"] if r.get("smi")]
        if smi_rows:
            w("")
            w("`nvidia-smi` every 200 ms during the phase (mean clock and power, highest temperature, the")
            w("clock event reasons with the share of readings that showed each):")
            w("")
            w("| Phase | Readings | SM clock (MHz) | Power (W) | Temp. (°C) | Clock event reasons |")
            w("|---|---:|---:|---:|---:|---|")
            for ph, m in smi_rows:
                rs = ", ".join(f"{k} {100 * v:.0f} %" for k, v in m["reasons"].items()) or "none"
                w(f"| {ph} | {m['readings']} | {m['clock_mhz']:.0f} | {m['power_w']:.0f} | "
                  f"{m['temperature_c']:.0f} | {rs} |")
        tiles = list(dict.fromkeys((r["name"], part.get("kernel") or "unknown", part.get("tile") or "n/a")
                                   for r in p["phases"] for part in r["parts"]))
        if tiles and name == passes[0][0]:
            w("")
            w("Kernels and tile shapes:")
            w("")
            for ph, k, t in tiles:
                w(f"- {ph}: `{k}` — {t}")
        for e in errs:
            w(f"- Note: {e}")
    w("")
    w("The script changed no clock, power limit or MIG mode and did not reset the GPU.")
    text = "\n".join(lines) + "\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


def gpm_line(passes, a):
    g = passes[0][1]["gpu"]
    supported = bool(g.get("gpm_supported"))
    samples = sum(p["tensor_active_samples"] for _, p in passes)
    parts = [f"NVML reports it {'supported' if supported else 'NOT supported'}"]
    parts += [f"{p['tensor_active_samples']} tensor_active samples in the {name} pass" for name, p in passes]
    notes = []
    for path in a.agent_log or []:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                notes += [l.strip() for l in f if "nvmlGpm" in l and l.strip() not in notes]
        except OSError:
            pass
    if any(re.search(r"permission", n, re.I) for n in notes):
        parts.append("**the agent was refused GPM (insufficient permissions): it needs root, or the driver "
                     "loaded with NVreg_RestrictProfilingToAdminUsers=0**")
    elif notes:
        parts.append("**GPM calls failed** (below)")
    elif not supported:
        parts.append("**no tensor activity without GPM: OFU cannot be measured on this GPU through NVML** "
                     "(pre-Hopper GPUs need the dcgm-exporter source)")
    elif samples == 0:
        parts.append("**no tensor activity arrived** although no GPM call failed (see the agent logs)")
    else:
        parts.append("no GPM call failed in the agent logs: no extra permission was needed")
    s = "; ".join(parts)
    for n in notes[:5]:
        s += f"\n  - agent log: `{n[:300]}`"
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--phases", required=True)
    c.add_argument("--bin", required=True)
    c.add_argument("--collector", required=True)
    c.add_argument("--gpu", required=True, help="GPU UUID")
    c.add_argument("--gpus-toml", required=True)
    c.add_argument("--guard-ms", type=int, default=200)
    c.add_argument("--interval-ms", type=int, default=100)
    c.add_argument("--tile", default="256x128x64:2x1", help="TMxTNxTK[:CMxCN] when the kernel name has none")
    c.add_argument("--smi-trace", help="nvidia-smi -lms trace of the pass (real runs)")
    c.add_argument("--out", required=True)
    r = sub.add_parser("render")
    r.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME=PASS.json")
    r.add_argument("--out", required=True)
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--nvidia-smi")
    r.add_argument("--agent-log", action="append")
    r.add_argument("--date", default="")
    r.add_argument("--host", default="")
    r.add_argument("--commit", default="")
    r.add_argument("--command", default="")
    a = p.parse_args()
    collect(a) if a.cmd == "collect" else render(a)


if __name__ == "__main__":
    main()
