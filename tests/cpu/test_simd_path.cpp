// The kernel-set choice (src/cpu/simd_path.h): names, support, forcing a path.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/kernels.h"
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

// tz_simd_kernels names the table in use: the path's name first, and for
// avx512 and avx2, which of their two tables (the one for AMD CPUs, or for
// AMD Zen 1/2, or the others'), so that a report tells them apart.
TEST(SimdPath, KernelTableNames) {
  const SimdPath before = tz::cpu::active_simd_path();
  for (SimdPath p : tz::cpu::kAllSimdPaths) {
    if (!tz::cpu::simd_path_supported(p)) continue;
    tz::cpu::ScopedSimdPath scoped(p);
    const char* path = tz::cpu::simd_path_name(p);
    const char* kernels = tz_simd_kernels();
    ASSERT_NE(kernels, nullptr);
    EXPECT_EQ(std::strncmp(kernels, path, std::strlen(path)), 0) << kernels;
    const bool amd_table = (p == SimdPath::kAvx512 && tz::cpu::simd_cpu_is_amd()) ||
                           (p == SimdPath::kAvx2 && tz::cpu::simd_cpu_slow_gather());
    EXPECT_EQ(std::strstr(kernels, "AMD") != nullptr, amd_table) << kernels;
    const std::vector<const tz::cpu::CodecKernels*> tables = tz::cpu::codec_kernel_variants(p);
    ASSERT_FALSE(tables.empty());
    EXPECT_STREQ(kernels, tz::cpu::codec_kernels_name(*tables[0]));
    for (size_t i = 1; i < tables.size(); ++i)
      EXPECT_STRNE(tz::cpu::codec_kernels_name(*tables[i]), tz::cpu::codec_kernels_name(*tables[0])) << path;
    if (p == SimdPath::kPortable) {
      EXPECT_STREQ(kernels, "portable");
    }
  }
  EXPECT_EQ(tz::cpu::active_simd_path(), before);
}

}  // namespace
