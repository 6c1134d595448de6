// AVX2 (+BMI2, FMA) kernels of the CPU backend (SimdPath::kAvx2, kernels.h),
// for x86-64 CPUs without AVX-512. Each produces exactly the bytes (or the
// status) of its portable counterpart; tests/cpu/test_simd*.cpp compare them.
//
// A rANS step of 32 lanes is four vectors of 8 lanes. What AVX-512 does with
// mask registers (expand the words a decoder lane takes, compress the words
// an encoder lane emits) is done here with a shuffle looked up by the 8-bit
// lane mask.
#include "codec/fields.h"
#include "codec/policy.h"
#include "codec/policy_lane_ctx.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_avx2_rans.h"
#include "cpu/simd_common.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <array>
#include <cstring>
#include <type_traits>
#define TZ_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,popcnt")))

namespace tz::cpu {

namespace {

// Decoder word placement: kTakeIndex (cpu/simd_common.h).

// Encoder word placement: kEmitShuffle (cpu/simd_common.h).

// ------------------------------------------------------------- decoder --

// The symbols of 8 table entries (bits 0..7), shifted left by Sh, in 32-bit
// lanes with the other bits clear: two shifts, no constant.
template <int Sh>
TZ_AVX2 inline __m256i entry_sym(__m256i e) {
  return _mm256_srli_epi32(_mm256_slli_epi32(e, 24), 24 - Sh);
}

// The 32 symbols of a step (four vectors of 8 entries in lane order) as 32
// bytes.
TZ_AVX2 inline __m256i pack_step_bytes(__m256i e0, __m256i e1, __m256i e2, __m256i e3) {
  const __m256i a = _mm256_packus_epi32(entry_sym<0>(e0), entry_sym<0>(e1));  // s0[0..3] s1[0..3] | s0[4..7] s1[4..7]
  const __m256i b = _mm256_packus_epi32(entry_sym<0>(e2), entry_sym<0>(e3));
  const __m256i c = _mm256_packus_epi16(a, b);  // dwords: s0a s1a s2a s3a | s0b s1b s2b s3b
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 16 symbols (two vectors of entries in lane order) as 16-bit values
// symbol << Sh, in order (Sh = 7: a BF16 exponent in place; 8: an FP16 top
// byte in place).
template <int Sh>
TZ_AVX2 inline __m256i pack_symbols16(__m256i e0, __m256i e1) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(entry_sym<Sh>(e0), entry_sym<Sh>(e1)), 0xD8);
}

// Emitters (structs, not lambdas: GCC does not give a lambda its enclosing
// function's target attribute). step() stores the 32 symbols of a step from
// its four vectors of table entries; operator()(i, sym) one symbol (the
// checked scalar tail).
struct EmitBytes {
  uint8_t* out;
  TZ_AVX2 void step(uint32_t base, __m256i e0, __m256i e1, __m256i e2, __m256i e3) const {
    _mm256_storeu_si256((__m256i*)(out + base), pack_step_bytes(e0, e1, e2, e3));
  }
  void operator()(uint32_t i, uint32_t sym) const { out[i] = (uint8_t)sym; }
};

struct EmitBF16 {
  uint8_t* out;
  const uint8_t* mant;
  // BF16 = sign << 15 | exponent << 7 | mantissa, from the raw byte
  // sign << 7 | mantissa: (b | b << 8) & 0x807F keeps the sign at bit 15
  // and the mantissa at bits 0..6, and the exponent fills bits 7..14.
  TZ_AVX2 static __m256i merge16(__m256i e7, const uint8_t* m) {
    const __m256i mv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)m));
    return _mm256_or_si256(
        _mm256_and_si256(_mm256_or_si256(mv, _mm256_slli_epi16(mv, 8)), _mm256_set1_epi16((short)0x807F)), e7);
  }
  TZ_AVX2 void step(uint32_t base, __m256i e0, __m256i e1, __m256i e2, __m256i e3) const {
    _mm256_storeu_si256((__m256i*)(out + 2 * (size_t)base), merge16(pack_symbols16<7>(e0, e1), mant + base));
    _mm256_storeu_si256((__m256i*)(out + 2 * (size_t)base + 32),
                        merge16(pack_symbols16<7>(e2, e3), mant + base + 16));
  }
  void operator()(uint32_t i, uint32_t sym) const {
    store_le16(out + 2 * (size_t)i, merge_elem_bf16((uint8_t)sym, mant[i]));
  }
};

// FP16 = top byte << 8 | low byte (stream 1, raw).
struct EmitF16 : MergedTailF16 {
  TZ_AVX2 static __m256i merge16(__m256i hi8, const uint8_t* l) {
    return _mm256_or_si256(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)l)), hi8);
  }
  TZ_AVX2 void step(uint32_t base, __m256i e0, __m256i e1, __m256i e2, __m256i e3) const {
    _mm256_storeu_si256((__m256i*)(out + 2 * (size_t)base), merge16(pack_symbols16<8>(e0, e1), low + base));
    _mm256_storeu_si256((__m256i*)(out + 2 * (size_t)base + 32), merge16(pack_symbols16<8>(e2, e3), low + base + 16));
  }
  using MergedTailF16::operator();
};

// FP32 = merge_elem_bf16(exponent, s1) << 16 | s2 << 8 | s3: the top half
// as the BF16 merge, the bottom from the two low-mantissa streams.
struct EmitF32 : MergedTailF32 {
  TZ_AVX2 void vec8(size_t i, __m256i e) const {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(s1 + i)));
    const __m256i top = _mm256_or_si256(
        _mm256_and_si256(_mm256_or_si256(b, _mm256_slli_epi32(b, 8)), _mm256_set1_epi32(0x807F)), entry_sym<7>(e));
    const __m256i low = _mm256_cvtepu16_epi32(
        _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)(s3 + i)), _mm_loadl_epi64((const __m128i*)(s2 + i))));
    _mm256_storeu_si256((__m256i*)(out + 4 * i), _mm256_or_si256(_mm256_slli_epi32(top, 16), low));
  }
  TZ_AVX2 void step(uint32_t base, __m256i e0, __m256i e1, __m256i e2, __m256i e3) const {
    vec8(base, e0);
    vec8((size_t)base + 8, e1);
    vec8((size_t)base + 16, e2);
    vec8((size_t)base + 24, e3);
  }
  using MergedTailF32::operator();
};

// Decoder of one stream: four vectors of 8 lane states, the vector step,
// then the checked scalar tail.
template <class Emit, bool Ctx, class Fetch>
struct StreamDec {
  __m256i x[4];
  __m256i c[4];  // lane table offsets (Ctx only)
  __m256i cbase, cmax;
  const uint8_t* p;
  const uint8_t* end;
  const uint32_t* dec;
  uint32_t n, s, full_steps;
  RansCtx ctx;
  Emit emit;

  TZ_AVX2 int init(const uint8_t* in, size_t size, uint32_t n_, const uint32_t* dec_, const RansCtx& ctx_) {
    if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
    for (int v = 0; v < 4; ++v) {
      x[v] = _mm256_loadu_si256((const __m256i*)(in + 32 * v));
      c[v] = _mm256_setzero_si256();
    }
    ctx = ctx_;
    cbase = _mm256_set1_epi32((int)ctx.base);
    cmax = _mm256_set1_epi32((int)ctx.n - 1);
    p = in + kRansStateBytes;
    end = in + size;
    dec = dec_;
    n = n_;
    s = 0;
    full_steps = n / kLanes;
    return kOk;
  }
  // A step reads at most 16 bytes per vector past at most 48 taken: 64 left
  // covers it.
  TZ_AVX2 bool fast() const { return s < full_steps && end - p >= 64; }
  TZ_AVX2 void step(const DecConsts& k) {
    __m256i e[4];
    dec_step32<Ctx, Fetch>(x, c, dec, p, cbase, cmax, k, e);
    emit.step(s * kLanes, e[0], e[1], e[2], e[3]);
    ++s;
  }
  // Scalar tail: the same code (and checks) as tz::rans_decode_ctx.
  TZ_AVX2 int finish() {
    const DecConsts k = DecConsts::make();
    while (fast()) step(k);
    alignas(32) uint32_t xs[kLanes];
    for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)(xs + 8 * v), x[v]);
    if (!Ctx) return rans_decode_tail(xs, p, end, s, n, dec, emit, rans_ctx_seeds_only(ctx));
    alignas(32) uint32_t cx[kLanes];
    for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)(cx + 8 * v), _mm256_srli_epi32(c[v], kProbBits));
    return rans_decode_tail(xs, p, end, s, n, dec, emit, ctx, cx);
  }
};

template <bool Ctx, class Fetch, class Emit>
TZ_AVX2 int decode_one_t(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                         const Emit& emit) {
  StreamDec<Emit, Ctx, Fetch> d{};
  d.emit = emit;
  const int st = d.init(in, size, n, dec, ctx);
  return st != kOk ? st : d.finish();
}

template <class Fetch, class Emit>
TZ_AVX2 int decode_one(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                       const Emit& emit) {
  return ctx.n > 1 ? decode_one_t<true, Fetch>(in, size, n, dec, ctx, emit)
                   : decode_one_t<false, Fetch>(in, size, n, dec, ctx, emit);
}

template <class Fetch>
TZ_AVX2 int decode_avx2_t(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                          uint8_t* out) {
  return decode_one<Fetch>(in, size, n, dec, ctx, EmitBytes{out});
}

// Two streams one after the other: stepping two in lockstep (eight state
// vectors) spills registers and measured slower on real BF16 exponents (AMD
// EPYC Zen 4, CPU time: 2.16 against 1.77 cycles per symbol for bytes, 2.06
// against 1.94 for the BF16 form; again with the two-constant step above:
// 2.50 against 1.65 and 2.34 against 1.79), so the lockstep form does not
// pay here.
template <class Fetch>
TZ_AVX2 void decode2_avx2_t(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  *st_a = decode_avx2_t<Fetch>(a.in, a.size, a.n, a.dec, a.ctx, a.out);
  *st_b = decode_avx2_t<Fetch>(b.in, b.size, b.n, b.dec, b.ctx, b.out);
}

// Merged in the step (EmitBF16, EmitF16, EmitF32): measured faster than decoding the
// bytes, then merging (BF16: 1.94 against 2.2 cycles per element on real
// BF16 weights, before the two-constant step).
template <class Fetch>
TZ_AVX2 int decode_merged_avx2_t(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                                 const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out) {
  switch (dtype) {
    case kF16: return decode_one<Fetch>(in, size, n, dec, ctx, EmitF16{{out, raw[0]}});
    case kF32: return decode_one<Fetch>(in, size, n, dec, ctx, EmitF32{{out, raw[0], raw[1], raw[2]}});
    default: return decode_one<Fetch>(in, size, n, dec, ctx, EmitBF16{out, raw[0]});
  }
}

template <class Fetch>
TZ_AVX2 void decode2_merged_avx2_t(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                                   const RansStream& b, const uint8_t* const* raw_b, int* st_b) {
  *st_a = decode_merged_avx2_t<Fetch>(dtype, a.in, a.size, a.n, a.dec, a.ctx, raw_a, a.out);
  *st_b = decode_merged_avx2_t<Fetch>(dtype, b.in, b.size, b.n, b.dec, b.ctx, raw_b, b.out);
}

}  // namespace

// The merged decoders are not in the anonymous namespace: the AVX-512 table
// uses them too (kernels.h).
TZ_AVX2 int decode_merged_avx2(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                               const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out) {
  return decode_merged_avx2_t<GatherFetch>(dtype, in, size, n, dec, ctx, raw, out);
}

TZ_AVX2 void decode2_merged_avx2(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                                 const RansStream& b, const uint8_t* const* raw_b, int* st_b) {
  decode2_merged_avx2_t<GatherFetch>(dtype, a, raw_a, st_a, b, raw_b, st_b);
}

namespace {

// ------------------------------------------------------------- encoder --

// q = floor(x / f) and rem = x - q f for x < f * 2^20, f in [1, 4096],
// without a division. The Newton step's constant is 2 + 2^-21
// instead of 2: it moves the refined reciprocal above 1 / f by more than
// the Newton error (at most (1.5 * 2^-12)^2, always from below) and the
// four roundings (2^-24 each) together, so the float quotient is never
// below x / f, and by less than 2^-21 + 4 * 2^-24 of it, i.e. under 0.75
// above it for quotients below 2^20: its truncation is q or q + 1, and one
// correction (q + 1 when the remainder comes out negative) makes it exact.
// The bound rests only on rcp_ps's documented error, not on one CPU's
// table; enc_quotient_misses_avx2 checks it for every state. x is
// converted exactly rounded (high and low halves, one fused multiply-add).
TZ_AVX2 inline __m256i enc_quotient8(__m256i x, __m256i f, __m256i* rem_out) {
  const __m256 ff = _mm256_cvtepi32_ps(f);
  __m256 r = _mm256_rcp_ps(ff);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(ff, r, _mm256_set1_ps(kEncNewtonTwo)));
  const __m256 xf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 16)), _mm256_set1_ps(65536.0f),
                                    _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF))));
  const __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(xf, r));
  const __m256i rem = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f));
  // All ones where q is one too large: a compare, not an arithmetic shift
  // (the step's many shifts share two ports on Intel; srai measured 2.62 ->
  // 3.13 cycles per symbol on the gather path, tz_kernel_bench enc_wide).
  const __m256i neg = _mm256_cmpgt_epi32(_mm256_setzero_si256(), rem);
  *rem_out = _mm256_add_epi32(rem, _mm256_and_si256(neg, f));
  return _mm256_add_epi32(q, neg);
}

// One encode step for 8 lanes (symbols sp[0..7]); the words of the lanes
// that emit go below wp in ascending lane order, as the scalar encoder's
// descending pushes leave them. Stores 16 bytes at wp - 8: the caller
// guarantees wp - 8 >= the start of the word buffer (8 symbols remain).
//
// q = floor(x / f) without a division (enc_quotient8; after
// renormalisation x < f * 2^20): the result is identical to the scalar
// encoder's.
//
// With lane contexts (Ctx), table = the context of the lane's previous
// symbol sp[l - 32] (tables of 256 entries each, concatenated in fst).
//
// The 8 freq | start entries are loaded one by one (ScalarFetch: from the
// symbol bytes themselves, or from the context-offset indices), on every
// CPU: against a gather, and against a 16-symbol window of entries taken by
// permutes where a table allows (the form kept in the AVX-512 step),
// tz_kernel_bench cycles per symbol, encode (BF16 exponents) / enc_wide
// (near-8-bit bytes): AMD EPYC family 23 model 49 (Zen 2) 1.84 / 1.89
// against 2.14 / 3.43; Intel Xeon family 6 model 167 1.33 / 1.37 against
// 1.38 / 1.54 (window and gather), 1.39 / 1.37 (window, then scalar loads).
template <bool Ctx>
TZ_AVX2 inline void enc8(__m256i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, __m256i cbase,
                         __m256i cmax) {
  __m256i sy = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sp));
  __m256i fs;
  if (Ctx) {
    const __m256i pv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sp - kLanes)));
    const __m256i c = _mm256_min_epu8(_mm256_subs_epu8(pv, cbase), cmax);  // as in dec8_state
    fs = ScalarFetch::get(fst, _mm256_add_epi32(sy, _mm256_slli_epi32(c, 8)));
  } else {
    fs = ScalarFetch::bytes(fst, sp, sy);
  }
  const __m256i f = _mm256_and_si256(fs, _mm256_set1_epi32(0x1FFF));
  const __m256i st = _mm256_srli_epi32(fs, 13);
  // Emit where x >= f << 20, i.e. (x >> 20) >= f (both below 2^13).
  const __m256i keep = _mm256_cmpgt_epi32(f, _mm256_srli_epi32(x, 20));
  const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(keep)) ^ 0xFFu;
  // Low halves of the 8 states packed into 16 bytes, then the emitting ones
  // moved to the top.
  const __m256i lo16 = _mm256_shuffle_epi8(
      x, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1,
                          -1, -1, -1, -1, -1, -1));
  const __m128i packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(lo16, 0x08));
  const __m128i wv = _mm_shuffle_epi8(packed, _mm_load_si128((const __m128i*)kEmitShuffle[m].data()));
  _mm_storeu_si128((__m128i*)(wp - 8), wv);
  wp -= _mm_popcnt_u32(m);
  x = _mm256_blendv_epi8(_mm256_srli_epi32(x, 16), x, keep);
  // q = floor(x / f), exact (see above).
  __m256i rem;
  const __m256i q = enc_quotient8(x, f, &rem);
  x = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, kProbBits), rem), st);
}

}  // namespace

namespace {

// The encoder's driver (simd_encode_driver.inc) over enc8 (no window).
struct Avx2EncStep {
  static constexpr bool kWindow = false;
  template <bool Ctx, bool Win>
  TZ_AVX2 static void step(__m256i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, __m256i cbase,
                           __m256i cmax, const void*) {
    static_assert(!Win, "the AVX2 step has no window");
    enc8<Ctx>(x, sp, fst, wp, cbase, cmax);
  }
  TZ_AVX2 static __m256i next_state(__m256i x, __m256i f) {
    __m256i rem;
    const __m256i q = enc_quotient8(x, f, &rem);
    return _mm256_add_epi32(_mm256_slli_epi32(q, kProbBits), rem);
  }
};

#define TZ_ENC_TARGET TZ_AVX2
#include "cpu/simd_encode_driver.inc"
#undef TZ_ENC_TARGET

}  // namespace

namespace {
TZ_AVX2 size_t encode_avx2(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx, uint16_t* words,
                           uint8_t* out, size_t limit) {
  return encode_driver<Avx2EncStep>(sym, n, t, ctx, words, out, limit);
}

}  // namespace

TZ_AVX2 uint64_t enc_quotient_misses_avx2(uint32_t f_first, uint32_t f_last) {
  return quotient_misses<Avx2EncStep>(f_first, f_last);
}

namespace {

// Field loops (split, merge, min/max, histogram) compiled for AVX2.
namespace loops {
#define TZ_LOOP_TARGET TZ_AVX2
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

}  // namespace

// The AVX2 table with each decoder's table lookups taken as Fetch takes
// them: gathers (kAvx2Kernels) or scalar loads (kAvx2ScalarFetchKernels, AMD
// Zen 1/2). The encoder is the same in both (enc8: scalar loads).
template <class Fetch>
constexpr CodecKernels avx2_kernels() {
  return {SimdPath::kAvx2,
          encode_avx2,
          decode_avx2_t<Fetch>,
          decode_merged_avx2_t<Fetch>,
          decode2_avx2_t<Fetch>,
          decode2_merged_avx2_t<Fetch>,
          histogram_avx2,
          loops::minmax,
          loops::split,
          loops::merge,
          false};
}

constexpr CodecKernels kAvx2Kernels = avx2_kernels<GatherFetch>();
constexpr CodecKernels kAvx2ScalarFetchKernels = avx2_kernels<ScalarFetch>();

}  // namespace tz::cpu

#endif  // __x86_64__
