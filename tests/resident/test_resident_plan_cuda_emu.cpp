// The CUDA plan of resident weights (src/resident/plan_cuda.cpp)
// over the real kernel source run by the CPU emulation of tests/cuda/emu
// (emu_codec.cpp: host memory stands in for device memory). Real fixture
// weights in every codec dtype decode byte for byte into two alternating
// destinations (the two scratch slots), per-item statuses name a corrupt
// frame without touching the others, and the plan's call-level checks hold.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "resident/plan_cuda.hpp"
#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace {

using tz::resident::ResidentPlanCuda;
using tzt::Bytes;

struct DevBuf {  // 256-aligned "device" memory
  uint8_t* p;
  size_t n;
  explicit DevBuf(size_t size) : n(size) {
    p = static_cast<uint8_t*>(std::aligned_alloc(256, (size + 255) / 256 * 256 + 256));
    memset(p, 0xCD, (size + 255) / 256 * 256 + 256);
  }
  ~DevBuf() { std::free(p); }
  DevBuf(const DevBuf&) = delete;
};

Bytes compress(const Bytes& raw, tz_dtype dt) {
  tz_params prm{};
  prm.dtype = dt;
  prm.block_elems = 4096;  // several blocks per tensor, on small emulated inputs
  Bytes out(tz_compress_bound(raw.size()));
  const size_t n = tz_compress(out.data(), out.size(), raw.data(), raw.size(), &prm);
  EXPECT_FALSE(tz_is_error(n)) << tz_last_error_detail();
  out.resize(n);
  return out;
}

// Real values (the first 16384 of the fixture's qkv and proj weights) as dt.
std::vector<Bytes> raws(tz_dtype dt) {
  std::vector<Bytes> out;
  for (const char* name : {"blocks.2.qkv.weight", "blocks.2.proj.weight"}) {
    const auto& t = tzt::find_tensor(tzt::bf16_slice(), name);
    std::vector<float> v = tzt::as_floats_bf16(t.data);
    v.resize(16384 + (out.size() ? 3000 : 0));  // second tensor: a partial last block
    switch (dt) {
      case TZ_DTYPE_BF16: out.push_back(tzt::to_bf16(v)); break;
      case TZ_DTYPE_F16: out.push_back(tzt::to_f16(v)); break;
      case TZ_DTYPE_F8_E4M3: out.push_back(tzt::to_f8_e4m3(v)); break;
      case TZ_DTYPE_F8_E5M2: out.push_back(tzt::to_f8_e5m2(v)); break;
      default: {
        Bytes b(v.size() * 4);
        memcpy(b.data(), v.data(), b.size());
        out.push_back(b);
      }
    }
  }
  return out;
}

class EmuEveryDtype : public ::testing::TestWithParam<tz_dtype> {};

TEST_P(EmuEveryDtype, GroupDecodesIntoEitherSlot) {
  const std::vector<Bytes> raw = raws(GetParam());
  std::vector<Bytes> frames;
  for (const auto& r : raw) frames.push_back(compress(r, GetParam()));
  // Frames in "device" memory, 16-byte aligned one after the other.
  size_t total = 0;
  std::vector<size_t> at;
  for (const auto& f : frames) {
    at.push_back(total);
    total += (f.size() + 15) / 16 * 16;
  }
  DevBuf dev(total);
  for (size_t i = 0; i < frames.size(); ++i) memcpy(dev.p + at[i], frames[i].data(), frames[i].size());

  ResidentPlanCuda plan;
  const uint64_t off1 = (raw[0].size() + 255) / 256 * 256;
  plan.add(0, "qkv", dev.p + at[0], frames[0].size(), raw[0].size(), 0);
  plan.add(0, "proj", dev.p + at[1], frames[1].size(), raw[1].size(), off1);
  plan.add(1, "proj", dev.p + at[1], frames[1].size(), raw[1].size(), 0);  // a tensor alone
  plan.finalize();
  EXPECT_EQ(plan.max_frames(), 2u);
  EXPECT_EQ(plan.group_bytes(0), off1 + raw[1].size());
  DevBuf temp(plan.temp_bytes());
  DevBuf slot_a(plan.group_bytes(0)), slot_b(plan.group_bytes(0));
  for (DevBuf* slot : {&slot_a, &slot_b, &slot_a}) {  // descriptors follow the destination
    memset(slot->p, 0, slot->n);
    std::vector<size_t> sizes(2, 99);
    std::vector<int> status(2, -1);
    ASSERT_EQ(plan.decode(0, slot->p, slot->n, temp.p, temp.n, sizes.data(), status.data(), nullptr), 0u);
    EXPECT_EQ(status, (std::vector<int>{TZ_OK, TZ_OK}));
    EXPECT_EQ(sizes[0], raw[0].size());
    EXPECT_EQ(sizes[1], raw[1].size());
    EXPECT_EQ(0, memcmp(slot->p, raw[0].data(), raw[0].size()));
    EXPECT_EQ(0, memcmp(slot->p + off1, raw[1].data(), raw[1].size()));
  }
  DevBuf alone(raw[1].size());
  size_t sz = 0;
  int st = -1;
  ASSERT_EQ(plan.decode(1, alone.p, alone.n, temp.p, temp.n, &sz, &st, nullptr), 0u);
  EXPECT_EQ(st, TZ_OK);
  EXPECT_EQ(0, memcmp(alone.p, raw[1].data(), raw[1].size()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmuEveryDtype,
                         ::testing::Values(TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3,
                                           TZ_DTYPE_F8_E5M2),
                         [](const auto& info) { return std::string(tz_dtype_name(info.param)); });

TEST(ResidentPlanCudaEmu, CorruptFrameGetsItsOwnStatus) {
  const std::vector<Bytes> raw = raws(TZ_DTYPE_BF16);
  Bytes good = compress(raw[0], TZ_DTYPE_BF16), bad = compress(raw[1], TZ_DTYPE_BF16);
  bad[bad.size() - 64] ^= 0x08;  // in the last block's data
  DevBuf a(good.size()), b(bad.size());
  memcpy(a.p, good.data(), good.size());
  memcpy(b.p, bad.data(), bad.size());
  ResidentPlanCuda plan;
  const uint64_t off1 = (raw[0].size() + 255) / 256 * 256;
  plan.add(0, "good", a.p, good.size(), raw[0].size(), 0);
  plan.add(0, "bad", b.p, bad.size(), raw[1].size(), off1);
  plan.finalize();
  EXPECT_EQ(plan.name(0, 1), "bad");
  DevBuf temp(plan.temp_bytes()), dst(plan.group_bytes(0));
  std::vector<size_t> sizes(2, 99);
  std::vector<int> status(2, -1);
  ASSERT_EQ(plan.decode(0, dst.p, dst.n, temp.p, temp.n, sizes.data(), status.data(), nullptr), 0u);
  EXPECT_EQ(status[0], TZ_OK);
  EXPECT_NE(status[1], TZ_OK);
  EXPECT_EQ(sizes[1], 0u);
  EXPECT_EQ(0, memcmp(dst.p, raw[0].data(), raw[0].size()));
}

TEST(ResidentPlanCudaEmu, CallLevelChecks) {
  ResidentPlanCuda plan;
  Bytes f = compress(raws(TZ_DTYPE_BF16)[0], TZ_DTYPE_BF16);
  DevBuf d(f.size() + 4);
  EXPECT_THROW(plan.add(0, "x", d.p + 2, f.size(), 100, 0), std::invalid_argument);  // not 4-byte aligned
  EXPECT_THROW(plan.add(0, "x", nullptr, f.size(), 100, 0), std::invalid_argument);
  size_t s;
  int st;
  EXPECT_THROW(plan.decode(0, d.p, 0, d.p, 0, &s, &st, nullptr), std::logic_error);  // before finalize
  memcpy(d.p, f.data(), f.size());
  plan.add(0, "x", d.p, f.size(), 32768, 0);
  plan.finalize();
  EXPECT_THROW(plan.add(1, "y", d.p, f.size(), 1, 0), std::logic_error);
  DevBuf out(32768);
  EXPECT_THROW(plan.decode(0, out.p, 100, d.p, 0, &s, &st, nullptr), std::invalid_argument);  // too small
  EXPECT_THROW(plan.decode(3, out.p, out.n, d.p, 0, &s, &st, nullptr), std::out_of_range);
  DevBuf temp(plan.temp_bytes());
  EXPECT_TRUE(tz_is_error(plan.decode(0, out.p, out.n, temp.p, 0, &s, &st, nullptr)));  // temp too small
}

}  // namespace
