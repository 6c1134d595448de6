// Integer-only cost model used to decide, per tensor, whether a stream is
// entropy coded. Integer so that CPU and GPU encoders decide identically.
#pragma once
#include "codec/format.h"

namespace tz {

// log2(v) in 16.16 fixed point for v >= 1 (truncated), by repeated squaring.
TZ_HD uint32_t log2_fix16(uint32_t v) {
  uint32_t ip = 0;
  while ((v >> ip) > 1u) ++ip;
  uint64_t m = ((uint64_t)v << 31) >> ip;  // 1.31 fixed point in [1, 2)
  uint32_t frac = 0;
  for (int i = 15; i >= 0; --i) {
    m = (m * m) >> 31;
    if (m >= (UINT64_C(1) << 32)) {
      m >>= 1;
      frac |= 1u << i;
    }
  }
  return (ip << 16) | frac;
}

// The cost in bits (16.16 fixed point) of one symbol of frequency f
// (0..kProbScale): kProbBits - log2(f), log2(0) taken as 0.
TZ_HD uint32_t symbol_cost_fix16_of(uint32_t f) { return (kProbBits << 16) - (f ? log2_fix16(f) : 0u); }

#if !defined(__CUDA_ARCH__)
// The host keeps every value of symbol_cost_fix16_of in a table (16 KiB):
// the 16 squarings per symbol were most of the encoder's set-up on small
// tensors. The device computes them (no per-thread table).
struct SymbolCostTable {
  uint32_t v[kProbScale + 1];
  SymbolCostTable() {
    for (uint32_t f = 0; f <= kProbScale; ++f) v[f] = symbol_cost_fix16_of(f);
  }
};
inline const SymbolCostTable& symbol_cost_table() {
  static const SymbolCostTable t;
  return t;
}
#endif

TZ_HD uint32_t symbol_cost_fix16(uint32_t f) {
#if defined(__CUDA_ARCH__)
  return symbol_cost_fix16_of(f);
#else
  return symbol_cost_table().v[f];
#endif
}

// Estimated rANS payload bits (16.16 fixed point) of a histogram coded with
// freq, as a 128-bit value split into hi:lo to stay portable.
TZ_HD void coded_bits_fix16(const uint64_t* counts, const uint32_t* freq, uint64_t* hi, uint64_t* lo) {
  unsigned __int128 acc = 0;
  for (int s = 0; s < 256; ++s) {
    if (!counts[s]) continue;
    acc += (unsigned __int128)counts[s] * symbol_cost_fix16(freq[s]);
  }
  *hi = (uint64_t)(acc >> 64);
  *lo = (uint64_t)acc;
}

// Estimated total bytes of a stream of `total` symbols in n_blocks blocks if
// rANS coded with a table of table_bytes.
TZ_HD uint64_t coded_stream_bytes(const uint64_t* counts, const uint32_t* freq, uint64_t n_blocks,
                                  uint64_t table_bytes) {
  uint64_t hi, lo;
  coded_bits_fix16(counts, freq, &hi, &lo);
  const unsigned __int128 bits = ((unsigned __int128)hi << 64) | lo;
  const uint64_t bytes = (uint64_t)((bits >> 16) / 8) + 1;
  return bytes + n_blocks * (kRansStateBytes + 2) + table_bytes + 1;
}

// Level policy: level 1 codes a stream when it saves at least 1% of its raw
// size (decode time is spent per coded stream); levels >= 2 whenever smaller.
TZ_HD bool stream_pays(int level, uint64_t coded, uint64_t raw) {
  if (level <= 1) return coded * 100 < raw * 99;
  return coded < raw;
}

}  // namespace tz
