"""Resident weights: which tensors stay compressed, and the groups one pre-hook decodes."""
from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn

from .._core import UsageError
from ._tensor import CODEC_OF

# ---- selection of what to compress -------------------------------------------

class Selection(NamedTuple):
    include: Optional[Sequence[str]]
    exclude: Sequence[str]
    types: Optional[Tuple[type, ...]]
    min_numel: int
    buffers: bool


def _selected(sel: Selection, module: nn.Module, full: str, t: torch.Tensor, is_buffer: bool) -> bool:
    if any(fnmatch.fnmatchcase(full, p) for p in sel.exclude):
        return False
    if sel.include is not None:
        if not any(fnmatch.fnmatchcase(full, p) for p in sel.include):
            return False
        if t.dtype not in CODEC_OF:
            raise UsageError(f"compress_model: '{full}' ({t.dtype}) matches include= but only "
                             f"{', '.join(str(d) for d in CODEC_OF)} can stay compressed")
        return True
    if is_buffer and not sel.buffers:
        return False
    if sel.types is not None and not isinstance(module, sel.types):
        return False
    return t.dtype in CODEC_OF and t.dim() >= 2 and t.numel() >= sel.min_numel


class Held(NamedTuple):
    """One distinct parameter or persistent buffer of a model and everything that holds it."""
    names: List[str]  # every qualified name, in named_modules order
    modules: List[nn.Module]  # the module behind each name
    tensor: torch.Tensor
    is_buffer: bool
    binds: List[Tuple[nn.Module, str]]  # the distinct (module, attribute) pairs holding it


def _distinct_tensors(model: nn.Module) -> List[Held]:
    """Every distinct parameter and persistent buffer (tied or shared ones once), first seen first."""
    found: Dict[int, Held] = {}
    for mname, m in model.named_modules(remove_duplicate=False):
        for is_buffer, table in ((False, m._parameters), (True, m._buffers)):
            for aname, t in table.items():
                if t is None or (is_buffer and aname in m._non_persistent_buffers_set):
                    continue
                h = found.get(id(t))
                if h is None:
                    h = found[id(t)] = Held([], [], t, is_buffer, [])
                h.names.append(f"{mname}.{aname}" if mname else aname)
                h.modules.append(m)
                if all(b[0] is not m or b[1] != aname for b in h.binds):
                    h.binds.append((m, aname))
    return list(found.values())


def _candidates(model: nn.Module, sel: Selection) -> List[Tuple[str, torch.Tensor, bool, List[Tuple[nn.Module, str]]]]:
    """(canonical name, tensor, is_buffer, bindings) of each distinct tensor to compress: the
    canonical name is the first of its names that the selection takes; every holder is rebound."""
    out = []
    for h in _distinct_tensors(model):
        full = next((n for n, m in zip(h.names, h.modules) if _selected(sel, m, n, h.tensor, h.is_buffer)), None)
        if full is None:
            continue
        if h.tensor.device.type == "meta":
            raise UsageError(f"compress_model: '{full}' is on the meta device (no values); use load_resident")
        out.append((full, h.tensor, h.is_buffer, h.binds))
    return out


# ---- groups: what one pre-hook decodes ---------------------------------------

_BLOCK_LISTS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_NOT_CALLED = (nn.ModuleList, nn.ModuleDict)  # containers without a forward (no hook would ever run)


def _find_groups(root: nn.Module, holders: Set[int]) -> List[Tuple[str, nn.Module, bool]]:
    """Top-level blocks: elements of layer lists (repeated = True), and other top-level parts that hold
    compressed weights."""
    memo_has: Dict[int, bool] = {}

    def has(m: nn.Module) -> bool:
        k = id(m)
        if k not in memo_has:
            memo_has[k] = k in holders or any(has(c) for c in m.children())
        return memo_has[k]

    def is_block_list(m: nn.Module) -> bool:
        return isinstance(m, _BLOCK_LISTS) and sum(1 for c in m.children() if has(c)) >= 2

    def has_block_list(m: nn.Module) -> bool:
        return is_block_list(m) or any(has_block_list(c) for c in m.children() if has(c))

    out: List[Tuple[str, nn.Module, bool]] = []
    seen: Set[int] = set()

    def add(name: str, m: nn.Module, repeated: bool = False) -> None:
        if isinstance(m, _NOT_CALLED) and id(m) not in holders:  # never called: its elements are the groups
            for n, c in m.named_children():
                if has(c):
                    add(f"{name}.{n}" if name else n, c, True)
            return
        if id(m) not in seen:
            seen.add(id(m))
            out.append((name, m, repeated))

    def visit(m: nn.Module, prefix: str) -> None:
        kids = [(n, c) for n, c in m.named_children() if has(c)]
        if id(m) in holders or not kids:
            add(prefix, m)
            return
        for n, c in kids:
            name = f"{prefix}.{n}" if prefix else n
            if is_block_list(m) or not has_block_list(c):
                add(name, c, is_block_list(m))
            else:
                visit(c, name)

    if has(root):
        visit(root, "")
    return out


def _selection(include: Any, exclude: Any, types: Any, min_numel: int, buffers: bool) -> Selection:
    if isinstance(include, str):
        include = [include]
    if isinstance(exclude, str):
        exclude = [exclude]
    if types is not None and not isinstance(types, tuple):
        types = tuple(types) if isinstance(types, (list, set)) else (types,)
    return Selection(list(include) if include is not None else None, list(exclude or []), types, int(min_numel),
                     bool(buffers))
