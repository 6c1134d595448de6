#include "cpu/checksum_cpu.h"

#include "codec/checksum.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
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

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t hw_update(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c64;
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// Three full segments at once: the crc32 instruction has a latency of three
// cycles and a throughput of one, so three independent chains fill it.
__attribute__((target("sse4.2"))) void hw_three_segments(const uint8_t* p, uint32_t out[3]) {
  uint64_t a = ~0u, b = ~0u, c = ~0u;
  const uint8_t* pa = p;
  const uint8_t* pb = p + kChecksumSegment;
  const uint8_t* pc = p + 2 * kChecksumSegment;
  for (size_t i = 0; i < kChecksumSegment; i += 8) {
    uint64_t va, vb, vc;
    memcpy(&va, pa + i, 8);
    memcpy(&vb, pb + i, 8);
    memcpy(&vc, pc + i, 8);
    a = _mm_crc32_u64(a, va);
    b = _mm_crc32_u64(b, vb);
    c = _mm_crc32_u64(c, vc);
  }
  out[0] = ~(uint32_t)a;
  out[1] = ~(uint32_t)b;
  out[2] = ~(uint32_t)c;
}

bool detect_hw() { return __builtin_cpu_supports("sse4.2"); }
#else
bool detect_hw() { return false; }
#endif

const bool g_hw = detect_hw();

uint32_t seg_crc(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (g_hw) return ~hw_update(~0u, p, n);
#endif
  return tz::crc32c(p, n, table().t);
}

}  // namespace

bool crc32c_hw_available() { return g_hw; }

uint32_t crc32c(const uint8_t* p, size_t n) { return seg_crc(p, n); }

static uint32_t update_raw(uint32_t state, const uint8_t* p, size_t n);
uint32_t crc32c_update(uint32_t state, const uint8_t* p, size_t n) { return update_raw(state, p, n); }

static uint32_t update_raw(uint32_t state, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (g_hw) return hw_update(state, p, n);
#endif
  return tz::crc32c_update(state, p, n, table().t);
}

uint32_t block_checksum(const uint8_t* p, size_t n) {
  // acc is the running CRC state over the LE32 list of segment CRCs.
  uint32_t acc = ~0u;
  uint8_t le[12];
  size_t off = 0;
#if defined(__x86_64__)
  if (g_hw) {
    for (; n - off >= 3 * kChecksumSegment; off += 3 * kChecksumSegment) {
      uint32_t c[3];
      hw_three_segments(p + off, c);
      for (int i = 0; i < 3; ++i) store_le32(le + 4 * i, c[i]);
      acc = hw_update(acc, le, 12);
    }
  }
#endif
  for (; off < n; off += kChecksumSegment) {
    const size_t len = (n - off) < kChecksumSegment ? (n - off) : kChecksumSegment;
    store_le32(le, seg_crc(p + off, len));
    acc = update_raw(acc, le, 4);
  }
  return ~acc;
}

}  // namespace tz::cpu
