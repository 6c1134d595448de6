// Self-seeded streams (doc/format.md 5.9) through the CUDA backend's kernels
// under the CPU emulation (cuda_emu.h): the emulated GPU encoder writes the
// CPU encoder's frames byte for byte (flag bit 1, streams coding n - 64
// symbols and carrying their tails in the lane states), and the emulated GPU
// decoder decodes both, for every dtype at levels 1 and 2 (the GPU encoder
// refuses level 3; its CPU frames are decoded), with last blocks around 128
// elements and around multiples of 32. The rejection rules are rows of the
// shared malformed-frame table (tz_malformed_frames.h), which
// test_cuda_emu.cpp runs through the emulated GPU decoder.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec/format.h"
#include "tensorzip/tensorzip.h"
#include "tensorzip/tensorzip_cuda.h"
#include "cuda_test_common.h"  // tests/cuda
#include "emu_buf.h"
#include "tz_test_data.h"

namespace {

using namespace tz_cuda_test;

using DevBuf = tz_emu_test::Buf;  // "device" buffer in host memory, with canaries (emu_buf.h)

// Nearly constant values (tzt::concentrated_bytes).
Bytes concentrated(tz_dtype dt, size_t n_elems, uint32_t seed) {
  return tzt::concentrated_bytes(tz::dtype_elem_size((uint8_t)dt), n_elems, seed);
}

struct Case {
  tz_dtype dt;
  Bytes data;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  uint32_t seed = 300;
  for (tz_dtype dt : kFloatTypes)
    for (size_t n : {4096 + 128, 4096 + 129, 4096 + 160, 4096 + 193, 2 * 4096 + 77}) {
      if (n == 4096 + 160 || n == 2 * 4096 + 77) out.push_back({dt, make_tensor(dt, n, seed++)});
      out.push_back({dt, concentrated(dt, n, seed++)});
    }
  return out;
}

TEST(CudaEmuSelfSeed, GpuFramesEqualCpuFramesAndDecode) {
  const std::vector<Case> cs = cases();
  for (int level : {1, 2}) {
    SCOPED_TRACE("level " + std::to_string(level));
    tz_params p{};
    p.level = level;
    p.block_elems = 4096;
    std::vector<std::unique_ptr<DevBuf>> src, dst;
    std::vector<tz_cuda_compress_item> items;
    for (const Case& c : cs) {
      src.push_back(std::make_unique<DevBuf>(c.data.size()));
      src.back()->put(c.data);
      const size_t cap = tz_compress_bound(c.data.size());
      dst.push_back(std::make_unique<DevBuf>(cap));
      items.push_back({src.back()->p(), c.data.size(), c.dt, dst.back()->p(), cap});
    }
    const size_t tb = tz_cuda_compress_temp_size(items.data(), items.size(), &p);
    ASSERT_FALSE(tz_is_error(tb));
    DevBuf temp(tb);
    Result r{std::vector<size_t>(items.size(), 0), std::vector<int>(items.size(), -1)};
    ASSERT_EQ(tz_cuda_compress(items.data(), items.size(), &p, temp.p(), tb, r.size.data(), r.status.data(), nullptr),
              0u);
    ASSERT_TRUE(temp.guards_intact());
    size_t self_seeded = 0;
    std::vector<Bytes> frames;
    for (size_t i = 0; i < cs.size(); ++i) {
      SCOPED_TRACE("item " + std::to_string(i) + " dtype " + std::to_string(cs[i].dt) + " bytes " +
                   std::to_string(cs[i].data.size()));
      ASSERT_EQ(r.status[i], TZ_OK);
      ASSERT_TRUE(dst[i]->guards_intact());
      tz_params cp = p;
      cp.dtype = cs[i].dt;
      const Bytes cpu = cpu_compress(cs[i].data, cp);
      const Bytes g = dst[i]->get(r.size[i]);
      ASSERT_TRUE(g == cpu) << "emulated GPU frame differs from the CPU frame";
      self_seeded += (g[7] & tz::kFlagSelfSeeded) != 0;
      frames.push_back(g);
    }
    EXPECT_GT(self_seeded, 0u);
    // The emulated GPU decoder: these frames, and the CPU's level-3 frames.
    std::vector<std::unique_ptr<DevBuf>> fin, out;
    std::vector<tz_cuda_decompress_item> ditems;
    std::vector<const Bytes*> expect;
    for (size_t i = 0; i < cs.size(); ++i) {
      std::vector<Bytes> fs{frames[i]};
      if (level == 2) {
        tz_params p3 = p;
        p3.level = 3;
        p3.dtype = cs[i].dt;
        fs.push_back(cpu_compress(cs[i].data, p3));
      }
      for (const Bytes& f : fs) {
        fin.push_back(std::make_unique<DevBuf>(f.size()));
        fin.back()->put(f);
        out.push_back(std::make_unique<DevBuf>(cs[i].data.size()));
        ditems.push_back({fin.back()->p(), f.size(), out.back()->p(), cs[i].data.size()});
        expect.push_back(&cs[i].data);
      }
    }
    const size_t dtb = tz_cuda_decompress_temp_size(ditems.data(), ditems.size());
    ASSERT_FALSE(tz_is_error(dtb));
    DevBuf dtemp(dtb);
    Result d{std::vector<size_t>(ditems.size(), 0), std::vector<int>(ditems.size(), -1)};
    ASSERT_EQ(tz_cuda_decompress(ditems.data(), ditems.size(), dtemp.p(), dtb, d.size.data(), d.status.data(), nullptr),
              0u);
    ASSERT_TRUE(dtemp.guards_intact());
    for (size_t i = 0; i < ditems.size(); ++i) {
      SCOPED_TRACE("decode item " + std::to_string(i));
      EXPECT_EQ(d.status[i], TZ_OK);
      EXPECT_EQ(d.size[i], expect[i]->size());
      EXPECT_TRUE(out[i]->get(expect[i]->size()) == *expect[i]);
      EXPECT_TRUE(out[i]->guards_intact());
    }
  }
}

}  // namespace
