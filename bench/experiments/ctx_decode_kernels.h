// The stream-1 decoders of tz_ctx_decode_bench (ctx_decode_bench.cpp):
// the library's portable and AVX2 rANS steps with symbol i's table found by
// Mode (one table, a context byte per symbol, or an exponent byte and a
// 256-entry offset table), then the checked scalar tail. Same payload layout
// and end conditions as tz::rans_decode_ctx.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "codec/rans.h"
#include "cpu/simd_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TZ_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,popcnt")))
#endif

namespace tz::ctxbench {

// How a decoder finds symbol i's table.
enum Mode { kOne = 0, kCtxBytes = 1, kExpLut = 2 };

// Every decoder here (decode_portable<M>, decode_avx2<M>): n symbols of the
// payload in[0, size) to out, symbol i with the table table_of<M> gives.
using DecodeFn = int (*)(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const uint8_t* cb,
                         const uint32_t* lut, uint8_t* out);

template <int M>
inline const uint32_t* table_of(const uint32_t* dec, const uint8_t* cb, const uint32_t* lut, uint32_t i) {
  if (M == kOne) return dec;
  if (M == kCtxBytes) return dec + (size_t)kProbScale * cb[i];
  return dec + lut[cb[i]];
}

// Checked scalar steps [s, end) and the end conditions (all words used,
// every lane at L), as rans_decode_tail.
template <int M>
int tail(uint32_t* x, const uint8_t* p, const uint8_t* end, uint32_t s, uint32_t n, const uint32_t* dec,
         const uint8_t* cb, const uint32_t* lut, uint8_t* out) {
  for (; s * kLanes < n; ++s) {
    const uint32_t base = s * kLanes;
    const uint32_t here = std::min<uint32_t>(n - base, kLanes);
    for (uint32_t l = 0; l < here; ++l) {
      out[base + l] = (uint8_t)rans_dec_sym(x[l], table_of<M>(dec, cb, lut, base + l));
      if (x[l] < kRansL) {
        if (end - p < 2) return kErrCorruptBlock;
        x[l] = (x[l] << 16) | load_le16(p);
        p += 2;
      }
    }
  }
  if (p != end) return kErrCorruptBlock;
  for (int l = 0; l < kLanes; ++l)
    if (x[l] != kRansL) return kErrCorruptBlock;
  return kOk;
}

// Portable: rans_decode_step's loop with the table of each symbol.
template <int M>
int decode_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const uint8_t* cb,
                    const uint32_t* lut, uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = load_le32(in + 4 * l);
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  uint32_t s = 0;
  for (; s < n / kLanes && (size_t)(end - p) >= 2 * kLanes; ++s) {
    const uint32_t base = s * kLanes;
    uint32_t low = 0;
    for (int l = 0; l < kLanes; ++l) {
      uint32_t xl = x[l];
      out[base + l] = (uint8_t)rans_dec_sym(xl, table_of<M>(dec, cb, lut, base + (uint32_t)l));
      low |= (xl < kRansL ? 1u : 0u) << l;
      x[l] = xl;
    }
    rans_refill_lanes(x, low, p);
  }
  return tail<M>(x, p, end, s, n, dec, cb, lut, out);
}

#if defined(__x86_64__)
// The library's AVX2 dec8 (src/cpu/simd_avx2.cpp) with the lane table
// offsets taken from 8 context bytes (kCtxBytes: ctx << 12) or looked up
// from 8 exponent bytes (kExpLut: a second gather, from the 1 KiB LUT).
template <int M>
TZ_AVX2 inline __m256i dec8(__m256i& x, const uint32_t* dec, const uint8_t*& p, const uint8_t* cb,
                            const uint32_t* lut, __m256i mask, __m256i ones) {
  __m256i idx = _mm256_and_si256(x, mask);
  if (M == kCtxBytes)
    idx = _mm256_add_epi32(idx,
                           _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)cb)), kProbBits));
  if (M == kExpLut)
    idx = _mm256_add_epi32(idx, _mm256_i32gather_epi32((const int*)lut,
                                                       _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)cb)), 4));
  const __m256i e = _mm256_i32gather_epi32((const int*)dec, idx, 4);
  const __m256i f = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), mask), ones);
  x = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, kProbBits)), _mm256_srli_epi32(e, 20));
  const __m256 take = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_srli_epi32(x, 16), ones));
  const unsigned m = (unsigned)_mm256_movemask_ps(take);
  const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)cpu::kTakeIndex[m].data()));
  const __m256i w = _mm256_permutevar8x32_epi32(words, perm);
  x = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(x),
                       _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(x, 16), w)), take));
  p += 2 * (size_t)_mm_popcnt_u32(m);
  return e;
}

TZ_AVX2 inline __m256i low_byte(__m256i e) { return _mm256_srli_epi32(_mm256_slli_epi32(e, 24), 24); }

template <int M>
TZ_AVX2 int decode_avx2(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const uint8_t* cb,
                        const uint32_t* lut, uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  __m256i x[4];
  for (int v = 0; v < 4; ++v) x[v] = _mm256_loadu_si256((const __m256i*)(in + 32 * v));
  const __m256i mask = _mm256_set1_epi32(kProbScale - 1), ones = _mm256_set1_epi32(-1);
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  uint32_t s = 0;
  for (; s < n / kLanes && end - p >= 64; ++s) {
    const uint32_t base = s * kLanes;
    const __m256i e0 = dec8<M>(x[0], dec, p, cb + base, lut, mask, ones);
    const __m256i e1 = dec8<M>(x[1], dec, p, cb + base + 8, lut, mask, ones);
    const __m256i e2 = dec8<M>(x[2], dec, p, cb + base + 16, lut, mask, ones);
    const __m256i e3 = dec8<M>(x[3], dec, p, cb + base + 24, lut, mask, ones);
    const __m256i a = _mm256_packus_epi32(low_byte(e0), low_byte(e1));
    const __m256i b = _mm256_packus_epi32(low_byte(e2), low_byte(e3));
    _mm256_storeu_si256((__m256i*)(out + base), _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b),
                                                                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  alignas(32) uint32_t xs[kLanes];
  for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)(xs + 8 * v), x[v]);
  return tail<M>(xs, p, end, s, n, dec, cb, lut, out);
}
#endif

}  // namespace tz::ctxbench
