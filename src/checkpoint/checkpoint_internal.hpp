// Internals shared by the checkpoint engine's sources (src/checkpoint):
// errors, file names of a checkpoint folder, small helpers. The parts:
//   checkpoint.cpp     save pipeline: codec choice, rank file, save(), commit()
//   manifest.cpp       manifest: write, bounded read, strict validation, is_complete/latest
//   references.cpp     delta references: the save's SaveOptions::ref, restore's previous rank files
//   restore.cpp        Checkpoint: open, rank files checked against the container Reader, load plan
//   restore_ring.cpp   restore's reads ahead: ordered pipeline (read queue -> aligned slots -> decode)
//   async_saver.cpp    AsyncSaver: staging copy, background save, error hand-over
#pragma once

#include <errno.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <system_error>
#include <thread>

#include "../io/cufile.hpp"
#include "tensorzip/checkpoint.hpp"
#include "tensorzip/container.hpp"

namespace tz::checkpoint::detail {

using Clock = std::chrono::steady_clock;

inline constexpr const char* kManifest = "manifest.json";
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

[[noreturn]] inline void fail(ErrorKind k, const std::string& m) { throw Error(k, m); }
[[noreturn]] inline void fail_errno(const std::string& path, const std::string& what, int err) {
  const ErrorKind k = (err == ENOSPC || err == EFBIG || err == EDQUOT) ? ErrorKind::kNoSpace : ErrorKind::kIO;
  fail(k, path + ": " + what + ": " + std::strerror(err));
}

inline double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}
// 16 lower-case hex digits; false otherwise.
bool parse_hex64(const std::string& s, uint64_t* out);

inline uint64_t align64(uint64_t x) { return (x + 63) & ~uint64_t{63}; }

inline std::string rank_file(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.tzip", rank);
  return b;
}
inline std::string rank_index(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.json", rank);
  return b;
}

inline unsigned resolve_threads(unsigned t) {
  if (t) return t;
  const unsigned h = std::thread::hardware_concurrency();
  return h ? h : 1;
}

inline std::string parent_of(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : p.substr(0, s);
}

// A container error as a checkpoint error of the matching kind.
[[noreturn]] void rethrow_container(const tz::container::Error& e);

// Runs f(); an allocation failure inside it (std::bad_alloc), or a thread
// that could not start (std::system_error), becomes Error(kInternal) naming
// `what`, so that every failure of the public API is a tz::checkpoint::Error.
template <class F>
decltype(auto) resource_errors_as_error(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::kInternal, what + ": out of memory");
  } catch (const std::system_error& e) {
    fail(ErrorKind::kInternal, what + ": " + e.what());
  }
}

// GPUDirect Storage for this save or restore: requested with Io::kGds, and
// the cuFile library, its driver and a GPU present (else POSIX/io_uring and
// the reason is reported).
tz::io::GdsDecision gds_decision(Io io);

}  // namespace tz::checkpoint::detail
