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
    t.flags = fp.h.flags;
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

// Seeded lane states (doc/format.md 5.8) in the decode-and-merge paths: the
// coded streams hand their seeds (the seed stream's head) to `seeds`; the
// seed stream is merged from BlockView::stream_bytes (its payload less the
// head, inside the block), so the head's elements are merged from other
// bytes first and merged again with the seeds once they are known. No copy
// of the raw stream.
// Self-seeded streams (5.9) in those paths: the fused decoder merges the
// stream's first n - kSeedBytes symbols; its last kSeedBytes land in `tail`
// and merge_tail merges the block's last kSeedBytes elements from them.
struct BlockSeeds {
  uint8_t bytes[kMaxStreams * kSeedBytes];
  uint8_t tail[kMaxStreams][kSeedBytes];
  uint8_t* tail_of(int k) { return tail[k]; }
  // After every stream decoded and dst merged.
  void remerge(uint8_t dtype, const BlockView& v, uint8_t* dst) const {
    if (v.n_seeded) block_seed_remerge(dtype, v.seed_stream, bytes, 0, kSeedBytes * v.n_seeded, dst);
  }
  // After a fused decode+merge of stream 0 with the bytes of streams 1 ..
  // K-1 (others[0 .. K-2], each all n of them): when stream 0 seeds itself
  // the fused pass merged its first n - kSeedBytes elements only, and this
  // merges the last kSeedBytes from its tail and the others.
  void merge_tail(uint8_t dtype, const BlockView& v, uint32_t n, const uint8_t* const* others, uint8_t* dst) const {
    if (!v.self_seeds(0)) return;
    const int K = dtype_stream_count(dtype);
    const uint32_t i0 = n - kSeedBytes;
    const uint8_t* f[kMaxStreams];
    f[0] = tail[0];
    for (int k = 1; k < K; ++k) f[k] = others[k - 1] + i0;
    merge_fields(dtype, f, kSeedBytes, dst + (size_t)i0 * dtype_elem_size(dtype));
  }
};

// Coded stream k of a block, decoded into scratch + k * align4(n) (a
// self-seeded one's last kSeedBytes symbols behind the others there).
RansStream coded_stream(const BlockDecTables& t, const BlockView& v, int k, uint32_t n, uint8_t* scratch,
                        BlockSeeds& seeds) {
  uint8_t* s = scratch + (size_t)k * align4(n);
  return RansStream{v.payload[k], v.size[k], v.coded[k], t.dec_of(k, v.set[k]), s,
                    v.seeded_ctx(k, t.ctx[k], seeds.bytes, s + v.coded[k])};
}

// Decodes the coded streams among `ks` (count of them) into their scratch
// buffers (coded_stream), two at a time; the first failing status, or kOk.
int decode_coded_streams(const CodecKernels& kr, const BlockDecTables& t, const BlockView& v, const int* ks,
                         int count, uint32_t n, uint8_t* scratch, BlockSeeds& seeds) {
  auto stream = [&](int k) { return coded_stream(t, v, k, n, scratch, seeds); };
  int i = 0;
  for (; i + 1 < count; i += 2) {
    int sa, sb;
    kr.rans_decode2(stream(ks[i]), &sa, stream(ks[i + 1]), &sb);
    if (sa != kOk) return sa;
    if (sb != kOk) return sb;
  }
  if (i < count) {
    const RansStream r = stream(ks[i]);
    return kr.rans_decode(r.in, r.size, r.n, r.dec, r.ctx, r.out);
  }
  return kOk;
}

// The layouts the merged decoders (CodecKernels::rans_decode_merged) decode
// a block in: stream 0 coded and every other stream raw; and, with a table
// whose rans_decode2 is not lockstep (CodecKernels::decode2_lockstep), also
// coded (none elided). The coded ones (their numbers in coded[], *n_coded
// of them) are decoded first, into scratch, and the merged decoder then
// takes their bytes as it takes a raw stream's: others[k - 1] is stream k's
// (scratch + k * align4(n) where coded). Measured on the fixture's Adam v
// (stream 1 coded in 74 of 125 blocks; bench/experiments/notebook.md): AVX2 +7 %
// decompress; AVX-512 -12 %, where the generic path's lockstep pair of
// streams 0 and 1 beats the merged pass.
bool merged_sources(const CodecKernels& kr, const BlockView& v, int K, uint32_t n, uint8_t* scratch,
                    const uint8_t** others, int* coded, int* n_coded) {
  if (v.mode[0] != kModeRans || v.elided) return false;
  *n_coded = 0;
  for (int k = 1; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      others[k - 1] = v.stream_bytes(k);
    } else if (v.mode[k] == kModeRans && !kr.decode2_lockstep) {
      others[k - 1] = scratch + (size_t)k * align4(n);
      coded[(*n_coded)++] = k;
    } else {
      return false;
    }
  }
  return true;
}

// tz::decode_block through the kernel table: same validation (parse_block),
// same output and status, coded streams decoded two at a time, and BF16 /
// FP16 / FP32 blocks whose stream 0 is coded (merged_sources) decoded and
// merged in one pass of stream 0, after any other coded streams.
int decode_block_kernels(const CodecKernels& kr, uint8_t dtype, const BlockDecTables& t, const uint8_t* blk,
                         size_t sz, uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored) {
  const int K = dtype_stream_count(dtype);
  BlockView v;
  const int pst = parse_block(K, t.kind, t.sets(), t.flags, blk, sz, n, &v);
  if (pst != kOk) return pst;
  *stored = v.checksum;
  BlockSeeds seeds;
  const uint8_t* others[kMaxStreams - 1];
  int coded[kMaxStreams - 1], n_coded = 0;
  if (decodes_merged(dtype) && merged_sources(kr, v, K, n, scratch, others, coded, &n_coded)) {
    const int cst = decode_coded_streams(kr, t, v, coded, n_coded, n, scratch, seeds);
    if (cst != kOk) return cst;
    const int st = kr.rans_decode_merged(dtype, v.payload[0], v.size[0], v.coded[0], t.dec_of(0, v.set[0]),
                                         v.seeded_ctx(0, t.ctx[0], seeds.bytes, seeds.tail_of(0)), others, dst);
    if (st == kOk) {
      seeds.remerge(dtype, v, dst);
      seeds.merge_tail(dtype, v, n, others, dst);
    }
    return st;
  }
  // One coded stream (FP8): its bytes are the elements, decoded in place
  // (merge would only copy them from scratch); a self-seeded one's last
  // kSeedBytes symbols land behind the others. Never seeded from another
  // stream (no raw stream).
  if (K == 1 && v.mode[0] == kModeRans)
    return kr.rans_decode(v.payload[0], v.size[0], v.coded[0], t.dec_of(0, v.set[0]),
                          v.seeded_ctx(0, t.ctx[0], nullptr, dst + v.coded[0]), dst);
  const uint8_t* streams[kMaxStreams];
  int pending = -1;  // a coded stream waiting for a partner
  for (int k = 0; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      streams[k] = v.stream_bytes(k);
    } else if (v.mode[k] == kModeRans) {
      uint8_t* s = scratch + (size_t)k * align4(n);
      streams[k] = s;
      if (pending < 0) {
        pending = k;
        continue;
      }
      const int pair[2] = {pending, k};
      pending = -1;
      const int st = decode_coded_streams(kr, t, v, pair, 2, n, scratch, seeds);
      if (st != kOk) return st;
    } else if (v.mode[k] == kModeRawElided) {
      streams[k] = nullptr;  // expand_elided, below
    } else {
      return kErrUnsupported;
    }
  }
  if (pending >= 0) {
    const int st = decode_coded_streams(kr, t, v, &pending, 1, n, scratch, seeds);
    if (st != kOk) return st;
  }
  if (v.elided) {
    uint8_t* slot[kMaxStreams];
    for (int k = 0; k < K; ++k) slot[k] = scratch + (size_t)k * align4(n);
    const int est = expand_elided(v, K, n, slot, streams, seeds.bytes);
    if (est != kOk) return est;
  }
  kr.merge(dtype, streams, n, dst);
  seeds.remerge(dtype, v, dst);
  return kOk;
}

// Blocks b and b + 1 (bytes blk_a, blk_b) decoded in lockstep into oa and
// ob, checksums checked, when both have a layout the two-stream kernels
// take: BF16 / FP16 / FP32 blocks whose stream 0 is coded (merged_sources;
// rans_decode2_merged), and blocks of one coded stream (FP8; rans_decode2,
// in place, as decode_block_kernels decodes one). Returns false, having
// written nothing, when they do not; each block's status in *sta, *stb.
bool decode_pair(const CodecKernels& kr, const FrameHeader& h, const BlockDecTables& t, uint32_t b,
                 const uint8_t* blk_a, size_t sz_a, const uint8_t* blk_b, size_t sz_b, uint8_t* scratch, uint8_t* oa,
                 uint8_t* ob, int* sta, int* stb) {
  const int K = h.n_streams;
  const bool merged = decodes_merged(h.dtype);
  if (!merged && !(K == 1 && h.dtype != kBytes)) return false;
  BlockView va, vb;
  const uint32_t na = block_elem_count(h, b), nb = block_elem_count(h, b + 1);
  if (parse_block(K, t.kind, t.sets(), t.flags, blk_a, sz_a, na, &va) != kOk ||
      parse_block(K, t.kind, t.sets(), t.flags, blk_b, sz_b, nb, &vb) != kOk)
    return false;
  BlockSeeds sa, sb;  // seeded blocks (BlockSeeds)
  if (merged) {
    // Stream 0 of each block decoded and merged, after the blocks' other
    // coded streams (merged_sources; block b's in the second half of
    // scratch), in lockstep across the blocks where they have as many.
    const uint8_t* oth_a[kMaxStreams - 1];
    const uint8_t* oth_b[kMaxStreams - 1];
    int ca[kMaxStreams - 1], cb[kMaxStreams - 1], nca = 0, ncb = 0;
    uint8_t* const scr_a = scratch;
    // Written only where merged_sources takes coded streams (tables that
    // are not lockstep), for which decode_range gives two blocks' streams.
    uint8_t* const scr_b = scratch + block_scratch_size(h.block_elems, K);
    if (!merged_sources(kr, va, K, na, scr_a, oth_a, ca, &nca) ||
        !merged_sources(kr, vb, K, nb, scr_b, oth_b, cb, &ncb))
      return false;
    int ca_st = kOk, cb_st = kOk;
    if (nca == ncb) {
      for (int i = 0; i < nca; ++i) {
        int s1, s2;
        kr.rans_decode2(coded_stream(t, va, ca[i], na, scr_a, sa), &s1, coded_stream(t, vb, cb[i], nb, scr_b, sb),
                        &s2);
        if (ca_st == kOk) ca_st = s1;
        if (cb_st == kOk) cb_st = s2;
      }
    } else {
      ca_st = decode_coded_streams(kr, t, va, ca, nca, na, scr_a, sa);
      cb_st = decode_coded_streams(kr, t, vb, cb, ncb, nb, scr_b, sb);
    }
    const RansStream s0a{va.payload[0], va.size[0], va.coded[0], t.dec_of(0, va.set[0]), oa,
                         va.seeded_ctx(0, t.ctx[0], sa.bytes, sa.tail_of(0))};
    const RansStream s0b{vb.payload[0], vb.size[0], vb.coded[0], t.dec_of(0, vb.set[0]), ob,
                         vb.seeded_ctx(0, t.ctx[0], sb.bytes, sb.tail_of(0))};
    if (ca_st == kOk && cb_st == kOk) {
      kr.rans_decode2_merged(h.dtype, s0a, oth_a, sta, s0b, oth_b, stb);
    } else {  // one block's other streams failed: the other block alone
      *sta = ca_st == kOk ? kr.rans_decode_merged(h.dtype, s0a.in, s0a.size, s0a.n, s0a.dec, s0a.ctx, oth_a, oa) : ca_st;
      *stb = cb_st == kOk ? kr.rans_decode_merged(h.dtype, s0b.in, s0b.size, s0b.n, s0b.dec, s0b.ctx, oth_b, ob) : cb_st;
    }
    if (*sta == kOk) {
      sa.remerge(h.dtype, va, oa);
      sa.merge_tail(h.dtype, va, na, oth_a, oa);
    }
    if (*stb == kOk) {
      sb.remerge(h.dtype, vb, ob);
      sb.merge_tail(h.dtype, vb, nb, oth_b, ob);
    }
  } else {
    // One coded stream: never seeded from another stream; a self-seeded
    // one's last kSeedBytes symbols land behind the others.
    if (va.mode[0] != kModeRans || vb.mode[0] != kModeRans) return false;
    kr.rans_decode2(RansStream{va.payload[0], va.size[0], va.coded[0], t.dec_of(0, va.set[0]), oa,
                               va.seeded_ctx(0, t.ctx[0], nullptr, oa + va.coded[0])},
                    sta,
                    RansStream{vb.payload[0], vb.size[0], vb.coded[0], t.dec_of(0, vb.set[0]), ob,
                               vb.seeded_ctx(0, t.ctx[0], nullptr, ob + vb.coded[0])},
                    stb);
  }
  const uint32_t es = dtype_elem_size(h.dtype);
  if (*sta == kOk && (block_checksum(oa, (size_t)na * es) ^ block_checksum_salt(b)) != va.checksum)
    *sta = kErrChecksum;
  if (*stb == kOk && (block_checksum(ob, (size_t)nb * es) ^ block_checksum_salt(b + 1)) != vb.checksum)
    *stb = kErrChecksum;
  return true;
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
  const CodecKernels& kr = codec_kernels();
  // One block's streams, or two where decode_pair decodes two blocks' other
  // coded streams (merged_sources: tables that are not lockstep); then,
  // without dst, two blocks' output.
  const size_t streams_bytes = (kr.decode2_lockstep ? 1 : 2) * block_scratch_size(h.block_elems, K);
  const size_t scratch_bytes = streams_bytes + (dst ? 0 : 2 * (size_t)h.block_elems * es);
  std::mutex bad_mu;  // guards the lowest failing block and its status
  uint32_t bad = UINT32_MAX;
  int bad_status = kOk;
  // Where the table decodes two blocks in lockstep, tasks of an even number
  // of blocks, so that decode_pair finds its pairs in a tensor of few blocks
  // too (with tasks of one block, the 3 to 9 blocks of most MiniLM tensors
  // never decoded in lockstep); elsewhere a pair is two decodes one after
  // the other, and one-block tasks keep a small tensor's blocks on as many
  // threads as there are.
  const uint32_t per_task = kr.decode2_lockstep ? 2 * std::max<uint32_t>(1, count / (ctx.pool.size() * 16))
                                                : std::max<uint32_t>(1, count / (ctx.pool.size() * 8));
  const size_t n_tasks = (count + per_task - 1) / per_task;
  ctx.pool.parallel_for(n_tasks, [&](size_t t, unsigned w) {
    uint8_t* scratch = ctx.worker_scratch(w, scratch_bytes);
    if (h.dtype == kBytes && !ctx.dctx[w]) ctx.dctx[w] = ZSTD_createDCtx();
    const uint32_t i0 = (uint32_t)(t * per_task), i1 = std::min<uint32_t>(count, i0 + per_task);
    const size_t block_bytes = (size_t)h.block_elems * es;
    auto out_of = [&](uint32_t i, int slot) {
      return dst ? dst + (uint64_t)i * block_bytes : scratch + streams_bytes + slot * block_bytes;
    };
    auto fail = [&](uint32_t b, int st) {
      std::lock_guard<std::mutex> lk(bad_mu);
      if (b < bad) {
        bad = b;
        bad_status = st;
      }
    };
    for (uint32_t i = i0; i < i1;) {
      if (i + 1 < i1) {
        const uint32_t b = first + i;
        int sta, stb;
        if (decode_pair(kr, h, dt.t, b, blocks + off[i], (size_t)(off[i + 1] - off[i]), blocks + off[i + 1],
                        (size_t)(off[i + 2] - off[i + 1]), scratch, out_of(i, 0), out_of(i + 1, 1), &sta, &stb)) {
          if (sta != kOk) return fail(b, sta);
          if (stb != kOk) return fail(b + 1, stb);
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
