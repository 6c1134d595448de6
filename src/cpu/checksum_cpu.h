// Fast block checksum on the CPU: same value as tz::block_checksum_ref
// (src/codec/checksum.h), using the CRC32C instruction when the CPU has one
// (x86-64 SSE4.2, ARMv8 CRC; chosen at run time), else the table of
// src/common/crc32c.h, which is also the reference the tests compare with.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tz::cpu {

uint32_t crc32c(const uint8_t* p, size_t n);
// Raw CRC32C state update (state starts at ~0; the CRC is ~state).
uint32_t crc32c_update(uint32_t state, const uint8_t* p, size_t n);
uint32_t block_checksum(const uint8_t* p, size_t n);
bool crc32c_hw_available();
// "sse4.2", "armv8-crc" or "table": what crc32c* above run on this CPU.
const char* crc32c_path();

// Raw state updates of k (1..kCrc32cMaxStreams) independent streams at once:
// state[i] = crc32c_update(state[i], p[i], n[i]) for every i, the streams
// interleaved so that the CRC instruction's latency is hidden (a block's or a
// page's segment CRCs in one pass; lengths may differ).
constexpr int kCrc32cMaxStreams = 6;  // six chains and their pointers fit the registers
void crc32c_update_streams(uint32_t* state, const uint8_t* const* p, const size_t* n, int k);

}  // namespace tz::cpu
