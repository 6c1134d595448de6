// The AVX2 rANS decode step and table lookups shared by the frame codec's
// AVX2 kernels (simd_avx2.cpp) and the KV page codec's (kv/kernels_avx2.cpp):
// one decoder of the 32-lane layout of doc/format.md §5.3, written once.
// Functions carry their own target attribute (the including file may use
// another for the rest of its code), so include it in any x86-64 file.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "codec/rans.h"
#include "cpu/simd_common.h"

#define TZ_AVX2_RANS __attribute__((target("avx2,fma,bmi,bmi2,popcnt")))

namespace tz::cpu {

// The two constants every decode step uses (kProbScale - 1, which is also
// the 12-bit field mask of a table entry, and all ones), made once per call
// and passed in: the steps then need no other constant register, which
// leaves room for the eight state vectors of two streams in lockstep.
struct DecConsts {
  __m256i mask;  // kProbScale - 1 = 0xFFF
  __m256i ones;  // all bits set
  TZ_AVX2_RANS static DecConsts make() {
    static_assert(kProbScale - 1 == 0xFFF, "slot mask and entry field mask are one constant");
    return {_mm256_set1_epi32(kProbScale - 1), _mm256_set1_epi32(-1)};
  }
};

// The 8 table entries t[idx] of a step, two ways, the same entries either
// way. GatherFetch: one vpgatherdd. ScalarFetch: the indices taken out of
// the vector two at a time, eight scalar loads joined by unpacks: more
// instructions, but fewer cycles in the decoders on AMD Zen 1 and Zen 2,
// whose vpgatherdd is microcoded (12.9 cycles for 8 entries on an EPYC
// family 23 model 49, tz_kernel_bench), and in the encoders on every CPU
// measured (doc/cpu.md). bytes(t, sp, idx): the same with idx = the 8 bytes at sp
// (the encoder's symbols), which the scalar form loads from memory.
struct GatherFetch {
  TZ_AVX2_RANS static __m256i get(const uint32_t* t, __m256i idx) {
    return _mm256_i32gather_epi32((const int*)t, idx, 4);
  }
  TZ_AVX2_RANS static __m256i bytes(const uint32_t* t, const uint8_t*, __m256i idx) { return get(t, idx); }
};
struct ScalarFetch {
  TZ_AVX2_RANS static __m128i get4(const uint32_t* t, __m128i idx) {
    const uint64_t a = (uint64_t)_mm_cvtsi128_si64(idx), b = (uint64_t)_mm_extract_epi64(idx, 1);
    const __m128i r0 = _mm_cvtsi32_si128((int)t[(uint32_t)a]), r1 = _mm_cvtsi32_si128((int)t[a >> 32]);
    const __m128i r2 = _mm_cvtsi32_si128((int)t[(uint32_t)b]), r3 = _mm_cvtsi32_si128((int)t[b >> 32]);
    return _mm_unpacklo_epi64(_mm_unpacklo_epi32(r0, r1), _mm_unpacklo_epi32(r2, r3));
  }
  TZ_AVX2_RANS static __m256i get(const uint32_t* t, __m256i idx) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(get4(t, _mm256_castsi256_si128(idx))),
                                   get4(t, _mm256_extracti128_si256(idx, 1)), 1);
  }
  TZ_AVX2_RANS static __m128i bytes4(const uint32_t* t, const uint8_t* sp) {
    const __m128i r0 = _mm_cvtsi32_si128((int)t[sp[0]]), r1 = _mm_cvtsi32_si128((int)t[sp[1]]);
    const __m128i r2 = _mm_cvtsi32_si128((int)t[sp[2]]), r3 = _mm_cvtsi32_si128((int)t[sp[3]]);
    return _mm_unpacklo_epi64(_mm_unpacklo_epi32(r0, r1), _mm_unpacklo_epi32(r2, r3));
  }
  TZ_AVX2_RANS static __m256i bytes(const uint32_t* t, const uint8_t* sp, __m256i) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(bytes4(t, sp)), bytes4(t, sp + 4), 1);
  }
};

// One decode step for 8 lanes, in two phases, so that the four vectors of a
// step do not wait for each other's word offsets (dec_step32):
// dec8_state returns the 8 table entries (symbol in bits 0..7 of each
// 32-bit lane, the other bits not cleared: the emitters clear them), sets
// the new states before renormalisation, `take` (sign bit: the lane takes a
// word) and its mask m; with lane contexts, coff holds each lane's table
// offset (context x kProbScale) and is advanced to the next symbol's.
// dec8_words then shifts in the words of the lanes that take one, read in
// lane order from p (16 bytes read at p). Phases measured against one pass
// per vector (the offset of vector v + 1 waiting on vector v's mask), EPYC
// family 23 model 49, cycles per symbol on BF16 exponents: 2.16 -> 1.99 with
// ScalarFetch, 2.57 -> 2.32 with gathers (BF16 merged 2.36 -> 2.20, 2.78 ->
// 2.55; tz_kernel_bench, three alternated runs).
//
// f = freq - 1 + 1 is formed as (freq - 1) - (-1), and "x < L" as the sign
// of (x >> 16) - 1 (x >> 16 is 0 exactly when x < 2^16, else below 2^16),
// which blendv_ps and movemask_ps read: no constant beyond DecConsts
// (measured 1.62 -> 1.48 cycles per symbol against masks, a zero and 1 held
// in registers, on BF16 exponents, AMD EPYC Zen 4).
template <bool Ctx, class Fetch>
TZ_AVX2_RANS inline __m256i dec8_state(__m256i& x, const uint32_t* dec, __m256i& coff, __m256i cbase,
                                       __m256i cmax, const DecConsts& k, __m256& take, unsigned& m) {
  __m256i idx = _mm256_and_si256(x, k.mask);
  if (Ctx) idx = _mm256_add_epi32(idx, coff);
  const __m256i e = Fetch::get(dec, idx);
  const __m256i f = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), k.mask), k.ones);
  x = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, kProbBits)), _mm256_srli_epi32(e, 20));
  take = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_srli_epi32(x, 16), k.ones));  // sign: x < L
  m = (unsigned)_mm256_movemask_ps(take);
  if (Ctx) {
    // Context of the symbol (byte 0 of e): min(max(sym - base, 0), n - 1)
    // by saturating byte arithmetic on the whole entry; cbase and cmax hold
    // base and n - 1 in byte 0 of each lane and zero above it, so the other
    // bytes of e become zero.
    coff = _mm256_slli_epi32(_mm256_min_epu8(_mm256_subs_epu8(e, cbase), cmax), kProbBits);
  }
  return e;
}
TZ_AVX2_RANS inline void dec8_words(__m256i& x, __m256 take, unsigned m, const uint8_t* p) {
  const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)kTakeIndex[m].data()));
  const __m256i w = _mm256_permutevar8x32_epi32(words, perm);
  x = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(x, 16), w)), take));
}

// One step of 32 lanes (four vectors x[0..3]): both phases of the four
// vectors, p moved past the words taken (four 16-byte reads, each past the
// words before it: the caller leaves 64 bytes); e[v] the table entries of
// vector v. c[] and cbase, cmax: lane contexts (Ctx only).
template <bool Ctx, class Fetch>
TZ_AVX2_RANS inline void dec_step32(__m256i* x, __m256i* c, const uint32_t* dec, const uint8_t*& p, __m256i cbase,
                                    __m256i cmax, const DecConsts& k, __m256i* e) {
  __m256 t[4];
  unsigned m[4];
  for (int v = 0; v < 4; ++v) e[v] = dec8_state<Ctx, Fetch>(x[v], dec, c[v], cbase, cmax, k, t[v], m[v]);
  for (int v = 0; v < 4; ++v) {
    dec8_words(x[v], t[v], m[v], p);
    p += 2 * (size_t)_mm_popcnt_u32(m[v]);
  }
}

}  // namespace tz::cpu

#endif  // __x86_64__
