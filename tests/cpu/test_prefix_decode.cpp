// The CPU run decoder of prefix-coded streams (src/cpu/prefix_decode.h)
// against the exact TZ_HD decoder (codec/prefix_code.h): real exponent
// streams cut into runs every way the decoder groups them, on the SIMD
// path the CPU picks and on portable (the build's baseline instructions),
// and the same verdict and bytes as the exact decoder on damaged streams.
#include <algorithm>
#include <array>
#include <vector>

#include "codec/fields.h"
#include "codec/prefix_code.h"
#include "cpu/prefix_decode.h"
#include "cpu/simd_path.h"
#include "tz_test_data.h"
#include "tz_test_util.h"

using namespace tzt;

namespace {

constexpr uint32_t kSegments = 32;

struct Coded {
  std::vector<uint8_t> sym;        // the symbols
  std::vector<uint8_t> bytes;      // the stream
  std::vector<uint64_t> seg_end;   // bit offset of each segment's end
  std::vector<uint16_t> single = std::vector<uint16_t>(1u << tz::kPrefixMaxBits);
  std::vector<uint64_t> multi = std::vector<uint64_t>(1u << tz::kPrefixMaxBits);
};

// Stream 0 (exponents) of n elements of a fixture slice, coded in 32
// segments end to end.
Coded code_exponents(bool f32, size_t n) {
  const Bytes raw = concat(f32 ? fp32_slice() : bf16_slice());
  Coded c;
  const size_t esz = f32 ? 4 : 2;
  for (size_t i = 0; i + esz <= raw.size() && c.sym.size() < n; i += esz) {
    uint8_t x[4];
    if (f32) tz::split_elem_f32(tz::load_le32(raw.data() + i), x[0], x[1], x[2], x[3]);
    else tz::split_elem_bf16(tz::load_le16(raw.data() + i), x[0], x[1]);
    c.sym.push_back(x[0]);
  }
  std::array<uint64_t, 256> counts{};
  for (uint8_t s : c.sym) ++counts[s];
  std::array<uint8_t, 256> len{};
  std::array<uint16_t, 256> code{};
  tz::prefix_code_lengths(counts.data(), tz::kPrefixMaxBits, len.data());
  tz::prefix_canonical_codes(len.data(), code.data());
  tz::prefix_build_single(len.data(), code.data(), tz::kPrefixMaxBits, c.single.data());
  tz::prefix_build_multi(c.single.data(), tz::kPrefixMaxBits, c.multi.data());
  c.seg_end.resize(kSegments);
  c.bytes.resize(2 * c.sym.size() + 16);
  c.bytes.resize(tz::prefix_encode(c.sym.data(), (uint32_t)c.sym.size(), len.data(), code.data(), kSegments,
                                   c.seg_end.data(), c.bytes.data(), c.bytes.size()));
  return c;
}

// The segments grouped into runs of `per` segments: bit offsets and counts.
struct Runs {
  std::vector<uint64_t> bit;
  std::vector<uint32_t> count;
};
Runs runs_of(const Coded& c, uint32_t per) {
  const uint32_t n = (uint32_t)c.sym.size(), seg = (n + kSegments - 1) / kSegments;
  Runs r;
  r.bit.push_back(0);
  for (uint32_t k = 0; k < kSegments; k += per) {
    const uint32_t last = std::min(kSegments, k + per) - 1;
    const uint32_t a = std::min(n, k * seg), b = std::min(n, (last + 1) * seg);
    r.bit.push_back(c.seg_end[last]);
    r.count.push_back(b - a);
  }
  return r;
}

// The exact decoder run by run: status and bytes.
int exact(const std::vector<uint8_t>& bytes, const Runs& r, const Coded& c, std::vector<uint8_t>& out) {
  int st = 0;
  size_t o = 0;
  for (size_t i = 0; i < r.count.size(); ++i) {
    st |= tz::prefix_decode(bytes.data(), bytes.size(), r.bit[i], r.bit[i + 1], r.count[i], c.single.data(),
                            tz::kPrefixMaxBits, out.data() + o);
    o += r.count[i];
  }
  return st;
}

int fast(const std::vector<uint8_t>& bytes, const Runs& r, const Coded& c, std::vector<uint8_t>& out) {
  return tz::cpu::prefix_decode_runs(bytes.data(), bytes.size(), r.bit.data(), r.count.data(),
                                     (uint32_t)r.count.size(), tz::cpu::PrefixTables{c.single.data(), c.multi.data()},
                                     out.data());
}

// Runs the body on the path the CPU picks and on portable.
template <class F>
void on_both_paths(F body) {
  const tz::cpu::SimdPath before = tz::cpu::active_simd_path();
  body();
  ASSERT_TRUE(tz::cpu::set_active_simd_path(tz::cpu::SimdPath::kPortable));
  body();
  tz::cpu::set_active_simd_path(before);
}

}  // namespace

TEST(PrefixDecodeRuns, RealExponentsInEveryGrouping) {
  for (bool f32 : {false, true}) {
    const Coded c = code_exponents(f32, 65536);
    ASSERT_FALSE(c.bytes.empty());
    on_both_paths([&] {
      for (uint32_t per : {1u, 2u, 5u, 8u, 32u}) {  // 32, 16, 7 (a partial group), 4 runs, 1 run
        const Runs r = runs_of(c, per);
        std::vector<uint8_t> out(c.sym.size(), 0xA5);
        EXPECT_EQ(fast(c.bytes, r, c, out), 0) << f32 << " " << per;
        EXPECT_EQ(out, c.sym) << f32 << " " << per;
      }
    });
  }
}

TEST(PrefixDecodeRuns, ShortStreamsAndEmptyRuns) {
  const Coded c = code_exponents(false, 300);  // every run near the end of the input
  Runs r = runs_of(c, 1);
  std::vector<uint8_t> out(c.sym.size());
  EXPECT_EQ(fast(c.bytes, r, c, out), 0);
  EXPECT_EQ(out, c.sym);
  Runs none{{0}, {}};
  EXPECT_EQ(fast(c.bytes, none, c, out), 0);
}

TEST(PrefixDecodeRuns, BadRunBoundsRefused) {
  const Coded c = code_exponents(false, 65536);
  std::vector<uint8_t> out(c.sym.size());
  Runs r = runs_of(c, 8);
  std::swap(r.bit[1], r.bit[2]);  // decreasing
  EXPECT_EQ(fast(c.bytes, r, c, out), 1);
  r = runs_of(c, 8);
  r.bit.back() = 8 * c.bytes.size() + 1;  // past the input
  EXPECT_EQ(fast(c.bytes, r, c, out), 1);
  r = runs_of(c, 8);
  r.bit[2] += 1;  // a run one bit short, the next one bit long
  EXPECT_EQ(fast(c.bytes, r, c, out), 1);
  r = runs_of(c, 8);
  r.count[3] -= 1;  // bits left over in a run
  out.resize(c.sym.size() - 1);
  EXPECT_EQ(fast(c.bytes, r, c, out), 1);
  // The input cut short: refused without reading past it.
  r = runs_of(c, 8);
  out.resize(c.sym.size());
  std::vector<uint8_t> cut(c.bytes.begin(), c.bytes.begin() + (long)c.bytes.size() / 2);
  EXPECT_EQ(fast(cut, r, c, out), 1);
}

TEST(PrefixDecodeRuns, DamagedStreamsGetTheExactDecodersVerdict) {
  const Coded c = code_exponents(true, 65536);
  on_both_paths([&] {
    const Runs r = runs_of(c, 8);
    int refused = 0, accepted_wrong = 0;
    for (uint32_t k = 0; k < 64; ++k) {
      std::vector<uint8_t> bad = c.bytes;
      const size_t bit = ((size_t)k * 2654435761u) % (8 * bad.size());
      bad[bit / 8] ^= (uint8_t)(0x80 >> (bit % 8));
      std::vector<uint8_t> want(c.sym.size()), got(c.sym.size());
      const int st_exact = exact(bad, r, c, want), st_fast = fast(bad, r, c, got);
      EXPECT_EQ(st_fast, st_exact) << k;
      if (st_exact == 0) {
        EXPECT_EQ(got, want) << k;
      }
      refused += st_fast;
      accepted_wrong += st_fast == 0 && got != c.sym;
    }
    // Both outcomes occur: a flip that moves a run's end is refused; one the
    // code resynchronises from within the run decodes to other symbols (the
    // block checksum's job, not the decoder's).
    EXPECT_GT(refused, 0);
    EXPECT_GT(accepted_wrong, 0);
  });
}
