"""DCP's own readers (FileSystemReader, dcp.load(checkpoint_id=), format_utils.dcp_to_torch_save)
on tensorzip checkpoints: the "tensorzip" stream transform extension and its registration.

Each item's DCP storage entry names this extension in its transform descriptor; DCP reads the
item's byte range (its frames in the rank's .tzip file) and passes it through the extension,
which decodes the frames and returns what FileSystemReader expects. See tensorzip.dcp.
"""
from __future__ import annotations

import io
import zlib
from typing import Any, Sequence, Tuple

import numpy as np
import torch

from .. import _core, _dtypes
from .. import _tensorzip as _C
from .._core import CorruptDataError
from ._layout import _CODEC_TZIP, _DESCRIPTOR_NAME, _DESCRIPTOR_VERSION, _FRAME_ALIGN

# ---- DCP's own readers: the "tensorzip" stream transform extension ----

def _descriptor(codec: str, dtype: str, shape: Sequence[int], crc: int) -> str:
    return "|".join([f"{_DESCRIPTOR_NAME}/{_DESCRIPTOR_VERSION}", codec, dtype, ",".join(str(int(x)) for x in shape),
                     str(int(crc))])


try:
    from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension
except ImportError:  # pragma: no cover - torch without DCP extensions (< 2.6)
    ExtensionRegistry = None  # type: ignore[assignment,misc]
    StreamTransformExtension = object  # type: ignore[assignment,misc]


class TensorZipExtension(StreamTransformExtension):  # type: ignore[misc,valid-type]
    """Decodes one item of a tensorzip checkpoint for DCP's own ``FileSystemReader``.

    DCP reads the byte range of an item (its frames in the rank's ``.tzip`` file) and passes it
    through the transforms named by the item's descriptor: this one decodes the frames (every
    block checksum checked; bytes items against their CRC-32) and returns what
    ``FileSystemReader`` expects, ``torch.save`` bytes of the tensor or the item's bytes. So
    ``FileSystemReader(dir)``, ``dcp.load(state, checkpoint_id=dir)`` and
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir, out)`` read tensorzip
    checkpoints once this module is imported (reading a tensorzip checkpoint's ``.metadata``
    imports it by itself). :class:`StorageReader` remains the efficient reader: it decodes into
    the target tensors and, for resharded loads, only the needed blocks.
    """

    def __init__(self, codec: str = _CODEC_TZIP, dtype: str = "U8", shape: Tuple[int, ...] = (0,), crc: int = 0):
        super().__init__()
        self.codec, self.dtype, self.shape, self.crc = codec, dtype, tuple(shape), crc

    @staticmethod
    def registry_name() -> str:
        return _DESCRIPTOR_NAME

    @staticmethod
    def from_descriptor(version: str) -> "TensorZipExtension":
        parts = str(version).split("|")
        if parts[0] != _DESCRIPTOR_VERSION or len(parts) != 5:
            raise ValueError(f"tensorzip.dcp: item descriptor version {parts[0]!r} is not read by DCP's own readers "
                             f"(this tensorzip writes version {_DESCRIPTOR_VERSION}); read the checkpoint with "
                             f"tensorzip.dcp.StorageReader")
        _, codec, dtype, shape_s, crc = parts
        shape = tuple(int(x) for x in shape_s.split(",")) if shape_s else ()
        return TensorZipExtension(codec, dtype, shape, int(crc))

    def get_descriptor(self) -> str:
        return _descriptor(self.codec, self.dtype, self.shape, self.crc)[len(_DESCRIPTOR_NAME) + 1:]

    def transform_to(self, output: Any) -> Any:
        raise NotImplementedError("tensorzip checkpoints are written by tensorzip.dcp.StorageWriter")

    def transform_from(self, input: Any) -> Any:
        data = input.read()
        if self.codec == _CODEC_TZIP:
            out = torch.empty(self.shape, dtype=_dtypes.torch_dtype(self.dtype))
            flat = out.reshape(-1).view(torch.uint8).numpy() if out.numel() else np.empty(0, np.uint8)
            _decode_frames(data, flat)
            buf = io.BytesIO()
            torch.save(out, buf)
            buf.seek(0)
            return buf
        payload = np.empty(int(np.prod(self.shape)) if self.shape else 0, dtype=np.uint8)
        _decode_frames(data, payload)
        if zlib.crc32(payload) != self.crc:
            raise CorruptDataError(f"tensorzip.dcp: item corrupt (CRC-32 mismatch of its {payload.size} bytes)")
        return io.BytesIO(payload.tobytes())


def _decode_frames(data: bytes, out: np.ndarray) -> None:
    """Decodes the consecutive frames of one .tzip tensor (each at a multiple of 64 bytes from the
    first) into ``out``, which must be exactly their raw size."""
    view = memoryview(data)
    pos = done = 0
    while done < out.size:
        if pos >= len(view):
            raise CorruptDataError("tensorzip.dcp: item truncated: its frames end before its data")
        info = _C.frame_info(view, pos)
        size, raw = int(info["frame_size"]), int(info["raw_size"])
        if pos + size > len(view) or done + raw > out.size:
            raise CorruptDataError("tensorzip.dcp: item corrupt: a frame runs past the item")
        _C.decompress_into(view[pos:pos + size], 0, out[done:done + raw])
        done += raw
        pos += (size + _FRAME_ALIGN - 1) // _FRAME_ALIGN * _FRAME_ALIGN


def extension_registry() -> Any:
    """A DCP ``ExtensionRegistry`` that knows tensorzip items, for ``FileSystemReader(path,
    _extension_registry=tensorzip.dcp.extension_registry())`` (DCP's experimental argument)."""
    if ExtensionRegistry is None:  # pragma: no cover
        raise _core.UsageError("this torch has no DCP stream extensions (torch >= 2.6 needed)")
    reg = ExtensionRegistry()
    reg.register(TensorZipExtension)
    return reg


def _register_with_dcp() -> bool:
    """Makes every DCP ExtensionRegistry know "tensorzip" items, also registries made before this
    module was imported (a FileSystemReader exists before it unpickles .metadata, which imports this
    module): the lookup method adds TensorZipExtension to a registry that lacks it. An extension the
    user registered under the same name is kept. Returns False where DCP has no such registry."""
    if ExtensionRegistry is None or not hasattr(ExtensionRegistry, "from_descriptor_list"):
        return False  # pragma: no cover
    lookup = ExtensionRegistry.from_descriptor_list
    if getattr(lookup, "_tensorzip", False):
        return True

    def from_descriptor_list(self: Any, descriptors: Sequence[str]) -> Sequence[Any]:
        exts = getattr(self, "extensions", None)
        if isinstance(exts, dict) and _DESCRIPTOR_NAME not in exts:
            self.register(TensorZipExtension)
        return lookup(self, descriptors)

    from_descriptor_list._tensorzip = True  # type: ignore[attr-defined]
    from_descriptor_list.__doc__ = lookup.__doc__
    ExtensionRegistry.from_descriptor_list = from_descriptor_list  # type: ignore[method-assign]
    return True


#: Whether DCP's own readers (FileSystemReader, dcp_to_torch_save, dcp.load(checkpoint_id=)) read
#: tensorzip checkpoints in this process (see TensorZipExtension).
DCP_TOOLS_READ_TENSORZIP = _register_with_dcp()
