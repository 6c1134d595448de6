// Level 1's fast tables' statistics (codec/policy.h, "fast tables'
// statistics"): the per-block ranges of four extremes and the pseudo-counts
// they give. The CPU encoder's table sections with them are checked against
// the policy step by step in tests/codec/test_policy.cpp
// (Policy.CpuEncoderFollowsThePolicy), the CUDA encoder's frames against
// the CPU's in tests/cuda/emu (CudaEmu.FastTablesRanges).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "codec/fields.h"
#include "codec/policy.h"
#include "cpu/kernels.h"
#include "tz_test_util.h"

namespace {

using namespace tz;
using tzt::Bytes;

// The range of a set of symbols, symbol by symbol.
void range_of_symbols(const std::vector<uint8_t>& syms, uint8_t* r) {
  policy_range_empty(r);
  for (uint8_t x : syms) policy_range_add(r, x);
}

// Every symbol of a block is in its range; with symbols on both sides of
// 0x80 the symbols strictly between the largest below 0x80 and the smallest
// from 0x80 on are not; with symbols on one side only the range is exactly
// [min, max]. Merging the ranges of two halves gives the range of the whole.
TEST(PolicyFast, RangeHoldsTheBlocksSymbolsAndSkipsTheGapBetweenSigns) {
  std::mt19937 rng(3);
  int two_sided = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int mode = trial % 4;  // 0: low side, 1: high side, 2: both, 3: anywhere
    std::vector<uint8_t> syms(1 + rng() % 40);
    const uint32_t c = rng() % 100;
    for (auto& x : syms) {
      const uint32_t v = c + rng() % 28;  // a band of 28 values, as an exponent's
      x = (uint8_t)(mode == 0 ? v % 128 : mode == 1 ? 128 + v % 128 : mode == 2 ? (rng() % 2) * 128 + v % 128 : rng());
    }
    uint8_t r[kRangeBytes];
    range_of_symbols(syms, r);
    const std::set<uint8_t> present(syms.begin(), syms.end());
    for (uint8_t x : present) ASSERT_TRUE(policy_range_has(r, x)) << "symbol " << (int)x << " of the block left out";
    const uint8_t lo = *present.begin(), hi = *present.rbegin();
    const bool low = lo < 0x80, high = hi >= 0x80;
    for (uint32_t x = 0; x < 256; ++x) {
      bool expect = x >= lo && x <= hi;
      if (low && high) {
        uint32_t top_low = 0, bottom_high = 255;
        for (uint8_t s : present) {
          if (s < 0x80) top_low = std::max<uint32_t>(top_low, s);
          else bottom_high = std::min<uint32_t>(bottom_high, s);
        }
        expect = (x >= lo && x <= top_low) || (x >= bottom_high && x <= hi);
      }
      ASSERT_EQ(policy_range_has(r, x), expect) << "trial " << trial << " symbol " << x;
    }
    two_sided += low && high;
    // The range of a run of blocks: the merge of the blocks' ranges.
    const size_t cut = syms.size() / 2;
    uint8_t a[kRangeBytes], b[kRangeBytes];
    range_of_symbols(std::vector<uint8_t>(syms.begin(), syms.begin() + cut), a);
    range_of_symbols(std::vector<uint8_t>(syms.begin() + cut, syms.end()), b);
    policy_range_merge(a, b);
    ASSERT_TRUE(std::equal(a, a + kRangeBytes, r)) << "trial " << trial;
  }
  EXPECT_GT(two_sided, 400);
  uint8_t e[kRangeBytes];
  policy_range_empty(e);
  for (uint32_t x = 0; x < 256; ++x) EXPECT_FALSE(policy_range_has(e, x));
}

// The kernels' four extremes (every SIMD path) are the range policy_range_add
// builds symbol by symbol: the encoders' ranges are the policy's.
TEST(PolicyFast, KernelExtremesAreThePolicyRange) {
  for (const tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2}) {
    const uint8_t d = (uint8_t)dt;
    const uint32_t n = 5000;
    const Bytes src = tzt::real_bytes(dt, (size_t)n * dtype_elem_size(d));
    for (int k = 0; k < dtype_stream_count(d); ++k) {
      uint8_t want[kRangeBytes];
      policy_range_empty(want);
      for (uint32_t i = 0; i < n; ++i) policy_range_add(want, field_byte(d, src.data(), i, k));
      for (const cpu::SimdPath p : cpu::kAllSimdPaths) {
        const cpu::CodecKernels* kr = cpu::codec_kernels_for(p);
        if (!kr || !cpu::simd_path_cpu_has(p)) continue;
        uint8_t got[kRangeBytes] = {1, 2, 3, 4};
        kr->minmax(d, k, src.data(), n, got);
        EXPECT_TRUE(std::equal(got, got + kRangeBytes, want))
            << "dtype " << (int)d << " stream " << k << " path " << cpu::simd_path_name(p);
        uint8_t none[kRangeBytes] = {1, 2, 3, 4}, empty[kRangeBytes];
        kr->minmax(d, k, src.data(), 0, none);
        policy_range_empty(empty);
        EXPECT_TRUE(std::equal(none, none + kRangeBytes, empty)) << "the range of no element is the empty range";
      }
    }
  }
}

// Fast tables give every symbol of the range a pseudo-count (so every
// symbol of the run stays codable) and none outside it; on FP8 E5M2 and
// FP16 data of both signs the range's tables cost fewer estimated bytes
// than tables over all of [min, max] (the gap between the signs' symbols
// would take a 1/4096 share per symbol).
TEST(PolicyFast, RangePseudoCountsCodeEverySymbolAndPayOnSignedStreams) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> v(16384 * 8);
  for (auto& x : v) x = nd(rng);
  for (const tz_dtype dt : {TZ_DTYPE_F8_E5M2, TZ_DTYPE_F16}) {
    const uint8_t d = (uint8_t)dt;
    const Bytes src = dt == TZ_DTYPE_F16 ? tzt::to_f16(v) : tzt::to_f8_e5m2(v);
    const uint32_t n = (uint32_t)v.size(), be = 16384, B = n / be;
    std::vector<uint32_t> hist((size_t)B * 256, 0);
    std::vector<uint64_t> counted(B, 0);
    std::vector<uint8_t> mm((size_t)B * kRangeBytes), wide((size_t)B * kRangeBytes);
    for (uint32_t b = 0; b < B; ++b) {
      policy_range_empty(&mm[kRangeBytes * b]);
      for (uint32_t i = b * be; i < (b + 1) * be; ++i) {
        const uint8_t x = field_byte(d, src.data(), i, 0);
        policy_range_add(&mm[kRangeBytes * b], x);
        if (i - b * be < kSampleElems) ++hist[(size_t)b * 256 + x], ++counted[b];
      }
      // [min, max]: both intervals the whole span.
      uint8_t* w = &wide[kRangeBytes * b];
      w[0] = mm[kRangeBytes * b], w[1] = mm[kRangeBytes * b + 1], w[2] = w[1], w[3] = w[0];
    }
    uint8_t run[kRangeBytes];
    policy_range_empty(run);
    for (uint32_t b = 0; b < B; ++b) policy_range_merge(run, &mm[kRangeBytes * b]);
    ASSERT_LT(run[2], 0x80) << "the data should have both signs";
    ASSERT_GE(run[3], 0x80);
    uint64_t sample[256] = {}, tc[256];
    for (uint32_t b = 0; b < B; ++b)
      for (int x = 0; x < 256; ++x) sample[x] += hist[(size_t)b * 256 + x];
    policy_table_counts(sample, true, run, tc);
    int gap = 0;
    for (uint32_t x = 0; x < 256; ++x) {
      EXPECT_EQ(tc[x] > 0, policy_range_has(run, x)) << "symbol " << x;
      EXPECT_EQ(tc[x], sample[x] * kFastTablesSampleWeight + (policy_range_has(run, x) ? 1 : 0));
      gap += x >= run[0] && x <= run[1] && !policy_range_has(run, x);
    }
    EXPECT_GT(gap, 0);
    TableScratch w;
    std::vector<uint32_t> f_range(256), f_wide(256);
    uint64_t c_range = 0, c_wide = 0;
    ASSERT_TRUE(policy_set_tables(hist.data(), 256, counted.data(), B, be, n, nullptr, 1, true, mm.data(), kRangeBytes,
                                  f_range.data(), &c_range, &w));
    ASSERT_TRUE(policy_set_tables(hist.data(), 256, counted.data(), B, be, n, nullptr, 1, true, wide.data(),
                                  kRangeBytes, f_wide.data(), &c_wide, &w));
    for (uint32_t b = 0; b < B; ++b)
      for (uint32_t i = b * be; i < (b + 1) * be; ++i)
        ASSERT_GT(f_range[field_byte(d, src.data(), i, 0)], 0u) << "a symbol of the data is not codable";
    EXPECT_LT(c_range, c_wide) << "dtype " << (int)d;
  }
}

}  // namespace
