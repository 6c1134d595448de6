#include "cpu/frame_tables.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <unordered_map>

#include "cpu/kernels.h"

namespace tz::cpu {

namespace {

// Lane contexts for stream 0 (the exponent-carrying field) at level 3
// (doc/format.md 5.5): symbol i is coded with table ctx_of(symbol i - 32).
// Takes the joint histogram of (previous symbol of the lane, symbol), then
// searches base and number of contexts with an entropy estimate and keeps
// the best candidate only if its exact coded size (tables included) beats
// the single table's by at least 0.5% of the stream (every context costs
// decode-time cache). On success fills *rc and ctx_freq (rc->n tables).
// When it is tried and what it must gain: policy_tries_lane_contexts and
// lane_contexts_pay (codec/policy.h).

// Stream 0 of n elements (what split_fields writes to streams[0]), by the
// same per-element rule as the histograms (field_byte).
template <uint8_t DT>
void stream0_t(const uint8_t* src, uint32_t n, uint8_t* __restrict out) {
  for (uint32_t i = 0; i < n; ++i) out[i] = field_byte(DT, src, i, 0);
}
void stream0_fields(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* out) {
  switch (dtype) {
    case kBF16: return stream0_t<kBF16>(src, n, out);
    case kF16: return stream0_t<kF16>(src, n, out);
    case kF32: return stream0_t<kF32>(src, n, out);
    default: return stream0_t<kF8E4M3>(src, n, out);
  }
}

double entropy_bytes(const uint64_t* counts, const int* syms, int n_syms) {
  double total = 0, acc = 0;
  for (int j = 0; j < n_syms; ++j) {
    const double c = (double)counts[syms[j]];
    if (c > 0) acc += c * std::log2(c);
    total += c;
  }
  return total > 0 ? (total * std::log2(total) - acc) / 8.0 : 0.0;
}

bool choose_lane_contexts(ThreadPool& pool, uint8_t dtype, const uint8_t* src, uint64_t n_elems, uint32_t block_elems,
                          uint32_t n_blocks, uint64_t plain_coded, RansCtx* rc, std::vector<uint32_t>* ctx_freq) {
  constexpr int kRows = 257;  // previous symbol 0..255; row 256: first step of a block (context 0)
  const unsigned W = pool.size();
  std::vector<uint64_t> joint((size_t)W * kRows * 256, 0);
  const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
  const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
  pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
    uint64_t* J = joint.data() + (size_t)w * kRows * 256;
    const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
    const size_t es = dtype_elem_size(dtype);
    std::vector<uint8_t> buf(align4(block_elems));
    uint8_t* const sym = buf.data();
    for (uint64_t b = t * per_task; b < b1; ++b) {
      const uint64_t e0 = b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + block_elems);
      const uint32_t nb = (uint32_t)(e1 - e0);
      stream0_fields(dtype, src + e0 * es, nb, sym);
      const size_t n = nb;
      for (size_t i = 0; i < n && i < (size_t)kLanes; ++i) ++J[256 * 256 + sym[i]];
      for (size_t i = kLanes; i < n; ++i) ++J[(size_t)sym[i - kLanes] * 256 + sym[i]];
    }
  });
  for (unsigned w = 1; w < W; ++w)
    for (size_t i = 0; i < (size_t)kRows * 256; ++i) joint[i] += joint[(size_t)w * kRows * 256 + i];
  // Present symbols, and prefix sums over rows 0..255: P[r][s] = sum of rows < r.
  int syms[256], n_syms = 0;
  uint64_t row_mass[256] = {};
  {
    uint64_t col[256] = {};  // row by row: the table is 0.5 MiB, columns would miss the cache
    for (int r = 0; r <= 256; ++r)
      for (int sy = 0; sy < 256; ++sy) col[sy] += joint[(size_t)r * 256 + sy];
    for (int sy = 0; sy < 256; ++sy)
      if (col[sy]) syms[n_syms++] = sy;
  }
  for (int r = 0; r < 256; ++r)
    for (int j = 0; j < n_syms; ++j) row_mass[r] += joint[(size_t)r * 256 + syms[j]];
  if (n_syms < 2) return false;
  std::vector<uint64_t> P((size_t)257 * 256, 0);
  for (int r = 0; r < 256; ++r)
    for (int j = 0; j < n_syms; ++j)
      P[(size_t)(r + 1) * 256 + syms[j]] = P[(size_t)r * 256 + syms[j]] + joint[(size_t)r * 256 + syms[j]];
  // Counts of context c for (base, nc): rows [lo, hi) plus, for context 0, the first-step row.
  auto ctx_counts = [&](uint32_t base, uint32_t nc, uint32_t c, uint64_t* out) {
    const uint32_t lo = c == 0 ? 0 : base + c, hi = c == 0 ? base + 1 : (c == nc - 1 ? 256 : base + c + 1);
    for (int j = 0; j < n_syms; ++j) {
      const int sy = syms[j];
      out[sy] = P[(size_t)std::min<uint32_t>(hi, 256) * 256 + sy] - P[(size_t)std::min<uint32_t>(lo, 256) * 256 + sy] +
                (c == 0 ? joint[256 * 256 + sy] : 0);
    }
  };
  // Candidate bases: previous-symbol values holding at least 0.1% of the mass.
  uint64_t mass = 0;
  for (int r = 0; r < 256; ++r) mass += row_mass[r];
  int rlo = 256, rhi = -1;
  for (int r = 0; r < 256; ++r)
    if (row_mass[r] * 1000 >= mass && row_mass[r] > 0) rlo = std::min(rlo, r), rhi = std::max(rhi, r);
  if (rhi < 0) return false;
  double best = 1e300;
  uint32_t best_base = 0, best_n = 1;
  uint64_t cnt[256] = {};
  // A context's estimate depends only on its row range (and, for context
  // 0, the first-step row): the candidates share most of them, so each is
  // computed once (the same value every time, so the choice is unchanged).
  struct Part {
    double est;
    bool ok;
  };
  std::unordered_map<uint32_t, Part> memo;
  auto part = [&](uint32_t base, uint32_t nc, uint32_t c) {
    const uint32_t lo = c == 0 ? 0 : base + c, hi = c == 0 ? base + 1 : (c == nc - 1 ? 256 : base + c + 1);
    const uint32_t key = lo | hi << 9 | (c == 0 ? 1u : 0u) << 18;
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    ctx_counts(base, nc, c, cnt);
    uint64_t tot = 0;
    int present = 0;
    for (int j = 0; j < n_syms; ++j) tot += cnt[syms[j]], present += cnt[syms[j]] != 0;
    const Part r{entropy_bytes(cnt, syms, n_syms) + 32 + 1.5 * present, tot > 0};
    memo.emplace(key, r);
    return r;
  };
  for (uint32_t nc = 2; nc <= kMaxContexts; ++nc) {
    for (int b = std::max(0, rlo - 1); b <= rhi && b + (int)nc - 1 <= 255; ++b) {
      double est = 2;
      bool ok = true;
      for (uint32_t c = 0; c < nc && ok; ++c) {
        const Part pc = part((uint32_t)b, nc, c);
        ok = pc.ok;
        est += pc.est;
      }
      if (ok && est < best) best = est, best_base = (uint32_t)b, best_n = nc;
    }
  }
  if (best_n < 2) return false;
  // Exact size of the best candidate with normalised tables.
  rc->base = best_base;
  rc->n = best_n;
  ctx_freq->assign((size_t)best_n * 256, 0);
  uint64_t coded = 2 + (uint64_t)n_blocks * (kRansStateBytes + 2) + 1;
  for (uint32_t c = 0; c < best_n; ++c) {
    uint64_t counts[256] = {};
    ctx_counts(best_base, best_n, c, counts);
    uint32_t* f = ctx_freq->data() + 256 * c;
    if (rans_normalize(counts, f) == 0) return false;
    uint8_t tbuf[kFreqTableMaxBytes];
    coded += coded_stream_bytes(counts, f, 0, rans_write_table(f, tbuf)) - 2;
  }
  return lane_contexts_pay(coded, plain_coded);
}

}  // namespace

void choose_tables(ThreadPool& pool, int level, uint8_t dtype, const uint8_t* src, uint64_t n_elems,
                   uint32_t block_elems, uint32_t n_blocks, TensorTables* out) {
  const uint32_t es = dtype_elem_size(dtype);
  const int K = dtype_stream_count(dtype);
  const CodecKernels& kr = codec_kernels();
  // The policy of codec/policy.h (shared with the CUDA encoder):
  // 1. A deterministic sample (the first kSampleElems elements of every
  //    block) screens out streams that cannot pay, e.g. low mantissa
  //    bytes, so their full histogram is never taken.
  // 2. Fast tables (level 1) or full histograms of the remaining streams
  //    decide for real.
  const unsigned W = pool.size();
  // Per worker and stream; a pass clears (and later reads) only the rows of
  // the streams it counts.
  std::unique_ptr<uint64_t[]> hist(new uint64_t[(size_t)W * kMaxStreams * 256]);
  auto histogram_pass = [&](const bool* want, uint32_t limit) {
    for (unsigned w = 0; w < W; ++w)
      for (int k = 0; k < K; ++k)
        if (want[k]) std::fill_n(&hist[((size_t)w * kMaxStreams + k) * 256], 256, 0);
    const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
    const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
    pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
      const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
      for (uint64_t b = t * per_task; b < b1; ++b) {
        const uint64_t e0 = b * block_elems;
        const uint64_t e1 = std::min<uint64_t>({n_elems, e0 + block_elems, e0 + limit});
        for (int k = 0; k < K; ++k)
          if (want[k])
            kr.histogram(dtype, k, src + e0 * es, (uint32_t)(e1 - e0), &hist[((size_t)w * kMaxStreams + k) * 256]);
      }
    });
  };
  auto merged = [&](int k, uint64_t* counts, uint64_t* total) {
    *total = 0;
    for (int s = 0; s < 256; ++s) {
      counts[s] = 0;
      for (unsigned w = 0; w < W; ++w) counts[s] += hist[((size_t)w * kMaxStreams + k) * 256 + s];
      *total += counts[s];
    }
  };
  bool want[kMaxStreams] = {};
  bool any = false;
  uint64_t norm[256];  // policy scratch
  const bool sampled = policy_sampled(block_elems) && !policy_sample_is_whole(block_elems, n_elems);
  for (int k = 0; k < K; ++k) want[k] = true;
  if (sampled) {
    histogram_pass(want, policy_first_pass_elems(block_elems));
    for (int k = 0; k < K; ++k) {
      uint64_t counts[256], total;
      merged(k, counts, &total);
      uint32_t f[256];
      want[k] = policy_sample_wants(level, counts, f, norm);
      any |= want[k];
    }
  } else {
    any = true;
  }
  // Level 1 on tensors of many blocks: frequencies from the sample, and
  // every symbol between the stream's minimum and maximum (one cheap
  // vectorised pass) kept codable with a pseudo-count. This replaces the
  // full histogram, the largest cost of compression after coding itself,
  // for a ratio loss measured below 0.05% on real checkpoints. Levels >= 2
  // take exact histograms.
  const bool fast_tables = policy_fast_tables(block_elems, level, n_blocks);
  if (any && fast_tables) {
    uint8_t lo[kMaxStreams], hi[kMaxStreams];
    std::vector<uint8_t> mm((size_t)n_blocks * kMaxStreams * 2);
    const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (pool.size() * 4));
    const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
    pool.parallel_for(n_tasks, [&](size_t t, unsigned) {
      const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
      for (uint64_t b = t * per_task; b < b1; ++b) {
        const uint64_t e0 = b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + block_elems);
        for (int k = 0; k < K; ++k)
          if (want[k]) {
            uint8_t* r = &mm[(b * kMaxStreams + k) * 2];
            kr.minmax(dtype, k, src + e0 * es, (uint32_t)(e1 - e0), &r[0], &r[1]);
          }
      }
    });
    for (int k = 0; k < K; ++k) {
      if (!want[k]) continue;
      lo[k] = 255;
      hi[k] = 0;
      for (uint64_t b = 0; b < n_blocks; ++b) {
        lo[k] = std::min(lo[k], mm[(b * kMaxStreams + k) * 2]);
        hi[k] = std::max(hi[k], mm[(b * kMaxStreams + k) * 2 + 1]);
      }
      uint64_t sample[256], total;
      merged(k, sample, &total);
      uint64_t counts[256];
      out->kind[k] = policy_fast_kind(level, sample, lo[k], hi[k], n_elems, n_blocks, out->freq[k], counts, norm);
    }
  } else if (any) {  // exact histograms: unsampled, or the second pass
    histogram_pass(want, block_elems);
    for (int k = 0; k < K; ++k) {
      if (!want[k]) continue;
      uint64_t counts[256], total, coded = 0;
      merged(k, counts, &total);
      out->kind[k] = policy_exact_kind(level, counts, n_elems, n_blocks, out->freq[k], norm, &coded);
      if (policy_tries_lane_contexts(level, k, out->kind[k], n_elems) &&
          choose_lane_contexts(pool, dtype, src, n_elems, block_elems, n_blocks, coded, &out->ctx0, &out->ctx_freq0))
        out->kind[0] = kKindRansCtx;
    }
  }
}

}  // namespace tz::cpu
