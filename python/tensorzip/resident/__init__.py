"""Weights that stay compressed in memory, decoded block by block just before use.

``compress_model(model)`` replaces the large floating-point weights of any
``torch.nn.Module`` by tensorzip frames held in the same device's memory. A
forward pre-hook on each top-level block (each element of the model's layer
list, and each other top-level part holding compressed weights) decodes all of
that block's weights at once into a reusable scratch slot; a forward hook
releases the slot. While one block runs, the next one's weights are decoded
into the other slot (the plan's own thread on the CPU, a side stream on CUDA).
``decompress_model`` undoes it; ``load_resident`` builds the compressed form
straight from a ``.tzip`` file or folder. See doc/python.md, "Weights that
stay compressed in memory".

How a module sees its weights: the module's class is replaced by a subclass
(same name, ``isinstance`` unchanged) with a property per compressed
attribute. Inside its block's forward the property returns a view of the
decoded slot; anywhere else it decodes the tensor on the spot (so modules
called outside their block, user code reading ``model.fc.weight`` and
``state_dict()`` get the right values, only slower). Compressed weights are
no longer parameters: they are frozen (no gradient, not in
``model.parameters()``); their frames are non-persistent ``uint8`` buffers
(``_tz_<name>``), so ``.to()``/``.cuda()`` move them and memory accounting
sees them.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Set, Union

import torch
import torch.nn as nn

from .._core import UsageError
from ._load import empty_parameters  # noqa: F401
from ._select import Selection, _candidates, _find_groups, _selected, _selection  # noqa: F401
from ._state import ResidentState, _attach, _state, is_resident  # noqa: F401
from ._tensor import CODEC_OF, Frame, ResidentTensor, _encode  # noqa: F401

__all__ = ["compress_model", "decompress_model", "load_resident", "resident_stats", "is_resident", "check",
           "from_pretrained", "empty_parameters", "ResidentTensor"]


def compress_model(model: nn.Module, *, include: Any = None, exclude: Any = None, types: Any = None,
                   min_numel: int = 4096, buffers: bool = False,
                   groups: Optional[Sequence[Union[str, nn.Module]]] = None,
                   level: int = 0, block_elems: int = 0, threads: int = 0, prefetch: bool = True,
                   embedding_rows: bool = True) -> nn.Module:
    """Keeps the large floating-point weights of ``model`` compressed in memory; returns ``model``.

    What stays compressed (no per-architecture table): by default every floating-point
    parameter (BF16, F16, F32, FP8) with at least 2 dimensions and ``min_numel`` elements:
    the weights of Linear, Embedding, Conv and similar layers; biases and norms stay plain.
    ``types``: only parameters of modules of these classes; ``include`` / ``exclude``:
    ``fnmatch`` patterns over full names (``"blocks.*.fc1.weight"``; ``include`` selects
    exactly what matches); ``buffers=True`` also takes floating-point persistent buffers.
    A tied or shared weight stays compressed when any of its names is selected, and then every
    module holding it shares the one compressed weight (the tie is kept).

    ``groups``: the modules (names or objects) whose forward decodes their weights in one
    batch; default: each element of the model's layer lists (ModuleList / Sequential /
    ModuleDict) and each other top-level part holding compressed weights. ``prefetch``:
    decode the next group while the current one runs. ``threads``: CPU decode workers
    (0 = all hardware threads). ``level`` / ``block_elems``: codec options.
    ``embedding_rows``: an ``nn.Embedding`` table in CPU memory is read by row (its forward, without
    autograd, decodes only the codec blocks holding the ids' rows) instead of decoded whole.

    Frames stay on each weight's device. Compressed weights are frozen: they leave
    ``model.parameters()`` and receive no gradient. Call ``decompress_model`` to undo.
    """
    if is_resident(model):
        raise UsageError("compress_model: the model is already compressed")
    sel = _selection(include, exclude, types, min_numel, buffers)
    cands = _candidates(model, sel)
    if not cands:
        raise UsageError("compress_model: no parameter matches (floating point, >= 2 dims, >= min_numel elements, "
                         "or include=)")
    items = []
    with torch.no_grad():
        for name, t, is_buffer, bindings in cands:
            buf, frames = _encode(t, level, block_elems, threads)
            items.append((name, buf.to(t.device), frames, t.dtype, tuple(t.shape),
                          bool(getattr(t, "requires_grad", False)), is_buffer, bindings))
    return _attach(model, items, groups, threads, prefetch, level, block_elems, embedding_rows)


def decompress_model(model: nn.Module) -> nn.Module:
    """Puts every compressed weight back as an ordinary parameter (or buffer); returns ``model``."""
    state = _state(model)
    state.quiesce()
    plain = []
    with torch.no_grad():
        for rt in state.tensors:
            plain.append(state.plain(rt))
    for h in state.root_hooks:
        h.remove()
    for grp in state.groups:
        for h in grp.hooks:
            h.remove()
    modules: Dict[int, nn.Module] = {}
    for rt, v in zip(state.tensors, plain):
        value: torch.Tensor = v if rt.is_buffer else nn.Parameter(v, requires_grad=rt.requires_grad)
        assert rt.owner is not None
        rt.owner._buffers.pop(rt.buf_name, None)
        rt.owner._non_persistent_buffers_set.discard(rt.buf_name)
        for m, attr in rt.bindings:
            (m._buffers if rt.is_buffer else m._parameters)[attr] = value
            modules[id(m)] = m
    for m in modules.values():
        object.__setattr__(m, "__class__", m.__dict__["_tz_orig_class"])
        for k in ("_tz_orig_class", "_tz_bind", "_tz_state"):
            m.__dict__.pop(k, None)
    del model.__dict__["_tz_resident"]
    state.engines.clear()
    return model


def resident_stats(model: nn.Module) -> Dict[str, Any]:
    """Memory and decode figures of a compressed model.

    ``plain_bytes``: bytes the compressed weights take decoded; ``compressed_bytes``: their
    frames (what stays in memory); ``other_bytes``: every other parameter and buffer;
    ``plan_bytes``: what the CPU decode plan keeps so that a forward parses no frame header and
    builds no decode table (per frame: its rANS decode tables, 16 KiB per frequency table, and a
    copy of its block index; at most 64 MiB per device, frames past that build their tables per
    decode); ``scratch_bytes``: decode slots allocated now: two of ``slot_bytes`` (the largest layer-list
    element) once a forward ran with prefetch, one without; a group larger than a slot (a big
    output head) is decoded into a buffer of its own, freed when it returns;
    ``decode_seconds`` / ``decoded_bytes``: CPU decode totals (groups and whole tensors);
    ``rows_decoded_bytes``: bytes of the codec blocks decoded for embedding rows;
    ``on_demand_decodes``: weights decoded outside their group (a module called on its own).
    """
    state = _state(model)
    frames = {id(rt.data) for rt in state.tensors}
    other = 0
    seen: Set[int] = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in frames or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        other += t.numel() * t.element_size()
    plain = sum(rt.nbytes for rt in state.tensors)
    comp = sum(rt.compressed_bytes for rt in state.tensors)
    assert state.layout is not None
    return {
        "tensors": len(state.tensors),
        "groups": [g.name for g in state.groups],
        "plain_bytes": plain,
        "compressed_bytes": comp,
        "ratio": plain / comp if comp else float("inf"),
        "other_bytes": other,
        "max_group_bytes": state.layout.max_group_bytes,
        "slot_bytes": state.layout.slot_bytes,
        "scratch_bytes": sum(e.scratch_bytes() for e in state.engines.values()),
        "plan_bytes": sum(e.plan_bytes for e in state.engines.values()),
        "decode_seconds": sum(e.decode_seconds for e in state.engines.values()),
        "decoded_bytes": sum(e.decoded_bytes for e in state.engines.values()),
        "on_demand_decodes": state.on_demand_decodes,
        "rows_decoded_bytes": state.rows_decoded_bytes,
        "devices": sorted({str(rt.device) for rt in state.tensors}),
        "load": getattr(state, "load_report", None),
    }


def check(model: nn.Module) -> None:
    """Waits for the device and raises CorruptDataError if a frame failed to decode there (CUDA).

    On the CPU a failing block raises in the forward itself. On CUDA the decoder reports per-frame
    statuses in device memory; they are copied back after every forward without a stall and checked
    at the start of the next one, or here.
    """
    _state(model).check()


def load_resident(model: nn.Module, path: Any, **kwargs: Any) -> nn.Module:
    """Loads a ``.tzip`` file or folder into ``model`` with the weights kept compressed (see _resident_load)."""
    from ._load import load_resident as _load

    return _load(model, path, **kwargs)


def from_pretrained(model_class: Any, path: Any, **kwargs: Any) -> nn.Module:
    """A transformers model from a compressed folder, built on the meta device, weights kept compressed."""
    from ._load import from_pretrained as _fp

    return _fp(model_class, path, **kwargs)
