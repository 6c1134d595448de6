"""Type stubs of the nanobind extension tensorzip._tensorzip (python/src/tensorzip_module.cpp).

Buffers are any object with the buffer protocol (bytes, bytearray, memoryview,
NumPy arrays); outputs must be writable and C-contiguous.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from typing_extensions import Buffer as _PyBuffer

Buffer = Union[_PyBuffer, np.ndarray]

class TensorZipError(Exception): ...
class CorruptDataError(TensorZipError, ValueError): ...
class UsageError(TensorZipError, ValueError): ...
class TensorZipIOError(TensorZipError, OSError): ...
class TensorZipExistsError(TensorZipError, FileExistsError): ...
class TensorZipFileNotFoundError(TensorZipIOError, FileNotFoundError): ...
class TensorZipPermissionError(TensorZipIOError, PermissionError): ...

VERSION: Tuple[int, int, int]
FORMAT_VERSION: int
HAVE_CONTAINER: bool
CONTAINER_VERSION: Tuple[int, int]

def library_version() -> int: ...
def simd_path() -> str:
    """The CPU kernel set the codec runs: portable, avx2, avx512 or neon."""
def compress_folder(src: str, dst: str, level: int = 0, threads: int = 0, force: bool = False,
                    predict: bool = True) -> None:
    """Model folder -> compressed folder, like `tzip compress DIR` (*.safetensors -> .tzip, others copied)."""
def decompress_folder(src: str, dst: str, threads: int = 0, force: bool = False) -> None:
    """Compressed folder -> the original folder, byte for byte, like `tzip decompress DIR`."""
def safetensors_info(path: str) -> Dict[str, Any]:
    """Validated safetensors header: data_start, file_size, metadata, tensors [(name, dtype, shape,
    begin, end)] in data order (offsets relative to data_start)."""
def codec_dtype_for(dtype: str) -> int:
    """The codec dtype the container uses for a safetensors dtype string (-1: unknown)."""
def compress_bound(size: int) -> int: ...
def compress(prefix: Buffer, data: Buffer, dtype: int, level: int = 0, block_elems: int = 0,
             threads: int = 0) -> bytes:
    """prefix + one codec frame of data (GIL released while coding)."""
def decompress_into(data: Buffer, offset: int, out: Buffer, threads: int = 0) -> int:
    """Decodes the frame data[offset:] into out (exactly its raw size); GIL released."""
def frame_info(data: Buffer, offset: int = 0) -> Dict[str, Union[int, str]]: ...
def frame_prefix_size(data: Buffer, offset: int = 0) -> int: ...
def frame_block_range(prefix: Buffer, first: int, count: int) -> Tuple[int, int, int, int]: ...
def decompress_blocks_into(prefix: Buffer, blocks: Buffer, first: int, count: int, out: Buffer,
                           out_offset: int = 0, threads: int = 0) -> int: ...
def compress_file(src: str, dst: str, level: int = 0, block_elems: int = 0, threads: int = 0,
                  chunk_bytes: int = 0, force: bool = False, predict: bool = True, ref: str = "",
                  ref_original: str = "", min_gain: float = -1.0,
                  user_metadata: Dict[str, str] = ...) -> Tuple[int, int]:
    """safetensors file -> .tzip file; returns (raw bytes, file bytes). ref: previous checkpoint
    (.tzip, delta); ref_original: its safetensors content (fast path); min_gain < 0: default."""

class Reader:
    def __init__(self, path: str, threads: int = 0, refs: List[str] = ..., check: bool = False) -> None:
        """refs: locations of referenced .tzip files (a chain may be given); check: check them now."""
    def references(self) -> List[Tuple[str, int]]:
        """(recorded relative path, whole-file xxh64) of each referenced .tzip file."""
    def predictions(self) -> List[Tuple[str, str, str, int]]:
        """(name, "cast" | "delta", source tensor, reference index or -1) of predicted tensors."""
    def version(self) -> Tuple[int, int]: ...
    @property
    def file_checksum(self) -> int: ...
    def check_references(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def tensors(self) -> List[Tuple[str, str, Tuple[int, ...], int, int]]:
        """(name, dtype, shape, raw bytes, compressed bytes) in data order."""
    def metadata(self) -> Dict[str, str]: ...
    def user_metadata(self) -> Dict[str, str]: ...
    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def original_size(self) -> int: ...
    @property
    def created_by(self) -> str: ...
    def find(self, name: str) -> int: ...
    def read_tensor(self, index: int, out: Buffer) -> None: ...
    def read_tensors(self, indices: List[int], outs: List[Buffer]) -> None: ...
    def read_range(self, index: int, offset: int, out: Buffer) -> None: ...
    def export_safetensors(self, out: str, threads: int = 0, force: bool = False) -> Tuple[int, int]: ...
    def verify(self, original: str = "", threads: int = 0) -> None: ...

class TensorWriter:
    """A .tzip file from tensors in memory (tz::container::TensorWriter): encode on a thread pool
    overlapped with writes through the I/O engine (io: "auto" = io_uring where available else a
    pwrite thread pool, "posix", "io_uring", "pwrite" = synchronous); temporary name, fsync and
    rename in finish(). add() keeps a reference to each buffer until finish() or abort()."""
    def __init__(self, path: str, level: int = 0, threads: int = 0, chunk_bytes: int = 0,
                 direct_io: bool = False, predict: bool = False, metadata: Dict[str, str] = ...,
                 block_elems: int = 0, force: bool = False, io: str = "auto", io_threads: int = 0,
                 user_metadata: Dict[str, str] = ..., safetensors_header: str = "", ref: str = "",
                 ref_original: str = "") -> None:
        """user_metadata: .tzip header only; safetensors_header: the export's header JSON verbatim
        (checked against the added tensors; "" = made by the writer); ref: previous .tzip (delta);
        ref_original: ref's content as a safetensors file (read, checked, instead of decoding ref)."""
    def add(self, name: str, dtype: str, shape: Sequence[int], data: Buffer) -> None:
        """dtype: a safetensors dtype string ("BF16", "F32", "U8", ...); data: C-contiguous, len = bytes."""
    def finish(self) -> Dict[str, Any]:
        """Encodes, writes, fsyncs, renames (GIL released). Returns raw_bytes, file_bytes,
        encode_seconds, seconds, io (back end, "+O_DIRECT" if used), direct, predicted, file_xxh64 and
        tensors: [{name, dtype, shape, raw_size, compressed_size, block_bytes, n_blocks, predicted,
        frames: [(offset, size, raw_size)]}] in the order added."""
    def abort(self) -> None: ...
    @property
    def path(self) -> str: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> "TensorWriter": ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        """Aborts (removes the temporary file) when the block raised."""
