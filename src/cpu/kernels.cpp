// The portable kernel table (the reference every SIMD table must match, and
// the fallback) and the choice of table by SIMD path.
#include "cpu/kernels.h"

#include "codec/fields.h"
#include "cpu/rans_portable.h"
#include "cpu/simd_common.h"

namespace tz::cpu {

void build_freq_start(const uint32_t* freq, uint32_t* freq_start) {
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    freq_start[s] = freq[s] | ((freq[s] ? start : 0u) << 13);
    start += freq[s];
  }
}

namespace {

size_t encode_portable(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx, uint16_t* words,
                       uint8_t* out, size_t limit) {
  return rans_encode_portable(sym, n, t.sym, ctx, words, out, limit);
}

int decode_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                    uint8_t* out) {
  return rans_decode_portable(in, size, n, dec, ctx, out);
}

// Field loops (split, merge, histogram, min/max): the plain loops the SIMD
// tables also compile (simd_field_loops.inc), here for the baseline
// instruction set. Their split and merge are the per-element expressions of
// tz::split_fields / tz::merge_fields written as loops over typed views,
// which the compiler vectorises (SSE2 on x86-64): tz::merge_fields stores
// bytes one by one (it is also the device code). Measured: see
// bench/experiments/notebook.md "AVX2 decode step, FP8 in place, portable merge".
namespace loops {
#define TZ_LOOP_TARGET
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

// BF16, FP16 and FP32: stream 0 decodes into the top n bytes of out, then
// merges with the raw streams from the front, a chunk at a time through a
// local copy (a chunk of elements i .. i+m-1 writes below es (i + m), at or
// below the unread symbols of the next, from (es - 1) n + i + m).
// Measured faster than merging symbol by symbol in the scalar decoder (5.1
// against 5.7 cycles per element on real BF16 weights, AMD EPYC Zen 4, 64
// distinct blocks, CPU time): the merge loop vectorises.
int decode_merged_portable(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                           const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out) {
  const uint32_t es = dtype_elem_size(dtype);
  const int K = dtype_stream_count(dtype);
  uint8_t* const sym0 = out + (size_t)(es - 1) * n;
  const int st = rans_decode_portable(in, size, n, dec, ctx, sym0);
  if (st != kOk) return st;
  constexpr uint32_t kChunk = 2048;
  uint8_t e[kChunk];
  for (uint32_t i = 0; i < n; i += kChunk) {
    const uint32_t m = n - i < kChunk ? n - i : kChunk;
    memcpy(e, sym0 + i, m);
    const uint8_t* streams[kMaxStreams] = {e};
    for (int k = 1; k < K; ++k) streams[k] = raw[k - 1] + i;
    loops::merge(dtype, streams, m, out + (size_t)es * i);
  }
  return kOk;
}

void decode2_portable(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  *st_a = rans_decode_portable(a.in, a.size, a.n, a.dec, a.ctx, a.out);
  *st_b = rans_decode_portable(b.in, b.size, b.n, b.dec, b.ctx, b.out);
}

void decode2_merged_portable(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                             const RansStream& b, const uint8_t* const* raw_b, int* st_b) {
  *st_a = decode_merged_portable(dtype, a.in, a.size, a.n, a.dec, a.ctx, raw_a, a.out);
  *st_b = decode_merged_portable(dtype, b.in, b.size, b.n, b.dec, b.ctx, raw_b, b.out);
}

}  // namespace

const CodecKernels kPortableKernels = {
    SimdPath::kPortable,   encode_portable,  decode_portable, decode_merged_portable, decode2_portable,
    decode2_merged_portable, loops::histogram, loops::minmax,  loops::split,         loops::merge,
    false,
};

const CodecKernels* codec_kernels_for(SimdPath p) {
  switch (p) {
    case SimdPath::kPortable: return &kPortableKernels;
#if defined(__x86_64__)
    case SimdPath::kAvx2: return simd_cpu_slow_gather() ? &kAvx2ScalarFetchKernels : &kAvx2Kernels;
    case SimdPath::kAvx512: return simd_cpu_is_amd() ? &kAvx512AmdKernels : &kAvx512Kernels;
#endif
#if defined(__aarch64__)
    case SimdPath::kNeon: return &kNeonKernels;
#endif
    default: return nullptr;
  }
}

std::vector<const CodecKernels*> codec_kernel_variants(SimdPath p) {
  std::vector<const CodecKernels*> r;
  if (const CodecKernels* k = codec_kernels_for(p)) r.push_back(k);
#if defined(__x86_64__)
  if (p == SimdPath::kAvx512) r.push_back(r[0] == &kAvx512Kernels ? &kAvx512AmdKernels : &kAvx512Kernels);
  if (p == SimdPath::kAvx2) r.push_back(r[0] == &kAvx2Kernels ? &kAvx2ScalarFetchKernels : &kAvx2Kernels);
#endif
  return r;
}

const char* codec_kernels_name(const CodecKernels& k) {
#if defined(__x86_64__)
  if (&k == &kAvx512Kernels) return "avx512 (16-lane merged decoders)";
  if (&k == &kAvx512AmdKernels) return "avx512 (AVX2 merged decoders, the table for AMD CPUs)";
  if (&k == &kAvx2Kernels) return "avx2 (decoders gather table entries)";
  if (&k == &kAvx2ScalarFetchKernels) return "avx2 (decoders load table entries one by one, the table for AMD Zen 1/2)";
#endif
  return simd_path_name(k.path);
}

const CodecKernels& codec_kernels() {
  const CodecKernels* k = codec_kernels_for(active_simd_path());
  return k ? *k : kPortableKernels;
}

}  // namespace tz::cpu
