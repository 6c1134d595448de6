"""Element types: safetensors dtype strings <-> NumPy / torch dtypes <-> codec dtypes."""
from __future__ import annotations

from typing import Any, Dict, NamedTuple

import numpy as np

_ml: Any
try:  # bfloat16 and float8 for NumPy
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
    itemsize: int      # bytes per element
    codec: int         # codec dtype used to compress it
    rank: int          # safetensors' Dtype enum order (files sort tensors by it, descending)
    numpy_name: str    # attribute of numpy or ml_dtypes
    torch_name: str    # attribute of torch


# Order = safetensors' Rust `Dtype` enum order (checked against safetensors' output in the tests).
_TABLE = [
    DType("BOOL", 1, CODEC_BYTES, 0, "bool_", "bool"),
    DType("U8", 1, CODEC_BYTES, 4, "uint8", "uint8"),
    DType("I8", 1, CODEC_BYTES, 5, "int8", "int8"),
    DType("F8_E5M2", 1, CODEC_F8_E5M2, 6, "float8_e5m2", "float8_e5m2"),
    DType("F8_E4M3", 1, CODEC_F8_E4M3, 7, "float8_e4m3fn", "float8_e4m3fn"),
    DType("I16", 2, CODEC_BYTES, 9, "int16", "int16"),
    DType("U16", 2, CODEC_BYTES, 10, "uint16", "uint16"),
    DType("F16", 2, CODEC_F16, 11, "float16", "float16"),
    DType("BF16", 2, CODEC_BF16, 12, "bfloat16", "bfloat16"),
    DType("I32", 4, CODEC_BYTES, 13, "int32", "int32"),
    DType("U32", 4, CODEC_BYTES, 14, "uint32", "uint32"),
    DType("F32", 4, CODEC_F32, 15, "float32", "float32"),
    DType("F64", 8, CODEC_BYTES, 17, "float64", "float64"),
    DType("I64", 8, CODEC_BYTES, 18, "int64", "int64"),
    DType("U64", 8, CODEC_BYTES, 19, "uint64", "uint64"),
]

BY_NAME: Dict[str, DType] = {d.name: d for d in _TABLE}
ALL_NAMES = tuple(d.name for d in _TABLE)


def lookup(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (supported: {', '.join(ALL_NAMES)})") from None


def numpy_dtype(name: str) -> np.dtype:
    d = lookup(name)
    mod: Any = np
    if d.numpy_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        if _ml is None:
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
