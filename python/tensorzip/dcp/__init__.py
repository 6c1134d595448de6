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

try:
    import torch.distributed.checkpoint  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tensorzip.dcp needs PyTorch >= 2.4 with torch.distributed: pip install torch") from e

from ._extension import (  # noqa: F401  (public here)
    DCP_TOOLS_READ_TENSORZIP,
    ExtensionRegistry,
    TensorZipExtension,
    _descriptor,
    extension_registry,
)
from ._layout import (  # noqa: F401  (public here, and the names the tests use)
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
from ._common import (  # noqa: F401  (public here; _STALL_ENV: the tests' hook)
    _STALL_ENV,
    _TzStorageInfo,
    read_stats,
    reset_read_stats,
)
from ._reader import StorageReader  # noqa: F401
from ._writer import StorageWriter  # noqa: F401

__all__ = ["StorageWriter", "StorageReader", "SUFFIX", "read_stats", "reset_read_stats", "clear_interrupted",
           "first_failure", "TensorZipExtension", "extension_registry", "DCP_TOOLS_READ_TENSORZIP"]


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
