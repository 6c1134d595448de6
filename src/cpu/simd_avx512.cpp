// AVX-512 kernels of the CPU backend (SimdPath::kAvx512, kernels.h). Each
// produces exactly the bytes (or the status) of its portable counterpart;
// tests/test_simd.cpp compares them.
#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TZ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2,bmi,bmi2,popcnt")))

namespace tz::cpu {

namespace {

// One decode step for 16 lanes: returns the 16 symbols (one per 32-bit
// lane) and advances *p past the words the lanes consumed, in lane order.
// With lane contexts, coff holds each lane's table offset (context x
// kProbScale) and is advanced to the next symbol's.
template <bool Ctx>
TZ_AVX512 inline __m512i dec16(__m512i& x, const uint32_t* dec, const uint8_t*& p, __m512i& coff, __m512i cbase,
                               __m512i cmax) {
  __m512i idx = _mm512_and_si512(x, _mm512_set1_epi32(kProbScale - 1));
  if (Ctx) idx = _mm512_add_epi32(idx, coff);
  const __m512i e = _mm512_i32gather_epi32(idx, dec, 4);
  const __m512i f = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 8), _mm512_set1_epi32(0xFFF)),
                                     _mm512_set1_epi32(1));
  x = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(x, kProbBits)), _mm512_srli_epi32(e, 20));
  const __mmask16 m = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32((int)kRansL));
  const __m512i w = _mm512_maskz_expand_epi32(m, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)));
  x = _mm512_mask_or_epi32(x, m, _mm512_slli_epi32(x, 16), w);
  p += 2 * (size_t)_mm_popcnt_u32(m);
  const __m512i sym = _mm512_and_si512(e, _mm512_set1_epi32(0xFF));
  if (Ctx) {
    const __m512i c = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(sym, cbase), _mm512_setzero_si512()), cmax);
    coff = _mm512_slli_epi32(c, kProbBits);
  }
  return sym;
}

// Decoder of one stream as a resumable state, so that two independent
// streams can be stepped in lockstep: each step is a chain of dependent
// instructions (gather -> multiply -> compare -> expand), and two streams
// give the out-of-order core twice as many independent chains.
// emit(step_base, half, syms32) stores 16 symbols; emit(i, sym) one.
template <class Emit, bool Ctx>
struct StreamDec {
  __m512i x0, x1;
  __m512i c0, c1, cbase, cmax;  // lane contexts (Ctx only)
  const uint8_t* p;
  const uint8_t* end;
  const uint32_t* dec;
  uint32_t n, s, full_steps;
  RansCtx ctx;
  Emit emit;

  TZ_AVX512 int init(const uint8_t* in, size_t size, uint32_t n_, const uint32_t* dec_, const RansCtx& ctx_) {
    if (size < kRansStateBytes || ((size - kRansStateBytes) & 1u)) return kErrCorruptBlock;
    x0 = _mm512_loadu_si512(in);
    x1 = _mm512_loadu_si512(in + 64);
    ctx = ctx_;
    c0 = c1 = _mm512_setzero_si512();
    cbase = _mm512_set1_epi32((int)ctx.base);
    cmax = _mm512_set1_epi32((int)ctx.n - 1);
    p = in + kRansStateBytes;
    end = in + size;
    dec = dec_;
    n = n_;
    s = 0;
    full_steps = n / kLanes;
    return kOk;
  }
  // Each half reads 32 bytes at most; 64 left covers both halves.
  TZ_AVX512 bool fast() const { return s < full_steps && end - p >= 64; }
  TZ_AVX512 void step() {
    const uint32_t base = s * kLanes;
    emit(base, 0, dec16<Ctx>(x0, dec, p, c0, cbase, cmax));
    emit(base, 1, dec16<Ctx>(x1, dec, p, c1, cbase, cmax));
    ++s;
  }
  // Scalar tail: the same code (and checks) as tz::rans_decode.
  TZ_AVX512 int finish() {
    while (fast()) step();
    alignas(64) uint32_t x[kLanes];
    _mm512_store_si512(x, x0);
    _mm512_store_si512(x + 16, x1);
    if (!Ctx) return rans_decode_tail(x, p, end, s, n, dec, emit);
    alignas(64) uint32_t cx[kLanes];
    _mm512_store_si512(cx, _mm512_srli_epi32(c0, kProbBits));
    _mm512_store_si512(cx + 16, _mm512_srli_epi32(c1, kProbBits));
    return rans_decode_tail(x, p, end, s, n, dec, emit, ctx, cx);
  }
};

template <bool Ctx, class Emit>
TZ_AVX512 int decode_one_t(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                           const Emit& emit) {
  StreamDec<Emit, Ctx> d{};
  d.emit = emit;
  const int st = d.init(in, size, n, dec, ctx);
  return st != kOk ? st : d.finish();
}

template <class Emit>
TZ_AVX512 int decode_one(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const Emit& emit,
                         const RansCtx& ctx = RansCtx{}) {
  return ctx.n > 1 ? decode_one_t<true>(in, size, n, dec, ctx, emit) : decode_one_t<false>(in, size, n, dec, ctx, emit);
}

template <bool CtxA, bool CtxB, class Emit>
TZ_AVX512 void decode_two_t(const uint8_t* in_a, size_t size_a, uint32_t n_a, const uint32_t* dec_a,
                            const RansCtx& ctx_a, const Emit& emit_a, int* st_a, const uint8_t* in_b, size_t size_b,
                            uint32_t n_b, const uint32_t* dec_b, const RansCtx& ctx_b, const Emit& emit_b, int* st_b) {
  StreamDec<Emit, CtxA> a{};
  StreamDec<Emit, CtxB> b{};
  a.emit = emit_a;
  b.emit = emit_b;
  *st_a = a.init(in_a, size_a, n_a, dec_a, ctx_a);
  *st_b = b.init(in_b, size_b, n_b, dec_b, ctx_b);
  if (*st_a == kOk && *st_b == kOk)
    while (a.fast() && b.fast()) {
      a.step();
      b.step();
    }
  if (*st_a == kOk) *st_a = a.finish();
  if (*st_b == kOk) *st_b = b.finish();
}

template <class Emit>
TZ_AVX512 void decode_two(const uint8_t* in_a, size_t size_a, uint32_t n_a, const uint32_t* dec_a, const Emit& emit_a,
                          int* st_a, const uint8_t* in_b, size_t size_b, uint32_t n_b, const uint32_t* dec_b,
                          const Emit& emit_b, int* st_b, const RansCtx& ctx_a = RansCtx{},
                          const RansCtx& ctx_b = RansCtx{}) {
  if (ctx_a.n > 1 && ctx_b.n > 1)
    decode_two_t<true, true>(in_a, size_a, n_a, dec_a, ctx_a, emit_a, st_a, in_b, size_b, n_b, dec_b, ctx_b, emit_b, st_b);
  else if (ctx_a.n > 1)
    decode_two_t<true, false>(in_a, size_a, n_a, dec_a, ctx_a, emit_a, st_a, in_b, size_b, n_b, dec_b, ctx_b, emit_b, st_b);
  else if (ctx_b.n > 1)
    decode_two_t<false, true>(in_a, size_a, n_a, dec_a, ctx_a, emit_a, st_a, in_b, size_b, n_b, dec_b, ctx_b, emit_b, st_b);
  else
    decode_two_t<false, false>(in_a, size_a, n_a, dec_a, ctx_a, emit_a, st_a, in_b, size_b, n_b, dec_b, ctx_b, emit_b,
                               st_b);
}


// Emitters for decode_driver (structs, not lambdas: GCC does not give a
// lambda its enclosing function's target attribute).
struct EmitBytes {
  uint8_t* out;
  TZ_AVX512 void operator()(uint32_t base, int half, __m512i sym) const {
    _mm_storeu_si128((__m128i*)(out + base + 16 * half), _mm512_cvtepi32_epi8(sym));
  }
  void operator()(uint32_t i, uint32_t sym) const { out[i] = (uint8_t)sym; }
};

struct EmitBF16 {
  uint8_t* out;
  const uint8_t* mant;
  TZ_AVX512 void operator()(uint32_t base, int half, __m512i sym) const {
    const uint32_t i = base + 16 * half;
    const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(mant + i)));
    const __m512i v = _mm512_or_si512(
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(m, _mm512_set1_epi32(0x80)), 8), _mm512_slli_epi32(sym, 7)),
        _mm512_and_si512(m, _mm512_set1_epi32(0x7F)));
    _mm256_storeu_si256((__m256i*)(out + 2 * (size_t)i), _mm512_cvtepi32_epi16(v));
  }
  void operator()(uint32_t i, uint32_t sym) const {
    store_le16(out + 2 * (size_t)i, merge_elem_bf16((uint8_t)sym, mant[i]));
  }
};


// One encode step for 16 lanes (symbols sp[0..15]); words go below *wp in
// ascending lane order, as the scalar encoder's descending pushes leave them.
//
// q = floor(x / f) without a division or a table of reciprocals: after
// renormalisation x < f * 2^20, so x / f < 2^20. In single precision,
// float(x) * (1/f refined by one Newton step from rcp14) has a relative
// error below 2^-22, i.e. an absolute error below 0.25, so its truncation is
// q - 1, q or q + 1; one signed correction of the remainder makes it exact.
// The result is therefore identical to the scalar encoder's.
//
// With lane contexts (Ctx), table = the context of the lane's previous
// symbol sp[l - 32] (tables of 256 entries each, concatenated in fst).
template <bool Ctx>
TZ_AVX512 inline void enc16(__m512i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, __m512i cbase,
                            __m512i cmax) {
  __m512i sy = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)sp));
  if (Ctx) {
    const __m512i pv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(sp - kLanes)));
    const __m512i c = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(pv, cbase), _mm512_setzero_si512()), cmax);
    sy = _mm512_add_epi32(sy, _mm512_slli_epi32(c, 8));
  }
  const __m512i fs = _mm512_i32gather_epi32(sy, fst, 4);
  const __m512i f = _mm512_and_si512(fs, _mm512_set1_epi32(0x1FFF));
  const __m512i st = _mm512_srli_epi32(fs, 13);
  const __mmask16 m = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(x, 20), f);
  const unsigned cnt = (unsigned)_mm_popcnt_u32(m);
  const __m256i w = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(m, x));
  wp -= cnt;
  _mm256_mask_storeu_epi16(wp, (__mmask16)((1u << cnt) - 1u), w);
  x = _mm512_mask_srli_epi32(x, m, x, 16);
  const __m512 ff = _mm512_cvtepi32_ps(f);
  __m512 r = _mm512_rcp14_ps(ff);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(ff, r, _mm512_set1_ps(2.0f)));
  __m512i q = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_cvtepu32_ps(x), r));
  __m512i rem = _mm512_sub_epi32(x, _mm512_mullo_epi32(q, f));
  const __mmask16 lo = _mm512_cmplt_epi32_mask(rem, _mm512_setzero_si512());
  q = _mm512_mask_sub_epi32(q, lo, q, _mm512_set1_epi32(1));
  rem = _mm512_mask_add_epi32(rem, lo, rem, f);
  const __mmask16 hi = _mm512_cmpge_epi32_mask(rem, f);
  q = _mm512_mask_add_epi32(q, hi, q, _mm512_set1_epi32(1));
  rem = _mm512_mask_sub_epi32(rem, hi, rem, f);
  x = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, kProbBits), rem), st);
}



// Shared by the plain and the lane-context encoder. fst: ctx.n tables of
// 256 (one when ctx.n <= 1).
TZ_AVX512 size_t encode_simd_t(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx,
                               uint16_t* words, uint8_t* out, size_t limit) {
  const uint32_t* fst = t.freq_start;
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  alignas(64) uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  const uint32_t full_steps = n / kLanes;
  const bool use_ctx = ctx.n > 1;
  // The partial last step is encoded first (steps run backwards), scalar.
  if (n % kLanes) {
    const uint32_t base = full_steps * kLanes;
    for (uint32_t l = n - base; l-- > 0;) {
      const uint8_t s = sym[base + l];
      const uint32_t c = use_ctx && full_steps > 0 ? rans_ctx_of(sym[base - kLanes + l], ctx) : 0;
      x[l] = rans_enc_put(x[l], t.sym[256 * c + s], &wp);
    }
  }
  __m512i x0 = _mm512_load_si512(x);
  __m512i x1 = _mm512_load_si512(x + 16);
  uint32_t s = full_steps;
  if (use_ctx) {
    const __m512i cbase = _mm512_set1_epi32((int)ctx.base), cmax = _mm512_set1_epi32((int)ctx.n - 1);
    for (; s > 1;) {
      --s;
      const uint8_t* sp = sym + (size_t)s * kLanes;
      enc16<true>(x1, sp + 16, fst, wp, cbase, cmax);
      enc16<true>(x0, sp, fst, wp, cbase, cmax);
    }
  }
  while (s-- > 0) {  // without contexts every step; with them step 0 (table 0)
    const uint8_t* sp = sym + (size_t)s * kLanes;
    enc16<false>(x1, sp + 16, fst, wp, x1, x1);  // (context arguments unused)
    enc16<false>(x0, sp, fst, wp, x0, x0);
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  _mm512_storeu_si512(out, x0);
  _mm512_storeu_si512(out + 64, x1);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}


TZ_AVX512 size_t encode_avx512(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx,
                               uint16_t* words, uint8_t* out, size_t limit) {
  return encode_simd_t(sym, n, t, ctx, words, out, limit);
}

TZ_AVX512 int decode_avx512(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                            uint8_t* out) {
  return decode_one(in, size, n, dec, EmitBytes{out}, ctx);
}

TZ_AVX512 int decode_bf16_avx512(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                                 const uint8_t* mant, uint8_t* out) {
  return decode_one(in, size, n, dec, EmitBF16{out, mant}, ctx);
}

TZ_AVX512 void decode2_avx512(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  decode_two(a.in, a.size, a.n, a.dec, EmitBytes{a.out}, st_a, b.in, b.size, b.n, b.dec, EmitBytes{b.out}, st_b,
             a.ctx, b.ctx);
}

TZ_AVX512 void decode2_bf16_avx512(const RansStream& a, const uint8_t* mant_a, int* st_a, const RansStream& b,
                                   const uint8_t* mant_b, int* st_b) {
  decode_two(a.in, a.size, a.n, a.dec, EmitBF16{a.out, mant_a}, st_a, b.in, b.size, b.n, b.dec,
             EmitBF16{b.out, mant_b}, st_b, a.ctx, b.ctx);
}

// Field loops (split, merge, min/max, histogram) compiled for AVX-512.
namespace loops {
#define TZ_LOOP_TARGET TZ_AVX512
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

}  // namespace

const CodecKernels kAvx512Kernels = {
    SimdPath::kAvx512,   encode_avx512,    decode_avx512, decode_bf16_avx512, decode2_avx512,
    decode2_bf16_avx512, loops::histogram, loops::minmax, loops::split,       loops::merge,
};

}  // namespace tz::cpu

#endif  // __x86_64__
