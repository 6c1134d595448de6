"""vLLM load format ``tensorzip``: serve a compressed model folder (made by ``tzip compress``).

::

    from vllm import LLM
    llm = LLM(model="my-model.tzip", load_format="tensorzip")

    python -m vllm.entrypoints.openai.api_server --model my-model.tzip --load-format tensorzip

How it plugs in: ``pip install tensorzip`` declares the entry point ``tensorzip`` in the group
``vllm.general_plugins``; vLLM calls :func:`register` in each of its processes, which registers
:class:`TensorZipModelLoader` with ``vllm.model_executor.model_loader.register_model_loader``.
vLLM builds the model from the folder's ``config.json`` as usual; the loader then streams the
folder's weights (``model.tzip``, or the ``.tzip`` shards of ``model.safetensors.index.json``),
decoded on a thread pool in a bounded window (``tensorzip._vllm_weights.iter_weights``), into
``model.load_weights``: bit for bit the tensors of the original safetensors folder, and never a
second copy of the model in host memory.

Options (``--model-loader-extra-config '{"threads": 8}'`` / ``model_loader_extra_config=``):
    ``threads``: tensors decoded at once (default: the CPUs the process may use).
    ``refs``: location(s) of the ``.tzip`` files delta/cast-coded weight files were saved against
        (a folder, a file, or a list; default: the recorded relative paths).
    ``window``: tensors decoded ahead of the model's loader (default and least: ``threads``).
    ``device_decode``: decode on the model's CUDA device (default: when the model's parameters are
        on a CUDA device, the module is built with CUDA and a device is visible; ``false``: always
        on the CPU; ``true``: refused with one line where the device path cannot run).

GPU path (``tensorzip._vllm_device``): each tensor's frames are read from the file as stored
(checked against their xxh64), copied to the device and decoded there by the CUDA plan of resident
weights into a CUDA tensor, which ``model.load_weights`` copies device to device; delta/cast-coded
tensors and tensors not coded as floats are decoded on the CPU as before. At most ``window``
tensors are in flight either way. The GPU path has not run on a GPU yet (doc/vllm.md).

With ``quantization="tensorzip"`` (``tensorzip._vllm_resident``) the loaded model's weights are then
kept compressed in memory (``tensorzip.resident.compress_model``), decoded block by block; a plain
safetensors folder is accepted in that mode (loaded by vLLM's own safetensors loader).

Not built yet (doc/vllm.md): delta/cast-coded tensors decoded on the GPU.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List

from ._core import UsageError
from . import _vllm_resident
from ._vllm_weights import iter_weights, model_weight_files

__all__ = ["register", "LOAD_FORMAT", "loader_class", "OPTIONS"]

LOAD_FORMAT = "tensorzip"
#: The keys model_loader_extra_config may hold.
OPTIONS = ("threads", "refs", "window", "device_decode")

# Under vLLM's logger: its messages go where vLLM's go.
logger = logging.getLogger("vllm.tensorzip")
_loader_class: Any = None


def _options(extra: Any) -> Dict[str, Any]:
    """model_loader_extra_config, checked: only OPTIONS; threads/window non-negative ints;
    device_decode a bool."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise UsageError(f"model_loader_extra_config of the tensorzip load format must be a dict "
                         f"(keys {', '.join(OPTIONS)}), got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(OPTIONS))
    if unknown:
        raise UsageError(f"model_loader_extra_config: unknown key(s) {', '.join(map(repr, unknown))} for the "
                         f"tensorzip load format (it takes {', '.join(OPTIONS)})")
    for key in ("threads", "window"):
        v = extra.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UsageError(f"model_loader_extra_config: {key} must be an integer >= 0, got {v!r}")
    v = extra.get("device_decode")
    if v is not None and not isinstance(v, bool):
        raise UsageError(f"model_loader_extra_config: device_decode must be true or false, got {v!r}")
    refs = extra.get("refs")
    if refs is not None:
        extra = dict(extra, refs=_ref_files(refs))
    return dict(extra)


def _ref_files(refs: Any) -> List[str]:
    """refs as files: a folder stands for the .tzip files in it (a reference model folder)."""
    items = [refs] if isinstance(refs, (str, os.PathLike)) else list(refs)
    out: List[str] = []
    for r in items:
        if not isinstance(r, (str, os.PathLike)):
            raise UsageError(f"model_loader_extra_config: refs must be a path or a list of paths, got {r!r}")
        r = os.fspath(r)
        if os.path.isdir(r):
            out.extend(os.path.join(r, f) for f in sorted(os.listdir(r)) if f.endswith(".tzip"))
        else:
            out.append(r)
    return out


def _make_loader_class() -> Any:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class TensorZipModelLoader(BaseModelLoader):
        """Loads the weights of a compressed model folder (``load_format="tensorzip"``)."""

        def __init__(self, load_config: Any):
            super().__init__(load_config)
            self.options = _options(getattr(load_config, "model_loader_extra_config", None))

        def download_model(self, model_config: Any) -> None:
            # Local folders only: checks that the weight files are there (shards included).
            if not _plain_folder(model_config):
                model_weight_files(str(model_config.model))

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
            resident = model_config.quantization == _vllm_resident.QUANTIZATION
            if resident:
                _vllm_resident.check_can_keep_compressed(vllm_config)
            model = super().load_model(vllm_config, model_config, prefix)
            if resident:
                _vllm_resident.keep_compressed(model, threads=self.options.get("threads") or 0,
                                               where=str(model_config.model))
            return model

        def load_weights(self, model: Any, model_config: Any) -> None:
            folder = str(model_config.model)
            if _plain_folder(model_config):  # quantization="tensorzip" of a safetensors folder
                _load_plain(self.load_config, model, model_config)
                return
            files = model_weight_files(folder)
            device = _decode_device(self.options, model)
            t0 = time.perf_counter()
            weights = iter_weights(files, threads=self.options.get("threads") or 0,
                                   refs=self.options.get("refs"), window=self.options.get("window"),
                                   device=device)
            try:
                loaded = model.load_weights(weights)
            finally:
                weights.close()  # an error inside load_weights: the pool stops, the files close
            logger.info("tensorzip: loaded the weights of %s (%d file(s), decoded on %s) in %.2f s", folder,
                        len(files), device if device is not None else "the CPU", time.perf_counter() - t0)
            if model_config.quantization in (None, _vllm_resident.QUANTIZATION) and loaded is not None:
                _check_all_loaded(model, loaded, folder)

    TensorZipModelLoader.__module__ = __name__
    TensorZipModelLoader.__qualname__ = "TensorZipModelLoader"
    return TensorZipModelLoader


def _decode_device(options: Dict[str, Any], model: Any) -> Any:
    """The CUDA device the weights are decoded on (the device of the model's first parameter), or
    None for the CPU path (a model on the CPU, device_decode false, no CUDA build or device)."""
    from . import _vllm_device

    device, why = _vllm_device.decode_device(options.get("device_decode"), _vllm_device.model_device(model))
    if device is None:
        logger.info("tensorzip: weights decoded on the CPU (%s)", why)
    return device


def _plain_folder(model_config: Any) -> bool:
    """A safetensors folder (no .tzip weights) served with quantization="tensorzip"."""
    from .transformers import weight_files

    folder = str(model_config.model)
    return model_config.quantization == _vllm_resident.QUANTIZATION and os.path.isdir(folder) and \
        weight_files(folder) is None


def _load_plain(load_config: Any, model: Any, model_config: Any) -> None:
    """The weights of a safetensors folder, through vLLM's default loader."""
    import dataclasses

    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    plain = dataclasses.replace(load_config, load_format="safetensors", model_loader_extra_config={})
    DefaultModelLoader(plain).load_weights(model, model_config)


def _check_all_loaded(model: Any, loaded: Any, folder: str) -> None:
    """vLLM's own check that every parameter came from the checkpoint (DefaultModelLoader's, with its
    exemptions), where this vLLM has it."""
    try:
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        track = DefaultModelLoader.track_weights_loading
    except (ImportError, AttributeError):  # pragma: no cover - another vLLM version
        return
    try:
        track(None, model, set(loaded), quantized=False)
    except ValueError as e:
        raise UsageError(f"{folder}: {e}") from None
    except (AttributeError, TypeError):  # pragma: no cover - a version whose check needs its loader
        pass


def loader_class() -> Any:
    """The ``BaseModelLoader`` subclass of the load format (vLLM imported on first use)."""
    global _loader_class
    if _loader_class is None:
        _loader_class = _make_loader_class()
    return _loader_class


def register() -> None:
    """Registers the load format ``tensorzip`` with vLLM (the ``vllm.general_plugins`` entry point;
    called in every vLLM process, possibly more than once). A vLLM without ``register_model_loader``
    gets a warning, not an error: the plugin never stops vLLM from starting."""
    try:
        from vllm.model_executor import model_loader as ml

        cls = loader_class()
        if getattr(ml, "_LOAD_FORMAT_TO_MODEL_LOADER", {}).get(LOAD_FORMAT) is not cls:
            ml.register_model_loader(LOAD_FORMAT)(cls)
    except Exception as e:  # pragma: no cover - another vLLM version
        logger.warning("tensorzip: cannot register the vLLM load format %r: %s", LOAD_FORMAT, e)
    try:
        _vllm_resident.register()
    except Exception as e:  # pragma: no cover - another vLLM version
        logger.warning("tensorzip: cannot register the vLLM quantization method %r: %s",
                       _vllm_resident.QUANTIZATION, e)


def __getattr__(name: str) -> Any:
    # KV offloading (tensorzip._vllm_offload, doc/kv.md "vLLM KV offloading") imports vLLM: loaded
    # when vLLM's OffloadingConnector asks for spec_name "TensorZipOffloadingSpec" here.
    if name == "TensorZipOffloadingSpec":
        from . import _vllm_offload

        return _vllm_offload.TensorZipOffloadingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
