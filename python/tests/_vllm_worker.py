"""One vLLM engine in a process of its own, for python/tests/test_vllm.py.

    python _vllm_worker.py SPEC.json OUT.json

SPEC: {"model": folder, "load_format": "auto" | "tensorzip", "extra": {...} (model_loader_extra_config),
"quantization": null | "tensorzip", "prompts": [[token ids], ...], "text_prompts": [str, ...], "max_tokens": n,
"seed": s}.
OUT: {"greedy": [[ids]], "sampled": [[ids]], "text_greedy": [[ids]], "texts": [str], "weights": {name: sha256},
"resident": null | the memory held by a model whose weights are kept compressed (resident_memory)}.
A failure to start the engine: exit status 3, "ENGINE ERROR: <class>: <message>" on stderr.
"""
from __future__ import annotations

import hashlib
import json
import sys
import traceback


def weight_digests(model):
    """sha256 of every parameter's bytes, by name (as loaded into the model)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach().to("cpu").contiguous()
        out[name] = hashlib.sha256(t.view(-1).view(__import__("torch").uint8).numpy().tobytes()).hexdigest()
    return out


def resident_memory(model):
    """What a model with weights kept compressed holds, measured from its tensors: the bytes of its frames
    (uint8 buffers), of its other parameters and buffers, and of its decode scratch; None for a plain model."""
    import torch
    from tensorzip.resident import is_resident, resident_stats

    if not is_resident(model):
        return None
    frames = other = 0
    seen = set()
    for t in list(model.buffers()) + list(model.parameters()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        n = t.untyped_storage().nbytes()
        if t.dtype == torch.uint8:
            frames += n
        else:
            other += n
    stats = resident_stats(model)
    return {"frame_bytes": frames, "other_bytes": other, "scratch_bytes": stats["scratch_bytes"],
            "stats": {k: stats[k] for k in ("tensors", "plain_bytes", "compressed_bytes", "slot_bytes", "groups",
                                            "on_demand_decodes")}}


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    try:
        llm = LLM(model=spec["model"], load_format=spec["load_format"],
                  model_loader_extra_config=spec.get("extra") or {}, dtype="bfloat16", max_model_len=256,
                  max_num_seqs=8, enforce_eager=spec.get("enforce_eager", True), seed=0,
                  quantization=spec.get("quantization"))
    except Exception as e:  # noqa: BLE001 - the test reads the message
        traceback.print_exc()
        print(f"ENGINE ERROR: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    n = spec.get("max_tokens", 24)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    sampled = llm.generate(prompts, SamplingParams(temperature=0.8, top_p=0.95, seed=spec.get("seed", 7),
                                                   max_tokens=n, ignore_eos=True), use_tqdm=False)
    text = llm.generate(spec.get("text_prompts", []), SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                        use_tqdm=False)
    weights = llm.apply_model(weight_digests)[0]
    resident = llm.apply_model(resident_memory)[0]
    out = {"greedy": [list(o.outputs[0].token_ids) for o in greedy],
           "sampled": [list(o.outputs[0].token_ids) for o in sampled],
           "text_greedy": [list(o.outputs[0].token_ids) for o in text],
           "texts": [o.outputs[0].text for o in text], "weights": weights, "resident": resident}
    json.dump(out, open(sys.argv[2], "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
