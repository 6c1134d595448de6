// KV-cache page codec, CPU side (doc/kv.md): calibration, table blobs, the
// choice of kernel set and batches over a thread pool. The per-page code is
// src/kv/page.h; the kernels of each SIMD path are in kernels_*.cpp here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kv/page.h"
#include "cpu/simd_path.h"
#include "common/thread_pool.h"
#include "tensorzip/tensorzip_kv.h"

namespace tz::kv {

// One kernel set: encode (page sealed: checksum filled) and decode (checksum
// verified) of one page, with the results of kv_encode_page / kv_decode_page.
struct PageKernels {
  size_t (*encode)(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch, uint8_t* dst);
  int (*decode)(const KvCodecTables& c, const uint8_t* page, size_t size, uint8_t* dst, uint8_t* scratch);
};

// The kernels of path p, or nullptr where this build or CPU has none
// (simd_path_cpu_has). Tests and benchmarks call a path directly.
const PageKernels* page_kernels(cpu::SimdPath p);
// The kernels the codec uses: those of cpu::active_simd_path() (the one
// dispatch rule), the portable ones where that path has none.
const PageKernels& active_page_kernels();

// Per-path kernel tables (kernels_portable.cpp, kernels_avx2.cpp, kernels_avx512.cpp,
// kernels_neon.cpp; the SIMD ones built from kernel_set.inc).
const PageKernels* portable_kernels();
#if defined(__x86_64__)
const PageKernels* avx2_kernels();
const PageKernels* avx512_kernels();
#endif
#if defined(__aarch64__)
const PageKernels* neon_kernels();
#endif

class Codec {
 public:
  const KvCodecTables& tables() const { return *tabs_; }
  const std::vector<uint8_t>& blob() const { return blob_; }

  // Learns tables from a sample (calibrate.cpp). Returns 0 or an error code.
  static size_t calibrate(std::unique_ptr<Codec>* out, const uint8_t* sample, size_t size, uint8_t dtype,
                          const tz_kv_params& p);
  // From a serialised blob (every field checked).
  static size_t load(std::unique_ptr<Codec>* out, const uint8_t* blob, size_t size);
  // From parsed tables (id recomputed).
  static std::unique_ptr<Codec> from_tables(const KvTables& t);

  size_t page_bound(size_t page_bytes) const;  // or an error
  // One page with kernel set k: the encoded / decoded size or an error (with detail).
  size_t encode(const PageKernels& k, uint8_t* dst, size_t cap, const uint8_t* src, size_t n) const;
  size_t decode(const PageKernels& k, uint8_t* dst, size_t cap, const uint8_t* src, size_t n) const;
  size_t decoded_size(const uint8_t* page, size_t n) const;
  // Batches (item results filled; returns 0 or the first failing item's code).
  size_t encode_batch(const PageKernels& k, tz_kv_item* items, size_t n_items, unsigned threads) const;
  size_t decode_batch(const PageKernels& k, tz_kv_item* items, size_t n_items, unsigned threads) const;

 private:
  Codec() = default;
  template <class F>
  size_t run_batch(tz_kv_item* items, size_t n_items, unsigned threads, const F& one) const;

  std::unique_ptr<KvCodecTables> tabs_;
  std::vector<uint8_t> blob_;
  mutable std::mutex pool_mu_;
  mutable std::unique_ptr<cpu::ThreadPool> pool_;
};

// The reference CRC table; the CPU's CRC32C (SSE4.2 or ARMv8 CRC where
// present) as the raw state update of kv_page.h; the page checksum with it,
// up to six segments interleaved (same value as KvRefPageSum).
const uint32_t* crc_table();
struct CpuCrc {
  uint32_t operator()(uint32_t s, const uint8_t* p, size_t n) const;
};
uint32_t page_checksum_cpu(const uint8_t* p, size_t size);
struct CpuPageSum {
  uint32_t operator()(const uint8_t* p, size_t size) const { return page_checksum_cpu(p, size); }
};

// The codec behind a C handle (src/api/kv_c_api.cpp).
const Codec* codec_of(const tz_kv_codec* c);

// Message for a page-level status (kErr* of format.h).
const char* page_status_text(int st);

}  // namespace tz::kv
