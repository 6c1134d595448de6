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
#include "codec/policy_lane_ctx.h"
#include "codec/policy_raw_runs.h"
#include "codec/policy_stream.h"
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
// Coding, packing and prediction kernels: encode_kernels.cuh (c_encode_kernel
// codes the blocks, c_finalize_kernel writes the frame prefix,
// c_gather_kernel packs the blocks behind it, c_predict_kernel forms residuals).
#include "cuda/encode_kernels.cuh"
namespace tz::cuda {
namespace {

// ========================================================== decompress ==
// Kernels: decode_kernels.cuh (d_parse_kernel validates each frame's prefix,
// d_decode_kernel decodes its blocks, d_finish_kernel reports).
}  // namespace
}  // namespace tz::cuda
#include "cuda/decode_kernels.cuh"
namespace tz::cuda {
namespace {

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
  P->off_bmm = o; o = align256(o + (size_t)blocks * kMaxStreams * kRangeBytes);
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
  TZ_LAUNCH(n, 256, 0, stream, c_finalize_kernel)(d_items, tabs, staging, sizes, offs, d_out_sizes, d_status);
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
