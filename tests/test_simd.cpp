// Every kernel set of the CPU backend (src/cpu/kernels.h: portable, AVX2,
// AVX-512, NEON) must produce exactly the bytes and statuses of the portable
// codec (src/codec), which is also what the GPU runs, and the portable coder
// exactly those of the plain reference written from doc/format.md
// (tests/support/ref_rans.h). Each test runs every path this build and CPU
// have and prints the ones it skipped ("[ PATH SKIP ]").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/format.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"
#include "ref_rans.h"
#include "simd_paths.h"
#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace {

using tz::cpu::CodecKernels;
using tz::cpu::kPortableKernels;
using Bytes = std::vector<uint8_t>;

const char* test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

#define SIMD_KERNELS_OR_SKIP(var)                                              \
  const auto var = tz::test::simd_kernels_to_test(test_name());                \
  if (var.empty()) GTEST_SKIP() << "no SIMD kernel set on this CPU and build: nothing to compare"

// Frequency tables exercising the edge cases of the SIMD quotient and of
// the table lookups: freq 1, 4095/4096, primes, powers of two, symbols 0 and
// 255, single-symbol tables.
std::vector<uint32_t> table_for(int which) {
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
constexpr int kTables = 16;

// Symbols drawn by frequency from ctx.n tables (table of each symbol chosen
// by its lane's previous symbol, as the coder does).
Bytes symbols_for(const std::vector<uint32_t>& f, const tz::RansCtx& ctx, uint32_t n, uint32_t seed) {
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
Bytes encode_with(const CodecKernels& k, const Bytes& sym, const Tables& t, const tz::RansCtx& ctx,
                  size_t limit = SIZE_MAX) {
  const uint32_t n = (uint32_t)sym.size();
  std::vector<uint16_t> words(n + 1);
  Bytes out(tz::kRansStateBytes + 2 * (size_t)n + 8);
  const size_t sz = k.rans_encode(sym.data(), n, t.et(), ctx, words.data(), out.data(), limit);
  out.resize(sz);
  return out;
}

Bytes merged_bf16(const Bytes& exps, const Bytes& mant) {
  Bytes v(2 * exps.size());
  for (size_t i = 0; i < exps.size(); ++i) tz::store_le16(v.data() + 2 * i, tz::merge_elem_bf16(exps[i], mant[i]));
  return v;
}

// Decodes one payload with every decoding entry of k (single, BF16 fused,
// both two-stream forms against a second stream) and checks each against
// the portable entry: same status, and same bytes when it succeeds.
void expect_decoders_match(const CodecKernels& k, const Bytes& in, uint32_t n, const Tables& t, const tz::RansCtx& ctx,
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

  const Bytes mant = tzt::hash_stream(n, n * 7 + 1);
  Bytes b0(2 * (size_t)n + 2, 0xEE), b1(2 * (size_t)n + 2, 0xEE);
  const int f0 = kPortableKernels.rans_decode_bf16(in.data(), in.size(), n, t.dec.data(), ctx, mant.data(), b0.data());
  const int f1 = k.rans_decode_bf16(in.data(), in.size(), n, t.dec.data(), ctx, mant.data(), b1.data());
  ASSERT_EQ(f0, s0) << tag << " (portable BF16 form)";
  ASSERT_EQ(f0, f1) << tag << " (BF16 form)";
  if (f0 == tz::kOk) {
    ASSERT_EQ(b0, b1) << tag << " (BF16 form)";
    Bytes want = merged_bf16(Bytes(d0.begin(), d0.begin() + n), mant);
    want.resize(b0.size(), 0xEE);
    ASSERT_EQ(b0, want) << tag << " (BF16 form merges)";
  }
  EXPECT_EQ(b1[2 * (size_t)n], 0xEE) << tag << ": BF16 form wrote past the end";

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

    const Bytes mant_b = tzt::hash_stream(n_other, 99);
    Bytes fa(2 * (size_t)n, 0), fb(2 * (size_t)n_other, 0);
    int ta = -1, tb = -1;
    const tz::cpu::RansStream qa{in.data(), in.size(), n, t.dec.data(), fa.data(), ctx};
    const tz::cpu::RansStream qb{other.data(), other.size(), n_other, t_other.dec.data(), fb.data(), ctx_other};
    if (order == 0)
      k.rans_decode2_bf16(qa, mant.data(), &ta, qb, mant_b.data(), &tb);
    else
      k.rans_decode2_bf16(qb, mant_b.data(), &tb, qa, mant.data(), &ta);
    ASSERT_EQ(ta, s0) << tag << " (BF16 pair)";
    ASSERT_EQ(tb, so) << tag << " (BF16 pair partner)";
    if (ta == tz::kOk) {
      ASSERT_TRUE(std::equal(fa.begin(), fa.end(), b0.begin())) << tag << " (BF16 pair)";
    }
    if (tb == tz::kOk) {
      ASSERT_EQ(fb, merged_bf16(Bytes(o0.begin(), o0.begin() + n_other), mant_b)) << tag;
    }
  }
}

const uint32_t kSizes[] = {0, 1, 2, 31, 32, 33, 63, 64, 65, 95, 96, 97, 100, 255, 256, 257, 1000, 4096, 65536 + 17};

TEST(Simd, PortableCoderMatchesTheReference) {
  // The fast portable coder (branch-free renormalisation) against the plain
  // reference: same payload bytes, and the reference decodes them back.
  for (int which = 0; which < kTables; ++which) {
    const Tables t(table_for(which));
    for (uint32_t n : kSizes) {
      const Bytes sym = symbols_for(t.freq, tz::RansCtx{}, n, which * 1000 + n);
      const Bytes ref = tz::ref::rans_encode(sym.data(), n, t.freq.data(), tz::RansCtx{});
      const Bytes got = encode_with(kPortableKernels, sym, t, tz::RansCtx{});
      ASSERT_EQ(got, ref) << "table " << which << " n " << n;
      Bytes back(n);
      ASSERT_EQ(tz::ref::rans_decode(ref.data(), ref.size(), n, t.freq.data(), tz::RansCtx{}, back.data()), tz::kOk);
      ASSERT_EQ(back, sym);
      ASSERT_EQ(tz::rans_decode(ref.data(), ref.size(), n, t.dec.data(), back.data()), tz::kOk);
      ASSERT_EQ(back, sym);
    }
  }
}

// Decodes c (n symbols) with the shared decoder of src/codec/rans.h and with
// the portable kernels: the same status, and the same bytes where it decodes;
// where c is the stream as coded (coded != nullptr), it must decode to *coded.
void expect_portable_decode_as_shared(const Bytes& c, uint32_t n, const Tables& t, const tz::RansCtx& ctx,
                                      const Bytes* coded, const std::string& tag) {
  Bytes want(n, 0xAB), back(n, 0xAB);
  const int st = tz::rans_decode_ctx(c.data(), c.size(), n, t.dec.data(), ctx, want.data());
  ASSERT_EQ(kPortableKernels.rans_decode(c.data(), c.size(), n, t.dec.data(), ctx, back.data()), st) << tag;
  if (coded) {
    ASSERT_EQ(st, tz::kOk) << tag;
    ASSERT_EQ(back, *coded) << tag;
  }
  if (st == tz::kOk) {
    ASSERT_EQ(back, want) << tag;
  }
}

TEST(Simd, PortableCoderMatchesTheSharedCoder) {
  // The portable table's coder (src/cpu/rans_portable.cpp: unrolled steps,
  // context offsets from a table) against the shared host/device coder of
  // src/codec/rans.h that the CUDA backend runs: same payload bytes and size
  // limit, with and without lane contexts (every count, bases at the range's
  // edges), and the same status and symbols on every corruption of them.
  std::mt19937 rng(5);
  for (uint32_t nc = 1; nc <= tz::kMaxContexts; ++nc)
    for (uint32_t base : {0u, 7u, 254u, 255u}) {
      if (nc == 1 && base != 0) continue;
      std::vector<uint32_t> f;
      for (uint32_t c = 0; c < nc; ++c) {
        const auto tc = table_for((int)((3 * c + base) % kTables));
        f.insert(f.end(), tc.begin(), tc.end());
      }
      const Tables t(f);
      const tz::RansCtx ctx{base, nc};
      for (uint32_t n : kSizes) {
        const std::string tag = "contexts " + std::to_string(nc) + " base " + std::to_string(base) + " n " +
                                std::to_string(n);
        const Bytes sym = symbols_for(t.freq, ctx, n, nc * 100 + base + n);
        std::vector<uint16_t> words(n + 1);
        Bytes shared(tz::kRansStateBytes + 2 * (size_t)n + 8);
        shared.resize(tz::rans_encode_ctx(sym.data(), n, t.enc.data(), ctx, words.data(), shared.data(), SIZE_MAX));
        const Bytes got = encode_with(kPortableKernels, sym, t, ctx);
        ASSERT_EQ(got, shared) << tag;
        EXPECT_TRUE(encode_with(kPortableKernels, sym, t, ctx, got.size()).empty()) << tag;
        EXPECT_EQ(encode_with(kPortableKernels, sym, t, ctx, got.size() + 1), got) << tag;
        for (int trial = 0; trial < (n >= 64 ? 60 : 6); ++trial) {
          Bytes c = got;
          if (trial > 0) {
            switch (trial % 4) {
              case 0: c[rng() % c.size()] ^= (uint8_t)(1u << (rng() % 8)); break;
              case 1: c.resize(c.size() - std::min<size_t>(c.size(), 1 + rng() % 70)); break;
              case 2: c.resize(c.size() + 2 * (1 + rng() % 40), (uint8_t)rng()); break;
              default: c[rng() % tz::kRansStateBytes] = (uint8_t)rng();
            }
          }
          ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(c, n, t, ctx, trial == 0 ? &sym : nullptr,
                                                                   tag + " trial " + std::to_string(trial)));
        }
      }
    }
}

TEST(Simd, PortableDecoderOfLongStreamsMatchesTheSharedDecoder) {
  // The portable decoder switches to tables split into symbol, frequency and
  // offset (src/cpu/rans_portable.cpp) once a stream has 8192 symbols per
  // table: at the sizes on either side of that switch, with and without lane
  // contexts, it must decode what the shared decoder of src/codec/rans.h
  // decodes and reject what it rejects, with the same status (flipped bits,
  // cut or padded streams, damaged lane states, a stream too short for one
  // full step).
  std::mt19937 rng(11);
  for (uint32_t nc = 1; nc <= tz::kMaxContexts; ++nc) {
    std::vector<uint32_t> f;
    for (uint32_t c = 0; c < nc; ++c) {
      const auto tc = table_for(6 + (int)c * 3 % 8);  // spread tables: every context costs bits
      f.insert(f.end(), tc.begin(), tc.end());
    }
    const Tables t(f);
    const tz::RansCtx ctx{nc > 1 ? 3u : 0u, nc};
    const uint32_t at = 8192 * nc;  // the switch
    for (uint32_t n : {at - 33, at - 1, at, at + 1, at + 31, at + 32, 3 * at + 7}) {
      const std::string tag = "contexts " + std::to_string(nc) + " n " + std::to_string(n);
      const Bytes sym = symbols_for(t.freq, ctx, n, nc * 7 + n);
      const Bytes got = encode_with(kPortableKernels, sym, t, ctx);
      ASSERT_GT(got.size(), tz::kRansStateBytes + 2 * (size_t)n / 4) << tag;
      for (int trial = 0; trial < 40; ++trial) {
        Bytes c = got;
        if (trial > 0) {
          switch (trial % 5) {
            case 0:  // a bit of the words
              c[tz::kRansStateBytes + rng() % (c.size() - tz::kRansStateBytes)] ^= (uint8_t)(1u << (rng() % 8));
              break;
            case 1: c.resize(c.size() - std::min<size_t>(c.size(), 1 + rng() % 70)); break;
            case 2: c.resize(c.size() + 2 * (1 + rng() % 40), (uint8_t)rng()); break;
            case 3: c.resize(tz::kRansStateBytes + 2 * (rng() % 32)); break;
            default: c[rng() % tz::kRansStateBytes] = (uint8_t)rng();
          }
        }
        ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(c, n, t, ctx, trial == 0 ? &sym : nullptr,
                                                                 tag + " trial " + std::to_string(trial)));
      }
    }
  }
}

TEST(Simd, EncoderAndDecoderMatchPortableCode) {
  SIMD_KERNELS_OR_SKIP(ks);
  for (const CodecKernels* k : ks) {
    for (int which = 0; which < kTables; ++which) {
      const Tables t(table_for(which));
      const Tables t2(table_for((which + 5) % kTables));
      for (uint32_t n : kSizes) {
        const Bytes sym = symbols_for(t.freq, tz::RansCtx{}, n, which * 1000 + n);
        const Bytes p = encode_with(kPortableKernels, sym, t, tz::RansCtx{});
        const Bytes s = encode_with(*k, sym, t, tz::RansCtx{});
        ASSERT_EQ(p, s) << tz::cpu::simd_path_name(k->path) << " table " << which << " n " << n;
        // The size limit: refused at exactly the payload size, kept one above.
        EXPECT_TRUE(encode_with(*k, sym, t, tz::RansCtx{}, p.size()).empty());
        EXPECT_EQ(encode_with(*k, sym, t, tz::RansCtx{}, p.size() + 1), p);
        const uint32_t n2 = (n * 3) % 5000 + 1;
        const Bytes other = encode_with(kPortableKernels, symbols_for(t2.freq, tz::RansCtx{}, n2, n), t2, tz::RansCtx{});
        expect_decoders_match(*k, p, n, t, tz::RansCtx{}, other, n2, t2, tz::RansCtx{},
                              "table " + std::to_string(which) + " n " + std::to_string(n));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(Simd, EncoderOfConcentratedTablesMatchesPortable) {
  // Exponent-like tables (nearly all probability in 16 adjacent symbols),
  // where the SIMD encoders look the common symbols up without a gather:
  // windows at both ends of the byte range, rare symbols outside them (0
  // and 255 included) so that vectors take either lookup, tables whose
  // window holds more (rare 0, 1, 40) and less (rare 400) than the 127/128
  // of the probability the encoder asks for.
  SIMD_KERNELS_OR_SKIP(ks);
  const uint32_t sizes[] = {32, 33, 64, 1000, 4101, 65536};
  for (const CodecKernels* k : ks)
    for (int centre : {0, 7, 120, 248, 255})
      for (uint64_t rare : {0, 1, 40, 400}) {  // weight of each symbol outside the window
        std::vector<uint64_t> c(256, 0);
        for (int v = std::max(0, centre - 7); v <= std::min(255, centre + 8); ++v) c[v] = 3000 + 97 * (uint64_t)(v % 5);
        for (int v : {0, 1, 60, 200, 254, 255})
          if (c[v] == 0) c[v] = rare;
        std::vector<uint32_t> f(256);
        tz::rans_normalize(c.data(), f.data());
        const Tables t(f);
        for (uint32_t n : sizes) {
          const std::string tag = std::string(tz::cpu::simd_path_name(k->path)) + " centre " +
                                  std::to_string(centre) + " rare " + std::to_string(rare) + " n " + std::to_string(n);
          const Bytes sym = symbols_for(t.freq, tz::RansCtx{}, n, centre * 7 + n);
          const Bytes p = encode_with(kPortableKernels, sym, t, tz::RansCtx{});
          ASSERT_EQ(p, encode_with(*k, sym, t, tz::RansCtx{})) << tag;
          EXPECT_TRUE(encode_with(*k, sym, t, tz::RansCtx{}, p.size()).empty()) << tag;
          Bytes back(n);
          ASSERT_EQ(k->rans_decode(p.data(), p.size(), n, t.dec.data(), tz::RansCtx{}, back.data()), tz::kOk) << tag;
          ASSERT_EQ(back, sym) << tag;
        }
      }
}

TEST(Simd, LaneContextStreamsMatch) {
  // Every context count and base at the symbol range's edges, short streams
  // (partial first and last steps) and long ones, paired with a plain stream.
  SIMD_KERNELS_OR_SKIP(ks);
  std::mt19937 rng(11);
  for (uint32_t nc = 2; nc <= tz::kMaxContexts; ++nc)
    for (uint32_t base : {0u, 3u, 250u, 254u, 255u}) {
      std::vector<uint32_t> f;
      for (uint32_t c = 0; c < nc; ++c) {
        const auto tc = table_for((int)(8 + (c + base) % 8));
        f.insert(f.end(), tc.begin(), tc.end());
      }
      const Tables t(f);
      const tz::RansCtx ctx{base, nc};
      const Tables tp(table_for(9));
      for (uint32_t n : {1u, 31u, 32u, 33u, 64u, 65u, 70u, 1000u + (uint32_t)(rng() % 5000), 65536u}) {
        const Bytes sym = symbols_for(t.freq, ctx, n, n * 31 + nc);
        const Bytes ref = tz::ref::rans_encode(sym.data(), n, t.freq.data(), ctx);
        ASSERT_EQ(encode_with(kPortableKernels, sym, t, ctx), ref) << "portable n " << n;
        const Bytes plain = encode_with(kPortableKernels, symbols_for(tp.freq, {}, 777, n), tp, {});
        for (const CodecKernels* k : ks) {
          ASSERT_EQ(encode_with(*k, sym, t, ctx), ref)
              << tz::cpu::simd_path_name(k->path) << " n " << n << " contexts " << nc << " base " << base;
          expect_decoders_match(*k, ref, n, t, ctx, plain, 777, tp, {},
                                "contexts " + std::to_string(nc) + " base " + std::to_string(base));
          expect_decoders_match(*k, ref, n, t, ctx, ref, n, t, ctx, "two context streams");
          if (HasFatalFailure()) return;
        }
      }
    }
}

TEST(Simd, QuotientExactAtEveryFrequency) {
  // A two-symbol table (f, 4096 - f) for every f: the states land on all
  // remainders of the SIMD quotient's correction steps.
  SIMD_KERNELS_OR_SKIP(ks);
  for (uint32_t fa = 1; fa < 4096; ++fa) {
    std::vector<uint32_t> f(256, 0);
    f[1] = fa;
    f[2] = 4096 - fa;
    const Tables t(f);
    const uint32_t n = 32 * 48 + 5;
    Bytes sym(n);
    std::mt19937 rng(fa);
    for (auto& v : sym) v = (rng() % 4096 < fa) ? 1 : 2;
    const Bytes p = encode_with(kPortableKernels, sym, t, {});
    for (const CodecKernels* k : ks)
      ASSERT_EQ(encode_with(*k, sym, t, {}), p) << tz::cpu::simd_path_name(k->path) << " freq " << fa;
  }
}

TEST(Simd, CorruptStreamsGiveTheSameStatus) {
  // Bit flips, truncations (even and odd lengths), extra bytes and garbage
  // states, with and without lane contexts: every decoding entry of every
  // path returns the portable (and reference) status, and the same symbols
  // when it accepts.
  SIMD_KERNELS_OR_SKIP(ks);
  std::mt19937 rng(1);
  for (uint32_t nc : {1u, 3u}) {
    std::vector<uint32_t> f;
    for (uint32_t c = 0; c < nc; ++c) {
      const auto tc = table_for(9 + (int)c);
      f.insert(f.end(), tc.begin(), tc.end());
    }
    const Tables t(f);
    const tz::RansCtx ctx{nc > 1 ? 100u : 0u, nc};
    for (uint32_t n : {3000u, 97u, 40u}) {
      const Bytes sym = symbols_for(t.freq, ctx, n, 99 + n);
      const Bytes good = encode_with(kPortableKernels, sym, t, ctx);
      ASSERT_FALSE(good.empty());
      for (int trial = 0; trial < 700; ++trial) {
        Bytes c = good;
        switch (trial % 5) {
          case 0: c[rng() % c.size()] ^= (uint8_t)(1u << (rng() % 8)); break;
          case 1: c.resize(c.size() - std::min<size_t>(c.size(), 1 + rng() % 16)); break;
          case 2: c.resize(c.size() + 1 + rng() % 8, (uint8_t)rng()); break;
          case 3: c[tz::kRansStateBytes + rng() % (c.size() - tz::kRansStateBytes + 1) - 1] ^= (uint8_t)rng(); break;
          default:
            for (int i = 0; i < 4; ++i) c[rng() % tz::kRansStateBytes] = (uint8_t)rng();
        }
        Bytes want(n);
        const int st = tz::ref::rans_decode(c.data(), c.size(), n, t.freq.data(), ctx, want.data());
        Bytes got(n);
        ASSERT_EQ(kPortableKernels.rans_decode(c.data(), c.size(), n, t.dec.data(), ctx, got.data()), st)
            << "portable, trial " << trial;
        if (st == tz::kOk) {
          ASSERT_EQ(got, want);
        }
        for (const CodecKernels* k : ks) {
          expect_decoders_match(*k, c, n, t, ctx, good, n, t, ctx, "trial " + std::to_string(trial));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The four stream buffers a split writes: n bytes each and a guard byte,
// 0xEE, the data starting `off` bytes into each (unaligned pointers).
struct StreamBufs {
  Bytes b[4];
  uint8_t* p[4];
  StreamBufs(uint32_t n, int off) {
    for (int s = 0; s < 4; ++s) {
      b[s].assign(n + 1 + (size_t)off, 0xEE);
      p[s] = b[s].data() + off;
    }
  }
};

TEST(Simd, PortableFieldLoopsMatchTheSharedFields) {
  // The portable table splits and merges with its own vectorisable loops
  // (simd_field_loops.inc); they must equal tz::split_fields /
  // tz::merge_fields (the shared host/device code) for every dtype, size
  // and alignment, and never write past the end.
  const uint8_t dtypes[] = {tz::kBytes, tz::kBF16, tz::kF16, tz::kF32, tz::kF8E4M3, tz::kF8E5M2};
  for (uint8_t dt : dtypes)
    for (uint32_t n : {0u, 1u, 2u, 3u, 7u, 15u, 16u, 17u, 31u, 33u, 63u, 65u, 129u, 1025u, 4097u})
      for (int off = 0; off < 4; ++off) {
        const std::string tag = "dtype " + std::to_string(dt) + " n " + std::to_string(n) + " offset " +
                                std::to_string(off);
        const uint32_t es = tz::dtype_elem_size(dt);
        const int K = tz::dtype_stream_count(dt);
        const Bytes buf = tzt::hash_stream((size_t)n * es + off, 3 * n + dt + off);
        const uint8_t* src = buf.data() + off;
        StreamBufs want(n, 0), got(n, off);
        tz::split_fields(dt, src, n, want.p);
        kPortableKernels.split(dt, src, n, got.p);
        for (int s = 0; s < K; ++s)
          ASSERT_TRUE(std::equal(want.b[s].begin(), want.b[s].end(), got.p[s])) << tag << " split " << s;
        // Merge streams that are not a split of anything (independent bytes).
        Bytes in[4];
        const uint8_t* ip[4];
        for (int s = 0; s < 4; ++s) {
          in[s] = tzt::hash_stream((size_t)n + off, 77 * s + n + off);
          ip[s] = in[s].data() + off;
        }
        Bytes mw((size_t)n * es + 1, 0xEE), mg((size_t)n * es + 1 + off, 0xEE);
        tz::merge_fields(dt, ip, n, mw.data());
        kPortableKernels.merge(dt, ip, n, mg.data() + off);
        ASSERT_TRUE(std::equal(mw.begin(), mw.end(), mg.begin() + off)) << tag << " merge";
      }
}

TEST(Simd, FieldKernelsMatchPortable) {
  // split, merge, min/max and histogram of every dtype and stream, odd sizes
  // around every vector width, unaligned buffers.
  SIMD_KERNELS_OR_SKIP(ks);
  const uint8_t dtypes[] = {tz::kBytes, tz::kBF16, tz::kF16, tz::kF32, tz::kF8E4M3, tz::kF8E5M2};
  const uint32_t sizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 4097};
  for (const CodecKernels* k : ks)
    for (uint8_t dt : dtypes)
      for (uint32_t n : sizes)
        for (int off = 0; off < 2; ++off) {
          const std::string tag = std::string(tz::cpu::simd_path_name(k->path)) + " dtype " + std::to_string(dt) +
                                  " n " + std::to_string(n) + " offset " + std::to_string(off);
          const uint32_t es = tz::dtype_elem_size(dt);
          const int K = tz::dtype_stream_count(dt);
          // Real-looking and random bytes alike: a hash stream with every
          // fourth element's high bytes copied, so exponents repeat.
          Bytes buf = tzt::hash_stream((size_t)n * es + off, n + dt);
          for (uint32_t i = 4; i < n; i += 4) buf[off + (size_t)i * es + es - 1] = buf[off + es - 1];
          const uint8_t* src = buf.data() + off;
          StreamBufs ps(n, 0), ss(n, off);
          uint8_t* const* pp = ps.p;
          uint8_t* const* sp = ss.p;
          kPortableKernels.split(dt, src, n, ps.p);
          k->split(dt, src, n, ss.p);
          for (int s = 0; s < K; ++s)
            ASSERT_TRUE(std::equal(ps.b[s].begin(), ps.b[s].end(), sp[s])) << tag << " split " << s;
          Bytes pm((size_t)n * es + 1, 0xEE), sm((size_t)n * es + 1 + off, 0xEE);
          const uint8_t* cpp[4] = {pp[0], pp[1], pp[2], pp[3]};
          const uint8_t* csp[4] = {sp[0], sp[1], sp[2], sp[3]};
          kPortableKernels.merge(dt, cpp, n, pm.data());
          k->merge(dt, csp, n, sm.data() + off);
          ASSERT_TRUE(std::equal(pm.begin(), pm.end(), sm.begin() + off)) << tag << " merge";
          ASSERT_TRUE(std::equal(pm.begin(), pm.end() - 1, src)) << tag << " merge inverts split";
          for (int s = 0; s < K; ++s) {
            uint8_t r0[4] = {1, 2, 3, 4}, r1[4] = {5, 6, 7, 8};
            kPortableKernels.minmax(dt, s, src, n, r0);
            k->minmax(dt, s, src, n, r1);
            for (int j = 0; j < 4; ++j) ASSERT_EQ(r0[j], r1[j]) << tag << " extreme " << j << " of stream " << s;
            std::vector<uint64_t> h0(256), h1(256), want(256);
            for (int v = 0; v < 256; ++v) h0[v] = h1[v] = want[v] = (uint64_t)v * 3;  // histograms add up
            kPortableKernels.histogram(dt, s, src, n, h0.data());
            k->histogram(dt, s, src, n, h1.data());
            uint8_t lo = 255, hi = 0;  // straight from the format's per-element rule
            int8_t smax = -128, smin = 127;
            for (uint32_t i = 0; i < n; ++i) {
              const uint8_t b = tz::field_byte(dt, src, i, s);
              ++want[b], lo = std::min(lo, b), hi = std::max(hi, b);
              smax = std::max(smax, (int8_t)b), smin = std::min(smin, (int8_t)b);
            }
            ASSERT_EQ(h0, want) << tag << " portable histogram of stream " << s;
            ASSERT_EQ(h0, h1) << tag << " histogram of stream " << s;
            ASSERT_EQ(r0[0], lo) << tag << " portable min of stream " << s;
            ASSERT_EQ(r0[1], hi) << tag << " portable max of stream " << s;
            ASSERT_EQ(r0[2], (uint8_t)smax) << tag << " portable signed max of stream " << s;
            ASSERT_EQ(r0[3], (uint8_t)smin) << tag << " portable signed min of stream " << s;
          }
        }
}

TEST(Simd, HistogramOfConcentratedStreamsMatchesPortable) {
  // Exponent-like streams (most bytes in a few adjacent values), where the
  // SIMD histograms count a window of values in vectors and the rest one by
  // one: windows at both ends of the byte range, outliers on both sides of
  // the window (0 and 255 included), a stream whose values leave the window
  // after the first chunk, sizes around chunk and vector widths, unaligned.
  SIMD_KERNELS_OR_SKIP(ks);
  std::mt19937 rng(14);
  const uint32_t sizes[] = {1025, 1056, 2047, 2048, 3001, 65536 + 17};
  const int centres[] = {3, 120, 250};
  for (const CodecKernels* k : ks)
    for (uint32_t n : sizes)
      for (int centre : centres)
        for (int outliers : {0, 1, 20, 300}) {  // per mille outside the window
          for (int drift = 0; drift < 2; ++drift) {
            const std::string tag = std::string(tz::cpu::simd_path_name(k->path)) + " n " + std::to_string(n) +
                                    " centre " + std::to_string(centre) + " outliers " + std::to_string(outliers) +
                                    " drift " + std::to_string(drift);
            // BF16 elements whose exponent (stream 0) is centre +- 5, an
            // outlier anywhere in 0..255, or (drift) centre + 40 past 1500.
            Bytes buf(2 * (size_t)n + 1);
            for (uint32_t i = 0; i < n; ++i) {
              int e = centre + (int)(rng() % 11) - 5;
              if ((int)(rng() % 1000) < outliers) e = (int)(rng() % 4 == 0 ? (rng() % 2) * 255 : rng() % 256);
              if (drift && i >= 1500) e += 40;
              e = std::clamp(e, 0, 255);
              const uint16_t v = (uint16_t)((e << 7) | (rng() & 0x807F));
              buf[1 + 2 * (size_t)i] = (uint8_t)v, buf[2 + 2 * (size_t)i] = (uint8_t)(v >> 8);
            }
            const uint8_t* src = buf.data() + 1;
            for (int s = 0; s < 2; ++s) {
              std::vector<uint64_t> h0(256, 7), h1(256, 7), want(256, 7);
              for (uint32_t i = 0; i < n; ++i) ++want[tz::field_byte(tz::kBF16, src, i, s)];
              kPortableKernels.histogram(tz::kBF16, s, src, n, h0.data());
              k->histogram(tz::kBF16, s, src, n, h1.data());
              ASSERT_EQ(h0, want) << tag << " portable histogram of stream " << s;
              ASSERT_EQ(h1, want) << tag << " histogram of stream " << s;
            }
            // The same bytes as one-byte elements (FP8 / bytes streams).
            std::vector<uint64_t> h0(256, 0), h1(256, 0);
            kPortableKernels.histogram(tz::kF8E4M3, 0, src, 2 * n, h0.data());
            k->histogram(tz::kF8E4M3, 0, src, 2 * n, h1.data());
            ASSERT_EQ(h0, h1) << tag << " histogram of the bytes";
          }
        }
}

}  // namespace
