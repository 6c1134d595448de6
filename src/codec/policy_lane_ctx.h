// Encoder policy, lane contexts of stream 0 (format version 2-3, doc/format.md
// sections 5.6 and 9): the joint histogram's rows, the search of the window
// and its bound, the contexts' tables and when a frame tries them. TZ_HD
// code shared by the CPU encoder (src/cpu/frame_tables.cpp) and the CUDA
// encoder (src/cuda/encode_tables.cuh), like the rest of codec/policy.h.
#pragma once
#include "codec/policy.h"

namespace tz {

// ------------------------------------------------- lane contexts (v3) --
// The joint histogram has kCtxJointRows rows of 256: row 0 the symbols of a
// block's first step, row 1 those whose lane predecessor is below the window
// [lo, lo + 11], rows 2..13 predecessor lo..lo + 11, row 14 above it. The
// window is centred on stream 0's most frequent first-pass symbol.
TZ_HD uint32_t policy_ctx_window(const uint64_t* counts) {
  uint32_t m = 0;
  for (uint32_t s = 1; s < 256; ++s)
    if (counts[s] > counts[m]) m = s;
  uint32_t lo = m >= 6 ? m - 6 : 0;
  if (lo > 256 - kCtxWindowRows) lo = 256 - kCtxWindowRows;
  return lo;
}
TZ_HD uint32_t policy_ctx_row(uint32_t prev, uint32_t lo) {
  if (prev < lo) return 1;
  if (prev >= lo + kCtxWindowRows) return kCtxJointRows - 1;
  return 2 + prev - lo;
}
// The symbols present in any row of the joint histogram, ascending, into
// syms; returns their number.
TZ_HD uint32_t policy_joint_symbols(const uint64_t* joint, uint8_t* syms) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    uint64_t any = 0;
    for (uint32_t r = 0; r < kCtxJointRows; ++r) any |= joint[(size_t)r * 256 + s];
    if (any) syms[n++] = (uint8_t)s;
  }
  return n;
}
// Counts of context c of candidate (base, n) from the joint histogram.
TZ_HD void policy_ctx_counts(const uint64_t* joint, uint32_t lo, uint32_t base, uint32_t n, uint32_t c, uint64_t* out) {
  for (int s = 0; s < 256; ++s) out[s] = 0;
  for (uint32_t r = 0; r < kCtxJointRows; ++r) {
    uint32_t ctx;
    if (r == 0) ctx = 0;
    else if (r == 1) ctx = 0;  // predecessors below the window: <= base (base >= lo - 1)
    else if (r == kCtxJointRows - 1) ctx = n - 1;
    else ctx = rans_ctx_of(lo + r - 2, RansCtx{base, n});
    if (ctx != c) continue;
    for (int s = 0; s < 256; ++s) out[s] += joint[(size_t)r * 256 + s];
  }
}
// Best (base, n) by the entropy estimate (tables estimated), searched over n
// in 2..kMaxContexts and every base that keeps the rows below and above the
// window in the first and last context. Returns its estimated bits (16.16)
// and fills *best; tmp is 256-entry scratch.
//
// Every context of a candidate is a run of joint rows (policy_ctx_counts):
// context 0 rows 0..x, a middle context one row of the window, the last
// context rows x..kCtxJointRows-1. The estimate of each such run is taken
// once (rows added one at a time), and a candidate sums those of its
// contexts: the same integers as summing policy_ctx_counts per context.
TZ_HD unsigned __int128 policy_ctx_search(const uint64_t* joint, uint32_t lo, RansCtx* best, uint64_t* tmp) {
  constexpr uint32_t R = kCtxJointRows;
  unsigned __int128 first_runs[R], last_runs[R], single[R];  // [x]: rows 0..x, rows x..R-1, row x
  // Only the symbols present in some row take part (policy_joint_symbols):
  // sums and estimates over them are those over all 256.
  uint8_t syms[256];
  const uint32_t n_syms = policy_joint_symbols(joint, syms);
  auto estimate = [&](const uint64_t* c) {
    uint32_t present = 0;
    const unsigned __int128 e = entropy_bits_q16_at(c, syms, n_syms, &present);
    return e + ((unsigned __int128)(8 * policy_table_estimate(present)) << 16);
  };
  for (int s = 0; s < 256; ++s) tmp[s] = 0;
  for (uint32_t x = 0; x < R; ++x) {
    for (uint32_t j = 0; j < n_syms; ++j) tmp[syms[j]] += joint[(size_t)x * 256 + syms[j]];
    first_runs[x] = estimate(tmp);
  }
  for (int s = 0; s < 256; ++s) tmp[s] = 0;
  for (uint32_t x = R; x-- > 0;) {
    for (uint32_t j = 0; j < n_syms; ++j) tmp[syms[j]] += joint[(size_t)x * 256 + syms[j]];
    last_runs[x] = estimate(tmp);
  }
  for (uint32_t x = 2; x + 1 < R; ++x) single[x] = estimate(joint + (size_t)x * 256);
  unsigned __int128 best_bits = ~(unsigned __int128)0;
  *best = RansCtx{0, 1};
  for (uint32_t n = 2; n <= kMaxContexts; ++n) {
    const uint32_t b_lo = lo > 0 ? lo - 1 : 0;
    const uint32_t b_hi = lo + kCtxWindowRows + 1 - n;  // base + n - 1 <= lo + kCtxWindowRows
    for (uint32_t base = b_lo; base <= b_hi && base + n <= 256; ++base) {
      // Rows of context 0: up to the row of prev = base; of the last
      // context: from the row of prev = base + n - 1.
      const uint32_t x0 = base + 2 - lo;         // >= 1 (base >= lo - 1)
      const uint32_t xl = base + n + 1 - lo;     // <= R - 1
      unsigned __int128 bits = first_runs[x0 < R - 2 ? x0 : R - 2] + last_runs[xl];
      for (uint32_t c = 1; c + 1 < n; ++c) bits += single[base + c + 2 - lo];
      if (bits < best_bits) {
        best_bits = bits;
        *best = RansCtx{base, n};
      }
    }
  }
  return best_bits;
}
// Tables of lane contexts ctx (from policy_ctx_search) from the joint
// histogram over `counted` elements; with fast tables every symbol of
// stream 0's range (policy_range_has; null with exact tables) gets a
// pseudo-count in every context. Fills ctx.n x 256 frequencies and *coded
// (as policy_set_tables, one set).
TZ_HD bool policy_ctx_tables(const uint64_t* joint, uint32_t wlo, const RansCtx& ctx, bool fast, const uint8_t* range,
                             uint64_t counted, uint64_t n_elems, uint64_t n_blocks, uint32_t* freq, uint64_t* coded,
                             TableScratch* w) {
  uint64_t payload = 0;
  for (uint32_t c = 0; c < ctx.n; ++c) {
    policy_ctx_counts(joint, wlo, ctx.base, ctx.n, c, w->counts);
    policy_table_counts(w->counts, fast, range, w->tc);
    uint32_t* f = freq + (size_t)c * 256;
    if (rans_normalize_with(w->tc, f, w->norm) == 0) return false;
    payload += policy_payload_bytes(w->counts, f);
  }
  *coded = (uint64_t)((unsigned __int128)payload * n_elems / (counted ? counted : 1)) +
           n_blocks * (kRansStateBytes + 2) + stream_table_size_v3(kKindRansCtx, freq, ctx, 1);
  return true;
}

// The search on the first-pass joint histogram: true, with *best, when the
// best candidate's estimate (tables estimated) is at least 0.5% below one
// table's over the same elements (first: stream 0's first-pass histogram,
// the joint histogram's row sum). tmp is 256-entry scratch.
//
// Every candidate's contexts merge whole joint rows, so its estimate is at
// least the sum of the rows' own entropies (merging never lowers a code
// length; tables cost >= 0), less the fixed-point log2's error: each
// computed entropy lies within kLog2FastError units of 2^-16 bits per
// counted symbol of the true one (log2_q16_fast errs one way), so the two
// sums differ from theirs by at most twice that. Where that bound already
// misses the 0.5%, no candidate can pass and the search is skipped (the
// same answer, cheaper).
TZ_HD bool policy_ctx_promising(const uint64_t* joint, uint32_t wlo, const uint64_t* first, RansCtx* best,
                                uint64_t* tmp) {
  *best = RansCtx{0, 1};
  uint32_t present = 0;
  const unsigned __int128 plain =
      entropy_bits_q16(first, &present) + ((unsigned __int128)(8 * policy_table_estimate(present)) << 16);
  unsigned __int128 bound = 0, n = 0;
  uint8_t syms[256];
  const uint32_t n_syms = policy_joint_symbols(joint, syms);
  for (uint32_t r = 0; r < kCtxJointRows; ++r) bound += entropy_bits_q16_at(joint + (size_t)r * 256, syms, n_syms, nullptr);
  for (int s = 0; s < 256; ++s) n += first[s];
  const unsigned __int128 slack = 2 * (unsigned __int128)kLog2FastError * n;
  if (bound > slack && (bound - slack) * 1000 >= plain * 995) return false;
  const unsigned __int128 ctx_bits = policy_ctx_search(joint, wlo, best, tmp);
  if (best->n < 2) return false;
  return ctx_bits * 1000 < plain * 995;
}
// Whether stream 0 is searched for lane contexts on the window (v3, every
// level >= 1; level 3 then also tries the exhaustive CPU search, which
// replaces this choice only where it pays more). Level 1 searches frames
// with exact tables (not fast, policy_fast_tables) of at least
// kCtxMinBytesLevel1 bytes only: the search's cost is fixed per frame, and
// on smaller ones, and on fast tables' samples, it outweighs the gain.
constexpr uint64_t kCtxMinBytesLevel1 = 256 * 1024;
TZ_HD bool policy_tries_window_contexts(int level, uint8_t kind, uint64_t n_elems, uint32_t elem_size, bool fast) {
  return policy_v3(level) && kind == kKindRans && n_elems >= kCtxMinElems &&
         (level >= 2 || (!fast && n_elems * elem_size >= kCtxMinBytesLevel1));
}

}  // namespace tz
