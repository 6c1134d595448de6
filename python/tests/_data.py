"""Test tensors: float-like data with a realistic exponent spread, per dtype."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import tensorzip._dtypes as D

ALL_DTYPES = list(D.ALL_NAMES)
FLOAT_CODEC_DTYPES = ["BF16", "F16", "F32", "F8_E4M3", "F8_E5M2"]


def valid_shape(dtype: str, shape, framework: str) -> bool:
    """Whether a test shape can hold `dtype` (F4: NumPy needs an even element count, torch's
    packed float4_e2m1fn_x2 a dimension to pack along)."""
    if D.lookup(dtype).packed == 1:
        return True
    if framework == "np":
        return int(np.prod(shape, dtype=np.int64)) % 2 == 0
    return len(shape) > 0


def np_array(dtype: str, shape, rng) -> np.ndarray:
    dt = D.numpy_dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "BOOL":
        return rng.random(n).reshape(shape) < 0.3
    if dtype == "F8_E8M0":  # MX block scales: exponents around 2^-7 (no sign, no zero)
        return rng.integers(110, 135, size=n, endpoint=True).astype(np.uint8).view(dt).reshape(shape)
    if dtype == "F4":  # MXFP4 elements: values of a block divided by its scale, in [-6, 6]
        return np.clip(rng.standard_normal(n) * 2.0, -6, 6).astype(np.float32).astype(dt).reshape(shape)
    if dtype == "C64":
        return (rng.standard_normal(n) * 0.02 + 1j * rng.standard_normal(n) * 0.02).astype(np.complex64).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
        return rng.integers(lo, hi, size=n, endpoint=True).astype(dt).reshape(shape)
    # weights-like floats: normal with a spread of scales, a few specials
    x = rng.standard_normal(n) * 0.02
    if n > 8:
        x[:4] = [0.0, -0.0, 1.5, -3.25]
    return x.astype(np.float32).astype(dt).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality (NaN-safe, -0.0 distinct from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) == bytes(
        np.ascontiguousarray(b).reshape(-1).view(np.uint8))


def torch_tensor(dtype: str, shape, rng):
    """A torch tensor of `shape` (torch's shape: for F4, float4_e2m1fn_x2 elements, two values each)."""
    import torch

    shape = tuple(shape)
    if D.lookup(dtype).packed != 1:
        a = np_array(dtype, D.file_shape_of_torch(dtype, shape), rng)
        flat = D.pack_nibbles(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    else:
        a = np_array(dtype, shape, rng)
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()
    if flat.size == 0:
        return torch.empty(shape, dtype=D.torch_dtype(dtype))
    return torch.from_numpy(flat).view(D.torch_dtype(dtype)).reshape(shape)


def torch_same_bits(a, b) -> bool:
    import torch

    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True
    ua = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    ub = b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(ua, ub)
