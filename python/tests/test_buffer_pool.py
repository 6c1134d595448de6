"""Reused memory for decoded tensors (tensorzip._buffer_pool) and the model weights stream that uses
it (tensorzip._vllm_weights.iter_weights): a block is reused only once nothing refers to it, so a
consumer that keeps tensors, or only views of them, still sees every tensor's own bytes."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

import tensorzip.torch as tzt  # noqa: E402
from tensorzip import _buffer_pool, _vllm_weights  # noqa: E402
from tensorzip._buffer_pool import BufferPool  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _gpt  # noqa: E402


def _base_address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_small_requests_are_not_pooled():
    pool = BufferPool(keep=2, min_bytes=1000)
    assert pool.memory(999) is None
    assert pool.memory(1000).nbytes == 1000
    pool.close()
    assert pool.memory(5000) is None


def test_block_reused_only_after_its_tensor_is_freed():
    pool = BufferPool(keep=2, min_bytes=1)
    t = torch.from_numpy(pool.memory(4096))
    address = t.data_ptr()
    view = t.view(64, 64).t()  # the storage outlives the first tensor object through a view
    del t
    other = pool.memory(4096)
    assert _base_address(other) != address and pool.reused == 0 and pool.allocated == 2
    del other
    assert pool.free_blocks() == 1  # `other`'s block is back; the view still holds the first
    del view
    assert pool.free_blocks() == 2
    again = pool.memory(4000)
    assert pool.reused == 1 and again.nbytes == 4000 and pool.free_blocks() == 1


def test_best_fit_and_keep_bound():
    pool = BufferPool(keep=2, min_bytes=1)
    arrays = [pool.memory(n) for n in (1000, 3000, 2000)]
    addresses = [_base_address(a) for a in arrays]
    del arrays  # three blocks back, at most two kept: the smallest (1000) goes
    assert pool.free_blocks() == 2
    got = pool.memory(1500)  # 2000 is the smallest block that holds 1500
    assert _base_address(got) == addresses[2]
    got2 = pool.memory(2500)
    assert _base_address(got2) == addresses[1]
    assert pool.reused == 2 and pool.free_blocks() == 0
    big = pool.memory(5000)  # nothing free holds it: a new block
    assert pool.allocated == 4 and big.nbytes == 5000


def test_blocks_given_back_after_close_are_dropped():
    pool = BufferPool(keep=4, min_bytes=1)
    a = pool.memory(100)
    pool.close()
    del a
    assert pool.free_blocks() == 0


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """The fixture GPT's real BF16 weights as one .tzip file, and those tensors."""
    sd = load_file(str(_gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE))
    path = tmp_path_factory.mktemp("pool") / "model.tzip"
    tzt.save_file(sd, str(path))
    return str(path), sd


@pytest.fixture
def every_tensor_pooled(monkeypatch):
    """Every tensor of the small fixture model goes through the pool (the default skips < 1 MiB);
    the pools that iter_weights makes are recorded."""
    made = []

    class Recorded(BufferPool):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(_buffer_pool, "MIN_POOLED_BYTES", 1)
    monkeypatch.setattr(_vllm_weights, "BufferPool", Recorded)
    return made


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("threads", [1, 2])
def test_stream_reuses_memory_of_dropped_tensors(weights_file, every_tensor_pooled, threads):
    """A consumer that copies and drops each tensor (what a model loader does): blocks are reused,
    every tensor arrives with its own bytes."""
    path, want = weights_file
    seen = 0
    for name, t in _vllm_weights.iter_weights([path], threads=threads):
        assert _same(t.clone(), want[name]), name
        seen += 1
        del t
    (pool,) = every_tensor_pooled
    assert seen == len(want)
    assert pool.reused > 0 and pool.allocated < seen
    assert pool.free_blocks() == 0  # closed at the end of the stream


@pytest.mark.parametrize("keep_views", [False, True])
def test_stream_never_reuses_memory_still_held(weights_file, every_tensor_pooled, keep_views):
    """A consumer that keeps every tensor, or only a transposed view of each 2-D one (as vLLM's
    GPT-2 loader makes of Conv1D weights): all of them still hold their own bytes at the end."""
    path, want = weights_file
    kept = {}
    for name, t in _vllm_weights.iter_weights([path], threads=2):
        kept[name] = t.t() if keep_views and t.dim() == 2 else t
        del t
    assert sorted(kept) == sorted(want)
    for name, t in kept.items():
        t = t.t() if keep_views and t.dim() == 2 else t
        assert _same(t, want[name]), name
    (pool,) = every_tensor_pooled
    assert pool.reused == 0
