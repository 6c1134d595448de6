"""PyTorch Distributed Checkpoint (DCP) storage backed by tensorzip.

Usage::

    import torch.distributed.checkpoint as dcp
    import tensorzip.dcp

    dcp.save(state_dict, storage_writer=tensorzip.dcp.StorageWriter(path))
    dcp.load(state_dict, storage_reader=tensorzip.dcp.StorageReader(path))

Layout of a checkpoint directory (one per ``path``):

- ``__<rank>_<save id>.tzip``: one standard ``.tzip`` file per rank, written
  by that rank only through tensorzip's I/O engine (``TensorWriter``: encode on
  a thread pool overlapped with writes through the POSIX/io_uring write queue,
  optional O_DIRECT, temporary name + fsync + rename). The save id is chosen by
  the coordinator while planning, so every save writes new names. Every DCP
  item of the rank is one tensor of the file, named after its DCP index
  (``fqn``, ``@``chunk offsets, ``#``index): tensor chunks with their own
  dtype and shape; non-tensor items (``BYTE_IO``: optimizer param groups, ints,
  pickled objects) and tensors of a dtype ``.tzip`` cannot hold (complex128, ...) as
  ``U8`` tensors of their bytes (DCP's bytes / ``torch.save`` bytes), so a
  rank has exactly one file, every byte of it under the frames' xxh64 and the
  codec's block checksums, and the file opens with ``tzip inspect/verify`` and
  :func:`tensorzip.safe_open`. The file's safetensors export holds the same items.
- ``.metadata``: DCP's own pickled :class:`~torch.distributed.checkpoint.metadata.Metadata`,
  written last by the coordinator in :meth:`StorageWriter.finish` (temporary
  file, fsync, atomic rename). Each item's storage entry records the file, the
  item's tensor name, dtype, shape and codec block layout, and (bytes items) a
  CRC-32, so a damaged file is reported with the name of the damaged item.

Crash safety: data files of earlier saves into the directory are deleted only
after the new ``.metadata`` is in place, so a save that dies half-way leaves the
previous checkpoint loadable (a killed rank leaves at most a temporary
``.__<rank>_<save id>.tzip.tmp-*`` file, removed by the next save, or now by
:func:`clear_interrupted`); a directory where no save finished is refused by
:class:`StorageReader` (its constructor, or ``dcp.load(checkpoint_id=)``'s reset,
before DCP's collectives) with a :class:`tensorzip.CorruptDataError`.

DCP's own readers: the ``"tensorzip"`` stream extension (:class:`TensorZipExtension`),
known to every DCP ``ExtensionRegistry`` once this module is imported (reading a
tensorzip checkpoint's ``.metadata`` imports it), lets ``FileSystemReader``,
``dcp.load(state, checkpoint_id=dir)`` and ``format_utils.dcp_to_torch_save`` read
tensorzip checkpoints. Errors inside ``dcp.load``/``dcp.save`` reach the caller as DCP's
``CheckpointException`` (a ``BaseException``); :func:`first_failure` gives the rank's
own exception (a :class:`tensorzip.CorruptDataError` for damaged data).

Resharding: a load that needs part of a stored chunk has the container
:class:`Reader` read and decode only the codec blocks that hold the requested
elements (``Reader.read_range``; see :class:`StorageReader`); a load of a whole
chunk decodes it straight into the target tensor. :func:`read_stats` counts
decodes and blocks.

Both classes subclass DCP's ``FileSystemWriter`` / ``FileSystemReader`` and
override how item bytes are written and read, how files are named and how
``.metadata`` is committed; planning, ``reset``/``checkpoint_id`` and the async
staging of ``FileSystemWriter`` are DCP's.

GPU encode: with a tensorzip module built with CUDA (``pip install . -C
cmake.define.TZ_CUDA=ON``; see doc/python.md) and a visible device
(:func:`tensorzip._tensorzip.cuda_available`), CUDA tensors of a codec dtype
(BF16, F16, F32, F8) are encoded on the GPU where they are (made contiguous
there if needed): the encoder reads device memory, and only the encoded
frames reach host memory (pinned buffers). Other CUDA tensors (integers,
bool, F64) and level 3 are copied to the host chunk by chunk and encoded on
the CPU; ``StorageWriter(..., gpu_encode=False)`` copies every CUDA tensor to
the CPU first and encodes there, as a module without CUDA does.
``last_write_stats["gpu_bytes"]`` counts the raw bytes encoded on the GPU.
``dcp.async_save`` stages the state dict into CPU memory before the writer
runs, so its writer only sees CPU tensors (CPU encode).

Limits:

- Without GPU encode, CUDA tensors are copied to the CPU and encoded there;
  the writer reads every item of the rank in its final pass, so a rank's CPU
  copies of GPU tensors are all alive until its file is written (with GPU
  encode, the contiguous device tensors stay referenced until then).
- ``thread_count`` and ``single_file_per_rank`` of ``FileSystemWriter`` are
  ignored: each rank writes exactly one file; tensorzip itself codes with
  ``threads`` threads (0 = all hardware threads).
- Local file systems only (``os.replace``/``os.fsync``); one save at a time per directory.
- ``.metadata`` pickles this module's storage entries, so reading a checkpoint
  needs tensorzip installed.
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint import filesystem as _dcp_fs
    from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from . import _core, _dtypes
from . import _tensorzip as _C
from ._core import CorruptDataError
from ._dcp_extension import (  # noqa: F401  (public here)
    DCP_TOOLS_READ_TENSORZIP,
    ExtensionRegistry,
    TensorZipExtension,
    _descriptor,
    extension_registry,
)
from ._dcp_layout import (  # noqa: F401  (public here, and the names the tests use)
    SUFFIX,
    _CODEC_TZIP,
    _CODEC_TZIP_PT,
    _CODEC_TZIP_RAW,
    _DATA_FILE,
    _DATA_TMP,
    _METADATA,
    _RANK_METADATA,
    _check_finished,
    _fsync_dir,
    _stale_data_files,
    clear_interrupted,
)

__all__ = ["StorageWriter", "StorageReader", "SUFFIX", "read_stats", "reset_read_stats", "clear_interrupted",
           "first_failure", "TensorZipExtension", "extension_registry", "DCP_TOOLS_READ_TENSORZIP"]

# Test hook (tests/test_dcp.py): "<rank>:<bytes>:<marker path>" makes that rank's
# writer stop for good once its items are handed to the TensorWriter (whose
# temporary file then exists) and before it finishes the file, after creating
# <marker path>, so that a test can kill it mid-save. <bytes> is not used.
_STALL_ENV = "TENSORZIP_DCP_TEST_STALL"

# A partial read is used when it decodes at most this fraction of a chunk's blocks.
_PARTIAL_MAX_FRACTION = 0.75
# More element runs than this (a request strided over many rows) decodes the whole chunk.
_PARTIAL_MAX_RUNS = 1 << 20


@dataclass
class _TzStorageInfo(_StorageInfo):
    """DCP's per-item storage entry, plus how the item is encoded.

    Items of a ``.tzip`` rank file: ``tensor`` is the item's tensor name in
    the file, ``dtype`` its safetensors dtype, ``shape`` the stored chunk's
    shape, ``block_bytes`` / ``n_blocks`` its codec block layout (what a
    partial read needs to pick blocks), ``offset`` / ``length`` the byte range
    of its frames in the file (informative), ``crc32`` a CRC-32 of the bytes
    of a ``BYTE_IO`` / ``torch.save`` item (checked after decoding; tensors are
    covered by the frames' xxh64 and the per-block checksums).
    """

    codec: str = _CODEC_TZIP_RAW
    crc32: int = 0
    shape: Optional[Tuple[int, ...]] = None
    # .tzip rank files: the tensor's name and dtype in the file, and its codec block layout.
    tensor: str = ""
    dtype: str = ""
    block_bytes: int = 0
    n_blocks: int = 0


# Counters of the reads done in this process (tests and benchmarks look at them).
_STATS: Dict[str, int] = {}


def reset_read_stats() -> None:
    """Zeroes the counters returned by :func:`read_stats`."""
    _STATS.update(bytes_decoded=0, whole_decodes=0, partial_decodes=0, blocks_decoded=0,
                  blocks_skipped=0)


def read_stats() -> Dict[str, int]:
    """Counters of :class:`StorageReader` reads in this process since the last :func:`reset_read_stats`.

    ``bytes_decoded``: raw
    bytes of ``.tzip`` tensors decoded; ``whole_decodes`` / ``partial_decodes``:
    tensor chunks decoded whole / decoded block by block (resharding);
    ``blocks_decoded`` / ``blocks_skipped``: codec blocks decoded / not decoded by partial decodes.
    """
    return dict(_STATS)


reset_read_stats()


_CUDA_ENCODE: Optional[bool] = None


def _cuda_encode_available() -> bool:
    """Whether the tensorzip module encodes on the GPU here (built with CUDA and a device visible).

    Asked once, when the first CUDA tensor is saved (so that importing this module never
    initialises CUDA)."""
    global _CUDA_ENCODE
    if _CUDA_ENCODE is None:
        probe = getattr(_C, "cuda_available", None)
        _CUDA_ENCODE = bool(probe()) if probe is not None else False
    return _CUDA_ENCODE


def _item_name(index: Any) -> str:
    fqn = getattr(index, "fqn", str(index))
    offset = getattr(index, "offset", None)
    return f"{fqn!r} (chunk offset {tuple(offset)})" if offset is not None and len(offset) else repr(fqn)


def _stored_name(index: Any, n: int, seen: set) -> str:
    """Name of an item's tensor in its rank's .tzip: fqn, chunk offsets and DCP index; unique in the file."""
    fqn = str(getattr(index, "fqn", index))
    offset = getattr(index, "offset", None)
    name = fqn
    if offset is not None and len(offset):
        name += "@" + ",".join(str(int(x)) for x in offset)
    if getattr(index, "index", None) is not None:
        name += f"#{index.index}"
    if name in seen or name == "__metadata__" or not name:
        name = f"{name}~{n}"
    seen.add(name)
    return name


def _new_save_id() -> str:
    # Sortable by time (seconds, base 36) + random part: unique per save in practice.
    return f"{np.base_repr(int(time.time()), 36).lower()}{uuid.uuid4().hex[:8]}"


class StorageWriter(FileSystemWriter):
    """DCP storage writer: each rank writes its items into one ``.tzip`` file through the I/O engine.

    Every save writes new files, ``__<rank>_<save id>.tzip`` (the save id is
    chosen by the coordinator during planning). Each rank's file is written by
    tensorzip's ``TensorWriter`` (:class:`tensorzip._tensorzip.TensorWriter`):
    the rank's tensors are encoded on a thread pool, chunk by chunk, while
    earlier chunks are written through the I/O engine's write queue (POSIX
    thread pool or io_uring, optionally O_DIRECT), under a temporary name that
    is fsync'd and renamed at the end. The coordinator then replaces
    ``.metadata`` atomically (temporary file, fsync, rename). Data files of
    earlier saves into the same directory are deleted only after the new
    ``.metadata`` is in place, so a save that dies half-way (a rank killed, a
    full disk) leaves the previous checkpoint in that directory loadable.

    Args:
        path: checkpoint directory (created if missing).
        level: tensorzip level: 0 default, 1 fast, 2 code every field that shrinks, 3 strongest, -1 store.
        threads: coding threads per rank, 0 = all hardware threads (the output does not depend on it).
        block_elems: codec block size in elements (power of two, 4096..2^20; 0 = codec default 65536).
            Smaller blocks make resharded loads read less, at a small cost in ratio.
        chunk_bytes: raw bytes per .tzip frame (power of two, 1..64 MiB; 0 = 4 MiB): the unit of
            encode/write overlap.
        io: write back end: ``"auto"`` (io_uring where available, else a pwrite thread pool),
            ``"posix"``, ``"io_uring"``, or ``"pwrite"`` (synchronous writes from the writer's thread).
        direct_io: write with O_DIRECT where the file system allows it (bypasses the page cache).
        sync_files: accepted for ``FileSystemWriter`` compatibility; the rank files are always fsync'd.
        overwrite: allow writing over an existing checkpoint (as ``FileSystemWriter``).
        gpu_encode: encode CUDA tensors on the GPU when the tensorzip module was built with CUDA and a
            device is visible (default True); False: copy them to the CPU and encode there. The GPU
            codec is built to write the same frames as the CPU codec for the same level and block size.
        **kwargs: passed to ``FileSystemWriter`` (e.g. ``cache_staged_state_dict``);
            ``thread_count`` and ``single_file_per_rank`` have no effect.

    After a save, :attr:`last_write_stats` holds this rank's writer statistics
    (``raw_bytes``, ``file_bytes``, ``io`` back end, ``direct``, ``seconds``, ``gpu_bytes``: raw
    bytes encoded on the GPU, ``gpu_host_bytes``: raw bytes of CUDA tensors added for GPU encode that
    the GPU codec does not take, copied to the host chunk by chunk and encoded on the CPU,
    ``gpu_tensors``: items added for GPU encode, ...).
    """

    def __init__(self, path: Union[str, os.PathLike], *, level: int = 0, threads: int = 0, block_elems: int = 0,
                 chunk_bytes: int = 0, io: str = "auto", direct_io: bool = False,
                 sync_files: bool = True, overwrite: bool = True, gpu_encode: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(path, sync_files=sync_files, overwrite=overwrite, **kwargs)
        # UsageError now for a bad level/threads/block_elems/chunk_bytes
        level, threads, block_elems, chunk_bytes = _core.check_write_options(level, threads, block_elems,
                                                                             chunk_bytes)
        if io not in ("auto", "posix", "io_uring", "pwrite"):
            raise _core.UsageError(f"io must be 'auto', 'posix', 'io_uring' or 'pwrite', not {io!r}")
        self.level = level
        self.threads = threads
        self.block_elems = block_elems
        self.chunk_bytes = chunk_bytes
        self.io = io
        self.direct_io = direct_io
        self.gpu_encode = bool(gpu_encode)
        self.last_write_stats: Optional[Dict[str, Any]] = None

    # ---- planning: one save id per save, agreed through the global plan ----

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        plan = super().prepare_local_plan(plan)
        if plan.storage_data is not None:  # no collectives: each rank names its own files
            rank = self.rank if self.rank is not None else 0
            plan = dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{rank}_{_new_save_id()}"))
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        save_id = _new_save_id()
        return [dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_{save_id}"))
                if plan.storage_data is None else plan for i, plan in enumerate(plans)]

    # ---- data ----

    def _gpu_target(self, item: Any, data: Any) -> Optional[Tuple[str, Any]]:
        """(dtype, contiguous device tensor) of an item to encode on the GPU, or None (CPU path)."""
        if not self.gpu_encode or item.type == WriteItemType.BYTE_IO or not isinstance(data, torch.Tensor):
            return None
        if data.device.type != "cuda" or data.numel() == 0 or not _cuda_encode_available():
            return None
        try:
            dtype = _dtypes.name_of_torch(data.dtype)
            _dtypes.file_shape_of_torch(dtype, tuple(data.shape))
        except ValueError:
            return None  # stored as torch.save bytes (CPU path)
        return dtype, data.detach().contiguous()

    @staticmethod
    def _as_stored(item: Any, data: Any) -> Tuple[str, str, Tuple[int, ...], Any, Any, int]:
        """(codec, dtype, shape, buffer, object to keep alive, crc32) of one item as a .tzip tensor."""
        if item.type == WriteItemType.BYTE_IO:
            payload = bytes(data.getbuffer()) if isinstance(data, io.BytesIO) else bytes(data)
            return _CODEC_TZIP_RAW, "U8", (len(payload),), payload, payload, zlib.crc32(payload)
        tensor = data.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        try:
            dtype = _dtypes.name_of_torch(tensor.dtype)
            _dtypes.file_shape_of_torch(dtype, tuple(tensor.shape))  # a 0-d packed F4 has no file shape
        except ValueError:
            # dtype .tzip cannot hold (complex, ...): its torch.save bytes, as DCP would store it.
            buf = io.BytesIO()
            torch.save(tensor, buf)
            payload = buf.getvalue()
            return _CODEC_TZIP_PT, "U8", (len(payload),), payload, payload, zlib.crc32(payload)
        shape = tuple(int(x) for x in tensor.shape)
        flat = tensor.reshape(-1).view(torch.uint8).numpy()  # shares the tensor's memory
        return _CODEC_TZIP, dtype, shape, flat, tensor, 0

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        storage_plan: _StoragePrefix = plan.storage_data
        file_name = f"{storage_plan.prefix}{SUFFIX}"
        path = os.fspath(self.fs.concat_path(self.path, file_name))
        stall = self._stall_hook()
        pending: List[Tuple[Any, str, str, Tuple[int, ...], int, int]] = []
        keep: List[Any] = []  # the writer reads every buffer in finish()
        # force: a file of this name can only be left over from this very save id (a retried write).
        with _C.TensorWriter(path, level=self.level, threads=self.threads, chunk_bytes=self.chunk_bytes,
                             direct_io=self.direct_io, predict=False, block_elems=self.block_elems, force=True,
                             io=self.io) as writer:
            names = set()
            gpu_streams: Dict[Any, Any] = {}  # device -> its current stream, synchronised before finish()
            n_gpu = 0
            for n, item in enumerate(plan.items):
                data = planner.resolve_data(item)
                name = _stored_name(item.index, n, names)
                gpu = self._gpu_target(item, data)
                if gpu is not None:
                    # Encoded on the GPU in finish(): the writer reads the device memory there.
                    dtype, tensor = gpu
                    shape = tuple(int(x) for x in tensor.shape)
                    nbytes = tensor.numel() * tensor.element_size()
                    writer.add_cuda(name, dtype, list(_dtypes.file_shape_of_torch(dtype, shape)), tensor.data_ptr(),
                                    nbytes, owner=tensor)
                    keep.append(tensor)
                    gpu_streams.setdefault(tensor.device, torch.cuda.current_stream(tensor.device))
                    pending.append((item, name, _CODEC_TZIP, shape, 0, nbytes))
                    n_gpu += 1
                    continue
                codec, dtype, shape, buf, owner, crc = self._as_stored(item, data)
                writer.add(name, dtype, list(_dtypes.file_shape_of_torch(dtype, shape)), buf)
                keep.append(owner)
                if item.type == WriteItemType.BYTE_IO:
                    size_in_bytes = len(buf)
                else:
                    size_in_bytes = data.numel() * data.element_size()
                pending.append((item, name, codec, shape, crc, size_in_bytes))
            if stall is not None:
                self._stall(stall[1])
            # The GPU encoder reads on streams of its own: the work that produced the tensors (and
            # their .contiguous() copies) on the current streams must be complete first.
            for stream in gpu_streams.values():
                stream.synchronize()
            stats = writer.finish()  # encode + write + fsync + rename (GIL released)
        del keep
        stored = {t["name"]: t for t in stats.pop("tensors")}
        self.last_write_stats = dict(stats, path=path, items=len(pending), gpu_tensors=n_gpu)
        results: List[WriteResult] = []
        for item, name, codec, shape, crc, size_in_bytes in pending:
            t = stored[name]
            frames = t["frames"]
            offset = int(frames[0][0]) if frames else 0
            length = int(frames[-1][0] + frames[-1][1]) - offset if frames else 0
            info = _TzStorageInfo(file_name, offset, length)
            info.transform_descriptors = [_descriptor(codec, t["dtype"], shape, crc)]
            info.codec = codec
            info.crc32 = crc
            info.shape = tuple(shape)
            info.tensor = name
            info.dtype = t["dtype"]
            info.block_bytes = int(t["block_bytes"])
            info.n_blocks = int(t["n_blocks"])
            results.append(WriteResult(index=item.index, size_in_bytes=size_in_bytes, storage_data=info))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _stall_hook(self) -> Optional[Tuple[int, str]]:
        spec = os.environ.get(_STALL_ENV)
        if not spec:
            return None
        rank_s, nbytes, marker = spec.split(":", 2)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return (int(nbytes), marker) if int(rank_s) == rank else None

    @staticmethod
    def _stall(marker: str) -> None:  # pragma: no cover - the test kills the process here
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(3600)

    # ---- commit ----

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """Writes ``.metadata`` (temporary file, fsync, atomic rename), then deletes older data files."""
        metadata.version = getattr(_dcp_fs, "CURRENT_DCP_VERSION", metadata.version)
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        per_rank = not self.use_collectives and self.rank is not None
        final = self._get_metadata_path(self.rank if per_rank else None)
        if self.sync_files:
            _fsync_dir(self.path)  # the new data files' names are durable before .metadata points at them
        # Atomic: readers see the old or the new checkpoint, never none.
        _core.replace_atomically(final, lambda f: pickle.dump(metadata, f), sync=self.sync_files)
        # Only now may data files of earlier (finished or interrupted) saves go.
        keep = {getattr(info, "relative_path", None) for info in storage_md.values()}
        mine = f"__{self.rank}_" if per_rank else None
        for name in _stale_data_files(os.fspath(self.path), keep):
            if mine and not (name.startswith(mine) or name.startswith("." + mine)):
                continue
            try:
                os.unlink(os.path.join(self.path, name))
            except OSError:
                pass


class StorageReader(FileSystemReader):
    """DCP storage reader for checkpoints written by :class:`StorageWriter`.

    Checks each item's CRC-32 and tensorzip checksums; a damaged item raises
    :class:`tensorzip.CorruptDataError` naming the item (state-dict key) and
    the file. Checkpoints written by DCP's own ``FileSystemWriter`` are read
    through ``FileSystemReader``.

    A load that needs only part of a stored chunk (resharding) reads the
    chunk's head (wrapper + frame prefix with the block index) and then only
    the codec blocks that hold the requested elements, and decodes only those;
    when the request covers most of the chunk (more than 3/4 of its blocks),
    or is a strided selection of more than 2^20 runs, the whole chunk is read.

    Args:
        path: checkpoint directory.
        threads: decoding threads, 0 = all hardware threads.
        partial_reads: decode only the needed blocks of a stored chunk (default True).
    """

    def __init__(self, path: Union[str, os.PathLike], *, threads: int = 0, partial_reads: bool = True) -> None:
        super().__init__(path)
        self.threads = threads
        self.partial_reads = partial_reads
        # tensors of the .tzip file being read: name -> (index, raw bytes, dtype, shape), from its validated header
        self._tzip_table: Dict[str, Tuple[int, int, str, Tuple[int, ...]]] = {}
        _check_finished(os.fspath(self.path))  # here, in the caller's code: DCP would wrap the error

    def reset(self, checkpoint_id: Optional[Union[str, os.PathLike]] = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id:
            _check_finished(os.fspath(self.path))  # dcp.load calls reset before its collectives

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        _check_finished(os.fspath(self.path), kwargs.get("rank"))
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        if not all(isinstance(self.storage_data[r.storage_index], _TzStorageInfo) for r in plan.items):
            return super().read_data(plan, planner)  # not a tensorzip checkpoint
        per_file: Dict[str, List[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for relative_path, reqs in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)
            if not os.path.exists(path):
                raise CorruptDataError(f"tensorzip.dcp: data file {path} of item "
                                       f"{_item_name(reqs[0].storage_index)} is missing")
            if not all(self.storage_data[r.storage_index].codec.startswith(_CODEC_TZIP) for r in reqs):
                raise CorruptDataError(f"tensorzip.dcp: {path}: not a .tzip rank file (written by an unreleased "
                                       f"development layout of tensorzip.dcp); save the checkpoint again")
            self._read_tzip(os.fspath(path), reqs, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    # ---- .tzip rank files (container Reader) ----

    def _read_tzip(self, path: str, reqs: List[Any], planner: Any) -> None:
        try:
            reader = _C.Reader(path, self.threads)
        except _C.TensorZipError as e:
            items = [_item_name(r.storage_index) for r in reqs[:4]]
            more = f" and {len(reqs) - 4} more" if len(reqs) > 4 else ""
            raise CorruptDataError(f"tensorzip.dcp: data file {path} of items {', '.join(items)}{more} "
                                   f"cannot be opened: {e}") from e
        try:
            cache: Dict[Any, Any] = {}  # storage_index -> decoded chunk, for several reads of one chunk
            # name -> (index, raw bytes, dtype, shape), once per file
            self._tzip_table = {t[0]: (i, int(t[3]), t[1], tuple(int(x) for x in t[2]))
                                for i, t in enumerate(reader.tensors())}
            together = self._tzip_targets_together(reader, reqs, planner)
            for k, req in enumerate(reqs):
                if k in together:
                    continue
                info: _TzStorageInfo = self.storage_data[req.storage_index]
                name = _item_name(req.storage_index)
                try:
                    self._read_tzip_item(reader, path, info, req, planner, cache)
                except CorruptDataError as e:
                    if str(e).startswith("tensorzip.dcp:"):
                        raise
                    raise CorruptDataError(f"tensorzip.dcp: item {name} in {path}: {e}") from e
                except _C.TensorZipError as e:  # a file that does not match its metadata
                    raise CorruptDataError(f"tensorzip.dcp: item {name} in {path}: {e}") from e
        finally:
            reader.close()

    def _tzip_entry(self, info: _TzStorageInfo) -> Tuple[int, int]:
        entry = self._tzip_table.get(info.tensor)
        if entry is None:
            raise CorruptDataError(f"tensor {info.tensor!r} is not in the file")
        idx, raw, dtype, shape = entry
        # The DCP metadata (a pickle) is checked against the file's validated
        # header before anything is allocated from it.
        if info.shape is not None and (info.dtype != dtype or tuple(info.shape) != shape):
            raise CorruptDataError(f"tensor {info.tensor!r}: the metadata says {info.dtype}{list(info.shape)}, "
                                   f"the file holds {dtype}{list(shape)}")
        if info.block_bytes and info.n_blocks != -(-raw // info.block_bytes):
            raise CorruptDataError(f"tensor {info.tensor!r}: the metadata's block layout ({info.n_blocks} blocks of "
                                   f"{info.block_bytes} bytes) does not match its {raw} bytes")
        return idx, raw

    def _tzip_index(self, reader: Any, info: _TzStorageInfo) -> int:
        return self._tzip_entry(info)[0]

    def _read_tzip_bytes(self, reader: Any, info: _TzStorageInfo) -> bytes:
        idx, n = self._tzip_entry(info)
        buf = bytearray(n)
        if n:
            reader.read_tensor(idx, buf)
        if zlib.crc32(buf) != info.crc32:
            raise CorruptDataError(f"corrupt (CRC-32 mismatch of the {n} stored bytes)")
        return bytes(buf)

    def _read_tzip_item(self, reader: Any, path: str, info: _TzStorageInfo, req: Any, planner: Any,
                        cache: Dict[Any, Any]) -> None:
        if req.type == LoadItemType.BYTE_IO:
            if info.codec != _CODEC_TZIP_RAW:
                raise CorruptDataError(f"stored as {info.codec!r}, not as bytes")
            planner.load_bytes(req, io.BytesIO(self._read_tzip_bytes(reader, info)))
            return
        key = req.storage_index
        tensor = cache.get(key)
        if tensor is None:
            if info.codec == _CODEC_TZIP_PT:
                tensor = torch.load(io.BytesIO(self._read_tzip_bytes(reader, info)), map_location="cpu",
                                    weights_only=True)
                cache[key] = tensor
            elif info.codec != _CODEC_TZIP:
                raise CorruptDataError(f"unknown encoding {info.codec!r}")
            elif self._tzip_into_target(reader, info, req, planner):
                return
            else:
                tensor = self._tzip_part(reader, info, req) if self.partial_reads else None
                if tensor is None:
                    tensor = self._tzip_whole(reader, info)
                    cache[key] = tensor
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise CorruptDataError(f"stored size {tuple(tensor.size())}, expected {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    def _tzip_whole(self, reader: Any, info: _TzStorageInfo) -> Any:
        idx = self._tzip_index(reader, info)
        out = torch.empty(tuple(info.shape), dtype=_dtypes.torch_dtype(info.dtype))
        if out.numel():
            reader.read_tensor(idx, out.reshape(-1).view(torch.uint8).numpy())
        _STATS["whole_decodes"] += 1
        _STATS["bytes_decoded"] += out.numel() * out.element_size()
        return out

    @staticmethod
    def _whole_target(info: _TzStorageInfo, req: Any, planner: Any) -> Optional[Any]:
        """The item's target when it takes the whole stored chunk and is a contiguous CPU tensor of the
        chunk's dtype and shape (the Reader can decode straight into it), else None."""
        if info.shape is None or any(int(o) for o in req.storage_offsets):
            return None
        if tuple(int(x) for x in req.lengths) != tuple(info.shape):
            return None
        target = planner.resolve_tensor(req).detach()
        if target.device.type != "cpu" or not target.is_contiguous() or target.numel() == 0 \
                or tuple(target.shape) != tuple(info.shape) or _dtypes.torch_dtype(info.dtype) != target.dtype:
            return None
        return target

    def _tzip_targets_together(self, reader: Any, reqs: List[Any], planner: Any) -> set:
        """The items of one file that go whole into their targets (a load in the saved layout), decoded
        together: the frames of all of them in parallel on ``threads`` threads (Reader.read_tensors), so
        many small items load as fast as one large one. Returns the positions in reqs done. On an error
        nothing is committed: the items are then read one by one, which names the damaged one."""
        picked = []
        for k, req in enumerate(reqs):
            info = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO or info.codec != _CODEC_TZIP:
                continue
            target = self._whole_target(info, req, planner)
            if target is None:
                continue
            try:  # the metadata checked against the file's validated header, as for one item
                idx = self._tzip_index(reader, info)
            except CorruptDataError:
                continue  # read alone below, which reports it
            picked.append((k, req, target, idx))
        if len(picked) < 2:
            return set()
        try:
            reader.read_tensors([p[3] for p in picked], [p[2].reshape(-1).view(torch.uint8).numpy() for p in picked])
        except _C.TensorZipError:
            return set()
        for _k, req, target, _i in picked:
            _STATS["whole_decodes"] += 1
            _STATS["bytes_decoded"] += target.numel() * target.element_size()
            planner.commit_tensor(req, target)
        return {p[0] for p in picked}

    def _tzip_into_target(self, reader: Any, info: _TzStorageInfo, req: Any, planner: Any) -> bool:
        """Whole stored chunk into a contiguous CPU target of the same dtype: the Reader decodes straight
        into it (no temporary tensor, no copy). False when that does not apply."""
        target = self._whole_target(info, req, planner)
        if target is None:
            return False
        reader.read_tensor(self._tzip_index(reader, info), target.reshape(-1).view(torch.uint8).numpy())
        _STATS["whole_decodes"] += 1
        _STATS["bytes_decoded"] += target.numel() * target.element_size()
        planner.commit_tensor(req, target)
        return True

    def _tzip_part(self, reader: Any, info: _TzStorageInfo, req: Any) -> Optional[Any]:
        """The stored chunk with (at least) the requested elements decoded, or None to decode it whole.

        Picks the codec blocks that hold the requested elements and has the
        container Reader read and decode only those (Reader.read_range: the
        frame's block index, then only the blocks' compressed bytes, each block
        checked), into a chunk-sized buffer whose other bytes stay unwritten.
        """
        shape = info.shape
        if shape is None or len(shape) == 0 or not info.block_bytes or not info.n_blocks:
            return None
        idx = self._tzip_index(reader, info)  # metadata checked against the file before anything else
        offs = [int(x) for x in req.storage_offsets]
        lens = [int(x) for x in req.lengths]
        if len(offs) != len(shape) or lens == list(shape):
            return None  # whole chunk wanted
        if any(o < 0 or n < 0 or o + n > s for o, n, s in zip(offs, lens, shape)):
            raise CorruptDataError(f"request {offs}+{lens} is outside the stored chunk {list(shape)}")
        runs = _element_runs(shape, offs, lens)
        if runs is None:
            return None
        ranges = _block_ranges(runs, _dtypes.lookup(info.dtype).itemsize, info.block_bytes, info.n_blocks)
        if ranges is None:
            return None
        out = torch.empty(tuple(shape), dtype=_dtypes.torch_dtype(info.dtype))
        flat = out.reshape(-1).view(torch.uint8).numpy()
        raw_size = flat.size
        n_decoded = 0
        for first, count in ranges:
            raw_off = first * info.block_bytes
            raw_len = min(count * info.block_bytes, raw_size - raw_off)
            reader.read_range(idx, raw_off, flat[raw_off:raw_off + raw_len])
            n_decoded += count
            _STATS["bytes_decoded"] += raw_len
        _STATS["partial_decodes"] += 1
        _STATS["blocks_decoded"] += n_decoded
        _STATS["blocks_skipped"] += info.n_blocks - n_decoded
        return out


def first_failure(exc: BaseException) -> BaseException:
    """The error behind DCP's ``CheckpointException`` (which ``dcp.load`` / ``dcp.save`` raise for any
    failure of a rank, and which is a ``BaseException``, not an ``Exception``): the exception of the
    lowest failing rank, e.g. the :class:`tensorzip.CorruptDataError` naming a damaged item.
    Other exceptions are returned unchanged. ::

        from torch.distributed.checkpoint.api import CheckpointException
        try:
            dcp.load(state, storage_reader=tensorzip.dcp.StorageReader(path))
        except CheckpointException as e:
            raise tensorzip.dcp.first_failure(e) from e
    """
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        return first[0] if isinstance(first, tuple) else first
    return exc


def _block_ranges(runs: Tuple[Any, int], itemsize: int, block_bytes: int,
                  n_blocks: int) -> Optional[List[Tuple[int, int]]]:
    """Runs of codec blocks (first, count) that hold the given element runs; None when they are more
    than _PARTIAL_MAX_FRACTION of the blocks (decoding the chunk whole is then cheaper)."""
    starts, run_len = runs
    if starts.size == 0 or run_len == 0:
        return []
    first = (starts * itemsize) // block_bytes
    last = ((starts + run_len) * itemsize - 1) // block_bytes
    mark = np.zeros(n_blocks + 1, dtype=np.int64)
    np.add.at(mark, first, 1)
    np.add.at(mark, last + 1, -1)
    needed = np.cumsum(mark[:n_blocks]) > 0
    if needed.sum() > _PARTIAL_MAX_FRACTION * n_blocks:
        return None
    edges = np.flatnonzero(np.diff(np.concatenate(([0], needed.astype(np.int8), [0]))))
    return [(int(a), int(b - a)) for a, b in zip(edges[0::2], edges[1::2])]


def _element_runs(shape: Sequence[int], offs: Sequence[int], lens: Sequence[int]) -> Optional[Tuple[Any, int]]:
    """Flat element offsets of the contiguous runs of a sub-box of a C-order array, and the run length.

    A dim-0 slice is one run; a column slice of a matrix is one run per row.
    None when there are more than _PARTIAL_MAX_RUNS runs.
    """
    nd = len(shape)
    strides = [math.prod(shape[j + 1:]) for j in range(nd)]
    k = nd - 1  # innermost dim that is not fully covered; dims after it are whole
    while k > 0 and offs[k] == 0 and lens[k] == shape[k]:
        k -= 1
    run_len = lens[k] * strides[k]
    n_runs = math.prod(lens[:k])
    if n_runs > _PARTIAL_MAX_RUNS:
        return None
    starts = np.array([offs[k] * strides[k]], dtype=np.int64)
    for j in range(k):
        if lens[j] == 0:
            return np.zeros(0, dtype=np.int64), 0
        add = (offs[j] + np.arange(lens[j], dtype=np.int64)) * strides[j]
        starts = (starts[:, None] + add[None, :]).reshape(-1)
    return starts, run_len
