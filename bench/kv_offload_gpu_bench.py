"""KV offloading between a CUDA device and host memory (doc/kv.md "vLLM KV offloading"): store and
load GB/s of raw KV, per transfer of --blocks blocks, for

- ``raw copy``: the blocks copied device -> pinned host memory and back (PCIe, no codec);
- ``device codec``: encoded on the device, only the encoded bytes copied to host memory
  (``PageCodec.encode_rows`` of a CUDA tensor); loaded by copying them back and decoding on the
  device (``decode_rows`` into a CUDA tensor): the offloading spec's device path;
- ``CPU codec``: the blocks copied to host memory and encoded there on every CPU thread; decoded
  there and copied to the device: the spec's path without the CUDA kernels (``device_codec`` false).

    python3 bench/kv_offload_gpu_bench.py [--blocks 1024] [--runs 7]

The blocks are real KV (layer 0 of the fixture GPT, tests/data/kv-fixture-l0.safetensors: per
32-token block the K bytes then the V bytes, 32 KiB), repeated to --blocks (each page codes on its
own, so repeats cost what new pages cost); the tables are calibrated on the first sequence. GB/s:
raw KV bytes over the median time of --runs (each timed from a synchronised device to a result on
the other side). Needs a CUDA device and a tensorzip build with the KV CUDA kernels.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def real_blocks(n: int):
    import torch
    from safetensors.torch import load_file

    d = load_file(str(ROOT / "tests" / "data" / "kv-fixture-l0.safetensors"))
    k = d["k"].reshape(-1, 32 * 8 * 32).contiguous().view(torch.uint8)  # (16, 16 KiB): 2 sequences
    v = d["v"].reshape(-1, 32 * 8 * 32).contiguous().view(torch.uint8)
    blocks = torch.cat([k, v], dim=1)  # (16, 32 KiB)
    reps = (n + blocks.shape[0] - 1) // blocks.shape[0]
    return blocks[:8], blocks.repeat(reps, 1)[:n].contiguous()


def timed(fn, runs: int) -> float:
    import torch

    fn()  # warm-up (tables upload, allocator)
    ts = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    import torch

    import tensorzip.kv as tkv

    if not (tkv.cuda_available() and torch.cuda.is_available()):
        print("kv_offload_gpu_bench: no CUDA device with the KV codec's CUDA kernels; nothing measured")
        return 1
    sample, blocks = real_blocks(args.blocks)
    codec = tkv.PageCodec.calibrate(sample.view(torch.bfloat16).reshape(-1), row_shape=())
    dev = blocks.to("cuda")
    raw = dev.numel()
    pinned = torch.empty_like(blocks).pin_memory()
    out = torch.empty_like(dev)
    held = {}

    def raw_store():
        pinned.copy_(dev, non_blocking=True)
        torch.cuda.current_stream().synchronize()

    def raw_load():
        out.copy_(pinned, non_blocking=True)

    def device_store():
        held["gpu"] = codec.encode_rows(dev)

    def device_load():
        codec.decode_rows(held["gpu"], out)

    def cpu_store():
        held["cpu"] = codec.encode_rows(dev.cpu().numpy())

    def cpu_load():
        host = codec.decode_rows(held["cpu"], torch.empty_like(blocks))
        out.copy_(host)

    rows = []
    for name, store, load in (("raw copy", raw_store, raw_load), ("device codec", device_store, device_load),
                              ("CPU codec", cpu_store, cpu_load)):
        ts, tl = timed(store, args.runs), timed(load, args.runs)
        if name != "raw copy":
            assert torch.equal(out, dev), f"{name}: the loaded blocks differ"
            moved = sum(len(b) for b in held["gpu" if name == "device codec" else "cpu"])
        else:
            moved = raw
        rows.append((name, moved, raw / ts / 1e9, raw / tl / 1e9))
    assert held["gpu"] == held["cpu"], "device and CPU codecs gave different bytes"
    print(f"KV offload, {torch.cuda.get_device_name()}: {args.blocks} blocks of {blocks.shape[1]} bytes "
          f"({raw / 2**20:.0f} MiB raw) per transfer, median of {args.runs}")
    print("| path | bytes over PCIe | ratio | store GB/s | load GB/s |")
    print("|---|---:|---:|---:|---:|")
    for name, moved, s, l in rows:
        print(f"| {name} | {moved} | {raw / moved:.3f} | {s:.2f} | {l:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
