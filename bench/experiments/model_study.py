#!/usr/bin/env python3
"""Which modelling pays? A measurement study for frame format version 3.

For every data kind of bench/codec_bench.py (the real fixture checkpoint, real
MiniLM and its FP16/BF16/FP8 casts), every tensor is modelled the way a frame
would code it, with the real costs of the format: 12-bit normalised tables and
their serialised size (doc/format.md 5.2), 128 bytes of lane states per coded
stream per block, per-block raw fallback. It prints, per kind, the size of:

  v2       one table per stream per tensor (today's frames)
  groups   tables per run of blocks, segmentation chosen optimally (DP over
           blocks; a run costs its table, "same as previous" is free)
  lanectx  stream 0 given the previous symbol of its lane (i - 32), n merged
           contexts (2..4) and base searched, as level 3's kind-3 streams;
           also (--columns) given the symbol one row up (i - row length, for
           2-D tensors whose rows hold >= 32 elements), the better of the two
  s1|s0    BF16/FP16/FP32: stream 1 (sign|mantissa or low byte) given a
           bucket of stream 0's value (2..4 merged contexts, thresholds
           searched); FP8: the byte given its lane predecessor's bucket
  best     per tensor and stream, the cheapest of the above (and combinations:
           groups x lanectx for stream 0)
  +slope   best, with one more candidate for stream 1 of BF16/FP16/FP32: every
           value of stream 0 its own context, each context's distribution a
           log-linear curve over the sub-intervals its stream-1 symbols split
           (slope and, where stream 1 holds the sign, the sign's probability:
           one byte each per modelled context instead of a serialised table;
           contexts of < 64 symbols share one ordinary table)

  +sel     best, with one more candidate for stream 1 of BF16/FP16/FP32: only
           the elements of chosen values of stream 0 code their stream-1 byte
           (each such value its own table, chosen where it saves more than
           the table costs), every other element's byte stays raw; lane
           states per block that codes any. The "coded" column is the share
           of elements whose stream-1 byte is then decoded (the decode cost
           of this candidate).

--seeded-states models lane states that carry 16 bits of the block's data
(the encoder's initial state holds them; the decoder's final state gives them
back): 64 instead of 128 bytes per coded stream per block, an upper bound.

This is a model, not the coder: rANS adds a few bytes per block over the
ideal code length, the same for every variant, so differences are what count.

Run:  python3 bench/experiments/model_study.py [--kinds bf16w,adam_v,...] [--block-elems 65536]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
import codec_bench as cb  # noqa: E402  (data loading, field split)

PROB = 4096
LANE_STATE_BYTES = 128


def normalize(c: np.ndarray) -> np.ndarray:
    """Counts -> frequencies summing to 4096, every present symbol >= 1
    (close to rans_normalize; exactness does not matter for a model)."""
    n = c.sum()
    if n == 0:
        return np.zeros_like(c)
    f = np.where(c > 0, np.maximum(1, (c * PROB) // n), 0).astype(np.int64)
    d = PROB - f.sum()
    while d != 0:
        if d > 0:
            i = int(np.argmax(np.where(c > 0, c / np.maximum(f, 1), -1)))
            f[i] += 1
            d -= 1
        else:
            r = np.where(f > 1, c / np.maximum(f - 1, 1), np.inf)
            i = int(np.argmin(r))
            f[i] -= 1
            d += 1
    return f


def table_bytes(f: np.ndarray) -> int:
    p = f[f > 0]
    return 32 + int(np.sum(np.where(p < 128, 1, 2)))


def code_bits(c: np.ndarray, f: np.ndarray) -> float:
    m = c > 0
    return float(np.sum(c[m] * (12.0 - np.log2(f[m]))))


def hist(x: np.ndarray) -> np.ndarray:
    return np.bincount(x, minlength=256).astype(np.int64)


def bits_per_symbol(f: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(f > 0, 12.0 - np.log2(np.maximum(f, 1)), 0.0)


def cost_one_table(H: np.ndarray, sizes: np.ndarray) -> float:
    """Bytes of a stream coded with one table over these blocks (H: blocks x 256
    histograms; raw fallback per block)."""
    f = normalize(H.sum(axis=0))
    if np.count_nonzero(f) == 0:
        return float(sizes.sum())
    coded = H @ bits_per_symbol(f) / 8 + LANE_STATE_BYTES
    coded = np.minimum(coded, sizes).sum()
    return min(coded + table_bytes(f) + 1, float(sizes.sum()) + 1)


def cost_groups(H: np.ndarray, sizes: np.ndarray, group_header: int = 2) -> float:
    """Optimal segmentation of the blocks into runs sharing a table (DP)."""
    B = len(H)
    if B <= 1:
        return cost_one_table(H, sizes)
    best = [0.0] + [np.inf] * B
    for j in range(1, B + 1):
        for i in range(max(0, j - 64), j):  # runs of up to 64 blocks, enough for the data here
            c = best[i] + cost_one_table(H[i:j], sizes[i:j]) + group_header
            if c < best[j]:
                best[j] = c
    return best[B]


def ctx_cost(sym: np.ndarray, ctx: np.ndarray, n_ctx: int, be: int) -> float:
    """Bytes of a stream coded with n_ctx tables, table = ctx[i] (one table set per tensor)."""
    n = len(sym)
    nb = (n + be - 1) // be
    blk = np.arange(n) // be
    Hc = np.bincount((blk * n_ctx + ctx) * 256 + sym, minlength=nb * n_ctx * 256).reshape(nb, n_ctx, 256)
    tb = 3
    coded = np.zeros(nb)
    for k in range(n_ctx):
        f = normalize(Hc[:, k, :].sum(axis=0))
        if np.count_nonzero(f):
            tb += table_bytes(f)
            coded += Hc[:, k, :] @ bits_per_symbol(f)
    sizes = np.bincount(blk, minlength=nb)
    return float(np.minimum(coded / 8 + LANE_STATE_BYTES, sizes).sum()) + tb


def lane_prev(sym: np.ndarray, be: int) -> np.ndarray:
    """Previous symbol of the same lane (i - 32) within the block; -1 in each block's first step."""
    prev = np.full(len(sym), -1, dtype=np.int64)
    prev[32:] = sym[:-32]
    idx = np.arange(len(sym))
    prev[(idx % be) < 32] = -1
    return prev


def stride_prev(sym: np.ndarray, be: int, stride: int) -> np.ndarray:
    """Symbol i - stride within the block; -1 where that falls before the block."""
    prev = np.full(len(sym), -1, dtype=np.int64)
    prev[stride:] = sym[:-stride]
    prev[(np.arange(len(sym)) % be) < stride] = -1
    return prev


def best_lane_ctx(sym: np.ndarray, be: int, stride: int = 32) -> tuple[float, str]:
    prev = lane_prev(sym, be) if stride == 32 else stride_prev(sym, be, stride)
    vals = prev[prev >= 0]
    if len(vals) == 0:
        return np.inf, ""
    hv = np.bincount(vals, minlength=256)
    cands = [v for v in range(256) if hv[v] >= 0.001 * len(vals)]
    best, what = np.inf, ""
    for n_ctx in (2, 3, 4):
        for base in cands:
            ctx = np.where(prev < 0, 0, np.clip(prev - base, 0, n_ctx - 1))
            c = ctx_cost(sym, ctx, n_ctx, be)
            if c < best:
                best, what = c, f"n={n_ctx} base={base}"
    return best, what


def best_bucket_ctx(sym: np.ndarray, key: np.ndarray, be: int, max_ctx: int = 4) -> tuple[float, str]:
    """sym given bucket(key): thresholds on key searched greedily (key = 0..255)."""
    hk = np.bincount(key, minlength=256)
    present = [v for v in range(256) if hk[v] > 0]
    if len(present) < 2:
        return np.inf, ""
    best, what = np.inf, ""
    thr: list[int] = []
    for _ in range(max_ctx - 1):
        step_best, step_t = np.inf, None
        for t in present[1:]:
            if t in thr:
                continue
            ts = sorted(thr + [t])
            ctx = np.searchsorted(np.array(ts), key, side="right")
            c = ctx_cost(sym, ctx, len(ts) + 1, be)
            if c < step_best:
                step_best, step_t = c, t
        if step_t is None:
            break
        thr.append(step_t)
        if step_best < best:
            best, what = step_best, f"thr={sorted(thr)}"
    return best, what


SLOPES = np.linspace(-8.0, 8.0, 256)  # one byte per context


def slope_ctx_cost(sym: np.ndarray, key: np.ndarray, be: int, signed: bool) -> float:
    """Bytes of stream 1 coded given stream 0's value with one log-linear curve
    per context (see the module text). signed: bit 7 of sym is the sign."""
    n_sub = 128 if signed else 256
    sub = (sym & 0x7F) if signed else sym
    t = (np.arange(n_sub) + 0.5) / n_sub
    curves = np.exp(SLOPES[:, None] * t[None, :])
    logq = np.log2(curves / curves.sum(axis=1, keepdims=True))  # [slope, sub]
    hk = np.bincount(key, minlength=256)
    bits = np.zeros(len(sym))
    modelled = np.zeros(256, dtype=bool)
    tb = 32.0  # which contexts are modelled: a bitmap
    for e in np.nonzero(hk >= 64)[0]:
        m = key == e
        cs = np.bincount(sub[m], minlength=n_sub).astype(np.float64)
        a = int(np.argmax(logq @ cs))
        q = 2.0 ** logq[a]
        if signed:
            ns = np.bincount(sym[m] >> 7, minlength=2).astype(np.float64)
            p1 = min(max(round(256 * ns[1] / ns.sum()), 1), 255) / 256
            q = np.concatenate([q * (1 - p1), q * p1])
            tb += 2
        else:
            tb += 1
        f = normalize(np.maximum(1, np.round(q * (1 << 24))).astype(np.int64))
        bits[m] = bits_per_symbol(f)[sym[m]]
        modelled[e] = True
    rest = ~modelled[key]
    if rest.any():
        f = normalize(np.bincount(sym[rest], minlength=256).astype(np.int64))
        bits[rest] = bits_per_symbol(f)[sym[rest]]
        tb += table_bytes(f)
    blk = np.arange(len(sym)) // be
    coded = np.bincount(blk, weights=bits) / 8 + LANE_STATE_BYTES
    sizes = np.bincount(blk).astype(np.float64)
    return float(np.minimum(coded, sizes).sum()) + tb


def study_tensor(t: cb.Tensor, be: int, row: int = 0) -> dict[str, float]:
    planes = cb.planes(t)
    raw = float(len(t.data))
    out = {"raw": raw}
    v2 = 0.0
    groups = 0.0
    ctx = 0.0
    per_plane_best = 0.0
    slope_best = 0.0
    sel_best = 0.0
    sel_coded = 0
    for k, p in enumerate(planes):
        p = p.astype(np.int64)
        nb = (len(p) + be - 1) // be
        blk = np.arange(len(p)) // be
        bh = np.bincount(blk * 256 + p, minlength=nb * 256).reshape(nb, 256)
        sz = np.bincount(blk, minlength=nb).astype(np.float64)
        one = cost_one_table(bh, sz)
        grp = cost_groups(bh, sz)
        cands = [one, grp]
        if k == 0 and len(p) >= 4 * 4096:
            lc, _ = best_lane_ctx(p, be)
            if 32 < row < be // 4:
                lc = min(lc, best_lane_ctx(p, be, row)[0])
            cands.append(lc)
        else:
            lc = np.inf
        if k == 1 and t.dtype in ("bf16", "f16", "f32") and len(p) >= 4 * 4096:
            bc, _ = best_bucket_ctx(p, planes[0].astype(np.int64), be)
            cands.append(bc)
        else:
            bc = np.inf
        sc = np.inf
        if k == 1 and t.dtype in ("bf16", "f16", "f32") and len(p) >= 4 * 4096:
            sc = slope_ctx_cost(p, planes[0].astype(np.int64), be, signed=t.dtype != "f16")
        sel, sel_n = np.inf, 0
        if k == 1 and t.dtype in ("bf16", "f16", "f32"):
            sel, sel_n = selective_cost(p, planes[0].astype(np.int64), be)
        sel_best += min(cands + [sel])
        if sel < min(cands):
            sel_coded += sel_n
        v2 += one
        groups += min(one, grp)
        ctx += min(one, lc, bc)
        per_plane_best += min(cands)
        slope_best += min(cands + [sc])
    if t.dtype in ("e4m3", "e5m2"):
        p = planes[0].astype(np.int64)
        if len(p) >= 4 * 4096:
            # FP8: the byte given a bucket of its lane predecessor's magnitude (exponent bits)
            prev = lane_prev(p, be)
            shift = 3 if t.dtype == "e4m3" else 2
            key = np.where(prev < 0, 0, (prev & 0x7F) >> shift)
            bc, _ = best_bucket_ctx(p, key.astype(np.int64), be)
            ctx = min(ctx, bc)
            per_plane_best = min(per_plane_best, bc)
            slope_best = min(slope_best, bc)
            sel_best = min(sel_best, bc)
    out.update(v2=v2, groups=groups, ctx=ctx, best=per_plane_best, slope=slope_best, sel=sel_best,
               sel_coded=float(sel_coded), elems=float(len(planes[0])))
    return out


def selective_cost(sym: np.ndarray, key: np.ndarray, be: int) -> tuple[float, int]:
    """Stream 1 coded only for the elements whose stream-0 value is chosen
    (own table each), raw elsewhere: (bytes, elements coded)."""
    n = len(sym)
    J = np.bincount(key * 256 + sym, minlength=256 * 256).reshape(256, 256)
    chosen = []
    for e in range(256):
        c = J[e]
        if c.sum() < 64:
            continue
        f = normalize(c)
        if c.sum() - code_bits(c, f) / 8 - table_bytes(f) > 0:
            chosen.append(e)
    if not chosen:
        return float(n), 0
    sel = np.isin(key, chosen)
    blk = np.arange(n) // be
    nb = (n + be - 1) // be
    coded = 0.0
    for e in chosen:
        f = normalize(J[e])
        coded += code_bits(J[e], f) / 8 + table_bytes(f)
    blocks_coding = np.count_nonzero(np.bincount(blk[sel], minlength=nb))
    return float(n - sel.sum()) + coded + blocks_coding * LANE_STATE_BYTES + 1, int(sel.sum())


def row_lengths(fixtures: Path) -> dict[str, int]:
    """Last dimension of every 2-D tensor of the fixture and MiniLM files."""
    import json
    import struct
    out = {}
    paths = [fixtures / f"gpt-small-step{cb.STEP}-model-bf16.safetensors",
             fixtures / f"gpt-small-step{cb.STEP}-optim-fp32.safetensors"]
    try:
        paths.append(cb.find_minilm())
    except SystemExit:
        pass
    for path in paths:
        if not path.exists():
            continue
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__" and len(meta["shape"]) == 2:
                out[name] = int(meta["shape"][1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="bf16w,master,adam_m,adam_v,minilm_f32,minilm_f16,minilm_bf16,"
                                       "minilm_e4m3,minilm_e5m2")
    ap.add_argument("--fixtures", type=Path, default=cb.DEFAULT_FIXTURES)
    ap.add_argument("--block-elems", type=int, default=65536)
    ap.add_argument("--columns", action="store_true", help="also try the row-above context for stream 0")
    ap.add_argument("--max-tensor-mb", type=float, default=0, help="skip tensors larger than this (0: none)")
    ap.add_argument("--seeded-states", action="store_true",
                    help="lane states carrying 16 bits of the block's data (64 bytes per coded stream per block)")
    a = ap.parse_args()
    global LANE_STATE_BYTES
    if a.seeded_states:
        LANE_STATE_BYTES = 64
    kinds = cb.load_kinds(a.fixtures, a.kinds.split(","))
    rows = row_lengths(a.fixtures) if a.columns else {}
    print(f"block_elems={a.block_elems}; lane states {LANE_STATE_BYTES} bytes per coded stream per block; "
          "sizes in bytes; ratio = raw / size")
    print("| data | raw | v2 | groups | contexts | best of all | best + slope | best + sel (coded) | H0 bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, kind in kinds.items():
        tot = {"raw": 0.0, "v2": 0.0, "groups": 0.0, "ctx": 0.0, "best": 0.0, "slope": 0.0, "sel": 0.0,
               "sel_coded": 0.0, "elems": 0.0}
        h0 = 0.0
        for t in kind.tensors:
            if a.max_tensor_mb and len(t.data) > a.max_tensor_mb * 1e6:
                continue
            r = study_tensor(t, a.block_elems, rows.get(t.name, 0))
            for k in tot:
                tot[k] += r[k]
            h0 += cb.h0_bytes(t)
        raw = tot["raw"]
        print(f"| {kind.label} | {raw:.0f} | {raw / tot['v2']:.4f} | {raw / tot['groups']:.4f} | "
              f"{raw / tot['ctx']:.4f} | {raw / tot['best']:.4f} | {raw / tot['slope']:.4f} | "
              f"{raw / tot['sel']:.4f} ({100 * tot['sel_coded'] / max(tot['elems'], 1):.1f} %) | {raw / h0:.4f} |",
              flush=True)


if __name__ == "__main__":
    main()
