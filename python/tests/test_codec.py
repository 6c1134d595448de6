"""tensorzip.compress / tensorzip.decompress: one array or tensor <-> self-describing bytes."""
from __future__ import annotations

import json
import struct
import threading

import numpy as np
import pytest
import torch

import tensorzip
from _data import ALL_DTYPES, FLOAT_CODEC_DTYPES, np_array, same_bits, torch_same_bits, torch_tensor, valid_shape

SHAPES = [(), (0,), (1,), (7, 3), (3, 0, 5), (65536 + 17,), (300, 1000)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_roundtrip_every_dtype(dtype, shape, rng):
    if not valid_shape(dtype, shape, "np"):
        with pytest.raises(ValueError, match="even number of elements"):
            tensorzip.compress(np_array(dtype, shape, rng))
        return
    a = np_array(dtype, shape, rng)
    b = tensorzip.compress(a)
    assert isinstance(b, bytes)
    out = tensorzip.decompress(b)
    assert isinstance(out, np.ndarray)
    assert same_bits(a, out)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_torch_roundtrip_every_dtype(dtype, shape, rng):
    if not valid_shape(dtype, shape, "pt"):
        with pytest.raises(ValueError, match="0-d"):
            tensorzip.compress(torch.zeros(shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
        return
    t = torch_tensor(dtype, shape, rng)
    b = tensorzip.compress(t)
    out = tensorzip.decompress(b)
    assert isinstance(out, torch.Tensor)
    assert out.device.type == "cpu"
    assert torch_same_bits(t, out)


@pytest.mark.parametrize("dtype", FLOAT_CODEC_DTYPES)
def test_float_weights_shrink(dtype, rng):
    # Normal weights: the exponent field is far from uniform, so every float
    # codec path must actually compress (ratio > 1), not just store.
    a = np_array(dtype, (512, 512), rng)
    b = tensorzip.compress(a)
    assert len(b) < a.nbytes * 0.95, (dtype, len(b), a.nbytes)


@pytest.mark.parametrize("level", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_levels_and_threads(level, threads, rng):
    a = np_array("BF16", (200_000,), rng)
    b = tensorzip.compress(a, level=level, threads=threads)
    assert same_bits(tensorzip.decompress(b, threads=threads), a)
    if level == -1:
        assert len(b) >= a.nbytes  # stored


def test_output_independent_of_threads(rng):
    a = np_array("F32", (300_000,), rng)
    assert tensorzip.compress(a, threads=1) == tensorzip.compress(a, threads=2) == tensorzip.compress(a)


@pytest.mark.parametrize("block_elems", [4096, 65536, 1 << 20])
def test_block_elems(block_elems, rng):
    a = np_array("F16", (100_003,), rng)
    b = tensorzip.compress(a, block_elems=block_elems)
    assert same_bits(tensorzip.decompress(b), a)


def test_non_contiguous_inputs(rng):
    a = np_array("F32", (64, 48), rng)
    for view in (a.T, a[::3, 1::2], a[:, ::-1]):
        assert same_bits(tensorzip.decompress(tensorzip.compress(view)), np.ascontiguousarray(view))
    t = torch_tensor("BF16", (64, 48), rng)
    for view in (t.T, t[::3, 1::2], t.narrow(1, 5, 10)):
        assert torch_same_bits(tensorzip.decompress(tensorzip.compress(view)), view.contiguous())


def test_requires_grad_and_numpy_scalar(rng):
    t = torch.randn(10, requires_grad=True)
    assert torch_same_bits(tensorzip.decompress(tensorzip.compress(t)), t)
    s = np.float32(3.5)
    out = tensorzip.decompress(tensorzip.compress(s))
    assert out.shape == () and out == 3.5


def test_framework_override(rng):
    a = np_array("BF16", (5, 6), rng)
    t = tensorzip.decompress(tensorzip.compress(a), framework="pt")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
    back = tensorzip.decompress(tensorzip.compress(t), framework="numpy")
    assert same_bits(back, a)
    with pytest.raises(ValueError, match="framework"):
        tensorzip.decompress(tensorzip.compress(a), framework="jax")


def test_accepts_bytes_like(rng):
    a = np_array("F8_E4M3", (1000,), rng)
    b = tensorzip.compress(a)
    for src in (bytearray(b), memoryview(b), np.frombuffer(b, dtype=np.uint8)):
        assert same_bits(tensorzip.decompress(src), a)


def test_wrapper_layout(rng):
    # The documented layout (doc/python.md): "TZPY", u16 version 1, u16 flags 0,
    # u32 JSON length, JSON {"dtype","shape","framework"}, then one codec frame.
    a = np_array("BF16", (3, 4), rng)
    b = tensorzip.compress(a)
    magic, version, flags, n = struct.unpack_from("<4sHHI", b)
    assert (magic, version, flags) == (b"TZPY", 1, 0)
    desc = json.loads(b[12:12 + n])
    assert desc == {"dtype": "BF16", "shape": [3, 4], "framework": "np"}
    info = tensorzip._tensorzip.frame_info(b, 12 + n)
    assert info["raw_size"] == a.nbytes and info["frame_size"] == len(b) - 12 - n
    assert info["dtype_name"].upper().startswith("BF16")


def test_concurrent_threads_share_nothing(rng):
    arrays = [np_array(d, (50_000,), rng) for d in ("BF16", "F32", "F16", "I64")]
    blobs = [tensorzip.compress(a) for a in arrays]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                assert tensorzip.compress(arrays[i], threads=1) == blobs[i]
                assert same_bits(tensorzip.decompress(blobs[i], threads=1), arrays[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(arrays))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


# ---- bad input ----------------------------------------------------------------

def test_bad_magic():
    with pytest.raises(tensorzip.CorruptDataError, match="bad magic"):
        tensorzip.decompress(b"NOPE" + bytes(100))
    with pytest.raises(ValueError):  # CorruptDataError is a ValueError too
        tensorzip.decompress(b"")


def test_truncated_everywhere(rng):
    b = tensorzip.compress(np_array("BF16", (20_000,), rng))
    for cut in [0, 3, 11, 12, 20, 40, 100, len(b) // 2, len(b) - 1]:
        with pytest.raises(tensorzip.CorruptDataError):
            tensorzip.decompress(b[:cut])


def test_trailing_garbage_rejected(rng):
    b = tensorzip.compress(np_array("F32", (1000,), rng))
    with pytest.raises(tensorzip.CorruptDataError):
        tensorzip.decompress(b + b"\0")


def test_corrupt_payload_detected_with_detail(rng):
    b = bytearray(tensorzip.compress(np_array("BF16", (200_000,), rng)))
    b[len(b) // 2] ^= 0x40
    with pytest.raises(tensorzip.CorruptDataError) as ei:
        tensorzip.decompress(b)
    # message names the failure and carries tz_last_error_detail() (e.g. "block 3: ...")
    assert "block" in str(ei.value)


def test_corrupt_description(rng):
    b = tensorzip.compress(np_array("F16", (10, 10), rng))
    n = struct.unpack_from("<I", b, 8)[0]
    desc = b[12:12 + n]
    for bad in (desc.replace(b"F16", b"X16"), desc.replace(b"[10,10]", b"[10,11]"),
                desc.replace(b"[10,10]", b"[-1,10]"), b"{" + desc[1:-1]):
        blob = b[:8] + struct.pack("<I", len(bad)) + bad + b[12 + n:]
        with pytest.raises(tensorzip.CorruptDataError):
            tensorzip.decompress(blob)
    with pytest.raises(tensorzip.CorruptDataError, match="version"):
        tensorzip.decompress(b[:4] + struct.pack("<H", 2) + b[6:])


def test_bad_arguments(rng):
    a = np_array("F32", (10,), rng)
    with pytest.raises(tensorzip.UsageError, match="level"):
        tensorzip.compress(a, level=9)
    with pytest.raises(TypeError):
        tensorzip.compress(a, level="fast")
    with pytest.raises(tensorzip.TensorZipError):
        tensorzip.compress(np_array("F32", (100_000,), rng), block_elems=1000)
    with pytest.raises(ValueError, match="unsupported NumPy dtype"):
        tensorzip.compress(np.zeros(3, dtype=np.complex128))
    with pytest.raises(ValueError, match="unsupported torch dtype"):
        tensorzip.compress(torch.zeros(3, dtype=torch.complex128))
    with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
        tensorzip.compress([1.0, 2.0])
    with pytest.raises(TypeError):
        tensorzip.decompress(12345)


def test_big_endian_input_is_converted():
    be = np.arange(10, dtype=">f4")
    out = tensorzip.decompress(tensorzip.compress(be))
    assert out.dtype == np.dtype("<f4") and np.array_equal(out, be)


def _longest_stall_while(fn) -> tuple:
    """Runs fn in a thread; returns (fn's duration, longest gap between two
    iterations of a pure-Python loop in this thread meanwhile)."""
    import time

    done = threading.Event()
    span = {}

    def work():
        t0 = time.perf_counter()
        fn()
        span["t"] = time.perf_counter() - t0
        done.set()

    th = threading.Thread(target=work)
    last = time.perf_counter()
    gap = 0.0
    th.start()
    while not done.is_set():
        now = time.perf_counter()
        gap = max(gap, now - last)
        last = now
    th.join()
    return span["t"], gap


def test_gil_released_while_coding(rng):
    # If the GIL were held during coding, this thread could not run its loop
    # for the whole call: the longest stall would be about the call's length.
    a = np.resize(np_array("F32", (1 << 20,), rng), 24 << 20)  # 96 MiB
    blob = tensorzip.compress(a, threads=1)
    out = np.empty_like(a)
    for fn in (lambda: tensorzip.compress(a, threads=1),
               lambda: tensorzip._tensorzip.decompress_into(blob, 12 + struct.unpack_from("<I", blob, 8)[0],
                                                          out.view(np.uint8), 1)):
        # up to 3 tries: a busy machine may deschedule this thread once; a
        # held GIL stalls it every time
        tries = []
        for _ in range(3):
            duration, stall = _longest_stall_while(fn)
            tries.append((duration, stall))
            if duration > 0.05 and stall < duration * 0.5:
                break
        else:
            pytest.fail(f"this thread stalled for most of the call: (duration, longest stall) = {tries}")


def test_simd_path_and_kernel_table_names():
    # the kernel table's name starts with its path's name; only avx512 and
    # avx2 have two tables, so only their names say more
    path = tensorzip._tensorzip.simd_path()
    kernels = tensorzip._tensorzip.simd_kernels()
    assert path in ("portable", "avx2", "avx512", "neon")
    assert kernels.startswith(path)
    assert kernels == path or path in ("avx512", "avx2"), kernels


def test_write_options_one_rule_set(tmp_path):
    # Python's option checks are the library's (tensorzip::container::check_write_options):
    # every entry point refuses what the C++ writers refuse, naming the rule.
    from tensorzip import _core
    import tensorzip.numpy as tznp
    assert _core.check_write_options(-1, 0, 4096, 1 << 20) == (-1, 0, 4096, 1 << 20)
    for level, block, chunk, rule in [(4, 0, 0, "level"), (-2, 0, 0, "level"), (0, 6144, 0, "block size"),
                                      (0, 1 << 32, 0, "block size"), (0, 0, 3 << 20, "chunk size"),
                                      (0, 0, 128 << 20, "chunk size")]:
        with pytest.raises(tensorzip.UsageError, match=rule):
            _core.check_write_options(level, 0, block, chunk)
    a = np.zeros(16, np.float32)
    with pytest.raises(tensorzip.UsageError, match="block size"):
        tensorzip.compress(a, block_elems=6144)
    with pytest.raises(tensorzip.UsageError, match="chunk size"):
        tznp.save_file({"a": a}, tmp_path / "a.tzip", chunk_bytes=3 << 20)
    with pytest.raises(TypeError):
        _core.check_write_options("1", 0, 0)
    assert not list(tmp_path.iterdir())
