// AVX-512 kernel set of the KV page codec (F, BW, VL, DQ, VBMI2: the
// features simd_path_cpu_has(kAvx512) checks): the operations of kv_page.h's
// KvScalarCoder / KvScalarDecoder with 16-lane vectors, mask registers and
// compress / expand, same bytes and statuses as the portable kernels.
#include "kv_codec.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#define TZ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2,bmi,bmi2,popcnt")))

namespace tz::kv {
namespace {

// ------------------------------------------------------------ fields --
TZ_AVX512 void split_avx512(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) {
  uint32_t i = 0;
  if (dtype == kBF16) {
    for (; i + 32 <= n; i += 32) {
      const __m512i v = _mm512_loadu_si512(src + 2 * i);
      const __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), _mm512_set1_epi16(0xFF));
      const __m512i s = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 8), _mm512_set1_epi16(0x80)),
                                        _mm512_and_si512(v, _mm512_set1_epi16(0x7F)));
      _mm256_storeu_si256((__m256i*)(streams[0] + i), _mm512_cvtepi16_epi8(e));
      _mm256_storeu_si256((__m256i*)(streams[1] + i), _mm512_cvtepi16_epi8(s));
    }
  } else if (dtype == kF16) {
    for (; i + 32 <= n; i += 32) {
      const __m512i v = _mm512_loadu_si512(src + 2 * i);
      _mm256_storeu_si256((__m256i*)(streams[0] + i), _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 8)));
      _mm256_storeu_si256((__m256i*)(streams[1] + i), _mm512_cvtepi16_epi8(v));
    }
  } else {
    memcpy(streams[0], src, n);
    return;
  }
  uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
  split_fields(dtype, src + 2 * (size_t)i, n - i, tail);
}

TZ_AVX512 inline void merge32(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
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

TZ_AVX512 void merge_avx512(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst) {
  if (dtype != kBF16 && dtype != kF16) {
    memcpy(dst, streams[0], n);
    return;
  }
  uint32_t i = 0;
  for (; i + 32 <= n; i += 32) merge32(dtype, streams[0] + i, streams[1] + i, dst + 2 * (size_t)i);
  const uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
  merge_fields(dtype, tail, n - i, dst + 2 * (size_t)i);
}

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

TZ_AVX512 int64_t escapes_avx512(const KvCodecTables& c, int k, const uint8_t* s, uint32_t n, uint8_t* lit) {
  const __m512i bm_lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)c.direct_bits[k]));
  const __m512i bm_hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(c.direct_bits[k] + 16)));
  const bool has_escape = c.t.st[k].has_escape;
  size_t L = 0;
  uint32_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(s + i);
    const uint64_t m = not_in_map(v, bm_lo, bm_hi);
    if (!m) continue;
    if (!has_escape) return -1;
    const uint64_t cnt = (uint64_t)_mm_popcnt_u64(m);
    _mm512_mask_storeu_epi8(lit + L, cnt == 64 ? ~0ull : (1ull << cnt) - 1, _mm512_maskz_compress_epi8(m, v));
    L += (size_t)cnt;
  }
  const int64_t t = kv_collect_escapes(c, k, s + i, n - i, lit + L);
  return t < 0 ? -1 : (int64_t)L + t;
}

// ------------------------------------------------------------ rANS --
// One encode step for 16 lanes (the AVX-512 frame encoder's arithmetic,
// src/cpu/simd_x86.cpp: exact q = floor(x / f) by a refined reciprocal and
// one correction each way).
TZ_AVX512 inline void enc16(__m512i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp) {
  const __m512i sy = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)sp));
  const __m512i fs = _mm512_i32gather_epi32(sy, fst, 4);
  const __m512i f = _mm512_and_si512(fs, _mm512_set1_epi32(0x1FFF));
  const __m512i st = _mm512_srli_epi32(fs, 13);
  const __mmask16 m = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(x, 20), f);
  const unsigned cnt = (unsigned)_mm_popcnt_u32(m);
  wp -= cnt;
  _mm256_mask_storeu_epi16(wp, (__mmask16)((1u << cnt) - 1u), _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(m, x)));
  x = _mm512_mask_srli_epi32(x, m, x, 16);
  const __m512 ff = _mm512_cvtepi32_ps(f);
  __m512 r = _mm512_rcp14_ps(ff);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(ff, r, _mm512_set1_ps(2.0f)));
  __m512i q = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_cvtepu32_ps(x), r));
  __m512i rem = _mm512_sub_epi32(x, _mm512_mullo_epi32(q, f));
  const __mmask16 lo = _mm512_cmplt_epi32_mask(rem, _mm512_setzero_si512());
  q = _mm512_mask_sub_epi32(q, lo, q, _mm512_set1_epi32(1));
  rem = _mm512_mask_add_epi32(rem, lo, rem, f);
  const __mmask16 hi = _mm512_cmpge_epi32_mask(rem, f);
  q = _mm512_mask_add_epi32(q, hi, q, _mm512_set1_epi32(1));
  rem = _mm512_mask_sub_epi32(rem, hi, rem, f);
  x = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, kProbBits), rem), st);
}

TZ_AVX512 size_t rans_encode_avx512(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words,
                                    uint8_t* out, size_t limit) {
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  alignas(64) uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  const uint32_t full = n / kLanes;
  if (n % kLanes) {
    const uint32_t base = full * kLanes;
    for (uint32_t l = n - base; l-- > 0;) x[l] = rans_enc_put(x[l], c.enc[k][sym[base + l]], &wp);
  }
  __m512i x0 = _mm512_load_si512(x), x1 = _mm512_load_si512(x + 16);
  for (uint32_t s = full; s-- > 0;) {
    const uint8_t* sp = sym + (size_t)s * kLanes;
    enc16(x1, sp + 16, c.fs[k], wp);
    enc16(x0, sp, c.fs[k], wp);
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  _mm512_storeu_si512(out, x0);
  _mm512_storeu_si512(out + 64, x1);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}

// One decode step for 16 lanes in two phases (as the AVX2 kernels): the new
// states and word masks of both halves first, then their words, so the
// second half's word load does not wait for the first half's.
struct Dec16 {
  __m512i e;
  __mmask16 m;
};

TZ_AVX512 inline Dec16 dec16_state(__m512i& x, const uint32_t* dec) {
  Dec16 d;
  d.e = _mm512_i32gather_epi32(_mm512_and_si512(x, _mm512_set1_epi32(kProbScale - 1)), dec, 4);
  const __m512i f = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(d.e, 8), _mm512_set1_epi32(0xFFF)),
                                     _mm512_set1_epi32(1));
  x = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(x, kProbBits)), _mm512_srli_epi32(d.e, 20));
  d.m = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32((int)kRansL));
  return d;
}

TZ_AVX512 inline void dec16_words(__m512i& x, const Dec16& d, const uint8_t* p) {
  const __m512i w = _mm512_maskz_expand_epi32(d.m, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)));
  x = _mm512_mask_or_epi32(x, d.m, _mm512_slli_epi32(x, 16), w);
}

TZ_AVX512 int rans_decode_avx512(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (size < kRansStateBytes || ((size - kRansStateBytes) & 1u)) return kErrCorruptBlock;
  __m512i x0 = _mm512_loadu_si512(in), x1 = _mm512_loadu_si512(in + 64);
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  uint32_t s = 0;
  for (; s < full && end - p >= 64; ++s) {  // two 32-byte reads, each past the words before it
    const Dec16 a = dec16_state(x0, dec), b = dec16_state(x1, dec);
    const uint8_t* p1 = p + 2 * (size_t)_mm_popcnt_u32(a.m);
    dec16_words(x0, a, p);
    dec16_words(x1, b, p1);
    p = p1 + 2 * (size_t)_mm_popcnt_u32(b.m);
    const __m512i ff = _mm512_set1_epi32(0xFF);
    _mm_storeu_si128((__m128i*)(out + (size_t)s * kLanes), _mm512_cvtepi32_epi8(_mm512_and_si512(a.e, ff)));
    _mm_storeu_si128((__m128i*)(out + (size_t)s * kLanes + 16), _mm512_cvtepi32_epi8(_mm512_and_si512(b.e, ff)));
  }
  alignas(64) uint32_t x[kLanes];
  _mm512_store_si512(x, x0);
  _mm512_store_si512(x + 16, x1);
  return rans_decode_tail(x, p, end, s, n, dec, RansEmitBytes{out});
}

// ------------------------------------------------------------ fixed --
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

TZ_AVX512 size_t fixed_codes_avx512(const KvCodecTables& c, const uint8_t* s, uint32_t n, uint8_t* codes) {
  const __m512i esc = _mm512_set1_epi8((char)fixed_escape_code(c.t.fixed_bits));
  size_t n_esc = 0;
  uint32_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i code = codes64(c, _mm512_loadu_si512(s + i), esc);
    _mm512_storeu_si512(codes + i, code);
    n_esc += (size_t)_mm_popcnt_u64(_mm512_cmpeq_epi8_mask(code, esc));
  }
  return n_esc + kv_fixed_codes(c, s + i, n - i, codes + i);
}

TZ_AVX512 void fixed_planes_avx512(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n,
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
  for (; g * kGroup < n; ++g) {
    uint32_t plane[kMaxFixedBits];
    const uint32_t here = n - g * kGroup < kGroup ? n - g * kGroup : kGroup;
    kv_fixed_planes(codes + g * kGroup, here, bits, plane);
    for (uint32_t b = 0; b < bits; ++b) store_le32(out + 4 * ((size_t)g * bits + b), plane[b]);
    for (uint32_t i = g * kGroup; i < g * kGroup + here; ++i)
      if (codes[i] == fixed_escape_code(bits)) *lit++ = s0[i];
  }
}

TZ_AVX512 int fixed_decode_avx512(const KvCodecTables& c, const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit,
                                  const uint8_t** streams, uint8_t* scratch, uint8_t* dst) {
  const uint32_t bits = c.t.fixed_bits, esc = fixed_escape_code(bits);
  const uint8_t dtype = c.t.dtype;
  const bool two = dtype == kBF16 || dtype == kF16;
  if (bits > 4) return KvScalarDecoder{&c}.fixed(planes, n, lit, n_lit, streams, scratch, dst);
  alignas(16) uint8_t syms[16] = {};
  for (uint32_t code = 0; code < esc; ++code) syms[code] = c.t.fixed_sym[code];
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)syms));
  {  // every literal must be a symbol without a code: checked for all of them at once
    const __m512i escv = _mm512_set1_epi8((char)esc);
    size_t i = 0;
    for (; i + 64 <= n_lit; i += 64)
      if (_mm512_cmpneq_epi8_mask(codes64(c, _mm512_loadu_si512(lit + i), escv), escv)) return kErrCorruptBlock;
    if (i < n_lit) {
      const __mmask64 tail = (~0ull) >> (64 - (n_lit - i));
      if (_mm512_mask_cmpneq_epi8_mask(tail, codes64(c, _mm512_maskz_loadu_epi8(tail, lit + i), escv), escv))
        return kErrCorruptBlock;
    }
  }
  uint8_t* const s0 = two ? scratch : dst;
  size_t j = 0;
  uint32_t g = 0;
  for (; (g + 1) * kGroup <= n; ++g) {
    const uint8_t* q = planes + 4 * (size_t)g * bits;
    __m256i code = _mm256_setzero_si256();
    uint32_t all = ~0u;
    for (uint32_t b = 0; b < bits; ++b) {
      const uint32_t w = load_le32(q + 4 * b);
      all &= w;
      code = _mm256_mask_blend_epi8((__mmask32)w, code, _mm256_or_si256(code, _mm256_set1_epi8((char)(1u << b))));
    }
    uint8_t* o = s0 + g * kGroup;
    __m256i sym = _mm256_shuffle_epi8(lut, code);
    if (all) {
      const uint32_t cnt = (uint32_t)_mm_popcnt_u32(all);
      const __m256i l = _mm256_maskz_loadu_epi8((__mmask32)((1ull << cnt) - 1u), lit + j);
      sym = _mm256_mask_expand_epi8(sym, (__mmask32)all, l);
      j += cnt;
    }
    _mm256_storeu_si256((__m256i*)o, sym);
    if (two) merge32(dtype, o, streams[1] + g * kGroup, dst + 2 * (size_t)g * kGroup);
  }
  if (g * kGroup == n) return kOk;
  const int st = kv_fixed_decode_from(c, planes, n, g, lit, j, s0);
  if (st != kOk || !two) return st;
  const uint8_t* tail[kMaxStreams] = {s0 + g * kGroup, streams[1] + g * kGroup};
  merge_fields(dtype, tail, n - g * kGroup, dst + 2 * (size_t)g * kGroup);
  return kOk;
}

// As kv_patch_escapes.
TZ_AVX512 int patch_avx512(const KvCodecTables& c, int k, uint8_t* s, uint32_t n, const uint8_t* lit, size_t n_lit,
                           size_t* lp) {
  const KvStreamTable& st = c.t.st[k];
  if (!st.has_escape) return kOk;
  const __m512i e = _mm512_set1_epi8((char)st.escape);
  size_t j = *lp;
  uint32_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t m = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(s + i), e);
    for (; m; m &= m - 1) {
      if (j >= n_lit) return kErrCorruptBlock;
      const uint8_t v = lit[j++];
      if (c.direct[k][v]) return kErrCorruptBlock;
      s[i + __builtin_ctzll(m)] = v;
    }
  }
  *lp = j;
  return kv_patch_escapes(c, k, s + i, n - i, lit, n_lit, lp);
}

TZ_AVX512 int finish_avx512(const KvCodecTables& c, uint8_t* const* coded, const uint8_t* const* streams, uint32_t n,
                            const uint8_t* lit, size_t n_lit, uint8_t* dst) {
  size_t lp = 0;
  for (int k = 0; k < c.t.n_streams; ++k) {
    if (!coded[k]) continue;
    const int st = patch_avx512(c, k, coded[k], n, lit, n_lit, &lp);
    if (st != kOk) return st;
  }
  if (lp != n_lit) return kErrCorruptBlock;
  merge_avx512(c.t.dtype, streams, n, dst);
  return kOk;
}

// ------------------------------------------------------------ kernel set --
struct Avx512Coder {
  const KvCodecTables* c;
  TZ_AVX512 void split(const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    split_avx512(c->t.dtype, src, n, streams);
  }
  TZ_AVX512 int64_t escapes(int k, const uint8_t* s, uint32_t n, uint8_t* lit) const {
    return escapes_avx512(*c, k, s, n, lit);
  }
  TZ_AVX512 size_t rans(int k, const uint8_t* s, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return rans_encode_avx512(*c, k, s, n, words, out, limit);
  }
  TZ_AVX512 size_t fixed_codes(const uint8_t* s, uint32_t n, uint8_t* codes) const {
    return fixed_codes_avx512(*c, s, n, codes);
  }
  TZ_AVX512 void fixed_planes(const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out, uint8_t* lit) const {
    fixed_planes_avx512(*c, codes, s0, n, out, lit);
  }
};

struct Avx512Decoder {
  const KvCodecTables* c;
  TZ_AVX512 int rans(int k, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) const {
    return rans_decode_avx512(c->dec[k], in, size, n, out);
  }
  TZ_AVX512 int finish(uint8_t* const* coded, const uint8_t* const* streams, uint32_t n, const uint8_t* lit,
                       size_t n_lit, uint8_t* dst) const {
    return finish_avx512(*c, coded, streams, n, lit, n_lit, dst);
  }
  TZ_AVX512 int fixed(const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit, const uint8_t** streams, uint8_t* scratch,
                      uint8_t* dst) const {
    return fixed_decode_avx512(*c, planes, n, lit, n_lit, streams, scratch, dst);
  }
};

TZ_AVX512 size_t encode_avx512(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch, uint8_t* dst) {
  const size_t size = kv_encode_page_with(c, src, n, scratch, dst, Avx512Coder{&c});
  kv_seal_page(c.t, dst, size, CpuPageSum{});
  return size;
}

TZ_AVX512 int decode_avx512(const KvCodecTables& c, const uint8_t* page, size_t size, uint8_t* dst, uint8_t* scratch) {
  return kv_decode_page_with(c, page, size, dst, scratch, CpuPageSum{}, Avx512Decoder{&c});
}

const PageKernels kAvx512 = {encode_avx512, decode_avx512};

}  // namespace

const PageKernels* avx512_kernels() { return &kAvx512; }

}  // namespace tz::kv

#else
namespace tz::kv {
const PageKernels* avx512_kernels() { return nullptr; }
}  // namespace tz::kv
#endif
