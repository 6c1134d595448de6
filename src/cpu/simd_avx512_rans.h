// The AVX-512 rANS decode step shared by the frame codec's AVX-512 kernels
// (simd_avx512.cpp) and the KV page codec's (kv/kernels_avx512.cpp): one
// step of 16 lanes of the 32-lane layout of doc/format.md §5.3, written once.
// Functions carry their own target attribute, so include it in any x86-64
// file.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "codec/rans.h"

// The target of both including files' AVX-512 code (one string for all:
// a function whose target differs from its caller's is inlined late, if at
// all, by GCC 12).
#define TZ_AVX512_RANS \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2,fma,bmi,bmi2,popcnt")))

namespace tz::cpu {

// One decode step for 16 lanes, in two phases (as the AVX2 step,
// simd_avx2_rans.h), so that a stream's second half does not wait for the
// first half's word offset: dec16_state gathers the table entries, sets
// the new states before renormalisation and the mask m of the lanes that
// take a word, and returns the 16 symbols (one per 32-bit lane, upper bits
// zero); dec16_words then shifts in those lanes' words, read in lane order
// from p (32 bytes read; a step of 32 lanes calls both for lanes 0..15,
// then both for 16..31, the second at p past the first's words, and its
// caller leaves 64 bytes). With lane contexts (Ctx), coff holds each lane's
// table offset (context x kProbScale) and is advanced to the next
// symbol's; cbase and cmax hold the context base and n - 1 in byte 0 of
// each lane, zero above. Against one pass per half, Intel Xeon family 6
// model 167, tz_kernel_bench cycles per symbol: two streams in lockstep
// 0.78 -> 0.73, one stream 1.26 -> 1.25.
template <bool Ctx>
TZ_AVX512_RANS inline __m512i dec16_state(__m512i& x, const uint32_t* dec, __m512i& coff, __m512i cbase,
                                          __m512i cmax, __mmask16& m) {
  __m512i idx = _mm512_and_si512(x, _mm512_set1_epi32(kProbScale - 1));
  if (Ctx) idx = _mm512_add_epi32(idx, coff);
  const __m512i e = _mm512_i32gather_epi32(idx, dec, 4);
  const __m512i f = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 8), _mm512_set1_epi32(0xFFF)),
                                     _mm512_set1_epi32(1));
  x = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(x, kProbBits)), _mm512_srli_epi32(e, 20));
  m = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32((int)kRansL));
  const __m512i sym = _mm512_and_si512(e, _mm512_set1_epi32(0xFF));
  if (Ctx) {
    // min(max(sym - base, 0), n - 1) by saturating byte arithmetic (sym's
    // upper bytes are zero, as are cbase's and cmax's).
    coff = _mm512_slli_epi32(_mm512_min_epu8(_mm512_subs_epu8(sym, cbase), cmax), kProbBits);
  }
  return sym;
}
TZ_AVX512_RANS inline void dec16_words(__m512i& x, __mmask16 m, const uint8_t* p) {
  const __m512i w = _mm512_maskz_expand_epi32(m, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)));
  x = _mm512_mask_or_epi32(x, m, _mm512_slli_epi32(x, 16), w);
}

}  // namespace tz::cpu

#endif  // __x86_64__
