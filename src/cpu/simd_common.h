// Pieces shared by the SIMD kernel files (no intrinsics here: what is inlined
// into a function with a target attribute must not need one itself).
#pragma once
#include <cstddef>
#include <cstdint>

namespace tz::cpu {

// Views of caller buffers for element loads and stores: the C API accepts
// any address, so these must not assume 2- or 4-byte alignment.
typedef uint16_t u16_unaligned __attribute__((aligned(1), may_alias));
typedef uint32_t u32_unaligned __attribute__((aligned(1), may_alias));

// Elements per chunk when a histogram extracts stream bytes with SIMD first.
inline constexpr uint32_t kHistChunk = 1024;

// Byte counts in four sub-histograms (runs of equal symbols, common in
// exponents, would otherwise serialise on one counter). Holds up to 2^32 - 1
// counts per symbol: flush before that (callers flush per call; blocks are
// at most 2^20 elements).
struct HistogramCounter {
  uint32_t h[4][256] = {};
  inline void add(const uint8_t* b, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
      ++h[0][b[i]];
      ++h[1][b[i + 1]];
      ++h[2][b[i + 2]];
      ++h[3][b[i + 3]];
    }
    for (; i < n; ++i) ++h[0][b[i]];
  }
  inline void flush(uint64_t* hist) const {
    for (int s = 0; s < 256; ++s) hist[s] += (uint64_t)h[0][s] + h[1][s] + h[2][s] + h[3][s];
  }
};

}  // namespace tz::cpu
