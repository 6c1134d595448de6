"""Compressed KV offloading (tensorzip.vllm.TensorZipOffloadingSpec, doc/kv.md "vLLM KV offloading").

    build-py/venv-vllm/bin/python bench/kv_offload_bench.py [--out kv-offload.md] [--reps 5]

Run it with a Python that has tensorzip (and, for the time-to-first-token rows, vLLM's CPU build;
scripts/vllm-test.sh makes such a venv). The fixture GPT is ../shared/fixtures (TZ_FIXTURES
overrides the folder).

1. Host memory and codec speed, on real KV blocks: the keys and values the fixture GPT (6 layers,
   8 heads of 32, BF16) computes over 8 x 256 tokens of this repository's Python source
   (scripts/make_kv_sample.py's fixture_kv), cut into 32-token blocks as vLLM's CPU build holds
   them (per block and layer one page: the block's K bytes then its V bytes, 32 KiB; a block is
   its 6 pages). The first sequence's blocks calibrate the tables (not timed); the other 56 blocks
   are stored and loaded through the spec's CompressedBlockStore with threads=1: blocks held per GiB
   of host memory (from the bytes held), store and load GB/s of raw KV per core (median and best
   of --reps; store includes copying the pages out, load the copy into the output).
2. Time to first token of a reused prefix, vLLM (CPU build) serving the fixture GPT (GPT-2 folder as
   python/tests/test_vllm.py writes it) with prefix caching, block_size 32: 3 prompts of 224 tokens
   (7 blocks) of real text are generated once (their blocks offloaded), then for each of them
   ``llm.reset_prefix_cache()`` and ``generate(prompt, max_tokens=1)`` timed: its blocks come from
   the offloaded copy (compressed or plain) or are recomputed (no connector); "engine prefix cache"
   is the same without the reset (vLLM's own cache, no offloading involved; it reuses 6 blocks).
   Each configuration is an engine in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=0,
   VLLM_CPU_KVCACHE_SPACE=1); medians over --reps rounds. The first token and its top-3
   log-probabilities must not change between rounds; the two offloads' must be equal bit for bit
   (the same KV read back); with the fixture GPT every configuration's first token must be the
   same (bench/gpt2_models.py's first_tokens_problem says why the tiled model's may not).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2_models  # noqa: E402
FIXTURE = gpt2_models.FIXTURE
TOKENS = 32
GIB = 1 << 30


# ---- 1. host memory and codec speed ----

def real_blocks(n_seq: int = 8):
    """uint8 (n_seq * 8, 32 KiB) per layer: the fixture GPT's K then V bytes of each 32-token block."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_kv_sample import fixture_kv

    text = b"".join(p.read_bytes() for p in sorted((ROOT / "python" / "tensorzip").glob("*.py")))
    ids = torch.frombuffer(bytearray(text[:n_seq * 256]), dtype=torch.uint8).long().view(n_seq, 256)
    ks, vs = fixture_kv(load_file(str(FIXTURE)), ids)
    layers = []
    for k, v in zip(ks, vs):
        kb = k.reshape(-1, TOKENS, 8, 32).view(torch.int16).reshape(-1, TOKENS * 8 * 32)
        vb = v.reshape(-1, TOKENS, 8, 32).view(torch.int16).reshape(-1, TOKENS * 8 * 32)
        layers.append(torch.cat([kb, vb], 1).contiguous().numpy().view("uint8"))
    return layers


def codec_rows(reps: int):
    import numpy as np

    from tensorzip._kv_offload import CompressedBlockStore

    layers = real_blocks()
    per_seq = 256 // TOKENS
    n = layers[0].shape[0] - per_seq
    raw_block = sum(l.shape[1] for l in layers)
    rows = []
    for label, kw in (("plain copies (compress=false)", dict(compress=False)),
                      ('tensorzip mode="rans"', dict(mode="rans")),
                      ('tensorzip mode="fixed"', dict(mode="fixed"))):
        st_s, ld_s, held = [], [], 0
        for _ in range(reps):
            store = CompressedBlockStore("BF16", [l.shape[1] for l in layers], threads=1, **kw)
            store.store(range(per_seq), {t: l[:per_seq] for t, l in enumerate(layers)})  # calibrates
            slots = list(range(per_seq, per_seq + n))
            t0 = time.perf_counter()
            store.store(slots, {t: l[per_seq:] for t, l in enumerate(layers)})
            st_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = store.load(slots, range(len(layers)))
            ld_s.append(time.perf_counter() - t0)
            assert all(np.array_equal(out[t], l[per_seq:]) for t, l in enumerate(layers))
            held = sum(store.slot_bytes(s) for s in slots)
        raw = n * raw_block
        rows.append({"config": label, "ratio": raw / held, "blocks_per_gib": GIB / (held / n),
                     "store_gbs": raw / statistics.median(st_s) / 1e9, "load_gbs": raw / statistics.median(ld_s) / 1e9,
                     "store_best": raw / min(st_s) / 1e9, "load_best": raw / min(ld_s) / 1e9})
    return rows, n, raw_block


# ---- 2. time to first token (engines in child processes) ----

def child(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    from _vllm_offload_worker import make_llm, store_stats, text_prompts
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = make_llm({"model": spec["model"], "offload": spec["offload"], "cpu_bytes_to_use": 256 << 20})
    prompts = [TokensPrompt(prompt_token_ids=p) for p in text_prompts(224, 3)]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=3)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    times, first, top = [], [], []
    for _ in range(spec["reps"]):
        for p in prompts:
            if spec["reset"]:
                llm.reset_prefix_cache()
            t0 = time.perf_counter()
            r = llm.generate([p], one, use_tqdm=False)[0]
            times.append(time.perf_counter() - t0)
            first.append(r.outputs[0].token_ids[0])
            top.append(gpt2_models.top_logprobs(r.outputs[0].logprobs[0]))
    n = len(prompts)
    if first != first[:n] * spec["reps"] or top != top[:n] * spec["reps"]:
        raise SystemExit(f"{spec['offload']}: the first token or its log-probabilities changed between rounds")
    stats = store_stats(llm) if spec["offload"] != "none" else None
    ratio = None
    if stats:
        held, raw = (sum(rk[k] for rk in stats["ranks"]) for k in ("held_bytes", "held_raw_bytes"))
        ratio = raw / held if held else None
    return {"ttft": times, "first": first[:n], "top": top[:n], "cached": r.num_cached_tokens, "ratio": ratio}


def ttft_rows(reps: int, tmp: Path, model: str = "fixture"):
    folder = tmp / "gpt2"
    gpt2_models.write_model(model, folder)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    rows = []
    for label, offload, reset in (("recompute (no connector)", "none", True),
                                  ("uncompressed offload (compress=false)", "plain", True),
                                  ("tensorzip offload (rans)", "tensorzip", True),
                                  ("engine prefix cache (no reset)", "none", False)):
        spec, out = tmp / "spec.json", tmp / "out.json"
        spec.write_text(json.dumps({"model": str(folder), "offload": offload, "reset": reset, "reps": reps}))
        p = subprocess.run([sys.executable, __file__, "--child", str(spec), str(out)], env=env, capture_output=True,
                           text=True, timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"engine {label} exited {p.returncode}:\n{p.stderr[-4000:]}")
        r = json.loads(out.read_text())
        rows.append({"config": label, "offload": offload, "ttft_ms": 1e3 * statistics.median(r["ttft"]),
                     "min_ms": 1e3 * min(r["ttft"]), "first": r["first"], "top": r["top"], "cached": r["cached"],
                     "ratio": r["ratio"]})
    problem = gpt2_models.first_tokens_problem(rows, model, ("plain", "tensorzip"), key="offload")
    if problem:
        raise SystemExit(problem)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--model", choices=gpt2_models.MODELS, default="fixture",
                    help="the model the time-to-first-token rows serve (bench/gpt2_models.py)")
    ap.add_argument("--ttft-only", action="store_true", help="only the time-to-first-token rows")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(Path(args.child[0]).read_text())
        Path(args.child[1]).write_text(json.dumps(child(spec)))
        return
    t_start = time.perf_counter()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    lines = [f"- Commit {commit}, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPUs; command: `python bench/kv_offload_bench.py --reps {args.reps} "
             f"--model {args.model}{' --ttft-only' if args.ttft_only else ''}`.", ""]
    if not args.ttft_only:
        rows, n, raw_block = codec_rows(args.reps)
        lines += [f"Host memory and codec speed: {n} real blocks of 32 tokens x 6 layers ({raw_block} raw bytes "
                  f"each), threads=1, median (best) of {args.reps}:", "",
                  "| configuration | ratio | blocks held per GiB | store GB/s per core | load GB/s per core |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['ratio']:.3f} | {r['blocks_per_gib']:.0f} | {r['store_gbs']:.2f} "
                  f"({r['store_best']:.2f}) | {r['load_gbs']:.2f} ({r['load_best']:.2f}) |" for r in rows]
    try:
        import vllm  # noqa: F401
        have_vllm = True
    except ImportError:
        have_vllm = False
    if have_vllm:
        with tempfile.TemporaryDirectory(prefix="kv-offload-bench-") as tmp:
            trows = ttft_rows(args.reps, Path(tmp), args.model)
        lines += ["", "Time to first token of a 224-token prompt seen before "
                  f"(vLLM CPU build serving {gpt2_models.describe(args.model)}, medians of {3 * args.reps}):", "",
                  "| configuration | TTFT ms (median) | min ms | prefix tokens reused | raw / held bytes |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['ttft_ms']:.1f} | {r['min_ms']:.1f} | {r['cached']} | "
                  f"{'—' if r['ratio'] is None else format(r['ratio'], '.3f')} |" for r in trows]
    else:
        lines += ["", "(no vLLM here: time-to-first-token rows skipped)"]
    lines += ["", f"Total run time {time.perf_counter() - t_start:.0f} s."]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
