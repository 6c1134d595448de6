// The frame codec's CPU kernels, one table per SIMD path.
//
// How a kernel set is added (the rule every CPU component follows):
//   1. Write the path's kernels in their own file (simd_avx2.cpp,
//      simd_avx512.cpp, simd_neon.cpp; target attributes on the functions, so
//      the rest of the build stays baseline) and define one CodecKernels
//      table there. Every entry must give exactly the result (bytes and
//      status) of the portable entry: tests/cpu/test_simd*.cpp compare them.
//   2. Return it from codec_kernels_for() (kernels.cpp) for its SimdPath.
//   3. Once every entry is the path's own, list the path in built_with()
//      (simd_path.cpp): only then may active_simd_path() choose it.
// Callers take codec_kernels() once per call and use its entries; they never
// test the CPU themselves. A component with kernels of its own (src/kv)
// keeps its own table of the same shape, chosen by the same
// active_simd_path().
#pragma once
#include <cstddef>
#include <cstdint>

#include <vector>

#include "codec/rans.h"
#include "cpu/simd_path.h"

namespace tz::cpu {

// Encoder tables of one stream (ctx.n tables of 256 entries each, table c
// at +256 c) in the two forms the kernels use.
struct EncTables {
  const RansEncSym* sym;       // portable encoder (tz::rans_encode_ctx)
  const uint32_t* freq_start;  // SIMD encoders: freq | start << 13 (0 if absent)
};
// freq_start form of one table.
void build_freq_start(const uint32_t* freq, uint32_t* freq_start);

// One stream to decode (for the two-stream entries).
struct RansStream {
  const uint8_t* in;
  size_t size;
  uint32_t n;
  const uint32_t* dec;
  uint8_t* out;
  RansCtx ctx{};  // lane contexts of the stream (n = 1: none)
};

struct CodecKernels {
  SimdPath path;
  // As tz::rans_encode_ctx (ctx.n == 1: tz::rans_encode).
  size_t (*rans_encode)(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx, uint16_t* words,
                        uint8_t* out, size_t limit);
  // As tz::rans_decode_ctx.
  int (*rans_decode)(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                     uint8_t* out);
  // A block of BF16, FP16 or FP32 (decodes_merged) whose stream 0 is coded
  // and every other stream raw: decodes stream 0 and merges it with the
  // bytes of streams 1 .. K-1 (raw[0 .. K-2]) into n elements in one pass
  // (tz::merge_fields of them all). Status as tz::rans_decode_ctx of stream 0.
  int (*rans_decode_merged)(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                            const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out);
  // Two independent streams (or such blocks) in lockstep; each its own status.
  void (*rans_decode2)(const RansStream& a, int* st_a, const RansStream& b, int* st_b);
  void (*rans_decode2_merged)(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                              const RansStream& b, const uint8_t* const* raw_b, int* st_b);
  // Adds the histogram of field stream k of n elements at src to hist[256].
  void (*histogram)(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint64_t* hist);
  // Extremes of the bytes of field stream k of n elements, range[0..3]: the
  // smallest and largest byte, and the largest and smallest in signed (int8)
  // order, as bytes (codec/policy.h, policy_range_of; n = 0: 255, 0, 0x80, 0x7F).
  void (*minmax)(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint8_t* range);
  // As tz::split_fields / tz::merge_fields.
  void (*split)(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams);
  void (*merge)(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst);
  // rans_decode2 steps its two streams in lockstep (AVX-512), rather than
  // one after the other. The frame decoder then decodes a block's coded
  // streams two together and merges them after; otherwise it decodes the
  // others first and merges stream 0 in its own pass (frame_decode.cpp,
  // merged_sources).
  bool decode2_lockstep;
};

// Whether rans_decode_merged serves dtype (BF16, FP16, FP32).
inline bool decodes_merged(uint8_t dtype) { return dtype == kBF16 || dtype == kF16 || dtype == kF32; }

// Every table of path p in this build (none, one, or for AVX-512 both
// variants, the one codec_kernels_for picks first): tests compare each.
std::vector<const CodecKernels*> codec_kernel_variants(SimdPath p);
// The table of path p in this build for this CPU, or nullptr when the build has none.
// (Whether the CPU can run it: simd_path_cpu_has.)
const CodecKernels* codec_kernels_for(SimdPath p);
// The table of active_simd_path().
const CodecKernels& codec_kernels();
// What table k is, in words: its path's name (simd_path_name), followed,
// for a path with more than one table, by which one and how it differs
// (tz_simd_kernels, `tzip --version`).
const char* codec_kernels_name(const CodecKernels& k);

// Per-path tables (defined in the path's file; declared for kernels.cpp and
// the tests).
extern const CodecKernels kPortableKernels;
#if defined(__x86_64__)
extern const CodecKernels kAvx2Kernels;
// The AVX2 table for CPUs whose vpgatherdd is slow (AMD Zen 1 and Zen 2):
// its decoders load the 8 table entries of a step one by one
// (simd_avx2.cpp, ScalarFetch).
extern const CodecKernels kAvx2ScalarFetchKernels;
extern const CodecKernels kAvx512Kernels;
// The AVX-512 table for AMD CPUs: its merged decoders (BF16, FP16, FP32)
// are the AVX2 ones (simd_avx512.cpp says why).
extern const CodecKernels kAvx512AmdKernels;
// Kernels one table borrows from another (simd_avx2.cpp, its histograms in
// simd_avx2_counts.cpp; the AVX-512 table counts histograms and, on AMD,
// decodes the merged layout with them).
void histogram_avx2(uint8_t dtype, int k, const uint8_t* src, uint32_t n, uint64_t* hist);
// The number of states x < f * 2^20, over frequencies f in [f_first,
// f_last], at which the AVX2 encoder's float quotient (q = floor(x / f))
// would not be exact, checked where it can first fail (tests).
uint64_t enc_quotient_misses_avx2(uint32_t f_first, uint32_t f_last);
// The same for the AVX-512 table's encoder step (its next state).
uint64_t enc_quotient_misses_avx512(uint32_t f_first, uint32_t f_last);
// Adds the lane-context joint counts of stream 0 of n elements (window lo)
// to J (kCtxJointRows x 256), as frame_tables.cpp's scalar joint_counts:
// the first skip elements (0 or kLanes) are lane predecessors only, and
// with skip 0 the first kLanes are a block's first step (row 0). hist, if
// not null, receives the per-symbol counts of the counted elements (the
// rows' sums).
void joint_counts_avx2(uint8_t dtype, const uint8_t* src, uint32_t n, uint32_t skip, uint32_t lo, uint32_t* J,
                       uint32_t* hist);
int decode_merged_avx2(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                       const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out);
void decode2_merged_avx2(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                         const RansStream& b, const uint8_t* const* raw_b, int* st_b);
#endif
#if defined(__aarch64__)
extern const CodecKernels kNeonKernels;
#endif

}  // namespace tz::cpu
