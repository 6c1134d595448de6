#include "cpu/frame_tables.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>

#include "codec/fields.h"
#include "codec/frame_prefix.h"
#include "codec/policy_lane_ctx.h"
#include "codec/policy_raw_runs.h"
#include "codec/policy_stream.h"
#include "cpu/kernels.h"

namespace tz::cpu {

namespace {

// Histogram of stream k over elements [e0, e1), added to hist, by the
// kernel set of this CPU.
void histogram_stream(uint8_t dtype, int k, const uint8_t* src, uint64_t e0, uint64_t e1, uint64_t* hist) {
  codec_kernels().histogram(dtype, k, src + e0 * dtype_elem_size(dtype), (uint32_t)(e1 - e0), hist);
}

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
  // Payloads as coded_stream_bytes estimates them, lane states and block
  // words, and the stream's version-3 table entry (compact tables): the
  // same terms as the estimate plain_coded was computed with.
  uint64_t coded = (uint64_t)n_blocks * (kRansStateBytes + 2);
  for (uint32_t c = 0; c < best_n; ++c) {
    uint64_t counts[256] = {};
    ctx_counts(best_base, best_n, c, counts);
    uint32_t* f = ctx_freq->data() + 256 * c;
    if (rans_normalize(counts, f) == 0) return false;
    coded += coded_stream_bytes(counts, f, 0, 0) - 1;
  }
  coded += stream_table_size_v3(kKindRansCtx, ctx_freq->data(), *rc, 1);
  return lane_contexts_pay(coded, plain_coded);
}


// Joint counts of stream 0 over n symbols (row of the lane predecessor,
// policy_ctx_row with window lo; row 0 for a block's first step) added to
// J (kCtxJointRows x 256, u32: n < 2^32); the first skip symbols (0 or
// kLanes) are predecessors only. The rows are computed in chunks by
// clamping (vectorised), then counted into two tables taken in turn so that
// runs of equal pairs do not wait on one counter.
void joint_counts(const uint8_t* sym, uint32_t n, uint32_t skip, uint32_t lo, uint32_t (*J)[kCtxJointRows * 256]) {
  constexpr uint32_t kChunk = 1024;
  for (uint32_t i = skip; i < n && i < (uint32_t)kLanes; ++i) ++J[i & 1][sym[i]];
  alignas(64) uint16_t idx[kChunk];
  for (uint32_t i = kLanes; i < n; i += kChunk) {
    const uint32_t m = std::min(kChunk, n - i);
    const uint8_t* cur = sym + i;
    const uint8_t* prev = cur - kLanes;
    const int16_t base = (int16_t)(2 - (int)lo);
    for (uint32_t j = 0; j < m; ++j) {
      // policy_ctx_row: below the window 1, inside 2 + prev - lo, above it
      // kCtxJointRows - 1 (16-bit lanes: prev - lo + 2 lies in [-253, 257]).
      int16_t r = (int16_t)(prev[j] + base);
      r = r < 1 ? (int16_t)1 : r;
      r = r > (int16_t)(kCtxJointRows - 1) ? (int16_t)(kCtxJointRows - 1) : r;
      idx[j] = (uint16_t)((uint16_t)r << 8 | cur[j]);
    }
    uint32_t j = 0;
    for (; j + 2 <= m; j += 2) {
      ++J[0][idx[j]];
      ++J[1][idx[j + 1]];
    }
    if (j < m) ++J[0][idx[j]];
  }
}

constexpr size_t kJointSize = (size_t)kCtxJointRows * 256;

// Count tables stream0_joint_counts adds into: the AVX2 and AVX-512 paths
// one, the others two (joint_counts takes them in turn).
unsigned stream0_joint_tables() {
#if defined(__x86_64__)
  const SimdPath p = codec_kernels().path;
  if (p == SimdPath::kAvx2 || p == SimdPath::kAvx512) return 1;
#endif
  return 2;
}

// Joint counts of stream 0 of the n elements at src (joint_counts, window
// lo; the first skip elements, 0 or kLanes, predecessors only) added to the
// stream0_joint_tables() tables at J, and, if hist is not null, the
// per-symbol counts of the counted elements to hist. The AVX2 and AVX-512
// paths count from the elements directly (joint_counts_avx2, the same
// counts), others extract stream 0 into sym (n bytes) first.
void stream0_joint_counts(uint8_t dtype, const uint8_t* src, uint32_t n, uint32_t skip, uint32_t lo, uint8_t* sym,
                          uint32_t* J, uint32_t* hist) {
#if defined(__x86_64__)
  const SimdPath p = codec_kernels().path;
  if (p == SimdPath::kAvx2 || p == SimdPath::kAvx512) return joint_counts_avx2(dtype, src, n, skip, lo, J, hist);
#endif
  stream0_fields(dtype, src, n, sym);
  joint_counts(sym, n, skip, lo, reinterpret_cast<uint32_t(*)[kJointSize]>(J));
  if (hist)
    for (uint32_t i = skip; i < n; ++i) ++hist[sym[i]];
}

// Joint counts of stream 0 taken by the workers of a pool: each worker adds
// into its own u32 tables (stream0_joint_tables of them), moved to a u64 sum
// of its own only before they could overflow; sum_into adds everything to
// a total after the parallel loop.
class JointCounter {
 public:
  JointCounter(unsigned workers, uint32_t max_n)
      : tables_(stream0_joint_tables()),
        max_n_(tables_ > 1 ? max_n : 0),
        J_((size_t)workers * tables_ * kJointSize, 0),
        pending_(workers, 0),
        acc_(workers),
        syms_(tables_ > 1 ? new uint8_t[(size_t)workers * max_n_] : nullptr) {}
  // Worker w counts n elements at src (stream0_joint_counts).
  void count(unsigned w, uint8_t dtype, const uint8_t* src, uint32_t n, uint32_t skip, uint32_t lo, uint32_t* hist) {
    if (pending_[w] + n > UINT32_MAX) flush(w);
    pending_[w] += n;
    stream0_joint_counts(dtype, src, n, skip, lo, syms_.get() + (size_t)w * max_n_, tables(w), hist);
  }
  // Adds every count to joint (kJointSize entries).
  void sum_into(std::vector<uint64_t>* joint) {
    uint64_t* out = joint->data();
    for (unsigned w = 0; w < pending_.size(); ++w) {
      const uint32_t* J = tables(w);
      for (unsigned t = 0; t < tables_; ++t)
        for (size_t i = 0; i < kJointSize; ++i) out[i] += J[t * kJointSize + i];
      if (!acc_[w].empty())
        for (size_t i = 0; i < kJointSize; ++i) out[i] += acc_[w][i];
    }
  }

 private:
  uint32_t* tables(unsigned w) { return J_.data() + (size_t)w * tables_ * kJointSize; }
  void flush(unsigned w) {
    if (acc_[w].empty()) acc_[w].assign(kJointSize, 0);
    uint32_t* J = tables(w);
    for (unsigned t = 0; t < tables_; ++t)
      for (size_t i = 0; i < kJointSize; ++i) acc_[w][i] += J[t * kJointSize + i], J[t * kJointSize + i] = 0;
    pending_[w] = 0;
  }
  unsigned tables_;
  size_t max_n_;
  std::vector<uint32_t> J_;
  std::vector<uint64_t> pending_;
  std::vector<std::vector<uint64_t>> acc_;
  std::unique_ptr<uint8_t[]> syms_;  // stream 0 of a block per worker (two-table paths only)
};

// Per-block statistics of the tensor: histograms of every stream (u32, 256
// per stream per block) over the first `limit` elements of each block.
// With `first` (the first pass: the same blocks over the first
// first->counted[b] elements), those elements are not counted again: a
// block's histograms are first's plus the rest's. With a joint request,
// stream 0 is counted jointly instead (joint_counts, window lo): its block
// histograms are the joint rows' sums, and the joint counts of the counted
// elements are added to *joint.
struct BlockHists {
  uint32_t K = 0;
  std::vector<uint32_t> h;        // (b * K + k) * 256
  std::vector<uint64_t> counted;  // elements counted in block b
  const uint32_t* of(uint32_t b, int k) const { return h.data() + ((size_t)b * K + k) * 256; }
  size_t stride() const { return (size_t)K * 256; }
};
struct JointRequest {
  uint32_t lo = 0;
  std::vector<uint64_t>* joint = nullptr;  // kCtxJointRows x 256, receives the sum
};

void block_histograms(ThreadPool& pool, uint8_t dtype, const uint8_t* src, uint64_t n_elems, uint32_t block_elems,
                      uint32_t n_blocks, uint32_t limit, const bool* want, int K, BlockHists* out,
                      const BlockHists* first = nullptr, const JointRequest* jr = nullptr) {
  out->K = (uint32_t)K;
  out->h.assign((size_t)n_blocks * K * 256, 0);
  out->counted.assign(n_blocks, 0);
  const unsigned W = pool.size();
  const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
  const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
  const uint32_t es = dtype_elem_size(dtype);
  std::optional<JointCounter> jc;
  if (jr) jc.emplace(W, (uint32_t)std::min<uint64_t>(limit, block_elems));
  pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
    const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
    uint64_t hist[256];
    for (uint64_t b = t * per_task; b < b1; ++b) {
      const uint64_t e0 = b * block_elems;
      const uint64_t e1 = std::min<uint64_t>({n_elems, e0 + block_elems, e0 + limit});
      const uint64_t c0 = e0 + (first ? first->counted[b] : 0);  // elements before c0 counted in first
      out->counted[b] = e1 - e0;
      for (int k = 0; k < K; ++k) {
        if (!want[k]) continue;
        uint32_t* o = out->h.data() + ((size_t)b * K + k) * 256;
        if (first) std::copy(first->of((uint32_t)b, k), first->of((uint32_t)b, k) + 256, o);
        if (c0 >= e1) continue;
        if (k == 0 && jr) {
          // From c0 on, the lane predecessors of the first step after the first pass's elements included.
          const uint32_t skip = c0 > e0 ? (uint32_t)kLanes : 0;
          jc->count(w, dtype, src + (c0 - skip) * es, (uint32_t)(e1 - c0 + skip), skip, jr->lo, o);
          continue;
        }
        std::fill(hist, hist + 256, 0);
        histogram_stream(dtype, k, src, c0, e1, hist);
        for (int s = 0; s < 256; ++s) o[s] += (uint32_t)hist[s];
      }
    }
  });
  if (jr) jc->sum_into(jr->joint);
}

// Per-block ranges of the wanted streams (fast tables: kRangeBytes per
// block and stream, policy_range_of, over whole blocks).
void block_ranges(ThreadPool& pool, uint8_t dtype, const uint8_t* src, uint64_t n_elems, uint32_t block_elems,
                  uint32_t n_blocks, const bool* want, int K, std::vector<uint8_t>* mm) {
  mm->assign((size_t)n_blocks * kMaxStreams * kRangeBytes, 0);
  const uint32_t es = dtype_elem_size(dtype);
  const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (pool.size() * 4));
  const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
  const CodecKernels& kr = codec_kernels();
  pool.parallel_for(n_tasks, [&](size_t t, unsigned) {
    const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
    for (uint64_t b = t * per_task; b < b1; ++b) {
      const uint64_t e0 = b * block_elems, e1 = std::min<uint64_t>(n_elems, e0 + block_elems);
      for (int k = 0; k < K; ++k)
        if (want[k]) kr.minmax(dtype, k, src + e0 * es, (uint32_t)(e1 - e0), &(*mm)[(b * kMaxStreams + k) * kRangeBytes]);
    }
  });
}

// Joint histogram of stream 0 (joint_counts, window lo) over the first
// `limit` elements of every block, for the lane-context search.
void sample_joint_histogram(ThreadPool& pool, uint8_t dtype, const uint8_t* src, uint64_t n_elems,
                            uint32_t block_elems, uint32_t n_blocks, uint32_t limit, uint32_t lo,
                            std::vector<uint64_t>* joint) {
  const unsigned W = pool.size();
  const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
  const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
  const uint32_t es = dtype_elem_size(dtype);
  JointCounter jc(W, (uint32_t)std::min<uint64_t>(limit, block_elems));
  pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
    const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
    for (uint64_t b = t * per_task; b < b1; ++b) {
      const uint64_t e0 = b * block_elems;
      const uint32_t n = (uint32_t)(std::min<uint64_t>({n_elems, e0 + block_elems, e0 + limit}) - e0);
      jc.count(w, dtype, src + e0 * es, n, 0, lo, nullptr);
    }
  });
  joint->assign(kJointSize, 0);
  jc.sum_into(joint);
}

}  // namespace

void choose_tables(ThreadPool& pool, int level, uint8_t dtype, const uint8_t* src, uint64_t n_elems,
                   uint32_t block_elems, uint32_t n_blocks, TensorTables* out) {
  const int K = dtype_stream_count(dtype);
  *out = TensorTables{};
  // 1. First pass: per-block histograms of every stream over the sample (or
  //    whole blocks), the screening of codec/policy.h.
  const bool sampled = policy_sampled(block_elems);
  bool all[kMaxStreams] = {true, true, true, true};
  BlockHists first;
  block_histograms(pool, dtype, src, n_elems, block_elems, n_blocks, policy_first_pass_elems(block_elems), all, K,
                   &first);
  uint64_t tot[kMaxStreams][256] = {};
  uint64_t counted_all = 0;
  for (uint32_t b = 0; b < n_blocks; ++b) {
    counted_all += first.counted[b];
    for (int k = 0; k < K; ++k)
      for (int s = 0; s < 256; ++s) tot[k][s] += first.of(b, k)[s];
  }
  bool want[kMaxStreams] = {};
  int n_wanted = 0;
  uint64_t norm[256];
  for (int k = 0; k < K; ++k) {
    uint32_t f[256];
    want[k] = !sampled || policy_sample_wants(level, tot[k], f, norm);
    for (uint32_t b = 0; !want[k] && policy_tries_raw_runs(level, n_blocks) && b < n_blocks; ++b)
      want[k] = policy_block_pays_alone(first.of(b, k));
    n_wanted += want[k];
  }
  if (!n_wanted) return;
  // 2. The counts tables are built from: fast tables (level 1, many blocks)
  //    keep the sample and add per-block ranges (block_ranges);
  //    otherwise exact per-block
  //    histograms (a second pass when sampled).
  const bool fast = policy_fast_tables(block_elems, level, n_blocks);
  // Lane contexts of stream 0 are searched on the first-pass elements'
  // joint histogram (policy_ctx_promising) wherever stream 0 may end up
  // rANS coded (step 4 uses the result only then). Where that search is
  // promising and the tables are exact, the exact pass counts stream 0
  // jointly, so that its block histograms and the exact joint histogram
  // come from one pass.
  const bool ctx_tried = want[0] && policy_tries_window_contexts(level, kKindRans, n_elems, dtype_elem_size(dtype), fast);
  const uint32_t wlo = policy_ctx_window(tot[0]);
  std::vector<uint64_t> joint;
  RansCtx rc;
  bool ctx_promising = false;
  if (ctx_tried) {
    sample_joint_histogram(pool, dtype, src, n_elems, block_elems, n_blocks, policy_first_pass_elems(block_elems),
                           wlo, &joint);
    ctx_promising = policy_ctx_promising(joint.data(), wlo, tot[0], &rc, norm);
  }
  BlockHists exact;
  std::vector<uint8_t> mm;
  if (fast) {
    block_ranges(pool, dtype, src, n_elems, block_elems, n_blocks, want, K, &mm);
  } else if (sampled) {
    // The first pass's elements are not counted again: their histograms
    // are first's, their joint counts already in joint (the same window).
    const JointRequest jr{wlo, &joint};
    block_histograms(pool, dtype, src, n_elems, block_elems, n_blocks, block_elems, want, K, &exact, &first,
                     ctx_promising ? &jr : nullptr);
  }
  const BlockHists& H = (fast || !sampled) ? first : exact;
  uint64_t counted = 0;
  for (uint32_t b = 0; b < n_blocks; ++b) counted += H.counted[b];

  // 3. Per wanted stream: raw, one table or table sets
  //    (policy_decide_stream, as the CUDA encoder decides).
  SegScratch seg;
  TableScratch tsc;
  uint64_t stream_coded[kMaxStreams] = {};
  const uint32_t max_sets = policy_max_sets(n_blocks, n_wanted, level);
  // Scratch the decision fills before it reads (never zero-filled).
  const std::unique_ptr<uint32_t[]> freq1(new uint32_t[256]),
      freqN(new uint32_t[(size_t)std::max<uint32_t>(max_sets, 1) * 256]);
  const std::unique_ptr<uint8_t[]> set_of(new uint8_t[n_blocks]);
  for (int k = 0; k < K; ++k) {
    if (!want[k]) continue;
    const StreamChoice c = policy_decide_stream(
        level, H.of(0, k), H.stride(), H.counted.data(), counted, n_blocks, block_elems, n_elems, max_sets, fast,
        fast ? mm.data() + kRangeBytes * k : nullptr, kRangeBytes * kMaxStreams, freq1.get(), freqN.get(),
        set_of.get(), &seg, &tsc);
    if (c.kind != kKindRans) continue;
    StreamTables& st = out->s[k];
    st.kind = kKindRans;
    st.n_sets = c.n_sets;
    if (c.use_sets) {
      st.freq.assign(freqN.get(), freqN.get() + (size_t)c.n_sets * 256);
      st.block_set.assign(set_of.get(), set_of.get() + n_blocks);
    } else {
      st.freq.assign(freq1.get(), freq1.get() + 256);
    }
    stream_coded[k] = c.coded;
  }

  // 4. Lane contexts of stream 0: searched on the first-pass elements;
  //    tables from the same elements with fast tables, else exact.
  StreamTables& s0 = out->s[0];
  if (policy_tries_window_contexts(level, s0.kind, n_elems, dtype_elem_size(dtype), fast) && ctx_promising) {
    uint8_t range[kRangeBytes];
    policy_range_empty(range);
    if (fast)
      for (uint32_t b = 0; b < n_blocks; ++b) policy_range_merge(range, &mm[(size_t)b * kMaxStreams * kRangeBytes]);
    StreamTables cs;
    cs.kind = kKindRansCtx;
    cs.ctx = rc;
    cs.freq.assign((size_t)rc.n * 256, 0);
    uint64_t coded = 0;
    if (policy_ctx_tables(joint.data(), wlo, rc, fast, range, counted, n_elems, n_blocks, cs.freq.data(), &coded,
                          &tsc) &&
        lane_contexts_pay(coded, stream_coded[0])) {
      s0 = cs;
      stream_coded[0] = coded;
    }
  }
  // Level 3: the exhaustive search over exact joint histograms.
  if (policy_tries_lane_contexts(level, 0, s0.kind, n_elems)) {
    RansCtx rc;
    std::vector<uint32_t> cf;
    if (choose_lane_contexts(pool, dtype, src, n_elems, block_elems, n_blocks, stream_coded[0], &rc, &cf)) {
      s0 = StreamTables{};
      s0.kind = kKindRansCtx;
      s0.ctx = rc;
      s0.freq = cf;
    }
  }
  bool any = false;
  for (int k = 0; k < K; ++k) any |= kind_is_rans(out->s[k].kind);
  out->version = any ? kFormatVersionSets : kFormatVersion;
}

void write_table_section(const TensorTables& t, int K, std::vector<uint8_t>* out) {
  std::vector<uint8_t>& tables = *out;
  tables.clear();
  for (int k = 0; k < K; ++k) {
    const StreamTables& st = t.s[k];
    const size_t at = tables.size();
    const size_t nt = kind_is_rans(st.kind) ? (size_t)st.n_sets * st.ctx.n : 0;
    tables.resize(at + 4 + nt * std::max(kFreqTableMaxBytes, kCompactTableMaxBytes));
    const size_t n = t.version >= kFormatVersionSets
                         ? write_stream_table_v3(st.kind, st.freq.data(), st.ctx, st.n_sets, tables.data() + at)
                         : write_stream_table(st.kind, st.freq.data(), st.ctx, tables.data() + at);
    tables.resize(at + n);
  }
  tables.resize(align4(tables.size()), 0);
}

}  // namespace tz::cpu
