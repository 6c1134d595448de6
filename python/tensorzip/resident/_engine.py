"""Device side of resident weights: where frames are decoded, and into what.

One engine per device holds the prepared plan (C++: ``_tensorzip.ResidentPlan``
on the CPU, ``ResidentPlanCuda`` on a GPU), two reusable scratch slots the
size of the largest layer (Layout.slot_bytes), and at most one decode ahead
of the running group (a prefetch: the plan's own thread on the CPU, a side
stream on CUDA).

Plan group ids: ``0 .. G-1`` are the model's groups (their exclusive tensors,
laid out in a slot), ``G + t`` is resident tensor ``t`` alone (decoded into a
buffer of its own: tensors shared between groups, accesses outside any group,
``state_dict()``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _tensorzip as _C
from .._core import CorruptDataError, UsageError


class _Slot:
    __slots__ = ("buf", "state", "group")

    def __init__(self) -> None:
        self.buf: Optional[torch.Tensor] = None
        self.state = "free"          # "free", "active", "prefetch"
        self.group = -1


class Engine:
    """Decoder of one device's resident tensors (built from a layout, rebuilt when tensors move)."""

    def __init__(self, device: torch.device, tensors: Sequence[Any], layout: "Layout", threads: int):
        self.device = device
        self.layout = layout
        self.n_groups = len(layout.group_bytes)
        self.tensors = list(tensors)
        self.slots = [_Slot(), _Slot()]
        self.prefetch_group = -1
        self.prefetch_slot = -1           # -1 with prefetch_group >= 0: into prefetch_buf, a buffer of its own
        self.prefetch_buf: Optional[torch.Tensor] = None
        self.prefetch_event: Any = None
        self.cuda = device.type == "cuda"
        if device.type not in ("cpu", "cuda"):
            raise UsageError(f"resident weights: device {device} is not supported (cpu and cuda are)")
        self._frames_alive: List[torch.Tensor] = []
        if self.cuda:
            self._build_cuda()
        else:
            self._build_cpu(threads)

    def __del__(self) -> None:
        # A decode ahead may still be writing a slot and reading frames: finish it before they go
        # (finalizers of a garbage cycle run before any of its objects is freed).
        try:
            self._drop_prefetch()
        except Exception:
            pass

    # ---- plan construction --------------------------------------------------

    def _plan_frames(self) -> List[List[Tuple[str, int, int, int, int]]]:
        """Per plan group: (name, frame pointer, frame size, raw size, offset in the destination)."""
        out: List[List[Tuple[str, int, int, int, int]]] = [[] for _ in range(self.n_groups + len(self.tensors))]
        group_device: Dict[int, torch.device] = {}
        for t_index, rt in enumerate(self.tensors):
            g = self.layout.group_of.get(t_index, -1)
            if g >= 0:
                other = group_device.setdefault(g, rt.device)
                if other != rt.device:
                    raise UsageError(f"resident weights: a group holds tensors on {other} and {rt.device} "
                                     f"('{rt.name}'); pass groups= whose weights share a device")
            if rt.device != self.device:
                continue
            self._frames_alive.append(rt.data)  # the plan reads them: they live as long as the engine
            base = rt.data.data_ptr()
            for f in rt.frames:
                item = (rt.name, base + f.offset, f.size, f.raw_size, f.raw_offset)
                out[self.n_groups + t_index].append(item)
                if g >= 0:
                    off = self.layout.offset_of[t_index]
                    out[g].append((rt.name, base + f.offset, f.size, f.raw_size, off + f.raw_offset))
        return out

    def _build_cpu(self, threads: int) -> None:
        self.plan = _C.ResidentPlan(threads)
        groups = self._plan_frames()
        for gid, items in enumerate(groups):
            for name, ptr, size, raw, off in items:
                got = self.plan.add(gid, name, ptr, size, off)
                if got != raw:
                    raise CorruptDataError(f"resident weights: tensor '{name}': frame decodes to {got} bytes, "
                                           f"{raw} expected")
        self.plan.finalize()

    def _build_cuda(self) -> None:
        if not getattr(_C, "HAVE_RESIDENT_CUDA", False):
            raise UsageError("resident weights on a CUDA device need the tensorzip module built with CUDA "
                             "(pip install . -C cmake.define.TZ_CUDA=ON)")
        self.plan = _C.ResidentPlanCuda()
        groups = self._plan_frames()
        self._status_offset: List[int] = []
        n = 0
        for gid, items in enumerate(groups):
            self._status_offset.append(n)
            n += len(items)
            for name, ptr, size, raw, off in items:
                self.plan.add(gid, name, ptr, size, raw, off)
        self._names = [[it[0] for it in items] for items in groups]
        self.plan.finalize()
        dev = self.device
        temp = max(256, int(self.plan.temp_bytes))
        self._temp = {"compute": torch.empty(temp, dtype=torch.uint8, device=dev),
                      "side": torch.empty(temp, dtype=torch.uint8, device=dev)}
        self._sizes = torch.zeros(max(1, n), dtype=torch.int64, device=dev)
        self._status = torch.zeros(max(1, n), dtype=torch.int32, device=dev)
        self._status_host = torch.zeros(max(1, n), dtype=torch.int32, pin_memory=True)
        self._status_event: Any = None
        self.side = torch.cuda.Stream(device=dev)

    # ---- decoding -----------------------------------------------------------

    def _decode(self, gid: int, dst: torch.Tensor, stream: str = "compute") -> None:
        cap = dst.numel()
        if gid >= self.plan.groups or not self._has_frames(gid):
            return  # nothing resident in it (e.g. a group whose tensors are all shared)
        if self.cuda:
            s = torch.cuda.current_stream(self.device) if stream == "compute" else self.side
            off = self._status_offset[gid]
            temp = self._temp[stream]
            self.plan.decode(gid, dst.data_ptr(), cap, temp.data_ptr(), temp.numel(),
                             self._sizes.data_ptr() + 8 * off, self._status.data_ptr() + 4 * off, s.cuda_stream)
        elif stream == "compute":
            self.plan.decode(gid, dst.data_ptr(), cap)
        else:
            self.plan.start(gid, dst.data_ptr(), cap)

    def _has_frames(self, gid: int) -> bool:
        return self.plan.frames(gid) > 0

    def _new_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(max(1, nbytes), dtype=torch.uint8, device=self.device)

    def decode_tensor(self, t_index: int) -> torch.Tensor:
        """Resident tensor t_index decoded into a new buffer (uint8, its raw bytes)."""
        rt = self.tensors[t_index]
        buf = self._new_buffer(rt.nbytes)
        self._decode(self.n_groups + t_index, buf)
        return buf

    def _slot_buffer(self, slot: _Slot) -> torch.Tensor:
        if slot.buf is None:
            slot.buf = self._new_buffer(self.layout.slot_bytes)
        return slot.buf

    def _fits(self, g: int) -> bool:
        return self.layout.group_bytes[g] <= self.layout.slot_bytes

    def _drop_prefetch(self) -> None:
        """Forgets a decode ahead that was not needed (waits for it; its error, if any, shows when used)."""
        if self.prefetch_group < 0:
            return
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.prefetch_event)
        else:
            try:
                self.plan.wait()
            except CorruptDataError:
                pass
        if self.prefetch_slot >= 0:
            slot = self.slots[self.prefetch_slot]
            slot.state, slot.group = "free", -1
        self.prefetch_group = self.prefetch_slot = -1
        self.prefetch_buf = None

    def acquire(self, g: int, fresh: bool) -> Tuple[torch.Tensor, int]:
        """Group g decoded: (buffer, slot index or -1 for a buffer of its own)."""
        if self.prefetch_group == g and not fresh:
            si, own = self.prefetch_slot, self.prefetch_buf
            self.prefetch_group = self.prefetch_slot = -1
            self.prefetch_buf = None
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self.prefetch_event)
            else:
                try:
                    self.plan.wait()
                except BaseException:
                    if si >= 0:
                        self.slots[si].state, self.slots[si].group = "free", -1
                    raise
            if si < 0:
                assert own is not None
                return own, -1
            self.slots[si].state = "active"
            return self._slot_buffer(self.slots[si]), si
        self._drop_prefetch()
        if fresh or not self._fits(g):
            buf = self._new_buffer(self.layout.group_bytes[g])
            self._decode(g, buf)
            return buf, -1
        for si, slot in enumerate(self.slots):
            if slot.state == "free":
                buf = self._slot_buffer(slot)
                self._decode(g, buf)  # raises before the slot is taken
                slot.state, slot.group = "active", g
                return buf, si
        buf = self._new_buffer(self.layout.group_bytes[g])  # both slots in use (nested groups)
        self._decode(g, buf)
        return buf, -1

    def release(self, si: int) -> None:
        # CUDA: the slot's readers are on the compute stream; a decode ahead into it waits for
        # everything enqueued there so far (_start_ahead), so nothing needs recording here.
        if si < 0:
            return
        slot = self.slots[si]
        slot.state, slot.group = "free", -1

    def prefetch(self, g: int) -> None:
        """Starts decoding group g into a free slot while the current group runs."""
        if self.prefetch_group >= 0 or g < 0 or g >= self.n_groups or self.layout.group_bytes[g] == 0:
            return
        if not self._fits(g):  # a group larger than the slots: ahead into a buffer of its own
            buf = self._new_buffer(self.layout.group_bytes[g])
            self._start_ahead(g, buf, None)
            self.prefetch_group, self.prefetch_slot, self.prefetch_buf = g, -1, buf
            return
        for si, slot in enumerate(self.slots):
            if slot.state == "free":
                self._start_ahead(g, self._slot_buffer(slot), slot)
                slot.state, slot.group = "prefetch", g
                self.prefetch_group, self.prefetch_slot = g, si
                return

    def _start_ahead(self, g: int, buf: torch.Tensor, slot: Optional[_Slot]) -> None:
        if self.cuda:
            # The side stream waits for the compute stream's work so far: the last readers of the
            # slot (the group before the running one) are in it, and under CUDA graph capture this
            # forks the side stream into the capture (joined again in acquire / after_forward).
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            self._decode(g, buf, "side")
            ev = torch.cuda.Event()
            ev.record(self.side)
            self.prefetch_event = ev
            buf.record_stream(self.side)
        else:
            self._decode(g, buf, "side")

    def quiesce(self) -> None:
        """Waits for any decode ahead (before the tensors or the plan change)."""
        self._drop_prefetch()

    def scratch_bytes(self) -> int:
        return sum(s.buf.numel() for s in self.slots if s.buf is not None)

    # ---- CUDA status (decode errors are reported by the device, read without a stall) --------

    def after_forward(self) -> None:
        if not self.cuda:
            return
        if self.prefetch_group >= 0:  # join the side stream (nothing left running past the forward)
            torch.cuda.current_stream(self.device).wait_event(self.prefetch_event)
        if torch.cuda.is_current_stream_capturing():
            return  # statuses of graph replays: check(model) reads them
        self._status_host.copy_(self._status, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        self._status_event = ev

    def check(self, block: bool = False) -> None:
        """Raises CorruptDataError for a frame the device failed to decode (CUDA; the CPU raises at once)."""
        if not self.cuda or torch.cuda.is_current_stream_capturing():
            return
        if block:
            torch.cuda.current_stream(self.device).synchronize()
            self.side.synchronize()
            host = self._status.cpu()
        elif self._status_event is None or not self._status_event.query():
            return
        else:
            host = self._status_host
        self._status_event = None
        bad = torch.nonzero(host).flatten().tolist()
        if bad:
            i = bad[0]
            gid = max(k for k, off in enumerate(self._status_offset) if off <= i)
            name = self._names[gid][i - self._status_offset[gid]]
            code = int(host[i])
            self._status.zero_()
            raise CorruptDataError(f"resident weights: tensor '{name}' failed to decode on {self.device} "
                                   f"(tz error code {code}); outputs of the forward that used it are not valid")

    @property
    def decode_seconds(self) -> float:
        return float(getattr(self.plan, "decode_seconds", 0.0))

    @property
    def plan_bytes(self) -> int:
        """Host bytes the CPU plan keeps per frame (decode tables built once, block index copies)."""
        return int(getattr(self.plan, "prepared_bytes", 0))

    @property
    def decoded_bytes(self) -> int:
        return int(getattr(self.plan, "decoded_bytes", 0))


class Layout:
    """Where each group's exclusive tensors sit in a slot (device-independent)."""

    ALIGN = 256

    def __init__(self, n_groups: int, members: Dict[int, List[int]], nbytes: Sequence[int],
                 repeated: Sequence[bool]):
        self.group_of: Dict[int, int] = {}
        self.offset_of: Dict[int, int] = {}
        self.group_bytes = [0] * n_groups
        for g in range(n_groups):
            off = 0
            for t in members.get(g, []):
                self.group_of[t] = g
                self.offset_of[t] = off
                off += (nbytes[t] + self.ALIGN - 1) // self.ALIGN * self.ALIGN
            self.group_bytes[g] = off
        self.max_group_bytes = max(self.group_bytes, default=0)
        # Slots fit the largest repeated layer (every group when the model has no layer list). A
        # larger group (a big embedding table or output head) gets a buffer of its own while it
        # runs, freed after it, so that the one-off giants are not held twice for the whole run.
        layers = [b for b, r in zip(self.group_bytes, repeated) if r]
        self.slot_bytes = max(layers) if layers else self.max_group_bytes
