"""save_file / load_file / safe_open on .tzip files (NumPy and torch)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorzip
import tensorzip.numpy as tzn
import tensorzip._dtypes as D
import tensorzip.torch as tzt
from _data import ALL_DTYPES, np_array, same_bits, torch_same_bits, torch_tensor, valid_shape

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")


SHAPES = [(33, 17), (1000,), (), (2, 0, 3), (70_000,)]


def every_dtype_np(rng):
    d = {}
    for i, dt in enumerate(ALL_DTYPES):
        shape = next(s for s in SHAPES[i % 5:] + SHAPES if valid_shape(dt, s, "np"))
        d[f"layer.{i}.{dt.lower()}"] = np_array(dt, shape, rng)
    return d


def every_dtype_pt(rng):
    d = {}
    for i, dt in enumerate(ALL_DTYPES):
        shape = next(s for s in SHAPES[i % 5:] + SHAPES if valid_shape(dt, s, "pt"))
        d[f"model.{dt.lower()}.w"] = torch_tensor(dt, shape, rng)
    return d


def test_numpy_save_load_every_dtype(tmp_path, rng):
    d = every_dtype_np(rng)
    p = tmp_path / "np.tzip"
    tzn.save_file(d, p, metadata={"k": "v"})
    out = tzn.load_file(p)
    assert set(out) == set(d)
    for k in d:
        assert same_bits(out[k], d[k]), k
    assert tensorzip.read_metadata(p) == {"k": "v"}


def test_torch_save_load_every_dtype(tmp_path, rng):
    d = every_dtype_pt(rng)
    p = tmp_path / "pt.tzip"
    tzt.save_file(d, str(p))
    out = tzt.load_file(str(p))
    assert set(out) == set(d)
    for k in d:
        assert isinstance(out[k], torch.Tensor)
        assert torch_same_bits(out[k], d[k]), k


def test_torch_load_to_device(tmp_path, rng):
    d = {"w": torch_tensor("BF16", (8, 8), rng)}
    p = tmp_path / "m.tzip"
    tzt.save_file(d, p)
    meta = tzt.load_file(p, device="meta")  # exercises the device move without a GPU
    assert meta["w"].device.type == "meta" and meta["w"].shape == (8, 8) and meta["w"].dtype == torch.bfloat16
    with tensorzip.safe_open(p, framework="pt", device="meta") as f:
        assert f.get_tensor("w").device.type == "meta"
    with pytest.raises(ValueError, match="device"):
        tensorzip.safe_open(p, framework="np", device="cuda:0")


@pytest.mark.parametrize("level", [-1, 0, 1, 2, 3])
def test_levels_threads_options(tmp_path, rng, level):
    d = {"a": np_array("BF16", (300_000,), rng), "b": np_array("F32", (100_000,), rng)}
    p = tmp_path / "l.tzip"
    tzn.save_file(d, p, level=level, threads=1, block_elems=16384, chunk_bytes=1 << 20)
    out = tzn.load_file(p, threads=2)
    assert all(same_bits(out[k], d[k]) for k in d)
    size = os.path.getsize(p)
    raw = sum(a.nbytes for a in d.values())
    assert (size > raw) if level == -1 else (size < raw)


def test_threads_never_change_the_bytes(tmp_path, rng):
    # Many small tensors of every dtype, and one of several frames: save_file writes the same
    # file for any thread count, and load_file / get_tensors (all tensors decoded together)
    # give the same tensors for any thread count.
    d = every_dtype_pt(rng)
    for i in range(300):
        d[f"small.{i}"] = torch_tensor("BF16" if i % 2 else "F32", (1 + i * 37 % 5000,), rng)
    d["big"] = torch_tensor("BF16", (1_500_000,), rng)
    files = []
    for t in (1, 2, 4, 8):
        p = tmp_path / f"t{t}.tzip"
        tzt.save_file(d, p, threads=t, chunk_bytes=1 << 20)
        files.append(p.read_bytes())
    assert all(f == files[0] for f in files[1:])
    for t in (1, 2, 8):
        out = tzt.load_file(tmp_path / "t1.tzip", threads=t)
        assert list(out) == list(tensorzip.safe_open(tmp_path / "t1.tzip", "pt").offset_keys())
        for k in d:
            assert torch_same_bits(out[k], d[k]), (t, k)
        with tensorzip.safe_open(tmp_path / "t1.tzip", framework="np", threads=t) as f:
            arrays = f.get_tensors()
            assert set(arrays) == set(d)
            assert same_bits(arrays["big"], f.get_tensor("big"))


def test_save_file_write_backend_never_changes_the_bytes(tmp_path, rng, monkeypatch):
    # save_file writes through the I/O engine's queue while a CPU is left over for it, else on
    # the coding threads (pwrite): whichever, at any thread count, the file is the same.
    from tensorzip import _file
    d = {f"t{i}": torch_tensor("F32" if i % 2 else "BF16", (1 + i * 7919 % 300_000,), rng) for i in range(12)}
    files = []
    for cpus in (1, 2, 64):
        monkeypatch.setattr(_file.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert _file.write_backend(2) == ("pwrite" if cpus <= 2 else "auto")
        assert _file.write_backend(0) == ("pwrite" if cpus <= (os.cpu_count() or 1) else "auto")
        for t in (1, 2, 3):
            p = tmp_path / f"c{cpus}t{t}.tzip"
            tzt.save_file(d, p, threads=t, chunk_bytes=1 << 20)
            files.append(p.read_bytes())
    assert all(f == files[0] for f in files[1:])
    out = tzt.load_file(tmp_path / "c1t1.tzip")
    for k in d:
        assert torch_same_bits(out[k], d[k]), k


def test_cross_framework(tmp_path, rng):
    d = every_dtype_pt(rng)
    p = tmp_path / "x.tzip"
    tzt.save_file(d, p)
    arrays = tzn.load_file(p)
    for k, t in d.items():
        a = np.ascontiguousarray(arrays[k]).reshape(-1).view(np.uint8)
        if t.dtype == torch.float4_e2m1fn_x2:  # NumPy: one F4 element per byte
            a = D.pack_nibbles(a)
        back = torch.from_numpy(a.copy()) if t.numel() else None
        if back is not None:
            assert torch.equal(back, t.reshape(-1).view(torch.uint8)), k


def test_safe_open_api(tmp_path, rng):
    d = {"zeta": np_array("F32", (4, 5), rng), "alpha": np_array("BF16", (6,), rng),
         "mid": np_array("I64", (3,), rng)}
    p = tmp_path / "s.tzip"
    tzn.save_file(d, p)
    with tensorzip.safe_open(p, framework="numpy") as f:
        assert f.keys() == ["alpha", "mid", "zeta"]
        # data order = safetensors order: larger dtypes first, then by name
        assert f.offset_keys() == ["mid", "zeta", "alpha"]
        assert f.metadata() is None
        for k in d:
            assert same_bits(f.get_tensor(k), d[k])
        s = f.get_slice("zeta")
        assert s.get_shape() == [4, 5] and s.get_dtype() == "F32" and len(s) == 4
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("zeta")


SLICE_KEYS = [
    np.s_[:], np.s_[1:3], np.s_[-2:], np.s_[::2], np.s_[1], np.s_[-1], np.s_[..., 3], np.s_[2, ...],
    np.s_[1:4, 2:9:3], np.s_[::-1, 5], np.s_[3:1:-1, ::-4], np.s_[0:0], np.s_[5:2], np.s_[1, 2, 3],
    np.s_[..., ::7], np.s_[:, :, 1:2],
]


@pytest.mark.parametrize("key", SLICE_KEYS, ids=repr)
def test_get_slice_matches_numpy_indexing(tmp_path, rng, key):
    a = np_array("BF16", (6, 10, 9), rng)
    p = tmp_path / "sl.tzip"
    tzn.save_file({"t": a}, p)
    with tensorzip.safe_open(p, framework="np") as f:
        got = f.get_slice("t")[key]
    assert same_bits(got, np.array(a[key]))


def test_get_slice_torch_and_big_tensor(tmp_path, rng):
    t = torch_tensor("F32", (4096, 300), rng)  # several frames and blocks
    p = tmp_path / "big.tzip"
    tzt.save_file({"w": t}, p, chunk_bytes=1 << 20)
    with tensorzip.safe_open(p, framework="pt") as f:
        sl = f.get_slice("w")
        for key in (np.s_[1000:1010], np.s_[4000:], np.s_[17, 5:200:3], np.s_[:, 299]):
            got = sl[key]
            assert isinstance(got, torch.Tensor)
            assert torch.equal(got, t[key].contiguous()), key


def test_get_slice_bad_keys(tmp_path, rng):
    p = tmp_path / "b.tzip"
    tzn.save_file({"t": np_array("F32", (3, 4), rng)}, p)
    with tensorzip.safe_open(p, framework="np") as f:
        s = f.get_slice("t")
        with pytest.raises(IndexError):
            s[3]
        with pytest.raises(IndexError):
            s[0, 0, 0]
        with pytest.raises(IndexError):
            s[..., ...]
        with pytest.raises(TypeError):
            s["x"]


def test_reading_one_tensor_reads_only_its_frames(tmp_path, rng):
    # Corrupt a byte in the middle of tensor "b"'s compressed bytes: "a" must
    # still load (its frames alone are read), while "b" must fail its checksum.
    a = np_array("F32", (1024,), rng)
    b = np_array("F32", (1 << 20,), rng)
    p = tmp_path / "c.tzip"
    tzn.save_file({"a": a, "b": b}, p)
    data = bytearray(p.read_bytes())
    pos = len(data) // 2  # frames of "a" are a few KiB at the start; the header is at the end
    data[pos] ^= 0x10
    p.write_bytes(bytes(data))
    with tensorzip.safe_open(p, framework="np") as f:
        assert same_bits(f.get_tensor("a"), a)
        assert same_bits(f.get_slice("b")[:10], b[:10])  # first block of "b" is intact
        with pytest.raises(tensorzip.CorruptDataError):
            f.get_tensor("b")


def test_metadata_and_names(tmp_path, rng):
    meta = {"format": "pt", "note": "ünïcode ✓", "empty": ""}
    d = {"naïve.名前": np_array("F16", (3,), rng), "with space/and:colon": np_array("U8", (2,), rng)}
    p = tmp_path / "m.tzip"
    tzn.save_file(d, p, metadata=meta)
    with tensorzip.safe_open(p, framework="np") as f:
        assert f.metadata() == meta
        assert set(f.keys()) == set(d)
        for k in d:
            assert same_bits(f.get_tensor(k), d[k])


def test_empty_dict(tmp_path):
    p = tmp_path / "e.tzip"
    tzn.save_file({}, p)
    assert tzn.load_file(p) == {}


def test_save_load_bytes(rng):
    d = {"x": torch_tensor("BF16", (100, 3), rng)}
    blob = tzt.save(d, metadata={"a": "b"})
    assert blob[:4] == b"TZIP"
    out = tzt.load(blob)
    assert torch_same_bits(out["x"], d["x"])
    assert same_bits(tzn.load(tzn.save({"y": d["x"].float().numpy()}))["y"], d["x"].float().numpy())


def test_overwrite_and_no_temporaries_left(tmp_path, rng):
    p = tmp_path / "o.tzip"
    tzn.save_file({"a": np_array("F32", (10,), rng)}, p)
    second = np_array("I32", (7,), rng)
    tzn.save_file({"b": second}, p)
    assert list(tzn.load_file(p)) == ["b"]
    with pytest.raises(TypeError):
        tzn.save_file({"c": "not an array"}, p)
    assert sorted(os.listdir(tmp_path)) == ["o.tzip"]
    assert same_bits(tzn.load_file(p)["b"], second)  # failed save left the old file intact


def test_save_errors(tmp_path, rng):
    a = np_array("F32", (4,), rng)
    with pytest.raises(TypeError, match="metadata"):
        tzn.save_file({"a": a}, tmp_path / "x.tzip", metadata={"k": 1})
    with pytest.raises(tensorzip.UsageError, match="reserved"):
        tzn.save_file({"__metadata__": a}, tmp_path / "x.tzip")
    with pytest.raises(TypeError):
        tzn.save_file([a], tmp_path / "x.tzip")
    with pytest.raises(TypeError, match="numpy.ndarray"):
        tzn.save_file({"a": torch.zeros(3)}, tmp_path / "x.tzip")
    with pytest.raises(ValueError, match="expected torch.Tensor"):  # safetensors' class and message
        tzt.save_file({"a": a}, tmp_path / "x.tzip")
    with pytest.raises(OSError):
        tzn.save_file({"a": a}, tmp_path / "no" / "such" / "dir" / "x.tzip")
    with pytest.raises(tensorzip.UsageError):
        tzn.save_file({"a": a}, tmp_path / "x.tzip", chunk_bytes=12345)


def test_load_errors(tmp_path, rng):
    with pytest.raises(OSError, match="No such file"):
        tzn.load_file(tmp_path / "missing.tzip")
    junk = tmp_path / "junk.tzip"
    junk.write_bytes(b"hello world, this is not a tzip file" * 10)
    with pytest.raises(tensorzip.CorruptDataError):
        tzn.load_file(junk)
    good = tmp_path / "good.tzip"
    tzn.save_file({"a": np_array("F32", (10_000,), rng)}, good)
    data = good.read_bytes()
    for cut in (0, 10, 100, len(data) // 2, len(data) - 1):
        t = tmp_path / f"cut{cut}.tzip"
        t.write_bytes(data[:cut])
        with pytest.raises(tensorzip.CorruptDataError):
            tzn.load_file(t)
    with pytest.raises(ValueError, match="framework"):
        tensorzip.safe_open(good, framework="tf")


def test_one_handle_many_threads(tmp_path, rng):
    import threading

    d = {f"t{i}": np_array(dt, (50_000,), rng) for i, dt in enumerate(["BF16", "F32", "F16", "I32"] * 2)}
    p = tmp_path / "mt.tzip"
    tzn.save_file(d, p)
    errors = []
    with tensorzip.safe_open(p, framework="np") as f:
        def work(offset):
            try:
                for j in range(10):
                    k = f"t{(offset + j) % len(d)}"
                    assert same_bits(f.get_tensor(k), d[k])
                    assert same_bits(f.get_slice(k)[100:200], d[k][100:200])
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors, errors


def test_save_load_model(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    p = tmp_path / "model.tzip"
    tzt.save_model(m, p, metadata={"format": "pt"})
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    assert tzt.load_model(m2, p) == ([], [])
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch_same_bits(a, b), k
    with pytest.raises(RuntimeError):
        tzt.load_model(torch.nn.Linear(8, 16), p)  # strict: unexpected keys


def _bytes_read_by_process() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_get_tensor_reads_only_its_bytes(tmp_path, rng):
    small = np_array("BF16", (2048,), rng)
    big = rng.standard_normal(4 << 20).astype(np.float32)  # 16 MiB, barely compressible mantissas
    p = tmp_path / "io.tzip"
    tzn.save_file({"big": big, "small": small}, p)
    with tensorzip.safe_open(p, framework="np") as f:
        before = _bytes_read_by_process()
        got = f.get_tensor("small")
        small_read = _bytes_read_by_process() - before
        before = _bytes_read_by_process()
        got_slice = f.get_slice("big")[1000:1010]
        slice_read = _bytes_read_by_process() - before
        before = _bytes_read_by_process()
        f.get_tensor("big")
        big_read = _bytes_read_by_process() - before
    assert same_bits(got, small) and same_bits(got_slice, big[1000:1010])
    assert small_read < 64 << 10, small_read          # a few KiB, not the 16 MiB neighbour
    assert slice_read < 1 << 20, slice_read           # the codec blocks it needs (~280 KiB), not the frame
    assert big_read > 10 << 20, big_read              # the counter does see real reads
