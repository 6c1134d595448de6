// CUDA backend: batched frame compression and decompression (doc/cuda.md).
//
// Everything per block reuses the header-only codec (src/codec) and the
// warp helpers of warp_codec.h, so a GPU frame equals the CPU frame byte for
// byte. All device code lives in this one translation unit: the codec headers
// define non-inline __host__ __device__ functions (TZ_HD_NOINLINE), which
// must not be compiled into two objects of the same library.
// TZ_CUDA_EMULATION: tests/cuda/emu compiles this file with the host
// compiler on top of a thread-per-lane emulation of the CUDA primitives used
// here, so the kernels run (slowly) on machines without a GPU.
#ifndef TZ_CUDA_EMULATION
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>
#define TZ_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define TZ_DYNAMIC_SMEM(type, name) extern __shared__ type name[]
#endif

#include <algorithm>
#include <vector>

#include "codec/block.h"
#include "codec/checksum.h"
#include "codec/frame_prefix.h"
#include "codec/policy.h"
#include "codec/predict.h"
#include "cuda/warp_codec.h"
#include "tensorzip/tensorzip_cuda.h"

namespace tz::cuda {
namespace {

constexpr int kWarpsPerCta = 8;  // one codec block per warp, 8 blocks per CTA ("chunk")
constexpr int kCtaThreads = kWarpsPerCta * 32;
constexpr uint32_t kFull = 0xFFFFFFFFu;
// Decode kernel shared memory: dec tables + CRC tables. Frames with lane
// contexts (more tables than streams) go to a second launch with room for
// kMaxFrameTables tables, so plain frames keep the smaller footprint.
constexpr size_t kDecSmem = (size_t)kMaxStreams * kProbScale * 4 + 8 * 256 * 4;
constexpr size_t kDecSmemCtx = (size_t)kMaxFrameTables * kProbScale * 4 + 8 * 256 * 4;

size_t err(int code) { return (size_t) - (ptrdiff_t)code; }
size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// ----------------------------------------------------------- descriptors --
// Per-item descriptors, computed on the host (all sizes are known there) and
// shipped as kernel parameters, so that no host-to-device copy of pageable
// memory (which would synchronise) is needed.
struct CItem {
  const uint8_t* src;
  uint8_t* dst;
  uint64_t n_bytes;
  uint64_t dst_cap;
  uint64_t staging_off;   // first block's bytes in the staging area
  uint32_t block_stride;  // staging bytes per block (block_bound, 16-aligned)
  uint32_t first_block;   // index of block 0 in the batch-wide block arrays
  uint32_t n_blocks;      // 0 if the item is rejected up front
  uint32_t first_chunk;   // index of its first CTA in chunked kernels
  uint32_t block_elems;
  uint8_t dtype;
  uint8_t n_streams;
  uint8_t status0;  // up-front verdict (tz_error_code); non-zero items do no work
  uint8_t pad;
};

struct DItem {
  const uint8_t* src;
  uint8_t* dst;
  uint64_t src_size;
  uint64_t dst_cap;
  uint64_t slot_base;   // first of max_blocks slots in the offsets array
  const uint8_t* pred;  // prediction source (tz_cuda_prediction), if pred_kind
  uint64_t pred_size;
  uint32_t max_blocks;  // bound on n_blocks from src_size and dst_cap
  uint32_t first_chunk;
  uint8_t status0;
  uint8_t pred_kind;    // kPredNone / kPredDelta / kPredCast
  uint8_t pad[6];
};

// Compression with a prediction: src XOR prediction is formed in temp
// memory first (c_predict_kernel), and the item is then coded from there.
struct PItem {
  const uint8_t* src;
  const uint8_t* pred;
  uint8_t* out;
  uint64_t n_bytes;
  uint8_t kind;
  uint8_t dtype;
  uint8_t pad[6];
};

constexpr uint8_t kPredNone = TZ_CUDA_PREDICT_NONE;
constexpr uint8_t kPredDelta = TZ_CUDA_PREDICT_DELTA;
constexpr uint8_t kPredCast = TZ_CUDA_PREDICT_CAST;

template <class Item, int N>
struct DescBatch {
  Item items[N];
  uint32_t base;
  uint32_t count;
};
constexpr int kCBatch = 60;  // keeps kernel parameters under 4 KiB
constexpr int kDBatch = 48;
constexpr int kPBatch = 96;
static_assert(sizeof(DescBatch<CItem, kCBatch>) <= 4000, "kernel parameter size");
static_assert(sizeof(DescBatch<DItem, kDBatch>) <= 4000, "kernel parameter size");
static_assert(sizeof(DescBatch<PItem, kPBatch>) <= 4000, "kernel parameter size");

template <class Item, int N>
__global__ void upload_kernel(const DescBatch<Item, N> b, Item* out) {
  if (threadIdx.x < b.count) out[b.base + threadIdx.x] = b.items[threadIdx.x];
}

template <class Item, int N>
cudaError_t upload(const std::vector<Item>& v, Item* out, cudaStream_t stream) {
  for (size_t base = 0; base < v.size(); base += N) {
    DescBatch<Item, N> b{};
    b.base = (uint32_t)base;
    b.count = (uint32_t)std::min<size_t>(N, v.size() - base);
    for (uint32_t i = 0; i < b.count; ++i) b.items[i] = v[base + i];
    TZ_LAUNCH(1, N, 0, stream, upload_kernel<Item, N>)(b, out);
  }
  return cudaGetLastError();
}

// Largest i with items[i].first_chunk <= chunk (items[0].first_chunk == 0).
// Items without chunks share the next item's value and are skipped.
template <class Item>
__device__ uint32_t find_item(const Item* items, uint32_t n_items, uint32_t chunk) {
  uint32_t lo = 0, hi = n_items;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (items[mid].first_chunk <= chunk) lo = mid; else hi = mid;
  }
  return lo;
}

// Compression kernels: this CTA's item and the first of the kWarpsPerCta
// blocks it takes; false when there is nothing to do (the item failed its
// checks, or the chunk lies past its last block).
__device__ inline bool cta_item_blocks(const CItem* items, uint32_t n_items, uint32_t& ii, uint32_t& b0) {
  ii = find_item(items, n_items, blockIdx.x);
  const CItem& it = items[ii];
  if (it.status0 != kOk) return false;
  b0 = (blockIdx.x - it.first_chunk) * kWarpsPerCta;
  return b0 < it.n_blocks;
}

// Parsed frame of one item (decompression).
struct DState {
  unsigned long long bad;  // min over failing blocks of (block << 8 | status)
  int status;
  FramePrefixView v;       // header, tables and index, validated by d_parse_kernel
};

// CRC32C state update with the CTA's slicing-by-8 tables (frame_header_crc).
struct TableCrc32c {
  const uint32_t* t;
  TZ_HD uint32_t operator()(uint32_t state, const uint8_t* p, size_t n) const {
    return warp::crc32c_update8(state, p, n, t);
  }
};

// ------------------------------------------------------------- helpers --
template <int DT>
__device__ __forceinline__ uint32_t load_elem(const uint8_t* p, uint64_t i) {
  if constexpr (DT == kBF16 || DT == kF16) return ((const uint16_t*)p)[i];
  else if constexpr (DT == kF32) return ((const uint32_t*)p)[i];
  else return p[i];
}
template <int DT>
__device__ __forceinline__ void store_elem(uint8_t* p, uint32_t i, uint32_t v) {
  if constexpr (DT == kBF16 || DT == kF16) ((uint16_t*)p)[i] = (uint16_t)v;
  else if constexpr (DT == kF32) ((uint32_t*)p)[i] = v;
  else p[i] = (uint8_t)v;
}

// Slicing-by-8 CRC tables in shared memory, built by the whole CTA.
__device__ void build_crc_tables(uint32_t* t) {
  for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) warp::crc32c_make_table8_entry(t, i);
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) warp::crc32c_extend_table8(t, i);
  __syncthreads();
}

// Block checksum (codec/checksum.h) by one warp: lane j hashes segments
// j, j+32, ...; every lane then folds the 32 segment CRCs of a round in order
// (shuffles), so all lanes return the same value.
__device__ uint32_t warp_block_checksum(const uint8_t* p, uint64_t bytes, const uint32_t* t, uint32_t lane) {
  const uint64_t n_seg = (bytes + kChecksumSegment - 1) / kChecksumSegment;
  uint32_t acc = ~0u;
  for (uint64_t base = 0; base < n_seg; base += 32) {
    const uint64_t seg = base + lane;
    uint32_t c = 0;
    if (seg < n_seg) {
      const uint64_t off = seg * kChecksumSegment;
      const uint64_t len = bytes - off < kChecksumSegment ? bytes - off : kChecksumSegment;
      c = ~warp::crc32c_update8(~0u, p + off, (size_t)len, t);
    }
    const uint32_t m = (uint32_t)(n_seg - base < 32 ? n_seg - base : 32);
    for (uint32_t j = 0; j < m; ++j) acc = warp::crc32c_fold_segment(acc, __shfl_sync(kFull, c, (int)j), t);
  }
  return ~acc;
}

// ============================================================ compress ==

__global__ void c_init_kernel(const CItem* items, uint32_t n_items, size_t* out_sizes, int* status) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_items) return;
  status[i] = items[i].status0;
  out_sizes[i] = 0;
}

// ------------------------------------------------ tensor-level tables --
// Statistics and decisions: encode_tables.cuh (c_hist_kernel,
// c_joint_kernel, c_table_kernel), by the policy of codec/policy.h.
}  // namespace
}  // namespace tz::cuda
#include "cuda/encode_tables.cuh"
namespace tz::cuda {
namespace {

// rANS-codes field k of one block with a warp (see warp_codec.h for the word
// order). Words are written backwards from the end of the largest payload
// that still beats raw, in place in the block's stream area, then moved down
// behind the 128 state bytes. Returns the payload size, or 0 for raw, with
// exactly the decision of rans_encode(..., limit = n).
// With lane contexts (rc.n > 1), symbol i >= 32 is coded with table
// ctx_of(symbol i - 32) of enc (rc.n tables of 256), as rans_encode_ctx.
template <int DT>
__device__ uint32_t warp_rans_encode(const uint8_t* src, uint32_t n, int k, const RansEncSym* enc, RansCtx rc,
                                     uint8_t* out, uint32_t lane) {
  const int64_t cap = warp::enc_word_cap(n);
  if (cap < 0) return 0;
  uint16_t* const W = (uint16_t*)(out + kRansStateBytes);
  uint32_t wp = (uint32_t)cap;
  uint32_t x = kRansL;
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

// Same bytes as encode_block (codec/block.h) for one block, by one warp:
// stream k is coded with the tables enc[tab0[k]...] of table set
// (sel >> 8k) & 0xFF (lane contexts for stream 0 when ctx0.n > 1).
template <int DT>
__device__ uint32_t warp_encode_block(const uint8_t* src, uint32_t n, const uint8_t* kind, const uint8_t* tab0,
                                      RansCtx ctx0, uint32_t sel, const RansEncSym (*enc)[256],
                                      const uint32_t* crc_t, uint8_t* out, uint32_t lane, uint32_t salt) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  constexpr uint32_t es = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  const uint32_t crc = warp_block_checksum(src, (uint64_t)n * es, crc_t, lane) ^ salt;
  uint32_t pos = (uint32_t)block_header_size(K);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t size = 0;
    uint8_t mode = kModeRaw;
    if (kind_is_rans(kind[k])) {
      size = warp_rans_encode<DT>(src, n, k, enc[tab0[k]], k == 0 ? ctx0 : RansCtx{}, out + pos, lane);
      if (size) mode = kModeRans;
    }
    if (mode == kModeRaw) {
      __syncwarp();  // a failed rANS attempt wrote words here from other lanes
      warp_raw_stream<DT>(src, n, k, out + pos, lane);
      size = n;
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
      if (!kind_is_rans(tab.kind[k])) continue;
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
#define TZ_WARP_ENCODE(DT) warp_encode_block<DT>(src, n, kind, tab0, ctx0, sel, enc, crc_t, out, lane, salt)
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
__global__ void __launch_bounds__(256) c_finalize_kernel(const CItem* items, const CTab* tabs, const uint32_t* sizes,
                                                         uint64_t* offs, size_t* out_sizes, int* status) {
  using Scan = cub::BlockScan<unsigned long long, 256>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t crc_t[8 * 256];
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
  __syncthreads();
  if (threadIdx.x == 0) {
    FrameHeader h{};
    h.version = tab.version;
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

// ========================================================== decompress ==

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

// Decodes one block with a warp: the block header validated by parse_block
// (codec/block.h, as on the CPU), then all streams in lock step (one symbol
// of every field per lane and step) so the fields merge straight into dst,
// then the segmented checksum of dst.
// Ctx: the frame has a lane-context stream (kind 3); without it the per-
// symbol table offset and context update are compiled out.
// dec + tab0[k] * kProbScale: stream k's tables in the block's table set;
// n_sets: the streams' set counts (format version 3), else null.
template <int DT, bool Ctx>
__device__ int warp_decode_block(const uint8_t* blk, uint32_t blk_size, uint32_t n, const uint8_t* kind,
                                 const uint8_t* n_sets, const uint32_t* dec, const uint8_t* tab0,
                                 const uint8_t* ctx_base, const uint8_t* ctx_n, const uint32_t* crc_t, uint8_t* dst,
                                 uint32_t lane, uint32_t salt) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  constexpr uint32_t es = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  BlockView v;
  const int pst = parse_block_k<K>(kind, n_sets, blk, blk_size, n, &v);
  if (pst != kOk) return pst;
  const uint32_t stored = v.checksum;
  // Modes are raw or rANS: zstd passes parse_block only in a frame with a
  // zstd kind, which d_parse_kernel leaves to the CPU.
  const uint8_t* const* pay = v.payload;
  const uint32_t* psz = v.size;
  bool coded[K];
#pragma unroll
  for (int k = 0; k < K; ++k) coded[k] = v.mode[k] == kModeRans;

  uint32_t x[K], p[K], coff[K];  // coff: this lane's table offset (lane context x kProbScale)
  RansCtx rc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    x[k] = coded[k] ? ((const uint32_t*)pay[k])[lane] : 0;
    p[k] = kRansStateBytes;
    coff[k] = 0;
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
        if (active) {
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
        f[k] = active ? pay[k][i] : 0;
      }
    }
    if (active) store_elem<DT>(dst, i, warp::elem_merge<DT>(f));
  }
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (coded[k] && (p[k] != psz[k] || !__all_sync(kFull, x[k] == kRansL))) return kErrCorruptBlock;
  __syncwarp();
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
      int st;
#define TZ_WARP_DECODE(DT)                                                                                       \
  (has_ctx ? warp_decode_block<DT, true>(blk, bsz, n, kind, ns, dec, tab0, ctx_base, ctx_n, crc_t, dst, lane, salt) \
           : warp_decode_block<DT, false>(blk, bsz, n, kind, ns, dec, tab0, ctx_base, ctx_n, crc_t, dst, lane, salt))
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

// ================================================================ host ==

struct CPlan {
  std::vector<CItem> items;
  std::vector<PItem> preds;       // predicted items (out = offset into the residual area until placed)
  std::vector<uint32_t> pred_of;  // item index of each entry of preds
  size_t off_pdesc = 0, off_resid = 0;
  size_t off_desc = 0, off_tab = 0, off_bhist = 0, off_bcount = 0, off_bmm = 0, off_bset = 0, off_sizes = 0,
         off_offs = 0, off_staging = 0, total = 0;
  uint32_t total_blocks = 0, total_chunks = 0, block_elems = 0;
  int level = 1;
};

size_t plan_compress(const tz_cuda_compress_item* items, size_t n_items, const tz_params* params, bool check_ptrs,
                     CPlan* P) {
  if (n_items && !items) return err(kErrBadParam);
  if (n_items > UINT32_MAX / 2) return err(kErrBadParam);
  tz_params p{};
  if (params) p = *params;
  if (!encode_level_valid(p.level)) return err(kErrBadParam);
  // Level 3 adds the CPU's exhaustive lane-context search
  // (src/cpu/frame_tables.cpp, choose_lane_contexts), which this encoder
  // does not run: refused rather than producing frames that differ from the
  // CPU's. Its frames decode here like any other.
  if (p.level == 3) return err(kErrUnsupported);
  P->level = policy_level(p.level);
  const uint32_t be = policy_block_elems(p.block_elems, kBF16);  // float dtypes only here
  if (!block_elems_valid(be)) return err(kErrBadParam);
  P->block_elems = be;
  P->items.resize(n_items);
  uint64_t blocks = 0, chunks = 0, staging = 0, resid = 0;
  for (size_t i = 0; i < n_items; ++i) {
    const tz_cuda_compress_item& in = items[i];
    CItem& c = P->items[i];
    c = CItem{};
    c.src = (const uint8_t*)in.src;
    c.dst = (uint8_t*)in.dst;
    c.n_bytes = in.src_size;
    c.dst_cap = in.dst_capacity;
    c.block_elems = be;
    const unsigned dt = (unsigned)in.dtype;
    int st = kOk;
    if (dt >= kDTypeCount) st = kErrBadParam;
    else if (encode_dtype((uint8_t)dt, in.src_size) == kBytes) st = kErrUnsupported;  // the CPU's zstd path
    else if (!encode_size_valid(in.src_size)) st = kErrBadParam;
    uint64_t nb = 0;
    if (st == kOk) {
      uint32_t nb32 = 0;
      if (encode_block_count(in.src_size / dtype_elem_size((uint8_t)dt), be, &nb32)) nb = nb32;
      else st = kErrBadParam;
    }
    c.dtype = st == kOk ? (uint8_t)dt : (uint8_t)kBF16;
    c.n_streams = (uint8_t)dtype_stream_count(c.dtype);
    if (st != kOk) nb = 0;
    c.n_blocks = (uint32_t)nb;
    c.first_block = (uint32_t)blocks;
    c.first_chunk = (uint32_t)chunks;
    c.block_stride = (uint32_t)((block_bound(be, c.n_streams) + 15) & ~(size_t)15);
    c.staging_off = staging;
    blocks += nb;
    chunks += (nb + kWarpsPerCta - 1) / kWarpsPerCta;
    staging += nb * c.block_stride;
    if (check_ptrs && st == kOk) {
      const uint32_t es = dtype_elem_size(c.dtype);
      if ((in.src_size && !in.src) || ((uintptr_t)in.src % es) != 0) st = kErrBadParam;
      else if (!in.dst || ((uintptr_t)in.dst % 4) != 0) st = kErrBadParam;
    }
    const tz_cuda_prediction& pr = in.predict;
    if (pr.kind != TZ_CUDA_PREDICT_NONE) {
      if (pr.kind != TZ_CUDA_PREDICT_DELTA && pr.kind != TZ_CUDA_PREDICT_CAST) st = kErrBadParam;
      if (st == kOk && pr.kind == TZ_CUDA_PREDICT_CAST &&
          ((c.dtype != kBF16 && c.dtype != kF16) || pr.src_size / 2 < in.src_size))
        st = kErrBadParam;
      if (st == kOk && pr.kind == TZ_CUDA_PREDICT_DELTA && pr.src_size < in.src_size) st = kErrBadParam;
      if (st == kOk && check_ptrs && in.src_size &&
          (!pr.src || ((uintptr_t)pr.src % (pr.kind == TZ_CUDA_PREDICT_CAST ? 4 : 1)) != 0))
        st = kErrBadParam;
      if (st == kOk && in.src_size) {
        PItem q{};
        q.src = (const uint8_t*)in.src;
        q.pred = (const uint8_t*)pr.src;
        q.out = (uint8_t*)(uintptr_t)resid;  // offset; placed by tz_cuda_compress
        q.n_bytes = in.src_size;
        q.kind = (uint8_t)pr.kind;
        q.dtype = c.dtype;
        P->preds.push_back(q);
        P->pred_of.push_back((uint32_t)i);
        resid += align256(in.src_size);
      }
    }
    c.status0 = (uint8_t)st;
  }
  if (blocks > UINT32_MAX || chunks > (uint64_t)INT32_MAX) return err(kErrBadParam);
  P->total_blocks = (uint32_t)blocks;
  P->total_chunks = (uint32_t)chunks;
  size_t o = 0;
  P->off_desc = o; o = align256(o + n_items * sizeof(CItem));
  P->off_tab = o; o = align256(o + n_items * sizeof(CTab));
  P->off_bhist = o; o = align256(o + (size_t)blocks * kMaxStreams * 256 * 4);
  P->off_bcount = o; o = align256(o + (size_t)blocks * 8);
  P->off_bmm = o; o = align256(o + (size_t)blocks * kMaxStreams * 2);
  P->off_bset = o; o = align256(o + (size_t)blocks * kMaxStreams);
  P->off_sizes = o; o = align256(o + (size_t)blocks * 4);
  P->off_offs = o; o = align256(o + (size_t)blocks * 8);
  P->off_staging = o; o = align256(o + staging);
  P->off_pdesc = o; o = align256(o + P->preds.size() * sizeof(PItem));
  P->off_resid = o; o = align256(o + resid);
  P->total = o;
  return 0;
}

struct DPlan {
  std::vector<DItem> items;
  size_t off_desc = 0, off_state = 0, off_offs = 0, total = 0;
  uint32_t total_chunks = 0;
};

size_t plan_decompress(const tz_cuda_decompress_item* items, size_t n_items, bool check_ptrs, DPlan* P) {
  if (n_items && !items) return err(kErrBadParam);
  if (n_items > UINT32_MAX / 2) return err(kErrBadParam);
  P->items.resize(n_items);
  uint64_t slots = 0, chunks = 0;
  for (size_t i = 0; i < n_items; ++i) {
    const tz_cuda_decompress_item& in = items[i];
    DItem& d = P->items[i];
    d = DItem{};
    d.src = (const uint8_t*)in.src;
    d.dst = (uint8_t*)in.dst;
    d.src_size = in.src_size;
    d.dst_cap = in.dst_capacity;
    d.pred = (const uint8_t*)in.predict.src;
    d.pred_size = in.predict.src_size;
    d.pred_kind = (uint8_t)in.predict.kind;
    // A valid frame has n_blocks <= ceil(raw / 4096) <= ceil(dst_cap / 4096)
    // (a block holds >= 4096 bytes except the last) and >= 12 bytes per
    // block (header + index entry) after the 32-byte header.
    uint64_t mb = (in.dst_capacity + 4095) / 4096;
    const uint64_t by_src = in.src_size < kFrameHeaderSize ? 0 : (in.src_size - kFrameHeaderSize) / 12;
    mb = std::min(mb, by_src);
    mb = std::min<uint64_t>(mb, UINT32_MAX);
    d.max_blocks = (uint32_t)mb;
    d.slot_base = slots;
    d.first_chunk = (uint32_t)chunks;
    slots += mb;
    chunks += (mb + kWarpsPerCta - 1) / kWarpsPerCta;
    int st = kOk;
    if (check_ptrs && (!in.src || ((uintptr_t)in.src % 4) != 0)) st = kErrBadParam;  // null: as the CPU
    if (in.predict.kind != TZ_CUDA_PREDICT_NONE && in.predict.kind != TZ_CUDA_PREDICT_DELTA &&
        in.predict.kind != TZ_CUDA_PREDICT_CAST)
      st = kErrBadParam;
    d.status0 = (uint8_t)st;
  }
  if (chunks > (uint64_t)INT32_MAX) return err(kErrBadParam);
  P->total_chunks = (uint32_t)chunks;
  size_t o = 0;
  P->off_desc = o; o = align256(o + n_items * sizeof(DItem));
  P->off_state = o; o = align256(o + n_items * sizeof(DState));
  P->off_offs = o; o = align256(o + (size_t)slots * 8);
  P->total = o;
  return 0;
}

size_t launch_status(cudaError_t e) { return e == cudaSuccess ? 0 : err(kErrGeneric); }

}  // namespace
}  // namespace tz::cuda

using namespace tz;
using namespace tz::cuda;

extern "C" size_t tz_cuda_compress_temp_size(const tz_cuda_compress_item* items, size_t n_items,
                                             const tz_params* params) {
  CPlan P;
  const size_t r = plan_compress(items, n_items, params, false, &P);
  return r ? r : P.total;
}

extern "C" size_t tz_cuda_compress(const tz_cuda_compress_item* items, size_t n_items, const tz_params* params,
                                   void* temp, size_t temp_size, size_t* d_out_sizes, int* d_status,
                                   cudaStream_t stream) {
  if (n_items == 0) return 0;
  if (!d_out_sizes || !d_status || !temp) return err(kErrBadParam);
  if ((uintptr_t)temp % 256) return err(kErrBadParam);
  CPlan P;
  const size_t r = plan_compress(items, n_items, params, true, &P);
  if (r) return r;
  if (temp_size < P.total) return err(kErrDstTooSmall);
  uint8_t* t = (uint8_t*)temp;
  CItem* d_items = (CItem*)(t + P.off_desc);
  CTab* tabs = (CTab*)(t + P.off_tab);
  uint32_t* sizes = (uint32_t*)(t + P.off_sizes);
  uint64_t* offs = (uint64_t*)(t + P.off_offs);
  uint8_t* staging = t + P.off_staging;
  const uint32_t n = (uint32_t)n_items;
  // Predicted items are coded from their residuals, formed first in temp.
  for (size_t k = 0; k < P.preds.size(); ++k) {
    P.preds[k].out = t + P.off_resid + (size_t)(uintptr_t)P.preds[k].out;
    P.items[P.pred_of[k]].src = P.preds[k].out;
  }
  if (!P.preds.empty()) {
    PItem* d_preds = (PItem*)(t + P.off_pdesc);
    if (size_t e = launch_status(upload<PItem, kPBatch>(P.preds, d_preds, stream))) return e;
    TZ_LAUNCH((uint32_t)P.preds.size() * kPredSplit, 256, 0, stream, c_predict_kernel)(d_preds,
                                                                                         (uint32_t)P.preds.size());
  }
  if (size_t e = launch_status(upload<CItem, kCBatch>(P.items, d_items, stream))) return e;
  TZ_LAUNCH((n + 255) / 256, 256, 0, stream, c_init_kernel)(d_items, n, d_out_sizes, d_status);
  CBlockStats bs{(uint32_t*)(t + P.off_bhist), (uint64_t*)(t + P.off_bcount), t + P.off_bmm, t + P.off_bset,
                  P.total_blocks};
  if (cudaMemsetAsync(tabs, 0, n_items * sizeof(CTab), stream) != cudaSuccess ||
      (P.total_blocks && cudaMemsetAsync(bs.set, 0, (size_t)P.total_blocks * kMaxStreams, stream) != cudaSuccess))
    return err(kErrGeneric);
  // The stages of encode_tables.cuh: first pass and decision, exact
  // per-block histograms, lane-context joint histograms (first-pass, exact).
  const bool stats = P.level >= 1 && P.total_chunks;
  if (stats)
    TZ_LAUNCH(P.total_chunks, kCtaThreads, 0, stream, c_hist_kernel)(d_items, n, P.level, 1, tabs, bs);
  TZ_LAUNCH((n + 7) / 8, 256, 0, stream, c_table_kernel)(d_items, n, P.level, 1, tabs, bs);
  if (stats && policy_sampled(P.block_elems)) {
    TZ_LAUNCH(P.total_chunks, kCtaThreads, 0, stream, c_hist_kernel)(d_items, n, P.level, 2, tabs, bs);
    TZ_LAUNCH((n + 7) / 8, 256, 0, stream, c_table_kernel)(d_items, n, P.level, 2, tabs, bs);
  }
  if (stats) {
    for (int phase = 3; phase <= 4; ++phase) {
      TZ_LAUNCH(P.total_chunks, kCtaThreads, 0, stream, c_joint_kernel)(d_items, n, tabs);
      TZ_LAUNCH((n + 7) / 8, 256, 0, stream, c_table_kernel)(d_items, n, P.level, phase, tabs, bs);
    }
  }
  if (P.total_chunks)
    TZ_LAUNCH(P.total_chunks, kCtaThreads, 0, stream, c_encode_kernel)(d_items, n, tabs, bs, staging, sizes);
  TZ_LAUNCH(n, 256, 0, stream, c_finalize_kernel)(d_items, tabs, sizes, offs, d_out_sizes, d_status);
  if (P.total_chunks)
    TZ_LAUNCH(P.total_chunks, kCtaThreads, 0, stream, c_gather_kernel)(d_items, n, tabs, staging, sizes, offs, d_status);
  return launch_status(cudaGetLastError());
}

extern "C" size_t tz_cuda_decompress_temp_size(const tz_cuda_decompress_item* items, size_t n_items) {
  DPlan P;
  const size_t r = plan_decompress(items, n_items, false, &P);
  return r ? r : P.total;
}

extern "C" size_t tz_cuda_decompress(const tz_cuda_decompress_item* items, size_t n_items, void* temp,
                                     size_t temp_size, size_t* d_out_sizes, int* d_status, cudaStream_t stream) {
  if (n_items == 0) return 0;
  if (!d_out_sizes || !d_status || !temp) return err(kErrBadParam);
  if ((uintptr_t)temp % 256) return err(kErrBadParam);
  DPlan P;
  const size_t r = plan_decompress(items, n_items, true, &P);
  if (r) return r;
  if (temp_size < P.total) return err(kErrDstTooSmall);
  uint8_t* t = (uint8_t*)temp;
  DItem* d_items = (DItem*)(t + P.off_desc);
  DState* states = (DState*)(t + P.off_state);
  uint64_t* offs = (uint64_t*)(t + P.off_offs);
  const uint32_t n = (uint32_t)n_items;
  if (size_t e = launch_status(upload<DItem, kDBatch>(P.items, d_items, stream))) return e;
  TZ_LAUNCH((n + 7) / 8, 256, 0, stream, d_parse_kernel)(d_items, n, states, offs);
  if (P.total_chunks) {
    if (cudaFuncSetAttribute((const void*)d_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)kDecSmemCtx) != cudaSuccess)
      return err(kErrGeneric);
    TZ_LAUNCH(P.total_chunks, kCtaThreads, kDecSmem, stream, d_decode_kernel)(d_items, n, states, offs, 0);
    TZ_LAUNCH(P.total_chunks, kCtaThreads, kDecSmemCtx, stream, d_decode_kernel)(d_items, n, states, offs, 1);
  }
  TZ_LAUNCH((n + 255) / 256, 256, 0, stream, d_finish_kernel)(states, n, d_out_sizes, d_status);
  return launch_status(cudaGetLastError());
}

namespace {
// Runs a one-item batch with temp memory from the stream-ordered allocator
// and waits for it.
template <class F>
size_t run_one(size_t temp_bytes, cudaStream_t stream, F&& call) {
  if (tz_is_error(temp_bytes)) return temp_bytes;
  void* mem = nullptr;
  const size_t res_off = align256(temp_bytes);
  if (cudaMallocAsync(&mem, res_off + 256, stream) != cudaSuccess) return err(kErrAlloc);
  size_t* d_size = (size_t*)((uint8_t*)mem + res_off);
  int* d_status = (int*)((uint8_t*)mem + res_off + 16);
  size_t r = call(mem, temp_bytes, d_size, d_status);
  size_t h_size = 0;
  int h_status = kErrGeneric;
  if (!r) {
    if (cudaMemcpyAsync(&h_size, d_size, sizeof h_size, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaMemcpyAsync(&h_status, d_status, sizeof h_status, cudaMemcpyDeviceToHost, stream) != cudaSuccess)
      r = err(kErrGeneric);
  }
  cudaFreeAsync(mem, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess && !r) r = err(kErrGeneric);
  if (r) return r;
  return h_status == kOk ? h_size : err(h_status);
}
}  // namespace

extern "C" size_t tz_cuda_compress_tensor(void* dst, size_t dst_capacity, const void* src, size_t src_size,
                                          const tz_params* params, cudaStream_t stream) {
  if (!params) return err(kErrBadParam);
  const tz_cuda_compress_item item{src, src_size, params->dtype, dst, dst_capacity, {}};
  return run_one(tz_cuda_compress_temp_size(&item, 1, params), stream,
                 [&](void* temp, size_t tb, size_t* ds, int* st) {
                   return tz_cuda_compress(&item, 1, params, temp, tb, ds, st, stream);
                 });
}

extern "C" size_t tz_cuda_decompress_tensor(void* dst, size_t dst_capacity, const void* src, size_t src_size,
                                            cudaStream_t stream) {
  const tz_cuda_decompress_item item{src, src_size, dst, dst_capacity, {}};
  return run_one(tz_cuda_decompress_temp_size(&item, 1), stream, [&](void* temp, size_t tb, size_t* ds, int* st) {
    return tz_cuda_decompress(&item, 1, temp, tb, ds, st, stream);
  });
}
