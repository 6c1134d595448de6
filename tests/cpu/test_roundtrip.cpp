// Lossless round trips through the public C API: every dtype, sizes around
// block boundaries, every level, non-default block sizes, odd byte counts.
#include "tz_test_util.h"

using namespace tzt;

namespace {

struct Case {
  tz_dtype dtype;
  int level;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return dtype_label(i.param.dtype) + "_level" + (i.param.level < 0 ? "m1" : std::to_string(i.param.level));
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (tz_dtype dt : kAllDtypes)
    for (int level = -1; level <= 3; ++level) v.push_back({dt, level});
  return v;
}

class RoundTrip : public ::testing::TestWithParam<Case> {};

// Element counts around the default block size B: empty, one element, odd,
// B-1, B, B+1 and several blocks with a short tail.
TEST_P(RoundTrip, SizesAroundBlockBoundaries) {
  const Case c = GetParam();
  const size_t es = elem_size(c.dtype);
  const size_t B = default_block_elems(c.dtype);
  for (size_t elems : {size_t(0), size_t(1), size_t(7), size_t(1001), B - 1, B, B + 1, 3 * B + 5}) {
    SCOPED_TRACE("elements " + std::to_string(elems));
    const Bytes src = real_bytes(c.dtype, elems * es);
    Bytes frame;
    ASSERT_TRUE(round_trips(src, make_params(c.dtype, c.level), &frame));
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
    EXPECT_EQ(info.dtype, c.dtype);
    EXPECT_EQ(info.raw_size, src.size());
    EXPECT_EQ(info.block_elems, B);
    EXPECT_EQ(info.n_blocks, (elems + B - 1) / B);
    EXPECT_EQ(info.frame_size, frame.size());
    EXPECT_LE(frame.size(), tz_compress_bound(src.size()));
    if (c.level == -1) {
      // Store level: no stream is entropy coded.
      for (unsigned k = 0; k < info.n_streams; ++k) EXPECT_EQ(info.stream_kind[k], 0) << "stream " << k;
    }
  }
}

// Non-default block sizes, including the smallest and the largest allowed.
TEST_P(RoundTrip, NonDefaultBlockSizes) {
  const Case c = GetParam();
  const size_t es = elem_size(c.dtype);
  for (unsigned be : {4096u, 8192u, 32768u, 1u << 20}) {
    for (size_t elems : {size_t(be) - 1, size_t(be) * 2 + 3}) {
      if (elems * es > (size_t(6) << 20)) continue;  // keep the matrix quick
      SCOPED_TRACE("block_elems " + std::to_string(be) + ", elements " + std::to_string(elems));
      const Bytes src = real_bytes(c.dtype, elems * es);
      Bytes frame;
      ASSERT_TRUE(round_trips(src, make_params(c.dtype, c.level, be), &frame));
      tz_frame_info info{};
      ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
      EXPECT_EQ(info.block_elems, be);
      EXPECT_EQ(info.n_blocks, (elems + be - 1) / be);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAllLevels, RoundTrip, ::testing::ValuesIn(all_cases()), case_name);

class RoundTripLarge : public ::testing::TestWithParam<tz_dtype> {};

// 20 MB of tiled real data with all hardware threads: many blocks, many
// tasks per worker.
TEST_P(RoundTripLarge, TwentyMegabytes) {
  const tz_dtype dt = GetParam();
  const Bytes src = real_bytes(dt, size_t(20) << 20);
  Bytes frame;
  ASSERT_TRUE(round_trips(src, make_params(dt, 1, 0, 0), &frame));
  EXPECT_LT(frame.size(), src.size()) << "real data did not compress at all";
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, RoundTripLarge, ::testing::ValuesIn(kAllDtypes),
                         [](const ::testing::TestParamInfo<tz_dtype>& i) { return dtype_label(i.param); });

// A byte count that is not a multiple of the element size goes through the
// generic path, whatever dtype was asked for.
TEST(RoundTripOdd, OddByteCountsUseGenericPath) {
  const struct {
    tz_dtype dt;
    size_t n;
  } cases[] = {{TZ_DTYPE_BF16, 3},       {TZ_DTYPE_BF16, 1},         {TZ_DTYPE_F16, 131073},
               {TZ_DTYPE_F32, 5},        {TZ_DTYPE_F32, 6},          {TZ_DTYPE_F32, 7},
               {TZ_DTYPE_F32, 262146},   {TZ_DTYPE_BF16, 2 * 65536 + 1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(dtype_label(c.dt) + " " + std::to_string(c.n) + " bytes");
    const Bytes src = real_bytes(c.dt, c.n);
    for (int level = -1; level <= 3; ++level) {
      Bytes frame;
      ASSERT_TRUE(round_trips(src, make_params(c.dt, level), &frame));
      tz_frame_info info{};
      ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
      EXPECT_EQ(info.dtype, TZ_DTYPE_BYTES);
      EXPECT_EQ(info.raw_size, c.n);
    }
  }
}

TEST(RoundTripOdd, NullParamsMeansBytes) {
  const Bytes src = real_bytes(TZ_DTYPE_BF16, 10000);
  Bytes frame(tz_compress_bound(src.size()));
  const size_t r = tz_compress(frame.data(), frame.size(), src.data(), src.size(), nullptr);
  ASSERT_FALSE(tz_is_error(r)) << describe(r);
  frame.resize(r);
  Bytes out;
  ASSERT_EQ(decompress(frame, out), src.size());
  EXPECT_EQ(out, src);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
  EXPECT_EQ(info.dtype, TZ_DTYPE_BYTES);
}

TEST(RoundTripOdd, EmptyInputWithNullPointers) {
  for (tz_dtype dt : kAllDtypes) {
    Bytes frame(tz_compress_bound(0));
    tz_params p = make_params(dt);
    const size_t r = tz_compress(frame.data(), frame.size(), nullptr, 0, &p);
    ASSERT_FALSE(tz_is_error(r)) << describe(r);
    frame.resize(r);
    const size_t d = tz_decompress(nullptr, 0, frame.data(), frame.size(), 1);
    EXPECT_EQ(d, 0u) << describe(d);
    unsigned bad = 12345;
    EXPECT_EQ(tz_verify(frame.data(), frame.size(), 1, &bad), 0u);
  }
}

// The C API takes plain byte pointers: source, frame and destination may sit
// at any address (a tensor inside a file mapping, a slice of a bigger
// buffer). UBSan in the debug preset flags any misaligned typed access.
TEST(RoundTripOdd, MisalignedBuffers) {
  for (tz_dtype dt : kAllDtypes) {
    for (size_t shift : {1, 2, 3}) {
      SCOPED_TRACE(dtype_label(dt) + " shifted by " + std::to_string(shift));
      const Bytes src = real_bytes(dt, 4096 * 3 * elem_size(dt) + 4 * 5);
      Bytes in(src.size() + shift);
      memcpy(in.data() + shift, src.data(), src.size());
      Bytes frame(tz_compress_bound(src.size()) + shift);
      tz_params p = make_params(dt, 1, 4096, 2);
      const size_t r = tz_compress(frame.data() + shift, frame.size() - shift, in.data() + shift, src.size(), &p);
      ASSERT_FALSE(tz_is_error(r)) << describe(r);
      EXPECT_EQ(Bytes(frame.begin() + (ptrdiff_t)shift, frame.begin() + (ptrdiff_t)(shift + r)), compress(src, p));
      Bytes out(src.size() + shift);
      ASSERT_EQ(tz_decompress(out.data() + shift, src.size(), frame.data() + shift, r, 2), src.size());
      EXPECT_TRUE(std::equal(src.begin(), src.end(), out.begin() + (ptrdiff_t)shift));
      // Random access into a misaligned destination.
      uint64_t off, size, roff, rsize;
      ASSERT_EQ(tz_frame_block_range(frame.data() + shift, r, 1, 2, &off, &size, &roff, &rsize), 0u);
      const size_t pr = tz_frame_prefix_size(frame.data() + shift, r);
      ASSERT_EQ(tz_decompress_blocks(out.data() + shift, rsize, frame.data() + shift, pr, frame.data() + shift + off,
                                     size, 1, 2, 1),
                rsize);
      EXPECT_TRUE(std::equal(out.begin() + (ptrdiff_t)shift, out.begin() + (ptrdiff_t)(shift + rsize),
                             src.begin() + (ptrdiff_t)roff));
    }
  }
}

// ---------------------------------------------------------------- params --

TEST(Params, RejectsInvalidParameters) {
  const Bytes src = real_bytes(TZ_DTYPE_BF16, 8192);
  Bytes dst(tz_compress_bound(src.size()));
  auto code = [&](tz_params p) {
    return tz_get_error_code(tz_compress(dst.data(), dst.size(), src.data(), src.size(), &p));
  };
  for (unsigned be : {1u, 2048u, 4095u, 4097u, 3u * 4096, (1u << 20) + 1, 1u << 21, 0x80000000u})
    EXPECT_EQ(code(make_params(TZ_DTYPE_BF16, 0, be)), TZ_ERROR_BAD_PARAMETER) << "block_elems " << be;
  for (int level : {-2, 4, 100, -100})
    EXPECT_EQ(code(make_params(TZ_DTYPE_BF16, level)), TZ_ERROR_BAD_PARAMETER) << "level " << level;
  // (Only values inside the enum's range: converting 255 to tz_dtype is
  // undefined in C++, and UBSan flags it.)
  EXPECT_EQ(code(make_params((tz_dtype)6)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(code(make_params((tz_dtype)7)), TZ_ERROR_BAD_PARAMETER);
  tz_params p = make_params(TZ_DTYPE_BF16);
  EXPECT_TRUE(tz_is_error(tz_compress(dst.data(), dst.size(), nullptr, 100, &p)));
  EXPECT_STRNE(tz_last_error_detail(), "");
}

TEST(Params, DestinationTooSmall) {
  const Bytes src = real_bytes(TZ_DTYPE_BF16, 3 * 65536 * 2);
  const Bytes frame = compress(src, TZ_DTYPE_BF16);
  ASSERT_FALSE(frame.empty());
  // Compression: every capacity below the frame size fails cleanly.
  for (size_t cap : {size_t(0), size_t(31), size_t(32), frame.size() / 2, frame.size() - 1}) {
    Bytes dst(cap + 16, 0xEE);
    tz_params p = make_params(TZ_DTYPE_BF16);
    const size_t r = tz_compress(dst.data(), cap, src.data(), src.size(), &p);
    EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_DST_TOO_SMALL) << "capacity " << cap;
    for (size_t i = cap; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote past capacity " << cap;
  }
  // ... and the exact frame size is enough.
  {
    Bytes dst(frame.size());
    tz_params p = make_params(TZ_DTYPE_BF16);
    EXPECT_EQ(tz_compress(dst.data(), dst.size(), src.data(), src.size(), &p), frame.size());
    EXPECT_EQ(dst, frame);
  }
  // Decompression into less than the raw size.
  Bytes out;
  EXPECT_EQ(tz_get_error_code(decompress(frame, out, 1, src.size() - 1)), TZ_ERROR_DST_TOO_SMALL);
  EXPECT_EQ(tz_get_error_code(decompress(frame, out, 1, 0)), TZ_ERROR_DST_TOO_SMALL);
  // A larger destination is fine and returns the raw size.
  EXPECT_EQ(decompress(frame, out, 1, src.size() + 100), src.size());
  EXPECT_TRUE(std::equal(src.begin(), src.end(), out.begin()));
}

TEST(Params, CompressBoundHoldsForIncompressibleData) {
  // Random bytes of every dtype at the smallest block size (the most
  // per-block overhead) must fit in tz_compress_bound.
  for (tz_dtype dt : kAllDtypes) {
    for (size_t n : {size_t(0), size_t(4), size_t(4096), size_t(4096 * 4 * 3 + 4), size_t(1) << 20}) {
      const Bytes src = hash_stream(n, n + (unsigned)dt);
      for (int level = -1; level <= 3; ++level) {
        Bytes dst(tz_compress_bound(n));
        tz_params p = make_params(dt, level, 4096);
        const size_t r = tz_compress(dst.data(), dst.size(), src.data(), src.size(), &p);
        ASSERT_FALSE(tz_is_error(r)) << dtype_label(dt) << " n=" << n << " level " << level << ": " << describe(r);
      }
    }
  }
}

TEST(Params, ContextThreads) {
  tz_ctx* c = tz_ctx_create(3);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(tz_ctx_threads(c), 3u);
  tz_ctx_free(c);
  c = tz_ctx_create(0);
  ASSERT_NE(c, nullptr);
  EXPECT_GE(tz_ctx_threads(c), 1u);
  tz_ctx_free(c);
  tz_ctx_free(nullptr);
  EXPECT_EQ(tz_ctx_threads(nullptr), 0u);
  uint8_t buf[64];
  EXPECT_EQ(tz_get_error_code(tz_ctx_compress(nullptr, buf, 64, buf, 8, nullptr)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(tz_get_error_code(tz_ctx_decompress(nullptr, buf, 64, buf, 8)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(tz_get_error_code(tz_ctx_verify(nullptr, buf, 8, nullptr)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(tz_get_error_code(tz_ctx_decompress_blocks(nullptr, buf, 64, buf, 8, buf, 8, 0, 1)),
            TZ_ERROR_BAD_PARAMETER);
}

// A context reused for many tensors of different dtypes and sizes keeps
// giving correct results (its scratch buffers grow and shrink in use).
TEST(Params, ContextReuse) {
  tz_ctx* c = tz_ctx_create(2);
  ASSERT_NE(c, nullptr);
  for (int rep = 0; rep < 3; ++rep) {
    for (tz_dtype dt : kAllDtypes) {
      for (size_t elems : {size_t(100), size_t(300000), size_t(4097)}) {
        const Bytes src = real_bytes(dt, elems * elem_size(dt));
        Bytes frame(tz_compress_bound(src.size()));
        tz_params p = make_params(dt, 1 + rep, rep == 1 ? 4096 : 0);
        const size_t r = tz_ctx_compress(c, frame.data(), frame.size(), src.data(), src.size(), &p);
        ASSERT_FALSE(tz_is_error(r)) << describe(r);
        frame.resize(r);
        Bytes out(src.size());
        ASSERT_EQ(tz_ctx_decompress(c, out.data(), out.size(), frame.data(), frame.size()), src.size());
        ASSERT_EQ(out, src);
        unsigned bad = 0;
        ASSERT_EQ(tz_ctx_verify(c, frame.data(), frame.size(), &bad), src.size());
      }
    }
  }
  tz_ctx_free(c);
}

}  // namespace
