#!/usr/bin/env python3
"""Checkpoint-aware coding benchmark (issue 6): whole-checkpoint ratio and
speed of tzip with and without prediction on the real fixture pair, beside
zstd -3 and ZipNN per tensor.

usage: python3 bench/predict_bench.py --tzip build-pred/programs/tzip \
           [--fixtures ../shared/fixtures] [--reps 5] [--work /tmp/predict_bench]

Rows (step 400 = its BF16 model file + FP32 optimizer file, 69.1 MB):
  tzip --no-predict   plain per-tensor coding (both files)
  tzip                cast prediction (BF16 weights from the FP32 masters)
  tzip --ref step200  cast + delta against the step-200 .tzip files
  tzip --ref step200 --ref-original step200.safetensors
                      delta fast path: the previous checkpoint's tensors read from its
                      safetensors files instead of decoded (compress and decompress; same file)
  tzip -l 3 ...       with --level3: the same three at level 3 (lane contexts)
  zstd -3             whole files (CLI), and per tensor (python zstandard)
  ZipNN               per tensor (bench/codec_bench.py wrapper), if installed
Speeds: best of --reps wall-clock runs of the CLI (includes reading the
inputs from the page cache and fsync of the outputs), and process CPU time.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def run(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    el = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return el, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def size_of(paths):
    return sum(os.path.getsize(p) for p in paths)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tzip", required=True)
    ap.add_argument("--fixtures", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/predict_bench")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--level3", action="store_true", help="also the level-3 rows (lane contexts)")
    a = ap.parse_args()
    fx = Path(a.fixtures)
    st = {s: [fx / f"gpt-small-step{s}-model-bf16.safetensors", fx / f"gpt-small-step{s}-optim-fp32.safetensors"]
          for s in (200, 400)}
    if not all(p.exists() for v in st.values() for p in v):
        print(f"fixtures not found in {fx}", file=sys.stderr)
        return 77
    w = Path(a.work)
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    T = [a.tzip]
    thr = ["-T", str(a.threads)] if a.threads else []
    raw = size_of(st[400])

    def outs(d, step):
        return [w / d / p.name.replace(".safetensors", ".tzip") for p in st[step]]

    (w / "s200").mkdir()
    run(T + ["compress", "-q", "-f"] + thr + [str(p) for p in st[200]] + ["-o", str(w / "s200")])
    rows = []

    def measure(label, d, extra, dextra=()):
        (w / d).mkdir(exist_ok=True)
        best = None
        for _ in range(a.reps):
            el, cpu = run(T + ["compress", "-q", "-f"] + thr + extra + [str(p) for p in st[400]] + ["-o", str(w / d)])
            best = (el, cpu) if best is None or el < best[0] else best
        o = outs(d, 400)
        comp = size_of(o)
        # decompress (a) each file by itself: the model file then decodes the
        # optimizer's master weights once more; (b) the checkpoint in one call
        # (sources restored first and read back as predictors)
        dbest = None
        for _ in range(a.reps):
            el = cpu = 0.0
            for f in o:
                e, c = run(T + ["decompress", "-q", "-f"] + thr + list(dextra) + [str(f), "-o", str(w / (f.name + ".out"))])
                el += e
                cpu += c
            dbest = (el, cpu) if dbest is None or el < dbest[0] else dbest
        for f, src in zip(o, st[400]):
            if (w / (f.name + ".out")).read_bytes() != src.read_bytes():
                raise SystemExit(f"{f}: round trip differs")
        cbest = None
        (w / (d + ".out")).mkdir(exist_ok=True)
        for _ in range(a.reps):
            e, c = run(T + ["decompress", "-q", "-f"] + thr + list(dextra) + [str(f) for f in o] +
                       ["-o", str(w / (d + ".out"))])
            cbest = (e, c) if cbest is None or e < cbest[0] else cbest
        for src in st[400]:
            if (w / (d + ".out") / src.name).read_bytes() != src.read_bytes():
                raise SystemExit(f"{src.name}: checkpoint round trip differs")
        rows.append((label, comp, best, dbest, cbest))

    measure("tzip --no-predict (plain per-tensor)", "plain", ["--no-predict"])
    measure("tzip (cast prediction, standalone)", "cast", [])
    refs = ["--ref", str(outs("s200", 200)[0]), "--ref", str(outs("s200", 200)[1])]
    measure("tzip --ref step200 (cast + delta)", "delta", refs)
    # Fast path: step 200's safetensors files stand in for decoding its .tzip files. The
    # decompress side gets the optimizer pair (the model file references step 400's optimizer
    # file, whose delta reference is step 200's).
    measure("tzip --ref step200 --ref-original (delta, fast path)", "deltafast",
            refs + ["--ref-original", str(st[200][0]), "--ref-original", str(st[200][1])],
            ["--ref", str(outs("s200", 200)[1]), "--ref-original", str(st[200][1])])
    if outs("delta", 400)[1].read_bytes() != outs("deltafast", 400)[1].read_bytes():
        raise SystemExit("--ref-original changed the compressed file")
    if a.level3:
        # Level 3: lane-context tables for exponents (doc/format.md 5.6), the strongest level.
        measure("tzip -l 3 --no-predict (plain per-tensor)", "plain3", ["-l", "3", "--no-predict"])
        measure("tzip -l 3 (cast prediction, standalone)", "cast3", ["-l", "3"])
        measure("tzip -l 3 --ref step200 (cast + delta)", "delta3", ["-l", "3"] + refs)
    # zstd -3, whole files
    zs = 0
    zt = None
    for _ in range(a.reps):
        t0 = time.perf_counter()
        zs = 0
        for p in st[400]:
            zs += len(subprocess.run(["zstd", "-3", "-c", "-q", str(p)], check=True, capture_output=True).stdout)
        el = time.perf_counter() - t0
        zt = el if zt is None or el < zt else zt
    rows.append(("zstd -3 (whole files, CLI)", zs, (zt, None), None, None))
    # per tensor: zstd -3 (python zstandard) and ZipNN
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    tensors = []
    try:
        from codec_data import read_safetensors
        for p in st[400]:
            tensors += read_safetensors(p)
    except Exception as e:  # noqa: BLE001
        print(f"per-tensor rows skipped: {e}", file=sys.stderr)
    if tensors:
        try:
            import zstandard
            c = zstandard.ZstdCompressor(level=3)
            rows.append(("zstd -3 per tensor (zstandard)", sum(len(c.compress(b)) for _, _, b in tensors), None, None,
                         None))
        except ImportError:
            pass
        try:
            from codec_runners import ZipNN
            z = ZipNN(2)
            n = 0
            t0 = time.perf_counter()
            for _, dt, b in tensors:
                key = {"BF16": "bf16", "F32": "f32", "F16": "f16"}.get(dt)
                if key is None or key not in z.z:
                    n += len(b)
                else:
                    n += len(z.compress(bytearray(b), key))
            rows.append(("ZipNN per tensor (byte mode, dtype-aware)", n, (time.perf_counter() - t0, None), None, None))
        except Exception as e:  # noqa: BLE001
            print(f"ZipNN row skipped: {e}", file=sys.stderr)

    print(f"step 400 checkpoint: {raw} bytes ({len(st[400])} files); reps {a.reps}, threads {a.threads or 'all'}")
    print("| method | compressed bytes | ratio | compress MB/s (CPU s) | decompress, file by file MB/s (CPU s) "
          "| decompress, checkpoint in one call MB/s (CPU s) |")
    print("|---|---|---|---|---|---|")
    for label, comp, c, d, cc in rows:
        cs = "-" if c is None else f"{raw / c[0] / 1e6:.0f}" + ("" if c[1] is None else f" ({c[1]:.2f})")
        ds = "-" if d is None else f"{raw / d[0] / 1e6:.0f} ({d[1]:.2f})"
        cd = "-" if cc is None else f"{raw / cc[0] / 1e6:.0f} ({cc[1]:.2f})"
        print(f"| {label} | {comp} | {raw / comp:.3f} | {cs} | {ds} | {cd} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
