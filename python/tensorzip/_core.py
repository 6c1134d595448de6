"""Framework-neutral core: tensors as (dtype string, shape, uint8 view of their bytes).

NumPy arrays and torch tensors are turned into flat uint8 NumPy views of
their own memory (no copy when they are already C-contiguous and on the CPU),
which the C++ module reads through the buffer protocol with the GIL released.
"""
from __future__ import annotations

import json
import os
import secrets
import struct
import sys
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import _dtypes
from ._tensorzip import (  # noqa: F401  (re-exported)
    CorruptDataError,
    TensorZipError,
    TensorZipExistsError,
    TensorZipFileNotFoundError,
    TensorZipIOError,
    TensorZipPermissionError,
    UsageError,
)
from . import _tensorzip as _C

Shape = Tuple[int, ...]


def _os_error_str(self: OSError) -> str:
    # tensorzip's OS errors carry errno / strerror / filename like any OSError, but print their
    # own message (which says what failed and why) rather than "[Errno N] strerror: 'filename'".
    if len(self.args) == 1 and isinstance(self.args[0], str):
        return self.args[0]
    return OSError.__str__(self)


TensorZipIOError.__str__ = _os_error_str  # type: ignore[method-assign]
TensorZipExistsError.__str__ = _os_error_str  # type: ignore[method-assign]


# ---- framework adapters ----------------------------------------------------

def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def numpy_source(x: Any) -> Tuple[str, Shape, np.ndarray]:
    """(dtype string, file shape, flat uint8 view) of a NumPy array (copied only if not C-contiguous;
    F4 arrays are packed two elements per byte)."""
    if not isinstance(x, np.ndarray):
        if isinstance(x, np.generic):
            x = np.asarray(x)
        else:
            raise TypeError(f"expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype.byteorder == ">" or (x.dtype.byteorder == "=" and sys.byteorder == "big"):
        x = x.astype(x.dtype.newbyteorder("<"))  # files and frames hold little-endian data
    name = _dtypes.name_of_numpy(x.dtype.newbyteorder("="))
    shape = tuple(int(s) for s in x.shape)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if _dtypes.lookup(name).packed != 1:
        return name, shape, _dtypes.pack_nibbles(x.reshape(-1).view(np.uint8))
    return name, shape, x.reshape(-1).view(np.uint8)


def torch_source(x: Any) -> Tuple[str, Shape, np.ndarray]:
    """(dtype string, file shape, flat uint8 view) of a torch tensor (copied only if not contiguous or
    not on the CPU). Sparse and meta tensors are refused with safetensors' messages."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    name = _dtypes.name_of_torch(x.dtype)
    shape = _dtypes.file_shape_of_torch(name, tuple(int(s) for s in x.shape))
    t = x.detach()
    if t.layout != torch.strided:
        raise ValueError(sparse_message([]))
    if t.device.type != "cpu":
        t = t.to("cpu")  # a meta tensor with data raises torch's NotImplementedError, as in safetensors
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.numel() == 0:  # empty tensors may carry any strides; nothing to view
        return name, shape, np.empty(0, dtype=np.uint8)
    t = t.contiguous()
    flat = t.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return name, shape, flat.numpy()


def sparse_message(names: Sequence[str]) -> str:
    """safetensors' message for sparse tensors (safetensors.torch._evaluate_tensors_for_save)."""
    return (f"You are trying to save a sparse tensors: `{list(names)}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed.")


def source_of(x: Any) -> Tuple[str, Shape, np.ndarray, str]:
    if is_torch_tensor(x):
        return (*torch_source(x), "pt")
    if isinstance(x, (np.ndarray, np.generic)):
        return (*numpy_source(x), "np")
    raise TypeError(f"expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")


def normalize_framework(framework: Optional[str]) -> Optional[str]:
    if framework is None:
        return None
    f = framework.lower()
    if f in ("pt", "torch", "pytorch"):
        return "pt"
    if f in ("np", "numpy"):
        return "np"
    raise ValueError(f"unsupported framework {framework!r}: use 'pt' (torch) or 'np' (numpy)")


def empty_output(dtype: str, shape: Shape, framework: str,
                 memory: Optional[np.ndarray] = None) -> Tuple[Any, np.ndarray]:
    """A new array/tensor for a file's tensor of dtype and (file) shape, and a flat writable uint8 view
    of its memory, to decode into; pass the first to :func:`finish_output` once it is filled.
    ``memory`` (torch only): a writable uint8 array of exactly the tensor's bytes that the tensor is
    made over (``torch.from_numpy``: the tensor keeps the array) instead of new memory."""
    d = _dtypes.lookup(dtype)
    if framework == "pt":
        import torch

        if memory is not None:
            if memory.dtype != np.uint8 or memory.ndim != 1 or memory.nbytes != _dtypes.file_nbytes(dtype, shape):
                raise ValueError(f"empty_output: memory of {memory.nbytes} bytes for a {dtype} tensor of shape "
                                 f"{list(shape)}")
            t = torch.from_numpy(memory).view(_dtypes.torch_dtype(dtype))
            return t.reshape(_dtypes.torch_shape_of_file(dtype, shape)), memory
        t = torch.empty(_dtypes.torch_shape_of_file(dtype, shape), dtype=_dtypes.torch_dtype(dtype))
        if t.numel() == 0:
            return t, np.empty(0, dtype=np.uint8)
        flat = t.reshape(-1)
        if flat.dtype != torch.uint8:
            flat = flat.view(torch.uint8)
        return t, flat.numpy()
    if d.packed != 1:  # NumPy F4: decoded packed, unpacked by finish_output
        packed = np.empty(_dtypes.file_nbytes(dtype, shape), dtype=np.uint8)
        return packed, packed
    a = np.empty(shape, dtype=_dtypes.numpy_dtype(dtype))
    return a, a.reshape(-1).view(np.uint8)


def finish_output(dtype: str, shape: Shape, framework: str, out: Any) -> Any:
    """The array/tensor of :func:`empty_output` once decoded (NumPy F4: unpacked, one element per byte)."""
    if framework == "np" and _dtypes.lookup(dtype).packed != 1:
        return _dtypes.unpack_nibbles(out).view(_dtypes.numpy_dtype(dtype)).reshape(shape)
    return out


def to_device(t: Any, device: Any) -> Any:
    if device is None:
        return t
    if isinstance(device, int):
        device = f"cuda:{device}"
    if str(device) == "cpu":
        return t
    return t.to(device)


def check_int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise UsageError(f"{what} must be between {lo} and {hi}, got {v}")
    return v


MAX_THREADS = 1 << 16


def check_threads(threads: Any) -> int:
    return check_int(threads, "threads", 0, MAX_THREADS)


def check_write_options(level: Any, threads: Any, block_elems: Any,
                        chunk_bytes: Any = 0) -> Tuple[int, int, int, int]:
    """The writer options as ints: their types checked here, their ranges by the library's one rule
    set (tensorzip::container::check_write_options; chunk_bytes 0: the default)."""
    level = check_int(level, "level", -(1 << 63), (1 << 63) - 1)
    threads = check_threads(threads)
    block_elems = check_int(block_elems, "block_elems", 0, (1 << 64) - 1)
    chunk_bytes = check_int(chunk_bytes, "chunk_bytes", 0, (1 << 64) - 1)
    _C.check_write_options(level, block_elems, chunk_bytes)
    return level, threads, block_elems, chunk_bytes


# ---- tensorzip.compress / tensorzip.decompress wrapper (doc/python.md) -----

MAGIC = b"TZPY"
WRAPPER_VERSION = 1
_FIXED = struct.Struct("<4sHHI")  # magic, version, flags, JSON length
MAX_JSON = 1 << 16


def compress(x: Any, level: int = 0, threads: int = 0, block_elems: int = 0) -> bytes:
    level, threads, block_elems, _ = check_write_options(level, threads, block_elems)
    dtype, shape, flat, framework = source_of(x)
    desc = json.dumps({"dtype": dtype, "shape": list(shape), "framework": framework},
                      separators=(",", ":")).encode()
    prefix = _FIXED.pack(MAGIC, WRAPPER_VERSION, 0, len(desc)) + desc
    return _C.compress(prefix, flat, _dtypes.lookup(dtype).codec, level, block_elems, threads)


def parse_wrapper(data: Any) -> Tuple[str, Shape, str, int]:
    mv = memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if len(mv) < _FIXED.size:
        raise CorruptDataError(f"not tensorzip data: {len(mv)} bytes is shorter than the {_FIXED.size}-byte header")
    magic, version, flags, n = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CorruptDataError(f"not tensorzip data: bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != WRAPPER_VERSION:
        raise CorruptDataError(f"unsupported tensorzip wrapper version {version} (this build reads {WRAPPER_VERSION})")
    if flags != 0:
        raise CorruptDataError(f"unsupported tensorzip wrapper flags 0x{flags:04x}")
    if n > MAX_JSON or _FIXED.size + n > len(mv):
        raise CorruptDataError(f"corrupt tensorzip header: description length {n} exceeds the data")
    try:
        desc = json.loads(bytes(mv[_FIXED.size:_FIXED.size + n]).decode("utf-8"))
        dtype = desc["dtype"]
        shape = desc["shape"]
        framework = desc.get("framework", "np")
        if not isinstance(dtype, str) or not isinstance(shape, list) or framework not in ("np", "pt"):
            raise ValueError("bad field types")
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < (1 << 63) for s in shape):
            raise ValueError("bad shape")
        _dtypes.lookup(dtype)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CorruptDataError(f"corrupt tensorzip header: {e}") from None
    return dtype, tuple(shape), framework, _FIXED.size + n


def decompress(data: Any, framework: Optional[str] = None, device: Any = "cpu", threads: int = 0) -> Any:
    threads = check_threads(threads)
    dtype, shape, stored_fw, offset = parse_wrapper(data)
    fw = normalize_framework(framework) or stored_fw
    try:
        nbytes = _dtypes.file_nbytes(dtype, shape)
    except ValueError as e:
        raise CorruptDataError(f"corrupt tensorzip header: {e}") from None
    info = _C.frame_info(data, offset)
    if info["raw_size"] != nbytes:
        raise CorruptDataError(
            f"corrupt tensorzip data: frame holds {info['raw_size']} bytes, {dtype}{list(shape)} needs {nbytes}")
    out, flat = empty_output(dtype, shape, fw)
    _C.decompress_into(data, offset, flat, threads)
    out = finish_output(dtype, shape, fw, out)
    if fw == "pt":
        return to_device(out, device)
    return out


def fsync_dir(path: Any) -> None:
    """fsync of a folder (its entries' names made durable); errors ignored (file systems without it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temporary(path: str, write: Callable[[BinaryIO], None], sync: bool) -> str:
    """A hidden temporary beside ``path`` (``.NAME.tmp-TAG-PID-RANDOM``, created exclusively,
    never followed through a link; folder walks skip such names), filled by ``write(f)`` and
    fsync'd (``sync``); its path. On any failure it is removed."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.tmp-{secrets.token_hex(4)}-{os.getpid()}-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except BaseException:
        _remove_quietly(tmp)
        raise
    return tmp


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _refuse_link(path: str) -> None:
    if os.path.islink(path):
        raise UsageError(f"{path}: is a symbolic link; neither the link nor the file behind it is replaced "
                         f"(give the file's own path, or remove the link)")


def replace_atomically(path: Any, write: Callable[[BinaryIO], None], *, sync: bool = True) -> None:
    """Writes ``path`` as the library writes its outputs (doc/cli.md "Outputs"): ``write(f)`` fills a
    hidden temporary beside it (``.NAME.tmp-TAG-PID-RANDOM``, created exclusively, never followed
    through a link; folder walks skip such names), which is fsync'd (``sync``), renamed onto
    ``path`` in one step, and the folder fsync'd. On any failure the temporary is removed and
    ``path`` is as it was. The file gets ``0666 & ~umask``. A symbolic link at ``path`` is refused
    (UsageError), as the library refuses one as an output."""
    path = os.fspath(path)
    _refuse_link(path)
    tmp = _write_temporary(path, write, sync)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def publish_once(path: Any, write: Callable[[BinaryIO], None], *, sync: bool = True) -> bool:
    """Writes ``path`` only if nothing is there, and never replaces what is: ``write(f)`` fills a
    temporary beside it as in replace_atomically, which is then hard-linked to ``path`` (one step
    that fails if ``path`` exists, so of processes publishing the same file at once exactly one
    wins and the others leave the winner's file as it is), removed, and the folder fsync'd.
    True when this call published ``path``; False when a file (or link) was already there (the
    caller reads that one). Needs a file system with hard links (an OSError otherwise)."""
    path = os.fspath(path)
    if os.path.lexists(path):
        return False  # a shortcut only: the link below is what decides
    tmp = _write_temporary(path, write, sync)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        _remove_quietly(tmp)
    if sync:
        fsync_dir(os.path.dirname(path) or ".")
    return True
