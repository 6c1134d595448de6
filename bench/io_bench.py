#!/usr/bin/env python3
"""Checkpoint save/load with torch.save and safetensors on the same data as
tz_io_bench (the step-400 fixture checkpoint tiled to --gib), for the
"Checkpoint I/O" table of bench/experiments/notebook.md.

    python3 bench/io_bench.py --fixtures ../shared/fixtures --gib 4 --dir /path/on/disk --dir /dev/shm/x

Saves are followed by fsync of the file and its folder; before each load the
file is dropped from the page cache (posix_fadvise DONTNEED). Skips a library
that is not installed.
"""
import argparse
import os
import time


def fsync_file_and_dir(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", action="append", required=True)
    args = ap.parse_args()
    try:
        import torch
        from safetensors.torch import load_file as st_load
        from safetensors.torch import save_file as st_save
    except ImportError as e:  # pragma: no cover
        print(f"skipped: {e}")
        return
    base = {}
    for f in ("gpt-small-step400-model-bf16.safetensors", "gpt-small-step400-optim-fp32.safetensors"):
        base.update(st_load(os.path.join(args.fixtures, f)))
    base_bytes = sum(t.numel() * t.element_size() for t in base.values())
    tiles = int(-(-args.gib * (1 << 30) // base_bytes))
    # Distinct tensors per tile (torch.save would store shared storage once).
    sd = {f"t{k}.{n}": t.clone() for k in range(tiles) for n, t in base.items()}
    total = base_bytes * tiles
    print(f"data: {tiles} tiles, {len(sd)} tensors, {total / 1e9:.3f} GB; torch {torch.__version__}")
    print("| storage | method | seconds | GB/s (raw bytes) | stall s | ratio | notes |")
    print("|---|---|---|---|---|---|---|")
    for root in args.dir:
        os.makedirs(root, exist_ok=True)
        where = "tmpfs" if root.startswith("/dev/shm") else "disk"
        for name, save, load in (
            ("torch.save", lambda p: torch.save(sd, p), lambda p: torch.load(p, weights_only=True)),
            ("safetensors save_file", lambda p: st_save(sd, p), lambda p: st_load(p)),
        ):
            path = os.path.join(root, "bench.ckpt")
            t0 = time.perf_counter()
            save(path)
            fsync_file_and_dir(path)
            ts = time.perf_counter() - t0
            size = os.path.getsize(path)
            print(f"| {where} | {name} (save) | {ts:.2f} | {total / ts / 1e9:.2f} | {ts:.2f} | "
                  f"{total / size:.3f} | + fsync |", flush=True)
            drop_cache(path)
            t0 = time.perf_counter()
            back = load(path)  # both read every tensor into memory (no mmap)
            tl = time.perf_counter() - t0
            print(f"| {where} | {name.split()[0]} load | {tl:.2f} | {total / tl / 1e9:.2f} | 0.00 | "
                  f"{total / size:.3f} | page cache dropped first |", flush=True)
            del back
            os.remove(path)


if __name__ == "__main__":
    main()
