"""Tensors over 2 GiB (32-bit size overflows). Needs ~10 GiB of free memory and
disk: skipped (with the reason) when the machine has less, or with TZ_PY_SKIP_LARGE=1."""
from __future__ import annotations

import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorzip
import tensorzip.torch as tzt

N = (1 << 30) + 4096 + 3          # bf16 elements: 2 GiB + 8 KiB + 6 bytes
NEED = 10 << 30


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _skip_reason(path=None):
    if os.environ.get("TZ_PY_SKIP_LARGE") == "1":
        return "TZ_PY_SKIP_LARGE=1"
    if _mem_available() < NEED:
        return f"needs {NEED >> 30} GiB of available memory, {_mem_available() >> 30} GiB available"
    if path is not None and shutil.disk_usage(path).free < NEED:
        return f"needs {NEED >> 30} GiB of free disk in {path}"
    return None


@pytest.fixture(scope="module")
def big():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(7)
    block = (rng.standard_normal(1 << 20) * 0.02).astype(ml_dtypes.bfloat16)
    a = np.resize(block, N)  # repeats the block: realistic per-block statistics, cheap to make
    a[-3:] = [1.0, -2.0, 3.0]
    return a


@pytest.mark.large
def test_compress_over_2gib(big):
    b = tensorzip.compress(big)
    assert len(b) < big.nbytes
    out = tensorzip.decompress(b)
    del b
    assert out.shape == (N,) and out.dtype == big.dtype
    assert np.array_equal(out.view(np.uint16), big.view(np.uint16))


@pytest.mark.large
def test_save_file_over_2gib(big, tmp_path):
    reason = _skip_reason(tmp_path)
    if reason:
        pytest.skip(reason)
    t = torch.from_numpy(big.view(np.uint16)).view(torch.bfloat16)  # no copy
    p = tmp_path / "big.tzip"
    tzt.save_file({"big": t, "small": t[:5].clone()}, p)
    with tensorzip.safe_open(p, framework="pt") as f:
        assert torch.equal(f.get_slice("big")[N - 10:], t[N - 10:])
        got = f.get_tensor("big")
    assert got.shape == (N,)
    assert torch.equal(got.view(torch.int16), t.view(torch.int16))
