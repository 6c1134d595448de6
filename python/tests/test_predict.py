"""Checkpoint-aware coding from Python: save_file(predict=, ref=, ref_original=),
load_file / safe_open(refs=), predictions() / references() (doc/python.md)."""
from __future__ import annotations

import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorzip
import tensorzip.numpy as tzn
import tensorzip.torch as tzt

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")


def checkpoint(rng, n=300_000, step=0):
    """A small mixed-precision checkpoint: FP32 master, BF16 weights cast from it (RNE),
    an FP32 Adam moment. `step` > 0 applies `step` small updates to the master."""
    master = rng.standard_normal(n).astype(np.float32) * np.float32(0.02)
    upd = np.random.default_rng(1234)
    for _ in range(step):
        master = master + (upd.standard_normal(n).astype(np.float32) * np.float32(1e-4) * np.abs(master))
        master = master.astype(np.float32)
    return {
        "master.w": master,
        "model.w": master.astype(ml_dtypes.bfloat16),
        "adam.m": (upd.standard_normal(n).astype(np.float32) * np.float32(1e-3)),
        "step": np.array([step], dtype=np.int64),
    }


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_all(loaded, d):
    assert set(loaded) == set(d)
    for k in d:
        assert same(loaded[k], d[k]), k


def test_cast_prediction_numpy(tmp_path):
    d = checkpoint(np.random.default_rng(0))
    p = tmp_path / "c.tzip"
    tzn.save_file(d, p)  # predict=True by default
    with tensorzip.safe_open(p, framework="np") as f:
        pr = f.predictions()
        assert pr == {"model.w": {"kind": "cast", "source": "master.w", "file": None}}
        assert f.references() == []
        assert f.format_version() == (2, 0)
    check_all(tzn.load_file(p), d)

    q = tmp_path / "plain.tzip"
    tzn.save_file(d, q, predict=False)
    with tensorzip.safe_open(q, framework="np") as f:
        assert f.predictions() == {}
        assert f.format_version() == (1, 0)
    check_all(tzn.load_file(q), d)
    assert os.path.getsize(p) < os.path.getsize(q)


def test_cast_prediction_inexact_torch(tmp_path):
    # BF16 weights that are the master's cast except for some elements: the
    # exceptions cost only their own bits, the round trip stays exact.
    g = torch.Generator().manual_seed(5)
    master = torch.randn(200_000, generator=g) * 0.02
    w = master.to(torch.bfloat16)
    w[::97] = torch.randn(w[::97].shape, generator=g).to(torch.bfloat16)
    d = {"opt.master": master, "model.weight": w}
    p = tmp_path / "t.tzip"
    tzt.save_file(d, p, metadata={"format": "pt"})
    with tensorzip.safe_open(p, framework="pt") as f:
        assert f.predictions()["model.weight"]["kind"] == "cast"
        assert f.predictions()["model.weight"]["source"] == "opt.master"
        assert torch.equal(f.get_tensor("model.weight").view(torch.int16), w.view(torch.int16))
        assert torch.equal(f.get_slice("model.weight")[1000:1100].view(torch.int16), w[1000:1100].view(torch.int16))
    out = tzt.load_file(p)
    assert torch.equal(out["model.weight"].view(torch.int16), w.view(torch.int16))
    assert torch.equal(out["opt.master"], master)


def test_delta_against_previous_checkpoint(tmp_path):
    rng = np.random.default_rng(1)
    d1 = checkpoint(rng, step=0)
    d2 = checkpoint(np.random.default_rng(1), step=1)
    a = tmp_path / "s1.tzip"
    b = tmp_path / "s2.tzip"
    tzn.save_file(d1, a)
    tzn.save_file(d2, b, ref=a)
    with tensorzip.safe_open(b, framework="np") as f:
        pr = f.predictions()
        assert pr["master.w"] == {"kind": "delta", "source": "master.w", "file": "s1.tzip"}
        assert pr["model.w"]["kind"] == "cast"  # casts are preferred over delta
        refs = f.references()
        assert len(refs) == 1 and refs[0]["file"] == "s1.tzip"
        with tensorzip.safe_open(a, framework="np") as fa:
            assert refs[0]["xxh64"] == fa._r.file_checksum
        check_all({k: f.get_tensor(k) for k in f.keys()}, d2)
    check_all(tzn.load_file(b), d2)
    plain = tmp_path / "s2-plain.tzip"
    tzn.save_file(d2, plain)
    assert os.path.getsize(b) < os.path.getsize(plain)

    # The reference moved: a clear error, then refs= finds it (matched by checksum).
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(str(a), moved / "old.tzip")
    with pytest.raises(tensorzip.TensorZipIOError, match=r"s2\.tzip: needs reference file .*s1\.tzip.*missing"):
        tzn.load_file(b)
    check_all(tzn.load_file(b, refs=moved / "old.tzip"), d2)
    pt = tzt.load_file(b, refs=[str(moved / "old.tzip")])
    assert pt["master.w"].numpy().tobytes() == d2["master.w"].tobytes()
    # Metadata needs no reference.
    assert tensorzip.read_metadata(b) is None
    # A file that is not its reference.
    with pytest.raises(tensorzip.CorruptDataError, match="plain.tzip is not a reference of this file"):
        tzn.load_file(b, refs=[moved / "old.tzip", plain])
    with pytest.raises(tensorzip.TensorZipIOError, match="missing"):
        tzn.load_file(b, refs=plain)
    # Another file at the recorded path: refused by checksum.
    shutil.copy(plain, a)
    with pytest.raises(tensorzip.CorruptDataError, match="not the file it was compressed against"):
        tzn.load_file(b)
    # export with refs gives the same safetensors bytes as the plain file's export.
    tensorzip.export_safetensors(b, tmp_path / "b.safetensors", refs=[moved / "old.tzip"])
    tensorzip.export_safetensors(plain, tmp_path / "p.safetensors")
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "p.safetensors").read_bytes()


def test_delta_chain_and_moved_files(tmp_path):
    ds = [checkpoint(np.random.default_rng(2), step=s) for s in range(3)]
    paths = [tmp_path / f"c{i}.tzip" for i in range(3)]
    tzn.save_file(ds[0], paths[0])
    tzn.save_file(ds[1], paths[1], ref=paths[0])
    tzn.save_file(ds[2], paths[2], ref=paths[1])
    check_all(tzn.load_file(paths[2]), ds[2])
    # Move the two references apart: the whole chain is given to load_file.
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a = shutil.move(str(paths[0]), tmp_path / "x" / "first.tzip")
    b = shutil.move(str(paths[1]), tmp_path / "y" / "second.tzip")
    with pytest.raises(tensorzip.TensorZipIOError, match="missing"):
        tzn.load_file(paths[2], refs=[b])  # c1's own reference is still missing
    check_all(tzn.load_file(paths[2], refs=[b, a]), ds[2])
    check_all(tzn.load_file(paths[2], refs=[a, b]), ds[2])
    with tensorzip.safe_open(paths[2], framework="np", refs=[a, b]) as f:
        assert same(f.get_slice("master.w")[1000:2000], ds[2]["master.w"][1000:2000])
    # A path that is in no reference chain of the file.
    other = tmp_path / "other.tzip"
    tzn.save_file(ds[0], other, predict=False)
    with pytest.raises(tensorzip.CorruptDataError, match="not a reference of this file or of its references"):
        tzn.load_file(paths[2], refs=[b, a, other])


def test_ref_original_fast_path_same_file(tmp_path):
    d1 = checkpoint(np.random.default_rng(3), step=0)
    d2 = checkpoint(np.random.default_rng(3), step=1)
    a = tmp_path / "a.tzip"
    tzn.save_file(d1, a)
    a_st = tmp_path / "a.safetensors"
    tensorzip.export_safetensors(a, a_st)
    b1 = tmp_path / "b1.tzip"
    b2 = tmp_path / "b2.tzip"
    tzn.save_file(d2, b1, ref=a)
    tzn.save_file(d2, b2, ref=a, ref_original=a_st)
    # Same predictor bytes, same decisions: the same file.
    assert b1.read_bytes() == b2.read_bytes()
    check_all(tzn.load_file(b2), d2)
    # A file of the same layout whose values differ a little (every 1000th master value in its
    # lowest bit: the delta still pays on the sample, the spot check sees the difference): refused.
    other = tmp_path / "other.safetensors"
    d1x = dict(d1)
    m = d1["master.w"].copy().view(np.uint32)
    m[::1000] ^= 1
    d1x["master.w"] = m.view(np.float32)
    tzn.save_file(d1x, tmp_path / "other.tzip")
    tensorzip.export_safetensors(tmp_path / "other.tzip", other)
    with pytest.raises(tensorzip.UsageError, match="differs from"):
        tzn.save_file(d2, tmp_path / "bad.tzip", ref=a, ref_original=other)
    assert not (tmp_path / "bad.tzip").exists()
    # torch: same options.
    t2 = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == ml_dtypes.bfloat16
          else torch.from_numpy(v) for k, v in d2.items()}
    b3 = tmp_path / "b3.tzip"
    tzt.save_file(t2, b3, ref=a, ref_original=a_st)
    assert b3.read_bytes() == b1.read_bytes()


def test_option_errors(tmp_path):
    d1 = checkpoint(np.random.default_rng(4), n=10_000)
    a = tmp_path / "a.tzip"
    tzn.save_file(d1, a)
    with pytest.raises(tensorzip.UsageError, match="needs predict=True"):
        tzn.save_file(d1, tmp_path / "b.tzip", ref=a, predict=False)
    with pytest.raises(tensorzip.UsageError, match="ref_original needs ref"):
        tzn.save_file(d1, tmp_path / "b.tzip", ref_original=tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        tzn.save_file(d1, tmp_path / "b.tzip", predict="yes")
    with pytest.raises(tensorzip.TensorZipIOError, match="missing.tzip"):
        tzn.save_file(d1, tmp_path / "b.tzip", ref=tmp_path / "missing.tzip")
    # ref_original of other content: header/size check.
    other = tmp_path / "o.safetensors"
    tzn.save_file({"x": np.zeros(3, np.float32)}, tmp_path / "o.tzip")
    tensorzip.export_safetensors(tmp_path / "o.tzip", other)
    with pytest.raises(tensorzip.UsageError, match="is not the safetensors file"):
        tzn.save_file(d1, tmp_path / "b.tzip", ref=a, ref_original=other)
    # The output may not be its own reference.
    with pytest.raises(tensorzip.TensorZipError):
        tzn.save_file(d1, a, ref=a)
    assert not (tmp_path / "b.tzip").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.tzip", "o.safetensors", "o.tzip"]
