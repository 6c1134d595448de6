// The CUDA backend's batch encoder under the CPU emulation (cuda_emu.h):
// frames of every dtype, level, table policy and size equal the CPU
// encoder's byte for byte and decode on both sides (cuda_emu_batch.h,
// roundtrip_batch), raw runs included, and so do the one-tensor calls. Inputs are small: the
// emulation runs one OS thread per CUDA thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu_batch.h"
#include "tz_frame_edit.h"

namespace {

using namespace tz_cuda_emu_test;

TEST(CudaEmu, SmallBlocksEveryDtypeAndLevel) {
  uint32_t seed = 1;
  for (int level : {-1, 1, 2}) {
    std::vector<std::pair<tz_dtype, Bytes>> batch;
    for (tz_dtype dt : kFloatTypes)
      for (size_t n : {0, 1, 33, 129, 4096, 9001})
        batch.push_back({dt, make_tensor(dt, n, seed++)});
    tz_params p{};
    p.level = level;
    p.block_elems = 4096;
    SCOPED_TRACE("level " + std::to_string(level));
    size_t seeded = 0;
    roundtrip_batch(batch, p, &seeded);
    if (level > 0) {
      EXPECT_GT(seeded, 0u) << "seeded lane states coded and decoded by the emulated GPU";
    }
  }
}

// Sampled table policies: block_elems > 4096 with >= 8 blocks takes the
// fast-table path at level 1 and the exact second pass at level 2.
TEST(CudaEmu, SampledTablePolicies) {
  const Bytes real = tzt::concat(tzt::bf16_slice());
  std::vector<std::pair<tz_dtype, Bytes>> batch = {
      {TZ_DTYPE_BF16, tzt::tile(real, 2 * 8192 * 9 + 100)},
      {TZ_DTYPE_F32, make_tensor(TZ_DTYPE_F32, 8192 * 8, 7)},
      {TZ_DTYPE_F16, make_tensor(TZ_DTYPE_F16, 8192 * 8 + 1, 8)},
      {TZ_DTYPE_F8_E4M3, make_tensor(TZ_DTYPE_F8_E4M3, 8192 * 9, 9)},
      {TZ_DTYPE_F32, make_tensor(TZ_DTYPE_F32, 8192 * 3, 10)},  // < 8 blocks: exact pass at level 1 too
  };
  for (int level : {1, 2}) {
    tz_params p{};
    p.level = level;
    p.block_elems = 8192;
    SCOPED_TRACE("level " + std::to_string(level));
    roundtrip_batch(batch, p);
  }
}

// Level 1's fast tables with their ranges (four extremes per block and
// stream) on every float dtype, blocks of 16384, the last block of each
// tensor short; FP16 / FP8 carry the sign in stream 0.
TEST(CudaEmu, FastTablesRanges) {
  const Bytes real = tzt::concat(tzt::bf16_slice());
  std::vector<std::pair<tz_dtype, Bytes>> batch = {
      {TZ_DTYPE_BF16, tzt::tile(real, 2 * (16384 * 8 + 6000))},
      {TZ_DTYPE_F32, make_tensor(TZ_DTYPE_F32, 16384 * 8 + 5000, 11)},
      {TZ_DTYPE_F16, make_tensor(TZ_DTYPE_F16, 16384 * 9 + 1000, 12)},
      {TZ_DTYPE_F8_E4M3, make_tensor(TZ_DTYPE_F8_E4M3, 16384 * 8 + 9000, 13)},
      {TZ_DTYPE_F8_E5M2, make_tensor(TZ_DTYPE_F8_E5M2, 16384 * 10, 14)},
  };
  tz_params p{};
  p.level = 1;
  p.block_elems = 16384;
  roundtrip_batch(batch, p);
}

// Raw runs (codec/policy.h, policy_raw_runs): FP32 values with some blocks
// at FP16 precision, whose streams 2 and 3 the encoders code in those blocks
// alone; sampled with fast tables (12 and 20 blocks of 8192; in the second,
// one block of 20 is FP16, so the tensor's sample does not want stream 2 and
// policy_block_pays_alone brings it in), sampled with exact tables (level 2)
// and unsampled (blocks of 4096).
TEST(CudaEmu, RawRunsFp16Blocks) {
  const std::vector<std::pair<tz_dtype, Bytes>> sampled = {{TZ_DTYPE_F32, tzt::f32_with_fp16_blocks(8192, 12, 3, 6)},
                                                           {TZ_DTYPE_F32, tzt::f32_with_fp16_blocks(8192, 20, 13, 14)}};
  const std::vector<std::pair<tz_dtype, Bytes>> small = {{TZ_DTYPE_F32, tzt::f32_with_fp16_blocks(4096, 4, 1, 2)}};
  for (int level : {1, 2}) {
    SCOPED_TRACE("level " + std::to_string(level));
    tz_params p{};
    p.level = level;
    p.block_elems = 8192;
    roundtrip_batch(sampled, p);
    p.block_elems = 4096;
    roundtrip_batch(small, p);
  }
}

// Zero elision (doc/format.md 5.10): FP32 with +0.0 rows, -0.0 rows and
// subnormals among them, BF16 pruned 2:4, FP16 with zero rows. The emulated
// GPU encoder elides the same streams of the same blocks (the same frames as
// the CPU's), and its decoder rebuilds them; an elided payload one word
// short is a corrupt block there too.
TEST(CudaEmu, ZeroElision) {
  constexpr unsigned kE = 4096;
  Bytes sub = tzt::f32_with_zero_rows(3 * kE, 256, 5);
  const uint32_t denorm = 0x00012301u;
  std::memcpy(&sub[0], &denorm, 4);
  const std::vector<std::pair<tz_dtype, Bytes>> batch = {
      {TZ_DTYPE_F32, tzt::f32_with_zero_rows(3 * kE, 256, 5)},
      {TZ_DTYPE_F32, tzt::f32_with_zero_rows(4 * kE, 256, 32)},  // the seed stream elided (blocks 0, 2)
      {TZ_DTYPE_F32, tzt::f32_with_zero_rows(2 * kE, 256, 3, true)},
      {TZ_DTYPE_F32, sub},
      {TZ_DTYPE_BF16, tzt::bf16_pruned_2of4(3 * kE)},
      {TZ_DTYPE_F16, tzt::to_f16(tzt::as_floats_f32(tzt::f32_with_zero_rows(2 * kE, 256, 3)))}};
  for (int level : {1, 2}) {
    SCOPED_TRACE("level " + std::to_string(level));
    tz_params p{};
    p.level = level;
    p.block_elems = kE;
    size_t elided = 0, seed_elided = 0;
    for (const auto& [dt, data] : batch) {
      tz_params cp = p;
      cp.dtype = dt;
      const Bytes f = cpu_compress(data, cp);
      elided += f.size() >= 32 && (f[7] & tz::kFlagZeroElided);
      for (const tzt::ParsedBlock& pb : tzt::frame_blocks(f))
        seed_elided += pb.v.seed_stream > 0 && ((pb.v.elided >> pb.v.seed_stream) & 1u);
    }
    EXPECT_EQ(elided, batch.size());
    EXPECT_GT(seed_elided, 0u);
    roundtrip_batch(batch, p);
  }
  tz_params cp{};
  cp.dtype = TZ_DTYPE_F32;
  cp.block_elems = kE;
  const Bytes& src = batch[0].second;
  const Bytes f = cpu_compress(src, cp);
  tzt::FrameParts fp(f);
  const uint32_t w = fp.word(1, 3);
  ASSERT_EQ(tz::stream_word_mode(w), tz::kModeRawElided);
  const uint32_t size = tz::stream_word_v3_size(w);
  ASSERT_EQ(size % 4, 0u);
  const size_t at = tzt::payload_offset(fp, 1, 3, 4) + size - 4;
  fp.blocks[1].erase(fp.blocks[1].begin() + (long)at, fp.blocks[1].begin() + (long)at + 4);
  fp.set_word(1, 3, tz::stream_word_v3(size - 4, tz::kModeRawElided, 0));
  const Bytes bad = fp.bytes();
  Buf in(bad.size()), out(src.size());
  in.put(bad);
  const Result r = emu_decompress({{in.p(), bad.size(), out.p(), src.size()}});
  EXPECT_EQ(r.status[0], TZ_ERROR_CORRUPT_BLOCK);
}

// More items than one descriptor upload carries (60 / 64 per launch), with
// empty items between, so chunk-to-item lookup skips items without blocks.
TEST(CudaEmu, ManySmallItems) {
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  std::mt19937 rng(3);
  for (int i = 0; i < 140; ++i) {
    const tz_dtype dt = kFloatTypes[i % 5];
    const size_t n = i % 3 == 0 ? 0 : rng() % 6000;
    batch.push_back({dt, make_tensor(dt, n, 1000 + i)});
  }
  tz_params p{};
  p.block_elems = 4096;
  roundtrip_batch(batch, p);
}

// Tiny tensors on both sides of the policy's short path (policy_size_can_pay:
// at level 1 up to 139 elements, at level 2 up to 138, every stream raw
// without a histogram): the emulated GPU encoder takes the same decision as
// the CPU's, byte for byte. Constant tensors code from the threshold on, so
// the frames just above it carry frequency tables.
TEST(CudaEmu, TinyFramesShortPath) {
  for (int level : {1, 2}) {
    std::vector<std::pair<tz_dtype, Bytes>> batch;
    uint32_t seed = 50;
    for (tz_dtype dt : kFloatTypes)
      for (size_t n : {1, 100, 138, 139, 140, 168, 240}) {
        batch.push_back({dt, make_tensor(dt, n, seed++)});
        batch.push_back({dt, float_bytes(dt, std::vector<float>(n, 0.0f))});
      }
    SCOPED_TRACE("level " + std::to_string(level));
    tz_params p{};
    p.level = level;
    roundtrip_batch(batch, p);
    // The constant tensors above the threshold are coded (a table), those
    // below are not: the batch covers both decisions.
    size_t coded = 0, raw = 0;
    for (auto& [dt, data] : batch) {
      if (data.empty() || std::any_of(data.begin(), data.end(), [](uint8_t b) { return b != 0; })) continue;
      tz_params cp = p;
      cp.dtype = dt;
      const Bytes f = cpu_compress(data, cp);
      tz_frame_info info{};
      ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info)));
      bool any = false;
      for (unsigned k = 0; k < info.n_streams; ++k) any |= info.stream_kind[k] != 0;
      const size_t n = data.size() / float_bytes(dt, {0.0f}).size();
      EXPECT_EQ(any, n >= (level == 1 ? 140u : 139u)) << "dtype " << dt << " n " << n;
      (any ? coded : raw) += 1;
    }
    EXPECT_GT(coded, 0u);
    EXPECT_GT(raw, 0u);
  }
}

TEST(CudaEmu, DefaultBlockSize) {
  std::vector<std::pair<tz_dtype, Bytes>> batch = {{TZ_DTYPE_BF16, make_tensor(TZ_DTYPE_BF16, 70000, 5)},
                                                   {TZ_DTYPE_F32, make_tensor(TZ_DTYPE_F32, 66000, 6)}};
  roundtrip_batch(batch, tz_params{});
}

TEST(CudaEmu, SpecialValuesZerosAndNoise) {
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-45f, 3.4e38f, 1.0f};
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  for (tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3}) {
    std::vector<float> v(5000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = specials[(i * 7 + i / 3) % 10];
    const Bytes b = float_bytes(dt, v);
    batch.push_back({dt, b});
    batch.push_back({dt, Bytes(b.size(), 0)});
    batch.push_back({dt, tzt::hash_stream(b.size(), (uint64_t)dt)});
  }
  tz_params p{};
  p.block_elems = 4096;
  roundtrip_batch(batch, p);
  p.level = 3;
  cpu_frames_decode(batch, p);
}

TEST(CudaEmu, FixtureSliceTensors) {
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  size_t total = 0;
  for (const auto* slice : {&tzt::bf16_slice(), &tzt::fp32_slice()})
    for (const auto& t : *slice) {
      if (total > 600000) break;
      batch.push_back({t.dtype == "BF16" ? TZ_DTYPE_BF16 : TZ_DTYPE_F32, t.data});
      total += t.data.size();
    }
  ASSERT_GE(batch.size(), 2u);
  tz_params p{};
  p.block_elems = 16384;
  roundtrip_batch(batch, p);
}


TEST(CudaEmu, ConvenienceCalls) {
  const Bytes data = make_tensor(TZ_DTYPE_F16, 6000, 77);
  Buf s(data.size()), f(tz_compress_bound(data.size())), o(data.size());
  s.put(data);
  tz_params p{};
  p.dtype = TZ_DTYPE_F16;
  p.block_elems = 4096;
  const size_t fs = tz_cuda_compress_tensor(f.p(), tz_compress_bound(data.size()), s.p(), data.size(), &p, nullptr);
  ASSERT_FALSE(tz_is_error(fs)) << tz_get_error_name(fs);
  EXPECT_TRUE(f.get(fs) == cpu_compress(data, p));
  EXPECT_EQ(tz_cuda_decompress_tensor(o.p(), data.size(), f.p(), fs, nullptr), data.size());
  EXPECT_TRUE(o.get(data.size()) == data);
  EXPECT_TRUE(tz_is_error(tz_cuda_decompress_tensor(o.p(), data.size(), f.p(), fs - 4, nullptr)));
}

}  // namespace
