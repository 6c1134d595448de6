// Damaged frames: every decoder entry point must return an error or the
// exact original bytes, never crash, over-read or return wrong data.
#include "tz_test_util.h"

using namespace tzt;

namespace {

// Decodes a (possibly damaged) frame with tz_decompress and tz_verify.
// Success is allowed only with the original bytes; errors must carry a
// valid code. Returns true if the frame was rejected.
bool rejected(const Bytes& frame, const Bytes& original, const std::string& what, unsigned threads = 1) {
  Bytes out(original.size() + 8, 0x77);
  const size_t r = tz_decompress(out.data(), original.size(), frame.data(), frame.size(), threads);
  unsigned bad = 0xFFFFFFFFu;
  const size_t v = tz_verify(frame.data(), frame.size(), threads, &bad);
  if (!tz_is_error(r)) {
    EXPECT_EQ(r, original.size()) << what;
    EXPECT_TRUE(std::equal(original.begin(), original.end(), out.begin())) << what << ": success with wrong bytes";
  } else {
    const tz_error_code c = tz_get_error_code(r);
    EXPECT_TRUE(c > TZ_OK && c < TZ_ERROR_MAX_CODE) << what;
  }
  for (size_t i = original.size(); i < out.size(); ++i) EXPECT_EQ(out[i], 0x77) << what << ": wrote past capacity";
  // tz_verify agrees with tz_decompress on whether the frame is good.
  EXPECT_EQ(tz_is_error(v), tz_is_error(r)) << what << ": verify " << tz_get_error_name(v) << ", decompress "
                                            << tz_get_error_name(r);
  if (tz_is_error(v) && tz_get_error_code(v) >= TZ_ERROR_CORRUPT_BLOCK && tz_get_error_code(v) <= TZ_ERROR_CHECKSUM) {
    tz_frame_info info{};
    // A block error names an existing block (unless the header itself was hit).
    if (!tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info))) {
      EXPECT_LT(bad, info.n_blocks) << what;
    }
  }
  return tz_is_error(r);
}

struct Sample {
  tz_dtype dt;
  Bytes src, frame;
};

// A small multi-block frame of real data per dtype: blocks of 4096
// elements, the last one short.
Sample small_frame(tz_dtype dt, size_t elems, int level = 1) {
  Sample s{dt, real_bytes(dt, elems * elem_size(dt)), {}};
  s.frame = compress(s.src, dt, level, 4096);
  return s;
}

TEST(Corruption, EveryBitFlip) {
  // FP8 (one coded stream) and BF16 (coded exponents, raw mantissas), three
  // and two blocks: a few KB each, so every single bit can be flipped.
  for (const auto& [dt, elems] : std::vector<std::pair<tz_dtype, size_t>>{{TZ_DTYPE_F8_E4M3, 2 * 4096 + 600},
                                                                          {TZ_DTYPE_BF16, 4096 + 300}}) {
    const Sample s = small_frame(dt, elems);
    ASSERT_FALSE(s.frame.empty());
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(s.frame.data(), s.frame.size(), &info)));
    ASSERT_GE(info.n_blocks, 2u);
    size_t accepted = 0;
    Bytes f = s.frame;
    for (size_t bit = 0; bit < 8 * f.size(); ++bit) {
      f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      if (!rejected(f, s.src, dtype_label(dt) + " bit " + std::to_string(bit))) ++accepted;
      f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      if (HasFailure()) return;
    }
    // Every bit of the format is covered by a checksum or a validity check:
    // the header and index by the header CRC, padding must be zero, the
    // decoded bytes by the block checksums.
    EXPECT_EQ(accepted, 0u) << dtype_label(dt) << ": " << accepted << " single-bit flips went unnoticed";
    std::printf("  %s: %zu-byte frame, %zu bit flips, %zu decoded to the original\n", dtype_label(dt).c_str(),
                s.frame.size(), 8 * s.frame.size(), accepted);
  }
}

TEST(Corruption, EveryByteEveryDtype) {
  for (tz_dtype dt : kAllDtypes) {
    for (int level : {1, 3}) {
      const Sample s = small_frame(dt, 4096 + 100, level);
      ASSERT_FALSE(s.frame.empty());
      Bytes f = s.frame;
      for (size_t i = 0; i < f.size(); ++i) {
        for (uint8_t x : {(uint8_t)0xFF, (uint8_t)(1u << (i % 8))}) {
          f[i] ^= x;
          rejected(f, s.src, dtype_label(dt) + " byte " + std::to_string(i) + " ^ " + std::to_string(x));
          f[i] ^= x;
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST(Corruption, RandomMultiByteDamage) {
  for (tz_dtype dt : kAllDtypes) {
    const Sample s = small_frame(dt, 3 * 4096 + 11, 2);
    ASSERT_FALSE(s.frame.empty());
    for (uint64_t trial = 0; trial < 1500; ++trial) {
      Bytes f = s.frame;
      const uint64_t h = splitmix64(trial * 31 + (unsigned)dt);
      const int n_changes = 1 + (int)(h % 6);
      for (int c = 0; c < n_changes; ++c) {
        const uint64_t r = splitmix64(h + (uint64_t)c);
        f[r % f.size()] = (uint8_t)(r >> 40);
      }
      rejected(f, s.src, dtype_label(dt) + " trial " + std::to_string(trial), trial % 3 == 0 ? 2 : 1);
      if (HasFailure()) return;
    }
  }
}

TEST(Corruption, TruncationAtEveryLength) {
  for (tz_dtype dt : kAllDtypes) {
    const Sample s = small_frame(dt, 2 * 4096 + 7);
    ASSERT_FALSE(s.frame.empty());
    for (size_t len = 0; len < s.frame.size(); ++len) {
      const Bytes f(s.frame.begin(), s.frame.begin() + (ptrdiff_t)len);  // exact-size copy
      Bytes out(s.src.size());
      const size_t r = tz_decompress(out.data(), out.size(), f.data(), f.size(), 1);
      ASSERT_TRUE(tz_is_error(r)) << dtype_label(dt) << " truncated to " << len;
      ASSERT_TRUE(tz_is_error(tz_verify(f.data(), f.size(), 1, nullptr))) << dtype_label(dt) << " len " << len;
    }
    // A null source with a zero size is an error as well, not a crash.
    Bytes out(16);
    EXPECT_TRUE(tz_is_error(tz_decompress(out.data(), out.size(), nullptr, 0, 1)));
  }
}

TEST(Corruption, TrailingBytesRejected) {
  for (tz_dtype dt : kAllDtypes) {
    const Sample s = small_frame(dt, 5000);
    for (size_t extra : {1, 3, 4, 100}) {
      Bytes f = s.frame;
      f.resize(f.size() + extra, 0);
      Bytes out(s.src.size());
      EXPECT_TRUE(tz_is_error(tz_decompress(out.data(), out.size(), f.data(), f.size(), 1)))
          << dtype_label(dt) << " +" << extra;
      EXPECT_TRUE(tz_is_error(tz_verify(f.data(), f.size(), 1, nullptr)));
    }
  }
}

TEST(Corruption, BadMagicAndVersion) {
  const Sample s = small_frame(TZ_DTYPE_BF16, 5000);
  Bytes out(s.src.size());
  tz_frame_info info{};
  for (int i = 0; i < 4; ++i) {
    Bytes f = s.frame;
    f[i] ^= 0x20;
    EXPECT_EQ(tz_get_error_code(tz_decompress(out.data(), out.size(), f.data(), f.size(), 1)), TZ_ERROR_BAD_MAGIC);
    EXPECT_EQ(tz_get_error_code(tz_verify(f.data(), f.size(), 1, nullptr)), TZ_ERROR_BAD_MAGIC);
    EXPECT_EQ(tz_get_error_code(tz_frame_inspect(f.data(), f.size(), &info)), TZ_ERROR_BAD_MAGIC);
    EXPECT_EQ(tz_get_error_code(tz_frame_prefix_size(f.data(), f.size())), TZ_ERROR_BAD_MAGIC);
  }
  // A zstd frame is not a tensorzip frame.
  const uint8_t zstd_magic[40] = {0x28, 0xB5, 0x2F, 0xFD};
  EXPECT_EQ(tz_get_error_code(tz_decompress(out.data(), out.size(), zstd_magic, sizeof zstd_magic, 1)),
            TZ_ERROR_BAD_MAGIC);
  // Versions 1 to 3 are valid: relabelling this version-3 frame (compact
  // tables) as version 1 or 2 makes its table section unreadable under that
  // version's rules, which are checked before the header CRC.
  ASSERT_EQ(s.frame[4], 3);
  for (uint8_t v : {1, 2}) {
    Bytes f = s.frame;
    f[4] = v;
    EXPECT_EQ(tz_get_error_code(tz_decompress(out.data(), out.size(), f.data(), f.size(), 1)),
              TZ_ERROR_CORRUPT_HEADER)
        << "version " << (int)v;
  }
  for (uint8_t v : {0, 4, 5, 0x81, 255}) {
    Bytes f = s.frame;
    f[4] = v;
    EXPECT_EQ(tz_get_error_code(tz_decompress(out.data(), out.size(), f.data(), f.size(), 1)), TZ_ERROR_BAD_VERSION)
        << "version " << (int)v;
    EXPECT_EQ(tz_get_error_code(tz_frame_inspect(f.data(), f.size(), &info)), TZ_ERROR_BAD_VERSION);
    EXPECT_STRNE(tz_last_error_detail(), "");
  }
}

TEST(Corruption, HeaderFieldsValidated) {
  const Sample s = small_frame(TZ_DTYPE_F32, 5000);
  Bytes out(s.src.size());
  auto code = [&](const Bytes& f) {
    return tz_get_error_code(tz_decompress(out.data(), out.size(), f.data(), f.size(), 1));
  };
  // Fields checked from the 32 header bytes alone: dtype, stream count,
  // flags, block size.
  for (size_t at : {5, 6, 7, 16, 17, 18}) {
    for (uint8_t v : {(uint8_t)0x06, (uint8_t)0xFF, (uint8_t)0x01}) {
      Bytes f = s.frame;
      if (f[at] == v) continue;
      f[at] = v;
      EXPECT_TRUE(code(f) == TZ_ERROR_CORRUPT_HEADER || code(f) == TZ_ERROR_CHECKSUM)
          << "byte " << at << " = " << (int)v << ": " << tz_error_code_name(code(f));
    }
  }
  // A change consistent with the fixed header checks (raw size one element
  // larger, same block count) is caught by the header checksum.
  Bytes f = s.frame;
  f[8] ^= 4;  // 20000 -> 20004 bytes
  EXPECT_EQ(code(f), TZ_ERROR_CHECKSUM);
}

// tz_verify names the first damaged block; tz_decompress fails too.
TEST(Corruption, VerifyReportsTheBadBlock) {
  for (tz_dtype dt : kAllDtypes) {
    SCOPED_TRACE(dtype_label(dt));
    const Sample s = small_frame(dt, 8 * 4096 + 5);
    ASSERT_FALSE(s.frame.empty());
    unsigned bad = 0;
    ASSERT_EQ(tz_verify(s.frame.data(), s.frame.size(), 2, &bad), s.src.size());
    auto block_at = [&](unsigned b, uint64_t* off, uint64_t* size) {
      ASSERT_EQ(tz_frame_block_range(s.frame.data(), s.frame.size(), b, 1, off, size, nullptr, nullptr), 0u);
    };
    for (unsigned threads : {1u, 4u}) {
      for (const std::vector<unsigned>& damaged : std::vector<std::vector<unsigned>>{{2}, {8}, {5, 3}, {0, 7}}) {
        // Damage the stored checksum (first 4 bytes of the block): the
        // block decodes, and its checksum no longer matches.
        Bytes f = s.frame;
        for (unsigned b : damaged) {
          uint64_t off, size;
          block_at(b, &off, &size);
          f[off + 1] ^= 0x10;
        }
        const unsigned first = *std::min_element(damaged.begin(), damaged.end());
        bad = 12345;
        size_t r = tz_verify(f.data(), f.size(), threads, &bad);
        EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_CHECKSUM);
        EXPECT_EQ(bad, first) << "threads " << threads;
        bad = 12345;
        tz_ctx* c = tz_ctx_create(threads);
        r = tz_ctx_verify(c, f.data(), f.size(), &bad);
        tz_ctx_free(c);
        EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_CHECKSUM);
        EXPECT_EQ(bad, first);
        Bytes out(s.src.size());
        EXPECT_TRUE(tz_is_error(tz_decompress(out.data(), out.size(), f.data(), f.size(), threads)));
        EXPECT_NE(std::string(tz_last_error_detail()).find("block " + std::to_string(first)), std::string::npos)
            << tz_last_error_detail();
        // Damage in the middle of the block payload: some error, same block.
        f = s.frame;
        for (unsigned b : damaged) {
          uint64_t off, size;
          block_at(b, &off, &size);
          f[off + size / 2] ^= 0x5A;
        }
        bad = 12345;
        r = tz_verify(f.data(), f.size(), threads, &bad);
        EXPECT_TRUE(tz_is_error(r));
        EXPECT_EQ(bad, first);
      }
    }
    // A damaged block leaves the other blocks readable by random access.
    Bytes f = s.frame;
    uint64_t off, size;
    block_at(3, &off, &size);
    f[off + size / 2] ^= 0x5A;
    uint64_t off4, size4, roff4, rsize4;
    ASSERT_EQ(tz_frame_block_range(f.data(), f.size(), 4, 1, &off4, &size4, &roff4, &rsize4), 0u);
    Bytes out(rsize4);
    const size_t pr = tz_frame_prefix_size(f.data(), f.size());
    EXPECT_EQ(tz_decompress_blocks(out.data(), out.size(), f.data(), pr, f.data() + off4, size4, 4, 1, 1), rsize4);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), s.src.begin() + (ptrdiff_t)roff4));
    Bytes out3(s.src.size());
    EXPECT_TRUE(tz_is_error(tz_decompress_blocks(out3.data(), out3.size(), f.data(), pr, f.data() + off, size, 3, 1, 1)));
  }
}

}  // namespace

// Two valid blocks of equal size swapped in place must not decode: the
// stored checksum is salted with the block's position (doc/format.md 7.2).
TEST(Corruption, SwappedEqualSizeBlocksAreRejected) {
  // Stored (level -1) frames have equal-size blocks; so do frames of
  // identical blocks of real-looking data.
  std::vector<uint8_t> src(4 * 8192 * 2);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (uint8_t)((i * 2654435761u) >> 13);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.level = -1;
  p.block_elems = 8192;
  std::vector<uint8_t> c(tz_compress_bound(src.size()));
  const size_t cs = tz_compress(c.data(), c.size(), src.data(), src.size(), &p);
  ASSERT_FALSE(tz_is_error(cs));
  c.resize(cs);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(c.data(), c.size(), &info)));
  ASSERT_EQ(info.n_blocks, 4u);
  const uint64_t bsz = (cs - info.prefix_size) / 4;
  std::vector<uint8_t> swapped = c;
  std::swap_ranges(swapped.begin() + info.prefix_size + bsz, swapped.begin() + info.prefix_size + 2 * bsz,
                   swapped.begin() + info.prefix_size + 2 * bsz);
  ASSERT_NE(swapped, c);
  std::vector<uint8_t> out(src.size());
  const size_t r = tz_decompress(out.data(), out.size(), swapped.data(), swapped.size(), 1);
  ASSERT_TRUE(tz_is_error(r));
  EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_CHECKSUM);
  unsigned bad = 99;
  ASSERT_TRUE(tz_is_error(tz_verify(swapped.data(), swapped.size(), 1, &bad)));
  EXPECT_EQ(bad, 1u);
  // The unswapped frame still decodes.
  ASSERT_FALSE(tz_is_error(tz_decompress(out.data(), out.size(), c.data(), c.size(), 1)));
  EXPECT_EQ(out, src);
}
