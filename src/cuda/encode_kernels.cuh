// CUDA encoder kernels after the tables are chosen (encode_tables.cuh):
// c_encode_kernel rANS-codes each block's fields with one warp per block (the
// decisions of codec/block.h), c_finalize_kernel writes the header, table
// section and block index, c_gather_kernel packs the staged blocks behind the
// prefix, c_predict_kernel forms cast/delta residuals. Part of cuda_codec.cu's
// translation unit (included from it; see the note there on TZ_HD_NOINLINE);
// the descriptors (CItem, PItem) and helpers it uses are defined there.
#pragma once

namespace tz::cuda {
namespace {

// rANS-codes field k of one block with a warp (see warp_codec.h for the word
// order). Words are written backwards from the end of the largest payload
// that still beats raw, in place in the block's stream area, then moved down
// behind the 128 state bytes. Returns the payload size, or 0 for raw, with
// exactly the decision of rans_encode(..., limit = n).
// With lane contexts (rc.n > 1), symbol i >= 32 is coded with table
// ctx_of(symbol i - 32) of enc (rc.n tables of 256), as rans_encode_ctx.
// Seeds (block_stream_seeds, doc/format.md 5.8, 5.9): with sd.from >= 0 the
// lane starts at L | the two bytes of field sd.from of elements sd.at +
// 2 lane, + 1, and the payload codes the first sd.coded elements. limit:
// the size a payload must beat (the block's n, or the bytes of the stream
// stored elided, doc/format.md 5.10).
template <int DT>
__device__ uint32_t warp_rans_encode(const uint8_t* src, uint32_t n, int k, const RansEncSym* enc, RansCtx rc,
                                     StreamSeeds sd, uint32_t limit, uint8_t* out, uint32_t lane) {
  const int64_t cap = warp::enc_word_cap(limit);
  if (cap < 0) return 0;
  uint16_t* const W = (uint16_t*)(out + kRansStateBytes);
  uint32_t wp = (uint32_t)cap;
  uint32_t x = kRansL;
  if (sd.from >= 0)
    x |= warp::elem_field<DT>(load_elem<DT>(src, sd.at + 2 * lane), sd.from) |
         warp::elem_field<DT>(load_elem<DT>(src, sd.at + 2 * lane + 1), sd.from) << 8;
  n = sd.coded;
  const uint32_t n_steps = (n + 31) / 32;
  for (uint32_t s = n_steps; s-- > 0;) {
    const uint32_t i = s * 32 + lane;
    bool emit = false;
    uint16_t word = 0;
    if (i < n) {
      const RansEncSym* t = enc;
      if (rc.n > 1 && s > 0) t += 256u * rans_ctx_of(warp::elem_field<DT>(load_elem<DT>(src, i - 32), k), rc);
      x = warp::enc_step(x, t[warp::elem_field<DT>(load_elem<DT>(src, i), k)], &emit, &word);
    }
    const uint32_t b = __ballot_sync(kFull, emit);
    const uint32_t cnt = (uint32_t)__popc(b);
    if (cnt > wp) return 0;  // warp-uniform: not smaller than raw
    if (emit) W[warp::enc_word_slot(wp, b, lane)] = word;
    wp -= cnt;
  }
  const uint32_t nw = (uint32_t)cap - wp;
  __syncwarp();
  if (wp > 0) {
    for (uint32_t base = 0; base < nw; base += 32) {
      const uint32_t j = base + lane;
      const uint16_t v = j < nw ? W[wp + j] : 0;
      __syncwarp();
      if (j < nw) W[j] = v;
      __syncwarp();
    }
  }
  ((uint32_t*)out)[lane] = x;
  const uint32_t size = kRansStateBytes + 2 * nw;
  if ((size & 2u) && lane == 0) *(uint16_t*)(out + size) = 0;  // pad to 4
  __syncwarp();
  return size;
}

// Field k stored raw, zero-padded to 4 bytes; 4 elements per lane per word.
template <int DT>
__device__ void warp_raw_stream(const uint8_t* src, uint32_t n, int k, uint8_t* out, uint32_t lane) {
  const uint32_t nq = (n + 3) / 4;
  for (uint32_t q = lane; q < nq; q += 32) {
    uint32_t w = 0;
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
      const uint32_t i = 4 * q + j;
      if (i < n) w |= warp::elem_field<DT>(load_elem<DT>(src, i), k) << (8 * j);
    }
    ((uint32_t*)out)[q] = w;
  }
  __syncwarp();
}

// Field k of the elements whose field 0 is not 0, in element order, zero-
// padded to 4 bytes (zero elision, doc/format.md 5.10: elide_zeros).
// Returns their count.
template <int DT>
__device__ uint32_t warp_elided_stream(const uint8_t* src, uint32_t n, int k, uint8_t* out, uint32_t lane) {
  uint32_t c = 0;
  for (uint32_t s = 0; s < (n + 31) / 32; ++s) {
    const uint32_t i = s * 32 + lane;
    const uint32_t e = i < n ? load_elem<DT>(src, i) : 0u;
    const bool keep = i < n && warp::elem_field<DT>(e, 0) != 0;
    const uint32_t b = __ballot_sync(kFull, keep);
    if (keep) out[c + warp::dec_word_slot(b, lane)] = (uint8_t)warp::elem_field<DT>(e, k);
    c += (uint32_t)__popc(b);
  }
  __syncwarp();
  if (lane == 0)
    for (uint32_t j = c; j < (uint32_t)align4(c); ++j) out[j] = 0;
  __syncwarp();
  return c;
}

// The streams one warp stores elided in a block: block_elided_streams
// (codec/zero_elision.h) over the block's elements; *kept: the elements
// whose field 0 is not 0.
template <int DT, int K>
__device__ uint32_t warp_elided_streams(const uint8_t* src, uint32_t n, uint8_t flags, uint32_t* kept, uint32_t lane) {
  *kept = n;
  if (!(flags & kFlagZeroElided) || K < 2) return 0;
  uint32_t z = 0, bad = 0;  // zeros of field 0; fields not 0 at one (elided_streams_of)
  for (uint32_t s = 0; s < (n + 31) / 32; ++s) {
    const uint32_t i = s * 32 + lane;
    const uint32_t e = i < n ? load_elem<DT>(src, i) : 0u;
    const bool zero = i < n && warp::elem_field<DT>(e, 0) == 0;
    z += (uint32_t)__popc(__ballot_sync(kFull, zero));
#pragma unroll
    for (int k = 1; k < K; ++k)
      if (__ballot_sync(kFull, zero && warp::elem_field<DT>(e, k) != 0)) bad |= 1u << k;
  }
  const uint32_t mask = elided_streams_of(flags, K, z != 0, bad);
  if (mask) *kept = n - z;
  return mask;
}

// Same bytes as encode_block (codec/block.h) for one block, by one warp:
// stream k is coded with the tables enc[tab0[k]...] of table set
// (sel >> 8k) & 0xFF, or stored raw where that is kSetRaw (lane contexts
// for stream 0 when ctx0.n > 1); flags: the frame's (seeded lane states,
// self-seeded streams: block_stream_seeds, codec/block.h).
template <int DT>
__device__ uint32_t warp_encode_block(const uint8_t* src, uint32_t n, const uint8_t* kind, const uint8_t* tab0,
                                      RansCtx ctx0, uint32_t sel, uint8_t flags, const RansEncSym (*enc)[256],
                                      const uint32_t* crc_t, uint8_t* out, uint32_t lane, uint32_t salt) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  constexpr uint32_t es = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  const uint32_t crc = warp_block_checksum(src, (uint64_t)n * es, crc_t, lane) ^ salt;
  uint32_t pos = (uint32_t)block_header_size(K);
  const int r = block_seed_stream_of(flags, K, kind, n);
  uint32_t kept = n;
  const uint32_t elidable = warp_elided_streams<DT, K>(src, n, flags, &kept, lane);
  uint32_t n_seeded = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t size = 0;
    uint8_t mode = kModeRaw;
    const bool elide = (elidable >> k) & 1u;
    if (kind_is_rans(kind[k]) && ((sel >> (8 * k)) & 0xFFu) != kSetRaw) {
      const StreamSeeds sd = block_stream_seeds(flags, k, r, n, n_seeded);
      size = warp_rans_encode<DT>(src, n, k, enc[tab0[k]], k == 0 ? ctx0 : RansCtx{}, sd, elide ? kept : n,
                                  out + pos, lane);
      if (size) {
        mode = kModeRans;
        n_seeded += k < r ? 1u : 0u;
      }
    }
    if (mode == kModeRaw) {
      __syncwarp();  // a failed rANS attempt wrote words here from other lanes
      const uint32_t skip = k == r ? kSeedBytes * n_seeded : 0u;  // the seeds, carried by the lane states
      if (elide) {
        mode = kModeRawElided;
        size = warp_elided_stream<DT>(src + (uint64_t)skip * es, n - skip, k, out + pos, lane);
      } else {
        size = n - skip;
        warp_raw_stream<DT>(src + (uint64_t)skip * es, size, k, out + pos, lane);
      }
    }
    if (lane == 0) ((uint32_t*)out)[1 + k] = stream_word_v3(size, mode, mode == kModeRans ? (sel >> (8 * k)) & 0xFFu : 0u);
    pos += (uint32_t)align4(size);
  }
  if (lane == 0) ((uint32_t*)out)[0] = crc;
  return pos;
}

// The 8 blocks of a chunk may use different table sets: the CTA encodes
// them in rounds, each round building the encoder tables of one selection
// (the table set of every stream, that of the lowest block not yet done)
// in shared memory for the warps whose block uses it.
__global__ void __launch_bounds__(kCtaThreads) c_encode_kernel(const CItem* items, uint32_t n_items, const CTab* tabs,
                                                               CBlockStats bs, uint8_t* staging, uint32_t* sizes) {
  __shared__ RansEncSym enc[kMaxFrameTables][256];
  __shared__ uint32_t crc_t[8 * 256];
  __shared__ uint8_t kind[kMaxStreams], tab0[kMaxStreams];
  __shared__ uint32_t key[kWarpsPerCta];
  __shared__ uint32_t lead;
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  uint32_t ii, b0;
  if (!cta_item_blocks(items, n_items, ii, b0)) return;
  const CItem it = items[ii];
  const CTab& tab = tabs[ii];
  const int K = it.n_streams;
  const uint32_t lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const uint32_t b = b0 + w;
  if (threadIdx.x < kMaxStreams) kind[threadIdx.x] = tab.kind[threadIdx.x];
  if (lane == 0) {
    uint32_t k_sel = 0;
    for (int k = 0; k < K; ++k)
      if (b < it.n_blocks && kind_is_rans(tab.kind[k]))
        k_sel |= (uint32_t)bs.set[(uint64_t)k * bs.total_blocks + it.first_block + b] << (8 * k);
    key[w] = b < it.n_blocks ? k_sel : kNone;
  }
  build_crc_tables(crc_t);  // syncs
  const RansCtx ctx0{tab.ctx_base, tab.ctx_n};
  const uint8_t flags = encoder_block_flags(tab.version, K, tab.kind);
  for (;;) {
    if (threadIdx.x == 0) {
      lead = kNone;
      for (uint32_t j = 0; j < kWarpsPerCta && lead == kNone; ++j) lead = key[j];
      uint32_t t = 0;
      for (int k = 0; k < K; ++k) {
        tab0[k] = (uint8_t)t;
        if (kind_is_rans(tab.kind[k])) t += k == 0 ? tab.ctx_n : 1u;
      }
    }
    __syncthreads();
    const uint32_t sel = lead;
    if (sel == kNone) break;
    // Thread j builds table j of the selection (one per stream and context).
    for (int k = 0; k < K; ++k) {
      if (!kind_is_rans(tab.kind[k]) || ((sel >> (8 * k)) & 0xFFu) == kSetRaw) continue;
      const uint32_t nc = k == 0 ? tab.ctx_n : 1u;
      for (uint32_t c = threadIdx.x; c < nc; c += blockDim.x)
        rans_build_enc(tab.freq[tab.first_table[k] + ((sel >> (8 * k)) & 0xFFu) * nc + c], enc[tab0[k] + c]);
    }
    __syncthreads();
    if (key[w] == sel) {
      const uint32_t es = dtype_elem_size(it.dtype);
      const uint64_t n_elems = it.n_bytes / es;
      const uint64_t e0 = (uint64_t)b * it.block_elems;
      const uint32_t n = (uint32_t)min((uint64_t)it.block_elems, n_elems - e0);
      const uint8_t* src = it.src + e0 * es;
      uint8_t* out = staging + it.staging_off + (uint64_t)b * it.block_stride;
      const uint32_t salt = block_checksum_salt(b);
      uint32_t size;
#define TZ_WARP_ENCODE(DT) warp_encode_block<DT>(src, n, kind, tab0, ctx0, sel, flags, enc, crc_t, out, lane, salt)
      switch (it.dtype) {
        case kBF16: size = TZ_WARP_ENCODE(kBF16); break;
        case kF16: size = TZ_WARP_ENCODE(kF16); break;
        case kF32: size = TZ_WARP_ENCODE(kF32); break;
        default: size = TZ_WARP_ENCODE(kF8E4M3); break;
      }
#undef TZ_WARP_ENCODE
      __syncwarp();
      if (lane == 0) {
        sizes[it.first_block + b] = size;
        key[w] = kNone;
      }
    }
    __syncthreads();
  }
}

// Per item, one CTA: exclusive scan of the block sizes (block offsets), the
// capacity check, then tables, block index and header with its CRC written
// to dst. Gather runs afterwards and skips items that failed here.
__global__ void __launch_bounds__(256) c_finalize_kernel(const CItem* items, const CTab* tabs, const uint8_t* staging,
                                                         const uint32_t* sizes, uint64_t* offs, size_t* out_sizes,
                                                         int* status) {
  using Scan = cub::BlockScan<unsigned long long, 256>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t crc_t[8 * 256];
  __shared__ unsigned any_elided;  // a staged block stores a stream elided (block_elides)
  const uint32_t ii = blockIdx.x;
  const CItem it = items[ii];
  if (it.status0 != kOk) return;
  build_crc_tables(crc_t);
  const CTab& tab = tabs[ii];
  const uint32_t nb = it.n_blocks;
  unsigned long long carry = 0;
  for (uint32_t base = 0; base < nb; base += 256) {
    const uint32_t j = base + threadIdx.x;
    const unsigned long long v = j < nb ? sizes[it.first_block + j] : 0;
    unsigned long long ex, agg;
    Scan(scan_tmp).ExclusiveSum(v, ex, agg);
    if (j < nb) offs[it.first_block + j] = carry + ex;
    carry += agg;
    __syncthreads();
  }
  const uint32_t ts = tab.tables_size;
  const uint64_t prefix = kFrameHeaderSize + ts + 4ull * nb;
  const uint64_t frame = prefix + carry;
  if (frame > it.dst_cap) {
    if (threadIdx.x == 0) status[ii] = kErrDstTooSmall;
    return;
  }
  uint8_t* dst = it.dst;
  for (uint32_t j = threadIdx.x; j < ts; j += blockDim.x) dst[kFrameHeaderSize + j] = tab.tables[j];
  for (uint32_t j = threadIdx.x; j < nb; j += blockDim.x)
    ((uint32_t*)(dst + kFrameHeaderSize + ts))[j] = sizes[it.first_block + j];
  const uint8_t flags = encoder_block_flags(tab.version, it.n_streams, tab.kind);
  if (threadIdx.x == 0) any_elided = 0;
  __syncthreads();
  if (flags & kFlagZeroElided)
    for (uint32_t j = threadIdx.x; j < nb; j += blockDim.x)
      if (block_elides(staging + it.staging_off + (uint64_t)j * it.block_stride, it.n_streams))
        atomicMax(&any_elided, 1u);
  __syncthreads();
  if (threadIdx.x == 0) {
    FrameHeader h{};
    h.version = tab.version;
    h.flags = encoder_header_flags(flags, any_elided != 0);
    h.dtype = it.dtype;
    h.n_streams = it.n_streams;
    h.raw_size = it.n_bytes;
    h.block_elems = it.block_elems;
    h.n_blocks = nb;
    h.tables_size = ts;
    write_frame_header(dst, h);
    h.header_crc = frame_header_crc(dst, prefix, TableCrc32c{crc_t});
    write_frame_header(dst, h);
    out_sizes[ii] = (size_t)frame;
  }
}

// Packs the staged blocks behind the prefix: one warp per block.
__global__ void __launch_bounds__(kCtaThreads) c_gather_kernel(const CItem* items, uint32_t n_items, const CTab* tabs,
                                                               const uint8_t* staging, const uint32_t* sizes,
                                                               const uint64_t* offs, const int* status) {
  const uint32_t chunk = blockIdx.x;
  const uint32_t ii = find_item(items, n_items, chunk);
  const CItem it = items[ii];
  if (it.status0 != kOk || status[ii] != kOk) return;
  const uint32_t b = (chunk - it.first_chunk) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= it.n_blocks) return;
  const uint64_t prefix = kFrameHeaderSize + tabs[ii].tables_size + 4ull * it.n_blocks;
  const uint32_t* from = (const uint32_t*)(staging + it.staging_off + (uint64_t)b * it.block_stride);
  uint32_t* to = (uint32_t*)(it.dst + prefix + offs[it.first_block + b]);
  const uint32_t words = sizes[it.first_block + b] / 4;
  for (uint32_t j = threadIdx.x % 32; j < words; j += 32) to[j] = from[j];
}

// Residuals of predicted items, element-wise (src/codec/predict.h):
// kPredSplit CTAs per item, grid-stride over its elements (cast) or 8-byte
// words (delta).
constexpr uint32_t kPredSplit = 8;
__global__ void __launch_bounds__(256) c_predict_kernel(const PItem* items, uint32_t n_items) {
  const uint32_t ii = blockIdx.x / kPredSplit;
  if (ii >= n_items) return;
  const PItem it = items[ii];
  const uint64_t first = (uint64_t)(blockIdx.x % kPredSplit) * blockDim.x + threadIdx.x;
  const uint64_t stride = (uint64_t)kPredSplit * blockDim.x;
  if (it.kind == kPredCast) {
    const int ck = it.dtype == kF16 ? tz::predict::kCastF16 : tz::predict::kCastBF16;
    for (uint64_t i = first; i < it.n_bytes / 2; i += stride) {
      store_le16(it.out + 2 * i, load_le16(it.src + 2 * i));
      tz::predict::cast_xor_elem(it.pred, it.out, (size_t)i, ck);
    }
  } else {
    for (uint64_t j = first; j * 8 < it.n_bytes; j += stride) {
      const uint64_t o = j * 8;
      const size_t len = (size_t)min((uint64_t)8, it.n_bytes - o);
      for (size_t k = 0; k < len; ++k) it.out[o + k] = it.src[o + k];
      tz::predict::xor_bytes(it.pred + o, it.out + o, len);
    }
  }
}

}  // namespace
}  // namespace tz::cuda
