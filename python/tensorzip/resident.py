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

import fnmatch
import weakref
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn

from . import _tensorzip as _C
from ._core import UsageError
from ._resident_engine import Engine, Layout

__all__ = ["compress_model", "decompress_model", "load_resident", "resident_stats", "is_resident",
           "ResidentTensor"]

#: torch dtype -> codec dtype (tz_dtype)
CODEC_OF = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
if hasattr(torch, "float8_e4m3fn"):
    CODEC_OF[torch.float8_e4m3fn] = 4
    CODEC_OF[torch.float8_e5m2] = 5

_FRAME_ALIGN = 16  # frames start 4-byte aligned at least (the CUDA decoder's requirement)


class Frame(NamedTuple):
    offset: int      # in the tensor's uint8 buffer
    size: int        # compressed bytes
    raw_offset: int  # in the tensor's bytes
    raw_size: int


class ResidentTensor:
    """One compressed weight: its frames (a uint8 buffer registered on its owner module) and its uses."""

    def __init__(self, name: str, dtype: torch.dtype, shape: Tuple[int, ...], frames: List[Frame],
                 requires_grad: bool, is_buffer: bool):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.frames = frames
        self.nbytes = sum(f.raw_size for f in frames)
        self.requires_grad = requires_grad
        self.is_buffer = is_buffer
        self.owner: Optional[nn.Module] = None
        self.buf_name = ""
        self.bindings: List[Tuple[nn.Module, str]] = []
        self.casts: List[torch.dtype] = []  # dtype conversions applied since (model.half(), .to(dtype))
        self.live: Optional[torch.Tensor] = None  # the decoded tensor while its group runs
        self.refs = 0

    @property
    def data(self) -> torch.Tensor:
        assert self.owner is not None
        return self.owner._buffers[self.buf_name]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def compressed_bytes(self) -> int:
        return int(self.data.numel())

    def view_of(self, raw: torch.Tensor) -> torch.Tensor:
        """The tensor from its decoded bytes (uint8, at least nbytes), after the recorded casts."""
        t = raw[: self.nbytes].view(self.dtype).view(self.shape) if self.nbytes else \
            torch.empty(self.shape, dtype=self.dtype, device=raw.device)
        for d in self.casts:
            t = t.to(d)
        return t

    @property
    def current_dtype(self) -> torch.dtype:
        return self.casts[-1] if self.casts else self.dtype

    def __repr__(self) -> str:
        return (f"ResidentTensor({self.name!r}, {self.dtype}, {list(self.shape)}, {self.nbytes} -> "
                f"{self.data.numel() if self.owner is not None else '?'} bytes)")


# ---- encoding --------------------------------------------------------------

def _encode(t: torch.Tensor, level: int, block_elems: int, threads: int) -> Tuple[torch.Tensor, List[Frame]]:
    """One frame of t's bytes, in a new CPU uint8 tensor."""
    host = t.detach()
    if host.device.type != "cpu":
        host = host.to("cpu")
    host = host.contiguous()
    raw = host.reshape(-1).view(torch.uint8).numpy()
    frame = _C.compress(b"", raw, CODEC_OF[t.dtype], level, block_elems, threads)
    buf = torch.frombuffer(bytearray(frame), dtype=torch.uint8) if frame else torch.empty(0, dtype=torch.uint8)
    return buf, [Frame(0, len(frame), 0, raw.nbytes)]


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


def _candidates(model: nn.Module, sel: Selection) -> List[Tuple[str, torch.Tensor, bool, List[Tuple[nn.Module, str]]]]:
    """(canonical name, tensor, is_buffer, bindings) of each distinct tensor to compress."""
    found: Dict[int, Tuple[str, torch.Tensor, bool, List[Tuple[nn.Module, str]]]] = {}
    order: List[int] = []
    for mname, m in model.named_modules(remove_duplicate=False):
        for is_buffer, table in ((False, m._parameters), (True, m._buffers)):
            for aname, t in table.items():
                if t is None or (is_buffer and aname in m._non_persistent_buffers_set):
                    continue
                full = f"{mname}.{aname}" if mname else aname
                key = id(t)
                if key in found:
                    if all(b[0] is not m or b[1] != aname for b in found[key][3]):
                        found[key][3].append((m, aname))
                    continue
                if not _selected(sel, m, full, t, is_buffer):
                    continue
                if t.device.type == "meta":
                    raise UsageError(f"compress_model: '{full}' is on the meta device (no values); use load_resident")
                found[key] = (full, t, is_buffer, [(m, aname)])
                order.append(key)
    return [found[k] for k in order]


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


def _resident_class(cls: type) -> type:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__setattr__": _sub_setattr,
              "_apply": _sub_apply, "_save_to_state_dict": _sub_save, "_load_from_state_dict": _sub_load,
              "_tz_resident_class": True}
        sub = type(cls)(cls.__name__, (cls,), ns)
        _SUBCLASSES[cls] = sub
    return sub


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


def _buffer_name(module: nn.Module, attr: str) -> str:
    name = f"_tz_{attr}"
    while name in module._buffers or name in module._parameters or name in module._modules:
        name = "_" + name
    return name


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
            block_elems: int) -> nn.Module:
    """items: (name, frame buffer on its device, frames, dtype, shape, requires_grad, is_buffer, bindings)."""
    tensors: List[ResidentTensor] = []
    for name, buf, frames, dtype, shape, rg, is_buffer, bindings in items:
        rt = ResidentTensor(name, dtype, shape, frames, rg, is_buffer)
        rt.bindings = list(bindings)
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


def _selection(include: Any, exclude: Any, types: Any, min_numel: int, buffers: bool) -> Selection:
    if isinstance(include, str):
        include = [include]
    if isinstance(exclude, str):
        exclude = [exclude]
    if types is not None and not isinstance(types, tuple):
        types = tuple(types) if isinstance(types, (list, set)) else (types,)
    return Selection(list(include) if include is not None else None, list(exclude or []), types, int(min_numel),
                     bool(buffers))


def compress_model(model: nn.Module, *, include: Any = None, exclude: Any = None, types: Any = None,
                   min_numel: int = 4096, buffers: bool = False,
                   groups: Optional[Sequence[Union[str, nn.Module]]] = None,
                   level: int = 0, block_elems: int = 0, threads: int = 0, prefetch: bool = True) -> nn.Module:
    """Keeps the large floating-point weights of ``model`` compressed in memory; returns ``model``.

    What stays compressed (no per-architecture table): by default every floating-point
    parameter (BF16, F16, F32, FP8) with at least 2 dimensions and ``min_numel`` elements:
    the weights of Linear, Embedding, Conv and similar layers; biases and norms stay plain.
    ``types``: only parameters of modules of these classes; ``include`` / ``exclude``:
    ``fnmatch`` patterns over full names (``"blocks.*.fc1.weight"``; ``include`` selects
    exactly what matches); ``buffers=True`` also takes floating-point persistent buffers.

    ``groups``: the modules (names or objects) whose forward decodes their weights in one
    batch; default: each element of the model's layer lists (ModuleList / Sequential /
    ModuleDict) and each other top-level part holding compressed weights. ``prefetch``:
    decode the next group while the current one runs. ``threads``: CPU decode workers
    (0 = all hardware threads). ``level`` / ``block_elems``: codec options.

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
    return _attach(model, items, groups, threads, prefetch, level, block_elems)


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
    ``scratch_bytes``: decode slots allocated now (two slots of ``max_group_bytes`` once a
    forward ran); ``decode_seconds`` / ``decoded_bytes``: CPU decode totals.
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
        "decode_seconds": sum(e.decode_seconds for e in state.engines.values()),
        "decoded_bytes": sum(e.decoded_bytes for e in state.engines.values()),
        "on_demand_decodes": state.on_demand_decodes,
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
    from ._resident_load import load_resident as _load

    return _load(model, path, **kwargs)


def from_pretrained(model_class: Any, path: Any, **kwargs: Any) -> nn.Module:
    """A transformers model from a compressed folder, built on the meta device, weights kept compressed."""
    from ._resident_load import from_pretrained as _fp

    return _fp(model_class, path, **kwargs)
