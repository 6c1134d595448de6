// A tensor compressed on every SIMD path the CPU has (simd_paths.h): the
// same frame bytes on each, each decoding to the input. Header-only; for
// GoogleTest bodies.
#pragma once
#include <gtest/gtest.h>

#include "cpu/simd_path.h"
#include "simd_paths.h"
#include "tz_test_util.h"

namespace tzt {

// The frame (empty after a failure, which is reported).
inline Bytes compress_every_path(const Bytes& src, tz_dtype dt, int level, unsigned block_elems) {
  Bytes f;
  for (tz::cpu::SimdPath p : tz::test::paths_to_test(tz::test::current_test_name())) {
    tz::cpu::ScopedSimdPath use(p);
    const Bytes g = compress(src, dt, level, block_elems);
    if (g.empty()) return {};
    if (f.empty()) f = g;
    EXPECT_EQ(g, f) << tz::cpu::simd_path_name(p);
    Bytes back(src.size(), 0xA5);
    const size_t r = tz_decompress(back.data(), back.size(), g.data(), g.size(), 1);
    EXPECT_FALSE(tz_is_error(r)) << tz::cpu::simd_path_name(p) << ": " << tz_get_error_name(r);
    EXPECT_EQ(back, src) << tz::cpu::simd_path_name(p);
  }
  return f;
}

}  // namespace tzt
