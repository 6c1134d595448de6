"""What the tensorzip.dcp tests (test_dcp*.py) share: torch and its Distributed Checkpoint (or
the test module is skipped), state dicts compared byte for byte, and DCP's warnings about running
without a process group silenced (an autouse fixture: a test module imports it)."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - depends on the build
    pytest.skip("torch.distributed is not available", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")


def flat(obj, prefix=""):
    """Flattens nested dicts/lists into {path: leaf}."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = obj
    return out


def tensor_bytes(t) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_identical(expected, actual):
    fe, fa = flat(expected), flat(actual)
    assert sorted(fe) == sorted(fa)
    n_tensors = 0
    for k, v in fe.items():
        w = fa[k]
        if isinstance(v, torch.Tensor):
            n_tensors += 1
            assert isinstance(w, torch.Tensor), k
            assert (v.dtype, tuple(v.shape)) == (w.dtype, tuple(w.shape)), k
            assert tensor_bytes(v) == tensor_bytes(w), f"{k}: tensor bytes differ"
        else:
            assert v == w, k
    return n_tensors



@pytest.fixture(autouse=True)
def quiet_dcp():
    # DCP warns when run without a process group; that is the single-process use here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
