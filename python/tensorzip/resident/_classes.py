"""Resident weights: the subclass each module holding a compressed weight is given.

Same name, ``isinstance`` unchanged; a property per compressed attribute (a view of the decoded
slot inside its group's forward, else decoded on the spot); ``_apply`` (``.to()``),
``state_dict`` and ``load_state_dict`` aware of the frames; ``nn.Embedding`` forwards read rows.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.nn as nn

from ._tensor import ResidentTensor

# ---- the swapped module classes ----------------------------------------------

_SUBCLASSES: Dict[type, type] = {}


def _property(attr: str) -> property:
    def get(self: nn.Module) -> Any:
        b = self.__dict__.get("_tz_bind")
        if b is not None:
            rt = b.get(attr)
            if rt is not None:
                live = rt.live
                if live is not None:
                    return live
                return self.__dict__["_tz_state"]().plain(rt)
        return nn.Module.__getattr__(self, attr)

    return property(get, doc=f"'{attr}' (kept compressed by tensorzip.resident)")


def _sub_setattr(self: nn.Module, name: str, value: Any) -> None:
    b = self.__dict__.get("_tz_bind")
    if b is not None and name in b:
        rt = b[name]
        ok = value is None or (isinstance(value, torch.Tensor) if rt.is_buffer else isinstance(value, nn.Parameter))
        if ok:  # replaced by the user: that attribute is an ordinary one again (else torch's TypeError below)
            self.__dict__["_tz_state"]().unbind(self, name)
    self.__dict__["_tz_orig_class"].__setattr__(self, name, value)


def _sub_apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
    orig = self.__dict__["_tz_orig_class"]
    ref = self.__dict__.get("_tz_state")
    state = ref() if ref is not None else None
    if state is not None:
        state.quiesce()  # no decode may read frames that fn is about to replace
    out = orig._apply(self, fn, recurse)
    if state is not None:
        state.after_apply(self, fn)
    return out


def _sub_save(self: nn.Module, destination: Any, prefix: str, keep_vars: bool) -> None:
    b = self.__dict__.get("_tz_bind") or {}
    state = self.__dict__["_tz_state"]()
    for table, is_buf in ((self._parameters, False), (self._buffers, True)):
        for name, t in table.items():
            if name in b:
                destination[prefix + name] = state.plain(b[name], memo=destination)
            elif t is not None and not (is_buf and name in self._non_persistent_buffers_set):
                destination[prefix + name] = t if keep_vars else t.detach()
    extra = getattr(type(self), "get_extra_state", nn.Module.get_extra_state)
    if extra is not nn.Module.get_extra_state:
        destination[prefix + "_extra_state"] = self.get_extra_state()


def _sub_load(self: nn.Module, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
    orig = self.__dict__["_tz_orig_class"]
    orig._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                               error_msgs)
    b = self.__dict__.get("_tz_bind") or {}
    state = self.__dict__["_tz_state"]()
    for name, rt in b.items():
        key = prefix + name
        if key in unexpected_keys:
            unexpected_keys.remove(key)
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            continue
        v = state_dict[key]
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != rt.shape:
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {shape} from checkpoint, "
                              f"the shape in current model is {torch.Size(rt.shape)}.")
            continue
        state.reencode(rt, v)


def _embedding_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    b = self.__dict__.get("_tz_bind")
    rt = b.get("weight") if b else None
    if rt is not None and rt.rows_only and rt.live is None and not torch.is_grad_enabled() \
            and input.device.type == "cpu" and rt.device.type == "cpu":
        out = self.__dict__["_tz_state"]().rows(rt, input)
        if out is not None:
            return out
    return self.__dict__["_tz_orig_class"].forward(self, input)


def _rows_only(rt: "ResidentTensor") -> bool:
    """A table only a standard nn.Embedding forward reads (no max_norm: it would rewrite rows)."""
    if len(rt.bindings) != 1 or len(rt.shape) != 2:
        return False
    m, attr = rt.bindings[0]
    return attr == "weight" and isinstance(m, nn.Embedding) and type(m).forward is nn.Embedding.forward \
        and m.max_norm is None


def _resident_class(cls: type) -> type:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__setattr__": _sub_setattr,
              "_apply": _sub_apply, "_save_to_state_dict": _sub_save, "_load_from_state_dict": _sub_load,
              "_tz_resident_class": True}
        if cls.forward is nn.Embedding.forward:
            ns["forward"] = _embedding_forward
        sub = type(cls)(cls.__name__, (cls,), ns)
        _SUBCLASSES[cls] = sub
    return sub


def _buffer_name(module: nn.Module, attr: str) -> str:
    name = f"_tz_{attr}"
    while name in module._buffers or name in module._parameters or name in module._modules:
        name = "_" + name
    return name
