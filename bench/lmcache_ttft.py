"""Time to first token of a prefix an LMCache server serves from its L2 files (part of
bench/lmcache_bench.py, which runs it; doc/kv.md "LMCache").

vLLM's CPU build serves one of bench/gpt2_models.py's models (default: the fixture GPT),
block size 32, through ``LMCacheMPConnector`` to an ``lmcache server`` (chunk size 64, L1 0.25 GB,
engine-driven transfers) whose L2 adapter is either tensorzip's (``TensorZipFSL2Adapter``, serde
``tensorzip``: compressed files) or LMCache's own ``fs`` adapter without a serde (the raw chunk
bytes). For each adapter: an engine generates the 3 prompts of 224 tokens of real text once (their
3 whole chunks each stored through the server into L2), the server stops, a new server starts on
the same folder (its L1 empty), and a fresh engine times ``generate(prompt, max_tokens=1)`` for
each prompt, each time after ``llm.reset_prefix_cache()`` and after clearing the server's L1
(its HTTP ``POST /cache/clear``): every reused chunk is read from its L2 file and deserialized
(the server's log is checked for that). Baselines with no connector: "recompute" (the same timed
calls after ``reset_prefix_cache()``) and "engine prefix cache" (the prompts generated once, then
timed without the reset: vLLM's own cache). Every engine is a process of its own with vLLM's
default process layout (VLLM_ENABLE_V1_MULTIPROCESSING=1, which LMCache's connector needs on the
CPU build), VLLM_CPU_KVCACHE_SPACE=1, one warm-up generation of other text before timing; medians
over the rounds. The first token and its top-3 log-probabilities must not change between rounds;
the two L2 adapters' must be equal bit for bit (the same KV read back); with the fixture GPT every
configuration's first tokens must be the same (bench/gpt2_models.py's first_tokens_problem says
why the tiled model's may not).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from _lmcache_server import LMCacheServer as _Server, fs_adapter, tensorzip_adapter  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
import gpt2_models  # noqa: E402
CHUNK_TOKENS = 64        # the server's --chunk-size: a multiple of the block size
BLOCK_TOKENS = 32        # vLLM's CPU build takes block sizes that are multiples of 32
PROMPT_TOKENS = 224      # 3 whole chunks and a half: 192 tokens can be reused (vLLM computes the last)
N_PROMPTS = 3
ENGINE_TIMEOUT = 1200


def _env() -> dict:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               LMCACHE_TRACK_USAGE="false", LMCACHE_DISABLE_BANNER="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", VLLM_ENABLE_V1_MULTIPROCESSING="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python" / "tests"), env.get("PYTHONPATH")) if p)
    return env


ADAPTERS = {"tensorzip": tensorzip_adapter, "fs": fs_adapter}


def LMCacheServer(adapter: str, l2: Path, log: Path):  # noqa: N802 (a server, as the shared class makes it)
    """``lmcache server`` with one of ADAPTERS on ``l2`` (python/tests/_lmcache_server.py)."""
    try:
        return _Server(ADAPTERS[adapter](l2), log, CHUNK_TOKENS, env=_env())
    except RuntimeError as e:
        raise SystemExit(f"lmcache server ({adapter}): {e}") from None


# ---- the engine (a child process) ----

def prompts_and_warmup():
    """The timed prompts (kv_offload_bench.py's: real source 4000 bytes apart) and a warm-up prompt of
    the same length that shares no prefix with them."""
    import _gpt
    from _vllm_offload_worker import text_prompts

    return text_prompts(PROMPT_TOKENS, N_PROMPTS), _gpt.real_text_ids(PROMPT_TOKENS, 2000)[0].tolist()


def engine_child(spec: dict) -> dict:
    """Runs in its own process: the timed calls of one configuration (or, with rounds 0, the store pass)."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = None
    if spec["port"]:
        kv = KVTransferConfig(kv_connector="LMCacheMPConnector", kv_role="kv_both",
                              kv_connector_extra_config={"lmcache.mp.host": "tcp://127.0.0.1",
                                                         "lmcache.mp.port": spec["port"], "lmcache.mp.mq_timeout": 120})
    llm = LLM(model=spec["model"], dtype="bfloat16", max_model_len=256, max_num_seqs=4, enforce_eager=True, seed=0,
              block_size=BLOCK_TOKENS, kv_transfer_config=kv)
    prompts, warmup = prompts_and_warmup()
    prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=3)
    if spec["rounds"] == 0:  # the store pass
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
        return {"first": [o.outputs[0].token_ids[0] for o in outs]}
    llm.generate([TokensPrompt(prompt_token_ids=warmup)], one, use_tqdm=False)
    if spec["seed"]:
        llm.generate(prompts, one, use_tqdm=False)
    times, firsts, tops, cached = [], [], [], []
    for _ in range(spec["rounds"]):
        for p in prompts:
            if spec["reset"]:
                llm.reset_prefix_cache()
            if spec["http_port"]:
                req = urllib.request.Request(f"http://127.0.0.1:{spec['http_port']}/cache/clear", data=b"{}",
                                             headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=60).read()
            t0 = time.perf_counter()
            out = llm.generate([p], one, use_tqdm=False)[0]
            times.append(time.perf_counter() - t0)
            firsts.append(out.outputs[0].token_ids[0])
            tops.append(gpt2_models.top_logprobs(out.outputs[0].logprobs[0]))
            cached.append(out.num_cached_tokens or 0)
    return {"ttft": times, "first": firsts, "top": tops, "cached": cached}


def _run_engine(tmp: Path, name: str, spec: dict) -> dict:
    spec_file, out = tmp / f"spec-{name}.json", tmp / f"out-{name}.json"
    spec_file.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(spec_file), str(out)], env=_env(),
                       capture_output=True, text=True, timeout=ENGINE_TIMEOUT)
    if p.returncode != 0:
        raise SystemExit(f"vLLM engine ({name}) exited {p.returncode}:\n{p.stderr[-4000:]}")
    return json.loads(out.read_text())


# ---- the configurations ----

def _from_l2(log: str) -> tuple[int, int]:
    """Chunks the server's lookups found in L1 and in L2, from its log lines `(a L1, b L2)`."""
    pairs = [(int(a), int(b)) for a, b in re.findall(r"\((\d+) L1, (\d+) L2\)", log)]
    return sum(a for a, _ in pairs), sum(b for _, b in pairs)


def lmcache_config(tmp: Path, folder: Path, adapter: str, rounds: int) -> dict:
    """Store through a server, restart it on the same folder, time a fresh engine: TTFTs, bytes per chunk."""
    l2 = tmp / f"l2-{adapter}"
    server = LMCacheServer(adapter, l2, tmp / f"server-{adapter}-store.log")
    try:
        stored = _run_engine(tmp, f"{adapter}-store", {"model": str(folder), "port": server.port, "http_port": 0,
                                                       "rounds": 0, "reset": False, "seed": False})
    finally:
        server.stop()
    files = [f for f in l2.rglob("*.data") if f.is_file()]
    if len(files) != N_PROMPTS * (PROMPT_TOKENS // CHUNK_TOKENS):
        raise SystemExit(f"{adapter}: {len(files)} chunk files in {l2} after the store pass, expected "
                         f"{N_PROMPTS * (PROMPT_TOKENS // CHUNK_TOKENS)}:\n{server.tail()}")
    chunk_bytes = sum(f.stat().st_size for f in files) / len(files)
    log = tmp / f"server-{adapter}-load.log"
    server = LMCacheServer(adapter, l2, log)
    try:
        r = _run_engine(tmp, f"{adapter}-load", {"model": str(folder), "port": server.port,
                                                  "http_port": server.http_port, "rounds": rounds, "reset": True,
                                                  "seed": False})
    finally:
        server.stop()
    from_l1, from_l2 = _from_l2(log.read_text(errors="replace"))
    want = rounds * N_PROMPTS * (PROMPT_TOKENS // CHUNK_TOKENS)
    if from_l1 != 0 or from_l2 < want or "Serde task" in log.read_text(errors="replace"):
        raise SystemExit(f"{adapter}: the timed prefixes did not all come from L2 ({from_l1} chunks from L1, "
                         f"{from_l2} from L2, expected {want}):\n{server.tail()}")
    r.update(chunk_bytes=chunk_bytes, files=len(files), store_first=stored["first"])
    return r


def ttft_rows(rounds: int, tmp: Path, model: str = "fixture") -> tuple[list[dict], int]:
    """One row per configuration; and the raw bytes of one chunk."""
    folder = tmp / "gpt2"
    cfg = gpt2_models.write_model(model, folder)
    raw_chunk = 2 * cfg["n_layer"] * CHUNK_TOKENS * cfg["n_embd"] * 2     # (K, V) x layers x tokens x hidden x BF16
    base = {"model": str(folder), "port": 0, "http_port": 0, "rounds": rounds}
    configs = [("recompute (no connector)", None,
                lambda: _run_engine(tmp, "recompute", dict(base, reset=True, seed=False))),
               ("LMCache, `fs` adapter (uncompressed files)", "fs", lambda: lmcache_config(tmp, folder, "fs", rounds)),
               ("LMCache, tensorzip adapter + serde", "tensorzip",
                lambda: lmcache_config(tmp, folder, "tensorzip", rounds)),
               ("engine prefix cache (no reset)", None,
                lambda: _run_engine(tmp, "prefix", dict(base, reset=False, seed=True)))]
    rows = []
    for label, adapter, run in configs:
        r = run()
        first, top = r["first"][:N_PROMPTS], r["top"][:N_PROMPTS]
        if r["first"] != first * rounds or r["top"] != top * rounds:
            raise SystemExit(f"{label}: the first tokens or their log-probabilities changed between rounds: "
                             f"{r['first']}")
        if model == "fixture" and r.get("store_first", first) != first:  # (tied logits: gpt2_models)
            raise SystemExit(f"{label}: the first tokens differ from the store pass's: {first}, {r['store_first']}")
        rows.append({"config": label, "adapter": adapter, "ttft_ms": 1e3 * statistics.median(r["ttft"]),
                     "min_ms": 1e3 * min(r["ttft"]), "first": first, "top": top,
                     "cached": statistics.median(r["cached"]), "chunk_bytes": r.get("chunk_bytes"),
                     "calls": len(r["ttft"])})
    problem = gpt2_models.first_tokens_problem(rows, model, ("fs", "tensorzip"), key="adapter")
    if problem:
        raise SystemExit(problem)
    return rows, raw_chunk


def ttft_table(rows: list[dict], raw_chunk: int, rounds: int, model: str = "fixture") -> list[str]:
    lines = [f"Time to first token of a {PROMPT_TOKENS}-token prompt seen before (vLLM CPU build serving "
             f"{gpt2_models.describe(model)}, "
             f"{CHUNK_TOKENS}-token chunks; median and best of {rows[0]['calls']} calls, {rounds} rounds of "
             f"{N_PROMPTS} prompts):", "",
             "| configuration | TTFT ms (median) | best ms | prefix tokens reused | bytes on disk per chunk |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        size = "—"
        if r["chunk_bytes"] is not None:
            size = f"{r['chunk_bytes']:,.0f} (raw / {raw_chunk / r['chunk_bytes']:.3f})"
        lines.append(f"| {r['config']} | {r['ttft_ms']:.1f} | {r['min_ms']:.1f} | {r['cached']:.0f} | {size} |")
    return lines


if __name__ == "__main__":  # an engine child: SPEC.json OUT.json
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    Path(sys.argv[2]).write_text(json.dumps(engine_child(json.loads(Path(sys.argv[1]).read_text()))))
