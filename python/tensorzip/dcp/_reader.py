"""tensorzip.dcp.StorageReader: items read back whole, or block by block when resharded."""
from __future__ import annotations

import io
import math
import os
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

try:
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
    from torch.futures import Future
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from .. import _dtypes
from .. import _tensorzip as _C
from .._core import CorruptDataError
from ._layout import _CODEC_TZIP, _CODEC_TZIP_PT, _CODEC_TZIP_RAW, _check_finished
from ._common import _PARTIAL_MAX_FRACTION, _PARTIAL_MAX_RUNS, _STATS, _TzStorageInfo, _item_name


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
