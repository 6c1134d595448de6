// Encoder policy, raw runs (format version 3, doc/format.md 9): which table
// sets of a stream are stored raw, never coded, and which streams the
// whole tensor's sample does not want are searched for them. TZ_HD code
// shared by the CPU encoder (src/cpu/frame_tables.cpp) and the CUDA encoder
// (src/cuda/encode_tables.cuh), like the rest of codec/policy.h.
#pragma once
#include "codec/policy.h"

namespace tz {

// ------------------------------------------------------ raw runs --
// A run of blocks (a table set) whose estimate does not pay on its own is
// stored raw: its blocks keep the stream in mode 0 and are never coded
// (encoder and decoder spend no rANS pass on them), and the run takes no
// table. So a stream coded in a few blocks only (an embedding's rows kept at
// FP16 precision, untouched rows) costs decode time in those blocks alone.
// The marker (kSetRaw, codec/format.h) lives only in the encoder's per-block
// set numbers; a raw block's stream word has set 0 (doc/format.md 6.3).

// Whether a run of `elems` elements whose coded estimate is `coded` is coded.
// Level 1, for a stream that one table does not code (the sets alone make
// it codable, so every coded run is a rANS pass more than version 2 spent):
// the run must save a quarter of its bytes; otherwise the level's bar.
constexpr uint32_t kRawRunsSavePct = 25;
TZ_HD bool policy_run_pays(int level, bool sets_alone, uint64_t coded, uint64_t elems) {
  if (level <= 1 && sets_alone) return (unsigned __int128)coded * 100 < (unsigned __int128)elems * (100 - kRawRunsSavePct);
  return stream_pays(level, coded, elems);
}
// Whether a stream that one table does not code is searched for sets whose
// runs may be coded alone (frames of 2 blocks or more, every level >= 1;
// level 1 then codes only runs that save kRawRunsSavePct).
TZ_HD bool policy_tries_raw_runs(int level, uint32_t n_blocks) { return level >= 1 && n_blocks >= 2; }
// Screening of a stream the sample of the whole tensor does not want
// (policy_sample_wants): it is wanted all the same if one block's
// first-pass histogram (h, 256 counts) could pay alone at level 1's raw-run
// bar: fewer than 256 symbols present and an order-0 entropy of at most
// (100 - kRawRunsSavePct) % of 8 bits a symbol. A block of near-uniform
// bytes holds every symbol and is passed over after the presence count.
TZ_HD bool policy_block_pays_alone(const uint32_t* h) {
  uint32_t present = 0;
  uint64_t n = 0;
  for (int s = 0; s < 256; ++s) present += h[s] ? 1u : 0u, n += h[s];
  if (present == 256 || n == 0) return false;
  unsigned __int128 acc = (unsigned __int128)n * log2_q16_fast(n);
  for (int s = 0; s < 256; ++s)
    if (h[s]) acc -= (unsigned __int128)h[s] * log2_q16_fast(h[s]);
  return acc * 100 <= ((unsigned __int128)n * 8 << 16) * (100 - kRawRunsSavePct);
}

// Drops the runs of policy_set_tables' `sets` (set_of_block, their tables in
// freq) that do not pay (policy_run_pays): their blocks get kSetRaw, the
// kept runs are renumbered in block order and their tables moved down.
// Returns the number kept (0: no run pays, the stream is raw) and *coded, the
// stream's estimate: kept runs as policy_set_tables, raw runs at their bytes,
// the table entry of the kept sets.
TZ_HD uint32_t policy_raw_runs(int level, bool sets_alone, const uint32_t* hist, size_t stride, const uint64_t* counted,
                               uint32_t n_blocks, uint32_t block_elems, uint64_t n_elems, uint8_t* set_of_block,
                               uint32_t sets, uint32_t* freq, uint64_t* coded, TableScratch* w) {
  uint64_t total = 0;
  uint32_t kept = 0, b = 0;
  for (uint32_t j = 0; j < sets; ++j) {
    for (int s = 0; s < 256; ++s) w->counts[s] = 0;
    uint64_t cnt = 0, elems = 0, blocks = 0;
    const uint32_t b0 = b;
    for (; b < n_blocks && set_of_block[b] == j; ++b) {
      for (int s = 0; s < 256; ++s) w->counts[s] += hist[(size_t)b * stride + s];
      cnt += counted[b];
      const uint64_t e0 = (uint64_t)b * block_elems;
      elems += n_elems - e0 < block_elems ? n_elems - e0 : block_elems;
      ++blocks;
    }
    const uint32_t* f = freq + (size_t)j * 256;
    const uint64_t run = policy_run_coded(w->counts, f, cnt, elems, blocks);
    const bool pays = policy_run_pays(level, sets_alone, run, elems);
    for (uint32_t c = b0; c < b; ++c) set_of_block[c] = pays ? (uint8_t)kept : kSetRaw;
    if (!pays) {
      total += elems;
      continue;
    }
    if (kept != j)
      for (int s = 0; s < 256; ++s) freq[(size_t)kept * 256 + s] = f[s];
    total += run;
    ++kept;
  }
  *coded = total + (kept ? stream_table_size_v3(kKindRans, freq, RansCtx{}, kept) : 0);
  return kept;
}

// Whether a wanted stream is coded with its sets (kept of them after
// policy_raw_runs, estimated at sets_coded) rather than one table (one_coded,
// paying at the level if one_pays): where one table pays, as policy_sets_pay;
// where it does not (the sets alone make the stream codable), whenever the
// kept runs, each paying at policy_run_pays' bar, make the stream smaller
// than raw. The stream is coded at all if this holds or one_pays.
TZ_HD bool policy_use_sets(int level, bool fast, bool one_pays, uint32_t kept, uint64_t sets_coded, uint64_t one_coded,
                           uint64_t n_elems) {
  if (kept == 0) return false;
  return one_pays ? policy_sets_pay(level, fast, sets_coded, one_coded) : sets_coded < n_elems;
}

}  // namespace tz
