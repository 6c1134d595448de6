// NEON (AArch64 Advanced SIMD) kernel set of the KV page codec: the
// operations of kv_page.h's KvScalarCoder / KvScalarDecoder with 4-lane
// vectors for the rANS states and 16-byte vectors for the fields, same bytes
// and statuses as the portable kernels. AArch64 has no gather: each lane's
// table entry is loaded on its own, the arithmetic and the word placement
// (table lookups) are vector code.
#include "kv_codec.hpp"

#if defined(__aarch64__)
#include <arm_neon.h>

namespace tz::kv {
namespace {

// ------------------------------------------------------------ lane tables --
struct NeonLaneTables {
  uint8_t expand[16][16];       // decoder: dword j <- loaded word #(mask bits below j) (bytes of a u32 lane)
  uint8_t compress_hi[16][8];   // encoder: low u16 of the masked lanes, ascending, in the top u16 slots
  NeonLaneTables() {
    for (int m = 0; m < 16; ++m) {
      int c = 0;
      for (int j = 0; j < 4; ++j) {
        const int k = (m >> j) & 1 ? c++ : 0;
        for (int b = 0; b < 4; ++b) expand[m][4 * j + b] = (uint8_t)(4 * k + b);
      }
      const int cnt = __builtin_popcount((unsigned)m);
      for (int b = 0; b < 8; ++b) compress_hi[m][b] = 0xFF;
      int slot = 4 - cnt;
      for (int j = 0; j < 4; ++j)
        if ((m >> j) & 1) {
          compress_hi[m][2 * slot] = (uint8_t)(4 * j);
          compress_hi[m][2 * slot + 1] = (uint8_t)(4 * j + 1);
          ++slot;
        }
    }
  }
};
const NeonLaneTables& lane_tables() {
  static const NeonLaneTables t;
  return t;
}

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
void split_neon(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) {
  uint32_t i = 0;
  if (dtype == kBF16) {
    for (; i + 16 <= n; i += 16) {
      const uint8x16x2_t v = vld2q_u8(src + 2 * i);  // val[0] low bytes, val[1] high bytes
      vst1q_u8(streams[0] + i, vorrq_u8(vshlq_n_u8(v.val[1], 1), vshrq_n_u8(v.val[0], 7)));
      vst1q_u8(streams[1] + i, vbslq_u8(vdupq_n_u8(0x80), v.val[1], v.val[0]));
    }
  } else if (dtype == kF16) {
    for (; i + 16 <= n; i += 16) {
      const uint8x16x2_t v = vld2q_u8(src + 2 * i);
      vst1q_u8(streams[0] + i, v.val[1]);
      vst1q_u8(streams[1] + i, v.val[0]);
    }
  } else {
    memcpy(streams[0], src, n);
    return;
  }
  uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
  split_fields(dtype, src + 2 * (size_t)i, n - i, tail);
}

inline void merge16(uint8_t dtype, const uint8_t* s0, const uint8_t* s1, uint8_t* dst) {
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

void merge_neon(uint8_t dtype, const uint8_t* const* streams, uint32_t n, uint8_t* dst) {
  if (dtype != kBF16 && dtype != kF16) {
    memcpy(dst, streams[0], n);
    return;
  }
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) merge16(dtype, streams[0] + i, streams[1] + i, dst + 2 * (size_t)i);
  const uint8_t* tail[kMaxStreams] = {streams[0] + i, streams[1] + i};
  merge_fields(dtype, tail, n - i, dst + 2 * (size_t)i);
}

// ------------------------------------------------------------ escapes --
int64_t escapes_neon(const KvCodecTables& c, int k, const uint8_t* s, uint32_t n, uint8_t* lit) {
  uint8x16x2_t bm;
  bm.val[0] = vld1q_u8(c.direct_bits[k]);
  bm.val[1] = vld1q_u8(c.direct_bits[k] + 16);
  static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bitv = vld1q_u8(bits);
  const bool has_escape = c.t.st[k].has_escape;
  size_t L = 0;
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8x16_t v = vld1q_u8(s + i);
    const uint8x16_t byte = vqtbl2q_u8(bm, vshrq_n_u8(v, 3));
    const uint8x16_t bit = vqtbl1q_u8(bitv, vandq_u8(v, vdupq_n_u8(7)));
    const uint8x16_t direct = vtstq_u8(byte, bit);
    if (vminvq_u8(direct) == 0xFF) continue;
    if (!has_escape) return -1;
    for (uint32_t m = byte_mask(vmvnq_u8(direct)); m; m &= m - 1) lit[L++] = s[i + __builtin_ctz(m)];
  }
  const int64_t t = kv_collect_escapes(c, k, s + i, n - i, lit + L);
  return t < 0 ? -1 : (int64_t)L + t;
}

int patch_neon(const KvCodecTables& c, int k, uint8_t* s, uint32_t n, const uint8_t* lit, size_t n_lit, size_t* lp) {
  const KvStreamTable& st = c.t.st[k];
  if (!st.has_escape) return kOk;
  const uint8x16_t e = vdupq_n_u8(st.escape);
  size_t j = *lp;
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8x16_t hit = vceqq_u8(vld1q_u8(s + i), e);
    if (vmaxvq_u8(hit) == 0) continue;
    for (uint32_t m = byte_mask(hit); m; m &= m - 1) {
      if (j >= n_lit) return kErrCorruptBlock;
      const uint8_t v = lit[j++];
      if (c.direct[k][v]) return kErrCorruptBlock;
      s[i + __builtin_ctz(m)] = v;
    }
  }
  *lp = j;
  return kv_patch_escapes(c, k, s + i, n - i, lit, n_lit, lp);
}

int finish_neon(const KvCodecTables& c, uint8_t* const* coded, const uint8_t* const* streams, uint32_t n,
                const uint8_t* lit, size_t n_lit, uint8_t* dst) {
  size_t lp = 0;
  for (int k = 0; k < c.t.n_streams; ++k) {
    if (!coded[k]) continue;
    const int st = patch_neon(c, k, coded[k], n, lit, n_lit, &lp);
    if (st != kOk) return st;
  }
  if (lp != n_lit) return kErrCorruptBlock;
  merge_neon(c.t.dtype, streams, n, dst);
  return kOk;
}

// ------------------------------------------------------------ rANS --
inline uint32x4_t gather4(const uint32_t* t, uint32x4_t idx) {
  uint32x4_t r = vdupq_n_u32(t[vgetq_lane_u32(idx, 0)]);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 1)], r, 1);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 2)], r, 2);
  return vsetq_lane_u32(t[vgetq_lane_u32(idx, 3)], r, 3);
}

// One encode step for 4 lanes. q = floor(x / f): x and f are exact in single
// precision up to one rounding of x, the quotient is correctly rounded, so
// the truncated estimate is within one of q; one correction each way.
inline void enc4(uint32x4_t& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, const NeonLaneTables& T) {
  uint32x4_t fs = vdupq_n_u32(fst[sp[0]]);
  fs = vsetq_lane_u32(fst[sp[1]], fs, 1);
  fs = vsetq_lane_u32(fst[sp[2]], fs, 2);
  fs = vsetq_lane_u32(fst[sp[3]], fs, 3);
  const uint32x4_t f = vandq_u32(fs, vdupq_n_u32(0x1FFF));
  const uint32x4_t st = vshrq_n_u32(fs, 13);
  const uint32x4_t emit = vcgeq_u32(vshrq_n_u32(x, 20), f);
  const uint32_t m = lane_mask(emit);
  const uint8x8_t w = vqtbl1_u8(vreinterpretq_u8_u32(x), vld1_u8(T.compress_hi[m]));
  vst1_u8((uint8_t*)(wp - 4), w);
  wp -= __builtin_popcount(m);
  x = vbslq_u32(emit, vshrq_n_u32(x, 16), x);
  const float32x4_t qf = vdivq_f32(vcvtq_f32_u32(x), vcvtq_f32_u32(f));
  uint32x4_t q = vcvtq_u32_f32(qf);
  int32x4_t rem = vreinterpretq_s32_u32(vsubq_u32(x, vmulq_u32(q, f)));
  const int32x4_t fi = vreinterpretq_s32_u32(f);
  const uint32x4_t lo = vcltq_s32(rem, vdupq_n_s32(0));
  q = vaddq_u32(q, lo);  // lo is all ones (-1) where the estimate was one too high
  rem = vaddq_s32(rem, vandq_s32(vreinterpretq_s32_u32(lo), fi));
  const uint32x4_t hi = vcgeq_s32(rem, fi);
  q = vsubq_u32(q, hi);
  rem = vsubq_s32(rem, vandq_s32(vreinterpretq_s32_u32(hi), fi));
  x = vaddq_u32(vaddq_u32(vshlq_n_u32(q, kProbBits), vreinterpretq_u32_s32(rem)), st);
}

size_t rans_encode_neon(const KvCodecTables& c, int k, const uint8_t* sym, uint32_t n, uint16_t* words, uint8_t* out,
                        size_t limit) {
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  const uint32_t full = n / kLanes;
  if (n % kLanes) {
    const uint32_t base = full * kLanes;
    for (uint32_t l = n - base; l-- > 0;) x[l] = rans_enc_put(x[l], c.enc[k][sym[base + l]], &wp);
  }
  uint32x4_t v[8];
  for (int g = 0; g < 8; ++g) v[g] = vld1q_u32(x + 4 * g);
  const NeonLaneTables& T = lane_tables();
  for (uint32_t s = full; s-- > 0;) {
    const uint8_t* sp = sym + (size_t)s * kLanes;
    for (int g = 8; g-- > 0;) enc4(v[g], sp + 4 * g, c.fs[k], wp, T);
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  for (int g = 0; g < 8; ++g) vst1q_u32(x + 4 * g, v[g]);
  for (int l = 0; l < kLanes; ++l) store_le32(out + 4 * l, x[l]);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
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

inline void dec4_words(uint32x4_t& x, uint32x4_t need, uint32_t m, const uint8_t* p, const NeonLaneTables& T) {
  const uint32x4_t w = vmovl_u16(vld1_u16((const uint16_t*)p));
  const uint32x4_t wx = vreinterpretq_u32_u8(vqtbl1q_u8(vreinterpretq_u8_u32(w), vld1q_u8(T.expand[m])));
  x = vbslq_u32(need, vorrq_u32(vshlq_n_u32(x, 16), wx), x);
}

int rans_decode_neon(const uint32_t* dec, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) {
  if (size < kRansStateBytes || ((size - kRansStateBytes) & 1u)) return kErrCorruptBlock;
  uint32x4_t v[8];
  for (int g = 0; g < 8; ++g) v[g] = vld1q_u32((const uint32_t*)(in + 16 * g));
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full = n / kLanes;
  const NeonLaneTables& T = lane_tables();
  uint32_t s = 0;
  for (; s < full && end - p >= 64; ++s) {  // eight 8-byte reads, each past the words before it
    uint32x4_t sy[8], need[8];
    uint32_t m[8];
    for (int g = 0; g < 8; ++g) sy[g] = dec4_state(v[g], dec, &need[g], &m[g]);
    for (int g = 0; g < 8; ++g) {
      dec4_words(v[g], need[g], m[g], p, T);
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

// ------------------------------------------------------------ fixed --
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

size_t fixed_codes_neon(const KvCodecTables& c, const uint8_t* s, uint32_t n, uint8_t* codes) {
  const uint8x16_t esc = vdupq_n_u8((uint8_t)fixed_escape_code(c.t.fixed_bits));
  size_t n_esc = 0;
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8x16_t code = codes16(c, vld1q_u8(s + i), esc);
    vst1q_u8(codes + i, code);
    n_esc += vaddvq_u8(vshrq_n_u8(vceqq_u8(code, esc), 7));
  }
  return n_esc + kv_fixed_codes(c, s + i, n - i, codes + i);
}

void fixed_planes_neon(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out,
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
  if (g * kGroup < n) {
    uint32_t plane[kMaxFixedBits];
    kv_fixed_planes(codes + g * kGroup, n - g * kGroup, bits, plane);
    for (uint32_t k = 0; k < bits; ++k) store_le32(out + 4 * ((size_t)g * bits + k), plane[k]);
    for (uint32_t i = g * kGroup; i < n; ++i)
      if (codes[i] == fixed_escape_code(bits)) *lit++ = s0[i];
  }
}

// Bits 0..15 of w as 16 bytes 0x00 / 0xFF.
inline uint8x16_t bits_to_bytes16(uint32_t w) {
  static const uint8_t rep[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(w)), vld1q_u8(rep));
  return vtstq_u8(v, vld1q_u8(sel));
}

int fixed_decode_neon(const KvCodecTables& c, const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit,
                      const uint8_t** streams, uint8_t* scratch, uint8_t* dst) {
  const uint32_t bits = c.t.fixed_bits, esc = fixed_escape_code(bits);
  const uint8_t dtype = c.t.dtype;
  const bool two = dtype == kBF16 || dtype == kF16;
  if (bits > 4) return KvScalarDecoder{&c}.fixed(planes, n, lit, n_lit, streams, scratch, dst);
  uint8_t syms[16] = {};
  for (uint32_t code = 0; code < esc; ++code) syms[code] = c.t.fixed_sym[code];
  const uint8x16_t lut = vld1q_u8(syms);
  {  // every literal must be a symbol without a code: checked for all of them at once
    const uint8x16_t escv = vdupq_n_u8((uint8_t)esc);
    size_t i = 0;
    for (; i + 16 <= n_lit; i += 16)
      if (vminvq_u8(vceqq_u8(codes16(c, vld1q_u8(lit + i), escv), escv)) != 0xFF) return kErrCorruptBlock;
    for (; i < n_lit; ++i)
      if (c.fixed_code[lit[i]] != esc) return kErrCorruptBlock;
  }
  uint8_t* const s0 = two ? scratch : dst;
  size_t j = 0;
  uint32_t g = 0;
  for (; (g + 1) * kGroup <= n; ++g) {
    const uint8_t* q = planes + 4 * (size_t)g * bits;
    uint8x16_t ca = vdupq_n_u8(0), cb = vdupq_n_u8(0);
    uint32_t all = ~0u;
    for (uint32_t b = 0; b < bits; ++b) {
      const uint32_t w = load_le32(q + 4 * b);
      all &= w;
      const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << b));
      ca = vorrq_u8(ca, vandq_u8(bits_to_bytes16(w), bit));
      cb = vorrq_u8(cb, vandq_u8(bits_to_bytes16(w >> 16), bit));
    }
    uint8_t* o = s0 + g * kGroup;
    vst1q_u8(o, vqtbl1q_u8(lut, ca));
    vst1q_u8(o + 16, vqtbl1q_u8(lut, cb));
    for (; all; all &= all - 1) o[__builtin_ctz(all)] = lit[j++];
    if (two) {
      merge16(dtype, o, streams[1] + g * kGroup, dst + 2 * (size_t)g * kGroup);
      merge16(dtype, o + 16, streams[1] + g * kGroup + 16, dst + 2 * (size_t)g * kGroup + 32);
    }
  }
  if (g * kGroup == n) return kOk;
  const int st = kv_fixed_decode_from(c, planes, n, g, lit, j, s0);
  if (st != kOk || !two) return st;
  const uint8_t* tail[kMaxStreams] = {s0 + g * kGroup, streams[1] + g * kGroup};
  merge_fields(dtype, tail, n - g * kGroup, dst + 2 * (size_t)g * kGroup);
  return kOk;
}

// ------------------------------------------------------------ kernel set --
struct NeonCoder {
  const KvCodecTables* c;
  void split(const uint8_t* src, uint32_t n, uint8_t* const* streams) const { split_neon(c->t.dtype, src, n, streams); }
  int64_t escapes(int k, const uint8_t* s, uint32_t n, uint8_t* lit) const { return escapes_neon(*c, k, s, n, lit); }
  size_t rans(int k, const uint8_t* s, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return rans_encode_neon(*c, k, s, n, words, out, limit);
  }
  size_t fixed_codes(const uint8_t* s, uint32_t n, uint8_t* codes) const { return fixed_codes_neon(*c, s, n, codes); }
  void fixed_planes(const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* out, uint8_t* lit) const {
    fixed_planes_neon(*c, codes, s0, n, out, lit);
  }
};

struct NeonDecoder {
  const KvCodecTables* c;
  int rans(int k, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) const {
    return rans_decode_neon(c->dec[k], in, size, n, out);
  }
  int finish(uint8_t* const* coded, const uint8_t* const* streams, uint32_t n, const uint8_t* lit, size_t n_lit,
             uint8_t* dst) const {
    return finish_neon(*c, coded, streams, n, lit, n_lit, dst);
  }
  int fixed(const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit, const uint8_t** streams, uint8_t* scratch,
            uint8_t* dst) const {
    return fixed_decode_neon(*c, planes, n, lit, n_lit, streams, scratch, dst);
  }
};

size_t encode_neon(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch, uint8_t* dst) {
  const size_t size = kv_encode_page_with(c, src, n, scratch, dst, NeonCoder{&c});
  kv_seal_page(c.t, dst, size, CpuPageSum{});
  return size;
}

int decode_neon(const KvCodecTables& c, const uint8_t* page, size_t size, uint8_t* dst, uint8_t* scratch) {
  return kv_decode_page_with(c, page, size, dst, scratch, CpuPageSum{}, NeonDecoder{&c});
}

const PageKernels kNeon = {encode_neon, decode_neon};

}  // namespace

const PageKernels* neon_kernels() { return &kNeon; }

}  // namespace tz::kv

#else
namespace tz::kv {
const PageKernels* neon_kernels() { return nullptr; }
}  // namespace tz::kv
#endif
