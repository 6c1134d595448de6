// The kernel-set choice (src/cpu/simd_path.h): names, support, forcing a path.
#include <gtest/gtest.h>

#include <cstring>

#include "cpu/simd_path.h"
#include "tensorzip/tensorzip.h"

namespace {
using tz::cpu::SimdPath;

TEST(SimdPath, NamesRoundTrip) {
  for (SimdPath p : tz::cpu::kAllSimdPaths) {
    SimdPath q = SimdPath::kPortable;
    ASSERT_TRUE(tz::cpu::parse_simd_path(tz::cpu::simd_path_name(p), &q)) << tz::cpu::simd_path_name(p);
    EXPECT_EQ(q, p);
  }
  SimdPath q = SimdPath::kAvx2;
  EXPECT_FALSE(tz::cpu::parse_simd_path("sse9", &q));
  EXPECT_FALSE(tz::cpu::parse_simd_path("", &q));
  EXPECT_EQ(q, SimdPath::kAvx2);
}

TEST(SimdPath, PortableAlwaysSupportedAndBestIsSupported) {
  EXPECT_TRUE(tz::cpu::simd_path_supported(SimdPath::kPortable));
  EXPECT_TRUE(tz::cpu::simd_path_supported(tz::cpu::best_simd_path()));
#if defined(__x86_64__)
  EXPECT_FALSE(tz::cpu::simd_path_supported(SimdPath::kNeon));
#elif defined(__aarch64__)
  EXPECT_FALSE(tz::cpu::simd_path_supported(SimdPath::kAvx2));
  EXPECT_FALSE(tz::cpu::simd_path_supported(SimdPath::kAvx512));
#endif
}

TEST(SimdPath, ScopedPathSwitchesAndRestores) {
  const SimdPath before = tz::cpu::active_simd_path();
  for (SimdPath p : tz::cpu::kAllSimdPaths) {
    if (!tz::cpu::simd_path_supported(p)) continue;
    {
      tz::cpu::ScopedSimdPath scoped(p);
      EXPECT_EQ(tz::cpu::active_simd_path(), p);
      EXPECT_STREQ(tz_simd_path(), tz::cpu::simd_path_name(p));
    }
    EXPECT_EQ(tz::cpu::active_simd_path(), before);
  }
  for (SimdPath p : tz::cpu::kAllSimdPaths) {
    if (tz::cpu::simd_path_supported(p)) continue;
    tz::cpu::ScopedSimdPath scoped(p);  // unsupported: no change
    EXPECT_EQ(tz::cpu::active_simd_path(), before);
  }
}

TEST(SimdPath, CApiSwitchesPaths) {
  const SimdPath before = tz::cpu::active_simd_path();
  for (SimdPath p : tz::cpu::kAllSimdPaths) {
    const int r = tz_set_simd_path(tz::cpu::simd_path_name(p));
    if (tz::cpu::simd_path_supported(p)) {
      EXPECT_EQ(r, 0);
      EXPECT_STREQ(tz_simd_path(), tz::cpu::simd_path_name(p));
    } else {
      EXPECT_EQ(r, -1) << tz::cpu::simd_path_name(p);
    }
  }
  EXPECT_EQ(tz_set_simd_path("sse9"), -1);
  EXPECT_EQ(tz_set_simd_path(nullptr), -1);
  EXPECT_EQ(tz_set_simd_path(tz::cpu::simd_path_name(before)), 0);
  EXPECT_EQ(tz::cpu::active_simd_path(), before);
}

}  // namespace
