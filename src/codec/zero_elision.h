// Zero elision (doc/format.md 5.10, format version 3 with header flag bit 2):
// a block may store stream k >= 1 raw without the bytes of the elements whose
// stream 0 symbol is 0 (the exponent field of BF16 and FP32, FP16's sign,
// exponent and top mantissa bits), which are then 0 in stream k. Exact zeros
// (an optimizer's untouched rows, pruned weights) then cost their stream-0
// symbol only. The one statement of the rule for every encoder and decoder
// (CPU and CUDA): no allocation, no I/O.
#pragma once
#include <string.h>

#include "codec/format.h"

namespace tz {

// Elements of a block whose stream-0 symbol is 0 (counted in byte
// counters per run of 255, which vectorise without widening).
TZ_HD uint32_t elided_count(const uint8_t* s0, uint32_t n) {
  uint32_t z = 0;
  for (uint32_t i0 = 0; i0 < n; i0 += 255) {
    const uint32_t i1 = n - i0 < 255 ? n : i0 + 255;
    uint8_t zc = 0;
    for (uint32_t i = i0; i < i1; ++i) zc = (uint8_t)(zc + (s0[i] == 0 ? 1 : 0));
    z += zc;
  }
  return z;
}
// Whether some stream-0 symbol of the block is 0: the encoders' first test,
// on every block (a library memchr on the host: no cost where there is none).
TZ_HD bool has_elided(const uint8_t* s0, uint32_t n) {
#if defined(__CUDA_ARCH__)
  for (uint32_t i = 0; i < n; ++i)
    if (s0[i] == 0) return true;
  return false;
#else
  return n && memchr(s0, 0, n) != nullptr;
#endif
}
// Whether stream sk may be elided: it is 0 wherever stream 0 is. Checked
// in runs of 256 bytes (byte arithmetic, which vectorises), stopping at the
// first run that has an element where it is not: a near-uniform stream
// (mantissa bytes) fails within the run of stream 0's first zero.
TZ_HD bool stream_elidable(const uint8_t* s0, const uint8_t* sk, uint32_t n) {
  for (uint32_t i0 = 0; i0 < n; i0 += 256) {
    const uint32_t i1 = n - i0 < 256 ? n : i0 + 256;
    uint8_t bad = 0;
    for (uint32_t i = i0; i < i1; ++i) bad |= (uint8_t)((s0[i] == 0 ? 1 : 0) & (sk[i] != 0 ? 1 : 0));
    if (bad) return false;
  }
  return true;
}
// Stores stream sk's bytes at the elements kept (stream 0 non-zero) in out,
// in element order; returns their count.
TZ_HD uint32_t elide_zeros(const uint8_t* s0, const uint8_t* sk, uint32_t n, uint8_t* out) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (s0[i] != 0) out[c++] = sk[i];
  return c;
}
// The inverse: n symbols of the stream from its kept bytes (exactly n -
// elided_count(s0, n) of them, checked by the caller).
TZ_HD void expand_zeros(const uint8_t* s0, const uint8_t* kept, uint32_t n, uint8_t* out) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < n; ++i) out[i] = s0[i] != 0 ? kept[c++] : (uint8_t)0;
}
// The streams (bit k) an encoder stores elided in a block, where the frame
// allows it (kFlagZeroElided in the encoder's flags), from a scan of the
// block: any_zero, whether some stream-0 symbol is 0; not_zero, bit k set
// where stream k is not 0 at such an element. Every stream k >= 1 that is 0
// wherever stream 0 is, when stream 0 has a zero at all. The CPU scans the
// split streams (block_elided_streams), a CUDA warp the elements.
TZ_HD uint32_t elided_streams_of(uint8_t flags, int K, bool any_zero, uint32_t not_zero) {
  if (!(flags & kFlagZeroElided) || K < 2 || !any_zero) return 0;
  uint32_t mask = 0;
  for (int k = 1; k < K; ++k)
    if (!((not_zero >> k) & 1u)) mask |= 1u << k;
  return mask;
}
// The same over a block's n elements split into streams s[0..K-1]; *kept:
// the elements whose stream-0 symbol is not 0 where a stream is elided (n
// otherwise).
TZ_HD uint32_t block_elided_streams(uint8_t flags, int K, const uint8_t* const* s, uint32_t n, uint32_t* kept) {
  *kept = n;
  if (!(flags & kFlagZeroElided) || K < 2 || !has_elided(s[0], n)) return 0;
  uint32_t not_zero = 0;
  for (int k = 1; k < K; ++k)
    if (!stream_elidable(s[0], s[k], n)) not_zero |= 1u << k;
  const uint32_t mask = elided_streams_of(flags, K, true, not_zero);
  if (mask) *kept = n - elided_count(s[0], n);
  return mask;
}

}  // namespace tz
