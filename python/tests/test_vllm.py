"""The vLLM load format ``tensorzip`` (tensorzip.vllm; doc/vllm.md).

The model: the fixture GPT (python/tests/_gpt.py, real trained weights) written as a Hugging Face
GPT-2 folder (GPT2LMHeadModel: Conv1D weights transposed, exact gelu, untied lm_head, byte-level
vocabulary of 256 with a byte-level tokenizer), checked against _gpt.py's model with transformers,
then compressed with `tzip compress`. vLLM (CPU build; scripts/vllm-test.sh installs it in a venv
of its own) serves the plain folder and the compressed ones, each engine in a process of its own
(_vllm_worker.py), once per folder: the token ids of greedy and seeded sampling, and the bytes of
every parameter in the loaded model, must be identical. The weight stream's own tests
(bit-identity, the bounded window, errors) need no vLLM and run in the main Python tests too.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

import tensorzip  # noqa: E402
from tensorzip import _vllm_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _gpt  # noqa: E402
import _weight_folders  # noqa: E402
from _engines import need_module  # noqa: E402

WORKER = Path(__file__).parent / "_vllm_worker.py"
# scripts/vllm-test.sh sets TZ_VLLM_REQUIRED=1: there a vLLM that does not import fails the tests
# instead of skipping them (the main Python tests, without vLLM, skip the engine tests).
REQUIRED = os.environ.get("TZ_VLLM_REQUIRED") == "1"
TEXT_PROMPTS = ["def load_file(path", "import numpy as np\n"]
ENGINE_TIMEOUT = 900


def _gpt_weights() -> Path:
    return _gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE


def gpt2_state_dict(sd):
    """_gpt.py's names -> GPT2LMHeadModel's (Conv1D stores Linear weights as [in, out])."""
    out = {"transformer.wte.weight": sd["tok.weight"], "transformer.wpe.weight": sd["pos.weight"],
           "transformer.ln_f.weight": sd["lnf.weight"], "transformer.ln_f.bias": sd["lnf.bias"],
           "lm_head.weight": sd["head.weight"]}
    conv = {"qkv": "attn.c_attn", "proj": "attn.c_proj", "fc1": "mlp.c_fc", "fc2": "mlp.c_proj"}
    for i in range(_gpt.n_layers_of(sd)):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{dst}{b}.weight"], out[f"{dst}{b}.bias"] = sd[f"{src}{a}.weight"], sd[f"{src}{a}.bias"]
        for a, b in conv.items():
            out[f"{dst}{b}.weight"] = sd[f"{src}{a}.weight"].t().contiguous()
            out[f"{dst}{b}.bias"] = sd[f"{src}{a}.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def _bytes_to_unicode():
    """GPT-2's byte <-> printable character table (the byte-level pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_byte_tokenizer(folder: Path) -> None:
    """A byte-level tokenizer whose ids are the bytes themselves (vocabulary 256, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 256, "eos_token": "\x00",
         "bos_token": "\x00", "clean_up_tokenization_spaces": False}))


def write_gpt2_folder(folder: Path, sd, n_layers: int, shards: int = 1) -> None:
    folder.mkdir(parents=True)
    transformers.GPT2Config(
        vocab_size=256, n_positions=256, n_embd=256, n_layer=n_layers, n_head=8, n_inner=1024,
        activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, architectures=["GPT2LMHeadModel"],
        dtype="bfloat16").save_pretrained(folder)
    write_byte_tokenizer(folder)
    _weight_folders.write_weights(folder, sd, shards)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tzip_cli):
    """{"plain", "tzip", "plain_sharded", "tzip_sharded"}: the GPT-2 folders and their compressed forms."""
    src = _gpt_weights()
    sd = _gpt.state_dict_of(src)
    n_layers = _gpt.n_layers_of(sd)
    hf = gpt2_state_dict(sd)
    root = tmp_path_factory.mktemp("vllm")
    out = {"plain": root / "gpt2", "plain_sharded": root / "gpt2-sharded", "n_layers": n_layers}
    write_gpt2_folder(out["plain"], hf, n_layers)
    write_gpt2_folder(out["plain_sharded"], hf, n_layers, shards=2)
    for key in ("plain", "plain_sharded"):
        dst = root / (out[key].name + ".tzip")
        subprocess.run([tzip_cli, "compress", str(out[key]), "-o", str(dst)], check=True, capture_output=True,
                       timeout=600)
        out[key.replace("plain", "tzip")] = dst
    assert sorted(p.name for p in out["tzip_sharded"].glob("*.tzip")) == \
        ["model-00001-of-00002.tzip", "model-00002-of-00002.tzip"]
    return out


@pytest.fixture(scope="module")
def delta(folders, tmp_path_factory, tzip_cli):
    """(folder, refs): the model compressed as a delta against a previous version of it (every third
    element's lowest bit flipped), whose .tzip folder was then moved away from the recorded path."""
    root = tmp_path_factory.mktemp("delta")
    sd = load_file(str(folders["plain"] / "model.safetensors"))
    prev = {}
    for name, t in sd.items():
        bits = t.view(torch.int16).clone().view(-1)
        bits[::3] ^= 1
        prev[name] = bits.view(t.shape).view(t.dtype)
    write_gpt2_folder(root / "prev", prev, folders["n_layers"])
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=600)
    run([tzip_cli, "compress", str(root / "prev"), "-o", str(root / "prev.tzip")])
    run([tzip_cli, "compress", str(folders["plain"]), "-o", str(root / "delta.tzip"), "--ref", str(root / "prev.tzip")])
    with tensorzip.safe_open(str(root / "delta.tzip" / "model.tzip"), framework="pt") as f:
        assert len(f.predictions()) == len(sd) and all(p["kind"] == "delta" for p in f.predictions().values())
    (root / "elsewhere").mkdir()
    moved = root / "elsewhere" / "prev-moved.tzip"
    shutil.move(str(root / "prev.tzip"), str(moved))
    return root / "delta.tzip", moved


# ---- the model and the weight stream (no vLLM needed) ----

def test_gpt2_folder_is_the_fixture_model(folders):
    """GPT2LMHeadModel on the folder computes _gpt.py's model (the name and layout mapping is right)."""
    ref = _gpt.gpt(_gpt_weights(), dtype=torch.float32)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folders["plain"]), dtype=torch.float32).eval()
    ids = _gpt.real_text_ids(128)
    with torch.no_grad():
        a = ref(ids)
        b = hf(ids).logits
    assert folders["n_layers"] == len(hf.transformer.h)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kind", ["tzip", "tzip_sharded"])
def test_weight_stream_is_bit_identical(folders, kind):
    files = _vllm_weights.model_weight_files(str(folders[kind]))
    got = dict(_vllm_weights.iter_weights(files, threads=3))
    want = load_file(str(folders["plain"] / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), name


def test_weight_stream_refs(folders, delta):
    """A delta-coded folder: its reference found through refs (a folder of .tzip files), not otherwise."""
    import tensorzip.vllm as tzv

    folder, moved = delta
    files = _vllm_weights.model_weight_files(str(folder))
    with pytest.raises(tensorzip.TensorZipError, match=str(folder / "model.tzip")):
        next(_vllm_weights.iter_weights(files, threads=2))
    refs = tzv._options({"refs": str(moved)})["refs"]
    assert refs == [str(moved / "model.tzip")]
    got = dict(_vllm_weights.iter_weights(files, threads=2, refs=refs))
    want = load_file(str(folders["plain"] / "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[n].view(torch.int16), t.view(torch.int16)) for n, t in want.items())


def test_weight_stream_window(folders, monkeypatch):
    """At most `window` decoded tensors exist that the consumer has not taken."""
    files = _vllm_weights.model_weight_files(str(folders["tzip"]))
    taken, decoded, most = _weight_folders.most_decoded_ahead(monkeypatch, tensorzip.SafeOpen, "get_tensor_in",
                                                              files, threads=2, window=3)
    assert taken == decoded > 3
    assert most <= 3


def test_weight_stream_errors(folders, tmp_path):
    with pytest.raises(tensorzip.UsageError, match="no .tzip weights"):
        _vllm_weights.model_weight_files(str(folders["plain"]))
    with pytest.raises(tensorzip.UsageError, match="not a local folder"):
        _vllm_weights.model_weight_files(str(tmp_path / "nowhere"))
    broken = missing_shard_copy(folders, tmp_path)
    with pytest.raises(tensorzip.UsageError, match=r"index.json names shards that are not in .*: model-00002-of-00002\.tzip "):
        _vllm_weights.model_weight_files(str(broken))


def missing_shard_copy(folders, tmp_path) -> Path:
    dst = tmp_path / "missing-shard.tzip"
    shutil.copytree(folders["tzip_sharded"], dst)
    (dst / "model-00002-of-00002.tzip").unlink()
    return dst


def corrupt_copy(folders, tmp_path):
    """A copy of the compressed folder with one byte of one tensor's frame flipped: (folder, tensor)."""
    return _weight_folders.corrupt_copy(folders["tzip"], tmp_path)


def test_weight_stream_corrupt_frame(folders, tmp_path):
    folder, tensor = corrupt_copy(folders, tmp_path)
    files = _vllm_weights.model_weight_files(str(folder))
    with pytest.raises(tensorzip.CorruptDataError) as e:
        for _ in _vllm_weights.iter_weights(files, threads=2):
            pass
    msg = str(e.value)
    assert str(folder / "model.tzip") in msg and msg.count(f"tensor {tensor!r}") == 1, msg


# ---- vLLM engines ----

def need_vllm():
    need_module("vllm", REQUIRED)


def _vllm_env():
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def prompts():
    return [_gpt.real_text_ids(48, off)[0].tolist() for off in (0, 700, 1500)]


def run_engine(tmp_path: Path, model: Path, load_format: str, extra=None, quantization=None):
    """(returncode, result dict or None, its output: stdout then stderr) of one engine in its own process."""
    need_vllm()
    spec = tmp_path / f"spec-{model.name}-{load_format}-{quantization}.json"
    out = tmp_path / f"out-{model.name}-{load_format}-{quantization}.json"
    spec.write_text(json.dumps({"model": str(model), "load_format": load_format, "extra": extra or {},
                                "quantization": quantization, "prompts": prompts(), "text_prompts": TEXT_PROMPTS,
                                "max_tokens": 24}))
    p = subprocess.run([sys.executable, str(WORKER), str(spec), str(out)], capture_output=True, text=True,
                       env=_vllm_env(), timeout=ENGINE_TIMEOUT)
    result = json.loads(out.read_text()) if p.returncode == 0 else None
    return p.returncode, result, p.stdout + p.stderr  # vLLM logs to stdout


def engine_result(tmp_path_factory, folders, key, load_format, extra=None, quantization=None):
    rc, result, err = run_engine(tmp_path_factory.mktemp("engine"), folders[key], load_format, extra, quantization)
    assert rc == 0, f"vLLM on {folders[key]} ({load_format}, quantization {quantization}) exited {rc}:\n{err[-6000:]}"
    result["log"] = err
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory, folders):
    """vLLM serving the plain safetensors folder with its default loader."""
    return engine_result(tmp_path_factory, folders, "plain", "auto")


@pytest.fixture(scope="module")
def served_tzip(tmp_path_factory, folders):
    return engine_result(tmp_path_factory, folders, "tzip", "tensorzip", {"threads": 2})


@pytest.fixture(scope="module")
def served_sharded(tmp_path_factory, folders):
    return engine_result(tmp_path_factory, folders, "tzip_sharded", "tensorzip")


@pytest.fixture(scope="module")
def served_delta(tmp_path_factory, delta):
    folder, moved = delta
    return engine_result(tmp_path_factory, {"delta": folder}, "delta", "tensorzip", {"refs": str(moved)})


@pytest.mark.parametrize("mode", ["served_tzip", "served_sharded", "served_delta"])
def test_same_tokens_and_weights(reference, request, mode):
    got = request.getfixturevalue(mode)
    assert len(reference["weights"]) > 0 and got["weights"] == reference["weights"]
    assert got["greedy"] == reference["greedy"]
    assert got["sampled"] == reference["sampled"]
    assert got["text_greedy"] == reference["text_greedy"] and got["texts"] == reference["texts"]
    # Outputs that depend on the weights: the prompts' greedy continuations differ, sampling differs.
    assert len({tuple(ids) for ids in reference["greedy"]}) == len(reference["greedy"])
    assert reference["sampled"] != reference["greedy"]


def test_engine_refuses_missing_shard(folders, tmp_path):
    folder = missing_shard_copy(folders, tmp_path)
    rc, _, err = run_engine(tmp_path, folder, "tensorzip")
    assert rc == 3, err[-4000:]
    line = [x for x in err.splitlines() if x.startswith("ENGINE ERROR:")][-1]
    assert "UsageError" in line and "names shards that are not in" in line and "model-00002-of-00002.tzip" in line \
        and str(folder) in line, line


def test_engine_refuses_corrupt_frame(folders, tmp_path):
    folder, tensor = corrupt_copy(folders, tmp_path)
    rc, _, err = run_engine(tmp_path, folder, "tensorzip", {"threads": 2})
    assert rc == 3, err[-4000:]
    line = [x for x in err.splitlines() if x.startswith("ENGINE ERROR:")][-1]
    assert "CorruptDataError" in line and str(folder / "model.tzip") in line, line
    assert line.count(f"tensor {tensor!r}") == 1, line


def test_engine_refuses_missing_tensor(folders, tmp_path, tzip_cli):
    """A folder whose weights lack a tensor the model needs: vLLM's own check, naming the folder."""
    sd = load_file(str(folders["plain"] / "model.safetensors"))
    del sd["transformer.ln_f.bias"]
    write_gpt2_folder(tmp_path / "partial", sd, folders["n_layers"])
    folder = tmp_path / "partial.tzip"
    subprocess.run([tzip_cli, "compress", str(tmp_path / "partial"), "-o", str(folder)], check=True,
                   capture_output=True, timeout=600)
    rc, _, err = run_engine(tmp_path, folder, "tensorzip")
    assert rc == 3, err[-4000:]
    line = [x for x in err.splitlines() if x.startswith("ENGINE ERROR:")][-1]
    assert "UsageError" in line and str(folder) in line and "transformer.ln_f.bias" in line, line


def test_plugin_registered_and_options_checked():
    need_vllm()
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    import tensorzip.vllm as tzv

    load_general_plugins()  # through the entry point, as vLLM does
    loader = get_model_loader(LoadConfig(load_format="tensorzip", model_loader_extra_config={"threads": 3}))
    assert type(loader) is tzv.loader_class() and loader.options == {"threads": 3}
    with pytest.raises(tensorzip.UsageError, match="unknown key.*'thread'"):
        get_model_loader(LoadConfig(load_format="tensorzip", model_loader_extra_config={"thread": 3}))
    with pytest.raises(tensorzip.UsageError, match="threads must be an integer"):
        get_model_loader(LoadConfig(load_format="tensorzip", model_loader_extra_config={"threads": "8"}))
    with pytest.raises(tensorzip.UsageError, match="device_decode must be true or false"):
        get_model_loader(LoadConfig(load_format="tensorzip", model_loader_extra_config={"device_decode": "yes"}))
    loader = get_model_loader(LoadConfig(load_format="tensorzip",
                                         model_loader_extra_config={"device_decode": False}))
    assert loader.options == {"device_decode": False}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def openai_server(args, log_path: Path, env: dict):
    """``python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port P *args`` in vLLM's
    default process layout (API server, engine core, worker): yields its base URL once /health
    answers; stopped (its process group) on exit. Its output goes to log_path."""
    need_vllm()
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
           *args]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env, VLLM_ENABLE_V1_MULTIPROCESSING="1"),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + ENGINE_TIMEOUT
        while True:
            assert proc.poll() is None, f"server exited {proc.returncode}:\n{log_path.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server not ready in time"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}"
        log.flush()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_openai_server(folders, reference, tmp_path):
    """python -m vllm.entrypoints.openai.api_server --load-format tensorzip answers as the plain folder's engine."""
    # The load format is registered in each of the server's processes through the entry point.
    args = ["--model", str(folders["tzip"]), "--load-format", "tensorzip", "--model-loader-extra-config",
            '{"threads": 2}', "--dtype", "bfloat16", "--max-model-len", "256", "--max-num-seqs", "8",
            "--enforce-eager", "--seed", "0"]
    with openai_server(args, tmp_path / "server.log", _vllm_env()) as url:
        for i, text in enumerate(TEXT_PROMPTS):
            r = _post(f"{url}/v1/completions",
                      {"model": str(folders["tzip"]), "prompt": text, "max_tokens": 24, "temperature": 0,
                       "ignore_eos": True, "return_token_ids": True})
            choice = r["choices"][0]
            assert choice["text"] == reference["texts"][i]
            if choice.get("token_ids") is not None:
                assert choice["token_ids"] == reference["text_greedy"][i]
    text = (tmp_path / "server.log").read_text()
    assert "Registered model loader" in text and "tensorzip: loaded the weights of" in text


# ---- weights kept compressed in memory: quantization="tensorzip" ----

RESIDENT = "tensorzip"


@pytest.fixture(scope="module")
def resident_tzip(tmp_path_factory, folders):
    return engine_result(tmp_path_factory, folders, "tzip", "tensorzip", {"threads": 2}, quantization=RESIDENT)


@pytest.fixture(scope="module")
def resident_sharded(tmp_path_factory, folders):
    return engine_result(tmp_path_factory, folders, "tzip_sharded", "tensorzip", quantization=RESIDENT)


@pytest.fixture(scope="module")
def resident_plain(tmp_path_factory, folders):
    """A plain safetensors folder served with its weights kept compressed."""
    return engine_result(tmp_path_factory, folders, "plain", "tensorzip", quantization=RESIDENT)


def _plain_weights(folders):
    return load_file(str(folders["plain"] / "model.safetensors"))


@pytest.mark.parametrize("mode", ["resident_tzip", "resident_sharded", "resident_plain"])
def test_resident_same_tokens(reference, folders, request, mode):
    got = request.getfixturevalue(mode)
    assert got["greedy"] == reference["greedy"]
    assert got["sampled"] == reference["sampled"]
    assert got["text_greedy"] == reference["text_greedy"] and got["texts"] == reference["texts"]
    # Every weight matrix of the checkpoint is held as frames, no longer a parameter (the biases and
    # norms stay plain parameters).
    res = got["resident"]
    assert res is not None, "the model's weights were not kept compressed"
    matrices = {n for n, t in _plain_weights(folders).items() if t.dim() == 2}
    held = set(reference["weights"]) - set(got["weights"])
    assert held == matrices and set(got["weights"]) < set(reference["weights"]), sorted(held ^ matrices)
    assert res["stats"]["on_demand_decodes"] > 0  # the output head: read by vLLM's logits processor


def test_resident_memory_at_rest(resident_tzip, folders):
    """Frames + every other tensor of the model <= 0.70x of the BF16 checkpoint; scratch <= two blocks."""
    sd = _plain_weights(folders)
    bf16 = sum(t.numel() * t.element_size() for t in sd.values())
    block = sum(t.numel() * t.element_size() for n, t in sd.items() if n.startswith("transformer.h.0."))
    res = resident_tzip["resident"]
    at_rest = res["frame_bytes"] + res["other_bytes"]
    assert res["frame_bytes"] == res["stats"]["compressed_bytes"] > 0
    assert at_rest <= 0.70 * bf16, (at_rest, bf16, at_rest / bf16)
    assert 0 < res["scratch_bytes"] <= 2 * block + 4096, (res["scratch_bytes"], block)
    # The figures reported at start: one log line with the compressed and raw bytes, ratio and scratch.
    line = next(x for x in resident_tzip["log"].splitlines() if "weights kept compressed" in x)
    assert f"{res['stats']['compressed_bytes']} bytes of frames for {res['stats']['plain_bytes']} raw bytes" in line
    assert f"scratch {2 * res['stats']['slot_bytes']} bytes" in line
    n = res["stats"]["tensors"]
    assert f"plain weights freed: {n} of {n}" in line, line  # no reference to a plain weight left behind


def test_resident_refuses_corrupt_frame(folders, tmp_path):
    folder, tensor = corrupt_copy(folders, tmp_path)
    rc, _, err = run_engine(tmp_path, folder, "tensorzip", {"threads": 2}, quantization=RESIDENT)
    assert rc == 3, err[-4000:]
    line = [x for x in err.splitlines() if x.startswith("ENGINE ERROR:")][-1]
    assert "CorruptDataError" in line and str(folder / "model.tzip") in line, line
    assert line.count(f"tensor {tensor!r}") == 1, line


def test_resident_registered_and_checks(monkeypatch):
    """The entry point registers quantization="tensorzip"; it refuses other load formats and compiled models."""
    need_vllm()
    import types

    import vllm.config
    from vllm.config import CompilationMode
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.plugins import load_general_plugins

    from tensorzip import _vllm_resident

    load_general_plugins()
    cls = get_quantization_config("tensorzip")
    assert cls is _vllm_resident.config_class() and cls.get_config_filenames() == []
    config = cls.from_config({})
    assert config.get_name() == "tensorzip"
    # vLLM pickles its config, this object in it, into the worker processes it starts.
    assert type(pickle.loads(pickle.dumps(config))) is cls
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none",
                        lambda: types.SimpleNamespace(load_config=types.SimpleNamespace(load_format="auto")))
    with pytest.raises(tensorzip.UsageError, match="pass load_format='tensorzip'.*not 'auto'"):
        config.get_quant_method(torch.nn.Linear(4, 4), "x")
    compiled = types.SimpleNamespace(compilation_config=types.SimpleNamespace(mode=CompilationMode.VLLM_COMPILE))
    with pytest.raises(tensorzip.UsageError, match="enforce_eager=True"):
        _vllm_resident.check_can_keep_compressed(compiled)
    eager = types.SimpleNamespace(compilation_config=types.SimpleNamespace(mode=CompilationMode.NONE))
    _vllm_resident.check_can_keep_compressed(eager)
