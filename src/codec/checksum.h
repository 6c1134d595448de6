// Block checksum: CRC32C over the CRC32C values of the block's decoded bytes
// cut into 4096-byte segments (the last one shorter), each stored as LE32.
// Segmenting lets a GPU warp hash a block with one lane per segment and the
// CPU interleave three hardware CRC streams; it detects the same errors a
// plain CRC of the block would in practice (any error confined to one
// segment changes that segment's CRC, and CRC32C of the list then changes).
#pragma once
#include "common/crc32c.h"
#include "codec/format.h"

namespace tz {

// The value stored in block b is the checksum of its bytes XOR this salt, so
// a block moved to another position (same size, valid on its own) fails
// verification. Multiplication by an odd constant is a bijection mod 2^32:
// different positions always get different salts; block 0 gets 0.
TZ_HD uint32_t block_checksum_salt(uint32_t b) { return b * 0x9E3779B1u; }

TZ_HD uint32_t block_checksum_ref(const uint8_t* p, size_t n, const uint32_t* table) {
  uint32_t acc = ~0u;
  for (size_t off = 0; off < n; off += kChecksumSegment) {
    const size_t len = (n - off) < kChecksumSegment ? (n - off) : kChecksumSegment;
    uint8_t le[4];
    store_le32(le, crc32c(p + off, len, table));
    acc = crc32c_update(acc, le, 4, table);
  }
  return ~acc;
}

}  // namespace tz
