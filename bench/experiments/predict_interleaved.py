#!/usr/bin/env python3
"""Interleaved timing of tzip compress / decompress with and without
prediction on the fixture step-400 checkpoint (plain, cast, cast + delta,
delta fast path: --ref-original step-200 safetensors on compress and decompress),
ROUNDS rounds of one run each, medians: steadier than best-of-N on a shared
machine. usage: predict_interleaved.py TZIP FIXTURES WORKDIR [ROUNDS] [THREADS] [LEVEL]"""
import os
import resource
import statistics
import subprocess
import sys
import time

tz, fx, w = sys.argv[1], sys.argv[2], sys.argv[3]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 15
thr = ["-T", sys.argv[5]] if len(sys.argv) > 5 and sys.argv[5] != "all" else []
lvl = ["-l", sys.argv[6]] if len(sys.argv) > 6 else []
st = {s: [f"{fx}/gpt-small-step{s}-model-bf16.safetensors", f"{fx}/gpt-small-step{s}-optim-fp32.safetensors"]
      for s in (200, 400)}
for d in ("s200", "plain", "cast", "delta", "deltafast", "out"):
    os.makedirs(f"{w}/{d}", exist_ok=True)
subprocess.run([tz, "compress", "-q", "-f"] + lvl + st[200] + ["-o", f"{w}/s200"], check=True)
refs = sum([["--ref", f"{w}/s200/" + os.path.basename(p).replace(".safetensors", ".tzip")] for p in st[200]], [])
ref_orig = sum([["--ref-original", p] for p in st[200]], [])
opt_ref = ["--ref", f"{w}/s200/" + os.path.basename(st[200][1]).replace(".safetensors", ".tzip"),
           "--ref-original", st[200][1]]
cfg = {"plain": ["--no-predict"], "cast": [], "delta": refs, "deltafast": refs + ref_orig}
dcfg = {"plain": [], "cast": [], "delta": [], "deltafast": opt_ref}


def timed(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    el = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return el, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


res = {(k, op): [] for k in cfg for op in ("c", "d")}
for _ in range(rounds):
    for k, extra in cfg.items():
        res[(k, "c")].append(timed([tz, "compress", "-q", "-f"] + thr + lvl + extra + st[400] + ["-o", f"{w}/{k}"]))
        outs = [f"{w}/{k}/" + os.path.basename(p).replace(".safetensors", ".tzip") for p in st[400]]
        res[(k, "d")].append(timed([tz, "decompress", "-q", "-f"] + thr + dcfg[k] + outs + ["-o", f"{w}/out"]))
raw = sum(os.path.getsize(p) for p in st[400])
print(f"{rounds} interleaved rounds, threads {thr[1] if thr else 'all'}, level {lvl[1] if lvl else 'default'}; medians")
print("| method | compress wall s | compress CPU s | decompress (checkpoint) wall s | decompress CPU s |")
print("|---|---|---|---|---|")
for k in cfg:
    c, d = res[(k, "c")], res[(k, "d")]
    print(f"| {k} | {statistics.median(x[0] for x in c):.3f} | {statistics.median(x[1] for x in c):.3f} | "
          f"{statistics.median(x[0] for x in d):.3f} | {statistics.median(x[1] for x in d):.3f} |")
