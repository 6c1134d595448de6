"""Pieces shared by the DCP writer and reader: storage entries, read counters, item names."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

try:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from .. import _tensorzip as _C
from ._layout import _CODEC_TZIP_RAW


# Test hook (python/tests/test_dcp_ranks.py): "<rank>:<bytes>:<marker path>" makes that rank's
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


# The pickled name of the storage entries is tensorzip.dcp._TzStorageInfo (re-exported
# there), as in checkpoints written before the package was split.
_TzStorageInfo.__module__ = "tensorzip.dcp"
