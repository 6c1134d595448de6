"""PyTorch Distributed Checkpoint (DCP) storage backed by tensorzip.

Usage::

    import torch.distributed.checkpoint as dcp
    import tensorzip.dcp

    dcp.save(state_dict, storage_writer=tensorzip.dcp.StorageWriter(path))
    dcp.load(state_dict, storage_reader=tensorzip.dcp.StorageReader(path))

Layout of a checkpoint directory (one per ``path``):

- ``__<rank>_0.tzdcp``: one file per rank, written by that rank only. It is a
  plain concatenation of items: each tensor chunk as one :func:`tensorzip.compress`
  payload (dtype, shape and a codec checksum included), tensors of a dtype the
  codec does not support as ``torch.save`` bytes, and non-tensor items
  (``BYTE_IO``: optimizer param groups, ints, pickled objects) as the raw bytes
  DCP hands over.
- ``.metadata``: DCP's own pickled :class:`~torch.distributed.checkpoint.metadata.Metadata`,
  written by the coordinator in :meth:`StorageWriter.finish` (temporary file,
  then rename, as DCP's ``FileSystemWriter`` does). Each item's storage entry
  records file, offset, length, how it was encoded and a CRC-32 of the stored
  bytes, so a damaged file is reported with the name of the damaged item.

Both classes subclass DCP's ``FileSystemWriter`` / ``FileSystemReader`` and
override only how item bytes are written and read; planning, metadata,
``reset``/``checkpoint_id`` and the async staging of ``FileSystemWriter`` are
DCP's.

Limits of this first version:

- Reads decode whole stored chunks: a rank that loads a slice of a stored
  chunk (resharding) decodes the whole chunk, then narrows it. Block-level
  partial reads are not implemented yet.
- Tensors are copied to the CPU and encoded there (no GPU encode yet).
- ``thread_count`` and ``single_file_per_rank`` of ``FileSystemWriter`` are
  ignored: each rank writes exactly one file; tensorzip itself codes with
  ``threads`` threads (0 = all hardware threads).
- Tested with plain tensors, DTensor shards on CPU/gloo, AdamW state and a
  single-process ``dcp.async_save`` (``FileSystemWriter``'s staging); FSDP2,
  multi-rank ``async_save`` and CUDA tensors are not tested yet.
- ``.metadata`` pickles this module's storage entries, so reading a checkpoint
  needs tensorzip installed.
"""
from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Union

try:
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from . import _core, _dtypes
from ._core import CorruptDataError

__all__ = ["StorageWriter", "StorageReader", "SUFFIX"]

#: Suffix of the per-rank data files.
SUFFIX = ".tzdcp"

# How an item's bytes were encoded (stored in the checkpoint metadata).
_CODEC_TZ = "tensorzip"      # tensorzip.compress payload of a tensor
_CODEC_PT = "torch.save"     # torch.save bytes of a tensor of a dtype tensorzip does not code
_CODEC_RAW = "raw"           # BYTE_IO item, as given by DCP

# Marks tensorzip entries for readers that do not know them: DCP's own
# FileSystemReader fails with "Unknown extension" instead of misreading bytes.
_DESCRIPTOR = "tensorzip/1"


@dataclass
class _TzStorageInfo(_StorageInfo):
    """DCP's per-item storage entry, plus the encoding and a CRC-32 of the stored bytes."""

    codec: str = _CODEC_RAW
    crc32: int = 0


def _item_name(index: Any) -> str:
    fqn = getattr(index, "fqn", str(index))
    offset = getattr(index, "offset", None)
    return f"{fqn!r} (chunk offset {tuple(offset)})" if offset is not None and len(offset) else repr(fqn)


class StorageWriter(FileSystemWriter):
    """DCP storage writer that stores every tensor chunk compressed by tensorzip.

    Args:
        path: checkpoint directory (created if missing).
        level: tensorzip level: 0 default, 1 fast, 2 code every field that shrinks, 3 strongest, -1 store.
        threads: coding threads per rank, 0 = all hardware threads (the output does not depend on it).
        sync_files: fsync the data file before returning (as ``FileSystemWriter``).
        overwrite: allow writing over an existing checkpoint (as ``FileSystemWriter``).
        **kwargs: passed to ``FileSystemWriter`` (e.g. ``cache_staged_state_dict``);
            ``thread_count`` and ``single_file_per_rank`` have no effect.
    """

    def __init__(self, path: Union[str, os.PathLike], *, level: int = 0, threads: int = 0,
                 sync_files: bool = True, overwrite: bool = True, **kwargs: Any) -> None:
        super().__init__(path, sync_files=sync_files, overwrite=overwrite, **kwargs)
        _core.compress(torch.zeros(1), level=level, threads=threads)  # UsageError now for a bad level/threads
        self.level = level
        self.threads = threads

    def _encode(self, item: Any, data: Any) -> Tuple[bytes, str]:
        if item.type == WriteItemType.BYTE_IO:
            if isinstance(data, io.BytesIO):
                return bytes(data.getbuffer()), _CODEC_RAW
            return bytes(data), _CODEC_RAW
        tensor = data.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        try:
            _dtypes.name_of_torch(tensor.dtype)
        except ValueError:
            # dtype the codec does not support (complex, ...): stored as DCP would store it.
            buf = io.BytesIO()
            torch.save(tensor, buf)
            return buf.getvalue(), _CODEC_PT
        return _core.compress(tensor, level=self.level, threads=self.threads, block_elems=0), _CODEC_TZ

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        storage_plan: _StoragePrefix = plan.storage_data
        file_name = f"{storage_plan.prefix}0{SUFFIX}"
        path = self.fs.concat_path(self.path, file_name)
        results: List[WriteResult] = []
        with self.fs.create_stream(path, "wb") as stream:
            offset = 0
            for item in plan.items:
                data = planner.resolve_data(item)
                payload, codec = self._encode(item, data)
                stream.write(payload)
                if item.type == WriteItemType.BYTE_IO:
                    size_in_bytes = len(payload)
                else:
                    size_in_bytes = data.numel() * data.element_size()
                info = _TzStorageInfo(file_name, offset, len(payload))
                info.transform_descriptors = [_DESCRIPTOR]
                info.codec = codec
                info.crc32 = zlib.crc32(payload)
                results.append(WriteResult(index=item.index, size_in_bytes=size_in_bytes, storage_data=info))
                offset += len(payload)
            if self.sync_files:
                stream.flush()
                os.fsync(stream.fileno())
        fut: Future = Future()
        fut.set_result(results)
        return fut


class StorageReader(FileSystemReader):
    """DCP storage reader for checkpoints written by :class:`StorageWriter`.

    Checks each item's CRC-32 and tensorzip checksum; a damaged item raises
    :class:`tensorzip.CorruptDataError` naming the item (state-dict key) and
    the file. Checkpoints written by DCP's own ``FileSystemWriter`` are read
    through ``FileSystemReader``.

    A load that needs only part of a stored chunk (resharding) decodes the whole
    chunk, then copies the needed part.

    Args:
        path: checkpoint directory.
        threads: decoding threads, 0 = all hardware threads.
    """

    def __init__(self, path: Union[str, os.PathLike], *, threads: int = 0) -> None:
        super().__init__(path)
        self.threads = threads

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        if not all(isinstance(self.storage_data[r.storage_index], _TzStorageInfo) for r in plan.items):
            return super().read_data(plan, planner)  # not a tensorzip checkpoint
        per_file: Dict[str, List[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for relative_path, reqs in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)
            cache: Dict[Any, Any] = {}  # storage_index -> decoded tensor, for several reads of one chunk
            with self.fs.create_stream(path, "rb") as stream:
                for req in reqs:
                    info: _TzStorageInfo = self.storage_data[req.storage_index]
                    if req.type == LoadItemType.BYTE_IO:
                        payload = self._read(stream, info, req, path)
                        planner.load_bytes(req, io.BytesIO(payload))
                        continue
                    key = req.storage_index
                    tensor = cache.get(key)
                    if tensor is None:
                        tensor = self._decode(self._read(stream, info, req, path), info, req, path)
                        cache[key] = tensor
                    tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != tensor.size():
                        raise CorruptDataError(f"tensorzip.dcp: item {_item_name(req.storage_index)} in {path}: "
                                               f"stored size {tuple(tensor.size())}, expected {tuple(target.size())}")
                    target.copy_(tensor)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def _read(stream: Any, info: _TzStorageInfo, req: Any, path: Any) -> bytes:
        stream.seek(info.offset)
        payload = stream.read(info.length)
        if len(payload) != info.length:
            raise CorruptDataError(f"tensorzip.dcp: item {_item_name(req.storage_index)}: {path} is truncated "
                                   f"(needs bytes {info.offset}..{info.offset + info.length})")
        if zlib.crc32(payload) != info.crc32:
            raise CorruptDataError(f"tensorzip.dcp: item {_item_name(req.storage_index)} in {path} is corrupt "
                                   f"(CRC-32 mismatch at bytes {info.offset}..{info.offset + info.length})")
        return payload

    def _decode(self, payload: bytes, info: _TzStorageInfo, req: Any, path: Any) -> Any:
        try:
            if info.codec == _CODEC_TZ:
                return _core.decompress(payload, framework="pt", device="cpu", threads=self.threads)
            if info.codec == _CODEC_PT:
                return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except CorruptDataError as e:
            raise CorruptDataError(f"tensorzip.dcp: item {_item_name(req.storage_index)} in {path}: {e}") from e
        raise CorruptDataError(f"tensorzip.dcp: item {_item_name(req.storage_index)} in {path}: "
                               f"unknown encoding {info.codec!r}")
