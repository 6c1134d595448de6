// CPU-side tests of the CUDA backend's host/device helpers
// (src/cuda/warp_codec.h): they run everywhere, GPU or not, and pin the warp
// kernels' word ordering, field access and checksum to the reference codec.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec/block.h"
#include "codec/checksum.h"
#include "cuda/warp_codec.h"

namespace {

using namespace tz;

std::vector<uint8_t> skewed_symbols(uint32_t n, double spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(120.0, spread);
  std::vector<uint8_t> s(n);
  for (auto& v : s) {
    const double d = nd(rng);
    v = (uint8_t)std::min(255.0, std::max(0.0, d));
  }
  return s;
}

struct Tables {
  uint32_t freq[256];
  std::vector<RansEncSym> enc = std::vector<RansEncSym>(256);
  std::vector<uint32_t> dec = std::vector<uint32_t>(kProbScale);
};

Tables tables_for(const std::vector<uint8_t>& s) {
  uint64_t counts[256] = {};
  for (uint8_t v : s) ++counts[v];
  Tables t;
  rans_normalize(counts, t.freq);
  rans_build_enc(t.freq, t.enc.data());
  rans_build_dec(t.freq, t.dec.data());
  return t;
}

TEST(CudaWarpHelpers, WordSlots) {
  // Lanes 3, 7 and 30 emit with wp = 10: lane 30 writes 9, lane 7 8, lane 3 7.
  const uint32_t b = (1u << 3) | (1u << 7) | (1u << 30);
  EXPECT_EQ(warp::enc_word_slot(10, b, 30), 9u);
  EXPECT_EQ(warp::enc_word_slot(10, b, 7), 8u);
  EXPECT_EQ(warp::enc_word_slot(10, b, 3), 7u);
  EXPECT_EQ(warp::dec_word_slot(b, 3), 0u);
  EXPECT_EQ(warp::dec_word_slot(b, 7), 1u);
  EXPECT_EQ(warp::dec_word_slot(b, 30), 2u);
  EXPECT_EQ(warp::dec_word_slot(0xFFFFFFFFu, 31), 31u);
  EXPECT_EQ(warp::enc_word_slot(32, 0xFFFFFFFFu, 0), 0u);
}

TEST(CudaWarpHelpers, WordCapMatchesRawLimit) {
  EXPECT_EQ(warp::enc_word_cap(1), -1);
  EXPECT_EQ(warp::enc_word_cap(128), -1);
  EXPECT_EQ(warp::enc_word_cap(129), 0);
  EXPECT_EQ(warp::enc_word_cap(130), 0);
  EXPECT_EQ(warp::enc_word_cap(131), 1);
  for (uint32_t n = 129; n < 2000; ++n) {
    const int64_t c = warp::enc_word_cap(n);
    EXPECT_LT(kRansStateBytes + 2 * (size_t)c, n);
    EXPECT_GE(kRansStateBytes + 2 * (size_t)(c + 1), n);
  }
}

// The warp encoder's emulation gives the very bytes (and the very raw
// decision) of rans_encode, for many sizes and skews, including tails of
// partial steps and streams that do not pay.
TEST(CudaWarpHelpers, EncoderEmulationMatchesRansEncode) {
  const uint32_t sizes[] = {1, 31, 32, 33, 100, 128, 129, 130, 131, 200, 1000, 4095, 4096, 4097, 65536, 70001};
  const double spreads[] = {0.01, 0.3, 2.0, 8.0, 40.0, 1000.0};
  uint32_t seed = 1;
  for (uint32_t n : sizes) {
    for (double sp : spreads) {
      const auto s = skewed_symbols(n, sp, seed++);
      const Tables t = tables_for(s);
      std::vector<uint16_t> words(n + 1);
      std::vector<uint8_t> ref(n + 8, 0xAA), emu(align4(n) + 8, 0xAA);
      const size_t r = rans_encode(s.data(), n, t.enc.data(), words.data(), ref.data(), n);
      const size_t e = warp::rans_encode_warp_emul(s.data(), n, t.enc.data(), emu.data());
      ASSERT_EQ(r, e) << "n=" << n << " spread=" << sp;
      if (r) {
        ASSERT_EQ(0, memcmp(ref.data(), emu.data(), r)) << "n=" << n << " spread=" << sp;
        std::vector<uint8_t> back(n);
        ASSERT_EQ(kOk, warp::rans_decode_warp_emul(emu.data(), e, n, t.dec.data(), back.data()));
        ASSERT_EQ(back, s);
      }
    }
  }
}

// The decoder emulation accepts and rejects exactly what rans_decode does.
TEST(CudaWarpHelpers, DecoderEmulationMatchesOnCorruption) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t n = 200 + rng() % 5000;
    const auto s = skewed_symbols(n, 3.0, 100 + trial);
    const Tables t = tables_for(s);
    std::vector<uint16_t> words(n);
    std::vector<uint8_t> pay(n + 8);
    const size_t sz = rans_encode(s.data(), n, t.enc.data(), words.data(), pay.data(), n);
    ASSERT_GT(sz, 0u);
    std::vector<uint8_t> bad(pay.begin(), pay.begin() + sz);
    size_t bad_size = sz;
    switch (trial % 3) {
      case 0: bad[rng() % sz] ^= (uint8_t)(1u << (rng() % 8)); break;
      case 1: bad_size = sz - 2 * (1 + rng() % 4); break;
      case 2: bad[rng() % sz] = (uint8_t)rng(); bad[rng() % sz] = (uint8_t)rng(); break;
    }
    std::vector<uint8_t> o1(n), o2(n);
    const int r1 = rans_decode(bad.data(), bad_size, n, t.dec.data(), o1.data());
    const int r2 = warp::rans_decode_warp_emul(bad.data(), bad_size, n, t.dec.data(), o2.data());
    ASSERT_EQ(r1, r2) << "trial " << trial;
    if (r1 == kOk) ASSERT_EQ(o1, o2);
  }
}

template <int DT>
void check_fields(uint32_t seed) {
  const uint32_t es = dtype_elem_size(DT);
  const int K = dtype_stream_count(DT);
  const uint32_t n = 1000;
  std::mt19937 rng(seed);
  std::vector<uint8_t> src(n * es);
  for (auto& b : src) b = (uint8_t)rng();
  std::vector<uint8_t> st[kMaxStreams];
  uint8_t* sp[kMaxStreams];
  for (int k = 0; k < K; ++k) {
    st[k].resize(n);
    sp[k] = st[k].data();
  }
  split_fields(DT, src.data(), n, sp);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    memcpy(&v, src.data() + (size_t)i * es, es);
    uint32_t f[kMaxStreams] = {};
    for (int k = 0; k < K; ++k) {
      f[k] = warp::elem_field<DT>(v, k);
      ASSERT_EQ(f[k], st[k][i]) << "dtype " << DT << " k " << k;
    }
    ASSERT_EQ(warp::elem_merge<DT>(f), v) << "dtype " << DT;
  }
}

TEST(CudaWarpHelpers, FieldsMatchSplitMerge) {
  check_fields<kBF16>(1);
  check_fields<kF16>(2);
  check_fields<kF32>(3);
  check_fields<kF8E4M3>(4);
  check_fields<kF8E5M2>(5);
  check_fields<kBytes>(6);
}

TEST(CudaWarpHelpers, SlicingCrcMatchesReference) {
  uint32_t t1[256], t8[8 * 256];
  crc32c_make_table(t1);
  warp::crc32c_make_table8(t8);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(t1[i], t8[i]);
  const char* check = "123456789";
  EXPECT_EQ(~warp::crc32c_update8(~0u, (const uint8_t*)check, 9, t8), 0xE3069283u);
  std::mt19937 rng(11);
  std::vector<uint8_t> buf(3 * 4096 + 100);
  for (auto& b : buf) b = (uint8_t)rng();
  for (size_t off = 0; off < 9; ++off)
    for (size_t len : {0, 1, 7, 8, 9, 63, 4096, 4097, 8191, 3 * 4096 + 50}) {
      ASSERT_EQ(warp::crc32c_update8(~0u, buf.data() + off, len, t8), crc32c_update(~0u, buf.data() + off, len, t1));
      ASSERT_EQ(warp::block_checksum8(buf.data() + off, len, t8), block_checksum_ref(buf.data() + off, len, t1));
    }
}

}  // namespace
