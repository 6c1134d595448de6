// Unit tests of the length-limited prefix coder (src/codec/prefix_code.h):
// code lengths against a reference Huffman code, the length limit, the
// description's validation, and round trips of real exponent streams
// through the bit-exact decoder and the multi-symbol table.
#include <algorithm>
#include <array>
#include <functional>
#include <queue>
#include <vector>

#include "codec/fields.h"
#include "codec/prefix_code.h"
#include "tz_test_data.h"
#include "tz_test_util.h"

using namespace tzt;

namespace {

using Counts = std::array<uint64_t, 256>;
using Lens = std::array<uint8_t, 256>;

// The exponent bytes (stream 0) of the fixture slices' real values.
std::vector<uint8_t> real_exponents(bool f32) {
  const Bytes raw = concat(f32 ? fp32_slice() : bf16_slice());
  std::vector<uint8_t> e;
  const size_t esz = f32 ? 4 : 2;
  for (size_t i = 0; i + esz <= raw.size(); i += esz) {
    uint8_t x[4];
    if (f32) tz::split_elem_f32(tz::load_le32(raw.data() + i), x[0], x[1], x[2], x[3]);
    else tz::split_elem_bf16(tz::load_le16(raw.data() + i), x[0], x[1]);
    e.push_back(x[0]);
  }
  return e;
}

Counts histogram(const uint8_t* s, size_t n) {
  Counts c{};
  for (size_t i = 0; i < n; ++i) ++c[s[i]];
  return c;
}

uint64_t coded_bits(const Counts& c, const Lens& len) {
  uint64_t b = 0;
  for (int s = 0; s < 256; ++s) b += c[s] * len[s];
  return b;
}

// Total bits of an unlimited Huffman code, by merging the two lightest
// subtrees: each merge adds its weight once per level it moves down.
uint64_t reference_huffman_bits(const Counts& c) {
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> q;
  for (uint64_t v : c)
    if (v) q.push(v);
  if (q.size() == 1) return q.top();
  uint64_t bits = 0;
  while (q.size() > 1) {
    const uint64_t a = q.top();
    q.pop();
    const uint64_t b = q.top();
    q.pop();
    bits += a + b;
    q.push(a + b);
  }
  return bits;
}

Lens lengths_of(const Counts& c, uint32_t limit = tz::kPrefixMaxBits) {
  Lens len{};
  tz::prefix_code_lengths(c.data(), limit, len.data());
  return len;
}

// A decoder built from the multi-symbol table alone (bytes 0..5 symbols,
// byte 6 bits, byte 7 count), one window at a time: checks that table
// against the bit-exact decoder.
std::vector<uint8_t> decode_with_multi(const std::vector<uint8_t>& bytes, uint64_t bits, size_t n,
                                       const uint64_t* multi) {
  std::vector<uint8_t> out;
  uint64_t pos = 0;
  while (out.size() < n && pos < bits) {
    uint32_t w = 0;
    for (uint32_t j = 0; j < 3; ++j) w = w << 8 | (pos / 8 + j < bytes.size() ? bytes[pos / 8 + j] : 0u);
    const uint32_t window = (w >> (24 - tz::kPrefixMaxBits - (uint32_t)(pos & 7))) & ((1u << tz::kPrefixMaxBits) - 1);
    const uint64_t e = multi[window];
    const uint32_t k = (uint32_t)(e >> 56);
    EXPECT_GE(k, 1u);
    for (uint32_t i = 0; i < k && out.size() < n; ++i) out.push_back((uint8_t)(e >> (8 * i)));
    pos += (e >> 48) & 0xFF;
  }
  return out;
}

}  // namespace

TEST(PrefixCode, LengthsAreHuffmansWhereTheLimitDoesNotBind) {
  // Real exponent histograms: their rarest exponents make Huffman codes
  // deeper than 16 bits, so the repair changes a few codes even there, for
  // at most 0.01 % of the bits.
  for (bool f32 : {false, true}) {
    const std::vector<uint8_t> e = real_exponents(f32);
    const Counts c = histogram(e.data(), e.size());
    const uint64_t bits = coded_bits(c, lengths_of(c, 16)), optimal = reference_huffman_bits(c);
    EXPECT_GE(bits, optimal);
    EXPECT_LE((double)bits, 1.0001 * (double)optimal);
  }
  // Hand-made ones the limit does not bind: Huffman's lengths exactly.
  std::vector<Counts> cases;
  cases.push_back(Counts{});
  cases.back()[7] = 10, cases.back()[9] = 10;  // two equal symbols: one bit each
  cases.push_back(Counts{});
  for (int s = 0; s < 256; ++s) cases.back()[s] = 1;  // uniform: 8 bits each
  cases.push_back(Counts{});
  for (int s = 0; s < 40; ++s) cases.back()[100 + s] = 1000 - 20 * s;
  for (const Counts& c : cases) {
    const Lens len = lengths_of(c, 16);
    EXPECT_EQ(coded_bits(c, len), reference_huffman_bits(c));
  }
  Counts two{};
  two[7] = 10, two[9] = 10;
  const Lens l2 = lengths_of(two);
  EXPECT_EQ(l2[7], 1);
  EXPECT_EQ(l2[9], 1);
}

TEST(PrefixCode, TheLimitHoldsAndTheCodeStaysComplete) {
  // Fibonacci counts make the deepest Huffman code: 30 symbols, depth 29.
  Counts fib{};
  uint64_t a = 1, b = 1;
  for (int s = 0; s < 30; ++s) {
    fib[s] = a;
    const uint64_t t = a + b;
    a = b, b = t;
  }
  const Lens deep = lengths_of(fib, 16);
  EXPECT_EQ(*std::max_element(deep.begin(), deep.end()), 16);
  std::vector<Counts> cases = {fib};
  for (bool f32 : {false, true}) {
    const std::vector<uint8_t> e = real_exponents(f32);
    cases.push_back(histogram(e.data(), e.size()));
  }
  for (const Counts& c : cases) {
    for (uint32_t limit : {8u, 9u, 11u}) {
      const Lens len = lengths_of(c, limit);
      EXPECT_TRUE(tz::prefix_lengths_valid(len.data(), std::min(limit, tz::kPrefixMaxBits))) << limit;
      for (int s = 0; s < 256; ++s) EXPECT_EQ(len[s] != 0, c[s] != 0);
      // Limiting costs bits, never saves them; on real exponents at the
      // format's limit it costs under 0.5 %.
      const uint64_t limited = coded_bits(c, len), optimal = reference_huffman_bits(c);
      EXPECT_GE(limited, optimal);
      if (&c != &cases[0] && limit == tz::kPrefixMaxBits) {
        EXPECT_LE((double)limited, 1.005 * (double)optimal) << limit;
      }
    }
  }
  // A function of the counts alone.
  EXPECT_EQ(lengths_of(fib), lengths_of(fib));
}

TEST(PrefixCode, OneSymbol) {
  Counts c{};
  c[42] = 1000;
  const Lens len = lengths_of(c);
  EXPECT_EQ(len[42], 1);
  EXPECT_TRUE(tz::prefix_lengths_valid(len.data(), tz::kPrefixMaxBits));
  std::array<uint16_t, 256> code{};
  tz::prefix_canonical_codes(len.data(), code.data());
  std::vector<uint16_t> single(1u << tz::kPrefixMaxBits);
  tz::prefix_build_single(len.data(), code.data(), tz::kPrefixMaxBits, single.data());
  const std::vector<uint8_t> sym(1000, 42);
  std::vector<uint8_t> bytes(200);
  uint64_t end = 0;
  const size_t size = tz::prefix_encode(sym.data(), 1000, len.data(), code.data(), 1, &end, bytes.data(), bytes.size());
  EXPECT_EQ(size, 125u);
  EXPECT_EQ(end, 1000u);
  std::vector<uint8_t> out(1000);
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 0, end, 1000, single.data(), tz::kPrefixMaxBits, out.data()), 0);
  EXPECT_EQ(out, sym);
}

TEST(PrefixCode, DescriptionRoundTripAndRefusals) {
  const std::vector<uint8_t> e = real_exponents(false);
  const Counts c = histogram(e.data(), e.size());
  const Lens len = lengths_of(c);
  std::vector<uint8_t> d(tz::prefix_desc_size(len.data()));
  ASSERT_GT(d.size(), 2u);
  EXPECT_EQ(tz::prefix_desc_write(len.data(), d.data()), d.size());
  Lens back{};
  EXPECT_EQ(tz::prefix_desc_read(d.data(), d.size(), tz::kPrefixMaxBits, back.data()), d.size());
  EXPECT_EQ(back, len);
  EXPECT_EQ(tz::prefix_desc_read(d.data(), d.size() - 1, tz::kPrefixMaxBits, back.data()), 0u);  // truncated
  std::vector<uint8_t> bad = d;
  std::swap(bad[0], bad[1]);  // hi < lo
  EXPECT_EQ(tz::prefix_desc_read(bad.data(), bad.size(), tz::kPrefixMaxBits, back.data()), 0u);
  // Every single-nibble change of the lengths makes the Kraft sum differ
  // from 1 or a length exceed the limit: each is refused.
  for (size_t i = 2; i < d.size(); ++i)
    for (int shift : {0, 4}) {
      bad = d;
      bad[i] = (uint8_t)(bad[i] ^ (1u << shift));
      EXPECT_EQ(tz::prefix_desc_read(bad.data(), bad.size(), tz::kPrefixMaxBits, back.data()), 0u) << i;
    }
  // Hand-made: {2, 2, 2} is incomplete (3/4), {1, 1, 1} over-full, a
  // length of 12 too long; {1, 2, 2} is fine.
  const uint8_t incomplete[] = {5, 7, 0x22, 0x02}, overfull[] = {5, 7, 0x11, 0x01}, ok[] = {5, 7, 0x21, 0x02};
  const uint8_t too_long[] = {0, 1, 0xC1};  // lengths 1, 12
  EXPECT_EQ(tz::prefix_desc_read(incomplete, 4, tz::kPrefixMaxBits, back.data()), 0u);
  EXPECT_EQ(tz::prefix_desc_read(overfull, 4, tz::kPrefixMaxBits, back.data()), 0u);
  EXPECT_EQ(tz::prefix_desc_read(too_long, 3, tz::kPrefixMaxBits, back.data()), 0u);
  EXPECT_EQ(tz::prefix_desc_read(ok, 4, tz::kPrefixMaxBits, back.data()), 4u);
  const uint8_t odd_nibble[] = {5, 7, 0x21, 0x12};  // the nibble after symbol 7 set
  EXPECT_EQ(tz::prefix_desc_read(odd_nibble, 4, tz::kPrefixMaxBits, back.data()), 0u);
}

TEST(PrefixCode, RealExponentsRoundTripInSegments) {
  for (bool f32 : {false, true}) {
    const std::vector<uint8_t> e = real_exponents(f32);
    const uint32_t n = (uint32_t)std::min<size_t>(e.size(), 65536);
    const Counts c = histogram(e.data(), n);
    const Lens len = lengths_of(c);
    std::array<uint16_t, 256> code{};
    tz::prefix_canonical_codes(len.data(), code.data());
    std::vector<uint16_t> single(1u << tz::kPrefixMaxBits);
    std::vector<uint64_t> multi(1u << tz::kPrefixMaxBits);
    tz::prefix_build_single(len.data(), code.data(), tz::kPrefixMaxBits, single.data());
    tz::prefix_build_multi(single.data(), tz::kPrefixMaxBits, multi.data());
    constexpr uint32_t kSeg = 32;
    std::vector<uint64_t> ends(kSeg);
    std::vector<uint8_t> bytes(2 * (size_t)n);
    const size_t size = tz::prefix_encode(e.data(), n, len.data(), code.data(), kSeg, ends.data(), bytes.data(),
                                          bytes.size());
    ASSERT_GT(size, 0u);
    EXPECT_EQ(size, (ends.back() + 7) / 8);
    EXPECT_EQ(ends.back(), coded_bits(c, len));
    // Each segment alone, from its bit offset, exactly.
    const uint32_t per = (n + kSeg - 1) / kSeg;
    std::vector<uint8_t> out(n);
    for (uint32_t k = 0; k < kSeg; ++k) {
      const uint32_t a = std::min(n, k * per), b = std::min(n, a + per);
      EXPECT_EQ(tz::prefix_decode(bytes.data(), size, k ? ends[k - 1] : 0, ends[k], b - a, single.data(),
                                  tz::kPrefixMaxBits, out.data() + a), 0) << k;
    }
    EXPECT_TRUE(std::equal(out.begin(), out.end(), e.begin()));
    // The whole stream through the multi-symbol table.
    bytes.resize(size);
    const std::vector<uint8_t> m = decode_with_multi(bytes, ends.back(), n, multi.data());
    EXPECT_TRUE(m.size() == n && std::equal(m.begin(), m.end(), e.begin()));
    // Too few output bytes allowed: nothing is written past cap.
    EXPECT_EQ(tz::prefix_encode(e.data(), n, len.data(), code.data(), kSeg, ends.data(), bytes.data(), size - 1), 0u);
  }
}

TEST(PrefixCode, DecoderRefusesRunsThatDoNotEndExactly) {
  const std::vector<uint8_t> e = real_exponents(false);
  const uint32_t n = 4096;
  const Counts c = histogram(e.data(), n);
  const Lens len = lengths_of(c);
  std::array<uint16_t, 256> code{};
  tz::prefix_canonical_codes(len.data(), code.data());
  std::vector<uint16_t> single(1u << tz::kPrefixMaxBits);
  tz::prefix_build_single(len.data(), code.data(), tz::kPrefixMaxBits, single.data());
  std::vector<uint8_t> bytes(2 * n), out(n + 1);
  uint64_t end = 0;
  const size_t size = tz::prefix_encode(e.data(), n, len.data(), code.data(), 1, &end, bytes.data(), bytes.size());
  ASSERT_GT(size, 0u);
  const uint32_t L = tz::kPrefixMaxBits;
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 0, end, n, single.data(), L, out.data()), 0);
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 0, end, n - 1, single.data(), L, out.data()), 1);  // bits left
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 0, end - 1, n, single.data(), L, out.data()), 1);  // crosses the end
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 0, 8 * size + 1, n, single.data(), L, out.data()), 1);
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size, 9, 8, 0, single.data(), L, out.data()), 1);
  // A run cut short of its bytes never reads past them: the decoder is
  // given fewer bytes than the bits need.
  EXPECT_EQ(tz::prefix_decode(bytes.data(), size / 2, 0, end, n, single.data(), L, out.data()), 1);
}
