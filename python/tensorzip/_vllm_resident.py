"""vLLM quantization method ``tensorzip``: the weights of the served model kept compressed in memory.

::

    LLM(model="my-model.tzip", load_format="tensorzip", quantization="tensorzip", enforce_eager=True)

How the two halves fit (doc/vllm.md, "Weights kept compressed"):

- :class:`TensorZipConfig` (registered with ``register_quantization_config("tensorzip")``) gives
  every linear layer (``LinearBase``) and every vocabulary embedding / output head
  (``VocabParallelEmbedding``, ``ParallelLMHead``) a method that creates, loads and computes with
  ordinary weights, as vLLM's unquantized methods do, except that it keeps no pre-packed copy of
  the weight (vLLM's CPU methods pack each weight once for oneDNN and drop the plain one): the
  plain weight must stay visible so that it can be kept compressed. On the CPU the method packs
  the weight per call through vLLM's own dispatcher (``dispatch_cpu_unquantized_gemm``), so the
  product is computed by the same kernel as for the plain model.
- The load format ``tensorzip`` (``tensorzip.vllm``) loads the weights as usual and then hands
  the model to :func:`tensorzip.resident.compress_model` with exactly those layers' weights:
  they become tensorzip frames, decoded one layer-list element (transformer block) at a time by
  forward pre-hooks, the next block decoded ahead meanwhile (the resident runtime's CPU plan, or
  its CUDA plan when the model is on a GPU).
"""
from __future__ import annotations

import gc
import logging
import weakref
from typing import Any, Dict, List

from ._core import UsageError

__all__ = ["QUANTIZATION", "config_class", "register", "keep_compressed", "check_can_keep_compressed"]

QUANTIZATION = "tensorzip"
#: Weights smaller than this stay plain (as tensorzip.resident.compress_model's default).
MIN_NUMEL = 4096

logger = logging.getLogger("vllm.tensorzip")
_classes: Dict[str, Any] = {}


class _GemmOperands:
    """What vLLM's CPU GEMM dispatcher reads of a layer: its weight and bias (packed per call)."""

    def __init__(self, weight: Any, bias: Any):
        self.weight = weight
        self.bias = None if bias is None else bias.detach().clone()  # the dispatcher may convert it in place


def _cpu_linear(x: Any, weight: Any, bias: Any) -> Any:
    """x @ weight.T + bias by the kernel vLLM's CPU unquantized method would pick for this weight."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    ops = _GemmOperands(weight, bias)
    dispatch_cpu_unquantized_gemm(ops, remove_weight=False)
    return ops.cpu_linear(x, weight, ops.bias)  # type: ignore[attr-defined]


def _make_classes() -> Dict[str, Any]:
    import torch
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod, VocabParallelEmbedding)
    from vllm.platforms import current_platform

    class _PlainWeightOnCpu:
        """vLLM's unquantized method, except that on the CPU it keeps no pre-packed copy of the weight
        (it is packed per call in apply): the plain weight stays visible to be kept compressed."""

        def process_weights_after_loading(self, layer: Any) -> None:
            if not current_platform.is_cpu():
                super().process_weights_after_loading(layer)  # type: ignore[misc]

        def apply(self, layer: Any, x: Any, bias: Any = None) -> Any:
            if current_platform.is_cpu():
                return _cpu_linear(x, layer.weight, bias)
            return super().apply(layer, x, bias)  # type: ignore[misc]

    class TensorZipLinearMethod(_PlainWeightOnCpu, UnquantizedLinearMethod):
        """Unquantized linear weights that tensorzip keeps compressed after the load."""

    class TensorZipEmbeddingMethod(_PlainWeightOnCpu, UnquantizedEmbeddingMethod):
        """Embedding tables and output heads that tensorzip keeps compressed after the load."""

    class TensorZipConfig(QuantizationConfig):
        """``quantization="tensorzip"``: BF16/F16/F32 checkpoints, weights kept compressed in memory."""

        def get_name(self) -> str:
            return QUANTIZATION

        def get_supported_act_dtypes(self) -> List[Any]:
            return [torch.bfloat16, torch.float16, torch.float32]

        @classmethod
        def get_min_capability(cls) -> int:
            return 0

        @staticmethod
        def get_config_filenames() -> List[str]:
            return []  # nothing in the model folder: the plain checkpoint is kept compressed at load

        @classmethod
        def from_config(cls, config: Dict[str, Any]) -> "TensorZipConfig":
            return cls()

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            _check_load_format()
            if isinstance(layer, LinearBase):
                return TensorZipLinearMethod()
            if isinstance(layer, VocabParallelEmbedding):
                return TensorZipEmbeddingMethod()
            return None

    for cls in (TensorZipLinearMethod, TensorZipEmbeddingMethod, TensorZipConfig):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return {"config": TensorZipConfig, "methods": (TensorZipLinearMethod, TensorZipEmbeddingMethod)}


def _check_load_format() -> None:
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    fmt = getattr(getattr(cfg, "load_config", None), "load_format", None)
    if fmt is not None and fmt != "tensorzip":
        raise UsageError(f"quantization='tensorzip' keeps the weights compressed through the tensorzip load format: "
                         f"pass load_format='tensorzip' (--load-format tensorzip), not {fmt!r}; it reads folders "
                         f"made by `tzip compress` and plain safetensors folders")


def _classes_once() -> Dict[str, Any]:
    if not _classes:
        _classes.update(_make_classes())
    return _classes


def __getattr__(name: str) -> Any:
    """The classes made on first use, found by their names: vLLM pickles its config, with the
    ``TensorZipConfig`` in it, into the processes it starts (several workers, the API server's engine)."""
    if name in ("TensorZipConfig", "TensorZipLinearMethod", "TensorZipEmbeddingMethod"):
        classes = _classes_once()
        return classes["config"] if name == "TensorZipConfig" else \
            classes["methods"][name == "TensorZipEmbeddingMethod"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_class() -> Any:
    """The ``QuantizationConfig`` subclass of ``quantization="tensorzip"`` (vLLM imported on first use)."""
    return _classes_once()["config"]


def register() -> None:
    """Registers ``quantization="tensorzip"`` with vLLM (idempotent)."""
    from vllm.model_executor.layers import quantization as q

    cls = config_class()
    if getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get(QUANTIZATION) is cls:
        return
    q.register_quantization_config(QUANTIZATION)(cls)


def check_can_keep_compressed(vllm_config: Any) -> None:
    """The model must run eagerly: torch.compile and CUDA graphs would trace the decode hooks."""
    from vllm.config import CompilationMode

    if vllm_config.compilation_config.mode != CompilationMode.NONE:
        raise UsageError("quantization='tensorzip' decodes each block's weights in a forward hook, which "
                         "torch.compile and CUDA graphs cannot trace: pass enforce_eager=True (--enforce-eager)")


def compressible_weights(model: Any) -> List[str]:
    """Names of the weights kept compressed: those of the layers given a tensorzip method and of plain
    ``torch.nn.Embedding`` tables (position embeddings), floating point, >= MIN_NUMEL elements."""
    import torch

    methods = _classes_once()["methods"]
    names = []
    for mname, m in model.named_modules():
        if not isinstance(getattr(m, "quant_method", None), methods) and type(m) is not torch.nn.Embedding:
            continue
        w = m._parameters.get("weight")
        if w is None or w.is_meta or w.dtype not in (torch.bfloat16, torch.float16, torch.float32) or \
                w.dim() < 2 or w.numel() < MIN_NUMEL:
            continue
        names.append(f"{mname}.weight" if mname else "weight")
    return names


def keep_compressed(model: Any, *, threads: int = 0, where: str = "") -> Dict[str, Any]:
    """Compresses the loaded model's weights (those of layers with a tensorzip method) in place, logs the
    memory figures and returns tensorzip.resident.resident_stats(model)."""
    from .resident import compress_model, resident_stats

    names = compressible_weights(model)
    if not names:
        raise UsageError(f"{where or 'model'}: quantization='tensorzip' found no weight to keep compressed "
                         f"(no linear or embedding layer with a BF16/F16/F32 weight of {MIN_NUMEL}+ elements)")
    plain = {id(p): weakref.ref(p) for p in map(model.get_parameter, names)}
    compress_model(model, include=names, threads=threads)
    gc.collect()
    freed = sum(r() is None for r in plain.values())  # a plain weight still referenced elsewhere is not freed
    stats = resident_stats(model)
    logger.info("tensorzip: %d weights kept compressed: %d bytes of frames for %d raw bytes (ratio %.3f, %.3fx); "
                "other parameters %d bytes; scratch %d bytes (2 slots of %d, the largest block) in %s; "
                "plain weights freed: %d of %d", stats["tensors"], stats["compressed_bytes"], stats["plain_bytes"],
                stats["ratio"], stats["compressed_bytes"] / max(1, stats["plain_bytes"]), stats["other_bytes"],
                2 * stats["slot_bytes"], stats["slot_bytes"], ", ".join(stats["devices"]), freed, len(plain))
    if freed < len(plain):
        logger.warning("tensorzip: %d plain weight(s) are still referenced outside the model: their memory is "
                       "not freed", len(plain) - freed)
    return stats
