"""One vLLM engine in a process of its own, for python/tests/test_lmcache.py.

    python _lmcache_worker.py SPEC.json OUT.json

SPEC: {"model": folder, "prompts": [[token ids], ...], "max_tokens": n, "block_size": b,
"kv_transfer_config": {...} or null (vLLM's KVTransferConfig fields)}.
OUT: {"greedy": [[ids]], "cached": [num_cached_tokens per prompt]}.
"""
from __future__ import annotations

import json
import sys


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = spec.get("kv_transfer_config")
    llm = LLM(model=spec["model"], dtype="bfloat16", max_model_len=256, max_num_seqs=4, enforce_eager=True,
              seed=0, block_size=spec["block_size"], kv_transfer_config=KVTransferConfig(**kv) if kv else None)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]],
                        SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True),
                        use_tqdm=False)
    json.dump({"greedy": [list(o.outputs[0].token_ids) for o in outs],
               "cached": [o.num_cached_tokens or 0 for o in outs]}, open(sys.argv[2], "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
