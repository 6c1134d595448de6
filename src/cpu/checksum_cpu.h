// Fast block checksum on the CPU: same value as tz::block_checksum_ref
// (src/codec/checksum.h), using the SSE4.2 CRC32 instruction when present.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tz::cpu {

uint32_t crc32c(const uint8_t* p, size_t n);
// Raw CRC32C state update (state starts at ~0; the CRC is ~state).
uint32_t crc32c_update(uint32_t state, const uint8_t* p, size_t n);
uint32_t block_checksum(const uint8_t* p, size_t n);
bool crc32c_hw_available();

}  // namespace tz::cpu
