// Raw runs (codec/policy_raw_runs.h; doc/format.md 9): a stream's
// table sets whose estimate does not pay are stored raw without being coded,
// so a stream may be coded in a few blocks of a frame only. The screening
// rule (policy_block_pays_alone) and the run rule against hand-made
// histograms; real FP32 values with some blocks at FP16 precision (an
// embedding's untouched rows) coded in those blocks alone at every level,
// with the same bytes on every SIMD path, decoding, and smaller than the
// frame of the same values at full precision by what those blocks' low bytes
// held. The emulated CUDA encoder writes the same frames
// (tests/cuda/emu/test_cuda_emu_encode.cpp, CudaEmu.RawRunsFp16Blocks).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/frame_prefix.h"
#include "codec/policy_raw_runs.h"
#include "cpu/simd_path.h"
#include "tz_every_path.h"
#include "tz_frame_edit.h"
#include "tz_test_util.h"

namespace {

using tzt::Bytes;
constexpr int kF32Streams = 4;

// Block b's mode of stream k, for every block of a frame.
std::vector<std::vector<uint8_t>> block_modes(const Bytes& frame) {
  std::vector<std::vector<uint8_t>> modes;
  for (const tzt::ParsedBlock& pb : tzt::frame_blocks(frame)) modes.emplace_back(pb.v.mode, pb.v.mode + kF32Streams);
  return modes;
}

TEST(RawRuns, BlockPaysAloneAtAQuarterOfItsBytes) {
  uint32_t h[256] = {};
  for (int s = 0; s < 256; ++s) h[s] = 16;  // every symbol: never
  EXPECT_FALSE(tz::policy_block_pays_alone(h));
  h[7] = 0;  // 255 symbols, near-uniform: 7.99 bits
  EXPECT_FALSE(tz::policy_block_pays_alone(h));
  uint32_t g[256] = {};
  for (int s = 0; s < 64; ++s) g[s * 4] = 64;  // 64 equal symbols: 6 bits, exactly 75 % of 8
  EXPECT_TRUE(tz::policy_block_pays_alone(g));
  g[1] = 64;  // 65: log2 65 > 6
  EXPECT_FALSE(tz::policy_block_pays_alone(g));
  uint32_t one[256] = {};
  one[0] = 4096;  // a constant stream
  EXPECT_TRUE(tz::policy_block_pays_alone(one));
  const uint32_t none[256] = {};
  EXPECT_FALSE(tz::policy_block_pays_alone(none));
}

// Four blocks of 4096 elements: 0-1 near-uniform, 2-3 of 8 symbols, in two
// runs. At level 1 for a stream one table does not code, the uniform run is
// raw and the other is renumbered to set 0 with its table moved down; the
// estimate is the raw run's bytes plus the coded run's.
TEST(RawRuns, RunsThatDoNotPayAreRawAndTheRestRenumbered) {
  constexpr uint32_t kB = 4, kE = 4096;
  std::vector<uint32_t> hist(kB * 256, 0);
  for (uint32_t b = 0; b < 2; ++b)
    for (int s = 0; s < 256; ++s) hist[b * 256 + s] = 16;
  for (uint32_t b = 2; b < 4; ++b)
    for (int s = 0; s < 8; ++s) hist[b * 256 + 32 * s] = 512;
  const uint64_t counted[kB] = {kE, kE, kE, kE};
  uint8_t set_of[kB] = {0, 0, 1, 1};
  std::vector<uint32_t> freq(2 * 256);
  uint64_t coded2 = 0;
  tz::TableScratch ts;
  ASSERT_TRUE(tz::policy_set_tables(hist.data(), 256, counted, kB, kE, kB * kE, set_of, 2, false, nullptr, 0,
                                    freq.data(), &coded2, &ts));
  const std::vector<uint32_t> table1(freq.begin() + 256, freq.end());
  uint64_t coded = 0;
  const uint32_t kept =
      tz::policy_raw_runs(1, true, hist.data(), 256, counted, kB, kE, kB * kE, set_of, 2, freq.data(), &coded, &ts);
  EXPECT_EQ(kept, 1u);
  EXPECT_EQ(set_of[0], tz::kSetRaw);
  EXPECT_EQ(set_of[1], tz::kSetRaw);
  EXPECT_EQ(set_of[2], 0u);
  EXPECT_EQ(set_of[3], 0u);
  EXPECT_TRUE(std::equal(table1.begin(), table1.end(), freq.begin()));
  uint64_t run[256] = {};
  for (int s = 0; s < 256; ++s) run[s] = hist[2 * 256 + s] + hist[3 * 256 + s];
  const uint64_t expect = 2 * kE + tz::policy_run_coded(run, freq.data(), 2 * kE, 2 * kE, 2) +
                          tz::stream_table_size_v3(tz::kKindRans, freq.data(), tz::RansCtx{}, 1);
  EXPECT_EQ(coded, expect);
  EXPECT_LT(coded, kB * kE);
  // Both runs paying: nothing changes.
  uint8_t both[kB] = {0, 0, 1, 1};
  for (uint32_t b = 0; b < 2; ++b)
    for (int s = 0; s < 256; ++s) hist[b * 256 + s] = s < 16 ? 256 : 0;
  ASSERT_TRUE(tz::policy_set_tables(hist.data(), 256, counted, kB, kE, kB * kE, both, 2, false, nullptr, 0, freq.data(),
                                    &coded2, &ts));
  EXPECT_EQ(tz::policy_raw_runs(1, true, hist.data(), 256, counted, kB, kE, kB * kE, both, 2, freq.data(), &coded, &ts),
            2u);
  EXPECT_EQ(coded, coded2);
  EXPECT_EQ(both[1], 0u);
  EXPECT_EQ(both[2], 1u);
}

// Sets over one table: where one table pays, only if the sets beat it
// (policy_sets_pay); where it does not, whenever the kept runs beat raw.
TEST(RawRuns, SetsAreUsedWhereTheyBeatOneTableOrRaw) {
  EXPECT_FALSE(tz::policy_use_sets(1, false, true, 0, 10, 100, 1000));    // no run kept
  EXPECT_TRUE(tz::policy_use_sets(1, false, true, 2, 99, 100, 1000));     // beats one table
  EXPECT_FALSE(tz::policy_use_sets(1, false, true, 2, 100, 100, 1000));   // ties it
  EXPECT_FALSE(tz::policy_use_sets(1, true, true, 2, 996, 1000, 10000));  // fast tables: 0.5 % margin
  EXPECT_TRUE(tz::policy_use_sets(1, false, false, 1, 999, ~0ull, 1000));  // sets alone: below raw
  EXPECT_FALSE(tz::policy_use_sets(1, false, false, 1, 1000, ~0ull, 1000));
}

// Real FP32 values in blocks of 8192 (sampled; fast tables at level 1),
// some blocks at FP16 precision: streams 2 and 3 are coded in those blocks
// and stored raw in every other, at every level and on every SIMD path.
// With 3 of 24 such blocks the whole tensor's sample wants both streams;
// with 1 of 20 it does not want stream 2, which the per-block screening
// (policy_block_pays_alone) brings in.
struct Fp16Layout {
  uint32_t n_blocks, b0, b1;
};
constexpr Fp16Layout kFp16Layouts[] = {{24, 5, 8}, {20, 13, 14}};

TEST(RawRuns, Fp16BlocksOfAnFp32TensorAreCodedAlone) {
  constexpr uint32_t kE = 8192;
  for (const Fp16Layout& lay : kFp16Layouts) {
    const Bytes src = tzt::f32_with_fp16_blocks(kE, lay.n_blocks, lay.b0, lay.b1);
    const Bytes full = tzt::f32_with_fp16_blocks(kE, lay.n_blocks, 0, 0);
    ASSERT_NE(src, full);
    for (int level = 1; level <= 3; ++level) {
      SCOPED_TRACE("level " + std::to_string(level) + ", " + std::to_string(lay.n_blocks) + " blocks");
      const Bytes f = tzt::compress_every_path(src, TZ_DTYPE_F32, level, kE);
      ASSERT_FALSE(f.empty());
      const std::vector<std::vector<uint8_t>> modes = block_modes(f);
      ASSERT_EQ(modes.size(), lay.n_blocks);
      for (uint32_t b = 0; b < lay.n_blocks; ++b) {
        const bool fp16 = b >= lay.b0 && b < lay.b1;
        EXPECT_EQ(modes[b][0], tz::kModeRans) << "block " << b;
        EXPECT_EQ(modes[b][2], fp16 ? tz::kModeRans : tz::kModeRaw) << "block " << b;
        EXPECT_EQ(modes[b][3], fp16 ? tz::kModeRans : tz::kModeRaw) << "block " << b;
      }
      // The FP16 blocks' streams 2 and 3 hold 3 bits of 16 per element: the
      // frame is smaller than the full-precision values' by well over one of
      // their two bytes per element.
      const Bytes ff = tzt::compress(full, TZ_DTYPE_F32, level, kE);
      ASSERT_FALSE(ff.empty());
      EXPECT_LT(f.size() + (lay.b1 - lay.b0) * kE, ff.size()) << f.size() << " vs " << ff.size();
    }
  }
}

// A tensor without such blocks: streams 2 and 3 stay raw in every block.
TEST(RawRuns, NearUniformLowBytesStayRawEverywhere) {
  const Bytes src = tzt::f32_with_fp16_blocks(8192, 24, 0, 0);
  for (int level = 1; level <= 3; ++level) {
    const Bytes f = tzt::compress(src, TZ_DTYPE_F32, level, 8192);
    ASSERT_FALSE(f.empty());
    for (const std::vector<uint8_t>& m : block_modes(f)) {
      EXPECT_EQ(m[2], tz::kModeRaw) << "level " << level;
      EXPECT_EQ(m[3], tz::kModeRaw) << "level " << level;
    }
  }
}

}  // namespace
