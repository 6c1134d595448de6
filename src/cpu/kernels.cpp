// The portable kernel table (the reference every SIMD table must match, and
// the fallback) and the choice of table by SIMD path.
#include "cpu/kernels.h"

#include "codec/fields.h"

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
  return rans_encode_ctx(sym, n, t.sym, ctx, words, out, limit);
}

int decode_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                    uint8_t* out) {
  return rans_decode_ctx(in, size, n, dec, ctx, out);
}

// Stores each decoded exponent merged with its sign|mantissa byte.
struct EmitBF16 {
  uint8_t* out;
  const uint8_t* mant;
  void operator()(uint32_t i, uint32_t sym) const {
    store_le16(out + 2 * (size_t)i, merge_elem_bf16((uint8_t)sym, mant[i]));
  }
};

int decode_bf16_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                         const uint8_t* mant, uint8_t* out) {
  return rans_decode_ctx_with(in, size, n, dec, ctx, EmitBF16{out, mant});
}

void decode2_portable(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  *st_a = rans_decode_ctx(a.in, a.size, a.n, a.dec, a.ctx, a.out);
  *st_b = rans_decode_ctx(b.in, b.size, b.n, b.dec, b.ctx, b.out);
}

void decode2_bf16_portable(const RansStream& a, const uint8_t* mant_a, int* st_a, const RansStream& b,
                           const uint8_t* mant_b, int* st_b) {
  *st_a = decode_bf16_portable(a.in, a.size, a.n, a.dec, a.ctx, mant_a, a.out);
  *st_b = decode_bf16_portable(b.in, b.size, b.n, b.dec, b.ctx, mant_b, b.out);
}

// Four sub-histograms: runs of equal symbols (common in exponents) would
// otherwise serialise on one counter.
template <uint8_t DT, int K>
void histogram_t(const uint8_t* src, uint32_t n, uint64_t* hist) {
  uint32_t h[4][256] = {};
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h[0][field_byte(DT, src, i, K)];
    ++h[1][field_byte(DT, src, i + 1, K)];
    ++h[2][field_byte(DT, src, i + 2, K)];
    ++h[3][field_byte(DT, src, i + 3, K)];
  }
  for (; i < n; ++i) ++h[0][field_byte(DT, src, i, K)];
  for (int s = 0; s < 256; ++s) hist[s] += (uint64_t)h[0][s] + h[1][s] + h[2][s] + h[3][s];
}

template <uint8_t DT, int K>
void minmax_t(const uint8_t* src, uint32_t n, uint8_t* lo, uint8_t* hi) {
  uint8_t a = 255, b = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t v = field_byte(DT, src, i, K);
    a = v < a ? v : a;
    b = v > b ? v : b;
  }
  *lo = a;
  *hi = b;
}

void histogram_portable(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint64_t* hist) {
  switch (dtype * 4 + k) {
    case kBF16 * 4 + 0: return histogram_t<kBF16, 0>(src, n, hist);
    case kBF16 * 4 + 1: return histogram_t<kBF16, 1>(src, n, hist);
    case kF16 * 4 + 0: return histogram_t<kF16, 0>(src, n, hist);
    case kF16 * 4 + 1: return histogram_t<kF16, 1>(src, n, hist);
    case kF32 * 4 + 0: return histogram_t<kF32, 0>(src, n, hist);
    case kF32 * 4 + 1: return histogram_t<kF32, 1>(src, n, hist);
    case kF32 * 4 + 2: return histogram_t<kF32, 2>(src, n, hist);
    case kF32 * 4 + 3: return histogram_t<kF32, 3>(src, n, hist);
    default: return histogram_t<kBytes, 0>(src, n, hist);
  }
}

void minmax_portable(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint8_t* lo, uint8_t* hi) {
  switch (dtype * 4 + k) {
    case kBF16 * 4 + 0: return minmax_t<kBF16, 0>(src, n, lo, hi);
    case kBF16 * 4 + 1: return minmax_t<kBF16, 1>(src, n, lo, hi);
    case kF16 * 4 + 0: return minmax_t<kF16, 0>(src, n, lo, hi);
    case kF16 * 4 + 1: return minmax_t<kF16, 1>(src, n, lo, hi);
    case kF32 * 4 + 0: return minmax_t<kF32, 0>(src, n, lo, hi);
    case kF32 * 4 + 1: return minmax_t<kF32, 1>(src, n, lo, hi);
    case kF32 * 4 + 2: return minmax_t<kF32, 2>(src, n, lo, hi);
    case kF32 * 4 + 3: return minmax_t<kF32, 3>(src, n, lo, hi);
    default: return minmax_t<kBytes, 0>(src, n, lo, hi);
  }
}

void split_portable(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) {
  split_fields(dtype, src, n, streams);
}
void merge_portable(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst) {
  merge_fields(dtype, streams, n, dst);
}

}  // namespace

const CodecKernels kPortableKernels = {
    SimdPath::kPortable, encode_portable,    decode_portable,  decode_bf16_portable, decode2_portable,
    decode2_bf16_portable, histogram_portable, minmax_portable, split_portable,       merge_portable,
};

const CodecKernels* codec_kernels_for(SimdPath p) {
  switch (p) {
    case SimdPath::kPortable: return &kPortableKernels;
#if defined(__x86_64__)
    case SimdPath::kAvx2: return &kAvx2Kernels;
    case SimdPath::kAvx512: return &kAvx512Kernels;
#endif
#if defined(__aarch64__)
    case SimdPath::kNeon: return &kNeonKernels;
#endif
    default: return nullptr;
  }
}

const CodecKernels& codec_kernels() {
  const CodecKernels* k = codec_kernels_for(active_simd_path());
  return k ? *k : kPortableKernels;
}

}  // namespace tz::cpu
