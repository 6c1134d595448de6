#include "cpu/simd_path.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tz::cpu {

namespace {

bool cpu_has(SimdPath p) {
  switch (p) {
    case SimdPath::kPortable: return true;
#if defined(__x86_64__)
    case SimdPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
    case SimdPath::kAvx512:
      // The AVX-512 table also runs AVX2 kernels (kernels.h) and FMA.
      return cpu_has(SimdPath::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2");
#endif
#if defined(__aarch64__)
    case SimdPath::kNeon:
#if defined(__linux__)
      return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
      return true;  // Advanced SIMD is mandatory in AArch64
#endif
#endif
    default: return false;
  }
}

// Paths the frame codec of this build has kernels for. A path is listed
// here only once its kernel table is complete (src/cpu/kernels.h,
// src/cpu/simd_*.cpp).
bool built_with(SimdPath p) {
  switch (p) {
    case SimdPath::kPortable: return true;
#if defined(__x86_64__)
    case SimdPath::kAvx2: return true;
    case SimdPath::kAvx512: return true;
#endif
#if defined(__aarch64__)
    case SimdPath::kNeon: return true;
#endif
    default: return false;
  }
}

std::string g_note;

SimdPath initial_path() {
  const SimdPath best = best_simd_path();
  const char* env = std::getenv("TZ_SIMD");
  if (env && *env) {
    SimdPath want;
    if (!parse_simd_path(env, &want)) {
      g_note = std::string("TZ_SIMD=") + env + " is not a known path (portable, avx2, avx512, neon); using " +
               simd_path_name(best);
      return best;
    }
    if (!simd_path_supported(want)) {
      g_note = std::string("TZ_SIMD=") + env + ": not available on this CPU or build; using " + simd_path_name(best);
      return best;
    }
    return want;
  }
  const char* no_simd = std::getenv("TZ_NO_SIMD");
  if (no_simd && *no_simd && std::strcmp(no_simd, "0") != 0) return SimdPath::kPortable;
  return best;
}

std::atomic<SimdPath>& active() {
  static std::atomic<SimdPath> p{initial_path()};
  return p;
}

}  // namespace

const char* simd_path_name(SimdPath p) {
  switch (p) {
    case SimdPath::kPortable: return "portable";
    case SimdPath::kAvx2: return "avx2";
    case SimdPath::kAvx512: return "avx512";
    case SimdPath::kNeon: return "neon";
  }
  return "unknown";
}

bool parse_simd_path(const char* name, SimdPath* out) {
  for (SimdPath p : kAllSimdPaths)
    if (std::strcmp(name, simd_path_name(p)) == 0) {
      *out = p;
      return true;
    }
  return false;
}

bool simd_path_cpu_has(SimdPath p) { return cpu_has(p); }

bool simd_cpu_is_amd() {
#if defined(__x86_64__)
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#else
  return false;
#endif
}
bool simd_cpu_slow_gather() {
#if defined(__x86_64__)
  static const bool slow = __builtin_cpu_is("amdfam17h");
  return slow;
#else
  return false;
#endif
}
bool simd_path_supported(SimdPath p) { return built_with(p) && cpu_has(p); }

SimdPath best_simd_path() {
  static const SimdPath best = [] {
    for (SimdPath p : {SimdPath::kAvx512, SimdPath::kAvx2, SimdPath::kNeon})
      if (simd_path_supported(p)) return p;
    return SimdPath::kPortable;
  }();
  return best;
}

SimdPath active_simd_path() { return active().load(std::memory_order_relaxed); }

const char* simd_path_note() {
  (void)active();  // the note is set when the path is first chosen
  return g_note.c_str();
}

bool set_active_simd_path(SimdPath p) {
  if (!simd_path_supported(p)) return false;
  active().store(p, std::memory_order_relaxed);
  return true;
}

ScopedSimdPath::ScopedSimdPath(SimdPath p) : prev_(active_simd_path()) {
  active().store(simd_path_supported(p) ? p : prev_, std::memory_order_relaxed);
}
ScopedSimdPath::~ScopedSimdPath() { active().store(prev_, std::memory_order_relaxed); }

}  // namespace tz::cpu
