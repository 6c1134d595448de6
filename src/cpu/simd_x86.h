// AVX-512 kernels for the CPU backend. Each produces exactly the bytes (or
// the status) of its portable counterpart in src/codec; tests compare them.
// Callers must check simd_available() first.
#pragma once
#include <cstddef>
#include <cstdint>

#include "codec/rans.h"

namespace tz::cpu {

bool simd_available();

// As tz::rans_decode_ctx (ctx.n == 1: tz::rans_decode).
int rans_decode_simd(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, uint8_t* out,
                     const RansCtx& ctx = RansCtx{});

// BF16 with the exponent stream rANS coded and the sign|mantissa stream raw:
// decodes the exponents and merges them with `mant` into n LE16 values.
int rans_decode_bf16_simd(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const uint8_t* mant,
                          uint8_t* out, const RansCtx& ctx = RansCtx{});

// Two independent streams decoded in lockstep (more instruction-level
// parallelism); each gets its own status, as from tz::rans_decode.
struct RansStream {
  const uint8_t* in;
  size_t size;
  uint32_t n;
  const uint32_t* dec;
  uint8_t* out;
  RansCtx ctx{};  // lane contexts of the stream (n = 1: none)
};
void rans_decode2_simd(const RansStream& a, int* st_a, const RansStream& b, int* st_b);
// The BF16 fused form of two blocks at once (see rans_decode_bf16_simd).
void rans_decode2_bf16_simd(const RansStream& a, const uint8_t* mant_a, int* st_a, const RansStream& b,
                            const uint8_t* mant_b, int* st_b);

// Encoder table for the SIMD encoder (same coding as tz::RansEncSym).
struct SimdEncTable {
  uint32_t freq_start[256];  // freq | start << 13 (freq <= 4096, start < 4096)
};
void build_simd_enc(const uint32_t* freq, SimdEncTable* t);

// As tz::rans_encode.
size_t rans_encode_simd(const uint8_t* sym, uint32_t n, const SimdEncTable& t, uint16_t* words, uint8_t* out,
                        size_t limit);

// As tz::rans_encode_ctx (lane contexts, ctx.n >= 2): t holds ctx.n tables.
size_t rans_encode_ctx_simd(const uint8_t* sym, uint32_t n, const SimdEncTable* t, const RansCtx& ctx, uint16_t* words,
                            uint8_t* out, size_t limit);

// Smallest and largest byte of field stream k over n elements.
void stream_minmax_simd(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint8_t* lo, uint8_t* hi);

// As tz::split_fields / tz::merge_fields, vectorised.
void split_fields_simd(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams);
void merge_fields_simd(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst);

}  // namespace tz::cpu
