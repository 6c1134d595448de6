// Frame-level behaviour: determinism across thread counts and entry points,
// frame inspection, and random access to block ranges.
#include <fstream>
#include <iterator>

#include "codec/frame_prefix.h"
#include "cpu/frame.h"
#include "tz_test_util.h"

using namespace tzt;

namespace {

// ----------------------------------------------------------- determinism --

class Determinism : public ::testing::TestWithParam<tz_dtype> {};

TEST_P(Determinism, SameBytesForEveryThreadCountAndEntryPoint) {
  const tz_dtype dt = GetParam();
  // ~90 blocks of 4096 elements: tasks are split differently per thread count.
  const Bytes src = real_bytes(dt, 4096 * 90 * elem_size(dt) + 3 * elem_size(dt));
  for (int level = -1; level <= 3; ++level) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Bytes ref = compress(src, dt, level, 4096, 1);
    ASSERT_FALSE(ref.empty());
    for (unsigned threads : {2u, 3u, 8u, 0u}) {
      EXPECT_EQ(compress(src, dt, level, 4096, threads), ref) << "threads " << threads;
    }
    for (unsigned threads : {1u, 3u, 8u}) {
      tz_ctx* c = tz_ctx_create(threads);
      ASSERT_NE(c, nullptr);
      for (int rep = 0; rep < 2; ++rep) {  // a reused context gives the same bytes
        Bytes out(tz_compress_bound(src.size()));
        tz_params p = make_params(dt, level, 4096, 99 /* ignored by tz_ctx_* */);
        const size_t r = tz_ctx_compress(c, out.data(), out.size(), src.data(), src.size(), &p);
        ASSERT_FALSE(tz_is_error(r)) << describe(r);
        out.resize(r);
        EXPECT_EQ(out, ref) << "tz_ctx with " << threads << " threads, repetition " << rep;
      }
      tz_ctx_free(c);
    }
    // Decompression is the same for every thread count too.
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
      Bytes out;
      ASSERT_EQ(decompress(ref, out, threads), src.size());
      ASSERT_EQ(out, src) << "threads " << threads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Determinism, ::testing::ValuesIn(kAllDtypes),
                         [](const ::testing::TestParamInfo<tz_dtype>& i) { return dtype_label(i.param); });

// ------------------------------------------------------------ inspection --

TEST(Inspect, FieldsDescribeTheFrame) {
  for (tz_dtype dt : kAllDtypes) {
    SCOPED_TRACE(dtype_label(dt));
    const size_t elems = 3 * 4096 + 17;
    const Bytes src = real_bytes(dt, elems * elem_size(dt));
    const Bytes frame = compress(src, dt, 2, 4096);
    ASSERT_FALSE(frame.empty());
    tz_frame_info info{};
    const size_t pr = tz_frame_inspect(frame.data(), frame.size(), &info);
    ASSERT_FALSE(tz_is_error(pr)) << describe(pr);
    // Coded streams: version 3 (compact tables); zstd bytes frames: 1.
    EXPECT_EQ(info.format_version, dt == TZ_DTYPE_BYTES ? 1u : (unsigned)TZ_FORMAT_VERSION);
    EXPECT_EQ(info.dtype, dt);
    const unsigned expect_streams = dt == TZ_DTYPE_F32 ? 4 : (dt == TZ_DTYPE_BF16 || dt == TZ_DTYPE_F16) ? 2 : 1;
    EXPECT_EQ(info.n_streams, expect_streams);
    EXPECT_EQ(info.block_elems, 4096u);
    EXPECT_EQ(info.n_blocks, 4u);
    EXPECT_EQ(info.raw_size, src.size());
    EXPECT_EQ(info.prefix_size, pr);
    EXPECT_EQ(info.frame_size, frame.size());
    EXPECT_EQ(tz_frame_prefix_size(frame.data(), 32), pr);
    EXPECT_EQ(tz_frame_prefix_size(frame.data(), frame.size()), pr);
    // Real data: the exponent field (stream 0) is entropy coded (or, for
    // bytes, zstd); stream kinds are 0 stored, 1 rANS, 2 zstd, 3 rANS with
    // lane contexts.
    if (dt == TZ_DTYPE_BYTES) EXPECT_EQ(info.stream_kind[0], 2);
    else EXPECT_TRUE(info.stream_kind[0] == 1 || info.stream_kind[0] == 3);
    for (unsigned k = 0; k < info.n_streams; ++k) EXPECT_LE(info.stream_kind[k], 3);

    // The prefix alone (exactly prefix_size bytes, in its own allocation so
    // ASan sees over-reads) is enough; frame_size is then unknown (0).
    const Bytes prefix(frame.begin(), frame.begin() + (ptrdiff_t)pr);
    tz_frame_info pinfo{};
    ASSERT_EQ(tz_frame_inspect(prefix.data(), prefix.size(), &pinfo), pr);
    EXPECT_EQ(pinfo.frame_size, 0u);
    EXPECT_EQ(pinfo.n_blocks, info.n_blocks);
    // Less than the prefix is an error.
    const Bytes short_prefix(frame.begin(), frame.begin() + (ptrdiff_t)pr - 1);
    EXPECT_EQ(tz_get_error_code(tz_frame_inspect(short_prefix.data(), short_prefix.size(), &pinfo)),
              TZ_ERROR_SRC_TRUNCATED);
    const Bytes header(frame.begin(), frame.begin() + 31);
    EXPECT_EQ(tz_get_error_code(tz_frame_prefix_size(header.data(), header.size())), TZ_ERROR_SRC_TRUNCATED);
    EXPECT_EQ(tz_get_error_code(tz_frame_inspect(frame.data(), frame.size(), nullptr)), TZ_ERROR_BAD_PARAMETER);
  }
}

// Header layout from doc/format.md: magic "TZFR", version, dtype, streams,
// flags, LE64 raw size, LE32 block_elems, LE32 n_blocks.
TEST(Inspect, HeaderBytesFollowTheFormat) {
  const Bytes src = real_bytes(TZ_DTYPE_F32, 4 * 5000);
  const Bytes frame = compress(src, TZ_DTYPE_F32, 1, 4096);
  ASSERT_GE(frame.size(), 32u);
  EXPECT_EQ(0, memcmp(frame.data(), "TZFR", 4));
  EXPECT_EQ(frame[4], TZ_FORMAT_VERSION);
  EXPECT_EQ(frame[5], TZ_DTYPE_F32);
  EXPECT_EQ(frame[6], 4);
  // flags: seeded lane states (bit 0) where a raw-kind stream follows a coded
  // one, as the encoder's rule says; no other bit.
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
  uint8_t kinds[4];
  for (int k = 0; k < 4; ++k) kinds[k] = (uint8_t)info.stream_kind[k];
  EXPECT_EQ(frame[7], tz::encoder_frame_flags(frame[4], 4, kinds));
  uint64_t raw;
  uint32_t be, nb;
  memcpy(&raw, frame.data() + 8, 8);
  memcpy(&be, frame.data() + 16, 4);
  memcpy(&nb, frame.data() + 20, 4);
  EXPECT_EQ(raw, src.size());
  EXPECT_EQ(be, 4096u);
  EXPECT_EQ(nb, 2u);
}

// --------------------------------------------------------- random access --

// Decodes blocks [first, first+count) from the prefix and exactly those
// blocks' bytes, each in its own exact-size allocation.
size_t decode_range(const Bytes& frame, unsigned first, unsigned count, Bytes& out, uint64_t* raw_off,
                    tz_ctx* ctx = nullptr) {
  const size_t pr = tz_frame_prefix_size(frame.data(), frame.size());
  if (tz_is_error(pr)) return pr;
  const Bytes prefix(frame.begin(), frame.begin() + (ptrdiff_t)pr);
  uint64_t off = 0, size = 0, rsize = 0;
  const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), first, count, &off, &size, raw_off, &rsize);
  if (tz_is_error(r)) return r;
  if (off + size > frame.size()) {
    ADD_FAILURE() << "block range [" << off << ", " << off + size << ") outside a frame of " << frame.size();
    return (size_t)-1;
  }
  const Bytes blocks(frame.begin() + (ptrdiff_t)off, frame.begin() + (ptrdiff_t)(off + size));
  out.assign(rsize, 0xCC);
  if (ctx)
    return tz_ctx_decompress_blocks(ctx, out.data(), out.size(), prefix.data(), prefix.size(), blocks.data(),
                                    blocks.size(), first, count);
  return tz_decompress_blocks(out.data(), out.size(), prefix.data(), prefix.size(), blocks.data(), blocks.size(),
                              first, count, 2);
}

TEST(RandomAccess, BlockRangesMatchFullDecode) {
  tz_ctx* ctx = tz_ctx_create(3);
  ASSERT_NE(ctx, nullptr);
  for (tz_dtype dt : kAllDtypes) {
    SCOPED_TRACE(dtype_label(dt));
    const size_t es = elem_size(dt);
    const unsigned n_blocks = 23;
    const Bytes src = real_bytes(dt, (4096 * (n_blocks - 1) + 1000) * es);  // short last block
    const Bytes frame = compress(src, dt, 1, 4096);
    ASSERT_FALSE(frame.empty());
    Bytes full;
    ASSERT_EQ(decompress(frame, full), src.size());
    ASSERT_EQ(full, src);
    const std::pair<unsigned, unsigned> ranges[] = {{0, 1},  {0, n_blocks}, {n_blocks - 1, 1}, {5, 7},
                                                    {1, 21}, {11, 1},       {0, 0}};
    for (const auto& [first, count] : ranges) {
      SCOPED_TRACE("blocks [" + std::to_string(first) + ", +" + std::to_string(count) + ")");
      for (tz_ctx* c : {(tz_ctx*)nullptr, ctx}) {
        Bytes part;
        uint64_t raw_off = 1234;
        const size_t r = decode_range(frame, first, count, part, &raw_off, c);
        ASSERT_FALSE(tz_is_error(r)) << describe(r);
        EXPECT_EQ(raw_off, (uint64_t)first * 4096 * es);
        const uint64_t end = std::min<uint64_t>(src.size(), (uint64_t)(first + count) * 4096 * es);
        ASSERT_EQ(r, end - raw_off);
        ASSERT_EQ(part.size(), r);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), src.begin() + (ptrdiff_t)raw_off));
      }
    }
    // Every block alone.
    for (unsigned b = 0; b < n_blocks; ++b) {
      Bytes part;
      uint64_t raw_off = 0;
      ASSERT_FALSE(tz_is_error(decode_range(frame, b, 1, part, &raw_off))) << "block " << b;
      ASSERT_TRUE(std::equal(part.begin(), part.end(), src.begin() + (ptrdiff_t)raw_off)) << "block " << b;
    }
  }
  tz_ctx_free(ctx);
}

TEST(RandomAccess, BlockRangeOffsetsTileTheFrame) {
  const Bytes src = real_bytes(TZ_DTYPE_BF16, 2 * (4096 * 9 + 5));
  const Bytes frame = compress(src, TZ_DTYPE_BF16, 1, 4096);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
  uint64_t expect = info.prefix_size, raw_expect = 0;
  for (unsigned b = 0; b < info.n_blocks; ++b) {
    uint64_t off, size, roff, rsize;
    ASSERT_EQ(tz_frame_block_range(frame.data(), frame.size(), b, 1, &off, &size, &roff, &rsize), 0u);
    EXPECT_EQ(off, expect);
    EXPECT_EQ(roff, raw_expect);
    EXPECT_EQ(size % 4, 0u);
    expect += size;
    raw_expect += rsize;
  }
  EXPECT_EQ(expect, frame.size());
  EXPECT_EQ(raw_expect, src.size());
  // Null outputs are allowed.
  EXPECT_EQ(tz_frame_block_range(frame.data(), frame.size(), 0, 1, nullptr, nullptr, nullptr, nullptr), 0u);
}

TEST(RandomAccess, RejectsBadRanges) {
  const Bytes src = real_bytes(TZ_DTYPE_F32, 4 * (4096 * 4));
  const Bytes frame = compress(src, TZ_DTYPE_F32, 1, 4096);
  const size_t pr = tz_frame_prefix_size(frame.data(), frame.size());
  ASSERT_FALSE(tz_is_error(pr));
  uint64_t off, size, roff, rsize;
  for (const auto& [first, count] : std::vector<std::pair<unsigned, unsigned>>{
           {4, 1}, {0, 5}, {3, 2}, {5, 0}, {1, 0xFFFFFFFFu}, {0xFFFFFFFFu, 2}}) {
    EXPECT_EQ(tz_get_error_code(tz_frame_block_range(frame.data(), pr, first, count, &off, &size, &roff, &rsize)),
              TZ_ERROR_BAD_PARAMETER)
        << first << "+" << count;
    Bytes dst(src.size());
    EXPECT_TRUE(tz_is_error(tz_decompress_blocks(dst.data(), dst.size(), frame.data(), pr, frame.data() + pr,
                                                 frame.size() - pr, first, count, 1)))
        << first << "+" << count;
  }
  // Wrong amount of block data, too small a destination.
  ASSERT_EQ(tz_frame_block_range(frame.data(), pr, 1, 2, &off, &size, &roff, &rsize), 0u);
  Bytes dst(rsize);
  EXPECT_TRUE(tz_is_error(
      tz_decompress_blocks(dst.data(), dst.size(), frame.data(), pr, frame.data() + off, size - 4, 1, 2, 1)));
  EXPECT_TRUE(tz_is_error(
      tz_decompress_blocks(dst.data(), dst.size(), frame.data(), pr, frame.data() + off, size + 4, 1, 2, 1)));
  EXPECT_EQ(tz_get_error_code(tz_decompress_blocks(dst.data(), dst.size() - 1, frame.data(), pr, frame.data() + off,
                                                   size, 1, 2, 1)),
            TZ_ERROR_DST_TOO_SMALL);
  // Blocks 1..2 given as the data of blocks 2..3 (same sizes are unlikely;
  // when they differ it is a size error, otherwise a checksum error).
  uint64_t off2, size2;
  ASSERT_EQ(tz_frame_block_range(frame.data(), pr, 2, 2, &off2, &size2, nullptr, nullptr), 0u);
  Bytes shifted(frame.begin() + (ptrdiff_t)off2, frame.begin() + (ptrdiff_t)(off2 + size2));
  shifted.resize(size, 0);
  EXPECT_TRUE(tz_is_error(
      tz_decompress_blocks(dst.data(), dst.size(), frame.data(), pr, shifted.data(), shifted.size(), 1, 2, 1)));
  // And the right data succeeds.
  EXPECT_EQ(tz_decompress_blocks(dst.data(), dst.size(), frame.data(), pr, frame.data() + off, size, 1, 2, 1), rsize);
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), src.begin() + (ptrdiff_t)roff));
}

}  // namespace

// An empty block range at the end of a frame starts at raw_size, not past it.
TEST(FrameApi, EmptyRangeAtEndStartsAtRawSize) {
  std::vector<uint8_t> src(3 * 4096 * 2 + 10);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)(i * 7);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.block_elems = 4096;
  std::vector<uint8_t> c(tz_compress_bound(src.size()));
  const size_t cs = tz_compress(c.data(), c.size(), src.data(), src.size(), &p);
  ASSERT_FALSE(tz_is_error(cs));
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(c.data(), cs, &info)));
  uint64_t off = 0, size = 0, roff = 0, rsize = 1;
  ASSERT_FALSE(tz_is_error(tz_frame_block_range(c.data(), cs, info.n_blocks, 0, &off, &size, &roff, &rsize)));
  EXPECT_EQ(off, cs);
  EXPECT_EQ(size, 0u);
  EXPECT_EQ(roff, src.size());
  EXPECT_EQ(rsize, 0u);
}

// tz_ctx_decompress_blocks_ex names the failing block of a partial read.
TEST(FrameApi, PartialReadReportsBadBlock) {
  std::vector<uint8_t> src(6 * 4096 * 2);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)((i * 2654435761u) >> 11);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.block_elems = 4096;
  std::vector<uint8_t> c(tz_compress_bound(src.size()));
  const size_t cs = tz_compress(c.data(), c.size(), src.data(), src.size(), &p);
  ASSERT_FALSE(tz_is_error(cs));
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(c.data(), cs, &info)));
  uint64_t off = 0, size = 0, roff = 0, rsize = 0;
  ASSERT_FALSE(tz_is_error(tz_frame_block_range(c.data(), cs, 2, 3, &off, &size, &roff, &rsize)));
  uint64_t off4 = 0, size4 = 0;
  ASSERT_FALSE(tz_is_error(tz_frame_block_range(c.data(), cs, 4, 1, &off4, &size4, nullptr, nullptr)));
  c[off4 + size4 - 5] ^= 0x40;  // damage block 4 only
  tz_ctx* ctx = tz_ctx_create(2);
  std::vector<uint8_t> out(rsize);
  unsigned bad = 0;
  const size_t r = tz_ctx_decompress_blocks_ex(ctx, out.data(), out.size(), c.data(), info.prefix_size,
                                               c.data() + off, size, 2, 3, &bad);
  ASSERT_TRUE(tz_is_error(r));
  EXPECT_EQ(bad, 4u);
  // Blocks 2..3 alone still decode and match.
  uint64_t off2 = 0, size2 = 0, roff2 = 0, rsize2 = 0;
  ASSERT_FALSE(tz_is_error(tz_frame_block_range(c.data(), cs, 2, 2, &off2, &size2, &roff2, &rsize2)));
  const size_t r2 = tz_ctx_decompress_blocks_ex(ctx, out.data(), out.size(), c.data(), info.prefix_size,
                                                c.data() + off2, size2, 2, 2, &bad);
  ASSERT_FALSE(tz_is_error(r2)) << tz_last_error_detail();
  EXPECT_EQ(0, memcmp(out.data(), src.data() + roff2, rsize2));
  tz_ctx_free(ctx);
}

// Frames prepared once (resident weights: tz::cpu::prepare_frame) decode
// version-3 frames as tz_decompress does: table sets (each block's stream
// words name their set) and lane contexts, whole and in block ranges that
// start at every block. The frames are the committed seed corpus's
// (tests/fuzz/corpus, written by tz_make_corpus from real tensors), checked
// here to carry several sets and lane contexts.
TEST(PreparedFrames, VersionThreeSetsAndContexts) {
  bool saw_sets = false, saw_ctx = false;
  for (const char* name : {"valid-v3-sets-bf16", "valid-v3-sets-f32", "valid-ctx-bf16", "valid-ctx-f32"}) {
    SCOPED_TRACE(name);
    std::ifstream in(std::string(TZ_TEST_DATA_DIR) + "/../fuzz/corpus/decompress/" + name, std::ios::binary);
    ASSERT_TRUE(in.good());
    const tzt::Bytes frame((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    tz::FrameHeader h{};
    ASSERT_EQ(tz::check_frame_header(frame.data(), frame.size(), &h), tz::kDefectNone);
    ASSERT_EQ(h.version, tz::kFormatVersionSets);
    tz::FrameTables t{};
    ASSERT_EQ(tz::parse_table_section(h, frame.data() + 32, &t), tz::kDefectNone);
    for (int k = 0; k < h.n_streams; ++k) {
      saw_sets |= t.n_sets[k] > 1;
      saw_ctx |= t.kind[k] == tz::kKindRansCtx;
    }
    tzt::Bytes want(h.raw_size);
    ASSERT_EQ(tz_decompress(want.data(), want.size(), frame.data(), frame.size(), 1), h.raw_size);
    tz::cpu::PreparedFramePtr pf;
    const size_t prefix = tz::cpu::prepare_frame(frame.data(), frame.size(), &pf);
    ASSERT_FALSE(tz::cpu::is_error(prefix)) << tz::cpu::last_error_detail();
    auto ctx = tz::cpu::make_context(2);
    for (uint32_t first = 0; first < h.n_blocks; ++first) {
      const uint32_t count = first == 0 ? h.n_blocks : h.n_blocks - first;
      uint64_t off = 0, size = 0, raw = 0;
      ASSERT_EQ(tz::cpu::prepared_block_range(*pf, first, count, &off, &size, &raw), 0u);
      tzt::Bytes got(raw, 0xEE);
      unsigned bad = 0;
      const size_t r = tz::cpu::decompress_blocks_prepared(*ctx, *pf, got.data(), got.size(), frame.data() + off,
                                                           size, first, count, &bad);
      ASSERT_EQ(r, raw) << "first " << first << ": " << tz::cpu::last_error_detail();
      const uint64_t raw_off = (uint64_t)first * h.block_elems * tz::dtype_elem_size(h.dtype);
      EXPECT_EQ(0, memcmp(got.data(), want.data() + raw_off, raw)) << "first " << first;
    }
  }
  EXPECT_TRUE(saw_sets) << "no frame with table sets";
  EXPECT_TRUE(saw_ctx) << "no frame with lane contexts";
}
