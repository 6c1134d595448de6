// The portable kernel set: the reference code of src/kv/page.h, with
// the CPU's CRC32C (same value as the table-driven reference).
#include "kv/codec.hpp"

namespace tz::kv {
namespace {

size_t encode_portable(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch, uint8_t* dst) {
  const size_t size = kv_encode_page(c, src, n, scratch, dst);
  kv_seal_page(c.t, dst, size, CpuPageSum{});
  return size;
}

int decode_portable(const KvCodecTables& c, const uint8_t* page, size_t size, uint8_t* dst, uint8_t* scratch) {
  return kv_decode_page(c, page, size, dst, scratch, CpuPageSum{});
}

const PageKernels kPortable = {encode_portable, decode_portable};

}  // namespace

const PageKernels* portable_kernels() { return &kPortable; }

}  // namespace tz::kv
