"""Element types: safetensors dtype strings <-> NumPy / torch dtypes <-> codec dtypes.

Every dtype of safetensors 0.8 that torch or NumPy (with ``ml_dtypes``) can hold is here.
The codec column must equal the container's choice (``codec_dtype_for`` in
src/container/safetensors.cpp; python/tests/test_dtypes.py checks that they agree): it
is what :func:`tensorzip.compress` uses for one tensor, while ``.tzip`` files take the
container's.

``F4`` (FP4 E2M1, two elements per byte, the first in the low nibble) is the one packed
type: a file's ``F4`` tensor of shape ``[..., 2n]`` is a torch ``float4_e2m1fn_x2`` tensor of
shape ``[..., n]`` (one byte per element, as safetensors maps it), and a NumPy
``ml_dtypes.float4_e2m1fn`` array of the file's shape (one element per byte, unpacked on
load and packed on save).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

import numpy as np

_ml: Any
try:  # bfloat16, float8 and float4 for NumPy
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    _ml = None

# Codec dtypes (tz_dtype in include/tensorzip/tensorzip.h; values are stored in frames).
CODEC_BYTES = 0
CODEC_BF16 = 1
CODEC_F16 = 2
CODEC_F32 = 3
CODEC_F8_E4M3 = 4
CODEC_F8_E5M2 = 5


class DType(NamedTuple):
    name: str          # safetensors dtype string
    itemsize: int      # bytes per torch element (F4: one float4_e2m1fn_x2 = two file elements)
    codec: int         # codec dtype used to compress it (the container's choice)
    rank: int          # safetensors' Dtype enum order (files sort tensors by it, descending)
    numpy_name: str    # attribute of numpy or ml_dtypes ("" when NumPy has none)
    torch_name: str    # attribute of torch ("" when torch has none)
    packed: int = 1    # file elements per torch element (F4: 2)


# rank = safetensors 0.8's Rust `Dtype` enum order (BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2
# F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16 BF16 I32 U32 F32 C64 F64 I64 U64;
# checked against safetensors' output in the tests). F6_* have no torch or NumPy type here.
# Codec choices for E8M0, F4, FNUZ and C64: measured (bench/dtype_codec_bench.py, bench/experiments/notebook.md).
_TABLE = [
    DType("BOOL", 1, CODEC_BYTES, 0, "bool_", "bool"),
    DType("F4", 1, CODEC_BYTES, 1, "float4_e2m1fn", "float4_e2m1fn_x2", packed=2),
    DType("U8", 1, CODEC_BYTES, 4, "uint8", "uint8"),
    DType("I8", 1, CODEC_BYTES, 5, "int8", "int8"),
    DType("F8_E5M2", 1, CODEC_F8_E5M2, 6, "float8_e5m2", "float8_e5m2"),
    DType("F8_E4M3", 1, CODEC_F8_E4M3, 7, "float8_e4m3fn", "float8_e4m3fn"),
    DType("F8_E8M0", 1, CODEC_F8_E4M3, 8, "float8_e8m0fnu", "float8_e8m0fnu"),
    DType("F8_E4M3FNUZ", 1, CODEC_F8_E4M3, 9, "float8_e4m3fnuz", "float8_e4m3fnuz"),
    DType("F8_E5M2FNUZ", 1, CODEC_F8_E5M2, 10, "float8_e5m2fnuz", "float8_e5m2fnuz"),
    DType("I16", 2, CODEC_BYTES, 11, "int16", "int16"),
    DType("U16", 2, CODEC_BYTES, 12, "uint16", "uint16"),
    DType("F16", 2, CODEC_F16, 13, "float16", "float16"),
    DType("BF16", 2, CODEC_BF16, 14, "bfloat16", "bfloat16"),
    DType("I32", 4, CODEC_BYTES, 15, "int32", "int32"),
    DType("U32", 4, CODEC_BYTES, 16, "uint32", "uint32"),
    DType("F32", 4, CODEC_F32, 17, "float32", "float32"),
    DType("C64", 8, CODEC_F32, 18, "complex64", "complex64"),
    DType("F64", 8, CODEC_BYTES, 19, "float64", "float64"),
    DType("I64", 8, CODEC_BYTES, 20, "int64", "int64"),
    DType("U64", 8, CODEC_BYTES, 21, "uint64", "uint64"),
]

BY_NAME: Dict[str, DType] = {d.name: d for d in _TABLE}
ALL_NAMES = tuple(d.name for d in _TABLE)
# safetensors dtypes that exist in files (the container accepts them) but have no torch or NumPy type.
NO_ARRAY_TYPE = ("F6_E2M3", "F6_E3M2")
_ML_NAMES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float4_e2m1fn"}


def lookup(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        if name in NO_ARRAY_TYPE:
            raise ValueError(f"dtype {name} has no torch or NumPy type: read the file with tzip decompress "
                             f"(safetensors bytes)") from None
        raise ValueError(f"unsupported dtype {name!r} (supported: {', '.join(ALL_NAMES)})") from None


def numpy_dtype(name: str) -> np.dtype:
    d = lookup(name)
    mod: Any = np
    if d.numpy_name in _ML_NAMES:
        if _ml is None or not hasattr(_ml, d.numpy_name):
            raise TypeError(f"dtype {name} needs the ml_dtypes package for NumPy (pip install ml_dtypes)")
        mod = _ml
    return np.dtype(getattr(mod, d.numpy_name))


_NP_TO_NAME: Dict[np.dtype, str] = {}


def name_of_numpy(dtype: Any) -> str:
    if not _NP_TO_NAME:
        for d in _TABLE:
            try:
                _NP_TO_NAME[numpy_dtype(d.name)] = d.name
            except TypeError:
                pass
    dt = np.dtype(dtype)
    try:
        return _NP_TO_NAME[dt]
    except KeyError:
        raise ValueError(f"unsupported NumPy dtype {dt} (supported: {', '.join(ALL_NAMES)})") from None


def torch_dtype(name: str) -> Any:
    import torch

    d = lookup(name)
    t = getattr(torch, d.torch_name, None)
    if t is None:
        raise TypeError(f"dtype {name} is not available in torch {torch.__version__}")
    return t


_TORCH_TO_NAME: Dict[Any, str] = {}


def name_of_torch(dtype: Any) -> str:
    if not _TORCH_TO_NAME:
        import torch

        for d in _TABLE:
            t = getattr(torch, d.torch_name, None)
            if t is not None:
                _TORCH_TO_NAME[t] = d.name
    try:
        return _TORCH_TO_NAME[dtype]
    except KeyError:
        raise ValueError(f"unsupported torch dtype {dtype} (supported: {', '.join(ALL_NAMES)})") from None


# ---- packed F4: file shape <-> torch shape ------------------------------------

def file_shape_of_torch(name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The file's shape of a torch tensor of dtype ``name`` (F4: last dimension doubled)."""
    p = lookup(name).packed
    if p == 1:
        return tuple(shape)
    if not shape:
        raise ValueError(f"a 0-d {name} tensor cannot be saved: its {p} packed elements have no dimension")
    return tuple(shape[:-1]) + (shape[-1] * p,)


def torch_shape_of_file(name: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The torch shape of a file's tensor (F4: last dimension halved); ValueError if it does not divide."""
    p = lookup(name).packed
    if p == 1:
        return tuple(shape)
    if not shape or shape[-1] % p:
        raise ValueError(f"{name} tensor of shape {list(shape)}: torch packs {p} elements per byte along the "
                         f"last dimension, which must be a multiple of {p}")
    return tuple(shape[:-1]) + (shape[-1] // p,)


def file_nbytes(name: str, shape: Tuple[int, ...]) -> int:
    """Bytes of a file's tensor of ``shape`` (file elements)."""
    d = lookup(name)
    n = 1
    for s in shape:
        n *= int(s)
    if d.packed == 1:
        return n * d.itemsize
    if n % d.packed:
        raise ValueError(f"{name} tensor of shape {list(shape)}: {n} elements do not fill whole bytes")
    return n // d.packed * d.itemsize


def pack_nibbles(a: np.ndarray) -> np.ndarray:
    """uint8 values 0..15, an even count -> bytes with element 2i in the low nibble of byte i."""
    a = a.reshape(-1)
    if a.size % 2:
        raise ValueError(f"F4 arrays need an even number of elements to fill whole bytes, got {a.size}")
    return ((a[1::2] << 4) | (a[0::2] & 0x0F)).astype(np.uint8)


def unpack_nibbles(b: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_nibbles` (uint8 values 0..15, two per input byte)."""
    out = np.empty(b.size * 2, dtype=np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    return out
