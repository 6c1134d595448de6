// The CPU decoder of prefix-coded streams (prefix_decode.h).
//
// A lane is one run: a 64-bit buffer b whose top c bits are the next bits
// of the run, and p, the byte whose first bit lines up with bit c of b.
// A refill ORs in the 8 bytes at p (re-reading bytes already in b ORs in
// the same bits) and leaves 56..63 valid bits, enough for four lookups of
// at most 11 bits. Each lookup stores 8 bytes (at most 6 of them symbols)
// and moves the output by the number of symbols, so a lane decodes in the
// fast loop only while 4 x 6 + 8 bytes of its output remain and 8 bytes of
// input are readable at p. The rest of a run, and every run that ends the
// wrong way, goes through the exact TZ_HD decoder, which also checks that
// the run ends on its last bit.
#include "cpu/prefix_decode.h"

#include <cstring>

#include "codec/prefix_code.h"
#include "cpu/prefix_step.h"
#include "cpu/simd_path.h"

namespace tz::cpu {
namespace {

constexpr uint32_t L = kPrefixMaxBits;
constexpr size_t kRoom = 4 * kPrefixLookupSyms + 8;  // output bytes one round of four lookups may store

static_assert(4 * L <= 56, "four lookups per refill");

struct Lane {
  const uint8_t* p = nullptr;
  uint64_t b = 0;
  unsigned c = 0;
  uint8_t* o = nullptr;
  uint8_t* e = nullptr;
  uint64_t begin_bit = 0, end_bit = 0;
  bool fast = false;  // started in the fast loop (its first 8 bytes readable)
};

// Lane for run r, positioned at its first bit (fast only if 8 bytes are
// readable there).
__attribute__((always_inline)) inline Lane start_lane(const uint8_t* in, size_t size, const uint64_t* bit,
                                                       const uint32_t* count, uint32_t r, uint8_t* o) {
  Lane l;
  l.o = o;
  l.e = o + count[r];
  l.begin_bit = bit[r];
  l.end_bit = bit[r + 1];
  l.p = in + (bit[r] >> 3);  // bit[r] <= 8 * size: checked by decode_runs
  if ((bit[r] >> 3) + 8 > size) return l;
  TZ_PREFIX_REFILL(l.b, l.c, l.p)
  const unsigned skip = (unsigned)(bit[r] & 7);
  l.b <<= skip;
  l.c -= skip;
  l.fast = true;
  return l;
}

// The rest of a lane: four lookups at a time while they fit, then exactly.
__attribute__((always_inline)) inline int finish_lane(const uint8_t* in, size_t size, Lane& l, const uint64_t* multi,
                                                       const uint16_t* single) {
  const uint8_t* const in_end = in + size;
  uint64_t pos;
  if (l.fast) {
    uint64_t b = l.b;
    unsigned c = l.c;
    const uint8_t* p = l.p;
    uint8_t* o = l.o;
    while (o + kRoom <= l.e && p + 8 <= in_end) {
      TZ_PREFIX_REFILL(b, c, p)
      for (int r = 0; r < 4; ++r) TZ_PREFIX_LOOKUP(multi, L, b, c, o)
    }
    pos = (uint64_t)(p - in) * 8 - c;
    l.o = o;
  } else {
    pos = l.begin_bit;  // not started
  }
  return prefix_decode(in, size, pos, l.end_bit, (uint32_t)(l.e - l.o), single, L, l.o);
}

__attribute__((always_inline)) inline int decode_runs(const uint8_t* in, size_t size, const uint64_t* bit,
                                                       const uint32_t* count, uint32_t n_runs, const PrefixTables& t,
                                                       uint8_t* out) {
  for (uint32_t r = 0; r < n_runs; ++r)
    if (bit[r] > bit[r + 1]) return 1;
  if (bit[n_runs] > 8 * (uint64_t)size) return 1;
  const uint64_t* multi = t.multi;
  const uint8_t* const in_end = in + size;
  int st = 0;
  uint8_t* o = out;
  uint32_t r = 0;
  for (; r + 4 <= n_runs; r += 4) {
    Lane l[4];
    for (uint32_t j = 0; j < 4; ++j) {
      l[j] = start_lane(in, size, bit, count, r + j, o);
      o = l[j].e;
    }
    if (l[0].fast && l[1].fast && l[2].fast && l[3].fast) {
      uint64_t b0 = l[0].b, b1 = l[1].b, b2 = l[2].b, b3 = l[3].b;
      unsigned c0 = l[0].c, c1 = l[1].c, c2 = l[2].c, c3 = l[3].c;
      const uint8_t *p0 = l[0].p, *p1 = l[1].p, *p2 = l[2].p, *p3 = l[3].p;
      uint8_t *o0 = l[0].o, *o1 = l[1].o, *o2 = l[2].o, *o3 = l[3].o;
      uint8_t *const e0 = l[0].e, *const e1 = l[1].e, *const e2 = l[2].e, *const e3 = l[3].e;
      while (o0 + kRoom <= e0 && o1 + kRoom <= e1 && o2 + kRoom <= e2 && o3 + kRoom <= e3 && p0 + 8 <= in_end &&
             p1 + 8 <= in_end && p2 + 8 <= in_end && p3 + 8 <= in_end) {
        TZ_PREFIX_REFILL(b0, c0, p0) TZ_PREFIX_REFILL(b1, c1, p1)
        TZ_PREFIX_REFILL(b2, c2, p2) TZ_PREFIX_REFILL(b3, c3, p3)
        for (int k = 0; k < 4; ++k) {
          TZ_PREFIX_LOOKUP(multi, L, b0, c0, o0) TZ_PREFIX_LOOKUP(multi, L, b1, c1, o1)
          TZ_PREFIX_LOOKUP(multi, L, b2, c2, o2) TZ_PREFIX_LOOKUP(multi, L, b3, c3, o3)
        }
      }
      l[0].b = b0, l[1].b = b1, l[2].b = b2, l[3].b = b3;
      l[0].c = c0, l[1].c = c1, l[2].c = c2, l[3].c = c3;
      l[0].p = p0, l[1].p = p1, l[2].p = p2, l[3].p = p3;
      l[0].o = o0, l[1].o = o1, l[2].o = o2, l[3].o = o3;
    }
    for (Lane& x : l) st |= finish_lane(in, size, x, multi, t.single);
  }
  for (; r < n_runs; ++r) {
    Lane x = start_lane(in, size, bit, count, r, o);
    o = x.e;
    st |= finish_lane(in, size, x, multi, t.single);
  }
  return st;
}

#if defined(__x86_64__)
// BMI2's shifts by any register (shlx, shrx): every AVX2 CPU has them; the
// build's baseline x86-64 would shift by %cl and spill (1.04 -> 0.75 cycles
// per symbol in the study).
__attribute__((target("bmi,bmi2"))) int decode_runs_bmi2(const uint8_t* in, size_t size, const uint64_t* bit,
                                                          const uint32_t* count, uint32_t n_runs,
                                                          const PrefixTables& t, uint8_t* out) {
  return decode_runs(in, size, bit, count, n_runs, t, out);
}
#endif

int decode_runs_base(const uint8_t* in, size_t size, const uint64_t* bit, const uint32_t* count, uint32_t n_runs,
                     const PrefixTables& t, uint8_t* out) {
  return decode_runs(in, size, bit, count, n_runs, t, out);
}

}  // namespace

int prefix_decode_runs(const uint8_t* in, size_t size, const uint64_t* bit, const uint32_t* count, uint32_t n_runs,
                       const PrefixTables& t, uint8_t* out) {
#if defined(__x86_64__)
  static const bool bmi2 = simd_path_cpu_has(SimdPath::kAvx2);
  if (bmi2 && active_simd_path() != SimdPath::kPortable)
    return decode_runs_bmi2(in, size, bit, count, n_runs, t, out);
#endif
  return decode_runs_base(in, size, bit, count, n_runs, t, out);
}

}  // namespace tz::cpu
