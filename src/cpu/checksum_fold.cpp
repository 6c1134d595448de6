// Folding CRC32C (see checksum_fold.h). Reflected CRC32C: a 16-byte block,
// loaded little-endian, is a polynomial of degree < 128 with bit i the
// coefficient of x^(127-i). The raw state is XORed into the first four bytes
// (a raw update from state s equals one from state 0 over the data with s
// XORed in). (Header intrinsics that leave lanes undefined are avoided: GCC
// warns about them.) Blocks 64 bytes apart accumulate into one accumulator lane:
// lane' = lane * x^512 + next block (mod P), the multiplication done on each
// 64-bit half with one carry-less multiply by x^(D+63) or x^(D-1) mod P
// (constants derived in scripts/crc32c_fold_constants.py). At the end the four
// lanes are moved onto the last one (48, 32, 16 bytes forward) and XORed: a
// 16-byte value congruent mod P to all the data folded, so its raw CRC from
// state 0 (two crc32 instructions: leading zero bits do not change a CRC from
// state 0) is the state after the data; the remaining < 64 bytes go through
// the crc32 instruction too.
#include "cpu/checksum_fold.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tz::cpu::fold {

// Printed by scripts/crc32c_fold_constants.py.
const uint64_t kConst[kNumConst][2] = {
    {0xe9a5d8be00000000ull, 0x1426a81500000000ull},  // 256 bytes: x^2111, x^2047 mod P
    {0x1c19243b00000000ull, 0x75bba45b00000000ull},  // 64 bytes: x^575, x^511 mod P
    {0xa46ef4aa00000000ull, 0x6051243f00000000ull},  // 48 bytes: x^447, x^383 mod P
    {0x33ccbbbc00000000ull, 0xa2158b3400000000ull},  // 32 bytes: x^319, x^255 mod P
    {0x3743f7bd00000000ull, 0x3171d43000000000ull},  // 16 bytes: x^191, x^127 mod P
};

#if defined(__x86_64__)
namespace {

enum { k256 = 0, k64 = 1, k48 = 2, k32 = 3, k16 = 4 };

#define TZ_CLMUL __attribute__((target("sse4.2,pclmul")))
#define TZ_CLMUL512 __attribute__((target("sse4.2,pclmul,avx2,avx512f,avx512vl,avx512bw,vpclmulqdq")))

TZ_CLMUL inline uint32_t crc_tail(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// The state after a 16-byte value congruent to the data folded, then the rest.
TZ_CLMUL inline uint32_t finish16(__m128i v, const uint8_t* rest, size_t n) {
  uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(v));
  c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(v, 1));
  return crc_tail(c, rest, n);
}

TZ_CLMUL inline __m128i kpair(int i) { return _mm_set_epi64x((long long)kConst[i][1], (long long)kConst[i][0]); }
TZ_CLMUL inline __m128i fold16(__m128i v, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11));
}
TZ_CLMUL inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }

TZ_CLMUL512 inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
TZ_CLMUL512 inline __m512i kpair512(int i) {
  const long long hi = (long long)kConst[i][1], lo = (long long)kConst[i][0];
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}
// a * x^D + d on each of the four lanes.
TZ_CLMUL512 inline __m512i fold64(__m512i a, __m512i k, __m512i d) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11), d,
                                   0x96);
}
TZ_CLMUL512 inline __m512i with_state(const uint8_t* p, uint32_t state) {
  return _mm512_xor_si512(load64(p), _mm512_maskz_set1_epi32(1, (int)state));
}
// Lanes 0, 1, 2 moved 48, 32, 16 bytes forward onto lane 3, all XORed.
TZ_CLMUL512 inline uint32_t finish64(__m512i a, const uint8_t* rest, size_t n) {
  const __m512i k = _mm512_set_epi64(0, 0, (long long)kConst[k16][1], (long long)kConst[k16][0],
                                     (long long)kConst[k32][1], (long long)kConst[k32][0],
                                     (long long)kConst[k48][1], (long long)kConst[k48][0]);
  const __m512i t = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                              _mm512_clmulepi64_epi128(a, k, 0x11), _mm512_maskz_mov_epi64(0xC0, a),
                                              0x96);
  const __m128i v = _mm_ternarylogic_epi64(_mm512_maskz_extracti32x4_epi32(0xF, t, 0), _mm512_maskz_extracti32x4_epi32(0xF, t, 1),
                                           _mm512_maskz_extracti32x4_epi32(0xF, t, 2), 0x96);
  return finish16(_mm_xor_si128(v, _mm512_maskz_extracti32x4_epi32(0xF, t, 3)), rest, n);
}

}  // namespace

bool clmul_available() { return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul"); }
bool clmul512_available() {
  return clmul_available() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("vpclmulqdq");
}

TZ_CLMUL uint32_t clmul_update(uint32_t state, const uint8_t* p, size_t n) {
  __m128i a0 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128((int)state));
  __m128i a1 = load16(p + 16), a2 = load16(p + 32), a3 = load16(p + 48);
  const __m128i k = kpair(k64);
  size_t o = 64;
  for (; o + 64 <= n; o += 64) {
    a0 = _mm_xor_si128(fold16(a0, k), load16(p + o));
    a1 = _mm_xor_si128(fold16(a1, k), load16(p + o + 16));
    a2 = _mm_xor_si128(fold16(a2, k), load16(p + o + 32));
    a3 = _mm_xor_si128(fold16(a3, k), load16(p + o + 48));
  }
  const __m128i v = _mm_xor_si128(_mm_xor_si128(fold16(a0, kpair(k48)), fold16(a1, kpair(k32))),
                                  _mm_xor_si128(fold16(a2, kpair(k16)), a3));
  return finish16(v, p + o, n - o);
}

TZ_CLMUL512 uint32_t clmul512_update(uint32_t state, const uint8_t* p, size_t n) {
  __m512i a = with_state(p, state);
  size_t o = 64;
  if (n >= 512) {  // four accumulators 256 bytes apart, then moved onto one
    __m512i b = load64(p + 64), c = load64(p + 128), d = load64(p + 192);
    const __m512i k = kpair512(k256);
    for (o = 256; o + 256 <= n; o += 256) {
      a = fold64(a, k, load64(p + o));
      b = fold64(b, k, load64(p + o + 64));
      c = fold64(c, k, load64(p + o + 128));
      d = fold64(d, k, load64(p + o + 192));
    }
    const __m512i k1 = kpair512(k64);
    a = fold64(fold64(fold64(a, k1, b), k1, c), k1, d);
  }
  const __m512i k1 = kpair512(k64);
  for (; o + 64 <= n; o += 64) a = fold64(a, k1, load64(p + o));
  return finish64(a, p + o, n - o);
}

#endif

}  // namespace tz::cpu::fold
