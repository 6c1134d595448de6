"""tensorzip.dcp.StorageWriter: each rank's items coded into one .tzip file."""
from __future__ import annotations

import dataclasses
import io
import os
import pickle
import time
import zlib
from typing import (
    Any,
    Dict,
    List,
    Optional,
    Tuple,
    Union,
)


try:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import filesystem as _dcp_fs
    from torch.distributed.checkpoint.filesystem import _StoragePrefix
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from .. import _core, _dtypes
from .. import _tensorzip as _C
from ._extension import _descriptor
from ._layout import SUFFIX, _CODEC_TZIP, _CODEC_TZIP_PT, _CODEC_TZIP_RAW, _fsync_dir, _stale_data_files
from ._common import _STALL_ENV, _TzStorageInfo, _cuda_encode_available, _new_save_id, _stored_name


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
