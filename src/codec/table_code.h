// Compact frequency tables of format version 3 (doc/format.md 5.7): the
// present range [lo, hi], then one Exp-Golomb code per symbol of the range,
// of the frequency itself (mode 0), of its difference to the previous
// symbol's (mode 1, smooth tables) or to a reference table's (mode 2: the
// same context of the previous set, or the previous context; near-identical
// tables cost a few bits per symbol). The encoder takes the cheapest mode and
// order. Header-only TZ_HD code shared by the CPU and CUDA backends.
#pragma once
#include "codec/format.h"

namespace tz {

constexpr uint32_t kTableCodeMaxOrder = 12;   // Exp-Golomb order k
constexpr uint32_t kTableCodeMaxValue = 8192; // largest coded value (zigzag of a difference of two frequencies)
constexpr uint32_t kTableCodeMaxZeros = 16;   // longest zero prefix a decoder reads
enum TableCodeMode : uint8_t { kTableValues = 0, kTableDeltaPrev = 1, kTableDeltaRef = 2 };

TZ_HD uint32_t table_zigzag(int32_t d) { return d >= 0 ? (uint32_t)d * 2u : (uint32_t)(-d) * 2u - 1u; }
TZ_HD int32_t table_unzigzag(uint32_t v) { return (v & 1u) ? -(int32_t)((v + 1u) / 2u) : (int32_t)(v / 2u); }

TZ_HD uint32_t table_floor_log2(uint32_t w) {  // w >= 1
#if defined(__CUDA_ARCH__)
  return 31u - (uint32_t)__clz(w);
#else
  return 31u - (uint32_t)__builtin_clz(w);
#endif
}
// Length in bits of the order-k Exp-Golomb code of v: with w = v + 2^k and
// m = floor(log2 w), m - k zero bits, then w in m + 1 bits, highest first.
TZ_HD uint32_t table_eg_bits(uint32_t v, uint32_t k) {
  const uint32_t m = table_floor_log2(v + (1u << k));
  return 2u * m - k + 1u;
}

// The value coded for symbol s (lo <= s <= hi) in a mode.
TZ_HD uint32_t table_code_value(const uint32_t* f, const uint32_t* ref, uint32_t lo, uint32_t s, uint8_t mode) {
  if (mode == kTableValues) return f[s];
  const int32_t pred = mode == kTableDeltaPrev ? (s > lo ? (int32_t)f[s - 1] : 0) : (int32_t)ref[s];
  return table_zigzag((int32_t)f[s] - pred);
}

// Encoding choice of one table: range, mode, order and size in bits of the
// codes (the 3 header bytes and byte padding not included).
struct TableCodeChoice {
  uint32_t lo, hi, mode, k;
  uint64_t bits;
};

// The encoding of freq (a normalised table, sum kProbScale) chosen by the
// encoder: per mode (mode 2 only when ref, a table of 256, is given) the
// best of four orders around log2 of the mean coded value, then the
// cheapest; ties go to the lower mode, then the lower order. A function of
// the tables alone.
TZ_HD TableCodeChoice table_code_choose(const uint32_t* freq, const uint32_t* ref) {
  TableCodeChoice c{0, 0, 0, 0, ~UINT64_C(0)};
  uint32_t lo = 256, hi = 0;
  for (uint32_t s = 0; s < 256; ++s)
    if (freq[s]) {
      if (lo == 256) lo = s;
      hi = s;
    }
  if (lo == 256) lo = hi = 0;  // empty table: not written by an encoder
  c.lo = lo;
  c.hi = hi;
  const uint8_t n_modes = ref ? 3 : 2;
  const uint32_t count = hi - lo + 1;
  for (uint8_t mode = 0; mode < n_modes; ++mode) {
    // Orders near log2 of the mean value (the best order of an Exp-Golomb
    // code is within one of it); four are tried.
    uint64_t sum = 0;
    for (uint32_t s = lo; s <= hi; ++s) sum += table_code_value(freq, ref, lo, s, mode);
    const uint32_t km = table_floor_log2((uint32_t)(sum / count) + 1u);
    const uint32_t k0 = km >= 2 ? km - 2 : 0;
    const uint32_t k1 = km + 1 < kTableCodeMaxOrder ? km + 1 : kTableCodeMaxOrder;
    uint64_t bits[kTableCodeMaxOrder + 1] = {};
    for (uint32_t s = lo; s <= hi; ++s) {
      const uint32_t v = table_code_value(freq, ref, lo, s, mode);
      for (uint32_t k = k0; k <= k1; ++k) bits[k] += table_eg_bits(v, k);
    }
    for (uint32_t k = k0; k <= k1; ++k)
      if (bits[k] < c.bits) {
        c.bits = bits[k];
        c.mode = mode;
        c.k = k;
      }
  }
  return c;
}

TZ_HD size_t table_code_bytes(const TableCodeChoice& c) { return 3 + (size_t)((c.bits + 7) / 8); }

// Serialised size of freq as a compact table.
TZ_HD size_t compact_table_size(const uint32_t* freq, const uint32_t* ref) {
  return table_code_bytes(table_code_choose(freq, ref));
}

// Writes freq as a compact table; returns the bytes written
// (compact_table_size, at most kCompactTableMaxBytes).
TZ_HD size_t write_compact_table(const uint32_t* freq, const uint32_t* ref, uint8_t* out) {
  const TableCodeChoice c = table_code_choose(freq, ref);
  out[0] = (uint8_t)c.lo;
  out[1] = (uint8_t)c.hi;
  out[2] = (uint8_t)(c.k | (c.mode << 4));
  const size_t n = table_code_bytes(c);
  for (size_t i = 3; i < n; ++i) out[i] = 0;
  uint64_t bit = 0;  // LSB first within each byte
  auto put = [&](uint32_t b) {
    if (b) out[3 + (bit >> 3)] |= (uint8_t)(1u << (bit & 7));
    ++bit;
  };
  for (uint32_t s = c.lo; s <= c.hi; ++s) {
    const uint32_t w = table_code_value(freq, ref, c.lo, s, (uint8_t)c.mode) + (1u << c.k);
    const uint32_t m = table_floor_log2(w);
    for (uint32_t z = c.k; z < m; ++z) put(0);
    for (uint32_t j = m + 1; j-- > 0;) put((w >> j) & 1u);
  }
  return n;
}

// Parses and validates a compact table from the n bytes at in; ref is the
// reference table for mode 2 (null: mode 2 is invalid). Returns the bytes
// consumed, or 0 if malformed: truncated, reserved bits set, order > 12,
// lo > hi, a zero prefix longer than 16 bits, a value > 8192, a frequency
// outside [0, 4096], freq[lo] or freq[hi] zero, a sum other than 4096, or
// non-zero padding bits.
TZ_HD size_t read_compact_table(const uint8_t* in, size_t n, const uint32_t* ref, uint32_t* freq) {
  if (n < 3) return 0;
  const uint32_t lo = in[0], hi = in[1], k = in[2] & 15u, mode = (in[2] >> 4) & 3u;
  if ((in[2] & 0xC0u) || k > kTableCodeMaxOrder || lo > hi || mode > kTableDeltaRef) return 0;
  if (mode == kTableDeltaRef && !ref) return 0;
  const uint64_t n_bits = ((uint64_t)n - 3) * 8;
  uint64_t bit = 0;
  auto get = [&](uint32_t* b) {
    if (bit >= n_bits) return false;
    *b = (in[3 + (bit >> 3)] >> (bit & 7)) & 1u;
    ++bit;
    return true;
  };
  for (uint32_t s = 0; s < 256; ++s) freq[s] = 0;
  uint32_t sum = 0;
  for (uint32_t s = lo; s <= hi; ++s) {
    uint32_t z = 0, b = 0;
    for (;;) {
      if (!get(&b)) return 0;
      if (b) break;
      if (++z > kTableCodeMaxZeros) return 0;
    }
    uint32_t w = 1;
    for (uint32_t j = 0; j < z + k; ++j) {
      if (!get(&b)) return 0;
      w = (w << 1) | b;
    }
    const uint32_t v = w - (1u << k);
    if (v > kTableCodeMaxValue) return 0;
    int32_t f;
    if (mode == kTableValues) f = (int32_t)v;
    else f = (mode == kTableDeltaPrev ? (s > lo ? (int32_t)freq[s - 1] : 0) : (int32_t)ref[s]) + table_unzigzag(v);
    if (f < 0 || f > (int32_t)kProbScale) return 0;
    freq[s] = (uint32_t)f;
    sum += (uint32_t)f;
  }
  if (freq[lo] == 0 || freq[hi] == 0 || sum != kProbScale) return 0;
  const size_t used = 3 + (size_t)((bit + 7) / 8);
  for (; bit < (used - 3) * 8; ++bit)
    if ((in[3 + (bit >> 3)] >> (bit & 7)) & 1u) return 0;
  return used;
}

}  // namespace tz
