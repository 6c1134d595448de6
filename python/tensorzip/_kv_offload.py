"""Compressed KV block offloading, the engine-neutral parts (no vLLM import; doc/kv.md
"vLLM KV offloading").

- :class:`OffloadIndex` (scheduler side): which blocks are offloaded, in which slot, LRU order,
  and a byte budget charged with the compressed size each block really holds.
- :class:`CompressedBlockStore` (worker side): the offloaded blocks as encoded KV pages in host
  memory (one page per block and KV tensor), tables per KV tensor, calibrated from the first
  stored blocks (or loaded), recalibrated when they stop paying.
- :class:`SlotSizes`: the bytes each slot holds, written by the workers and read by the index,
  through a small shared-memory file (the scheduler and the workers may be separate processes).

``tensorzip._vllm_offload`` adapts these to vLLM's ``OffloadingSpec`` API.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from . import _core
from ._core import TensorZipError, UsageError

#: Page header size of the KV page codec (doc/kv.md section 3.1).
PAGE_HEADER_BYTES = 16
from .kv._recalibration import CHECK_PAGES, RatioWindow, keeps_loaded  # the recalibration rule (doc/kv.md)

_KV_DTYPES = {"bfloat16": "BF16", "bf16": "BF16", "float16": "F16", "half": "F16", "fp16": "F16",
              "fp8": "F8_E4M3", "fp8_e4m3": "F8_E4M3", "float8_e4m3fn": "F8_E4M3",
              "fp8_e5m2": "F8_E5M2", "float8_e5m2": "F8_E5M2"}


def kv_dtype_of(name: str) -> str:
    """An engine's KV cache dtype name (``bfloat16``, ``torch.float16``, ``fp8_e4m3``, ...) -> the
    codec's (BF16, F16, F8_E4M3, F8_E5M2); other dtypes are refused."""
    key = str(name).lower().removeprefix("torch.")
    if key not in _KV_DTYPES:
        raise UsageError(f"KV offloading: the KV cache dtype {name!r} is not one the KV page codec codes "
                         f"(bfloat16, float16, fp8_e4m3, fp8_e5m2)")
    return _KV_DTYPES[key]


# ---- slot sizes, shared between the scheduler and the workers ------------------------------

class SlotSizes:
    """``int64[ranks, slots]``: the bytes each worker holds for each slot, in a file of
    ``/dev/shm`` (the system's temporary folder where there is none) named by the engine id.
    Every side opens (or creates) the same file; :meth:`unlink` removes the name."""

    def __init__(self, engine_id: str, ranks: int, slots: int, folder: Optional[str] = None):
        if ranks <= 0 or slots <= 0:
            raise UsageError(f"KV offloading: slot sizes for {ranks} rank(s) and {slots} slot(s)")
        folder = folder or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(engine_id))[:100]
        self.path = os.path.join(folder, f"tensorzip-kv-offload-{safe}-{ranks}x{slots}")
        nbytes = ranks * slots * 8
        # Never through a link, and only a regular file of this user's: the folder is shared.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size not in (0, nbytes):
                raise UsageError(f"KV offloading: {self.path}: exists and is not this engine's slot-sizes file")
            if st.st_size < nbytes:
                os.ftruncate(fd, nbytes)
            self._map = np.memmap(self.path, dtype=np.int64, mode="r+", shape=(ranks, slots))
        finally:
            os.close(fd)

    def write(self, rank: int, slot: int, nbytes: int) -> None:
        self._map[rank, slot] = nbytes

    def total(self, slot: int) -> int:
        return int(self._map[:, slot].sum())

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# ---- scheduler side: the index ---------------------------------------------------------------

_LIVE_INDEXES: "weakref.WeakSet[OffloadIndex]" = weakref.WeakSet()


def live_indexes() -> List["OffloadIndex"]:
    """The offload indexes of this process (for tests: what the scheduler side charged)."""
    return list(_LIVE_INDEXES)

@dataclass
class _Entry:
    slot: int
    nbytes: int  # charged to the budget: the reservation while pending, then the bytes held
    ready: bool = False
    readers: int = 0


@dataclass
class StorePlan:
    keys: List[Any]            # keys to store now, in the order of slots
    slots: List[int]
    evicted: List[Any]         # keys evicted to make room
    drop: List[int] = field(default_factory=list)  # slots whose blocks the worker must free first


class OffloadIndex:
    """Offloaded blocks by key: slot, readiness, readers, LRU order, bytes charged.

    Budget rule: ``held`` (the sum charged) never exceeds ``budget``. A block being stored is
    charged ``reserve`` (its largest encoded size); when its store completes, the bytes it really
    holds (``complete_store(sizes)``). Room is made by evicting least recently used ready blocks
    that nobody reads and that the store does not name. ``slots`` bounds the number of blocks."""

    def __init__(self, budget: int, reserve: int, slots: int):
        if reserve <= 0 or budget < 0 or slots < 0:
            raise UsageError(f"KV offloading: budget {budget}, reserve {reserve}, slots {slots}")
        self.budget, self.reserve, self.slots = int(budget), int(reserve), int(slots)
        self.reset()
        _LIVE_INDEXES.add(self)

    def reset(self) -> None:
        self._entries: "OrderedDict[Any, _Entry]" = OrderedDict()
        self._free: List[int] = []
        self._fresh = 0
        self.held = 0
        self._drop: List[int] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def state(self, key: Any) -> Optional[str]:
        """None (not offloaded), "pending" (being stored) or "ready"."""
        e = self._entries.get(key)
        return None if e is None else ("ready" if e.ready else "pending")

    def ready_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.ready)

    def prepare_load(self, keys: Iterable[Any]) -> List[int]:
        slots = []
        for key in keys:
            e = self._entries.get(key)
            if e is None or not e.ready:
                raise UsageError(f"KV offloading: block {key!r} is not offloaded (load of a block never stored)")
            e.readers += 1
            self._entries.move_to_end(key)
            slots.append(e.slot)
        return slots

    def complete_load(self, keys: Iterable[Any]) -> None:
        for key in keys:
            e = self._entries.get(key)
            if e is not None and e.readers > 0:
                e.readers -= 1

    def touch(self, keys: Iterable[Any]) -> None:
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)

    def _evictable(self, protected: set) -> Iterable[Any]:
        return [k for k, e in self._entries.items() if e.ready and e.readers == 0 and k not in protected]

    def prepare_store(self, keys: Sequence[Any]) -> Optional[StorePlan]:
        """Slots for the keys not offloaded yet, evicting as needed; None when they cannot fit
        (nothing is changed then)."""
        new = list(dict.fromkeys(k for k in keys if k not in self._entries))
        if not new:
            return StorePlan([], [], [])
        protected = set(keys)
        need_bytes = self.held + len(new) * self.reserve - self.budget
        need_slots = len(new) - (len(self._free) + self.slots - self._fresh)
        evicted: List[Any] = []
        if need_bytes > 0 or need_slots > 0:
            for key in self._evictable(protected):
                if need_bytes <= 0 and need_slots <= 0:
                    break
                evicted.append(key)
                need_bytes -= self._entries[key].nbytes
                need_slots -= 1
            if need_bytes > 0 or need_slots > 0:
                return None
        for key in evicted:
            e = self._entries.pop(key)
            self.held -= e.nbytes
            self._free.append(e.slot)
            self._drop.append(e.slot)
        slots = []
        for key in new:
            if self._free:
                slot = self._free.pop()
            else:
                slot, self._fresh = self._fresh, self._fresh + 1
            self._entries[key] = _Entry(slot, self.reserve)
            self.held += self.reserve
            slots.append(slot)
        drop, self._drop = self._drop, []
        return StorePlan(new, slots, evicted, drop)

    def complete_store(self, keys: Iterable[Any], sizes: Optional[Mapping[int, int]] = None,
                       success: bool = True) -> List[Any]:
        """Pending blocks become ready, charged ``sizes[slot]`` (the bytes held; default: the
        reservation); on failure they are removed. Returns the keys made ready."""
        done = []
        for key in keys:
            e = self._entries.get(key)
            if e is None or e.ready:
                continue
            if not success:
                self._entries.pop(key)
                self.held -= e.nbytes
                self._free.append(e.slot)
                self._drop.append(e.slot)
                continue
            held = e.nbytes if sizes is None else int(sizes[e.slot])
            if held > self.reserve:
                raise UsageError(f"KV offloading: slot {e.slot} holds {held} bytes, more than the "
                                 f"{self.reserve} reserved for it")
            self.held += held - e.nbytes
            e.nbytes, e.ready = held, True
            done.append(key)
        return done


# ---- worker side: the compressed pages ---------------------------------------------------------

class _Tables:
    """The codecs of one KV tensor: the current one, older ones still named by held pages, and the
    recalibration window."""

    def __init__(self) -> None:
        self.current: Any = None
        self.loaded = False            # current came from tables_dir and is not checked yet
        self.by_id: Dict[int, Any] = {}
        self.pages: Dict[int, int] = {}  # table id -> held pages coded with it
        self.window = RatioWindow()    # stale: check (or calibrate) on the next stored pages

    def use(self, codec: Any, reference: float) -> None:
        old = self.current
        self.current, self.loaded = codec, False
        self.window.start(reference)
        self.by_id[codec.table_id] = codec
        self.pages.setdefault(codec.table_id, 0)
        if old is not None and old is not codec and self.pages.get(old.table_id, 0) == 0:
            self._forget(old.table_id)

    def add_pages(self, n: int) -> None:
        tid = self.current.table_id
        self.pages[tid] = self.pages.get(tid, 0) + n

    def release(self, table_id: int) -> None:
        self.pages[table_id] = self.pages.get(table_id, 0) - 1
        if self.pages[table_id] <= 0 and (self.current is None or table_id != self.current.table_id):
            self._forget(table_id)

    def _forget(self, table_id: int) -> None:
        self.pages.pop(table_id, None)
        self.by_id.pop(table_id, None)


_LIVE_STORES: "weakref.WeakSet[CompressedBlockStore]" = weakref.WeakSet()


def live_stores() -> List["CompressedBlockStore"]:
    """The block stores of this process (for tests and benchmarks: their ``stats()``)."""
    return list(_LIVE_STORES)


class CompressedBlockStore:
    """Offloaded KV blocks as encoded pages in host memory, by slot.

    ``page_bytes[t]``: the bytes of one block of KV tensor ``t`` (a page). ``compress=False``
    holds plain copies (the uncompressed baseline). ``tables_dir``: a folder of tables saved
    earlier (``tensor-<t>.tzkv``; of an engine of ``ranks`` > 1 workers, ``tensor-<t>.rank-<r>.tzkv``
    of worker ``rank``: each holds the KV of its own heads), used while they pay; tables calibrated
    here are written there when the folder lacks them (never over a file).

    Recalibration rule: every ``CHECK_PAGES`` pages stored of a tensor, their ratio is compared with
    the ratio the tensor's tables had on the pages they were calibrated from; below ``KEEP_RATIO``
    times that, the next stored pages of the tensor calibrate new tables (pages already held keep
    theirs: every page names its tables). Tables loaded from ``tables_dir`` are kept if on the
    first stored pages they reach ``KEEP_RATIO`` times the ratio of tables calibrated on them."""

    def __init__(self, dtype: str, page_bytes: Sequence[int], *, compress: bool = True, mode: str = "rans",
                 threads: int = 0, tables_dir: Optional[str] = None, sizes: Optional[SlotSizes] = None,
                 rank: int = 0, ranks: int = 1):
        self.dtype = dtype
        self.page_bytes = [int(n) for n in page_bytes]
        self.compress, self.mode, self.threads = bool(compress), mode, int(threads)
        self.tables_dir, self.sizes, self.rank, self.ranks = tables_dir, sizes, int(rank), int(ranks)
        if not 0 <= self.rank < self.ranks:
            raise UsageError(f"KV offloading: worker rank {rank} of {ranks}")
        self._slots: Dict[int, Dict[int, bytes]] = {}
        self._tables = [_Tables() for _ in self.page_bytes]
        self._lock = threading.Lock()
        self.generation = 0
        self.counters = dict(blocks_stored=0, blocks_loaded=0, pages_stored=0, pages_loaded=0,
                             raw_bytes_stored=0, coded_bytes_stored=0, calibrations=0, recalibrations=0,
                             tables_loaded=0, encode_s=0.0, decode_s=0.0)
        if tables_dir is not None and self.compress:
            self._load_tables(tables_dir)
        _LIVE_STORES.add(self)

    # ---- tables ----
    def _tables_path(self, t: int) -> str:
        name = f"tensor-{t}.tzkv" if self.ranks == 1 else f"tensor-{t}.rank-{self.rank}.tzkv"
        return os.path.join(str(self.tables_dir), name)

    def _load_tables(self, folder: str) -> None:
        from .kv import PageCodec

        for t, tables in enumerate(self._tables):
            path = self._tables_path(t)
            if not os.path.isfile(path):
                continue
            try:
                codec = PageCodec.load(path, framework="np")
            except TensorZipError as e:  # the file named, the error's kind kept
                raise type(e)(f"{path}: {e}") from None
            if codec.dtype != self.dtype:
                raise UsageError(f"{path}: KV tables for {codec.dtype}, the KV cache is {self.dtype}")
            tables.use(codec, 0.0)
            tables.loaded = tables.window.stale = True
            self.counters["tables_loaded"] += 1

    def _ratio(self, codec: Any, rows: np.ndarray) -> float:
        return rows.size / max(1, sum(map(len, codec.encode_rows(rows, self.threads))))

    def _calibrate(self, t: int, rows: np.ndarray) -> None:
        """Tables for tensor t from the pages ``rows`` (uint8, one page a row), by the rule above."""
        from .kv import PageCodec
        from . import _dtypes

        tables = self._tables[t]
        sample = rows.reshape(-1).view(_dtypes.numpy_dtype(self.dtype))
        fresh = PageCodec.calibrate(sample, mode=self.mode, row_shape=())
        fresh_ratio = self._ratio(fresh, rows)
        if tables.loaded and keeps_loaded(self._ratio(tables.current, rows), fresh_ratio):
            tables.use(tables.current, fresh_ratio)
            return
        if tables.current is not None and not tables.loaded:
            self.counters["recalibrations"] += 1
        self.counters["calibrations"] += 1
        tables.use(fresh, fresh_ratio)
        if self.tables_dir is not None:  # published once: a file already there (another engine's) stays
            os.makedirs(str(self.tables_dir), exist_ok=True)
            data = fresh.to_bytes()
            _core.publish_once(self._tables_path(t), lambda f: f.write(data))

    # ---- blocks ----
    def _free_slot(self, slot: int) -> None:
        pages = self._slots.pop(slot, None)
        if pages and self.compress:
            for t, blob in pages.items():
                self._tables[t].release(_table_id(blob))

    def drop(self, slots: Iterable[int]) -> None:
        """Frees the pages of these slots (blocks the index evicted)."""
        with self._lock:
            for slot in slots:
                self._free_slot(int(slot))

    def clear(self, generation: int) -> None:
        """Frees every page (the index was reset); ``generation`` names the new index state."""
        with self._lock:
            for slot in list(self._slots):
                self._free_slot(slot)
            self.generation = generation

    def store(self, slots: Sequence[int], rows: Mapping[int, Any]) -> int:
        """Stores block i of ``rows[t]`` (uint8, ``(len(slots), page_bytes[t])``) in slot
        ``slots[i]`` for every tensor t; returns the raw bytes stored. ``rows[t]`` is a NumPy array,
        or, in a compressing store, a CUDA tensor: its pages are then encoded on the device
        (``PageCodec.encode_rows``) and only their encoded bytes come to host memory; the tables
        are calibrated on host copies of the pages, as for host rows."""
        slots = [int(s) for s in slots]
        raw = 0
        with self._lock:
            for s in slots:
                self._free_slot(s)
                self._slots[s] = {}
            for t, block_rows in rows.items():
                if isinstance(block_rows, np.ndarray) or not self.compress:
                    block_rows = np.ascontiguousarray(_host_rows(block_rows)).view(np.uint8)
                if tuple(block_rows.shape) != (len(slots), self.page_bytes[t]):
                    raise UsageError(f"KV offloading: tensor {t}: blocks of shape {tuple(block_rows.shape)}, "
                                     f"expected {(len(slots), self.page_bytes[t])}")
                blobs = self._encode(t, block_rows)
                for s, blob in zip(slots, blobs):
                    self._slots[s][t] = blob
                raw += len(slots) * self.page_bytes[t]
            for s in slots:
                if self.sizes is not None:
                    self.sizes.write(self.rank, s, self.slot_bytes(s))
            c = self.counters
            c["blocks_stored"] += len(slots)
            c["pages_stored"] += len(slots) * len(rows)
            c["raw_bytes_stored"] += raw
            c["coded_bytes_stored"] += sum(self.slot_bytes(s) for s in slots)
        return raw

    def _encode(self, t: int, rows: Any) -> List[bytes]:
        t0 = time.perf_counter()
        if not self.compress:
            blobs = [row.tobytes() for row in rows]
        else:
            tables = self._tables[t]
            if tables.window.stale:
                self._calibrate(t, _host_rows(rows))
            blobs = tables.current.encode_rows(rows, self.threads)
            tables.add_pages(len(blobs))
            tables.window.add(rows.shape[0] * rows.shape[1], sum(map(len, blobs)), len(blobs))
        self.counters["encode_s"] += time.perf_counter() - t0
        return blobs

    def load(self, slots: Sequence[int], tensors: Iterable[int],
             empty: Optional[Callable[[int, int], Any]] = None) -> Dict[int, Any]:
        """The blocks of these slots, decoded: {t: uint8 (len(slots), page_bytes[t])}. ``empty(n,
        page_bytes)``: where to decode (default a NumPy array); in a compressing store it may give
        CUDA tensors: the pages then decode on the device (``PageCodec.decode_rows``)."""
        empty = empty if empty is not None and self.compress else _empty_host_rows
        out: Dict[int, np.ndarray] = {}
        with self._lock:
            t0 = time.perf_counter()
            for t in tensors:
                blobs = []
                for s in slots:
                    pages = self._slots.get(int(s))
                    if pages is None or t not in pages:
                        raise UsageError(f"KV offloading: slot {s} holds no block of tensor {t}")
                    blobs.append(pages[t])
                dst = empty(len(blobs), self.page_bytes[t])
                if self.compress:
                    self._decode(t, blobs, dst)
                else:
                    for i, blob in enumerate(blobs):
                        dst[i] = np.frombuffer(blob, dtype=np.uint8)
                out[t] = dst
            c = self.counters
            c["decode_s"] += time.perf_counter() - t0
            c["blocks_loaded"] += len(slots)
            c["pages_loaded"] += len(slots) * len(out)
        return out

    def _decode(self, t: int, blobs: List[bytes], dst: Any) -> None:
        tables = self._tables[t]
        ids = [_table_id(b) for b in blobs]
        for tid in set(ids):
            if tid not in tables.by_id:
                raise UsageError(f"KV offloading: tensor {t}: a held page names tables {tid:08x} that are gone")
        if len(set(ids)) == 1:
            tables.by_id[ids[0]].decode_rows(blobs, dst, self.threads)
            return
        for tid in set(ids):
            idx = [i for i, x in enumerate(ids) if x == tid]
            part = dst[idx]  # a copy (NumPy and torch alike), decoded, then put back
            tables.by_id[tid].decode_rows([blobs[i] for i in idx], part, self.threads)
            dst[idx] = part

    # ---- accounting ----
    def slot_bytes(self, slot: int) -> int:
        return sum(len(b) for b in self._slots.get(int(slot), {}).values())

    def held_bytes(self) -> int:
        """Bytes of every page held (measured from the held blobs)."""
        with self._lock:
            return sum(len(b) for pages in self._slots.values() for b in pages.values())

    def held_raw_bytes(self) -> int:
        """The bytes the held blocks have decoded."""
        with self._lock:
            return sum(self.page_bytes[t] for pages in self._slots.values() for t in pages)

    def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = dict(self.counters)
        out.update(blocks_held=len(self._slots), held_bytes=self.held_bytes(), held_raw_bytes=self.held_raw_bytes(),
                   compress=self.compress, tables=[t.current.table_id if t.current is not None else None
                                                   for t in self._tables])
        return out


def take_blocks(kv: Any, blocks: np.ndarray, page_bytes: int, on_device: bool) -> Any:
    """The pages of these blocks of a KV cache tensor ``kv`` (a torch (num_blocks, bytes) 1-byte
    view): uint8 rows (len(blocks), page_bytes), gathered where ``kv`` is; kept there
    (``on_device``: a CUDA tensor for the device codec) or copied to a NumPy array."""
    import torch

    picked = kv.index_select(0, torch.from_numpy(blocks.astype(np.int64)).to(kv.device))
    if on_device:
        return picked[:, :page_bytes].contiguous().view(torch.uint8)
    return picked.cpu().numpy().view(np.uint8)[:, :page_bytes]


def put_blocks(kv: Any, blocks: np.ndarray, rows: Any) -> int:
    """Writes decoded pages (uint8 rows: a NumPy array or a tensor, on any device) into these
    blocks of ``kv`` (as :func:`take_blocks`); returns the bytes written."""
    import torch

    index = torch.from_numpy(blocks.astype(np.int64)).to(kv.device)
    src = (rows if isinstance(rows, torch.Tensor) else torch.from_numpy(rows)).view(kv.dtype)
    dst = kv if rows.shape[1] == kv.shape[1] else kv[:, :rows.shape[1]]
    dst.index_copy_(0, index, src.to(kv.device))
    return int(rows.shape[0] * rows.shape[1])


def _host_rows(rows: Any) -> np.ndarray:
    """Rows as a NumPy array (a tensor, CUDA or not, copied to host memory)."""
    return rows if isinstance(rows, np.ndarray) else rows.cpu().numpy()


def _empty_host_rows(n: int, page_bytes: int) -> np.ndarray:
    return np.empty((n, page_bytes), dtype=np.uint8)


def _table_id(blob: bytes) -> int:
    return int.from_bytes(blob[4:8], "little")


def reserve_bytes(page_bytes: Iterable[int], compress: bool = True) -> int:
    """The largest size a block of these pages can hold: every page stored raw behind its header."""
    pages = list(page_bytes)
    return sum(pages) + (PAGE_HEADER_BYTES * len(pages) if compress else 0)
