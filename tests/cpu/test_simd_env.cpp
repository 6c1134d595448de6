// When TZ_SIMD names a kernel set, this test binary runs on it: ctest runs
// the frame and container suites once per SIMD path this way
// (tests/CMakeLists.txt). A path this CPU or build lacks runs no test: the
// binary says so and exits with kSkipExit before any test, which ctest
// reports as skipped (SKIP_RETURN_CODE), not as passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensorzip/tensorzip.h"

namespace {

constexpr int kSkipExit = 77;  // SKIP_RETURN_CODE of the per-path ctest entries

class RequestedSimdPath : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* want = std::getenv("TZ_SIMD");
    if (!want || !*want) return;
    if (std::strcmp(tz_simd_path(), want) != 0) {
      std::printf("TZ_SIMD=%s is not available on this CPU and build (the codec would run %s): no test run, "
                  "exit %d (skipped)\n", want, tz_simd_path(), kSkipExit);
      std::fflush(stdout);
      std::_Exit(kSkipExit);
    }
    std::printf("[ SIMD PATH ] every test runs on the %s kernels (TZ_SIMD)\n", want);
  }
};

[[maybe_unused]] ::testing::Environment* const g_requested_path =
    ::testing::AddGlobalTestEnvironment(new RequestedSimdPath);

}  // namespace
