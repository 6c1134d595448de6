// AVX2 kernel set of the KV page codec: kernel_set.inc (the page loops,
// escape patching and the kernel set, written once for every SIMD path) over
// 8-lane / 32-byte primitives, the rANS decoder and the fused pass of the
// common rANS page; the rANS encoder is the frame codec's AVX2 encoder for
// this CPU (the same coder on the same freq | start tables). Same bytes and statuses
// as the portable kernels (tests/kv compares them).
#include "kv/codec.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/kernels.h"
#include "cpu/simd_avx2_rans.h"
#include "cpu/simd_common.h"
#include "cpu/simd_path.h"

#define TZ_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,popcnt")))  // as the frame codec's AVX2 path (cpu/simd_path.h)

namespace tz::kv {
namespace {

// ------------------------------------------------------------ fields --
constexpr uint32_t kFieldBlock = 32;

// 32 elements of BF16 / F16 (64 bytes at src) as 32 bytes of each stream, in
// element order.
template <uint8_t D>
TZ_AVX2 inline void split_regs(const uint8_t* src, __m256i* s0, __m256i* s1) {
  const __m256i a = _mm256_loadu_si256((const __m256i*)src);
  const __m256i b = _mm256_loadu_si256((const __m256i*)(src + 32));
  const __m256i mff = _mm256_set1_epi16(0xFF);
  __m256i ha, hb, la, lb;
  if constexpr (D == kBF16) {
    const __m256i m7f = _mm256_set1_epi16(0x7F), m80 = _mm256_set1_epi16(0x80);
    ha = _mm256_and_si256(_mm256_srli_epi16(a, 7), mff);
    hb = _mm256_and_si256(_mm256_srli_epi16(b, 7), mff);
    la = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 8), m80), _mm256_and_si256(a, m7f));
    lb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 8), m80), _mm256_and_si256(b, m7f));
  } else {
    ha = _mm256_srli_epi16(a, 8);
    hb = _mm256_srli_epi16(b, 8);
    la = _mm256_and_si256(a, mff);
    lb = _mm256_and_si256(b, mff);
  }
  *s0 = _mm256_permute4x64_epi64(_mm256_packus_epi16(ha, hb), 0xD8);
  *s1 = _mm256_permute4x64_epi64(_mm256_packus_epi16(la, lb), 0xD8);
}

// 32 elements of BF16 / F16 into 32 bytes of each stream.
template <uint8_t D>
TZ_AVX2 inline void split_block(const uint8_t* src, uint8_t* s0, uint8_t* s1) {
  __m256i e, m;
  split_regs<D>(src, &e, &m);
  _mm256_storeu_si256((__m256i*)s0, e);
  _mm256_storeu_si256((__m256i*)s1, m);
}

// 32 elements of BF16 / F16 from 32 bytes of each stream.
TZ_AVX2 inline void merge_block(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
  const __m256i e = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i*)s0), 0xD8);
  const __m256i m = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i*)s1), 0xD8);
  const __m256i z = _mm256_setzero_si256();
  const __m256i elo = _mm256_unpacklo_epi8(e, z), ehi = _mm256_unpackhi_epi8(e, z);
  const __m256i mlo = _mm256_unpacklo_epi8(m, z), mhi = _mm256_unpackhi_epi8(m, z);
  __m256i lo, hi;
  if (dtype == kBF16) {
    const __m256i m7f = _mm256_set1_epi16(0x7F), m80 = _mm256_set1_epi16(0x80);
    lo = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(mlo, m80), 8), _mm256_slli_epi16(elo, 7)),
                         _mm256_and_si256(mlo, m7f));
    hi = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(mhi, m80), 8), _mm256_slli_epi16(ehi, 7)),
                         _mm256_and_si256(mhi, m7f));
  } else {
    lo = _mm256_or_si256(_mm256_slli_epi16(elo, 8), mlo);
    hi = _mm256_or_si256(_mm256_slli_epi16(ehi, 8), mhi);
  }
  _mm256_storeu_si256((__m256i*)dst, lo);
  _mm256_storeu_si256((__m256i*)(dst + 32), hi);
}

// ------------------------------------------------------------ scans --
constexpr uint32_t kScanBytes = 32;

struct ByteEq {
  __m256i v;
  TZ_AVX2 explicit ByteEq(uint8_t e) : v(_mm256_set1_epi8((char)e)) {}
  TZ_AVX2 uint32_t mask(const uint8_t* p) const {
    return (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)p), v));
  }
};

// Mask of the bytes of v whose bit in the 256-bit map bm is clear.
TZ_AVX2 inline uint32_t not_in_map(__m256i v, __m256i bm_lo, __m256i bm_hi) {
  const __m256i idx = _mm256_and_si256(_mm256_srli_epi16(v, 3), _mm256_set1_epi8(0x1F));
  const __m256i lo4 = _mm256_and_si256(idx, _mm256_set1_epi8(0x0F));
  const __m256i byte = _mm256_blendv_epi8(_mm256_shuffle_epi8(bm_lo, lo4), _mm256_shuffle_epi8(bm_hi, lo4),
                                          _mm256_slli_epi16(idx, 3));
  const __m256i bitv = _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32,
                                        64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
  const __m256i bit = _mm256_shuffle_epi8(bitv, _mm256_and_si256(v, _mm256_set1_epi8(7)));
  return ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(byte, bit), bit));
}

struct DirectScan {
  __m256i bm_lo, bm_hi;
  TZ_AVX2 DirectScan(const KvCodecTables& c, int k)
      : bm_lo(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c.direct_bits[k]))),
        bm_hi(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(c.direct_bits[k] + 16)))) {}
  TZ_AVX2 uint32_t not_direct(const uint8_t* p) const {
    return not_in_map(_mm256_loadu_si256((const __m256i*)p), bm_lo, bm_hi);
  }
};

// Codes of 32 symbols through the per-high-nibble lookups (kv_page.h
// fixed_lut): bytes of a nibble no code symbol has get the escape.
TZ_AVX2 inline __m256i codes32(const KvCodecTables& c, __m256i v, __m256i esc) {
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  __m256i code = esc;
  for (int j = 0; j < c.fixed_hi_n; ++j) {
    const int h = c.fixed_hi[j];
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c.fixed_lut[h]));
    code = _mm256_blendv_epi8(code, _mm256_shuffle_epi8(lut, lo), _mm256_cmpeq_epi8(hi, _mm256_set1_epi8((char)h)));
  }
  return code;
}

struct CodeScan {
  const KvCodecTables* c;
  __m256i esc;
  TZ_AVX2 explicit CodeScan(const KvCodecTables& t)
      : c(&t), esc(_mm256_set1_epi8((char)fixed_escape_code(t.t.fixed_bits))) {}
  TZ_AVX2 size_t codes(const uint8_t* s, uint8_t* codes, uint32_t i) const {
    const __m256i code = codes32(*c, _mm256_loadu_si256((const __m256i*)(s + i)), esc);
    _mm256_storeu_si256((__m256i*)(codes + i), code);
    return (size_t)__builtin_popcount((uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, esc)));
  }
  TZ_AVX2 bool all_uncoded(const uint8_t* p, size_t count) const {
    if (count < kScanBytes) return kv_all_uncoded(*c, p, count);
    const __m256i code = codes32(*c, _mm256_loadu_si256((const __m256i*)p), esc);
    return (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, esc)) == ~0u;
  }
};

// ------------------------------------------------------------ fixed --
TZ_AVX2 void fixed_planes_isa(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out,
                              uint8_t* lit) {
  const uint32_t bits = c.t.fixed_bits;
  const __m256i esc = _mm256_set1_epi8((char)fixed_escape_code(bits));
  uint32_t g = 0;
  for (; (g + 1) * kGroup <= n; ++g) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(codes + g * kGroup));
    for (uint32_t b = 0; b < bits; ++b)  // bit b of each byte to the sign bit (codes < 128: no carry between bytes)
      store_le32(out + 4 * ((size_t)g * bits + b), (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(v, (int)(7 - b))));
    for (uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, esc)); m; m &= m - 1)
      *lit++ = s0[g * kGroup + __builtin_ctz(m)];
  }
  kv_fixed_planes_from(c, codes, s0, n, g, out, lit);
}

// Fixed-mode coding of whole groups in one pass (kernel_set.inc's
// fixed_page_simd): per 32 elements of dtype class D (kBF16, kF16, or kOneByte:
// stream 0 = the bytes), the streams split in registers,
// stream 1 stored at raw1, the codes' Bits planes at planes and the escaped
// stream-0 bytes at lit (in order, read back from src). Returns the escapes.
constexpr uint8_t kOneByte = 0;  // D of the one-byte dtypes (no dtype code 0)
// Same bytes as split_simd + fixed_codes_simd + fixed_planes_isa.
// codes32 with its lookups and nibble compares prepared once per page.
struct CodeLuts {
  __m256i lut[16], hi[16];
  int n;
  TZ_AVX2 explicit CodeLuts(const KvCodecTables& c) : n(c.fixed_hi_n) {
    for (int j = 0; j < n; ++j) {
      lut[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c.fixed_lut[c.fixed_hi[j]]));
      hi[j] = _mm256_set1_epi8((char)c.fixed_hi[j]);
    }
  }
  TZ_AVX2 __m256i codes(__m256i v, __m256i esc) const {
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
    __m256i code = esc;
    for (int j = 0; j < n; ++j)
      code = _mm256_blendv_epi8(code, _mm256_shuffle_epi8(lut[j], lo), _mm256_cmpeq_epi8(h, hi[j]));
    return code;
  }
};

template <uint8_t D, uint32_t Bits>
TZ_AVX2 size_t fixed_groups_t(const KvCodecTables& c, const uint8_t* src, uint32_t groups, uint8_t* planes,
                              uint8_t* raw1, uint8_t* lit) {
  constexpr size_t kIn = D == kOneByte ? kGroup : 2 * kGroup;  // source bytes per group
  const __m256i esc = _mm256_set1_epi8((char)fixed_escape_code(Bits));
  const CodeLuts luts(c);
  size_t L = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    const uint8_t* p = src + kIn * g;
    __m256i s0;
    if constexpr (D == kOneByte) {
      s0 = _mm256_loadu_si256((const __m256i*)p);
    } else {
      __m256i s1;
      split_regs<D>(p, &s0, &s1);
      _mm256_storeu_si256((__m256i*)(raw1 + (size_t)kGroup * g), s1);
    }
    const __m256i code = luts.codes(s0, esc);
    uint8_t* q = planes + 4 * (size_t)Bits * g;
    for (uint32_t b = 0; b < Bits; ++b)  // bit b of each byte to the sign bit (codes < 128: no carry between bytes)
      store_le32(q + 4 * b, (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(code, (int)(7 - b))));
    for (uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, esc)); m; m &= m - 1) {
      const uint32_t j = (uint32_t)__builtin_ctz(m);
      if constexpr (D == kBF16)
        lit[L++] = (uint8_t)(load_le16(p + 2 * j) >> 7);
      else if constexpr (D == kF16)
        lit[L++] = p[2 * j + 1];
      else
        lit[L++] = p[j];
    }
  }
  return L;
}

template <uint8_t D>
TZ_AVX2 size_t fixed_groups_d(const KvCodecTables& c, const uint8_t* src, uint32_t groups, uint8_t* planes,
                              uint8_t* raw1, uint8_t* lit) {
  switch (c.t.fixed_bits) {
    case 1: return fixed_groups_t<D, 1>(c, src, groups, planes, raw1, lit);
    case 2: return fixed_groups_t<D, 2>(c, src, groups, planes, raw1, lit);
    case 3: return fixed_groups_t<D, 3>(c, src, groups, planes, raw1, lit);
    case 4: return fixed_groups_t<D, 4>(c, src, groups, planes, raw1, lit);
    case 5: return fixed_groups_t<D, 5>(c, src, groups, planes, raw1, lit);
    case 6: return fixed_groups_t<D, 6>(c, src, groups, planes, raw1, lit);
    default: return fixed_groups_t<D, 7>(c, src, groups, planes, raw1, lit);  // (bits <= kMaxFixedBits: tables checked)
  }
}

TZ_AVX2 size_t fixed_groups_isa(const KvCodecTables& c, const uint8_t* src, uint32_t groups, uint8_t* planes,
                                uint8_t* raw1, uint8_t* lit) {
  const uint8_t dtype = c.t.dtype;
  if (dtype == kBF16) return fixed_groups_d<kBF16>(c, src, groups, planes, raw1, lit);
  if (dtype == kF16) return fixed_groups_d<kF16>(c, src, groups, planes, raw1, lit);
  return fixed_groups_d<kOneByte>(c, src, groups, planes, raw1, lit);
}

// Bits of w as 32 bytes 0x00 / 0xFF (byte j = bit j).
TZ_AVX2 inline __m256i bits_to_bytes(uint32_t w) {
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w),
                                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                           2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_cmpeq_epi8(_mm256_and_si256(rep, sel), sel);
}

struct FixedGroups {
  __m256i lut;
  uint32_t bits;
  TZ_AVX2 FixedGroups(const uint8_t* syms, uint32_t b)
      : lut(_mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)syms))), bits(b) {}
  TZ_AVX2 size_t group(const uint8_t* q, const uint8_t* lit, uint8_t* o) const {
    __m256i code = _mm256_setzero_si256();
    uint32_t all = ~0u;
    for (uint32_t b = 0; b < bits; ++b) {
      const uint32_t w = load_le32(q + 4 * b);
      all &= w;
      code = _mm256_or_si256(code, _mm256_and_si256(bits_to_bytes(w), _mm256_set1_epi8((char)(1u << b))));
    }
    _mm256_storeu_si256((__m256i*)o, _mm256_shuffle_epi8(lut, code));
    size_t j = 0;
    for (; all; all &= all - 1) o[__builtin_ctz(all)] = lit[j++];
    return j;
  }
};

// Fixed-mode decoding of whole groups in one pass (kernel_set.inc's
// fixed_decode_simd, codes of Bits <= 4 bits): per group the codes from its
// planes (one 16-byte read, spread over the 32 lanes by a shuffle per
// plane), the elements of dtype class D (kBF16, kF16, kOneByte) made from
// the codes by table lookups and the raw stream 1 and stored at dst, then
// the escaped elements rewritten with their literals (lit, in order; checked
// by the caller). end: the page's end (the last groups' 16-byte reads stay
// inside it). Returns the literals taken. Same output as FixedGroups::group +
// merge_span.
template <uint8_t D, uint32_t Bits>
TZ_AVX2 size_t fixed_decode_groups_t(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                     const uint8_t* raw1, const uint8_t* lit, const uint8_t* end, uint8_t* dst) {
  constexpr uint32_t kEsc = (1u << Bits) - 1u;
  alignas(16) uint8_t hi_t[16] = {}, lo_t[16] = {};  // code -> the symbol's part of each output byte (escape: 0)
  for (uint32_t code = 0; code < kEsc; ++code) {
    const uint8_t sym = c.t.fixed_sym[code];
    hi_t[code] = D == kBF16 ? (uint8_t)(sym >> 1) : sym;
    lo_t[code] = D == kBF16 ? (uint8_t)(sym << 7) : 0;
  }
  const __m256i hi_lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)hi_t));
  const __m256i lo_lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)lo_t));
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  const __m256i esc = _mm256_set1_epi8((char)kEsc);
  __m256i spread[Bits];  // lane j of plane b: byte 4b + j / 8 of the group
  for (uint32_t b = 0; b < Bits; ++b)
    spread[b] = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                                 3, 3, 3, 3, 3, 3, 3, 3),
                                _mm256_set1_epi8((char)(4 * b)));
  size_t j = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    const uint8_t* q = planes + 4 * (size_t)Bits * g;
    __m128i w;
    if (end - q >= 16) {
      w = _mm_loadu_si128((const __m128i*)q);
    } else {
      alignas(16) uint8_t t[16] = {};
      memcpy(t, q, 4 * Bits);
      w = _mm_load_si128((const __m128i*)t);
    }
    const __m256i v = _mm256_broadcastsi128_si256(w);
    __m256i code = _mm256_setzero_si256();
    for (uint32_t b = 0; b < Bits; ++b) {
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread[b]), sel), sel);
      code = _mm256_or_si256(code, _mm256_and_si256(set, _mm256_set1_epi8((char)(1u << b))));
    }
    uint8_t* o = dst + (D == kOneByte ? 1 : 2) * (size_t)kGroup * g;
    const __m256i hi = _mm256_shuffle_epi8(hi_lut, code);
    if constexpr (D == kOneByte) {
      _mm256_storeu_si256((__m256i*)o, hi);
    } else {
      const __m256i m = _mm256_loadu_si256((const __m256i*)(raw1 + (size_t)kGroup * g));
      __m256i h = hi, l = m;
      if constexpr (D == kBF16) {
        h = _mm256_or_si256(hi, _mm256_and_si256(m, _mm256_set1_epi8((char)0x80)));
        l = _mm256_or_si256(_mm256_shuffle_epi8(lo_lut, code), _mm256_and_si256(m, _mm256_set1_epi8(0x7F)));
      }
      const __m256i a = _mm256_unpacklo_epi8(l, h), b = _mm256_unpackhi_epi8(l, h);  // elements 0-7 16-23, 8-15 24-31
      _mm256_storeu_si256((__m256i*)o, _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256((__m256i*)(o + 32), _mm256_permute2x128_si256(a, b, 0x31));
    }
    // An escaped element holds the raw stream's bits and zeros where its
    // symbol goes (table entry 0): the literal is or-ed in.
    for (uint32_t e = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, esc)); e; e &= e - 1) {
      const uint32_t i = (uint32_t)__builtin_ctz(e);
      const uint8_t sym = lit[j++];
      if constexpr (D == kBF16)
        store_le16(o + 2 * i, (uint16_t)(load_le16(o + 2 * i) | (uint32_t)sym << 7));
      else if constexpr (D == kF16)
        o[2 * i + 1] = sym;
      else
        o[i] = sym;
    }
  }
  return j;
}

template <uint8_t D>
TZ_AVX2 size_t fixed_decode_groups_d(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                     const uint8_t* raw1, const uint8_t* lit, const uint8_t* end, uint8_t* dst) {
  switch (c.t.fixed_bits) {
    case 1: return fixed_decode_groups_t<D, 1>(c, planes, groups, raw1, lit, end, dst);
    case 2: return fixed_decode_groups_t<D, 2>(c, planes, groups, raw1, lit, end, dst);
    case 3: return fixed_decode_groups_t<D, 3>(c, planes, groups, raw1, lit, end, dst);
    default: return fixed_decode_groups_t<D, 4>(c, planes, groups, raw1, lit, end, dst);  // (the caller: bits <= 4)
  }
}

TZ_AVX2 size_t fixed_decode_groups_isa(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                       const uint8_t* raw1, const uint8_t* lit, const uint8_t* end, uint8_t* dst) {
  const uint8_t dtype = c.t.dtype;
  if (dtype == kBF16) return fixed_decode_groups_d<kBF16>(c, planes, groups, raw1, lit, end, dst);
  if (dtype == kF16) return fixed_decode_groups_d<kF16>(c, planes, groups, raw1, lit, end, dst);
  return fixed_decode_groups_d<kOneByte>(c, planes, groups, raw1, lit, end, dst);
}

// ------------------------------------------------------------ rANS --
// The frame codec's AVX2 encoder (one in both AVX2 tables: table entries
// loaded one by one, no window).
TZ_AVX2 size_t rans_encode_isa(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words,
                               uint8_t* out, size_t limit) {
  return cpu::kAvx2Kernels.rans_encode(sym, n, cpu::EncTables{c.enc[k], c.fs[k]}, RansCtx{}, words, out, limit);
}

// One step of the four groups: the 32 symbols in element order; p moves past
// the words taken (the frame codec's AVX2 step, cpu/simd_avx2_rans.h: its
// table lookup as the CPU's AVX2 frame kernels take it, gathered or, on AMD
// Zen 1/2, loaded one by one; the caller leaves 64 bytes).
template <class Fetch>
TZ_AVX2 inline __m256i dec_step(__m256i* x, const uint32_t* dec, const uint8_t*& p, const cpu::DecConsts& k) {
  __m256i e[4], unused[4];
  cpu::dec_step32<false, Fetch>(x, unused, dec, p, k.mask, k.mask, k, e);
  const __m256i ff = _mm256_set1_epi32(0xFF);
  const __m256i v = _mm256_packus_epi16(_mm256_packus_epi32(_mm256_and_si256(e[0], ff), _mm256_and_si256(e[1], ff)),
                                        _mm256_packus_epi32(_mm256_and_si256(e[2], ff), _mm256_and_si256(e[3], ff)));
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The four state vectors of a rANS payload's lane states.
TZ_AVX2 inline void load_states(const uint8_t* in, __m256i* x) {
  for (int v = 0; v < 4; ++v) x[v] = _mm256_loadu_si256((const __m256i*)(in + 32 * v));
}

// After the vector steps: the checked scalar tail (rans_decode_tail) from step s.
template <class Emit>
TZ_AVX2 inline int dec_tail(const __m256i* xv, const uint8_t* p, const uint8_t* end, uint32_t s, uint32_t n,
                            const uint32_t* dec, const Emit& emit) {
  alignas(32) uint32_t x[kLanes];
  for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)(x + 8 * v), xv[v]);
  return rans_decode_tail(x, p, end, s, n, dec, emit);
}

// As rans_decode.
template <class Fetch>
TZ_AVX2 int rans_decode_t(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  __m256i x[4];
  load_states(in, x);
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  const cpu::DecConsts k = cpu::DecConsts::make();
  uint32_t s = 0;
  for (; s < full && end - p >= 64; ++s)
    _mm256_storeu_si256((__m256i*)(out + (size_t)s * kLanes), dec_step<Fetch>(x, dec, p, k));
  return dec_tail(x, p, end, s, n, dec, RansEmitBytes{out});
}

TZ_AVX2 int rans_decode_isa(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  return cpu::simd_cpu_slow_gather() ? rans_decode_t<cpu::ScalarFetch>(dec, in, size, n, out)
                                     : rans_decode_t<cpu::GatherFetch>(dec, in, size, n, out);
}

// A BF16 / F16 rANS page whose stream 0 is coded and stream 1 raw, in one
// pass: each step's 32 symbols are kept in s (scratch) and merged with the raw
// stream into dst at once; escapes found on the way are patched afterwards
// (symbol and merged element). Same results and statuses as rans_decode +
// kv_finish_rans: the stream's end conditions first, then the literals.
// (One instance per dtype: the merge in the step has no dtype test.)
template <uint8_t D, class Fetch>
TZ_AVX2 int rans_merge_dtype(const KvCodecTables& c, const uint8_t* in, size_t size, uint32_t n, const uint8_t* raw1,
                             const uint8_t* lit, size_t n_lit, uint8_t* s, uint8_t* dst) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  const uint32_t* dec = c.dec[0];
  constexpr uint8_t dtype = D;
  const KvStreamTable& st = c.t.st[0];
  __m256i x[4];
  load_states(in, x);
  const cpu::DecConsts k = cpu::DecConsts::make();
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  const __m256i esc = _mm256_set1_epi8((char)st.escape);
  bool any_escape = false;
  uint32_t step = 0;
  for (; step < full && end - p >= 64; ++step) {
    const __m256i v = dec_step<Fetch>(x, dec, p, k);
    uint8_t* o = s + (size_t)step * kLanes;
    _mm256_storeu_si256((__m256i*)o, v);
    any_escape |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, esc)) != 0;
    merge_block(dtype, o, raw1 + (size_t)step * kLanes, dst + 2 * (size_t)step * kLanes);
  }
  const int r = dec_tail(x, p, end, step, n, dec, RansEmitBytes{s});
  if (r != kOk) return r;
  const uint32_t done = step * kLanes;
  const uint8_t* tail[kMaxStreams] = {s + done, raw1 + done};
  merge_fields(dtype, tail, n - done, dst + 2 * (size_t)done);
  size_t lp = 0;
  if (st.has_escape) {
    for (uint32_t i = done; i < n && !any_escape; ++i) any_escape = s[i] == st.escape;
    for (uint32_t i = 0; any_escape && i < n; i += 32) {
      const uint32_t here = n - i < 32 ? n - i : 32;
      uint32_t m = 0;
      if (here == 32) {
        m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)(s + i)), esc));
      } else {
        for (uint32_t j = 0; j < here; ++j) m |= (uint32_t)(s[i + j] == st.escape) << j;
      }
      for (; m; m &= m - 1) {
        if (lp >= n_lit) return kErrCorruptBlock;
        const uint8_t lv = lit[lp++];
        if (c.direct[0][lv]) return kErrCorruptBlock;
        const uint32_t e = i + (uint32_t)__builtin_ctz(m);
        s[e] = lv;
        const uint8_t* one[kMaxStreams] = {s + e, raw1 + e};
        merge_fields(dtype, one, 1, dst + 2 * (size_t)e);
      }
    }
  }
  return lp == n_lit ? kOk : kErrCorruptBlock;
}

TZ_AVX2 int rans_merge_isa(const KvCodecTables& c, const uint8_t* in, size_t size, uint32_t n, const uint8_t* raw1,
                           const uint8_t* lit, size_t n_lit, uint8_t* s, uint8_t* dst) {
  if (cpu::simd_cpu_slow_gather())
    return c.t.dtype == kBF16 ? rans_merge_dtype<kBF16, cpu::ScalarFetch>(c, in, size, n, raw1, lit, n_lit, s, dst)
                              : rans_merge_dtype<kF16, cpu::ScalarFetch>(c, in, size, n, raw1, lit, n_lit, s, dst);
  return c.t.dtype == kBF16 ? rans_merge_dtype<kBF16, cpu::GatherFetch>(c, in, size, n, raw1, lit, n_lit, s, dst)
                            : rans_merge_dtype<kF16, cpu::GatherFetch>(c, in, size, n, raw1, lit, n_lit, s, dst);
}

// ------------------------------------------------------------ kernel set --
#define TZ_KV_TARGET TZ_AVX2
#define TZ_KV_FUSED_FINISH 1
#define TZ_KV_RANS_MERGE 1
#define TZ_KV_FIXED_PAGE 1
#define TZ_KV_FIXED_GROUPS 1
#define TZ_KV_FIXED_DECODE_GROUPS 1
#define TZ_KV_PREFETCH_FIXED 1
#include "kv/kernel_set.inc"
#undef TZ_KV_PREFETCH_FIXED
#undef TZ_KV_FIXED_DECODE_GROUPS
#undef TZ_KV_FIXED_GROUPS
#undef TZ_KV_FIXED_PAGE
#undef TZ_KV_RANS_MERGE
#undef TZ_KV_FUSED_FINISH
#undef TZ_KV_TARGET

}  // namespace

const PageKernels* avx2_kernels() { return &kSimdKernels; }

}  // namespace tz::kv
#endif
