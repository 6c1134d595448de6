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


def best_of(reps, fn):
    """The (wall, cpu) pair of the fastest of reps calls of fn."""
    best = None
    for _ in range(reps):
        r = fn()
        best = r if best is None or r[0] < best[0] else best
    return best


class Checkpoints:
    """The fixture's step-200 and step-400 files, the work folder and the tzip command."""

    def __init__(self, a):
        fx = Path(a.fixtures)
        self.st = {s: [fx / f"gpt-small-step{s}-model-bf16.safetensors", fx / f"gpt-small-step{s}-optim-fp32.safetensors"]
                   for s in (200, 400)}
        self.found = all(p.exists() for v in self.st.values() for p in v)
        self.fixtures = fx
        self.w = Path(a.work)
        self.T = [a.tzip]
        self.thr = ["-T", str(a.threads)] if a.threads else []
        self.reps = a.reps
        self.raw = size_of(self.st[400]) if self.found else 0
        self.rows = []

    def outs(self, d, step):
        return [self.w / d / p.name.replace(".safetensors", ".tzip") for p in self.st[step]]

    def compress(self, d, extra, step=400):
        return run(self.T + ["compress", "-q", "-f"] + self.thr + extra + [str(p) for p in self.st[step]] +
                   ["-o", str(self.w / d)])

    def decompress_files(self, files, dextra, out):
        return run(self.T + ["decompress", "-q", "-f"] + self.thr + list(dextra) + [str(f) for f in files] +
                   ["-o", str(out)])

    def measure(self, label, d, extra, dextra=()):
        """One tzip row: compress the step-400 pair, decompress (a) each file by itself (the model
        file then decodes the optimizer's master weights once more), (b) the checkpoint in one call
        (sources restored first and read back as predictors); every round trip checked."""
        w = self.w
        (w / d).mkdir(exist_ok=True)
        best = best_of(self.reps, lambda: self.compress(d, extra))
        o = self.outs(d, 400)

        def file_by_file():
            el = cpu = 0.0
            for f in o:
                e, c = self.decompress_files([f], dextra, w / (f.name + ".out"))
                el += e
                cpu += c
            return el, cpu

        dbest = best_of(self.reps, file_by_file)
        for f, src in zip(o, self.st[400]):
            if (w / (f.name + ".out")).read_bytes() != src.read_bytes():
                raise SystemExit(f"{f}: round trip differs")
        (w / (d + ".out")).mkdir(exist_ok=True)
        cbest = best_of(self.reps, lambda: self.decompress_files(o, dextra, w / (d + ".out")))
        for src in self.st[400]:
            if (w / (d + ".out") / src.name).read_bytes() != src.read_bytes():
                raise SystemExit(f"{src.name}: checkpoint round trip differs")
        self.rows.append((label, size_of(o), best, dbest, cbest))

    def tzip_rows(self, level3):
        self.measure("tzip --no-predict (plain per-tensor)", "plain", ["--no-predict"])
        self.measure("tzip (cast prediction, standalone)", "cast", [])
        refs = ["--ref", str(self.outs("s200", 200)[0]), "--ref", str(self.outs("s200", 200)[1])]
        self.measure("tzip --ref step200 (cast + delta)", "delta", refs)
        # Fast path: step 200's safetensors files stand in for decoding its .tzip files. The
        # decompress side gets the optimizer pair (the model file references step 400's optimizer
        # file, whose delta reference is step 200's).
        st = self.st
        self.measure("tzip --ref step200 --ref-original (delta, fast path)", "deltafast",
                     refs + ["--ref-original", str(st[200][0]), "--ref-original", str(st[200][1])],
                     ["--ref", str(self.outs("s200", 200)[1]), "--ref-original", str(st[200][1])])
        if self.outs("delta", 400)[1].read_bytes() != self.outs("deltafast", 400)[1].read_bytes():
            raise SystemExit("--ref-original changed the compressed file")
        if level3:
            # Level 3: lane-context tables for exponents (doc/format.md 5.6), the strongest level.
            self.measure("tzip -l 3 --no-predict (plain per-tensor)", "plain3", ["-l", "3", "--no-predict"])
            self.measure("tzip -l 3 (cast prediction, standalone)", "cast3", ["-l", "3"])
            self.measure("tzip -l 3 --ref step200 (cast + delta)", "delta3", ["-l", "3"] + refs)

    def peer_rows(self):
        """zstd -3 on whole files (CLI), then per tensor: zstd -3 (python zstandard) and ZipNN."""
        def zstd_files():
            t0 = time.perf_counter()
            n = sum(len(subprocess.run(["zstd", "-3", "-c", "-q", str(p)], check=True, capture_output=True).stdout)
                    for p in self.st[400])
            return time.perf_counter() - t0, n

        zt, zs = best_of(self.reps, zstd_files)
        self.rows.append(("zstd -3 (whole files, CLI)", zs, (zt, None), None, None))
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        tensors = []
        try:
            from codec_data import read_safetensors
            for p in self.st[400]:
                tensors += read_safetensors(p)
        except Exception as e:  # noqa: BLE001
            print(f"per-tensor rows skipped: {e}", file=sys.stderr)
        if not tensors:
            return
        try:
            import zstandard
            c = zstandard.ZstdCompressor(level=3)
            self.rows.append(("zstd -3 per tensor (zstandard)", sum(len(c.compress(b)) for _, _, b in tensors), None,
                              None, None))
        except ImportError:
            pass
        try:
            from codec_runners import ZipNN
            z = ZipNN(2)
            n = 0
            t0 = time.perf_counter()
            for _, dt, b in tensors:
                key = {"BF16": "bf16", "F32": "f32", "F16": "f16"}.get(dt)
                n += len(b) if key is None or key not in z.z else len(z.compress(bytearray(b), key))
            self.rows.append(("ZipNN per tensor (byte mode, dtype-aware)", n, (time.perf_counter() - t0, None), None,
                              None))
        except Exception as e:  # noqa: BLE001
            print(f"ZipNN row skipped: {e}", file=sys.stderr)

    def print_table(self, threads):
        raw = self.raw
        print(f"step 400 checkpoint: {raw} bytes ({len(self.st[400])} files); reps {self.reps}, "
              f"threads {threads or 'all'}")
        print("| method | compressed bytes | ratio | compress MB/s (CPU s) | decompress, file by file MB/s (CPU s) "
              "| decompress, checkpoint in one call MB/s (CPU s) |")
        print("|---|---|---|---|---|---|")
        for label, comp, c, d, cc in self.rows:
            cs = "-" if c is None else f"{raw / c[0] / 1e6:.0f}" + ("" if c[1] is None else f" ({c[1]:.2f})")
            ds = "-" if d is None else f"{raw / d[0] / 1e6:.0f} ({d[1]:.2f})"
            cd = "-" if cc is None else f"{raw / cc[0] / 1e6:.0f} ({cc[1]:.2f})"
            print(f"| {label} | {comp} | {raw / comp:.3f} | {cs} | {ds} | {cd} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tzip", required=True)
    ap.add_argument("--fixtures", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/predict_bench")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--level3", action="store_true", help="also the level-3 rows (lane contexts)")
    a = ap.parse_args()
    ck = Checkpoints(a)
    if not ck.found:
        print(f"fixtures not found in {ck.fixtures}", file=sys.stderr)
        return 77
    shutil.rmtree(ck.w, ignore_errors=True)
    ck.w.mkdir(parents=True)
    (ck.w / "s200").mkdir()
    ck.compress("s200", [], step=200)
    ck.tzip_rows(a.level3)
    ck.peer_rows()
    ck.print_table(a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
