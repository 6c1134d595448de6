"""The KV page codec on CUDA devices (doc/kv.md section 7): batches of pages held in CUDA torch
tensors, coded by the kernels of ``src/kv/kernels_cuda.cu`` into exactly the bytes of the CPU
codec (a page encoded on either side decodes on the other).

Used through :class:`tensorzip.kv.PageCodec` (``encode_rows_device``, ``decode_rows_device``, and
``encode_rows`` / ``decode_rows`` given CUDA tensors). Every call runs on the current CUDA stream
of the tensors' device and waits for it (the per-page statuses are read back), so the results
are ready when a call returns. torch is imported by the caller (this module needs it).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch

from .. import _tensorzip as _C
from .._core import UsageError


def built_with_cuda() -> bool:
    """Whether this build of tensorzip has the KV page codec's CUDA kernels."""
    return bool(getattr(_C, "HAVE_KV_CUDA", False))


def available() -> bool:
    """Built with the CUDA kernels and a CUDA device visible (initialises the CUDA runtime)."""
    return built_with_cuda() and bool(_C.cuda_available())


def require(rows: Any, what: str) -> None:
    """Refuses, with one line, a call that cannot run on a device here."""
    if not built_with_cuda():
        raise UsageError(f"KV {what}: this tensorzip build has no CUDA kernels (built without the CUDA backend: "
                         f"build the package with TZ_CUDA=ON), so pages code on the CPU only")
    if not _C.cuda_available():
        raise UsageError(f"KV {what}: no CUDA device is visible (tensorzip._tensorzip.cuda_available() is False)")
    if not isinstance(rows, torch.Tensor) or not rows.is_cuda:
        raise UsageError(f"KV {what}: expected a CUDA torch tensor, got "
                         f"{type(rows).__name__}{' on ' + str(rows.device) if isinstance(rows, torch.Tensor) else ''}")


def _byte_rows(rows: torch.Tensor, what: str) -> torch.Tensor:
    if rows.dim() != 2 or rows.element_size() != 1:
        raise UsageError(f"KV {what}: expected a (num_pages, page_bytes) tensor of 1-byte items, "
                         f"got shape {tuple(rows.shape)} of {rows.dtype}")
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        raise UsageError(f"KV {what}: no pages")
    return rows.contiguous().view(torch.uint8)


def _pinned(nbytes: int) -> torch.Tensor:
    """Page-locked host memory (torch's caching host allocator), so that copies are DMA."""
    return torch.empty(max(1, nbytes), dtype=torch.uint8, pin_memory=True)


def _tables(codec: Any, device: torch.device, stream: Any) -> torch.Tensor:
    """The codec's tables in the device's memory, uploaded once per device."""
    cache: Dict[int, torch.Tensor] = codec._device_tables
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in cache:
        t = torch.empty(int(_C.kv_cuda_tables_size()), dtype=torch.uint8, device=device)
        codec._c.cuda_upload_tables(t.data_ptr(), t.numel(), stream.cuda_stream)
        stream.synchronize()  # the upload done before any stream uses the tables
        cache[index] = t
    return cache[index]


def _check(status: torch.Tensor, sizes: torch.Tensor, what: str) -> List[int]:
    """Waits for the stream (reads the results back); raises for the first page in error."""
    st = status.cpu().tolist()
    for i, code in enumerate(st):
        if code:
            _C.kv_cuda_raise_status(int(code), f"{what}: page {i}")
    return [int(n) for n in sizes.cpu().tolist()]


def encode_rows(codec: Any, rows: torch.Tensor) -> Tuple[torch.Tensor, List[int]]:
    """Pages (rows of a CUDA tensor) -> (encoded, sizes): page i at ``encoded[i, :sizes[i]]``,
    ``encoded`` a CUDA uint8 tensor (num_pages, bound(page_bytes))."""
    require(rows, "encode_rows_device")
    rows = _byte_rows(rows, "encode_rows_device")
    n, page_bytes = int(rows.shape[0]), int(rows.shape[1])
    dev = rows.device
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        tables = _tables(codec, dev, stream)
        stride = codec._c.bound(page_bytes)
        out = torch.empty((n, stride), dtype=torch.uint8, device=dev)
        temp_size = int(codec._c.cuda_encode_temp_size(page_bytes, n))
        temp = torch.empty(max(256, temp_size), dtype=torch.uint8, device=dev)
        sizes = torch.zeros(n, dtype=torch.int64, device=dev)
        status = torch.zeros(n, dtype=torch.int32, device=dev)
        codec._c.cuda_encode(tables.data_ptr(), rows.data_ptr(), page_bytes, n, out.data_ptr(), stride,
                             temp.data_ptr(), temp_size, sizes.data_ptr(), status.data_ptr(), stream.cuda_stream)
        return out, _check(status, sizes, "KV CUDA encode")


def to_host(encoded: torch.Tensor, sizes: Sequence[int]) -> List[bytes]:
    """The pages of :func:`encode_rows` as bytes: only their encoded bytes cross to (pinned) host
    memory, in one copy."""
    n, stride, dev = int(encoded.shape[0]), int(encoded.shape[1]), encoded.device
    lengths = [int(x) for x in sizes]
    with torch.cuda.device(dev):
        on_dev = torch.tensor(lengths, dtype=torch.int64).to(dev)
        keep = torch.arange(stride, device=dev).unsqueeze(0) < on_dev.unsqueeze(1)
        packed = encoded[keep]  # the pages back to back (row-major order of the mask)
        host = _pinned(packed.numel())
        host[:packed.numel()].copy_(packed, non_blocking=True)
        torch.cuda.current_stream(dev).synchronize()
    view = memoryview(host.numpy())
    offsets = [0] + np.cumsum(lengths).tolist()
    return [bytes(view[offsets[i]:offsets[i + 1]]) for i in range(n)]


def decode_rows(codec: Any, pages: torch.Tensor, offsets: Sequence[int], out: torch.Tensor) -> torch.Tensor:
    """Encoded pages in device memory (``pages``, a CUDA uint8 tensor, page i at
    ``pages[offsets[i]:offsets[i + 1]]``) -> the rows of ``out`` (num_pages, page_bytes), a CUDA
    tensor of 1-byte items."""
    require(out, "decode_rows_device")
    if not out.is_contiguous():
        raise UsageError("KV decode_rows_device: out must be contiguous")
    rows = _byte_rows(out, "decode_rows_device")
    offsets = [int(o) for o in offsets]
    n, page_bytes = int(rows.shape[0]), int(rows.shape[1])
    if len(offsets) != n + 1 or offsets[0] != 0:
        raise UsageError(f"KV decode_rows_device: {len(offsets)} offsets for {n} rows (n + 1, from 0, expected)")
    if not isinstance(pages, torch.Tensor) or pages.device != rows.device or pages.element_size() != 1 \
            or not pages.is_contiguous() or pages.numel() < offsets[-1]:
        raise UsageError(f"KV decode_rows_device: pages must be a contiguous 1-byte tensor on {rows.device} "
                         f"holding {offsets[-1]} bytes")
    dev = rows.device
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        tables = _tables(codec, dev, stream)
        temp_size = int(codec._c.cuda_decode_temp_size(offsets, page_bytes))
        temp = torch.empty(max(256, temp_size), dtype=torch.uint8, device=dev)
        sizes = torch.zeros(n, dtype=torch.int64, device=dev)
        status = torch.zeros(n, dtype=torch.int32, device=dev)
        codec._c.cuda_decode(tables.data_ptr(), pages.data_ptr(), offsets, rows.data_ptr(), page_bytes,
                             temp.data_ptr(), temp_size, sizes.data_ptr(), status.data_ptr(), stream.cuda_stream)
        got = _check(status, sizes, "KV CUDA decode")
    for i, size in enumerate(got):
        if size != page_bytes:
            raise UsageError(f"KV CUDA decode: page {i} decodes to {size} bytes, not {page_bytes}")
    return out


def decode_blobs(codec: Any, blobs: Sequence[Any], out: torch.Tensor) -> torch.Tensor:
    """Encoded pages held in host memory (bytes-like) -> the rows of ``out`` (a CUDA tensor): one
    copy of the encoded bytes through pinned memory, then :func:`decode_rows`."""
    require(out, "decode_rows")
    lengths = [memoryview(b).nbytes for b in blobs]
    offsets = [0] + np.cumsum(lengths).tolist()
    host = _pinned(offsets[-1])
    flat = host.numpy()
    for b, start, n in zip(blobs, offsets, lengths):
        flat[start:start + n] = np.frombuffer(b, dtype=np.uint8)
    pages = host.to(out.device, non_blocking=True)
    return decode_rows(codec, pages, offsets, out)
