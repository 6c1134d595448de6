// Self-seeded streams (doc/format.md 5.9, format version 3 with header flag
// bit 1): the rule against the text, self-seeded frames of every dtype and
// level encoded alike and decoded on every SIMD path (blocks around 128
// elements and around multiples of 32), the same frames without self-seeding
// (byte for byte what the encoder of before writes), and seeded frames
// written before self-seeding decoding and re-encoding to the same bytes.
// The rejection rules (flag bits, final states, the 128-element threshold)
// are rows of tests/support/tz_malformed_frames.h, run on every backend by
// test_frame_validation.cpp and the CUDA emulation tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/frame_prefix.h"
#include "cpu/frame.h"
#include "cpu/simd_path.h"
#include "simd_paths.h"
#include "tz_frame_edit.h"
#include "tz_test_util.h"

namespace {

using tzt::Bytes;

// The encoder restricted to some flags for a scope (kFlagSeededLanes: the
// encoder of before self-seeding).
struct FlagsMask {
  explicit FlagsMask(uint8_t m) { tz::cpu::set_encoder_flags_mask(m); }
  ~FlagsMask() { tz::cpu::set_encoder_flags_mask(tz::kFrameFlagsKnown); }
};

int decompress(const Bytes& frame, Bytes* out, size_t raw) {
  out->assign(raw, 0xA5);
  const size_t r = tz_decompress(out->data(), out->size(), frame.data(), frame.size(), 1);
  return tz_is_error(r) ? (int)tz_get_error_code(r) : (r == raw ? 0 : -1);
}

// Self-seeded streams of a frame's blocks, and those of blocks of fewer
// than kSelfSeedMinElems + 2 x 32 elements.
struct SelfSeedCount {
  uint64_t streams = 0, in_short_blocks = 0;
};
SelfSeedCount self_seeded_streams(const Bytes& frame) {
  SelfSeedCount c;
  for (const tzt::ParsedBlock& pb : tzt::frame_blocks(frame)) {
    const uint64_t s = (uint64_t)__builtin_popcount(pb.v.self_seeded);
    c.streams += s;
    if (pb.n < tz::kSelfSeedMinElems + 64) c.in_short_blocks += s;
  }
  return c;
}

// Every block decoded by codec/block.h's decode_block (the TZ_HD decoder a
// GPU thread runs), against the source bytes.
void decode_blocks_with_codec(const Bytes& frame, const Bytes& src, const std::string& tag) {
  tz::FrameHeader h{};
  ASSERT_EQ(tz::check_frame_header(frame.data(), frame.size(), &h), tz::kDefectNone) << tag;
  static tz::FrameTables t;
  t = tz::FrameTables{};
  ASSERT_EQ(tz::parse_table_section(h, frame.data() + 32, &t), tz::kDefectNone) << tag;
  std::vector<uint32_t> dec((size_t)t.n_tables * tz::kProbScale + 64);
  for (uint32_t j = 0; j < t.n_tables; ++j) tz::rans_build_dec(t.freq[j], dec.data() + (size_t)j * tz::kProbScale);
  tz::BlockDecTables dt{};
  dt.v3 = h.version >= tz::kFormatVersionSets;
  dt.flags = h.flags;
  for (int k = 0; k < h.n_streams; ++k) {
    dt.kind[k] = t.kind[k];
    dt.ctx[k] = t.ctx[k];
    dt.n_sets[k] = t.n_sets[k];
    if (tz::kind_is_rans(t.kind[k])) dt.dec[k] = dec.data() + (size_t)t.first_table[k] * tz::kProbScale;
  }
  const uint32_t es = tz::dtype_elem_size(h.dtype);
  uint64_t pos = tz::frame_prefix_size(h);
  for (uint32_t b = 0; b < h.n_blocks; ++b) {
    const uint32_t sz = tz::load_le32(frame.data() + 32 + h.tables_size + 4ull * b);
    const uint32_t n = tz::block_elem_count(h, b);
    Bytes scratch(tz::block_scratch_size(n, h.n_streams)), out((size_t)n * es);
    uint32_t stored = 0;
    ASSERT_EQ(tz::decode_block(h.dtype, dt, frame.data() + pos, sz, n, scratch.data(), out.data(), &stored), tz::kOk)
        << tag << " block " << b;
    ASSERT_TRUE(std::equal(out.begin(), out.end(), src.begin() + (ptrdiff_t)((uint64_t)b * h.block_elems * es)))
        << tag << " block " << b;
    pos += sz;
  }
}

TEST(SelfSeeded, RuleOfTheText) {
  using tz::block_stream_seeds;
  const uint8_t both = tz::kFlagSeededLanes | tz::kFlagSelfSeeded;
  // Stream before the seed stream: the seed stream's head, 64 i on.
  auto s = block_stream_seeds(both, 0, 1, 4096, 0);
  EXPECT_EQ(s.from, 1);
  EXPECT_EQ(s.at, 0u);
  EXPECT_EQ(s.coded, 4096u);
  s = block_stream_seeds(both, 1, 3, 4096, 1);
  EXPECT_EQ(s.from, 3);
  EXPECT_EQ(s.at, 64u);
  // After the seed stream, or no seed stream: itself, from n - 64 on, n >= 128.
  for (int r : {-1, 1}) {
    s = block_stream_seeds(both, 2, r, 4096, 0);
    EXPECT_TRUE(s.self(2));
    EXPECT_EQ(s.at, 4096u - 64);
    EXPECT_EQ(s.coded, 4096u - 64);
    s = block_stream_seeds(both, 2, r, 128, 0);
    EXPECT_TRUE(s.self(2));
    EXPECT_EQ(s.coded, 64u);
    s = block_stream_seeds(both, 2, r, 127, 0);
    EXPECT_EQ(s.from, -1);
    EXPECT_EQ(s.coded, 127u);
    s = block_stream_seeds(tz::kFlagSeededLanes, 2, r, 4096, 0);  // bit 1 clear
    EXPECT_EQ(s.from, -1);
    EXPECT_EQ(s.coded, 4096u);
  }
  // Bit 1 alone: every coded stream seeds itself (no seed stream).
  s = block_stream_seeds(tz::kFlagSelfSeeded, 0, -1, 1000, 0);
  EXPECT_TRUE(s.self(0));
  // A block too short for the seed stream (n < 64 c) but >= 128: self.
  const uint8_t f32k[4] = {tz::kKindRans, tz::kKindRans, tz::kKindRans, tz::kKindRaw};
  EXPECT_EQ(tz::block_seed_stream(4, f32k, 191), -1);
  EXPECT_TRUE(block_stream_seeds(both, 0, tz::block_seed_stream_of(both, 4, f32k, 191), 191, 0).self(0));
  EXPECT_EQ(block_stream_seeds(both, 0, tz::block_seed_stream_of(both, 4, f32k, 192), 192, 0).from, 3);

  // The encoder's flags: bit 1 exactly where a rANS-kind stream follows the
  // last raw-kind stream (or there is none).
  struct K {
    int n;
    uint8_t kind[4];
    uint8_t flags;
  };
  const uint8_t R = tz::kKindRaw, A = tz::kKindRans, C = tz::kKindRansCtx;
  const K cases[] = {
      {1, {A}, tz::kFlagSelfSeeded},
      {1, {R}, 0},
      {2, {A, R}, tz::kFlagSeededLanes},
      {2, {A, A}, tz::kFlagSelfSeeded},
      {2, {R, A}, tz::kFlagSelfSeeded},
      {2, {R, R}, 0},
      {4, {C, A, R, R}, tz::kFlagSeededLanes},
      {4, {A, A, A, R}, tz::kFlagSeededLanes},
      {4, {A, A, A, A}, tz::kFlagSelfSeeded},
      {4, {A, R, A, R}, tz::kFlagSeededLanes},
      {4, {A, R, R, A}, both},
  };
  for (const K& k : cases) {
    EXPECT_EQ(tz::encoder_frame_flags(tz::kFormatVersionSets, k.n, k.kind), k.flags) << k.n << " " << (int)k.kind[0];
    EXPECT_EQ(tz::encoder_frame_flags(2, k.n, k.kind), 0);
  }
}

// Nearly constant values (tzt::concentrated_bytes).
Bytes concentrated(tz_dtype dt, size_t n_elems, uint32_t seed) {
  return tzt::concentrated_bytes(tz::dtype_elem_size((uint8_t)dt), n_elems, seed);
}

// Every dtype, levels 1-3, real and nearly constant data, last blocks of
// 127-129 elements and around 160 and 192 (multiples of 32): the frame is
// flagged as the encoder's rule says, every SIMD path encodes the same bytes
// and decodes them, and with self-seeding removed it is byte for byte the
// frame the encoder writes without bit 1.
TEST(SelfSeeded, FramesOfEveryDtypeRoundTripOnEveryPath) {
  const tz_dtype dts[] = {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2};
  const auto paths = tz::test::paths_to_test(tz::test::current_test_name());
  SelfSeedCount total;
  uint64_t fp8_self = 0, bytes_now = 0, bytes_before = 0;
  for (tz_dtype dt : dts) {
    const uint32_t es = tz::dtype_elem_size((uint8_t)dt);
    const size_t sizes[] = {2 * 4096 + 77, 4096 + 127, 4096 + 128, 4096 + 129, 4096 + 159,
                            4096 + 160,    4096 + 161, 4096 + 191, 4096 + 192, 4096 + 193, 150};
    for (size_t n_elems : sizes) {
      for (int data = 0; data < 2; ++data) {
        const Bytes src = data ? concentrated(dt, n_elems, (uint32_t)n_elems) : tzt::real_bytes(dt, n_elems * es);
        for (int level = 1; level <= 3; ++level) {
          const std::string tag = tzt::dtype_label(dt) + " n=" + std::to_string(n_elems) + " level " +
                                  std::to_string(level) + (data ? " concentrated" : " real");
          Bytes f;
          for (tz::cpu::SimdPath p : paths) {
            tz::cpu::ScopedSimdPath use(p);
            const Bytes g = tzt::compress(src, dt, level, 4096);
            ASSERT_FALSE(g.empty()) << tag;
            if (f.empty()) f = g;
            ASSERT_EQ(g, f) << tag << ": frame encoded on " << tz::cpu::simd_path_name(p);
          }
          tz_frame_info info{};
          ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info))) << tag;
          uint8_t kinds[4] = {};
          for (unsigned k = 0; k < info.n_streams; ++k) kinds[k] = (uint8_t)info.stream_kind[k];
          EXPECT_EQ(f[7], tz::encoder_frame_flags(f[4], (int)info.n_streams, kinds)) << tag;
          const SelfSeedCount s = self_seeded_streams(f);
          decode_blocks_with_codec(f, src, tag);
          total.streams += s.streams;
          total.in_short_blocks += s.in_short_blocks;
          if (es == 1) fp8_self += s.streams;
          for (tz::cpu::SimdPath p : paths) {
            tz::cpu::ScopedSimdPath use(p);
            Bytes back;
            ASSERT_EQ(decompress(f, &back, src.size()), 0) << tag << " " << tz::cpu::simd_path_name(p);
            ASSERT_EQ(back, src) << tag << " " << tz::cpu::simd_path_name(p);
          }
          Bytes before;
          {
            FlagsMask only_bit0(tz::kFlagSeededLanes);
            before = tzt::compress(src, dt, level, 4096);
          }
          EXPECT_EQ(before[7] & tz::kFlagSelfSeeded, 0) << tag;
          // Never larger; smaller by the coded cost of the tails (0 bits
          // for a stream of one symbol).
          EXPECT_LE(f.size(), before.size()) << tag;
          if (!s.streams) {
            EXPECT_EQ(f, before) << tag;
          }
          bytes_now += f.size();
          bytes_before += before.size();
          EXPECT_EQ(tzt::unseed_frame(f, nullptr, tz::kFlagSelfSeeded), before) << tag;
          Bytes back;
          ASSERT_EQ(decompress(before, &back, src.size()), 0) << tag;
          EXPECT_EQ(back, src) << tag;
        }
      }
    }
  }
  EXPECT_GT(total.streams, 0u);
  EXPECT_LT(bytes_now, bytes_before);
  EXPECT_GT(fp8_self, 0u);               // one-stream frames, decoded in place
  EXPECT_GT(total.in_short_blocks, 0u);  // self-seeded blocks of 129..191 elements
}

// Seeded frames (flag bit 0) written by the encoder before self-seeding
// (copied from the fuzz corpus as it was): they decode on every path to the
// same bytes, and the encoder's rule gives their stream kinds flag bit 0
// alone (none has a stream that bit 1 would seed): such frames are written
// as before (FramesOfEveryDtypeRoundTripOnEveryPath compares the bytes).
TEST(SelfSeeded, SeededFramesWrittenBeforeStillDecode) {
  const std::filesystem::path dir = std::filesystem::path(TZ_TEST_DATA_DIR) / "frames-v3-flags1";
  int n_frames = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    const Bytes f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(f.size(), 32u) << e.path();
    EXPECT_EQ(f[4], tz::kFormatVersionSets) << e.path();
    EXPECT_EQ(f[7], tz::kFlagSeededLanes) << e.path();
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info))) << e.path();
    Bytes first;
    for (tz::cpu::SimdPath p : tz::test::paths_to_test(tz::test::current_test_name())) {
      tz::cpu::ScopedSimdPath use(p);
      Bytes back;
      ASSERT_EQ(decompress(f, &back, info.raw_size), 0) << e.path() << " " << tz::cpu::simd_path_name(p);
      if (first.empty()) first = back;
      EXPECT_EQ(back, first) << e.path() << " " << tz::cpu::simd_path_name(p);
    }
    uint8_t kinds[4] = {};
    for (unsigned k = 0; k < info.n_streams; ++k) kinds[k] = (uint8_t)info.stream_kind[k];
    EXPECT_EQ(tz::encoder_frame_flags(f[4], (int)info.n_streams, kinds), tz::kFlagSeededLanes) << e.path();
    ++n_frames;
  }
  EXPECT_GE(n_frames, 3);
}

}  // namespace
