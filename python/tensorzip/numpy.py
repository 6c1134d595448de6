"""NumPy API, mirroring ``safetensors.numpy``: ``.tzip`` files of NumPy arrays.

bfloat16 and float8 arrays use the ``ml_dtypes`` types
(``ml_dtypes.bfloat16``, ``ml_dtypes.float8_e4m3fn``, ``ml_dtypes.float8_e5m2``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _core, _file
from ._file import PathLike

__all__ = ["save_file", "load_file", "save", "load"]


def save_file(tensor_dict: Dict[str, np.ndarray], filename: PathLike, metadata: Optional[Dict[str, str]] = None,
              *, level: int = 0, threads: int = 0, block_elems: int = 0, chunk_bytes: int = 0,
              predict: bool = True, ref: Optional[PathLike] = None,
              ref_original: Optional[PathLike] = None) -> None:
    """Saves a dict of NumPy arrays to a ``.tzip`` file (replacing any existing file).

    Args:
        tensor_dict: name -> array. Non-contiguous arrays are copied first.
        filename: output path (conventionally ``*.tzip``).
        metadata: optional ``__metadata__`` (str -> str), as in safetensors.
        level: 0 default, 1 fast, 2 code every field that shrinks, 3 strongest, -1 store.
        threads: coding threads, 0 = all hardware threads.
        block_elems: elements per codec block (power of two in [4096, 2**20]); 0 = default.
        chunk_bytes: raw bytes per container frame (power of two >= 1 MiB); 0 = default.
        predict: store BF16/F16 tensors that are round-to-nearest-even casts of an FP32 tensor
            of the same dict (mixed-precision weights + FP32 master) as residuals against that
            cast, found by shape and sampled values, used only where it pays (default True).
        ref: previous checkpoint's ``.tzip`` file: tensors of the same name, dtype and shape are
            stored as XOR residuals against it where that pays (delta). The new file then needs
            ``ref`` to load (recorded by relative path and checksum; see ``refs=`` of load_file).
        ref_original: optional safetensors file with the same content as ``ref`` (e.g. what the
            previous checkpoint was saved from): the predictors are read from it instead of
            decoding ``ref`` (faster). Its header, size and the bytes used are checked against
            ``ref`` (its stored block checksums).

    The file is written under a temporary name and renamed, so a failure never
    leaves a partial file at ``filename``. ``tzip decompress`` turns it into the
    very bytes ``safetensors.numpy.save_file`` would have written.
    """
    _file.save_sources(tensor_dict, filename, metadata, _core.numpy_source, level, threads, block_elems,
                       chunk_bytes, predict, ref, ref_original)


def load_file(filename: PathLike, *, threads: int = 0, refs: Any = None) -> Dict[str, np.ndarray]:
    """Loads every array of a ``.tzip`` file (as NumPy arrays).

    ``refs``: for a file saved with ``ref=`` (delta), the location(s) of the previous
    checkpoint's ``.tzip`` (and of its own references, for a chain), matched by checksum;
    default: the relative paths recorded in the file.
    """
    return _file.load_all(filename, "np", "cpu", threads, refs)


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None, *, level: int = 0,
         threads: int = 0) -> bytes:
    """Like :func:`save_file`, but returns the ``.tzip`` file's bytes."""
    return _file.save_to_bytes(save_file, tensor_dict, metadata, level, threads)


def load(data: bytes, *, threads: int = 0) -> Dict[str, np.ndarray]:
    """Loads the arrays of a ``.tzip`` file held in memory."""
    return _file.load_from_bytes(data, lambda path: load_file(path, threads=threads))
