"""tensorzip.dcp in one process: PyTorch Distributed Checkpoint StorageWriter / StorageReader.

Save/load of a trained model + AdamW state, async_save, options and dtypes refused, size against
DCP's FileSystemWriter, DCP's own tools on tensorzip checkpoints, errors that name the item and the
file, corruption and edited metadata detected. Block-level partial reads: test_dcp_partial.py;
several processes (gloo, NCCL): test_dcp_ranks.py.
"""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dcp_support import (  # noqa: E402,F401  (quiet_dcp: autouse; torch or the module is skipped)
    assert_identical, dcp, flat, quiet_dcp, tensor_bytes, torch)
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


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


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

    n = assert_identical({"model": msd, "optim": osd}, dict(zip(("model", "optim"), get_state_dict(model2, opt2))))
    assert n >= 4 * 3 + 1  # 4 params + exp_avg/exp_avg_sq/step each (step may be shared per group)

    # Training continues identically from the restored state.
    _train(model, opt, 2, seed=5)
    _train(model2, opt2, 2, seed=5)
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert tensor_bytes(a) == tensor_bytes(b), k


def test_async_save(tmp_path):
    state = _big_state()
    expected = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in flat(state).items()}
    fut = dcp.async_save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    state["emb"].add_(1)  # the state was staged (copied) before async_save returned
    fut.result(timeout=60)
    out = _big_state(seed=3)
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    assert_identical(expected, flat(out))


def test_bad_level_is_refused(tmp_path):
    with pytest.raises(tensorzip.UsageError):
        tzdcp.StorageWriter(tmp_path, level=9)


def test_unsupported_dtype_and_scalars(tmp_path):
    state = {"c": torch.randn(5, dtype=torch.complex64), "s": torch.tensor(2.5), "e": torch.zeros(0, 3),
             "i": torch.arange(10, dtype=torch.int64), "b": torch.tensor([True, False])}
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path))
    out = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path))
    assert_identical(state, out)


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
    assert_identical(state, out)


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
    assert_identical(state, out)
    out = _tools_blank()
    dcp.load(out, checkpoint_id=tmp_path / "ck")
    assert_identical(state, out)
    out = _tools_blank()
    dcp.load(out, storage_reader=dcp.FileSystemReader(tmp_path / "ck", _extension_registry=tzdcp.extension_registry()))
    assert_identical(state, out)
    dcp_to_torch_save(tmp_path / "ck", tmp_path / "all.pt")
    assert_identical(state, torch.load(tmp_path / "all.pt", weights_only=False))
    # In a fresh process that never imported tensorzip: unpickling .metadata imports tensorzip.dcp,
    # which is enough for the registry DCP made before that.
    code = ("import sys, torch; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
            "assert 'tensorzip' not in sys.modules; dcp_to_torch_save(sys.argv[1], sys.argv[2]); "
            "print(sorted(torch.load(sys.argv[2], weights_only=False)))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ck"), str(tmp_path / "fresh.pt")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_identical(state, torch.load(tmp_path / "fresh.pt", weights_only=False))
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
            assert bytes(out) == tensor_bytes(state["emb"])
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
    assert_identical(state, out)
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
        assert_identical(state, out)
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
