"""tensorzip.dcp: PyTorch Distributed Checkpoint StorageWriter / StorageReader.

Single-process save/load of a trained model + AdamW state, block-level partial
reads (counters prove that only the needed codec blocks were read and decoded),
corruption detection, size against DCP's FileSystemWriter; several gloo
processes (python/tests/_dcp_worker.py): N -> M rank resharding of DTensor
model + optimizer state, multi-rank async_save, FSDP2, a rank killed mid-save;
CUDA tensors over NCCL when a GPU is present.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - depends on the build
    pytest.skip("torch.distributed is not available", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

import tensorzip  # noqa: E402
import tensorzip.dcp as tzdcp  # noqa: E402


def _make(seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return model, opt


def _train(model, opt, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(16, 64, generator=g).to(dtype)
        y = torch.randn(16, 32, generator=g).to(dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _flat(obj, prefix=""):
    """Flattens nested dicts/lists into {path: leaf}."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = obj
    return out


def _tensor_bytes(t) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _assert_identical(expected, actual):
    fe, fa = _flat(expected), _flat(actual)
    assert sorted(fe) == sorted(fa)
    n_tensors = 0
    for k, v in fe.items():
        w = fa[k]
        if isinstance(v, torch.Tensor):
            n_tensors += 1
            assert isinstance(w, torch.Tensor), k
            assert (v.dtype, tuple(v.shape)) == (w.dtype, tuple(w.shape)), k
            assert _tensor_bytes(v) == _tensor_bytes(w), f"{k}: tensor bytes differ"
        else:
            assert v == w, k
    return n_tensors


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


@pytest.fixture(autouse=True)
def _quiet():
    # DCP warns when run without a process group; that is the single-process use here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_model_and_adamw(tmp_path, dtype):
    model, opt = _make(0, dtype)
    _train(model, opt, 3, seed=1)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 3, "extra": {"note": "hello", "blob": b"\x00\x01"}}
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path / "ckpt"))
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ".metadata" in files and any(f.endswith(tzdcp.SUFFIX) for f in files), files

    # A different model with a different AdamW state: everything must be overwritten.
    model2, opt2 = _make(7, dtype)
    _train(model2, opt2, 1, seed=9)
    msd2, osd2 = get_state_dict(model2, opt2)
    state2 = {"model": msd2, "optim": osd2, "step": 0, "extra": {"note": "", "blob": b""}}
    dcp.load(state2, storage_reader=tzdcp.StorageReader(tmp_path / "ckpt"))
    set_state_dict(model2, opt2, model_state_dict=state2["model"], optim_state_dict=state2["optim"])
    assert state2["step"] == 3 and state2["extra"] == {"note": "hello", "blob": b"\x00\x01"}

    n = _assert_identical({"model": msd, "optim": osd}, dict(zip(("model", "optim"), get_state_dict(model2, opt2))))
    assert n >= 4 * 3 + 1  # 4 params + exp_avg/exp_avg_sq/step each (step may be shared per group)

    # Training continues identically from the restored state.
    _train(model, opt, 2, seed=5)
    _train(model2, opt2, 2, seed=5)
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert _tensor_bytes(a) == _tensor_bytes(b), k


def test_async_save(tmp_path):
    state = _big_state()
    expected = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in _flat(state).items()}
    fut = dcp.async_save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    state["emb"].add_(1)  # the state was staged (copied) before async_save returned
    fut.result(timeout=60)
    out = _big_state(seed=3)
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    _assert_identical(expected, _flat(out))


def test_bad_level_is_refused(tmp_path):
    with pytest.raises(tensorzip.UsageError):
        tzdcp.StorageWriter(tmp_path, level=9)


def test_unsupported_dtype_and_scalars(tmp_path):
    state = {"c": torch.randn(5, dtype=torch.complex64), "s": torch.tensor(2.5), "e": torch.zeros(0, 3),
             "i": torch.arange(10, dtype=torch.int64), "b": torch.tensor([True, False])}
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    out = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    _assert_identical(state, out)


def _big_state(seed=0):
    model, opt = _make(seed, torch.bfloat16)
    _train(model, opt, 2, seed=seed + 1)
    torch.manual_seed(seed)
    emb = (torch.randn(2048, 256) * 0.02).to(torch.bfloat16)  # LLM-like weights, 1 MiB
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "emb": emb}


def test_smaller_than_filesystemwriter(tmp_path):
    state = _big_state()
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path / "tz"))
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "fs"))
    tz, fs = _dir_size(tmp_path / "tz"), _dir_size(tmp_path / "fs")
    # The bf16 embedding dominates; tensorzip codes its exponents, DCP stores it raw.
    assert tz < 0.85 * fs, (tz, fs)
    # And the default reader reads DCP's own checkpoint through StorageReader too.
    out = _big_state(seed=3)
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "fs"))
    _assert_identical(state, out)


def _tools_state():
    state = _big_state()
    state["blob"] = b"\x00\x01" * 50
    state["c"] = torch.randn(6, dtype=torch.complex64)
    state["c128"] = torch.randn(3, dtype=torch.complex128)  # no .tzip dtype: torch.save bytes
    state["f4"] = torch.randint(0, 255, (4, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return state


def _tools_blank():
    out = _big_state(seed=3)
    out["blob"], out["c"], out["c128"] = b"", torch.zeros(6, dtype=torch.complex64), torch.zeros(3, dtype=torch.complex128)
    out["f4"] = torch.zeros(4, 3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return out


def test_dcp_tools_read_tensorzip_checkpoints(tmp_path):
    """DCP's own readers: FileSystemReader, dcp.load(checkpoint_id=) without a reader, and
    format_utils.dcp_to_torch_save (which gets no registry), through the "tensorzip" extension."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if tzdcp.ExtensionRegistry is None:  # pragma: no cover - torch before DCP stream extensions
        pytest.skip("this torch has no torch.distributed.checkpoint._extension")
    assert tzdcp.DCP_TOOLS_READ_TENSORZIP
    state = _tools_state()
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path / "ck", block_elems=4096, chunk_bytes=1 << 20))
    out = _tools_blank()
    dcp.load(out, storage_reader=dcp.FileSystemReader(tmp_path / "ck"))
    _assert_identical(state, out)
    out = _tools_blank()
    dcp.load(out, checkpoint_id=tmp_path / "ck")
    _assert_identical(state, out)
    out = _tools_blank()
    dcp.load(out, storage_reader=dcp.FileSystemReader(tmp_path / "ck", _extension_registry=tzdcp.extension_registry()))
    _assert_identical(state, out)
    dcp_to_torch_save(tmp_path / "ck", tmp_path / "all.pt")
    _assert_identical(state, torch.load(tmp_path / "all.pt", weights_only=False))
    # In a fresh process that never imported tensorzip: unpickling .metadata imports tensorzip.dcp,
    # which is enough for the registry DCP made before that.
    code = ("import sys, torch; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
            "assert 'tensorzip' not in sys.modules; dcp_to_torch_save(sys.argv[1], sys.argv[2]); "
            "print(sorted(torch.load(sys.argv[2], weights_only=False)))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ck"), str(tmp_path / "fresh.pt")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    _assert_identical(state, torch.load(tmp_path / "fresh.pt", weights_only=False))
    # A corrupt item is caught by the extension too (block checksums), with DCP's wrapping.
    fqn, info = _largest_item(tmp_path / "ck")
    data_file = tmp_path / "ck" / info.relative_path
    raw = bytearray(data_file.read_bytes())
    raw[info.offset + info.length // 2] ^= 0x04
    data_file.write_bytes(bytes(raw))
    msg = _load_error(_tools_blank(), dcp.FileSystemReader(tmp_path / "ck"))
    assert "CorruptDataError" in msg or "checksum" in msg, msg
    # Descriptors of the unreleased development layout: a clear refusal, not a misread.
    with pytest.raises(ValueError, match="StorageReader"):
        tzdcp.TensorZipExtension.from_descriptor("2")


def test_first_failure_unwraps_dcp_errors(tmp_path):
    state = _big_state()
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    fqn, info = _largest_item(tmp_path)
    data_file = tmp_path / info.relative_path
    raw = bytearray(data_file.read_bytes())
    raw[info.offset + info.length // 2] ^= 0x10
    data_file.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException) as ei:
        dcp.load(_big_state(seed=3), storage_reader=tzdcp.StorageReader(tmp_path))
    err = tzdcp.first_failure(ei.value)
    assert isinstance(err, tensorzip.CorruptDataError) and fqn in str(err) and info.relative_path in str(err)
    e = ValueError("x")
    assert tzdcp.first_failure(e) is e


def _load_error(state, reader) -> str:
    """dcp.load's error text; DCP wraps each rank's exception in a CheckpointException (a BaseException)."""
    try:
        dcp.load(state, storage_reader=reader)
    except CheckpointException as e:
        return str(e) + "".join(f"\n{type(f[0]).__name__}: {f[0]}" for f in e.failures.values())
    raise AssertionError("dcp.load succeeded on a bad checkpoint")


def _largest_item(path: Path):
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    index, info = max(md.storage_data.items(), key=lambda kv: kv[1].length)
    return index.fqn, info


@pytest.mark.parametrize("where", ["middle", "last"])
def test_corruption_detected_with_tensor_name(tmp_path, where):
    state = _big_state()
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    fqn, info = _largest_item(tmp_path)
    assert fqn == "emb"
    pos = info.offset + (info.length // 2 if where == "middle" else info.length - 1)
    data_file = tmp_path / info.relative_path
    raw = bytearray(data_file.read_bytes())
    raw[pos] ^= 0x10
    data_file.write_bytes(bytes(raw))
    msg = _load_error(_big_state(seed=3), tzdcp.StorageReader(tmp_path))
    assert "CorruptDataError" in msg and "emb" in msg and info.relative_path in msg, msg


def test_rank_file_is_a_tzip_written_by_the_io_engine(tmp_path):
    # The rank file is a standard .tzip (the container Reader opens and verifies it) holding every
    # item, and it was written by TensorWriter through the I/O engine's write queue.
    state = _big_state()
    state["blob"] = b"\x01\x02\x03"
    state["c"] = torch.randn(4, dtype=torch.complex64)
    writer = tzdcp.StorageWriter(tmp_path)
    dcp.save(state, storage_writer=writer)
    st = writer.last_write_stats
    assert st is not None and st["io"].split("+")[0] in ("posix", "io_uring"), st
    (data_file,) = tmp_path.glob("*" + tzdcp.SUFFIX)
    assert st["path"] == str(data_file) and st["file_bytes"] == data_file.stat().st_size
    with open(tmp_path / ".metadata", "rb") as f:
        md = pickle.load(f)
    r = tensorzip._tensorzip.Reader(str(data_file))
    r.verify()  # whole-file checksum, header, every frame and block
    names = {t[0]: t for t in r.tensors()}
    assert len(names) == len(md.storage_data) == st["items"]
    for index, info in md.storage_data.items():
        assert info.relative_path == data_file.name and info.tensor in names, (index, info)
        if index.fqn == "emb":
            assert names[info.tensor][1:3] == ("BF16", (2048, 256)) and info.codec == "tzip"
            assert names[info.tensor][4] < 0.85 * names[info.tensor][3]  # compressed
            out = bytearray(names[info.tensor][3])
            r.read_tensor(r.find(info.tensor), out)
            assert bytes(out) == _tensor_bytes(state["emb"])
        if index.fqn == "blob":
            assert names[info.tensor][1] == "U8", names[info.tensor]
        if index.fqn == "c":  # complex64: a C64 tensor of the file (F32 codec), not torch.save bytes
            assert names[info.tensor][1] == "C64" and info.codec == "tzip", names[info.tensor]
    r.close()
    # The io="pwrite" sink (writer thread) gives the same file contents.
    w2 = tzdcp.StorageWriter(tmp_path / "pw", io="pwrite")
    dcp.save(state, storage_writer=w2)
    assert w2.last_write_stats["io"].startswith("pwrite")
    out = _big_state(seed=3)
    out["blob"], out["c"] = b"", torch.zeros(4, dtype=torch.complex64)
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "pw"))
    _assert_identical(state, out)
    with pytest.raises(tensorzip.UsageError):
        tzdcp.StorageWriter(tmp_path, io="nope")


def test_rank_files_pass_tzip_verify(tmp_path, run_tzip):
    # The tzip CLI sees a 2-item-kind rank file as an ordinary .tzip: verify passes, inspect lists the items,
    # and a flipped byte in the tensor data makes verify fail.
    state = _big_state()
    state["blob"] = b"abc" * 100
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    (data_file,) = tmp_path.glob("*" + tzdcp.SUFFIX)
    run_tzip("verify", data_file)
    out = run_tzip("inspect", data_file).stdout
    assert "emb" in out and "blob" in out, out
    _, info = _largest_item(tmp_path)
    raw = bytearray(data_file.read_bytes())
    raw[info.offset + info.length // 2] ^= 0x08
    data_file.write_bytes(bytes(raw))
    assert run_tzip("verify", data_file, check=False).returncode != 0


def test_tensor_writer_binding(tmp_path):
    import numpy as np
    C = tensorzip._tensorzip
    x = (torch.randn(300, 700, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    raw = x.view(torch.uint8).reshape(-1).numpy()
    with C.TensorWriter(str(tmp_path / "a.tzip"), chunk_bytes=1 << 20, block_elems=4096) as w:
        w.add("x", "BF16", [300, 700], raw)
        w.add("n", "I64", [3], np.arange(3, dtype=np.int64))
        w.add("s", "F32", [], np.array(1.5, dtype=np.float32))
        w.add("e", "F32", [0, 4], np.zeros(0, dtype=np.float32))
        assert not (tmp_path / "a.tzip").exists()  # nothing at the final name before finish()
        st = w.finish()
    assert st["raw_bytes"] == raw.size + 24 + 4 and st["file_bytes"] == (tmp_path / "a.tzip").stat().st_size
    assert [t["name"] for t in st["tensors"]] == ["x", "n", "s", "e"]
    tx = st["tensors"][0]
    assert tx["n_blocks"] == -(-300 * 700 // 4096) and tx["block_bytes"] == 8192 and len(tx["frames"]) == 1
    r = C.Reader(str(tmp_path / "a.tzip"))
    r.verify()
    part = np.zeros(5000, dtype=np.uint8)
    r.read_range(r.find("x"), 100000, part)
    assert part.tobytes() == raw[100000:105000].tobytes()
    r.close()
    # O_DIRECT writes (buffered where the file system refuses O_DIRECT): same tensors back.
    with C.TensorWriter(str(tmp_path / "d.tzip"), direct_io=True, io="posix") as w:
        w.add("x", "BF16", [300, 700], raw)
        st = w.finish()
    assert st["direct"] == ("O_DIRECT" in st["io"]) and st["io"].startswith("posix"), st["io"]
    r = C.Reader(str(tmp_path / "d.tzip"))
    back = np.zeros(raw.size, dtype=np.uint8)
    r.read_tensor(0, back)
    assert back.tobytes() == raw.tobytes()
    r.close()
    (tmp_path / "d.tzip").unlink()
    # An exception inside the block leaves no file (and no temporary).
    with pytest.raises(RuntimeError):
        with C.TensorWriter(str(tmp_path / "b.tzip")) as w:
            w.add("x", "BF16", [300, 700], raw)
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tzip"]
    with pytest.raises(tensorzip.UsageError):
        C.TensorWriter(str(tmp_path / "c.tzip")).add("x", "BF16", [3], raw)  # size does not match the shape
    with pytest.raises(tensorzip.UsageError):
        C.TensorWriter(str(tmp_path / "c.tzip"), io="nope")
    with pytest.raises(tensorzip.TensorZipExistsError):
        C.TensorWriter(str(tmp_path / "a.tzip"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")
def test_no_cuda_device_cpu_path(tmp_path):
    """Without a CUDA device: cuda_available() is False (also in a build with CUDA), TensorWriter.add_cuda
    refuses with a clear error (a build without CUDA: no CUDA support; with CUDA: no usable device
    memory) and leaves the writer usable, and StorageWriter encodes on the CPU (gpu_bytes == 0)."""
    import numpy as np
    C = tensorzip._tensorzip
    assert isinstance(C.HAVE_CUDA, bool)
    assert C.cuda_available() is False
    raw = np.arange(1000, dtype=np.float32)
    with C.TensorWriter(str(tmp_path / "a.tzip")) as w:
        with pytest.raises(tensorzip.UsageError) as e:
            w.add_cuda("g", "F32", [1000], 1 << 40, 4000)
        msg = str(e.value)
        assert "'g'" in msg, msg
        if C.HAVE_CUDA:
            assert "a.tzip: tensor 'g'" in msg, msg  # e.g. "cannot use its memory on the GPU: no CUDA-capable ..."
        else:
            assert "no CUDA support" in msg and "TZ_CUDA" in msg, msg
        w.add("x", "F32", [1000], raw)  # the refused tensor was not added
        st = w.finish()
    assert [t["name"] for t in st["tensors"]] == ["x"] and st["gpu_bytes"] == 0 and st["gpu_host_bytes"] == 0
    assert tensorzip.safe_open(str(tmp_path / "a.tzip")).get_tensor("x").tobytes() == raw.tobytes()

    state = _big_state()
    for gpu_encode in (True, False):
        w = tzdcp.StorageWriter(tmp_path / f"ck{gpu_encode}", gpu_encode=gpu_encode)
        dcp.save(state, storage_writer=w)
        st = w.last_write_stats
        assert st["gpu_bytes"] == 0 and st["gpu_host_bytes"] == 0 and st["gpu_tensors"] == 0, st
        out = _big_state(seed=3)
        dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / f"ck{gpu_encode}"))
        _assert_identical(state, out)
    # Same state, same options: the same rank file, byte for byte (what the GPU test relies on to
    # compare a GPU-encoded file with a CPU-encoded one).
    a, b = (next((tmp_path / f"ck{g}").glob("*" + tzdcp.SUFFIX)) for g in (True, False))
    assert a.read_bytes() == b.read_bytes()


def test_corrupt_non_tensor_item_detected(tmp_path):
    # BYTE_IO items are U8 tensors of the rank's .tzip: frame/block checksums and a per-item CRC-32.
    state = {"w": torch.randn(64, 64), "blob": bytes(range(256)) * 8}
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    with open(tmp_path / ".metadata", "rb") as f:
        md = pickle.load(f)
    (info,) = [v for k, v in md.storage_data.items() if k.fqn == "blob"]
    data_file = tmp_path / info.relative_path
    raw = bytearray(data_file.read_bytes())
    raw[info.offset + info.length // 2] ^= 0x01
    data_file.write_bytes(bytes(raw))
    msg = _load_error({"w": torch.empty(64, 64), "blob": b""}, tzdcp.StorageReader(tmp_path))
    assert "CorruptDataError" in msg and ("checksum" in msg or "corrupt" in msg) and "'blob'" in msg, msg
    assert info.relative_path in msg, msg


def test_truncated_file_detected(tmp_path):
    state = _big_state()
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    fqn, info = _largest_item(tmp_path)
    data_file = tmp_path / info.relative_path
    with open(data_file, "r+b") as f:
        f.truncate(info.offset + 100)
    msg = _load_error(_big_state(seed=3), tzdcp.StorageReader(tmp_path))
    # The .tzip trailer (header + index) is gone with the end of the file: the file cannot be opened,
    # and the error names the file, the problem and the items it holds.
    assert "CorruptDataError" in msg and info.relative_path in msg and "truncated" in msg, msg
    assert "cannot be opened" in msg and "'model." in msg, msg


# ---- several processes (gloo on CPU) ----------------------------------------------------

_WORKER = textwrap.dedent('''
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.checkpoint.state_dict import get_state_dict
    import tensorzip.dcp

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # same model and data on every rank (replicated training)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 64, generator=g), torch.randn(8, 16, generator=g)
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    msd, osd = get_state_dict(model, opt)
    full = (torch.randn(1000, 48, generator=g) * 0.02).to(torch.bfloat16)
    state = {"model": msd, "optim": osd, "sharded": distribute_tensor(full, mesh, [Shard(0)]),
             "rank_count": world}
    dcp.save(state, storage_writer=tensorzip.dcp.StorageWriter(os.path.join(out, "ckpt")))
    if rank == 0:
        torch.save({"model": msd, "optim": osd, "sharded": full}, os.path.join(out, "expected.pt"))
    dist.barrier()
    # Resharded read: load into Shard(1) columns; every rank reads part of both stored row shards.
    other = {"sharded": distribute_tensor(torch.zeros(1000, 48, dtype=torch.bfloat16), mesh, [Shard(1)])}
    dcp.load(other, storage_reader=tensorzip.dcp.StorageReader(os.path.join(out, "ckpt")))
    mine = other["sharded"].to_local()
    want = full[:, rank * 24:(rank + 1) * 24]
    assert mine.shape == want.shape and torch.equal(mine.view(torch.int16), want.view(torch.int16))
    print("resharded-ok", rank, flush=True)
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_save_one_rank_load(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ)
    # The worker must import the same tensorzip as this test.
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tensorzip.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only; hostname may not resolve in CI
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("2-rank save timed out")
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]

    files = sorted(f.name for f in (tmp_path / "ckpt").iterdir())
    data_files = sorted(f for f in files if f.endswith(tzdcp.SUFFIX))
    assert len(data_files) == 2 and data_files[0].startswith("__0_") and data_files[1].startswith("__1_"), files
    # Each rank wrote its shard of the DTensor into its own file.
    with open(tmp_path / "ckpt" / ".metadata", "rb") as f:
        md = pickle.load(f)
    shard_files = {info.relative_path for idx, info in md.storage_data.items() if idx.fqn == "sharded"}
    assert shard_files == set(data_files)

    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    # Load with one process (no process group): the two shards are assembled into one plain tensor.
    model, opt = _make_worker_model()
    msd, osd = get_state_dict(model, opt)
    out = {"model": msd, "optim": osd, "sharded": torch.zeros(1000, 48, dtype=torch.bfloat16), "rank_count": 0}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "ckpt"))
    assert out["rank_count"] == 2
    _assert_identical(expected, {k: out[k] for k in expected})

    assert "resharded-ok" in outs[0] and "resharded-ok" in outs[1], outs


def _make_worker_model():
    torch.manual_seed(123)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _x = torch.randn(2, 64)
    opt.zero_grad()
    model(_x).sum().backward()
    opt.step()
    return model, opt


# ---- block-level partial reads (resharding) ---------------------------------------------

class _SliceLoader:
    """Minimal LoadPlanner for StorageReader.read_data: every request goes to one target tensor."""

    def __init__(self, target):
        self.target = target

    def resolve_tensor(self, req):
        return self.target

    def commit_tensor(self, req, tensor):
        pass


def _read_box(reader, fqn, offs, lens, dtype):
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    (index,) = [k for k in reader.storage_data if k.fqn == fqn]
    req = ReadItem(type=LoadItemType.TENSOR, dest_index=index, dest_offsets=torch.Size([0] * len(offs)),
                   storage_index=index, storage_offsets=torch.Size(offs), lengths=torch.Size(lens))
    target = torch.full(tuple(lens), 7, dtype=dtype)
    tzdcp.reset_read_stats()
    reader.read_data(LoadPlan([req]), _SliceLoader(target)).wait()
    return target, tzdcp.read_stats()


def _open_reader(path, **kw):
    reader = tzdcp.StorageReader(path, **kw)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    return reader


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_partial_read_decodes_only_needed_blocks(tmp_path, dtype):
    g = torch.Generator().manual_seed(4)
    state = {"rows": (torch.randn(512, 256, generator=g) * 0.02).to(dtype),      # 32 blocks of 16 rows
             "wide": (torch.randn(16, 16384, generator=g) * 0.02).to(dtype),     # 4 blocks per row
             "cube": (torch.randn(8, 64, 512, generator=g) * 0.02).to(dtype)}    # 8 blocks per [i]
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path, block_elems=4096))
    reader = _open_reader(tmp_path)
    cases = [
        ("rows", (100, 0), (50, 256), 4),          # dim-0 slice: one contiguous run, rows 100..149 -> blocks 6..9
        ("rows", (0, 0), (1, 256), 1),             # first row
        ("rows", (511, 0), (1, 256), 1),           # last row
        ("rows", (17, 3), (2, 5), 1),              # small box inside one block
        ("wide", (0, 4096), (16, 4096), 16),       # column slice: one block per row
        ("wide", (3, 100), (9, 5000), 18),         # columns 100..5099 span blocks 0-1 of rows 3..11
        ("cube", (2, 0, 0), (3, 64, 512), 24),     # dim-0 slice of a 3-D chunk
        ("cube", (0, 8, 0), (8, 8, 512), 8),       # middle dim slice: one block per [i]
    ]
    for fqn, offs, lens, blocks in cases:
        got, st = _read_box(reader, fqn, offs, lens, dtype)
        want = state[fqn][tuple(slice(o, o + n) for o, n in zip(offs, lens))]
        assert _tensor_bytes(got) == _tensor_bytes(want), (fqn, offs, lens)
        # It really decoded and read only part of the chunk: a whole decode would fail these.
        assert st["partial_decodes"] == 1 and st["whole_decodes"] == 0, (fqn, offs, st)
        assert st["blocks_decoded"] == blocks, (fqn, offs, st)
        n_blocks = st["blocks_decoded"] + st["blocks_skipped"]
        assert n_blocks == state[fqn].numel() // 4096
        info = reader.storage_data[[k for k in reader.storage_data if k.fqn == fqn][0]]
        assert info.n_blocks == n_blocks and info.block_bytes == 4096 * state[fqn].element_size()
        assert 0 < st["bytes_decoded"] <= blocks * info.block_bytes, (fqn, st)
    # A request covering most blocks (all rows of a column slice of "rows") decodes the chunk whole.
    got, st = _read_box(reader, "rows", (0, 64), (512, 64), dtype)
    assert _tensor_bytes(got) == _tensor_bytes(state["rows"][:, 64:128])
    assert st["whole_decodes"] == 1 and st["partial_decodes"] == 0
    # partial_reads=False: always whole chunks, same bytes.
    got, st = _read_box(_open_reader(tmp_path, partial_reads=False), "rows", (100, 0), (50, 256), dtype)
    assert _tensor_bytes(got) == _tensor_bytes(state["rows"][100:150]) and st["whole_decodes"] == 1


def test_partial_read_detects_corrupt_block(tmp_path):
    full = (torch.randn(512, 256, generator=torch.Generator().manual_seed(5)) * 0.02).to(torch.bfloat16)
    dcp.save({"w": full}, storage_writer=tzdcp.StorageWriter(tmp_path, block_elems=4096))
    reader = _open_reader(tmp_path)
    (info,) = reader.storage_data.values()
    # Damage a byte inside block 20 (rows 320..335): a partial read of those rows must fail, naming 'w';
    # a partial read of other rows still works (the damage is outside what it reads).
    import tensorzip._tensorzip as C
    data_file = tmp_path / info.relative_path
    raw = bytearray(data_file.read_bytes())
    # The chunk is one tensor of the rank's .tzip, in one frame (it is smaller than chunk_bytes).
    prefix_size = C.frame_prefix_size(bytes(raw), info.offset)
    prefix = bytes(raw[info.offset:info.offset + prefix_size])
    off, size, _, _ = C.frame_block_range(prefix, 20, 1)
    raw[info.offset + off + size // 2] ^= 0x04
    data_file.write_bytes(bytes(raw))
    got, st = _read_box(reader, "w", (0, 0), (16, 256), torch.bfloat16)
    assert _tensor_bytes(got) == _tensor_bytes(full[:16]) and st["partial_decodes"] == 1
    with pytest.raises(tensorzip.CorruptDataError, match=r"'w'.*" + info.relative_path):
        _read_box(reader, "w", (320, 0), (16, 256), torch.bfloat16)
    # Damage in the frame's block index is caught too.
    raw[info.offset + prefix_size - 2] ^= 0x01
    data_file.write_bytes(bytes(raw))
    with pytest.raises(tensorzip.CorruptDataError, match=r"'w'.*" + info.relative_path):
        _read_box(reader, "w", (0, 0), (16, 256), torch.bfloat16)


# ---- several processes: resharding N -> M ranks, async_save, FSDP2, crash safety -----------

_WORKER_FILE = Path(__file__).with_name("_dcp_worker.py")


def _worker_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tensorzip.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.pop(tzdcp._STALL_ENV, None)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _spawn(scenario: str, world: int, out: Path):
    port = _free_port()
    return [subprocess.Popen([sys.executable, str(_WORKER_FILE), scenario, str(r), str(world), str(port), str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_worker_env())
            for r in range(world)]


def _wait_all(procs, timeout: float):
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"worker timed out: {p.args}")
    return outs


def test_reshard_save_n_load_m_async_fsdp2(tmp_path):
    """4 gloo processes: save with 4/3/2 ranks, load with 2/2/4/4 ranks (rows <-> columns), model + AdamW
    + non-tensor items byte-identical; multi-rank async_save loaded by 3 ranks; FSDP2 4 -> 2 ranks."""
    procs = _spawn("reshard", 4, tmp_path)
    outs = _wait_all(procs, 240)
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-6000:]
    for check, ranks in [("load-r4-on-2-cols", 2), ("load-c3-on-2-rows", 2), ("load-r2-on-4-rows", 4),
                         ("load-c3-on-4-cols", 4), ("async_save-4-load-3", 3), ("fsdp2-4-load-2", 2)]:
        assert all(f"ok {check}" in outs[r] for r in range(ranks)), (check, outs[0][-3000:])
    # The 3-rank save wrote three files, and a checkpoint is readable by one process as plain tensors.
    assert len(list((tmp_path / "c3").glob("*" + tzdcp.SUFFIX))) == 3
    out = {"emb": torch.zeros(2048, 64, dtype=torch.bfloat16), "step_count": 0, "blob": b"",
           "cfg": {"name": "", "sizes": [], "ratio": 0.0}}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "c3"))
    g = torch.Generator().manual_seed(2)
    assert _tensor_bytes(out["emb"]) == _tensor_bytes((torch.randn(2048, 64, generator=g) * 0.02).to(torch.bfloat16))
    assert out["step_count"] == 3 and out["blob"] == bytes([0, 0, 255]) * 5
    assert out["cfg"] == {"name": "run-0", "sizes": [64, 256], "ratio": 0.5}


def test_async_save_while_fsdp2_trains_gloo_only(tmp_path):
    """The README's async_save: gloo-only FSDP2 training continues while the save runs on its own
    gloo group; the checkpoint equals the state at the time of the save."""
    procs = _spawn("async_train", 2, tmp_path)
    outs = _wait_all(procs, 240)
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-6000:]
    assert all("ok async-save-while-training" in o and "ok async-train-load" in o for o in outs), outs[0][-3000:]


def _wait_for(path: Path, procs, timeout: float):
    import time
    deadline = time.monotonic() + timeout
    while not path.exists():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            for q in procs:
                q.kill()
            outs = [q.communicate()[0].decode(errors="replace") for q in procs]
            pytest.fail(f"worker did not reach {path.name}: " + "\n---\n".join(o[-3000:] for o in outs))
        time.sleep(0.05)


def test_rank_killed_mid_save_leaves_previous_checkpoint(tmp_path):
    import signal

    fresh = tmp_path / "single"
    fresh.mkdir()
    procs = _spawn("crash", 2, tmp_path)
    single = subprocess.Popen([sys.executable, str(_WORKER_FILE), "single_crash", "0", "1", "0", str(fresh)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_worker_env())
    _wait_for(tmp_path / "stalled", procs, 120)
    procs[1].send_signal(signal.SIGKILL)  # rank 1 dies with its new data file half-written
    procs[1].wait()
    procs[0].kill()  # the job dies with it (rank 0 would wait on rank 1 until the gloo timeout)
    procs[0].wait()
    _wait_for(fresh / "stalled-fresh", [single], 120)
    single.send_signal(signal.SIGKILL)
    single.wait()

    # Reused directory: the new save's files are there, .metadata is still the previous save's.
    ckpt = tmp_path / "ckpt"
    with open(ckpt / ".metadata", "rb") as f:
        finished = {info.relative_path for info in pickle.load(f).storage_data.values()}
    names = sorted(f.name for f in ckpt.iterdir())
    # The finished save's two files; rank 1 of the interrupted one left only its writer's temporary
    # (nothing is at a rank file's final name before TensorWriter.finish); rank 0's may be complete.
    temps = [n for n in names if n.startswith(".__1_") and tzdcp.SUFFIX + ".tmp-" in n]
    data_files = [n for n in names if n.endswith(tzdcp.SUFFIX)] + temps
    assert len(finished) == 2 and finished <= set(data_files) and len(temps) == 1, names
    assert not [n for n in names if n.startswith("__1_") and n not in finished], names
    # clear_interrupted on a copy: only the interrupted save's files go; the checkpoint still loads.
    import shutil
    copy = tmp_path / "ckpt-copy"
    shutil.copytree(ckpt, copy)
    removed = tzdcp.clear_interrupted(copy)
    assert set(removed) == set(data_files) - finished and removed, (removed, names)
    assert sorted(f.name for f in copy.iterdir()) == sorted(finished | {".metadata"})
    assert tzdcp.clear_interrupted(copy) == []
    expected = torch.load(tmp_path / "expected_a.pt", weights_only=True)
    out = {"model": {k: torch.zeros_like(v) for k, v in expected["model"].items()},
           "emb": torch.zeros_like(expected["emb"]), "step_count": 0, "blob": b""}
    dcp.load(out, storage_reader=tzdcp.StorageReader(ckpt))
    _assert_identical({k: expected[k] for k in out}, out)

    # The next save into that directory succeeds and removes every older data file.
    dcp.save({"w": torch.ones(3)}, storage_writer=tzdcp.StorageWriter(ckpt))
    left = sorted(f.name for f in ckpt.iterdir())
    assert len([f for f in left if f.endswith(tzdcp.SUFFIX)]) == 1 and not set(left) & set(data_files), left
    assert not [f for f in left if f.endswith(".tmp") or ".tmp-" in f], left

    # Fresh directory: nothing to load, and the error says why: a CorruptDataError in the caller's
    # code (not wrapped by DCP), from the reader's constructor and from dcp.load(checkpoint_id=).
    fresh_ck = fresh / "fresh"
    with pytest.raises(tensorzip.CorruptDataError, match="no finished checkpoint") as ei:
        tzdcp.StorageReader(fresh_ck)
    assert "interrupted" in str(ei.value) and str(fresh_ck) in str(ei.value) and "clear_interrupted" in str(ei.value)
    with pytest.raises(tensorzip.CorruptDataError, match="no finished checkpoint"):
        dcp.load({"emb": torch.zeros(2048, 64, dtype=torch.bfloat16)}, checkpoint_id=fresh_ck,
                 storage_reader=tzdcp.StorageReader(ckpt))
    # clear_interrupted: removes the leftovers of the interrupted save, nothing else.
    (fresh_ck / "notes.txt").write_text("mine")
    left_before = sorted(f.name for f in fresh_ck.iterdir())
    removed = tzdcp.clear_interrupted(fresh_ck)
    assert removed and sorted(removed) == [n for n in left_before if n != "notes.txt"], (removed, left_before)
    assert sorted(f.name for f in fresh_ck.iterdir()) == ["notes.txt"]
    tzdcp.StorageReader(fresh_ck)  # nothing unfinished left (and nothing to load: DCP's own error then)


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs a CUDA GPU and NCCL")
def test_cuda_tensors_nccl_single_rank(tmp_path):
    """CUDA tensors over NCCL: with a tensorzip module built with CUDA, encoded on the GPU (the writer's
    gpu_bytes count every tensor byte), reloaded byte-identical onto the GPU, and the rank file equals
    the one of gpu_encode=False (CPU encode) byte for byte; dcp.async_save (staged to CPU memory by
    DCP) encodes on the CPU. A module without CUDA takes the CPU path (TZ_REQUIRE_GPU_ENCODE=1, as
    bench/gpu/run.sh sets, makes that a failure)."""
    procs = _spawn("cuda", 1, tmp_path)
    (out,) = _wait_all(procs, 240)
    assert procs[0].returncode == 0 and "ok cuda" in out, out[-6000:]
    assert "ok cuda-cpu-path-same-file" in out and "ok cuda-async-staged-cpu" in out, out[-6000:]
    if tensorzip._tensorzip.HAVE_CUDA:
        assert "ok cuda-gpu-encode" in out, out[-6000:]


def test_missing_data_file_named(tmp_path):
    dcp.save({"w": torch.randn(64, 64)}, storage_writer=tzdcp.StorageWriter(tmp_path))
    (data_file,) = tmp_path.glob("*" + tzdcp.SUFFIX)
    data_file.unlink()
    msg = _load_error({"w": torch.empty(64, 64)}, tzdcp.StorageReader(tmp_path))
    assert "CorruptDataError" in msg and "missing" in msg and "'w'" in msg and data_file.name in msg, msg


def test_second_save_replaces_first(tmp_path):
    # Same directory, twice: the second checkpoint is loaded and only its file is left.
    dcp.save({"w": torch.zeros(10), "n": 1}, storage_writer=tzdcp.StorageWriter(tmp_path))
    first = {f.name for f in tmp_path.glob("*" + tzdcp.SUFFIX)}
    dcp.save({"w": torch.arange(10.0), "n": 2}, storage_writer=tzdcp.StorageWriter(tmp_path))
    files = {f.name for f in tmp_path.iterdir()}
    assert len([f for f in files if f.endswith(tzdcp.SUFFIX)]) == 1 and not files & first, files
    out = {"w": torch.empty(10), "n": 0}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    assert torch.equal(out["w"], torch.arange(10.0)) and out["n"] == 2


def test_block_range_bindings():
    # The module functions the partial reads use: block i of a frame decodes to bytes of block i.
    import numpy as np
    import tensorzip._tensorzip as C

    x = (torch.randn(10 * 4096 + 100, generator=torch.Generator().manual_seed(8)) * 0.02).to(torch.bfloat16)
    payload = tensorzip.compress(x, block_elems=4096)
    start = tensorzip._core.parse_wrapper(payload)[3]  # the codec frame follows the wrapper header
    info = C.frame_info(payload, start)
    assert info["n_blocks"] == 11 and C.frame_prefix_size(payload, start) == info["prefix_size"]
    prefix = payload[start:start + info["prefix_size"]]
    raw = x.view(torch.uint8).numpy()
    for first, count in [(0, 1), (3, 4), (10, 1), (0, 11)]:
        off, size, raw_off, raw_len = C.frame_block_range(prefix, first, count)
        assert raw_off == first * 8192 and raw_len == min(count * 8192, raw.size - raw_off)
        out = np.zeros(raw.size, dtype=np.uint8)
        blocks = payload[start + off:start + off + size]
        assert C.decompress_blocks_into(prefix, blocks, first, count, out, raw_off) == raw_len
        assert out[raw_off:raw_off + raw_len].tobytes() == raw[raw_off:raw_off + raw_len].tobytes()
    with pytest.raises(tensorzip.TensorZipError):
        C.frame_block_range(prefix, 10, 2)  # past the last block
    with pytest.raises(tensorzip.CorruptDataError):
        bad = bytearray(payload[start + off:start + off + size])
        bad[len(bad) // 2] ^= 0x40
        C.decompress_blocks_into(prefix, bytes(bad), 0, 11, np.zeros(raw.size, dtype=np.uint8))


def test_save_without_collectives(tmp_path):
    # use_collectives=False: each rank writes __<rank>.metadata; saves into one directory replace each other.
    for i in range(2):
        dcp.save({"w": torch.arange(10.0) + i, "n": i}, storage_writer=tzdcp.StorageWriter(tmp_path),
                 use_collectives=False)
    files = sorted(f.name for f in tmp_path.iterdir())
    assert "__0.metadata" in files and len([f for f in files if f.endswith(tzdcp.SUFFIX)]) == 1, files
    out = {"w": torch.zeros(10), "n": -1}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    assert torch.equal(out["w"], torch.arange(10.0) + 1) and out["n"] == 1


def test_refuses_entries_of_the_unreleased_tzdcp_layout(tmp_path):
    # Metadata whose storage entries are not .tzip items (the development .tzdcp layout) is refused
    # with a clear error, never read as something else.
    w = torch.arange(64.0)
    dcp.save({"w": w}, storage_writer=tzdcp.StorageWriter(tmp_path))
    with open(tmp_path / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.codec = "tensorzip"
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump(md, f)
    assert "not a .tzip rank file" in _load_error({"w": torch.zeros(64)}, tzdcp.StorageReader(tmp_path))


@pytest.mark.parametrize("edit", ["shape", "huge_shape", "dtype", "n_blocks"])
@pytest.mark.parametrize("partial_reads", [True, False])
def test_metadata_checked_against_the_file_before_allocating(tmp_path, edit, partial_reads):
    # .metadata is a pickle outside the .tzip's checksums: an edited entry must be refused against
    # the rank file's validated table (naming the item) before anything is allocated from it,
    # on the batched path (several whole items at once) as on the one-item paths.
    state = {"a": torch.randn(64, 64), "b": torch.randn(32, 32), "c": torch.randn(16)}
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    with open(tmp_path / ".metadata", "rb") as f:
        md = pickle.load(f)
    (index, info), = [(i, s) for i, s in md.storage_data.items() if i.fqn == "b"]
    changed = {"shape": {"shape": (64, 16)}, "huge_shape": {"shape": (1 << 20, 1 << 20)},
               "dtype": {"dtype": "BF16"}, "n_blocks": {"n_blocks": info.n_blocks + 5}}[edit]
    for k, v in changed.items():
        setattr(info, k, v)
    md.storage_data[index] = info
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump(md, f)
    blank = {"a": torch.empty(64, 64), "b": torch.empty(32, 32), "c": torch.empty(16)}
    msg = _load_error(blank, tzdcp.StorageReader(tmp_path, partial_reads=partial_reads))
    assert "CorruptDataError" in msg and "'b'" in msg, msg
    assert ("block layout" if edit == "n_blocks" else "the metadata says") in msg, msg
