// The portable decoder keeps the split decode tables of a thread's last few
// table sets and finds them again by the content of the decode tables
// (src/cpu/rans_portable.cpp, SplitTablesCache). These tests decode
// sequences of streams that a cache keyed wrongly would get wrong: one
// decode-table buffer rewritten with tables that differ only in their last
// slots, more table sets in turn than the cache holds, and streams too short
// to build split tables after a long one with the same tables. Every decode
// must give the shared decoder's status and symbols (src/codec/rans.h).
// Named Simd* so that the per-path reruns of the suite skip it: it calls the
// portable kernels directly, whatever TZ_SIMD says.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/format.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "simd_paths.h"

namespace {

using Bytes = std::vector<uint8_t>;
using tz::test::expect_portable_decode_as_shared;

// A table set of nc tables: every symbol of the first `spread` present,
// the rest of the probability on symbols 254 and 255 (so that two sets
// differing only there differ only in their decode tables' last slots).
std::vector<uint32_t> freqs(uint32_t nc, uint32_t spread, uint32_t f254) {
  std::vector<uint32_t> f(256 * (size_t)nc, 0);
  for (uint32_t c = 0; c < nc; ++c) {
    uint32_t* t = f.data() + 256 * c;
    uint32_t sum = 0;
    for (uint32_t s = 0; s < spread; ++s) t[s] = 8 + (s * 7 + c) % 23, sum += t[s];
    t[254] = f254;
    t[255] = tz::kProbScale - sum - f254;  // the callers' spreads leave it >= 1 (checked in Set)
  }
  return f;
}

struct Set {
  std::vector<uint32_t> freq, dec;
  std::vector<tz::RansEncSym> enc;
  tz::RansCtx ctx;
  Set(const std::vector<uint32_t>& f, uint32_t base) : freq(f), enc(f.size()) {
    const uint32_t nc = (uint32_t)(f.size() / 256);
    ctx = tz::RansCtx{base, nc};
    dec.resize((size_t)nc * tz::kProbScale);
    for (uint32_t c = 0; c < nc; ++c) {
      uint32_t sum = 0;
      for (int s = 0; s < 256; ++s) sum += f[256 * c + s];
      EXPECT_TRUE(sum == tz::kProbScale && f[256 * c + 255] >= 1 && f[256 * c + 255] < tz::kProbScale) << "table " << c;
      tz::rans_build_enc(f.data() + 256 * c, enc.data() + 256 * c);
      tz::rans_build_dec(f.data() + 256 * c, dec.data() + (size_t)tz::kProbScale * c);
    }
  }
};

// n symbols drawn by the frequencies of their context's table, and their payload.
Bytes symbols(const Set& t, uint32_t n, uint32_t seed) {
  std::vector<std::vector<uint8_t>> pool(t.ctx.n);
  for (uint32_t c = 0; c < t.ctx.n; ++c)
    for (int s = 0; s < 256; ++s) pool[c].insert(pool[c].end(), t.freq[256 * c + s], (uint8_t)s);
  std::mt19937 rng(seed);
  Bytes out(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t c = i >= (uint32_t)tz::kLanes ? tz::rans_ctx_of(out[i - tz::kLanes], t.ctx) : 0u;
    out[i] = pool[c][rng() % pool[c].size()];
  }
  return out;
}
Bytes encode(const Set& t, const Bytes& sym) {
  const uint32_t n = (uint32_t)sym.size();
  std::vector<uint16_t> words(n + 1);
  Bytes out(tz::kRansStateBytes + 2 * (size_t)n + 8);
  out.resize(tz::rans_encode_ctx(sym.data(), n, t.enc.data(), t.ctx, words.data(), out.data(), SIZE_MAX));
  return out;
}

TEST(SimdPortableTables, OneBufferRewrittenWithTablesDifferingInTheLastSlots) {
  // The frame decoder reuses its decode-table buffers from frame to frame:
  // the same address with other tables must not find the old split tables.
  for (uint32_t nc = 1; nc <= tz::kMaxContexts; ++nc) {
    const Set a(freqs(nc, 200, 40), 3), b(freqs(nc, 200, 41), 3);
    ASSERT_EQ(a.dec.size(), b.dec.size());
    size_t first_diff = 0;
    while (first_diff < a.dec.size() && a.dec[first_diff] == b.dec[first_diff]) ++first_diff;
    ASSERT_GE(first_diff, (size_t)3000) << "the sets' decode tables share their first 3000 slots";
    ASSERT_LT(first_diff, (size_t)tz::kProbScale) << "and differ in table 0";
    std::vector<uint32_t> buf(a.dec.size());
    for (uint32_t n : {9000u * nc, 2000u * nc, 30000u * nc}) {  // builds; reuses only; builds
      for (const Set* t : {&a, &b, &a, &b}) {
        const std::string tag = "contexts " + std::to_string(nc) + " n " + std::to_string(n) +
                                (t == &a ? " set a" : " set b");
        std::copy(t->dec.begin(), t->dec.end(), buf.begin());
        const Bytes sym = symbols(*t, n, n + nc + (t == &a ? 0u : 1u));
        ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(encode(*t, sym), n, buf.data(), t->ctx, &sym, tag));
      }
    }
  }
}

TEST(SimdPortableTables, MoreTableSetsInTurnThanKept) {
  // Seven table sets decoded in turn, long and short streams, intact and
  // damaged: every one as the shared decoder decodes it.
  std::vector<Set> sets;
  for (uint32_t k = 0; k < 7; ++k) sets.emplace_back(freqs(1 + k % tz::kMaxContexts, 60 + 20 * k, 30 + k), k);
  std::mt19937 rng(3);
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < sets.size(); ++k) {
      const Set& t = sets[k];
      const uint32_t n = (round == 1 ? 1500u : 9000u) * t.ctx.n + (uint32_t)k;
      const Bytes sym = symbols(t, n, (uint32_t)(round * 10 + k));
      const Bytes c = encode(t, sym);
      const std::string tag = "round " + std::to_string(round) + " set " + std::to_string(k);
      ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(c, n, t.dec.data(), t.ctx, &sym, tag));
      Bytes bad = c;
      bad[tz::kRansStateBytes + rng() % (bad.size() - tz::kRansStateBytes)] ^= (uint8_t)(1u << (rng() % 8));
      ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(bad, n, t.dec.data(), t.ctx, nullptr, tag + " damaged"));
      bad = c;
      bad.resize(bad.size() - 2 * (1 + rng() % 20));
      ASSERT_NO_FATAL_FAILURE(expect_portable_decode_as_shared(bad, n, t.dec.data(), t.ctx, nullptr, tag + " cut"));
    }
}

}  // namespace
