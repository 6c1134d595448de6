// Field kernels of every kernel set of the CPU backend against the portable
// ones, and the portable ones against the shared host/device fields
// (src/codec/fields.h): split, merge, min/max and histograms of every dtype,
// odd sizes around every vector width, unaligned buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/format.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"
#include "simd_paths.h"
#include "tz_test_data.h"

namespace {

using tz::cpu::CodecKernels;
using tz::cpu::kPortableKernels;
using Bytes = std::vector<uint8_t>;

// The four stream buffers a split writes: n bytes each and a guard byte,
// 0xEE, the data starting `off` bytes into each (unaligned pointers).
struct StreamBufs {
  Bytes b[4];
  uint8_t* p[4];
  StreamBufs(uint32_t n, int off) {
    for (int s = 0; s < 4; ++s) {
      b[s].assign(n + 1 + (size_t)off, 0xEE);
      p[s] = b[s].data() + off;
    }
  }
};

TEST(Simd, PortableFieldLoopsMatchTheSharedFields) {
  // The portable table splits and merges with its own vectorisable loops
  // (simd_field_loops.inc); they must equal tz::split_fields /
  // tz::merge_fields (the shared host/device code) for every dtype, size
  // and alignment, and never write past the end.
  const uint8_t dtypes[] = {tz::kBytes, tz::kBF16, tz::kF16, tz::kF32, tz::kF8E4M3, tz::kF8E5M2};
  for (uint8_t dt : dtypes)
    for (uint32_t n : {0u, 1u, 2u, 3u, 7u, 15u, 16u, 17u, 31u, 33u, 63u, 65u, 129u, 1025u, 4097u})
      for (int off = 0; off < 4; ++off) {
        const std::string tag = "dtype " + std::to_string(dt) + " n " + std::to_string(n) + " offset " +
                                std::to_string(off);
        const uint32_t es = tz::dtype_elem_size(dt);
        const int K = tz::dtype_stream_count(dt);
        const Bytes buf = tzt::hash_stream((size_t)n * es + off, 3 * n + dt + off);
        const uint8_t* src = buf.data() + off;
        StreamBufs want(n, 0), got(n, off);
        tz::split_fields(dt, src, n, want.p);
        kPortableKernels.split(dt, src, n, got.p);
        for (int s = 0; s < K; ++s)
          ASSERT_TRUE(std::equal(want.b[s].begin(), want.b[s].end(), got.p[s])) << tag << " split " << s;
        // Merge streams that are not a split of anything (independent bytes).
        Bytes in[4];
        const uint8_t* ip[4];
        for (int s = 0; s < 4; ++s) {
          in[s] = tzt::hash_stream((size_t)n + off, 77 * s + n + off);
          ip[s] = in[s].data() + off;
        }
        Bytes mw((size_t)n * es + 1, 0xEE), mg((size_t)n * es + 1 + off, 0xEE);
        tz::merge_fields(dt, ip, n, mw.data());
        kPortableKernels.merge(dt, ip, n, mg.data() + off);
        ASSERT_TRUE(std::equal(mw.begin(), mw.end(), mg.begin() + off)) << tag << " merge";
      }
}

TEST(Simd, FieldKernelsMatchPortable) {
  // split, merge, min/max and histogram of every dtype and stream, odd sizes
  // around every vector width, unaligned buffers.
  SIMD_KERNELS_OR_SKIP(ks);
  const uint8_t dtypes[] = {tz::kBytes, tz::kBF16, tz::kF16, tz::kF32, tz::kF8E4M3, tz::kF8E5M2};
  const uint32_t sizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 4097};
  for (const CodecKernels* k : ks)
    for (uint8_t dt : dtypes)
      for (uint32_t n : sizes)
        for (int off = 0; off < 2; ++off) {
          const std::string tag = std::string(tz::cpu::simd_path_name(k->path)) + " dtype " + std::to_string(dt) +
                                  " n " + std::to_string(n) + " offset " + std::to_string(off);
          const uint32_t es = tz::dtype_elem_size(dt);
          const int K = tz::dtype_stream_count(dt);
          // Real-looking and random bytes alike: a hash stream with every
          // fourth element's high bytes copied, so exponents repeat.
          Bytes buf = tzt::hash_stream((size_t)n * es + off, n + dt);
          for (uint32_t i = 4; i < n; i += 4) buf[off + (size_t)i * es + es - 1] = buf[off + es - 1];
          const uint8_t* src = buf.data() + off;
          StreamBufs ps(n, 0), ss(n, off);
          uint8_t* const* pp = ps.p;
          uint8_t* const* sp = ss.p;
          kPortableKernels.split(dt, src, n, ps.p);
          k->split(dt, src, n, ss.p);
          for (int s = 0; s < K; ++s)
            ASSERT_TRUE(std::equal(ps.b[s].begin(), ps.b[s].end(), sp[s])) << tag << " split " << s;
          Bytes pm((size_t)n * es + 1, 0xEE), sm((size_t)n * es + 1 + off, 0xEE);
          const uint8_t* cpp[4] = {pp[0], pp[1], pp[2], pp[3]};
          const uint8_t* csp[4] = {sp[0], sp[1], sp[2], sp[3]};
          kPortableKernels.merge(dt, cpp, n, pm.data());
          k->merge(dt, csp, n, sm.data() + off);
          ASSERT_TRUE(std::equal(pm.begin(), pm.end(), sm.begin() + off)) << tag << " merge";
          ASSERT_TRUE(std::equal(pm.begin(), pm.end() - 1, src)) << tag << " merge inverts split";
          for (int s = 0; s < K; ++s) {
            uint8_t r0[4] = {1, 2, 3, 4}, r1[4] = {5, 6, 7, 8};
            kPortableKernels.minmax(dt, s, src, n, r0);
            k->minmax(dt, s, src, n, r1);
            for (int j = 0; j < 4; ++j) ASSERT_EQ(r0[j], r1[j]) << tag << " extreme " << j << " of stream " << s;
            std::vector<uint64_t> h0(256), h1(256), want(256);
            for (int v = 0; v < 256; ++v) h0[v] = h1[v] = want[v] = (uint64_t)v * 3;  // histograms add up
            kPortableKernels.histogram(dt, s, src, n, h0.data());
            k->histogram(dt, s, src, n, h1.data());
            uint8_t lo = 255, hi = 0;  // straight from the format's per-element rule
            int8_t smax = -128, smin = 127;
            for (uint32_t i = 0; i < n; ++i) {
              const uint8_t b = tz::field_byte(dt, src, i, s);
              ++want[b], lo = std::min(lo, b), hi = std::max(hi, b);
              smax = std::max(smax, (int8_t)b), smin = std::min(smin, (int8_t)b);
            }
            ASSERT_EQ(h0, want) << tag << " portable histogram of stream " << s;
            ASSERT_EQ(h0, h1) << tag << " histogram of stream " << s;
            ASSERT_EQ(r0[0], lo) << tag << " portable min of stream " << s;
            ASSERT_EQ(r0[1], hi) << tag << " portable max of stream " << s;
            ASSERT_EQ(r0[2], (uint8_t)smax) << tag << " portable signed max of stream " << s;
            ASSERT_EQ(r0[3], (uint8_t)smin) << tag << " portable signed min of stream " << s;
          }
        }
}

TEST(Simd, HistogramOfConcentratedStreamsMatchesPortable) {
  // Exponent-like streams (most bytes in a few adjacent values), where the
  // SIMD histograms count a window of values in vectors and the rest one by
  // one: windows at both ends of the byte range, outliers on both sides of
  // the window (0 and 255 included), a stream whose values leave the window
  // after the first chunk, sizes around chunk and vector widths, unaligned.
  SIMD_KERNELS_OR_SKIP(ks);
  std::mt19937 rng(14);
  const uint32_t sizes[] = {1025, 1056, 2047, 2048, 3001, 65536 + 17};
  const int centres[] = {3, 120, 250};
  for (const CodecKernels* k : ks)
    for (uint32_t n : sizes)
      for (int centre : centres)
        for (int outliers : {0, 1, 20, 300}) {  // per mille outside the window
          for (int drift = 0; drift < 2; ++drift) {
            const std::string tag = std::string(tz::cpu::simd_path_name(k->path)) + " n " + std::to_string(n) +
                                    " centre " + std::to_string(centre) + " outliers " + std::to_string(outliers) +
                                    " drift " + std::to_string(drift);
            // BF16 elements whose exponent (stream 0) is centre +- 5, an
            // outlier anywhere in 0..255, or (drift) centre + 40 past 1500.
            Bytes buf(2 * (size_t)n + 1);
            for (uint32_t i = 0; i < n; ++i) {
              int e = centre + (int)(rng() % 11) - 5;
              if ((int)(rng() % 1000) < outliers) e = (int)(rng() % 4 == 0 ? (rng() % 2) * 255 : rng() % 256);
              if (drift && i >= 1500) e += 40;
              e = std::clamp(e, 0, 255);
              const uint16_t v = (uint16_t)((e << 7) | (rng() & 0x807F));
              buf[1 + 2 * (size_t)i] = (uint8_t)v, buf[2 + 2 * (size_t)i] = (uint8_t)(v >> 8);
            }
            const uint8_t* src = buf.data() + 1;
            for (int s = 0; s < 2; ++s) {
              std::vector<uint64_t> h0(256, 7), h1(256, 7), want(256, 7);
              for (uint32_t i = 0; i < n; ++i) ++want[tz::field_byte(tz::kBF16, src, i, s)];
              kPortableKernels.histogram(tz::kBF16, s, src, n, h0.data());
              k->histogram(tz::kBF16, s, src, n, h1.data());
              ASSERT_EQ(h0, want) << tag << " portable histogram of stream " << s;
              ASSERT_EQ(h1, want) << tag << " histogram of stream " << s;
            }
            // The same bytes as one-byte elements (FP8 / bytes streams).
            std::vector<uint64_t> h0(256, 0), h1(256, 0);
            kPortableKernels.histogram(tz::kF8E4M3, 0, src, 2 * n, h0.data());
            k->histogram(tz::kF8E4M3, 0, src, 2 * n, h1.data());
            ASSERT_EQ(h0, h1) << tag << " histogram of the bytes";
          }
        }
}

}  // namespace
