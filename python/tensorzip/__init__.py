"""tensorzip: lossless compression of LLM float tensors, for NumPy and PyTorch.

- ``tensorzip.compress(x) -> bytes`` / ``tensorzip.decompress(b)``: one array or tensor.
- ``tensorzip.numpy`` / ``tensorzip.torch``: ``save_file`` / ``load_file`` of ``.tzip``
  files (the format of the ``tzip`` CLI), drop-ins for ``safetensors.numpy`` /
  ``safetensors.torch``.
- ``tensorzip.safe_open(path, framework=...)``: lazy access to one tensor or slice, of a
  ``.tzip`` or a plain ``.safetensors`` file.
- ``tensorzip.transformers``: Hugging Face ``from_pretrained`` / ``save_pretrained`` of
  compressed model folders.

See doc/python.md.
"""
from __future__ import annotations

from typing import Any, Optional

from . import _tensorzip as _C
from ._core import (
    CorruptDataError,
    TensorZipError,
    TensorZipExistsError,
    TensorZipFileNotFoundError,
    TensorZipIOError,
    TensorZipPermissionError,
    UsageError,
)
from ._core import compress as _compress
from ._core import decompress as _decompress
from ._file import (
    SafeOpen,
    TensorSlice,
    compress_folder,
    compress_safetensors,
    decompress_folder,
    export_safetensors,
    read_metadata,
)

__version__ = "0.1.0"
__all__ = [
    "compress", "decompress", "safe_open", "SafeOpen", "TensorSlice", "read_metadata",
    "compress_safetensors", "export_safetensors", "compress_folder", "decompress_folder",
    "TensorZipError", "CorruptDataError", "UsageError", "TensorZipIOError", "TensorZipExistsError",
    "TensorZipFileNotFoundError", "TensorZipPermissionError",
    "HAVE_CONTAINER", "__version__",
]

#: Whether this build can read and write .tzip files (the C++ container library was built in).
HAVE_CONTAINER: bool = bool(getattr(_C, "HAVE_CONTAINER", False))


def compress(x: Any, level: int = 0, threads: int = 0, block_elems: int = 0) -> bytes:
    """Compresses one NumPy array or torch tensor into self-describing bytes.

    Args:
        x: a NumPy array (bf16/fp8 through ``ml_dtypes``) or a torch tensor of
           dtype bool, (u)int8/16/32/64, float16, bfloat16, float32, float64,
           float8_e4m3fn or float8_e5m2. Non-contiguous or non-CPU inputs are copied.
        level: 0 default, 1 fast, 2 code every field that shrinks, 3 strongest, -1 store.
        threads: coding threads, 0 = all hardware threads (the output does not depend on it).
        block_elems: elements per codec block (power of two in [4096, 2**20]); 0 = default.

    Returns:
        A small header (dtype, shape, framework; doc/python.md) followed by one
        tensorzip codec frame. The GIL is released while coding.
    """
    return _compress(x, level=level, threads=threads, block_elems=block_elems)


def decompress(data: Any, framework: Optional[str] = None, device: Any = "cpu", threads: int = 0) -> Any:
    """Restores the array or tensor of :func:`compress` (dtype and shape included).

    Args:
        data: bytes-like (bytes, bytearray, memoryview, mmap...).
        framework: ``"np"`` or ``"pt"``; default: the kind that was compressed.
        device: for torch tensors, where to put the result (decoded on the CPU).
        threads: decoding threads, 0 = all hardware threads.

    Raises:
        CorruptDataError: not tensorzip data, truncated, corrupt or checksum mismatch.
    """
    return _decompress(data, framework=framework, device=device, threads=threads)


def safe_open(filename: Any, framework: str = "np", device: Any = "cpu", *, threads: int = 0,
              refs: Any = None) -> SafeOpen:
    """Opens a ``.tzip`` file (or a plain ``.safetensors`` file) for lazy reading, like
    ``safetensors.safe_open``.

    ``framework`` is ``"pt"`` (torch) or ``"np"`` (numpy). Use as a context
    manager; ``keys()``, ``metadata()``, ``get_tensor(name)`` and
    ``get_slice(name)[...]`` read only the compressed bytes of what they return.
    ``refs``: location(s) of the ``.tzip`` files a delta file was saved against
    (default: the recorded relative paths); ``predictions()`` and
    ``references()`` tell which tensors are predicted from what.
    """
    return SafeOpen(filename, framework=framework, device=device, threads=threads, refs=refs)
