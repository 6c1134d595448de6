#include "cpu/frame.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <bit>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "codec/checksum.h"
#include "codec/policy.h"
#include "cpu/checksum_cpu.h"
#include "cpu/frame_tables.h"
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
  size_t operator()(int k, const uint8_t* sym, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return kr->rans_encode(sym, n, EncTables{et->enc[k], freq_start[k]}, et->ctx[k], words, out, limit);
  }
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

  // Tensor-level stream kinds and tables (cpu/frame_tables.cpp, by the
  // policy of codec/policy.h shared with the CUDA encoder).
  TensorTables tt;
  if (dtype == kBytes) tt.s[0].kind = policy_bytes_kind(level);
  else choose_tables(ctx.pool, level, dtype, src, n_elems, block_elems, n_blocks, &tt);
  const std::vector<uint8_t> tables = write_table_section(tt, K);

  const uint64_t prefix = kFrameHeaderSize + tables.size() + 4ull * n_blocks;
  if (!dst && cap) return make_error(kErrBadParam, "destination is null");
  if (cap < prefix) return make_error(kErrDstTooSmall, "destination too small for the frame header");

  // Encoder tables of every set of every coded stream; a block takes its
  // sets' (block_tables).
  const bool v3 = tt.version >= kFormatVersionSets;
  std::vector<RansEncSym> enc[kMaxStreams];
  std::vector<uint32_t> fst[kMaxStreams];
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
  auto block_tables = [&](uint32_t b, BlockEncTables* et, const uint32_t** fk) {
    *et = BlockEncTables{};
    et->v3 = v3;
    for (int k = 0; k < K; ++k) {
      const StreamTables& st = tt.s[k];
      et->kind[k] = st.kind;
      if (!kind_is_rans(st.kind)) continue;
      const uint32_t set = st.set_of(b);
      et->set[k] = (uint8_t)set;
      et->ctx[k] = st.ctx;
      et->enc[k] = enc[k].data() + (size_t)set * st.ctx.n * 256;
      fk[k] = fst[k].data() + (size_t)set * st.ctx.n * 256;
    }
  };

  // Blocks: tasks are runs of blocks, the items of an ordered pipeline
  // (cpu/ordered_pipeline.h) on the context's threads. A run is encoded into
  // its slot's buffer, and commit, in run order, copies it to its final
  // offset. Memory stays bounded (2 runs per thread), and the output never
  // depends on the number of workers.
  const uint32_t per_task = std::max<uint32_t>(1, std::min<uint32_t>(16, n_blocks / (ctx.pool.size() * 8)));
  const size_t n_tasks = (n_blocks + per_task - 1) / per_task;
  std::vector<uint32_t> sizes(n_blocks);
  const size_t bbound = block_bound(block_elems, K);
  const size_t scratch_bytes = block_scratch_size(block_elems, K);
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
    const size_t run_bound = (size_t)(b1 - b0) * bbound;
    const bool direct = runs->all_before_committed(t) && !overflow && cap - next_off >= run_bound;
    uint8_t* o = direct ? dst + next_off : ctx.slot_out(slot, (size_t)per_task * bbound);
    if (dtype == kBytes && tt.s[0].kind == kKindZstd && !ctx.cctx[w]) ctx.cctx[w] = ZSTD_createCCtx();
    size_t pos = 0;
    for (uint32_t b = b0; b < b1; ++b) {
      const uint32_t nb = (uint32_t)std::min<uint64_t>(block_elems, n_elems - (uint64_t)b * block_elems);
      const uint8_t* sb = src + (uint64_t)b * block_elems * es;
      const uint32_t crc = block_checksum(sb, (size_t)nb * es) ^ block_checksum_salt(b);
      BlockEncTables et;
      const uint32_t* fk[kMaxStreams] = {};
      if (dtype != kBytes) block_tables(b, &et, fk);
      const size_t sz = dtype == kBytes ? encode_bytes_block(ctx.cctx[w], zlevel, tt.s[0].kind, sb, nb, crc, o + pos)
                                        : encode_block_with(dtype, et, sb, nb, crc, scratch, o + pos,
                                                            KernelCoder{&kr, &et, fk});
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
  OrderedPipeline pipeline(n_tasks, window, std::move(stages));
  runs = &pipeline;
  pipeline.run(ctx.pool);
  const uint64_t total = next_off;
  if (overflow) return make_error(kErrDstTooSmall, "destination too small (" + std::to_string(cap) + " < " +
                                                       std::to_string(total) + " bytes)");

  FrameHeader h{};
  h.version = tt.version;
  h.dtype = dtype;
  h.n_streams = (uint8_t)K;
  h.raw_size = n;
  h.block_elems = block_elems;
  h.n_blocks = n_blocks;
  h.tables_size = (uint32_t)tables.size();
  if (!tables.empty()) memcpy(dst + kFrameHeaderSize, tables.data(), tables.size());
  uint8_t* index = dst + kFrameHeaderSize + tables.size();
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

namespace {

struct DecTables {
  BlockDecTables t{};
  std::vector<uint32_t> dec;
  explicit DecTables(const FramePrefix& fp) {
    const FrameTables& ft = fp.t;
    dec.resize((size_t)ft.n_tables * kProbScale);
    for (uint32_t j = 0; j < ft.n_tables; ++j) rans_build_dec(ft.freq[j], dec.data() + (size_t)j * kProbScale);
    t.v3 = fp.h.version >= kFormatVersionSets;
    for (int k = 0; k < fp.h.n_streams; ++k) {
      t.kind[k] = ft.kind[k];
      t.ctx[k] = ft.ctx[k];
      t.n_sets[k] = ft.n_sets[k];
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
  const int pst = parse_block(K, t.kind, t.sets(), blk, sz, n, &v);
  if (pst != kOk) return pst;
  *stored = v.checksum;
  if (dtype == kBF16 && v.mode[0] == kModeRans && v.mode[1] == kModeRaw)
    return kr.rans_decode_bf16(v.payload[0], v.size[0], n, t.dec_of(0, v.set[0]), t.ctx[0], v.payload[1], dst);
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
      kr.rans_decode2(
          RansStream{v.payload[j], v.size[j], n, t.dec_of(j, v.set[j]), scratch + (size_t)j * align4(n), t.ctx[j]},
          &sa, RansStream{v.payload[k], v.size[k], n, t.dec_of(k, v.set[k]), s, t.ctx[k]}, &sb);
      if (sa != kOk) return sa;
      if (sb != kOk) return sb;
    } else {
      return kErrUnsupported;
    }
  }
  if (pending >= 0) {
    const int st = kr.rans_decode(v.payload[pending], v.size[pending], n, t.dec_of(pending, v.set[pending]),
                                  t.ctx[pending], scratch + (size_t)pending * align4(n));
    if (st != kOk) return st;
  }
  kr.merge(dtype, streams, n, dst);
  return kOk;
}

// Decodes blocks [first, first+count) whose bytes start at `blocks`, into
// dst (or only verifies them when dst is null).
size_t decode_range(Context& ctx, const FramePrefix& fp, const uint8_t* blocks, uint32_t first, uint32_t count,
                    uint8_t* dst, unsigned* bad_block) {
  const FrameHeader& h = fp.h;
  const uint32_t es = dtype_elem_size(h.dtype);
  const int K = h.n_streams;
  std::vector<uint64_t> off(count + 1);
  off[0] = 0;
  for (uint32_t i = 0; i < count; ++i) off[i + 1] = off[i] + load_le32(fp.index + 4ull * (first + i));
  DecTables dt(fp);
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
            parse_block(K, dt.t.kind, dt.t.sets(), blocks + off[i], (size_t)(off[i + 1] - off[i]), na, &va) == kOk &&
            parse_block(K, dt.t.kind, dt.t.sets(), blocks + off[i + 1], (size_t)(off[i + 2] - off[i + 1]), nb, &vb) ==
                kOk &&
            va.mode[0] == kModeRans && va.mode[1] == kModeRaw && vb.mode[0] == kModeRans && vb.mode[1] == kModeRaw;
        if (ok) {
          uint8_t* oa = out_of(i, 0);
          uint8_t* ob = out_of(i + 1, 1);
          int sta, stb;
          kr.rans_decode2_bf16(
              RansStream{va.payload[0], va.size[0], na, dt.t.dec_of(0, va.set[0]), oa, dt.t.ctx[0]}, va.payload[1],
              &sta, RansStream{vb.payload[0], vb.size[0], nb, dt.t.dec_of(0, vb.set[0]), ob, dt.t.ctx[0]},
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

size_t decompress_blocks(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* prefix, size_t prefix_size,
                         const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                         unsigned* bad_block) {
  FramePrefix fp;
  const size_t pr = parse_prefix(prefix, prefix_size, &fp);
  if (is_error(pr)) return pr;
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
  const size_t r = decode_range(ctx, fp, blocks, first, count, dst, bad_block);
  if (is_error(r)) return r;
  return (size_t)raw;
}

}  // namespace tz::cpu
