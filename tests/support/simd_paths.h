// Which SIMD kernel sets a test compares with the portable code: every path
// this build has kernels for and this CPU runs. Each path left out is named
// on stdout with the reason, so a log shows what was not covered.
#pragma once
#include <cstdio>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/simd_path.h"

namespace tz::test {

inline void note_skipped_path(const char* test, cpu::SimdPath p, const char* why) {
  std::printf("[ PATH SKIP ] %s: %s not tested (%s)\n", test, cpu::simd_path_name(p), why);
}

// Kernel tables of the SIMD paths (portable excluded) to compare.
inline std::vector<const cpu::CodecKernels*> simd_kernels_to_test(const char* test) {
  std::vector<const cpu::CodecKernels*> r;
  for (cpu::SimdPath p : cpu::kAllSimdPaths) {
    if (p == cpu::SimdPath::kPortable) continue;
    const cpu::CodecKernels* k = cpu::codec_kernels_for(p);
    if (!k)
      note_skipped_path(test, p, "no kernels for this architecture");
    else if (!cpu::simd_path_cpu_has(p))
      note_skipped_path(test, p, "this CPU lacks it");
    else
      r.push_back(k);
  }
  return r;
}

// Every path the codec can be switched to here (portable first), for loops
// over ScopedSimdPath.
inline std::vector<cpu::SimdPath> paths_to_test(const char* test) {
  std::vector<cpu::SimdPath> r{cpu::SimdPath::kPortable};
  for (const cpu::CodecKernels* k : simd_kernels_to_test(test))
    if (cpu::simd_path_supported(k->path)) r.push_back(k->path);
  return r;
}

}  // namespace tz::test
