"""Hugging Face transformers models from and to compressed (``.tzip``) model folders.

::

    import torch, transformers, tensorzip.transformers as tzt

    # a folder made by `tzip compress model/` (or by save_pretrained below), sharded or not
    model = tzt.from_pretrained(transformers.AutoModel, "model.tzip", dtype=torch.bfloat16)
    tzt.save_pretrained(model, "out.tzip", max_shard_size="2GB")

How it plugs in: only through ``from_pretrained``'s public arguments. The folder's weight files
(``model.tzip``, or the shards that ``model.safetensors.index.json`` lists, ``x.safetensors``
named ``x.tzip``) are opened with :func:`tensorzip.safe_open`, and their tensors handed to
``model_class.from_pretrained(None, config=<folder>, state_dict=<lazy tensors>, **kwargs)``:
transformers then reads the config (with your keyword arguments), builds the model, and loads
the weights with its own loader, the one it uses for safetensors folders. The lazy tensors are
decoded one at a time, when the loader takes them (as safetensors slices are read), so
``dtype``, ``device_map``, ``key_mapping``, tied weights, ``output_loading_info`` and the
low-memory loading behave as for a safetensors folder; no private function is patched. Auto
classes (``AutoModel``, ``AutoModelForCausalLM``, ...) are resolved to the model class of the
folder's config first. A folder without ``.tzip`` weights is passed to ``from_pretrained``
unchanged.

To have transformers' own ``from_pretrained`` open compressed folders (code that calls
``AutoModel.from_pretrained(folder)`` unchanged), call :func:`enable` once: it wraps the public
classmethod ``transformers.PreTrainedModel.from_pretrained`` so that a local folder with ``.tzip``
weights (and no safetensors weights of its own) goes through :func:`from_pretrained`; everything
else reaches transformers unchanged. :func:`disable` undoes it.

Supported: transformers 5.x (tested in CI with the version pinned in
python/requirements-test.txt and its lowest supported version; doc/python.md). Limits:
local folders only (not Hub repository ids); ``device_map`` entries ``"disk"`` (offload to
disk), GGUF files, adapters (PEFT) and models with remote code (``trust_remote_code``) are
refused with a clear error.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, Optional

try:
    import torch
    import transformers
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.transformers needs PyTorch and transformers: pip install torch transformers") from e

from . import _core, _dtypes
from ._core import UsageError
from ._file import compress_safetensors
from ._open import SafeOpen, TensorSlice

__all__ = ["from_pretrained", "save_pretrained", "weight_files", "enable", "disable", "is_enabled",
           "SUPPORTED_TRANSFORMERS"]

#: The transformers versions this module is written and tested for (major versions).
SUPPORTED_TRANSFORMERS = (5,)

WEIGHTS = "model.tzip"
SAFE_INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"(.*?)-\d{5}-of-\d{5}")


def _check_version() -> None:
    major = int(transformers.__version__.split(".")[0])
    if major not in SUPPORTED_TRANSFORMERS:
        raise ImportError(f"tensorzip.transformers supports transformers {SUPPORTED_TRANSFORMERS[0]}.x; "
                          f"transformers {transformers.__version__} is installed")


def _add_variant(name: str, variant: Optional[str]) -> str:
    """model.tzip + "fp16" -> model.fp16.tzip (transformers' naming of variants)."""
    if not variant:
        return name
    parts = name.split(".")
    return ".".join(parts[:-1] + [variant, parts[-1]])


def _as_tzip_name(name: str) -> str:
    return name[: -len(".safetensors")] + ".tzip" if name.endswith(".safetensors") else name


def weight_files(folder: str, variant: Optional[str] = None) -> Optional[List[str]]:
    """The compressed weight files of a model folder: ``model.tzip``, or the ``.tzip`` shards named
    by ``model.safetensors.index.json`` (shards ``x.safetensors`` stored as ``x.tzip``; a shard still
    in safetensors form is used as it is). None when the folder has no ``.tzip`` weights."""
    single = os.path.join(folder, _add_variant(WEIGHTS, variant))
    if os.path.isfile(single):
        return [single]
    index = os.path.join(folder, _add_variant(SAFE_INDEX, variant))
    if not os.path.isfile(index):
        return None
    import json

    with open(index, encoding="utf-8") as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UsageError(f"{index}: no weight_map")
    shards: List[str] = []
    for shard in dict.fromkeys(weight_map.values()):  # in order, once each
        if not isinstance(shard, str) or os.path.isabs(shard) or ".." in shard.split("/"):
            raise UsageError(f"{index}: bad shard name {shard!r}")
        tz = os.path.join(folder, _as_tzip_name(shard))
        shards.append(tz if os.path.isfile(tz) else os.path.join(folder, shard))
    if not any(s.endswith(".tzip") for s in shards):
        return None  # a plain safetensors folder
    # A shard in neither form is named as this folder's shards are stored: compressed.
    missing = [_as_tzip_name(os.path.basename(s)) for s in shards if not os.path.isfile(s)]
    if missing:
        raise UsageError(f"{index} names shards that are not in {folder}: {', '.join(missing)} (nor in safetensors "
                         f"form)")
    return shards


class _LazyTensor:
    """One tensor of an open file for transformers' loader: the safetensors slice interface
    (``get_shape``, ``get_dtype``, ``[...]`` / ``[a:b]`` reads) plus the ``dtype``, ``shape`` and
    ``is_floating_point()`` that transformers asks of a state dict's values before loading."""

    __slots__ = ("_slice", "dtype", "shape")

    def __init__(self, sl: TensorSlice):
        self._slice = sl
        name = sl.get_dtype()
        self.dtype = _dtypes.torch_dtype(name)
        self.shape = torch.Size(_dtypes.torch_shape_of_file(name, tuple(sl.get_shape())))

    def get_shape(self) -> List[int]:
        return self._slice.get_shape()

    def get_dtype(self) -> str:
        return self._slice.get_dtype()

    def is_floating_point(self) -> bool:
        return bool(self.dtype.is_floating_point)

    def __len__(self) -> int:
        return len(self._slice)

    def __getitem__(self, key: Any) -> torch.Tensor:
        return self._slice[key]

    def __repr__(self) -> str:
        return f"<tensorzip lazy tensor {self._slice!r}>"


def _model_class_for(model_class: Any, config: Any) -> Any:
    """The concrete model class of an Auto class for this config (the class itself otherwise)."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    auto_map = getattr(config, "auto_map", None) or {}
    if model_class.__name__ in auto_map:
        raise UsageError(f"{model_class.__name__}: this model's code lives in its folder (auto_map, remote code); "
                         f"tensorzip.transformers loads library models only")
    try:
        return mapping[type(config)]
    except KeyError:
        raise UsageError(f"{model_class.__name__} has no model class for a {type(config).__name__}") from None


def from_pretrained(model_class: Any, pretrained_model_name_or_path: Any, *model_args: Any, threads: int = 0,
                    refs: Any = None, **kwargs: Any) -> Any:
    """``model_class.from_pretrained`` of a compressed model folder.

    Args:
        model_class: a transformers model class or Auto class (``transformers.AutoModel``,
            ``AutoModelForCausalLM``, ``BertModel``, ...).
        pretrained_model_name_or_path: a local folder holding ``config.json`` and ``model.tzip`` (or
            ``.tzip`` shards with ``model.safetensors.index.json``): what ``tzip compress model/``
            or :func:`save_pretrained` write. A folder without ``.tzip`` weights is loaded by
            transformers as usual.
        threads: tensorzip decoding threads per tensor (0 = all hardware threads).
        refs: for weight files saved as deltas against other ``.tzip`` files, their locations
            (see ``tensorzip.safe_open``); default: the recorded relative paths.
        **kwargs: as for ``from_pretrained``: ``dtype``, ``device_map``, ``config``, ``variant``,
            ``subfolder``, ``attn_implementation``, ``output_loading_info``, config overrides, ...

    Returns:
        The model (in eval mode), as ``model_class.from_pretrained`` returns it.
    """
    _check_version()
    folder = os.fspath(pretrained_model_name_or_path)
    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: not a local folder (tensorzip.transformers loads compressed folders made by "
                         f"tzip compress or save_pretrained; download Hub models first)")
    if kwargs.get("state_dict") is not None:
        raise UsageError("state_dict: the weights come from the folder's .tzip files")
    for key in ("gguf_file", "adapter_kwargs"):
        if kwargs.get(key):
            raise UsageError(f"{key} is not supported by tensorzip.transformers")
    device_map = kwargs.get("device_map")
    if isinstance(device_map, dict) and "disk" in device_map.values():
        raise UsageError("device_map: 'disk' offload is not supported for compressed folders")
    subfolder = kwargs.pop("subfolder", "") or ""
    variant = kwargs.pop("variant", None)
    kwargs.pop("use_safetensors", None)
    base = os.path.join(folder, subfolder)
    files = weight_files(base, variant)
    if files is None:
        return model_class.from_pretrained(folder, *model_args, subfolder=subfolder, variant=variant, **kwargs)

    config = kwargs.pop("config", None)
    if config is None:
        config = base
    if isinstance(config, (str, os.PathLike)):
        cfg_obj = transformers.AutoConfig.from_pretrained(os.fspath(config))
    else:
        cfg_obj = config
    cls = _model_class_for(model_class, cfg_obj)
    if "generation_config" not in kwargs and os.path.isfile(os.path.join(base, "generation_config.json")):
        kwargs["generation_config"] = transformers.GenerationConfig.from_pretrained(base)

    handles = []
    try:
        state: Dict[str, _LazyTensor] = {}
        for path in files:
            h = SafeOpen(path, framework="pt", device="cpu", threads=threads, refs=refs)
            handles.append(h)
            for name in h.keys():
                if name in state:
                    raise UsageError(f"tensor {name!r} is in two weight files of {base}")
                state[name] = _LazyTensor(h.get_slice(name))
        result = cls.from_pretrained(None, *model_args, config=config, state_dict=state, **kwargs)
    finally:
        for h in handles:
            h.close()
    model = result[0] if isinstance(result, tuple) else result
    model.config.name_or_path = folder  # as from_pretrained(folder) records it
    return result


def save_pretrained(model: Any, save_directory: Any, *, level: int = 0, threads: int = 0, **kwargs: Any) -> None:
    """``model.save_pretrained(save_directory, **kwargs)``, with the weights as ``.tzip`` files.

    The folder gets what ``save_pretrained`` writes (config, generation config,
    ``model.safetensors.index.json`` for a sharded model, naming the ``.safetensors`` shards)
    with each ``x.safetensors`` stored as ``x.tzip``: the same folder as ``tzip compress`` of a
    plain ``save_pretrained`` folder, loadable by :func:`from_pretrained` and restored to the
    plain folder, byte for byte, by ``tzip decompress``.

    transformers writes the safetensors files (it has no hook for another writer); they are
    written into a temporary folder beside ``save_directory`` and each is compressed and removed
    in turn, so the save needs the model's uncompressed size of free space for a moment.
    Compressed shards of an earlier save that this one does not write are removed, as
    ``save_pretrained`` removes its stale shards.

    Args:
        level, threads: tensorzip level and threads, as for ``tensorzip.torch.save_file``.
        **kwargs: ``save_pretrained``'s (``max_shard_size``, ``variant``, ``state_dict``,
            ``is_main_process``, ...); ``push_to_hub`` is refused.
    """
    _check_version()
    if kwargs.get("push_to_hub"):
        raise UsageError("push_to_hub: save the compressed folder, then upload it yourself")
    if not kwargs.get("is_main_process", True):
        model.save_pretrained(os.fspath(save_directory), **kwargs)  # the other ranks' part (collectives)
        return
    out = os.path.abspath(os.fspath(save_directory))
    if os.path.isfile(out):
        raise UsageError(f"{out}: is a file, expected a folder")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.staging-", dir=parent)
    try:
        model.save_pretrained(staging, **kwargs)
        os.makedirs(out, exist_ok=True)
        written = set()
        for root, dirs, names in os.walk(staging):
            dirs.sort()
            rel_root = os.path.relpath(root, staging)
            dst_root = out if rel_root == "." else os.path.join(out, rel_root)
            os.makedirs(dst_root, exist_ok=True)
            for name in sorted(names):
                src = os.path.join(root, name)
                if name.endswith(".safetensors"):
                    dst_name = _as_tzip_name(name)
                    compress_safetensors(src, os.path.join(dst_root, dst_name), level=level, threads=threads,
                                         overwrite=True)
                    os.unlink(src)  # frees its space before the next shard
                else:
                    dst_name = name
                    _copy_replace(src, os.path.join(dst_root, dst_name))
                written.add(os.path.normpath(os.path.join(rel_root, dst_name)))
        _remove_stale_shards(out, written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_replace(src: str, dst: str) -> None:
    with open(src, "rb") as s:
        _core.replace_atomically(dst, lambda f: shutil.copyfileobj(s, f, 1 << 20))


def _remove_stale_shards(out: str, written: set) -> None:
    """Compressed shards (``model-0000k-of-0000n.tzip``) of an earlier save that this save did not write."""
    for name in os.listdir(out):
        stem = name[: -len(".tzip")] if name.endswith(".tzip") else None
        if stem and name not in written and _SHARD.fullmatch(stem) and os.path.isfile(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))



# ---- enable(): transformers' own from_pretrained opens compressed folders ----

_original_from_pretrained: Any = None  # the classmethod object enable() replaced, None when not enabled


def _is_compressed_folder(path: Any, kwargs: Dict[str, Any]) -> bool:
    """A local folder whose weights are .tzip files and that transformers itself could not load
    (no model.safetensors of its own), and the call does not bring its own weights."""
    if kwargs.get("state_dict") is not None or kwargs.get("gguf_file"):
        return False
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return False
    base = os.path.join(os.fspath(path), kwargs.get("subfolder", "") or "")
    variant = kwargs.get("variant")
    if os.path.isfile(os.path.join(base, _add_variant("model.safetensors", variant))):
        return False
    files = weight_files(base, variant)
    return files is not None


def enable() -> None:
    """Let ``transformers``' own ``from_pretrained`` (``AutoModel.from_pretrained(folder)``,
    ``BertModel.from_pretrained(folder)``, ...) load compressed model folders.

    Wraps the public classmethod ``transformers.PreTrainedModel.from_pretrained`` (Auto classes
    resolve the model class and call it): a local folder with ``.tzip`` weights and no
    safetensors weights of its own is loaded by :func:`from_pretrained` with the same arguments;
    any other call is passed to transformers unchanged. Calling it again does nothing. Model
    classes that define their own ``from_pretrained`` are not covered; use :func:`from_pretrained`.
    """
    global _original_from_pretrained
    _check_version()
    if _original_from_pretrained is not None:
        return
    base = transformers.PreTrainedModel
    original = base.__dict__["from_pretrained"]
    plain = original.__func__

    @functools.wraps(plain)
    def from_pretrained_or_tzip(cls: Any, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any) -> Any:
        if _is_compressed_folder(pretrained_model_name_or_path, kwargs):
            return from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs)
        return plain(cls, pretrained_model_name_or_path, *model_args, **kwargs)

    base.from_pretrained = classmethod(from_pretrained_or_tzip)
    _original_from_pretrained = original


def disable() -> None:
    """Undo :func:`enable` (transformers' ``from_pretrained`` as it was)."""
    global _original_from_pretrained
    if _original_from_pretrained is None:
        return
    transformers.PreTrainedModel.from_pretrained = _original_from_pretrained
    _original_from_pretrained = None


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return _original_from_pretrained is not None
