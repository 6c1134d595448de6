"""Nothing lost, from Python: a file another .tzip file needs is never replaced; special files are
refused, not waited on; safetensors' refusals of what it cannot save; names from files never
reach a message raw."""
from __future__ import annotations

import json
import os
import struct
import threading

import numpy as np
import pytest
import torch

import tensorzip
import tensorzip.numpy as tzn
import tensorzip.torch as tzt

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "fixture-slice-fp32.safetensors")


def _delta_pair(tmp_path):
    """step1.tzip, and step2.tzip stored as a delta against it (it records step1.tzip): real FP32
    tensors, the second step changing a few of them slightly."""
    import safetensors.numpy
    step1 = safetensors.numpy.load_file(DATA)
    step2 = dict(step1)
    for k in sorted(step2)[:2]:
        step2[k] = step2[k].copy()
        step2[k].reshape(-1)[::97] *= np.float32(1.0001)
    tzn.save_file(step1, tmp_path / "step1.tzip")
    tzn.save_file(step2, tmp_path / "step2.tzip", ref=tmp_path / "step1.tzip")
    refs = tensorzip.safe_open(tmp_path / "step2.tzip", framework="np").references()
    assert refs, "the test needs step2.tzip to reference step1.tzip"
    return step1, step2


def test_save_file_never_replaces_a_reference(tmp_path):
    step1, step2 = _delta_pair(tmp_path)
    before = (tmp_path / "step1.tzip").read_bytes()
    with pytest.raises(tensorzip.TensorZipExistsError, match="step2.tzip needs it"):
        tzn.save_file({"x": np.zeros(8, dtype=np.float32)}, tmp_path / "step1.tzip")
    with pytest.raises(tensorzip.TensorZipExistsError, match="step2.tzip needs it"):
        tzt.save_file({"x": torch.zeros(8)}, tmp_path / "step1.tzip")
    assert (tmp_path / "step1.tzip").read_bytes() == before
    got = tzn.load_file(tmp_path / "step2.tzip")
    assert all(np.array_equal(got[k], step2[k]) for k in step2)
    # overwrite=True of the file functions is refused the same way
    src = tmp_path / "other.safetensors"
    import safetensors.numpy
    safetensors.numpy.save_file({"x": np.ones(8, dtype=np.float32)}, str(src))
    with pytest.raises(tensorzip.TensorZipExistsError, match="step2.tzip needs it"):
        tensorzip.compress_safetensors(src, tmp_path / "step1.tzip", overwrite=True)
    assert (tmp_path / "step1.tzip").read_bytes() == before
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    # the dependent itself may be replaced (nothing needs it)
    tzn.save_file(step1, tmp_path / "step2.tzip")


def _in_thread(fn, fifo, timeout=10.0):
    """fn() in a thread; if it blocks (on the FIFO), a writer is opened to release it."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    blocked = t.is_alive()
    if blocked:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(timeout)
    return blocked, out


@pytest.mark.parametrize("call", ["numpy.load_file", "torch.load_file", "safe_open"])
def test_special_files_are_refused_not_waited_on(tmp_path, call):
    fifo = tmp_path / "model.tzip"
    os.mkfifo(fifo)
    fns = {
        "numpy.load_file": lambda: tzn.load_file(fifo),
        "torch.load_file": lambda: tzt.load_file(fifo),
        "safe_open": lambda: tensorzip.safe_open(fifo, framework="np"),
    }
    blocked, out = _in_thread(fns[call], str(fifo))
    assert not blocked, f"{call} blocked on a FIFO"
    assert isinstance(out.get("error"), tensorzip.UsageError), out
    assert "not a regular file" in str(out["error"]) and str(fifo) in str(out["error"])


def test_torch_save_file_refuses_what_safetensors_refuses(tmp_path):
    import safetensors.torch
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cases = {
        "non-contiguous": {"m": m.t()},
        "not a tensor": {"m": m, "n": 3},
        "not a dict": [m],
    }
    for what, value in cases.items():
        with pytest.raises(ValueError) as ours:
            tzt.save_file(value, tmp_path / "x.tzip")
        with pytest.raises(ValueError) as theirs:
            safetensors.torch.save_file(value, str(tmp_path / "x.safetensors"))
        assert str(ours.value) == str(theirs.value), what
        with pytest.raises(ValueError):
            tzt.save(value)
    assert not os.path.exists(tmp_path / "x.tzip")
    tzt.save_file({"m": m.t().contiguous()}, tmp_path / "x.tzip")  # what the message advises works


def test_names_in_messages_are_escaped(tmp_path):
    name = "lay\x1b[2Jer\n0"
    h = json.dumps({name: {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    for fn in (lambda: tensorzip.safe_open(bad, framework="np"),
               lambda: tensorzip.compress_safetensors(bad, tmp_path / "bad.tzip")):
        with pytest.raises(tensorzip.TensorZipError) as e:
            fn()
        msg = str(e.value)
        assert "\x1b" not in msg and "\n" not in msg and "\\x1b[2J" in msg, msg


def test_python_side_writes_replace_atomically(tmp_path):
    """KV tables, copied folder files and DCP metadata go through one writer: a failure part-way
    leaves the old file and no temporary; success leaves no temporary either."""
    from tensorzip import _core
    p = tmp_path / "tables.bin"
    p.write_bytes(b"old")

    def fail(f):
        f.write(b"partial")
        raise RuntimeError("disk on fire")
    with pytest.raises(RuntimeError):
        _core.replace_atomically(p, fail)
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["tables.bin"]
    _core.replace_atomically(p, lambda f: f.write(b"new"))
    assert p.read_bytes() == b"new" and os.listdir(tmp_path) == ["tables.bin"]
    link = tmp_path / "link.bin"
    link.symlink_to(p)
    with pytest.raises(tensorzip.UsageError, match="symbolic link"):  # as the library's outputs
        _core.replace_atomically(link, lambda f: f.write(b"via link"))
    assert p.read_bytes() == b"new" and link.is_symlink()


def test_publish_once_never_replaces_a_file(tmp_path):
    """A file published once (shared KV tables): of writers racing to publish the same path,
    one wins and the others leave its file as it is, whenever they came; no temporary is left."""
    from tensorzip import _core
    p = tmp_path / "kv.tables"
    assert _core.publish_once(p, lambda f: f.write(b"first")) is True
    assert p.read_bytes() == b"first" and os.listdir(tmp_path) == ["kv.tables"]
    assert _core.publish_once(p, lambda f: f.write(b"second")) is False
    assert p.read_bytes() == b"first" and os.listdir(tmp_path) == ["kv.tables"]

    # Another process publishes between this one's look and its own publication.
    q = tmp_path / "raced.tables"

    def other_wins_meanwhile(f):
        f.write(b"loser")
        q.write_bytes(b"winner")
    assert _core.publish_once(q, other_wins_meanwhile) is False
    assert q.read_bytes() == b"winner"
    assert sorted(os.listdir(tmp_path)) == ["kv.tables", "raced.tables"]

    # A link at the path (even a dangling one) is someone's: neither it nor its target is touched.
    link = tmp_path / "link.tables"
    link.symlink_to(tmp_path / "nowhere")
    assert _core.publish_once(link, lambda f: f.write(b"via link")) is False
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()

    def fail(f):
        f.write(b"partial")
        raise RuntimeError("disk on fire")
    with pytest.raises(RuntimeError):
        _core.publish_once(tmp_path / "failed.tables", fail)
    assert sorted(os.listdir(tmp_path)) == ["kv.tables", "link.tables", "raced.tables"]
