// Runs the CUDA backend's kernels under the CPU emulation (cuda_emu.h) on
// every machine: frames must equal the CPU encoder's byte for byte, decode
// on both sides, and corrupt frames must give per-item errors without
// writes outside the item's buffer. Inputs are small: the emulation runs one
// OS thread per CUDA thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/predict.h"
#include "common/crc32c.h"
#include "tensorzip/tensorzip.h"
#include "tensorzip/tensorzip_cuda.h"
#include "cuda_test_common.h"  // tests/cuda (shared with test_cuda_gpu.cpp)
#include "tz_malformed_frames.h"
#include "tz_test_data.h"

namespace {

using namespace tz_cuda_test;

// "Device" buffer in host memory, 256-aligned, with canaries on both sides.
struct Buf {
  static constexpr size_t kGuard = 256;
  uint8_t* base;
  size_t size;
  explicit Buf(size_t n) : size(n) {
    base = (uint8_t*)std::aligned_alloc(256, (n + 2 * kGuard + 255) / 256 * 256);
    memset(base, 0xA5, n + 2 * kGuard);
  }
  ~Buf() { std::free(base); }
  Buf(const Buf&) = delete;
  uint8_t* p() const { return base + kGuard; }
  Bytes get(size_t n) const { return Bytes(p(), p() + n); }
  void put(const Bytes& b) const {
    if (!b.empty()) memcpy(p(), b.data(), b.size());
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (base[i] != 0xA5 || base[kGuard + size + i] != 0xA5) return false;
    return true;
  }
};

Result emu_compress(const std::vector<tz_cuda_compress_item>& items, const tz_params& p) {
  const size_t n = items.size();
  const size_t tb = tz_cuda_compress_temp_size(items.data(), n, &p);
  EXPECT_FALSE(tz_is_error(tb));
  Buf temp(tb);
  Result r{std::vector<size_t>(n, 12345), std::vector<int>(n, -1)};
  EXPECT_EQ(tz_cuda_compress(items.data(), n, &p, temp.p(), tb, r.size.data(),
                             r.status.data(), nullptr),
            0u);
  EXPECT_TRUE(temp.guards_intact()) << "write outside temp";
  return r;
}

Result emu_decompress(const std::vector<tz_cuda_decompress_item>& items) {
  const size_t n = items.size();
  const size_t tb = tz_cuda_decompress_temp_size(items.data(), n);
  EXPECT_FALSE(tz_is_error(tb));
  Buf temp(tb);
  Result r{std::vector<size_t>(n, 12345), std::vector<int>(n, -1)};
  EXPECT_EQ(tz_cuda_decompress(items.data(), n, temp.p(), tb, r.size.data(), r.status.data(), nullptr), 0u);
  EXPECT_TRUE(temp.guards_intact()) << "write outside temp";
  return r;
}

// *seeded (if given) counts the frames with seeded lane states (doc/format.md 5.8).
void roundtrip_batch(const std::vector<std::pair<tz_dtype, Bytes>>& tensors, const tz_params& p,
                     size_t* seeded = nullptr) {
  const size_t n = tensors.size();
  std::vector<std::unique_ptr<Buf>> src, dst, back, cpuf, back2;
  std::vector<tz_cuda_compress_item> items;
  for (auto& [dt, data] : tensors) {
    src.push_back(std::make_unique<Buf>(data.size()));
    src.back()->put(data);
    const size_t cap = tz_compress_bound(data.size());
    dst.push_back(std::make_unique<Buf>(cap));
    items.push_back({src.back()->p(), data.size(), dt, dst.back()->p(), cap});
  }
  const Result c = emu_compress(items, p);
  std::vector<tz_cuda_decompress_item> d1, d2;
  for (size_t i = 0; i < n; ++i) {
    const auto& [dt, data] = tensors[i];
    SCOPED_TRACE("item " + std::to_string(i) + " dtype " + std::to_string(dt) + " bytes " +
                 std::to_string(data.size()));
    ASSERT_EQ(c.status[i], TZ_OK);
    ASSERT_TRUE(dst[i]->guards_intact());
    ASSERT_TRUE(src[i]->guards_intact());
    tz_params cp = p;
    cp.dtype = dt;
    const Bytes cpu = cpu_compress(data, cp);
    const Bytes g = dst[i]->get(c.size[i]);
    ASSERT_EQ(g.size(), cpu.size());
    ASSERT_TRUE(g == cpu) << "emulated GPU frame differs from the CPU frame";
    if (seeded && g.size() >= 32 && (g[7] & tz::kFlagSeededLanes)) ++*seeded;
    Bytes dec(data.size() + 1);
    ASSERT_EQ(tz_decompress(dec.data(), dec.size(), g.data(), g.size(), 1), data.size());
    back.push_back(std::make_unique<Buf>(data.size()));
    d1.push_back({dst[i]->p(), c.size[i], back.back()->p(), data.size()});
    cpuf.push_back(std::make_unique<Buf>(cpu.size()));
    cpuf.back()->put(cpu);
    back2.push_back(std::make_unique<Buf>(data.size()));
    d2.push_back({cpuf.back()->p(), cpu.size(), back2.back()->p(), data.size()});
  }
  const Result r1 = emu_decompress(d1);
  const Result r2 = emu_decompress(d2);
  for (size_t i = 0; i < n; ++i) {
    const Bytes& data = tensors[i].second;
    SCOPED_TRACE("item " + std::to_string(i));
    ASSERT_EQ(r1.status[i], TZ_OK);
    ASSERT_EQ(r1.size[i], data.size());
    ASSERT_TRUE(back[i]->get(data.size()) == data);
    ASSERT_TRUE(back[i]->guards_intact());
    ASSERT_EQ(r2.status[i], TZ_OK);
    ASSERT_TRUE(back2[i]->get(data.size()) == data);
  }
}

// Compresses each tensor on the CPU with p, decodes the frames in one
// emulated GPU batch, with the same frames in the version-1/2 layout
// where they have one table set per stream (tzt::as_version12), and checks
// the bytes. Returns how many frames use lane contexts (stream kind 3).
size_t cpu_frames_decode(const std::vector<std::pair<tz_dtype, Bytes>>& tensors, const tz_params& p) {
  std::vector<std::unique_ptr<Buf>> frames, outs;
  std::vector<tz_cuda_decompress_item> items;
  std::vector<const Bytes*> expect;
  size_t n_ctx = 0;
  for (auto& [dt, data] : tensors) {
    tz_params cp = p;
    cp.dtype = dt;
    const Bytes f = cpu_compress(data, cp);
    tz_frame_info info{};
    EXPECT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info)));
    n_ctx += info.stream_kind[0] == tz::kKindRansCtx;
    std::vector<Bytes> layouts{f};
    try {
      if (info.format_version == tz::kFormatVersionSets) layouts.push_back(tzt::as_version12(f));
    } catch (const std::runtime_error&) {
      // several table sets: no version-1/2 form
    }
    for (const Bytes& g : layouts) {
      frames.push_back(std::make_unique<Buf>(g.size()));
      frames.back()->put(g);
      outs.push_back(std::make_unique<Buf>(data.size()));
      items.push_back({frames.back()->p(), g.size(), outs.back()->p(), data.size()});
      expect.push_back(&data);
    }
  }
  const Result r = emu_decompress(items);
  for (size_t i = 0; i < items.size(); ++i) {
    SCOPED_TRACE("item " + std::to_string(i));
    EXPECT_EQ(r.status[i], TZ_OK);
    EXPECT_EQ(r.size[i], expect[i]->size());
    EXPECT_TRUE(outs[i]->get(expect[i]->size()) == *expect[i]);
    EXPECT_TRUE(outs[i]->guards_intact());
  }
  return n_ctx;
}

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
    if (level > 0) EXPECT_GT(seeded, 0u) << "seeded lane states coded and decoded by the emulated GPU";
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

// Level 3 (lane contexts, exhaustive search) is encoded by the CPU only: the
// GPU encoder refuses it, and the GPU decoder decodes the CPU's frames, in
// a batch that mixes plain frames (first decode launch) and context frames
// (second launch, larger shared memory).
TEST(CudaEmu, LaneContextFramesDecode) {
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (tz_dtype dt : {TZ_DTYPE_F32, TZ_DTYPE_BF16, TZ_DTYPE_F16}) {
    std::vector<float> v(20000 + 7 * dt);
    float scale = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
      const float g = nd(rng);
      v[i] = g * g * scale;
    }
    Bytes b = dt == TZ_DTYPE_BF16 ? tzt::to_bf16(v) : dt == TZ_DTYPE_F16 ? tzt::to_f16(v) : Bytes(v.size() * 4);
    if (dt == TZ_DTYPE_F32) memcpy(b.data(), v.data(), b.size());
    batch.push_back({dt, b});
    batch.push_back({dt, make_tensor(dt, 5000, 9)});
  }
  tz_params p{};
  p.level = 3;
  p.block_elems = 4096;
  const size_t n_ctx = cpu_frames_decode(batch, p);
  EXPECT_GE(n_ctx, 2u) << "the row-scaled tensors should use lane contexts";
  // Levels 1-2 find lane contexts too (format version 3), and the emulated
  // GPU encoder writes the CPU's frames byte for byte.
  p.level = 2;
  EXPECT_GE(cpu_frames_decode(batch, p), 2u);
  roundtrip_batch(batch, p);
  // The GPU encoder refuses level 3.
  p.level = 3;
  Buf src(16), dst(1024);
  std::vector<tz_cuda_compress_item> items{{src.p(), 16, TZ_DTYPE_F32, dst.p(), 1024}};
  EXPECT_EQ(tz_get_error_code(tz_cuda_compress_temp_size(items.data(), 1, &p)), TZ_ERROR_UNSUPPORTED);
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

TEST(CudaEmu, UnsupportedAndTooSmall) {
  const Bytes good = make_tensor(TZ_DTYPE_BF16, 5000, 3);
  const size_t cap = tz_compress_bound(good.size());
  Buf s(good.size()), d0(cap), d1(cap), d2(100), d3(cap), s_odd(good.size() + 2);
  s.put(good);
  std::vector<tz_cuda_compress_item> items = {
      {s.p(), good.size(), TZ_DTYPE_BYTES, d0.p(), cap},
      {s.p(), good.size() - 1, TZ_DTYPE_BF16, d1.p(), cap},
      {s.p(), good.size(), TZ_DTYPE_BF16, d2.p(), 100},
      {s.p(), good.size(), TZ_DTYPE_BF16, d3.p(), cap},
      {s_odd.p() + 1, good.size(), TZ_DTYPE_BF16, d1.p(), cap},  // misaligned source
      {s.p(), good.size(), (tz_dtype)77, d1.p(), cap},
  };
  tz_params p{};
  p.block_elems = 4096;
  const Result r = emu_compress(items, p);
  EXPECT_EQ(r.status[0], TZ_ERROR_UNSUPPORTED);
  EXPECT_EQ(r.status[1], TZ_ERROR_UNSUPPORTED);
  EXPECT_EQ(r.status[2], TZ_ERROR_DST_TOO_SMALL);
  EXPECT_EQ(r.status[3], TZ_OK);
  EXPECT_EQ(r.status[4], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.status[5], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.size[0], 0u);
  EXPECT_EQ(r.size[2], 0u);
  EXPECT_TRUE(d2.guards_intact());
  tz_params cp = p;
  cp.dtype = TZ_DTYPE_BF16;
  EXPECT_TRUE(d3.get(r.size[3]) == cpu_compress(good, cp));

  // Generic frames: stored streams decode, zstd streams are unsupported.
  tz_params bp{};
  bp.dtype = TZ_DTYPE_BYTES;
  bp.level = -1;
  const Bytes raw_frame = cpu_compress(good, bp);
  bp.level = 1;
  const Bytes z_frame = cpu_compress(good, bp);
  Buf f1(raw_frame.size()), f2(z_frame.size()), o1(good.size()), o2(good.size());
  f1.put(raw_frame);
  f2.put(z_frame);
  const Result d = emu_decompress({{f1.p(), raw_frame.size(), o1.p(), good.size()},
                                   {f2.p(), z_frame.size(), o2.p(), good.size()}});
  EXPECT_EQ(d.status[0], TZ_OK);
  EXPECT_EQ(d.size[0], good.size());
  EXPECT_TRUE(o1.get(good.size()) == good);
  EXPECT_EQ(d.status[1], TZ_ERROR_UNSUPPORTED);
  EXPECT_TRUE(o1.guards_intact() && o2.guards_intact());
}

TEST(CudaEmu, CorruptFramesPerItemStatus) {
  std::mt19937 rng(5);
  const Bytes data = make_tensor(TZ_DTYPE_BF16, 2 * 4096 + 77, 9);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.block_elems = 4096;
  const Bytes frame = cpu_compress(data, p);
  const int kItems = 48;
  std::vector<std::unique_ptr<Buf>> fs, outs;
  std::vector<tz_cuda_decompress_item> items;
  std::vector<bool> cpu_ok(kItems);
  std::vector<int> cpu_code(kItems);
  for (int i = 0; i < kItems; ++i) {
    Bytes f = frame;
    if (i % 8 != 0) {
      switch (i % 4) {
        case 0: f[rng() % f.size()] ^= (uint8_t)(1u << (rng() % 8)); break;
        case 1: f.resize(rng() % f.size()); break;
        case 2: f[rng() % 64] = (uint8_t)rng(); break;
        case 3: for (int j = 0; j < 6; ++j) f[rng() % f.size()] = (uint8_t)rng(); break;
      }
    }
    Bytes tmp(data.size());
    const size_t cr = tz_decompress(tmp.data(), tmp.size(), f.data(), f.size(), 1);
    cpu_ok[i] = !tz_is_error(cr);
    cpu_code[i] = cpu_ok[i] ? 0 : (int)tz_get_error_code(cr);
    fs.push_back(std::make_unique<Buf>(f.size()));
    fs.back()->put(f);
    outs.push_back(std::make_unique<Buf>(data.size()));
    items.push_back({fs.back()->p(), f.size(), outs.back()->p(), data.size()});
  }
  const Result r = emu_decompress(items);
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(r.status[i] == TZ_OK, cpu_ok[i]) << "item " << i << " status " << r.status[i];
    EXPECT_EQ(r.status[i], cpu_code[i]) << "item " << i << " (error code differs from the CPU's)";
    EXPECT_TRUE(outs[i]->guards_intact()) << "item " << i;
    if (r.status[i] == TZ_OK) EXPECT_TRUE(outs[i]->get(data.size()) == data) << "item " << i;
    else EXPECT_EQ(r.size[i], 0u);
  }
  Buf f(frame.size()), o(100);
  f.put(frame);
  const Result s = emu_decompress({{f.p(), frame.size(), o.p(), 100}});
  EXPECT_EQ(s.status[0], TZ_ERROR_DST_TOO_SMALL);
  EXPECT_TRUE(o.guards_intact());
}

// Corruptions behind a valid header CRC: header fields, table bytes and
// block index entries are changed and the header CRC recomputed, so the
// deeper checks (index, block bounds, block headers) are what must catch
// them. Same verdict and code as the CPU, nothing written outside dst.
TEST(CudaEmu, CorruptionsWithValidHeaderCrc) {
  std::mt19937 rng(17);
  tz_params p{};
  p.dtype = TZ_DTYPE_F32;
  p.block_elems = 4096;
  const Bytes data = make_tensor(TZ_DTYPE_F32, 3 * 4096 + 500, 4);
  const Bytes frame = cpu_compress(data, p);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
  const size_t tables_end = 32 + (info.prefix_size - 32 - 4 * info.n_blocks);
  uint32_t table[256];
  tz::crc32c_make_table(table);
  auto fix_crc = [&](Bytes& f) {
    if (f.size() < 32) return;
    uint64_t prefix = info.prefix_size;
    uint32_t ts, nb;
    memcpy(&ts, f.data() + 24, 4);
    memcpy(&nb, f.data() + 20, 4);
    prefix = 32 + (uint64_t)ts + 4ull * nb;
    if (prefix > f.size()) return;
    uint32_t st = tz::crc32c_update(~0u, f.data(), 28, table);
    st = ~tz::crc32c_update(st, f.data() + 32, prefix - 32, table);
    memcpy(f.data() + 28, &st, 4);
  };
  const int kItems = 64;
  std::vector<std::unique_ptr<Buf>> fs, outs;
  std::vector<tz_cuda_decompress_item> items;
  std::vector<int> cpu_code(kItems);
  for (int i = 0; i < kItems; ++i) {
    Bytes f = frame;
    switch (i % 6) {
      case 0: {  // a block index entry
        const uint32_t v = (i & 8) ? (uint32_t)rng() : (uint32_t)(rng() % 40000) & ~3u;
        memcpy(f.data() + tables_end + 4 * (rng() % info.n_blocks), &v, 4);
        break;
      }
      case 1: f[32 + rng() % (tables_end - 32)] = (uint8_t)rng(); break;  // table section
      case 2: {                                                          // raw size
        const uint64_t v = (i & 8) ? rng() : data.size() + 4 * (int)(rng() % 9) - 16;
        memcpy(f.data() + 8, &v, 8);
        break;
      }
      case 3: f[5 + rng() % 3] = (uint8_t)(rng() % 8); break;  // dtype, n_streams, flags
      case 4: {                                                // block_elems / n_blocks / tables_size
        const uint32_t v = rng() % 3 == 0 ? (uint32_t)rng() : (uint32_t)(rng() % 20000);
        memcpy(f.data() + 16 + 4 * (rng() % 3), &v, 4);
        break;
      }
      case 5: {  // block bytes: stream words and payloads, behind an intact prefix
        for (int j = 0; j < 3; ++j) f[info.prefix_size + rng() % (f.size() - info.prefix_size)] = (uint8_t)rng();
        break;
      }
    }
    fix_crc(f);
    Bytes tmp(data.size());
    const size_t cr = tz_decompress(tmp.data(), tmp.size(), f.data(), f.size(), 1);
    cpu_code[i] = tz_is_error(cr) ? (int)tz_get_error_code(cr) : 0;
    fs.push_back(std::make_unique<Buf>(f.size()));
    fs.back()->put(f);
    outs.push_back(std::make_unique<Buf>(data.size()));
    items.push_back({fs.back()->p(), f.size(), outs.back()->p(), data.size()});
  }
  const Result r = emu_decompress(items);
  int errors = 0;
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(r.status[i], cpu_code[i]) << "item " << i << " (mutation " << i % 6 << ")";
    EXPECT_TRUE(outs[i]->guards_intact()) << "item " << i;
    errors += r.status[i] != 0;
  }
  EXPECT_GT(errors, kItems / 2);
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

// Every rule of the shared validator (codec/frame_prefix.h, parse_block):
// the table of malformed frames gives the same status code on the GPU as on
// the CPU, in one batch. The one difference is by design: a valid frame with
// a zstd stream (dtype bytes) is TZ_ERROR_UNSUPPORTED on the GPU, whatever
// its blocks hold, and only such frames are.
TEST(CudaEmu, MalformedFramesSameCodeAsCpu) {
  const std::vector<tzt::MalformedFrame> table = tzt::malformed_frames();
  std::vector<std::unique_ptr<Buf>> fs, outs;
  std::vector<tz_cuda_decompress_item> items;
  std::vector<int> cpu_code;
  std::vector<Bytes> cpu_out;
  for (const auto& m : table) {
    fs.push_back(std::make_unique<Buf>(m.frame.size()));
    fs.back()->put(m.frame);
    outs.push_back(std::make_unique<Buf>(m.dst_capacity));
    items.push_back({fs.back()->p(), m.frame.size(), outs.back()->p(), m.dst_capacity});
    Bytes o(m.dst_capacity);
    const size_t r = tz_decompress(o.data(), o.size(), fs.back()->p(), m.frame.size(), 1);
    cpu_code.push_back(tz_is_error(r) ? (int)tz_get_error_code(r) : 0);
    cpu_out.push_back(o);
  }
  const Result r = emu_decompress(items);
  int unsupported = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& m = table[i];
    SCOPED_TRACE(m.rule);
    EXPECT_EQ(cpu_code[i], m.code);
    EXPECT_EQ(r.status[i], m.gpu_code);
    if (m.gpu_code == m.code) EXPECT_EQ(r.status[i], cpu_code[i]) << "GPU and CPU disagree";
    unsupported += r.status[i] == TZ_ERROR_UNSUPPORTED;
    EXPECT_TRUE(outs[i]->guards_intact());
    if (r.status[i] == TZ_OK) {
      EXPECT_EQ(r.size[i], m.dst_capacity);
      EXPECT_TRUE(outs[i]->get(m.dst_capacity) == cpu_out[i]);
    } else {
      EXPECT_EQ(r.size[i], 0u);
    }
  }
  EXPECT_EQ(unsupported, 3) << "the zstd frames only";
  // A null source is a parameter error on both sides.
  Buf o(16);
  const Result n = emu_decompress({{nullptr, 0, o.p(), 16}});
  EXPECT_EQ(n.status[0], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(tz_get_error_code(tz_decompress(o.p(), 16, nullptr, 0, 1)), TZ_ERROR_BAD_PARAMETER);
}

}  // namespace

// ---- predicted tensors (doc/cuda.md, "Predicted tensors") ---------------------

namespace {

// Residual of `values` against a prediction, with the CPU container's
// element-wise functions (src/codec/predict.h).
Bytes residual_of(const Bytes& values, const Bytes& pred, int kind, tz_dtype dt) {
  Bytes r = values;
  if (kind == TZ_CUDA_PREDICT_CAST)
    tz::predict::cast_xor(pred.data(), r.data(), r.size() / 2,
                          dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16);
  else
    tz::predict::xor_bytes(pred.data(), r.data(), r.size());
  return r;
}

struct PredCase {
  tz_dtype dt;
  int kind;
  Bytes values, pred;
};

// FP32 masters and their cast, with every 97th element changed (an inexact
// prediction: the exceptions cost their own bits only).
PredCase cast_case(tz_dtype dt, size_t n, uint32_t seed) {
  Bytes m = make_tensor(TZ_DTYPE_F32, n, seed);
  Bytes v(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint16_t c = tz::predict::cast_f32(tz::load_le32(&m[4 * i]),
                                       dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    if (i % 97 == 5) c ^= (uint16_t)(0x0101u * (1 + i % 7));
    tz::store_le16(&v[2 * i], c);
  }
  return {dt, TZ_CUDA_PREDICT_CAST, v, m};
}

// The previous tensor and a nudged copy (low mantissa bits change).
PredCase delta_case(tz_dtype dt, size_t n, uint32_t seed) {
  Bytes prev = make_tensor(dt, n, seed);
  Bytes cur = prev;
  std::mt19937 rng(seed);
  const size_t es = prev.size() / n;
  for (size_t i = 0; i < n; ++i)
    if (rng() % 3 == 0) cur[i * es] ^= (uint8_t)(1 + rng() % 3);
  return {dt, TZ_CUDA_PREDICT_DELTA, cur, prev};
}

void predicted_roundtrip(const std::vector<PredCase>& cases, const tz_params& p) {
  const size_t n = cases.size();
  std::vector<std::unique_ptr<Buf>> src, pred, dst, back, raw;
  std::vector<tz_cuda_compress_item> items;
  for (const auto& c : cases) {
    src.push_back(std::make_unique<Buf>(c.values.size()));
    src.back()->put(c.values);
    pred.push_back(std::make_unique<Buf>(c.pred.size()));
    pred.back()->put(c.pred);
    const size_t cap = tz_compress_bound(c.values.size());
    dst.push_back(std::make_unique<Buf>(cap));
    tz_cuda_compress_item it{src.back()->p(), c.values.size(), c.dt, dst.back()->p(), cap, {}};
    it.predict = {c.kind, pred.back()->p(), c.pred.size()};
    items.push_back(it);
  }
  const Result r = emu_compress(items, p);
  std::vector<tz_cuda_decompress_item> d, dr;
  for (size_t i = 0; i < n; ++i) {
    const PredCase& c = cases[i];
    SCOPED_TRACE("item " + std::to_string(i) + " dtype " + std::to_string(c.dt) + " kind " + std::to_string(c.kind));
    ASSERT_EQ(r.status[i], TZ_OK);
    ASSERT_TRUE(src[i]->guards_intact() && pred[i]->guards_intact() && dst[i]->guards_intact());
    ASSERT_TRUE(src[i]->get(c.values.size()) == c.values) << "input modified";
    // The frame is the CPU frame of the residual.
    tz_params cp = p;
    cp.dtype = c.dt;
    const Bytes resid = residual_of(c.values, c.pred, c.kind, c.dt);
    const Bytes cpu = cpu_compress(resid, cp);
    ASSERT_TRUE(dst[i]->get(r.size[i]) == cpu) << "frame differs from the CPU frame of the residual";
    back.push_back(std::make_unique<Buf>(c.values.size()));
    tz_cuda_decompress_item di{dst[i]->p(), r.size[i], back.back()->p(), c.values.size(), {}};
    di.predict = {c.kind, pred[i]->p(), c.pred.size()};
    d.push_back(di);
    raw.push_back(std::make_unique<Buf>(c.values.size()));
    dr.push_back({dst[i]->p(), r.size[i], raw.back()->p(), c.values.size(), {}});
  }
  const Result rd = emu_decompress(d);
  const Result rr = emu_decompress(dr);
  for (size_t i = 0; i < n; ++i) {
    const PredCase& c = cases[i];
    SCOPED_TRACE("item " + std::to_string(i));
    ASSERT_EQ(rd.status[i], TZ_OK);
    ASSERT_EQ(rd.size[i], c.values.size());
    ASSERT_TRUE(back[i]->get(c.values.size()) == c.values) << "value = residual XOR prediction";
    ASSERT_TRUE(back[i]->guards_intact());
    ASSERT_EQ(rr.status[i], TZ_OK);  // without the prediction: the residual itself
    ASSERT_TRUE(raw[i]->get(c.values.size()) == residual_of(c.values, c.pred, c.kind, c.dt));
  }
}

}  // namespace

TEST(CudaEmu, PredictedCastAndDeltaMatchCpuResiduals) {
  tz_params p{};
  p.block_elems = 4096;
  predicted_roundtrip({cast_case(TZ_DTYPE_BF16, 10000, 1), cast_case(TZ_DTYPE_F16, 9000, 2),
                       delta_case(TZ_DTYPE_F32, 9001, 3), delta_case(TZ_DTYPE_BF16, 5000, 4),
                       delta_case(TZ_DTYPE_F8_E4M3, 8200, 5)},
                      p);
  // Exact cast: an all-zero residual.
  PredCase exact = cast_case(TZ_DTYPE_BF16, 4500, 6);
  for (size_t i = 0; i < 4500; ++i)
    tz::store_le16(&exact.values[2 * i], tz::predict::cast_f32(tz::load_le32(&exact.pred[4 * i]), tz::predict::kCastBF16));
  p.level = 2;
  predicted_roundtrip({exact, delta_case(TZ_DTYPE_F16, 4096, 7)}, p);
}

TEST(CudaEmu, PredictionParameterErrors) {
  tz_params p{};
  p.block_elems = 4096;
  const Bytes f32 = make_tensor(TZ_DTYPE_F32, 5000, 8);
  const Bytes bf = make_tensor(TZ_DTYPE_BF16, 5000, 9);
  Buf s32(f32.size()), sbf(bf.size()), pr(f32.size());
  s32.put(f32);
  sbf.put(bf);
  pr.put(f32);
  const size_t cap = tz_compress_bound(f32.size());
  Buf o1(cap), o2(cap), o3(cap), o4(cap);
  std::vector<tz_cuda_compress_item> items = {
      {s32.p(), f32.size(), TZ_DTYPE_F32, o1.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size()}},  // cast to F32
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o2.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), bf.size()}},   // source too small
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o3.p(), cap, {7, pr.p(), f32.size()}},                     // unknown kind
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o4.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size()}},  // fine
  };
  const Result r = emu_compress(items, p);
  EXPECT_EQ(r.status[0], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.status[1], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.status[2], TZ_ERROR_BAD_PARAMETER);
  ASSERT_EQ(r.status[3], TZ_OK);
  // Decoding: a cast needs a BF16/F16 frame and a large enough source.
  tz_params cp = p;
  cp.dtype = TZ_DTYPE_F32;
  const Bytes frame32 = cpu_compress(f32, cp);
  Buf fin(frame32.size()), out1(f32.size()), out2(bf.size()), out3(bf.size());
  fin.put(frame32);
  std::vector<tz_cuda_decompress_item> d = {
      {fin.p(), frame32.size(), out1.p(), f32.size(), {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size() * 2}},
      {o4.p(), r.size[3], out2.p(), bf.size(), {TZ_CUDA_PREDICT_CAST, pr.p(), bf.size()}},
      {o4.p(), r.size[3], out3.p(), bf.size(), {TZ_CUDA_PREDICT_DELTA, pr.p(), bf.size() - 1}},
  };
  const Result rd = emu_decompress(d);
  EXPECT_EQ(rd.status[0], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(rd.status[1], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(rd.status[2], TZ_ERROR_BAD_PARAMETER);
  EXPECT_TRUE(out1.guards_intact() && out2.guards_intact() && out3.guards_intact());
}
