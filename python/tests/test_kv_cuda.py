"""tensorzip.kv on CUDA devices (doc/kv.md section 7; tensorzip/kv/_cuda.py).

Everywhere: without the CUDA kernels in the build or without a device, the device calls are
refused with one line saying which, and ``tensorzip.kv.cuda_available()`` agrees with the
module's ``cuda_available()``. On a GPU (skipped without one; ``TZ_REQUIRE_KV_CUDA=1`` makes a
missing device a failure): pages of real KV (layer 0 of the fixture GPT) encoded on the device are
the CPU's bytes, CPU-encoded pages decode on the device bit for bit, a damaged page raises the
CPU's error, and the compressed block store codes CUDA rows into the same bytes as host rows.
The vLLM worker's device path: test_vllm_offload.py.
"""
import os

import numpy as np
import pytest

import tensorzip
import tensorzip.kv as tkv
from tensorzip import _kv_offload as ko
from tensorzip import _tensorzip as _C

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "kv-fixture-l0.safetensors")
REQUIRED = os.environ.get("TZ_REQUIRE_KV_CUDA") == "1"


def real_rows(name: str, seq: int, tokens: int, dtype=None) -> torch.Tensor:
    """Pages of `tokens` tokens of layer 0's K or V (sequence `seq`), as vLLM-style byte rows
    (num_pages, page_bytes) uint8; `dtype`: the values cast first (F16, FP8)."""
    from safetensors.torch import load_file

    t = load_file(DATA)[name][seq]  # (256, 8, 32) bf16
    if dtype is not None:
        t = t.float().to(dtype)
    return t.reshape(-1, tokens * 8 * 32).contiguous().view(torch.uint8)


@pytest.fixture
def cuda():
    if tkv.cuda_available() and torch.cuda.is_available():
        return torch.device("cuda")
    if REQUIRED:
        pytest.fail(f"TZ_REQUIRE_KV_CUDA=1: no KV CUDA here (HAVE_KV_CUDA={getattr(_C, 'HAVE_KV_CUDA', None)}, "
                    f"cuda_available()={_C.cuda_available()}, torch.cuda.is_available()={torch.cuda.is_available()})")
    pytest.skip("no CUDA device with the KV codec's CUDA kernels")


# ---- everywhere ----

def test_device_calls_refused_without_kernels_or_device():
    assert tkv.cuda_available() == bool(getattr(_C, "HAVE_KV_CUDA", False) and _C.cuda_available())
    if tkv.cuda_available():
        pytest.skip("a CUDA device is here: nothing is refused")
    rows = real_rows("k", 1, 16)
    codec = tkv.PageCodec.calibrate(real_rows("k", 0, 16).view(torch.bfloat16).reshape(-1), row_shape=())
    why = "no CUDA kernels" if not _C.HAVE_KV_CUDA else "no CUDA device is visible"
    with pytest.raises(tensorzip.UsageError, match=f"KV encode_rows_device: .*{why}"):
        codec.encode_rows_device(rows)
    with pytest.raises(tensorzip.UsageError, match=f"KV decode_rows_device: .*{why}"):
        codec.decode_rows_device(torch.zeros(64, dtype=torch.uint8), [0, 64], torch.empty_like(rows[:1]))
    # Host rows still code on the CPU, tensors and arrays alike.
    blobs = codec.encode_rows(rows)
    assert blobs == codec.encode_rows(rows.numpy())
    out = torch.zeros_like(rows)
    codec.decode_rows(blobs, out)
    assert torch.equal(out, rows)


def test_build_flag_is_the_module_build():
    # HAVE_KV_CUDA is the CUDA build (the kernels are linked where the module has CUDA at all).
    assert _C.HAVE_KV_CUDA == _C.HAVE_CUDA


@pytest.mark.skipif(not getattr(_C, "HAVE_KV_CUDA", False), reason="a build without the KV CUDA kernels")
def test_binding_of_a_cuda_build_without_a_device():
    """What the CUDA build's binding does with no device: temp sizes (host arithmetic), statuses
    raised as the CPU codec raises the same codes, launches refused with one line."""
    if tkv.cuda_available():
        pytest.skip("a CUDA device is here")
    codec = tkv.PageCodec.calibrate(real_rows("k", 0, 16).view(torch.bfloat16).reshape(-1), row_shape=())
    n = codec._c
    assert 0 < n.cuda_encode_temp_size(16384, 4) < n.cuda_encode_temp_size(16384, 8)
    assert 0 < n.cuda_decode_temp_size([0, 100, 200], 16384) < n.cuda_decode_temp_size([0, 100, 200], 32768)
    _C.kv_cuda_raise_status(0, "no error")
    for status, kind, text in [(7, tensorzip.CorruptDataError, "corrupt block"),
                               (8, tensorzip.CorruptDataError, "checksum mismatch"),
                               (2, tensorzip.UsageError, "destination buffer too small"),
                               (1, tensorzip.TensorZipError, "error")]:
        with pytest.raises(kind, match=f"KV CUDA decode: page 3: {text}"):
            _C.kv_cuda_raise_status(status, "KV CUDA decode: page 3")
    with pytest.raises(tensorzip.UsageError, match="KV CUDA encode could not start"):
        n.cuda_encode(256, 512, 16384, 4, 1024, codec.bound(16384), 2048, n.cuda_encode_temp_size(16384, 4),
                      4096, 8192, 0)
    with pytest.raises(tensorzip.UsageError, match="stride of 100 bytes per page"):
        n.cuda_encode(256, 512, 16384, 4, 1024, 100, 2048, 1 << 20, 4096, 8192, 0)
    with pytest.raises(tensorzip.UsageError, match="page offsets must not decrease"):
        n.cuda_decode(256, 512, [0, 5, 3], 1024, 16384, 2048, 1 << 20, 4096, 8192, 0)


class _StandInKernels:
    """The native codec with its cuda_* calls done on the CPU over the same raw pointers (host
    memory here): each page coded by the CPU codec, sizes and statuses written where the kernels
    write them. Checks the Python side of the device path (pointers, strides, offsets, packing,
    statuses) on any machine; the kernels themselves are tested by tz_kv_cuda_emu_tests and, on
    a GPU, by the tests below."""

    def __init__(self, native):
        self.native, self.calls = native, []

    def __getattr__(self, name):
        return getattr(self.native, name)

    @staticmethod
    def _mem(ptr, n, ctype=None):
        import ctypes

        return np.ctypeslib.as_array(((ctype or ctypes.c_uint8) * n).from_address(ptr))

    def cuda_upload_tables(self, ptr, capacity, stream):
        self._mem(ptr, capacity)[:] = 0xAB

    def cuda_encode_temp_size(self, page_bytes, n):
        return 512 * n

    def cuda_decode_temp_size(self, offsets, page_bytes):
        return 512 * (len(offsets) - 1)

    def _results(self, sizes, status, n):
        import ctypes

        return self._mem(sizes, n, ctypes.c_int64), self._mem(status, n, ctypes.c_int32)

    def cuda_encode(self, tables, src, page_bytes, n, dst, stride, temp, temp_size, sizes, status, stream):
        self.calls.append(("encode", n, stride, temp_size))
        sz, st = self._results(sizes, status, n)
        for i in range(n):
            blob = self.native.encode(self._mem(src + i * page_bytes, page_bytes))
            self._mem(dst + i * stride, len(blob))[:] = np.frombuffer(blob, dtype=np.uint8)
            sz[i], st[i] = len(blob), 0

    def cuda_decode(self, tables, src, offsets, dst, page_bytes, temp, temp_size, sizes, status, stream):
        self.calls.append(("decode", len(offsets) - 1, temp_size))
        sz, st = self._results(sizes, status, len(offsets) - 1)
        for i in range(len(offsets) - 1):
            blob = bytes(self._mem(src + offsets[i], offsets[i + 1] - offsets[i]))
            try:
                n = self.native.decoded_size(blob)
                if n > page_bytes:
                    sz[i], st[i] = 0, 2
                    continue
                self.native.decode_into(blob, self._mem(dst + i * page_bytes, n))
                sz[i], st[i] = n, 0
            except tensorzip.CorruptDataError:
                sz[i], st[i] = 0, 8


@pytest.fixture
def stand_in(monkeypatch):
    """tensorzip.kv._cuda over _StandInKernels, CPU tensors standing for device ones."""
    import contextlib
    import types

    from tensorzip.kv import _cuda

    class Stream:
        cuda_stream = 0

        def synchronize(self):
            pass

    def raise_status(status, what):
        if status:
            raise tensorzip.CorruptDataError(f"{what}: status {status}")

    monkeypatch.setattr(_cuda, "require", lambda rows, what: None)
    monkeypatch.setattr(_cuda, "_pinned", lambda n: torch.empty(max(1, n), dtype=torch.uint8))
    monkeypatch.setattr(_cuda, "_C", types.SimpleNamespace(kv_cuda_tables_size=lambda: 64,
                                                           kv_cuda_raise_status=raise_status))
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: Stream())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    codec = tkv.PageCodec.calibrate(real_rows("k", 0, 16).view(torch.bfloat16).reshape(-1), row_shape=())
    codec._c = _StandInKernels(codec._c)
    return _cuda, codec


def test_device_path_python_side_over_stand_in_kernels(stand_in):
    _cuda, codec = stand_in
    rows = real_rows("k", 1, 32)
    cpu = codec.encode_rows(rows.numpy())
    enc, sizes = _cuda.encode_rows(codec, rows[:, :].view(torch.int8))
    assert enc.shape == (rows.shape[0], codec.bound(rows.shape[1])) and sizes == [len(b) for b in cpu]
    assert [bytes(enc[i, :sizes[i]].numpy()) for i in range(len(cpu))] == cpu
    assert _cuda.to_host(enc, sizes) == cpu
    assert codec._device_tables[0].eq(0xAB).all()  # uploaded once, kept per device
    out = torch.zeros_like(rows)
    packed = torch.frombuffer(bytearray(b"".join(cpu)), dtype=torch.uint8)
    offsets = [0] + np.cumsum([len(b) for b in cpu]).tolist()
    _cuda.decode_rows(codec, packed, offsets, out)
    assert torch.equal(out, rows)
    out.zero_()
    _cuda.decode_blobs(codec, cpu, out)
    assert torch.equal(out, rows)
    bad = bytearray(cpu[2])
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(tensorzip.CorruptDataError, match="KV CUDA decode: page 2"):
        _cuda.decode_blobs(codec, cpu[:2] + [bytes(bad)] + cpu[3:], out)
    with pytest.raises(tensorzip.UsageError, match="3 offsets for 8 rows"):
        _cuda.decode_rows(codec, packed, offsets[:3], out)
    with pytest.raises(tensorzip.UsageError, match="pages must be a contiguous 1-byte tensor"):
        _cuda.decode_rows(codec, packed[:10], offsets, out)
    with pytest.raises(tensorzip.UsageError, match="out must be contiguous"):
        _cuda.decode_rows(codec, packed, offsets[:5], torch.zeros((8, 2 * rows.shape[1]), dtype=torch.uint8)[:4, ::2])
    with pytest.raises(tensorzip.UsageError, match=f"page 0 decodes to {rows.shape[1]} bytes, not {2 * rows.shape[1]}"):
        _cuda.decode_rows(codec, packed, offsets[:2], torch.zeros((1, 2 * rows.shape[1]), dtype=torch.uint8))
    assert [c[0] for c in codec._c.calls] == ["encode"] + ["decode"] * 4


# ---- on a GPU ----

CASES = [("rans", None), ("fixed", None), ("rans", torch.float16), ("rans", torch.float8_e4m3fn),
         ("fixed", torch.float8_e5m2)]


@pytest.mark.parametrize("mode,dtype", CASES)
def test_gpu_pages_are_the_cpu_bytes(cuda, mode, dtype):
    for name in ("k", "v"):
        sample = real_rows(name, 0, 16, dtype)
        for row_shape in ((), (8, 32)):
            elem = dtype or torch.bfloat16
            codec = tkv.PageCodec.calibrate(sample.view(elem).reshape(-1, 8, 32), mode=mode, row_shape=row_shape)
            for tokens in (16, 64, 256):
                rows = real_rows(name, 1, tokens, dtype)
                cpu = codec.encode_rows(rows.numpy())
                enc, sizes = codec.encode_rows_device(rows.to(cuda))
                assert enc.is_cuda and enc.shape == (rows.shape[0], codec.bound(rows.shape[1]))
                gpu = [bytes(enc[i, :sizes[i]].cpu().numpy()) for i in range(rows.shape[0])]
                assert gpu == cpu, (name, row_shape, tokens)
                assert codec.encode_rows(rows.to(cuda)) == cpu  # the path to host bytes
                assert sum(sizes) < rows.numel()  # the pages did compress


@pytest.mark.parametrize("mode", ["rans", "fixed"])
def test_gpu_decodes_cpu_pages_and_cpu_decodes_gpu_pages(cuda, mode):
    codec = tkv.PageCodec.calibrate(real_rows("v", 0, 16).view(torch.bfloat16).reshape(-1), mode=mode, row_shape=())
    rows = real_rows("v", 1, 32)
    blobs = codec.encode_rows(rows.numpy())
    out = torch.zeros_like(rows, device=cuda)
    codec.decode_rows(blobs, out)
    assert torch.equal(out.cpu(), rows)
    packed = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).to(cuda)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).tolist()
    out2 = torch.full_like(rows, 0x55, device=cuda)
    codec.decode_rows_device(packed, offsets, out2)
    assert torch.equal(out2.cpu(), rows)
    gpu_blobs = codec.encode_rows(rows.to(cuda))
    back = np.zeros(tuple(rows.shape), dtype=np.uint8)
    codec.decode_rows(gpu_blobs, back)
    assert np.array_equal(back, rows.numpy())


def _cpu_error(codec, blob, page_bytes):
    try:
        codec.decode_rows([blob], np.zeros((1, page_bytes), dtype=np.uint8))
    except tensorzip.TensorZipError as e:
        return type(e)
    return None


def test_gpu_damaged_page_raises_the_cpu_error(cuda):
    k = real_rows("k", 0, 16)
    ck = tkv.PageCodec.calibrate(k.view(torch.bfloat16).reshape(-1), row_shape=())
    cv = tkv.PageCodec.calibrate(real_rows("v", 0, 16).view(torch.bfloat16).reshape(-1), row_shape=())
    rows = real_rows("k", 1, 16)
    blobs = ck.encode_rows(rows.numpy())
    page = rows.shape[1]
    damaged = []
    for i in (0, 5, 20, len(blobs[3]) // 2, len(blobs[3]) - 1):
        bad = bytearray(blobs[3])
        bad[i] ^= 0x10
        damaged.append(bytes(bad))
    damaged.append(blobs[3][:-3])  # truncated
    for bad in damaged:
        expected = _cpu_error(ck, bad, page)
        assert expected is not None
        out = torch.zeros_like(rows, device=cuda)
        with pytest.raises(expected, match="KV CUDA decode: page 3"):
            ck.decode_rows(blobs[:3] + [bad] + blobs[4:], out)
    with pytest.raises(_cpu_error(cv, blobs[0], page), match="page 0"):
        cv.decode_rows(blobs[:2], torch.zeros_like(rows[:2], device=cuda))  # pages of other tables
    with pytest.raises(tensorzip.UsageError, match="decodes to"):
        ck.decode_rows(blobs[:1], torch.zeros((1, page * 2), dtype=torch.uint8, device=cuda))


def test_gpu_store_holds_the_bytes_of_a_host_store(cuda, tmp_path):
    rows = torch.cat([real_rows("k", 1, 32), real_rows("v", 1, 32)], dim=1)  # vLLM-style K|V blocks
    stores = [ko.CompressedBlockStore("BF16", [rows.shape[1]], threads=2) for _ in range(2)]
    stores[0].store(range(8), {0: rows.numpy()})
    stores[1].store(range(8), {0: rows.to(cuda)})
    assert all(stores[0]._slots[s] == stores[1]._slots[s] for s in range(8))
    out = stores[1].load(range(8), [0], lambda n, p: torch.empty((n, p), dtype=torch.uint8, device=cuda))[0]
    assert out.is_cuda and torch.equal(out.cpu(), rows)


def test_gpu_blocks_taken_coded_and_put_back_on_the_device(cuda):
    """The offloading worker's device path without vLLM: blocks of a KV cache tensor on the GPU
    gathered there, stored (encoded on the device), loaded (decoded there) into other blocks."""
    rows = torch.cat([real_rows("k", 1, 32), real_rows("v", 1, 32)], dim=1)
    kv = torch.zeros((32, rows.shape[1] + 64), dtype=torch.int8, device=cuda)  # a row pads past the page
    kv[:8, :rows.shape[1]] = rows.view(torch.int8).to(cuda)
    taken = ko.take_blocks(kv, np.arange(8), rows.shape[1], on_device=True)
    assert taken.is_cuda and torch.equal(taken.cpu(), rows)
    store = ko.CompressedBlockStore("BF16", [rows.shape[1]], threads=2)
    store.store(range(8), {0: taken})
    host = ko.CompressedBlockStore("BF16", [rows.shape[1]], threads=2)
    host.store(range(8), {0: ko.take_blocks(kv, np.arange(8), rows.shape[1], on_device=False)})
    assert all(store._slots[s] == host._slots[s] for s in range(8))
    loaded = store.load(range(8), [0], lambda n, p: torch.empty((n, p), dtype=torch.uint8, device=cuda))[0]
    assert ko.put_blocks(kv, np.arange(20, 28), loaded) == rows.numel()
    assert torch.equal(kv[20:28], kv[:8]) and not kv[20:28, rows.shape[1]:].any()
