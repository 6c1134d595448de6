"""The report of bench/codec_bench.py: one markdown table (ratio, distance to the order-0 bound,
compress and decompress GB/s single-threaded and with all threads, per data kind and codec), the
header that says how and where it was measured, and the notes under it.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import shlex
import sys
import time
from pathlib import Path

from codec_data import Kind
from machine import cpu_model, cpu_simd_flags, git_state, load_average


def versions() -> str:
    out = []
    for pkg in ("zstandard", "lz4", "zipnn", "numpy", "ml_dtypes"):
        try:
            out.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import zstandard
        out.append(f"libzstd {zstandard.ZSTD_VERSION[0]}.{zstandard.ZSTD_VERSION[1]}.{zstandard.ZSTD_VERSION[2]}")
    except Exception:
        pass
    return ", ".join(out)


def gbps(nbytes: int, secs: float) -> str:
    if secs <= 0:
        return "—"
    v = nbytes / secs / 1e9
    return f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def render(kinds: dict[str, Kind], codecs: list[str], names: dict[str, str], res: dict, threads: int,
           mt_ok: dict[str, bool]) -> str:
    N = threads
    lines = [f"| data | codec | ratio | size vs H0 bound | comp 1T GB/s (CPU) | dec 1T GB/s (CPU) | "
             f"comp {N}T GB/s (wall) | dec {N}T GB/s (wall) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for k, kind in kinds.items():
        first = True
        mb = kind.nbytes / 1e6
        head = f"**{kind.label}** ({mb:.1f} MB, {len(kind.tensors)} tensors)"
        lines.append(f"| {head} | order-0 bound | {kind.nbytes / kind.bound_bytes:.3f} | 0% | | | | |")
        for c in codecs:
            st = res.get((c, 1, k))
            mt = res.get((c, N, k)) if N > 1 else st
            if st is None:
                continue
            ratio = kind.nbytes / st.size
            dist = (st.size / kind.bound_bytes - 1) * 100
            row = [" ", names[c], f"{ratio:.3f}", f"{dist:+.1f}%", gbps(kind.nbytes, st.ctime),
                   gbps(kind.nbytes, st.dtime)]
            if mt is not None and mt_ok[c]:
                row += [gbps(kind.nbytes, mt.ctime), gbps(kind.nbytes, mt.dtime)]
            else:
                row += ["—", "—"]
            lines.append("| " + " | ".join(row) + " |")
            first = False
    return "\n".join(lines)


def report_header(args, *, lib: Path, simd_default: str, threads: int, reps: int, budget: float, res: dict,
                  heap_mode: str, load0: list[str], t_begin: float) -> list[str]:
    """How and where the table was measured (the report's bullet list)."""
    load1 = load_average()
    cmd = command_line()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    reps_used = sorted({cell.reps for cell in res.values()})
    header = [
        f"command: `{cmd}`",
        f"date: {now}; wall time {time.time() - t_begin:.0f} s",
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; all-threads runs use {threads} threads; "
        f"load average {' '.join(load0)} before, {' '.join(load1)} after",
        f"tensorzip: {lib} (git {git_state()}); {versions()}"
        + (f"; rows marked (base): {args.base_lib}" if args.base_lib else ""),
        f"SIMD path: {simd_default} (what this CPU and build pick; TZ_SIMD={os.environ.get('TZ_SIMD', '')!r})"
        + (f"; rows marked [path] ran that path (--simd {args.simd})" if args.simd else "")
        + f"; CPU SIMD flags: {cpu_simd_flags()}",
        f"timing: median over up to {reps} repetitions per cell (no new one after {budget:g} s; repetitions "
        f"used: {', '.join(map(str, reps_used))}), repetitions interleaved across codecs, each round starting one "
        f"codec further on; every round trip "
        f"verified byte for byte; allocator: {heap_mode}",
    ]
    return header


def report_notes(kinds: dict[str, Kind], threads: int) -> list[str]:
    notes = [
        "Each tensor is compressed on its own; sizes and times are summed per data kind. GB/s = 1e9 bytes of "
        "uncompressed data per second, compress and decompress, in-process (Python calls; output buffers are "
        "allocated per call for every codec). 1T columns: process CPU time of the calls (equals wall time on an "
        "idle core and does not count time lost to other jobs on a shared machine); all-threads columns: wall "
        "time, so they depend on how busy the machine was (load average above).",
        "Order-0 bound: per tensor, sum over tensorzip's byte planes (BF16: exponent, sign|mantissa7; FP16: high, "
        "low byte; FP32: exponent, sign|mantissa[22:16], mantissa[15:8], mantissa[7:0]; FP8: the byte) of "
        "n·H0(plane) bits, without any table or header cost. 'size vs H0 bound' = compressed size / bound − 1.",
        "tensorzip = default level (1); tensorzip L2 = level 2; tensorzip L3 = level 3 (lane contexts). zstd uses libzstd worker threads for the "
        "all-threads compress columns (decompression is single-threaded in libzstd); lz4 has no thread option (—). "
        "ZipNN: byte input with bytearray_dtype set to the tensor's dtype, default method, threads=1 or "
        f"{threads}.",
    ]
    if "whole" in kinds:
        notes.append(f"Whole checkpoint = BF16 weights + FP32 master + Adam m + Adam v of the same step "
                     f"({len(kinds['whole'].tensors)} tensors), each compressed alone: sizes and median times of "
                     f"those four rows added up.")
    return notes


def render_report(header: list[str], table: str, notes: list[str]) -> str:
    return "\n".join(["## tensorzip codec benchmark", ""] + [f"- {h}" for h in header] + ["", table, ""] +
                      [f"- {n}" for n in notes]) + "\n"


def command_line() -> str:
    """This process's command, as a shell would take it."""
    return "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], os.getcwd())] + sys.argv[1:])


def write_json(path: Path, *, kinds: dict[str, Kind], names: dict, res: dict, table: str, notes: list[str],
               simd_path: str, threads: int) -> None:
    """The run as data: every cell (codec key and name, threads, data kind, compressed bytes, median
    compress and decompress seconds), the data kinds' sizes, and the rendered table and notes."""
    doc = {
        "command": command_line(),
        "simd_path": simd_path,
        "threads": threads,
        "kinds": {k: {"label": kind.label, "nbytes": kind.nbytes, "tensors": len(kind.tensors)}
                  for k, kind in kinds.items()},
        "cells": [{"codec": c, "name": names[c], "threads": th, "kind": k, "size": cell.size, "comp_s": cell.ctime,
                   "dec_s": cell.dtime, "reps": cell.reps} for (c, th, k), cell in res.items()],
        "table": table,
        "notes": notes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
