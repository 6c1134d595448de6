// KV page codec on CUDA devices (include/tensorzip/tensorzip_kv_cuda.h,
// doc/kv.md 7): one warp per page, the page layout, encoder rule and checks
// of src/kv/page.h (its TZ_HD helpers are called here), the lane-
// parallel parts (split, escapes, bit planes, the 32 rANS lanes, checksum
// segments) spread over the warp with ballots. Pages equal the CPU's byte for
// byte; tests/kv/emu runs this file under the CPU emulation of
// tests/cuda/emu/cuda_emu.h.
//
// TZ_CUDA_EMULATION: compiled by the host compiler over cuda_emu.h.
#ifndef TZ_CUDA_EMULATION
#include <cuda_runtime.h>
#define TZ_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

#include "common/tz_hd.h"
#if defined(__CUDACC__)
// The codec headers' non-inline host/device functions get internal linkage in
// this translation unit, so that this library links beside tensorzip_cuda
// (which compiles the same headers in its own single translation unit).
#undef TZ_HD_NOINLINE
#define TZ_HD_NOINLINE static __host__ __device__
#endif

#include <algorithm>
#include <vector>

#include "kv/page.h"
#include "cuda/warp_codec.h"
#include "kv/codec.hpp"
#include "tensorzip/tensorzip_kv_cuda.h"

namespace tz::kv::gpu {
namespace {

constexpr uint32_t kFull = 0xFFFFFFFFu;
constexpr int kWarps = 4;  // pages per CTA
constexpr int kBatch = 64; // items per launch (kernel parameters < 4 KiB)

size_t err(int code) { return (size_t) - (ptrdiff_t)code; }
size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

struct Item {
  const uint8_t* src;
  uint8_t* dst;
  uint8_t* temp;
  uint64_t src_size;
  uint64_t dst_cap;
  uint32_t n;       // encode: elements; decode: max elements (dst capacity)
  int32_t status0;  // verdict of the host checks (kOk: the kernel does the item)
};

struct Batch {
  Item items[kBatch];
  uint32_t count;
  uint32_t base;  // index of items[0] in the caller's arrays
};
static_assert(sizeof(Batch) <= 4000, "kernel parameter size");

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31u; }
__device__ __forceinline__ uint32_t lanes_below(uint32_t lane) { return (1u << lane) - 1u; }

// CRC32C table in shared memory, built by the CTA.
__device__ void build_crc_table(uint32_t* t) {
  for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
    t[i] = c;
  }
}

// Page checksum (kv_page_checksum): one lane per 1 KiB segment, folded in order.
__device__ uint32_t warp_page_checksum(const uint8_t* p, size_t size, const uint32_t* t) {
  const uint32_t lane = lane_id();
  const size_t n_seg = (size + kKvChecksumSegment - 1) / kKvChecksumSegment;
  uint32_t acc = ~0u;
  for (size_t base = 0; base < n_seg; base += 32) {
    const size_t s = base + lane;
    uint32_t c = 0;
    if (s < n_seg) c = kv_segment_crc(p, size, s * kKvChecksumSegment, KvTableCrc{t});
    const uint32_t m = n_seg - base < 32 ? (uint32_t)(n_seg - base) : 32u;
    for (uint32_t j = 0; j < m; ++j) acc = warp::crc32c_fold_segment(acc, __shfl_sync(kFull, c, (int)j), t);
  }
  return ~acc;
}

// rans_encode by the warp (lane l = rANS lane l): returns the payload size
// (states + words at out) or 0 when it would not be smaller than limit.
// W: scratch for up to n words.
__device__ size_t warp_rans_encode(const uint8_t* sym, uint32_t n, const RansEncSym* enc, uint16_t* W, uint8_t* out,
                                   size_t limit) {
  const uint32_t lane = lane_id();
  if (limit <= kRansStateBytes + 1) return 0;
  const uint32_t cap = (uint32_t)((limit - kRansStateBytes - 1) / 2);  // words with 128 + 2w < limit
  uint32_t wp = cap, x = kRansL;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = n_steps; s-- > 0;) {
    const uint32_t i = s * kLanes + lane;
    bool emit = false;
    uint16_t word = 0;
    if (i < n) x = warp::enc_step(x, enc[sym[i]], &emit, &word);
    const uint32_t b = __ballot_sync(kFull, emit);
    const uint32_t cnt = (uint32_t)__popc(b);
    if (cnt > wp) return 0;  // (uniform: every lane sees the same ballot)
    if (emit) W[warp::enc_word_slot(wp, b, lane)] = word;
    wp -= cnt;
  }
  __syncwarp();
  const uint32_t nw = cap - wp;
  store_le32(out + 4 * lane, x);
  for (uint32_t j = lane; j < nw; j += 32) store_le16(out + kRansStateBytes + 2 * (size_t)j, W[wp + j]);
  __syncwarp();
  return kRansStateBytes + 2 * (size_t)nw;
}

// rans_decode by the warp; kOk or kErrCorruptBlock (uniform).
__device__ int warp_rans_decode(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, uint8_t* out) {
  const uint32_t lane = lane_id();
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32_t x = load_le32(in + 4 * lane);
  size_t p = kRansStateBytes;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = 0; s < n_steps; ++s) {
    const uint32_t i = s * kLanes + lane;
    bool need = false;
    if (i < n) {
      out[i] = (uint8_t)rans_dec_sym(x, dec);
      need = x < kRansL;
    }
    const uint32_t b = __ballot_sync(kFull, need);
    const uint32_t cnt = (uint32_t)__popc(b);
    if (p + 2 * (size_t)cnt > size) return kErrCorruptBlock;
    if (need) x = (x << 16) | load_le16(in + p + 2 * warp::dec_word_slot(b, lane));
    p += 2 * (size_t)cnt;
  }
  const bool ok = p == size && x == kRansL;
  __syncwarp();
  return __all_sync(kFull, ok) ? kOk : kErrCorruptBlock;
}

// Element i of the merged page from its stream bytes.
__device__ void put_elem(uint8_t dtype, uint8_t* dst, uint32_t i, uint8_t s0, uint8_t s1) {
  if (dtype == kBF16) store_le16(dst + 2 * (size_t)i, merge_elem_bf16(s0, s1));
  else if (dtype == kF16) store_le16(dst + 2 * (size_t)i, (uint16_t)(((uint32_t)s0 << 8) | s1));
  else dst[i] = s0;
}

// ------------------------------------------------------------ encode --
__device__ size_t encode_page(const KvCodecTables& c, const Item& it, const uint32_t* crc_t) {
  const uint32_t lane = lane_id();
  const KvTables& t = c.t;
  const int K = t.n_streams;
  const uint32_t n = it.n;
  const uint8_t dtype = t.dtype;
  const size_t es = dtype_elem_size(dtype);
  const size_t a4 = align4(n);
  const size_t stored = kPageHeaderSize + (size_t)n * es;
  uint8_t* streams[kMaxKvStreams] = {it.temp, it.temp + a4};
  uint8_t* lit = it.temp + 2 * a4;
  uint16_t* W = (uint16_t*)(it.temp + 3 * a4 + 64);
  uint8_t* dst = it.dst;
  for (uint32_t i = lane; i < n; i += 32) {
    if (dtype == kBF16) split_elem_bf16(load_le16(it.src + 2 * (size_t)i), streams[0][i], streams[1][i]);
    else if (dtype == kF16) {
      streams[0][i] = it.src[2 * (size_t)i + 1];
      streams[1][i] = it.src[2 * (size_t)i];
    } else streams[0][i] = it.src[i];
  }
  __syncwarp();
  size_t pos = kPageHeaderSize;
  uint8_t mode = kPageStored;
  if (t.mode == kModeFixedTables) {
    const uint32_t bits = t.fixed_bits, escc = fixed_escape_code(bits);
    size_t n_esc = 0;
    for (uint32_t base = 0; base < n; base += 32) {
      const uint32_t i = base + lane;
      n_esc += (uint32_t)__popc(__ballot_sync(kFull, i < n && c.fixed_code[streams[0][i]] == escc));
    }
    if (kv_fixed_page_size(bits, K, n, n_esc) < stored) {
      mode = kPageFixed;
      const size_t planes = 4 * (size_t)bits * ((n + kGroup - 1) / kGroup);
      size_t lp = kPageHeaderSize + planes + (size_t)(K - 1) * a4;
      for (uint32_t g = 0; g * kGroup < n; ++g) {
        const uint32_t i = g * kGroup + lane;
        const uint32_t code = i < n ? c.fixed_code[streams[0][i]] : 0u;
        for (uint32_t b = 0; b < bits; ++b) {
          const uint32_t w = __ballot_sync(kFull, (code >> b) & 1u);
          if (lane == 0) store_le32(dst + pos + 4 * ((size_t)g * bits + b), w);
        }
        const uint32_t em = __ballot_sync(kFull, i < n && code == escc);
        if (i < n && code == escc) dst[lp + (uint32_t)__popc(em & lanes_below(lane))] = streams[0][i];
        lp += (uint32_t)__popc(em);
      }
      pos += planes;
      for (int k = 1; k < K; ++k) {
        for (size_t i = lane; i < a4; i += 32) dst[pos + i] = i < n ? streams[k][i] : 0;
        pos += a4;
      }
      pos += n_esc;
    }
  } else {
    size_t wpos = kPageHeaderSize, nlit = 0;
    for (int k = 0; k < K; ++k) pos += t.st[k].kind == kKindRans ? 4 : 0;
    for (int k = 0; k < K; ++k) {
      const KvStreamTable& st = t.st[k];
      size_t r = 0;
      if (st.kind == kKindRans) {
        size_t L = 0;
        bool ok = true;
        for (uint32_t base = 0; base < n; base += 32) {
          const uint32_t i = base + lane;
          const bool nd = i < n && !c.direct[k][streams[k][i]];
          const uint32_t m = __ballot_sync(kFull, nd);
          if (m && !st.has_escape) ok = false;
          if (nd && st.has_escape) lit[nlit + L + (uint32_t)__popc(m & lanes_below(lane))] = streams[k][i];
          L += (uint32_t)__popc(m);
        }
        __syncwarp();
        if (ok && L + kRansStateBytes < n) {
          r = kv_accept_coded(warp_rans_encode(streams[k], n, c.enc[k], W, dst + pos, n - L), L, n);
          if (r) nlit += L;
        }
        if (lane == 0) store_le32(dst + wpos, r ? stream_word((uint32_t)r, kModeRans) : stream_word(n, kModeRaw));
        wpos += 4;
      }
      if (!r) {
        for (uint32_t i = lane; i < n; i += 32) dst[pos + i] = streams[k][i];
        r = n;
      }
      if (lane == 0)
        for (size_t i = r; i < align4(r); ++i) dst[pos + i] = 0;
      pos += align4(r);
    }
    if (pos + nlit < stored) {
      for (size_t i = lane; i < nlit; i += 32) dst[pos + i] = lit[i];
      pos += nlit;
      mode = kPageRans;
    }
  }
  __syncwarp();
  if (mode == kPageStored) {
    for (size_t i = lane; i < stored - kPageHeaderSize; i += 32) dst[kPageHeaderSize + i] = it.src[i];
    pos = stored;
  }
  if (lane == 0) kv_write_page_header(dst, mode, t.id, n);
  __syncwarp();
  if (t.flags & kFlagChecksum) {
    const uint32_t sum = warp_page_checksum(dst, pos, crc_t);
    if (lane == 0) store_le32(dst + 12, sum);
  }
  __syncwarp();
  return pos;
}

// ------------------------------------------------------------ decode --
__device__ int decode_page(const KvCodecTables& c, const Item& it, const uint32_t* crc_t, size_t* out) {
  const uint32_t lane = lane_id();
  const KvTables& t = c.t;
  // Same order of checks as the CPU (Codec::decode): header, destination size, layout, checksum.
  KvPageView v;
  int st = kv_parse_page_header(it.src, it.src_size, &v.h);
  if (st != kOk) return st;
  const uint8_t dtype = t.dtype;
  const size_t es = dtype_elem_size(dtype);
  if ((size_t)v.h.n_elems * es > it.dst_cap) return kErrDstTooSmall;
  st = kv_view_page(c, it.src, it.src_size, &v);
  if (st != kOk) return st;
  const uint32_t n = v.h.n_elems;
  if ((t.flags & kFlagChecksum) && warp_page_checksum(it.src, it.src_size, crc_t) != v.h.checksum) return kErrChecksum;
  *out = (size_t)n * es;
  uint8_t* dst = it.dst;
  if (v.h.mode == kPageStored) {
    for (size_t i = lane; i < *out; i += 32) dst[i] = it.src[kPageHeaderSize + i];
    return kOk;
  }
  const uint8_t* raw1 = t.n_streams > 1 ? v.payload[1] : nullptr;
  if (v.h.mode == kPageFixed) {
    const uint32_t bits = t.fixed_bits, escc = fixed_escape_code(bits);
    size_t lp = 0;
    bool bad = false;
    for (uint32_t g = 0; g * kGroup < n; ++g) {
      const uint32_t i = g * kGroup + lane;
      uint32_t code = 0;
      for (uint32_t b = 0; b < bits; ++b) code |= ((load_le32(v.payload[0] + 4 * ((size_t)g * bits + b)) >> lane) & 1u) << b;
      const bool esc = i < n && code == escc;
      const uint32_t m = __ballot_sync(kFull, esc);
      uint8_t s0 = t.fixed_sym[code < escc ? code : 0];
      if (esc) {
        s0 = v.lit[lp + (uint32_t)__popc(m & lanes_below(lane))];  // count checked by kv_view_page
        bad = c.fixed_code[s0] != escc;
      }
      lp += (uint32_t)__popc(m);
      if (i < n) put_elem(dtype, dst, i, s0, raw1 ? raw1[i] : 0);
    }
    return __any_sync(kFull, bad) ? kErrCorruptBlock : kOk;
  }
  uint8_t* coded[kMaxKvStreams] = {nullptr, nullptr};
  for (int k = 0; k < t.n_streams; ++k) {
    if (v.smode[k] != kModeRans) continue;
    coded[k] = it.temp + (size_t)k * align4(n);
    st = warp_rans_decode(v.payload[k], v.size[k], n, c.dec[k], coded[k]);
    if (st != kOk) return st;
  }
  __syncwarp();
  size_t lp = 0;
  for (int k = 0; k < t.n_streams; ++k) {
    if (!coded[k] || !t.st[k].has_escape) continue;
    for (uint32_t base = 0; base < n; base += 32) {
      const uint32_t i = base + lane;
      const bool esc = i < n && coded[k][i] == t.st[k].escape;
      const uint32_t m = __ballot_sync(kFull, esc);
      if (lp + (uint32_t)__popc(m) > v.n_lit) return kErrCorruptBlock;
      bool bad = false;
      if (esc) {
        const uint8_t lv = v.lit[lp + (uint32_t)__popc(m & lanes_below(lane))];
        bad = c.direct[k][lv] != 0;
        coded[k][i] = lv;
      }
      if (__any_sync(kFull, bad)) return kErrCorruptBlock;
      lp += (uint32_t)__popc(m);
    }
  }
  if (lp != v.n_lit) return kErrCorruptBlock;
  __syncwarp();
  const uint8_t* s0 = coded[0] ? coded[0] : v.payload[0];
  const uint8_t* s1 = t.n_streams > 1 ? (coded[1] ? coded[1] : v.payload[1]) : nullptr;
  for (uint32_t i = lane; i < n; i += 32) put_elem(dtype, dst, i, s0[i], s1 ? s1[i] : 0);
  return kOk;
}

// ------------------------------------------------------------ kernel --
// One warp per item of the batch: its page encoded (Encode) or decoded, and
// its size (0 on error) and status stored by lane 0.
template <bool Encode>
__global__ void __launch_bounds__(kWarps * 32) page_kernel(const KvCodecTables* tabs, const Batch b, size_t* out_sizes,
                                                           int* status) {
  __shared__ uint32_t crc_t[256];
  build_crc_table(crc_t);
  __syncthreads();
  const uint32_t w = blockIdx.x * kWarps + threadIdx.x / 32;
  if (w >= b.count) return;
  const Item it = b.items[w];
  size_t size = 0;
  int st = it.status0;
  if (st == kOk) {
    if constexpr (Encode)
      size = encode_page(*tabs, it, crc_t);
    else
      st = decode_page(*tabs, it, crc_t, &size);
  }
  if (lane_id() == 0) {
    out_sizes[b.base + w] = st == kOk ? size : 0;
    status[b.base + w] = st;
  }
}

// ------------------------------------------------------------ host --
size_t check_call(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items, size_t n_items,
                  void* temp, size_t* d_out_sizes, int* d_status) {
  if (!codec || !d_tables || (n_items && (!items || !d_out_sizes || !d_status))) return err(kErrBadParam);
  if (n_items && ((uintptr_t)temp & 255u)) return err(kErrBadParam);
  return 0;
}

size_t encode_scratch(const tz::kv::Codec& c, const tz_kv_cuda_item& it) {
  const size_t es = dtype_elem_size(c.tables().t.dtype);
  if (it.src_size == 0 || it.src_size % es || it.src_size / es > kMaxPageElems) return 0;
  return align256(kv_page_scratch_size((uint32_t)(it.src_size / es)));
}

size_t decode_scratch(const tz::kv::Codec& c, const tz_kv_cuda_item& it) {
  const size_t es = dtype_elem_size(c.tables().t.dtype);
  const size_t n = std::min<size_t>(it.dst_capacity / es, kMaxPageElems);
  return align256(2 * align4(n) + 64);
}

// Temp bytes of one item.
template <bool Encode>
size_t item_scratch(const tz::kv::Codec& c, const tz_kv_cuda_item& it) {
  return Encode ? encode_scratch(c, it) : decode_scratch(c, it);
}

template <bool Encode>
size_t temp_size(const tz_kv_codec* codec, const tz_kv_cuda_item* items, size_t n_items) {
  if (!codec || (n_items && !items)) return err(kErrBadParam);
  size_t s = 0;
  for (size_t i = 0; i < n_items; ++i) s += item_scratch<Encode>(*codec_of(codec), items[i]);
  return s;
}

// tz_kv_cuda_encode (Encode) / tz_kv_cuda_decode: the items in batches of
// kBatch, each checked on the host (status0) and launched one warp per item.
template <bool Encode>
size_t run(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items, size_t n_items, void* temp,
           size_t temp_size, size_t* d_out_sizes, int* d_status, cudaStream_t stream) {
  const size_t e = check_call(codec, d_tables, items, n_items, temp, d_out_sizes, d_status);
  if (e) return e;
  const tz::kv::Codec& c = *codec_of(codec);
  const auto* tabs = (const KvCodecTables*)d_tables;
  const size_t es = dtype_elem_size(c.tables().t.dtype);
  size_t off = 0;
  for (size_t base = 0; base < n_items; base += kBatch) {
    Batch b{};
    b.base = (uint32_t)base;
    b.count = (uint32_t)std::min<size_t>(kBatch, n_items - base);
    for (uint32_t j = 0; j < b.count; ++j) {
      const tz_kv_cuda_item& in = items[base + j];
      Item& it = b.items[j];
      it.src = (const uint8_t*)in.src;
      it.dst = (uint8_t*)in.dst;
      it.src_size = in.src_size;
      it.dst_cap = in.dst_capacity;
      it.status0 = kOk;
      const size_t s = item_scratch<Encode>(c, in);
      if (off + s > temp_size) return err(kErrBadParam);
      it.temp = (uint8_t*)temp + off;
      off += s;
      if (Encode) {
        if (!s || !in.src || !in.dst) {
          it.status0 = kErrBadParam;
        } else {
          it.n = (uint32_t)(in.src_size / es);
          if (in.dst_capacity < kv_page_bound(it.n, c.tables().t.dtype)) it.status0 = kErrDstTooSmall;
        }
      } else {
        it.n = (uint32_t)std::min<size_t>(in.dst_capacity / es, kMaxPageElems);
        if (!in.src || !in.dst) it.status0 = kErrBadParam;
      }
    }
    TZ_LAUNCH((b.count + kWarps - 1) / kWarps, kWarps * 32, 0, stream, page_kernel<Encode>)(tabs, b, d_out_sizes,
                                                                                             d_status);
    if (cudaGetLastError() != cudaSuccess) return err(kErrGeneric);
  }
  return 0;
}

}  // namespace
}  // namespace tz::kv::gpu

extern "C" size_t tz_kv_cuda_tables_size(void) { return sizeof(tz::kv::KvCodecTables); }

extern "C" size_t tz_kv_cuda_upload_tables(const tz_kv_codec* codec, void* d_tables, size_t capacity,
                                           cudaStream_t stream) {
  if (!codec || !d_tables || capacity < sizeof(tz::kv::KvCodecTables)) return tz::kv::gpu::err(tz::kErrBadParam);
  const tz::kv::Codec& c = *tz::kv::codec_of(codec);
  if (cudaMemcpyAsync(d_tables, &c.tables(), sizeof(tz::kv::KvCodecTables), cudaMemcpyHostToDevice, stream) !=
      cudaSuccess)
    return tz::kv::gpu::err(tz::kErrGeneric);
  return 0;
}

extern "C" size_t tz_kv_cuda_encode_temp_size(const tz_kv_codec* codec, const tz_kv_cuda_item* items,
                                              size_t n_items) {
  return tz::kv::gpu::temp_size<true>(codec, items, n_items);
}

extern "C" size_t tz_kv_cuda_decode_temp_size(const tz_kv_codec* codec, const tz_kv_cuda_item* items,
                                              size_t n_items) {
  return tz::kv::gpu::temp_size<false>(codec, items, n_items);
}

extern "C" size_t tz_kv_cuda_encode(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items,
                                    size_t n_items, void* temp, size_t temp_size, size_t* d_out_sizes, int* d_status,
                                    cudaStream_t stream) {
  return tz::kv::gpu::run<true>(codec, d_tables, items, n_items, temp, temp_size, d_out_sizes, d_status, stream);
}

extern "C" size_t tz_kv_cuda_decode(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items,
                                    size_t n_items, void* temp, size_t temp_size, size_t* d_out_sizes, int* d_status,
                                    cudaStream_t stream) {
  return tz::kv::gpu::run<false>(codec, d_tables, items, n_items, temp, temp_size, d_out_sizes, d_status, stream);
}
