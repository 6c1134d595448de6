// Zero elision (doc/format.md 5.10; codec/zero_elision.h): a block stores a
// stream raw without the bytes of the elements whose stream 0 is 0, where
// that stream is 0 there too. Real FP32 values with whole rows at +0.0 (an
// optimizer moment's untouched rows) and real BF16 weights pruned 2:4: the
// streams are elided on every SIMD path with the same bytes, decode exactly,
// and the frames are smaller than the encoder's without elision by what the
// zeros' bytes held; -0.0 and subnormals keep the bytes zero elision cannot
// rebuild; frames without a zero are byte for byte those of before; and a
// block breaking the rule is rejected. The emulated CUDA encoder writes the
// same frames (tests/cuda/emu/test_cuda_emu_encode.cpp, CudaEmu.ZeroElision*).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/zero_elision.h"
#include "cpu/frame.h"
#include "cpu/simd_path.h"
#include "tz_every_path.h"
#include "tz_frame_edit.h"
#include "tz_test_util.h"

namespace {

using tzt::Bytes;

// The encoder restricted to some flags for a scope.
struct FlagsMask {
  explicit FlagsMask(uint8_t m) { tz::cpu::set_encoder_flags_mask(m); }
  ~FlagsMask() { tz::cpu::set_encoder_flags_mask(tz::kFrameFlagsKnown); }
};
constexpr uint8_t kNoElision = tz::kFlagSeededLanes | tz::kFlagSelfSeeded;

// Streams stored elided, as a bit mask over all blocks, and the blocks that
// elide some stream.
struct Elided {
  uint32_t streams = 0;
  uint32_t blocks = 0;
};
Elided elided_of(const Bytes& frame) {
  Elided e;
  for (const tzt::ParsedBlock& pb : tzt::frame_blocks(frame)) {
    e.streams |= pb.v.elided;
    e.blocks += pb.v.elided != 0;
  }
  return e;
}

uint64_t count_zero_elems(const Bytes& src, size_t es) {
  uint64_t z = 0;
  for (size_t i = 0; i < src.size(); i += es) {
    bool all = true;
    for (size_t j = 0; j < es; ++j) all = all && src[i + j] == 0;
    z += all;
  }
  return z;
}

TEST(ZeroElision, HelpersFollowTheRule) {
  const uint8_t s0[8] = {0, 3, 0, 5, 7, 0, 1, 2};
  const uint8_t ok[8] = {0, 9, 0, 8, 7, 0, 6, 5};
  const uint8_t bad[8] = {0, 9, 4, 8, 7, 0, 6, 5};  // non-zero where stream 0 is 0
  EXPECT_EQ(tz::elided_count(s0, 8), 3u);
  EXPECT_TRUE(tz::stream_elidable(s0, ok, 8));
  EXPECT_FALSE(tz::stream_elidable(s0, bad, 8));
  uint8_t kept[8] = {}, back[8];
  ASSERT_EQ(tz::elide_zeros(s0, ok, 8, kept), 5u);
  const uint8_t want[5] = {9, 8, 7, 6, 5};
  EXPECT_EQ(0, std::memcmp(kept, want, 5));
  tz::expand_zeros(s0, kept, 8, back);
  EXPECT_EQ(0, std::memcmp(back, ok, 8));
  const uint8_t* const s[3] = {s0, ok, bad};
  uint32_t n_kept = 0;
  EXPECT_EQ(tz::block_elided_streams(tz::kFlagZeroElided, 3, s, 8, &n_kept), 2u);  // stream 1 only
  EXPECT_EQ(n_kept, 5u);
  EXPECT_EQ(tz::block_elided_streams(0, 3, s, 8, &n_kept), 0u);  // not allowed
  EXPECT_EQ(n_kept, 8u);
  EXPECT_EQ(tz::block_elided_streams(tz::kFlagZeroElided, 1, s, 8, &n_kept), 0u);  // one stream: nothing to elide
  const uint8_t nz[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const uint8_t* const t[2] = {nz, ok};
  EXPECT_EQ(tz::block_elided_streams(tz::kFlagZeroElided, 2, t, 8, &n_kept), 0u);  // no zero
  EXPECT_EQ(n_kept, 8u);
}

// FP32 with a fifth of its 256-element rows at +0.0: streams 1-3 elided in
// every block, at every level, and each zero element saves at least a byte
// against the frame without elision (its three bytes cost 0.7 bits each in a
// coded stream, and a raw one holds them whole).
TEST(ZeroElision, ZeroRowsOfFp32AreElided) {
  constexpr unsigned kE = 8192;
  const Bytes src = tzt::f32_with_zero_rows(8 * kE, 256, 5);
  const uint64_t zeros = count_zero_elems(src, 4);
  ASSERT_GT(zeros, 8u * kE / 6);
  for (int level = 1; level <= 3; ++level) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Bytes f = tzt::compress_every_path(src, TZ_DTYPE_F32, level, kE);
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(f[7] & tz::kFlagZeroElided, tz::kFlagZeroElided);
    const Elided e = elided_of(f);
    EXPECT_EQ(e.streams, 0xEu);
    EXPECT_EQ(e.blocks, 8u);
    Bytes off;
    {
      FlagsMask m(kNoElision);
      off = tzt::compress(src, TZ_DTYPE_F32, level, kE);
    }
    ASSERT_FALSE(off.empty());
    EXPECT_EQ(off[7] & tz::kFlagZeroElided, 0);
    EXPECT_EQ(elided_of(off).streams, 0u);
    EXPECT_LT(f.size() + zeros, off.size()) << f.size() << " vs " << off.size();
  }
}

// BF16 weights pruned 2:4: half the elements +0.0, stream 1 elided.
TEST(ZeroElision, PrunedBf16IsElided) {
  constexpr unsigned kE = 8192;
  const Bytes src = tzt::bf16_pruned_2of4(6 * kE);
  const uint64_t zeros = count_zero_elems(src, 2);
  ASSERT_EQ(zeros, 3u * kE);
  for (int level = 1; level <= 3; ++level) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Bytes f = tzt::compress_every_path(src, TZ_DTYPE_BF16, level, kE);
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(elided_of(f).streams, 0x2u);
    Bytes off;
    {
      FlagsMask m(kNoElision);
      off = tzt::compress(src, TZ_DTYPE_BF16, level, kE);
    }
    ASSERT_FALSE(off.empty());
    // Stored raw, the zeros' stream-1 bytes are whole bytes; coded, their
    // share of a half-zero stream still costs about a bit each.
    EXPECT_LT(f.size() + zeros / 8, off.size()) << f.size() << " vs " << off.size();
  }
}

// FP16 (stream 0: sign, exponent, two mantissa bits) with zero rows. A
// positive subnormal below 2^-16 has stream 0 = 0 too, with its bits in
// stream 1: a block holding one keeps stream 1 whole. (Real FP16 weights
// hold a few such values per 8192, so the rows here are scaled by 64, and
// block 0 gets one.)
TEST(ZeroElision, ZeroRowsOfFp16AreElidedWhereNoSubnormalSharesTheirKey) {
  constexpr unsigned kE = 8192, kB = 4;
  std::vector<float> v = tzt::as_floats_f32(tzt::f32_with_zero_rows(kB * kE, 256, 3));
  for (float& x : v) x *= 64.0f;
  Bytes src = tzt::to_f16(v);
  src[2 * 5] = 0x01;  // element 5 (a zero row): the subnormal 2^-24
  src[2 * 5 + 1] = 0x00;
  ASSERT_GT(count_zero_elems(src, 2), kB * kE / 4);
  std::vector<bool> want(kB);
  for (unsigned b = 0; b < kB; ++b) {
    bool zero = false, shared = false;
    for (unsigned i = b * kE; i < (b + 1) * kE; ++i) {
      zero = zero || (src[2 * i] == 0 && src[2 * i + 1] == 0);
      shared = shared || (src[2 * i + 1] == 0 && src[2 * i] != 0);
    }
    want[b] = zero && !shared;
  }
  ASSERT_FALSE(want[0]);
  ASSERT_TRUE(want[1] || want[2] || want[3]);
  for (int level = 1; level <= 3; ++level) {
    const Bytes f = tzt::compress_every_path(src, TZ_DTYPE_F16, level, kE);
    ASSERT_FALSE(f.empty());
    const std::vector<tzt::ParsedBlock> bl = tzt::frame_blocks(f);
    ASSERT_EQ(bl.size(), kB);
    for (unsigned b = 0; b < kB; ++b) EXPECT_EQ(bl[b].v.elided, want[b] ? 0x2u : 0u) << "level " << level << " block " << b;
  }
}

// One zero row in 32: streams 1-3 stay raw-kind, stream 3 is the seed
// stream of every block (its head carried by the coded stream 0's lane
// states) and is elided behind that head like streams 1 and 2; each zero
// saves its three raw bytes.
constexpr uint64_t kSeedBytesPerBlock = tz::kSeedBytes;
TEST(ZeroElision, TheSeedStreamIsElidedBehindItsSeeds) {
  constexpr unsigned kE = 8192, kB = 6;
  const Bytes src = tzt::f32_with_zero_rows(kB * kE, 256, 32);
  const uint64_t zeros = count_zero_elems(src, 4);
  ASSERT_EQ(zeros, kB * 256u);
  const Bytes f = tzt::compress_every_path(src, TZ_DTYPE_F32, 1, kE);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[7], tz::kFlagSeededLanes | tz::kFlagZeroElided);
  for (const tzt::ParsedBlock& pb : tzt::frame_blocks(f)) {
    EXPECT_EQ(pb.v.seed_stream, 3);
    EXPECT_EQ(pb.v.n_seeded, 1u);
    EXPECT_EQ(pb.v.elided, 0xEu);
  }
  Bytes off;
  {
    FlagsMask m(kNoElision);
    off = tzt::compress(src, TZ_DTYPE_F32, 1, kE);
  }
  ASSERT_FALSE(off.empty());
  // The zero row is each block's first: stream 3's head (64 of its zeros)
  // is carried by the seeds either way.
  EXPECT_EQ(f.size() + 3 * zeros - kSeedBytesPerBlock * kB, off.size()) << f.size() << " vs " << off.size();
}

// -0.0 rows: stream 1 holds their sign and is not elided; streams 2 and 3
// are. Subnormals (exponent 0, mantissa bits set) in a block keep that
// block's streams that hold their bits.
TEST(ZeroElision, NegativeZerosAndSubnormalsKeepTheirBytes) {
  constexpr unsigned kE = 8192;
  const Bytes neg = tzt::f32_with_zero_rows(4 * kE, 256, 5, true);
  const Bytes f = tzt::compress_every_path(neg, TZ_DTYPE_F32, 1, kE);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(elided_of(f).streams, 0xCu);
  Bytes sub = tzt::f32_with_zero_rows(4 * kE, 256, 5);
  const uint32_t denorm[2] = {0x00000001u, 0x00012300u};  // stream 3 / stream 2 bits
  std::memcpy(&sub[4 * 0], &denorm[0], 4);                    // block 0: row 0 is a zero row
  std::memcpy(&sub[4 * (kE + 2 * 37 * 256 % kE)], &denorm[1], 4);
  ASSERT_EQ(sub[4 * 0 + 0], 1);
  for (int level = 1; level <= 3; ++level) {
    const Bytes g = tzt::compress_every_path(sub, TZ_DTYPE_F32, level, kE);
    ASSERT_FALSE(g.empty());
    const std::vector<tzt::ParsedBlock> bl = tzt::frame_blocks(g);
    ASSERT_EQ(bl.size(), 4u);
    EXPECT_EQ(bl[0].v.elided & 0x8u, 0u) << "level " << level;  // stream 3 holds a subnormal's bit
    EXPECT_NE(bl[0].v.elided & 0x6u, 0u) << "level " << level;
    EXPECT_EQ(bl[2].v.elided, 0xEu) << "level " << level;
  }
}

// Without a zero exponent the frames are those of the encoder without zero
// elision, byte for byte, and the flag stays clear.
TEST(ZeroElision, FramesWithoutZerosAreUnchanged) {
  const Bytes src = tzt::f32_with_zero_rows(4 * 8192, 256, 1u << 30);  // only row 0 is zero...
  Bytes none = src;
  for (size_t i = 0; i < 256; ++i) none[4 * i + 3] = 0x3C;  // ...made non-zero
  ASSERT_EQ(count_zero_elems(none, 4), 0u);
  for (tz_dtype dt : {TZ_DTYPE_F32, TZ_DTYPE_BF16, TZ_DTYPE_F16}) {
    for (int level = 1; level <= 3; ++level) {
      const Bytes f = tzt::compress(none, dt, level, 8192);
      Bytes off;
      {
        FlagsMask m(kNoElision);
        off = tzt::compress(none, dt, level, 8192);
      }
      ASSERT_FALSE(f.empty());
      EXPECT_EQ(f, off) << tz_dtype_name(dt) << " level " << level;
      EXPECT_EQ(f[7] & tz::kFlagZeroElided, 0);
    }
  }
}

// A block breaking the rule is rejected as a corrupt block: an elided
// stream in a frame without the flag, stream 0 marked elided, and an elided
// payload one word short of the elements kept.
TEST(ZeroElision, BlocksBreakingTheRuleAreRejected) {
  constexpr unsigned kE = 8192;
  const Bytes src = tzt::f32_with_zero_rows(2 * kE, 256, 5);
  const Bytes f = tzt::compress(src, TZ_DTYPE_F32, 1, kE);
  ASSERT_FALSE(f.empty());
  ASSERT_EQ(elided_of(f).streams, 0xEu);
  auto status = [&](const Bytes& g) {
    Bytes back(src.size());
    return tz_get_error_code(tz_decompress(back.data(), back.size(), g.data(), g.size(), 1));
  };
  EXPECT_EQ(status(f), TZ_OK);
  {
    tzt::FrameParts p(f);
    p.set8(7, p.hdr[7] & ~tz::kFlagZeroElided);
    EXPECT_EQ(status(p.bytes()), TZ_ERROR_CORRUPT_BLOCK);
  }
  {
    tzt::FrameParts p(f);
    const uint32_t w = p.word(1, 0);
    p.set_word(1, 0, (w & 0x3FFFFFFFu) | (uint32_t)tz::kModeRawElided << 30);
    EXPECT_EQ(status(p.bytes()), TZ_ERROR_CORRUPT_BLOCK);
  }
  {
    tzt::FrameParts p(f);
    const int k = 2;
    const uint32_t w = p.word(1, k);
    const uint32_t size = tz::stream_word_v3_size(w);
    ASSERT_EQ(size % 4, 0u);
    const size_t at = tzt::payload_offset(p, 1, k, 4) + size - 4;
    p.blocks[1].erase(p.blocks[1].begin() + (long)at, p.blocks[1].begin() + (long)at + 4);
    p.set_word(1, k, tz::stream_word_v3(size - 4, tz::kModeRawElided, 0));
    EXPECT_EQ(status(p.bytes()), TZ_ERROR_CORRUPT_BLOCK);
  }
}

}  // namespace
