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
//        table comes from the sample and the stream's range over the
//        whole tensor (version 3: policy_range_has);
//      - else a second, exact histogram of the wanted streams, and
//        policy_exact_kind decides.
//   4. Stream 0 may then get lane contexts (codec/policy_lane_ctx.h:
//      policy_tries_window_contexts, policy_ctx_search, lane_contexts_pay;
//      level 3's exhaustive search is the CPU's choose_lane_contexts).
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
// An encoder's requested block_elems: 0 (the default above) or a block size
// a frame can hold (block_elems_valid: a power of two in [4096, 2^20]).
TZ_HD bool policy_block_elems_valid(uint64_t requested) {
  return requested == 0 || (requested <= UINT32_MAX && block_elems_valid((uint32_t)requested));
}
// The encoder options a caller gives, checked in one place (the codec's
// compress, every .tzip writer, the C APIs, the CLI and Python): null when
// both are valid, else the rule the first invalid one breaks.
TZ_HD const char* policy_option_error(int level, uint64_t block_elems) {
  if (!encode_level_valid(level)) return "level must be -1 (store), 0 (default), 1, 2 or 3";
  if (!policy_block_elems_valid(block_elems))
    return "block size must be 0 (the default) or a power of two between 4096 and 1048576 elements";
  return nullptr;
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
// The smallest coded size any stream of n_blocks blocks can have in the
// estimate levels >= 1 decide by (format version 3, policy_set_tables; for
// lane contexts policy_ctx_tables, larger): one payload byte (a single
// symbol of frequency kProbScale costs 0 bits), the lane states and 2 bytes
// per block, and the smallest table entry: the kind and set-count bytes and
// one compact table of 3 header bytes and at least 2 bytes of codes. A
// table's codes take more than 8 bits: a code takes at least one bit, and
// c <= 8 coded symbols hold frequencies summing to kProbScale, so the
// largest value (mode 0) is at least 512 (>= 10 bits), or the largest
// difference (mode 1) at least 4096 / c^2 (a zigzag code of >= 8 bits, plus
// the other codes; c = 1: the value 8192); mode 2 needs a second table,
// whose stream then has a first one. A constant tensor reaches this
// minimum (a 7-byte table entry).
constexpr uint64_t kMinStreamTableBytes = 2 + 3 + 2;
static_assert(kProbScale == 4096, "kMinStreamTableBytes assumes frequencies summing to 4096");
TZ_HD uint64_t policy_min_coded_bytes(uint64_t n_blocks) {
  return 1 + n_blocks * (kRansStateBytes + 2) + kMinStreamTableBytes;
}
// Short path (the "tiny frame" rule): whether a stream of n_elems symbols
// (its raw size in bytes) in n_blocks blocks could pay at this level at
// all, from sizes alone. False means that no histogram can make any stream
// of the tensor pay (policy_set_tables and policy_ctx_tables estimate at
// least policy_min_coded_bytes, and stream_pays is monotone in the coded
// size), so every stream is raw without a histogram being taken: the same
// frame the full policy writes. At level 1 this is n_elems <= 139 with one
// block (levels >= 2: <= 138); a tensor of 2 or more blocks can always pay.
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

// Level 3: stream 0, when rANS coded (with or without the window's lane
// contexts) in a tensor of >= kCtxMinElems elements, is searched for lane
// contexts exhaustively.
TZ_HD bool policy_tries_lane_contexts(int level, int k, uint8_t kind, uint64_t n_elems) {
  return level >= 3 && k == 0 && kind_is_rans(kind) && n_elems >= kCtxMinElems;
}
// Lane contexts are kept only if their exact coded size (tables included)
// is at least 0.5% below the single table's.
TZ_HD bool lane_contexts_pay(uint64_t ctx_coded, uint64_t plain_coded) {
  return ctx_coded * 1000 < plain_coded * 995;
}

// ================================================ format version 3 (levels 1-2) ==
// The statistics are per block: a histogram of every stream over the block's
// first-pass elements (the sample, or the whole block), exact per-block
// histograms of the wanted streams where v2 took an exact tensor histogram,
// and where fast tables apply, per-block ranges (see "fast tables'
// statistics" below). With them:
//   a. policy_segment_blocks cuts the blocks of a wanted stream into runs
//      (table sets) where the statistics change (greedy splitting on an
//      integer entropy estimate, at most policy_max_sets runs; level 1 only
//      for streams one table codes, policy_tries_sets, with fewer split
//      points, policy_split_candidates);
//   b. each run gets a table (policy_table_counts: exact counts, or fast-table
//      counts from the sample), and the sets are kept only if their
//      estimate, compact tables included, beats one table for the stream
//      (policy_sets_pay); runs that do not pay on their own are stored raw,
//      never coded (codec/policy_raw_runs.h), which also lets a stream that
//      one table does not code be coded in a few runs;
//   c. stream 0 may get lane contexts (policy_ctx_window, policy_ctx_search)
//      from a joint histogram of (row of the previous lane symbol, symbol)
//      over the same elements (level 1: frames with exact tables of at
//      least kCtxMinBytesLevel1 bytes); it then has one set. The CPU counts the
//      exact joint histogram in the exact pass (stream 0's block histograms
//      are its row sums); the numbers, and so the frames, are the same.
// Every step is integer arithmetic on the same inputs on the CPU and the GPU.

constexpr uint32_t kCtxWindowRows = 12;                  // previous-symbol values with a row of their own
constexpr uint32_t kCtxJointRows = kCtxWindowRows + 3;   // + first step, below the window, above it
constexpr uint32_t kSetSplitCandidates = 64;             // split points tried per run (levels 2-3)
constexpr uint32_t kSetSplitCandidatesLevel1 = 16;       // at level 1

// Levels 1 and 2 write format version 3 (sets, compact tables, lane
// contexts); level 3 adds the exhaustive CPU search for lane contexts.
TZ_HD bool policy_v3(int level) { return level >= 1; }

// log2(v) in 16.16 fixed point for v >= 1: the bit scan gives the integer
// part, a cubic in the next 16 bits the fraction. Never above the true
// value, and at most kLog2FastError units of 2^-16 below it (0.0133 bits;
// tests/codec/test_policy.cpp measures it).
constexpr uint32_t kLog2FastError = 869;
TZ_HD uint32_t log2_q16_fast(uint64_t v) {
#if defined(__CUDA_ARCH__)
  const uint32_t ip = 63u - (uint32_t)__clzll((long long)v);
#else
  const uint32_t ip = 63u - (uint32_t)__builtin_clzll(v);
#endif
  const int64_t t = (int64_t)((ip >= 16 ? (v >> (ip - 16)) : (v << (16 - ip))) & 0xFFFFu);  // fraction, Q16
  int64_t y = (18062 * t) >> 16;
  y = ((-47064 + y) * t) >> 16;
  y = ((94538 + y) * t) >> 16;
  return (ip << 16) + (uint32_t)(y < 0 ? 0 : y);
}

// Order-0 code length of a histogram in 16.16 fixed-point bits:
// N log2 N - sum c log2 c; *present receives the number of present symbols.
TZ_HD unsigned __int128 entropy_bits_q16(const uint64_t* c, uint32_t* present) {
  unsigned __int128 acc = 0;
  uint64_t n = 0;
  uint32_t p = 0;
  for (int s = 0; s < 256; ++s) {
    if (!c[s]) continue;
    n += c[s];
    ++p;
    acc -= (unsigned __int128)c[s] * log2_q16_fast(c[s]);
  }
  if (present) *present = p;
  if (!n) return 0;
  return acc + (unsigned __int128)n * log2_q16_fast(n);
}

// entropy_bits_q16 of a histogram whose non-zero counts all lie at the n
// symbols syms[] (ascending): the same value, without scanning the absent
// symbols.
TZ_HD unsigned __int128 entropy_bits_q16_at(const uint64_t* c, const uint8_t* syms, uint32_t n, uint32_t* present) {
  unsigned __int128 acc = 0;
  uint64_t total = 0;
  uint32_t p = 0;
  for (uint32_t j = 0; j < n; ++j) {
    const uint64_t v = c[syms[j]];
    if (!v) continue;
    total += v;
    ++p;
    acc -= (unsigned __int128)v * log2_q16_fast(v);
  }
  if (present) *present = p;
  if (!total) return 0;
  return acc + (unsigned __int128)total * log2_q16_fast(total);
}

// Estimated bytes of a compact table of `present` symbols (for decisions
// before the table exists).
TZ_HD uint64_t policy_table_estimate(uint32_t present) { return 3 + present; }

// Most table sets a stream may get: the frame's 32 tables shared by the
// wanted streams, at most kMaxTableSets each (kMaxTableSetsLevel1 at level
// 1: every split searched costs the default level time); one below 2 blocks.
constexpr uint32_t kMaxTableSetsLevel1 = 8;
TZ_HD uint32_t policy_max_sets(uint32_t n_blocks, int n_wanted, int level) {
  if (n_blocks < 2 || n_wanted < 1) return 1;
  uint32_t m = kMaxFrameTablesV3 / (uint32_t)n_wanted;
  const uint32_t cap = level <= 1 ? kMaxTableSetsLevel1 : kMaxTableSets;
  if (m > cap) m = cap;
  return m < n_blocks ? m : n_blocks;
}
// Whether a wanted stream is searched for table sets, given whether it
// pays with one table. Level 1 searches only streams that one table codes:
// a stream that sets alone would make codable costs a whole rANS pass more
// for a small gain. Higher levels search every wanted stream.
TZ_HD bool policy_tries_sets(int level, bool one_table_pays) { return level >= 2 || one_table_pays; }
// Whether sets of estimated size sets_coded are kept over one table of
// one_coded. Fast tables estimate from the sample the tables were made
// from, which favours more tables: level 1 then wants a 0.5% margin.
TZ_HD bool policy_sets_pay(int level, bool fast, uint64_t sets_coded, uint64_t one_coded) {
  if (level <= 1 && fast) return (unsigned __int128)sets_coded * 1000 < (unsigned __int128)one_coded * 995;
  return sets_coded < one_coded;
}

// Working memory of policy_segment_blocks (global memory on the GPU).
struct SegScratch {
  uint64_t total[256];
  uint64_t left[256];
  uint64_t right[256];
  uint32_t start[kMaxTableSets + 1];   // run j covers blocks [start[j], start[j+1])
  uint32_t best_pos[kMaxTableSets];    // best split of run j (0: none)
  uint64_t best_gain[kMaxTableSets];   // its gain, 16.16 bits at full scale
};

// Sum of the per-block histograms of blocks [b0, b1) (hist: block b's 256
// counts at hist + b * stride).
TZ_HD void policy_run_counts(const uint32_t* hist, size_t stride, uint32_t b0, uint32_t b1, uint64_t* out) {
  for (int s = 0; s < 256; ++s) out[s] = 0;
  for (uint32_t b = b0; b < b1; ++b)
    for (int s = 0; s < 256; ++s) out[s] += hist[(size_t)b * stride + s];
}

// Split points tried per run at this level (the search's cost).
TZ_HD uint32_t policy_split_candidates(int level) {
  return level <= 1 ? kSetSplitCandidatesLevel1 : kSetSplitCandidates;
}
// Best split of run [b0, b1) at one of <= `candidates` evenly spaced
// points: the gain in coded bits (16.16, scaled from the counted elements to
// the whole run by scale_num / scale_den) minus twice the new table's
// estimated size. Sets *pos = 0 when no split gains.
TZ_HD void policy_best_split(const uint32_t* hist, size_t stride, uint32_t b0, uint32_t b1, uint32_t candidates,
                             uint64_t scale_num, uint64_t scale_den, SegScratch* w, uint32_t* pos, uint64_t* gain) {
  *pos = 0;
  *gain = 0;
  if (b1 - b0 < 2) return;
  policy_run_counts(hist, stride, b0, b1, w->total);
  const unsigned __int128 whole = entropy_bits_q16(w->total, nullptr);
  const uint32_t step = (b1 - b0 - 1 + candidates - 1) / candidates;
  for (int s = 0; s < 256; ++s) w->left[s] = 0;
  uint32_t next = b0;
  for (uint32_t j = b0 + step; j < b1; j += step) {
    for (; next < j; ++next)
      for (int s = 0; s < 256; ++s) w->left[s] += hist[(size_t)next * stride + s];
    for (int s = 0; s < 256; ++s) w->right[s] = w->total[s] - w->left[s];
    uint32_t pl = 0, pr = 0;
    const unsigned __int128 parts = entropy_bits_q16(w->left, &pl) + entropy_bits_q16(w->right, &pr);
    if (parts >= whole) continue;
    const unsigned __int128 g = (whole - parts) * scale_num / (scale_den ? scale_den : 1);
    const uint32_t pmin = pl < pr ? pl : pr;
    const unsigned __int128 cost = (unsigned __int128)(2 * 8 * policy_table_estimate(pmin)) << 16;
    if (g <= cost) continue;
    const uint64_t net = (uint64_t)(g - cost);
    if (net > *gain) {
      *gain = net;
      *pos = j;
    }
  }
}

// Cuts blocks [0, n_blocks) of one stream into at most max_sets runs by
// repeatedly splitting the run whose best split gains most (ties: the
// lowest run). set_of_block[b] receives block b's run number (runs in block
// order). Returns the number of runs.
TZ_HD uint32_t policy_segment_blocks(int level, const uint32_t* hist, size_t stride, uint32_t n_blocks, uint32_t max_sets,
                                     uint64_t scale_num, uint64_t scale_den, SegScratch* w, uint8_t* set_of_block) {
  const uint32_t cand = policy_split_candidates(level);
  uint32_t runs = 1;
  w->start[0] = 0;
  w->start[1] = n_blocks;
  if (max_sets > kMaxTableSets) max_sets = kMaxTableSets;
  if (max_sets > 1) policy_best_split(hist, stride, 0, n_blocks, cand, scale_num, scale_den, w, &w->best_pos[0], &w->best_gain[0]);
  while (runs < max_sets) {
    uint32_t r = runs;
    for (uint32_t j = 0; j < runs; ++j)
      if (w->best_pos[j] && (r == runs || w->best_gain[j] > w->best_gain[r])) r = j;
    if (r == runs) break;
    const uint32_t cut = w->best_pos[r];
    for (uint32_t j = runs + 1; j > r + 1; --j) w->start[j] = w->start[j - 1];
    for (uint32_t j = runs; j > r + 1; --j) {
      w->best_pos[j] = w->best_pos[j - 1];
      w->best_gain[j] = w->best_gain[j - 1];
    }
    w->start[r + 1] = cut;
    ++runs;
    policy_best_split(hist, stride, w->start[r], w->start[r + 1], cand, scale_num, scale_den, w, &w->best_pos[r],
                      &w->best_gain[r]);
    policy_best_split(hist, stride, w->start[r + 1], w->start[r + 2], cand, scale_num, scale_den, w, &w->best_pos[r + 1],
                      &w->best_gain[r + 1]);
  }
  for (uint32_t j = 0; j < runs; ++j)
    for (uint32_t b = w->start[j]; b < w->start[j + 1]; ++b) set_of_block[b] = (uint8_t)j;
  return runs;
}

// ------------------------------------------- fast tables' statistics --
// Level 1's fast tables (policy_fast_tables) come from the sample and keep
// every symbol that may occur codable by a pseudo-count. The symbols that
// may occur: a range per block and stream (kRangeBytes) from four running
// extremes of the whole block, the unsigned minimum and maximum and the
// minimum and maximum in signed (int8) order, i.e. the smallest symbol with
// the top bit set and the largest without (policy_range_of). Symbols in
// [min, signed max] or [signed min, max] (policy_range_has) include every
// symbol of the block, and where the top bit is a sign (FP16's and FP8's
// stream 0) they leave out the unused symbols between the positive and the
// negative values, each of which would otherwise cost a 1/4096 share of the
// table (doc/format.md 9).
constexpr uint32_t kRangeBytes = 4;  // unsigned min, unsigned max, signed max, signed min (as bytes)

// The range of a block's symbols: r (kRangeBytes) from its four extremes;
// the empty range is {255, 0, 0x80, 0x7F}. policy_range_add adds a symbol,
// policy_range_merge another range (blocks of a run, a tensor's stream).
TZ_HD void policy_range_empty(uint8_t* r) {
  r[0] = 255, r[1] = 0, r[2] = 0x80, r[3] = 0x7F;
}
TZ_HD void policy_range_of(uint32_t umin, uint32_t umax, int32_t smax, int32_t smin, uint8_t* r) {
  r[0] = (uint8_t)umin, r[1] = (uint8_t)umax, r[2] = (uint8_t)(int8_t)smax, r[3] = (uint8_t)(int8_t)smin;
}
TZ_HD void policy_range_merge(uint8_t* r, const uint8_t* o) {
  r[0] = o[0] < r[0] ? o[0] : r[0];
  r[1] = o[1] > r[1] ? o[1] : r[1];
  r[2] = (int8_t)o[2] > (int8_t)r[2] ? o[2] : r[2];
  r[3] = (int8_t)o[3] < (int8_t)r[3] ? o[3] : r[3];
}
TZ_HD void policy_range_add(uint8_t* r, uint32_t x) {
  const uint8_t o[kRangeBytes] = {(uint8_t)x, (uint8_t)x, (uint8_t)x, (uint8_t)x};
  policy_range_merge(r, o);
}
// Whether symbol x may occur in range r: x in [min, signed max] or in
// [signed min, max]. With symbols on both sides of 0x80 the signed max is
// the largest below 0x80 and the signed min the smallest from 0x80 on;
// with symbols on one side only, both intervals are [min, max].
TZ_HD bool policy_range_has(const uint8_t* r, uint32_t x) {
  return (x >= r[0] && x <= r[2]) || (x >= r[3] && x <= r[1]);
}

// Counts a table is normalised from: exact, the run's histogram; fast
// tables (policy_fast_tables), its sample weighted by kFastTablesSampleWeight
// plus one for every symbol the run's range (policy_range_has) holds, so
// that every symbol of the run stays codable.
TZ_HD void policy_table_counts(const uint64_t* counts, bool fast, const uint8_t* range, uint64_t* out) {
  for (uint32_t x = 0; x < 256; ++x)
    out[x] = fast ? counts[x] * kFastTablesSampleWeight + (policy_range_has(range, x) ? 1 : 0) : counts[x];
}

// Estimated payload bytes of counts coded with freq (as coded_stream_bytes,
// with the fast log2), and of a run of `elems` elements in `blocks` blocks
// whose counted symbols (`counted` of them) have histogram counts, with
// table freq: the payload scaled to the run, lane states and block words.
TZ_HD uint64_t policy_payload_bytes(const uint64_t* counts, const uint32_t* freq) {
  unsigned __int128 bits = 0;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) bits += (unsigned __int128)counts[s] * ((kProbBits << 16) - log2_q16_fast(freq[s]));
  return (uint64_t)((bits >> 16) / 8) + 1;
}
TZ_HD uint64_t policy_run_coded(const uint64_t* counts, const uint32_t* freq, uint64_t counted, uint64_t elems,
                                uint64_t blocks) {
  const uint64_t payload = policy_payload_bytes(counts, freq);
  const uint64_t scaled = counted ? (uint64_t)((unsigned __int128)payload * elems / counted) : 0;
  return scaled + blocks * (kRansStateBytes + 2);
}

// Working memory of policy_set_tables / policy_ctx_tables.
struct TableScratch {
  uint64_t counts[256];
  uint64_t tc[256];
  uint64_t norm[256];
};

// Tables of stream k's `sets` runs (set_of_block[b], null: one run) from the
// per-block histograms (hist + b * stride, over counted[b] elements) and,
// with fast tables, per-block ranges (kRangeBytes at mm + b * mm_stride). Fills sets x 256 frequencies and *coded, the estimated bytes of the
// stream (payloads scaled to the runs, lane states, block words, its compact
// table entry). False if a run has no symbol (cannot happen for a run of
// blocks with elements).
TZ_HD bool policy_set_tables(const uint32_t* hist, size_t stride, const uint64_t* counted, uint32_t n_blocks,
                             uint32_t block_elems, uint64_t n_elems, const uint8_t* set_of_block, uint32_t sets,
                             bool fast, const uint8_t* mm, size_t mm_stride, uint32_t* freq, uint64_t* coded,
                             TableScratch* w) {
  uint64_t total = 0;
  uint32_t b = 0;
  for (uint32_t j = 0; j < sets; ++j) {
    for (int s = 0; s < 256; ++s) w->counts[s] = 0;
    uint64_t cnt = 0, elems = 0, blocks = 0;
    uint8_t range[kRangeBytes];
    policy_range_empty(range);
    for (; b < n_blocks && (set_of_block ? set_of_block[b] : 0u) == j; ++b) {
      for (int s = 0; s < 256; ++s) w->counts[s] += hist[(size_t)b * stride + s];
      cnt += counted[b];
      const uint64_t e0 = (uint64_t)b * block_elems;
      elems += n_elems - e0 < block_elems ? n_elems - e0 : block_elems;
      ++blocks;
      if (fast) policy_range_merge(range, mm + (size_t)b * mm_stride);
    }
    policy_table_counts(w->counts, fast, range, w->tc);
    uint32_t* f = freq + (size_t)j * 256;
    if (rans_normalize_with(w->tc, f, w->norm) == 0) return false;
    total += policy_run_coded(w->counts, f, cnt, elems, blocks);
  }
  *coded = total + stream_table_size_v3(kKindRans, freq, RansCtx{}, sets);
  return true;
}

// A lower bound of policy_set_tables' *coded for one set over `counts`
// (the stream's histogram over `counted` of its n_elems elements in n_blocks
// blocks), without a table: by Gibbs' inequality no table codes the counts in
// fewer bits than their order-0 entropy, which entropy_bits_q16 overstates by
// at most 32 units of 2^-16 bits per counted symbol, and the payload's
// fixed-point log2 errs by at most 16 per symbol (slack 64 per symbol, as in
// policy_ctx_promising); the lane states and block words are exact; a compact
// table spans at least the counts' present range, each code of at least one
// bit. Where even the bound does not pay (stream_pays is monotone in the
// size) and no sets are tried, the stream is raw without normalising or
// sizing a table: the same decision.
TZ_HD uint64_t policy_one_table_bound(const uint64_t* counts, uint64_t counted, uint64_t n_elems, uint64_t n_blocks) {
  uint32_t lo = 256, hi = 0;
  for (uint32_t s = 0; s < 256; ++s)
    if (counts[s]) {
      if (lo == 256) lo = s;
      hi = s;
    }
  if (lo == 256 || counted == 0) return 0;
  const unsigned __int128 bits = entropy_bits_q16(counts, nullptr);
  const unsigned __int128 slack = (unsigned __int128)64 * counted;
  const uint64_t payload = bits > slack ? (uint64_t)(((bits - slack) >> 16) / 8) : 0;
  const uint64_t scaled = (uint64_t)((unsigned __int128)payload * n_elems / counted);
  const uint64_t table = 2 + 3 + (hi - lo + 1 + 7) / 8;  // kind and set-count bytes, one compact table
  return scaled + n_blocks * (kRansStateBytes + 2) + table;
}

}  // namespace tz
