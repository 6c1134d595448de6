"""Resident weights: the state attached to a compressed model (groups, hooks, engines) and _attach."""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .._core import UsageError
from ._classes import _buffer_name, _property, _resident_class, _rows_only
from ._engine import Engine, Layout
from ._select import _NOT_CALLED, _find_groups
from ._tensor import CODEC_OF, Frame, ResidentTensor, _encode

# ---- the model's state ---------------------------------------------------------

class _Group:
    __slots__ = ("name", "module", "repeated", "members", "shared", "active", "slot", "buf", "hooks")

    def __init__(self, name: str, module: nn.Module, repeated: bool):
        self.name = name
        self.module = module
        self.repeated = repeated  # an element of a layer list: the slots are sized for these
        self.members: List[int] = []   # exclusive resident tensors (indices)
        self.shared: List[int] = []    # tensors also used by other groups
        self.active = 0
        self.slot = -1
        self.buf: Optional[torch.Tensor] = None
        self.hooks: List[Any] = []


class ResidentState:
    """Everything compress_model attached to one model (``model.__dict__['_tz_resident']``)."""

    def __init__(self, root: nn.Module, tensors: List[ResidentTensor], threads: int, prefetch: bool,
                 level: int, block_elems: int):
        self.root_ref = weakref.ref(root)
        self.tensors = tensors
        self.threads = threads
        self.prefetch = prefetch
        self.level = level
        self.block_elems = block_elems
        self.groups: List[_Group] = []
        self.engines: Dict[torch.device, Engine] = {}
        self.layout: Optional[Layout] = None
        self.prev_group = -1
        self.successor: Dict[int, int] = {}
        self.root_hooks: List[Any] = []
        # state_dict(): one decoded tensor per resident tensor and destination dict (tied weights
        # appear under two names as one tensor, as in a plain model); dropped with the dict.
        self._memo: Dict[int, Tuple[Any, Dict[int, torch.Tensor]]] = {}
        self.on_demand_decodes = 0
        self.load_report: Optional[Dict[str, List[str]]] = None  # set by load_resident
        self._held: Dict[int, List[int]] = {}  # group -> shared tensors it holds a reference to
        self.rows_decoded_bytes = 0  # embedding rows read by block (tensorzip._resident_rows)

    # ---- layout and engines ----
    def index(self, rt: ResidentTensor) -> int:
        for i, t in enumerate(self.tensors):
            if t is rt:
                return i
        raise KeyError(rt.name)

    def build_groups(self, groups: List[Tuple[str, nn.Module, bool]]) -> None:
        owner_group: Dict[int, int] = {}
        for gi, (name, m, repeated) in enumerate(groups):
            self.groups.append(_Group(name, m, repeated))
            for sub in m.modules():
                owner_group.setdefault(id(sub), gi)
        for ti, rt in enumerate(self.tensors):
            if rt.rows_only:
                continue  # decoded row by row by its embedding's forward, in no group's slot
            gs = sorted({owner_group[id(m)] for m, _ in rt.bindings})
            if len(gs) == 1:
                self.groups[gs[0]].members.append(ti)
            else:
                for g in gs:
                    self.groups[g].shared.append(ti)
        self.relayout()

    def relayout(self) -> None:
        self.quiesce()
        self.engines.clear()
        self.layout = Layout(len(self.groups), {g: grp.members for g, grp in enumerate(self.groups)},
                             [rt.nbytes for rt in self.tensors], [grp.repeated for grp in self.groups])

    def quiesce(self) -> None:
        for e in self.engines.values():
            e.quiesce()

    def engine(self, device: torch.device) -> Engine:
        e = self.engines.get(device)
        if e is None:
            assert self.layout is not None
            e = Engine(device, self.tensors, self.layout, self.threads)  # decodes the tensors on `device`
            self.engines[device] = e
        return e

    def _engine_for(self, rt: ResidentTensor) -> Engine:
        return self.engine(rt.device)

    # ---- decoded values ----
    def plain(self, rt: ResidentTensor, memo: Any = None) -> torch.Tensor:
        """rt decoded into a tensor of its own (what a plain model's attribute holds)."""
        if rt.live is not None:
            return rt.live.clone() if memo is not None else rt.live
        cache = None
        if memo is not None:
            key = id(memo)
            entry = self._memo.get(key)
            if entry is None or entry[0]() is not memo:
                try:
                    ref = weakref.ref(memo, lambda _r, _k=key, _m=self._memo: _m.pop(_k, None))
                except TypeError:  # a destination without weak references: no sharing
                    ref = None
                if ref is not None:
                    entry = (ref, {})
                    self._memo[key] = entry
            if entry is not None:
                cache = entry[1]
                if id(rt) in cache:
                    return cache[id(rt)]
        e = self._engine_for(rt)
        self.on_demand_decodes += 1
        t = rt.view_of(e.decode_tensor(self.index(rt)))
        if cache is not None:
            cache[id(rt)] = t
        return t

    def rows(self, rt: ResidentTensor, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """An embedding lookup decoding only the blocks that hold the rows (None: decode it whole)."""
        from ._rows import gather

        e = self._engine_for(rt)
        plan_blocks = None
        if not e.cuda:  # the frames' tables prepared once, in the plan (its group n_groups + t: rt alone)
            gid = e.n_groups + self.index(rt)
            plan_blocks = lambda fi, first, count, ptr, cap: e.plan.decode_blocks(gid, fi, first, count, ptr, cap)  # noqa: E731
        got = gather(rt, ids, self.threads, plan_blocks)
        if got is None:
            return None
        out, nbytes = got
        self.rows_decoded_bytes += nbytes
        return out

    def reencode(self, rt: ResidentTensor, value: torch.Tensor) -> None:
        """New values for rt (load_state_dict): encoded in rt's current dtype, on its device."""
        self.quiesce()
        dtype = rt.current_dtype
        if dtype not in CODEC_OF:
            raise UsageError(f"'{rt.name}': {dtype} cannot stay compressed")
        buf, frames = _encode(value.detach().to(dtype), self.level, self.block_elems, self.threads)
        rt.dtype, rt.casts, rt.frames = dtype, [], frames
        rt.nbytes = sum(f.raw_size for f in frames)
        assert rt.owner is not None
        rt.owner._buffers[rt.buf_name] = buf.to(rt.device)
        self._memo.clear()
        self.relayout()

    # ---- hooks ----
    def enter(self, g: int) -> None:
        grp = self.groups[g]
        if self.prev_group >= 0 and self.prev_group != g:
            self.successor[self.prev_group] = g
        self.prev_group = g
        grp.active += 1
        if grp.active > 1:
            return
        fresh = torch.is_grad_enabled()  # autograd may keep the weights: never hand it a reused slot
        try:
            self._materialise(g, grp, fresh)
        except BaseException:
            grp.active = 0
            self._release(grp)
            raise
        if self.prefetch and not fresh:
            nxt = self.successor.get(g, g + 1 if g + 1 < len(self.groups) else -1)
            if 0 <= nxt < len(self.groups) and self.groups[nxt].members and self.groups[nxt].active == 0:
                self._engine_for(self.tensors[self.groups[nxt].members[0]]).prefetch(nxt)

    def _materialise(self, g: int, grp: _Group, fresh: bool) -> None:
        if grp.members:
            e = self._engine_for(self.tensors[grp.members[0]])
            e.check()
            buf, grp.slot = e.acquire(g, fresh)
            grp.buf = buf
            assert self.layout is not None
            for ti in grp.members:
                rt = self.tensors[ti]
                off = self.layout.offset_of[ti]
                rt.live = rt.view_of(buf[off:off + rt.nbytes])
        for ti in grp.shared:
            rt = self.tensors[ti]
            if rt.refs == 0:
                rt.live = rt.view_of(self._engine_for(rt).decode_tensor(ti))
            rt.refs += 1
            self._held.setdefault(g, []).append(ti)

    def _release(self, grp: _Group) -> None:
        g = self.groups.index(grp)
        for ti in grp.members:
            self.tensors[ti].live = None
        for ti in self._held.pop(g, []):
            rt = self.tensors[ti]
            rt.refs -= 1
            if rt.refs == 0:
                rt.live = None
        if grp.members and grp.slot >= 0:
            self._engine_for(self.tensors[grp.members[0]]).release(grp.slot)
        grp.slot, grp.buf = -1, None

    def exit(self, g: int) -> None:
        grp = self.groups[g]
        if grp.active == 0:
            return
        grp.active -= 1
        if grp.active == 0:
            self._release(grp)

    def forward_begin(self) -> None:
        self.prev_group = -1

    def forward_end(self) -> None:
        for e in self.engines.values():
            e.after_forward()

    def check(self) -> None:
        """Waits for the device and raises for any frame that failed to decode there (CUDA)."""
        for e in self.engines.values():
            e.check(block=True)

    # ---- model changes ----
    def after_apply(self, module: nn.Module, fn: Any) -> None:
        b = module.__dict__.get("_tz_bind") or {}
        for rt in {id(r): r for r in b.values()}.values():
            if rt.owner is not module:
                continue
            buf = rt.data
            if buf.dtype != torch.uint8:  # e.g. Module.type(dtype) converts every tensor: undo it exactly
                back = buf.to(torch.uint8)
                if not torch.equal(back.to(buf.dtype), buf):
                    raise UsageError(f"'{rt.name}': its compressed bytes were converted to {buf.dtype}")
                rt.owner._buffers[rt.buf_name] = back
            cur = rt.current_dtype
            probe = fn(torch.empty(0, dtype=cur, device=rt.device))
            if isinstance(probe, torch.Tensor) and probe.dtype != cur and probe.dtype.is_floating_point:
                rt.casts.append(probe.dtype)
        self.quiesce()
        self.engines.clear()
        self._memo.clear()

    def unbind(self, module: nn.Module, attr: str) -> None:
        self.quiesce()
        b = module.__dict__["_tz_bind"]
        rt = b.pop(attr)
        rt.bindings = [(m, a) for m, a in rt.bindings if not (m is module and a == attr)]
        table = module._buffers if rt.is_buffer else module._parameters
        table[attr] = None  # still a registered slot, as in a plain module (the caller assigns it next)
        if rt.owner is module and rt.bindings:  # move the frames to another user
            m2 = rt.bindings[0][0]
            name2 = _buffer_name(m2, rt.bindings[0][1])
            m2._buffers[name2] = module._buffers.pop(rt.buf_name)
            m2._non_persistent_buffers_set.add(name2)
            rt.owner, rt.buf_name = m2, name2
        elif not rt.bindings:
            module._buffers.pop(rt.buf_name, None)
            ti = self.index(rt)
            self.tensors.pop(ti)
            for grp in self.groups:
                grp.members = [i - (i > ti) for i in grp.members if i != ti]
                grp.shared = [i - (i > ti) for i in grp.shared if i != ti]
        self.relayout()


def is_resident(model: nn.Module) -> bool:
    """True when compress_model (or load_resident) was applied to ``model``."""
    return "_tz_resident" in model.__dict__


def _state(model: nn.Module) -> ResidentState:
    s = model.__dict__.get("_tz_resident")
    if s is None:
        raise UsageError("the model has no resident (compressed) weights: call tensorzip.torch.compress_model first")
    return s


# ---- attaching ---------------------------------------------------------------

def _attach(model: nn.Module, items: List[Tuple[str, torch.Tensor, List[Frame], torch.dtype, Tuple[int, ...], bool,
                                                bool, List[Tuple[nn.Module, str]]]],
            groups: Optional[Sequence[Union[str, nn.Module]]], threads: int, prefetch: bool, level: int,
            block_elems: int, rows: bool = True) -> nn.Module:
    """items: (name, frame buffer on its device, frames, dtype, shape, requires_grad, is_buffer, bindings)."""
    tensors: List[ResidentTensor] = []
    for name, buf, frames, dtype, shape, rg, is_buffer, bindings in items:
        rt = ResidentTensor(name, dtype, shape, frames, rg, is_buffer)
        rt.bindings = list(bindings)
        rt.rows_only = rows and _rows_only(rt)
        owner, attr = bindings[0]
        rt.owner, rt.buf_name = owner, _buffer_name(owner, attr)
        tensors.append(rt)
    state = ResidentState(model, tensors, threads, prefetch, level, block_elems)
    holders = {id(m) for rt in tensors for m, _ in rt.bindings}
    if groups is None:
        found = _find_groups(model, holders)
    else:
        mods = dict(model.named_modules())
        found = []
        for g in groups:
            if isinstance(g, str):
                if g not in mods:
                    raise UsageError(f"compress_model: groups= names '{g}', which is not a module of the model")
                gname, gmod = g, mods[g]
            else:
                gname, gmod = next((n for n, m in mods.items() if m is g), "?"), g
            if isinstance(gmod, _NOT_CALLED):  # a layer list: each element is a group
                found.extend((f"{gname}.{n}", c, True) for n, c in gmod.named_children())
            else:
                found.append((gname, gmod, True))
        covered = {id(s) for _, m, _ in found for s in m.modules()}
        for mname, m in model.named_modules():
            if id(m) in holders and id(m) not in covered:
                found.append((mname, m, False))  # weights outside the given groups: a group each
                covered.update(id(s) for s in m.modules())
    # From here on the model changes.
    for rt, (_, buf, *_rest) in zip(tensors, items):
        for m, attr in rt.bindings:
            if "_tz_orig_class" not in m.__dict__:
                m.__dict__["_tz_orig_class"] = type(m)
                m.__dict__["_tz_bind"] = {}
                m.__dict__["_tz_state"] = weakref.ref(state)
                object.__setattr__(m, "__class__", _resident_class(type(m)))
            sub = type(m)
            if not isinstance(sub.__dict__.get(attr), property):
                setattr(sub, attr, _property(attr))
            m.__dict__["_tz_bind"][attr] = rt
            (m._buffers if rt.is_buffer else m._parameters)[attr] = None
        assert rt.owner is not None
        rt.owner._buffers[rt.buf_name] = buf
        rt.owner._non_persistent_buffers_set.add(rt.buf_name)
    state.build_groups(found)
    for gi, grp in enumerate(state.groups):
        grp.hooks.append(grp.module.register_forward_pre_hook(lambda mod, args, _g=gi: state.enter(_g)))
        grp.hooks.append(grp.module.register_forward_hook(lambda mod, args, out, _g=gi: state.exit(_g),
                                                          always_call=True))
    state.root_hooks.append(model.register_forward_pre_hook(lambda mod, args: state.forward_begin(), prepend=True))
    state.root_hooks.append(model.register_forward_hook(lambda mod, args, out: state.forward_end(), always_call=True))
    model.__dict__["_tz_resident"] = state
    return model
