// The KV page codec's CUDA kernels on a real device (skipped without one):
// pages encoded on the GPU equal the CPU's byte for byte and decode on both
// sides; damaged pages give the CPU's status. Same cases as the emulation
// tests (emu/), at the sizes a GPU runs well: every page size of the real
// layer-0 KV, both modes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "kv_test_util.hpp"
#include "tensorzip/tensorzip_kv_cuda.h"

namespace {

using kvt::Bytes;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) { EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  uint8_t* u() const { return (uint8_t*)p; }
};

TEST(KvCudaGpu, PagesEqualCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
    tz_kv_params p{};
    p.mode = (tz_kv_mode)mode;
    const Bytes sample = kvt::sequence("k", 0), data = kvt::sequence("k", 1);
    tz_kv_codec* c = nullptr;
    ASSERT_EQ(tz_kv_calibrate(&c, sample.data(), sample.size(), TZ_DTYPE_BF16, &p), 0u);
    Dev tabs(tz_kv_cuda_tables_size());
    ASSERT_EQ(tz_kv_cuda_upload_tables(c, tabs.p, tz_kv_cuda_tables_size(), nullptr), 0u);
    for (uint32_t tokens : {16u, 64u, 256u}) {
      const size_t page = (size_t)tokens * kvt::kRowElems * 2, n = data.size() / page;
      const size_t bound = tz_kv_page_bound(c, page);
      Dev src(data.size()), dst(n * bound), sizes(n * sizeof(size_t)), status(n * sizeof(int));
      ASSERT_EQ(cudaMemcpy(src.p, data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<tz_kv_cuda_item> items(n);
      for (size_t i = 0; i < n; ++i) items[i] = {src.u() + i * page, page, dst.u() + i * bound, bound};
      const size_t ts = tz_kv_cuda_encode_temp_size(c, items.data(), n);
      Dev temp(ts);
      ASSERT_EQ(tz_kv_cuda_encode(c, tabs.p, items.data(), n, temp.p, ts, (size_t*)sizes.p, (int*)status.p, nullptr), 0u);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<size_t> sz(n);
      std::vector<int> st(n);
      cudaMemcpy(sz.data(), sizes.p, n * sizeof(size_t), cudaMemcpyDeviceToHost);
      cudaMemcpy(st.data(), status.p, n * sizeof(int), cudaMemcpyDeviceToHost);
      Bytes all(n * bound);
      cudaMemcpy(all.data(), dst.p, all.size(), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(st[i], 0);
        Bytes cpu(bound);
        cpu.resize(tz_kv_encode(c, cpu.data(), bound, data.data() + i * page, page));
        EXPECT_EQ(Bytes(all.begin() + (ptrdiff_t)(i * bound), all.begin() + (ptrdiff_t)(i * bound + sz[i])), cpu)
            << "mode " << mode << " tokens " << tokens << " page " << i;
      }
      // Decode on the GPU what the GPU encoded.
      Dev out(data.size());
      for (size_t i = 0; i < n; ++i) items[i] = {dst.u() + i * bound, sz[i], out.u() + i * page, page};
      const size_t td = tz_kv_cuda_decode_temp_size(c, items.data(), n);
      Dev temp2(td);
      ASSERT_EQ(tz_kv_cuda_decode(c, tabs.p, items.data(), n, temp2.p, td, (size_t*)sizes.p, (int*)status.p, nullptr), 0u);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Bytes back(data.size());
      cudaMemcpy(back.data(), out.p, back.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(st.data(), status.p, n * sizeof(int), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(st[i], 0);
      EXPECT_EQ(back, data);
    }
    tz_kv_codec_free(c);
  }
}

// Throughput of batches of pages on the device (bench/gpu/run.sh prints it;
// bench/experiments/notebook.md compares it with SplitZip's published figures). The real
// layer-0 K pages tiled to ~1 GiB of pages, encoded and decoded in one batch
// per call, best of 5 by CUDA events; the last round trip is checked.
TEST(KvCudaGpu, Throughput) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const Bytes sample = kvt::sequence("k", 0), data = kvt::sequence("k", 1);
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
    tz_kv_params p{};
    p.mode = (tz_kv_mode)mode;
    tz_kv_codec* c = nullptr;
    ASSERT_EQ(tz_kv_calibrate(&c, sample.data(), sample.size(), TZ_DTYPE_BF16, &p), 0u);
    Dev tabs(tz_kv_cuda_tables_size());
    ASSERT_EQ(tz_kv_cuda_upload_tables(c, tabs.p, tz_kv_cuda_tables_size(), nullptr), 0u);
    for (uint32_t tokens : {16u, 256u}) {
      const size_t page = (size_t)tokens * kvt::kRowElems * 2, per = data.size() / page;
      ASSERT_GT(per, 0u);
      const size_t n = std::max<size_t>(per, ((size_t)1 << 30) / page), bound = tz_kv_page_bound(c, page);
      Dev src(n * page), dst(n * bound), out(n * page), sizes(n * sizeof(size_t)), status(n * sizeof(int));
      for (size_t i = 0; i < n; i += per) {
        const size_t k = std::min(per, n - i);
        ASSERT_EQ(cudaMemcpy(src.u() + i * page, data.data(), k * page, cudaMemcpyHostToDevice), cudaSuccess);
      }
      std::vector<tz_kv_cuda_item> enc(n), dec(n);
      for (size_t i = 0; i < n; ++i) enc[i] = {src.u() + i * page, page, dst.u() + i * bound, bound};
      const size_t ts = tz_kv_cuda_encode_temp_size(c, enc.data(), n);
      Dev temp(ts);
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      float best_enc = 1e30f, best_dec = 1e30f, ms = 0;
      std::vector<size_t> sz(n);
      size_t packed = 0;
      for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(a);
        ASSERT_EQ(tz_kv_cuda_encode(c, tabs.p, enc.data(), n, temp.p, ts, (size_t*)sizes.p, (int*)status.p, nullptr), 0u);
        cudaEventRecord(b);
        ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
        cudaEventElapsedTime(&ms, a, b);
        best_enc = std::min(best_enc, ms);
      }
      cudaMemcpy(sz.data(), sizes.p, n * sizeof(size_t), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        dec[i] = {dst.u() + i * bound, sz[i], out.u() + i * page, page};
        packed += sz[i];
      }
      const size_t td = tz_kv_cuda_decode_temp_size(c, dec.data(), n);
      Dev temp2(td);
      for (int rep = 0; rep < 5; ++rep) {
        ASSERT_EQ(cudaMemset(out.p, 0, n * page), cudaSuccess);
        cudaEventRecord(a);
        ASSERT_EQ(tz_kv_cuda_decode(c, tabs.p, dec.data(), n, temp2.p, td, (size_t*)sizes.p, (int*)status.p, nullptr), 0u);
        cudaEventRecord(b);
        ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
        cudaEventElapsedTime(&ms, a, b);
        best_dec = std::min(best_dec, ms);
      }
      std::vector<int> st(n);
      cudaMemcpy(st.data(), status.p, n * sizeof(int), cudaMemcpyDeviceToHost);
      EXPECT_TRUE(std::all_of(st.begin(), st.end(), [](int v) { return v == 0; }));
      Bytes back(per * page);
      cudaMemcpy(back.data(), out.p, back.size(), cudaMemcpyDeviceToHost);
      EXPECT_EQ(back, Bytes(data.begin(), data.begin() + (ptrdiff_t)(per * page)));
      const double gb = (double)n * page / 1e9;
      std::printf("kv gpu: mode %s, %u-token pages, %zu pages (%.2f GB): ratio %.3f, encode %.1f GB/s, decode %.1f GB/s\n",
                  mode == TZ_KV_MODE_RANS ? "rans" : "fixed", tokens, n, gb, (double)n * page / (double)packed,
                  gb / (best_enc / 1e3), gb / (best_dec / 1e3));
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    tz_kv_codec_free(c);
  }
}

}  // namespace
