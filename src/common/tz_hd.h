// Host/device portability macros and little-endian load/store helpers.
// Everything in src/codec is built from these so the same per-block code
// compiles for the CPU backend and inside CUDA kernels.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define TZ_HD __host__ __device__ __forceinline__
#define TZ_HD_NOINLINE __host__ __device__
#else
#define TZ_HD inline
#define TZ_HD_NOINLINE inline
#endif

namespace tz {

// The format is little-endian. Both supported hosts (x86-64, aarch64) and
// NVIDIA GPUs are little-endian, so a memcpy load is the LE value; the
// static_assert in src/cpu guards the assumption on the host side.
TZ_HD uint16_t load_le16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
TZ_HD uint32_t load_le32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
TZ_HD uint64_t load_le64(const uint8_t* p) { uint64_t v; memcpy(&v, p, 8); return v; }
TZ_HD void store_le16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }
TZ_HD void store_le32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
TZ_HD void store_le64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }

// High 64 bits of a 64x64 product.
TZ_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

TZ_HD size_t align4(size_t n) { return (n + 3u) & ~(size_t)3u; }

// Number of set bits (a warp ballot's lanes, a lane mask's words).
TZ_HD uint32_t popc32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)__popc(v);
#else
  return (uint32_t)__builtin_popcount(v);
#endif
}

}  // namespace tz
