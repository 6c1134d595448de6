"""tensorzip.kv: the KV page codec from Python (real KV pages of the fixture GPT
over Python source text, casts, special values, damage, batches, vLLM-style
row views, tables save/load) and the transformers cache (generation
token-for-token identical to DynamicCache with a tiny random-init Llama)."""
import os
import sys

import numpy as np
import pytest

import tensorzip
import tensorzip.kv as tkv

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "kv-fixture-l0.safetensors")
FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "gpt-small-step400-model-bf16.safetensors")


def real_kv():
    """Layer 0 K and V of the fixture GPT, (2 seq, 256 tokens, 8 heads, 32) BF16 (tests/data)."""
    from safetensors.torch import load_file

    d = load_file(DATA)
    return d["k"], d["v"]


def pages_of(seq, tokens):  # (256, 8, 32) -> (256 / tokens, tokens, 8, 32)
    return seq.reshape(-1, tokens, *seq.shape[1:])


def ratio(codec, pages):
    blobs = codec.encode_batch(pages)
    return pages.numel() * pages.element_size() / sum(len(b) for b in blobs), blobs


@pytest.mark.parametrize("mode,lo16,lo256", [("rans", 1.45, 1.49), ("fixed", 1.30, 1.30)])
def test_real_pages_round_trip_and_ratio(mode, lo16, lo256):
    k, v = real_kv()
    for t in (k, v):
        codec = tkv.PageCodec.calibrate(t[0], mode=mode)  # tables from sequence 0
        assert codec.row_shape == (8, 32) and codec.dtype == "BF16" and codec.mode == mode
        for tokens, lo in ((16, lo16), (64, lo16), (256, lo256)):
            pages = pages_of(t[1], tokens)
            r, blobs = ratio(codec, pages)
            assert r >= lo, (mode, tokens, r)
            back = codec.decode_batch(blobs)
            assert back.shape == pages.shape and back.dtype == torch.bfloat16
            assert torch.equal(back.view(torch.int16), pages.view(torch.int16))
            one = codec.decode(codec.encode(pages[0]))
            assert one.shape == (tokens, 8, 32) and torch.equal(one.view(torch.int16), pages[0].view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_casts_round_trip(dtype):
    k, _ = real_kv()
    sample, data = k[0].float().to(dtype), k[1].float().to(dtype)
    for mode in ("rans", "fixed"):
        codec = tkv.PageCodec.calibrate(sample, mode=mode)
        pages = pages_of(data, 16)
        r, blobs = ratio(codec, pages)
        assert r > 1.0
        back = codec.decode_batch(blobs)
        assert back.dtype == dtype
        assert torch.equal(back.view(torch.uint8), pages.view(torch.uint8))


def test_numpy_pages_and_special_values():
    import ml_dtypes

    k, _ = real_kv()
    sample = k[0].view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    codec = tkv.PageCodec.calibrate(sample)
    page = k[1][:16].view(torch.int16).numpy().copy()
    special = np.array([0x7F80, 0xFF80, 0x7FC1, 0x8000, 0x0001, 0x807F, 0x7F7F], dtype=np.uint16).view(np.int16)
    page.reshape(-1)[: special.size * 50 : 50] = special  # inf, -inf, NaN payload, -0, subnormals, max
    page = page.view(ml_dtypes.bfloat16)
    blob = codec.encode(page)
    back = codec.decode(blob)
    assert isinstance(back, np.ndarray) and back.shape == (16, 8, 32)
    assert np.array_equal(back.view(np.uint16), page.view(np.uint16))
    assert len(blob) < page.nbytes * 0.7  # specials go through escapes, the page still compresses


def test_tables_save_load(tmp_path):
    k, _ = real_kv()
    codec = tkv.PageCodec.calibrate(k[0], mode="fixed", fixed_bits=4, checksum=False)
    assert codec.fixed_bits == 4
    path = tmp_path / "k.tzkv"
    codec.save(path)
    again = tkv.PageCodec.load(path)
    assert again.to_bytes() == codec.to_bytes() and again.table_id == codec.table_id
    assert again.row_shape == (8, 32) and again.mode == "fixed"
    blob = codec.encode(k[1][:32])
    assert torch.equal(again.decode(blob).view(torch.int16), k[1][:32].view(torch.int16))
    bad = bytearray(codec.to_bytes())
    bad[40] ^= 1
    with pytest.raises(tensorzip.CorruptDataError):
        tkv.PageCodec.from_bytes(bytes(bad))


def test_damage_and_misuse_raise():
    k, v = real_kv()
    ck, cv = tkv.PageCodec.calibrate(k[0]), tkv.PageCodec.calibrate(v[0])
    blob = ck.encode(k[1][:16])
    with pytest.raises(tensorzip.UsageError, match="other tables"):
        cv.decode(blob)  # a page of the K codec given to the V codec
    for i in (0, 5, 20, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[i] ^= 0x10
        with pytest.raises(tensorzip.TensorZipError):
            ck.decode(bytes(bad))
    with pytest.raises(tensorzip.CorruptDataError):
        ck.decode(blob[:-3])
    with pytest.raises(tensorzip.UsageError):
        ck.encode(k[1][:16].float())  # wrong dtype
    with pytest.raises(tensorzip.UsageError):
        ck.encode(k[1][:16].reshape(16, 256))  # not (tokens, heads, head_dim)


def test_vllm_style_block_views():
    k, _ = real_kv()
    codec = tkv.PageCodec.calibrate(k[0], row_shape=())
    blocks = pages_of(k[1], 16).reshape(16, -1).view(torch.int8)  # (num_blocks, page_bytes) int8, as vLLM hands them
    blobs = codec.encode_rows(blocks, threads=2)
    out = torch.zeros_like(blocks)
    codec.decode_rows(blobs, out, threads=2)
    assert torch.equal(out, blocks)


@pytest.mark.skipif(not os.path.exists(FIXTURE), reason="../shared/fixtures not present")
def test_every_layer_of_the_fixture():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from make_kv_sample import fixture_kv
    from safetensors.torch import load_file

    text = b"".join(open(os.path.join(ROOT, "python", "tensorzip", f), "rb").read() for f in ("_file.py", "_core.py"))
    ids = torch.frombuffer(bytearray(text[: 4 * 256]), dtype=torch.uint8).long().view(4, 256)
    ks, vs = fixture_kv(load_file(FIXTURE), ids)
    assert len(ks) == 6
    for t in ks + vs:
        codec = tkv.PageCodec.calibrate(t[:2])
        r16, _ = ratio(codec, t[2:].reshape(-1, 16, 8, 32))
        r256, blobs = ratio(codec, t[2:].reshape(-1, 256, 8, 32))
        assert r16 >= 1.45 and r256 >= 1.49, (r16, r256)
        assert torch.equal(codec.decode_batch(blobs).reshape(t[2:].shape).view(torch.int16), t[2:].view(torch.int16))


# ---- transformers cache --------------------------------------------------------

def tiny_llama(dtype):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    return model


@pytest.mark.parametrize("mode", ["rans", "fixed"])
def test_transformers_cache_generation_identical(mode):
    transformers = pytest.importorskip("transformers")
    model = tiny_llama(torch.bfloat16)
    prompt = torch.frombuffer(bytearray(open(tkv.__file__, "rb").read()[:40]), dtype=torch.uint8).long()[None]
    kw = dict(max_new_tokens=40, do_sample=False, min_new_tokens=40)
    ref = transformers.DynamicCache()
    with torch.no_grad():
        plain = model.generate(prompt, cache=ref, **kw)
        cache = tkv.TensorZipKVCache(page_tokens=8, mode=mode)
        comp = model.generate(prompt, cache=cache, **kw)
    assert torch.equal(plain, comp)
    assert len(cache.layers) == 3
    layer = cache.layers[0]
    assert layer.compressed_tokens == 72 and layer.get_seq_length() == 79  # 40 + 40 - 1 tokens in the cache
    assert 0 < cache.compressed_nbytes() < cache.raw_nbytes()
    # Keys and values as the plain generation's DynamicCache holds them, bit for bit.
    for i, lay in enumerate(cache.layers):
        keys, values = lay.materialize()
        assert torch.equal(keys.view(torch.int16), ref.layers[i].keys.view(torch.int16))
        assert torch.equal(values.view(torch.int16), ref.layers[i].values.view(torch.int16))


def test_transformers_cache_reuses_tables_and_crops():
    transformers = pytest.importorskip("transformers")
    model = tiny_llama(torch.bfloat16)
    ids = torch.arange(60)[None] % 256
    first = tkv.TensorZipKVCache(page_tokens=16)
    with torch.no_grad():
        model(ids, cache=first)
    tables = first.codecs()
    assert set(tables) == {0, 1, 2}
    again = tkv.TensorZipKVCache(page_tokens=16, codecs=tables)
    ref = transformers.DynamicCache()
    with torch.no_grad():
        model(ids, cache=again)
        model(ids, cache=ref)
    assert again.layers[1].codecs[0] is tables[1][0]
    again.crop(-20)
    ref.crop(-20)
    for i in range(3):
        k, v = again.layers[i].materialize()
        assert again.layers[i].get_seq_length() == 40
        assert torch.equal(k.view(torch.int16), ref.layers[i].keys.view(torch.int16))
        assert torch.equal(v.view(torch.int16), ref.layers[i].values.view(torch.int16))
