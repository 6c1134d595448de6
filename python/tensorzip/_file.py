"""`.tzip` files: save_file (tensors streamed into the container's TensorWriter) and helpers.

A .tzip file keeps the safetensors header of the file it was made from
verbatim (doc/container.md), so `tzip decompress` gives back a safetensors
file. save_file therefore lays tensors out exactly as safetensors'
save_file would (same order, same JSON, same padding) and hands that header
to the writer, which makes `tzip decompress` of a file saved here
byte-identical to `safetensors.*.save_file` of the same dict.

The tensors go from their own memory into the writer (encoded chunk by chunk
while earlier chunks are written): no raw copy of them is written anywhere,
so a save needs only the output's size on disk (plus its temporary name).

Reading (safe_open and friends) lives in _open.py.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _core, _dtypes
from . import _tensorzip as _C
from ._core import TensorZipError, UsageError
from ._open import (  # noqa: F401  (re-exported: the package's public names live here too)
    PathLike,
    SafeOpen,
    TensorSlice,
    load_all,
    read_metadata,
    ref_paths,
    require_container,
)

_require_container = require_container
_ref_paths = ref_paths


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


def check_metadata(metadata: Optional[Mapping[str, str]], what: str = "metadata") -> None:
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError(f"{what} must be a dict of str to str, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{what} must be a dict of str to str; entry {k!r}: {type(v).__name__}")


_check_metadata = check_metadata


def opt_path(p: Any, what: str) -> str:
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


_opt_path = opt_path


def write_backend(threads: int) -> str:
    """TensorWriter's ``io`` for save_file: the I/O engine's write queue ("auto": io_uring or a
    pwrite thread) while the coding threads leave a CPU free for it, else "pwrite", each frame
    group written by the coding thread that commits it. On two busy CPUs the queue's extra thread
    only takes turns with the coders and costs more CPU time than it saves (bench/experiments/notebook.md,
    "wall time with threads: huge-page buffers")."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    coders = threads if threads > 0 else (os.cpu_count() or 1)
    return "pwrite" if coders >= cpus else "auto"


def save_sources(tensors: Mapping[str, Any], filename: PathLike, metadata: Optional[Mapping[str, str]],
                 source: Callable[[Any], Tuple[str, Tuple[int, ...], np.ndarray]],
                 level: int, threads: int, block_elems: int, chunk_bytes: int, predict: bool = True,
                 ref: Optional[PathLike] = None, ref_original: Optional[PathLike] = None) -> None:
    require_container()
    if not isinstance(predict, bool):
        raise TypeError(f"predict must be True or False, got {type(predict).__name__}")
    ref_s = opt_path(ref, "ref")
    ref_orig_s = opt_path(ref_original, "ref_original")
    if ref_s and not predict:
        raise UsageError("ref (delta against a previous checkpoint) needs predict=True")
    if ref_orig_s and not ref_s:
        raise UsageError("ref_original needs ref (the previous checkpoint's .tzip file)")
    level, threads, block_elems, chunk_bytes = _core.check_write_options(level, threads, block_elems, chunk_bytes)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a dict of name to tensor, got {type(tensors).__name__}")
    check_metadata(metadata)
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
    out = os.fspath(filename)
    with _C.TensorWriter(out, level=level, threads=threads, chunk_bytes=chunk_bytes, predict=predict,
                         metadata=dict(metadata or {}), block_elems=block_elems, force=True,
                         safetensors_header=header[8:].decode("utf-8"), ref=ref_s, ref_original=ref_orig_s,
                         io=write_backend(threads)) as w:
        for i in order:
            name, dtype, shape, _n = items[i]
            w.add(name, dtype, list(shape), views[i])
        w.finish()  # encode + write + fsync + rename (GIL released); nothing at `out` before


def _scrub(e: BaseException, path: str, what: str) -> BaseException:
    """e with the temporary path in its message replaced by `what` (for save()/load() of bytes)."""
    msg = str(e).replace(path, what)
    if msg == str(e):
        return e
    new = type(e)(msg)
    for attr in ("errno", "strerror"):
        if getattr(e, attr, None) is not None:
            setattr(new, attr, getattr(e, attr))
    return new


def save_to_bytes(save_file: Callable[..., None], tensors: Mapping[str, Any],
                  metadata: Optional[Mapping[str, str]], level: int, threads: int) -> bytes:
    """The bytes of the ``.tzip`` file that ``save_file`` (numpy's or torch's) writes."""
    with tempfile.TemporaryDirectory(prefix="tensorzip-") as d:
        path = os.path.join(d, "t.tzip")
        try:
            save_file(tensors, path, metadata, level=level, threads=threads)
        except TensorZipError as e:
            raise _scrub(e, path, "(the .tzip bytes)") from None
        with open(path, "rb") as f:
            return f.read()


def load_from_bytes(data: bytes, load_file: Callable[[str], Any]) -> Any:
    """``load_file(path)`` of a ``.tzip`` (or safetensors) file held in memory (through a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="tensorzip-") as d:
        path = os.path.join(d, "t.tzip")
        with open(path, "wb") as f:
            f.write(data)
        try:
            return load_file(path)
        except TensorZipError as e:
            raise _scrub(e, path, "(the given bytes)") from None


def export_safetensors(filename: PathLike, out: PathLike, threads: int = 0, overwrite: bool = False,
                       refs: Any = None) -> None:
    """Writes the safetensors file a .tzip file was made from (byte-identical), like `tzip decompress`.
    ``refs``: locations of the .tzip files a delta file references (default: the recorded paths)."""
    require_container()
    r = _C.Reader(os.fspath(filename), threads, ref_paths(refs), True)
    try:
        r.export_safetensors(os.fspath(out), threads, overwrite)
    finally:
        r.close()


def compress_safetensors(src: PathLike, dst: PathLike, level: int = 0, threads: int = 0,
                         overwrite: bool = False, *, predict: bool = True, ref: Optional[PathLike] = None,
                         ref_original: Optional[PathLike] = None,
                         user_metadata: Optional[Mapping[str, str]] = None) -> Tuple[int, int]:
    """Compresses a safetensors file into a .tzip file, like `tzip compress`. Returns (raw bytes, file bytes).
    ``predict``/``ref``/``ref_original`` as in :func:`tensorzip.torch.save_file`; ``user_metadata``
    as ``tzip compress --meta`` (kept in the .tzip only; shown by ``safe_open().metadata()``)."""
    require_container()
    check_metadata(user_metadata, "user_metadata")
    ref_s = opt_path(ref, "ref")
    ref_orig_s = opt_path(ref_original, "ref_original")
    raw, size = _C.compress_file(os.fspath(src), os.fspath(dst), level=level, threads=threads, force=overwrite,
                                 predict=bool(predict), ref=ref_s, ref_original=ref_orig_s,
                                 user_metadata=dict(user_metadata or {}))
    return int(raw), int(size)


def compress_folder(src: PathLike, dst: PathLike, level: int = 0, threads: int = 0, overwrite: bool = False, *,
                    predict: bool = True) -> None:
    """Compresses a model folder, like ``tzip compress DIR -o DST``: every ``x.safetensors`` becomes
    ``x.tzip``, every other file (configs, tokenizer, ``model.safetensors.index.json``) is copied;
    the folder is built under a temporary name and renamed. ``tensorzip.transformers.from_pretrained``
    loads the result."""
    require_container()
    _C.compress_folder(os.fspath(src), os.fspath(dst), level=level, threads=threads, force=overwrite,
                       predict=bool(predict))


def decompress_folder(src: PathLike, dst: PathLike, threads: int = 0, overwrite: bool = False) -> None:
    """Restores a compressed model folder, like ``tzip decompress DIR -o DST`` (byte-identical)."""
    require_container()
    _C.decompress_folder(os.fspath(src), os.fspath(dst), threads=threads, force=overwrite)
