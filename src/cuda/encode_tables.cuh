// CUDA encoder, tensor-level statistics and decisions (format version 3,
// doc/format.md 9): per-block histograms, min/max and lane-context joint
// histograms taken by c_hist_kernel / c_joint_kernel, decided by
// c_table_kernel with one warp per item and lane k per stream, through the
// policy functions of codec/policy.h that the CPU encoder
// (src/cpu/frame_tables.cpp) calls, on the same statistics, so that frames
// are byte-identical. Part of cuda_codec.cu's translation unit (included
// from it; see the note there on TZ_HD_NOINLINE).
//
// Stages of an item (CTab::stage), each ended by a table-kernel launch:
//   after the first pass        every item: screening; fast or unsampled
//                               items decide their streams, the others
//                               wait for exact per-block histograms;
//   kStageExact                 exact per-block histograms of the wanted
//                               streams taken: decide;
//   kStageJoint                 lane contexts tried: the joint histogram of
//                               the first-pass elements taken: search;
//   kStageJointExact            promising contexts of an exactly counted
//                               item: joint histogram of whole blocks taken;
//   kStageDone                  tables final, table section written.
#pragma once

namespace tz::cuda {
namespace {

enum CStage : uint8_t { kStageFirst = 0, kStageExact, kStageJoint, kStageJointExact, kStageDone };

// Tensor-level tables of one item (compression).
struct CTab {
  uint32_t freq[kMaxFrameTablesV3][256];  // final: stream k's tables from first_table[k]
  unsigned long long total[kMaxStreams][256];  // first-pass histograms over all blocks
  unsigned long long joint[kCtxJointRows * 256];
  uint32_t cfreq[kMaxContexts][256];  // candidate lane-context tables of stream 0
  uint64_t coded[kMaxStreams];
  uint32_t tables_size;
  uint32_t wlo;  // lane-context window
  uint8_t kind[kMaxStreams];
  uint8_t n_sets[kMaxStreams];
  uint8_t first_table[kMaxStreams];
  uint8_t region[kMaxStreams];  // where lane k's candidate tables are written while deciding
  uint8_t ctx_base, ctx_n;      // lane contexts of stream 0 (ctx_n = 1: none)
  uint8_t want;                 // streams screened in by the sample (bit k)
  uint8_t stage;
  uint8_t fast;                 // policy_fast_tables
  uint8_t version;
  uint8_t range0[kRangeBytes];  // stream 0's range over the tensor (fast tables, policy_range_has)
  // Working arrays of lane k (global memory: the driver reserves local
  // memory for every resident thread).
  struct Scratch {
    SegScratch seg;
    TableScratch ts;
    uint64_t norm[256];
    uint32_t f[256];
    uint32_t freq1[256];
  } scratch[kMaxStreams];
  uint8_t tables[kMaxTablesSizeV3];
};

// Batch-wide per-block arrays (indexed by CItem::first_block + b).
struct CBlockStats {
  uint32_t* hist;  // (block * kMaxStreams + k) * 256 counts
  uint64_t* counted;  // elements counted in the block's histogram
  uint8_t* mm;     // (block * kMaxStreams + k) * kRangeBytes: range (fast tables, policy_range_of)
  uint8_t* set;    // k * total_blocks + block: table set
  uint32_t total_blocks;
};

// Per-block histograms of the streams in `want` over the first `limit`
// elements of blocks b0.. of the chunk (warp w: block b0 + w), with
// `minmax` each wanted stream's range over the whole block (policy_range_of:
// its extremes, the signed ones as the unsigned extremes of byte ^ 0x80),
// with `totals` also added to the item's first-pass histograms.
struct RangeShared {
  uint32_t lo[kWarpsPerCta][kMaxStreams], hi[kWarpsPerCta][kMaxStreams];
  uint32_t slo[kWarpsPerCta][kMaxStreams], shi[kWarpsPerCta][kMaxStreams];  // extremes of byte ^ 0x80
};
template <int DT>
__device__ void hist_blocks(const CItem& it, uint32_t b0, uint32_t limit, uint32_t want, bool minmax, bool totals,
                            uint32_t (*h)[kMaxStreams][256], RangeShared& sr, const CBlockStats& bs, CTab& tab) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (uint32_t j = threadIdx.x; j < kWarpsPerCta * kMaxStreams * 256; j += blockDim.x) (&h[0][0][0])[j] = 0;
  if (threadIdx.x < kWarpsPerCta * kMaxStreams) {
    (&sr.lo[0][0])[threadIdx.x] = 255;
    (&sr.hi[0][0])[threadIdx.x] = 0;
    (&sr.slo[0][0])[threadIdx.x] = 255;
    (&sr.shi[0][0])[threadIdx.x] = 0;
  }
  __syncthreads();
  const uint64_t n_elems = it.n_bytes / dtype_elem_size(DT);
  const uint32_t b = b0 + w;
  const bool active = b < it.n_blocks;
  uint64_t e0 = 0, e1 = 0, hend = 0;
  if (active) {
    e0 = (uint64_t)b * it.block_elems;
    e1 = min(n_elems, e0 + it.block_elems);
    hend = min(e1, e0 + limit);
    uint32_t lo[K], hi[K], slo[K], shi[K];
#pragma unroll
    for (int k = 0; k < K; ++k) lo[k] = 255, hi[k] = 0, slo[k] = 255, shi[k] = 0;
    const uint64_t end = minmax ? e1 : hend;
    for (uint64_t i = e0 + lane; i < end; i += 32) {
      const uint32_t v = load_elem<DT>(it.src, i);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!((want >> k) & 1u)) continue;
        const uint32_t f = warp::elem_field<DT>(v, k);
        if (i < hend) atomicAdd(&h[w][k][f], 1u);
        lo[k] = f < lo[k] ? f : lo[k];
        hi[k] = f > hi[k] ? f : hi[k];
        const uint32_t sf = f ^ 0x80u;
        slo[k] = sf < slo[k] ? sf : slo[k];
        shi[k] = sf > shi[k] ? sf : shi[k];
      }
    }
    if (minmax) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        atomicMin(&sr.lo[w][k], lo[k]);
        atomicMax(&sr.hi[w][k], hi[k]);
        atomicMin(&sr.slo[w][k], slo[k]);
        atomicMax(&sr.shi[w][k], shi[k]);
      }
    }
  }
  __syncthreads();
  if (!active) return;
  const uint64_t gb = (uint64_t)it.first_block + b;
  for (uint32_t j = lane; j < (uint32_t)K * 256; j += 32) {
    const uint32_t k = j / 256, s = j % 256;
    if (!((want >> k) & 1u)) continue;
    const uint32_t c = h[w][k][s];
    bs.hist[(gb * kMaxStreams + k) * 256 + s] = c;
    if (totals && c) atomicAdd(&tab.total[k][s], (unsigned long long)c);
  }
  if (lane == 0) bs.counted[gb] = hend - e0;
  if (minmax && lane < (uint32_t)K && ((want >> lane) & 1u)) {
    policy_range_of(sr.lo[w][lane], sr.hi[w][lane], (int32_t)(int8_t)(uint8_t)(sr.shi[w][lane] ^ 0x80u),
                    (int32_t)(int8_t)(uint8_t)(sr.slo[w][lane] ^ 0x80u), bs.mm + (gb * kMaxStreams + lane) * kRangeBytes);
  }
}

// Phase 1: every item, every stream, over the first-pass elements, ranges
// where fast tables apply. Phase 2: the items waiting for exact counts
// (kStageExact), their wanted streams, whole blocks.
__global__ void __launch_bounds__(kCtaThreads) c_hist_kernel(const CItem* items, uint32_t n_items, int level,
                                                             int phase, CTab* tabs, CBlockStats bs) {
  __shared__ uint32_t h[kWarpsPerCta][kMaxStreams][256];
  __shared__ RangeShared sr;
  uint32_t ii, b0;
  if (!cta_item_blocks(items, n_items, ii, b0)) return;
  const CItem it = items[ii];
  CTab& tab = tabs[ii];
  uint32_t limit = it.block_elems, want = 0xFu;
  bool minmax = false, totals = false;
  if (phase == 1) {
    // Short path (policy_codes_streams: e.g. too small for any stream to
    // pay): every stream raw, decided by c_table_kernel from sizes alone.
    if (!policy_codes_streams(level, it.dtype, it.n_bytes / dtype_elem_size(it.dtype), it.n_blocks)) return;
    limit = policy_first_pass_elems(it.block_elems);
    minmax = policy_fast_tables(it.block_elems, level, it.n_blocks);
    totals = true;
  } else {
    if (tab.stage != kStageExact) return;
    want = tab.want;
  }
  switch (it.dtype) {
    case kBF16: hist_blocks<kBF16>(it, b0, limit, want, minmax, totals, h, sr, bs, tab); break;
    case kF16: hist_blocks<kF16>(it, b0, limit, want, minmax, totals, h, sr, bs, tab); break;
    case kF32: hist_blocks<kF32>(it, b0, limit, want, minmax, totals, h, sr, bs, tab); break;
    default: hist_blocks<kF8E4M3>(it, b0, limit, want, minmax, totals, h, sr, bs, tab); break;
  }
}

// Joint histogram of stream 0 (policy_ctx_row of the lane predecessor x
// symbol) of items in kStageJoint (first-pass elements) or kStageJointExact
// (whole blocks): one shared histogram per CTA, added to the item's.
template <int DT>
__device__ void joint_blocks(const CItem& it, uint32_t b0, uint32_t limit, uint32_t wlo, uint32_t* J, CTab& tab) {
  for (uint32_t j = threadIdx.x; j < kCtxJointRows * 256; j += blockDim.x) J[j] = 0;
  __syncthreads();
  const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t n_elems = it.n_bytes / dtype_elem_size(DT);
  const uint32_t b = b0 + w;
  if (b < it.n_blocks) {
    const uint64_t e0 = (uint64_t)b * it.block_elems;
    const uint64_t end = min(min(n_elems, e0 + it.block_elems), e0 + limit);
    for (uint64_t i = e0 + lane; i < end; i += 32) {
      const uint32_t s = warp::elem_field<DT>(load_elem<DT>(it.src, i), 0);
      const uint32_t row = i - e0 < 32 ? 0u : policy_ctx_row(warp::elem_field<DT>(load_elem<DT>(it.src, i - 32), 0), wlo);
      atomicAdd(&J[row * 256 + s], 1u);
    }
  }
  __syncthreads();
  for (uint32_t j = threadIdx.x; j < kCtxJointRows * 256; j += blockDim.x)
    if (J[j]) atomicAdd(&tab.joint[j], (unsigned long long)J[j]);
}

__global__ void __launch_bounds__(kCtaThreads) c_joint_kernel(const CItem* items, uint32_t n_items, CTab* tabs) {
  __shared__ uint32_t J[kCtxJointRows * 256];
  uint32_t ii, b0;
  if (!cta_item_blocks(items, n_items, ii, b0)) return;
  const CItem it = items[ii];
  CTab& tab = tabs[ii];
  if (tab.stage != kStageJoint && tab.stage != kStageJointExact) return;
  const uint32_t limit = tab.stage == kStageJoint ? policy_first_pass_elems(it.block_elems) : it.block_elems;
  switch (it.dtype) {
    case kBF16: joint_blocks<kBF16>(it, b0, limit, tab.wlo, J, tab); break;
    case kF16: joint_blocks<kF16>(it, b0, limit, tab.wlo, J, tab); break;
    case kF32: joint_blocks<kF32>(it, b0, limit, tab.wlo, J, tab); break;
    default: joint_blocks<kF8E4M3>(it, b0, limit, tab.wlo, J, tab); break;
  }
}

// The table section and frame version of an item whose tables are final
// (lane 0): stream k's tables moved from its region to first_table[k].
__device__ void finish_tables(CTab& tab, int K) {
  uint32_t at = 0;
  bool any = false;
  for (int k = 0; k < K; ++k) {
    const uint32_t nt = kind_is_rans(tab.kind[k]) ? (uint32_t)tab.n_sets[k] * (k == 0 ? tab.ctx_n : 1u) : 0u;
    // Regions are in stream order and at least as far as the final place.
    if (nt && tab.region[k] != at)
      for (uint32_t j = 0; j < nt * 256; ++j) tab.freq[at][j] = tab.freq[tab.region[k]][j];
    tab.first_table[k] = (uint8_t)at;
    at += nt;
    any |= nt > 0;
  }
  tab.version = any ? kFormatVersionSets : kFormatVersion;
  size_t n = 0;
  for (int k = 0; k < K; ++k) {
    const RansCtx rc = k == 0 && tab.ctx_n > 1 ? RansCtx{tab.ctx_base, tab.ctx_n} : RansCtx{};
    if (any)
      n += write_stream_table_v3(tab.kind[k], tab.freq[tab.first_table[k]], rc, tab.n_sets[k], tab.tables + n);
    else
      n += write_stream_table(tab.kind[k], tab.freq[tab.first_table[k]], rc, tab.tables + n);
  }
  const uint32_t padded = (uint32_t)align4(n);
  for (uint32_t j = (uint32_t)n; j < padded; ++j) tab.tables[j] = 0;
  tab.tables_size = padded;
  tab.stage = kStageDone;
}

// Lane k decides stream k from the per-block histograms
// (policy_decide_stream, codec/policy_stream.h, as choose_tables on the
// CPU); then lane 0 tries lane contexts or finishes.
__device__ void decide_streams(const CItem& it, int level, CTab& tab, const CBlockStats& bs, uint32_t lane) {
  const int K = it.n_streams;
  const uint64_t n_elems = it.n_bytes / dtype_elem_size(it.dtype);
  const uint32_t B = it.n_blocks;
  const int n_wanted = __popc(tab.want);
  const uint32_t max_sets = policy_max_sets(B, n_wanted, level);
  const bool fast = tab.fast;
  if ((int)lane < K && ((tab.want >> lane) & 1u)) {
    const uint32_t k = lane;
    CTab::Scratch& W = tab.scratch[k];
    const uint32_t* hist = bs.hist + ((uint64_t)it.first_block * kMaxStreams + k) * 256;
    const uint64_t* counted = bs.counted + it.first_block;
    const uint8_t* mm = bs.mm + ((uint64_t)it.first_block * kMaxStreams + k) * kRangeBytes;
    uint8_t* set_of = bs.set + (uint64_t)k * bs.total_blocks + it.first_block;
    uint64_t cnt = 0;
    for (uint32_t b = 0; b < B; ++b) cnt += counted[b];
    uint32_t* region = tab.freq[tab.region[k]];
    const StreamChoice c = policy_decide_stream(level, hist, kMaxStreams * 256, counted, cnt, B, it.block_elems,
                                                n_elems, max_sets, fast, mm, kRangeBytes * kMaxStreams, W.freq1,
                                                region, set_of, &W.seg, &W.ts);
    if (c.kind == kKindRans && !c.use_sets)
      for (uint32_t s = 0; s < 256; ++s) region[s] = W.freq1[s];
    if (!c.use_sets)
      for (uint32_t b = 0; b < B; ++b) set_of[b] = 0;
    tab.kind[k] = c.kind;
    tab.n_sets[k] = (uint8_t)c.n_sets;
    tab.coded[k] = c.coded;
  }
  __syncwarp();
  if (lane != 0) return;
  if (policy_tries_window_contexts(level, tab.kind[0], n_elems, dtype_elem_size(it.dtype), fast)) {
    tab.wlo = policy_ctx_window((const uint64_t*)tab.total[0]);
    for (uint32_t j = 0; j < kCtxJointRows * 256; ++j) tab.joint[j] = 0;
    tab.stage = kStageJoint;
    return;
  }
  finish_tables(tab, K);
}

// Lane contexts from the joint histogram (lane 0): kept if they pay.
__device__ void ctx_tables(const CItem& it, CTab& tab, const CBlockStats& bs) {
  const uint64_t n_elems = it.n_bytes / dtype_elem_size(it.dtype);
  const RansCtx rc{tab.ctx_base, tab.ctx_n};
  CTab::Scratch& W = tab.scratch[0];
  uint64_t cnt = 0;
  for (uint32_t b = 0; b < it.n_blocks; ++b) cnt += bs.counted[it.first_block + b];
  uint32_t* cf = tab.cfreq[0];
  uint64_t coded = 0;
  if (policy_ctx_tables((const uint64_t*)tab.joint, tab.wlo, rc, tab.fast, tab.range0, cnt, n_elems,
                                it.n_blocks, cf, &coded, &W.ts) &&
      lane_contexts_pay(coded, tab.coded[0])) {
    uint32_t* r = tab.freq[tab.region[0]];  // the region holds >= kMaxContexts tables
    for (uint32_t j = 0; j < rc.n * 256; ++j) r[j] = cf[j];
    tab.kind[0] = kKindRansCtx;
    tab.n_sets[0] = 1;
    tab.coded[0] = coded;
    uint8_t* set_of = bs.set + it.first_block;
    for (uint32_t b = 0; b < it.n_blocks; ++b) set_of[b] = 0;
  } else {
    tab.ctx_n = 1;
    tab.ctx_base = 0;
  }
  finish_tables(tab, it.n_streams);
}

// Stream kinds and tables: one warp per item (see the stages above).
__global__ void c_table_kernel(const CItem* items, uint32_t n_items, int level, int phase, CTab* tabs,
                               CBlockStats bs) {
  const uint32_t ii = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const uint32_t lane = threadIdx.x % 32;
  if (ii >= n_items) return;
  const CItem it = items[ii];
  if (it.status0 != kOk) return;
  CTab& tab = tabs[ii];
  const int K = it.n_streams;
  const uint64_t n_elems = it.n_bytes / dtype_elem_size(it.dtype);
  if (phase == 1) {
    const bool codes = policy_codes_streams(level, it.dtype, n_elems, it.n_blocks);
    bool want = false;
    if ((int)lane < K && codes) {
      CTab::Scratch& W = tab.scratch[lane];
      want = !policy_sampled(it.block_elems) || policy_sample_wants(level, (const uint64_t*)tab.total[lane], W.f, W.norm);
      for (uint32_t b = 0; !want && policy_tries_raw_runs(level, it.n_blocks) && b < it.n_blocks; ++b)
        want = policy_block_pays_alone(bs.hist + ((uint64_t)(it.first_block + b) * kMaxStreams + lane) * 256);
    }
    const uint32_t wmask = __ballot_sync(kFull, want) & ((1u << K) - 1u);
    __syncwarp();
    if (lane == 0) {
      tab.want = (uint8_t)wmask;
      tab.fast = policy_fast_tables(it.block_elems, level, it.n_blocks);
      tab.ctx_n = 1;
      tab.ctx_base = 0;
      uint32_t r = 0;  // lane k's candidate region: the max_sets tables of its rank among the wanted
      const uint32_t ms = policy_max_sets(it.n_blocks, __popc(wmask), level);
      for (int k = 0; k < K; ++k) {
        tab.kind[k] = kKindRaw;
        tab.n_sets[k] = 0;
        tab.region[k] = (uint8_t)r;
        if ((wmask >> k) & 1u) r += ms > kMaxContexts ? ms : kMaxContexts;
      }
      for (int k = K; k < kMaxStreams; ++k) tab.kind[k] = kKindRaw, tab.n_sets[k] = 0, tab.region[k] = 0;
      policy_range_empty(tab.range0);
      if (tab.fast && (wmask & 1u))
        for (uint32_t b = 0; b < it.n_blocks; ++b)
          policy_range_merge(tab.range0, bs.mm + ((uint64_t)(it.first_block + b) * kMaxStreams) * kRangeBytes);
      tab.stage = !wmask ? (uint8_t)kStageDone
                         : policy_second_pass(it.block_elems, level, it.n_blocks, true) ? (uint8_t)kStageExact
                                                                                       : (uint8_t)kStageFirst;
      if (!wmask) finish_tables(tab, K);
    }
    __syncwarp();
    if (tab.stage == kStageFirst) decide_streams(it, level, tab, bs, lane);
    return;
  }
  if (phase == 2) {
    if (tab.stage == kStageExact) decide_streams(it, level, tab, bs, lane);
    return;
  }
  if (lane != 0) return;
  if (phase == 3 && tab.stage == kStageJoint) {
    RansCtx rc;
    if (!policy_ctx_promising((const uint64_t*)tab.joint, tab.wlo, (const uint64_t*)tab.total[0], &rc,
                              tab.scratch[0].ts.counts)) {
      finish_tables(tab, K);
      return;
    }
    tab.ctx_base = (uint8_t)rc.base;
    tab.ctx_n = (uint8_t)rc.n;
    if (!tab.fast && policy_sampled(it.block_elems)) {
      for (uint32_t j = 0; j < kCtxJointRows * 256; ++j) tab.joint[j] = 0;
      tab.stage = kStageJointExact;
      return;
    }
    ctx_tables(it, tab, bs);
  } else if (phase == 4 && tab.stage == kStageJointExact) {
    ctx_tables(it, tab, bs);
  }
}

}  // namespace
}  // namespace tz::cuda
