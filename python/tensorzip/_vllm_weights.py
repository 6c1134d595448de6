"""The weights of a compressed model folder as a stream of ``(name, torch tensor)`` pairs, decoded on
a thread pool in a bounded window: what the vLLM load format ``tensorzip`` (``tensorzip.vllm``)
hands to ``model.load_weights``. No vLLM import here (testable without vLLM).

The folder's weight files are found by :func:`tensorzip.transformers.weight_files` (``model.tzip``,
or the shards that ``model.safetensors.index.json`` names, ``x.safetensors`` stored as ``x.tzip``),
the rule ``tensorzip.transformers.from_pretrained`` uses. Every file is opened (header, tensor table,
references of delta/cast-coded files) before the first tensor is decoded, so a missing or unreadable
file fails before any work. Each worker thread reads through a handle of its own (the container's
reader serialises the calls on one handle); at most ``window`` decoded tensors exist that the
consumer has not taken yet (decoded or being decoded), so the host memory of the load is the model
plus at most ``window`` + 1 tensors, never a second copy of the model. Tensors of 1 MiB and more
are decoded into memory that tensors the consumer has dropped used before
(``tensorzip._buffer_pool``: no page faults and zeroed pages for each new tensor); the pool holds
at most ``window`` + 1 free blocks, so the bound above grows to ``2 * (window + 1)`` tensors at
most. The files are read ahead of the decoding (``tensorzip._read_ahead``: the kernel reads them
into the page cache, up to ``READ_AHEAD_BYTES`` past the last tensor handed to a worker, while the
workers decode).
"""
from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._buffer_pool import BufferPool
from ._core import TensorZipError, UsageError
from ._open import SafeOpen
from ._read_ahead import ReadAhead

__all__ = ["model_weight_files", "iter_weights", "default_threads", "READ_AHEAD_BYTES"]

#: How far past the last tensor handed to a worker the files are read ahead (bytes of the files).
READ_AHEAD_BYTES = 64 << 20


def default_threads() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def model_weight_files(folder: str) -> List[str]:
    """The ``.tzip`` weight files of a compressed model folder (a shard still in safetensors form is
    used as it is). UsageError when the folder is not a local folder, has no ``.tzip`` weights, or
    its index names shards that are missing."""
    from .transformers import weight_files  # the one rule for finding a folder's weight files

    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: not a local folder (the tensorzip load format reads compressed model folders "
                         f"made by `tzip compress`; download Hub models and compress them first)")
    files = weight_files(folder)
    if files is None:
        raise UsageError(f"{folder}: no .tzip weights (neither model.tzip nor .tzip shards named by "
                         f"model.safetensors.index.json); a plain safetensors folder loads with vLLM's own "
                         f"load formats")
    return files


def _with_context(e: BaseException, where: str) -> BaseException:
    """The same error class, its message prefixed with the file and tensor."""
    msg = f"{where}: {e}"
    if isinstance(e, OSError):
        out = TensorZipError(msg) if not isinstance(e, TensorZipError) else type(e)(msg)
        for attr in ("errno", "strerror", "filename"):
            try:
                setattr(out, attr, getattr(e, attr, None))
            except AttributeError:  # pragma: no cover
                pass
        return out
    try:
        return type(e)(msg)
    except Exception:  # pragma: no cover - an exception class with another constructor
        return TensorZipError(msg)


class _Handles:
    """Open handles of the weight files, reused by the worker threads (one handle serves one thread
    at a time); every handle is closed by close()."""

    def __init__(self, threads_per_tensor: int, refs: Any):
        self._tpt = threads_per_tensor
        self._refs = refs
        self._free: Dict[str, "queue.SimpleQueue[SafeOpen]"] = {}
        self._all: List[SafeOpen] = []
        self._lock = threading.Lock()

    def open(self, path: str) -> SafeOpen:
        try:
            h = SafeOpen(path, framework="pt", device="cpu", threads=self._tpt, refs=self._refs)
        except (TensorZipError, OSError, ValueError) as e:
            raise _with_context(e, path) from e
        with self._lock:
            self._all.append(h)
            self._free.setdefault(path, queue.SimpleQueue())
        return h

    def take(self, path: str) -> SafeOpen:
        try:
            return self._free[path].get_nowait()
        except (KeyError, queue.Empty):
            return self.open(path)

    def give(self, path: str, h: SafeOpen) -> None:
        self._free[path].put(h)

    def close(self) -> None:
        with self._lock:
            handles, self._all = self._all, []
        for h in handles:
            try:
                h.close()
            except Exception:  # pragma: no cover - closing never hides the load's own error
                pass


def _plan(files: List[str], handles: _Handles, ahead: ReadAhead, device: Any = None) -> List[Tuple[str, str]]:
    """(file, tensor name) of every tensor, in each file's data order; every file opened once (its
    header and references checked; with a device decoder, its frame table read); a name in two
    files refused."""
    jobs: List[Tuple[str, str]] = []
    seen: Dict[str, str] = {}
    for path in files:
        h = handles.open(path)
        if device is not None:
            device.add_file(path)
        sizes = h._stored_sizes()
        for name, _n in sizes:
            if name in seen:
                raise UsageError(f"tensor {name!r} is in two weight files: {seen[name]} and {path}")
            seen[name] = path
            jobs.append((path, name))
        ahead.add_file(path, [n for _name, n in sizes])
        handles.give(path, h)
    return jobs


def iter_weights(files: List[str], threads: int = 0, refs: Any = None, window: Optional[int] = None,
                 threads_per_tensor: int = 1, device: Any = None) -> Iterator[Tuple[str, Any]]:
    """``(name, tensor)`` for every tensor of ``files`` (torch tensors, bit for bit the stored
    ones), yielded in the order their decoding completes.

    Args:
        threads: tensors decoded at once (0: the CPUs this process may use).
        refs: locations of the files delta/cast-coded files were saved against
            (``tensorzip.safe_open``'s ``refs``; default: the recorded relative paths).
        window: tensors decoded or being decoded that the consumer has not taken yet (default and
            least: threads). The host memory of the load is at most window + 1 tensors (the one the
            consumer holds) above the model's own.
        threads_per_tensor: decoding threads for one tensor of several frames (the reader's
            ``threads``; 1: each tensor on its own worker).
        device: a CUDA device: the tensors that can be are decoded there (``tensorzip._vllm_device``)
            and yielded as tensors on it, the others as CPU tensors; None (default): all on the CPU.
            The caller checks that the device path can run (``_vllm_device.decode_device``).

    Errors name the file and the tensor (``<file>: tensor 'x': <what>``), keep tensorzip's class
    (CorruptDataError for a damaged frame, ...), and stop the load: tensors in flight are dropped,
    nothing more is decoded, and every handle is closed.
    """
    n = threads if threads and threads > 0 else default_threads()
    win = max(n, window or n)
    handles = _Handles(threads_per_tensor, refs)
    memory = BufferPool(keep=win + 1)
    ahead = ReadAhead(READ_AHEAD_BYTES)
    pool: Optional[ThreadPoolExecutor] = None
    on_device = None
    if device is not None:
        from ._vllm_device import DeviceDecoder

        on_device = DeviceDecoder(device)
    try:
        jobs = _plan(files, handles, ahead, on_device)

        def decode_on_host(path: str, name: str) -> Any:
            h = handles.take(path)
            try:
                return h.get_tensor_in(name, memory.memory)
            finally:
                handles.give(path, h)

        def decode(path: str, name: str) -> Any:
            try:
                if on_device is not None and on_device.on_device(path, name):
                    t = on_device.decode(path, name)
                    if t is not None:
                        return t
                return decode_on_host(path, name)
            except (TensorZipError, OSError, ValueError, KeyError) as e:
                if path in str(e) and repr(name) in str(e):
                    raise  # the message names both already
                raise _with_context(e, f"{path}: tensor {name!r}") from e

        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="tensorzip-load")
        pending: Dict[Future, str] = {}
        next_job = 0
        while next_job < len(jobs) or pending:
            while next_job < len(jobs) and len(pending) < win:
                path, name = jobs[next_job]
                ahead.reached(next_job)
                pending[pool.submit(decode, path, name)] = name
                next_job += 1
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:  # errors first: one error stops the load before more is yielded
                if fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
            ready = [(pending.pop(fut), fut.result()) for fut in done]
            del done
            while ready:  # each tensor dropped here once the consumer has taken it
                yield ready.pop(0)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        handles.close()
        memory.close()
        ahead.close()
