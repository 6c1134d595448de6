#include "cpu/frame.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <bit>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "codec/checksum.h"
#include "codec/policy.h"
#include "cpu/checksum_cpu.h"
#include "cpu/kernels.h"
#include "cpu/ordered_pipeline.h"

static_assert(std::endian::native == std::endian::little, "tensorzip assumes a little-endian host");

namespace tz::cpu {

namespace {
thread_local std::string g_detail;

const char* status_text(int st) {
  switch (st) {
    case kErrCorruptBlock: return "corrupt block data";
    case kErrChecksum: return "checksum mismatch";
    case kErrUnsupported: return "unsupported stream mode";
    default: return "error";
  }
}
}  // namespace

size_t make_error(int code, std::string detail) {
  g_detail = std::move(detail);
  return (size_t)-(ptrdiff_t)code;
}
const std::string& last_error_detail() { return g_detail; }

namespace {
// CRC32C state update for frame_header_crc (codec/frame_prefix.h).
struct CpuCrc32c {
  uint32_t operator()(uint32_t state, const uint8_t* p, size_t n) const { return crc32c_update(state, p, n); }
};
}  // namespace

struct Context {
  explicit Context(unsigned threads)
      : pool(threads), scratch(pool.size()), out(2 * pool.size()), cctx(pool.size()), dctx(pool.size()) {}
  ~Context() {
    for (auto* c : cctx) ZSTD_freeCCtx(c);
    for (auto* d : dctx) ZSTD_freeDCtx(d);
  }
  uint8_t* worker_scratch(unsigned w, size_t bytes) {
    if (scratch[w].size() < bytes) scratch[w].resize(bytes);
    return scratch[w].data();
  }
  // Output buffer of compress_frame's pipeline slot s (s < 2 x threads).
  uint8_t* slot_out(size_t s, size_t bytes) {
    if (out[s].size() < bytes) out[s].resize(bytes);
    return out[s].data();
  }
  ThreadPool pool;
  std::vector<std::vector<uint8_t>> scratch;
  std::vector<std::vector<uint8_t>> out;
  std::vector<ZSTD_CCtx*> cctx;
  std::vector<ZSTD_DCtx*> dctx;
};

ContextPtr make_context(unsigned threads) { return ContextPtr(new Context(threads)); }
void ContextDeleter::operator()(Context* c) const { delete c; }
unsigned context_threads(const Context& c) { return c.pool.size(); }

size_t compress_bound(size_t n) {
  // Every block raw: header (<= 20 B), <= 3 B padding per stream, a 4 B index
  // entry; blocks hold >= kMinBlockElems bytes.
  const size_t max_blocks = n / kMinBlockElems + 1;
  const size_t tables = kMaxTablesSize;
  return kFrameHeaderSize + tables + max_blocks * (4 + block_header_size(kMaxStreams) + 3 * kMaxStreams) + n;
}

namespace {

int zstd_level_for(int level) {
  if (level >= 3) return 19;
  if (level == 2) return 9;
  return 3;
}

// Generic (TZ_DTYPE_BYTES) block: one stream, zstd or raw.
size_t encode_bytes_block(ZSTD_CCtx* cctx, int zlevel, uint8_t kind, const uint8_t* src, uint32_t n,
                          uint32_t checksum, uint8_t* out) {
  store_le32(out, checksum);
  const size_t hdr = block_header_size(1);
  size_t size = 0;
  uint8_t mode = kModeRaw;
  if (kind == kKindZstd && n > 0) {
    const size_t z = ZSTD_compressCCtx(cctx, out + hdr, n - 1, src, n, zlevel);
    if (!ZSTD_isError(z)) {
      size = z;
      mode = kModeZstd;
    }
  }
  if (mode == kModeRaw) {
    memcpy(out + hdr, src, n);
    size = n;
  }
  store_le32(out + 4, stream_word((uint32_t)size, mode));
  const size_t padded = align4(size);
  memset(out + hdr + size, 0, padded - size);
  return hdr + padded;
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

bool choose_lane_contexts(Context& ctx, uint8_t dtype, const uint8_t* src, uint64_t n_elems, uint32_t block_elems,
                          uint32_t n_blocks, uint64_t plain_coded, RansCtx* rc, std::vector<uint32_t>* ctx_freq) {
  constexpr int kRows = 257;  // previous symbol 0..255; row 256: first step of a block (context 0)
  const unsigned W = ctx.pool.size();
  std::vector<uint64_t> joint((size_t)W * kRows * 256, 0);
  const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
  const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
  ctx.pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
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

// The stream coder of encode_block_with, through the kernel table.
struct KernelCoder {
  const CodecKernels* kr;
  const BlockEncTables* et;
  const uint32_t* const* freq_start;  // per stream, ctx.n tables of 256 (kernels.h EncTables)
  void split(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    kr->split(dtype, src, n, streams);
  }
  size_t operator()(int k, const uint8_t* sym, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return kr->rans_encode(sym, n, EncTables{et->enc[k], freq_start[k]}, et->ctx[k], words, out, limit);
  }
};

// Encoder tables of a frame's streams (rANS symbols and cumulative starts),
// built only for the coded streams: an all-raw frame allocates nothing.
struct FrameEncTables {
  BlockEncTables et{};
  const uint32_t* fst_of[kMaxStreams] = {};
  std::vector<RansEncSym> enc, enc_ctx0;
  std::vector<uint32_t> fst, fst_ctx0;
  FrameEncTables(int K, const uint8_t* kind, const uint32_t (*freq)[256], const RansCtx& rctx0,
                 const uint32_t* ctx_freq0) {
    int n_rans = 0;
    for (int k = 0; k < K; ++k) n_rans += kind[k] == kKindRans;
    enc.resize((size_t)n_rans * 256);
    fst.resize((size_t)n_rans * 256);
    int next_rans = 0;
    for (int k = 0; k < K; ++k) {
      et.kind[k] = kind[k];
      if (kind[k] == kKindRans) {
        const size_t at = (size_t)next_rans++ * 256;
        rans_build_enc(freq[k], enc.data() + at);
        et.enc[k] = enc.data() + at;
        build_freq_start(freq[k], fst.data() + at);
        fst_of[k] = fst.data() + at;
      } else if (kind[k] == kKindRansCtx) {
        enc_ctx0.resize((size_t)rctx0.n * 256);
        fst_ctx0.resize((size_t)rctx0.n * 256);
        for (uint32_t c = 0; c < rctx0.n; ++c) {
          rans_build_enc(ctx_freq0 + 256 * c, enc_ctx0.data() + 256 * c);
          build_freq_start(ctx_freq0 + 256 * c, fst_ctx0.data() + 256 * c);
        }
        et.enc[k] = enc_ctx0.data();
        et.ctx[k] = rctx0;
        fst_of[k] = fst_ctx0.data();
      }
    }
  }
  FrameEncTables(const FrameEncTables&) = delete;
  FrameEncTables& operator=(const FrameEncTables&) = delete;
};

}  // namespace

size_t compress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, const tz_params& p) {
  if (!src && n) return make_error(kErrBadParam, "source is null");
  // Read the enum's storage as an int: a C caller may pass any value, and
  // an out-of-range enum value is undefined behaviour in C++.
  int dt_in;
  static_assert(sizeof(dt_in) == sizeof(p.dtype));
  memcpy(&dt_in, &p.dtype, sizeof dt_in);
  if (dt_in < 0 || dt_in >= kDTypeCount) return make_error(kErrBadParam, "unknown dtype " + std::to_string(dt_in));
  if (!encode_level_valid(p.level)) return make_error(kErrBadParam, "level must be in [-1, 3]");
  const int level = policy_level(p.level);
  const uint8_t dtype = encode_dtype((uint8_t)dt_in, n);  // odd-sized data: generic path
  const uint32_t es = dtype_elem_size(dtype);
  const uint32_t block_elems = policy_block_elems(p.block_elems, dtype);
  if (!block_elems_valid(block_elems))
    return make_error(kErrBadParam, "block_elems must be a power of two in [4096, 1048576]");
  if (!encode_size_valid(n)) return make_error(kErrBadParam, "input larger than 2^56 bytes");
  const uint64_t n_elems = n / es;
  uint32_t n_blocks = 0;
  if (!encode_block_count(n_elems, block_elems, &n_blocks))
    return make_error(kErrBadParam, "too many blocks: raise block_elems");
  const int K = dtype_stream_count(dtype);

  const CodecKernels& kr = codec_kernels();

  // Tensor-level stream kinds and tables.
  // freq[k] is written by the policy for every rANS stream and read for no
  // other stream, so it is not cleared (4 KiB a frame).
  uint8_t kind[kMaxStreams] = {};
  uint32_t freq[kMaxStreams][256];
  RansCtx rctx0{};                  // lane contexts of stream 0 (kind kKindRansCtx)
  std::vector<uint32_t> ctx_freq0;  // rctx0.n tables of 256
  if (dtype == kBytes) {
    kind[0] = policy_bytes_kind(level);
  } else if (policy_codes_streams(level, dtype, n_elems, n_blocks)) {
    // The policy of codec/policy.h (shared with the CUDA encoder):
    // 1. A deterministic sample (the first kSampleElems elements of every
    //    block) screens out streams that cannot pay, e.g. low mantissa
    //    bytes, so their full histogram is never taken.
    // 2. Fast tables (level 1) or full histograms of the remaining streams
    //    decide for real.
    const unsigned W = ctx.pool.size();
    std::vector<uint64_t> hist((size_t)W * kMaxStreams * 256);
    auto histogram_pass = [&](const bool* want, uint32_t limit) {
      std::fill(hist.begin(), hist.end(), 0);
      const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (W * 4));
      const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
      ctx.pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
        const uint64_t b1 = std::min<uint64_t>(n_blocks, (t + 1) * per_task);
        for (uint64_t b = t * per_task; b < b1; ++b) {
          const uint64_t e0 = b * block_elems;
          const uint64_t e1 = std::min<uint64_t>({n_elems, e0 + block_elems, e0 + limit});
          for (int k = 0; k < K; ++k)
            if (want[k])
              kr.histogram(dtype, k, src + e0 * es, (uint32_t)(e1 - e0), hist.data() + ((size_t)w * kMaxStreams + k) * 256);
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
    const bool sampled = policy_sampled(block_elems);
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
      const uint64_t per_task = std::max<uint64_t>(1, n_blocks / (ctx.pool.size() * 4));
      const size_t n_tasks = (size_t)((n_blocks + per_task - 1) / per_task);
      ctx.pool.parallel_for(n_tasks, [&](size_t t, unsigned) {
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
        kind[k] = policy_fast_kind(level, sample, lo[k], hi[k], n_elems, n_blocks, freq[k], counts, norm);
      }
    } else if (any) {  // exact histograms: unsampled, or the second pass
      histogram_pass(want, block_elems);
      for (int k = 0; k < K; ++k) {
        if (!want[k]) continue;
        uint64_t counts[256], total, coded = 0;
        merged(k, counts, &total);
        kind[k] = policy_exact_kind(level, counts, n_elems, n_blocks, freq[k], norm, &coded);
        if (policy_tries_lane_contexts(level, k, kind[k], n_elems) &&
            choose_lane_contexts(ctx, dtype, src, n_elems, block_elems, n_blocks, coded, &rctx0, &ctx_freq0))
          kind[0] = kKindRansCtx;
      }
    }
  }
  // The table section goes straight into dst once its size is known.
  const uint32_t* table_freq[kMaxStreams];
  RansCtx table_ctx[kMaxStreams];
  size_t tables_bytes = 0;
  for (int k = 0; k < K; ++k) {
    table_freq[k] = kind[k] == kKindRansCtx ? ctx_freq0.data() : freq[k];
    table_ctx[k] = kind[k] == kKindRansCtx ? rctx0 : RansCtx{};
    tables_bytes += stream_table_size(kind[k], table_freq[k], table_ctx[k]);
  }
  const size_t tables_padded = align4(tables_bytes);

  const uint64_t prefix = kFrameHeaderSize + tables_padded + 4ull * n_blocks;
  if (!dst && cap) return make_error(kErrBadParam, "destination is null");
  if (cap < prefix) return make_error(kErrDstTooSmall, "destination too small for the frame header");
  {
    uint8_t* t = dst + kFrameHeaderSize;
    for (int k = 0; k < K; ++k) t += write_stream_table(kind[k], table_freq[k], table_ctx[k], t);
    memset(t, 0, tables_padded - tables_bytes);
  }

  const FrameEncTables enc(K, kind, freq, rctx0, ctx_freq0.data());
  const BlockEncTables& et = enc.et;
  const uint32_t* const* fst_of = enc.fst_of;
  const KernelCoder coder{&kr, &et, fst_of};
  bool any_ctx = false;
  for (int k = 0; k < K; ++k) any_ctx |= kind[k] == kKindRansCtx;

  // Blocks: tasks are runs of blocks, the items of an ordered pipeline
  // (cpu/ordered_pipeline.h) on the context's threads. A run is encoded into
  // its slot's buffer, and commit, in run order, copies it to its final
  // offset. Memory stays bounded (2 runs per thread), and the output never
  // depends on the number of workers.
  const uint32_t per_task = std::max<uint32_t>(1, std::min<uint32_t>(16, n_blocks / (ctx.pool.size() * 8)));
  const size_t n_tasks = (n_blocks + per_task - 1) / per_task;
  std::vector<uint32_t> sizes(n_blocks);
  const size_t bbound = block_bound(block_elems, K);
  const size_t scratch_bytes = block_scratch_size((uint32_t)std::min<uint64_t>(block_elems, n_elems), K);
  const int zlevel = zstd_level_for(level);
  uint64_t next_off = prefix;  // advanced by commit, in run order
  bool overflow = false;       // likewise
  const size_t window = 2 * (size_t)ctx.pool.size();
  std::vector<size_t> run_bytes(window);
  std::vector<char> run_in_place(window);
  OrderedPipeline* runs = nullptr;
  OrderedPipeline::Stages stages;
  stages.work = [&](size_t t, size_t slot, unsigned w) {
    const uint32_t b0 = (uint32_t)(t * per_task), b1 = std::min<uint32_t>(n_blocks, b0 + per_task);
    uint8_t* scratch = ctx.worker_scratch(w, scratch_bytes);
    // If every earlier run is in place and dst has room for this one's worst
    // case, encode straight into dst (always so with one thread): no copy.
    const uint32_t last_elems = (uint32_t)std::min<uint64_t>(block_elems, n_elems - (uint64_t)(b1 - 1) * block_elems);
    const size_t run_bound = (size_t)(b1 - b0 - 1) * bbound + block_bound(last_elems, K);
    const bool direct = (!runs || runs->all_before_committed(t)) && !overflow && cap - next_off >= run_bound;
    uint8_t* o = direct ? dst + next_off : ctx.slot_out(slot, (size_t)per_task * bbound);
    if (dtype == kBytes && kind[0] == kKindZstd && !ctx.cctx[w]) ctx.cctx[w] = ZSTD_createCCtx();
    size_t pos = 0;
    for (uint32_t b = b0; b < b1; ++b) {
      const uint32_t nb = (uint32_t)std::min<uint64_t>(block_elems, n_elems - (uint64_t)b * block_elems);
      const uint8_t* sb = src + (uint64_t)b * block_elems * es;
      const uint32_t crc = block_checksum(sb, (size_t)nb * es) ^ block_checksum_salt(b);
      const size_t sz = dtype == kBytes ? encode_bytes_block(ctx.cctx[w], zlevel, kind[0], sb, nb, crc, o + pos)
                                        : encode_block_with(dtype, et, sb, nb, crc, scratch, o + pos, coder);
      sizes[b] = (uint32_t)sz;
      pos += sz;
    }
    run_bytes[slot] = pos;
    run_in_place[slot] = direct;
  };
  stages.commit = [&](size_t, size_t slot) {
    const size_t pos = run_bytes[slot];
    if (run_in_place[slot]) {
      // already in place
    } else if (!overflow && next_off + pos <= cap) {
      memcpy(dst + next_off, ctx.slot_out(slot, 0), pos);
    } else {
      overflow = true;
    }
    next_off += pos;
  };
  if (n_tasks == 1) {
    // One run (every frame of up to 16 blocks on one thread, and every
    // small frame): nothing to order or overlap, so no pipeline is set up.
    stages.work(0, 0, 0);
    stages.commit(0, 0);
  } else {
    OrderedPipeline pipeline(n_tasks, window, std::move(stages));
    runs = &pipeline;
    pipeline.run(ctx.pool);
  }
  const uint64_t total = next_off;
  if (overflow) return make_error(kErrDstTooSmall, "destination too small (" + std::to_string(cap) + " < " +
                                                       std::to_string(total) + " bytes)");

  FrameHeader h{};
  h.version = any_ctx ? kFormatVersionCtx : kFormatVersion;
  h.dtype = dtype;
  h.n_streams = (uint8_t)K;
  h.raw_size = n;
  h.block_elems = block_elems;
  h.n_blocks = n_blocks;
  h.tables_size = (uint32_t)tables_padded;
  uint8_t* index = dst + kFrameHeaderSize + tables_padded;
  for (uint32_t b = 0; b < n_blocks; ++b) store_le32(index + 4 * b, sizes[b]);
  write_frame_header(dst, h);
  h.header_crc = frame_header_crc(dst, prefix, CpuCrc32c{});
  write_frame_header(dst, h);
  return (size_t)total;
}

size_t parse_prefix(const uint8_t* src, size_t n, FramePrefix* fp) {
  if (!src) return make_error(kErrBadParam, "source is null");
  uint32_t bad_entry = 0;
  const FrameDefect d = parse_frame_prefix(src, n, CpuCrc32c{}, fp, &bad_entry);
  if (d == kDefectNone) return (size_t)fp->prefix_size;
  const int st = frame_defect_status(d);
  if (d == kDefectBadVersion)
    return make_error(st, "frame format version " + std::to_string(src[4]) + " is not supported (this build reads " +
                              std::to_string(kFormatVersion) + " and " + std::to_string(kFormatVersionCtx) + ")");
  if (d == kDefectIndexEntry)
    return make_error(st, "block " + std::to_string(bad_entry) + ": " + frame_defect_text(d));
  return make_error(st, frame_defect_text(d));
}

namespace {

struct DecTables {
  BlockDecTables t{};
  std::vector<uint32_t> dec;
  explicit DecTables(const FramePrefix& fp) {
    const FrameTables& ft = fp.t;
    dec.resize((size_t)ft.n_tables * kProbScale);
    for (uint32_t j = 0; j < ft.n_tables; ++j) rans_build_dec(ft.freq[j], dec.data() + (size_t)j * kProbScale);
    for (int k = 0; k < fp.h.n_streams; ++k) {
      t.kind[k] = ft.kind[k];
      t.ctx[k] = ft.ctx[k];
      if (kind_is_rans(ft.kind[k])) t.dec[k] = dec.data() + (size_t)ft.first_table[k] * kProbScale;
    }
  }
};

// Generic (TZ_DTYPE_BYTES) block: one stream, raw or zstd, validated by
// parse_block like every other block.
int decode_bytes_block(ZSTD_DCtx* dctx, uint8_t kind, const uint8_t* blk, size_t sz, uint32_t n, uint8_t* out,
                       uint32_t* stored) {
  BlockView v;
  const int pst = parse_block(1, &kind, blk, sz, n, &v);
  if (pst != kOk) return pst;
  *stored = v.checksum;
  if (v.mode[0] == kModeRaw) {
    memcpy(out, v.payload[0], n);
    return kOk;
  }
  const size_t r = ZSTD_decompressDCtx(dctx, out, n, v.payload[0], v.size[0]);
  if (ZSTD_isError(r) || r != n) return kErrCorruptBlock;
  return kOk;
}

// tz::decode_block through the kernel table: same validation (parse_block),
// same output and status, coded streams decoded two at a time, and the
// common BF16 layout (exponents coded, sign|mantissa raw) decoded and merged
// in one pass.
int decode_block_kernels(const CodecKernels& kr, uint8_t dtype, const BlockDecTables& t, const uint8_t* blk,
                         size_t sz, uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored) {
  const int K = dtype_stream_count(dtype);
  BlockView v;
  const int pst = parse_block(K, t.kind, blk, sz, n, &v);
  if (pst != kOk) return pst;
  *stored = v.checksum;
  if (dtype == kBF16 && v.mode[0] == kModeRans && v.mode[1] == kModeRaw)
    return kr.rans_decode_bf16(v.payload[0], v.size[0], n, t.dec[0], t.ctx[0], v.payload[1], dst);
  const uint8_t* streams[kMaxStreams];
  int pending = -1;  // a coded stream waiting for a partner
  for (int k = 0; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      streams[k] = v.payload[k];
    } else if (v.mode[k] == kModeRans) {
      uint8_t* s = scratch + (size_t)k * align4(n);
      streams[k] = s;
      if (pending < 0) {
        pending = k;
        continue;
      }
      const int j = pending;
      pending = -1;
      int sa, sb;
      kr.rans_decode2(RansStream{v.payload[j], v.size[j], n, t.dec[j], scratch + (size_t)j * align4(n), t.ctx[j]},
                        &sa, RansStream{v.payload[k], v.size[k], n, t.dec[k], s, t.ctx[k]}, &sb);
      if (sa != kOk) return sa;
      if (sb != kOk) return sb;
    } else {
      return kErrUnsupported;
    }
  }
  if (pending >= 0) {
    const int st = kr.rans_decode(v.payload[pending], v.size[pending], n, t.dec[pending], t.ctx[pending],
                                  scratch + (size_t)pending * align4(n));
    if (st != kOk) return st;
  }
  kr.merge(dtype, streams, n, dst);
  return kOk;
}

// Decodes blocks [first, first+count) whose bytes start at `blocks`, into
// dst (or only verifies them when dst is null).
// With `tables` (a PreparedFrame's), no decode table is built.
size_t decode_range(Context& ctx, const FramePrefix& fp, const uint8_t* blocks, uint32_t first, uint32_t count,
                    uint8_t* dst, unsigned* bad_block, const DecTables* tables = nullptr) {
  const FrameHeader& h = fp.h;
  const uint32_t es = dtype_elem_size(h.dtype);
  const int K = h.n_streams;
  std::vector<uint64_t> off(count + 1);
  off[0] = 0;
  for (uint32_t i = 0; i < count; ++i) off[i + 1] = off[i] + load_le32(fp.index + 4ull * (first + i));
  std::optional<DecTables> own;
  const DecTables& dt = tables ? *tables : own.emplace(fp);
  const size_t scratch_bytes = block_scratch_size(h.block_elems, K) + (dst ? 0 : 2 * (size_t)h.block_elems * es);
  const CodecKernels& kr = codec_kernels();
  std::mutex bad_mu;  // guards the lowest failing block and its status
  uint32_t bad = UINT32_MAX;
  int bad_status = kOk;
  const uint32_t per_task = std::max<uint32_t>(1, count / (ctx.pool.size() * 8));
  const size_t n_tasks = (count + per_task - 1) / per_task;
  ctx.pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
    uint8_t* scratch = ctx.worker_scratch(w, scratch_bytes);
    if (h.dtype == kBytes && !ctx.dctx[w]) ctx.dctx[w] = ZSTD_createDCtx();
    const uint32_t i0 = (uint32_t)(t * per_task), i1 = std::min<uint32_t>(count, i0 + per_task);
    const size_t block_bytes = (size_t)h.block_elems * es;
    auto out_of = [&](uint32_t i, int slot) {
      return dst ? dst + (uint64_t)i * block_bytes : scratch + block_scratch_size(h.block_elems, K) + slot * block_bytes;
    };
    auto fail = [&](uint32_t b, int st) {
      std::lock_guard<std::mutex> lk(bad_mu);
      if (b < bad) {
        bad = b;
        bad_status = st;
      }
    };
    for (uint32_t i = i0; i < i1;) {
      // BF16 blocks (exponents coded, sign|mantissa raw) go two at a time
      // through the interleaved SIMD decoder.
      if (h.dtype == kBF16 && i + 1 < i1) {
        BlockView va, vb;
        const uint32_t na = block_elem_count(h, first + i), nb = block_elem_count(h, first + i + 1);
        const bool ok =
            parse_block(K, dt.t.kind, blocks + off[i], (size_t)(off[i + 1] - off[i]), na, &va) == kOk &&
            parse_block(K, dt.t.kind, blocks + off[i + 1], (size_t)(off[i + 2] - off[i + 1]), nb, &vb) == kOk &&
            va.mode[0] == kModeRans && va.mode[1] == kModeRaw && vb.mode[0] == kModeRans && vb.mode[1] == kModeRaw;
        if (ok) {
          uint8_t* oa = out_of(i, 0);
          uint8_t* ob = out_of(i + 1, 1);
          int sta, stb;
          kr.rans_decode2_bf16(RansStream{va.payload[0], va.size[0], na, dt.t.dec[0], oa, dt.t.ctx[0]}, va.payload[1],
                                 &sta, RansStream{vb.payload[0], vb.size[0], nb, dt.t.dec[0], ob, dt.t.ctx[0]},
                                 vb.payload[1], &stb);
          if (sta == kOk && (block_checksum(oa, (size_t)na * es) ^ block_checksum_salt(first + i)) != va.checksum)
            sta = kErrChecksum;
          if (stb == kOk && (block_checksum(ob, (size_t)nb * es) ^ block_checksum_salt(first + i + 1)) != vb.checksum)
            stb = kErrChecksum;
          if (sta != kOk) return fail(first + i, sta);
          if (stb != kOk) return fail(first + i + 1, stb);
          i += 2;
          continue;
        }
      }
      const uint32_t b = first + i;
      const uint32_t nb = block_elem_count(h, b);
      uint8_t* out = out_of(i, 0);
      uint32_t stored = 0;
      const uint8_t* blk = blocks + off[i];
      const size_t sz = (size_t)(off[i + 1] - off[i]);
      int st = h.dtype == kBytes ? decode_bytes_block(ctx.dctx[w], fp.t.kind[0], blk, sz, nb, out, &stored)
                                 : decode_block_kernels(kr, h.dtype, dt.t, blk, sz, nb, scratch, out, &stored);
      if (st == kOk && (block_checksum(out, (size_t)nb * es) ^ block_checksum_salt(b)) != stored) st = kErrChecksum;
      if (st != kOk) return fail(b, st);
      ++i;
    }
  });
  if (bad != UINT32_MAX) {
    if (bad_block) *bad_block = bad;
    return make_error(bad_status, "block " + std::to_string(bad) + ": " + status_text(bad_status));
  }
  return (size_t)(off[count]);
}

}  // namespace

size_t decompress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, bool write,
                        unsigned* bad_block) {
  FramePrefix fp;
  const size_t prefix = parse_prefix(src, n, &fp);
  if (is_error(prefix)) return prefix;
  const uint64_t frame = prefix + fp.blocks_size;
  const FrameDefect ext = check_frame_extent(prefix, fp.blocks_size, n);
  if (ext == kDefectFrameTruncated)
    return make_error(frame_defect_status(ext), "frame truncated: " + std::to_string(n) + " of " +
                                                    std::to_string(frame) + " bytes present");
  if (ext != kDefectNone)
    return make_error(frame_defect_status(ext),
                      "input has " + std::to_string(n - frame) + " trailing bytes after the frame");
  if (write) {
    if (fp.h.raw_size > cap)
      return make_error(kErrDstTooSmall, "destination holds " + std::to_string(cap) + " bytes, frame decodes to " +
                                             std::to_string(fp.h.raw_size));
    if (!dst && fp.h.raw_size) return make_error(kErrBadParam, "destination is null");
  }
  const size_t r = decode_range(ctx, fp, src + prefix, 0, fp.h.n_blocks, write ? dst : nullptr, bad_block);
  if (is_error(r)) return r;
  return (size_t)fp.h.raw_size;
}

namespace {

// The arguments of a block-range decode against the frame's (validated)
// prefix: the range, the block bytes given, the destination. Sets *raw to
// the bytes it decodes to; 0 or an error.
size_t check_block_range(const FramePrefix& fp, uint8_t* dst, size_t cap, size_t blocks_size, uint32_t first,
                         uint32_t count, uint64_t* raw_bytes) {
  if ((uint64_t)first + count > fp.h.n_blocks) return make_error(kErrBadParam, "block range outside the frame");
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < count; ++i) bytes += load_le32(fp.index + 4ull * (first + i));
  if (blocks_size != bytes)
    return make_error(kErrSrcTruncated, "block data is " + std::to_string(blocks_size) + " bytes, expected " +
                                            std::to_string(bytes));
  const uint32_t es = dtype_elem_size(fp.h.dtype);
  uint64_t raw = 0;
  for (uint32_t i = 0; i < count; ++i) raw += (uint64_t)block_elem_count(fp.h, first + i) * es;
  if (raw > cap) return make_error(kErrDstTooSmall, "destination too small for the block range");
  if (!dst && raw) return make_error(kErrBadParam, "destination is null");
  *raw_bytes = raw;
  return 0;
}

}  // namespace

size_t decompress_blocks(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* prefix, size_t prefix_size,
                         const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                         unsigned* bad_block) {
  FramePrefix fp;
  const size_t pr = parse_prefix(prefix, prefix_size, &fp);
  if (is_error(pr)) return pr;
  uint64_t raw = 0;
  const size_t c = check_block_range(fp, dst, cap, blocks_size, first, count, &raw);
  if (is_error(c)) return c;
  const size_t r = decode_range(ctx, fp, blocks, first, count, dst, bad_block);
  if (is_error(r)) return r;
  return (size_t)raw;
}

// ---- frames prepared once (resident weights) ------------------------------

struct PreparedFrame {
  FrameHeader h;
  // FrameTables without its frequencies (8 KiB; the tables are built from them)
  struct {
    uint8_t kind[kMaxStreams], first_table[kMaxStreams];
    RansCtx ctx[kMaxStreams];
    uint32_t n_tables;
  } t;
  uint64_t prefix_size, blocks_size;
  std::vector<uint8_t> index;  // the validated block index, copied out of the frame
  DecTables tables;            // built from the validated frequencies
  PreparedFrame(const FramePrefix& fp, const uint8_t* idx)
      : h(fp.h), prefix_size(fp.prefix_size), blocks_size(fp.blocks_size),
        index(idx, idx + 4ull * fp.h.n_blocks), tables(fp) {
    for (int k = 0; k < kMaxStreams; ++k) {
      t.kind[k] = fp.t.kind[k];
      t.first_table[k] = fp.t.first_table[k];
      t.ctx[k] = fp.t.ctx[k];
    }
    t.n_tables = fp.t.n_tables;
  }
  // The parsed prefix as decode_range reads it (no frequencies: it does not
  // read them when given the tables).
  void view(FramePrefix* fp) const {
    fp->h = h;
    for (int k = 0; k < kMaxStreams; ++k) {
      fp->t.kind[k] = t.kind[k];
      fp->t.first_table[k] = t.first_table[k];
      fp->t.ctx[k] = t.ctx[k];
    }
    fp->t.n_tables = t.n_tables;
    fp->index = index.data();
    fp->prefix_size = prefix_size;
    fp->blocks_size = blocks_size;
  }
};

void PreparedFrameDeleter::operator()(PreparedFrame* f) const { delete f; }

size_t prepare_frame(const uint8_t* prefix, size_t prefix_size, PreparedFramePtr* out) {
  return guarded([&]() -> size_t {
    FramePrefix fp;
    const size_t pr = parse_prefix(prefix, prefix_size, &fp);
    if (is_error(pr)) return pr;
    out->reset(new PreparedFrame(fp, fp.index));
    return pr;
  });
}

size_t prepared_frame_bytes(const PreparedFrame& f) {
  return sizeof(PreparedFrame) + f.index.capacity() + f.tables.dec.capacity() * sizeof(uint32_t);
}

size_t prepared_block_range(const PreparedFrame& f, uint32_t first, uint32_t count, uint64_t* offset,
                            uint64_t* size, uint64_t* raw_size) {
  if ((uint64_t)first + count > f.h.n_blocks) return make_error(kErrBadParam, "block range outside the frame");
  uint64_t off = f.prefix_size, sz = 0, raw = 0;
  const uint8_t* idx = f.index.data();
  for (uint32_t b = 0; b < first; ++b) off += load_le32(idx + 4ull * b);
  for (uint32_t b = first; b < first + count; ++b) sz += load_le32(idx + 4ull * b);
  for (uint32_t b = first; b < first + count; ++b) raw += (uint64_t)block_elem_count(f.h, b) * dtype_elem_size(f.h.dtype);
  *offset = off;
  *size = sz;
  *raw_size = raw;
  return 0;
}

size_t decompress_blocks_prepared(Context& ctx, const PreparedFrame& f, uint8_t* dst, size_t cap,
                                  const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                                  unsigned* bad_block) {
  FramePrefix fp;  // frequencies left unset
  f.view(&fp);
  uint64_t raw = 0;
  const size_t c = check_block_range(fp, dst, cap, blocks_size, first, count, &raw);
  if (is_error(c)) return c;
  const size_t r = decode_range(ctx, fp, blocks, first, count, dst, bad_block, &f.tables);
  if (is_error(r)) return r;
  return (size_t)raw;
}

}  // namespace tz::cpu
