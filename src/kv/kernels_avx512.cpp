// AVX-512 kernel set of the KV page codec (F, BW, VL, DQ, VBMI2: the
// features simd_path_cpu_has(kAvx512) checks): kernel_set.inc (the page
// loops, escape patching and the kernel set, written once for every SIMD
// path) over 16-lane / 64-byte primitives with mask registers and compress /
// expand, and the rANS decoder; the rANS encoder is the frame codec's AVX2
// one. Same bytes and statuses as the portable kernels.
#include "kv/codec.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/kernels.h"
#include "cpu/simd_avx512_rans.h"

#define TZ_AVX512 TZ_AVX512_RANS  // (cpu/simd_avx512_rans.h: the frame codec's AVX-512 target)

namespace tz::kv {
namespace {

// ------------------------------------------------------------ fields --
constexpr uint32_t kFieldBlock = 32;

// 32 elements of BF16 / F16 into 32 bytes of each stream.
template <uint8_t D>
TZ_AVX512 inline void split_block(const uint8_t* src, uint8_t* s0, uint8_t* s1) {
  const __m512i v = _mm512_loadu_si512(src);
  if constexpr (D == kBF16) {
    const __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), _mm512_set1_epi16(0xFF));
    const __m512i s = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 8), _mm512_set1_epi16(0x80)),
                                      _mm512_and_si512(v, _mm512_set1_epi16(0x7F)));
    _mm256_storeu_si256((__m256i*)s0, _mm512_cvtepi16_epi8(e));
    _mm256_storeu_si256((__m256i*)s1, _mm512_cvtepi16_epi8(s));
  } else {
    _mm256_storeu_si256((__m256i*)s0, _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 8)));
    _mm256_storeu_si256((__m256i*)s1, _mm512_cvtepi16_epi8(v));
  }
}

// 32 elements of BF16 / F16 from 32 bytes of each stream.
TZ_AVX512 inline void merge_block(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
  const __m512i e = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)s0));
  const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)s1));
  __m512i v;
  if (dtype == kBF16)
    v = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(m, _mm512_set1_epi16(0x80)), 8),
                                        _mm512_slli_epi16(e, 7)),
                        _mm512_and_si512(m, _mm512_set1_epi16(0x7F)));
  else
    v = _mm512_or_si512(_mm512_slli_epi16(e, 8), m);
  _mm512_storeu_si512(dst, v);
}

// ------------------------------------------------------------ scans --
constexpr uint32_t kScanBytes = 64;

struct ByteEq {
  __m512i v;
  TZ_AVX512 explicit ByteEq(uint8_t e) : v(_mm512_set1_epi8((char)e)) {}
  TZ_AVX512 uint64_t mask(const uint8_t* p) const { return _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(p), v); }
};

// ------------------------------------------------------------ escapes --
// Mask of the 64 bytes of v whose bit in the 256-bit map (bm_lo: bytes
// 0..15, bm_hi: 16..31, each broadcast to every 128-bit lane) is clear.
TZ_AVX512 inline uint64_t not_in_map(__m512i v, __m512i bm_lo, __m512i bm_hi) {
  const __m512i idx = _mm512_and_si512(_mm512_srli_epi16(v, 3), _mm512_set1_epi8(0x1F));
  const __m512i lo4 = _mm512_and_si512(idx, _mm512_set1_epi8(0x0F));
  const __mmask64 upper = _mm512_test_epi8_mask(idx, _mm512_set1_epi8(0x10));
  const __m512i byte = _mm512_mask_blend_epi8(upper, _mm512_shuffle_epi8(bm_lo, lo4), _mm512_shuffle_epi8(bm_hi, lo4));
  const __m512i bitv = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128));
  const __m512i bit = _mm512_shuffle_epi8(bitv, _mm512_and_si512(v, _mm512_set1_epi8(7)));
  return (uint64_t)_mm512_testn_epi8_mask(byte, bit);
}

struct DirectScan {
  __m512i bm_lo, bm_hi;
  TZ_AVX512 DirectScan(const KvCodecTables& c, int k)
      : bm_lo(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)c.direct_bits[k]))),
        bm_hi(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(c.direct_bits[k] + 16)))) {}
  TZ_AVX512 uint64_t not_direct(const uint8_t* p) const { return not_in_map(_mm512_loadu_si512(p), bm_lo, bm_hi); }
  TZ_AVX512 size_t copy(const uint8_t* p, uint64_t m, uint8_t* lit) const {
    const uint64_t cnt = (uint64_t)_mm_popcnt_u64(m);
    _mm512_mask_storeu_epi8(lit, cnt == 64 ? ~0ull : (1ull << cnt) - 1, _mm512_maskz_compress_epi8(m, _mm512_loadu_si512(p)));
    return (size_t)cnt;
  }
};

TZ_AVX512 inline __m512i codes64(const KvCodecTables& c, __m512i v, __m512i esc) {
  const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  __m512i code = esc;
  for (int j = 0; j < c.fixed_hi_n; ++j) {
    const int h = c.fixed_hi[j];
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)c.fixed_lut[h]));
    code = _mm512_mask_shuffle_epi8(code, _mm512_cmpeq_epi8_mask(hi, _mm512_set1_epi8((char)h)), lut, lo);
  }
  return code;
}

struct CodeScan {
  const KvCodecTables* c;
  __m512i esc;
  TZ_AVX512 explicit CodeScan(const KvCodecTables& t)
      : c(&t), esc(_mm512_set1_epi8((char)fixed_escape_code(t.t.fixed_bits))) {}
  TZ_AVX512 size_t codes(const uint8_t* s, uint8_t* codes, uint32_t i) const {
    const __m512i code = codes64(*c, _mm512_loadu_si512(s + i), esc);
    _mm512_storeu_si512(codes + i, code);
    return (size_t)_mm_popcnt_u64(_mm512_cmpeq_epi8_mask(code, esc));
  }
  TZ_AVX512 bool all_uncoded(const uint8_t* p, size_t count) const {  // 1 <= count <= 64
    const __mmask64 m = (~0ull) >> (64 - count);
    return !_mm512_mask_cmpneq_epi8_mask(m, codes64(*c, _mm512_maskz_loadu_epi8(m, p), esc), esc);
  }
};

// ------------------------------------------------------------ fixed --
TZ_AVX512 void fixed_planes_isa(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n,
                                uint8_t* out, uint8_t* lit) {
  const uint32_t bits = c.t.fixed_bits;
  const __m512i esc = _mm512_set1_epi8((char)fixed_escape_code(bits));
  uint32_t g = 0;
  for (; (g + 2) * kGroup <= n; g += 2) {  // two groups per 64-byte vector
    const __m512i v = _mm512_loadu_si512(codes + g * kGroup);
    for (uint32_t b = 0; b < bits; ++b) {
      const uint64_t m = _mm512_test_epi8_mask(v, _mm512_set1_epi8((char)(1u << b)));
      store_le32(out + 4 * ((size_t)g * bits + b), (uint32_t)m);
      store_le32(out + 4 * ((size_t)(g + 1) * bits + b), (uint32_t)(m >> 32));
    }
    // Compress in a register, then a masked store: the memory form of
    // vpcompressb is microcoded and slow on some cores (Zen 4).
    const __mmask64 e = _mm512_cmpeq_epi8_mask(v, esc);
    if (e) {
      const uint64_t cnt = (uint64_t)_mm_popcnt_u64(e);
      _mm512_mask_storeu_epi8(lit, cnt == 64 ? ~0ull : (1ull << cnt) - 1,
                              _mm512_maskz_compress_epi8(e, _mm512_loadu_si512(s0 + g * kGroup)));
      lit += cnt;
    }
  }
  kv_fixed_planes_from(c, codes, s0, n, g, out, lit);
}

// The 32 symbols of one group of `bits`-bit codes (planes at q, 4 bytes a
// plane): codes through the 16-entry table lut, escaped lanes (all bits
// set) taken in order from lit. Sets *taken to the literals used.
TZ_AVX512 inline __m256i group_symbols(__m256i lut, const uint8_t* q, uint32_t bits, const uint8_t* lit,
                                       uint32_t* taken) {
  __m256i code = _mm256_setzero_si256();
  uint32_t all = ~0u;
  for (uint32_t b = 0; b < bits; ++b) {
    const uint32_t w = load_le32(q + 4 * b);
    all &= w;
    code = _mm256_mask_blend_epi8((__mmask32)w, code, _mm256_or_si256(code, _mm256_set1_epi8((char)(1u << b))));
  }
  __m256i sym = _mm256_shuffle_epi8(lut, code);
  *taken = 0;
  if (all) {
    *taken = (uint32_t)_mm_popcnt_u32(all);
    const __m256i l = _mm256_maskz_loadu_epi8((__mmask32)((1ull << *taken) - 1u), lit);
    sym = _mm256_mask_expand_epi8(sym, (__mmask32)all, l);
  }
  return sym;
}

struct FixedGroups {
  __m256i lut;
  uint32_t bits;
  TZ_AVX512 FixedGroups(const uint8_t* syms, uint32_t b)
      : lut(_mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)syms))), bits(b) {}
  TZ_AVX512 size_t group(const uint8_t* q, const uint8_t* lit, uint8_t* o) const {
    uint32_t cnt;
    _mm256_storeu_si256((__m256i*)o, group_symbols(lut, q, bits, lit, &cnt));
    return cnt;
  }
};

// Fixed-mode decoding of whole groups in one pass (kernel_set.inc's
// fixed_decode_simd, codes of Bits <= 4 bits): per group the symbols from
// the planes (mask blends) and the literals (expanded into the escaped
// lanes), merged with the raw stream 1 in registers into the elements of
// dtype class D (kBF16, kF16, or 0: a one-byte dtype) at dst. Returns the
// literals taken (checked by the caller). Same output as FixedGroups::group
// + merge_span.
template <uint8_t D, uint32_t Bits>
TZ_AVX512 size_t fixed_decode_groups_t(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                       const uint8_t* raw1, const uint8_t* lit, uint8_t* dst) {
  alignas(16) uint8_t syms[16] = {};
  for (uint32_t code = 0; code < (1u << Bits) - 1u; ++code) syms[code] = c.t.fixed_sym[code];
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)syms));
  size_t j = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    uint32_t cnt;
    const __m256i sym = group_symbols(lut, planes + 4 * (size_t)Bits * g, Bits, lit + j, &cnt);
    j += cnt;
    if constexpr (D == kBF16 || D == kF16) {
      const __m512i e = _mm512_cvtepu8_epi16(sym);
      const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(raw1 + (size_t)kGroup * g)));
      __m512i v;
      if constexpr (D == kBF16)
        v = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(m, _mm512_set1_epi16(0x80)), 8),
                                            _mm512_slli_epi16(e, 7)),
                            _mm512_and_si512(m, _mm512_set1_epi16(0x7F)));
      else
        v = _mm512_or_si512(_mm512_slli_epi16(e, 8), m);
      _mm512_storeu_si512(dst + 2 * (size_t)kGroup * g, v);
    } else {
      _mm256_storeu_si256((__m256i*)(dst + (size_t)kGroup * g), sym);
    }
  }
  return j;
}

template <uint8_t D>
TZ_AVX512 size_t fixed_decode_groups_d(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                       const uint8_t* raw1, const uint8_t* lit, uint8_t* dst) {
  switch (c.t.fixed_bits) {
    case 1: return fixed_decode_groups_t<D, 1>(c, planes, groups, raw1, lit, dst);
    case 2: return fixed_decode_groups_t<D, 2>(c, planes, groups, raw1, lit, dst);
    case 3: return fixed_decode_groups_t<D, 3>(c, planes, groups, raw1, lit, dst);
    default: return fixed_decode_groups_t<D, 4>(c, planes, groups, raw1, lit, dst);  // (the caller: bits <= 4)
  }
}

TZ_AVX512 size_t fixed_decode_groups_isa(const KvCodecTables& c, const uint8_t* planes, uint32_t groups,
                                         const uint8_t* raw1, const uint8_t* lit, const uint8_t* end, uint8_t* dst) {
  (void)end;  // (32-bit plane reads and masked literal reads: nothing past the planes)
  const uint8_t dtype = c.t.dtype;
  if (dtype == kBF16) return fixed_decode_groups_d<kBF16>(c, planes, groups, raw1, lit, dst);
  if (dtype == kF16) return fixed_decode_groups_d<kF16>(c, planes, groups, raw1, lit, dst);
  return fixed_decode_groups_d<0>(c, planes, groups, raw1, lit, dst);
}

// ------------------------------------------------------------ rANS --
// Encoder: the frame codec's AVX-512 one (the AVX2 step in AVX-512VL's
// forms, with the 16-symbol window), not this codec's own 16-lane one, which
// measured slower on AMD Zen 4 (a 16-token BF16 page of the fixture KV in
// 4.6 us against 3.8 us with the AVX2 encoder; thread CPU time, best of 10
// interleaved runs). Against the frame codec's AVX2 encoder, Intel Xeon
// family 6 model 167, kv_bench.py 1 thread, BF16 pages of 16 / 256 tokens:
// encode 2.82 / 2.99 -> 3.82 / 4.05 GB/s.
TZ_AVX512 size_t rans_encode_isa(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words,
                                 uint8_t* out, size_t limit) {
  // (both AVX-512 tables have this encoder)
  return cpu::kAvx512Kernels.rans_encode(sym, n, cpu::EncTables{c.enc[k], c.fs[k]}, RansCtx{}, words, out, limit);
}

// The decoder: the frame codec's AVX-512 step (cpu/simd_avx512_rans.h).
TZ_AVX512 int rans_decode_isa(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  __m512i x0 = _mm512_loadu_si512(in), x1 = _mm512_loadu_si512(in + 64);
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  uint32_t s = 0;
  __m512i none = _mm512_setzero_si512();  // (no lane contexts)
  for (; s < full && end - p >= 64; ++s) {  // two 32-byte reads, each past the words before it
    __mmask16 m0, m1;
    const __m512i s0 = cpu::dec16_state<false>(x0, dec, none, none, none, m0);
    const __m512i s1 = cpu::dec16_state<false>(x1, dec, none, none, none, m1);
    const uint8_t* p1 = p + 2 * (size_t)_mm_popcnt_u32(m0);
    cpu::dec16_words(x0, m0, p);
    cpu::dec16_words(x1, m1, p1);
    p = p1 + 2 * (size_t)_mm_popcnt_u32(m1);
    _mm_storeu_si128((__m128i*)(out + (size_t)s * kLanes), _mm512_cvtepi32_epi8(s0));
    _mm_storeu_si128((__m128i*)(out + (size_t)s * kLanes + 16), _mm512_cvtepi32_epi8(s1));
  }
  alignas(64) uint32_t x[kLanes];
  _mm512_store_si512(x, x0);
  _mm512_store_si512(x + 16, x1);
  return rans_decode_tail(x, p, end, s, n, dec, RansEmitBytes{out});
}

// ------------------------------------------------------------ kernel set --
#define TZ_KV_TARGET TZ_AVX512
#define TZ_KV_FIXED_PAGE 1
#define TZ_KV_FIXED_DECODE_GROUPS 1
#define TZ_KV_PREFETCH_FIXED 1
#include "kv/kernel_set.inc"
#undef TZ_KV_PREFETCH_FIXED
#undef TZ_KV_FIXED_DECODE_GROUPS
#undef TZ_KV_FIXED_PAGE
#undef TZ_KV_TARGET

}  // namespace

const PageKernels* avx512_kernels() { return &kSimdKernels; }

}  // namespace tz::kv
#endif
