"""PyTorch API, mirroring ``safetensors.torch``: ``.tzip`` files of torch tensors."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.torch needs PyTorch: pip install torch (or pip install 'tensorzip[torch]')") from e

from . import _core, _file
from ._file import PathLike

from .resident import compress_model, decompress_model, load_resident, resident_stats  # noqa: E402,F401

__all__ = ["save_file", "load_file", "save", "load", "save_model", "load_model",
           "compress_model", "decompress_model", "load_resident", "resident_stats"]


def save_file(tensors: Dict[str, torch.Tensor], filename: PathLike, metadata: Optional[Dict[str, str]] = None,
              *, level: int = 0, threads: int = 0, block_elems: int = 0, chunk_bytes: int = 0,
              predict: bool = True, ref: Optional[PathLike] = None,
              ref_original: Optional[PathLike] = None) -> None:
    """Saves a dict of tensors to a ``.tzip`` file (replacing any existing file).

    Tensors on another device are copied to the CPU first; non-contiguous
    tensors are made contiguous (safetensors refuses them instead). Tensors
    that share memory are each saved in full.

    Args:
        tensors: name -> tensor.
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

    ``tzip decompress`` of the result is byte-identical to what
    ``safetensors.torch.save_file(tensors, ..., metadata)`` writes.
    """
    _file.save_sources(tensors, filename, metadata, _core.torch_source, level, threads, block_elems, chunk_bytes,
                       predict, ref, ref_original)


def load_file(filename: PathLike, device: Union[str, int, torch.device] = "cpu", *,
              threads: int = 0, refs: Any = None) -> Dict[str, torch.Tensor]:
    """Loads every tensor of a ``.tzip`` file onto ``device`` (decoded on the CPU, then moved).

    ``refs``: for a file saved with ``ref=`` (delta), the location(s) of the previous
    checkpoint's ``.tzip`` (and of its own references, for a chain), matched by checksum;
    default: the relative paths recorded in the file.
    """
    return _file.load_all(filename, "pt", device, threads, refs)


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None, *, level: int = 0,
         threads: int = 0) -> bytes:
    """Like :func:`save_file`, but returns the ``.tzip`` file's bytes."""
    return _file.save_to_bytes(save_file, tensors, metadata, level, threads)


def load(data: bytes, device: Union[str, int, torch.device] = "cpu", *, threads: int = 0) -> Dict[str, torch.Tensor]:
    """Loads the tensors of a ``.tzip`` file held in memory."""
    return _file.load_from_bytes(data, lambda path: load_file(path, device, threads=threads))


def save_model(model: torch.nn.Module, filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
               level: int = 0, threads: int = 0) -> None:
    """Saves ``model.state_dict()`` (tensors shared between entries are each saved in full)."""
    save_file(model.state_dict(), filename, metadata, level=level, threads=threads)


def load_model(model: torch.nn.Module, filename: PathLike, strict: bool = True,
               device: Union[str, int, torch.device] = "cpu", *, threads: int = 0) -> Tuple[List[str], List[str]]:
    """Loads a file saved by :func:`save_model` into ``model``; returns (missing keys, unexpected keys)."""
    state = load_file(filename, device, threads=threads)
    result = model.load_state_dict(state, strict=strict)
    return list(result.missing_keys), list(result.unexpected_keys)
