// Lane contexts (stream kind 3, doc/format.md 5.6; format version 2, and
// version 3 from the default level on): the exponent stream is coded with
// one of up to 4 tables chosen by the symbol the same lane coded one step
// earlier. Round trips, the encoder's choice at every level, every SIMD
// kernel set against the portable coder, and malformed headers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/format.h"
#include "codec/policy.h"
#include "codec/policy_lane_ctx.h"
#include "codec/rans.h"
#include "common/crc32c.h"
#include "cpu/kernels.h"
#include "simd_paths.h"
#include "tensorzip/tensorzip.h"
#include "tz_malformed_frames.h"
#include "tz_test_data.h"
#include "tz_test_util.h"

namespace {

using Bytes = std::vector<uint8_t>;

using tzt::compress;  // records a failure and returns {} on error

Bytes decompress(const Bytes& frame, size_t raw, unsigned threads = 1) {
  Bytes out(raw + 1);
  const size_t r = tz_decompress(out.data(), out.size(), frame.data(), frame.size(), threads);
  EXPECT_FALSE(tz_is_error(r)) << tz_get_error_name(r) << ": " << tz_last_error_detail();
  out.resize(tz_is_error(r) ? 0 : r);
  return out;
}

// Adam-v-like data: rows of 256 squared Gaussians with a per-row scale, so
// that an element's exponent depends on its row (which lane contexts see:
// element i - 32 is in the same row).
std::vector<float> row_scaled(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  float scale = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
    const float g = nd(rng);
    v[i] = g * g * scale;
  }
  return v;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  memcpy(b.data(), v.data(), b.size());
  return b;
}

// Table section of a frame: kind of stream 0 (byte 32).
uint8_t stream0_kind(const Bytes& f) { return f.size() > 32 ? f[32] : 0xFF; }

// Recomputes the header CRC after an edit of header/tables/index.
void fix_header_crc(Bytes& f) {
  const uint32_t ts = tz::load_le32(f.data() + 24), nb = tz::load_le32(f.data() + 20);
  const size_t prefix = 32 + (size_t)ts + 4 * (size_t)nb;
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    tz::crc32c_make_table(t.data());
    return t;
  }();
  uint32_t st = tz::crc32c_update(~0u, f.data(), 28, table.data());
  st = tz::crc32c_update(st, f.data() + 32, prefix - 32, table.data());
  tz::store_le32(f.data() + 28, ~st);
}

// Bytes of stream 0's payloads (coded or raw) over the blocks of a frame.
uint64_t stream0_bytes(const Bytes& f) {
  tz_frame_info info{};
  EXPECT_FALSE(tz_is_error(tz_frame_inspect(f.data(), f.size(), &info)));
  uint64_t pos = info.prefix_size, total = 0;
  const uint32_t ts = tz::load_le32(f.data() + 24);
  for (unsigned b = 0; b < info.n_blocks; ++b) {
    const uint32_t w = tz::load_le32(f.data() + pos + 4);
    total += f[4] >= tz::kFormatVersionSets ? tz::stream_word_v3_size(w) : tz::stream_word_size(w);
    pos += tz::load_le32(f.data() + 32 + ts + 4 * b);
  }
  return total;
}

// Order-0 code length in bytes of stream 0 (the F32 exponent) of src.
double exponent_h0_bytes(const Bytes& src) {
  std::vector<double> c(256, 0.0);
  for (size_t i = 0; i + 4 <= src.size(); i += 4) c[(tz::load_le32(src.data() + i) >> 23) & 0xFF] += 1;
  const double n = (double)(src.size() / 4);
  double bits = 0;
  for (double x : c)
    if (x > 0) bits -= x * std::log2(x / n);
  return bits / 8;
}

TEST(LaneCtx, EveryLevelUsesContextsOnRowScaledData) {
  const Bytes src = f32_bytes(row_scaled(1 << 18, 1));
  for (int level : {0, 1, 2, 3}) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Bytes f = compress(src, TZ_DTYPE_F32, level);
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(f[4], tz::kFormatVersionSets);
    EXPECT_EQ(stream0_kind(f), tz::kKindRansCtx);
    const uint32_t n_ctx = f[34];
    EXPECT_GE(n_ctx, 2u);
    EXPECT_LE(n_ctx, tz::kMaxContexts);
    // The exponent of a row-scaled element is far more predictable from its
    // neighbour than on its own: stream 0, lane states included, is clearly
    // below its order-0 code length, which no single table can reach.
    EXPECT_LT((double)stream0_bytes(f), 0.95 * exponent_h0_bytes(src));
    EXPECT_EQ(decompress(f, src.size()), src);
    EXPECT_EQ(decompress(f, src.size(), 4), src);
  }
  // The same frame in the version-2 layout decodes to the same bytes.
  const Bytes v2 = tzt::as_version12(compress(src, TZ_DTYPE_F32, 1));
  EXPECT_EQ(v2[4], tz::kFormatVersionCtx);
  EXPECT_EQ(decompress(v2, src.size()), src);
}

TEST(LaneCtx, EveryFloatDtypeAndOddSizesRoundTrip) {
  for (size_t n : {(size_t)16384, (size_t)16385, (size_t)65536 + 33, (size_t)200003}) {
    const std::vector<float> v = row_scaled(n, (uint32_t)n);
    const Bytes f32 = f32_bytes(v);
    const std::pair<tz_dtype, Bytes> cases[] = {{TZ_DTYPE_F32, f32},
                                                {TZ_DTYPE_BF16, tzt::to_bf16(v)},
                                                {TZ_DTYPE_F16, tzt::to_f16(v)},
                                                {TZ_DTYPE_F8_E4M3, tzt::to_f8_e4m3(v)},
                                                {TZ_DTYPE_F8_E5M2, tzt::to_f8_e5m2(v)}};
    for (const auto& [dt, src] : cases) {
      for (unsigned be : {4096u, 0u}) {
        SCOPED_TRACE("dtype " + std::to_string(dt) + " n " + std::to_string(n) + " block " + std::to_string(be));
        const Bytes f = compress(src, dt, 3, be);
        EXPECT_EQ(decompress(f, src.size()), src);
        EXPECT_EQ(decompress(f, src.size(), 3), src);
        // Level 3 never loses against level 2 by more than the context header.
        EXPECT_LE(f.size(), compress(src, dt, 2, be).size() + 4);
      }
    }
  }
}

TEST(LaneCtx, RealOptimizerStateSlice) {
  // Adam's second moment of a real attention projection (rows 0..127 of
  // exp_avg_sq.blocks.2.qkv.weight in the fixture): the case lane contexts
  // were made for. Measured offline: exponent stream -13.7% with 4 contexts.
  const auto ts = tzt::read_safetensors(TZ_TEST_DATA_DIR "/fixture-slice-adam-v-q.safetensors");
  ASSERT_EQ(ts.size(), 1u);
  const Bytes& src = ts[0].data;
  // Levels 2 and 3 find the contexts: stream 0 ends well below its order-0
  // code length (which bounds any single table). Level 1 searches frames of
  // kCtxMinBytesLevel1 bytes on only (the slice is smaller): one table.
  ASSERT_LT(src.size(), tz::kCtxMinBytesLevel1);
  for (int level : {1, 2, 3}) {
    SCOPED_TRACE("level " + std::to_string(level));
    const Bytes f = compress(src, TZ_DTYPE_F32, level);
    EXPECT_EQ(decompress(f, src.size()), src);
    if (level == 1) {
      EXPECT_EQ(stream0_kind(f), tz::kKindRans);
      continue;
    }
    EXPECT_EQ(stream0_kind(f), tz::kKindRansCtx);
    EXPECT_LT((double)stream0_bytes(f), 0.92 * exponent_h0_bytes(src))
        << stream0_bytes(f) << " vs " << exponent_h0_bytes(src);
  }
  // The same rows twice over (above the level-1 size) get them at level 1 too.
  Bytes twice = src;
  while (twice.size() < tz::kCtxMinBytesLevel1) twice.insert(twice.end(), src.begin(), src.end());
  const Bytes f1 = compress(twice, TZ_DTYPE_F32, 1);
  EXPECT_EQ(stream0_kind(f1), tz::kKindRansCtx);
  EXPECT_EQ(decompress(f1, twice.size()), twice);
  // Other optimizer tensors of the slice: level 3 never worse than level 2.
  for (const auto& t : tzt::fp32_slice()) {
    SCOPED_TRACE(t.name);
    const Bytes a = compress(t.data, TZ_DTYPE_F32, 2), b = compress(t.data, TZ_DTYPE_F32, 3);
    EXPECT_LE(b.size(), a.size());
    EXPECT_EQ(decompress(b, t.data.size()), t.data);
  }
}

TEST(LaneCtx, NoContextsOnSmallOrUniformInputs) {
  for (int level : {1, 3}) {
    const Bytes small = f32_bytes(row_scaled(1000, 3));
    EXPECT_NE(stream0_kind(compress(small, TZ_DTYPE_F32, level)), tz::kKindRansCtx);
    const Bytes zeros(1 << 18, 0);
    EXPECT_NE(stream0_kind(compress(zeros, TZ_DTYPE_F32, level)), tz::kKindRansCtx);
    // Noise: every stream raw, a version-1 frame.
    const Bytes noise = tzt::hash_stream(1 << 18, 9);
    const Bytes f = compress(noise, TZ_DTYPE_F32, level);
    EXPECT_EQ(f[4], tz::kFormatVersion);
    EXPECT_EQ(decompress(f, noise.size()), noise);
  }
}

TEST(LaneCtx, RandomAccessDecodesBlockRanges) {
  const Bytes src = f32_bytes(row_scaled(4096 * 10 + 100, 5));
  const Bytes f = compress(src, TZ_DTYPE_F32, 3, 4096);
  ASSERT_EQ(f[4], tz::kFormatVersionSets);
  ASSERT_EQ(stream0_kind(f), tz::kKindRansCtx);
  const size_t prefix = tz_frame_prefix_size(f.data(), f.size());
  ASSERT_FALSE(tz_is_error(prefix));
  for (unsigned first : {0u, 3u, 9u}) {
    for (unsigned count : {1u, 2u}) {
      uint64_t off = 0, len = 0, roff = 0, rlen = 0;
      ASSERT_FALSE(tz_is_error(tz_frame_block_range(f.data(), prefix, first, count, &off, &len, &roff, &rlen)));
      Bytes out(4096 * 4 * count);
      const size_t r = tz_decompress_blocks(out.data(), out.size(), f.data(), prefix, f.data() + off, len, first,
                                            count, 1);
      ASSERT_FALSE(tz_is_error(r)) << tz_last_error_detail();
      const size_t begin = (size_t)first * 4096 * 4;
      const size_t end = std::min(src.size(), begin + (size_t)count * 4096 * 4);
      ASSERT_EQ(r, end - begin);
      EXPECT_TRUE(std::equal(out.begin(), out.begin() + (long)r, src.begin() + (long)begin));
    }
  }
}

TEST(LaneCtx, MalformedContextHeadersAreRejected) {
  const Bytes src = f32_bytes(row_scaled(1 << 16, 7));
  const Bytes good = compress(src, TZ_DTYPE_F32, 3);
  ASSERT_EQ(stream0_kind(good), tz::kKindRansCtx);
  auto rejected = [&](Bytes f, const char* what) {
    fix_header_crc(f);
    Bytes out(src.size());
    const size_t r = tz_decompress(out.data(), out.size(), f.data(), f.size(), 1);
    EXPECT_TRUE(tz_is_error(r)) << what;
  };
  Bytes v1 = good;
  v1[4] = tz::kFormatVersion;  // kind 3 needs version 2 (and compact tables version 3)
  rejected(v1, "kind 3 in a version-1 frame");
  for (uint8_t n : {0, 1, 5, 255}) {
    Bytes b = good;
    b[34] = n;
    rejected(b, "context count out of range");
  }
  Bytes v4 = good;
  v4[4] = 4;
  rejected(v4, "unknown version");
  // Without the header CRC fix the edit is caught by the CRC.
  Bytes nocrc = good;
  nocrc[33] ^= 1;
  Bytes out(src.size());
  EXPECT_TRUE(tz_is_error(tz_decompress(out.data(), out.size(), nocrc.data(), nocrc.size(), 1)));
  // A changed context base decodes to other symbols: the block checks catch it.
  Bytes base = good;
  base[33] ^= 1;
  rejected(base, "context base changed");
}

TEST(LaneCtx, EncodersAndDecodersAgreeOnEdgeContexts) {
  // Random streams with every context from 1 to kMaxContexts and bases at
  // the symbol range edges, against per-context tables: the portable coder
  // round-trips, and every SIMD kernel set gives its bytes and statuses.
  const auto kernels = tz::test::simd_kernels_to_test("LaneCtx.EncodersAndDecodersAgreeOnEdgeContexts");
  std::mt19937 rng(11);
  for (uint32_t nc = 1; nc <= tz::kMaxContexts; ++nc) {
    for (uint32_t base : {0u, 3u, 254u, 255u}) {
      // Mostly long streams; some of at most two steps (partial last step
      // with and without a previous step).
      const uint32_t n = base == 3u ? 1u + rng() % 70 : 1000 + rng() % 5000;
      Bytes sym(n);
      for (auto& s : sym) s = (uint8_t)(rng() % 8 == 0 ? rng() % 256 : 250 + rng() % 6);
      tz::RansCtx rc;
      rc.base = base;
      rc.n = nc;
      std::vector<uint64_t> counts((size_t)nc * 256, 0);
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t c = i < (uint32_t)tz::kLanes ? 0 : tz::rans_ctx_of(sym[i - tz::kLanes], rc);
        ++counts[(size_t)c * 256 + sym[i]];
      }
      std::vector<uint32_t> freq((size_t)nc * 256);
      std::vector<tz::RansEncSym> enc((size_t)nc * 256);
      std::vector<uint32_t> dec((size_t)nc * tz::kProbScale);
      for (uint32_t c = 0; c < nc; ++c) {
        if (tz::rans_normalize(counts.data() + 256 * c, freq.data() + 256 * c) == 0) freq[256 * c] = tz::kProbScale;
        tz::rans_build_enc(freq.data() + 256 * c, enc.data() + 256 * c);
        tz::rans_build_dec(freq.data() + 256 * c, dec.data() + (size_t)c * tz::kProbScale);
      }
      std::vector<uint16_t> words(n);
      Bytes payload(tz::kRansStateBytes + 2 * (size_t)n + 64);
      const size_t sz = tz::rans_encode_ctx(sym.data(), n, enc.data(), rc, words.data(), payload.data(), SIZE_MAX);
      ASSERT_GT(sz, 0u);
      Bytes out(n, 0), out_simd(n, 0);
      ASSERT_EQ(tz::rans_decode_ctx(payload.data(), sz, n, dec.data(), rc, out.data()), tz::kOk);
      EXPECT_EQ(out, sym);
      std::vector<uint32_t> fst((size_t)nc * 256);
      for (uint32_t c = 0; c < nc; ++c) tz::cpu::build_freq_start(freq.data() + 256 * c, fst.data() + 256 * c);
      for (const tz::cpu::CodecKernels* k : kernels) {
        // Every SIMD encoder writes the same bytes (tables concatenated).
        const char* path = tz::cpu::simd_path_name(k->path);
        std::vector<uint16_t> words2(n);
        Bytes payload2(payload.size());
        const size_t sz2 = k->rans_encode(sym.data(), n, tz::cpu::EncTables{enc.data(), fst.data()}, rc, words2.data(),
                                          payload2.data(), SIZE_MAX);
        ASSERT_EQ(sz2, sz) << path;
        EXPECT_TRUE(std::equal(payload.begin(), payload.begin() + (long)sz, payload2.begin()))
            << path << " n=" << n << " contexts=" << nc << " base=" << base;
        ASSERT_EQ(k->rans_decode(payload.data(), sz, n, dec.data(), rc, out_simd.data()), tz::kOk) << path;
        EXPECT_EQ(out_simd, sym) << path;
        // Two streams in lockstep.
        Bytes a(n), b(n);
        int sa = -1, sb = -1;
        k->rans_decode2(tz::cpu::RansStream{payload.data(), sz, n, dec.data(), a.data(), rc}, &sa,
                        tz::cpu::RansStream{payload.data(), sz, n, dec.data(), b.data(), rc}, &sb);
        EXPECT_EQ(sa, tz::kOk) << path;
        EXPECT_EQ(sb, tz::kOk) << path;
        EXPECT_EQ(a, sym) << path;
        EXPECT_EQ(b, sym) << path;
      }
      // A corrupted word must be rejected identically by both decoders.
      if (sz == tz::kRansStateBytes) continue;  // short streams may carry no word
      Bytes bad(payload.begin(), payload.begin() + (long)sz);
      const size_t mid = tz::kRansStateBytes + (sz - tz::kRansStateBytes) / 2;
      ASSERT_LT(mid, bad.size());
      bad.at(mid) ^= 0x5A;
      const int st = tz::rans_decode_ctx(bad.data(), sz, n, dec.data(), rc, out.data());
      for (const tz::cpu::CodecKernels* k : kernels)
        EXPECT_EQ(k->rans_decode(bad.data(), sz, n, dec.data(), rc, out_simd.data()), st)
            << tz::cpu::simd_path_name(k->path);
    }
  }
}

}  // namespace

#if defined(__x86_64__)
// The AVX2 joint counts of stream 0 (the lane-context search's statistics,
// also used by the AVX-512 path) equal the definition, counted one pair at a
// time: row 0 for a block's first step, else policy_ctx_row of the lane
// predecessor; with skip = kLanes the first step only gives predecessors (the
// exact pass counts a block after its first-pass elements so). The symbol
// histogram it adds is the counted elements'. On real data of every float
// dtype (concentrated exponents), on random bytes (mostly outside the packed
// window), at window starts 0, 1, 2, the middle and the top, and on sizes
// around the step and chunk lengths; every count is compared, added to
// tables that are not empty.
TEST(LaneCtx, Avx2JointCountsEqualTheDefinition) {
  if (!tz::cpu::simd_path_cpu_has(tz::cpu::SimdPath::kAvx2)) GTEST_SKIP() << "this CPU lacks AVX2";
  constexpr size_t kJ = (size_t)tz::kCtxJointRows * 256;
  std::mt19937 rng(5);
  Bytes noise(4 * 5000);
  for (auto& b : noise) b = (uint8_t)rng();
  int cases = 0;
  for (const tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2}) {
    const uint32_t es = tz::dtype_elem_size((uint8_t)dt);
    for (const bool random : {false, true}) {
      for (const uint32_t n : {1u, 31u, 32u, 33u, 64u, 1000u, 1024u, 1056u, 1057u, 2048u, 5000u}) {
        const Bytes src = random ? Bytes(noise.begin(), noise.begin() + (long)n * es) : tzt::real_bytes(dt, (size_t)n * es);
        uint64_t first[256] = {};
        for (uint32_t i = 0; i < n; ++i) ++first[tz::field_byte((uint8_t)dt, src.data(), i, 0)];
        for (const uint32_t lo : {tz::policy_ctx_window(first), 0u, 1u, 2u, 120u, 256u - tz::kCtxWindowRows}) {
          for (const uint32_t skip : {0u, (uint32_t)tz::kLanes}) {
            if (skip >= n) continue;
            // Both start from the same non-zero counts.
            std::vector<uint32_t> want(kJ, 7), got(kJ, 7), want_hist(256, 3), got_hist(256, 3);
            for (uint32_t i = skip; i < n; ++i) {
              const uint32_t row = i < (uint32_t)tz::kLanes
                                       ? 0u
                                       : tz::policy_ctx_row(tz::field_byte((uint8_t)dt, src.data(), i - tz::kLanes, 0), lo);
              ++want[(size_t)row * 256 + tz::field_byte((uint8_t)dt, src.data(), i, 0)];
              ++want_hist[tz::field_byte((uint8_t)dt, src.data(), i, 0)];
            }
            tz::cpu::joint_counts_avx2((uint8_t)dt, src.data(), n, skip, lo, got.data(), got_hist.data());
            ASSERT_EQ(got, want) << "dtype " << dt << " n " << n << " lo " << lo << " skip " << skip
                                 << (random ? " random" : " real");
            ASSERT_EQ(got_hist, want_hist) << "dtype " << dt << " n " << n << " lo " << lo << " skip " << skip;
            std::vector<uint32_t> no_hist(kJ, 7);  // without the histogram: the same joint counts
            tz::cpu::joint_counts_avx2((uint8_t)dt, src.data(), n, skip, lo, no_hist.data(), nullptr);
            ASSERT_EQ(no_hist, want);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 2 * (11 + 8) * 6);  // skip = kLanes on the 8 sizes above kLanes
}
#endif
