// NEON (AArch64 Advanced SIMD) kernels of the CPU backend (SimdPath::kNeon,
// kernels.h). Each produces exactly the bytes (or the status) of its portable
// counterpart; tests/cpu/test_simd*.cpp compare them (CI runs them under
// qemu-aarch64: scripts/test-aarch64.sh).
//
// A rANS step of 32 lanes is eight vectors of 4 lanes. NEON has no gather:
// table entries are loaded lane by lane. The words a decoder lane takes (an
// encoder lane emits) are placed with a byte table lookup (TBL) chosen by the
// 4-bit lane mask.
#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_common.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <array>

namespace tz::cpu {

namespace {

constexpr int kVec = 4;                   // lanes per vector
constexpr int kVecs = kLanes / kVec;      // vectors per step

// Decoder: for lane mask m (bit i: lane i takes a word), kTake[m] moves word
// j (bytes 2j, 2j+1 of 8 loaded bytes) into 32-bit lane i, j = the number of
// lanes below i that take one; other bytes 0 (index 255 is out of range).
constexpr std::array<std::array<uint8_t, 16>, 16> make_take() {
  std::array<std::array<uint8_t, 16>, 16> t{};
  for (int m = 0; m < 16; ++m) {
    int c = 0;
    for (int i = 0; i < kVec; ++i) {
      t[m][4 * i] = (uint8_t)(2 * c);
      t[m][4 * i + 1] = (uint8_t)(2 * c + 1);
      t[m][4 * i + 2] = 255;
      t[m][4 * i + 3] = 255;
      c += (m >> i) & 1;
    }
  }
  return t;
}
alignas(16) constexpr std::array<std::array<uint8_t, 16>, 16> kTake = make_take();

// Encoder: for lane mask m (bit i: lane i emits), kEmit[m] puts the emitting
// lanes' 16-bit words (from 4 packed words), in ascending lane order, at the
// top of 8 bytes (zero below).
constexpr std::array<std::array<uint8_t, 8>, 16> make_emit() {
  std::array<std::array<uint8_t, 8>, 16> t{};
  for (int m = 0; m < 16; ++m) {
    int cnt = 0;
    for (int i = 0; i < kVec; ++i) cnt += (m >> i) & 1;
    for (int j = 0; j < 8; ++j) t[m][j] = 255;
    int slot = kVec - cnt;
    for (int i = 0; i < kVec; ++i)
      if ((m >> i) & 1) {
        t[m][2 * slot] = (uint8_t)(2 * i);
        t[m][2 * slot + 1] = (uint8_t)(2 * i + 1);
        ++slot;
      }
  }
  return t;
}
alignas(16) constexpr std::array<std::array<uint8_t, 8>, 16> kEmit = make_emit();

inline unsigned lane_mask(uint32x4_t m) {
  static const uint32_t bits[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(m, vld1q_u32(bits)));
}

inline uint32x4_t gather4(const uint32_t* t, uint32x4_t idx) {
  uint32x4_t r = vdupq_n_u32(t[vgetq_lane_u32(idx, 0)]);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 1)], r, 1);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 2)], r, 2);
  r = vsetq_lane_u32(t[vgetq_lane_u32(idx, 3)], r, 3);
  return r;
}

// ------------------------------------------------------------- decoder --

// One decode step for 4 lanes: returns the 4 symbols and advances p past
// the words taken (reads 8 bytes at p). With contexts, coff is each lane's
// table offset (context x kProbScale), advanced to the next symbol's.
template <bool Ctx>
inline uint32x4_t dec4(uint32x4_t& x, const uint32_t* dec, const uint8_t*& p, uint32x4_t& coff, const RansCtx& ctx) {
  uint32x4_t idx = vandq_u32(x, vdupq_n_u32(kProbScale - 1));
  if (Ctx) idx = vaddq_u32(idx, coff);
  const uint32x4_t e = gather4(dec, idx);
  const uint32x4_t f = vaddq_u32(vandq_u32(vshrq_n_u32(e, 8), vdupq_n_u32(0xFFF)), vdupq_n_u32(1));
  x = vmlaq_u32(vshrq_n_u32(e, 20), f, vshrq_n_u32(x, kProbBits));
  const uint32x4_t take = vcltq_u32(x, vdupq_n_u32(kRansL));
  const unsigned m = lane_mask(take);
  const uint8x16_t words = vcombine_u8(vld1_u8(p), vdup_n_u8(0));
  const uint32x4_t w = vreinterpretq_u32_u8(vqtbl1q_u8(words, vld1q_u8(kTake[m].data())));
  x = vbslq_u32(take, vorrq_u32(vshlq_n_u32(x, 16), w), x);
  p += 2 * (size_t)__builtin_popcount(m);
  const uint32x4_t sym = vandq_u32(e, vdupq_n_u32(0xFF));
  if (Ctx) {
    const int32x4_t d = vsubq_s32(vreinterpretq_s32_u32(sym), vdupq_n_s32((int32_t)ctx.base));
    const int32x4_t c = vminq_s32(vmaxq_s32(d, vdupq_n_s32(0)), vdupq_n_s32((int32_t)ctx.n - 1));
    coff = vshlq_n_u32(vreinterpretq_u32_s32(c), kProbBits);
  }
  return sym;
}

// 8 symbols (two vectors in lane order) as bytes / as 16-bit values.
inline uint16x8_t narrow16(uint32x4_t a, uint32x4_t b) { return vcombine_u16(vmovn_u32(a), vmovn_u32(b)); }

struct EmitBytes {
  uint8_t* out;
  void step(uint32_t base, const uint32x4_t* s) const {
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t v = vcombine_u8(vmovn_u16(narrow16(s[4 * h], s[4 * h + 1])),
                                       vmovn_u16(narrow16(s[4 * h + 2], s[4 * h + 3])));
      vst1q_u8(out + base + 16 * h, v);
    }
  }
  void operator()(uint32_t i, uint32_t sym) const { out[i] = (uint8_t)sym; }
};

// merge_elem_bf16 of 8 exponents e and raw sign|mantissa bytes m (u16).
inline uint16x8_t merge_bf16(uint16x8_t e, uint16x8_t m) {
  return vorrq_u16(vorrq_u16(vshlq_n_u16(vandq_u16(m, vdupq_n_u16(0x80)), 8), vshlq_n_u16(e, 7)),
                   vandq_u16(m, vdupq_n_u16(0x7F)));
}

struct EmitBF16 {
  uint8_t* out;
  const uint8_t* mant;
  void step(uint32_t base, const uint32x4_t* s) const {
    for (int h = 0; h < 4; ++h) {
      const uint16x8_t v = merge_bf16(narrow16(s[2 * h], s[2 * h + 1]), vmovl_u8(vld1_u8(mant + base + 8 * h)));
      vst1q_u8(out + 2 * ((size_t)base + 8 * h), vreinterpretq_u8_u16(v));
    }
  }
  void operator()(uint32_t i, uint32_t sym) const {
    store_le16(out + 2 * (size_t)i, merge_elem_bf16((uint8_t)sym, mant[i]));
  }
};

// FP16 = top byte << 8 | low byte (stream 1, raw).
struct EmitF16 : MergedTailF16 {
  void step(uint32_t base, const uint32x4_t* s) const {
    for (int h = 0; h < 4; ++h) {
      const uint16x8_t hi = narrow16(s[2 * h], s[2 * h + 1]);
      const uint16x8_t lo = vmovl_u8(vld1_u8(low + base + 8 * h));
      vst1q_u8(out + 2 * ((size_t)base + 8 * h), vreinterpretq_u8_u16(vorrq_u16(vshlq_n_u16(hi, 8), lo)));
    }
  }
  using MergedTailF16::operator();
};

// FP32 = the BF16 merge of (exponent, s1) << 16 | s2 << 8 | s3.
struct EmitF32 : MergedTailF32 {
  void step(uint32_t base, const uint32x4_t* s) const {
    for (int h = 0; h < 4; ++h) {
      const size_t i = (size_t)base + 8 * h;
      const uint16x8_t top = merge_bf16(narrow16(s[2 * h], s[2 * h + 1]), vmovl_u8(vld1_u8(s1 + i)));
      const uint16x8_t low = vorrq_u16(vmovl_u8(vld1_u8(s3 + i)), vshlq_n_u16(vmovl_u8(vld1_u8(s2 + i)), 8));
      vst1q_u8(out + 4 * i, vreinterpretq_u8_u16(vzip1q_u16(low, top)));
      vst1q_u8(out + 4 * i + 16, vreinterpretq_u8_u16(vzip2q_u16(low, top)));
    }
  }
  using MergedTailF32::operator();
};

template <class Emit, bool Ctx>
struct StreamDec {
  uint32x4_t x[kVecs];
  uint32x4_t c[kVecs];  // lane table offsets (Ctx only)
  const uint8_t* p;
  const uint8_t* end;
  const uint32_t* dec;
  uint32_t n, s, full_steps;
  RansCtx ctx;
  Emit emit;

  int init(const uint8_t* in, size_t size, uint32_t n_, const uint32_t* dec_, const RansCtx& ctx_) {
    if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
    for (int v = 0; v < kVecs; ++v) {
      x[v] = vreinterpretq_u32_u8(vld1q_u8(in + 16 * v));
      c[v] = vdupq_n_u32(0);
    }
    ctx = ctx_;
    p = in + kRansStateBytes;
    end = in + size;
    dec = dec_;
    n = n_;
    s = 0;
    full_steps = n / kLanes;
    return kOk;
  }
  // A step takes at most 64 bytes, each vector reading 8 at its position.
  bool fast() const { return s < full_steps && end - p >= 64; }
  void step() {
    uint32x4_t sym[kVecs];
    for (int v = 0; v < kVecs; ++v) sym[v] = dec4<Ctx>(x[v], dec, p, c[v], ctx);
    emit.step(s * kLanes, sym);
    ++s;
  }
  int finish() {
    while (fast()) step();
    uint32_t xs[kLanes];
    for (int v = 0; v < kVecs; ++v) vst1q_u32(xs + kVec * v, x[v]);
    if (!Ctx) return rans_decode_tail(xs, p, end, s, n, dec, emit, rans_ctx_seeds_only(ctx));
    uint32_t cx[kLanes];
    for (int v = 0; v < kVecs; ++v) vst1q_u32(cx + kVec * v, vshrq_n_u32(c[v], kProbBits));
    return rans_decode_tail(xs, p, end, s, n, dec, emit, ctx, cx);
  }
};

template <bool Ctx, class Emit>
int decode_one_t(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                 const Emit& emit) {
  StreamDec<Emit, Ctx> d{};
  d.emit = emit;
  const int st = d.init(in, size, n, dec, ctx);
  return st != kOk ? st : d.finish();
}

template <class Emit>
int decode_one(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx, const Emit& emit) {
  return ctx.n > 1 ? decode_one_t<true>(in, size, n, dec, ctx, emit) : decode_one_t<false>(in, size, n, dec, ctx, emit);
}

int decode_neon(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx, uint8_t* out) {
  return decode_one(in, size, n, dec, ctx, EmitBytes{out});
}

int decode_merged_neon(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                       const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out) {
  switch (dtype) {
    case kF16: return decode_one(in, size, n, dec, ctx, EmitF16{{out, raw[0]}});
    case kF32: return decode_one(in, size, n, dec, ctx, EmitF32{{out, raw[0], raw[1], raw[2]}});
    default: return decode_one(in, size, n, dec, ctx, EmitBF16{out, raw[0]});
  }
}

// Two streams one after the other: with eight 4-lane vectors per step a
// single stream already gives the core eight independent chains (no ARM
// machine was at hand to measure whether lockstep pays).
void decode2_neon(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  *st_a = decode_neon(a.in, a.size, a.n, a.dec, a.ctx, a.out);
  *st_b = decode_neon(b.in, b.size, b.n, b.dec, b.ctx, b.out);
}

void decode2_merged_neon(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                         const RansStream& b, const uint8_t* const* raw_b, int* st_b) {
  *st_a = decode_merged_neon(dtype, a.in, a.size, a.n, a.dec, a.ctx, raw_a, a.out);
  *st_b = decode_merged_neon(dtype, b.in, b.size, b.n, b.dec, b.ctx, raw_b, b.out);
}

// ------------------------------------------------------------- encoder --

// One encode step for 4 lanes (symbols sp[0..3]); the emitting lanes' words
// go below wp in ascending lane order. Stores 8 bytes at wp - 4 (the caller
// guarantees 4 symbols remain, so wp - 4 is inside the word buffer).
//
// q = floor(x / f): x < f * 2^20 after renormalisation, so x / f < 2^20;
// x converts to float correctly rounded and the division rounds once, so
// the float quotient is within 2^20 * 2^-23 = 1/8 of x / f and its
// truncation is q - 1, q or q + 1; one signed correction of the remainder in
// each direction makes it exact (the scalar encoder's result).
template <bool Ctx>
inline void enc4(uint32x4_t& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, const RansCtx& ctx) {
  uint32_t fs_l[kVec];
  for (int i = 0; i < kVec; ++i) {
    const uint32_t c = Ctx ? rans_ctx_of(sp[i - kLanes], ctx) : 0u;
    fs_l[i] = fst[256 * c + sp[i]];
  }
  const uint32x4_t fs = vld1q_u32(fs_l);
  const uint32x4_t f = vandq_u32(fs, vdupq_n_u32(0x1FFF));
  const uint32x4_t st = vshrq_n_u32(fs, 13);
  const uint32x4_t emit = vcgeq_u32(vshrq_n_u32(x, 20), f);
  const unsigned m = lane_mask(emit);
  const uint8x16_t lo = vcombine_u8(vreinterpret_u8_u16(vmovn_u32(x)), vdup_n_u8(0));
  vst1_u8((uint8_t*)(wp - kVec), vqtbl1_u8(lo, vld1_u8(kEmit[m].data())));
  wp -= __builtin_popcount(m);
  x = vbslq_u32(emit, vshrq_n_u32(x, 16), x);
  const float32x4_t q_f = vdivq_f32(vcvtq_f32_u32(x), vcvtq_f32_u32(f));
  uint32x4_t q = vcvtq_u32_f32(q_f);
  int32x4_t rem = vreinterpretq_s32_u32(vsubq_u32(x, vmulq_u32(q, f)));
  const int32x4_t fi = vreinterpretq_s32_u32(f);
  const uint32x4_t neg = vcltq_s32(rem, vdupq_n_s32(0));  // q one too large
  q = vaddq_u32(q, neg);
  rem = vaddq_s32(rem, vandq_s32(vreinterpretq_s32_u32(neg), fi));
  const uint32x4_t over = vcgeq_s32(rem, fi);  // q one too small
  q = vsubq_u32(q, over);
  rem = vsubq_s32(rem, vandq_s32(vreinterpretq_s32_u32(over), fi));
  x = vaddq_u32(vaddq_u32(vshlq_n_u32(q, kProbBits), vreinterpretq_u32_s32(rem)), st);
}

size_t encode_neon(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx, uint16_t* words,
                   uint8_t* out, size_t limit) {
  const uint32_t* fst = t.freq_start;
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  uint32_t xs[kLanes];
  for (int l = 0; l < kLanes; ++l) xs[l] = rans_lane_start(ctx, l);
  const uint32_t full_steps = n / kLanes;
  const bool use_ctx = ctx.n > 1;
  if (n % kLanes) {  // the partial last step first (steps run backwards), scalar
    const uint32_t base = full_steps * kLanes;
    for (uint32_t l = n - base; l-- > 0;) {
      const uint8_t s = sym[base + l];
      const uint32_t c = use_ctx && full_steps > 0 ? rans_ctx_of(sym[base - kLanes + l], ctx) : 0;
      xs[l] = rans_enc_put(xs[l], t.sym[256 * c + s], &wp);
    }
  }
  uint32x4_t x[kVecs];
  for (int v = 0; v < kVecs; ++v) x[v] = vld1q_u32(xs + kVec * v);
  uint32_t s = full_steps;
  if (use_ctx)
    for (; s > 1;) {
      --s;
      const uint8_t* sp = sym + (size_t)s * kLanes;
      for (int v = kVecs; v-- > 0;) enc4<true>(x[v], sp + kVec * v, fst, wp, ctx);
    }
  while (s-- > 0) {  // without contexts every step; with them step 0 (table 0)
    const uint8_t* sp = sym + (size_t)s * kLanes;
    for (int v = kVecs; v-- > 0;) enc4<false>(x[v], sp + kVec * v, fst, wp, ctx);
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  for (int v = 0; v < kVecs; ++v) vst1q_u8(out + 16 * v, vreinterpretq_u8_u32(x[v]));
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}

// Field loops (split, merge, min/max, histogram): AArch64's baseline has
// NEON, so plain loops vectorise without a target attribute.
namespace loops {
#define TZ_LOOP_TARGET
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

}  // namespace

const CodecKernels kNeonKernels = {
    SimdPath::kNeon,   encode_neon,      decode_neon,   decode_merged_neon, decode2_neon,
    decode2_merged_neon, loops::histogram, loops::minmax, loops::split,     loops::merge,
    false,
};

}  // namespace tz::cpu

#endif  // __aarch64__
