// Seeded lane states (doc/format.md 5.8, format version 3 with header flag
// bit 0): the lane end rule, seeded streams on every kernel path against the
// reference written from the text, seeded frames of every dtype on every
// path, the same frames without seeds (byte for byte what the encoder writes
// with seeding off), and frames written before seeding (flags 0) decoding.
// The rejection rules (flag bits, raw payload sizes, final states) are rows
// of tests/support/tz_malformed_frames.h, run on every backend by
// test_frame_validation.cpp and the CUDA emulation tests.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/frame_prefix.h"
#include "cpu/frame.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"
#include "ref_rans.h"
#include "simd_paths.h"
#include "tz_malformed_frames.h"
#include "tz_test_util.h"

namespace {

using tzt::Bytes;

// Seeding switched off for a scope (the encoder of before: flags 0; self-
// seeded streams, doc/format.md 5.9, are tested in test_self_seeded.cpp).
struct NoSeeds {
  NoSeeds() { tz::cpu::set_encoder_seeded_lanes(false); }
  ~NoSeeds() { tz::cpu::set_encoder_seeded_lanes(true); }
};

using tzt::compress;  // records a failure and returns {} on error

int decompress(const Bytes& frame, Bytes* out, size_t raw) {
  out->assign(raw, 0xA5);
  const size_t r = tz_decompress(out->data(), out->size(), frame.data(), frame.size(), 1);
  return tz_is_error(r) ? (int)tz_get_error_code(r) : (r == raw ? 0 : -1);
}

// Seeded streams of a frame's blocks (parse_block's count), and whether the
// frame is seeded.
uint64_t seeded_streams(const Bytes& frame) {
  tz::FrameHeader h{};
  EXPECT_EQ(tz::check_frame_header(frame.data(), frame.size(), &h), tz::kDefectNone);
  static tz::FrameTables t;
  t = tz::FrameTables{};
  EXPECT_EQ(tz::parse_table_section(h, frame.data() + 32, &t), tz::kDefectNone);
  uint64_t pos = tz::frame_prefix_size(h), total = 0;
  for (uint32_t b = 0; b < h.n_blocks; ++b) {
    const uint32_t sz = tz::load_le32(frame.data() + 32 + h.tables_size + 4ull * b);
    tz::BlockView v{};
    EXPECT_EQ(tz::parse_block(h.n_streams, t.kind, h.version >= tz::kFormatVersionSets ? t.n_sets : nullptr,
                              h.flags, frame.data() + pos, sz,
                              tz::block_elem_count(h, b), &v),
              tz::kOk);
    total += v.n_seeded;
    pos += sz;
  }
  return total;
}

TEST(SeededLanes, LaneEndRule) {
  uint32_t x[tz::kLanes];
  for (auto& v : x) v = tz::kRansL;
  EXPECT_EQ(tz::rans_lanes_end(x, tz::RansCtx{}), tz::kOk);
  uint8_t seeds[tz::kSeedBytes];
  tz::RansCtx c{};
  c.seed_out = seeds;
  for (int l = 0; l < tz::kLanes; ++l) x[l] = tz::kRansL | (uint32_t)(0x1111 * (l % 16) + l);
  ASSERT_EQ(tz::rans_lanes_end(x, c), tz::kOk);
  for (int l = 0; l < tz::kLanes; ++l) EXPECT_EQ(tz::load_le16(seeds + 2 * l), x[l] & 0xFFFF) << l;
  EXPECT_EQ(tz::rans_lanes_end(x, tz::RansCtx{}), tz::kErrCorruptBlock);  // unseeded: must be exactly L
  const uint32_t bad[] = {tz::kRansL - 1, 2 * tz::kRansL, 3 * tz::kRansL + 5, 0xFFFFFFFFu};
  for (uint32_t b : bad) {
    uint32_t y[tz::kLanes];
    std::memcpy(y, x, sizeof y);
    y[17] = b;
    std::memset(seeds, 0x5A, sizeof seeds);
    EXPECT_EQ(tz::rans_lanes_end(y, c), tz::kErrCorruptBlock) << b;
    for (uint8_t s : seeds) EXPECT_EQ(s, 0x5A);  // nothing handed back from a rejected stream
  }
}

// A stream seeded with random seeds: every kernel path encodes the bytes of
// the reference of doc/format.md (tests/support/ref_rans.h, lanes starting
// at L + seed), decodes them back with the seeds, and rejects them unseeded.
TEST(SeededLanes, StreamsMatchTheReferenceOnEveryPath) {
  std::vector<const tz::cpu::CodecKernels*> paths{&tz::cpu::kPortableKernels};
  for (const auto* k : tz::test::simd_kernels_to_test(tz::test::current_test_name())) paths.push_back(k);
  std::mt19937 rng(15);
  for (uint32_t nctx : {1u, 3u}) {
    tz::RansCtx ctx{};
    ctx.n = nctx;
    ctx.base = 118;
    for (uint32_t n : {33u, 1000u, 4096u, 65536u + 17u}) {
      // Exponent-like symbols around 120 and a smooth table per context.
      Bytes sym(n);
      std::normal_distribution<double> nd(120.0, 2.0);
      for (auto& s : sym) s = (uint8_t)std::min(255.0, std::max(0.0, nd(rng)));
      std::vector<uint32_t> freq(256 * nctx);
      for (uint32_t c = 0; c < nctx; ++c) {
        std::vector<uint64_t> counts(256, 1);
        for (uint8_t s : sym) counts[s] += 8 + c;
        tz::rans_normalize(counts.data(), &freq[256 * c]);
      }
      std::vector<tz::RansEncSym> enc(256 * nctx);
      std::vector<uint32_t> fst(256 * nctx), dec(tz::kProbScale * nctx + 8);
      for (uint32_t c = 0; c < nctx; ++c) {
        tz::rans_build_enc(&freq[256 * c], &enc[256 * c]);
        tz::cpu::build_freq_start(&freq[256 * c], &fst[256 * c]);
        tz::rans_build_dec(&freq[256 * c], &dec[tz::kProbScale * c]);
      }
      Bytes seed(tz::kSeedBytes);
      for (auto& b : seed) b = (uint8_t)rng();
      uint32_t x0[tz::kLanes];
      for (int l = 0; l < tz::kLanes; ++l) x0[l] = tz::kRansL | tz::load_le16(&seed[2 * l]);
      const Bytes want = tz::ref::rans_encode(sym.data(), n, freq.data(), ctx, x0);
      {
        Bytes back(n);
        uint16_t got[tz::kLanes];
        ASSERT_EQ(tz::ref::rans_decode(want.data(), want.size(), n, freq.data(), ctx, back.data(), got), tz::kOk);
        ASSERT_EQ(back, sym);
        for (int l = 0; l < tz::kLanes; ++l) ASSERT_EQ(got[l], x0[l] & 0xFFFF);
      }
      for (const auto* kr : paths) {
        const std::string tag = std::string(tz::cpu::simd_path_name(kr->path)) + " n=" + std::to_string(n) +
                                " contexts=" + std::to_string(nctx);
        tz::RansCtx ec = ctx;
        ec.seed_in = seed.data();
        std::vector<uint16_t> words(n);
        Bytes out(tz::kRansStateBytes + 2 * (size_t)n);
        const size_t sz = kr->rans_encode(sym.data(), n, tz::cpu::EncTables{enc.data(), fst.data()}, ec,
                                          words.data(), out.data(), SIZE_MAX);
        out.resize(sz);
        ASSERT_EQ(out, want) << tag;
        Bytes back(n), seeds_back(tz::kSeedBytes, 0);
        tz::RansCtx dc = ctx;
        dc.seed_out = seeds_back.data();
        ASSERT_EQ(kr->rans_decode(out.data(), out.size(), n, dec.data(), dc, back.data()), tz::kOk) << tag;
        EXPECT_EQ(back, sym) << tag;
        EXPECT_EQ(seeds_back, seed) << tag;
        EXPECT_EQ(kr->rans_decode(out.data(), out.size(), n, dec.data(), ctx, back.data()), tz::kErrCorruptBlock)
            << tag << ": a seeded stream read as unseeded";
        // The two-stream entry, and the merged BF16, FP16 and FP32 ones.
        Bytes b2(n), sb2(tz::kSeedBytes, 0);
        tz::RansCtx dc2 = ctx;
        dc2.seed_out = sb2.data();
        int sa = -1, sb = -1;
        kr->rans_decode2(tz::cpu::RansStream{out.data(), out.size(), n, dec.data(), back.data(), dc},
                         &sa, tz::cpu::RansStream{out.data(), out.size(), n, dec.data(), b2.data(), dc2}, &sb);
        EXPECT_EQ(sa, tz::kOk) << tag;
        EXPECT_EQ(sb, tz::kOk) << tag;
        EXPECT_EQ(b2, sym) << tag;
        EXPECT_EQ(sb2, seed) << tag;
        std::vector<Bytes> raw(3, Bytes(n));
        for (auto& r : raw)
          for (auto& m : r) m = (uint8_t)rng();
        const uint8_t* rp[3] = {raw[0].data(), raw[1].data(), raw[2].data()};
        for (const uint8_t dt : {tz::kBF16, tz::kF16, tz::kF32}) {
          const uint32_t es = tz::dtype_elem_size(dt);
          Bytes merged((size_t)es * n), want((size_t)es * n), sb3(tz::kSeedBytes, 0);
          const uint8_t* st[4] = {sym.data(), rp[0], rp[1], rp[2]};
          tz::merge_fields(dt, st, n, want.data());
          tz::RansCtx dc3 = ctx;
          dc3.seed_out = sb3.data();
          ASSERT_EQ(kr->rans_decode_merged(dt, out.data(), out.size(), n, dec.data(), dc3, rp, merged.data()), tz::kOk)
              << tag << " dtype " << (int)dt;
          EXPECT_EQ(sb3, seed) << tag;
          EXPECT_EQ(merged, want) << tag << " dtype " << (int)dt;
        }
      }
    }
  }
}

// Every dtype, levels 1-3, a partial last block, a frame of one short block:
// the frame is seeded exactly where the encoder's rule says, decodes to the
// input on every SIMD path, and is, seeds moved back, byte for byte the
// frame the encoder writes with seeding off.
TEST(SeededLanes, FramesOfEveryDtypeRoundTripOnEveryPath) {
  const tz_dtype dts[] = {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2};
  const auto paths = tz::test::paths_to_test(tz::test::current_test_name());
  uint64_t seeded_total = 0;
  for (tz_dtype dt : dts) {
    const uint32_t es = tz::dtype_elem_size((uint8_t)dt);
    for (size_t n_elems : {(size_t)2 * 4096 + 77, (size_t)150, (size_t)5000}) {
      const Bytes src = tzt::real_bytes(dt, n_elems * es);
      for (int level = 1; level <= 3; ++level) {
        const std::string tag = tzt::dtype_label(dt) + " n=" + std::to_string(n_elems) + " level " +
                                std::to_string(level);
        const Bytes f = compress(src, dt, level, 4096);
        ASSERT_FALSE(f.empty()) << tag;
        tz_frame_info info{};
        ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info))) << tag;
        uint8_t kinds[4] = {};
        for (unsigned k = 0; k < info.n_streams; ++k) kinds[k] = (uint8_t)info.stream_kind[k];
        EXPECT_EQ(f[7], tz::encoder_frame_flags(f[4], (int)info.n_streams, kinds)) << tag;
        if (dt == TZ_DTYPE_F8_E4M3 || dt == TZ_DTYPE_F8_E5M2) {
          EXPECT_EQ(f[7] & tz::kFlagSeededLanes, 0) << tag << ": no raw stream";
        }
        const uint64_t s = seeded_streams(f);
        seeded_total += s;
        for (tz::cpu::SimdPath p : paths) {
          tz::cpu::ScopedSimdPath use(p);
          Bytes back;
          ASSERT_EQ(decompress(f, &back, src.size()), 0) << tag << " " << tz::cpu::simd_path_name(p);
          ASSERT_EQ(back, src) << tag << " " << tz::cpu::simd_path_name(p);
        }
        Bytes plain;
        {
          NoSeeds off;
          plain = compress(src, dt, level, 4096);
        }
        EXPECT_EQ(plain[7], 0) << tag;
        if (s) {
          EXPECT_LT(f.size(), plain.size()) << tag;
        }
        EXPECT_EQ(tzt::unseed_frame(f), plain) << tag;
        Bytes back;
        ASSERT_EQ(decompress(plain, &back, src.size()), 0) << tag;
        EXPECT_EQ(back, src) << tag;
      }
    }
  }
  EXPECT_GT(seeded_total, 0u);  // the loop above did see seeded streams
}

// Lane-context streams (kind 3) seeded: F32 rows of squared Gaussians with a
// per-row scale (Adam v), level 3.
TEST(SeededLanes, LaneContextFramesAreSeeded) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(4 * 16384);
  for (size_t i = 0; i < v.size(); ++i) {
    const float scale = std::ldexp(1.0f, -(int)((i / 256) % 9) - 12);
    const float g = nd(rng);
    v[i] = g * g * scale;
  }
  Bytes src(v.size() * 4);
  std::memcpy(src.data(), v.data(), src.size());
  const Bytes f = compress(src, TZ_DTYPE_F32, 3, 16384);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info)));
  ASSERT_EQ(info.stream_kind[0], tz::kKindRansCtx);
  ASSERT_TRUE(f[7] & tz::kFlagSeededLanes);
  EXPECT_GT(seeded_streams(f), 0u);
  for (tz::cpu::SimdPath p : tz::test::paths_to_test(tz::test::current_test_name())) {
    tz::cpu::ScopedSimdPath use(p);
    Bytes back;
    ASSERT_EQ(decompress(f, &back, src.size()), 0) << tz::cpu::simd_path_name(p);
    ASSERT_EQ(back, src) << tz::cpu::simd_path_name(p);
  }
}

// Frames written by the encoder before seeding (version 3, flags 0; copied
// from the fuzz corpus as it was) decode on every path: every block's
// checksum matches, and every path gives the same bytes.
TEST(SeededLanes, FramesWrittenBeforeSeedingStillDecode) {
  const std::filesystem::path dir = std::filesystem::path(TZ_TEST_DATA_DIR) / "frames-v3-flags0";
  int n_frames = 0, would_seed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    const Bytes f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(f.size(), 32u) << e.path();
    EXPECT_EQ(f[4], tz::kFormatVersionSets) << e.path();
    EXPECT_EQ(f[7], 0) << e.path();
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info))) << e.path();
    uint8_t kinds[4] = {};
    for (unsigned k = 0; k < info.n_streams; ++k) kinds[k] = (uint8_t)info.stream_kind[k];
    would_seed += tz::encoder_frame_flags(f[4], (int)info.n_streams, kinds) != 0;
    Bytes first;
    for (tz::cpu::SimdPath p : tz::test::paths_to_test(tz::test::current_test_name())) {
      tz::cpu::ScopedSimdPath use(p);
      Bytes back;
      ASSERT_EQ(decompress(f, &back, info.raw_size), 0) << e.path() << " " << tz::cpu::simd_path_name(p);
      if (first.empty()) first = back;
      EXPECT_EQ(back, first) << e.path() << " " << tz::cpu::simd_path_name(p);
    }
    ++n_frames;
  }
  EXPECT_GE(n_frames, 4);
  EXPECT_GT(would_seed, 0);  // frames that the encoder now writes seeded
}

}  // namespace
