// Frequency tables, symbols and table forms of the rANS kernel comparisons
// of the Simd suite (test_simd.cpp: the encoders, test_simd_decoder.cpp: the
// decoders), and the check that one kernel set decodes a payload as the
// portable one does with every decoding entry.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/format.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"
#include "tz_test_data.h"

namespace tz::test::simd_cases {

using tz::cpu::CodecKernels;
using tz::cpu::kPortableKernels;
using Bytes = std::vector<uint8_t>;

// Frequency tables exercising the edge cases of the SIMD quotient and of
// the table lookups: freq 1, 4095/4096, primes, powers of two, symbols 0 and
// 255, single-symbol tables.
inline std::vector<uint32_t> table_for(int which) {
  std::vector<uint32_t> f(256, 0);
  switch (which) {
    case 0: f[7] = 4096; break;                  // one symbol takes everything
    case 1: f[0] = 4095, f[255] = 1; break;      // one dominant, one rare
    case 2: f[255] = 4095, f[0] = 1; break;      // the same, mirrored
    case 3: f[0] = 2048, f[1] = 2048; break;     // powers of two
    case 4: f[255] = 4096; break;                // single symbol at the top
    case 5: {                                    // many singletons and a few large primes
      uint32_t sum = 0;
      for (int s = 0; s < 200; ++s) f[s] = 1, sum += 1;
      f[200] = 1021, f[201] = 2039, sum += 3060;
      f[202] = 4096 - sum;
      break;
    }
    case 6:  // every symbol, 16 each
      for (auto& v : f) v = 16;
      break;
    case 7: f[3] = 2049, f[4] = 2047; break;  // just over and under one half
    default: {  // pseudo-random positive tables
      std::mt19937 rng(which);
      std::vector<uint64_t> c(256);
      for (auto& v : c) v = (rng() % 3 == 0) ? 0 : 1 + rng() % (which % 2 ? 1000 : 5);
      c[rng() % 256] += 1;
      tz::rans_normalize(c.data(), f.data());
    }
  }
  return f;
}
inline constexpr int kTables = 16;

// Symbols drawn by frequency from ctx.n tables (table of each symbol chosen
// by its lane's previous symbol, as the coder does).
inline Bytes symbols_for(const std::vector<uint32_t>& f, const tz::RansCtx& ctx, uint32_t n, uint32_t seed) {
  std::vector<std::vector<uint8_t>> by_table(ctx.n);
  for (uint32_t c = 0; c < ctx.n; ++c)
    for (int s = 0; s < 256; ++s)
      for (uint32_t j = 0; j < f[256 * c + s]; ++j) by_table[c].push_back((uint8_t)s);
  std::mt19937 rng(seed);
  Bytes out(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t c = (ctx.n > 1 && i >= (uint32_t)tz::kLanes) ? tz::rans_ctx_of(out[i - tz::kLanes], ctx) : 0;
    out[i] = by_table[c][rng() % by_table[c].size()];
  }
  return out;
}

// Every table form of ctx.n tables.
struct Tables {
  std::vector<uint32_t> freq;
  std::vector<tz::RansEncSym> enc;
  std::vector<uint32_t> fst;
  std::vector<uint32_t> dec;
  explicit Tables(const std::vector<uint32_t>& f) : freq(f), enc(f.size()), fst(f.size()) {
    const size_t nc = f.size() / 256;
    dec.resize(nc * tz::kProbScale);
    for (size_t c = 0; c < nc; ++c) {
      tz::rans_build_enc(f.data() + 256 * c, enc.data() + 256 * c);
      tz::cpu::build_freq_start(f.data() + 256 * c, fst.data() + 256 * c);
      tz::rans_build_dec(f.data() + 256 * c, dec.data() + tz::kProbScale * c);
    }
  }
  tz::cpu::EncTables et() const { return {enc.data(), fst.data()}; }
};

// Encodes with a kernel table; returns the payload ({} when the encoder said
// it would not fit under limit).
inline Bytes encode_with(const CodecKernels& k, const Bytes& sym, const Tables& t, const tz::RansCtx& ctx,
                  size_t limit = SIZE_MAX) {
  const uint32_t n = (uint32_t)sym.size();
  std::vector<uint16_t> words(n + 1);
  Bytes out(tz::kRansStateBytes + 2 * (size_t)n + 8);
  const size_t sz = k.rans_encode(sym.data(), n, t.et(), ctx, words.data(), out.data(), limit);
  out.resize(sz);
  return out;
}

// tz::merge_fields of stream 0 (sym0) and the raw streams 1 .. K-1 of a
// BF16, FP16 or FP32 block.
inline Bytes merged_elems(uint8_t dtype, const Bytes& sym0, const std::vector<Bytes>& raw) {
  const int K = tz::dtype_stream_count(dtype);
  const size_t n = sym0.size();
  Bytes v((size_t)tz::dtype_elem_size(dtype) * n);
  const uint8_t* st[4] = {sym0.data()};
  for (int k = 1; k < K; ++k) st[k] = raw[k - 1].data();
  tz::merge_fields(dtype, st, (uint32_t)n, v.data());
  return v;
}
inline const char* merged_name(uint8_t dt) { return dt == tz::kF16 ? "FP16" : dt == tz::kF32 ? "FP32" : "BF16"; }
inline constexpr uint8_t kMergedDtypes[] = {tz::kBF16, tz::kF16, tz::kF32};
// Raw streams 1 .. 3 of n elements (hash bytes), and their pointers.
struct RawStreams {
  std::vector<Bytes> b;
  const uint8_t* p[3];
  RawStreams(uint32_t n, uint32_t seed) {
    for (int k = 0; k < 3; ++k) b.push_back(tzt::hash_stream(n, seed + 101 * k));
    for (int k = 0; k < 3; ++k) p[k] = b[k].data();
  }
};

// Decodes one payload with every decoding entry of k (single, BF16/FP16/FP32 merged,
// both two-stream forms against a second stream) and checks each against
// the portable entry: same status, and same bytes when it succeeds.
inline void expect_decoders_match(const CodecKernels& k, const Bytes& in, uint32_t n, const Tables& t, const tz::RansCtx& ctx,
                           const Bytes& other, uint32_t n_other, const Tables& t_other, const tz::RansCtx& ctx_other,
                           const std::string& what) {
  const std::string tag = std::string(tz::cpu::simd_path_name(k.path)) + " " + what;
  Bytes d0(n + 1, 0xEE), d1(n + 1, 0xEE);
  const int s0 = kPortableKernels.rans_decode(in.data(), in.size(), n, t.dec.data(), ctx, d0.data());
  const int s1 = k.rans_decode(in.data(), in.size(), n, t.dec.data(), ctx, d1.data());
  ASSERT_EQ(s0, s1) << tag;
  if (s0 == tz::kOk) {
    ASSERT_EQ(d0, d1) << tag;
  }
  EXPECT_EQ(d1[n], 0xEE) << tag << ": wrote past the end";

  const RawStreams raw(n, n * 7 + 1);
  std::vector<Bytes> want_merged(3);  // per kMergedDtypes entry, for the pair checks
  for (size_t di = 0; di < 3; ++di) {
    const uint8_t dt = kMergedDtypes[di];
    const size_t es = tz::dtype_elem_size(dt);
    const std::string form = std::string(" (") + merged_name(dt) + " merged form)";
    Bytes p0(es * n + 4, 0xEE), p1(es * n + 4, 0xEE);
    const int f0 = kPortableKernels.rans_decode_merged(dt, in.data(), in.size(), n, t.dec.data(), ctx, raw.p, p0.data());
    const int f1 = k.rans_decode_merged(dt, in.data(), in.size(), n, t.dec.data(), ctx, raw.p, p1.data());
    ASSERT_EQ(f0, s0) << tag << " portable" << form;
    ASSERT_EQ(f0, f1) << tag << form;
    if (f0 == tz::kOk) {
      ASSERT_EQ(p0, p1) << tag << form;
      want_merged[di] = merged_elems(dt, Bytes(d0.begin(), d0.begin() + n), raw.b);
      Bytes want = want_merged[di];
      want.resize(p0.size(), 0xEE);
      ASSERT_EQ(p0, want) << tag << form << " merges";
    }
    EXPECT_EQ(p1[es * n], 0xEE) << tag << form << " wrote past the end";
  }

  // Two streams in lockstep, in both orders.
  int so = -1;
  Bytes o0(n_other + 1);
  so = kPortableKernels.rans_decode(other.data(), other.size(), n_other, t_other.dec.data(), ctx_other, o0.data());
  for (int order = 0; order < 2; ++order) {
    Bytes a(n + 1, 0xEE), b(n_other + 1, 0xEE);
    int sa = -1, sb = -1;
    const tz::cpu::RansStream ra{in.data(), in.size(), n, t.dec.data(), a.data(), ctx};
    const tz::cpu::RansStream rb{other.data(), other.size(), n_other, t_other.dec.data(), b.data(), ctx_other};
    if (order == 0)
      k.rans_decode2(ra, &sa, rb, &sb);
    else
      k.rans_decode2(rb, &sb, ra, &sa);
    ASSERT_EQ(sa, s0) << tag << " (pair, order " << order << ")";
    ASSERT_EQ(sb, so) << tag << " (pair partner, order " << order << ")";
    if (sa == tz::kOk) {
      ASSERT_TRUE(std::equal(a.begin(), a.begin() + n, d0.begin())) << tag << " (pair)";
    }
    if (sb == tz::kOk) {
      ASSERT_TRUE(std::equal(b.begin(), b.begin() + n_other, o0.begin())) << tag << " (pair)";
    }

    const RawStreams raw_b(n_other, 99);
    for (size_t di = 0; di < 3; ++di) {
      const uint8_t dt = kMergedDtypes[di];
      const size_t es = tz::dtype_elem_size(dt);
      const std::string form = std::string(" (") + merged_name(dt) + " merged pair)";
      Bytes fa(es * n, 0), fb(es * n_other, 0);
      int ta = -1, tb = -1;
      const tz::cpu::RansStream qa{in.data(), in.size(), n, t.dec.data(), fa.data(), ctx};
      const tz::cpu::RansStream qb{other.data(), other.size(), n_other, t_other.dec.data(), fb.data(), ctx_other};
      if (order == 0)
        k.rans_decode2_merged(dt, qa, raw.p, &ta, qb, raw_b.p, &tb);
      else
        k.rans_decode2_merged(dt, qb, raw_b.p, &tb, qa, raw.p, &ta);
      ASSERT_EQ(ta, s0) << tag << form;
      ASSERT_EQ(tb, so) << tag << form << " partner";
      if (ta == tz::kOk) {
        ASSERT_EQ(fa, want_merged[di]) << tag << form;
      }
      if (tb == tz::kOk) {
        ASSERT_EQ(fb, merged_elems(dt, Bytes(o0.begin(), o0.begin() + n_other), raw_b.b)) << tag << form << " partner";
      }
    }
  }
}

inline constexpr uint32_t kSizes[] = {0, 1, 2, 31, 32, 33, 63, 64, 65, 95, 96, 97, 100, 255, 256, 257, 1000, 4096, 65536 + 17};

}  // namespace tz::test::simd_cases
