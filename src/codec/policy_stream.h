// Encoder policy, one stream's decision (format version 3, doc/format.md 9):
// raw, one table, or table sets, from the stream's per-block histograms.
// The one form of that decision: the CPU encoder (choose_tables,
// src/cpu/frame_tables.cpp) and the CUDA encoder (decide_streams,
// src/cuda/encode_tables.cuh, one warp lane per stream) both call
// policy_decide_stream, so they cannot take different paths to it.
#pragma once
#include "codec/policy.h"
#include "codec/policy_raw_runs.h"

namespace tz {

struct StreamChoice {
  uint8_t kind = kKindRaw;  // kKindRaw, or kKindRans with the tables below
  bool use_sets = false;    // kKindRans: table sets (n_sets tables in freq_sets, blocks' sets in set_of),
                            // else one table (freq_one)
  uint32_t n_sets = 0;      // kKindRans: 1, or the sets kept
  uint64_t coded = 0;       // kKindRans: the stream's estimated coded bytes
};

// Stream k of a tensor (wanted by the sample screening) from its per-block
// histograms (hist + b * stride over counted[b] elements, counted_total in
// all) and, with fast tables, per-block ranges (mm + b * mm_stride):
//  1. where sets are not tried (policy_tries_sets(level, false) fails, or
//     max_sets <= 1), policy_one_table_bound first: if even the bound does
//     not pay, neither does one table (the same decision without sizing a
//     table), and only raw runs may make the stream codable;
//  2. one table (policy_set_tables), kept if it pays (stream_pays);
//  3. table sets (policy_segment_blocks) where tried, their raw runs
//     (policy_raw_runs), kept by policy_use_sets.
// Scratch: freq_one (256 entries), freq_sets (max_sets x 256), set_of
// (n_blocks; after a choice without sets its content is unspecified), seg, ts.
TZ_HD StreamChoice policy_decide_stream(int level, const uint32_t* hist, size_t stride, const uint64_t* counted,
                                        uint64_t counted_total, uint32_t n_blocks, uint32_t block_elems,
                                        uint64_t n_elems, uint32_t max_sets, bool fast, const uint8_t* mm,
                                        size_t mm_stride, uint32_t* freq_one, uint32_t* freq_sets, uint8_t* set_of,
                                        SegScratch* seg, TableScratch* ts) {
  StreamChoice c;
  bool bound_pays = true;
  if (!policy_tries_sets(level, false) || max_sets <= 1) {
    uint64_t* counts = ts->counts;  // free until policy_set_tables
    for (int x = 0; x < 256; ++x) counts[x] = 0;
    for (uint32_t b = 0; b < n_blocks; ++b)
      for (int x = 0; x < 256; ++x) counts[x] += hist[(size_t)b * stride + x];
    bound_pays = stream_pays(level, policy_one_table_bound(counts, counted_total, n_elems, n_blocks), n_elems);
    if (!bound_pays && !policy_tries_raw_runs(level, n_blocks)) return c;
  }
  uint64_t coded1 = ~UINT64_C(0), codedN = ~UINT64_C(0);
  bool one_pays = false;
  if (bound_pays) {
    if (!policy_set_tables(hist, stride, counted, n_blocks, block_elems, n_elems, nullptr, 1, fast, mm, mm_stride,
                           freq_one, &coded1, ts))
      return c;
    one_pays = stream_pays(level, coded1, n_elems);
  }
  const uint32_t n_sets =
      max_sets > 1 && (policy_tries_sets(level, one_pays) || policy_tries_raw_runs(level, n_blocks))
          ? policy_segment_blocks(level, hist, stride, n_blocks, max_sets, n_elems, counted_total, seg, set_of)
          : 1;
  uint32_t kept = 0;
  if (n_sets > 1 && policy_set_tables(hist, stride, counted, n_blocks, block_elems, n_elems, set_of, n_sets, fast, mm,
                                      mm_stride, freq_sets, &codedN, ts))
    kept = policy_raw_runs(level, !one_pays, hist, stride, counted, n_blocks, block_elems, n_elems, set_of, n_sets,
                           freq_sets, &codedN, ts);
  c.use_sets = policy_use_sets(level, fast, one_pays, kept, codedN, coded1, n_elems);
  if (!c.use_sets && !one_pays) return c;
  c.kind = kKindRans;
  c.n_sets = c.use_sets ? kept : 1;
  c.coded = c.use_sets ? codedN : coded1;
  return c;
}

}  // namespace tz
