// The CPU frame decoder: whole frames, block ranges, and frames prepared once
// (parsed prefix and decode tables kept for resident weights). Blocks are
// validated by the shared parse_block (codec/block.h) and decoded through
// the kernel table of the CPU's SIMD path (cpu/kernels.h).
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>

#include "codec/checksum.h"
#include "cpu/frame_internal.h"
#include "cpu/kernels.h"

namespace tz::cpu {

namespace {
const char* status_text(int st) {
  switch (st) {
    case kErrCorruptBlock: return "corrupt block data";
    case kErrChecksum: return "checksum mismatch";
    case kErrUnsupported: return "unsupported stream mode";
    default: return "error";
  }
}
}  // namespace

namespace {

struct DecTables {
  BlockDecTables t{};
  std::unique_ptr<uint32_t[]> dec;  // n_tables x kProbScale entries (+ slack), every one written
  size_t entries = 0;
  explicit DecTables(const FramePrefix& fp) {
    const FrameTables& ft = fp.t;
    entries = ft.n_tables ? (size_t)ft.n_tables * kProbScale + kDecTableSlack : 0;  // all raw: nothing
    if (entries) dec.reset(new uint32_t[entries]);  // not cleared: the tables are built in order over all of it
    for (uint32_t j = 0; j < ft.n_tables; ++j) build_dec_table(ft.freq[j], dec.get() + (size_t)j * kProbScale);
    t.v3 = fp.h.version >= kFormatVersionSets;
    t.seeded = (fp.h.flags & kFlagSeededLanes) != 0;
    for (int k = 0; k < fp.h.n_streams; ++k) {
      t.kind[k] = ft.kind[k];
      t.ctx[k] = ft.ctx[k];
      t.n_sets[k] = ft.n_sets[k];
      if (kind_is_rans(ft.kind[k])) t.dec[k] = dec.get() + (size_t)ft.first_table[k] * kProbScale;
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

// A BF16 block with exponents coded and sign|mantissa raw, the layout the
// fused decode-and-merge kernels take: its sign|mantissa stream, and in a
// seeded block (doc/format.md 5.8) the exponents' lane model with the seeds
// going to the stream's tail. The fused kernels read n bytes of the stream
// while they decode, but the seeds are only known at the end, so a seeded
// block's payload is copied to sr (n bytes of scratch, tail zeroed) and the
// tail is merged again afterwards (finish_fused_bf16).
struct FusedBf16 {
  const uint8_t* mant;
  RansCtx ctx;
};
FusedBf16 fused_bf16_streams(const BlockView& v, const RansCtx& ctx0, uint32_t n, uint8_t* sr) {
  if (!v.n_seeded) return {v.payload[1], ctx0};
  memcpy(sr, v.payload[1], v.size[1]);
  memset(sr + v.size[1], 0, n - v.size[1]);
  return {sr, v.seeded_ctx(0, ctx0, sr)};
}
void finish_fused_bf16(const BlockView& v, uint32_t n, const uint8_t* sr, uint8_t* dst) {
  if (v.n_seeded) block_seed_remerge(kBF16, 1, sr, v.size[1], n, dst);
}

// tz::decode_block through the kernel table: same validation (parse_block),
// same output and status, coded streams decoded two at a time, and the
// common BF16 layout (exponents coded, sign|mantissa raw) decoded and merged
// in one pass.
int decode_block_kernels(const CodecKernels& kr, uint8_t dtype, const BlockDecTables& t, const uint8_t* blk,
                         size_t sz, uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored) {
  const int K = dtype_stream_count(dtype);
  BlockView v;
  const int pst = parse_block(K, t.kind, t.sets(), t.seeded, blk, sz, n, &v);
  if (pst != kOk) return pst;
  *stored = v.checksum;
  if (dtype == kBF16 && v.mode[0] == kModeRans && v.mode[1] == kModeRaw) {
    const FusedBf16 f = fused_bf16_streams(v, t.ctx[0], n, scratch);
    const int st = kr.rans_decode_bf16(v.payload[0], v.size[0], n, t.dec_of(0, v.set[0]), f.ctx, f.mant, dst);
    if (st == kOk) finish_fused_bf16(v, n, scratch, dst);
    return st;
  }
  // One coded stream (FP8): its bytes are the elements, decoded in place
  // (merge would only copy them from scratch). Never seeded (no raw stream).
  if (K == 1 && v.mode[0] == kModeRans)
    return kr.rans_decode(v.payload[0], v.size[0], n, t.dec_of(0, v.set[0]), t.ctx[0], dst);
  const uint8_t* streams[kMaxStreams];
  // A seeded block's seed stream is assembled in its scratch area: the seeds
  // land at its tail as the coded streams before it decode (they all come
  // before it), its payload goes in front.
  uint8_t* const sr = v.n_seeded ? scratch + (size_t)v.seed_stream * align4(n) : nullptr;
  int pending = -1;  // a coded stream waiting for a partner
  for (int k = 0; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      streams[k] = v.payload[k];
      if (sr && k == v.seed_stream) {
        memcpy(sr, v.payload[k], v.size[k]);
        streams[k] = sr;
      }
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
      kr.rans_decode2(RansStream{v.payload[j], v.size[j], n, t.dec_of(j, v.set[j]), scratch + (size_t)j * align4(n),
                                 v.seeded_ctx(j, t.ctx[j], sr)},
                      &sa,
                      RansStream{v.payload[k], v.size[k], n, t.dec_of(k, v.set[k]), s, v.seeded_ctx(k, t.ctx[k], sr)},
                      &sb);
      if (sa != kOk) return sa;
      if (sb != kOk) return sb;
    } else {
      return kErrUnsupported;
    }
  }
  if (pending >= 0) {
    const int st = kr.rans_decode(v.payload[pending], v.size[pending], n, t.dec_of(pending, v.set[pending]),
                                  v.seeded_ctx(pending, t.ctx[pending], sr), scratch + (size_t)pending * align4(n));
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
            parse_block(K, dt.t.kind, dt.t.sets(), dt.t.seeded, blocks + off[i], (size_t)(off[i + 1] - off[i]), na,
                        &va) == kOk &&
            parse_block(K, dt.t.kind, dt.t.sets(), dt.t.seeded, blocks + off[i + 1],
                        (size_t)(off[i + 2] - off[i + 1]), nb, &vb) == kOk &&
            va.mode[0] == kModeRans && va.mode[1] == kModeRaw && vb.mode[0] == kModeRans && vb.mode[1] == kModeRaw;
        if (ok) {
          uint8_t* oa = out_of(i, 0);
          uint8_t* ob = out_of(i + 1, 1);
          int sta, stb;
          // Seeded blocks: their sign|mantissa streams in the scratch's two
          // stream areas (fused_bf16_streams).
          uint8_t* const sra = scratch;
          uint8_t* const srb = scratch + align4(h.block_elems);
          const FusedBf16 fa = fused_bf16_streams(va, dt.t.ctx[0], na, sra);
          const FusedBf16 fb = fused_bf16_streams(vb, dt.t.ctx[0], nb, srb);
          kr.rans_decode2_bf16(RansStream{va.payload[0], va.size[0], na, dt.t.dec_of(0, va.set[0]), oa, fa.ctx},
                               fa.mant, &sta,
                               RansStream{vb.payload[0], vb.size[0], nb, dt.t.dec_of(0, vb.set[0]), ob, fb.ctx},
                               fb.mant, &stb);
          if (sta == kOk) finish_fused_bf16(va, na, sra, oa);
          if (stb == kOk) finish_fused_bf16(vb, nb, srb, ob);
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
  // FrameTables without its frequencies (up to 32 KiB; the tables are built from them)
  struct {
    uint8_t kind[kMaxStreams], first_table[kMaxStreams], n_sets[kMaxStreams];
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
      t.n_sets[k] = fp.t.n_sets[k];
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
      fp->t.n_sets[k] = t.n_sets[k];
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
  return sizeof(PreparedFrame) + f.index.capacity() + f.tables.entries * sizeof(uint32_t);
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
