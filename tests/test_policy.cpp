// The encoder policy (codec/policy.h) and the table-section writer
// (codec/frame_prefix.h), tested directly, and the CPU encoder's table
// sections checked against the policy run step by step on the same data.
// (The CUDA encoder's frames are compared with the CPU's byte for byte in
// tests/cuda/emu, so they follow the same decisions.)
#include <gtest/gtest.h>

#include <random>

#include "codec/fields.h"
#include "codec/policy.h"
#include "tz_test_util.h"

namespace {

using namespace tz;
using tzt::Bytes;

TEST(Policy, Parameters) {
  for (int l = -3; l <= 5; ++l) EXPECT_EQ(encode_level_valid(l), l >= -1 && l <= 3) << l;
  EXPECT_EQ(policy_level(0), 1);
  EXPECT_EQ(policy_level(-1), -1);
  EXPECT_EQ(policy_level(3), 3);
  EXPECT_EQ(encode_dtype(kBF16, 6), kBF16);
  EXPECT_EQ(encode_dtype(kBF16, 7), kBytes);
  EXPECT_EQ(encode_dtype(kF32, 6), kBytes);
  EXPECT_EQ(encode_dtype(kF8E4M3, 7), kF8E4M3);
  EXPECT_EQ(policy_block_elems(0, kBF16), kDefaultBlockElems);
  EXPECT_EQ(policy_block_elems(0, kBytes), kDefaultBytesBlockElems);
  EXPECT_EQ(policy_block_elems(8192, kBytes), 8192u);
  EXPECT_TRUE(block_elems_valid(4096));
  EXPECT_TRUE(block_elems_valid(1u << 20));
  EXPECT_FALSE(block_elems_valid(2048));
  EXPECT_FALSE(block_elems_valid(6144));
  EXPECT_FALSE(block_elems_valid(1u << 21));
  EXPECT_FALSE(block_elems_valid(0));
  EXPECT_TRUE(encode_size_valid(kMaxRawSize));
  EXPECT_FALSE(encode_size_valid(kMaxRawSize + 1));
  uint32_t nb = 0;
  EXPECT_TRUE(encode_block_count(UINT64_C(4096) * UINT32_MAX, 4096, &nb));
  EXPECT_EQ(nb, UINT32_MAX);
  EXPECT_FALSE(encode_block_count(UINT64_C(4096) * UINT32_MAX + 1, 4096, &nb));
  EXPECT_TRUE(encode_block_count(0, 4096, &nb));
  EXPECT_EQ(nb, 0u);
}

TEST(Policy, PassesAndFastTables) {
  EXPECT_EQ(policy_bytes_kind(-1), kKindRaw);
  EXPECT_EQ(policy_bytes_kind(1), kKindZstd);
  EXPECT_EQ(policy_bytes_kind(3), kKindZstd);
  EXPECT_FALSE(policy_codes_streams(-1, kBF16, 10000, 1));
  EXPECT_FALSE(policy_codes_streams(1, kBytes, 10000, 1));
  EXPECT_FALSE(policy_codes_streams(2, kF32, 0, 0));
  EXPECT_FALSE(policy_codes_streams(1, kF8E5M2, 1, 1));  // too small to pay (short path)
  EXPECT_TRUE(policy_codes_streams(1, kF8E5M2, 168, 1));
  EXPECT_FALSE(policy_sampled(kSampleElems));
  EXPECT_TRUE(policy_sampled(2 * kSampleElems));
  EXPECT_EQ(policy_first_pass_elems(4096), 4096u);
  EXPECT_EQ(policy_first_pass_elems(65536), kSampleElems);
  EXPECT_TRUE(policy_fast_tables(8192, 1, kFastTablesMinBlocks));
  EXPECT_FALSE(policy_fast_tables(8192, 1, kFastTablesMinBlocks - 1));
  EXPECT_FALSE(policy_fast_tables(8192, 2, 100));
  EXPECT_FALSE(policy_fast_tables(4096, 1, 100));
  EXPECT_TRUE(policy_second_pass(8192, 2, 100, true));
  EXPECT_FALSE(policy_second_pass(8192, 2, 100, false));
  EXPECT_FALSE(policy_second_pass(8192, 1, 100, true));  // fast tables instead
  EXPECT_TRUE(policy_second_pass(8192, 1, 7, true));     // too few blocks for fast tables
  EXPECT_FALSE(policy_second_pass(4096, 2, 100, true));  // the first pass was exact
}

// Symbol 0 with count c, symbols 1..255 with 100 each.
void peaked(uint64_t c, uint64_t* h) {
  for (int s = 0; s < 256; ++s) h[s] = 100;
  h[0] = c;
}

TEST(Policy, SampleScreeningByLevel) {
  uint64_t h[256], norm[256];
  uint32_t f[256];
  for (int s = 0; s < 256; ++s) h[s] = 1000;
  EXPECT_FALSE(policy_sample_wants(1, h, f, norm)) << "uniform bytes never pay";
  EXPECT_FALSE(policy_sample_wants(2, h, f, norm));
  for (int s = 0; s < 256; ++s) h[s] = s == 7 ? 4096 : 0;
  EXPECT_TRUE(policy_sample_wants(1, h, f, norm)) << "a constant stream pays";
  // Level 1 wants a 1% saving, level 2 any saving: a peak of growing height
  // is wanted by level 2 first, and level 1 never wants what level 2 does not.
  bool only_level2 = false;
  for (uint64_t c = 100; c < 20000; c += 25) {
    peaked(c, h);
    const bool w1 = policy_sample_wants(1, h, f, norm), w2 = policy_sample_wants(2, h, f, norm);
    EXPECT_FALSE(w1 && !w2) << c;
    only_level2 |= w2 && !w1;
  }
  EXPECT_TRUE(only_level2);
}

TEST(Policy, ExactKindCountsEveryOverhead) {
  uint64_t h[256] = {}, norm[256];
  uint32_t freq[256];
  uint64_t coded = 0;
  EXPECT_EQ(policy_exact_kind(2, h, 0, 1, freq, norm, &coded), kKindRaw) << "empty histogram";
  std::mt19937 rng(1);
  std::normal_distribution<double> nd(120.0, 3.0);
  uint64_t n = 0;
  for (int i = 0; i < 20000; ++i, ++n) ++h[std::clamp((int)nd(rng), 0, 255)];
  ASSERT_EQ(policy_exact_kind(2, h, n, 1, freq, norm, &coded), kKindRans);
  uint32_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    sum += freq[s];
    EXPECT_EQ(freq[s] != 0, h[s] != 0) << s;
  }
  EXPECT_EQ(sum, kProbScale);
  uint8_t tbuf[kFreqTableMaxBytes];
  EXPECT_EQ(coded, coded_stream_bytes(h, freq, 1, rans_write_table(freq, tbuf)));
  // Every block adds its lane states: with enough blocks the same symbols do
  // not pay any more.
  const uint64_t per_block = kRansStateBytes + 2;
  const uint64_t blocks_to_raw = (n - coded) / per_block + 2;
  EXPECT_EQ(policy_exact_kind(2, h, n, blocks_to_raw, freq, norm, &coded), kKindRaw);
  EXPECT_EQ(policy_exact_kind(2, h, n, blocks_to_raw - 2, freq, norm, &coded), kKindRans);
  for (int s = 0; s < 256; ++s) h[s] = 1000;
  EXPECT_EQ(policy_exact_kind(2, h, 256000, 1, freq, norm, &coded), kKindRaw);
}

TEST(Policy, FastTablesKeepMinToMaxCodable) {
  uint64_t sample[256] = {}, counts[256], norm[256];
  uint32_t freq[256];
  for (int s = 10; s <= 20; ++s) sample[s] = (uint64_t)(s == 15 ? 3000 : 100);
  // Symbols 5..30 occur in the tensor (min/max) but not all in the sample.
  ASSERT_EQ(policy_fast_kind(1, sample, 5, 30, 1u << 20, 16, freq, counts, norm), kKindRans);
  uint32_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    sum += freq[s];
    EXPECT_EQ(freq[s] != 0, s >= 5 && s <= 30) << s;
  }
  EXPECT_EQ(sum, kProbScale);
  EXPECT_GT(freq[15], freq[12]);
  // A sample with no symbols has no estimate.
  uint64_t empty[256] = {};
  EXPECT_EQ(policy_fast_kind(1, empty, 0, 255, 100, 8, freq, counts, norm), kKindRaw);
  // Uniform symbols do not pay.
  for (int s = 0; s < 256; ++s) sample[s] = 64;
  EXPECT_EQ(policy_fast_kind(1, sample, 0, 255, 1u << 20, 16, freq, counts, norm), kKindRaw);
}

TEST(Policy, LaneContextGates) {
  EXPECT_TRUE(policy_tries_lane_contexts(3, 0, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(2, 0, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 1, kKindRans, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 0, kKindRaw, kCtxMinElems));
  EXPECT_FALSE(policy_tries_lane_contexts(3, 0, kKindRans, kCtxMinElems - 1));
  EXPECT_TRUE(lane_contexts_pay(994, 1000));
  EXPECT_FALSE(lane_contexts_pay(995, 1000));
}

// The table-section entries the encoders write are what parse_table_section
// reads back, and their sizes are known before writing.
TEST(Policy, StreamTableEntriesRoundTrip) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    uint64_t counts[256] = {};
    const int present = 1 + (int)(rng() % 256);
    for (int i = 0; i < present; ++i) counts[rng() % 256] += 1 + rng() % (trial % 2 ? 100000 : 50);
    uint32_t f[3][256];
    for (auto& t : f) ASSERT_GT(rans_normalize(counts, t), 0);
    uint8_t tbuf[kFreqTableMaxBytes];
    EXPECT_EQ(freq_table_size(f[0]), rans_write_table(f[0], tbuf));
    // F32-like frame: raw, rANS, rANS with 2 contexts (version 2), raw.
    FrameHeader h{};
    h.version = kFormatVersionCtx;
    h.dtype = kF32;
    h.n_streams = 4;
    const uint8_t kinds[4] = {kKindRaw, kKindRans, kKindRansCtx, kKindRaw};
    const RansCtx ctx2{(uint32_t)(rng() % 256), 2};
    Bytes sec;
    for (int k = 0; k < 4; ++k) {
      const RansCtx rc = kinds[k] == kKindRansCtx ? ctx2 : RansCtx{};
      const uint32_t* fr = kinds[k] == kKindRansCtx ? &f[1][0] : &f[0][0];
      const size_t at = sec.size(), sz = stream_table_size(kinds[k], fr, rc);
      sec.resize(at + sz + 8, 0xEE);
      EXPECT_EQ(write_stream_table(kinds[k], fr, rc, sec.data() + at), sz);
      EXPECT_EQ(sec[at + sz], 0xEE) << "wrote past its size";
      sec.resize(at + sz);
    }
    tzt::Bytes padded = sec;
    while (padded.size() % 4) padded.push_back(0);
    h.tables_size = (uint32_t)padded.size();
    FrameTables t{};
    ASSERT_EQ(parse_table_section(h, padded.data(), &t), kDefectNone);
    EXPECT_EQ(t.n_tables, 3u);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(t.kind[k], kinds[k]);
    EXPECT_EQ(t.ctx[2].base, ctx2.base);
    EXPECT_EQ(t.ctx[2].n, 2u);
    EXPECT_EQ(memcmp(t.freq[t.first_table[1]], f[0], sizeof f[0]), 0);
    EXPECT_EQ(memcmp(t.freq[t.first_table[2]], f[1], sizeof f[1]), 0);
    EXPECT_EQ(memcmp(t.freq[t.first_table[2] + 1], f[2], sizeof f[2]), 0);
  }
}

// The table section the policy gives for `data` (no lane contexts), with
// the decision procedure of codec/policy.h run step by step.
Bytes policy_table_section(uint8_t dt, const Bytes& data, int level, uint32_t block_elems) {
  const uint32_t es = dtype_elem_size(dt);
  const uint64_t n_elems = data.size() / es;
  uint32_t n_blocks = 0;
  EXPECT_TRUE(encode_block_count(n_elems, block_elems, &n_blocks));
  const int K = dtype_stream_count(dt);
  std::vector<Bytes> streams(K, Bytes(n_elems));
  {
    uint8_t* sp[kMaxStreams];
    for (int k = 0; k < K; ++k) sp[k] = streams[k].data();
    split_fields(dt, data.data(), (uint32_t)n_elems, sp);
  }
  auto histogram = [&](int k, uint32_t per_block, uint64_t* h) {
    for (int s = 0; s < 256; ++s) h[s] = 0;
    for (uint64_t b = 0; b < n_blocks; ++b)
      for (uint64_t i = b * block_elems; i < std::min<uint64_t>(n_elems, b * block_elems + per_block); ++i)
        ++h[streams[k][i]];
  };
  uint8_t kind[kMaxStreams] = {};
  uint32_t freq[kMaxStreams][256] = {};
  uint64_t norm[256], scratch[256];
  uint32_t f[256];
  // The full procedure: no short path (policy_size_can_pay), so that the
  // encoder's frames of tiny tensors are checked against histograms.
  if (level >= 1 && dt != kBytes && n_elems > 0) {
    bool want[kMaxStreams], any = false;
    for (int k = 0; k < K; ++k) {
      uint64_t h[256];
      histogram(k, policy_first_pass_elems(block_elems), h);
      if (!policy_sampled(block_elems)) {
        kind[k] = policy_exact_kind(level, h, n_elems, n_blocks, freq[k], norm, nullptr);
        continue;
      }
      want[k] = policy_sample_wants(level, h, f, norm);
      any |= want[k];
    }
    for (int k = 0; k < K && policy_sampled(block_elems); ++k) {
      if (!want[k]) continue;
      uint64_t h[256];
      if (policy_fast_tables(block_elems, level, n_blocks)) {
        histogram(k, kSampleElems, h);
        const uint8_t lo = *std::min_element(streams[k].begin(), streams[k].end());
        const uint8_t hi = *std::max_element(streams[k].begin(), streams[k].end());
        kind[k] = policy_fast_kind(level, h, lo, hi, n_elems, n_blocks, freq[k], scratch, norm);
      } else {
        EXPECT_TRUE(policy_second_pass(block_elems, level, n_blocks, any));
        histogram(k, block_elems, h);
        kind[k] = policy_exact_kind(level, h, n_elems, n_blocks, freq[k], norm, nullptr);
      }
    }
  }
  Bytes sec;
  for (int k = 0; k < K; ++k) {
    const size_t at = sec.size();
    sec.resize(at + stream_table_size(kind[k], freq[k], RansCtx{}));
    write_stream_table(kind[k], freq[k], RansCtx{}, sec.data() + at);
  }
  while (sec.size() % 4) sec.push_back(0);
  return sec;
}

// The CPU encoder's table sections are the policy's: unsampled blocks,
// level-1 fast tables, the level-2 exact second pass, too few blocks for
// fast tables, and level -1.
TEST(Policy, CpuEncoderFollowsThePolicy) {
  const Bytes bf = tzt::tile(tzt::concat(tzt::bf16_slice()), 2 * 8192 * 10 + 100);  // 11 blocks of 8192
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.01f);
  std::vector<float> v(8192 * 9);
  for (auto& x : v) x = nd(rng);
  Bytes f32(v.size() * 4);
  memcpy(f32.data(), v.data(), f32.size());
  const Bytes f8 = tzt::to_f8_e4m3(std::vector<float>(v.begin(), v.begin() + 8192 * 3));
  struct Case {
    uint8_t dt;
    const Bytes* data;
    int level;
    uint32_t block_elems;
  };
  const Case cases[] = {
      {kBF16, &bf, 1, 4096}, {kBF16, &bf, 1, 8192}, {kBF16, &bf, 2, 8192}, {kF32, &f32, 1, 8192},
      {kF32, &f32, 2, 8192}, {kF32, &f32, 2, 4096}, {kF8E4M3, &f8, 1, 8192}, {kBF16, &bf, -1, 8192},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("dtype " + std::to_string(c.dt) + " level " + std::to_string(c.level) + " block_elems " +
                 std::to_string(c.block_elems));
    tz_params p{};
    p.dtype = (tz_dtype)c.dt;
    p.level = c.level;
    p.block_elems = c.block_elems;
    Bytes frame(tz_compress_bound(c.data->size()));
    const size_t r = tz_compress(frame.data(), frame.size(), c.data->data(), c.data->size(), &p);
    ASSERT_FALSE(tz_is_error(r));
    const uint32_t ts = load_le32(&frame[24]);
    const Bytes got(frame.begin() + 32, frame.begin() + 32 + ts);
    const Bytes want = policy_table_section(c.dt, *c.data, c.level, c.block_elems);
    EXPECT_TRUE(got == want) << "table section differs from the policy's";
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), r, &info)));
    int coded = 0;
    for (unsigned k = 0; k < info.n_streams; ++k) coded += info.stream_kind[k] == kKindRans;
    if (c.level >= 1) {
      EXPECT_GE(coded, 1) << "the case should code a stream, not only store them";
    }
  }
}

// The short path (policy_size_can_pay) is exact: for every size it calls
// hopeless, the full policy on the tensor's exact histograms stores every
// stream raw, for real data (prefixes of real BF16 / FP32 / FP16 / FP8
// tensors), for constant data (one symbol per stream: the cheapest stream
// there is) and for two-valued data; and the bound is tight: at the first
// size it lets through, a constant tensor is coded.
TEST(Policy, TinyShortPathIsExact) {
  const tz_dtype dts[] = {TZ_DTYPE_BF16, TZ_DTYPE_F32, TZ_DTYPE_F16, TZ_DTYPE_F8_E4M3};
  for (const int level : {1, 2, 3}) {
    uint64_t first_pays = 0;
    for (uint64_t n = 1; n <= 400; ++n)
      if (policy_size_can_pay(level, n, 1)) {
        first_pays = n;
        break;
      }
    ASSERT_EQ(first_pays, level == 1 ? 168u : 167u) << "level " << level;
    for (const tz_dtype dt : dts) {
      const uint8_t d = (uint8_t)dt;
      const uint32_t es = dtype_elem_size(d);
      const int K = dtype_stream_count(d);
      const Bytes& real = tzt::real_data(dt);
      ASSERT_GE(real.size(), first_pays * es);
      for (uint64_t n = 1; n <= first_pays; ++n) {
        SCOPED_TRACE("level " + std::to_string(level) + " dtype " + std::to_string(d) + " n " + std::to_string(n));
        const bool short_path = !policy_codes_streams(level, d, n, 1);
        EXPECT_EQ(short_path, n < first_pays);
        Bytes constant(n * es, 0x3c), two(n * es);
        for (size_t i = 0; i < two.size(); ++i) two[i] = (i / es) % 2 ? 0x3c : 0x3d;
        const Bytes prefix(real.begin(), real.begin() + n * es);
        bool constant_coded = false;
        for (const Bytes* data : std::initializer_list<const Bytes*>{&prefix, &constant, &two}) {
          std::vector<Bytes> streams(K, Bytes(n));
          uint8_t* sp[kMaxStreams];
          for (int k = 0; k < K; ++k) sp[k] = streams[k].data();
          split_fields(d, data->data(), (uint32_t)n, sp);
          for (int k = 0; k < K; ++k) {
            uint64_t h[256] = {}, norm[256];
            uint32_t freq[256];
            for (uint8_t x : streams[k]) ++h[x];
            const uint8_t kind = policy_exact_kind(level, h, n, 1, freq, norm, nullptr);
            if (short_path) {
              EXPECT_EQ(kind, kKindRaw) << "stream " << k << " would have paid";
            }
            if (data == &constant && kind == kKindRans) constant_coded = true;
          }
        }
        if (!short_path) {
          EXPECT_TRUE(constant_coded) << "the bound is not tight";
        }
      }
    }
  }
  // Two or more blocks (more than 4096 elements) can always pay.
  for (const int level : {1, 2, 3}) EXPECT_TRUE(policy_size_can_pay(level, 4097, 2));
}

// Compresses data (default block size) into *frame, checks that it round
// trips and that its table section is the policy's.
void expect_policy_frame(tz_dtype dt, const Bytes& data, int level, Bytes* frame) {
  ASSERT_TRUE(tzt::round_trips(data, tzt::make_params(dt, level), frame));
  const uint32_t ts = load_le32(&(*frame)[24]);
  const Bytes got(frame->begin() + 32, frame->begin() + 32 + ts);
  EXPECT_TRUE(got == policy_table_section((uint8_t)dt, data, level, kDefaultBlockElems))
      << "table section differs from the policy's";
}

// The CPU encoder's frames of tiny tensors are those of the full policy: a
// frame of every size 1..200 elements (both sides of the short path's
// threshold) has the policy's table section, and decodes.
TEST(Policy, CpuEncoderTinyFramesFollowThePolicy) {
  for (const tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3}) {
    const uint32_t es = dtype_elem_size((uint8_t)dt);
    for (const Bytes* src : {&tzt::real_data(dt)}) {
      for (const int level : {1, 2}) {
        for (uint64_t n = 1; n <= 200; ++n) {
          SCOPED_TRACE("dtype " + std::to_string(dt) + " level " + std::to_string(level) + " n " + std::to_string(n));
          Bytes data(src->begin(), src->begin() + n * es);
          if (n % 3 == 0) std::fill(data.begin(), data.end(), 0);  // constant: codes from 168 on
          Bytes frame;
          expect_policy_frame(dt, data, level, &frame);
        }
      }
    }
  }
}

// A tensor whose sample is the whole tensor (one block of <= kSampleElems
// elements: policy_sample_is_whole) gets from the CPU encoder, which then
// skips the screening pass, the table section of the full sampled
// procedure, on real data of every float dtype at every coding level, on
// both sides of kSampleElems; and the frames decode.
TEST(Policy, WholeSampleTakesTheUnsampledPath) {
  EXPECT_TRUE(policy_sample_is_whole(kDefaultBlockElems, kSampleElems));
  EXPECT_FALSE(policy_sample_is_whole(kDefaultBlockElems, kSampleElems + 1));
  EXPECT_FALSE(policy_sample_is_whole(kSampleElems, 100));  // unsampled already
  const uint64_t sizes[] = {168, 169, 200, 256, 311, 512, 1000, 1024, 2048, 3001, 4095, 4096, 4097, 6000};
  int coded_frames = 0;
  for (const tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2}) {
    const uint32_t es = dtype_elem_size((uint8_t)dt);
    for (const int level : {1, 2, 3}) {
      for (const uint64_t n : sizes) {
        SCOPED_TRACE("dtype " + std::to_string(dt) + " level " + std::to_string(level) + " n " + std::to_string(n));
        for (const uint64_t offset : {(uint64_t)0, (uint64_t)7 * n}) {  // two windows of the real data
          const Bytes data = tzt::real_bytes(dt, (offset + n) * es);
          const Bytes window(data.begin() + offset * es, data.end());
          Bytes frame;
          expect_policy_frame(dt, window, level, &frame);
          tz_frame_info info{};
          ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), frame.size(), &info)));
          for (unsigned k = 0; k < info.n_streams; ++k)
            if (info.stream_kind[k] == kKindRans) {
              ++coded_frames;
              break;
            }
        }
      }
    }
  }
  EXPECT_GT(coded_frames, 100) << "the cases should code streams, not only store them";
}

}  // namespace
