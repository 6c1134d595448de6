"""PyTorch API, mirroring ``safetensors.torch``: ``.tzip`` files of torch tensors."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple, Union

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

    Tensors on another device are copied to the CPU first. As in safetensors,
    with safetensors' messages: a value that is not a dict of tensors, a
    non-contiguous tensor (call ``.contiguous()``, or use :func:`save_model`)
    and a sparse tensor raise ``ValueError``; tensors that share memory (two
    views of one storage that overlap) ``RuntimeError`` (use :func:`save_model`,
    which keeps one of them); meta tensors torch's ``NotImplementedError``.

    The tensors are encoded from their own memory while the file is written
    (no raw copy of them is written anywhere).

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
    check_savable(tensors)
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


def save_model(model: torch.nn.Module, filename: PathLike, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True, *, level: int = 0, threads: int = 0) -> None:
    """Saves ``model.state_dict()`` as safetensors' ``save_model`` does: of tensors that share
    memory (tied weights), only one is stored (the first name in sorted order among those that
    cover the whole storage), and each dropped name is recorded in the metadata as
    ``{dropped: kept}`` (unless the metadata has that key already). :func:`load_model` restores
    them through the model's own sharing."""
    state = model.state_dict()
    to_remove = duplicate_names(state)
    if to_remove:
        metadata = dict(metadata) if metadata is not None else {}
    for kept, group in to_remove.items():
        for name in group:
            metadata.setdefault(name, kept)  # type: ignore[union-attr]
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    try:
        save_file(state, filename, metadata, level=level, threads=threads)
    except ValueError as e:
        raise ValueError(str(e) + " Or use save_model(..., force_contiguous=True), read the docs for potential"
                         " caveats.") from None


def load_model(model: torch.nn.Module, filename: PathLike, strict: bool = True,
               device: Union[str, int, torch.device] = "cpu", *, threads: int = 0) -> Tuple[List[str], List[str]]:
    """Loads a file saved by :func:`save_model` into ``model``; returns (missing keys, unexpected keys).

    As in safetensors: names the file dropped because they share memory with a kept one are
    neither missing nor unexpected when the model shares them too; ``strict`` raises
    ``RuntimeError`` listing the missing and unexpected keys."""
    state = load_file(filename, device, threads=threads)
    to_remove = duplicate_names(model.state_dict(), preferred_names=list(state.keys()))
    missing_l, unexpected_l = model.load_state_dict(state, strict=False)
    missing = set(missing_l)
    unexpected = list(unexpected_l)
    for group in to_remove.values():
        for name in group:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return sorted(missing), unexpected


# ---- shared memory (safetensors' rules, so that the same dicts are refused and deduplicated) ----

def _storage_key(t: torch.Tensor) -> Optional[Tuple[Any, int, int]]:
    """(device, storage address, storage bytes) of a tensor with real storage, else None."""
    if t.device.type == "meta" or t.layout != torch.strided:
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    ptr, size = st.data_ptr(), st.nbytes()
    if ptr == 0 or size == 0:
        return None
    return (t.device, ptr, size)


def _end_address(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return t.data_ptr()
    return t.view(-1)[-1].data_ptr() + t.element_size()


def shared_groups(tensors: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Sets of names whose tensors overlap in memory (one set per overlapping cluster; names on
    their own are sets of one). Tensors of one storage that do not overlap are apart."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = {}
    for name, t in tensors.items():
        key = _storage_key(t)
        if key is not None:
            by_storage.setdefault(key, set()).add(name)
    groups: List[Set[str]] = []
    for names in sorted(by_storage.values(), key=lambda g: sorted(g)):
        if len(names) < 2:
            groups.append(set(names))
            continue
        areas = sorted((tensors[n].data_ptr(), _end_address(tensors[n]), n) for n in names)
        current = {areas[0][2]}
        stop = areas[0][1]
        for start, end, name in areas[1:]:
            if start >= stop:
                groups.append(current)
                current = {name}
            else:
                current.add(name)
            stop = end  # as safetensors: the last area's end decides
        groups.append(current)
    return groups


def _covers_storage(t: torch.Tensor) -> bool:
    st = t.untyped_storage()
    return t.data_ptr() == st.data_ptr() and t.numel() * t.element_size() == st.nbytes()


def duplicate_names(state: Dict[str, torch.Tensor], *, preferred_names: Optional[List[str]] = None,
                    discard_names: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """{kept name: [names to drop]} for the tensors of ``state`` that share memory (safetensors'
    ``save_model`` rule: keep the first sorted name among those covering the whole storage,
    preferring ``preferred_names``, avoiding ``discard_names``)."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    out: Dict[str, List[str]] = {}
    for group in shared_groups(state):
        if len(group) < 2:
            continue
        complete = {n for n in group if _covers_storage(state[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {group}. None is covering the entire storage.Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an"
                " issue.")
        keep = sorted(complete)[0]
        if complete - discard:
            keep = sorted(complete - discard)[0]
        if preferred & complete:
            keep = sorted(preferred & complete)[0]
        out[keep] = [n for n in sorted(group) if n != keep]
    return out


def check_savable(tensors: Any) -> None:
    """Refuses, as safetensors' save_file does (same exception classes and messages): a value
    that is not a dict, or a value in it that is not a tensor (ValueError), sparse tensors
    (ValueError), tensors that share memory (RuntimeError) and non-contiguous tensors
    (ValueError)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
    sparse = [k for k, v in tensors.items() if v.layout != torch.strided]
    if sparse:
        raise ValueError(_core.sparse_message(sparse))
    dense = dict(tensors)
    failing = [g for g in shared_groups(dense) if len(g) > 1]
    if failing:
        raise RuntimeError(
            f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {failing}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """)
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving.")
