// Lane permutation tables of the 8-lane (AVX2) rANS kernels, indexed by the
// 8-bit mask of lanes that renormalise.
#pragma once
#include <cstdint>

namespace tz::kv {

struct X86LaneTables {
  // Decoder: lane j (in the mask) takes word #(mask bits below j) of the 8 loaded.
  uint8_t expand[256][8];
  // Encoder: the masked lanes, ascending, moved to the top lanes 8-cnt .. 7.
  uint8_t compress_hi[256][8];
  X86LaneTables() {
    for (int m = 0; m < 256; ++m) {
      int c = 0, cnt = __builtin_popcount((unsigned)m);
      for (int j = 0; j < 8; ++j) {
        expand[m][j] = (uint8_t)((m >> j) & 1 ? c++ : 0);
        compress_hi[m][j] = 0;
      }
      int k = 8 - cnt;
      for (int j = 0; j < 8; ++j)
        if ((m >> j) & 1) compress_hi[m][k++] = (uint8_t)j;
    }
  }
};

inline const X86LaneTables& x86_tables() {
  static const X86LaneTables t;
  return t;
}

}  // namespace tz::kv
