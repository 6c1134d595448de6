// The rANS decoders of every kernel set of the CPU backend against the
// portable ones (and the portable ones against the shared decoder of
// src/codec/rans.h and the reference of tests/support/ref_rans.h): streams
// long enough for split tables, lane-context streams, corrupt streams. The
// encoders are compared in test_simd.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "codec/rans.h"
#include "cpu/kernels.h"
#include "ref_rans.h"
#include "simd_paths.h"
#include "simd_rans_cases.h"

namespace {

using namespace tz::test::simd_cases;
using tz::test::expect_portable_decode_as_shared;

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
        ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(c, n, t.dec.data(), ctx, trial == 0 ? &sym : nullptr,
                                                                 tag + " trial " + std::to_string(trial)));
      }
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

}  // namespace
