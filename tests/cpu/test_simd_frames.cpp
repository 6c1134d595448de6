// Whole frames on every kernel set of the CPU backend: the frames of real and
// edge-case tensors are byte-identical on every path this build and CPU have
// (against the portable path), and corrupt frames give the same result on
// every path (the kernel-level comparisons are in test_simd.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cpu/simd_path.h"
#include "simd_paths.h"
#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace {

using Bytes = std::vector<uint8_t>;

// ------------------------------------------------- whole frames per path --

struct FrameCase {
  std::string name;
  tz_dtype dt;
  Bytes data;
};

std::vector<FrameCase> frame_cases() {
  std::vector<FrameCase> cs;
  const Bytes bf16 = tzt::concat(tzt::bf16_slice());
  const Bytes f32 = tzt::concat(tzt::fp32_slice());
  const std::vector<float> fv = tzt::as_floats_f32(f32);
  const std::vector<float> small(fv.begin(), fv.begin() + std::min<size_t>(fv.size(), 300000));
  cs.push_back({"bf16 slice", TZ_DTYPE_BF16, bf16});
  cs.push_back({"fp32 slice", TZ_DTYPE_F32, Bytes(f32.begin(), f32.begin() + std::min<size_t>(f32.size(), 1200000))});
  cs.push_back({"f16 cast", TZ_DTYPE_F16, tzt::to_f16(small)});
  cs.push_back({"e4m3 cast", TZ_DTYPE_F8_E4M3, tzt::to_f8_e4m3(small)});
  cs.push_back({"e5m2 cast", TZ_DTYPE_F8_E5M2, tzt::to_f8_e5m2(small)});
  cs.push_back({"bf16 odd size", TZ_DTYPE_BF16, Bytes(bf16.begin(), bf16.begin() + 2 * 70001 + 1)});
  cs.push_back({"bf16 block+1", TZ_DTYPE_BF16, Bytes(bf16.begin(), bf16.begin() + 2 * (65536 + 1))});
  cs.push_back({"bf16 33 elements", TZ_DTYPE_BF16, Bytes(bf16.begin(), bf16.begin() + 66)});
  cs.push_back({"f32 one element", TZ_DTYPE_F32, Bytes(f32.begin(), f32.begin() + 4)});
  cs.push_back({"random bf16", TZ_DTYPE_BF16, tzt::hash_stream(2 * 100000, 5)});
  cs.push_back({"zeros f32", TZ_DTYPE_F32, Bytes(4 * 90000, 0)});
  cs.push_back({"bytes", TZ_DTYPE_BYTES, Bytes(bf16.begin(), bf16.begin() + 300001)});
  return cs;
}

Bytes compress_frame(const FrameCase& c, int level, unsigned block_elems) {
  tz_params p{};
  p.dtype = c.dt;
  p.level = level;
  p.block_elems = block_elems;
  p.threads = 1;
  Bytes out(tz_compress_bound(c.data.size()));
  const size_t r = tz_compress(out.data(), out.size(), c.data.data(), c.data.size(), &p);
  EXPECT_FALSE(tz_is_error(r)) << c.name << ": " << tz_last_error_detail();
  out.resize(tz_is_error(r) ? 0 : r);
  return out;
}

TEST(Simd, FramesAreIdenticalOnEveryPath) {
  // The same frame bytes from every path at every level and two block
  // sizes, and every path decodes every frame.
  const auto paths = tz::test::paths_to_test(tz::test::current_test_name());
  if (paths.size() < 2) GTEST_SKIP() << "only the portable path runs here: nothing to compare";
  for (const FrameCase& c : frame_cases())
    for (int level = -1; level <= 3; ++level)
      for (unsigned be : {0u, 4096u}) {
        Bytes want;
        {
          tz::cpu::ScopedSimdPath sp(tz::cpu::SimdPath::kPortable);
          want = compress_frame(c, level, be);
        }
        for (auto path : paths) {
          tz::cpu::ScopedSimdPath sp(path);
          const std::string tag =
              c.name + " level " + std::to_string(level) + " block " + std::to_string(be) + " " + tz_simd_path();
          ASSERT_STREQ(tz_simd_path(), tz::cpu::simd_path_name(path));
          ASSERT_EQ(compress_frame(c, level, be), want) << tag;
          Bytes back(c.data.size() + 1);
          const size_t r = tz_decompress(back.data(), back.size(), want.data(), want.size(), 1);
          ASSERT_FALSE(tz_is_error(r)) << tag << ": " << tz_last_error_detail();
          back.resize(r);
          ASSERT_EQ(back, c.data) << tag;
        }
      }
}

TEST(Simd, CorruptFramesGiveTheSameResultOnEveryPath) {
  // Damaged block bytes (the header CRC covers the prefix, so the damage
  // reaches the block decoders): every path reports the same error, the
  // same message (naming the same block) and the same first bad block.
  const auto paths = tz::test::paths_to_test(tz::test::current_test_name());
  if (paths.size() < 2) GTEST_SKIP() << "only the portable path runs here: nothing to compare";
  std::mt19937 rng(7);
  const auto cases = frame_cases();
  for (size_t ci : {0u, 1u, 2u, 3u, 5u}) {
    FrameCase c = cases[ci];
    c.data.resize(std::min<size_t>(c.data.size(), 300000) / 4 * 4 + (c.data.size() % 2));  // keeps odd sizes odd
    for (int level : {1, 3}) {
      const Bytes good = compress_frame(c, level, 4096);
      const size_t prefix = tz_frame_prefix_size(good.data(), good.size());
      ASSERT_FALSE(tz_is_error(prefix));
      for (int trial = 0; trial < 40; ++trial) {
        Bytes bad = good;
        const int flips = 1 + trial % 3;
        for (int f = 0; f < flips; ++f) bad[prefix + rng() % (bad.size() - prefix)] ^= (uint8_t)(1u << (rng() % 8));
        size_t want_r = 0;
        unsigned want_block = 0;
        std::string want_msg;
        Bytes want_out;
        for (auto path : paths) {
          tz::cpu::ScopedSimdPath sp(path);
          Bytes out(c.data.size());
          const size_t r = tz_decompress(out.data(), out.size(), bad.data(), bad.size(), 1);
          const std::string msg = tz_is_error(r) ? tz_last_error_detail() : "";
          unsigned block = 0;
          tz_verify(bad.data(), bad.size(), 1, &block);
          if (path == tz::cpu::SimdPath::kPortable) {
            want_r = r, want_block = block, want_msg = msg, want_out = out;
            continue;
          }
          const std::string tag = c.name + " level " + std::to_string(level) + " trial " + std::to_string(trial) +
                                  " " + tz_simd_path();
          ASSERT_EQ(r, want_r) << tag;
          ASSERT_EQ(msg, want_msg) << tag;
          ASSERT_EQ(block, want_block) << tag;
          if (!tz_is_error(r)) {
            ASSERT_EQ(out, want_out) << tag;
          }
        }
      }
    }
  }
}

}  // namespace
