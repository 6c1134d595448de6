// The encoder policy (codec/policy.h) and the table-section writer
// (codec/frame_prefix.h), tested directly. The CPU encoder's table sections
// against the policy run step by step: tests/codec/test_policy_encoder.cpp; level
// 1's fast-table ranges: tests/codec/test_policy_fast.cpp. (The CUDA encoder's
// frames are compared with the CPU's byte for byte in tests/cuda/emu, so
// they follow the same decisions.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codec/fields.h"
#include "codec/policy.h"
#include "codec/policy_lane_ctx.h"
#include "tz_test_util.h"

namespace {

using namespace tz;
using tzt::Bytes;

TEST(Policy, Parameters) {
  for (int l = -3; l <= 5; ++l) EXPECT_EQ(encode_level_valid(l), l >= -1 && l <= 3) << l;
  EXPECT_EQ(policy_level(0), 1);
  EXPECT_EQ(policy_level(-1), -1);
  EXPECT_EQ(policy_level(3), 3);
  EXPECT_EQ(encode_dtype(kBF16, 6), kBF16);
  EXPECT_EQ(encode_dtype(kBF16, 7), kBytes);
  EXPECT_EQ(encode_dtype(kF32, 6), kBytes);
  EXPECT_EQ(encode_dtype(kF8E4M3, 7), kF8E4M3);
  EXPECT_EQ(policy_block_elems(0, kBF16), kDefaultBlockElems);
  EXPECT_EQ(policy_block_elems(0, kBytes), kDefaultBytesBlockElems);
  EXPECT_EQ(policy_block_elems(8192, kBytes), 8192u);
  // The options' one rule set: level, then block size (0: the default).
  EXPECT_EQ(policy_option_error(0, 0), nullptr);
  EXPECT_EQ(policy_option_error(-1, 4096), nullptr);
  EXPECT_EQ(policy_option_error(3, 1u << 20), nullptr);
  EXPECT_NE(policy_option_error(4, 0), nullptr);
  EXPECT_NE(policy_option_error(-2, 0), nullptr);
  EXPECT_NE(policy_option_error(1, 2048), nullptr);
  EXPECT_NE(policy_option_error(1, 6144), nullptr);
  EXPECT_NE(policy_option_error(1, 2u << 20), nullptr);
  EXPECT_NE(policy_option_error(1, (1ull << 32) + 4096), nullptr);  // not truncated to 4096
  EXPECT_STREQ(policy_option_error(9, 5), policy_option_error(9, 0)) << "the level is named first";
  EXPECT_TRUE(block_elems_valid(4096));
  EXPECT_TRUE(block_elems_valid(1u << 20));
  EXPECT_FALSE(block_elems_valid(2048));
  EXPECT_FALSE(block_elems_valid(6144));
  EXPECT_FALSE(block_elems_valid(1u << 21));
  EXPECT_FALSE(block_elems_valid(0));
  EXPECT_TRUE(encode_size_valid(kMaxRawSize));
  EXPECT_FALSE(encode_size_valid(kMaxRawSize + 1));
  uint32_t nb = 0;
  EXPECT_TRUE(encode_block_count(UINT64_C(4096) * UINT32_MAX, 4096, &nb));
  EXPECT_EQ(nb, UINT32_MAX);
  EXPECT_FALSE(encode_block_count(UINT64_C(4096) * UINT32_MAX + 1, 4096, &nb));
  EXPECT_TRUE(encode_block_count(0, 4096, &nb));
  EXPECT_EQ(nb, 0u);
}

TEST(Policy, PassesAndFastTables) {
  EXPECT_EQ(policy_bytes_kind(-1), kKindRaw);
  EXPECT_EQ(policy_bytes_kind(1), kKindZstd);
  EXPECT_EQ(policy_bytes_kind(3), kKindZstd);
  EXPECT_FALSE(policy_codes_streams(-1, kBF16, 10000, 1));
  EXPECT_FALSE(policy_codes_streams(1, kBytes, 10000, 1));
  EXPECT_FALSE(policy_codes_streams(2, kF32, 0, 0));
  EXPECT_FALSE(policy_codes_streams(1, kF8E5M2, 1, 1));  // too small to pay (short path)
  EXPECT_FALSE(policy_codes_streams(1, kF8E5M2, 139, 1));
  EXPECT_TRUE(policy_codes_streams(1, kF8E5M2, 140, 1));
  EXPECT_FALSE(policy_sampled(kSampleElems));
  EXPECT_TRUE(policy_sampled(2 * kSampleElems));
  EXPECT_EQ(policy_first_pass_elems(4096), 4096u);
  EXPECT_EQ(policy_first_pass_elems(65536), kSampleElems);
  EXPECT_TRUE(policy_fast_tables(8192, 1, kFastTablesMinBlocks));
  EXPECT_FALSE(policy_fast_tables(8192, 1, kFastTablesMinBlocks - 1));
  EXPECT_FALSE(policy_fast_tables(8192, 2, 100));
  EXPECT_FALSE(policy_fast_tables(4096, 1, 100));
  EXPECT_TRUE(policy_second_pass(8192, 2, 100, true));
  EXPECT_FALSE(policy_second_pass(8192, 2, 100, false));
  EXPECT_FALSE(policy_second_pass(8192, 1, 100, true));  // fast tables instead
  EXPECT_TRUE(policy_second_pass(8192, 1, 7, true));     // too few blocks for fast tables
  EXPECT_FALSE(policy_second_pass(4096, 2, 100, true));  // the first pass was exact
}

// Symbol 0 with count c, symbols 1..255 with 100 each.
void peaked(uint64_t c, uint64_t* h) {
  for (int s = 0; s < 256; ++s) h[s] = 100;
  h[0] = c;
}

TEST(Policy, SampleScreeningByLevel) {
  uint64_t h[256], norm[256];
  uint32_t f[256];
  for (int s = 0; s < 256; ++s) h[s] = 1000;
  EXPECT_FALSE(policy_sample_wants(1, h, f, norm)) << "uniform bytes never pay";
  EXPECT_FALSE(policy_sample_wants(2, h, f, norm));
  for (int s = 0; s < 256; ++s) h[s] = s == 7 ? 4096 : 0;
  EXPECT_TRUE(policy_sample_wants(1, h, f, norm)) << "a constant stream pays";
  // Level 1 wants a 1% saving, level 2 any saving: a peak of growing height
  // is wanted by level 2 first, and level 1 never wants what level 2 does not.
  bool only_level2 = false;
  for (uint64_t c = 100; c < 20000; c += 25) {
    peaked(c, h);
    const bool w1 = policy_sample_wants(1, h, f, norm), w2 = policy_sample_wants(2, h, f, norm);
    EXPECT_FALSE(w1 && !w2) << c;
    only_level2 |= w2 && !w1;
  }
  EXPECT_TRUE(only_level2);
}

// log2_q16_fast's error, which the lane-context bound relies on
// (policy_ctx_promising): never above log2, at most kLog2FastError units
// of 2^-16 below it.
TEST(Policy, Log2FastErrsOneWayWithinItsBound) {
  std::mt19937_64 rng(3);
  double lo = 0, hi = -1e9;
  for (uint64_t i = 0; i < (1u << 21); ++i) {
    const uint64_t v = i < (1u << 20) ? i + 1 : (rng() >> (rng() % 63)) | 1u;
    const double e = (double)log2_q16_fast(v) - 65536.0 * std::log2((double)v);
    lo = std::min(lo, e), hi = std::max(hi, e);
  }
  EXPECT_GT(lo, -(double)kLog2FastError);
  EXPECT_LT(hi, 0.01);  // above log2 only by the double's rounding
}

TEST(Policy, ExactKindCountsEveryOverhead) {
  uint64_t h[256] = {}, norm[256];
  uint32_t freq[256];
  uint64_t coded = 0;
  EXPECT_EQ(policy_exact_kind(2, h, 0, 1, freq, norm, &coded), kKindRaw) << "empty histogram";
  std::mt19937 rng(1);
  std::normal_distribution<double> nd(120.0, 3.0);
  uint64_t n = 0;
  for (int i = 0; i < 20000; ++i, ++n) ++h[std::clamp((int)nd(rng), 0, 255)];
  ASSERT_EQ(policy_exact_kind(2, h, n, 1, freq, norm, &coded), kKindRans);
  uint32_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    sum += freq[s];
    EXPECT_EQ(freq[s] != 0, h[s] != 0) << s;
  }
  EXPECT_EQ(sum, kProbScale);
  uint8_t tbuf[kFreqTableMaxBytes];
  EXPECT_EQ(coded, coded_stream_bytes(h, freq, 1, rans_write_table(freq, tbuf)));
  // Every block adds its lane states: with enough blocks the same symbols do
  // not pay any more.
  const uint64_t per_block = kRansStateBytes + 2;
  const uint64_t blocks_to_raw = (n - coded) / per_block + 2;
  EXPECT_EQ(policy_exact_kind(2, h, n, blocks_to_raw, freq, norm, &coded), kKindRaw);
  EXPECT_EQ(policy_exact_kind(2, h, n, blocks_to_raw - 2, freq, norm, &coded), kKindRans);
  for (int s = 0; s < 256; ++s) h[s] = 1000;
  EXPECT_EQ(policy_exact_kind(2, h, 256000, 1, freq, norm, &coded), kKindRaw);
}

TEST(Policy, FastTablesKeepMinToMaxCodable) {
  uint64_t sample[256] = {}, counts[256], norm[256];
  uint32_t freq[256];
  for (int s = 10; s <= 20; ++s) sample[s] = (uint64_t)(s == 15 ? 3000 : 100);
  // Symbols 5..30 occur in the tensor (min/max) but not all in the sample.
  ASSERT_EQ(policy_fast_kind(1, sample, 5, 30, 1u << 20, 16, freq, counts, norm), kKindRans);
  uint32_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    sum += freq[s];
    EXPECT_EQ(freq[s] != 0, s >= 5 && s <= 30) << s;
  }
  EXPECT_EQ(sum, kProbScale);
  EXPECT_GT(freq[15], freq[12]);
  // A sample with no symbols has no estimate.
  uint64_t empty[256] = {};
  EXPECT_EQ(policy_fast_kind(1, empty, 0, 255, 100, 8, freq, counts, norm), kKindRaw);
  // Uniform symbols do not pay.
  for (int s = 0; s < 256; ++s) sample[s] = 64;
  EXPECT_EQ(policy_fast_kind(1, sample, 0, 255, 1u << 20, 16, freq, counts, norm), kKindRaw);
}

TEST(Policy, LaneContextGates) {
  EXPECT_TRUE(policy_tries_lane_contexts(3, 0, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(2, 0, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 1, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 0, kKindRaw, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 0, kKindRans, kCtxMinElems - 1));
  EXPECT_TRUE(policy_tries_lane_contexts(3, 0, kKindRansCtx, kCtxMinElems));  // after the window search
  for (int level : {1, 2, 3}) EXPECT_TRUE(policy_tries_window_contexts(level, kKindRans, kCtxMinBytesLevel1, 1, false));
  EXPECT_FALSE(policy_tries_window_contexts(-1, kKindRans, kCtxMinBytesLevel1, 1, false));
  EXPECT_FALSE(policy_tries_window_contexts(1, kKindRaw, kCtxMinBytesLevel1, 1, false));
  EXPECT_FALSE(policy_tries_window_contexts(2, kKindRans, kCtxMinElems - 1, 4, false));
  // Level 1: frames of kCtxMinBytesLevel1 bytes on; level 2 from kCtxMinElems elements.
  EXPECT_TRUE(policy_tries_window_contexts(1, kKindRans, kCtxMinBytesLevel1 / 4, 4, false));
  EXPECT_FALSE(policy_tries_window_contexts(1, kKindRans, kCtxMinBytesLevel1 / 4 - 1, 4, false));
  EXPECT_TRUE(policy_tries_window_contexts(2, kKindRans, kCtxMinElems, 1, false));
  // Level 1 not on fast tables; level 2 on them too.
  EXPECT_FALSE(policy_tries_window_contexts(1, kKindRans, kCtxMinBytesLevel1, 1, true));
  EXPECT_TRUE(policy_tries_window_contexts(2, kKindRans, kCtxMinBytesLevel1, 1, true));
  EXPECT_TRUE(lane_contexts_pay(994, 1000));
  EXPECT_FALSE(lane_contexts_pay(995, 1000));
}

// The table-section entries the encoders write are what parse_table_section
// reads back, and their sizes are known before writing.
TEST(Policy, StreamTableEntriesRoundTrip) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    uint64_t counts[256] = {};
    const int present = 1 + (int)(rng() % 256);
    for (int i = 0; i < present; ++i) counts[rng() % 256] += 1 + rng() % (trial % 2 ? 100000 : 50);
    uint32_t f[3][256];
    for (auto& t : f) ASSERT_GT(rans_normalize(counts, t), 0);
    uint8_t tbuf[kFreqTableMaxBytes];
    EXPECT_EQ(freq_table_size(f[0]), rans_write_table(f[0], tbuf));
    // F32-like frame: raw, rANS, rANS with 2 contexts (version 2), raw.
    FrameHeader h{};
    h.version = kFormatVersionCtx;
    h.dtype = kF32;
    h.n_streams = 4;
    const uint8_t kinds[4] = {kKindRaw, kKindRans, kKindRansCtx, kKindRaw};
    const RansCtx ctx2{(uint32_t)(rng() % 256), 2};
    Bytes sec;
    for (int k = 0; k < 4; ++k) {
      const RansCtx rc = kinds[k] == kKindRansCtx ? ctx2 : RansCtx{};
      const uint32_t* fr = kinds[k] == kKindRansCtx ? &f[1][0] : &f[0][0];
      const size_t at = sec.size(), sz = stream_table_size(kinds[k], fr, rc);
      sec.resize(at + sz + 8, 0xEE);
      EXPECT_EQ(write_stream_table(kinds[k], fr, rc, sec.data() + at), sz);
      EXPECT_EQ(sec[at + sz], 0xEE) << "wrote past its size";
      sec.resize(at + sz);
    }
    tzt::Bytes padded = sec;
    while (padded.size() % 4) padded.push_back(0);
    h.tables_size = (uint32_t)padded.size();
    FrameTables t{};
    ASSERT_EQ(parse_table_section(h, padded.data(), &t), kDefectNone);
    EXPECT_EQ(t.n_tables, 3u);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(t.kind[k], kinds[k]);
    EXPECT_EQ(t.ctx[2].base, ctx2.base);
    EXPECT_EQ(t.ctx[2].n, 2u);
    EXPECT_EQ(memcmp(t.freq[t.first_table[1]], f[0], sizeof f[0]), 0);
    EXPECT_EQ(memcmp(t.freq[t.first_table[2]], f[1], sizeof f[1]), 0);
    EXPECT_EQ(memcmp(t.freq[t.first_table[2] + 1], f[2], sizeof f[2]), 0);
  }
}

// policy_joint_symbols lists exactly the symbols present in some row, in
// order, and entropy_bits_q16_at over them equals entropy_bits_q16 (value
// and present count) for every row and for sums of rows, on sparse joint
// histograms, an empty one and a full one.
TEST(Policy, JointSymbolsAndEntropyOverThem) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<uint64_t> joint((size_t)kCtxJointRows * 256, 0);
    const int per_row = trial == 0 ? 0 : trial == 1 ? 256 : 1 + (int)(rng() % 30);
    for (uint32_t r = 0; r < kCtxJointRows; ++r)
      for (int j = 0; j < per_row; ++j)
        joint[(size_t)r * 256 + (trial == 1 ? (uint32_t)j : rng() % 256)] += 1 + rng() % (1u << (trial % 20));
    uint8_t syms[256];
    const uint32_t n = policy_joint_symbols(joint.data(), syms);
    std::vector<uint8_t> want;
    for (uint32_t s = 0; s < 256; ++s) {
      bool any = false;
      for (uint32_t r = 0; r < kCtxJointRows; ++r) any |= joint[(size_t)r * 256 + s] != 0;
      if (any) want.push_back((uint8_t)s);
    }
    ASSERT_EQ(std::vector<uint8_t>(syms, syms + n), want) << "trial " << trial;
    std::vector<uint64_t> sum(256, 0);
    for (uint32_t r = 0; r < kCtxJointRows; ++r) {
      const uint64_t* row = joint.data() + (size_t)r * 256;
      for (int s = 0; s < 256; ++s) sum[s] += row[s];
      for (const uint64_t* c : {row, (const uint64_t*)sum.data()}) {
        uint32_t p0 = 99, p1 = 98;
        EXPECT_TRUE(entropy_bits_q16_at(c, syms, n, &p1) == entropy_bits_q16(c, &p0)) << "trial " << trial;
        EXPECT_EQ(p0, p1);
      }
    }
  }
}

// policy_ctx_search takes the estimate of each run of joint rows once; the
// result must equal summing the estimate of policy_ctx_counts over the
// contexts of every candidate (the definition), best candidate and bits.
TEST(Policy, ContextSearchEqualsPerContextSums) {
  std::mt19937 rng(5);
  for (uint32_t lo : {0u, 1u, 5u, 100u, 244u}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<uint64_t> joint((size_t)kCtxJointRows * 256, 0);
      // Sparse, skewed rows: a few symbols per row, some rows empty.
      for (uint32_t r = 0; r < kCtxJointRows; ++r) {
        if (rng() % 5 == 0) continue;
        for (int j = 0; j < 6; ++j) joint[(size_t)r * 256 + (rng() % 24 + lo) % 256] += rng() % (1000 << (trial % 4));
      }
      uint64_t tmp[256];
      RansCtx best{};
      const unsigned __int128 bits = policy_ctx_search(joint.data(), lo, &best, tmp);
      unsigned __int128 ref_bits = ~(unsigned __int128)0;
      RansCtx ref{0, 1};
      for (uint32_t n = 2; n <= kMaxContexts; ++n)
        for (uint32_t base = lo > 0 ? lo - 1 : 0; base <= lo + kCtxWindowRows + 1 - n && base + n <= 256; ++base) {
          unsigned __int128 b = 0;
          for (uint32_t c = 0; c < n; ++c) {
            policy_ctx_counts(joint.data(), lo, base, n, c, tmp);
            uint32_t present = 0;
            b += entropy_bits_q16(tmp, &present);
            b += (unsigned __int128)(8 * policy_table_estimate(present)) << 16;
          }
          if (b < ref_bits) ref_bits = b, ref = RansCtx{base, n};
        }
      SCOPED_TRACE("lo " + std::to_string(lo) + " trial " + std::to_string(trial));
      EXPECT_EQ(best.base, ref.base);
      EXPECT_EQ(best.n, ref.n);
      EXPECT_TRUE(bits == ref_bits);
    }
  }
}

// Level 1 searches table sets only on streams one table already codes, and
// at most kMaxTableSetsLevel1 of them; higher levels every wanted stream.
TEST(Policy, SetSearchByLevel) {
  EXPECT_TRUE(policy_tries_sets(1, true));
  EXPECT_FALSE(policy_tries_sets(1, false));
  for (int level : {2, 3}) EXPECT_TRUE(policy_tries_sets(level, false)) << level;
  EXPECT_EQ(policy_max_sets(200, 1, 1), kMaxTableSetsLevel1);
  EXPECT_EQ(policy_max_sets(200, 1, 2), kMaxTableSets);
  EXPECT_EQ(policy_max_sets(200, 4, 1), std::min(kMaxTableSetsLevel1, kMaxFrameTablesV3 / 4));
  EXPECT_EQ(policy_max_sets(5, 1, 1), 5u);
  EXPECT_EQ(policy_max_sets(1, 1, 2), 1u);
}

// policy_ctx_promising skips the search where the rows' own entropies bound
// every candidate above the 0.5%: its answer is the search's on joints that
// do and do not pay (including near the threshold).
TEST(Policy, ContextBoundKeepsTheSearchAnswer) {
  std::mt19937 rng(11);
  int promising = 0, not_promising = 0, skipped = 0;
  for (uint32_t lo : {0u, 3u, 100u, 244u}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<uint64_t> joint((size_t)kCtxJointRows * 256, 0);
      // Rows share one distribution, shifted by up to `shift` symbols per
      // row: no shift, no gain from contexts; larger shifts gain more.
      const uint32_t shift = (uint32_t)(trial % 8);
      for (uint32_t r = 0; r < kCtxJointRows; ++r)
        for (int j = 0; j < 12; ++j)
          joint[(size_t)r * 256 + (lo + j + (r * shift) / 4) % 256] += (uint64_t)(1000 + 300 * j + rng() % (1 + 50 * (trial % 5)));
      uint64_t first[256] = {}, tmp[256];
      for (uint32_t r = 0; r < kCtxJointRows; ++r)
        for (int s = 0; s < 256; ++s) first[s] += joint[(size_t)r * 256 + s];
      RansCtx ref{};
      const unsigned __int128 ctx_bits = policy_ctx_search(joint.data(), lo, &ref, tmp);
      uint32_t present = 0;
      const unsigned __int128 plain =
          entropy_bits_q16(first, &present) + ((unsigned __int128)(8 * policy_table_estimate(present)) << 16);
      const bool want = ref.n >= 2 && ctx_bits * 1000 < plain * 995;
      unsigned __int128 bound = 0;
      for (uint32_t r = 0; r < kCtxJointRows; ++r) bound += entropy_bits_q16(joint.data() + (size_t)r * 256, nullptr);
      skipped += bound * 1000 >= plain * 995;
      RansCtx got{};
      SCOPED_TRACE("lo " + std::to_string(lo) + " trial " + std::to_string(trial));
      EXPECT_EQ(policy_ctx_promising(joint.data(), lo, first, &got, tmp), want);
      if (want) {
        EXPECT_TRUE(got.base == ref.base && got.n == ref.n);
      }
      (want ? promising : not_promising)++;
    }
  }
  EXPECT_GT(promising, 0);
  EXPECT_GT(not_promising, 0);
  EXPECT_GT(skipped, 0);  // the bound does decide some of them
}

// policy_one_table_bound never exceeds the estimate policy_set_tables
// gives one set of the same histograms (exact tables, and fast tables with
// their range's pseudo-counts), on per-block histograms of every stream of
// real tensors of every dtype, of random bytes, of constant and two-valued
// data, over 1 to 3 blocks; and it is close enough to rule streams out: on
// the random bytes of small tensors it already fails stream_pays at level 1.
TEST(Policy, OneTableBoundIsALowerBound) {
  std::mt19937 rng(17);
  int cases = 0, ruled_out = 0;
  for (const tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2}) {
    const uint8_t d = (uint8_t)dt;
    const uint32_t es = dtype_elem_size(d);
    for (const int data : {0, 1, 2, 3}) {  // real, random, constant, two values
      for (const uint32_t n : {200u, 1000u, 4096u, 9000u}) {
        Bytes src = data == 0 ? tzt::real_bytes(dt, (size_t)n * es) : Bytes((size_t)n * es, 0x3C);
        if (data == 1) for (auto& b : src) b = (uint8_t)rng();
        if (data == 3) for (size_t i = 0; i < src.size(); ++i) src[i] = (i / es) % 2 ? 0x41 : 0x3C;
        for (const uint32_t n_blocks : {1u, 2u, 3u}) {
          const uint32_t block_elems = (n + n_blocks - 1) / n_blocks;
          for (int k = 0; k < dtype_stream_count(d); ++k) {
            std::vector<uint32_t> hist((size_t)n_blocks * 256, 0);
            std::vector<uint64_t> counted(n_blocks, 0);
            std::vector<uint8_t> mm((size_t)n_blocks * kRangeBytes, 0);
            uint64_t total[256] = {}, all = 0;
            for (uint32_t b = 0; b < n_blocks; ++b) {
              policy_range_empty(&mm[kRangeBytes * b]);
              for (uint32_t i = b * block_elems; i < std::min(n, (b + 1) * block_elems); ++i) {
                const uint8_t x = field_byte(d, src.data(), i, k);
                ++hist[(size_t)b * 256 + x], ++total[x], ++counted[b], ++all;
                policy_range_add(&mm[kRangeBytes * b], x);
              }
            }
            for (const bool fast : {false, true}) {
              std::vector<uint32_t> freq(256);
              uint64_t coded = 0;
              TableScratch w;
              ASSERT_TRUE(policy_set_tables(hist.data(), 256, counted.data(), n_blocks, block_elems, n, nullptr, 1, fast,
                                            fast ? mm.data() : nullptr, kRangeBytes, freq.data(), &coded, &w));
              const uint64_t bound = policy_one_table_bound(total, all, n, n_blocks);
              EXPECT_LE(bound, coded) << "dtype " << dt << " data " << data << " n " << n << " blocks " << n_blocks
                                      << " stream " << k << (fast ? " fast" : "");
              EXPECT_GT(bound, (uint64_t)n_blocks * (kRansStateBytes + 2));  // more than the fixed terms
              ++cases;
              if (data == 1 && n <= 1000 && !stream_pays(1, bound, n)) ++ruled_out;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, (2 + 2 + 4 + 1 + 1) * 4 * 4 * 3 * 2);  // streams of BF16, F16, F32, E4M3, E5M2
  EXPECT_GT(ruled_out, 0);
}

// The short path (policy_size_can_pay) is exact: for every size it calls
// hopeless, the full policy on the tensor's exact histograms stores every
// stream raw, for real data (prefixes of real BF16 / FP32 / FP16 / FP8
// tensors), for constant data (one symbol per stream: the cheapest stream
// there is) and for two-valued data; and the bound is tight: at the first
// size it lets through, a constant tensor is coded.
TEST(Policy, TinyShortPathIsExact) {
  const tz_dtype dts[] = {TZ_DTYPE_BF16, TZ_DTYPE_F32, TZ_DTYPE_F16, TZ_DTYPE_F8_E4M3};
  for (const int level : {1, 2, 3}) {
    uint64_t first_pays = 0;
    for (uint64_t n = 1; n <= 400; ++n)
      if (policy_size_can_pay(level, n, 1)) {
        first_pays = n;
        break;
      }
    ASSERT_EQ(first_pays, level == 1 ? 140u : 139u) << "level " << level;
    for (const tz_dtype dt : dts) {
      const uint8_t d = (uint8_t)dt;
      const uint32_t es = dtype_elem_size(d);
      const int K = dtype_stream_count(d);
      const Bytes& real = tzt::real_data(dt);
      ASSERT_GE(real.size(), first_pays * es);
      for (uint64_t n = 1; n <= first_pays; ++n) {
        SCOPED_TRACE("level " + std::to_string(level) + " dtype " + std::to_string(d) + " n " + std::to_string(n));
        const bool short_path = !policy_codes_streams(level, d, n, 1);
        EXPECT_EQ(short_path, n < first_pays);
        Bytes constant(n * es, 0x3c), two(n * es);
        for (size_t i = 0; i < two.size(); ++i) two[i] = (i / es) % 2 ? 0x3c : 0x3d;
        const Bytes prefix(real.begin(), real.begin() + n * es);
        bool constant_coded = false;
        for (const Bytes* data : std::initializer_list<const Bytes*>{&prefix, &constant, &two}) {
          std::vector<Bytes> streams(K, Bytes(n));
          uint8_t* sp[kMaxStreams];
          for (int k = 0; k < K; ++k) sp[k] = streams[k].data();
          split_fields(d, data->data(), (uint32_t)n, sp);
          for (int k = 0; k < K; ++k) {
            // The version-3 decision of one block: one table's estimate
            // (policy_set_tables) against the raw size.
            uint32_t h[256] = {}, freq[256];
            for (uint8_t x : streams[k]) ++h[x];
            const uint64_t counted = n;
            uint64_t coded = 0;
            TableScratch ts;
            const bool pays = policy_set_tables(h, 256, &counted, 1, kDefaultBlockElems, n, nullptr, 1, false, nullptr,
                                                0, freq, &coded, &ts) &&
                              stream_pays(level, coded, n);
            if (short_path) {
              EXPECT_FALSE(pays) << "stream " << k << " would have paid";
            }
            if (data == &constant && pays) constant_coded = true;
          }
        }
        if (!short_path) {
          EXPECT_TRUE(constant_coded) << "the bound is not tight";
        }
      }
    }
  }
  // Two or more blocks (more than 4096 elements) can always pay.
  for (const int level : {1, 2, 3}) EXPECT_TRUE(policy_size_can_pay(level, 4097, 2));
}

}  // namespace
