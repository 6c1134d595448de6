#!/usr/bin/env python3
"""LMCache serde ``tensorzip`` benchmark (tensorzip.lmcache, doc/kv.md "LMCache"): bytes on disk per
chunk against raw, and serialize / deserialize speed on one core.

Real KV: the fixture GPT (../shared/fixtures, all 6 layers; else the repository's sample/, layer 0)
run in BF16 over real Python source (the standard library's email and json packages), in
LMCache's chunk layout (2, layers, tokens, hidden). The serde is calibrated on the first chunk, as
in a server, and measured on the others: each chunk is serialized into a buffer of
``estimate_serialized_size`` bytes and deserialized into a KV-shaped buffer through LMCache's
memory objects, one chunk per call on the calling thread (LMCache's AsyncSerdeProcessor with
``max_workers`` 1 runs the same calls on one worker thread), timed as that thread's CPU time
(robust on a shared machine). A copy of each chunk (torch ``copy_``, one thread) is timed alongside.
Repetitions interleaved, medians.

Then, where vLLM's CPU build is installed too, time to first token of a reused prefix served from
an LMCache server's L2 files (bench/lmcache_ttft.py): tensorzip's adapter and serde against
LMCache's `fs` adapter (uncompressed), recomputing, and vLLM's own prefix cache; --ttft-rounds
rounds of 3 prompts (0: skip).

    build-py/venv-lmcache/bin/python bench/lmcache_bench.py [--seqs 16] [--reps 5] [--ttft-rounds 5] [--out FILE]

Needs LMCache (scripts/lmcache-test.sh makes the venv above, with vLLM's CPU build).
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))


def real_kv(n_seq):
    """(n_seq, 2, layers, 256, hidden) BF16 KV of the fixture GPT over real source, and the weights used."""
    import torch
    from make_kv_sample import T, fixture_kv, text_ids
    import _gpt

    weights = _gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE
    ids, _ = text_ids(n_seq)
    ks, vs = fixture_kv(_gpt.state_dict_of(weights), ids)
    kv = torch.stack([torch.stack(ks), torch.stack(vs)])          # (2, L, B, T, H, HD)
    return kv.permute(2, 0, 1, 3, 4, 5).reshape(n_seq, 2, len(ks), T, -1).contiguous(), weights


def chunks_of(kv, tokens):
    """Chunks of `tokens` tokens in LMCache's layout, in sequence order."""
    n, _, _, t, _ = kv.shape
    return [kv[i, :, :, j:j + tokens].contiguous() for i in range(n) for j in range(0, t - tokens + 1, tokens)]


def memobj(t):
    import torch
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    raw = t.contiguous().view(-1).view(torch.uint8).clone()
    meta = MemoryObjMetadata(shape=t.shape, dtype=t.dtype, address=0, phy_size=raw.numel(), ref_count=1,
                             shapes=[t.shape], dtypes=[t.dtype])
    return TensorMemoryObj(raw, meta, None)


def measure(chunks, mode, reps):
    """One row: bytes per chunk, tables bytes per chunk, serialize / deserialize / copy GB/s."""
    import torch
    import tensorzip.lmcache as tzl
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey

    codecs = tzl._Codecs(mode, None)
    ser, de = tzl.TensorZipSerializer(codecs), tzl.TensorZipDeserializer(codecs)
    first = chunks[0]
    est = ser.estimate_serialized_size(MemoryLayoutDesc(shapes=[first.shape], dtypes=[first.dtype]))
    key = ObjectKey(chunk_hash=b"\0" * 16, model_name="fixture-gpt", kv_rank=0)
    ser.serialize(memobj(first), memobj(torch.zeros(est, dtype=torch.uint8)), key)  # calibrates
    measured = chunks[1:]
    srcs = [memobj(c) for c in measured]
    bufs = [memobj(torch.zeros(est, dtype=torch.uint8)) for _ in measured]
    outs = [memobj(torch.zeros_like(c)) for c in measured]
    copies = [torch.empty_like(c) for c in measured]
    raw = sum(c.numel() * c.element_size() for c in measured)
    t_ser, t_de, t_copy, sizes = [], [], [], []
    for _ in range(reps):
        t0 = time.thread_time()
        sizes = [ser.serialize(s, b, key) for s, b in zip(srcs, bufs)]
        t1 = time.thread_time()
        for b, n in zip(bufs, sizes):
            b.set_used_size(n)
        t2 = time.thread_time()
        for b, o in zip(bufs, outs):
            de.deserialize(b, o, key)
        t3 = time.thread_time()
        for c, d in zip(measured, copies):
            d.copy_(c)
        t4 = time.thread_time()
        for b in bufs:
            b.set_used_size(est)
        t_ser.append(t1 - t0)
        t_de.append(t3 - t2)
        t_copy.append(t4 - t3)
    for c, o in zip(measured, outs):
        if not torch.equal(o.tensor.view(torch.int16), c.view(torch.int16)):
            raise SystemExit("a chunk did not round-trip")
    tables = sum(len(t) for _, t in codecs._by_layout[(0, tuple(first.shape))])
    return {"mode": mode, "chunks": len(measured), "raw": raw // len(measured), "stored": sum(sizes) / len(measured),
            "tables": tables, "ser": raw / statistics.median(t_ser) / 1e9, "de": raw / statistics.median(t_de) / 1e9,
            "copy": raw / statistics.median(t_copy) / 1e9}


def ttft_lines(rounds, model="fixture"):
    """The time-to-first-token table (bench/lmcache_ttft.py), or a line saying why it is not there."""
    if rounds == 0:
        return []
    try:
        import vllm  # noqa: F401
    except ImportError:
        return ["", "(no vLLM here: the time-to-first-token table is skipped)"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lmcache_ttft

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmcache-ttft-") as tmp:
        rows, raw_chunk = lmcache_ttft.ttft_rows(rounds, Path(tmp), model)
    return ["", *lmcache_ttft.ttft_table(rows, raw_chunk, rounds, model), "",
            f"Time-to-first-token part: {time.perf_counter() - t0:.0f} s."]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=16, help="sequences of 256 tokens (default 16)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ttft-rounds", type=int, default=5,
                    help="rounds of the time-to-first-token part (default 5; 0 skips it)")
    ap.add_argument("--model", choices=("fixture", "tiled"), default="fixture",
                    help="the model the time-to-first-token part serves (bench/gpt2_models.py)")
    ap.add_argument("--ttft-only", action="store_true", help="only the time-to-first-token part")
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.ttft_only:
        text = "\n".join(ttft_lines(args.ttft_rounds, args.model)).lstrip("\n") + "\n"
        print(text, end="")
        if args.out:
            Path(args.out).write_text(text)
        return
    kv, weights = real_kv(args.seqs)
    lines = [f"LMCache serde `tensorzip`, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
             f"one core (CPU time of the coding thread); KV of {os.path.relpath(weights, ROOT)} ({kv.shape[2]} layers, hidden {kv.shape[4]}, BF16) "
             f"over {args.seqs} x 256 tokens of real Python source; calibrated on the first chunk; medians of "
             f"{args.reps}.", "",
             "| chunk tokens | mode | chunks | raw bytes | stored bytes (mean) | of which tables | ratio | "
             "serialize GB/s | deserialize GB/s | copy GB/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for tokens in (256, 64):
        chunks = chunks_of(kv, tokens)
        for mode in ("rans", "fixed"):
            r = measure(chunks, mode, args.reps)
            lines.append(f"| {tokens} | {mode} | {r['chunks']} | {r['raw']} | {r['stored']:.0f} | {r['tables']} | "
                         f"{r['raw'] / r['stored']:.3f}x | {r['ser']:.2f} | {r['de']:.2f} | {r['copy']:.2f} |")
    lines += ttft_lines(args.ttft_rounds, args.model)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
