// The CUDA kernels of the KV page codec under the CPU emulation: pages equal
// the CPU's byte for byte, decode on both sides, damaged pages give the CPU's
// status per item, and no write lands outside an item's buffers. Small
// inputs: the emulation runs one OS thread per CUDA thread.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "emu_buf.h"
#include "kv_test_util.hpp"
#include "tensorzip/tensorzip_kv_cuda.h"

namespace {

using kvt::Bytes;

using tz_emu_test::Buf;  // tests/cuda/emu/emu_buf.h

struct Emu {
  tz_kv_codec* codec = nullptr;
  std::unique_ptr<Buf> tables;
  Emu(const Bytes& sample, tz_dtype dt, tz_kv_params p) {
    EXPECT_EQ(tz_kv_calibrate(&codec, sample.data(), sample.size(), dt, &p), 0u);
    tables = std::make_unique<Buf>(tz_kv_cuda_tables_size());
    EXPECT_EQ(tz_kv_cuda_upload_tables(codec, tables->p(), tables->size, nullptr), 0u);
  }
  ~Emu() { tz_kv_codec_free(codec); }
  // Encodes each page on the "GPU"; returns the pages.
  std::vector<Bytes> encode(const std::vector<Bytes>& pages) {
    std::vector<std::unique_ptr<Buf>> src, dst;
    std::vector<tz_kv_cuda_item> items;
    for (const Bytes& pg : pages) {
      src.push_back(std::make_unique<Buf>(pg.size()));
      memcpy(src.back()->p(), pg.data(), pg.size());
      const size_t bound = tz_kv_page_bound(codec, pg.size());
      dst.push_back(std::make_unique<Buf>(bound));
      items.push_back({src.back()->p(), pg.size(), dst.back()->p(), bound});
    }
    const size_t ts = tz_kv_cuda_encode_temp_size(codec, items.data(), items.size());
    Buf temp(ts);
    std::vector<size_t> sizes(items.size(), 7);
    std::vector<int> status(items.size(), -1);
    EXPECT_EQ(tz_kv_cuda_encode(codec, tables->p(), items.data(), items.size(), temp.p(), ts, sizes.data(),
                                status.data(), nullptr),
              0u);
    EXPECT_TRUE(temp.guards_intact());
    std::vector<Bytes> out;
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_EQ(status[i], 0) << i;
      EXPECT_TRUE(dst[i]->guards_intact()) << i;
      out.emplace_back(dst[i]->p(), dst[i]->p() + sizes[i]);
    }
    return out;
  }
  // Decodes each page into a buffer of cap bytes; statuses and outputs.
  void decode(const std::vector<Bytes>& pages, size_t cap, std::vector<int>* status, std::vector<Bytes>* outs) {
    std::vector<std::unique_ptr<Buf>> src, dst;
    std::vector<tz_kv_cuda_item> items;
    for (const Bytes& pg : pages) {
      src.push_back(std::make_unique<Buf>(pg.size()));
      if (!pg.empty()) memcpy(src.back()->p(), pg.data(), pg.size());
      dst.push_back(std::make_unique<Buf>(cap));
      items.push_back({src.back()->p(), pg.size(), dst.back()->p(), cap});
    }
    const size_t ts = tz_kv_cuda_decode_temp_size(codec, items.data(), items.size());
    Buf temp(ts);
    std::vector<size_t> sizes(items.size(), 7);
    status->assign(items.size(), -1);
    EXPECT_EQ(tz_kv_cuda_decode(codec, tables->p(), items.data(), items.size(), temp.p(), ts, sizes.data(),
                                status->data(), nullptr),
              0u);
    EXPECT_TRUE(temp.guards_intact());
    outs->clear();
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_TRUE(dst[i]->guards_intact()) << i;
      EXPECT_TRUE(src[i]->guards_intact()) << i;
      outs->emplace_back(dst[i]->p(), dst[i]->p() + ((*status)[i] == 0 ? sizes[i] : 0));
    }
  }
};

Bytes cpu_encode(tz_kv_codec* c, const Bytes& page) {
  Bytes out(tz_kv_page_bound(c, page.size()));
  out.resize(tz_kv_encode(c, out.data(), out.size(), page.data(), page.size()));
  return out;
}

int cpu_status(tz_kv_codec* c, const Bytes& page, size_t cap) {
  Bytes out(cap);
  const size_t r = tz_kv_decode(c, out.data(), cap, page.data(), page.size());
  return tz_is_error(r) ? (int)tz_get_error_code(r) : 0;
}

TEST(KvCudaEmu, PagesEqualCpuEveryDtypeAndMode) {
  for (uint8_t dt : {tz::kBF16, tz::kF16, tz::kF8E4M3}) {
    const Bytes sample = kvt::cast_bf16(kvt::sequence("k", 0), dt);
    const Bytes data = kvt::cast_bf16(kvt::sequence("k", 1), dt);
    const size_t es = tz::dtype_elem_size(dt);
    for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
      tz_kv_params p{};
      p.mode = (tz_kv_mode)mode;
      Emu e(sample, (tz_dtype)dt, p);
      // a real 16-token page, a short one, one with special values, one that stays stored
      std::vector<Bytes> pages = {Bytes(data.begin(), data.begin() + (ptrdiff_t)(16 * 256 * es)),
                                  Bytes(data.begin() + 10, data.begin() + 10 + (ptrdiff_t)(77 * es)),
                                  kvt::cast_bf16(kvt::special_bf16(300), dt), tzt::hash_stream(512 * es, 5)};
      if (dt != tz::kBF16) pages[2] = tzt::hash_stream(300 * es, 9);
      const std::vector<Bytes> gpu = e.encode(pages);
      std::vector<int> st;
      std::vector<Bytes> outs;
      e.decode(gpu, 16 * 256 * es, &st, &outs);
      for (size_t i = 0; i < pages.size(); ++i) {
        EXPECT_EQ(gpu[i], cpu_encode(e.codec, pages[i])) << "dtype " << (int)dt << " mode " << mode << " page " << i;
        EXPECT_EQ(st[i], 0);
        EXPECT_EQ(outs[i], pages[i]) << i;
      }
    }
  }
}

TEST(KvCudaEmu, DamagedPagesSameStatusAsCpu) {
  const Bytes sample = kvt::sequence("v", 0);
  const Bytes data = kvt::sequence("v", 1);
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED})
    for (int no_crc : {0, 1}) {
      tz_kv_params p{};
      p.mode = (tz_kv_mode)mode;
      p.no_checksum = no_crc;
      Emu e(sample, TZ_DTYPE_BF16, p);
      Bytes src(data.begin(), data.begin() + 2 * 700);
      tz::store_le16(src.data() + 300, 0x7F80);
      const Bytes page = cpu_encode(e.codec, src);
      std::vector<Bytes> bad;
      uint64_t rng = 7 + (uint64_t)mode;
      for (int t = 0; t < 24; ++t) {
        Bytes b = page;
        rng = tzt::splitmix64(rng);
        if (t % 4 == 3) b.resize(rng % b.size());
        else b[rng % b.size()] ^= (uint8_t)(1 + (rng >> 20) % 255);
        bad.push_back(b);
      }
      std::vector<int> st;
      std::vector<Bytes> outs;
      e.decode(bad, 2 * 700, &st, &outs);
      for (size_t i = 0; i < bad.size(); ++i) {
        EXPECT_EQ(st[i], cpu_status(e.codec, bad[i], 2 * 700)) << "mode " << mode << " crc " << !no_crc << " case " << i;
        if (st[i] == 0) {
          Bytes cpu(2 * 700);
          tz_kv_decode(e.codec, cpu.data(), cpu.size(), bad[i].data(), bad[i].size());
          EXPECT_EQ(outs[i], cpu);
        }
      }
      // A destination too small for the page.
      e.decode({page}, 2 * 700 - 2, &st, &outs);
      EXPECT_EQ(st[0], TZ_ERROR_DST_TOO_SMALL);
    }
}

}  // namespace
