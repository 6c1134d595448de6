// Unit tests of the entropy coder (src/codec/rans.h): frequency
// normalisation, table serialisation, and the 32-lane coder itself.
#include <cmath>
#include <array>
#include <numeric>
#include <random>

#include "codec/rans.h"
#include "cpu/frame_internal.h"
#include "tz_test_util.h"

using namespace tzt;

namespace {

struct Norm {
  std::array<uint32_t, 256> freq{};
  int present = 0;
};

Norm normalize(const std::array<uint64_t, 256>& counts) {
  Norm n;
  n.present = tz::rans_normalize(counts.data(), n.freq.data());
  return n;
}

// The invariants every table must meet, whatever the histogram.
void check_invariants(const std::array<uint64_t, 256>& counts, const Norm& n) {
  int present = 0;
  uint64_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    present += counts[s] != 0;
    sum += n.freq[s];
    if (counts[s]) {
      EXPECT_GE(n.freq[s], 1u) << "symbol " << s;
    } else {
      EXPECT_EQ(n.freq[s], 0u) << "absent symbol " << s;
    }
  }
  EXPECT_EQ(n.present, present);
  EXPECT_EQ(sum, present ? tz::kProbScale : 0u);
  // More frequent symbols never get a smaller frequency.
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b)
      if (counts[a] > counts[b] && counts[b]) {
        ASSERT_GE(n.freq[a], n.freq[b]) << a << " vs " << b;
      }
  // Deterministic (CPU and GPU encoders must build the same table).
  const Norm again = normalize(counts);
  EXPECT_EQ(again.freq, n.freq);
}

// Bits needed to code `counts` with `freq`.
double code_bits(const std::array<uint64_t, 256>& counts, const std::array<uint32_t, 256>& freq) {
  double bits = 0;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) bits += (double)counts[s] * std::log2((double)tz::kProbScale / freq[s]);
  return bits;
}

TEST(RansNormalize, EmptyHistogram) {
  std::array<uint64_t, 256> c{};
  const Norm n = normalize(c);
  EXPECT_EQ(n.present, 0);
  for (uint32_t f : n.freq) EXPECT_EQ(f, 0u);
}

TEST(RansNormalize, ExtremeHistograms) {
  std::array<uint64_t, 256> c{};
  // One symbol (any count): the whole range.
  for (uint64_t count : {UINT64_C(1), UINT64_C(5000), UINT64_C(1) << 56}) {
    c = {};
    c[200] = count;
    const Norm n = normalize(c);
    check_invariants(c, n);
    EXPECT_EQ(n.freq[200], tz::kProbScale);
  }
  // 256 equal symbols: 16 each.
  c.fill(12345);
  {
    const Norm n = normalize(c);
    check_invariants(c, n);
    for (uint32_t f : n.freq) EXPECT_EQ(f, 16u);
  }
  // One huge symbol and 255 singletons: the singletons keep 1 each.
  c.fill(1);
  c[77] = UINT64_C(1) << 40;
  {
    const Norm n = normalize(c);
    check_invariants(c, n);
    EXPECT_EQ(n.freq[77], tz::kProbScale - 255);
  }
  // Counts summing to 2^56 (the largest raw size a frame allows).
  c = {};
  c[0] = (UINT64_C(1) << 56) - 300;
  for (int s = 1; s <= 100; ++s) c[s] = 3;
  check_invariants(c, normalize(c));
  c.fill(UINT64_C(1) << 48);  // 256 * 2^48 = 2^56
  {
    const Norm n = normalize(c);
    check_invariants(c, n);
    for (uint32_t f : n.freq) EXPECT_EQ(f, 16u);
  }
  c = {};
  c[1] = (UINT64_C(1) << 55) + 12345;
  c[2] = (UINT64_C(1) << 55) - 12345 - 255;
  for (int s = 3; s < 256; ++s) c[s] = 1;
  check_invariants(c, normalize(c));
  // Two symbols, one of them very rare.
  c = {};
  c[10] = 1;
  c[11] = 1000000;
  {
    const Norm n = normalize(c);
    check_invariants(c, n);
    EXPECT_EQ(n.freq[10], 1u);
  }
}

TEST(RansNormalize, RandomHistograms) {
  for (uint64_t trial = 0; trial < 300; ++trial) {
    std::array<uint64_t, 256> c{};
    const uint64_t h = splitmix64(trial);
    const int n_sym = 1 + (int)(h % 256);
    const int shape = (int)((h >> 8) % 4);
    for (int i = 0; i < n_sym; ++i) {
      const uint64_t r = splitmix64(h ^ (uint64_t)i);
      const int s = (int)(r % 256);
      switch (shape) {
        case 0: c[s] += 1 + r % 10; break;                                   // small counts
        case 1: c[s] += (r >> 8) % 1000000; break;                           // large, some zero
        case 2: c[s] += (UINT64_C(1) << (i % 40)); break;                    // geometric
        default: c[s] += (r >> 8) % (UINT64_C(1) << 40); break;              // huge
      }
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_invariants(c, normalize(c));
    if (HasFailure()) return;
  }
}

// The host's heap-ordered fix-up picks exactly what the device's greedy
// scan (one pass over 256 symbols per unit) picks: tables must not depend on
// which backend encoded. Reference: the scan, written out here.
std::array<uint32_t, 256> normalize_by_scan(const std::array<uint64_t, 256>& in) {
  std::array<uint32_t, 256> freq{};
  uint64_t total = 0;
  int present = 0;
  for (uint64_t v : in) total += v, present += v != 0;
  if (present == 0) return freq;
  if (present == 1) {
    for (int s = 0; s < 256; ++s) freq[s] = in[s] ? tz::kProbScale : 0;
    return freq;
  }
  int shift = 0;
  while ((total >> shift) >= (UINT64_C(1) << 50)) ++shift;
  std::array<uint64_t, 256> c{};
  uint64_t t = 0;
  for (int s = 0; s < 256; ++s) {
    c[s] = in[s] >> shift;
    if (in[s] && c[s] == 0) c[s] = 1;
    t += c[s];
  }
  int64_t sum = 0;
  for (int s = 0; s < 256; ++s)
    if (c[s]) {
      freq[s] = (uint32_t)std::max<uint64_t>(1, c[s] * tz::kProbScale / t);
      sum += freq[s];
    }
  for (; sum < (int64_t)tz::kProbScale; ++sum) {
    int b = -1;
    for (int s = 0; s < 256; ++s)
      if (c[s] && (b < 0 || c[s] * freq[b] > c[b] * freq[s])) b = s;
    ++freq[b];
  }
  for (; sum > (int64_t)tz::kProbScale; --sum) {
    int b = -1;
    for (int s = 0; s < 256; ++s)
      if (freq[s] > 1 && (b < 0 || c[s] * (freq[b] - 1) < c[b] * (freq[s] - 1))) b = s;
    --freq[b];
  }
  return freq;
}

TEST(RansNormalize, SameTablesAsTheGreedyScan) {
  int raised = 0, lowered = 0;
  for (uint64_t trial = 0; trial < 3000; ++trial) {
    std::array<uint64_t, 256> c{};
    const uint64_t h = splitmix64(trial * 7 + 1);
    const int n_sym = 2 + (int)(h % 255);
    const int shape = (int)((h >> 8) % 5);
    for (int i = 0; i < n_sym; ++i) {
      const uint64_t r = splitmix64(h ^ (uint64_t)i);
      const int s = shape == 4 ? i : (int)(r % 256);
      switch (shape) {
        case 0: c[s] += 1 + r % 10; break;                         // small counts: many ties
        case 1: c[s] += (r >> 8) % 1000000; break;                 // large, some zero
        case 2: c[s] += (UINT64_C(1) << (i % 40)); break;          // geometric
        case 3: c[s] += (r >> 8) % (UINT64_C(1) << 40); break;     // huge
        default: c[s] += i < 3 ? 1000000 : 1 + r % 3; break;       // a few big, many tiny: sum > scale
      }
    }
    const Norm n = normalize(c);
    const auto ref = normalize_by_scan(c);
    ASSERT_EQ(n.freq, ref) << "trial " << trial;
    // Both fix-up directions must be exercised (start = the rounded-down sum).
    uint64_t t = 0, start = 0;
    for (uint64_t v : c) t += v;
    for (uint64_t v : c)
      if (v) start += std::max<uint64_t>(1, (unsigned __int128)v * tz::kProbScale / t);
    raised += start < tz::kProbScale;
    lowered += start > tz::kProbScale;
  }
  EXPECT_GT(raised, 100);
  EXPECT_GT(lowered, 20);
}

// The normalised table is close to the best integer table: compared with
// an exhaustive search over all tables of two and three symbols.
TEST(RansNormalize, NearOptimalForSmallAlphabets) {
  const std::vector<std::vector<uint64_t>> hists = {
      {1, 1}, {1, 999}, {3, 7}, {123456, 7}, {5, 5, 5}, {1000, 10, 1}, {70000, 3000, 17}, {1, 1, 1000000}};
  for (const auto& h : hists) {
    std::array<uint64_t, 256> c{};
    for (size_t i = 0; i < h.size(); ++i) c[i * 50] = h[i];
    const Norm n = normalize(c);
    check_invariants(c, n);
    double best = INFINITY;
    const uint32_t M = tz::kProbScale;
    if (h.size() == 2) {
      for (uint32_t f0 = 1; f0 < M; ++f0)
        best = std::min(best, h[0] * std::log2((double)M / f0) + h[1] * std::log2((double)M / (M - f0)));
    } else {
      for (uint32_t f0 = 1; f0 < M - 1; ++f0)
        for (uint32_t f1 = 1; f0 + f1 < M; ++f1)
          best = std::min(best, h[0] * std::log2((double)M / f0) + h[1] * std::log2((double)M / f1) +
                                    h[2] * std::log2((double)M / (M - f0 - f1)));
    }
    const double got = code_bits(c, n.freq);
    EXPECT_LE(got, best * 1.0001 + 0.5) << "histogram of " << h.size() << " symbols: " << got << " vs " << best;
  }
}

// On the real exponent histogram the table costs little over the entropy.
TEST(RansNormalize, RealExponentHistogram) {
  const Bytes& src = real_data(TZ_DTYPE_BF16);
  std::array<uint64_t, 256> c{};
  for (size_t i = 0; i + 1 < src.size(); i += 2) ++c[(uint8_t)(((src[i + 1] << 8 | src[i]) >> 7) & 0xFF)];
  const Norm n = normalize(c);
  check_invariants(c, n);
  const double total = std::accumulate(c.begin(), c.end(), 0.0);
  double entropy = 0;
  for (uint64_t x : c)
    if (x) entropy -= x * std::log2(x / total);
  const double got = code_bits(c, n.freq);
  EXPECT_LE(got, entropy * 1.005) << "entropy " << entropy / total << " bits/symbol, table " << got / total;
}

// ---------------------------------------------------------------- tables --

TEST(RansTable, WriteReadRoundTrip) {
  for (uint64_t trial = 0; trial < 200; ++trial) {
    std::array<uint64_t, 256> c{};
    const uint64_t h = splitmix64(trial + 1000);
    const int n_sym = 1 + (int)(h % 256);
    for (int i = 0; i < n_sym; ++i) c[splitmix64(h + i) % 256] += 1 + splitmix64(h - i) % (trial % 2 ? 100 : 10000000);
    const Norm n = normalize(c);
    uint8_t buf[tz::kFreqTableMaxBytes];
    const size_t w = tz::rans_write_table(n.freq.data(), buf);
    ASSERT_LE(w, tz::kFreqTableMaxBytes);
    ASSERT_GE(w, 32u + n.present);
    // Exactly-sized copy: the reader must not look past n.
    const Bytes exact(buf, buf + w);
    std::array<uint32_t, 256> back{};
    ASSERT_EQ(tz::rans_read_table(exact.data(), exact.size(), back.data()), w);
    ASSERT_EQ(back, n.freq);
    // Extra bytes after the table are not consumed.
    Bytes longer = exact;
    longer.resize(w + 7, 0xAB);
    ASSERT_EQ(tz::rans_read_table(longer.data(), longer.size(), back.data()), w);
    // Every truncation is rejected.
    for (size_t len = 0; len < w; ++len) {
      const Bytes t(exact.begin(), exact.begin() + (ptrdiff_t)len);
      ASSERT_EQ(tz::rans_read_table(t.data(), t.size(), back.data()), 0u) << "length " << len;
    }
  }
}

TEST(RansTable, LayoutFollowsTheFormat) {
  // Bitmap bit s%8 of byte s/8, then LEB128 frequencies in symbol order.
  std::array<uint32_t, 256> f{};
  f[0] = 100;
  f[9] = 3996;
  uint8_t buf[tz::kFreqTableMaxBytes];
  ASSERT_EQ(tz::rans_write_table(f.data(), buf), 32u + 1 + 2);
  EXPECT_EQ(buf[0], 0x01);
  EXPECT_EQ(buf[1], 0x02);
  for (int i = 2; i < 32; ++i) EXPECT_EQ(buf[i], 0);
  EXPECT_EQ(buf[32], 100);
  EXPECT_EQ(buf[33], 0x80 | (3996 & 0x7F));
  EXPECT_EQ(buf[34], 3996 >> 7);
}

// The CPU decoder's table builder (8 entries at a time, runs overwritten by
// the next symbol's) writes rans_build_dec's tables exactly, for tables of
// one symbol, of every symbol, of runs of every length mod 8 and random
// ones, built back to back into one buffer as the decoder does; and it
// writes nothing past the slack.
TEST(RansTable, CpuDecodeTableBuilderMatchesTheReference) {
  using tz::kProbScale;
  std::mt19937 rng(23);
  std::vector<std::array<uint32_t, 256>> tables;
  std::array<uint32_t, 256> t{};
  t[7] = kProbScale;  // one symbol
  tables.push_back(t);
  t.fill(kProbScale / 256);  // every symbol, 16 each
  tables.push_back(t);
  t.fill(0);
  t[255] = kProbScale;  // the last symbol only
  tables.push_back(t);
  for (int trial = 0; trial < 40; ++trial) {
    uint64_t counts[256] = {};
    const int present = 1 + (int)(rng() % 256);
    for (int j = 0; j < present; ++j) counts[rng() % 256] += 1 + rng() % (trial % 2 ? 9 : 100000);
    ASSERT_GT(tz::rans_normalize(counts, t.data()), 0u);
    tables.push_back(t);
  }
  const size_t n = tables.size();
  std::vector<uint32_t> got(n * kProbScale + tz::cpu::kDecTableSlack + 8, 0xA5A5A5A5u), want(n * kProbScale);
  for (size_t j = 0; j < n; ++j) {
    tz::cpu::build_dec_table(tables[j].data(), got.data() + j * kProbScale);
    tz::rans_build_dec(tables[j].data(), want.data() + j * kProbScale);
  }
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "entry " << i;
  for (size_t i = n * kProbScale + tz::cpu::kDecTableSlack; i < got.size(); ++i) EXPECT_EQ(got[i], 0xA5A5A5A5u) << i;
}

TEST(RansTable, RejectsMalformedTables) {
  auto make = [](std::initializer_list<std::pair<int, std::vector<uint8_t>>> entries) {
    Bytes t(32, 0);
    for (const auto& [sym, enc] : entries) {
      t[sym / 8] |= (uint8_t)(1u << (sym % 8));
      t.insert(t.end(), enc.begin(), enc.end());
    }
    return t;
  };
  std::array<uint32_t, 256> f{};
  auto read = [&](const Bytes& t) { return tz::rans_read_table(t.data(), t.size(), f.data()); };
  // Valid reference: 4096 = 0x80|0x00, 0x20 for one symbol; 4000 + 96 for two.
  EXPECT_EQ(read(make({{5, {0x80, 0x20}}})), 34u);
  EXPECT_EQ(read(make({{5, {0x80 | (4000 & 0x7F), 4000 >> 7}}, {6, {96}}})), 35u);
  EXPECT_EQ(read(Bytes(32, 0)), 0u);                                                   // empty: sums to 0
  EXPECT_EQ(read(make({{5, {0x00}}, {6, {0x80, 0x20}}})), 0u);                         // zero frequency
  EXPECT_EQ(read(make({{5, {0x80, 0x00}}, {6, {0x80, 0x20}}})), 0u);                   // non-canonical LEB128
  EXPECT_EQ(read(make({{5, {0x81, 0x20}}})), 0u);                                      // 4097 > 4096
  EXPECT_EQ(read(make({{5, {0xFF, 0x7F}}})), 0u);                                      // 16383
  EXPECT_EQ(read(make({{5, {0x80, 0x80}}})), 0u);                                      // 3-byte LEB128
  EXPECT_EQ(read(make({{5, {100}}, {6, {100}}})), 0u);                                 // sum 200
  EXPECT_EQ(read(make({{5, {0x80 | (4000 & 0x7F), 4000 >> 7}}, {6, {97}}})), 0u);      // sum 4097
  Bytes missing = make({{5, {0x80 | (4000 & 0x7F), 4000 >> 7}}, {6, {96}}});
  missing[0] |= 0x01;  // symbol 0 present but no frequency left
  EXPECT_EQ(read(missing), 0u);
  EXPECT_EQ(tz::rans_read_table(nullptr, 0, f.data()), 0u);
}

// ---------------------------------------------------------------- coding --

struct Coder {
  std::array<uint32_t, 256> freq{};
  std::vector<tz::RansEncSym> enc = std::vector<tz::RansEncSym>(256);
  std::vector<uint32_t> dec = std::vector<uint32_t>(tz::kProbScale);
  explicit Coder(const Bytes& sym) {
    std::array<uint64_t, 256> c{};
    for (uint8_t s : sym) ++c[s];
    if (sym.empty()) c[0] = 1;
    tz::rans_normalize(c.data(), freq.data());
    tz::rans_build_enc(freq.data(), enc.data());
    tz::rans_build_dec(freq.data(), dec.data());
  }
  Bytes encode(const Bytes& sym) const {
    std::vector<uint16_t> words(sym.size() + 1);
    Bytes out(tz::kRansStateBytes + 2 * sym.size());
    const size_t n = tz::rans_encode(sym.data(), (uint32_t)sym.size(), enc.data(), words.data(), out.data(), SIZE_MAX);
    out.resize(n);
    return out;
  }
};

// A plain decoder written from the format text (doc/format.md 5): lane
// l = i % 32 decodes symbol i; steps go forward; in a step, lanes whose
// state fell below 2^16 read the next 16-bit word in ascending lane order.
bool reference_decode(const Bytes& payload, size_t n, const std::array<uint32_t, 256>& freq, Bytes& out) {
  if (payload.size() < 128 || payload.size() % 2) return false;
  uint32_t x[32];
  for (int l = 0; l < 32; ++l) memcpy(&x[l], payload.data() + 4 * l, 4);
  size_t p = 128;
  std::array<uint32_t, 256> start{};
  for (int s = 1; s < 256; ++s) start[s] = start[s - 1] + freq[s - 1];
  out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    uint32_t& xl = x[i % 32];
    const uint32_t slot = xl & 4095;
    int s = 0;
    while (!(slot >= start[s] && slot < start[s] + freq[s])) ++s;
    out[i] = (uint8_t)s;
    xl = freq[s] * (xl >> 12) + slot - start[s];
    if (xl < (1u << 16)) {
      if (p + 2 > payload.size()) return false;
      xl = (xl << 16) | (uint32_t)(payload[p] | payload[p + 1] << 8);
      p += 2;
    }
  }
  if (p != payload.size()) return false;
  for (uint32_t v : x)
    if (v != (1u << 16)) return false;
  return true;
}

Bytes symbols(size_t n, int shape, uint64_t seed) {
  Bytes s(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(seed + i);
    switch (shape) {
      case 0: s[i] = (uint8_t)r; break;                          // uniform
      case 1: s[i] = (uint8_t)(120 + __builtin_ctzll(r | (1ull << 40))); break;  // geometric, exponent-like
      case 2: s[i] = 42; break;                                  // one symbol
      default: s[i] = (r % 1000) < 2 ? 7 : 9; break;             // two, very skewed
    }
  }
  return s;
}

TEST(RansCoder, RoundTripEdgeLengths) {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 100; ++n) lengths.push_back(n);
  for (size_t n : {127, 128, 129, 1000, 4095, 4096, 4097, 65536, 100003}) lengths.push_back(n);
  for (int shape = 0; shape < 4; ++shape) {
    for (size_t n : lengths) {
      SCOPED_TRACE("shape " + std::to_string(shape) + ", n " + std::to_string(n));
      const Bytes sym = symbols(n, shape, n * 7 + shape);
      const Coder c(sym);
      const Bytes payload = c.encode(sym);
      ASSERT_GE(payload.size(), tz::kRansStateBytes);
      ASSERT_EQ(payload.size() % 2, 0u);
      Bytes out(n + 1, 0xEE);
      ASSERT_EQ(tz::rans_decode(payload.data(), payload.size(), (uint32_t)n, c.dec.data(), out.data()), tz::kOk);
      ASSERT_EQ(out[n], 0xEE) << "decoder wrote past n";
      out.resize(n);
      ASSERT_EQ(out, sym);
      Bytes ref;
      ASSERT_TRUE(reference_decode(payload, n, c.freq, ref)) << "stream does not follow the documented lane order";
      ASSERT_EQ(ref, sym);
    }
  }
}

TEST(RansCoder, SizeLimitAndSingleSymbol) {
  const Bytes sym = symbols(10000, 0, 1);  // uniform: ~8 bits per symbol
  const Coder c(sym);
  const Bytes payload = c.encode(sym);
  std::vector<uint16_t> words(sym.size());
  Bytes out(payload.size() + 16);
  // limit is exclusive: returns 0 when the payload would not be smaller.
  EXPECT_EQ(tz::rans_encode(sym.data(), (uint32_t)sym.size(), c.enc.data(), words.data(), out.data(), payload.size()),
            0u);
  EXPECT_EQ(
      tz::rans_encode(sym.data(), (uint32_t)sym.size(), c.enc.data(), words.data(), out.data(), payload.size() + 1),
      payload.size());
  // One symbol with frequency 4096 costs nothing beyond the states.
  const Bytes one = symbols(5000, 2, 0);
  const Coder c1(one);
  EXPECT_EQ(c1.encode(one).size(), tz::kRansStateBytes);
  // Near-uniform data: about 8 bits per symbol, so ~ n + 128 bytes.
  EXPECT_NEAR((double)payload.size(), 10000.0 + 128, 150.0);
}

TEST(RansCoder, DecoderRejectsDamagedPayloads) {
  for (size_t n : {0, 1, 33, 1000, 20000}) {
    const Bytes sym = symbols(n, 1, n);
    const Coder c(sym);
    const Bytes payload = c.encode(sym);
    Bytes out(n + 1);
    auto decode = [&](const Bytes& p) { return tz::rans_decode(p.data(), p.size(), (uint32_t)n, c.dec.data(), out.data()); };
    // Too short for the states, odd sizes, missing or extra words.
    for (size_t len : {size_t(0), size_t(4), size_t(127)}) EXPECT_NE(decode(Bytes(payload.begin(), payload.begin() + (ptrdiff_t)std::min(len, payload.size()))), tz::kOk);
    Bytes odd = payload;
    odd.push_back(0);
    EXPECT_NE(decode(odd), tz::kOk);
    Bytes extra = payload;
    extra.push_back(0);
    extra.push_back(0);
    EXPECT_NE(decode(extra), tz::kOk);
    if (payload.size() > tz::kRansStateBytes) {
      const Bytes fewer(payload.begin(), payload.end() - 2);
      EXPECT_NE(decode(fewer), tz::kOk);
    }
    // Any single changed byte: error, or different symbols. A success with
    // the same symbols would mean two streams encode the same input.
    for (size_t i = 0; i < payload.size(); i += (payload.size() > 2000 ? 37 : 1)) {
      Bytes p = payload;
      p[i] ^= 0x24;
      out.assign(n + 1, 0);
      const int st = decode(p);
      if (st == tz::kOk) {
        EXPECT_FALSE(std::equal(sym.begin(), sym.end(), out.begin())) << "byte " << i;
      }
    }
  }
}

TEST(RansCoder, GarbageNeverOverruns) {
  // Arbitrary payloads and lengths: the decoder may fail, but it must stay
  // inside its buffers (checked by ASan in the debug preset, and here by a
  // guard zone after the output) and answer ok or "corrupt block", never
  // anything else. Garbage of a full lane state or more is refused.
  const Coder c(symbols(5000, 1, 3));
  constexpr size_t kGuard = 64;
  size_t refused = 0, long_inputs = 0;
  for (uint64_t trial = 0; trial < 3000; ++trial) {
    const uint64_t h = splitmix64(trial);
    const size_t size = (size_t)(h % 600);
    const uint32_t n = (uint32_t)((h >> 16) % 2000);
    const Bytes p = hash_stream(size, trial);
    Bytes out(n + kGuard, 0xA5);
    const int r = tz::rans_decode(p.data(), p.size(), n, c.dec.data(), out.data());
    ASSERT_TRUE(r == tz::kOk || r == tz::kErrCorruptBlock) << "trial " << trial << ": status " << r;
    for (size_t k = n; k < n + kGuard; ++k)
      ASSERT_EQ(out[k], 0xA5) << "trial " << trial << ": wrote byte " << k - n << " past the output";
    refused += r != tz::kOk;
    long_inputs += size >= 4 * tz::kLanes;
  }
  // Random bytes almost never leave every lane's final state where the
  // encoder starts it: most trials must be refused, not silently decoded.
  EXPECT_GT(refused, long_inputs * 9 / 10) << refused << " of 3000 refused, " << long_inputs << " long inputs";
}

}  // namespace
