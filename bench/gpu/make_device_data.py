#!/usr/bin/env python3
"""Fills .device-data/ (git-ignored) with real checkpoint tensors for
bench/gpu/run.sh: the step-400 BF16 model file whole (9.9 MB), a slice of
the FP32 optimizer file holding, for each of master / exp_avg / exp_avg_sq,
its first tensors up to --per-kind-mib MiB, and the same master tensors at
step 200 in step200/ (the GPU delta row). The default makes a folder of
~25 MB; bench/gpu/prepare.sh, which calls this script, sizes --per-kind-mib
to what is left of the 64 MiB a device call may send (tracked files ~16 MB,
.device-deps ~22 MB, this folder); the total is printed.

    python3 bench/gpu/make_device_data.py [--fixtures ../shared/fixtures] [--out .device-data]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess


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
    ap.add_argument("--per-kind-mib", type=float, default=3.7)
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
    # The same master tensors at step 200, in a subfolder (the benchmark's
    # data kinds come from the top folder only): the delta row of
    # tz_gpu_bench codes the step-400 masters against them.
    prev = os.path.join(a.fixtures, "gpt-small-step200-optim-fp32.safetensors")
    phdr, pstart = read_header(prev)
    masters = [(b0, name, info) for b0, name, info in keep if name.startswith("master.") and name in phdr]
    p_hdr, p_blobs, off = {}, [], 0
    with open(prev, "rb") as f:
        for _, name, _ in masters:
            b0, b1 = phdr[name]["data_offsets"]
            f.seek(pstart + b0)
            data = f.read(b1 - b0)
            p_hdr[name] = {"dtype": phdr[name]["dtype"], "shape": phdr[name]["shape"],
                           "data_offsets": [off, off + len(data)]}
            p_blobs.append(data)
            off += len(data)
    h = json.dumps(p_hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.join(a.out, "step200"), exist_ok=True)
    with open(os.path.join(a.out, "step200", "step200-optim-master-slice.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for d in p_blobs:
            f.write(d)
    total = 0
    for root, _, files in os.walk(a.out):
        total += sum(os.path.getsize(os.path.join(root, x)) for x in files)
    print(f"{a.out}: {total / 1e6:.1f} MB ({', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in used.items())}, "
          f"step-200 masters {off / 1e6:.1f} MB)")
    # What one device call sends: tracked and untracked-not-ignored files,
    # plus the carried .device-data and .device-deps (limit 64 MiB).
    try:
        files = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               check=True, capture_output=True).stdout.split(b"\0")
        tree = sum(os.path.getsize(os.path.join(repo, f.decode())) for f in files
                   if f and os.path.isfile(os.path.join(repo, f.decode())))
        deps_dir = os.path.join(repo, ".device-deps")
        deps = sum(os.path.getsize(os.path.join(deps_dir, x)) for x in os.listdir(deps_dir)) \
            if os.path.isdir(deps_dir) else 0
        sent = tree + total + deps
        print(f"one device call sends {sent / 1048576:.1f} MiB (tree {tree / 1e6:.1f} MB, data {total / 1e6:.1f} MB, "
              f".device-deps {deps / 1e6:.1f} MB): {'OK' if sent <= 64 * 1048576 else 'OVER the 64 MiB limit: lower --per-kind-mib'}")
    except (OSError, subprocess.CalledProcessError):
        pass


if __name__ == "__main__":
    main()
