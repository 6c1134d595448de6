// Codec objects, table blobs, kernel choice and batches (doc/kv.md).
#include "kv/codec.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "cpu/checksum_cpu.h"
#include "cpu/frame.h"

namespace tz::kv {

namespace {
struct CrcTable {
  uint32_t t[256];
  CrcTable() { crc32c_make_table(t); }
};

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// Scratch of the calling thread (pages are coded one at a time per thread).
uint8_t* thread_scratch(size_t n) {
  thread_local std::vector<uint8_t> s;
  if (s.size() < n) s.resize(n);
  return s.data();
}
}  // namespace

const uint32_t* crc_table() {
  static const CrcTable t;
  return t.t;
}

uint32_t CpuCrc::operator()(uint32_t s, const uint8_t* p, size_t n) const { return cpu::crc32c_update(s, p, n); }

// The segments of a page are hashed kCrc32cMaxStreams at a time by the
// frame codec's segment-list CRC (cpu::crc32c_segment_list: folded or
// chained CRC32C instructions where present). Segment 0 starts with the
// page's first 16 bytes, checksum field zeroed.
uint32_t page_checksum_cpu(const uint8_t* p, size_t size) {
  if (size < kPageHeaderSize) return kv_page_checksum(p, size, CpuCrc{});
  uint8_t head[16];
  memcpy(head, p, 16);
  memset(head + 12, 0, 4);
  return cpu::crc32c_segment_list(p, size, kKvChecksumSegment, head);
}

const char* page_status_text(int st) {
  switch (st) {
    case kErrSrcTruncated: return "page shorter than its 16-byte header";
    case kErrBadMagic: return "not a KV page (bad magic)";
    case kErrBadVersion: return "unsupported KV page version";
    case kErrCorruptHeader: return "corrupt page header";
    case kErrCorruptBlock: return "corrupt page payload";
    case kErrChecksum: return "page checksum mismatch";
    case kErrBadParam: return "page was encoded with other tables (table id differs)";
    case kErrUnsupported: return "unsupported";
    default: return "error";
  }
}

const PageKernels* page_kernels(cpu::SimdPath p) {
  if (!cpu::simd_path_cpu_has(p)) return nullptr;
  switch (p) {
    case cpu::SimdPath::kPortable: return portable_kernels();
#if defined(__x86_64__)
    case cpu::SimdPath::kAvx2: return avx2_kernels();
    case cpu::SimdPath::kAvx512: return avx512_kernels();
#endif
#if defined(__aarch64__)
    case cpu::SimdPath::kNeon: return neon_kernels();
#endif
    default: return nullptr;
  }
}

const PageKernels& active_page_kernels() {
  const PageKernels* k = page_kernels(cpu::active_simd_path());
  return k ? *k : *portable_kernels();
}

std::unique_ptr<Codec> Codec::from_tables(const KvTables& t) {
  std::unique_ptr<Codec> c(new Codec());
  c->tabs_ = std::make_unique<KvCodecTables>();
  c->tabs_->t = t;
  c->blob_.resize(kv_tables_size(t));
  kv_write_tables(t, c->blob_.data(), crc_table());
  c->tabs_->t.id = load_le32(c->blob_.data() + c->blob_.size() - 4);
  kv_derive_tables(c->tabs_.get());
  return c;
}

size_t Codec::load(std::unique_ptr<Codec>* out, const uint8_t* blob, size_t size) {
  if (!blob) return cpu::make_error(kErrBadParam, "KV tables: null buffer");
  KvTables t{};
  const int st = kv_read_tables(blob, size, &t, crc_table());
  if (st != kOk) {
    const char* what = st == kErrChecksum      ? "checksum mismatch"
                       : st == kErrBadMagic    ? "not KV codec tables (bad magic)"
                       : st == kErrBadVersion  ? "unsupported tables version"
                       : st == kErrUnsupported ? "unsupported dtype"
                       : st == kErrSrcTruncated ? "truncated"
                                                : "malformed";
    return cpu::make_error(st, std::string("KV tables (") + std::to_string(size) + " bytes): " + what);
  }
  std::unique_ptr<Codec> c = from_tables(t);
  if (c->blob_.size() != size || memcmp(c->blob_.data(), blob, size) != 0)  // canonical form only
    return cpu::make_error(kErrCorruptHeader, "KV tables: not in canonical form");
  *out = std::move(c);
  return 0;
}

size_t Codec::page_bound(size_t page_bytes) const {
  const size_t es = dtype_elem_size(tabs_->t.dtype);
  if (page_bytes == 0 || page_bytes % es || page_bytes / es > kMaxPageElems)
    return cpu::make_error(kErrBadParam, "KV page of " + std::to_string(page_bytes) + " bytes: must be 1.." +
                                             std::to_string(kMaxPageElems) + " elements of " + std::to_string(es) +
                                             " bytes");
  return kv_page_bound((uint32_t)(page_bytes / es), tabs_->t.dtype);
}

size_t Codec::encode(const PageKernels& k, uint8_t* dst, size_t cap, const uint8_t* src, size_t n) const {
  const size_t bound = page_bound(n);
  if (cpu::is_error(bound)) return bound;
  if (!src || !dst) return cpu::make_error(kErrBadParam, "KV encode: null buffer");
  if (cap < bound)
    return cpu::make_error(kErrDstTooSmall, "KV encode: destination holds " + std::to_string(cap) + " bytes, " +
                                                std::to_string(bound) + " needed (tz_kv_page_bound)");
  const uint32_t elems = (uint32_t)(n / dtype_elem_size(tabs_->t.dtype));
  return k.encode(*tabs_, src, elems, thread_scratch(kv_page_scratch_size(elems)), dst);
}

size_t Codec::decoded_size(const uint8_t* page, size_t n) const {
  if (!page) return cpu::make_error(kErrBadParam, "KV page: null buffer");
  KvPageHeader h;
  const int st = kv_parse_page_header(page, n, &h);
  if (st != kOk) return cpu::make_error(st, std::string("KV page: ") + page_status_text(st));
  return (size_t)h.n_elems * dtype_elem_size(tabs_->t.dtype);
}

size_t Codec::decode(const PageKernels& k, uint8_t* dst, size_t cap, const uint8_t* src, size_t n) const {
  const size_t out = decoded_size(src, n);
  if (cpu::is_error(out)) return out;
  if (!dst) return cpu::make_error(kErrBadParam, "KV decode: null destination");
  if (cap < out)
    return cpu::make_error(kErrDstTooSmall, "KV decode: destination holds " + std::to_string(cap) +
                                                " bytes, the page decodes to " + std::to_string(out));
  const uint32_t elems = (uint32_t)(out / dtype_elem_size(tabs_->t.dtype));
  const int st = k.decode(*tabs_, src, n, dst, thread_scratch(kv_page_scratch_size(elems)));
  if (st == kOk) return out;
  std::string d = std::string("KV page (") + std::to_string(n) + " bytes): " + page_status_text(st);
  if (st == kErrBadParam) d += " (page " + hex32(load_le32(src + 4)) + ", codec " + hex32(tabs_->t.id) + ")";
  return cpu::make_error(st, d);
}

template <class F>
size_t Codec::run_batch(tz_kv_item* items, size_t n_items, unsigned threads, const F& one) const {
  if (n_items && !items) return cpu::make_error(kErrBadParam, "KV batch: null item array");
  auto body = [&](size_t i, unsigned) { items[i].result = one(items[i]); };
  // (hardware_concurrency reads /sys on Linux: asked only when threads == 0.)
  const unsigned want = threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  std::unique_lock<std::mutex> lock(pool_mu_, std::defer_lock);
  // The pool serves one batch at a time; a concurrent caller codes its batch on its own thread.
  if (want > 1 && n_items > 1 && lock.try_lock()) {
    if (!pool_ || pool_->size() != want) pool_ = std::make_unique<cpu::ThreadPool>(want);
    pool_->parallel_for(n_items, body);
    lock.unlock();
  } else {
    for (size_t i = 0; i < n_items; ++i) body(i, 0);
  }
  for (size_t i = 0; i < n_items; ++i)
    if (cpu::is_error(items[i].result)) {
      // The detail of a worker's error stayed on its thread: restate it here.
      return cpu::make_error((int)(0 - items[i].result),
                             "KV batch item " + std::to_string(i) + ": " + tz_get_error_name(items[i].result));
    }
  return 0;
}

size_t Codec::encode_batch(const PageKernels& k, tz_kv_item* items, size_t n_items, unsigned threads) const {
  return run_batch(items, n_items, threads, [&](const tz_kv_item& it) {
    return encode(k, (uint8_t*)it.dst, it.dst_capacity, (const uint8_t*)it.src, it.src_size);
  });
}

size_t Codec::decode_batch(const PageKernels& k, tz_kv_item* items, size_t n_items, unsigned threads) const {
  return run_batch(items, n_items, threads, [&](const tz_kv_item& it) {
    return decode(k, (uint8_t*)it.dst, it.dst_capacity, (const uint8_t*)it.src, it.src_size);
  });
}

}  // namespace tz::kv
