"""Resident weights: one compressed weight (its frames and uses) and how it is encoded."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from .. import _tensorzip as _C
from .._frame_layout import Frame

#: torch dtype -> codec dtype (tz_dtype)
CODEC_OF = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
if hasattr(torch, "float8_e4m3fn"):
    CODEC_OF[torch.float8_e4m3fn] = 4
    CODEC_OF[torch.float8_e5m2] = 5



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
        self.rows_only = False  # an nn.Embedding table: its forward decodes only the rows it reads

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
