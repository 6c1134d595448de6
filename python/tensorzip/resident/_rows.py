"""Embedding tables kept compressed, read by row.

An ``nn.Embedding`` forward needs only the rows of the ids it is given; its
table is often the model's largest tensor (vocabulary x width). For a table
held in CPU memory, such a forward decodes only the codec blocks that cover
those rows (every block of a frame decodes alone: through the CPU plan's
``decode_blocks``, with the frame's prepared tables, or ``tz_frame_block_range`` +
``tz_ctx_decompress_blocks`` without a plan) and gathers the rows from them: the
same values ``F.embedding`` reads from the plain table, bit for bit.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch

from .. import _tensorzip as _C


class _FrameIndex:
    """Block layout of one frame of a table: its prefix and each block's byte range."""

    __slots__ = ("raw_offset", "view", "prefix", "first_block", "blocks")

    def __init__(self, raw_offset: int, view: Any, prefix: Any, first_block: int, blocks: List[Tuple[int, int]]):
        self.raw_offset = raw_offset
        self.view = view            # the frame's bytes (NumPy view of the frame buffer)
        self.prefix = prefix
        self.first_block = first_block  # global index of its first codec block
        self.blocks = blocks        # (offset in the frame, compressed size) per block


class TableIndex:
    """Codec block layout of a resident 2-D table (built once per frame buffer)."""

    def __init__(self, rt: Any):
        self.key = (rt.data.data_ptr(), len(rt.frames))
        data = rt.data.numpy()
        es = torch.empty(0, dtype=rt.dtype).element_size()
        self.frames: List[_FrameIndex] = []
        self.block_bytes = 0
        self.usable = True
        first = 0
        for fi, f in enumerate(rt.frames):
            view = data[f.offset:f.offset + f.size]
            info = _C.frame_info(view)
            bb = int(info["block_elems"]) * es
            if self.block_bytes == 0:
                self.block_bytes = bb
            last = fi == len(rt.frames) - 1
            # global block ids need every frame but the last to hold whole blocks of one size
            if bb != self.block_bytes or (not last and f.raw_size % bb) or f.raw_offset != first * bb:
                self.usable = False
                return
            prefix = view[:int(info["prefix_size"])]
            blocks = []
            for b in range(int(info["n_blocks"])):
                off, size, _, _ = _C.frame_block_range(prefix, b, 1)
                blocks.append((int(off), int(size)))
            self.frames.append(_FrameIndex(f.raw_offset, view, prefix, first, blocks))
            first += len(blocks)
        self.n_blocks = first

    def decode_run(self, g0: int, g1: int, out: Any, out_offset: int, threads: int,
                   plan_blocks: Optional[Callable[[int, int, int, int, int], int]] = None) -> int:
        """Decodes global blocks [g0, g1] into out[out_offset:] (a uint8 tensor); returns the bytes
        written. plan_blocks(frame, first, count, dst_ptr, capacity): the plan's decode_blocks."""
        written = 0
        for fi, fr in enumerate(self.frames):
            lo, hi = max(g0, fr.first_block), min(g1, fr.first_block + len(fr.blocks) - 1)
            if lo > hi:
                continue
            a, b = lo - fr.first_block, hi - fr.first_block
            pos = out_offset + written
            if plan_blocks is not None:
                written += plan_blocks(fi, a, b - a + 1, out.data_ptr() + pos, out.numel() - pos)
                continue
            start = fr.blocks[a][0]
            end = fr.blocks[b][0] + fr.blocks[b][1]
            written += _C.decompress_blocks_into(fr.prefix, fr.view[start:end], a, b - a + 1, out.numpy(), pos,
                                                 threads)
        return written


def table_index(rt: Any) -> Optional[TableIndex]:
    idx = getattr(rt, "_rows_index", None)
    if idx is None or idx.key != (rt.data.data_ptr(), len(rt.frames)):
        idx = TableIndex(rt)
        rt._rows_index = idx
    return idx if idx.usable else None


def gather(rt: Any, ids: torch.Tensor, threads: int,
           plan_blocks: Optional[Callable[[int, int, int, int, int], int]] = None) -> Optional[Tuple[torch.Tensor, int]]:
    """(rows of the table for ids, shaped ids.shape + (width,), bytes decoded), or None to decode it whole."""
    idx = table_index(rt)
    if idx is None:
        return None
    num, dim = rt.shape
    es = torch.empty(0, dtype=rt.dtype).element_size()
    flat = ids.reshape(-1)
    if flat.numel() == 0:
        return torch.empty((*ids.shape, dim), dtype=rt.current_dtype), 0
    uniq, inv = torch.unique(flat, sorted=True, return_inverse=True)
    if int(uniq[0]) < 0 or int(uniq[-1]) >= num:
        raise IndexError("index out of range in self")
    bb = idx.block_bytes
    row_bytes = dim * es
    start = uniq * row_bytes
    first_b = start // bb
    last_b = (start + row_bytes - 1) // bb
    span = int((last_b - first_b).max()) + 1
    cand = first_b[:, None] + torch.arange(span)[None, :]
    need = torch.unique(cand[cand <= last_b[:, None]])  # sorted global block ids
    # Runs of consecutive blocks, decoded back to back into one buffer.
    breaks = torch.nonzero(need[1:] != need[:-1] + 1).flatten() + 1
    run_first = torch.cat([need[:1], need[breaks]])
    run_last = torch.cat([need[breaks - 1], need[-1:]])
    run_raw = run_first * bb
    run_len = torch.minimum((run_last + 1) * bb, torch.tensor(rt.nbytes)) - run_raw
    run_pos = torch.cumsum(run_len, 0) - run_len
    buf = torch.empty(int(run_len.sum()), dtype=torch.uint8)
    for g0, g1, pos in zip(run_first.tolist(), run_last.tolist(), run_pos.tolist()):
        idx.decode_run(g0, g1, buf, pos, threads, plan_blocks)
    run_of_row = torch.searchsorted(run_raw, start, right=True) - 1
    pos_bytes = run_pos[run_of_row] + (start - run_raw[run_of_row])
    # Row r of the decoded runs starts at element pos_bytes[r] // es: one gather of every id's row
    # from a view whose row e is the `dim` elements from element e on.
    table = buf.view(rt.dtype)
    starts = table.as_strided((table.numel() - dim + 1, dim), (1, 1))
    rows = torch.index_select(starts, 0, (pos_bytes // es)[inv])
    for d in rt.casts:
        rows = rows.to(d)
    return rows.view(*ids.shape, dim), buf.numel()
