// The AVX-512 kernels of the CPU backend must produce exactly the bytes and
// statuses of the portable codec (src/codec), which is also what the GPU
// runs. Skipped where the CPU lacks AVX-512.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec/rans.h"
#include "cpu/simd_x86.h"

namespace {

// A frequency table exercising the edge cases of the SIMD quotient:
// freq 1, freq 4095/4096 neighbours, primes, powers of two.
std::vector<uint32_t> table_for(int which) {
  std::vector<uint32_t> f(256, 0);
  switch (which) {
    case 0:  // one symbol takes everything
      f[7] = 4096;
      break;
    case 1:  // one dominant, one rare
      f[0] = 4095;
      f[255] = 1;
      break;
    case 2: {  // many singletons and a few large primes
      uint32_t sum = 0;
      for (int s = 0; s < 200; ++s) f[s] = 1, sum += 1;
      f[200] = 1021, f[201] = 2039, sum += 3060;
      f[202] = 4096 - sum;
      break;
    }
    default: {  // pseudo-random positive table
      std::mt19937 rng(which);
      std::vector<uint64_t> c(256);
      for (auto& v : c) v = 1 + rng() % 1000;
      tz::rans_normalize(c.data(), f.data());
    }
  }
  return f;
}

std::vector<uint8_t> symbols_for(const std::vector<uint32_t>& f, uint32_t n, uint32_t seed) {
  std::vector<uint8_t> present;
  for (int s = 0; s < 256; ++s)
    for (uint32_t j = 0; j < f[s]; ++j) present.push_back((uint8_t)s);  // sample by frequency
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& v : out) v = present[rng() % present.size()];
  return out;
}

TEST(Simd, EncoderAndDecoderMatchPortableCode) {
  if (!tz::cpu::simd_available()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (int which = 0; which < 12; ++which) {
    const auto f = table_for(which);
    std::vector<tz::RansEncSym> enc(256);
    tz::rans_build_enc(f.data(), enc.data());
    tz::cpu::SimdEncTable senc;
    tz::cpu::build_simd_enc(f.data(), &senc);
    std::vector<uint32_t> dec(tz::kProbScale);
    tz::rans_build_dec(f.data(), dec.data());
    for (uint32_t n : {0u, 1u, 31u, 32u, 33u, 100u, 4096u, 65536u + 17u}) {
      const auto sym = symbols_for(f, n, which * 1000 + n);
      std::vector<uint16_t> w1(n + 1), w2(n + 1);
      std::vector<uint8_t> o1(tz::kRansStateBytes + 2 * (size_t)n + 8), o2(o1.size());
      const size_t limit = o1.size();
      const size_t s1 = tz::rans_encode(sym.data(), n, enc.data(), w1.data(), o1.data(), limit);
      const size_t s2 = tz::cpu::rans_encode_simd(sym.data(), n, senc, w2.data(), o2.data(), limit);
      ASSERT_EQ(s1, s2) << "table " << which << " n " << n;
      ASSERT_EQ(0, memcmp(o1.data(), o2.data(), s1)) << "table " << which << " n " << n;
      if (!s1) continue;
      std::vector<uint8_t> d1(n), d2(n);
      ASSERT_EQ(tz::kOk, tz::rans_decode(o1.data(), s1, n, dec.data(), d1.data()));
      ASSERT_EQ(tz::kOk, tz::cpu::rans_decode_simd(o1.data(), s1, n, dec.data(), d2.data()));
      EXPECT_EQ(sym, d1);
      EXPECT_EQ(sym, d2);
      // Paired decoding gives the same result for both streams.
      std::vector<uint8_t> d3(n), d4(n);
      int sa = -1, sb = -1;
      tz::cpu::rans_decode2_simd(tz::cpu::RansStream{o1.data(), s1, n, dec.data(), d3.data()}, &sa,
                                 tz::cpu::RansStream{o1.data(), s1, n, dec.data(), d4.data()}, &sb);
      EXPECT_EQ(tz::kOk, sa);
      EXPECT_EQ(tz::kOk, sb);
      EXPECT_EQ(sym, d3);
      EXPECT_EQ(sym, d4);
    }
  }
}

TEST(Simd, QuotientExactAtEveryRemainderBoundary) {
  if (!tz::cpu::simd_available()) GTEST_SKIP() << "no AVX-512 on this CPU";
  // A two-symbol table (f, 4096 - f) driven so that states land on
  // multiples of f and their neighbours: compare whole encodings for every
  // freq value from 1 to 4095.
  for (uint32_t fa = 1; fa < 4096; fa += (fa < 64 ? 1 : 37)) {
    std::vector<uint32_t> f(256, 0);
    f[1] = fa;
    f[2] = 4096 - fa;
    std::vector<tz::RansEncSym> enc(256);
    tz::rans_build_enc(f.data(), enc.data());
    tz::cpu::SimdEncTable senc;
    tz::cpu::build_simd_enc(f.data(), &senc);
    const uint32_t n = 32 * 64;
    std::vector<uint8_t> sym(n);
    std::mt19937 rng(fa);
    for (auto& v : sym) v = (rng() % 4096 < fa) ? 1 : 2;
    std::vector<uint16_t> w1(n), w2(n);
    std::vector<uint8_t> o1(tz::kRansStateBytes + 2 * n + 8), o2(o1.size());
    const size_t s1 = tz::rans_encode(sym.data(), n, enc.data(), w1.data(), o1.data(), o1.size());
    const size_t s2 = tz::cpu::rans_encode_simd(sym.data(), n, senc, w2.data(), o2.data(), o2.size());
    ASSERT_EQ(s1, s2) << "freq " << fa;
    ASSERT_EQ(0, memcmp(o1.data(), o2.data(), s1)) << "freq " << fa;
  }
}

TEST(Simd, CorruptStreamsGiveTheSameStatus) {
  if (!tz::cpu::simd_available()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const auto f = table_for(5);
  std::vector<tz::RansEncSym> enc(256);
  tz::rans_build_enc(f.data(), enc.data());
  std::vector<uint32_t> dec(tz::kProbScale);
  tz::rans_build_dec(f.data(), dec.data());
  const uint32_t n = 3000;
  const auto sym = symbols_for(f, n, 99);
  std::vector<uint16_t> w(n);
  std::vector<uint8_t> o(tz::kRansStateBytes + 2 * n + 8);
  const size_t sz = tz::rans_encode(sym.data(), n, enc.data(), w.data(), o.data(), o.size());
  ASSERT_GT(sz, 0u);
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> c(o.begin(), o.begin() + sz);
    c[rng() % sz] ^= (uint8_t)(1u << (rng() % 8));
    const size_t len = trial % 3 == 0 ? sz - 2 * (rng() % 8) : sz;
    std::vector<uint8_t> d1(n), d2(n);
    const int a = tz::rans_decode(c.data(), len, n, dec.data(), d1.data());
    const int b = tz::cpu::rans_decode_simd(c.data(), len, n, dec.data(), d2.data());
    ASSERT_EQ(a, b) << "trial " << trial;
    if (a == tz::kOk) {
      EXPECT_EQ(d1, d2);
    }
  }
}

}  // namespace
