// The CPU encoder's table sections checked against the encoder policy
// (codec/policy.h) run step by step on the same data: a model of the
// decision procedure (policy_table_section) and the frames of real, random
// and tiny tensors at every level. (The policy functions themselves:
// tests/codec/test_policy.cpp, tests/codec/test_policy_fast.cpp; the CUDA encoder's
// frames are compared with the CPU's byte for byte in tests/cuda/emu.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "codec/fields.h"
#include "codec/policy.h"
#include "codec/policy_lane_ctx.h"
#include "tz_test_util.h"

namespace {

using namespace tz;
using tzt::Bytes;

// The table section the policy gives for `data` at levels -1..2 (format
// version 3: per-block statistics, table sets, lane contexts), with the
// decision procedure of codec/policy.h run step by step on statistics
// taken here from split_fields' streams.
Bytes policy_table_section(uint8_t dt, const Bytes& data, int level, uint32_t block_elems) {
  const uint32_t es = dtype_elem_size(dt);
  const uint64_t n_elems = data.size() / es;
  uint32_t B = 0;
  EXPECT_TRUE(encode_block_count(n_elems, block_elems, &B));
  const int K = dtype_stream_count(dt);
  std::vector<Bytes> streams(K, Bytes(n_elems));
  {
    uint8_t* sp[kMaxStreams];
    for (int k = 0; k < K; ++k) sp[k] = streams[k].data();
    split_fields(dt, data.data(), (uint32_t)n_elems, sp);
  }
  // Per-block histograms over the first `per_block` elements of each block.
  auto block_hists = [&](uint32_t per_block, std::vector<uint32_t>* h, std::vector<uint64_t>* counted) {
    h->assign((size_t)B * K * 256, 0);
    counted->assign(B, 0);
    for (uint32_t b = 0; b < B; ++b) {
      const uint64_t e0 = (uint64_t)b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + per_block);
      (*counted)[b] = e1 - e0;
      for (int k = 0; k < K; ++k)
        for (uint64_t i = e0; i < e1; ++i) ++(*h)[((size_t)b * K + k) * 256 + streams[k][i]];
    }
  };
  uint8_t kind[kMaxStreams] = {};
  uint32_t sets[kMaxStreams] = {1, 1, 1, 1};
  RansCtx ctx0{};
  std::vector<uint32_t> freq[kMaxStreams];
  bool any = false;
  // The full procedure: no short path (policy_size_can_pay), so that the
  // encoder's frames of tiny tensors are checked against histograms.
  if (level >= 1 && dt != kBytes && n_elems > 0) {
    std::vector<uint32_t> H1, H;
    std::vector<uint64_t> C1, C;
    block_hists(policy_first_pass_elems(block_elems), &H1, &C1);
    uint64_t tot[kMaxStreams][256] = {};
    for (uint32_t b = 0; b < B; ++b)
      for (int k = 0; k < K; ++k)
        for (int x = 0; x < 256; ++x) tot[k][x] += H1[((size_t)b * K + k) * 256 + x];
    bool want[kMaxStreams] = {};
    int n_wanted = 0;
    uint64_t norm[256];
    uint32_t f[256];
    for (int k = 0; k < K; ++k) {
      want[k] = !policy_sampled(block_elems) || policy_sample_wants(level, tot[k], f, norm);
      n_wanted += want[k];
    }
    const bool fast = policy_fast_tables(block_elems, level, B);
    if (!fast && policy_sampled(block_elems)) block_hists(block_elems, &H, &C);
    else H = H1, C = C1;
    // Fast tables: every block's range.
    std::vector<uint8_t> mm((size_t)B * kMaxStreams * kRangeBytes, 0);
    for (uint32_t b = 0; b < B && fast; ++b) {
      const uint64_t e0 = (uint64_t)b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + block_elems);
      for (int k = 0; k < K; ++k) {
        uint8_t* r = &mm[((size_t)b * kMaxStreams + k) * kRangeBytes];
        policy_range_empty(r);
        for (uint64_t i = e0; i < e1; ++i) policy_range_add(r, streams[k][i]);
      }
    }
    uint64_t counted = 0;
    for (uint64_t c : C) counted += c;
    SegScratch seg;
    TableScratch ts;
    uint64_t coded[kMaxStreams] = {};
    for (int k = 0; k < K && n_wanted; ++k) {
      if (!want[k]) continue;
      std::vector<uint8_t> set_of(B, 0);
      const uint32_t ms = policy_max_sets(B, n_wanted, level);
      std::vector<uint32_t> f1(256);
      uint64_t c1 = 0, cn = ~UINT64_C(0);
      if (!policy_set_tables(&H[(size_t)k * 256], (size_t)K * 256, C.data(), B, block_elems, n_elems, nullptr, 1,
                             fast, &mm[kRangeBytes * k], kRangeBytes * kMaxStreams, f1.data(), &c1, &ts))
        continue;
      const uint32_t n = ms > 1 && policy_tries_sets(level, stream_pays(level, c1, n_elems))
                             ? policy_segment_blocks(level, &H[(size_t)k * 256], (size_t)K * 256, B, ms, n_elems, counted,
                                                     &seg, set_of.data())
                             : 1;
      std::vector<uint32_t> fn((size_t)n * 256);
      if (n > 1 && !policy_set_tables(&H[(size_t)k * 256], (size_t)K * 256, C.data(), B, block_elems, n_elems,
                                      set_of.data(), n, fast, &mm[kRangeBytes * k], kRangeBytes * kMaxStreams, fn.data(), &cn, &ts))
        cn = ~UINT64_C(0);
      const bool use = n > 1 && cn != ~UINT64_C(0) && policy_sets_pay(level, fast, cn, c1);
      if (!stream_pays(level, use ? cn : c1, n_elems)) continue;
      kind[k] = kKindRans;
      sets[k] = use ? n : 1;
      freq[k] = use ? fn : f1;
      coded[k] = use ? cn : c1;
    }
    if (policy_tries_window_contexts(level, kind[0], n_elems, es, fast)) {
      const uint32_t wlo = policy_ctx_window(tot[0]);
      auto joint = [&](uint32_t per_block) {
        std::vector<uint64_t> J((size_t)kCtxJointRows * 256, 0);
        for (uint32_t b = 0; b < B; ++b) {
          const uint64_t e0 = (uint64_t)b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + per_block);
          for (uint64_t i = e0; i < e1; ++i)
            ++J[(i - e0 < 32 ? 0 : policy_ctx_row(streams[0][i - 32], wlo)) * 256 + streams[0][i]];
        }
        return J;
      };
      std::vector<uint64_t> J = joint(policy_first_pass_elems(block_elems));
      RansCtx rc;
      uint64_t tmp[256];
      if (policy_ctx_promising(J.data(), wlo, tot[0], &rc, tmp)) {
        if (!fast && policy_sampled(block_elems)) J = joint(block_elems);
        uint8_t range[kRangeBytes];
        policy_range_empty(range);
        if (fast)
          for (uint8_t x : streams[0]) policy_range_add(range, x);
        std::vector<uint32_t> cf((size_t)rc.n * 256);
        uint64_t cc = 0;
        if (policy_ctx_tables(J.data(), wlo, rc, fast, range, counted, n_elems, B, cf.data(), &cc, &ts) &&
            lane_contexts_pay(cc, coded[0])) {
          kind[0] = kKindRansCtx;
          ctx0 = rc;
          sets[0] = 1;
          freq[0] = cf;
        }
      }
    }
    for (int k = 0; k < K; ++k) any |= kind[k] != kKindRaw;
  }
  Bytes sec(4 * (4 + 32 * kCompactTableMaxBytes));
  size_t n = 0;
  for (int k = 0; k < K; ++k) {
    const uint32_t zero[256] = {};
    const uint32_t* fr = freq[k].empty() ? zero : freq[k].data();
    n += any ? write_stream_table_v3(kind[k], fr, k == 0 ? ctx0 : RansCtx{}, sets[k], sec.data() + n)
             : write_stream_table(kind[k], fr, RansCtx{}, sec.data() + n);
  }
  sec.resize(n);
  while (sec.size() % 4) sec.push_back(0);
  return sec;
}

// The CPU encoder's table sections are the policy's: unsampled blocks,
// level-1 fast tables, the level-2 exact second pass, too few blocks for
// fast tables, level -1, table sets on data whose statistics change along
// the tensor and lane contexts on row-scaled data.
TEST(Policy, CpuEncoderFollowsThePolicy) {
  const Bytes bf = tzt::tile(tzt::concat(tzt::bf16_slice()), 2 * 8192 * 10 + 100);  // 11 blocks of 8192
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.01f);
  std::vector<float> v(8192 * 9);
  for (auto& x : v) x = nd(rng);
  Bytes f32(v.size() * 4);
  memcpy(f32.data(), v.data(), f32.size());
  const Bytes f8 = tzt::to_f8_e4m3(std::vector<float>(v.begin(), v.begin() + 8192 * 3));
  // Statistics that change along the tensor (table sets): 12 blocks of 8192
  // whose scale steps up every 3 blocks.
  std::vector<float> steps(8192 * 12);
  for (size_t i = 0; i < steps.size(); ++i) steps[i] = nd(rng) * std::ldexp(1.0f, 4 * (int)(i / (3 * 8192)));
  const Bytes e5 = tzt::to_f8_e5m2(steps), st32 = tzt::to_bf16(steps);
  // Fast tables on FP16 / FP8 with the sign in stream 0 (ranges on both
  // sides of 0x80): 9 blocks of 16384, the last one short.
  std::vector<float> big(16384 * 8 + 6000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = nd(rng) * (1.0f + (float)((i / 1000) % 7));
  const Bytes e5b = tzt::to_f8_e5m2(big), h16b = tzt::to_f16(big);
  // Rows of 256 with their own scale (lane contexts).
  std::vector<float> rows(8192 * 4);
  float scale = 1.0f;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
    const float g = nd(rng) * 100.0f;
    rows[i] = g * g * scale;
  }
  Bytes r32(rows.size() * 4);
  memcpy(r32.data(), rows.data(), r32.size());
  struct Case {
    uint8_t dt;
    const Bytes* data;
    int level;
    uint32_t block_elems;
  };
  const Case cases[] = {
      {kBF16, &bf, 1, 4096},    {kBF16, &bf, 1, 8192},   {kBF16, &bf, 2, 8192},   {kF32, &f32, 1, 8192},
      {kF32, &f32, 2, 8192},    {kF32, &f32, 2, 4096},   {kF8E4M3, &f8, 1, 8192}, {kBF16, &bf, -1, 8192},
      {kF8E5M2, &e5, 1, 8192},  {kF8E5M2, &e5, 2, 8192}, {kBF16, &st32, 1, 8192}, {kF32, &r32, 1, 8192},
      {kF32, &r32, 2, 4096},    {kF8E5M2, &e5b, 1, 16384}, {kF16, &h16b, 1, 16384},
  };
  bool saw_sets = false, saw_ctx = false;
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
    if (frame[4] == kFormatVersionSets) {
      FrameHeader h{};
      ASSERT_EQ(check_frame_header(frame.data(), r, &h), kDefectNone);
      FrameTables t{};
      ASSERT_EQ(parse_table_section(h, frame.data() + 32, &t), kDefectNone);
      for (int k = 0; k < h.n_streams; ++k) {
        saw_sets |= t.n_sets[k] > 1;
        saw_ctx |= t.kind[k] == kKindRansCtx;
      }
    }
    tz_frame_info info{};
    ASSERT_FALSE(tz_is_error(tz_frame_inspect(frame.data(), r, &info)));
    int coded = 0;
    for (unsigned k = 0; k < info.n_streams; ++k) coded += kind_is_rans((uint8_t)info.stream_kind[k]);
    if (c.level >= 1) {
      EXPECT_GE(coded, 1) << "the case should code a stream, not only store them";
    }
  }
  EXPECT_TRUE(saw_sets) << "no case used table sets";
  EXPECT_TRUE(saw_ctx) << "no case used lane contexts";
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
          if (n % 3 == 0) std::fill(data.begin(), data.end(), 0);  // constant: codes from 140 on
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
  const uint64_t sizes[] = {140, 141, 168, 200, 256, 311, 512, 1000, 1024, 2048, 3001, 4095, 4096, 4097, 6000};
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
