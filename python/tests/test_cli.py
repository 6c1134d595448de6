"""Interoperability: files written from Python vs the tzip CLI and safetensors."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import tensorzip
import tensorzip.numpy as tzn
import tensorzip.torch as tzt
from _data import ALL_DTYPES, np_array, same_bits, torch_same_bits, torch_tensor
from conftest import FIXTURES

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")


def mixed_torch_dict(rng):
    d = {}
    shapes = [(64, 33), (1000,), (), (5, 0), (70_000,), (3, 4, 5)]
    for i, dt in enumerate(ALL_DTYPES):
        d[f"blk.{i % 3}.{dt.lower()}"] = torch_tensor(dt, shapes[i % len(shapes)], rng)
    d["ünïcode.名前"] = torch_tensor("BF16", (17,), rng)
    d["a"] = torch_tensor("F32", (2, 2), rng)  # same dtype as others: ties broken by name
    d["Z"] = torch_tensor("F32", (3,), rng)
    d['quote"back\\slash\ttab\nnl\x01\x1f\x7f/é'] = torch_tensor("F16", (4,), rng)  # JSON escapes
    return d


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {}, {'k"\n': 'v\\\x01é'}],
                         ids=["nometa", "meta", "emptymeta", "escapedmeta"])
def test_torch_file_decompresses_to_safetensors_bytes(tmp_path, rng, run_tzip, metadata):
    d = mixed_torch_dict(rng)
    tz = tmp_path / "m.tzip"
    tzt.save_file(d, tz, metadata=metadata)
    ref = tmp_path / "ref.safetensors"
    safetensors.torch.save_file(d, str(ref), metadata=metadata)
    out = tmp_path / "out.safetensors"
    run_tzip("decompress", tz, "-o", out)
    assert out.read_bytes() == ref.read_bytes()
    run_tzip("verify", tz, "--against", ref)


def test_numpy_file_decompresses_to_safetensors_bytes(tmp_path, rng, run_tzip):
    # (safetensors.numpy has no NumPy type for F4: ml_dtypes' float4_e2m1fn is one element per byte)
    d = {f"w{i}.{dt}": np_array(dt, (40, 7), rng) for i, dt in enumerate(ALL_DTYPES) if dt != "F4"}
    tz = tmp_path / "n.tzip"
    tzn.save_file(d, tz, metadata={"framework": "numpy"})
    ref = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(d, str(ref), metadata={"framework": "numpy"})
    out = tmp_path / "out.safetensors"
    run_tzip("decompress", tz, "-o", out)
    assert out.read_bytes() == ref.read_bytes()


def test_python_export_matches_cli(tmp_path, rng, run_tzip):
    d = mixed_torch_dict(rng)
    tz = tmp_path / "m.tzip"
    tzt.save_file(d, tz, metadata={"x": "y"})
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    run_tzip("decompress", tz, "-o", a)
    tensorzip.export_safetensors(tz, b)
    assert a.read_bytes() == b.read_bytes()
    with pytest.raises(FileExistsError):  # tensorzip.TensorZipExistsError
        tensorzip.export_safetensors(tz, b)
    tensorzip.export_safetensors(tz, b, overwrite=True)
    with pytest.raises(tensorzip.TensorZipExistsError):
        tensorzip.compress_safetensors(a, tz)
    loaded = safetensors.torch.load_file(str(a))
    for k in d:
        assert torch_same_bits(loaded[k], d[k]), k


def test_cli_file_read_by_python(tmp_path, rng, run_tzip):
    d = mixed_torch_dict(rng)
    st = tmp_path / "in.safetensors"
    safetensors.torch.save_file(d, str(st), metadata={"format": "pt"})
    tz = tmp_path / "in.tzip"
    run_tzip("compress", st, "-o", tz)
    out = tzt.load_file(tz)
    assert set(out) == set(d)
    for k in d:
        assert torch_same_bits(out[k], d[k]), k
    with tensorzip.safe_open(tz, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        name = "ünïcode.名前"
        assert torch.equal(f.get_slice(name)[10:20], d[name][10:20])
    # and back: Python's compress_safetensors == CLI compress, byte for byte? (not required:
    # created_by may differ) -- but both must decompress to the original file
    tz2 = tmp_path / "py.tzip"
    tensorzip.compress_safetensors(st, tz2)
    back = tmp_path / "back.safetensors"
    run_tzip("decompress", tz2, "-o", back)
    assert back.read_bytes() == st.read_bytes()


def test_cli_rejects_corrupt_python_file(tmp_path, rng, run_tzip):
    tz = tmp_path / "c.tzip"
    tzn.save_file({"w": np_array("BF16", (200_000,), rng)}, tz)
    data = bytearray(tz.read_bytes())
    data[len(data) // 3] ^= 1
    tz.write_bytes(bytes(data))
    p = run_tzip("verify", tz, check=False)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)


@pytest.mark.skipif(not (FIXTURES / "gpt-small-step400-model-bf16.safetensors").exists(),
                    reason="shared fixtures not present")
def test_real_checkpoint_roundtrip(tmp_path, run_tzip):
    src = FIXTURES / "gpt-small-step400-model-bf16.safetensors"
    ref = safetensors.torch.load_file(str(src))
    with safetensors.safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
    # full metadata (4 keys) survives
    tz = tmp_path / "model.tzip"
    tzt.save_file(ref, tz, metadata=meta)
    assert os.path.getsize(tz) < os.path.getsize(src) * 0.8  # real BF16 weights compress
    with tensorzip.safe_open(tz, framework="pt") as f:
        assert f.metadata() == meta
    got = tzt.load_file(tz)
    for k, v in ref.items():
        assert torch_same_bits(got[k], v), k
    # byte identity with safetensors (one metadata key: safetensors' own order is then fixed)
    tzt.save_file(ref, tz, metadata={"format": "pt"})
    expect = tmp_path / "expect.safetensors"
    safetensors.torch.save_file(ref, str(expect), metadata={"format": "pt"})
    out = tmp_path / "model.safetensors"
    run_tzip("decompress", tz, "-o", out)
    assert out.read_bytes() == expect.read_bytes()
