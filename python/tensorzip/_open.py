"""safe_open: lazy reading of ``.tzip`` files and of plain ``.safetensors`` files.

A file is recognised by its first bytes (``TZIP``: a .tzip file; an 8-byte header length then
``{``: safetensors). A .tzip file is read through the C++ container Reader (frames decoded, every
checksum checked, delta references resolved); a safetensors file's header is validated by the
same C++ parser that ``tzip compress`` uses, and its tensors are read with ``preadv`` straight
into the output tensors' memory. Both offer the same methods, so code that reads old
(safetensors) and new (.tzip) files needs one path.
"""
from __future__ import annotations

import errno as _errno
import os
import stat as _stat
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, _dtypes
from . import _tensorzip as _C
from ._core import TensorZipError

PathLike = Union[str, "os.PathLike[str]"]

TZIP_MAGIC = b"TZIP"


def require_container() -> None:
    if not getattr(_C, "HAVE_CONTAINER", False):
        raise TensorZipError(
            "this tensorzip build has no .tzip container support (src/container was not built); "
            "only tensorzip.compress/decompress are available")


def os_error(e: OSError, path: str, what: str) -> Exception:
    """An OSError of Python's own I/O as tensorzip's class for it (FileNotFoundError /
    PermissionError subclasses of TensorZipIOError), with errno, strerror and filename."""
    cls = {_errno.ENOENT: _C.TensorZipFileNotFoundError, _errno.EACCES: _C.TensorZipPermissionError,
           _errno.EPERM: _C.TensorZipPermissionError}.get(e.errno, _C.TensorZipIOError)
    exc = cls(f"{path}: {what}: {e.strerror or e}")
    exc.errno, exc.strerror, exc.filename = e.errno, e.strerror, path
    return exc


def ref_paths(refs: Any, what: str = "refs") -> List[str]:
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


def file_kind(path: str) -> str:
    """"tzip" or "safetensors", from the file's first bytes; CorruptDataError for anything else."""
    # O_NONBLOCK: a FIFO or a device never blocks the open; only regular files are read
    # (the rule of the container's readers, with their messages).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise os_error(e, path, "cannot open") from None
    try:
        st = os.fstat(fd)
        if _stat.S_ISDIR(st.st_mode):
            raise _core.UsageError(f"{path}: is a directory, expected a file")
        if not _stat.S_ISREG(st.st_mode):
            raise _core.UsageError(f"{path}: not a regular file")
        head = os.pread(fd, 9, 0)
        size = st.st_size
    except OSError as e:
        raise os_error(e, path, "cannot read") from None
    finally:
        os.close(fd)
    if head[:4] == TZIP_MAGIC:
        return "tzip"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    raise _core.CorruptDataError(f"{path}: not a .tzip or safetensors file (it starts with {head[:8]!r})")


class _SafetensorsFile:
    """A plain safetensors file with the container Reader's read interface (used by SafeOpen)."""

    def __init__(self, path: str):
        info = _C.safetensors_info(path)  # validated by the container's parser (CorruptDataError)
        self.path = path
        self._start = int(info["data_start"])
        self._meta = dict(info["metadata"])
        self._tensors = [(n, d, tuple(int(x) for x in s), int(a), int(b)) for n, d, s, a, b in info["tensors"]]
        try:
            self._fd: Optional[int] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise os_error(e, path, "cannot open") from None

    def tensors(self) -> List[Tuple[str, str, Tuple[int, ...], int, int]]:
        return [(n, d, s, b - a, b - a) for n, d, s, a, b in self._tensors]

    def metadata(self) -> Dict[str, str]:
        return dict(self._meta)

    def user_metadata(self) -> Dict[str, str]:
        return {}

    def references(self) -> list:
        return []

    def predictions(self) -> list:
        return []

    def version(self) -> None:
        return None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def read_tensor(self, index: int, out: np.ndarray) -> None:
        _n, _d, _s, a, b = self._tensors[index]
        if out.nbytes != b - a:
            raise _core.UsageError(f"output buffer has {out.nbytes} bytes, tensor has {b - a}")
        self._pread_into(self._start + a, out)

    def read_tensors(self, indices: List[int], outs: List[np.ndarray]) -> None:
        for index, out in zip(indices, outs):
            self.read_tensor(index, out)

    def read_range(self, index: int, offset: int, out: np.ndarray) -> None:
        _n, _d, _s, a, b = self._tensors[index]
        if offset < 0 or offset + out.nbytes > b - a:
            raise _core.UsageError("byte range past the end of the tensor")
        self._pread_into(self._start + a + offset, out)

    def _pread_into(self, pos: int, out: np.ndarray) -> None:
        fd = self._fd
        if fd is None:
            raise ValueError("I/O operation on a closed tensorzip file")
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            try:
                n = os.preadv(fd, [view[done:]], pos + done)
            except OSError as e:
                raise os_error(e, self.path, "read failed") from None
            if n == 0:
                raise _core.CorruptDataError(f"{self.path}: truncated: the data of a tensor ends past the end of the "
                                             f"file")
            done += n


def _open_backend(path: str, threads: int, refs: Any) -> Any:
    if file_kind(path) == "safetensors":
        return _SafetensorsFile(path)
    # A file with predicted tensors from other files (delta against a previous checkpoint)
    # needs them: they are located (refs, else the recorded relative paths) and their checksums
    # checked now, so a missing or wrong reference fails here with a clear message.
    return _C.Reader(path, threads, ref_paths(refs), True)


def normalize_key(key: Any, shape: Tuple[int, ...]) -> List[Union[int, slice]]:
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


class TensorSlice:
    """Lazy view of one tensor of an open file; indexing reads only the bytes it needs.

    ``get_shape()`` and ``get_dtype()`` give the file's shape and dtype string, as safetensors'
    slices do (for F4, the shape counts 4-bit elements; indexing a torch F4 slice indexes the
    ``float4_e2m1fn_x2`` tensor, whose last dimension is half of it).
    """

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
        return self._h._read_slice(self._index, self._name, self._dtype, self._shape, key)

    def __repr__(self) -> str:
        return f"TensorSlice({self._name!r}, dtype={self._dtype}, shape={list(self._shape)})"


class SafeOpen:
    """An open .tzip or safetensors file (see :func:`tensorzip.safe_open`)."""

    def __init__(self, filename: PathLike, framework: str = "np", device: Any = "cpu", threads: int = 0,
                 refs: Any = None):
        require_container()
        fw = _core.normalize_framework(framework)
        if fw is None:
            raise ValueError("framework must be given: 'pt' (torch) or 'np' (numpy)")
        if fw == "np" and str(device) != "cpu":
            raise ValueError(f"numpy arrays live on the CPU; device={device!r} needs framework='pt'")
        self._fw = fw
        self._device = device
        self._threads = _core.check_threads(threads)
        path = os.fspath(filename)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        self._r = _open_backend(path, self._threads, refs)
        # One pass over the table (a file may hold 10^5 tensors); both backends give shapes as
        # tuples of ints and sizes as ints.
        table = self._r.tensors()
        self._entries: Dict[str, Tuple[int, str, Tuple[int, ...], int]] = {
            name: (i, dtype, shape, raw) for i, (name, dtype, shape, raw, _comp) in enumerate(table)}
        self._offset_order = [t[0] for t in table]

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

    def _stored_sizes(self) -> List[Tuple[str, int]]:
        """(name, bytes the tensor's data takes in the file: its compressed frames in a .tzip file)
        for every tensor, in the order of their data in the file."""
        return [(name, int(comp)) for name, _d, _s, _raw, comp in self._r.tensors()]

    def metadata(self) -> Optional[Dict[str, str]]:
        """The file's ``__metadata__`` plus, for a .tzip file, its user metadata (``tzip compress
        --meta``, ``compress_safetensors(user_metadata=)``; a key of both: ``__metadata__``'s value).
        None when there is none."""
        m = dict(self._r.user_metadata())
        m.update(self._r.metadata())
        return m or None

    def user_metadata(self) -> Dict[str, str]:
        """Only the .tzip file's own user metadata (not part of the restored safetensors file)."""
        return dict(self._r.user_metadata())

    def file_format(self) -> str:
        """``"tzip"`` or ``"safetensors"``: what the opened file is."""
        return "safetensors" if isinstance(self._r, _SafetensorsFile) else "tzip"

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

    def format_version(self) -> Optional[Tuple[int, int]]:
        """The .tzip container version: (1, 0) standalone, (2, 0) with predicted tensors; None for a
        safetensors file."""
        v = self._r.version()
        if v is None:
            return None
        return int(v[0]), int(v[1])

    def _entry(self, name: str) -> Tuple[int, str, Tuple[int, ...], int]:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self._r.path}") from None

    def _check_size(self, name: str, dtype: str, shape: Tuple[int, ...], raw: int) -> None:
        try:
            ok = _dtypes.file_nbytes(dtype, shape) == raw
        except ValueError:
            ok = False
        if not ok:
            raise _core.CorruptDataError(f"{self._r.path}: tensor {name!r}: size does not match its shape")

    def get_tensor(self, name: str) -> Any:
        """Reads one tensor (only its own compressed bytes are read)."""
        return self.get_tensor_in(name, None)

    def get_tensor_in(self, name: str, memory: Optional[Callable[[int], Optional[np.ndarray]]]) -> Any:
        """:meth:`get_tensor`, decoded into ``memory(nbytes)`` when that gives an array (torch
        only; see ``_core.empty_output``; ``tensorzip._buffer_pool.BufferPool.memory`` is one)."""
        index, dtype, shape, raw = self._entry(name)
        self._check_size(name, dtype, shape, raw)
        mem = memory(raw) if memory is not None and raw and self._fw == "pt" else None
        out, flat = _core.empty_output(dtype, shape, self._fw, mem)
        del mem  # the tensor holds the array now: its memory goes back when the tensor is freed
        if flat.nbytes:
            self._r.read_tensor(index, flat)
        out = _core.finish_output(dtype, shape, self._fw, out)
        return _core.to_device(out, self._device) if self._fw == "pt" else out

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in data order (safetensors' ``get_tensors``): for a .tzip file, a whole-file
        read, with every check of ``tzip verify`` (every frame, padding byte and the whole-file
        checksum; ``load_file`` is this), decoded in parallel on the file's ``threads``, so many
        small tensors load as fast as one large one."""
        outs: Dict[str, Any] = {}
        indices: List[int] = []
        flats: List[np.ndarray] = []
        for name in self._offset_order:
            index, dtype, shape, raw = self._entry(name)
            self._check_size(name, dtype, shape, raw)
            out, flat = _core.empty_output(dtype, shape, self._fw)
            outs[name] = (dtype, shape, out)
            if flat.nbytes:
                indices.append(index)
                flats.append(flat)
        if isinstance(self._r, _SafetensorsFile):
            self._r.read_tensors(indices, flats)
        else:
            self._r.read_all(indices, flats)
        done = {}
        for name, (dtype, shape, out) in outs.items():
            out = _core.finish_output(dtype, shape, self._fw, out)
            done[name] = _core.to_device(out, self._device) if self._fw == "pt" else out
        return done

    def get_slice(self, name: str) -> TensorSlice:
        index, dtype, shape, _raw = self._entry(name)
        return TensorSlice(self, index, name, dtype, shape)

    def _read_slice(self, index: int, name: str, dtype: str, file_shape: Tuple[int, ...], key: Any) -> Any:
        d = _dtypes.lookup(dtype)
        if d.packed != 1 and self._fw == "np":  # unpacked F4 in NumPy: read it whole, index it there
            full = self.get_tensor(name)
            out = full[tuple(normalize_key(key, file_shape))]
            return np.ascontiguousarray(out)
        shape = _dtypes.torch_shape_of_file(dtype, file_shape) if self._fw == "pt" else file_shape
        itemsize = d.itemsize
        key_n = normalize_key(key, shape)
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
        out_file_shape = _dtypes.file_shape_of_torch(dtype, out_shape) if (self._fw == "pt" and out_shape) \
            else out_shape
        if any(len(s) == 0 for s in sel):
            out, _ = _core.empty_output(dtype, out_file_shape, self._fw)
            return out
        if all(kp and len(s) == n and (n < 2 or s[1] - s[0] == 1) for s, kp, n in zip(sel, keep, shape)):
            return self.get_tensor(name)  # the whole tensor: decoded straight into the output
        strides = [itemsize] * len(shape)
        for dim in range(len(shape) - 2, -1, -1):
            strides[dim] = strides[dim + 1] * shape[dim + 1]
        lo = [int(s.min()) for s in sel]
        hi = [int(s.max()) for s in sel]
        first = sum(lv * st for lv, st in zip(lo, strides))
        last = sum(h * st for h, st in zip(hi, strides)) + itemsize
        if out_shape and _contiguous_rows(sel, keep, shape):
            # Whole rows of the leading dimension, step 1 (a shard of dim 0): decoded straight
            # into the output's memory.
            out, flat = _core.empty_output(dtype, out_file_shape, self._fw)
            self._r.read_range(index, first, flat)
            return _core.to_device(out, self._device) if self._fw == "pt" else out
        # Only the bytes between the first and the last selected element are
        # decoded (the container decodes just the blocks covering them).
        raw = np.empty(last - first, dtype=np.uint8)
        self._r.read_range(index, first, raw)
        box_shape = tuple(h - lv + 1 for lv, h in zip(lo, hi)) + (itemsize,)
        box = np.lib.stride_tricks.as_strided(raw, shape=box_shape, strides=tuple(strides) + (1,), writeable=False)
        picked = box[np.ix_(*[s - lv for s, lv in zip(sel, lo)], np.arange(itemsize))]
        picked = np.ascontiguousarray(picked).reshape(out_shape + (itemsize,))
        out, flat = _core.empty_output(dtype, out_file_shape, self._fw)
        flat[...] = picked.reshape(-1)
        return _core.to_device(out, self._device) if self._fw == "pt" else out


def _contiguous_rows(sel: Sequence[np.ndarray], keep: Sequence[bool], shape: Tuple[int, ...]) -> bool:
    """The selection is rows [a, b) (step 1) of dim 0 with every later dimension whole."""
    s0 = sel[0]
    if not keep[0] or (len(s0) > 1 and not np.all(np.diff(s0) == 1)):
        return False
    return all(kp and len(s) == n and (n < 2 or bool(np.all(np.diff(s) == 1)))
               for s, kp, n in zip(sel[1:], keep[1:], shape[1:]))


def load_all(filename: PathLike, framework: str, device: Any = "cpu", threads: int = 0,
             refs: Any = None) -> Dict[str, Any]:
    with SafeOpen(filename, framework=framework, device=device, threads=threads, refs=refs) as f:
        return f.get_tensors()


def read_metadata(filename: PathLike) -> Optional[Dict[str, str]]:
    """``safe_open(filename).metadata()`` without opening references (needs no reference file)."""
    require_container()
    path = os.fspath(filename)
    if file_kind(path) == "safetensors":
        return dict(_C.safetensors_info(path)["metadata"]) or None
    r = _C.Reader(path, 1)  # header only: references are not needed
    try:
        m = dict(r.user_metadata())
        m.update(r.metadata())
        return m or None
    finally:
        r.close()

