// Errors under the CPU emulation of the CUDA backend: unsupported and too
// small items, corrupt frames and the table of malformed frames give per-item
// status codes, the CPU's code for the same frame, and no write outside an
// item's buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/crc32c.h"
#include "cuda_emu_batch.h"

namespace {

using namespace tz_cuda_emu_test;

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
