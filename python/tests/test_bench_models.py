"""bench/gpt2_models.py, the models the vLLM benchmarks serve: a tiled model is GPT2LMHeadModel's exact
set of tensors, each a cyclic run of the fixture's real weights of its kind, and a folder written from
it loads in transformers with nothing missing or left over."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).parent))
import _gpt  # noqa: E402
import gpt2_models  # noqa: E402

SMALL = dict(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2, n_inner=256)


@pytest.fixture(autouse=True)
def fixture_weights(monkeypatch):
    monkeypatch.setattr(gpt2_models, "FIXTURE", _gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE)


def test_tiled_is_a_cyclic_run_of_the_pool():
    pool = torch.arange(10, dtype=torch.float32)
    t = gpt2_models.tiled(pool, (3, 5), 27)
    assert t.shape == (3, 5)
    assert t.reshape(-1).tolist() == [float((27 + i) % 10) for i in range(15)]


def test_tiled_state_dict_is_gpt2s_tensors_made_of_the_fixtures_weights():
    sd = gpt2_models.tiled_state_dict(SMALL)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SMALL, tie_word_embeddings=False))
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith((".attn.bias", ".masked_bias"))}
    assert {k: tuple(v.shape) for k, v in sd.items()} == want
    pools = gpt2_models.fixture_pools()
    for name, kind in (("transformer.h.1.mlp.c_fc.weight", "mlp.c_fc.weight"), ("lm_head.weight", "lm_head"),
                       ("transformer.h.0.ln_2.bias", "ln.bias")):
        t, pool = sd[name].reshape(-1), pools[kind]
        assert t.dtype == torch.bfloat16
        n = pool.numel()
        cand = torch.nonzero(pool == t[0]).reshape(-1)
        for k in range(1, 8):  # starts whose first 8 values match, then the whole run
            cand = cand[pool[(cand + k) % n] == t[k]]
        runs = [int(c) for c in cand if torch.equal(pool[(torch.arange(t.numel()) + int(c)) % n], t)]
        assert runs, f"{name} is not a cyclic run of the fixture's {kind} weights"


def test_tiled_folder_loads_in_transformers(tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "tiled"
    gpt2_models.write_gpt2_config(folder, SMALL)
    sd = gpt2_models.tiled_state_dict(SMALL)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(model.state_dict()["transformer.h.1.attn.c_proj.weight"],
                       sd["transformer.h.1.attn.c_proj.weight"])
    assert (folder / "tokenizer.json").is_file()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 256) and torch.isfinite(logits).all()


def test_unknown_model_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        gpt2_models.write_model("huge", tmp_path / "x")


def _row(config, store, first, top):
    return {"config": config, "store": store, "first": first, "top": top}


def test_first_tokens_problem():
    top = [[[8, -3.87], [40, -3.87]], [[21, -4.06], [53, -4.06]]]
    other = [[[8, -3.87], [40, -3.87]], [[31, -4.05], [63, -4.05]]]
    rows = [_row("recompute", None, [8, 31], other), _row("plain", "plain", [8, 21], top),
            _row("tz", "tensorzip", [8, 21], top)]
    check = gpt2_models.first_tokens_problem
    # The tiled model: recompute may pick another tied token; the two stores must agree bit for bit.
    assert check(rows, "tiled", ("plain", "tensorzip"), key="store") is None
    assert "first tokens differ: recompute [8, 31], plain [8, 21]" in \
        check(rows, "fixture", ("plain", "tensorzip"), key="store")
    off_by_a_bit = [[[8, -3.87], [40, -3.87]], [[21, -4.0600001], [53, -4.06]]]
    rows[2] = _row("tz", "tensorzip", [8, 21], off_by_a_bit)
    assert "tz and plain read the same KV back but differ" in \
        check(rows, "tiled", ("plain", "tensorzip"), key="store")


def test_tiled_lm_head_rows_repeat_every_32_tokens():
    """Why the tiled model's logits tie (first_tokens_problem's reason), checked on the real tensor."""
    head = gpt2_models.tiled_state_dict(dict(SMALL, n_embd=2048, n_layer=1, n_inner=8))["lm_head.weight"]
    assert torch.equal(head[8], head[40]) and torch.equal(head[40], head[72])
    assert not torch.equal(head[8], head[9])
