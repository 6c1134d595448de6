"""tensorzip.lmcache: a lossless LMCache serde ``tensorzip`` and a file-system L2 adapter that
stores its variable-length chunks (doc/kv.md, "LMCache").

LMCache's multiprocess server (``lmcache server``) hands each L2 adapter KV chunks of shape
``(2, layers, tokens, hidden)`` (``(layers, tokens, hidden)`` for MLA). The serde codes every
``(tokens, hidden)`` slice of a chunk (one layer's K or V) as one page of the KV page codec
(tensorzip.kv), with one codec per slice calibrated on the first chunk (or loaded from a tables
file) and recalibrated when the chunks' ratio falls below 0.9x what the codecs had when they were
calibrated (checked every 64 pages, tensorzip.kv._recalibration), and writes the codecs' tables
into every chunk, so that any server, restarted or not, decodes any stored chunk on its own.

LMCache sizes a chunk's buffer from ``estimate_serialized_size`` (an upper bound) and its L2
adapters write only the bytes ``serialize`` returned, but its ``fs`` adapter loads a file only into
a buffer of exactly that bound, so it refuses every compressed chunk. ``TensorZipFSL2Adapter`` is
that adapter with one change: before a load, a buffer is narrowed to the length its file's chunk
header records. Both are registered when this module is imported; LMCache imports it through its
``plugin`` adapter type::

    lmcache server --l1-size-gb 1 --eviction-policy LRU --l2-adapter '{"type": "plugin",
        "module_path": "tensorzip.lmcache", "class_name": "TensorZipFSL2Adapter",
        "adapter_params": {"base_path": "/var/cache/kv"}, "serde": {"type": "tensorzip"}}'

(with vLLM on a CPU also ``--supported-transfer-mode engine_driven``: doc/kv.md section 7.3).

Serde options (the ``"serde"`` dict): ``mode`` ("rans", default, or "fixed"), ``tables`` (a file
of tables: loaded when it exists, else published after the first chunk is calibrated, never
replacing one another server published first: that one is then used; loaded tables are kept if
they pay on the first chunk they meet),
``max_workers`` (chunks coded at once, default 1).

Chunk layout (little-endian; doc/kv.md section 7.3)::

    chunk  := "TZLC", u8 version (1), u8 n_groups, u16 0, u64 chunk_bytes, group * n_groups
    group  := u8 ndim, u8[3] 0, u32 n_pages, u64 dims[ndim], page * n_pages
    page   := u32 tables_bytes, u32 page_bytes, tables (doc/kv.md section 2), page (section 3)

A group is one of the memory object's tensors; its pages are its slices over every dim but the
last two, in order. A tables file is a chunk whose pages are empty.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

try:
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.l2_adapters.base import L2TaskId
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter, FSL2AdapterConfig
    from lmcache.v1.distributed.serde import (
        AsyncSerdeProcessor,
        Deserializer,
        SerdeProcessor,
        Serializer,
        get_registered_serde_types,
        register_serde_factory,
    )
    from lmcache.v1.memory_management import MemoryObj
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"tensorzip.lmcache needs LMCache and torch (pip install lmcache): {e}") from e

from . import _core
from .kv import PageCodec
from .kv._recalibration import RatioWindow, keeps_loaded

__all__ = ["TensorZipSerializer", "TensorZipDeserializer", "TensorZipFSL2Adapter", "TensorZipFSL2AdapterConfig",
           "SERDE_NAME", "chunk_bytes_of"]

#: The serde's registered name (``"serde": {"type": "tensorzip"}``).
SERDE_NAME = "tensorzip"

_MAGIC = b"TZLC"
_VERSION = 1
_HEADER = struct.Struct("<4sBBHQ")       # magic, version, n_groups, reserved, chunk_bytes
_GROUP = struct.Struct("<B3xI")          # ndim, reserved, n_pages (then u64 dims[ndim])
_PAGE = struct.Struct("<II")             # tables_bytes, page_bytes
_MAX_TABLES_BYTES = 1126                 # doc/kv.md section 2.3
_MAX_NDIM = 8
_KV_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16"}
for _name, _st in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _KV_DTYPES[getattr(torch, _name)] = _st

Dims = Tuple[int, ...]
# One group as coded: its dims and (tables, page) per page.
Group = Tuple[Dims, List[Tuple[Any, Any]]]


class ChunkError(ValueError):
    """A chunk that cannot be coded or decoded (the message names the chunk and what is wrong)."""


# ---- the chunk layout ----------------------------------------------------------

def _pages_of(dims: Dims) -> int:
    """Pages of a group of these dims: its slices over every dim but the last two."""
    n = 1
    for d in dims[:-2]:
        n *= d
    return n


def chunk_bytes_of(head: Any) -> Optional[int]:
    """The length a chunk's header records, or None when ``head`` (its first 16 bytes or more)
    does not start a chunk of this version."""
    if len(head) < _HEADER.size:
        return None
    magic, version, n_groups, reserved, size = _HEADER.unpack_from(head, 0)
    if magic != _MAGIC or version != _VERSION or reserved != 0 or n_groups == 0 or size < _HEADER.size:
        return None
    return size


def _chunk_size(groups: Sequence[Group]) -> int:
    """Bytes of the chunk of ``groups``."""
    return _HEADER.size + sum(_GROUP.size + 8 * len(dims) + sum(_PAGE.size + len(t) + len(p) for t, p in pages)
                              for dims, pages in groups)


def _write_chunk(out: np.ndarray, groups: Sequence[Group]) -> int:
    """Writes the chunk of ``groups`` into the uint8 array ``out``; returns its length."""
    pos = _HEADER.size
    for dims, pages in groups:
        head = _GROUP.pack(len(dims), len(pages)) + struct.pack(f"<{len(dims)}Q", *dims)
        out[pos:pos + len(head)] = np.frombuffer(head, np.uint8)
        pos += len(head)
        for tables, page in pages:
            out[pos:pos + _PAGE.size] = np.frombuffer(_PAGE.pack(len(tables), len(page)), np.uint8)
            pos += _PAGE.size
            for part in (tables, page):
                out[pos:pos + len(part)] = np.frombuffer(part, np.uint8)
                pos += len(part)
    out[:_HEADER.size] = np.frombuffer(_HEADER.pack(_MAGIC, _VERSION, len(groups), 0, pos), np.uint8)
    return pos


def _read_chunk(buf: np.ndarray, what: str) -> List[Group]:
    """The groups of the chunk at the start of the uint8 array ``buf`` (views into it); every
    length is checked against the buffer and the header. ``what`` names the chunk in errors."""
    size = chunk_bytes_of(buf[:_HEADER.size])
    if size is None:
        raise ChunkError(f"{what}: not a tensorzip chunk (bad magic, version or header)")
    if size > len(buf):
        raise ChunkError(f"{what}: the header records {size} bytes, only {len(buf)} were read")
    n_groups = int(buf[5])
    pos, groups = _HEADER.size, []

    def take(n: int, field: str) -> np.ndarray:
        nonlocal pos
        if pos + n > size:
            raise ChunkError(f"{what}: {field} runs past the chunk's {size} bytes")
        view = buf[pos:pos + n]
        pos += n
        return view

    for g in range(n_groups):
        ndim, n_pages = _GROUP.unpack(take(_GROUP.size, f"group {g} header").tobytes())
        if not 1 <= ndim <= _MAX_NDIM:
            raise ChunkError(f"{what}: group {g} has {ndim} dims (1..{_MAX_NDIM})")
        dims = struct.unpack(f"<{ndim}Q", take(8 * ndim, f"group {g} dims").tobytes())
        if n_pages != _pages_of(dims):
            raise ChunkError(f"{what}: group {g} of dims {dims} records {n_pages} pages, not {_pages_of(dims)}")
        pages = []
        for p in range(n_pages):
            n_tables, n_page = _PAGE.unpack(take(_PAGE.size, f"group {g} page {p} lengths").tobytes())
            pages.append((take(n_tables, f"group {g} page {p} tables"), take(n_page, f"group {g} page {p}")))
        groups.append((dims, pages))
    if pos != size:
        raise ChunkError(f"{what}: {size - pos} bytes after the last page")
    return groups


# ---- memory objects as tensors --------------------------------------------------

def _bytes_of(obj: MemoryObj) -> np.ndarray:
    """The object's logical bytes as a writable uint8 array (no copy)."""
    return np.frombuffer(obj.byte_array, dtype=np.uint8)


def _group_tensors(obj: MemoryObj, raw: np.ndarray) -> List[Tuple[torch.Tensor, Dims]]:
    """Each group of a KV-shaped object as (pages, dims): pages is a (n_pages, elements) view."""
    out, pos = [], 0
    for shape, dtype in zip(obj.get_shapes(), obj.get_dtypes()):
        dims = tuple(int(d) for d in shape)
        if not dims or len(dims) > _MAX_NDIM:
            raise ChunkError(f"a group of shape {dims} (1..{_MAX_NDIM} dims)")
        nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        if pos + nbytes > len(raw):
            raise ChunkError(f"the object holds {len(raw)} bytes, its layout needs more")
        t = torch.frombuffer(raw[pos:pos + nbytes], dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        out.append((t.view(dtype).view(_pages_of(dims), -1), dims))
        pos += nbytes
    return out


def _chunk_name(key: Optional[ObjectKey]) -> str:
    return f"chunk {key.chunk_hash.hex()}" if key is not None else "chunk"


# ---- codecs ------------------------------------------------------------------------

def _code_pages(codecs: List[Tuple[PageCodec, bytes]], pages: torch.Tensor) -> List[bytes]:
    """Page i coded with codecs[i]."""
    return [codec.encode(pages[i]) for i, (codec, _) in enumerate(codecs)]


def _ratio_of(pages: torch.Tensor, coded: List[bytes]) -> float:
    return pages.numel() * pages.element_size() / max(1, sum(map(len, coded)))


class _Codecs:
    """Page codecs by their tables (shared by a serde's serializer and deserializer), and the
    serializer's codecs per group layout: calibrated on the first chunk of that layout, or loaded
    from / saved to a tables file, and recalibrated when they stop paying (the rule of
    tensorzip.kv._recalibration, over the pages of a layout's chunks: every chunk carries its
    tables, so chunks stored earlier decode as they are)."""

    _MAX_BY_TABLES = 4096

    def __init__(self, mode: str, tables_path: Optional[str]) -> None:
        if mode not in ("rans", "fixed"):
            raise ValueError(f"tensorzip serde: mode must be 'rans' or 'fixed', not {mode!r}")
        self.mode = mode
        self.tables_path = tables_path
        self._lock = threading.RLock()  # held while calibrating, which may read a tables file (from_tables)
        self._by_tables: Dict[bytes, PageCodec] = {}
        self._by_layout: Dict[Tuple[int, Dims], List[Tuple[PageCodec, bytes]]] = {}
        self._windows: Dict[Tuple[int, Dims], RatioWindow] = {}  # the recalibration rule, per layout
        self._loaded: set = set()  # layouts whose codecs came from the tables file, not yet checked
        self._tables_settled = False  # a tables file exists (read, or published by this process)
        self.counters = {"calibrations": 0, "recalibrations": 0, "loaded_kept": 0, "loaded_replaced": 0}
        if tables_path:
            try:
                self._take_loaded(self._read_tables_file(tables_path))
                self._tables_settled = True
            except FileNotFoundError:
                pass  # published after the first chunk is calibrated

    def _read_tables_file(self, path: str) -> Dict[Tuple[int, Dims], List[Tuple[PageCodec, bytes]]]:
        """The codecs of a tables file by group layout (ChunkError if it is not one)."""
        with open(path, "rb") as f:
            raw = np.frombuffer(f.read(), dtype=np.uint8)
        return {(g, dims): [(self.from_tables(t, path), t.tobytes()) for t, _ in pages]
                for g, (dims, pages) in enumerate(_read_chunk(raw, f"tables file {path}"))}

    def from_tables(self, tables: Any, what: str) -> PageCodec:
        """The codec of these tables (parsed once)."""
        key = bytes(tables)
        codec = self._by_tables.get(key)
        if codec is None:
            try:
                codec = PageCodec.from_bytes(key)
            except Exception as e:
                raise ChunkError(f"{what}: bad tables: {e}") from e
            with self._lock:
                if len(self._by_tables) >= self._MAX_BY_TABLES:
                    self._by_tables.clear()
                self._by_tables[key] = codec
        return codec

    def _take_loaded(self, codecs: Dict[Tuple[int, Dims], List[Tuple[PageCodec, bytes]]]) -> None:
        """Codecs of a tables file: used once checked on the first chunk of their layout."""
        self._by_layout.update(codecs)
        for layout in codecs:
            self._loaded.add(layout)
            self._windows.setdefault(layout, RatioWindow()).stale = True

    def for_layout(self, g: int, dims: Dims,
                   pages: torch.Tensor) -> Tuple[List[Tuple[PageCodec, bytes]], Optional[List[bytes]]]:
        """The codecs of group ``g`` of these dims for a chunk whose pages are ``pages``: calibrated
        on them the first time, and again when the current ones are stale; with the pages already
        coded by them when the choice coded them (a calibration measures the ratio), else None."""
        layout = (g, dims)
        found = self._by_layout.get(layout)
        window = self._windows.get(layout)
        if found is not None and window is not None and not window.stale:
            return found, None
        with self._lock:
            found = self._by_layout.get(layout)
            window = self._windows.setdefault(layout, RatioWindow())
            if found is not None and not window.stale:
                return found, None
            fresh = []
            for i in range(pages.shape[0]):
                codec = PageCodec.calibrate(pages[i], mode=self.mode, row_shape=())
                fresh.append((codec, codec.to_bytes()))
            fresh_coded = _code_pages(fresh, pages)
            fresh_ratio = _ratio_of(pages, fresh_coded)
            if layout in self._loaded:
                self._loaded.discard(layout)
                found_coded = _code_pages(found, pages)
                if keeps_loaded(_ratio_of(pages, found_coded), fresh_ratio):
                    self.counters["loaded_kept"] += 1
                    window.start(fresh_ratio)
                    return found, found_coded
                self.counters["loaded_replaced"] += 1
            elif found is not None:
                self.counters["recalibrations"] += 1
            self.counters["calibrations"] += 1
            self._by_layout[layout] = fresh
            window.start(fresh_ratio)
            self._save_tables_locked()
        return fresh, fresh_coded

    def coded(self, g: int, dims: Dims, raw: int, coded: int, pages: int) -> None:
        """Pages of a layout coded with its current codecs (the recalibration window)."""
        with self._lock:
            window = self._windows.get((g, dims))
            if window is not None:
                window.add(raw, coded, pages)

    def _save_tables_locked(self) -> None:
        """Publishes the tables file if there is none. It is written once and never replaced:
        when another process (another server sharing the file) published it first, its tables
        are checked and used for the layouts it has."""
        if not self.tables_path or self._tables_settled:
            return
        groups = [(dims, [(t, b"") for _, t in codecs]) for (_, dims), codecs in sorted(self._by_layout.items())]
        out = np.zeros(_chunk_size(groups), dtype=np.uint8)
        _write_chunk(out, groups)
        if not _core.publish_once(self.tables_path, lambda f: f.write(out.tobytes())):
            try:
                self._take_loaded(self._read_tables_file(self.tables_path))
            except OSError as e:  # e.g. a link to nowhere
                raise ChunkError(f"tables file {self.tables_path}: is there but cannot be read "
                                 f"({e.strerror or e})") from e
        self._tables_settled = True


_bound_codecs: Dict[torch.dtype, PageCodec] = {}


def _page_bound(dtype: torch.dtype, elements: int) -> int:
    """Largest coded page of ``elements`` elements. The bound depends on the dtype and size only
    (doc/kv.md section 3), so a codec calibrated on one zero answers it for any tables."""
    codec = _bound_codecs.get(dtype)
    if codec is None:
        codec = _bound_codecs[dtype] = PageCodec.calibrate(torch.zeros(1, dtype=dtype), row_shape=())
    return codec.bound(elements * dtype.itemsize)


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in _KV_DTYPES:
        raise ChunkError(f"KV dtype {dtype} is not supported (one of {', '.join(map(str, _KV_DTYPES))})")


# ---- the serde ---------------------------------------------------------------------

class TensorZipSerializer(Serializer):
    """KV chunk -> tensorzip chunk (lossless)."""

    def __init__(self, codecs: _Codecs) -> None:
        self._codecs = codecs

    def estimate_serialized_size(self, layout_desc: MemoryLayoutDesc) -> int:
        size = _HEADER.size
        for shape, dtype in zip(layout_desc.shapes, layout_desc.dtypes):
            _check_dtype(dtype)
            dims = tuple(int(d) for d in shape)
            n_pages = _pages_of(dims)
            elements = int(np.prod(dims, dtype=np.int64)) // max(n_pages, 1)
            size += _GROUP.size + 8 * len(dims)
            size += n_pages * (_PAGE.size + _MAX_TABLES_BYTES + _page_bound(dtype, max(elements, 1)))
        return size

    def serialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> int:
        what = _chunk_name(key)
        try:
            groups: List[Group] = []
            for g, (pages, dims) in enumerate(_group_tensors(src, _bytes_of(src))):
                _check_dtype(pages.dtype)
                codecs, blobs = self._codecs.for_layout(g, dims, pages)
                if blobs is None:
                    blobs = _code_pages(codecs, pages)
                coded = [(tables, blob) for (_, tables), blob in zip(codecs, blobs)]
                groups.append((dims, coded))
                self._codecs.coded(g, dims, pages.numel() * pages.element_size(), sum(len(p) for _, p in coded),
                                   len(coded))
            out = _bytes_of(dst)
            need = _chunk_size(groups)
            if need > len(out):
                raise ChunkError(f"{need} bytes do not fit the {len(out)}-byte buffer")
            return _write_chunk(out, groups)
        except ChunkError as e:
            raise ChunkError(f"tensorzip serde: {what}: {e}") from None
        except Exception as e:
            raise ChunkError(f"tensorzip serde: {what}: {type(e).__name__}: {e}") from e


class TensorZipDeserializer(Deserializer):
    """tensorzip chunk -> KV chunk, into the destination's layout (which the chunk must match)."""

    def __init__(self, codecs: _Codecs) -> None:
        self._codecs = codecs

    def deserialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> None:
        what = f"tensorzip serde: {_chunk_name(key)}"
        groups = _read_chunk(_bytes_of(src), what)
        targets = _group_tensors(dst, _bytes_of(dst))
        if len(groups) != len(targets):
            raise ChunkError(f"{what}: {len(groups)} groups stored, the destination has {len(targets)}")
        for g, ((dims, pages), (out, want)) in enumerate(zip(groups, targets)):
            if dims != want:
                raise ChunkError(f"{what}: group {g} stored with dims {dims}, the destination's are {want}")
            for i, (tables, page) in enumerate(pages):
                codec = self._codecs.from_tables(tables, f"{what}: group {g} page {i}")
                if codec.dtype != _KV_DTYPES.get(out.dtype):
                    raise ChunkError(f"{what}: group {g} page {i} holds {codec.dtype}, the destination is {out.dtype}")
                try:
                    codec.decode(memoryview(page), out=out[i])
                except Exception as e:
                    raise ChunkError(f"{what}: group {g} page {i}: {e}") from e


def create_serde(kwargs: Dict[str, object]) -> SerdeProcessor:
    """LMCache's serde factory for ``"serde": {"type": "tensorzip", ...}``."""
    unknown = sorted(set(kwargs) - {"mode", "tables", "max_workers"})
    if unknown:
        raise ValueError(f"tensorzip serde: unknown option(s) {', '.join(unknown)} (mode, tables, max_workers)")
    tables = kwargs.get("tables")
    codecs = _Codecs(str(kwargs.get("mode", "rans")), str(tables) if tables else None)
    workers = int(kwargs.get("max_workers", 1))  # type: ignore[call-overload]
    if workers < 1:
        raise ValueError(f"tensorzip serde: max_workers must be >= 1, not {workers}")
    return AsyncSerdeProcessor(TensorZipSerializer(codecs), TensorZipDeserializer(codecs), max_workers=workers)


# ---- the file-system adapter ---------------------------------------------------------

class TensorZipFSL2AdapterConfig(FSL2AdapterConfig):
    """The ``fs`` adapter's options (``base_path``, ``relative_tmp_dir``, ``read_ahead_size``,
    ``use_odirect``)."""


class TensorZipFSL2Adapter(FSL2Adapter):
    """LMCache's ``fs`` L2 adapter that also loads chunks shorter than their buffer: a file that
    starts with a tensorzip chunk header is read into the first ``chunk_bytes`` bytes of its buffer
    (the buffer narrowed to that length); other files load as the ``fs`` adapter loads them."""

    def __init__(self, config: TensorZipFSL2AdapterConfig, l1_memory_desc: Any = None) -> None:
        # LMCache's plugin adapter type passes its L1 memory description; files need none.
        super().__init__(config)

    def submit_load_task(self, keys: List[ObjectKey], objects: List[MemoryObj]) -> L2TaskId:
        for key, obj in zip(keys, objects):
            size = self._stored_chunk_bytes(key)
            if size is not None and size < obj.get_size():
                obj.set_used_size(size)
        return super().submit_load_task(keys, objects)

    def _stored_chunk_bytes(self, key: ObjectKey) -> Optional[int]:
        try:
            path = self._key_to_path(key)
            with open(path, "rb") as f:
                size = chunk_bytes_of(f.read(_HEADER.size))
                return size if size is not None and size == os.fstat(f.fileno()).st_size else None
        except OSError:
            return None  # missing or unreadable: the load itself reports it


if SERDE_NAME not in get_registered_serde_types():
    register_serde_factory(SERDE_NAME, create_serde)
