// NEON (AArch64 Advanced SIMD) kernel set of the KV page codec:
// kernel_set.inc (the page loops, escape patching and the kernel set,
// written once for every SIMD path) over 16-byte primitives, and the rANS
// decoder with 4-lane vectors (AArch64 has no gather: each lane's table entry
// is loaded on its own, the arithmetic and the word placement are vector
// code); the rANS encoder is the frame codec's. Same bytes and statuses as
// the portable kernels.
#include "kv/codec.hpp"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <array>

#include "cpu/kernels.h"

namespace tz::kv {
namespace {

// ------------------------------------------------------------ lane tables --
// Decoder: for the 4-bit mask m of lanes that take a word, kExpand[m] moves
// the bytes of word #(mask bits below j) of the loaded words (widened to u32)
// into u32 lane j.
constexpr std::array<std::array<uint8_t, 16>, 16> make_expand() {
  std::array<std::array<uint8_t, 16>, 16> t{};
  for (int m = 0; m < 16; ++m) {
    int c = 0;
    for (int j = 0; j < 4; ++j) {
      const int k = (m >> j) & 1 ? c++ : 0;
      for (int b = 0; b < 4; ++b) t[m][4 * j + b] = (uint8_t)(4 * k + b);
    }
  }
  return t;
}
alignas(16) constexpr std::array<std::array<uint8_t, 16>, 16> kExpand = make_expand();

inline uint32_t lane_mask(uint32x4_t m) {
  const uint32_t w[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(m, vld1q_u32(w)));
}

// 16-bit mask of the nonzero bytes of v (bit i = byte i).
inline uint32_t byte_mask(uint8x16_t v) {
  static const uint8_t w[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t t = vandq_u8(vtstq_u8(v, v), vld1q_u8(w));
  return (uint32_t)vaddv_u8(vget_low_u8(t)) | ((uint32_t)vaddv_u8(vget_high_u8(t)) << 8);
}

// ------------------------------------------------------------ fields --
constexpr uint32_t kFieldBlock = 16;

// 16 elements of BF16 / F16 into 16 bytes of each stream.
template <uint8_t D>
inline void split_block(const uint8_t* src, uint8_t* s0, uint8_t* s1) {
  const uint8x16x2_t v = vld2q_u8(src);  // val[0] low bytes, val[1] high bytes
  if constexpr (D == kBF16) {
    vst1q_u8(s0, vorrq_u8(vshlq_n_u8(v.val[1], 1), vshrq_n_u8(v.val[0], 7)));
    vst1q_u8(s1, vbslq_u8(vdupq_n_u8(0x80), v.val[1], v.val[0]));
  } else {
    vst1q_u8(s0, v.val[1]);
    vst1q_u8(s1, v.val[0]);
  }
}

// 16 elements of BF16 / F16 from 16 bytes of each stream.
inline void merge_block(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
  const uint8x16_t e = vld1q_u8(s0), m = vld1q_u8(s1);
  uint8x16x2_t v;
  if (dtype == kBF16) {
    v.val[0] = vbslq_u8(vdupq_n_u8(0x80), vshlq_n_u8(e, 7), m);
    v.val[1] = vbslq_u8(vdupq_n_u8(0x80), m, vshrq_n_u8(e, 1));
  } else {
    v.val[0] = m;
    v.val[1] = e;
  }
  vst2q_u8(dst, v);
}

// ------------------------------------------------------------ scans --
constexpr uint32_t kScanBytes = 16;

struct ByteEq {
  uint8x16_t v;
  explicit ByteEq(uint8_t e) : v(vdupq_n_u8(e)) {}
  uint32_t mask(const uint8_t* p) const {
    const uint8x16_t hit = vceqq_u8(vld1q_u8(p), v);
    return vmaxvq_u8(hit) == 0 ? 0 : byte_mask(hit);
  }
};

struct DirectScan {
  uint8x16x2_t bm;
  uint8x16_t bitv;
  DirectScan(const KvCodecTables& c, int k) {
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    bm.val[0] = vld1q_u8(c.direct_bits[k]);
    bm.val[1] = vld1q_u8(c.direct_bits[k] + 16);
    bitv = vld1q_u8(bits);
  }
  uint32_t not_direct(const uint8_t* p) const {
    const uint8x16_t v = vld1q_u8(p);
    const uint8x16_t byte = vqtbl2q_u8(bm, vshrq_n_u8(v, 3));
    const uint8x16_t bit = vqtbl1q_u8(bitv, vandq_u8(v, vdupq_n_u8(7)));
    const uint8x16_t direct = vtstq_u8(byte, bit);
    return vminvq_u8(direct) == 0xFF ? 0 : byte_mask(vmvnq_u8(direct));
  }
};

inline uint8x16_t codes16(const KvCodecTables& c, uint8x16_t v, uint8x16_t esc) {
  const uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0F));
  const uint8x16_t hi = vshrq_n_u8(v, 4);
  uint8x16_t code = esc;
  for (int j = 0; j < c.fixed_hi_n; ++j) {
    const int h = c.fixed_hi[j];
    code = vbslq_u8(vceqq_u8(hi, vdupq_n_u8((uint8_t)h)), vqtbl1q_u8(vld1q_u8(c.fixed_lut[h]), lo), code);
  }
  return code;
}

struct CodeScan {
  const KvCodecTables* c;
  uint8x16_t esc;
  explicit CodeScan(const KvCodecTables& t) : c(&t), esc(vdupq_n_u8((uint8_t)fixed_escape_code(t.t.fixed_bits))) {}
  size_t codes(const uint8_t* s, uint8_t* codes, uint32_t i) const {
    const uint8x16_t code = codes16(*c, vld1q_u8(s + i), esc);
    vst1q_u8(codes + i, code);
    return vaddvq_u8(vshrq_n_u8(vceqq_u8(code, esc), 7));
  }
  bool all_uncoded(const uint8_t* p, size_t count) const {
    if (count < kScanBytes) return kv_all_uncoded(*c, p, count);
    return vminvq_u8(vceqq_u8(codes16(*c, vld1q_u8(p), esc), esc)) == 0xFF;
  }
};

// ------------------------------------------------------------ fixed --
void fixed_planes_isa(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out,
                      uint8_t* lit) {
  const uint32_t bits = c.t.fixed_bits;
  const uint8x16_t esc = vdupq_n_u8((uint8_t)fixed_escape_code(bits));
  uint32_t g = 0;
  for (; (g + 1) * kGroup <= n; ++g) {
    const uint8x16_t a = vld1q_u8(codes + g * kGroup), b = vld1q_u8(codes + g * kGroup + 16);
    for (uint32_t k = 0; k < bits; ++k) {
      const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << k));
      const uint32_t w = byte_mask(vandq_u8(a, bit)) | (byte_mask(vandq_u8(b, bit)) << 16);
      store_le32(out + 4 * ((size_t)g * bits + k), w);
    }
    const uint8x16_t ea = vceqq_u8(a, esc), eb = vceqq_u8(b, esc);
    if (vmaxvq_u8(vorrq_u8(ea, eb)) == 0) continue;
    for (uint32_t m = byte_mask(ea) | (byte_mask(eb) << 16); m; m &= m - 1) *lit++ = s0[g * kGroup + __builtin_ctz(m)];
  }
  kv_fixed_planes_from(c, codes, s0, n, g, out, lit);
}

// Bits 0..15 of w as 16 bytes 0x00 / 0xFF.
inline uint8x16_t bits_to_bytes16(uint32_t w) {
  static const uint8_t rep[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(w)), vld1q_u8(rep));
  return vtstq_u8(v, vld1q_u8(sel));
}

struct FixedGroups {
  uint8x16_t lut;
  uint32_t bits;
  FixedGroups(const uint8_t* syms, uint32_t b) : lut(vld1q_u8(syms)), bits(b) {}
  size_t group(const uint8_t* q, const uint8_t* lit, uint8_t* o) const {
    uint8x16_t ca = vdupq_n_u8(0), cb = vdupq_n_u8(0);
    uint32_t all = ~0u;
    for (uint32_t b = 0; b < bits; ++b) {
      const uint32_t w = load_le32(q + 4 * b);
      all &= w;
      const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << b));
      ca = vorrq_u8(ca, vandq_u8(bits_to_bytes16(w), bit));
      cb = vorrq_u8(cb, vandq_u8(bits_to_bytes16(w >> 16), bit));
    }
    vst1q_u8(o, vqtbl1q_u8(lut, ca));
    vst1q_u8(o + 16, vqtbl1q_u8(lut, cb));
    size_t j = 0;
    for (; all; all &= all - 1) o[__builtin_ctz(all)] = lit[j++];
    return j;
  }
};

// ------------------------------------------------------------ rANS --
inline uint32x4_t gather4(const uint32_t* t, uint32x4_t idx) {
  uint32x4_t r = vdupq_n_u32(t[vgetq_lane_u32(idx, 0)]);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 1)], r, 1);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 2)], r, 2);
  return vsetq_lane_u32(t[vgetq_lane_u32(idx, 3)], r, 3);
}

// The frame codec's NEON rANS encoder (the same coder on the same freq |
// start tables; 8 bytes stored at wp - 4, within the 64 bytes of slack below
// the words).
size_t rans_encode_isa(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words, uint8_t* out,
                       size_t limit) {
  return cpu::kNeonKernels.rans_encode(sym, n, cpu::EncTables{c.enc[k], c.fs[k]}, RansCtx{}, words, out, limit);
}

// One decode step for 4 lanes in two phases (as the x86 kernels): every
// group's new state and word mask first, then the words at offsets summed
// from the masks, so the eight groups of a step do not wait for each other.
inline uint32x4_t dec4_state(uint32x4_t& x, const uint32_t* dec, uint32x4_t* need, uint32_t* m) {
  const uint32x4_t e = gather4(dec, vandq_u32(x, vdupq_n_u32(kProbScale - 1)));
  const uint32x4_t f = vaddq_u32(vandq_u32(vshrq_n_u32(e, 8), vdupq_n_u32(0xFFF)), vdupq_n_u32(1));
  x = vmlaq_u32(vshrq_n_u32(e, 20), f, vshrq_n_u32(x, kProbBits));
  *need = vceqq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(0));
  *m = lane_mask(*need);
  return vandq_u32(e, vdupq_n_u32(0xFF));
}

inline void dec4_words(uint32x4_t& x, uint32x4_t need, uint32_t m, const uint8_t* p) {
  const uint32x4_t w = vmovl_u16(vld1_u16((const uint16_t*)p));
  const uint32x4_t wx = vreinterpretq_u32_u8(vqtbl1q_u8(vreinterpretq_u8_u32(w), vld1q_u8(kExpand[m].data())));
  x = vbslq_u32(need, vorrq_u32(vshlq_n_u32(x, 16), wx), x);
}

int rans_decode_isa(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32x4_t v[8];
  for (int g = 0; g < 8; ++g) v[g] = vld1q_u32((const uint32_t*)(in + 16 * g));
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  uint32_t s = 0;
  for (; s < full && end - p >= 64; ++s) {  // eight 8-byte reads, each past the words before it
    uint32x4_t sy[8], need[8];
    uint32_t m[8];
    for (int g = 0; g < 8; ++g) sy[g] = dec4_state(v[g], dec, &need[g], &m[g]);
    for (int g = 0; g < 8; ++g) {
      dec4_words(v[g], need[g], m[g], p);
      p += 2 * (size_t)__builtin_popcount(m[g]);
    }
    for (int h = 0; h < 2; ++h) {
      const uint16x8_t a = vcombine_u16(vmovn_u32(sy[4 * h]), vmovn_u32(sy[4 * h + 1]));
      const uint16x8_t b = vcombine_u16(vmovn_u32(sy[4 * h + 2]), vmovn_u32(sy[4 * h + 3]));
      vst1q_u8(out + (size_t)s * kLanes + 16 * h, vcombine_u8(vmovn_u16(a), vmovn_u16(b)));
    }
  }
  uint32_t x[kLanes];
  for (int g = 0; g < 8; ++g) vst1q_u32(x + 4 * g, v[g]);
  return rans_decode_tail(x, p, end, s, n, dec, RansEmitBytes{out});
}

// ------------------------------------------------------------ kernel set --
#define TZ_KV_TARGET
#include "kv/kernel_set.inc"
#undef TZ_KV_TARGET

}  // namespace

const PageKernels* neon_kernels() { return &kSimdKernels; }

}  // namespace tz::kv
#endif
