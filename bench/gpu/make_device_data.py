#!/usr/bin/env python3
"""Fills .device-data/ (git-ignored) with real checkpoint tensors for
bench/gpu/run.sh: the step-400 BF16 model file whole (9.9 MB) and a slice of
the FP32 optimizer file holding, for each of master / exp_avg / exp_avg_sq,
its first tensors up to --per-kind-mib MiB. The default keeps the folder at
~28 MB, so that it and the nvCOMP wheel in .whl/ (~30 MB) fit the device
tool's 64 MiB carry limit.

    python3 bench/gpu/make_device_data.py [--fixtures ../shared/fixtures] [--out .device-data]
"""
import argparse
import json
import os
import shutil
import struct


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--fixtures", default=os.path.join(repo, "..", "shared", "fixtures"))
    ap.add_argument("--out", default=os.path.join(repo, ".device-data"))
    ap.add_argument("--per-kind-mib", type=float, default=6.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = os.path.join(a.fixtures, "gpt-small-step400-model-bf16.safetensors")
    shutil.copyfile(model, os.path.join(a.out, "step400-model-bf16.safetensors"))

    optim = os.path.join(a.fixtures, "gpt-small-step400-optim-fp32.safetensors")
    hdr, start = read_header(optim)
    budget = a.per_kind_mib * 1048576
    used = {"master.": 0, "exp_avg.": 0, "exp_avg_sq.": 0}
    keep = []
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        kind = next(k for k in ("exp_avg_sq.", "exp_avg.", "master.") if name.startswith(k))
        b0, b1 = info["data_offsets"]
        if used[kind] + (b1 - b0) > budget:
            continue
        used[kind] += b1 - b0
        keep.append((b0, name, info))
    keep.sort()
    out_hdr, blobs, off = {"__metadata__": hdr.get("__metadata__", {})}, [], 0
    with open(optim, "rb") as f:
        for b0, name, info in keep:
            f.seek(start + b0)
            data = f.read(info["data_offsets"][1] - b0)
            out_hdr[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [off, off + len(data)]}
            blobs.append(data)
            off += len(data)
    h = json.dumps(out_hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(a.out, "step400-optim-fp32-slice.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for d in blobs:
            f.write(d)
    total = sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out))
    print(f"{a.out}: {total / 1e6:.1f} MB ({', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in used.items())})")


if __name__ == "__main__":
    main()
