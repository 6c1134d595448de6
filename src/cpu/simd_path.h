// Which CPU kernel set runs: the one rule for choosing among the portable
// code and the SIMD paths. Every path produces exactly the portable code's
// bytes and statuses (tests compare them), so the choice changes speed only.
//
// The active path is the best one the CPU and the build both have, unless the
// environment variable TZ_SIMD names another (portable | avx2 | avx512 | neon;
// a path this CPU lacks falls back to the best one it has, and the reason is
// kept in simd_path_note()). TZ_NO_SIMD=1 (older spelling) means portable.
// Tests switch paths at run time with ScopedSimdPath.
#pragma once
#include <cstdint>

namespace tz::cpu {

enum class SimdPath : uint8_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3 };
inline constexpr SimdPath kAllSimdPaths[] = {SimdPath::kPortable, SimdPath::kAvx2, SimdPath::kAvx512,
                                             SimdPath::kNeon};

const char* simd_path_name(SimdPath p);
// Parses a name as TZ_SIMD spells it; false when unknown.
bool parse_simd_path(const char* name, SimdPath* out);

// True when this CPU can run instructions of path p (whether or not the
// frame codec of this build has kernels for it: a component with kernels of
// its own, or a test calling one kernel directly, checks this).
bool simd_path_cpu_has(SimdPath p);
// True on an AMD x86-64 CPU (the AVX-512 kernel table differs there:
// cpu/kernels.h).
bool simd_cpu_is_amd();
// Whether this CPU's 8-lane AVX2 gather (vpgatherdd) is slow enough that
// eight scalar loads beat it: AMD family 17h (Zen, Zen+, Zen 2), where it is
// microcoded (12.9 cycles against about 7 on Zen 4); the AVX2 table then
// loads table entries one by one (kernels.h, kAvx2ScalarFetchKernels).
bool simd_cpu_slow_gather();
// True when the frame codec of this build has kernels for p and this CPU can
// run them: the paths active_simd_path() may take.
bool simd_path_supported(SimdPath p);
// The best supported path (ignores TZ_SIMD).
SimdPath best_simd_path();
// The path the codec uses now (TZ_SIMD, else best_simd_path()).
SimdPath active_simd_path();
// Makes p the active path when simd_path_supported(p) (false otherwise, and
// nothing changes). Not while other threads are coding.
bool set_active_simd_path(SimdPath p);
// Why the active path differs from what TZ_SIMD asked for ("" when it does not).
const char* simd_path_note();

// Forces a path for the lifetime of the object (tests and benchmarks): check
// simd_path_supported() first, an unsupported path leaves the active one
// unchanged. The previous path comes back on destruction.
// Not for use while other threads are coding.
class ScopedSimdPath {
 public:
  explicit ScopedSimdPath(SimdPath p);
  ~ScopedSimdPath();
  ScopedSimdPath(const ScopedSimdPath&) = delete;
  ScopedSimdPath& operator=(const ScopedSimdPath&) = delete;

 private:
  SimdPath prev_;
};

}  // namespace tz::cpu
