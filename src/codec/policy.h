// Encoder policy (doc/format.md section 9): the encoder parameters, and which
// stream of a tensor is stored raw, rANS coded or zstd coded, with which
// frequency table. Integer-only TZ_HD code with caller-provided scratch, so
// that the CPU encoder (compress_frame in src/cpu/frame.cpp) and the CUDA
// encoder (c_hist_kernel / c_table_kernel in src/cuda/cuda_codec.cu, one
// warp lane per stream) take every decision with the same functions and
// write byte-identical frames. The backends only differ in how they take the
// histograms and min/max (threads, SIMD, warps), never in what they decide.
//
// The decision for a float tensor at level >= 1 with elements:
//   0. Short path (policy_size_can_pay): a tensor too small for any stream
//      to pay even with the smallest table and a zero-bit payload is all
//      raw, from its size alone (no histogram).
//   1. First pass (policy_first_pass_elems): a histogram of every stream over
//      the first kSampleElems elements of every block when blocks are larger
//      than that ("sampled"), else of whole blocks.
//   2. Unsampled: that histogram is exact; policy_exact_kind decides. (So
//      is a sample that is the whole tensor: policy_sample_is_whole.)
//   3. Sampled: policy_sample_wants screens each stream on its sample. If no
//      stream is wanted, every stream is raw. Otherwise
//      - policy_fast_tables (level 1, >= kFastTablesMinBlocks blocks): the
//        table comes from the sample and the stream's min/max over the whole
//        tensor, policy_fast_kind decides;
//      - else a second, exact histogram of the wanted streams, and
//        policy_exact_kind decides.
//   4. Level 3 may then give stream 0 lane contexts (policy_tries_lane_contexts,
//      lane_contexts_pay; the search itself is the CPU's choose_lane_contexts).
// Dtype bytes is zstd coded per block at level >= 1 (one stream, kind zstd).
#pragma once
#include "codec/cost.h"
#include "codec/frame_prefix.h"

namespace tz {

constexpr uint32_t kSampleElems = 4096;          // the sample: first elements of every block
constexpr uint64_t kFastTablesMinBlocks = 8;     // level-1 fast tables from this many blocks on
constexpr uint64_t kFastTablesSampleWeight = 64; // sample counts x this, +1 for min..max
constexpr uint64_t kCtxMinElems = 1u << 14;      // lane contexts only for tensors this large

// ------------------------------------------------------------ parameters --

TZ_HD bool encode_level_valid(int level) { return level >= -1 && level <= 3; }
// Level 0 means the default, level 1.
TZ_HD int policy_level(int level) { return level == 0 ? 1 : level; }
// Data whose size is not a multiple of the element size is coded as bytes.
TZ_HD uint8_t encode_dtype(uint8_t dtype, uint64_t n_bytes) {
  return n_bytes % dtype_elem_size(dtype) != 0 ? (uint8_t)kBytes : dtype;
}
// block_elems = 0 means the default of the (effective) dtype.
TZ_HD uint32_t policy_block_elems(uint32_t requested, uint8_t dtype) {
  if (requested) return requested;
  return dtype == kBytes ? kDefaultBytesBlockElems : kDefaultBlockElems;
}
// Sizes a frame can describe: raw_size <= kMaxRawSize, n_blocks < 2^32.
TZ_HD bool encode_size_valid(uint64_t n_bytes) { return n_bytes <= kMaxRawSize; }
TZ_HD bool encode_block_count(uint64_t n_elems, uint32_t block_elems, uint32_t* n_blocks) {
  const uint64_t nb = frame_n_blocks(n_elems, block_elems);
  if (nb > UINT32_MAX) return false;
  *n_blocks = (uint32_t)nb;
  return true;
}

// ------------------------------------------------------------ stream kinds --

// Dtype bytes: one stream, zstd coded per block from level 1 on (CPU only).
TZ_HD uint8_t policy_bytes_kind(int level) { return level >= 1 ? (uint8_t)kKindZstd : (uint8_t)kKindRaw; }
// The smallest coded size any stream of n_blocks blocks can have
// (coded_stream_bytes at its minimum): one payload byte (a single symbol of
// frequency kProbScale costs 0 bits), the lane states and 2 bytes per block,
// the smallest frequency table (the 32-byte presence bitmap and one 2-byte
// entry: the frequencies sum to kProbScale >= 128, so some entry takes 2
// bytes) and the 1 byte of the estimate's rounding.
constexpr uint64_t kMinFreqTableBytes = 32 + 2;
static_assert(kProbScale >= 128, "kMinFreqTableBytes assumes a 2-byte frequency entry");
TZ_HD uint64_t policy_min_coded_bytes(uint64_t n_blocks) {
  return 1 + n_blocks * (kRansStateBytes + 2) + kMinFreqTableBytes + 1;
}
// Short path (the "tiny frame" rule): whether a stream of n_elems symbols
// (its raw size in bytes) in n_blocks blocks could pay at this level at
// all, from sizes alone. False means that no histogram can make any stream
// of the tensor pay (policy_exact_kind and policy_fast_kind both estimate at
// least policy_min_coded_bytes, and stream_pays is monotone in the coded
// size), so every stream is raw without a histogram being taken: the same
// frame the full policy writes. At level 1 this is n_elems <= 167 with one
// block (levels >= 2: <= 166); a tensor of 2 or more blocks can always pay.
TZ_HD bool policy_size_can_pay(int level, uint64_t n_elems, uint64_t n_blocks) {
  return stream_pays(level, policy_min_coded_bytes(n_blocks), n_elems);
}
// Whether any stream of a float tensor can be entropy coded (else all raw,
// and no histogram is taken).
TZ_HD bool policy_codes_streams(int level, uint8_t dtype, uint64_t n_elems, uint64_t n_blocks) {
  return level >= 1 && dtype != kBytes && n_elems > 0 && policy_size_can_pay(level, n_elems, n_blocks);
}
TZ_HD bool policy_sampled(uint32_t block_elems) { return block_elems > kSampleElems; }
// Whether the sample of a sampled tensor is the whole tensor (one block of
// at most kSampleElems elements). Its first-pass histogram is then exact,
// and deciding every stream with policy_exact_kind straight away (the
// unsampled path: one pass, one decision per stream) gives the same kinds
// and tables as screening first: policy_sample_wants estimates the same
// table's payload without the lane states and table bytes, so never more
// than policy_exact_kind, and stream_pays is monotone in the size, so a
// stream the screening drops would not have paid either. The CPU encoder
// takes that path (Policy.WholeSampleTakesTheUnsampledPath checks it).
TZ_HD bool policy_sample_is_whole(uint32_t block_elems, uint64_t n_elems) {
  return policy_sampled(block_elems) && n_elems <= kSampleElems;
}
// Elements per block of the first histogram pass.
TZ_HD uint32_t policy_first_pass_elems(uint32_t block_elems) {
  return policy_sampled(block_elems) ? kSampleElems : block_elems;
}
TZ_HD bool policy_fast_tables(uint32_t block_elems, int level, uint64_t n_blocks) {
  return policy_sampled(block_elems) && level == 1 && n_blocks >= kFastTablesMinBlocks;
}
// A sampled tensor with a wanted stream and no fast tables needs a second,
// exact histogram pass over the wanted streams.
TZ_HD bool policy_second_pass(uint32_t block_elems, int level, uint64_t n_blocks, bool any_wanted) {
  return policy_sampled(block_elems) && any_wanted && !policy_fast_tables(block_elems, level, n_blocks);
}

// Sample screening: whether the stream looks codable on its sampled symbols
// alone (table and state overheads left out), so that it gets a full
// histogram or fast tables. f and norm are 256-entry scratch.
TZ_HD bool policy_sample_wants(int level, const uint64_t* sample, uint32_t* f, uint64_t* norm) {
  uint64_t total = 0;
  for (int s = 0; s < 256; ++s) total += sample[s];
  rans_normalize_with(sample, f, norm);
  return stream_pays(level, coded_stream_bytes(sample, f, 0, 0), total);
}

// Fast tables (policy_fast_tables): frequencies from the sample, with every
// symbol in [lo, hi] (the stream's min and max over the whole tensor) kept
// codable by a pseudo-count; the payload is estimated from the sample and
// scaled to the tensor. Returns kKindRans (freq filled) or kKindRaw.
// counts and norm are 256-entry scratch.
TZ_HD uint8_t policy_fast_kind(int level, const uint64_t* sample, uint32_t lo, uint32_t hi, uint64_t n_elems,
                               uint64_t n_blocks, uint32_t* freq, uint64_t* counts, uint64_t* norm) {
  uint64_t total = 0;
  for (uint32_t x = 0; x < 256; ++x) {
    total += sample[x];
    counts[x] = sample[x] * kFastTablesSampleWeight + (x >= lo && x <= hi ? 1 : 0);
  }
  if (rans_normalize_with(counts, freq, norm) == 0 || total == 0) return kKindRaw;
  const uint64_t sample_bytes = coded_stream_bytes(sample, freq, 0, 0);
  const uint64_t coded = (uint64_t)((unsigned __int128)sample_bytes * n_elems / total) +
                         n_blocks * (kRansStateBytes + 2) + freq_table_size(freq);
  return stream_pays(level, coded, n_elems) ? (uint8_t)kKindRans : (uint8_t)kKindRaw;
}

// Exact decision from the stream's full histogram: rANS when the estimated
// coded size (payload, lane states of every block, table) pays at this
// level. Returns kKindRans (freq filled, *coded set) or kKindRaw. norm is
// 256-entry scratch.
TZ_HD uint8_t policy_exact_kind(int level, const uint64_t* counts, uint64_t n_elems, uint64_t n_blocks,
                                uint32_t* freq, uint64_t* norm, uint64_t* coded) {
  if (rans_normalize_with(counts, freq, norm) == 0) return kKindRaw;
  const uint64_t c = coded_stream_bytes(counts, freq, n_blocks, freq_table_size(freq));
  if (coded) *coded = c;
  return stream_pays(level, c, n_elems) ? (uint8_t)kKindRans : (uint8_t)kKindRaw;
}

// Level 3: stream 0, when rANS coded in a tensor of >= kCtxMinElems
// elements, is searched for lane contexts.
TZ_HD bool policy_tries_lane_contexts(int level, int k, uint8_t kind, uint64_t n_elems) {
  return level >= 3 && k == 0 && kind == kKindRans && n_elems >= kCtxMinElems;
}
// Lane contexts are kept only if their exact coded size (tables included)
// is at least 0.5% below the single table's.
TZ_HD bool lane_contexts_pay(uint64_t ctx_coded, uint64_t plain_coded) {
  return ctx_coded * 1000 < plain_coded * 995;
}

}  // namespace tz
