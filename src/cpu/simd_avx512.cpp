// AVX-512 kernels of the CPU backend (SimdPath::kAvx512, kernels.h). Each
// produces exactly the bytes (or the status) of its portable counterpart;
// tests/cpu/test_simd*.cpp compare them.
//
// Two tables. The encoder entry of both is encode_avx512: the AVX2
// encoder's 8-lane step in AVX-512VL's 256-bit forms (masks, unsigned
// conversion, two-table permutes; below), through the AVX2 encoder's
// driver (simd_encode_driver.inc), with a 16-symbol window of entries
// (which the AVX2 encoder does without); Intel Xeon model 207,
// tz_kernel_bench, against the AVX2 step when that had the window and
// gathers: 1.35-1.70 against 1.97-2.66 cycles per symbol (window),
// 1.96-2.40 against 2.33-3.11 (gathers). A 16-lane AVX-512 encoder
// (compress and masked stores; see git history) measured slower on AMD EPYC
// Zen 4 and no faster on that Xeon. The merged
// decoders (BF16, FP16 and FP32 blocks whose stream 0 is coded and every
// other stream raw, decoded and merged in one pass) differ:
// - kAvx512Kernels (every CPU but AMD's): 16-lane merged decoders, two
//   blocks in lockstep. Intel Xeon model 207, MiniLM, one thread, against
//   the AVX2 ones: BF16 decompress 2.73-2.97 against 1.86-1.91 GB/s, FP16
//   2.68-2.77 against 1.94-2.00; one block after the other instead of
//   lockstep, 2.55-2.68 and 2.42-2.66.
// - kAvx512AmdKernels (AMD, whose Zen 4 runs a 512-bit vector as two
//   halves): the AVX2 merged decoders, measured faster there (BF16: 1.55
//   against 1.62 cycles per element for one block, 1.55 against 1.85 for
//   two blocks of two tables in lockstep; tz_kernel_bench, runs alternated).
// The histogram entry is the AVX2 one in both (a window of common values
// counted in 32-byte vectors: 0.47 against 0.87 cycles per byte with the
// plain loop compiled for AVX-512, Zen 4).
#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_avx2_rans.h"
#include "cpu/simd_avx512_rans.h"
#include "cpu/simd_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TZ_AVX512 TZ_AVX512_RANS  // one target for every AVX-512 kernel (cpu/simd_avx512_rans.h)

namespace tz::cpu {

namespace {

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
    if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
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
    // The two phases (simd_avx512_rans.h) written out here: through a
    // wrapper taking the states by reference, GCC 12 left this struct's
    // finish out of line or, forced inline, the lockstep loops slower
    // (FP32 decode -4 %, two-block BF16 decode -8 %, Intel Xeon family 6
    // model 167).
    __mmask16 m0, m1;
    const __m512i s0 = dec16_state<Ctx>(x0, dec, c0, cbase, cmax, m0);
    const __m512i s1 = dec16_state<Ctx>(x1, dec, c1, cbase, cmax, m1);
    const uint8_t* p1 = p + 2 * (size_t)_mm_popcnt_u32(m0);
    dec16_words(x0, m0, p);
    dec16_words(x1, m1, p1);
    p = p1 + 2 * (size_t)_mm_popcnt_u32(m1);
    emit(base, 0, s0);
    emit(base, 1, s1);
    ++s;
  }
  // Scalar tail: the same code (and checks) as tz::rans_decode.
  TZ_AVX512 int finish() {
    while (fast()) step();
    alignas(64) uint32_t x[kLanes];
    _mm512_store_si512(x, x0);
    _mm512_store_si512(x + 16, x1);
    if (!Ctx) return rans_decode_tail(x, p, end, s, n, dec, emit, rans_ctx_seeds_only(ctx));
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



// BF16 = sign << 15 | exponent << 7 | mantissa from the raw byte
// b = sign << 7 | mantissa ((b | b << 8) & 0x807F, as the AVX2 emitter);
// FP16 = top byte << 8 | low byte; FP32 = that BF16 value << 16 | s2 << 8 |
// s3. 16 symbols a half.
template <uint8_t Dtype>
struct EmitMerged {
  uint8_t* out;
  const uint8_t* const* raw;
  TZ_AVX512 static __m256i bf16_of(__m256i s16, __m256i b) {
    return _mm256_or_si256(_mm256_slli_epi16(s16, 7),
                           _mm256_and_si256(_mm256_or_si256(b, _mm256_slli_epi16(b, 8)), _mm256_set1_epi16((short)0x807F)));
  }
  TZ_AVX512 void operator()(uint32_t base, int half, __m512i sym) const {
    const size_t i = (size_t)base + 16 * half;
    const __m256i s16 = _mm512_cvtepi32_epi16(sym);
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(raw[0] + i)));
    if (Dtype == kF16) {
      _mm256_storeu_si256((__m256i*)(out + 2 * i), _mm256_or_si256(_mm256_slli_epi16(s16, 8), b));
    } else if (Dtype == kBF16) {
      _mm256_storeu_si256((__m256i*)(out + 2 * i), bf16_of(s16, b));
    } else {
      const __m128i s2 = _mm_loadu_si128((const __m128i*)(raw[1] + i));
      const __m128i s3 = _mm_loadu_si128((const __m128i*)(raw[2] + i));
      const __m512i low = _mm512_cvtepu16_epi32(_mm256_set_m128i(_mm_unpackhi_epi8(s3, s2), _mm_unpacklo_epi8(s3, s2)));
      const __m512i top = _mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_of(s16, b)), 16);
      _mm512_storeu_si512(out + 4 * i, _mm512_or_si512(top, low));
    }
  }
  void operator()(uint32_t i, uint32_t sym) const {
    const uint8_t s = (uint8_t)sym;
    if (Dtype == kF32)
      store_le32(out + 4 * (size_t)i, merge_elem_f32(s, raw[0][i], raw[1][i], raw[2][i]));
    else
      store_le16(out + 2 * (size_t)i, Dtype == kF16 ? merge_elem_f16(s, raw[0][i]) : merge_elem_bf16(s, raw[0][i]));
  }
};

TZ_AVX512 int decode_avx512(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                            uint8_t* out) {
  return decode_one(in, size, n, dec, EmitBytes{out}, ctx);
}


TZ_AVX512 void decode2_avx512(const RansStream& a, int* st_a, const RansStream& b, int* st_b) {
  decode_two(a.in, a.size, a.n, a.dec, EmitBytes{a.out}, st_a, b.in, b.size, b.n, b.dec, EmitBytes{b.out}, st_b,
             a.ctx, b.ctx);
}


TZ_AVX512 int decode_merged_avx512(uint8_t dtype, const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                                   const RansCtx& ctx, const uint8_t* const* raw, uint8_t* out) {
  switch (dtype) {
    case kF16: return decode_one(in, size, n, dec, EmitMerged<kF16>{out, raw}, ctx);
    case kF32: return decode_one(in, size, n, dec, EmitMerged<kF32>{out, raw}, ctx);
    default: return decode_one(in, size, n, dec, EmitMerged<kBF16>{out, raw}, ctx);
  }
}

template <uint8_t Dtype>
TZ_AVX512 void decode2_merged_t(const RansStream& a, const uint8_t* const* raw_a, int* st_a, const RansStream& b,
                                const uint8_t* const* raw_b, int* st_b) {
  decode_two(a.in, a.size, a.n, a.dec, EmitMerged<Dtype>{a.out, raw_a}, st_a, b.in, b.size, b.n, b.dec,
             EmitMerged<Dtype>{b.out, raw_b}, st_b, a.ctx, b.ctx);
}

TZ_AVX512 void decode2_merged_avx512(uint8_t dtype, const RansStream& a, const uint8_t* const* raw_a, int* st_a,
                                     const RansStream& b, const uint8_t* const* raw_b, int* st_b) {
  switch (dtype) {
    case kF16: return decode2_merged_t<kF16>(a, raw_a, st_a, b, raw_b, st_b);
    case kF32: return decode2_merged_t<kF32>(a, raw_a, st_a, b, raw_b, st_b);
    default: return decode2_merged_t<kBF16>(a, raw_a, st_a, b, raw_b, st_b);
  }
}

// ------------------------------------------------------------- encoder --

// The AVX2 encoder's step (simd_avx2.cpp enc8: the same 8 lanes in a
// 256-bit vector, the same words, so the same bytes) in AVX-512VL's forms:
// the renormalisation test as a mask (no movemask, no blend), x converted
// to float as unsigned in one instruction (correctly rounded: the value
// AVX2's two-half conversion gives), the 16-symbol window's entries and
// reciprocals by two-table permutes, the correction masked. Entries of a
// table without a window are loaded one by one from the symbol bytes
// (ScalarFetch::bytes, as the AVX2 step): against the gather, near-8-bit
// bytes (tz_kernel_bench enc_wide) 1.17 against 1.33 cycles per symbol,
// Intel Xeon family 6 model 167; with lane contexts they are gathered (the
// scalar form from the index vector measured 0.3-6 % slower there on Adam
// m / v compress). The quotient
// is AVX2's enc_quotient8: the same reciprocal (rcp_ps, Newton constant
// kEncNewtonTwo) of the same float x, so the same q, checked for every
// state by enc_quotient_misses_avx512 (simd_encode_driver.inc).
struct EncWindowVL {
  __m256i lo, t0, t1;  // lo broadcast; freq | start entries lo .. lo + 7, lo + 8 .. lo + 15
  __m256 r0, r1;       // their reciprocals (enc_rcp8)
};

TZ_AVX512 inline __m256 enc_rcp8(__m256i f) {
  const __m256 ff = _mm256_cvtepi32_ps(f);
  const __m256 r = _mm256_rcp_ps(ff);
  return _mm256_mul_ps(r, _mm256_fnmadd_ps(ff, r, _mm256_set1_ps(kEncNewtonTwo)));
}

// q = floor(x / f) as enc_quotient8, from the reciprocal r of f: the next
// state (q << 12) + (x - q f) + start, corrected where q came out one too
// large (q - 1 and the remainder + f: f - 4096 added).
TZ_AVX512 inline __m256i enc_next_state8(__m256i x, __m256i f, __m256 r, __m256i st) {
  const __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_cvtepu32_ps(x), r));
  const __m256i rem = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f));
  const __mmask8 neg = _mm256_cmplt_epi32_mask(rem, _mm256_setzero_si256());
  const __m256i xn = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, kProbBits), rem), st);
  return _mm256_mask_add_epi32(xn, neg, xn, _mm256_sub_epi32(f, _mm256_set1_epi32((int)kProbScale)));
}

template <bool Ctx, bool Win>
TZ_AVX512 inline void enc8vl(__m256i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, __m256i cbase,
                             __m256i cmax, const EncWindowVL* win) {
  __m256i sy = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sp));
  if (Ctx) {
    const __m256i pv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sp - kLanes)));
    const __m256i c = _mm256_min_epu8(_mm256_subs_epu8(pv, cbase), cmax);  // as in dec8
    sy = _mm256_add_epi32(sy, _mm256_slli_epi32(c, 8));
  }
  __m256i fs, f;
  __m256 r;
  const __m256i d = Win ? _mm256_sub_epi32(sy, win->lo) : sy;  // symbol - lo
  if (Win && _mm256_testz_si256(d, _mm256_set1_epi32(~15))) {  // all 8 in the window
    fs = _mm256_permutex2var_epi32(win->t0, d, win->t1);
    f = _mm256_and_si256(fs, _mm256_set1_epi32(0x1FFF));
    r = _mm256_permutex2var_ps(win->r0, d, win->r1);
  } else {
    fs = Ctx ? GatherFetch::get(fst, sy) : ScalarFetch::bytes(fst, sp, sy);
    f = _mm256_and_si256(fs, _mm256_set1_epi32(0x1FFF));
    r = enc_rcp8(f);
  }
  const __m256i st = _mm256_srli_epi32(fs, 13);
  // Emit where x >= f << 20, i.e. (x >> 20) >= f (both below 2^13).
  const __mmask8 emit = _mm256_cmpge_epu32_mask(_mm256_srli_epi32(x, 20), f);
  const unsigned m = (unsigned)emit;
  const __m128i packed = _mm256_cvtepi32_epi16(x);  // the low halves, lane order
  const __m128i wv = _mm_shuffle_epi8(packed, _mm_load_si128((const __m128i*)kEmitShuffle[m].data()));
  _mm_storeu_si128((__m128i*)(wp - 8), wv);
  wp -= _mm_popcnt_u32(m);
  x = enc_next_state8(_mm256_mask_srli_epi32(x, emit, x, 16), f, r, st);
}

struct Avx512EncStep {
  static constexpr bool kWindow = true;
  using Window = EncWindowVL;
  TZ_AVX512 static Window window(const uint32_t* fst, uint32_t lo) {
    Window w;
    w.lo = _mm256_set1_epi32((int)lo);
    w.t0 = _mm256_loadu_si256((const __m256i*)(fst + lo));
    w.t1 = _mm256_loadu_si256((const __m256i*)(fst + lo + 8));
    w.r0 = enc_rcp8(_mm256_and_si256(w.t0, _mm256_set1_epi32(0x1FFF)));
    w.r1 = enc_rcp8(_mm256_and_si256(w.t1, _mm256_set1_epi32(0x1FFF)));
    return w;
  }
  template <bool Ctx, bool Win>
  TZ_AVX512 static void step(__m256i& x, const uint8_t* sp, const uint32_t* fst, uint16_t*& wp, __m256i cbase,
                             __m256i cmax, const Window* w) {
    enc8vl<Ctx, Win>(x, sp, fst, wp, cbase, cmax, w);
  }
  TZ_AVX512 static __m256i next_state(__m256i x, __m256i f) {
    return enc_next_state8(x, f, enc_rcp8(f), _mm256_setzero_si256());
  }
};

#define TZ_ENC_TARGET TZ_AVX512
#include "cpu/simd_encode_driver.inc"
#undef TZ_ENC_TARGET

TZ_AVX512 size_t encode_avx512(const uint8_t* sym, uint32_t n, const EncTables& t, const RansCtx& ctx,
                               uint16_t* words, uint8_t* out, size_t limit) {
  return encode_driver<Avx512EncStep>(sym, n, t, ctx, words, out, limit);
}

}  // namespace

TZ_AVX512 uint64_t enc_quotient_misses_avx512(uint32_t f_first, uint32_t f_last) {
  return quotient_misses<Avx512EncStep>(f_first, f_last);
}

namespace {

// Field loops (split, merge, min/max) compiled for AVX-512.
namespace loops {
#define TZ_LOOP_TARGET TZ_AVX512
#include "cpu/simd_field_loops.inc"
#undef TZ_LOOP_TARGET
}  // namespace loops

}  // namespace

const CodecKernels kAvx512Kernels = {
    SimdPath::kAvx512, encode_avx512,  decode_avx512, decode_merged_avx512, decode2_avx512,
    decode2_merged_avx512, histogram_avx2, loops::minmax, loops::split,     loops::merge,
    true,
};

const CodecKernels kAvx512AmdKernels = {
    SimdPath::kAvx512, encode_avx512,  decode_avx512, decode_merged_avx2, decode2_avx512,
    decode2_merged_avx2, histogram_avx2, loops::minmax, loops::split,     loops::merge,
    true,
};

}  // namespace tz::cpu

#endif  // __x86_64__
