"""One vLLM engine with prefix caching and (optionally) KV offloading, in a process of its own,
for python/tests/test_vllm_offload.py and bench/kv_offload_bench.py.

    python _vllm_offload_worker.py SPEC.json OUT.json

SPEC: {"model": folder, "offload": "none" | "tensorzip" | "plain" (the spec with compress=false),
"prompt_tokens": n (default 150), "prompts": k (default 3), "max_tokens": m (default 16),
"cpu_bytes_to_use": bytes (default 64 MiB), "tensor_parallel_size": workers (default 1; more:
vLLM's "mp" executor, a process per worker), "load_format", "quantization" (default: vLLM's)}.
The prompts are real text (this repository's Python source, byte ids). The engine generates
greedily for them ("first"), its prefix cache is reset (``llm.reset_prefix_cache()``, the offloaded
blocks stay) and its KV cache overwritten with a constant, and it generates for them again ("again");
then, as a control, the KV cache is overwritten without a reset and it generates once more
("poisoned": prefix hits on overwritten blocks).
OUT: {"first", "again": [[token ids]], "after_first", "after_again": the compressed block store
stats of every worker after each ("ranks", rank order), with the index's block count and bytes
charged where the scheduler runs in this process (None without offloading), "prompt_blocks": full
32-token blocks of the prompts that a prefix hit can cover, "cached_tokens_first",
"cached_tokens_again": prefix-hit tokens, "resident": each worker's resident_stats (None: plain
weights)}. The workers are reached through
_vllm_worker_probe.OffloadProbe.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

BLOCK = 32


def text_prompts(n_tokens: int, count: int):
    src = (Path(__file__).resolve().parents[1] / "tensorzip" / "_file.py").read_bytes()
    prompts = [list(src[i * 4000:i * 4000 + n_tokens]) for i in range(count)]
    if any(len(p) != n_tokens for p in prompts):
        raise ValueError(f"{count} prompts of {n_tokens} tokens 4000 bytes apart need more than {len(src)} bytes")
    return prompts


def store_stats(llm):
    """Every worker's block store stats (rank order), with what the scheduler's index charged when
    it is in this process; None without a block store."""
    from tensorzip import _kv_offload

    ranks = sorted(llm.collective_rpc("tz_offload_stats"), key=lambda r: r["rank"])
    if not any(r["stores"] for r in ranks):
        return None
    assert all(len(r["stores"]) == 1 for r in ranks), ranks
    out = {"ranks": [r["stores"][0] for r in ranks]}
    indexes = _kv_offload.live_indexes()
    assert len(indexes) <= 1, f"{len(indexes)} indexes"
    if indexes:
        out.update(index_blocks=len(indexes[0]), index_held=indexes[0].held, index_budget=indexes[0].budget)
    return out


def make_llm(spec):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw = {}
    if spec["offload"] != "none":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"spec_name": "TensorZipOffloadingSpec", "spec_module_path": "tensorzip.vllm",
                                       "cpu_bytes_to_use": spec.get("cpu_bytes_to_use", 64 << 20),
                                       "block_size": BLOCK, "compress": spec["offload"] == "tensorzip"})
    tp = spec.get("tensor_parallel_size", 1)
    if tp > 1:
        kw["distributed_executor_backend"] = "mp"
    for key in ("load_format", "quantization"):
        if spec.get(key):
            kw[key] = spec[key]
    return LLM(model=spec["model"], dtype="bfloat16", max_model_len=256, max_num_seqs=8, enforce_eager=True,
               seed=0, block_size=BLOCK, enable_prefix_caching=True, tensor_parallel_size=tp,
               worker_extension_cls="_vllm_worker_probe.OffloadProbe", **kw)


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = make_llm(spec)
    n = spec.get("prompt_tokens", 150)
    ids = text_prompts(n, spec.get("prompts", 3))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
    params = SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", 16), ignore_eos=True)
    out = {"prompt_blocks": len(ids) * ((n - 1) // BLOCK), "resident": llm.collective_rpc("tz_resident_stats")}
    for phase in ("first", "again"):
        if phase == "again":
            assert llm.reset_prefix_cache(), "reset_prefix_cache refused"
            out["poisoned_bytes"] = sum(llm.collective_rpc("tz_poison_kv_cache"))
        res = llm.generate(prompts, params, use_tqdm=False)
        out[phase] = [list(r.outputs[0].token_ids) for r in res]
        out[f"cached_tokens_{phase}"] = sum(r.num_cached_tokens or 0 for r in res)
        out[f"after_{phase}"] = store_stats(llm)
    # The control: the KV cache overwritten again, without a reset, so the prefix cache hands out the
    # overwritten blocks: the tokens must change (the overwrite is not harmless).
    llm.collective_rpc("tz_poison_kv_cache")
    res = llm.generate(prompts, params, use_tqdm=False)
    out["poisoned"] = [list(r.outputs[0].token_ids) for r in res]
    json.dump(out, open(sys.argv[2], "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
