"""Memory for tensors decoded one after another and dropped by their consumer, reused once a tensor's
memory is free: the weights stream of a model load (``tensorzip._vllm_weights``), where the engine
copies each tensor into its own parameter and drops it.

Why: a large tensor's memory comes fresh from the kernel (glibc maps large blocks on allocation and
unmaps them on free), so each new tensor costs a page fault and a zeroed page per 4 KiB before the
decoder writes it: for a BF16 model, about as many faults as the engine's own first touch of its
parameters. Decoding into memory that an earlier, dropped tensor used skips them.

Safety rule: a block returns to the pool only when nothing refers to the memory any more. Each
tensor is ``torch.from_numpy`` of a NumPy view made for it; the tensor's storage holds that view
and releases it when the last tensor or view sharing the storage is gone (a consumer that keeps
``w.t()`` keeps the storage); a ``weakref.finalize`` on the view then gives the block back. A
consumer that keeps its tensors simply never gives their blocks back: the pool then allocates, as
without it.
"""
from __future__ import annotations

import threading
import weakref
from typing import List, Optional

import numpy as np

__all__ = ["BufferPool"]

#: Tensors smaller than this are allocated as usual (malloc's own free lists serve them well).
MIN_POOLED_BYTES = 1 << 20


class BufferPool:
    """Blocks of memory for decoded tensors, handed out by :meth:`memory` and taken back when the
    tensor made over them is freed.

    Args:
        keep: free blocks held at most; when one more comes back, the smallest goes (to the
            allocator). The memory the pool adds to a load is at most ``keep`` blocks, each no larger
            than the largest tensor it served.
        min_bytes: requests below this get None (the caller allocates as usual); default
            ``MIN_POOLED_BYTES``.
    """

    def __init__(self, keep: int, min_bytes: Optional[int] = None):
        if keep < 1:
            raise ValueError(f"BufferPool: keep must be >= 1, got {keep}")
        self._keep = keep
        self._min = MIN_POOLED_BYTES if min_bytes is None else min_bytes
        self._free: List[np.ndarray] = []
        self._lock = threading.Lock()
        self._closed = False
        self.reused = 0     # requests served from a block given back
        self.allocated = 0  # requests that allocated a new block

    def memory(self, nbytes: int) -> Optional[np.ndarray]:
        """A writable uint8 array of exactly ``nbytes`` for one tensor to be made over (with
        ``torch.from_numpy``; the caller must not keep the array itself), or None when ``nbytes`` is
        below ``min_bytes`` or the pool is closed. Its block comes back to the pool when the array
        is freed."""
        if nbytes < self._min or self._closed:
            return None
        block = self._take(nbytes)
        view = block[:nbytes]
        fin = weakref.finalize(view, self._give, block)
        fin.atexit = False
        return view

    def free_blocks(self) -> int:
        with self._lock:
            return len(self._free)

    def close(self) -> None:
        """Drops the free blocks; blocks given back later are dropped too."""
        with self._lock:
            self._closed = True
            self._free.clear()

    def _take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            best = -1
            for i, b in enumerate(self._free):  # the smallest block that holds nbytes
                if b.nbytes >= nbytes and (best < 0 or b.nbytes < self._free[best].nbytes):
                    best = i
            if best >= 0:
                self.reused += 1
                return self._free.pop(best)
            self.allocated += 1
        return np.empty(nbytes, dtype=np.uint8)

    def _give(self, block: np.ndarray) -> None:
        with self._lock:
            if self._closed:
                return
            self._free.append(block)
            if len(self._free) > self._keep:
                smallest = min(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                del self._free[smallest]
