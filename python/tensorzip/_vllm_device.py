"""The weight stream's tensors decoded on a CUDA device: the GPU path of the vLLM load format
``tensorzip`` (``tensorzip.vllm``, option ``device_decode``). No vLLM import here.

Per tensor: its frames are read from the ``.tzip`` file as stored (``pread`` and each frame's
recorded xxh64, no decoding: ``_tensorzip.read_frames_into``) into page-locked host memory, each
frame's header checked against the file's index (``_tensorzip.frame_info``), copied to the
device, and decoded there by a one-group CUDA plan of resident weights
(``_tensorzip.ResidentPlanCuda``, ``tz_cuda_decompress``) into a new CUDA tensor. Each worker
thread has a CUDA stream of its own and waits for it, so a tensor is complete when it is handed
on; it is then marked as used by the consumer's stream (``record_stream``), so its memory is not
reused before the work the consumer queued on it has run.

Tensors that stay on the host path (decoded by the CPU, as without this module): tensors of a
shard still in safetensors form, delta/cast-coded tensors (their prediction is decoded on the
CPU), dtypes that are not coded as floats (integers, packed F4, ...: their frames may hold zstd
streams, which the CUDA decoder does not read), and any tensor with such a frame.

Errors name the file and the tensor (``<file>: tensor 'x': <what>``): a frame that does not match
its checksum, a header that differs from the index, and a frame the device failed to decode all
raise CorruptDataError; nothing decoded from a damaged frame is handed on.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _dtypes
from . import _tensorzip as _C
from ._core import CorruptDataError, TensorZipError, UsageError
from ._frame_layout import Frame, pack_frames

__all__ = ["built_with_cuda", "unavailable_reason", "decode_device", "model_device", "DeviceDecoder"]



def built_with_cuda() -> bool:
    """Whether this build of tensorzip has the CUDA plan of resident weights (the decoder used here)."""
    return bool(getattr(_C, "HAVE_RESIDENT_CUDA", False))


def unavailable_reason(device: Any) -> Optional[str]:
    """None when tensors can be decoded on ``device``, else why not (one line)."""
    import torch

    if device is None or torch.device(device).type != "cuda":
        return f"the model's parameters are on {device if device is not None else 'no device'}, not a CUDA device"
    if not built_with_cuda():
        return "this tensorzip build has no CUDA decoder (build the package with TZ_CUDA=ON)"
    if not _C.cuda_available():
        return "no CUDA device is visible (tensorzip._tensorzip.cuda_available() is False)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def model_device(model: Any) -> Any:
    """The device of the model's first parameter that is not on the meta device (None: none)."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return None


def decode_device(option: Any, device: Any) -> Tuple[Any, str]:
    """(device to decode on or None, why) for the option ``device_decode`` (None: not given, the
    default: on when possible) and the model's device. ``device_decode: true`` given explicitly
    where the device path cannot run is refused (UsageError, one line); false is the CPU path."""
    if option is False:
        return None, "device_decode is false"
    why = unavailable_reason(device)
    if why is None:
        return device, f"decoded on {device}"
    if option is True:
        raise UsageError(f"model_loader_extra_config: device_decode is true but the weights cannot be decoded "
                         f"on the device: {why}")
    return None, why


class _Entry:
    """One tensor of a .tzip file, from its frame table (``_tensorzip.tzip_frame_table``)."""
    __slots__ = ("dtype", "shape", "predicted", "frames")

    def __init__(self, row: Tuple[Any, ...]):
        _name, self.dtype, shape, self.predicted, self.frames = row
        self.shape = tuple(int(s) for s in shape)


class _CudaCalls:
    """The CUDA runtime calls of the device path, in one place (tests replace them by host stand-ins)."""

    def __init__(self, device: Any):
        self.device = device
        self._local = threading.local()

    def stream(self) -> Any:
        """The calling thread's stream on the device (created on first use)."""
        import torch

        s = getattr(self._local, "stream", None)
        if s is None:
            s = self._local.stream = torch.cuda.Stream(device=self.device)
        return s

    def using(self, stream: Any) -> Any:
        """The model's device and the thread's stream made current (kernels launch there)."""
        import contextlib

        import torch

        ctx = contextlib.ExitStack()
        ctx.enter_context(torch.cuda.device(self.device))
        ctx.enter_context(torch.cuda.stream(stream))
        return ctx

    def pinned(self, nbytes: int) -> Any:
        import torch

        return torch.empty(max(1, nbytes), dtype=torch.uint8, pin_memory=True)

    def handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def wait(self, stream: Any) -> None:
        stream.synchronize()

    def consumer_stream(self) -> Any:
        import torch

        return torch.cuda.current_stream(self.device)

    def hand_over(self, t: Any, consumer: Any) -> None:
        t.record_stream(consumer)


def _strip(msg: str, path: str) -> str:
    return msg[len(path) + 2:] if msg.startswith(path + ": ") else msg


class DeviceDecoder:
    """Decodes tensors of .tzip files on one CUDA device, one tensor per call (thread-safe: each
    thread decodes on a stream of its own). ``tables(path)`` is read once per file."""

    def __init__(self, device: Any, calls: Optional[_CudaCalls] = None):
        self.device = device
        self.calls = calls or _CudaCalls(device)
        self.consumer = self.calls.consumer_stream()  # the stream of the thread that takes the tensors
        self._tables: Dict[str, Dict[str, _Entry]] = {}

    def add_file(self, path: str) -> None:
        """Reads the frame table of a .tzip file (a safetensors shard has none: its tensors stay on the
        host path)."""
        if not path.endswith(".tzip") or path in self._tables:
            return
        try:
            rows = _C.tzip_frame_table(path)
        except (TensorZipError, OSError) as e:
            raise type(e)(f"{path}: {_strip(str(e), path)}") from e
        self._tables[path] = {row[0]: _Entry(row) for row in rows}

    def on_device(self, path: str, name: str) -> bool:
        """Whether the tensor is decoded here (else on the host path; the module docstring says which)."""
        e = self._tables.get(path, {}).get(name)
        if e is None or e.predicted:
            return False
        try:
            d = _dtypes.lookup(e.dtype)
        except ValueError:
            return False
        return d.codec != _dtypes.CODEC_BYTES and d.packed == 1

    def decode(self, path: str, name: str) -> Any:
        """The tensor as a new tensor on the device, bit for bit the stored one; None when one of its
        frames is not coded as floats (the caller decodes it on the host)."""
        import torch

        e = self._tables[path][name]
        dtype = _dtypes.torch_dtype(e.dtype)
        where = f"{path}: tensor {name!r}"
        host, frames = self._read(path, e, where)
        if frames is None:
            return None
        nbytes = _dtypes.file_nbytes(e.dtype, e.shape)
        if sum(f.raw_size for f in frames) != nbytes:  # checked before any device memory is taken
            raise CorruptDataError(f"{where}: frames hold {sum(f.raw_size for f in frames)} bytes, the tensor "
                                   f"{list(e.shape)} of {e.dtype} needs {nbytes}")
        calls = self.calls
        stream = calls.stream()
        with calls.using(stream):
            out = torch.empty(e.shape, dtype=dtype, device=self.device)
            if frames:
                self._decode_frames(name, host, frames, out, nbytes, stream, where)
        calls.wait(stream)
        del host
        calls.hand_over(out, self.consumer)
        return out

    def _read(self, path: str, e: _Entry, where: str) -> Tuple[Any, Optional[List[Frame]]]:
        """The tensor's frames as stored in page-locked host memory, checked (xxh64, header against
        the index); frames None when one is not coded as floats."""
        frames, reads, pos = pack_frames(e.frames)
        host = self.calls.pinned(pos)
        try:
            _C.read_frames_into(path, reads, host.data_ptr(), host.numel())
            for f in frames:
                info = _C.frame_info(host[f.offset:f.offset + f.size].numpy())
                if info["raw_size"] != f.raw_size or info["frame_size"] != f.size:
                    raise CorruptDataError("frame sizes differ from the file's index")
                if info["dtype"] == _dtypes.CODEC_BYTES:
                    return host, None
        except (TensorZipError, OSError) as e:
            raise type(e)(f"{where}: {_strip(str(e), path)}") from e
        return host, frames

    def _decode_frames(self, name: str, host: Any, frames: List[Frame], out: Any, nbytes: int, stream: Any,
                       where: str) -> None:
        """Enqueues the copy of the frames and their decode into ``out`` on ``stream``, waits for it and
        checks every frame's status and decoded size."""
        import torch

        calls = self.calls
        dev_frames = host.to(self.device, non_blocking=True)
        plan = _C.ResidentPlanCuda()
        base = dev_frames.data_ptr()
        try:
            for f in frames:
                plan.add(0, name, base + f.offset, f.size, f.raw_size, f.raw_offset)
            plan.finalize()
            temp = torch.empty(max(256, int(plan.temp_bytes)), dtype=torch.uint8, device=self.device)
            sizes = torch.zeros(len(frames), dtype=torch.int64, device=self.device)
            status = torch.zeros(len(frames), dtype=torch.int32, device=self.device)
            plan.decode(0, out.data_ptr(), nbytes, temp.data_ptr(), temp.numel(), sizes.data_ptr(),
                        status.data_ptr(), calls.handle(stream))
        except TensorZipError as e:
            calls.wait(stream)  # nothing left running on the buffers before they go
            raise type(e)(f"{where}: {e}") from e
        calls.wait(stream)
        for i, (code, got) in enumerate(zip(status.cpu().tolist(), sizes.cpu().tolist())):
            if code:
                raise CorruptDataError(f"{where}: frame {i} of {len(frames)} failed to decode on {self.device} "
                                       f"(tz error code {int(code)})")
            if int(got) != frames[i].raw_size:
                raise CorruptDataError(f"{where}: frame {i} decoded to {int(got)} bytes on {self.device}, "
                                       f"{frames[i].raw_size} expected")
