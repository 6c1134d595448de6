// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table driven.
// The table is passed in so device code can keep it in shared memory; the
// CPU backend uses the SSE4.2 instruction instead (src/cpu/checksum.cpp),
// and tests check both against each other and the standard check value.
#pragma once
#include "common/tz_hd.h"

namespace tz {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;

// Fills table[256].
TZ_HD void crc32c_make_table(uint32_t* table) {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
    table[i] = c;
  }
}

// Raw update: caller supplies the running (already inverted) state.
TZ_HD uint32_t crc32c_update(uint32_t state, const uint8_t* p, size_t n, const uint32_t* table) {
  for (size_t i = 0; i < n; ++i) state = table[(state ^ p[i]) & 0xFFu] ^ (state >> 8);
  return state;
}

TZ_HD uint32_t crc32c(const uint8_t* p, size_t n, const uint32_t* table) {
  return ~crc32c_update(~0u, p, n, table);
}

}  // namespace tz
