// Fast block checksum on the CPU: same value as tz::block_checksum_ref
// (src/codec/checksum.h), using the CRC32C instruction when the CPU has one
// (x86-64 SSE4.2, ARMv8 CRC; chosen at run time), on x86-64 carry-less-multiply
// folding for buffers long enough (cpu/checksum_fold.h), else the table of
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
// "vpclmulqdq", "pclmul", "sse4.2", "armv8-crc" or "table": what crc32c*
// above run on this CPU (the best one here, or the one the environment
// variable TZ_CRC32C names if this CPU has it: table, crc, pclmul, vpclmulqdq).
const char* crc32c_path();

// The ways to compute it. kCrc: the CRC instruction (SSE4.2 or ARMv8);
// kClmul: PCLMULQDQ folding of 128-bit lanes (x86-64), kClmul512: VPCLMULQDQ
// folding of 512-bit registers (AVX-512). They fold buffers of at least
// these sizes and use the CRC instruction below (where folding starts to
// pay on an AMD EPYC Zen 4: bench/experiments/notebook.md "CRC32C folding"); the 128-bit
// path folds single buffers only, streams go through the CRC chains (faster).
enum class Crc32cPath : int { kTable = 0, kCrc = 1, kClmul = 2, kClmul512 = 3 };
bool crc32c_path_supported(Crc32cPath path);
const char* crc32c_path_name(Crc32cPath path);
Crc32cPath crc32c_active_path();
constexpr size_t kCrc32cFoldMinBytes512 = 128;
constexpr size_t kCrc32cFoldMinBytes128 = 512;
// As crc32c_update / crc32c_update_streams on a given (supported) path.
uint32_t crc32c_update_on(Crc32cPath path, uint32_t state, const uint8_t* p, size_t n);

// Raw state updates of k (1..kCrc32cMaxStreams) independent streams at once:
// state[i] = crc32c_update(state[i], p[i], n[i]) for every i, the streams
// interleaved so that the CRC instruction's latency is hidden (a block's or a
// page's segment CRCs in one pass; lengths may differ).
constexpr int kCrc32cMaxStreams = 6;  // six chains and their pointers fit the registers
void crc32c_update_streams(uint32_t* state, const uint8_t* const* p, const size_t* n, int k);
void crc32c_update_streams_on(Crc32cPath path, uint32_t* state, const uint8_t* const* p, const size_t* n, int k);

// The CRC32C (finalised) of the LE32 list of the finalised CRC32Cs of the
// consecutive `segment`-byte segments of p[0, n) (the last one shorter),
// hashed kCrc32cMaxStreams segments at a time: the frame codec's
// block_checksum and the KV page checksum. With head (16 bytes, n >= 16),
// segment 0 starts with head's bytes in place of p's first 16.
uint32_t crc32c_segment_list(const uint8_t* p, size_t n, size_t segment, const uint8_t* head);

}  // namespace tz::cpu
