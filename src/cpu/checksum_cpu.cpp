#include "cpu/checksum_cpu.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "codec/checksum.h"
#include "cpu/checksum_fold.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define TZ_CRC_HW 1
#define TZ_CRC_TARGET __attribute__((target("sse4.2")))
#elif defined(__aarch64__) && defined(__linux__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define TZ_CRC_HW 1
#define TZ_CRC_TARGET __attribute__((target("+crc")))
#endif

namespace tz::cpu {
namespace {

struct Table {
  uint32_t t[256];
  Table() { crc32c_make_table(t); }
};
const Table& table() {
  static const Table tab;
  return tab;
}

#if defined(TZ_CRC_HW)
// One instruction: the raw state over 8 (little-endian) bytes or one byte.
#if defined(__x86_64__)
// (64-bit states on x86-64: the instruction's own width, no moves between
// the rounds of an interleaved loop.)
TZ_CRC_TARGET inline uint64_t hw_step8(uint64_t s, const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return _mm_crc32_u64(s, v);
}
TZ_CRC_TARGET inline uint32_t hw_step1(uint32_t s, uint8_t b) { return _mm_crc32_u8(s, b); }
bool detect_hw() { return __builtin_cpu_supports("sse4.2"); }
const char* const kHwName = "sse4.2";
#else
TZ_CRC_TARGET inline uint64_t hw_step8(uint64_t s, const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return __crc32cd((uint32_t)s, v);
}
TZ_CRC_TARGET inline uint32_t hw_step1(uint32_t s, uint8_t b) { return __crc32cb(s, b); }
bool detect_hw() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
const char* const kHwName = "armv8-crc";
#endif

TZ_CRC_TARGET uint32_t hw_update(uint32_t state, const uint8_t* p, size_t n) {
  uint64_t c = state;
  for (; n >= 8; p += 8, n -= 8) c = hw_step8(c, p);
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = hw_step1(c32, *p++);
  return c32;
}

// len (a multiple of 8) bytes of each of the K streams, one instruction per
// stream per round: K independent chains (the instruction's latency is three
// cycles, its throughput one per cycle). The states stay in registers.
template <size_t... J>
TZ_CRC_TARGET void hw_lockstep(uint32_t* st, const uint8_t* const* p, size_t len, std::index_sequence<J...>) {
  uint64_t c[sizeof...(J)] = {st[J]...};
  const uint8_t* q[sizeof...(J)] = {p[J]...};
  for (size_t i = 0; i < len; i += 8) ((c[J] = hw_step8(c[J], q[J] + i)), ...);
  ((st[J] = (uint32_t)c[J]), ...);
}

TZ_CRC_TARGET void hw_streams(uint32_t* state, const uint8_t* const* p, const size_t* n, int k) {
  uint32_t s[kCrc32cMaxStreams];
  const uint8_t* q[kCrc32cMaxStreams];
  size_t left[kCrc32cMaxStreams];
  int idx[kCrc32cMaxStreams];
  for (int j = 0; j < k; ++j) s[j] = state[j], q[j] = p[j], left[j] = n[j], idx[j] = j;
  // Short streams (a KV page's 1 KiB segments): every cache line asked for
  // at once, so that memory fetches them in parallel; the hardware
  // prefetchers would learn each stream only after a few misses of its own.
  // Longer streams (the frame codec's 4 KiB segments) are left to them.
  size_t total = 0;
  for (int j = 0; j < k; ++j) total += n[j];
  if (total <= 8192)
    for (int j = 0; j < k; ++j)
      for (size_t o = 0; o < n[j]; o += 64) __builtin_prefetch(p[j] + o);
  int live = k;
  while (live > 0) {
    size_t common = left[0];
    for (int j = 1; j < live; ++j) common = left[j] < common ? left[j] : common;
    common &= ~(size_t)7;
    if (common) {
      switch (live) {
        case 1: hw_lockstep(s, q, common, std::make_index_sequence<1>{}); break;
        case 2: hw_lockstep(s, q, common, std::make_index_sequence<2>{}); break;
        case 3: hw_lockstep(s, q, common, std::make_index_sequence<3>{}); break;
        case 4: hw_lockstep(s, q, common, std::make_index_sequence<4>{}); break;
        case 5: hw_lockstep(s, q, common, std::make_index_sequence<5>{}); break;
        default: hw_lockstep(s, q, common, std::make_index_sequence<6>{}); break;
      }
      for (int j = 0; j < live; ++j) q[j] += common, left[j] -= common;
    }
    // Streams with fewer than 8 bytes left end here (the shortest one at least).
    int w = 0;
    for (int j = 0; j < live; ++j) {
      if (left[j] < 8) {
        state[idx[j]] = hw_update(s[j], q[j], left[j]);
      } else {
        s[w] = s[j], q[w] = q[j], left[w] = left[j], idx[w] = idx[j];
        ++w;
      }
    }
    live = w;
  }
}
#else
bool detect_hw() { return false; }
const char* const kHwName = "table";
#endif

const bool g_hw = detect_hw();

#if defined(__x86_64__)
// On the 512-bit path, streams of at least kCrc32cFoldMinBytes512 are folded
// one after the other and the others go through the CRC instruction's
// chains. The 128-bit path folds single buffers only: six CRC chains beat it
// on streams (measured, bench/experiments/notebook.md "CRC32C folding").
void fold_streams(uint32_t* state, const uint8_t* const* p, const size_t* n, int k) {
  uint32_t cs[kCrc32cMaxStreams];
  const uint8_t* cp[kCrc32cMaxStreams];
  size_t cn[kCrc32cMaxStreams];
  int ci[kCrc32cMaxStreams];
  int nc = 0;
  for (int j = 0; j < k; ++j) {
    if (n[j] >= kCrc32cFoldMinBytes512)
      state[j] = fold::clmul512_update(state[j], p[j], n[j]);
    else
      cs[nc] = state[j], cp[nc] = p[j], cn[nc] = n[j], ci[nc++] = j;
  }
  if (nc) {
    hw_streams(cs, cp, cn, nc);
    for (int j = 0; j < nc; ++j) state[ci[j]] = cs[j];
  }
}
#endif

bool path_supported(Crc32cPath path) {
  switch (path) {
    case Crc32cPath::kTable: return true;
    case Crc32cPath::kCrc: return detect_hw();
#if defined(__x86_64__)
    case Crc32cPath::kClmul: return fold::clmul_available();
    case Crc32cPath::kClmul512: return fold::clmul512_available();
#endif
    default: return false;
  }
}

// The best path here (measured: bench/experiments/notebook.md "CRC32C folding"), or the
// one TZ_CRC32C names when this CPU has it.
Crc32cPath choose_path() {
  Crc32cPath best = Crc32cPath::kTable;
  for (Crc32cPath p : {Crc32cPath::kCrc, Crc32cPath::kClmul, Crc32cPath::kClmul512})
    if (path_supported(p)) best = p;
  if (const char* e = std::getenv("TZ_CRC32C")) {
    for (int i = 0; i <= 3; ++i) {
      const Crc32cPath p = (Crc32cPath)i;
      const char* name = i == 1 ? "crc" : crc32c_path_name(p);
      if (strcmp(e, name) == 0 && path_supported(p)) best = p;
    }
  }
  return best;
}

const Crc32cPath g_path = choose_path();

}  // namespace

bool crc32c_hw_available() { return g_hw; }
bool crc32c_path_supported(Crc32cPath path) { return path_supported(path); }
Crc32cPath crc32c_active_path() { return g_path; }
const char* crc32c_path_name(Crc32cPath path) {
  switch (path) {
    case Crc32cPath::kCrc: return kHwName;
    case Crc32cPath::kClmul: return "pclmul";
    case Crc32cPath::kClmul512: return "vpclmulqdq";
    default: return "table";
  }
}
const char* crc32c_path() { return crc32c_path_name(g_path); }

uint32_t crc32c_update_on(Crc32cPath path, uint32_t state, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (path == Crc32cPath::kClmul512 && n >= kCrc32cFoldMinBytes512) return fold::clmul512_update(state, p, n);
  if (path == Crc32cPath::kClmul && n >= kCrc32cFoldMinBytes128) return fold::clmul_update(state, p, n);
#endif
#if defined(TZ_CRC_HW)
  if (path != Crc32cPath::kTable) return hw_update(state, p, n);
#endif
  return tz::crc32c_update(state, p, n, table().t);
}

void crc32c_update_streams_on(Crc32cPath path, uint32_t* state, const uint8_t* const* p, const size_t* n, int k) {
#if defined(__x86_64__)
  if (path == Crc32cPath::kClmul512) return fold_streams(state, p, n, k);
#endif
#if defined(TZ_CRC_HW)
  if (path != Crc32cPath::kTable) return hw_streams(state, p, n, k);
#endif
  for (int j = 0; j < k; ++j) state[j] = tz::crc32c_update(state[j], p[j], n[j], table().t);
}

uint32_t crc32c_update(uint32_t state, const uint8_t* p, size_t n) { return crc32c_update_on(g_path, state, p, n); }

uint32_t crc32c(const uint8_t* p, size_t n) { return ~crc32c_update(~0u, p, n); }

void crc32c_update_streams(uint32_t* state, const uint8_t* const* p, const size_t* n, int k) {
  crc32c_update_streams_on(g_path, state, p, n, k);
}

uint32_t crc32c_segment_list(const uint8_t* p, size_t n, size_t segment, const uint8_t* head) {
  // acc is the running CRC state over the LE32 list of segment CRCs; up to
  // kCrc32cMaxStreams segments are hashed at once.
  uint32_t acc = ~0u;
  for (size_t off = 0; off < n; off += kCrc32cMaxStreams * segment) {
    uint32_t st[kCrc32cMaxStreams];
    const uint8_t* sp[kCrc32cMaxStreams];
    size_t len[kCrc32cMaxStreams];
    int k = 0;
    for (size_t o = off; o < n && k < kCrc32cMaxStreams; o += segment, ++k) {
      st[k] = ~0u;
      sp[k] = p + o;
      len[k] = (n - o) < segment ? (n - o) : segment;
    }
    if (off == 0 && head) {  // segment 0 starts with head's 16 bytes
      st[0] = crc32c_update(~0u, head, 16);
      sp[0] += 16;
      len[0] -= 16;
    }
    crc32c_update_streams(st, sp, len, k);
    uint8_t le[4 * kCrc32cMaxStreams];
    for (int j = 0; j < k; ++j) store_le32(le + 4 * j, ~st[j]);
    acc = crc32c_update(acc, le, 4 * (size_t)k);
  }
  return ~acc;
}

uint32_t block_checksum(const uint8_t* p, size_t n) { return crc32c_segment_list(p, n, kChecksumSegment, nullptr); }

}  // namespace tz::cpu
