// Element-wise predictors of checkpoint-aware coding (doc/container.md,
// "Predicted tensors"): round-to-nearest-even casts FP32 -> BF16 / FP16 and
// XOR residuals. Header-only and __host__ __device__ (TZ_HD) so the CUDA
// encode/decode kernels can fuse them; the CPU container uses the same code.
//
// All values are raw little-endian bit patterns: a cast maps the 32 bits of
// an IEEE binary32 to the 16 bits of the target, so the result is defined
// for every input (no floating-point environment, no FTZ/DAZ effects).
#pragma once
#include "common/tz_hd.h"

namespace tz::predict {

// FP32 -> BF16, round to nearest, ties to even. NaN (any payload, either
// sign) -> 0x7FC0, the canonical quiet NaN that PyTorch's
// c10::BFloat16 round_to_nearest_even produces. Infinities, zeros (sign
// kept), subnormals and overflow to infinity follow from the rounding.
TZ_HD uint16_t f32_to_bf16_rne(uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  const uint32_t bias = 0x7FFFu + ((x >> 16) & 1u);
  return (uint16_t)((x + bias) >> 16);
}

// FP32 -> FP16 (IEEE binary16), round to nearest, ties to even, with
// binary16 subnormals and overflow to infinity (|x| >= 65520). NaN -> sign
// | 0x7E00 (quiet NaN, payload dropped).
TZ_HD uint16_t f32_to_f16_rne(uint32_t x) {
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520 (incl. inf)
  if (ax >= 0x38800000u) {                                     // >= 2^-14: normal half
    const uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie, to even 0)
  const uint32_t e = ax >> 23;                      // 102..112
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;  // value = m * 2^(e-150)
  const uint32_t shift = 126u - e;                  // to units of 2^-24: 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry to 0x400 (smallest normal)
  return (uint16_t)(sign | q);
}

enum CastKind : int { kCastBF16 = 0, kCastF16 = 1 };

TZ_HD uint16_t cast_f32(uint32_t x, int kind) { return kind == kCastF16 ? f32_to_f16_rne(x) : f32_to_bf16_rne(x); }

// Element i of a cast residual: actual XOR cast(source). Used both ways:
// encode turns values into residuals, decode turns residuals into values.
// `src` holds n FP32 values (4n bytes), `io` n 16-bit values (2n bytes).
TZ_HD void cast_xor_elem(const uint8_t* src, uint8_t* io, size_t i, int kind) {
  const uint16_t p = cast_f32(load_le32(src + 4 * i), kind);
  store_le16(io + 2 * i, (uint16_t)(load_le16(io + 2 * i) ^ p));
}
TZ_HD void cast_xor(const uint8_t* src, uint8_t* io, size_t n, int kind) {
  for (size_t i = 0; i < n; ++i) cast_xor_elem(src, io, i, kind);
}

// Delta residual: io[i] ^= ref[i], byte-wise (any dtype: XOR of the bit
// patterns element by element is XOR of their bytes).
TZ_HD void xor_bytes(const uint8_t* ref, uint8_t* io, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store_le64(io + i, load_le64(io + i) ^ load_le64(ref + i));
  for (; i < n; ++i) io[i] ^= ref[i];
}

}  // namespace tz::predict
