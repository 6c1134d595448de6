// When TZ_SIMD names a kernel set, this test binary runs on it: ctest runs
// the frame and container suites once per SIMD path this way
// (tests/CMakeLists.txt). A path this CPU or build lacks skips every test,
// saying so, instead of running them again on the fallback path.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensorzip/tensorzip.h"

namespace {

class RequestedSimdPath : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* want = std::getenv("TZ_SIMD");
    if (!want || !*want) return;
    if (std::strcmp(tz_simd_path(), want) != 0)
      GTEST_SKIP() << "TZ_SIMD=" << want << " is not available on this CPU and build (the codec would run "
                   << tz_simd_path() << "): every test skipped";
    std::printf("[ SIMD PATH ] every test runs on the %s kernels (TZ_SIMD)\n", want);
  }
};

[[maybe_unused]] ::testing::Environment* const g_requested_path =
    ::testing::AddGlobalTestEnvironment(new RequestedSimdPath);

}  // namespace
