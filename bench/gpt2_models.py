"""The GPT-2-layout models the vLLM benchmarks serve, both made of the fixture GPT's real trained BF16
weights (../shared/fixtures/gpt-small-step400-model-bf16.safetensors; TZ_FIXTURES overrides the folder):

- ``fixture``: the fixture GPT itself (6 layers, n_embd 256, 8 heads of 32, vocab 256), written as
  python/tests/test_vllm.py writes it (Conv1D weights transposed, byte-level tokenizer).
- ``tiled``: a 1.21 GB model (n_embd 2048, 12 layers, 16 heads of 128, n_inner 8192, vocab 256,
  n_positions 256, untied lm_head). For each kind of tensor (token embedding, position embedding,
  layernorm weights, layernorm biases, c_attn / attn.c_proj / mlp.c_fc / mlp.c_proj weights in
  Conv1D [in, out] layout and their biases, lm_head) the fixture's tensors of that kind (all layers)
  are flattened and concatenated into one pool; a tensor of the big model is that pool tiled
  (repeated) to its element count from an offset that differs per tensor, and reshaped. No random
  numbers; the model computes, but it was never trained at this size.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(os.environ.get("TZ_FIXTURES") or ROOT.parent / "shared" / "fixtures") / \
    "gpt-small-step400-model-bf16.safetensors"
TILED = dict(vocab_size=256, n_positions=256, n_embd=2048, n_layer=12, n_head=16, n_inner=8192)
MODELS = ("fixture", "tiled")


def _tests_on_path() -> None:
    tests = str(ROOT / "python" / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def fixture_pools():
    """{kind: 1-D BF16 tensor}: the fixture's real weights of each kind, in GPT-2 layout."""
    import torch
    from safetensors.torch import load_file
    sd = load_file(str(FIXTURE))
    n = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    kinds = {"wte": ["tok.weight"], "wpe": ["pos.weight"], "lm_head": ["head.weight"]}
    for i in range(n):
        b = f"blocks.{i}."
        kinds.setdefault("ln.weight", []).extend([b + "ln1.weight", b + "ln2.weight"])
        kinds.setdefault("ln.bias", []).extend([b + "ln1.bias", b + "ln2.bias"])
        for src, dst in (("qkv", "attn.c_attn"), ("proj", "attn.c_proj"), ("fc1", "mlp.c_fc"),
                         ("fc2", "mlp.c_proj")):
            kinds.setdefault(dst + ".weight", []).append(b + src + ".weight")
            kinds.setdefault(dst + ".bias", []).append(b + src + ".bias")
    kinds["ln.weight"].append("lnf.weight")
    kinds["ln.bias"].append("lnf.bias")
    conv = lambda k, t: t.t() if t.dim() == 2 and k.startswith(("attn", "mlp")) else t  # noqa: E731
    return {k: torch.cat([conv(k, sd[name]).contiguous().reshape(-1) for name in names])
            for k, names in kinds.items()}


def tiled(pool, shape, offset):
    numel = math.prod(shape)
    reps = -(-(numel + offset) // pool.numel())
    return pool.repeat(reps)[offset % pool.numel():][:numel].reshape(shape).clone()


def tiled_state_dict(cfg=TILED):
    """GPT2LMHeadModel's tensors for ``cfg``, each tiled from the fixture's pool of its kind."""
    pools = fixture_pools()
    d, inner, out = cfg["n_embd"], cfg["n_inner"], {}
    shapes = {"attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,), "attn.c_proj.weight": (d, d),
              "attn.c_proj.bias": (d,), "mlp.c_fc.weight": (d, inner), "mlp.c_fc.bias": (inner,),
              "mlp.c_proj.weight": (inner, d), "mlp.c_proj.bias": (d,)}
    idx = 0

    def put(name, kind, shape):
        nonlocal idx
        idx += 1
        out[name] = tiled(pools[kind], shape, idx * 7919)

    put("transformer.wte.weight", "wte", (cfg["vocab_size"], d))
    put("transformer.wpe.weight", "wpe", (cfg["n_positions"], d))
    for i in range(cfg["n_layer"]):
        for ln in ("ln_1", "ln_2"):
            put(f"transformer.h.{i}.{ln}.weight", "ln.weight", (d,))
            put(f"transformer.h.{i}.{ln}.bias", "ln.bias", (d,))
        for kind, shape in shapes.items():
            put(f"transformer.h.{i}.{kind}", kind, shape)
    put("transformer.ln_f.weight", "ln.weight", (d,))
    put("transformer.ln_f.bias", "ln.bias", (d,))
    put("lm_head.weight", "lm_head", (cfg["vocab_size"], d))
    return out


def write_gpt2_config(folder: Path, cfg: dict, tokenizer: bool = True) -> None:
    """config.json of a GPT2LMHeadModel (exact GELU, untied head, BF16) and, with ``tokenizer``, the
    byte-level tokenizer python/tests/test_vllm.py writes."""
    import transformers
    folder.mkdir(parents=True, exist_ok=True)
    transformers.GPT2Config(**cfg, activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False, bos_token_id=0,
                            eos_token_id=0, architectures=["GPT2LMHeadModel"],
                            dtype="bfloat16").save_pretrained(folder)
    if tokenizer:
        _tests_on_path()
        from test_vllm import write_byte_tokenizer
        write_byte_tokenizer(folder)


def write_model(name: str, folder: Path) -> dict:
    """Writes model ``name`` (one of MODELS) as a GPT-2 folder with a tokenizer; returns its
    config (n_layer, n_embd, n_head)."""
    from safetensors.torch import save_file
    _tests_on_path()
    if name == "fixture":
        import _gpt
        from test_vllm import gpt2_state_dict, write_gpt2_folder
        sd = _gpt.state_dict_of(FIXTURE)
        n = _gpt.n_layers_of(sd)
        write_gpt2_folder(folder, gpt2_state_dict(sd), n)
        return dict(n_layer=n, n_embd=256, n_head=8)
    if name == "tiled":
        write_gpt2_config(folder, TILED)
        save_file(tiled_state_dict(), str(folder / "model.safetensors"), metadata={"format": "pt"})
        return {k: TILED[k] for k in ("n_layer", "n_embd", "n_head")}
    raise ValueError(f"unknown model {name!r} (one of {', '.join(MODELS)})")


def describe(name: str) -> str:
    """One phrase naming the model for a report."""
    if name == "fixture":
        return "the fixture GPT (6 layers, 8 heads of 32, BF16)"
    return (f"the tiled GPT-2 ({TILED['n_layer']} layers, {TILED['n_head']} heads of "
            f"{TILED['n_embd'] // TILED['n_head']}, 1.21 GB of BF16 tiled from the fixture's real weights)")


def top_logprobs(logprobs: dict) -> list:
    """vLLM's {token: Logprob} of one position as [(token, logprob)], best first."""
    return sorted(([int(k), float(v.logprob)] for k, v in logprobs.items()), key=lambda x: (-x[1], x[0]))


def first_tokens_problem(rows: list, model: str, same_kv: tuple, key: str) -> str | None:
    """Why the first tokens of a time-to-first-token run are wrong, or None. ``rows``: one per
    configuration, with "config", ``key``, "first" (a token per prompt) and "top" (top_logprobs per
    prompt). The rows whose ``key`` is in ``same_kv`` read the same KV back from a store (one
    compressed by tensorzip, one not) and compute the same positions: their first tokens and
    log-probabilities must be equal bit for bit. With the fixture GPT every row's first tokens must
    be the same. Not with the tiled model: its lm_head repeats its rows every 32 tokens (the pool of
    256 x 256 values tiled 2048 wide), so the best logits tie exactly, and a configuration that
    computes other positions (recompute, the engine's prefix cache) rounds differently in BF16 and
    may pick another of the tied tokens."""
    pair = [r for r in rows if r[key] in same_kv]
    for r in pair[1:]:
        if (r["first"], r["top"]) != (pair[0]["first"], pair[0]["top"]):
            return (f"{r['config']} and {pair[0]['config']} read the same KV back but differ: "
                    f"{r['first']} {r['top']} vs {pair[0]['first']} {pair[0]['top']}")
    if model == "fixture":
        for r in rows[1:]:
            if r["first"] != rows[0]["first"]:
                return f"first tokens differ: {rows[0]['config']} {rows[0]['first']}, {r['config']} {r['first']}"
    return None
