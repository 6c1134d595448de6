// GoogleTest helpers shared by tests/test_*.cpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace tzt {

constexpr tz_dtype kAllDtypes[] = {TZ_DTYPE_BYTES, TZ_DTYPE_BF16,    TZ_DTYPE_F16,
                                   TZ_DTYPE_F32,   TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2};

inline size_t elem_size(tz_dtype dt) {
  switch (dt) {
    case TZ_DTYPE_BF16: case TZ_DTYPE_F16: return 2;
    case TZ_DTYPE_F32: return 4;
    default: return 1;
  }
}

// Documented default block size (tensorzip.h).
inline size_t default_block_elems(tz_dtype dt) { return dt == TZ_DTYPE_BYTES ? 262144 : 65536; }

inline std::string describe(size_t r) {
  return std::string(tz_get_error_name(r)) + " (" + tz_last_error_detail() + ")";
}

inline tz_params make_params(tz_dtype dt, int level = 0, unsigned block_elems = 0, unsigned threads = 1) {
  tz_params p{};
  p.dtype = dt;
  p.level = level;
  p.block_elems = block_elems;
  p.threads = threads;
  return p;
}

// Compresses src; records a test failure and returns an empty vector on
// error (a valid frame is never empty).
inline Bytes compress(const void* src, size_t n, const tz_params& p) {
  Bytes out(tz_compress_bound(n));
  const size_t r = tz_compress(out.data(), out.size(), src, n, &p);
  if (tz_is_error(r)) {
    ADD_FAILURE() << "tz_compress(" << n << " bytes, dtype " << tz_dtype_name(p.dtype) << ", level " << p.level
                  << "): " << describe(r);
    return {};
  }
  if (r > out.size()) {
    ADD_FAILURE() << "tz_compress returned " << r << " > capacity " << out.size();
    return {};
  }
  out.resize(r);
  return out;
}
inline Bytes compress(const Bytes& src, const tz_params& p) { return compress(src.data(), src.size(), p); }
inline Bytes compress(const Bytes& src, tz_dtype dt, int level = 0, unsigned block_elems = 0, unsigned threads = 1) {
  return compress(src, make_params(dt, level, block_elems, threads));
}

// Decompresses into a buffer of exactly `cap` bytes (raw size when cap is
// SIZE_MAX, read from tz_frame_inspect). Returns tz_decompress's result;
// out holds the decoded bytes on success.
inline size_t decompress(const Bytes& frame, Bytes& out, unsigned threads = 1, size_t cap = SIZE_MAX) {
  if (cap == SIZE_MAX) {
    tz_frame_info info{};
    const size_t r = tz_frame_inspect(frame.data(), frame.size(), &info);
    if (tz_is_error(r)) return r;
    cap = (size_t)info.raw_size;
  }
  out.assign(cap, 0xA5);
  const size_t r = tz_decompress(out.data(), out.size(), frame.data(), frame.size(), threads);
  if (!tz_is_error(r)) out.resize(r);
  return r;
}

// Compresses with p, decompresses (exact-size destination, so ASan sees
// any overrun) and compares bit for bit.
inline ::testing::AssertionResult round_trips(const Bytes& src, const tz_params& p, Bytes* frame_out = nullptr) {
  Bytes frame = compress(src, p);
  if (frame.empty()) return ::testing::AssertionFailure() << "compression failed";
  Bytes out(src.size() + 1, 0x5A);  // one spare byte: must stay untouched
  const size_t r = tz_decompress(out.data(), src.size(), frame.data(), frame.size(), p.threads);
  if (tz_is_error(r)) return ::testing::AssertionFailure() << "tz_decompress: " << describe(r);
  if (r != src.size()) return ::testing::AssertionFailure() << "decompressed " << r << " bytes, expected " << src.size();
  if (out[src.size()] != 0x5A) return ::testing::AssertionFailure() << "wrote past the decompressed size";
  if (!src.empty() && memcmp(out.data(), src.data(), src.size()) != 0) {
    size_t i = 0;
    while (out[i] == src[i]) ++i;
    return ::testing::AssertionFailure() << "first difference at byte " << i << " of " << src.size();
  }
  if (frame_out) *frame_out = std::move(frame);
  return ::testing::AssertionSuccess();
}

// Scales a tensor by amax (per-tensor scaling, as FP8 quantisation does)
// so that its largest magnitude maps to `target`, then casts.
inline Bytes fp8_scaled(const std::vector<float>& v, bool e4m3) {
  float amax = 0;
  for (float x : v)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  const float scale = amax > 0 ? (e4m3 ? 448.0f : 57344.0f) / amax : 1.0f;
  std::vector<float> s(v.size());
  for (size_t i = 0; i < v.size(); ++i) s[i] = v[i] * scale;
  return e4m3 ? to_f8_e4m3(s) : to_f8_e5m2(s);
}

// Real tensor bytes of each dtype (cached): BF16 weights and FP32 master /
// Adam state as stored; FP16 = the BF16 weights cast to FP16; FP8 = each
// BF16 weight tensor scaled per tensor and cast; bytes = the FP32 slice.
inline const Bytes& real_data(tz_dtype dt) {
  static const Bytes bf16 = concat(bf16_slice());
  static const Bytes f32 = concat(fp32_slice());
  static const Bytes f16 = to_f16(as_floats_bf16(bf16));
  static const auto fp8 = [](bool e4m3) {
    Bytes out;
    for (const auto& t : bf16_slice()) {
      const Bytes b = fp8_scaled(as_floats_bf16(t.data), e4m3);
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  };
  static const Bytes e4m3 = fp8(true);
  static const Bytes e5m2 = fp8(false);
  switch (dt) {
    case TZ_DTYPE_BF16: return bf16;
    case TZ_DTYPE_F16: return f16;
    case TZ_DTYPE_F32: return f32;
    case TZ_DTYPE_F8_E4M3: return e4m3;
    case TZ_DTYPE_F8_E5M2: return e5m2;
    default: return f32;
  }
}

// n bytes of real data of dtype dt (tiled when more is asked than the slice holds).
inline Bytes real_bytes(tz_dtype dt, size_t n) { return tile(real_data(dt), n); }

inline std::string dtype_label(tz_dtype dt) { return tz_dtype_name(dt); }

}  // namespace tzt
