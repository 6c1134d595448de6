"""`.tzip` files: save_file (safetensors layout, then the C++ container writer) and safe_open.

A .tzip file keeps the safetensors header of the file it was made from
verbatim (doc/container.md), so `tzip decompress` gives back a safetensors
file. save_file therefore lays tensors out exactly as safetensors'
save_file would (same order, same JSON, same padding), which makes
`tzip decompress` of a file saved here byte-identical to
`safetensors.*.save_file` of the same dict.
"""
from __future__ import annotations

import json
import math
import os
import struct
import tempfile
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, _dtypes
from . import _tensorzip as _C
from ._core import TensorZipError, UsageError

PathLike = Union[str, "os.PathLike[str]"]


def _require_container() -> None:
    if not getattr(_C, "HAVE_CONTAINER", False):
        raise TensorZipError(
            "this tensorzip build has no .tzip container support (src/container was not built); "
            "only tensorzip.compress/decompress are available")


def safetensors_header(items: Sequence[Tuple[str, str, Tuple[int, ...], int]],
                       metadata: Optional[Mapping[str, str]]) -> Tuple[bytes, List[int]]:
    """The safetensors header (8-byte length + JSON padded with spaces to 8 bytes) for
    (name, dtype, shape, nbytes) items, and the order in which their data follows.

    Same rules as safetensors' Rust `prepare`/`serialize`: tensors sorted by
    dtype (descending enum order), then by name; `__metadata__` first.
    """
    order = sorted(range(len(items)), key=lambda i: (-_dtypes.lookup(items[i][1]).rank, items[i][0]))
    header: Dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    offset = 0
    for i in order:
        name, dtype, shape, nbytes = items[i]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text, order


def _check_metadata(metadata: Optional[Mapping[str, str]]) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must be a dict of str to str; entry {k!r}: {type(v).__name__}")


def _ref_paths(refs: Any, what: str = "refs") -> List[str]:
    """None, one path or a sequence of paths -> list of str."""
    if refs is None:
        return []
    if isinstance(refs, (str, bytes, os.PathLike)):
        refs = [refs]
    out = []
    for r in refs:
        if isinstance(r, bytes):
            r = os.fsdecode(r)
        if not isinstance(r, (str, os.PathLike)):
            raise TypeError(f"{what} must be a path or a list of paths, got {type(r).__name__}")
        out.append(os.fspath(r))
    return out


def _opt_path(p: Any, what: str) -> str:
    if p is None:
        return ""
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not isinstance(p, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike), got {type(p).__name__}")
    s = os.fspath(p)
    if not s:
        raise UsageError(f"{what} must not be empty (use None for no {what})")
    return s


def save_sources(tensors: Mapping[str, Any], filename: PathLike, metadata: Optional[Mapping[str, str]],
                 source: Callable[[Any], Tuple[str, Tuple[int, ...], np.ndarray]],
                 level: int, threads: int, block_elems: int, chunk_bytes: int, predict: bool = True,
                 ref: Optional[PathLike] = None, ref_original: Optional[PathLike] = None) -> None:
    _require_container()
    if not isinstance(predict, bool):
        raise TypeError(f"predict must be True or False, got {type(predict).__name__}")
    ref_s = _opt_path(ref, "ref")
    ref_orig_s = _opt_path(ref_original, "ref_original")
    if ref_s and not predict:
        raise UsageError("ref (delta against a previous checkpoint) needs predict=True")
    if ref_orig_s and not ref_s:
        raise UsageError("ref_original needs ref (the previous checkpoint's .tzip file)")
    level = _core.check_int(level, "level", -1, 3)
    threads = _core.check_int(threads, "threads", 0, 1 << 16)
    block_elems = _core.check_int(block_elems, "block_elems", 0, 1 << 20)
    chunk_bytes = _core.check_int(chunk_bytes, "chunk_bytes", 0, 1 << 30)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a dict of name to tensor, got {type(tensors).__name__}")
    _check_metadata(metadata)
    items = []
    views = []
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        if name == "__metadata__":
            raise UsageError("'__metadata__' is reserved and cannot be a tensor name")
        dtype, shape, flat = source(x)
        items.append((name, dtype, shape, int(flat.nbytes)))
        views.append(flat)
    header, order = safetensors_header(items, metadata)

    # The container writer (tz::container::compress_file) reads a safetensors
    # file, so the tensors go through a temporary one beside the output.
    out = os.fspath(filename)
    folder, base = os.path.split(os.path.abspath(out))
    tmp = os.path.join(folder, f".{base}.{os.getpid()}-{uuid.uuid4().hex[:8]}.safetensors")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for i in order:
                if views[i].nbytes:
                    f.write(views[i].data)
        _C.compress_file(tmp, out, level=level, block_elems=block_elems, threads=threads,
                         chunk_bytes=chunk_bytes, force=True, predict=predict, ref=ref_s,
                         ref_original=ref_orig_s)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


class TensorSlice:
    """Lazy view of one tensor of an open file; indexing reads only the bytes it needs."""

    def __init__(self, handle: "SafeOpen", index: int, name: str, dtype: str, shape: Tuple[int, ...]):
        self._h = handle
        self._index = index
        self._name = name
        self._dtype = dtype
        self._shape = shape

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __getitem__(self, key: Any) -> Any:
        return self._h._read_slice(self._index, self._dtype, self._shape, key)

    def __repr__(self) -> str:
        return f"TensorSlice({self._name!r}, dtype={self._dtype}, shape={list(self._shape)})"


def save_to_bytes(save_file: Callable[..., None], tensors: Mapping[str, Any],
                  metadata: Optional[Mapping[str, str]], level: int, threads: int) -> bytes:
    """The bytes of the ``.tzip`` file that ``save_file`` (numpy's or torch's) writes."""
    with tempfile.TemporaryDirectory(prefix="tensorzip-") as d:
        path = os.path.join(d, "t.tzip")
        save_file(tensors, path, metadata, level=level, threads=threads)
        with open(path, "rb") as f:
            return f.read()


def load_from_bytes(data: bytes, load_file: Callable[[str], Any]) -> Any:
    """``load_file(path)`` of a ``.tzip`` file held in memory (through a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="tensorzip-") as d:
        path = os.path.join(d, "t.tzip")
        with open(path, "wb") as f:
            f.write(data)
        return load_file(path)


def _normalize_key(key: Any, shape: Tuple[int, ...]) -> List[Union[int, slice]]:
    if not isinstance(key, tuple):
        key = (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for k in key if k is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices: tensor is {len(shape)}-dimensional, but {n_real} were indexed")
    out: List[Union[int, slice]] = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (len(shape) - n_real))
        elif isinstance(k, slice):
            out.append(k)
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            out.append(int(k))
        else:
            raise TypeError(f"slices support ints, slices and '...', got {type(k).__name__}")
    out.extend([slice(None)] * (len(shape) - len(out)))
    return out


class SafeOpen:
    """An open .tzip file (see :func:`tensorzip.safe_open`)."""

    def __init__(self, filename: PathLike, framework: str = "np", device: Any = "cpu", threads: int = 0,
                 refs: Any = None):
        _require_container()
        fw = _core.normalize_framework(framework)
        if fw is None:
            raise ValueError("framework must be given: 'pt' (torch) or 'np' (numpy)")
        if fw == "np" and str(device) != "cpu":
            raise ValueError(f"numpy arrays live on the CPU; device={device!r} needs framework='pt'")
        self._fw = fw
        self._device = device
        self._threads = _core.check_int(threads, "threads", 0, 1 << 16)
        # A file with predicted tensors from other files (delta against a
        # previous checkpoint) needs them: they are located (refs, else the
        # recorded relative paths) and their checksums checked now, so a
        # missing or wrong reference fails here with a clear message.
        self._r = _C.Reader(os.fspath(filename), self._threads, _ref_paths(refs), True)
        self._entries = {}
        for i, (name, dtype, shape, raw, _comp) in enumerate(self._r.tensors()):
            self._entries[name] = (i, dtype, tuple(int(s) for s in shape), raw)
        self._offset_order = [t[0] for t in self._r.tensors()]

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._r.close()

    # -- safetensors API ---------------------------------------------------
    def keys(self) -> List[str]:
        """Tensor names, sorted."""
        return sorted(self._entries)

    def offset_keys(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        return list(self._offset_order)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The file's `__metadata__` (None when it has none)."""
        m = dict(self._r.metadata())
        return m or None

    def references(self) -> List[Dict[str, Any]]:
        """Other .tzip files this file's predicted tensors need (a delta file's previous
        checkpoint, or the file holding a cast source): ``[{"file": path relative to this
        file's folder, as recorded, "xxh64": whole-file checksum}]``. Empty for a standalone file."""
        return [{"file": f, "xxh64": int(x)} for f, x in self._r.references()]

    def predictions(self) -> Dict[str, Dict[str, Any]]:
        """Which tensors are stored as residuals against a prediction (like ``tzip inspect``):
        ``{name: {"kind": "cast" | "delta", "source": tensor name, "file": None | recorded path}}``.
        "cast": the tensor is the round-to-nearest-even cast of the FP32 tensor ``source``
        (in this file when ``file`` is None); "delta": XOR against the tensor of the same name in
        the previous checkpoint ``file``. Tensors not listed are stored as themselves."""
        refs = self._r.references()
        out: Dict[str, Dict[str, Any]] = {}
        for name, kind, src, ref in self._r.predictions():
            out[name] = {"kind": kind, "source": src, "file": None if ref < 0 else refs[ref][0]}
        return out

    def format_version(self) -> Tuple[int, int]:
        """The .tzip container version: (1, 0) standalone, (2, 0) with predicted tensors."""
        major, minor = self._r.version()
        return int(major), int(minor)

    def _entry(self, name: str) -> Tuple[int, str, Tuple[int, ...], int]:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self._r.path}") from None

    def get_tensor(self, name: str) -> Any:
        """Reads one tensor (only its own compressed bytes are read)."""
        index, dtype, shape, raw = self._entry(name)
        if _dtypes.lookup(dtype).itemsize * math.prod(shape) != raw:
            raise _core.CorruptDataError(f"{self._r.path}: tensor {name!r}: size does not match its shape")
        out, flat = _core.empty_output(dtype, shape, self._fw)
        self._r.read_tensor(index, flat)
        return _core.to_device(out, self._device) if self._fw == "pt" else out

    def _get_all(self) -> Dict[str, Any]:
        """Every tensor, in data order, decoded together: the frames of all of them in
        parallel on the file's threads (many small tensors scale like one large one)."""
        names = self._offset_order
        outs, indices, flats = {}, [], []
        for name in names:
            index, dtype, shape, raw = self._entry(name)
            if _dtypes.lookup(dtype).itemsize * math.prod(shape) != raw:
                raise _core.CorruptDataError(f"{self._r.path}: tensor {name!r}: size does not match its shape")
            out, flat = _core.empty_output(dtype, shape, self._fw)
            outs[name] = out
            if flat.nbytes:
                indices.append(index)
                flats.append(flat)
        self._r.read_tensors(indices, flats)
        if self._fw == "pt":
            return {k: _core.to_device(v, self._device) for k, v in outs.items()}
        return outs

    def get_slice(self, name: str) -> TensorSlice:
        index, dtype, shape, _raw = self._entry(name)
        return TensorSlice(self, index, name, dtype, shape)

    def _read_slice(self, index: int, dtype: str, shape: Tuple[int, ...], key: Any) -> Any:
        itemsize = _dtypes.lookup(dtype).itemsize
        key_n = _normalize_key(key, shape)
        # Per dimension: the selected indices; the box [lo, hi] that holds them.
        sel: List[np.ndarray] = []
        keep: List[bool] = []
        for k, n in zip(key_n, shape):
            if isinstance(k, int):
                i = k + n if k < 0 else k
                if not 0 <= i < n:
                    raise IndexError(f"index {k} is out of bounds for a dimension of size {n}")
                sel.append(np.array([i], dtype=np.int64))
                keep.append(False)
            else:
                sel.append(np.arange(*k.indices(n), dtype=np.int64))
                keep.append(True)
        out_shape = tuple(len(s) for s, kp in zip(sel, keep) if kp)
        if any(len(s) == 0 for s in sel):
            out, _ = _core.empty_output(dtype, out_shape, self._fw)
            return out
        strides = [itemsize] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        lo = [int(s.min()) for s in sel]
        hi = [int(s.max()) for s in sel]
        first = sum(l * st for l, st in zip(lo, strides))
        last = sum(h * st for h, st in zip(hi, strides)) + itemsize
        # Only the bytes between the first and the last selected element are
        # decoded (the container decodes just the blocks covering them).
        raw = np.empty(last - first, dtype=np.uint8)
        self._r.read_range(index, first, raw)
        box_shape = tuple(h - l + 1 for l, h in zip(lo, hi)) + (itemsize,)
        box = np.lib.stride_tricks.as_strided(raw, shape=box_shape, strides=tuple(strides) + (1,), writeable=False)
        picked = box[np.ix_(*[s - l for s, l in zip(sel, lo)], np.arange(itemsize))]
        picked = np.ascontiguousarray(picked).reshape(out_shape + (itemsize,))
        out, flat = _core.empty_output(dtype, out_shape, self._fw)
        flat[...] = picked.reshape(-1)
        return _core.to_device(out, self._device) if self._fw == "pt" else out


def load_all(filename: PathLike, framework: str, device: Any = "cpu", threads: int = 0,
             refs: Any = None) -> Dict[str, Any]:
    with SafeOpen(filename, framework=framework, device=device, threads=threads, refs=refs) as f:
        return f._get_all()


def read_metadata(filename: PathLike) -> Optional[Dict[str, str]]:
    _require_container()
    r = _C.Reader(os.fspath(filename), 1)  # header only: references are not needed
    try:
        return dict(r.metadata()) or None
    finally:
        r.close()


def export_safetensors(filename: PathLike, out: PathLike, threads: int = 0, overwrite: bool = False,
                       refs: Any = None) -> None:
    """Writes the safetensors file a .tzip file was made from (byte-identical), like `tzip decompress`.
    ``refs``: locations of the .tzip files a delta file references (default: the recorded paths)."""
    _require_container()
    r = _C.Reader(os.fspath(filename), threads, _ref_paths(refs), True)
    try:
        r.export_safetensors(os.fspath(out), threads, overwrite)
    finally:
        r.close()


def compress_safetensors(src: PathLike, dst: PathLike, level: int = 0, threads: int = 0,
                         overwrite: bool = False, *, predict: bool = True, ref: Optional[PathLike] = None,
                         ref_original: Optional[PathLike] = None) -> Tuple[int, int]:
    """Compresses a safetensors file into a .tzip file, like `tzip compress`. Returns (raw bytes, file bytes).
    ``predict``/``ref``/``ref_original`` as in :func:`tensorzip.torch.save_file`."""
    _require_container()
    ref_s = _opt_path(ref, "ref")
    ref_orig_s = _opt_path(ref_original, "ref_original")
    raw, size = _C.compress_file(os.fspath(src), os.fspath(dst), level=level, threads=threads, force=overwrite,
                                 predict=bool(predict), ref=ref_s, ref_original=ref_orig_s)
    return int(raw), int(size)
