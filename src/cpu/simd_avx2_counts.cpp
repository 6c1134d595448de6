// AVX2 histograms of the CPU backend (SimdPath::kAvx2; the AVX-512 table uses
// them too, kernels.h): the exact byte histogram of a stream and the joint
// counts of the lane-context search. Each produces exactly the counts of its
// portable counterpart; tests/cpu/test_simd_fields.cpp and the policy tests
// compare them. The rANS coder of this path is in simd_avx2.cpp.
#include "codec/fields.h"
#include "codec/policy.h"
#include "codec/policy_lane_ctx.h"
#include "cpu/kernels.h"
#include "cpu/simd_common.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>
#define TZ_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,popcnt")))

namespace tz::cpu {

namespace {

// The stream extraction of the field loops, compiled for AVX2.
namespace loops {
#define TZ_LOOP_TARGET TZ_AVX2
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

// ----------------------------------------------------------- histogram --

// The exact histogram with the common values counted in vectors. Exponent
// streams put nearly all their bytes into a few adjacent values, so the
// values of a window [lo, lo + 16) are counted by comparing 32 bytes at a
// time with each (byte counters, added up per chunk), and only the bytes
// outside the window one by one. The counts are the scalar loop's (every
// byte lands in exactly one of the two); the window only decides the speed.
// It is chosen from the first chunk, counted scalar; a stream (or a later
// chunk) with more than 1/8 of its bytes outside it is counted scalar.
constexpr int kHistWindow = 16;

// Byte counting by 16-bit indices into HistogramCounter's eight tables:
// widen_indices stores, for byte i of 32 at a time, i % 8 * 256 + byte
// (count_indices adds them up), so that each count is one index load and one
// increment.
// table_of: the i % 8 * 256 of each 16-bit lane (index_tables()).
TZ_AVX2 inline __m256i index_tables() {
  return _mm256_setr_epi16(0, 256, 512, 768, 1024, 1280, 1536, 1792, 0, 256, 512, 768, 1024, 1280, 1536, 1792);
}
TZ_AVX2 inline void widen_indices(__m256i bytes, __m256i table_of, uint16_t* idx) {
  _mm256_store_si256((__m256i*)idx, _mm256_add_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(bytes)), table_of));
  _mm256_store_si256((__m256i*)(idx + 16),
                     _mm256_add_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(bytes, 1)), table_of));
}
inline void count_indices(const uint16_t* idx, uint32_t m, HistogramCounter& h) {  // m a multiple of 8
  uint32_t* const counters = &h.h[0][0];
  for (uint32_t j = 0; j < m; j += 8) {
    ++counters[idx[j]];
    ++counters[idx[j + 1]];
    ++counters[idx[j + 2]];
    ++counters[idx[j + 3]];
    ++counters[idx[j + 4]];
    ++counters[idx[j + 5]];
    ++counters[idx[j + 6]];
    ++counters[idx[j + 7]];
  }
}
// HistogramCounter::add of the m bytes of buf (64-byte aligned), the whole
// vectors by 16-bit indices.
TZ_AVX2 inline void count_bytes(const uint8_t* buf, uint32_t m, HistogramCounter& h) {
  alignas(64) uint16_t idx[kHistChunk];
  const __m256i table_of = index_tables();
  const uint32_t mv = m & ~31u;
  for (uint32_t done = 0; done < mv; done += kHistChunk) {
    const uint32_t c = mv - done < kHistChunk ? mv - done : kHistChunk;
    for (uint32_t j = 0; j < c; j += 32)
      widen_indices(_mm256_load_si256((const __m256i*)(buf + done + j)), table_of, idx + j);
    count_indices(idx, c, h);
  }
  h.add(buf + mv, m - mv);
}

// Adds to win[j0 + j] (j < 8) the count of value lo + j0 + j among the m
// bytes of buf (m a multiple of 32, at most 255 * 32). With Outliers, also
// counts the bytes outside [lo, lo + 16) in h and returns how many there
// were. (One function per half of the window: eight byte counters, the
// difference vector and the compared values fill the sixteen registers.)
template <int J0, bool Outliers>
TZ_AVX2 inline uint32_t count_window8(const uint8_t* buf, uint32_t m, __m256i lov, uint64_t* win, HistogramCounter& h) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  uint32_t outside = 0;
  for (uint32_t i = 0; i < m; i += 32) {
    const __m256i d = _mm256_sub_epi8(_mm256_load_si256((const __m256i*)(buf + i)), lov);  // value - lo
    // a_j -= (d == J0 + j) ? -1 : 0
    a0 = _mm256_sub_epi8(a0, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 0)));
    a1 = _mm256_sub_epi8(a1, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 1)));
    a2 = _mm256_sub_epi8(a2, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 2)));
    a3 = _mm256_sub_epi8(a3, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 3)));
    a4 = _mm256_sub_epi8(a4, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 4)));
    a5 = _mm256_sub_epi8(a5, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 5)));
    a6 = _mm256_sub_epi8(a6, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 6)));
    a7 = _mm256_sub_epi8(a7, _mm256_cmpeq_epi8(d, _mm256_set1_epi8(J0 + 7)));
    if (Outliers) {
      const __m256i in = _mm256_cmpeq_epi8(_mm256_min_epu8(d, _mm256_set1_epi8(kHistWindow - 1)), d);  // d <= 15
      for (uint32_t out = ~(uint32_t)_mm256_movemask_epi8(in); out; out &= out - 1) {
        ++h.h[0][buf[i + (uint32_t)__builtin_ctz(out)]];
        ++outside;
      }
    }
  }
  const __m256i acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int j = 0; j < 8; ++j) {
    const __m256i s = _mm256_sad_epu8(acc[j], _mm256_setzero_si256());  // four 64-bit partial sums
    const __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    win[J0 + j] += (uint64_t)_mm_cvtsi128_si64(t) + (uint64_t)_mm_extract_epi64(t, 1);
  }
  return outside;
}

// Adds to win[] the counts of the values in [lo, lo + 16) among the m bytes
// of buf (m a multiple of 32, at most 255 * 32) and counts the others in h.
// Returns how many were outside the window.
TZ_AVX2 uint32_t count_window(const uint8_t* buf, uint32_t m, uint8_t lo, uint64_t* win, HistogramCounter& h) {
  const __m256i lov = _mm256_set1_epi8((char)lo);
  const uint32_t outside = count_window8<0, true>(buf, m, lov, win, h);
  count_window8<8, false>(buf, m, lov, win, h);
  return outside;
}

// Start of the window holding the most of every third of the m bytes of
// buf (odd: not in step with 2-, 4- or 8-byte element patterns), or -1 when
// it holds less than 7/8 of them (or m is too small to tell).
inline int choose_window(const uint8_t* buf, uint32_t m) {
  if (m < 256) return -1;
  uint16_t cnt[256] = {};
  uint32_t samples = 0;
  for (uint32_t i = 0; i < m; i += 3, ++samples) ++cnt[buf[i]];
  uint32_t in = 0;
  for (int v = 0; v < kHistWindow; ++v) in += cnt[v];
  uint32_t best = in;
  int lo = 0;
  for (int v = 1; v + kHistWindow <= 256; ++v) {
    in = in + cnt[v + kHistWindow - 1] - cnt[v - 1];  // never below zero
    if (in > best) best = in, lo = v;
  }
  return 8 * best >= 7 * samples ? lo : -1;
}

}  // namespace

// Not in the anonymous namespace: the AVX-512 table uses it too (kernels.h).
TZ_AVX2 void histogram_avx2(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint64_t* hist) {
  static_assert(kHistChunk % 32 == 0 && kHistChunk <= 255 * 32, "byte counters of a chunk must not overflow");
  HistogramCounter h;
  uint64_t win[kHistWindow] = {};
  alignas(64) uint8_t buf[kHistChunk];
  const uint32_t es = dtype_elem_size(dtype);
  int lo = -1;             // start of the window in use (win[] counts it), or -1: bytes counted one by one
  uint32_t retry = 0;      // chunk at which a window is looked for again
  uint32_t backoff = 1;    // chunks to the next look after a failure (doubles up to 64)
  auto failed = [&](uint32_t c) {
    retry = c + backoff;
    backoff = backoff < 64 ? 2 * backoff : 64;
  };
  auto drop_window = [&] {
    for (int j = 0; j < kHistWindow; ++j) hist[lo + j] += win[j], win[j] = 0;
    lo = -1;
  };
  for (uint32_t i = 0, c = 0; i < n; i += kHistChunk, ++c) {
    const uint32_t m = n - i < kHistChunk ? n - i : kHistChunk;
    loops::extract(dtype, k, src + (size_t)i * es, m, buf);
    if (lo < 0 && c >= retry) {
      lo = choose_window(buf, m);
      if (lo < 0) failed(c);
    }
    if (lo < 0) {
      count_bytes(buf, m, h);
      continue;
    }
    const uint32_t mv = m & ~31u;
    const uint32_t outside = count_window(buf, mv, (uint8_t)lo, win, h);
    h.add(buf + mv, m - mv);
    if (8 * outside > mv) {  // the window does not fit (any more): look again later
      drop_window();
      failed(c);  // the next chunk first, then backing off
    } else {
      backoff = 1;
    }
  }
  if (lo >= 0) drop_window();
  h.flush(hist);
}

// Joint counts of stream 0 for the lane-context search (frame_tables.cpp,
// joint_counts: row policy_ctx_row of the lane predecessor, row 0 for the
// first step), from the elements directly. Each (row, symbol) pair whose
// symbol lies in a window of 16 values [wl, wl + 16) around the row window is
// packed into one byte, row << 4 | (symbol - wl) (rows 0..14 below 0xF0), by
// byte arithmetic on 32 symbols at a time and then counted as a byte
// histogram (widen_indices, count_indices); the pairs outside (about 1% on
// the fixture's optimizer state) are counted one by one. The counts are exactly the scalar
// loop's: every pair lands in one of the two. With skip = kLanes the first
// step is a predecessor only: its pairs are written as the byte 0xFF, whose
// count (row 15) is never read.
TZ_AVX2 void joint_counts_avx2(uint8_t dtype, const uint8_t* src, uint32_t n, uint32_t skip, uint32_t lo, uint32_t* J,
                               uint32_t* hist) {
  static_assert(kCtxJointRows <= 15, "rows fit in four bits below the outlier byte 0xFF");
  static_assert(kHistChunk % 32 == 0, "chunks are whole vectors");
  static_assert(kLanes == 32, "a step is one vector");
  const uint32_t es = dtype_elem_size(dtype);
  const uint32_t wl = lo >= 2 ? (lo - 2 < 240 ? lo - 2 : 240) : 0;
  alignas(64) uint8_t buf[kLanes + kHistChunk];  // the previous step's symbols, then the chunk's
  alignas(64) uint16_t idx[kHistChunk];  // i % 8 * 256 + pair of element i of the chunk (widen_indices)
  const __m256i table_of = index_tables();
  HistogramCounter h;
  std::memset(buf, 0, kLanes);
  const __m256i lov = _mm256_set1_epi8((char)lo), wlv = _mm256_set1_epi8((char)wl);
  const __m256i one = _mm256_set1_epi8(1), top = _mm256_set1_epi8((char)(kCtxJointRows - 2));
  const __m256i fifteen = _mm256_set1_epi8(15), outlier = _mm256_set1_epi8((char)0xFF);
  auto count_one = [&](uint32_t g, uint32_t j) {  // element g of the block, at buf[kLanes + j]
    if (g < skip) return;
    const uint32_t row = g < (uint32_t)kLanes ? 0u : policy_ctx_row(buf[j], lo);
    ++J[row * 256 + buf[kLanes + j]];
    if (hist) ++hist[buf[kLanes + j]];
  };
  for (uint32_t i = 0; i < n; i += kHistChunk) {
    const uint32_t m = n - i < kHistChunk ? n - i : kHistChunk;
    loops::extract(dtype, 0, src + (size_t)i * es, m, buf + kLanes);
    const uint32_t mv = m & ~31u;
    for (uint32_t j = 0; j < mv; j += 32) {
      const __m256i prev = _mm256_load_si256((const __m256i*)(buf + j));
      const __m256i cur = _mm256_load_si256((const __m256i*)(buf + kLanes + j));
      // Row: 2 + prev - lo inside the window, 1 below it, kCtxJointRows - 1
      // above it (saturating: min(prev - lo + 1, 13) + [prev >= lo]).
      const __m256i r0 = _mm256_min_epu8(_mm256_adds_epu8(_mm256_subs_epu8(prev, lov), one), top);
      const __m256i ge = _mm256_cmpeq_epi8(_mm256_max_epu8(prev, lov), prev);  // -1 where prev >= lo
      __m256i r = _mm256_sub_epi8(r0, ge);
      if (i + j == 0) r = _mm256_setzero_si256();  // a block's first step: row 0
      const __m256i d = _mm256_sub_epi8(cur, wlv);
      __m256i in = _mm256_cmpeq_epi8(_mm256_min_epu8(d, fifteen), d);  // d <= 15
      const __m256i pair = _mm256_or_si256(_mm256_slli_epi16(r, 4), d);  // r <= 14: no carry across bytes
      __m256i pv = _mm256_blendv_epi8(outlier, pair, in);
      if (i + j < skip) pv = outlier, in = outlier;  // predecessors only
      widen_indices(pv, table_of, idx + j);
      for (uint32_t out = ~(uint32_t)_mm256_movemask_epi8(in); out; out &= out - 1)
        count_one(i + j + (uint32_t)__builtin_ctz(out), j + (uint32_t)__builtin_ctz(out));
    }
    count_indices(idx, mv, h);
    for (uint32_t j = mv; j < m; ++j) count_one(i + j, j);
    if (m == kHistChunk) std::memcpy(buf, buf + kHistChunk, kLanes);
  }
  uint64_t ph[256] = {};
  h.flush(ph);
  for (uint32_t r = 0; r < kCtxJointRows; ++r)
    for (uint32_t d = 0; d < 16; ++d) J[r * 256 + wl + d] += (uint32_t)ph[r << 4 | d];
  if (hist)
    for (uint32_t r = 0; r < kCtxJointRows; ++r)
      for (uint32_t d = 0; d < 16; ++d) hist[wl + d] += (uint32_t)ph[r << 4 | d];
}

}  // namespace tz::cpu

#endif  // __x86_64__
