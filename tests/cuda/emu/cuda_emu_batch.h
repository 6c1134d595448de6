// Batch helpers of the CUDA backend's emulation tests (test_cuda_emu_*.cpp):
// the batch entry points with guarded temp memory, and the two round trips
// the tests share (the emulated GPU encoder against the CPU's frames; the CPU's
// frames through the emulated GPU decoder).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_common.h"  // tests/cuda (shared with test_cuda_gpu.cpp)
#include "emu_buf.h"
#include "tensorzip/tensorzip.h"
#include "tensorzip/tensorzip_cuda.h"
#include "tz_malformed_frames.h"

namespace tz_cuda_emu_test {

using namespace tz_cuda_test;
using tz_emu_test::Buf;

inline Result emu_compress(const std::vector<tz_cuda_compress_item>& items, const tz_params& p) {
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

inline Result emu_decompress(const std::vector<tz_cuda_decompress_item>& items) {
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
inline void roundtrip_batch(const std::vector<std::pair<tz_dtype, Bytes>>& tensors, const tz_params& p,
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
inline size_t cpu_frames_decode(const std::vector<std::pair<tz_dtype, Bytes>>& tensors, const tz_params& p) {
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

}  // namespace tz_cuda_emu_test
