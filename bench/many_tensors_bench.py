#!/usr/bin/env python3
"""Time of header handling against the tensor count (issue 14 item 3).

Writes safetensors files of N one-element FP32 tensors (the worst case for
per-tensor costs: headers and bookkeeping, no data), then times, for each N,
interleaved over ROUNDS rounds (medians):
  compress   tzip compress -f FILE -o OUT.tzip (default threads: all cores)
  inspect    tzip inspect OUT.tzip > /dev/null
  decompress tzip decompress -f OUT.tzip -o BACK.safetensors
  safe_open  tensorzip.safe_open(OUT.tzip): open, keys(), one get_tensor (in a fresh
             interpreter; the interpreter start is measured apart and subtracted)
  st_safe_open  the same with safetensors.safe_open(FILE) on the .safetensors input
             (the same interpreter start and imports, subtracted the same way)
Wall time on a shared machine is noisy: the CPU time of each command is printed beside it.
usage: many_tensors_bench.py --tzip BUILD/programs/tzip [--counts 20000,200000] [--rounds 3]
       [--work DIR] [--python PY] [--no-python]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def write_safetensors(path, n):
    header = {"__metadata__": {"format": "pt"}}
    for i in range(n):
        header[f"layers.{i}.scale"] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(struct.pack(f"<{n}f", *(float(i % 97) for i in range(n))))


# Both imports in every timed interpreter, so that one start-up figure is
# subtracted from both readers.
IMPORTS = "import sys, tensorzip, safetensors"
SAFE_OPEN = IMPORTS + """
opener = tensorzip.safe_open if sys.argv[2] == "tensorzip" else safetensors.safe_open
with opener(sys.argv[1], framework="np") as f:
    k = f.keys()
    f.get_tensor(k[len(k) // 2])
"""


def timed(cmd):
    """(wall seconds, CPU seconds: user + system of the command)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} {cmd[1]} failed (exit {p.returncode})")
    return wall, ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tzip", required=True)
    ap.add_argument("--counts", default="20000,200000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--no-python", action="store_true")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="tz-many-")
    counts = [int(x) for x in a.counts.split(",")]
    files = {}
    for n in counts:
        src = os.path.join(work, f"many-{n}.safetensors")
        if not os.path.exists(src):
            write_safetensors(src, n)
        files[n] = src
    ops = ["compress", "inspect", "decompress"] + ([] if a.no_python else ["safe_open", "st_safe_open"])
    res = {(n, op): [] for n in counts for op in ops}
    start = []
    for _ in range(a.rounds):
        if not a.no_python:
            start.append(timed([a.python, "-c", IMPORTS]))
        for n in counts:
            src, out, back = files[n], os.path.join(work, f"many-{n}.tzip"), os.path.join(work, f"back-{n}.safetensors")
            res[(n, "compress")].append(timed([a.tzip, "compress", "-q", "-f", src, "-o", out]))
            res[(n, "inspect")].append(timed([a.tzip, "inspect", out]))
            res[(n, "decompress")].append(timed([a.tzip, "decompress", "-q", "-f", out, "-o", back]))
            if not a.no_python:
                res[(n, "safe_open")].append(timed([a.python, "-c", SAFE_OPEN, out, "tensorzip"]))
                res[(n, "st_safe_open")].append(timed([a.python, "-c", SAFE_OPEN, src, "safetensors"]))
            if open(src, "rb").read() != open(back, "rb").read():
                sys.exit(f"round trip of {src} is not byte-identical")
    base = [statistics.median(x[k] for x in start) if start else 0.0 for k in (0, 1)]
    print(f"{a.rounds} interleaved rounds, medians, seconds as wall / CPU (user + system); safe_open columns minus "
          f"{base[0]:.3f} / {base[1]:.3f} s of interpreter start and import")
    print("| tensors | stored header bytes | " + " | ".join(ops) + " |")
    print("|---|---|" + "---|" * len(ops))
    for n in counts:
        out = os.path.join(work, f"many-{n}.tzip")
        with open(out, "rb") as f:
            f.seek(-40, os.SEEK_END)
            hsize = struct.unpack("<Q", f.read(8))[0]
        cells = []
        for op in ops:
            sub = base if op.endswith("safe_open") else (0.0, 0.0)
            w = statistics.median(x[0] for x in res[(n, op)]) - sub[0]
            c = statistics.median(x[1] for x in res[(n, op)]) - sub[1]
            cells.append(f"{w:.3f} / {c:.3f}")
        print(f"| {n} | {hsize} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
