// AVX2 kernel set of the KV page codec: the operations of kv_page.h's
// KvScalarCoder / KvScalarDecoder with 8-lane vectors, same bytes and
// statuses (tests/runtime/kv compares them). The page layout and the encoder
// rule stay in kv_encode_page_with / kv_decode_page_with.
#include "kv_codec.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kv_x86_tables.hpp"

#define TZ_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))

namespace tz::kv {
namespace {

typedef uint16_t u16u __attribute__((aligned(1), may_alias));

// ------------------------------------------------------------ fields --
TZ_AVX2 void split_avx2(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) {
  uint32_t i = 0;
  if (dtype == kBF16) {
    const __m256i m7f = _mm256_set1_epi16(0x7F), m80 = _mm256_set1_epi16(0x80), mff = _mm256_set1_epi16(0xFF);
    for (; i + 32 <= n; i += 32) {
      const __m256i a = _mm256_loadu_si256((const __m256i*)(src + 2 * i));
      const __m256i b = _mm256_loadu_si256((const __m256i*)(src + 2 * i + 32));
      const __m256i ea = _mm256_and_si256(_mm256_srli_epi16(a, 7), mff), eb = _mm256_and_si256(_mm256_srli_epi16(b, 7), mff);
      const __m256i sa = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 8), m80), _mm256_and_si256(a, m7f));
      const __m256i sb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 8), m80), _mm256_and_si256(b, m7f));
      _mm256_storeu_si256((__m256i*)(streams[0] + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(ea, eb), 0xD8));
      _mm256_storeu_si256((__m256i*)(streams[1] + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(sa, sb), 0xD8));
    }
  } else if (dtype == kF16) {
    const __m256i mff = _mm256_set1_epi16(0xFF);
    for (; i + 32 <= n; i += 32) {
      const __m256i a = _mm256_loadu_si256((const __m256i*)(src + 2 * i));
      const __m256i b = _mm256_loadu_si256((const __m256i*)(src + 2 * i + 32));
      const __m256i ha = _mm256_srli_epi16(a, 8), hb = _mm256_srli_epi16(b, 8);
      const __m256i la = _mm256_and_si256(a, mff), lb = _mm256_and_si256(b, mff);
      _mm256_storeu_si256((__m256i*)(streams[0] + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(ha, hb), 0xD8));
      _mm256_storeu_si256((__m256i*)(streams[1] + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(la, lb), 0xD8));
    }
  } else {
    memcpy(streams[0], src, n);
    return;
  }
  uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
  split_fields(dtype, src + 2 * (size_t)i, n - i, tail);
}

// 32 elements of BF16 / F16 from 32 bytes of each stream.
TZ_AVX2 inline void merge32(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
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

TZ_AVX2 void merge_avx2(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst) {
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

TZ_AVX2 int64_t escapes_avx2(const KvCodecTables& c, int k, const uint8_t* s, uint32_t n, uint8_t* lit) {
  const __m256i bm_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c.direct_bits[k]));
  const __m256i bm_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(c.direct_bits[k] + 16)));
  const bool has_escape = c.t.st[k].has_escape;
  size_t L = 0;
  uint32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t m = not_in_map(_mm256_loadu_si256((const __m256i*)(s + i)), bm_lo, bm_hi);
    if (!m) continue;
    if (!has_escape) return -1;
    for (; m; m &= m - 1) lit[L++] = s[i + __builtin_ctz(m)];
  }
  const int64_t t = kv_collect_escapes(c, k, s + i, n - i, lit + L);
  return t < 0 ? -1 : (int64_t)L + t;
}

// Decoder side: replaces escape symbols of s by literals (as kv_patch_escapes).
TZ_AVX2 int patch_avx2(const KvCodecTables& c, int k, uint8_t* s, uint32_t n, const uint8_t* lit, size_t n_lit,
                       size_t* lp) {
  const KvStreamTable& st = c.t.st[k];
  if (!st.has_escape) return kOk;
  const __m256i e = _mm256_set1_epi8((char)st.escape);
  size_t j = *lp;
  uint32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)(s + i)), e));
    for (; m; m &= m - 1) {
      if (j >= n_lit) return kErrCorruptBlock;
      const uint8_t v = lit[j++];
      if (c.direct[k][v]) return kErrCorruptBlock;
      s[i + __builtin_ctz(m)] = v;
    }
  }
  *lp = j;
  return kv_patch_escapes(c, k, s + i, n - i, lit, n_lit, lp);
}

// ------------------------------------------------------------ rANS --
// One encode step for 8 lanes (symbols sp[0..7]): the words of the lanes
// that renormalise go to [wp - cnt, wp) in ascending lane order (a full
// 16-byte store at wp - 8: the bytes below wp - cnt are scratch the next
// store overwrites). Division as in the AVX-512 frame encoder: float
// reciprocal refined once, truncation within one of q, one correction each
// way, so q = floor(x / f) exactly.
TZ_AVX2 inline void enc8(__m256i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, const X86LaneTables& T) {
  const __m256i sy = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sp));
  const __m256i fs = _mm256_i32gather_epi32((const int*)fst, sy, 4);
  const __m256i f = _mm256_and_si256(fs, _mm256_set1_epi32(0x1FFF));
  const __m256i st = _mm256_srli_epi32(fs, 13);
  const __m256i keep = _mm256_cmpgt_epi32(f, _mm256_srli_epi32(x, 20));
  const unsigned m = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(keep)) & 0xFFu;
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)T.compress_hi[m]));
  const __m256i wv = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(x, perm),
                                         _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                                          1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
  _mm_storeu_si128((__m128i*)(wp - 8), _mm256_castsi256_si128(_mm256_permute4x64_epi64(wv, 0x08)));
  wp -= __builtin_popcount(m);
  x = _mm256_blendv_epi8(_mm256_srli_epi32(x, 16), x, keep);
  const __m256 fx = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 16)), _mm256_set1_ps(65536.0f)),
                                  _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF))));
  const __m256 ff = _mm256_cvtepi32_ps(f);
  __m256 r = _mm256_rcp_ps(ff);
  r = _mm256_mul_ps(r, _mm256_sub_ps(_mm256_set1_ps(2.0f), _mm256_mul_ps(ff, r)));
  __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(fx, r));
  __m256i rem = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f));
  const __m256i lo = _mm256_cmpgt_epi32(_mm256_setzero_si256(), rem);
  q = _mm256_add_epi32(q, lo);
  rem = _mm256_add_epi32(rem, _mm256_and_si256(lo, f));
  const __m256i hi = _mm256_cmpgt_epi32(rem, _mm256_sub_epi32(f, _mm256_set1_epi32(1)));
  q = _mm256_sub_epi32(q, hi);
  rem = _mm256_sub_epi32(rem, _mm256_and_si256(hi, f));
  x = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, kProbBits), rem), st);
}

// As rans_encode (words: n u16 with 16 bytes of slack below).
TZ_AVX2 size_t rans_encode_avx2(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words,
                                uint8_t* out, size_t limit) {
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  alignas(32) uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  const uint32_t full = n / kLanes;
  if (n % kLanes) {  // the partial last step is coded first (steps run backwards), scalar
    const uint32_t base = full * kLanes;
    for (uint32_t l = n - base; l-- > 0;) x[l] = rans_enc_put(x[l], c.enc[k][sym[base + l]], &wp);
  }
  __m256i x0 = _mm256_load_si256((const __m256i*)x), x1 = _mm256_load_si256((const __m256i*)(x + 8));
  __m256i x2 = _mm256_load_si256((const __m256i*)(x + 16)), x3 = _mm256_load_si256((const __m256i*)(x + 24));
  const uint32_t* fst = c.fs[k];
  const X86LaneTables& T = x86_tables();
  for (uint32_t s = full; s-- > 0;) {
    const uint8_t* sp = sym + (size_t)s * kLanes;
    enc8(x3, sp + 24, fst, wp, T);
    enc8(x2, sp + 16, fst, wp, T);
    enc8(x1, sp + 8, fst, wp, T);
    enc8(x0, sp, fst, wp, T);
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  _mm256_storeu_si256((__m256i*)out, x0);
  _mm256_storeu_si256((__m256i*)(out + 32), x1);
  _mm256_storeu_si256((__m256i*)(out + 64), x2);
  _mm256_storeu_si256((__m256i*)(out + 96), x3);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}

// One decode step for 8 lanes, in two phases so that the four groups of a
// step do not wait for each other: phase 1 (table entry, new state, which
// lanes need a word) for every group, then the word offsets of all groups
// from the masks, then phase 2 (the words, loaded and placed per group).
struct Dec8 {
  __m256i e, need;
  unsigned m;
};

TZ_AVX2 inline Dec8 dec8_state(__m256i& x, const uint32_t* dec) {
  Dec8 d;
  d.e = _mm256_i32gather_epi32((const int*)dec, _mm256_and_si256(x, _mm256_set1_epi32(kProbScale - 1)), 4);
  const __m256i f = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(d.e, 8), _mm256_set1_epi32(0xFFF)),
                                     _mm256_set1_epi32(1));
  x = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, kProbBits)), _mm256_srli_epi32(d.e, 20));
  d.need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  d.m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(d.need));
  return d;
}

TZ_AVX2 inline void dec8_words(__m256i& x, const Dec8& d, const uint8_t* p, const X86LaneTables& T) {
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)T.expand[d.m]));
  const __m256i w = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), perm);
  x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), w), d.need);
}

// As rans_decode; the scalar tail (rans_decode_tail) makes the same checks.
TZ_AVX2 int rans_decode_avx2(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (size < kRansStateBytes || ((size - kRansStateBytes) & 1u)) return kErrCorruptBlock;
  __m256i x0 = _mm256_loadu_si256((const __m256i*)in), x1 = _mm256_loadu_si256((const __m256i*)(in + 32));
  __m256i x2 = _mm256_loadu_si256((const __m256i*)(in + 64)), x3 = _mm256_loadu_si256((const __m256i*)(in + 96));
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ff = _mm256_set1_epi32(0xFF);
  const X86LaneTables& T = x86_tables();
  uint32_t s = 0;
  for (; s < full && end - p >= 64; ++s) {  // four 16-byte reads, each past the words before it
    const Dec8 a = dec8_state(x0, dec), b = dec8_state(x1, dec), c = dec8_state(x2, dec), d = dec8_state(x3, dec);
    const uint8_t* p1 = p + 2 * (size_t)__builtin_popcount(a.m);
    const uint8_t* p2 = p1 + 2 * (size_t)__builtin_popcount(b.m);
    const uint8_t* p3 = p2 + 2 * (size_t)__builtin_popcount(c.m);
    dec8_words(x0, a, p, T);
    dec8_words(x1, b, p1, T);
    dec8_words(x2, c, p2, T);
    dec8_words(x3, d, p3, T);
    p = p3 + 2 * (size_t)__builtin_popcount(d.m);
    const __m256i v = _mm256_packus_epi16(_mm256_packus_epi32(_mm256_and_si256(a.e, ff), _mm256_and_si256(b.e, ff)),
                                          _mm256_packus_epi32(_mm256_and_si256(c.e, ff), _mm256_and_si256(d.e, ff)));
    _mm256_storeu_si256((__m256i*)(out + (size_t)s * kLanes), _mm256_permutevar8x32_epi32(v, order));
  }
  alignas(32) uint32_t x[kLanes];
  _mm256_store_si256((__m256i*)x, x0);
  _mm256_store_si256((__m256i*)(x + 8), x1);
  _mm256_store_si256((__m256i*)(x + 16), x2);
  _mm256_store_si256((__m256i*)(x + 24), x3);
  return rans_decode_tail(x, p, end, s, n, dec, RansEmitBytes{out});
}

// A BF16 / F16 rANS page whose stream 0 is coded and stream 1 raw, in one
// pass: each step's 32 symbols are kept in s (scratch) and merged with the raw
// stream into dst at once; escapes found on the way are patched afterwards
// (symbol and merged element). Same results and statuses as rans_decode +
// kv_finish_rans: the stream's end conditions first, then the literals.
TZ_AVX2 int rans_merge_avx2(const KvCodecTables& c, const uint8_t* in, size_t size, uint32_t n, const uint8_t* raw1,
                            const uint8_t* lit, size_t n_lit, uint8_t* s, uint8_t* dst) {
  if (size < kRansStateBytes || ((size - kRansStateBytes) & 1u)) return kErrCorruptBlock;
  const uint32_t* dec = c.dec[0];
  const uint8_t dtype = c.t.dtype;
  const KvStreamTable& st = c.t.st[0];
  __m256i x0 = _mm256_loadu_si256((const __m256i*)in), x1 = _mm256_loadu_si256((const __m256i*)(in + 32));
  __m256i x2 = _mm256_loadu_si256((const __m256i*)(in + 64)), x3 = _mm256_loadu_si256((const __m256i*)(in + 96));
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ff = _mm256_set1_epi32(0xFF);
  const __m256i esc = _mm256_set1_epi8((char)st.escape);
  const X86LaneTables& T = x86_tables();
  bool any_escape = false;
  uint32_t step = 0;
  for (; step < full && end - p >= 64; ++step) {
    const Dec8 a = dec8_state(x0, dec), b = dec8_state(x1, dec), cc = dec8_state(x2, dec), d = dec8_state(x3, dec);
    const uint8_t* p1 = p + 2 * (size_t)__builtin_popcount(a.m);
    const uint8_t* p2 = p1 + 2 * (size_t)__builtin_popcount(b.m);
    const uint8_t* p3 = p2 + 2 * (size_t)__builtin_popcount(cc.m);
    dec8_words(x0, a, p, T);
    dec8_words(x1, b, p1, T);
    dec8_words(x2, cc, p2, T);
    dec8_words(x3, d, p3, T);
    p = p3 + 2 * (size_t)__builtin_popcount(d.m);
    const __m256i v = _mm256_permutevar8x32_epi32(
        _mm256_packus_epi16(_mm256_packus_epi32(_mm256_and_si256(a.e, ff), _mm256_and_si256(b.e, ff)),
                            _mm256_packus_epi32(_mm256_and_si256(cc.e, ff), _mm256_and_si256(d.e, ff))),
        order);
    uint8_t* o = s + (size_t)step * kLanes;
    _mm256_storeu_si256((__m256i*)o, v);
    any_escape |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, esc)) != 0;
    merge32(dtype, o, raw1 + (size_t)step * kLanes, dst + 2 * (size_t)step * kLanes);
  }
  alignas(32) uint32_t x[kLanes];
  _mm256_store_si256((__m256i*)x, x0);
  _mm256_store_si256((__m256i*)(x + 8), x1);
  _mm256_store_si256((__m256i*)(x + 16), x2);
  _mm256_store_si256((__m256i*)(x + 24), x3);
  const int r = rans_decode_tail(x, p, end, step, n, dec, RansEmitBytes{s});
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

// ------------------------------------------------------------ fixed --
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

TZ_AVX2 size_t fixed_codes_avx2(const KvCodecTables& c, const uint8_t* s, uint32_t n, uint8_t* codes) {
  const __m256i esc = _mm256_set1_epi8((char)fixed_escape_code(c.t.fixed_bits));
  size_t n_esc = 0;
  uint32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i code = codes32(c, _mm256_loadu_si256((const __m256i*)(s + i)), esc);
    _mm256_storeu_si256((__m256i*)(codes + i), code);
    n_esc += (size_t)__builtin_popcount((uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, esc)));
  }
  return n_esc + kv_fixed_codes(c, s + i, n - i, codes + i);
}

TZ_AVX2 void fixed_planes_avx2(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n,
                               uint8_t* out, uint8_t* lit) {
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
  if (g * kGroup < n) {
    uint32_t plane[kMaxFixedBits];
    kv_fixed_planes(codes + g * kGroup, n - g * kGroup, bits, plane);
    for (uint32_t b = 0; b < bits; ++b) store_le32(out + 4 * ((size_t)g * bits + b), plane[b]);
    for (uint32_t i = g * kGroup; i < n; ++i)
      if (codes[i] == fixed_escape_code(bits)) *lit++ = s0[i];
  }
}

// Bits of w as 32 bytes 0x00 / 0xFF (byte j = bit j).
TZ_AVX2 inline __m256i bits_to_bytes(uint32_t w) {
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w),
                                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                           2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_cmpeq_epi8(_mm256_and_si256(rep, sel), sel);
}

// Fixed mode, codes of at most 4 bits (a 16-entry byte lookup): stream 0
// decoded 32 elements at a time into scratch and merged with the raw
// streams into dst right away (as KvScalarDecoder::fixed).
TZ_AVX2 int fixed_decode_avx2(const KvCodecTables& c, const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit,
                              const uint8_t** streams, uint8_t* scratch, uint8_t* dst) {
  const uint32_t bits = c.t.fixed_bits, esc = fixed_escape_code(bits);
  const uint8_t dtype = c.t.dtype;
  const bool two = dtype == kBF16 || dtype == kF16;
  if (bits > 4) return KvScalarDecoder{&c}.fixed(planes, n, lit, n_lit, streams, scratch, dst);
  alignas(16) uint8_t syms[16] = {};
  for (uint32_t code = 0; code < esc; ++code) syms[code] = c.t.fixed_sym[code];
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)syms));
  {  // every literal must be a symbol without a code: checked for all of them at once
    const __m256i escv = _mm256_set1_epi8((char)esc);
    size_t i = 0;
    for (; i + 32 <= n_lit; i += 32)
      if ((uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(codes32(c, _mm256_loadu_si256((const __m256i*)(lit + i)), escv),
                                                           escv)) != ~0u)
        return kErrCorruptBlock;
    for (; i < n_lit; ++i)
      if (c.fixed_code[lit[i]] != esc) return kErrCorruptBlock;
  }
  uint8_t* const s0 = two ? scratch : dst;  // FP8: stream 0 is the output
  size_t j = 0;
  uint32_t g = 0;
  for (; (g + 1) * kGroup <= n; ++g) {
    const uint8_t* q = planes + 4 * (size_t)g * bits;
    __m256i code = _mm256_setzero_si256();
    uint32_t all = ~0u;
    for (uint32_t b = 0; b < bits; ++b) {
      const uint32_t w = load_le32(q + 4 * b);
      all &= w;
      code = _mm256_or_si256(code, _mm256_and_si256(bits_to_bytes(w), _mm256_set1_epi8((char)(1u << b))));
    }
    uint8_t* o = s0 + g * kGroup;
    _mm256_storeu_si256((__m256i*)o, _mm256_shuffle_epi8(lut, code));
    for (; all; all &= all - 1) o[__builtin_ctz(all)] = lit[j++];
    if (two) merge32(dtype, o, streams[1] + g * kGroup, dst + 2 * (size_t)g * kGroup);
  }
  if (g * kGroup == n) return kOk;
  const int st = kv_fixed_decode_from(c, planes, n, g, lit, j, s0);
  if (st != kOk || !two) return st;
  const uint8_t* tail[kMaxStreams] = {s0 + g * kGroup, streams[1] + g * kGroup};
  merge_fields(dtype, tail, n - g * kGroup, dst + 2 * (size_t)g * kGroup);
  return kOk;
}

// Escapes patched and streams merged (as kv_finish_rans). The common case,
// a 2-byte dtype whose only stream with escapes is stream 0, is one pass.
TZ_AVX2 int finish_avx2(const KvCodecTables& c, uint8_t* const* coded, const uint8_t* const* streams, uint32_t n,
                        const uint8_t* lit, size_t n_lit, uint8_t* dst) {
  const uint8_t dtype = c.t.dtype;
  size_t lp = 0;
  if ((dtype == kBF16 || dtype == kF16) && !(coded[1] && c.t.st[1].has_escape)) {
    uint32_t i = 0;
    if (coded[0] && c.t.st[0].has_escape) {
      const __m256i e = _mm256_set1_epi8((char)c.t.st[0].escape);
      uint8_t* s = coded[0];
      for (; i + 32 <= n; i += 32) {
        uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)(s + i)), e));
        for (; m; m &= m - 1) {
          if (lp >= n_lit) return kErrCorruptBlock;
          const uint8_t v = lit[lp++];
          if (c.direct[0][v]) return kErrCorruptBlock;
          s[i + __builtin_ctz(m)] = v;
        }
        merge32(dtype, s + i, streams[1] + i, dst + 2 * (size_t)i);
      }
      const int st = kv_patch_escapes(c, 0, s + i, n - i, lit, n_lit, &lp);
      if (st != kOk) return st;
    } else {
      for (; i + 32 <= n; i += 32) merge32(dtype, streams[0] + i, streams[1] + i, dst + 2 * (size_t)i);
    }
    if (lp != n_lit) return kErrCorruptBlock;
    const uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
    merge_fields(dtype, tail, n - i, dst + 2 * (size_t)i);
    return kOk;
  }
  for (int k = 0; k < c.t.n_streams; ++k) {
    if (!coded[k]) continue;
    const int st = patch_avx2(c, k, coded[k], n, lit, n_lit, &lp);
    if (st != kOk) return st;
  }
  if (lp != n_lit) return kErrCorruptBlock;
  merge_avx2(dtype, streams, n, dst);
  return kOk;
}

// ------------------------------------------------------------ kernel set --
struct Avx2Coder {
  const KvCodecTables* c;
  TZ_AVX2 void split(const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    split_avx2(c->t.dtype, src, n, streams);
  }
  TZ_AVX2 int64_t escapes(int k, const uint8_t* s, uint32_t n, uint8_t* lit) const {
    return escapes_avx2(*c, k, s, n, lit);
  }
  TZ_AVX2 size_t rans(int k, const uint8_t* s, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return rans_encode_avx2(*c, k, s, n, words, out, limit);
  }
  TZ_AVX2 size_t fixed_codes(const uint8_t* s, uint32_t n, uint8_t* codes) const {
    return fixed_codes_avx2(*c, s, n, codes);
  }
  TZ_AVX2 void fixed_planes(const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out, uint8_t* lit) const {
    fixed_planes_avx2(*c, codes, s0, n, out, lit);
  }
};

struct Avx2Decoder {
  const KvCodecTables* c;
  // The fused pass of the common BF16 / F16 page (kv_decode_page_with picks it).
  TZ_AVX2 int rans_merge(const uint8_t* in, size_t size, uint32_t n, const uint8_t* raw1, const uint8_t* lit,
                         size_t n_lit, uint8_t* scratch, uint8_t* dst) const {
    return rans_merge_avx2(*c, in, size, n, raw1, lit, n_lit, scratch, dst);
  }
  TZ_AVX2 int rans(int k, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) const {
    return rans_decode_avx2(c->dec[k], in, size, n, out);
  }
  TZ_AVX2 int finish(uint8_t* const* coded, const uint8_t* const* streams, uint32_t n, const uint8_t* lit,
                     size_t n_lit, uint8_t* dst) const {
    return finish_avx2(*c, coded, streams, n, lit, n_lit, dst);
  }
  TZ_AVX2 int fixed(const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit, const uint8_t** streams, uint8_t* scratch,
                    uint8_t* dst) const {
    return fixed_decode_avx2(*c, planes, n, lit, n_lit, streams, scratch, dst);
  }
};

TZ_AVX2 size_t encode_avx2(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch, uint8_t* dst) {
  const size_t size = kv_encode_page_with(c, src, n, scratch, dst, Avx2Coder{&c});
  kv_seal_page(c.t, dst, size, CpuPageSum{});
  return size;
}

TZ_AVX2 int decode_avx2(const KvCodecTables& c, const uint8_t* page, size_t size, uint8_t* dst, uint8_t* scratch) {
  return kv_decode_page_with(c, page, size, dst, scratch, CpuPageSum{}, Avx2Decoder{&c});
}

const PageKernels kAvx2 = {encode_avx2, decode_avx2};

}  // namespace

const PageKernels* avx2_kernels() { return &kAvx2; }

}  // namespace tz::kv

#else
namespace tz::kv {
const PageKernels* avx2_kernels() { return nullptr; }
}  // namespace tz::kv
#endif
