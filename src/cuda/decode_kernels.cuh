// CUDA decoder kernels (doc/cuda.md): d_parse_kernel validates the prefix of
// each frame (one warp per frame, the validator of codec/frame_prefix.h),
// d_decode_kernel decodes and checks its blocks (one warp per block, the
// per-block logic of codec/block.h), d_finish_kernel writes each item's
// status and size. Part of cuda_codec.cu's translation unit (included from it;
// see the note there on TZ_HD_NOINLINE); the descriptors (DItem, DState) and
// helpers it uses are defined there.
#pragma once

namespace tz::cuda {
namespace {

// value = residual XOR prediction for the n elements of block b, after the
// block's checksum (which covers the residual) was verified.
__device__ void apply_prediction_block(const DItem& it, uint8_t dtype, uint64_t e0, uint32_t n, uint8_t* dst,
                                       uint32_t lane) {
  if (it.pred_kind == kPredCast) {
    const int ck = dtype == kF16 ? tz::predict::kCastF16 : tz::predict::kCastBF16;
    const uint8_t* src = it.pred + e0 * 4;
    for (uint32_t i = lane; i < n; i += 32) tz::predict::cast_xor_elem(src, dst, i, ck);
  } else {
    const uint32_t es = dtype_elem_size(dtype);
    const uint8_t* ref = it.pred + e0 * es;
    for (uint32_t i = lane; i < n; i += 32) tz::predict::xor_bytes(ref + (uint64_t)i * es, dst + (uint64_t)i * es, es);
  }
}

// Validates the prefix of one frame per warp with the validator of
// codec/frame_prefix.h, in its order (the CPU's parse_prefix and
// decompress_frame): lane 0 runs parse_frame_head (header, tables, header
// CRC) into the item's DState; the warp checks the block index entries with
// block_index_entry_valid, one lane per entry, scans them into block
// offsets, and checks the extent. Never reads outside [src, src + src_size).
__global__ void __launch_bounds__(256) d_parse_kernel(const DItem* items, uint32_t n_items, DState* states,
                                                      uint64_t* offs) {
  __shared__ uint32_t crc_t[8 * 256];
  build_crc_tables(crc_t);
  const uint32_t ii = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const uint32_t lane = threadIdx.x % 32;
  if (ii >= n_items) return;
  const DItem it = items[ii];
  DState& S = states[ii];
  int st = it.status0;
  if (lane == 0) {
    S.bad = ~0ull;
    if (st == kOk)
      st = frame_defect_status(parse_frame_head(it.src, (size_t)it.src_size, TableCrc32c{crc_t}, &S.v));
    S.status = st;
  }
  __syncwarp();
  st = __shfl_sync(kFull, st, 0);
  if (st != kOk) return;
  const FrameHeader h = S.v.h;
  const int K = h.n_streams;
  const uint8_t* const index = S.v.index;
  const uint32_t nb = h.n_blocks;
  bool bad = false;
  uint64_t carry = 0;
  for (uint32_t base = 0; base < nb; base += 32) {
    const uint32_t j = base + lane;
    uint64_t v = 0;
    if (j < nb) {
      const uint32_t sz = load_le32(index + 4ull * j);
      if (!block_index_entry_valid(h, j, sz)) bad = true;
      v = sz;
    }
    uint64_t incl = v;
    for (int d = 1; d < 32; d <<= 1) {
      const uint64_t u = __shfl_up_sync(kFull, incl, d);
      if ((int)lane >= d) incl += u;
    }
    if (j < nb && j < it.max_blocks) offs[it.slot_base + j] = carry + incl - v;
    carry += __shfl_sync(kFull, incl, 31);
  }
  if (__any_sync(kFull, bad)) st = frame_defect_status(kDefectIndexEntry);
  if (st == kOk) st = frame_defect_status(check_frame_extent(S.v.prefix_size, carry, it.src_size));
  if (st == kOk && h.raw_size > it.dst_cap) st = kErrDstTooSmall;
  if (st == kOk && nb > it.max_blocks) st = kErrCorruptHeader;  // unreachable for a consistent frame
  if (st == kOk && ((uintptr_t)it.dst % dtype_elem_size(h.dtype)) != 0) st = kErrBadParam;
  if (st == kOk && h.raw_size > 0 && it.dst == nullptr) st = kErrBadParam;
  // A valid frame with a zstd stream (dtype bytes): the CPU decodes it. The
  // only case of TZ_ERROR_UNSUPPORTED; its blocks are not examined here.
  if (st == kOk && stream_kinds_use_zstd(S.v.t.kind, K)) st = kErrUnsupported;
  if (st == kOk && it.pred_kind == kPredCast) {
    // The prediction is one FP32 per element, cast to BF16 or F16.
    if (h.dtype != kBF16 && h.dtype != kF16) st = kErrBadParam;
    else if (it.pred_size / 2 < h.raw_size) st = kErrBadParam;
    else if (h.raw_size && (!it.pred || ((uintptr_t)it.pred % 4) != 0)) st = kErrBadParam;
  } else if (st == kOk && it.pred_kind == kPredDelta) {
    if (it.pred_size < h.raw_size) st = kErrBadParam;
    else if (h.raw_size && !it.pred) st = kErrBadParam;
  }
  if (lane == 0) S.status = st;
}

// Zero elision (doc/format.md 5.10), after a block's lock-step decode left
// its elided fields 0: field k of the elements whose field 0 (final, seeds
// included) is not 0, from the stream's payload in element order
// (expand_elided on the CPU), from element `from` on for the seed stream
// (its head came with the seeds); then each payload's size is checked
// against the elements kept. Warp-uniform status.
template <int DT, int K>
__device__ int warp_expand_elided(const BlockView& v, uint32_t n, uint8_t* dst, uint32_t lane) {
  const uint32_t from = v.seed_stream >= 0 ? kSeedBytes * v.n_seeded : 0u;
  uint32_t kept = 0, kept_r = 0;  // elements kept so far; of them, at or after `from`
  for (uint32_t s = 0; s < (n + 31) / 32; ++s) {
    const uint32_t i = s * 32 + lane;
    uint32_t e = i < n ? load_elem<DT>(dst, i) : 0u;
    const bool keep = i < n && warp::elem_field<DT>(e, 0) != 0;
    const uint32_t b = __ballot_sync(kFull, keep);
    const uint32_t br = __ballot_sync(kFull, keep && i >= from);
    const uint32_t at = kept + warp::dec_word_slot(b, lane), at_r = kept_r + warp::dec_word_slot(br, lane);
    kept += (uint32_t)__popc(b);
    kept_r += (uint32_t)__popc(br);
#pragma unroll
    for (int k = 1; k < K; ++k) {
      if (!((v.elided >> k) & 1u)) continue;
      const bool seed = k == v.seed_stream;
      if ((seed ? kept_r : kept) > v.size[k]) return kErrCorruptBlock;  // warp-uniform
      if (keep && (!seed || i >= from)) e = warp::elem_with_field<DT>(e, k, v.payload[k][seed ? at_r : at]);
    }
    if (keep) store_elem<DT>(dst, i, e);
  }
#pragma unroll
  for (int k = 1; k < K; ++k)
    if (((v.elided >> k) & 1u) && (k == v.seed_stream ? kept_r : kept) != v.size[k]) return kErrCorruptBlock;
  __syncwarp();
  return kOk;
}

// Decodes one block with a warp: the block header validated by parse_block
// (codec/block.h, as on the CPU), then all streams in lock step (one symbol
// of every field per lane and step) so the fields merge straight into dst,
// then the segmented checksum of dst.
// Ctx: the frame has a lane-context stream (kind 3); without it the per-
// symbol table offset and context update are compiled out.
// dec + tab0[k] * kProbScale: stream k's tables in the block's table set;
// n_sets: the streams' set counts (format version 3), else null; flags: the
// frame's flags. Seeded lane states (doc/format.md 5.8): the seed stream is
// read from BlockView::stream_bytes (its head from other bytes of the block)
// while the streams decode, then each lane puts its two seed bytes of every
// seeded stream into their elements. Self-seeded streams (5.9) decode their
// first coded[k] symbols (field 0 in the elements after them), then each
// lane puts its two bytes into field k of the last kSeedBytes elements.
template <int DT, bool Ctx>
__device__ int warp_decode_block(const uint8_t* blk, uint32_t blk_size, uint32_t n, const uint8_t* kind,
                                 const uint8_t* n_sets, uint8_t flags, const uint32_t* dec, const uint8_t* tab0,
                                 const uint8_t* ctx_base, const uint8_t* ctx_n, const uint32_t* crc_t, uint8_t* dst,
                                 uint32_t lane, uint32_t salt) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  constexpr uint32_t es = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  BlockView v;
  const int pst = parse_block_k<K>(kind, n_sets, flags, blk, blk_size, n, &v);
  if (pst != kOk) return pst;
  const uint32_t stored = v.checksum;
  // Modes are raw or rANS: zstd passes parse_block only in a frame with a
  // zstd kind, which d_parse_kernel leaves to the CPU.
  const uint8_t* pay[K];
#pragma unroll
  for (int k = 0; k < K; ++k) pay[k] = v.stream_bytes(k);
  const uint32_t* psz = v.size;
  bool coded[K];
#pragma unroll
  for (int k = 0; k < K; ++k) coded[k] = v.mode[k] == kModeRans;

  uint32_t x[K], p[K], coff[K];  // coff: this lane's table offset (lane context x kProbScale)
  uint32_t ncoded[K];             // symbols the payload codes (v.coded)
  RansCtx rc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    x[k] = coded[k] ? ((const uint32_t*)pay[k])[lane] : 0;
    p[k] = kRansStateBytes;
    coff[k] = 0;
    ncoded[k] = v.coded[k];
    rc[k].base = ctx_base[k];
    rc[k].n = ctx_n[k];
  }
  const uint32_t n_steps = (n + 31) / 32;
  for (uint32_t s = 0; s < n_steps; ++s) {
    const uint32_t i = s * 32 + lane;
    const bool active = i < n;
    uint32_t f[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (coded[k]) {
        uint32_t sym = 0;
        bool need = false;
        if (i < ncoded[k]) {
          sym = rans_dec_sym(x[k], dec + (size_t)tab0[k] * kProbScale + (Ctx ? coff[k] : 0u));
          if (Ctx && rc[k].n > 1) coff[k] = rans_ctx_of(sym, rc[k]) * kProbScale;
          need = x[k] < kRansL;
        }
        const uint32_t b = __ballot_sync(kFull, need);
        const uint32_t cnt = (uint32_t)__popc(b);
        if (p[k] + 2 * cnt > psz[k]) return kErrCorruptBlock;  // warp-uniform
        if (need)
          x[k] = (x[k] << 16) | *(const uint16_t*)(pay[k] + p[k] + 2 * warp::dec_word_slot(b, lane));
        p[k] += 2 * cnt;
        f[k] = sym;
      } else {
        // An elided stream's bytes (zero elision) go in after the loop.
        f[k] = active && !((v.elided >> k) & 1u) ? pay[k][i] : 0;
      }
    }
    if (active) store_elem<DT>(dst, i, warp::elem_merge<DT>(f));
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!coded[k]) continue;
    const bool end_ok =
        v.seed_at[k] != BlockView::kNoSeed || v.self_seeds(k) ? (x[k] >> 16) == 1u : x[k] == kRansL;
    if (p[k] != psz[k] || !__all_sync(kFull, end_ok)) return kErrCorruptBlock;
  }
  __syncwarp();
  if (v.n_seeded) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (v.seed_at[k] == BlockView::kNoSeed) continue;
#pragma unroll
      for (uint32_t j = 0; j < 2; ++j) {
        const uint32_t e = v.seed_at[k] + 2 * lane + j;
        store_elem<DT>(dst, e, warp::elem_with_field<DT>(load_elem<DT>(dst, e), v.seed_stream, (x[k] >> (8 * j)) & 0xFFu));
      }
    }
    __syncwarp();
  }
  if (v.self_seeded) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!v.self_seeds(k)) continue;
#pragma unroll
      for (uint32_t j = 0; j < 2; ++j) {
        const uint32_t e = ncoded[k] + 2 * lane + j;
        store_elem<DT>(dst, e, warp::elem_with_field<DT>(load_elem<DT>(dst, e), k, (x[k] >> (8 * j)) & 0xFFu));
      }
      __syncwarp();
    }
  }
  if (v.elided) {
    const int est = warp_expand_elided<DT, K>(v, n, dst, lane);
    if (est != kOk) return est;
  }
  if ((warp_block_checksum(dst, (uint64_t)n * es, crc_t, lane) ^ salt) != stored) return kErrChecksum;
  return kOk;
}

// ctx_launch: this launch decodes the frames whose blocks use more tables
// than kMaxStreams (lane contexts) and has kDecSmemCtx bytes of shared
// memory; the other launch decodes every other frame with kDecSmem.
// The 8 blocks of a chunk may use different table sets (format version 3):
// the CTA decodes them in rounds, each building the decode tables of one
// selection (the set of every stream, read from the stream words of the
// lowest block not yet done) for the warps whose block uses it. Frames
// before version 3 have one selection: one round.
__global__ void __launch_bounds__(kCtaThreads) d_decode_kernel(const DItem* items, uint32_t n_items,
                                                               DState* states, const uint64_t* offs, int ctx_launch) {
  TZ_DYNAMIC_SMEM(uint32_t, smem);
  const uint32_t max_tables = ctx_launch ? kMaxFrameTables : kMaxStreams;
  uint32_t* dec = smem;                                   // max_tables x kProbScale entries
  uint32_t* crc_t = smem + max_tables * kProbScale;       // 8 x 256
  __shared__ uint32_t cum[kMaxFrameTables][257];
  __shared__ uint8_t kind[kMaxStreams], tab0[kMaxStreams], ctx_base[kMaxStreams], ctx_n[kMaxStreams],
      n_sets[kMaxStreams];
  __shared__ uint32_t key[kWarpsPerCta];
  __shared__ uint32_t lead;
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  const uint32_t chunk = blockIdx.x;
  const uint32_t ii = find_item(items, n_items, chunk);
  const DItem it = items[ii];
  DState& S = states[ii];
  if (S.status != kOk) return;
  const FrameTables& FT = S.v.t;
  const int K = S.v.h.n_streams;
  uint32_t T = 0;  // tables of one block
  for (int k = 0; k < K; ++k)
    if (kind_is_rans(FT.kind[k])) T += FT.ctx[k].n;
  if ((T > kMaxStreams) != (ctx_launch != 0)) return;
  const uint32_t nb = S.v.h.n_blocks;
  const uint32_t b0 = (chunk - it.first_chunk) * kWarpsPerCta;
  if (b0 >= nb) return;
  const bool v3 = S.v.h.version >= kFormatVersionSets;
  if (threadIdx.x == 0) {
    uint32_t t = 0;
    for (int k = 0; k < K; ++k) {
      kind[k] = FT.kind[k];
      tab0[k] = (uint8_t)t;
      ctx_base[k] = (uint8_t)FT.ctx[k].base;
      ctx_n[k] = (uint8_t)FT.ctx[k].n;
      n_sets[k] = FT.n_sets[k];
      if (kind_is_rans(FT.kind[k])) t += FT.ctx[k].n;
    }
  }
  const uint32_t lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const uint32_t b = b0 + w;
  const FrameHeader h = S.v.h;
  const uint8_t* blk = b < nb ? it.src + S.v.prefix_size + offs[it.slot_base + b] : nullptr;
  if (lane == 0) {
    // The index entry is at least the block header (d_parse_kernel), so the
    // stream words are inside the frame; parse_block rejects bad sets.
    uint32_t sel = 0;
    if (v3 && b < nb)
      for (int k = 0; k < K; ++k) {
        const uint32_t word = load_le32(blk + 4 + 4 * k);
        const uint32_t set = stream_word_v3_set(word);
        if (stream_word_mode(word) == kModeRans && set < FT.n_sets[k]) sel |= set << (8 * k);
      }
    key[w] = b < nb ? sel : kNone;
  }
  build_crc_tables(crc_t);  // syncs
  bool has_ctx = false;  // the same for every warp of the frame
  for (int k = 0; k < K; ++k) has_ctx |= FT.ctx[k].n > 1;
  for (;;) {
    if (threadIdx.x == 0) {
      lead = kNone;
      for (uint32_t j = 0; j < kWarpsPerCta && lead == kNone; ++j) lead = key[j];
    }
    __syncthreads();
    const uint32_t sel = lead;
    if (sel == kNone) break;
    if (threadIdx.x < T) {
      const uint32_t j = threadIdx.x;
      int k = 0;
      while (!(kind_is_rans(kind[k]) && j < tab0[k] + (uint32_t)ctx_n[k])) ++k;
      const uint32_t* f = FT.freq[FT.first_table[k] + ((sel >> (8 * k)) & 0xFFu) * ctx_n[k] + (j - tab0[k])];
      uint32_t c = 0;
      for (int s = 0; s < 256; ++s) {
        cum[j][s] = c;
        c += f[s];
      }
      cum[j][256] = c;
    }
    __syncthreads();
    for (uint32_t k = 0; k < T; ++k) {
      for (uint32_t j = threadIdx.x; j < kProbScale; j += blockDim.x) {
        uint32_t lo = 0, hi = 256;  // largest s with cum[s] <= j; its frequency is non-zero
        while (hi - lo > 1) {
          const uint32_t mid = (lo + hi) / 2;
          if (cum[k][mid] <= j) lo = mid; else hi = mid;
        }
        dec[k * kProbScale + j] = rans_dec_entry(lo, cum[k][lo + 1] - cum[k][lo], j - cum[k][lo]);
      }
    }
    __syncthreads();
    if (key[w] == sel) {
      const uint32_t n = block_elem_count(h, b);
      const uint32_t es = dtype_elem_size(h.dtype);
      const uint32_t bsz = load_le32(S.v.index + 4ull * b);
      uint8_t* dst = it.dst + (uint64_t)b * h.block_elems * es;
      const uint32_t salt = block_checksum_salt(b);
      const uint8_t* ns = v3 ? n_sets : nullptr;
      const uint8_t flags = h.flags;
      int st;
#define TZ_WARP_DECODE(DT)                                                                                       \
  (has_ctx ? warp_decode_block<DT, true>(blk, bsz, n, kind, ns, flags, dec, tab0, ctx_base, ctx_n, crc_t, dst, lane, salt) \
           : warp_decode_block<DT, false>(blk, bsz, n, kind, ns, flags, dec, tab0, ctx_base, ctx_n, crc_t, dst, lane, salt))
      switch (h.dtype) {
        case kBF16: st = TZ_WARP_DECODE(kBF16); break;
        case kF16: st = TZ_WARP_DECODE(kF16); break;
        case kF32: st = TZ_WARP_DECODE(kF32); break;
        case kBytes: st = TZ_WARP_DECODE(kBytes); break;
        default: st = TZ_WARP_DECODE(kF8E4M3); break;
      }
#undef TZ_WARP_DECODE
      if (st == kOk && it.pred_kind != kPredNone) {
        __syncwarp();  // every lane has finished reading the block (checksum)
        apply_prediction_block(it, h.dtype, (uint64_t)b * h.block_elems, n, dst, lane);
      }
      if (st != kOk && lane == 0) atomicMin(&S.bad, ((unsigned long long)b << 8) | (unsigned)st);
      __syncwarp();
      if (lane == 0) key[w] = kNone;
    }
    __syncthreads();
  }
}

__global__ void d_finish_kernel(const DState* states, uint32_t n_items, size_t* out_sizes, int* status) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_items) return;
  int st = states[i].status;
  if (st == kOk && states[i].bad != ~0ull) st = (int)(states[i].bad & 0xFFu);
  status[i] = st;
  out_sizes[i] = st == kOk ? (size_t)states[i].v.h.raw_size : 0;
}

}  // namespace
}  // namespace tz::cuda
