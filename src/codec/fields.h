// Field split: each element is cut into byte streams so that the skewed
// fields (exponents) are entropy coded apart from the near-random ones
// (low mantissa bits). The mapping is part of the format (doc/format.md 4).
//
//   BF16  s eeeeeeee mmmmmmm     -> S0 = e (8 bits), S1 = s<<7 | m
//   F16   s eeeee mmmmmmmmmm     -> S0 = high byte (s, e, m9..m8), S1 = low byte
//   F32   s e(8) m(23)           -> S0 = e, S1 = s<<7 | m22..m16, S2 = m15..m8, S3 = m7..m0
//   F8*, bytes                   -> S0 = the byte
#pragma once
#include "codec/format.h"

namespace tz {

TZ_HD void split_elem_bf16(uint16_t v, uint8_t& s0, uint8_t& s1) {
  s0 = (uint8_t)(v >> 7);
  s1 = (uint8_t)(((v >> 8) & 0x80u) | (v & 0x7Fu));
}
TZ_HD uint16_t merge_elem_bf16(uint8_t s0, uint8_t s1) {
  return (uint16_t)(((uint32_t)(s1 & 0x80u) << 8) | ((uint32_t)s0 << 7) | (s1 & 0x7Fu));
}
// FP16: stream 0 is the top byte, stream 1 the low byte.
TZ_HD uint16_t merge_elem_f16(uint8_t s0, uint8_t s1) { return (uint16_t)(((uint32_t)s0 << 8) | s1); }
TZ_HD void split_elem_f32(uint32_t v, uint8_t& s0, uint8_t& s1, uint8_t& s2, uint8_t& s3) {
  s0 = (uint8_t)(v >> 23);
  s1 = (uint8_t)(((v >> 24) & 0x80u) | ((v >> 16) & 0x7Fu));
  s2 = (uint8_t)(v >> 8);
  s3 = (uint8_t)v;
}
TZ_HD uint32_t merge_elem_f32(uint8_t s0, uint8_t s1, uint8_t s2, uint8_t s3) {
  return ((uint32_t)(s1 & 0x80u) << 24) | ((uint32_t)s0 << 23) | ((uint32_t)(s1 & 0x7Fu) << 16) |
         ((uint32_t)s2 << 8) | s3;
}

// Byte of field stream k of element i (what split_fields writes to
// streams[k][i]).
TZ_HD uint8_t field_byte(uint8_t dtype, const uint8_t* src, uint64_t i, int k) {
  switch (dtype) {
    case kBF16: {
      uint8_t s0, s1;
      split_elem_bf16(load_le16(src + 2 * i), s0, s1);
      return k == 0 ? s0 : s1;
    }
    case kF16: return src[2 * i + 1 - k];
    case kF32: {
      uint8_t s[4];
      split_elem_f32(load_le32(src + 4 * i), s[0], s[1], s[2], s[3]);
      return s[k];
    }
    default: return src[i];
  }
}

// Splits n elements of src into streams[k] (each n bytes). The streams
// are distinct buffers (local restrict pointers let compilers vectorise).
TZ_HD_NOINLINE void split_fields(uint8_t dtype, const uint8_t* __restrict src, uint32_t n, uint8_t* const* streams) {
  uint8_t* __restrict s0 = streams[0];
  switch (dtype) {
    case kBF16: {
      uint8_t* __restrict s1 = streams[1];
      for (size_t i = 0; i < n; ++i) split_elem_bf16(load_le16(src + 2 * i), s0[i], s1[i]);
      break;
    }
    case kF16: {
      uint8_t* __restrict s1 = streams[1];
      for (size_t i = 0; i < n; ++i) {
        s0[i] = src[2 * i + 1];
        s1[i] = src[2 * i];
      }
      break;
    }
    case kF32: {
      uint8_t* __restrict s1 = streams[1];
      uint8_t* __restrict s2 = streams[2];
      uint8_t* __restrict s3 = streams[3];
      for (size_t i = 0; i < n; ++i) split_elem_f32(load_le32(src + 4 * i), s0[i], s1[i], s2[i], s3[i]);
      break;
    }
    default:
      if (n) memcpy(s0, src, n);
      break;
  }
}

// Inverse of split_fields.
TZ_HD_NOINLINE void merge_fields(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* __restrict dst) {
  const uint8_t* __restrict s0 = streams[0];
  switch (dtype) {
    case kBF16: {
      const uint8_t* __restrict s1 = streams[1];
      for (size_t i = 0; i < n; ++i) store_le16(dst + 2 * i, merge_elem_bf16(s0[i], s1[i]));
      break;
    }
    case kF16: {
      const uint8_t* __restrict s1 = streams[1];
      for (size_t i = 0; i < n; ++i) {
        dst[2 * i + 1] = s0[i];
        dst[2 * i] = s1[i];
      }
      break;
    }
    case kF32: {
      const uint8_t* __restrict s1 = streams[1];
      const uint8_t* __restrict s2 = streams[2];
      const uint8_t* __restrict s3 = streams[3];
      for (size_t i = 0; i < n; ++i) store_le32(dst + 4 * i, merge_elem_f32(s0[i], s1[i], s2[i], s3[i]));
      break;
    }
    default:
      if (n) memcpy(dst, s0, n);
      break;
  }
}

}  // namespace tz
