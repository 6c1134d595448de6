// Helpers shared by the CUDA backend's tests on a GPU (test_cuda_gpu.cpp)
// and under the CPU emulation (emu/test_cuda_emu_*.cpp): per-item batch
// results, the CPU encoder's frame for comparison, and test tensors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace tz_cuda_test {

using Bytes = std::vector<uint8_t>;

// Per-item outputs of one batch call (sizes and status codes).
struct Result {
  std::vector<size_t> size;
  std::vector<int> status;
};

inline constexpr tz_dtype kFloatTypes[] = {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3,
                                           TZ_DTYPE_F8_E5M2};

// The CPU encoder's frame of src (empty, with a test failure, on error).
inline Bytes cpu_compress(const Bytes& src, const tz_params& p) {
  Bytes out(tz_compress_bound(src.size()));
  const size_t r = tz_compress(out.data(), out.size(), src.data(), src.size(), &p);
  EXPECT_FALSE(tz_is_error(r)) << tz_get_error_name(r);
  out.resize(tz_is_error(r) ? 0 : r);
  return out;
}

// FP32 values as dtype dt (round to nearest even; FP32 as is).
inline Bytes float_bytes(tz_dtype dt, const std::vector<float>& v) {
  switch (dt) {
    case TZ_DTYPE_BF16: return tzt::to_bf16(v);
    case TZ_DTYPE_F16: return tzt::to_f16(v);
    case TZ_DTYPE_F8_E4M3: return tzt::to_f8_e4m3(v);
    case TZ_DTYPE_F8_E5M2: return tzt::to_f8_e5m2(v);
    default: {
      Bytes b(v.size() * 4);
      if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
      return b;
    }
  }
}

// Realistic values: normal weights of a random scale, as dtype dt.
inline Bytes make_tensor(tz_dtype dt, size_t n_elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, std::ldexp(1.0f, -(int)(seed % 12)));
  std::vector<float> v(n_elems);
  for (auto& f : v) f = nd(rng);
  return float_bytes(dt, v);
}

}  // namespace tz_cuda_test
