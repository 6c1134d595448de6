// Carry-less-multiply folding CRC32C on x86-64 (PCLMULQDQ on 128-bit lanes,
// VPCLMULQDQ on 512-bit registers): the same raw state updates as
// crc32c_update / crc32c_update_streams of cpu/checksum_cpu.h, for buffers of
// at least kFoldMinBytes. Used by checksum_cpu.cpp only, after cpuid said the
// instructions are there.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tz::cpu::fold {

constexpr size_t kFoldMinBytes = 64;  // one 64-byte group: the folding's unit

// The constants: kConst[i] = {for the low 64-bit half, for the high half} of a
// 16-byte block moved forward by kConstBytes[i] bytes (derivation and the
// script that prints them: scripts/crc32c_fold_constants.py).
constexpr int kNumConst = 5;
constexpr size_t kConstBytes[kNumConst] = {256, 64, 48, 32, 16};
extern const uint64_t kConst[kNumConst][2];

#if defined(__x86_64__)
bool clmul_available();     // PCLMULQDQ and SSE4.2
bool clmul512_available();  // AVX-512F/VL/BW and VPCLMULQDQ (and the OS saves zmm)

// n >= kFoldMinBytes; four 128-bit accumulators a stream.
uint32_t clmul_update(uint32_t state, const uint8_t* p, size_t n);
// n >= kFoldMinBytes; one 512-bit accumulator (four 128-bit lanes), four
// of them 256 bytes apart from 512 bytes on. (Several streams are folded
// one after the other: measured faster than one accumulator a stream in
// lockstep, bench/experiments/notebook.md "CRC32C folding".)
uint32_t clmul512_update(uint32_t state, const uint8_t* p, size_t n);
#endif

}  // namespace tz::cpu::fold
