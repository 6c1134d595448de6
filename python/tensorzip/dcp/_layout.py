"""tensorzip.dcp's checkpoint folder: file names, item codecs, finished or not, leftovers.

Shared by the storage writer/reader (tensorzip.dcp) and DCP's own readers' extension
(tensorzip._dcp_extension). Import names from tensorzip.dcp.
"""
from __future__ import annotations

import os
import pickle
import re
from typing import Any, List, Optional, Union

from .._core import CorruptDataError, fsync_dir as _fsync_dir

#: Suffix of the per-rank data files (standard .tzip files).
SUFFIX = ".tzip"

_METADATA = ".metadata"
# Data files written by StorageWriter: __<rank>_<save id>.tzip.
_DATA_FILE = re.compile(r"^__(\d+)_([0-9a-z]+)(" + re.escape(SUFFIX) + r")$")
# The temporary name TensorWriter builds a data file under (left behind by a killed save):
# ".NAME.tmp-<machine tag>-<pid>-<random>" (src/container/output.hpp), or "-<pid>-<n>" (older).
_DATA_TMP = re.compile(r"^\.__(\d+)_([0-9a-z]+)" + re.escape(SUFFIX) +
                       r"\.tmp-(?:[0-9a-f]{8}-\d+-[0-9a-f]{16}|\d+-\d+)$")

_RANK_METADATA = re.compile(r"^__\d+\.metadata$")  # written by saves with use_collectives=False

# How an item is stored (recorded in the checkpoint metadata).
# Every item is one tensor of the rank's .tzip file.
_CODEC_TZIP = "tzip"            # the tensor itself (dtype and shape as saved)
_CODEC_TZIP_PT = "tzip:torch.save"  # U8 tensor: torch.save bytes of a tensor of a dtype .tzip cannot hold
_CODEC_TZIP_RAW = "tzip:raw"    # U8 tensor: a BYTE_IO item, as given by DCP

# Each item's DCP transform descriptor: "tensorzip/3|<codec>|<dtype>|<shape>|<crc32>". DCP's own
# readers hand it to the extension registered under "tensorzip" (TensorZipExtension below), which
# decodes the item's frames; a reader without it fails with "Unknown extension name='tensorzip'"
# instead of misreading bytes. ("tensorzip/2": development layouts, read by StorageReader only.)
_DESCRIPTOR_NAME = "tensorzip"
_DESCRIPTOR_VERSION = "3"
_FRAME_ALIGN = 64  # frames of a .tzip file start at multiples of 64 (doc/container.md)


# ---- checkpoint folder state: finished or not, leftovers of interrupted saves ----

def _stale_data_files(path: str, keep: set) -> List[str]:
    """Names of data files and writer temporaries in ``path`` that ``keep`` does not hold (files
    StorageWriter writes, and nothing else: their names are __<rank>_<save id>.tzip and
    .__<rank>_<save id>.tzip.tmp-<pid>-<n>)."""
    return sorted(n for n in os.listdir(path) if n not in keep and (_DATA_FILE.match(n) or _DATA_TMP.match(n)))


def _check_finished(path: str, rank: Optional[int] = None) -> None:
    """CorruptDataError when ``path`` holds data files of a save but no finished checkpoint."""
    if not os.path.isdir(path):
        return  # DCP's FileNotFoundError
    names = os.listdir(path)
    meta = _METADATA if rank is None else f"__{rank}{_METADATA}"
    if meta in names:
        return
    leftovers = sorted(n for n in names if _DATA_FILE.match(n) or _DATA_TMP.match(n))
    per_rank = rank is None and any(_RANK_METADATA.match(n) for n in names)
    if leftovers and not per_rank:  # (a save without collectives has __<rank>.metadata: DCP falls back)
        shown = ", ".join(leftovers[:4]) + (", ..." if len(leftovers) > 4 else "")
        raise CorruptDataError(
            f"tensorzip.dcp: {path} holds no finished checkpoint: {meta} is missing but data files of an "
            f"unfinished save are there ({shown}); that save was interrupted before it wrote its metadata, so "
            f"there is nothing to load (tensorzip.dcp.clear_interrupted({path!r}) removes them)")


def clear_interrupted(path: Union[str, os.PathLike]) -> List[str]:
    """Removes what interrupted saves left in a checkpoint folder; returns the names removed.

    That is: ``StorageWriter`` data files (``__<rank>_<save id>.tzip``) that no finished checkpoint
    of the folder uses (none, when no save finished there), and writer temporaries
    (``.__<rank>_<save id>.tzip.tmp-*``). The finished checkpoint (``.metadata`` and the files it
    names; with ``use_collectives=False``, every ``__<rank>.metadata`` and its files) and every other
    file are left alone. The next finished save into the folder does the same by itself; this is
    for a folder that is to be kept as it is, or reused later. Call it when no save into the folder
    is running (it would remove that save's files).
    """
    folder = os.fspath(path)
    keep: set = set()
    for name in os.listdir(folder):
        if name == _METADATA or _RANK_METADATA.match(name):
            with open(os.path.join(folder, name), "rb") as f:
                md = pickle.load(f)
            keep |= {getattr(info, "relative_path", None) for info in (md.storage_data or {}).values()}
    removed = []
    for name in _stale_data_files(folder, keep):
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    if removed:
        _fsync_dir(folder)
    return removed
