// libFuzzer target of the KV page decoder (doc/kv.md 5), every CPU kernel
// set. Byte 0 picks one of 8 codecs (BF16 / FP8 E4M3 x rANS / fixed x with /
// without page checksums), calibrated once on a fixed synthetic sample; the
// rest is the input.
//   byte0 & 0x80 = 0: the input is a page. Its table id is set to the
//     codec's (and, with byte0 & 0x40, its checksum recomputed) so that
//     mutations reach the payload checks. Every path must return the same
//     status and, on success, the same bytes.
//   byte0 & 0x80 = 1: the input is page content: encoded by every path (same
//     bytes), decoded back (same content).
// Replayed over tests/fuzz/corpus/kv_page by ctest (fuzz_replay_kv_page).
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "kv/codec.hpp"

namespace {

using tz::kv::Codec;

// Sample: BF16 values with a KV-like exponent spread (integer hash, no file).
std::vector<uint8_t> sample_bytes(uint8_t dtype) {
  std::vector<uint8_t> s;
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 8192; ++i) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    const uint32_t e = 118 + (uint32_t)__builtin_ctzll(h | (1ull << 10));  // geometric exponents
    const uint16_t v = (uint16_t)(((h >> 40) & 0x8000u) | (e << 7) | ((h >> 20) & 0x7Fu));
    if (dtype == tz::kBF16) {
      s.push_back((uint8_t)v);
      s.push_back((uint8_t)(v >> 8));
    } else {
      s.push_back((uint8_t)((v >> 8) ^ (v & 0x3)));
    }
  }
  return s;
}

const Codec& codec(int i) {
  static std::unique_ptr<Codec> c[8];
  if (!c[i]) {
    const uint8_t dt = (i & 1) ? tz::kF8E4M3 : tz::kBF16;
    tz_kv_params p{};
    p.mode = (i & 2) ? TZ_KV_MODE_FIXED : TZ_KV_MODE_RANS;
    p.no_checksum = (i & 4) ? 1 : 0;
    const std::vector<uint8_t> s = sample_bytes(dt);
    FUZZ_CHECK(Codec::calibrate(&c[i], s.data(), s.size(), dt, p) == 0);
  }
  return *c[i];
}

std::vector<const tz::kv::PageKernels*> paths() {
  std::vector<const tz::kv::PageKernels*> v;
  for (tz::cpu::SimdPath p : tz::cpu::kAllSimdPaths)
    if (const tz::kv::PageKernels* k = tz::kv::page_kernels(p)) v.push_back(k);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const Codec& c = codec(sel & 7);
  const size_t es = tz::dtype_elem_size(c.tables().t.dtype);
  static const std::vector<const tz::kv::PageKernels*> ks = paths();
  if (sel & 0x80) {
    const size_t n = (size - 1) / es * es;
    if (n == 0) return 0;
    std::vector<uint8_t> ref, enc(c.page_bound(n));
    for (const tz::kv::PageKernels* k : ks) {
      const size_t r = c.encode(*k, enc.data(), enc.size(), data + 1, n);
      FUZZ_CHECK(!tz_is_error(r) && r <= enc.size());
      if (k == ks[0]) ref.assign(enc.begin(), enc.begin() + (ptrdiff_t)r);
      FUZZ_CHECK(r == ref.size() && memcmp(enc.data(), ref.data(), r) == 0);
    }
    for (const tz::kv::PageKernels* k : ks) {
      std::unique_ptr<uint8_t[]> out(new uint8_t[n]);
      FUZZ_CHECK(c.decode(*k, out.get(), n, ref.data(), ref.size()) == n);
      FUZZ_CHECK(memcmp(out.get(), data + 1, n) == 0);
    }
    return 0;
  }
  // An exact-size copy, so that reads past the page are seen by ASan.
  const size_t n = size - 1;
  std::unique_ptr<uint8_t[]> page(new uint8_t[n ? n : 1]);
  memcpy(page.get(), data + 1, n);
  if (n >= tz::kv::kPageHeaderSize) {
    tz::store_le32(page.get() + 4, c.tables().t.id);
    if ((sel & 0x40) && (c.tables().t.flags & tz::kv::kFlagChecksum))
      tz::store_le32(page.get() + 12, tz::kv::page_checksum_cpu(page.get(), n));
  }
  size_t cap = 1 << 16;
  const size_t want = c.decoded_size(page.get(), n);
  if (!tz_is_error(want) && want <= (1u << 22)) cap = want;  // bounded memory for the fuzzer
  std::vector<uint8_t> first;
  size_t first_r = 0;
  for (const tz::kv::PageKernels* k : ks) {
    std::unique_ptr<uint8_t[]> out(new uint8_t[cap]);
    const size_t r = c.decode(*k, out.get(), cap, page.get(), n);
    if (k == ks[0]) {
      first_r = r;
      if (!tz_is_error(r)) first.assign(out.get(), out.get() + r);
    }
    FUZZ_CHECK(r == first_r);
    if (!tz_is_error(r)) {
      FUZZ_CHECK(r == want);
      FUZZ_CHECK(memcmp(out.get(), first.data(), r) == 0);
    }
  }
  return 0;
}
