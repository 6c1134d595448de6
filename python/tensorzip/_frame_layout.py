"""A tensor's frames, as stored in a .tzip file, packed into one buffer for a decoder: the layout
the resident weights (``tensorzip.resident``) and the vLLM load's device path
(``tensorzip._vllm_device``) read frames into (``_tensorzip.read_frames_into``) and hand to the
decoders. No torch here."""
from __future__ import annotations

from typing import Any, Iterable, List, NamedTuple, Tuple

#: Frame starts in the buffer: 4-byte aligned at least (the CUDA decoder's rule).
FRAME_ALIGN = 16


class Frame(NamedTuple):
    offset: int      # in the tensor's uint8 buffer
    size: int        # compressed bytes
    raw_offset: int  # in the tensor's bytes
    raw_size: int


def pack_frames(rows: Iterable[Tuple[Any, Any, Any, Any]]) -> Tuple[List[Frame], List[Tuple[int, int, int, int]], int]:
    """A tensor's frame rows ``(file offset, stored size, raw size, xxh64)`` (``tzip_frame_table``)
    -> (its frames at their places in the buffer, ``read_frames_into``'s reads ``(file offset,
    size, xxh64, buffer offset)``, the buffer's size in bytes)."""
    frames: List[Frame] = []
    reads: List[Tuple[int, int, int, int]] = []
    pos = raw = 0
    for off, size, raw_size, xxh in rows:
        frames.append(Frame(pos, int(size), raw, int(raw_size)))
        reads.append((int(off), int(size), int(xxh), pos))
        pos += (int(size) + FRAME_ALIGN - 1) // FRAME_ALIGN * FRAME_ALIGN
        raw += int(raw_size)
    return frames, reads, pos
