// Which SIMD kernel sets a test compares with the portable code: every path
// this build has kernels for and this CPU runs. Each path left out is named
// on stdout with the reason, so a log shows what was not covered. Also the
// check that the portable decoder decodes as the shared one does.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"

namespace tz::test {

// The running test's name (what the skipped-path notes name).
inline const char* current_test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

inline void note_skipped_path(const char* test, cpu::SimdPath p, const char* why) {
  std::printf("[ PATH SKIP ] %s: %s not tested (%s)\n", test, cpu::simd_path_name(p), why);
}

// Kernel tables of the SIMD paths (portable excluded) to compare: every
// variant of a path (AVX-512 has two, cpu/kernels.h), not only this CPU's.
inline std::vector<const cpu::CodecKernels*> simd_kernels_to_test(const char* test) {
  std::vector<const cpu::CodecKernels*> r;
  for (cpu::SimdPath p : cpu::kAllSimdPaths) {
    if (p == cpu::SimdPath::kPortable) continue;
    const std::vector<const cpu::CodecKernels*> ks = cpu::codec_kernel_variants(p);
    if (ks.empty())
      note_skipped_path(test, p, "no kernels for this architecture");
    else if (!cpu::simd_path_cpu_has(p))
      note_skipped_path(test, p, "this CPU lacks it");
    else
      r.insert(r.end(), ks.begin(), ks.end());
  }
  return r;
}

// Every path the codec can be switched to here (portable first), for loops
// over ScopedSimdPath.
inline std::vector<cpu::SimdPath> paths_to_test(const char* test) {
  std::vector<cpu::SimdPath> r{cpu::SimdPath::kPortable};
  for (const cpu::CodecKernels* k : simd_kernels_to_test(test))
    if (cpu::simd_path_supported(k->path) && (r.back() != k->path)) r.push_back(k->path);
  return r;
}

// Decodes c (n symbols) with the portable kernels and with the shared decoder
// of src/codec/rans.h, both from the decode tables at dec: the same status,
// and the same symbols where it decodes; where c is the stream as coded
// (coded != nullptr), it must decode to *coded. (The portable decoder keeps
// split tables of the last few table sets it saw, found by their content:
// dec may be any buffer holding the tables.)
inline void expect_portable_decode_as_shared(const std::vector<uint8_t>& c, uint32_t n, const uint32_t* dec,
                                             const RansCtx& ctx, const std::vector<uint8_t>* coded,
                                             const std::string& tag) {
  std::vector<uint8_t> want(n, 0xAB), got(n, 0xCD);
  const int st = rans_decode_ctx(c.data(), c.size(), n, dec, ctx, want.data());
  ASSERT_EQ(cpu::kPortableKernels.rans_decode(c.data(), c.size(), n, dec, ctx, got.data()), st) << tag;
  if (coded) {
    ASSERT_EQ(st, kOk) << tag;
    ASSERT_EQ(got, *coded) << tag;
  }
  if (st == kOk) {
    ASSERT_EQ(got, want) << tag;
  }
}

}  // namespace tz::test

// Declares `var`, the kernel sets simd_kernels_to_test gives, and skips the
// test when there are none.
#define SIMD_KERNELS_OR_SKIP(var)                                                 \
  const auto var = tz::test::simd_kernels_to_test(tz::test::current_test_name()); \
  if (var.empty()) GTEST_SKIP() << "no SIMD kernel set on this CPU and build: nothing to compare"
