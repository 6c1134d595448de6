"""tensorzip.kv: lossless KV-cache page codec (doc/kv.md).

Tables are calibrated once from a sample of real pages (per layer and K/V, or
per model) and kept apart from the pages; every page then encodes with no
histogram and no per-page table, and decodes on its own::

    codec = tensorzip.kv.PageCodec.calibrate(sample)   # e.g. (pages, 16, heads, head_dim) bf16
    blob = codec.encode(page)                          # bytes
    page2 = codec.decode(blob)                         # same shape, dtype and bits
    blobs = codec.encode_batch(pages)                  # list of bytes, one per page
    pages2 = codec.decode_batch(blobs)                 # (n, tokens, heads, head_dim)
    codec.save("layer3-k.tzkv"); codec = tensorzip.kv.PageCodec.load("layer3-k.tzkv")

Pages in CUDA memory code on the device where the build has the CUDA kernels and a device is
visible (:func:`cuda_available`), into the CPU codec's bytes: ``encode_rows_device`` /
``decode_rows_device``, and ``encode_rows`` / ``decode_rows`` given CUDA tensors.

Values the sample never held (inf, NaN, outliers) still code, through an
escape. ``mode="fixed"`` trades ratio (~1.43x instead of ~1.5x on BF16) for
speed. ``TensorZipKVCache`` is a Hugging Face ``transformers`` cache that
keeps each layer's past keys and values compressed in host memory.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from .. import _dtypes
from .. import _tensorzip as _C
from .._core import UsageError

__all__ = ["PageCodec", "TensorZipKVCache", "KV_DTYPES", "cuda_available"]

#: Element types the page codec takes (safetensors names).
KV_DTYPES = ("BF16", "F16", "F8_E4M3", "F8_E5M2")

Shape = Tuple[int, ...]


def cuda_available() -> bool:
    """True when this build has the KV page codec's CUDA kernels and a CUDA device is visible
    (initialises the CUDA runtime; False without torch)."""
    if not getattr(_C, "HAVE_KV_CUDA", False):
        return False
    try:
        from . import _cuda
    except ImportError:  # no torch
        return False
    return _cuda.available()


def _cuda_module(what: str) -> Any:
    """tensorzip.kv._cuda (imports torch), or a one-line refusal naming what was asked."""
    if not getattr(_C, "HAVE_KV_CUDA", False):
        raise UsageError(f"KV {what}: this tensorzip build has no CUDA kernels (built without the CUDA backend: "
                         f"build the package with TZ_CUDA=ON), so pages code on the CPU only")
    from . import _cuda

    return _cuda


def _default_row_shape(shape: Shape) -> Shape:
    # (..., tokens, heads, head_dim): a page's rows are tokens of heads x head_dim
    # (vLLM / LMCache layout); 2-D (tokens, width); 1-D: flat pages.
    if len(shape) >= 3:
        return tuple(shape[-2:])
    if len(shape) == 2:
        return (shape[-1],)
    return ()


class PageCodec:
    """A calibrated page codec: immutable, usable from many threads at once."""

    def __init__(self, native: Any, framework: str = "pt") -> None:
        self._c = native
        info = native.info()
        self._dtype = next(d.name for d in _dtypes.BY_NAME.values() if d.codec == info["dtype"] and d.name in KV_DTYPES)
        self._itemsize = _dtypes.lookup(self._dtype).itemsize
        self._row_shape: Shape = tuple(int(d) for d in info["row_dims"])
        self._row_bytes = int(np.prod(self._row_shape, dtype=np.int64)) * self._itemsize if self._row_shape else self._itemsize
        self._info = info
        self._framework = framework
        self._device_tables: dict = {}  # device index -> the tables in its memory (kv/_cuda.py)

    # ---- making one --------------------------------------------------------
    @classmethod
    def calibrate(cls, sample: Any, *, mode: str = "rans", fixed_bits: int = 0, checksum: bool = True,
                  row_shape: Optional[Sequence[int]] = None) -> "PageCodec":
        """Learns tables from ``sample``: real pages (torch tensor or NumPy array) of dtype
        bfloat16, float16, float8_e4m3fn or float8_e5m2.

        ``row_shape``: the shape of one token row of a page, stored with the tables so that
        :meth:`decode` restores page shapes; default ``sample.shape[-2:]`` (heads, head_dim)
        for a sample of 3 or more dims, ``sample.shape[-1:]`` for 2 dims, ``()`` (flat) for 1.
        ``mode``: ``"rans"`` (calibrated static rANS, the best ratio) or ``"fixed"`` (a
        fixed-width exponent code with escapes; ``fixed_bits`` 1..7, 0 = from the sample).
        ``checksum``: pages carry a CRC32C of their bytes (default; detects damage).
        """
        name, shape, flat, framework = _core.source_of(sample)
        if name not in KV_DTYPES:
            raise UsageError(f"KV page codec: dtype {name} is not supported (one of {', '.join(KV_DTYPES)})")
        rows = _default_row_shape(shape) if row_shape is None else tuple(int(d) for d in row_shape)
        if any(d <= 0 for d in rows) or len(rows) > 4:
            raise UsageError(f"KV page codec: row_shape {rows} must have 0..4 positive dims")
        if flat.size == 0:
            raise UsageError("KV page codec: the calibration sample is empty")
        _core.check_int(fixed_bits, "fixed_bits", 0, 7)
        native = _C.kv_calibrate(flat, _dtypes.lookup(name).codec, mode, int(fixed_bits), bool(checksum), list(rows))
        return cls(native, framework)

    @classmethod
    def from_bytes(cls, tables: Any, framework: str = "pt") -> "PageCodec":
        """A codec from serialised tables (:meth:`to_bytes`); every field is checked."""
        return cls(_C.kv_load(tables), _core.normalize_framework(framework) or "pt")

    @classmethod
    def load(cls, path: Any, framework: str = "pt") -> "PageCodec":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read(), framework)

    def to_bytes(self) -> bytes:
        """The serialised tables (a few hundred bytes; doc/kv.md section 2)."""
        return self._c.tables()

    def save(self, path: Any) -> None:
        """Writes the tables to ``path`` (through a temporary file, then renamed: _core.replace_atomically)."""
        data = self.to_bytes()
        _core.replace_atomically(path, lambda f: f.write(data))

    # ---- properties ----------------------------------------------------------
    @property
    def dtype(self) -> str:
        """Element type (safetensors name: BF16, F16, F8_E4M3, F8_E5M2)."""
        return self._dtype

    @property
    def mode(self) -> str:
        return self._info["mode"]

    @property
    def fixed_bits(self) -> int:
        return int(self._info["fixed_bits"])

    @property
    def row_shape(self) -> Shape:
        return self._row_shape

    @property
    def table_id(self) -> int:
        """CRC32C of the tables; every page records the id of the tables it needs."""
        return int(self._info["table_id"])

    def bound(self, page_bytes: int) -> int:
        """Largest encoded size of a page of ``page_bytes`` bytes."""
        return self._c.bound(page_bytes)

    def __repr__(self) -> str:
        extra = f", fixed_bits={self.fixed_bits}" if self.mode == "fixed" else ""
        return f"PageCodec(dtype={self._dtype}, mode={self.mode}{extra}, row_shape={self._row_shape}, id={self.table_id:08x})"

    # ---- pages ---------------------------------------------------------------
    def _page_source(self, page: Any, what: str = "page") -> Tuple[Shape, np.ndarray, str]:
        name, shape, flat, framework = _core.source_of(page)
        if name != self._dtype:
            raise UsageError(f"KV {what}: dtype {name}, the codec was calibrated for {self._dtype}")
        return shape, flat, framework

    def _check_rows(self, shape: Shape, lead: int, what: str) -> None:
        rows = self._row_shape
        if not rows:
            return  # flat pages: any shape, decoded as 1-D
        if len(shape) != lead + len(rows) or tuple(shape[lead:]) != rows:
            raise UsageError(f"KV {what}: shape {shape} must end with the codec's row shape {rows} "
                             f"after {lead} leading dim(s) (calibrate with row_shape=... for other layouts)")

    def encode(self, page: Any) -> bytes:
        """One page -> bytes. The page's shape must be (tokens, *row_shape)."""
        shape, flat, _ = self._page_source(page)
        self._check_rows(shape, 1, "page")
        if flat.size == 0:
            raise UsageError("KV page: empty")
        return self._c.encode(flat)

    def decoded_nbytes(self, blob: Any) -> int:
        """Decoded size in bytes of an encoded page (from its header)."""
        return self._c.decoded_size(blob)

    def _shape_of(self, nbytes: int) -> Shape:
        if not self._row_shape:
            return (nbytes // self._itemsize,)
        if nbytes % self._row_bytes:
            raise UsageError(f"KV page of {nbytes} bytes is not whole rows of {self._row_shape}")
        return (nbytes // self._row_bytes, *self._row_shape)

    def decode(self, blob: Any, *, framework: Optional[str] = None, out: Any = None) -> Any:
        """Bytes of :meth:`encode` -> the page (shape and dtype restored). ``framework``:
        ``"pt"`` or ``"np"`` (default: that of the calibration sample); ``out``: an existing
        contiguous tensor / array of the page's size to decode into."""
        if out is not None:
            shape, flat, _ = self._page_source(out, "out")
            self._c.decode_into(blob, flat)
            return out
        nbytes = self._c.decoded_size(blob)
        fw = _core.normalize_framework(framework) or self._framework
        t, flat = _core.empty_output(self._dtype, self._shape_of(nbytes), fw)
        self._c.decode_into(blob, flat)
        return t

    def encode_batch(self, pages: Any, threads: int = 0) -> List[bytes]:
        """Pages of shape (n, tokens, *row_shape) -> n bytes objects (coded on ``threads`` threads,
        0 = all)."""
        shape, flat, _ = self._page_source(pages, "pages")
        self._check_rows(shape, 2, "pages")
        if not shape or shape[0] == 0 or flat.size == 0:
            raise UsageError("KV encode_batch: no pages")
        blob, offsets = self._c.encode_batch(flat, flat.size // shape[0], threads)
        view = memoryview(blob)
        return [bytes(view[offsets[i]:offsets[i + 1]]) for i in range(shape[0])]

    def encode_rows(self, rows: Any, threads: int = 0) -> List[bytes]:
        """vLLM-style block views: a 2-D (num_blocks, page_bytes) uint8 / int8 array or tensor,
        one page per row (its bytes are elements of the codec's dtype). A CUDA tensor codes on its
        device (:meth:`encode_rows_device`) and only the encoded bytes come back to the host."""
        if _core.is_torch_tensor(rows) and rows.is_cuda:
            cuda = _cuda_module("encode_rows")
            return cuda.to_host(*cuda.encode_rows(self, rows))
        arr = rows.numpy() if _core.is_torch_tensor(rows) else np.asarray(rows)
        if arr.ndim != 2 or arr.dtype.itemsize != 1:
            raise UsageError("KV encode_rows: expected a (num_blocks, page_bytes) array of 1-byte items")
        arr = np.ascontiguousarray(arr).view(np.uint8)
        blob, offsets = self._c.encode_batch(arr.reshape(-1), arr.shape[1], threads)
        view = memoryview(blob)
        return [bytes(view[offsets[i]:offsets[i + 1]]) for i in range(arr.shape[0])]

    def decode_rows(self, blobs: Sequence[Any], out: Any, threads: int = 0) -> Any:
        """Inverse of :meth:`encode_rows` into ``out`` (num_blocks, page_bytes), 1-byte items. A CUDA
        tensor ``out`` decodes on its device (the encoded bytes copied there once)."""
        if _core.is_torch_tensor(out) and out.is_cuda:
            return _cuda_module("decode_rows").decode_blobs(self, list(blobs), out)
        arr = out.numpy() if _core.is_torch_tensor(out) else out
        if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.dtype.itemsize != 1 or not arr.flags.c_contiguous:
            raise UsageError("KV decode_rows: out must be a contiguous (num_blocks, page_bytes) array of 1-byte items")
        if arr.shape[0] != len(blobs):
            raise UsageError(f"KV decode_rows: {len(blobs)} pages for {arr.shape[0]} rows")
        self._c.decode_batch(list(blobs), arr.reshape(-1).view(np.uint8), arr.shape[1], threads)
        return out

    def encode_rows_device(self, rows: Any) -> Tuple[Any, List[int]]:
        """Pages held in a CUDA tensor (num_pages, page_bytes) of 1-byte items -> ``(encoded, sizes)``
        in the device's memory: page i is ``encoded[i, :sizes[i]]`` (``encoded``: uint8, num_pages x
        ``bound(page_bytes)``), the CPU codec's bytes. Runs on the current CUDA stream and waits for
        it. Refused (UsageError) without the CUDA kernels in this build or without a device."""
        return _cuda_module("encode_rows_device").encode_rows(self, rows)

    def decode_rows_device(self, pages: Any, offsets: Sequence[int], out: Any) -> Any:
        """Encoded pages in device memory (``pages``: a CUDA uint8 tensor, page i at
        ``pages[offsets[i]:offsets[i + 1]]``) -> the rows of ``out`` (a contiguous CUDA tensor
        (num_pages, page_bytes) of 1-byte items). A damaged page raises (CorruptDataError, as on
        the CPU); nothing is read or written outside the buffers."""
        return _cuda_module("decode_rows_device").decode_rows(self, pages, offsets, out)

    def decode_batch(self, blobs: Sequence[Any], *, framework: Optional[str] = None, out: Any = None,
                     threads: int = 0) -> Any:
        """n pages of equal size -> one tensor (n, tokens, *row_shape)."""
        blobs = list(blobs)
        if not blobs:
            raise UsageError("KV decode_batch: no pages")
        nbytes = self._c.decoded_size(blobs[0])
        if out is None:
            fw = _core.normalize_framework(framework) or self._framework
            out, flat = _core.empty_output(self._dtype, (len(blobs), *self._shape_of(nbytes)), fw)
        else:
            _, flat, _ = self._page_source(out, "out")
        self._c.decode_batch(blobs, flat, nbytes, threads)
        return out


def __getattr__(name: str) -> Any:
    # The transformers cache is imported on first use (torch and transformers are optional).
    if name in ("TensorZipKVCache", "CompressedKVLayer"):
        from . import _hf

        return getattr(_hf, name)
    raise AttributeError(f"module 'tensorzip.kv' has no attribute {name!r}")
