#include "cpu/frame.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>

#include "codec/checksum.h"
#include "codec/policy.h"
#include "cpu/frame_internal.h"
#include "cpu/frame_tables.h"
#include "cpu/kernels.h"
#include "common/ordered_pipeline.h"

static_assert(std::endian::native == std::endian::little, "tensorzip assumes a little-endian host");

namespace tz::cpu {

namespace {
thread_local std::string g_detail;
}  // namespace


size_t make_error(int code, std::string detail) {
  g_detail = std::move(detail);
  return (size_t)-(ptrdiff_t)code;
}
const std::string& last_error_detail() { return g_detail; }


ContextPtr make_context(unsigned threads) { return ContextPtr(new Context(threads)); }
void ContextDeleter::operator()(Context* c) const { delete c; }
unsigned context_threads(const Context& c) { return c.pool.size(); }

size_t compress_bound(size_t n) {
  // Every block raw: header (<= 20 B), <= 3 B padding per stream, a 4 B index
  // entry; blocks hold >= kMinBlockElems bytes.
  const size_t max_blocks = n / kMinBlockElems + 1;
  const size_t tables = kMaxTablesSizeAny;
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


// The stream coder of encode_block_with, through the kernel table:
// freq_start[k] is the block's set of stream k (ctx.n tables of 256,
// kernels.h EncTables).
struct KernelCoder {
  const CodecKernels* kr;
  const BlockEncTables* et;
  const uint32_t* const* freq_start;
  void split(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    kr->split(dtype, src, n, streams);
  }
  size_t operator()(int k, const uint8_t* sym, uint32_t n, const uint8_t* seed, uint16_t* words, uint8_t* out,
                    size_t limit) const {
    RansCtx c = et->ctx[k];
    c.seed_in = seed;
    return kr->rans_encode(sym, n, EncTables{et->enc[k], freq_start[k]}, c, words, out, limit);
  }
};

// Encoder tables of a frame's streams (rANS symbols and cumulative starts of
// every set of every coded stream), built only for the coded streams: an
// all-raw frame allocates nothing. A block takes its sets' (block).
struct FrameEncTables {
  const TensorTables& tt;
  int K;
  uint8_t flags;  // the blocks are coded with (encoder_block_flags): the header's, and kFlagZeroElided
  std::vector<RansEncSym> enc[kMaxStreams];
  std::vector<uint32_t> fst[kMaxStreams];
  FrameEncTables(const TensorTables& t, int n_streams, uint8_t frame_flags)
      : tt(t), K(n_streams), flags(frame_flags) {
    for (int k = 0; k < K; ++k) {
      const StreamTables& st = tt.s[k];
      if (!kind_is_rans(st.kind)) continue;
      const size_t nt = (size_t)st.n_sets * st.ctx.n;
      enc[k].resize(nt * 256);
      fst[k].resize(nt * 256);
      for (size_t j = 0; j < nt; ++j) {
        rans_build_enc(st.freq.data() + 256 * j, enc[k].data() + 256 * j);
        build_freq_start(st.freq.data() + 256 * j, fst[k].data() + 256 * j);
      }
    }
  }
  // The tables of block b: its sets' encoder tables and cumulative starts.
  void block(uint32_t b, BlockEncTables* et, const uint32_t** fk) const {
    *et = BlockEncTables{};
    et->v3 = tt.version >= kFormatVersionSets;
    et->flags = flags;
    for (int k = 0; k < K; ++k) {
      const StreamTables& st = tt.s[k];
      et->kind[k] = st.kind;
      if (!kind_is_rans(st.kind)) continue;
      const uint32_t set = st.set_of(b);
      et->set[k] = (uint8_t)set;
      et->ctx[k] = st.ctx;
      if (set == kSetRaw) continue;  // stored raw in this block, never coded (policy_raw_runs)
      et->enc[k] = enc[k].data() + (size_t)set * st.ctx.n * 256;
      fk[k] = fst[k].data() + (size_t)set * st.ctx.n * 256;
    }
  }
  FrameEncTables(const FrameEncTables&) = delete;
  FrameEncTables& operator=(const FrameEncTables&) = delete;
};

}  // namespace

namespace {

// A frame's shape as compress_frame validated it.
struct FrameShape {
  const uint8_t* src;
  uint8_t dtype;
  uint32_t es;  // element size
  int K;        // streams
  uint32_t block_elems;
  uint64_t n_elems;
  uint32_t n_blocks;
};

// Codes every block of the frame after its prefix (prefix bytes from the
// start of dst) and records each block's size in sizes. Tasks are runs of
// blocks, the items of an ordered pipeline (common/ordered_pipeline.h) on the
// context's threads. A run is encoded into its slot's buffer, and commit, in
// run order, copies it to its final offset. Memory stays bounded (2 runs per
// thread), and the output never depends on the number of workers. Returns
// the frame's size; *overflow when it does not fit in cap bytes.
uint64_t encode_blocks(Context& ctx, const FrameShape& f, const FrameEncTables& enc, uint8_t kind0, int level, uint8_t* dst, size_t cap, uint64_t prefix, uint32_t* sizes,
                       bool* overflow_out) {
  const uint32_t n_blocks = f.n_blocks, block_elems = f.block_elems;
  const uint64_t n_elems = f.n_elems;
  const uint32_t per_task = std::max<uint32_t>(1, std::min<uint32_t>(16, n_blocks / (ctx.pool.size() * 8)));
  const size_t n_tasks = (n_blocks + per_task - 1) / per_task;
  const size_t bbound = block_bound(block_elems, f.K);
  const size_t scratch_bytes = block_scratch_size((uint32_t)std::min<uint64_t>(block_elems, n_elems), f.K);
  const int zlevel = zstd_level_for(level);
  const CodecKernels& kr = codec_kernels();
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
    const size_t run_bound = (size_t)(b1 - b0 - 1) * bbound + block_bound(last_elems, f.K);
    const bool direct = (!runs || runs->all_before_committed(t)) && !overflow && cap - next_off >= run_bound;
    uint8_t* o = direct ? dst + next_off : ctx.slot_out(slot, (size_t)per_task * bbound);
    if (f.dtype == kBytes && kind0 == kKindZstd && !ctx.cctx[w]) ctx.cctx[w] = ZSTD_createCCtx();
    size_t pos = 0;
    for (uint32_t b = b0; b < b1; ++b) {
      const uint32_t nb = (uint32_t)std::min<uint64_t>(block_elems, n_elems - (uint64_t)b * block_elems);
      const uint8_t* sb = f.src + (uint64_t)b * block_elems * f.es;
      const uint32_t crc = block_checksum(sb, (size_t)nb * f.es) ^ block_checksum_salt(b);
      size_t sz;
      if (f.dtype == kBytes) {
        sz = encode_bytes_block(ctx.cctx[w], zlevel, kind0, sb, nb, crc, o + pos);
      } else {
        BlockEncTables et;
        const uint32_t* fk[kMaxStreams] = {};
        enc.block(b, &et, fk);
        sz = encode_block_with(f.dtype, et, sb, nb, crc, scratch, o + pos, KernelCoder{&kr, &et, fk});
      }
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
  *overflow_out = overflow;
  return next_off;
}

}  // namespace

namespace {
std::atomic<uint8_t> g_flags_mask{kFrameFlagsKnown};
}  // namespace
void set_encoder_seeded_lanes(bool on) { set_encoder_flags_mask(on ? kFrameFlagsKnown : 0); }
void set_encoder_flags_mask(uint8_t mask) { g_flags_mask.store(mask, std::memory_order_relaxed); }

size_t compress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, const tz_params& p) {
  if (!src && n) return make_error(kErrBadParam, "source is null");
  // Read the enum's storage as an int: a C caller may pass any value, and
  // an out-of-range enum value is undefined behaviour in C++.
  int dt_in;
  static_assert(sizeof(dt_in) == sizeof(p.dtype));
  memcpy(&dt_in, &p.dtype, sizeof dt_in);
  if (dt_in < 0 || dt_in >= kDTypeCount) return make_error(kErrBadParam, "unknown dtype " + std::to_string(dt_in));
  if (const char* e = policy_option_error(p.level, p.block_elems)) return make_error(kErrBadParam, e);
  const int level = policy_level(p.level);
  const uint8_t dtype = encode_dtype((uint8_t)dt_in, n);  // odd-sized data: generic path
  const uint32_t es = dtype_elem_size(dtype);
  const uint32_t block_elems = policy_block_elems(p.block_elems, dtype);
  if (!encode_size_valid(n)) return make_error(kErrBadParam, "input larger than 2^56 bytes");
  const uint64_t n_elems = n / es;
  uint32_t n_blocks = 0;
  if (!encode_block_count(n_elems, block_elems, &n_blocks))
    return make_error(kErrBadParam, "too many blocks: raise block_elems");
  const int K = dtype_stream_count(dtype);

  // Tensor-level stream kinds and tables (frame_tables.cpp, by the policy of
  // codec/policy.h, shared with the CUDA encoder).
  TensorTables tt;
  if (dtype == kBytes)
    tt.s[0].kind = policy_bytes_kind(level);
  else if (policy_codes_streams(level, dtype, n_elems, n_blocks))
    choose_tables(ctx.pool, level, dtype, src, n_elems, block_elems, n_blocks, &tt);
  std::vector<uint8_t>& tables = ctx.table_section;
  write_table_section(tt, K, &tables);

  const uint64_t prefix = kFrameHeaderSize + tables.size() + 4ull * n_blocks;
  if (!dst && cap) return make_error(kErrBadParam, "destination is null");
  if (cap < prefix) return make_error(kErrDstTooSmall, "destination too small for the frame header");
  if (!tables.empty()) memcpy(dst + kFrameHeaderSize, tables.data(), tables.size());

  uint8_t kinds[kMaxStreams];
  for (int k = 0; k < K; ++k) kinds[k] = tt.s[k].kind;
  const uint8_t flags = encoder_block_flags(tt.version, K, kinds) & g_flags_mask.load(std::memory_order_relaxed);
  const FrameEncTables enc(tt, K, flags);
  std::vector<uint32_t> sizes(n_blocks);
  bool overflow = false;
  const FrameShape shape{src, dtype, es, K, block_elems, n_elems, n_blocks};
  const uint64_t total =
      encode_blocks(ctx, shape, enc, tt.s[0].kind, level, dst, cap, prefix, sizes.data(), &overflow);
  if (overflow) return make_error(kErrDstTooSmall, "destination too small (" + std::to_string(cap) + " < " +
                                                       std::to_string(total) + " bytes)");

  FrameHeader h{};
  h.version = tt.version;
  uint8_t* index = dst + kFrameHeaderSize + tables.size();
  bool any_elided = false;  // the header names zero elision only where a block uses it
  if (flags & kFlagZeroElided)
    for (uint64_t b = 0, off = prefix; b < n_blocks && !any_elided; off += sizes[b++])
      any_elided = block_elides(dst + off, K);
  h.flags = encoder_header_flags(flags, any_elided);
  h.dtype = dtype;
  h.n_streams = (uint8_t)K;
  h.raw_size = n;
  h.block_elems = block_elems;
  h.n_blocks = n_blocks;
  h.tables_size = (uint32_t)tables.size();
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
                              std::to_string(kFormatVersion) + " to " + std::to_string(kFormatVersionSets) + ")");
  if (d == kDefectIndexEntry)
    return make_error(st, "block " + std::to_string(bad_entry) + ": " + frame_defect_text(d));
  return make_error(st, frame_defect_text(d));
}

}  // namespace tz::cpu
