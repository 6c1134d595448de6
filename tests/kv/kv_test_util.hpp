// Helpers of the KV page codec suite: the real KV pages of
// tests/data/kv-fixture-l0.safetensors (layer 0 keys and values of the fixture
// GPT over real Python source, BF16, token-major), their casts, pages with
// special values, and a codec made through the internal C++ API (so that a
// test can pick a kernel set).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kv/codec.hpp"
#include "tz_test_data.h"

namespace kvt {

using Bytes = std::vector<uint8_t>;
constexpr uint32_t kRowElems = 8 * 32;  // heads x head_dim of the fixture GPT
constexpr uint32_t kSeqTokens = 256;

// "k" or "v": (2 sequences, 256 tokens, 8 heads, 32) BF16.
inline const Bytes& real_kv(const std::string& which) {
  static const std::vector<tzt::Tensor> ts = tzt::read_safetensors(std::string(TZ_TEST_DATA_DIR) + "/kv-fixture-l0.safetensors");
  return tzt::find_tensor(ts, which).data;
}
// Sequence s of it (256 tokens).
inline Bytes sequence(const std::string& which, int s) {
  const Bytes& all = real_kv(which);
  const size_t n = (size_t)kSeqTokens * kRowElems * 2;
  return Bytes(all.begin() + (ptrdiff_t)(s * n), all.begin() + (ptrdiff_t)((s + 1) * n));
}

// BF16 bytes re-cast to dtype (round to nearest even, from the exact BF16 values).
inline Bytes cast_bf16(const Bytes& bf16, uint8_t dtype) {
  if (dtype == tz::kBF16) return bf16;
  const std::vector<float> f = tzt::as_floats_bf16(bf16);
  if (dtype == tz::kF16) return tzt::to_f16(f);
  if (dtype == tz::kF8E4M3) return tzt::to_f8_e4m3(f);
  return tzt::to_f8_e5m2(f);
}

inline std::unique_ptr<tz::kv::Codec> calibrate(const Bytes& sample, uint8_t dtype, tz_kv_params p = {}) {
  std::unique_ptr<tz::kv::Codec> c;
  const size_t r = tz::kv::Codec::calibrate(&c, sample.data(), sample.size(), dtype, p);
  EXPECT_FALSE(tz_is_error(r)) << tz_last_error_detail();
  return c;
}

inline Bytes encode(const tz::kv::Codec& c, const tz::kv::PageKernels& k, const uint8_t* src, size_t n) {
  Bytes out(c.page_bound(n));
  const size_t r = c.encode(k, out.data(), out.size(), src, n);
  EXPECT_FALSE(tz_is_error(r)) << tz_last_error_detail();
  out.resize(tz_is_error(r) ? 0 : r);
  return out;
}

// Decodes; returns the size or the error code.
inline size_t decode(const tz::kv::Codec& c, const tz::kv::PageKernels& k, const Bytes& page, Bytes* out) {
  const size_t n = c.decoded_size(page.data(), page.size());
  if (tz_is_error(n)) return n;
  out->assign(n, 0xCD);
  return c.decode(k, out->data(), out->size(), page.data(), page.size());
}

inline const tz::kv::PageKernels& portable() { return *tz::kv::portable_kernels(); }

// Every kernel set this CPU and build have, portable first.
inline std::vector<std::pair<std::string, const tz::kv::PageKernels*>> all_paths() {
  std::vector<std::pair<std::string, const tz::kv::PageKernels*>> v;
  for (tz::cpu::SimdPath p : tz::cpu::kAllSimdPaths)
    if (const tz::kv::PageKernels* k = tz::kv::page_kernels(p)) v.emplace_back(tz::cpu::simd_path_name(p), k);
  return v;
}

// BF16 values that no real KV sample holds: +-inf, NaNs with payloads, -0,
// subnormals, the largest and smallest normals.
inline Bytes special_bf16(size_t n) {
  const uint16_t sp[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x8000, 0x0000, 0x0001, 0x807F,
                         0x0040, 0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x3F80, 0x4B00};
  Bytes out(2 * n);
  for (size_t i = 0; i < n; ++i) tz::store_le16(out.data() + 2 * i, sp[(i * 7 + i / 16) % 16]);
  return out;
}

}  // namespace kvt
