"""The vLLM load format's weight stream reads its files ahead of the decoding (tensorzip._read_ahead,
used by tensorzip._vllm_weights; doc/vllm.md): every byte of every file asked for once, in order,
bounded ahead of the workers; a file system without posix_fadvise changes nothing but speed. No vLLM
needed.

The data: the fixture GPT's real trained weights (python/tests/_gpt.py) as one .tzip file and as
two .tzip shards (its tensors split in two safetensors files, each compressed with `tzip compress`).
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from tensorzip import _read_ahead, _vllm_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _gpt  # noqa: E402


@pytest.fixture(scope="module")
def weights(tmp_path_factory, tzip_cli):
    """{"sd": the source tensors, "one": [model.tzip], "shards": [a.tzip, b.tzip]}."""
    sd = _gpt.state_dict_of(_gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE)
    root = tmp_path_factory.mktemp("weights")
    names = list(sd)
    parts = {"model": names, "a": names[:len(names) // 2], "b": names[len(names) // 2:]}
    for stem, part in parts.items():
        save_file({n: sd[n] for n in part}, str(root / f"{stem}.safetensors"), metadata={"format": "pt"})
        subprocess.run([tzip_cli, "compress", str(root / f"{stem}.safetensors"), "-o", str(root / f"{stem}.tzip")],
                       check=True, capture_output=True, timeout=600)
    return {"sd": sd, "one": [str(root / "model.tzip")], "shards": [str(root / "a.tzip"), str(root / "b.tzip")]}


def same_as_source(got, sd):
    assert sorted(got) == sorted(sd)
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name


def advice_log(monkeypatch):
    """Records posix_fadvise calls as (file path, offset, length, advice)."""
    log = []
    real = os.posix_fadvise

    def record(fd, offset, length, advice):
        log.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    return log


def settled(value):
    """value() once it is above 0 and has not changed for 0.3 s (at most 30 s)."""
    deadline = time.monotonic() + 30
    last = value()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = value()
        if now == last and now > 0:
            break
        last = now
    return last


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not os.path.isdir("/proc/self/fd"), reason="Linux only")
def test_read_ahead_covers_the_files_in_order_and_stays_bounded(weights, monkeypatch):
    log = advice_log(monkeypatch)
    monkeypatch.setattr(_vllm_weights, "READ_AHEAD_BYTES", 128 << 10)
    monkeypatch.setattr(_read_ahead, "ADVISE_STEP", 1)
    files = weights["shards"]
    sizes = [os.path.getsize(f) for f in files]
    advised_at_first = None
    got = {}
    for name, t in _vllm_weights.iter_weights(files, threads=1):
        if advised_at_first is None:  # the read-ahead thread's calls, once it has caught up
            advised_at_first = settled(lambda: sum(length for _p, _o, length, _a in log))
        got[name] = t
    same_as_source(got, weights["sd"])
    assert all(a == os.POSIX_FADV_WILLNEED for *_x, a in log)
    # Each file from its first byte to its last, in order, with no gap and no byte twice.
    expect = [(os.path.realpath(f), 0) for f in files]
    pos = {p: 0 for p, _ in expect}
    order = []
    for path, offset, length, _a in log:
        assert offset == pos[path], (path, offset, pos[path])
        pos[path] += length
        if not order or order[-1] != path:
            order.append(path)
    assert order == [p for p, _ in expect]
    assert [pos[p] for p, _ in expect] == sizes
    # Bounded: with the first tensor taken, only its neighbourhood has been asked for.
    assert 0 < advised_at_first < sizes[0] / 2


def test_read_ahead_is_only_a_hint(weights, monkeypatch):
    """posix_fadvise failing (a file system without it) changes nothing but speed."""
    def refuse(fd, offset, length, advice):
        raise OSError(errno.ENOSYS, "not supported")

    monkeypatch.setattr(os, "posix_fadvise", refuse, raising=False)
    same_as_source(dict(_vllm_weights.iter_weights(weights["shards"], threads=2)), weights["sd"])

