// Static rANS with 32 interleaved states and 16-bit renormalisation.
//
// Layout (doc/format.md section 5): symbol i of a stream belongs to lane
// i % 32. The decoder walks steps of 32 symbols forward; within a step the
// lanes that need a word take them from the word stream in ascending lane
// order. The encoder therefore runs steps backwards and, within a step, lanes
// backwards, pushing words onto the front of the stream. This is the order a
// GPU warp decodes in (ballot + popc to place each lane's read), and the CPU
// decoder reproduces it lane by lane.
#pragma once
#include <algorithm>

#include "codec/format.h"

namespace tz {

// ---------------------------------------------------------------- tables --

struct RansEncSym {
  uint64_t rcp;    // ceil(2^44 / freq): exact floor(x / freq) for x < 2^32
  uint32_t freq;   // 1..kProbScale, 0 = symbol absent
  uint32_t start;  // cumulative frequency
};

// Decode table entry (one per slot of kProbScale):
//   bits 0..7 symbol, bits 8..19 freq-1, bits 20..31 slot-start.
TZ_HD uint32_t rans_dec_entry(uint32_t sym, uint32_t freq, uint32_t off) {
  return sym | ((freq - 1u) << 8) | (off << 20);
}

// Lane contexts (format version 2, stream kind 3): symbol i of a stream is
// coded with table ctx_of(symbol i - 32), the symbol its lane coded one step
// earlier; symbols of the first step use table 0. A stream of kind 1 is the
// case n = 1.
// The seeds of a block's coded stream (format version 3, doc/format.md 5.8)
// travel with it: an encoder given seed_in starts lane l at
// L | le16(seed_in + 2l) instead of L; a decoder given seed_out accepts a
// lane whose final state x has x >> 16 == 1 and stores le16(seed_out + 2l)
// = x & 0xFFFF (without it, every lane must end at L). Null in every table;
// a block's coder sets them per call.
struct RansCtx {
  uint32_t base = 0;  // first symbol value with its own context
  uint32_t n = 1;     // number of contexts (tables), 1..kMaxContexts
  const uint8_t* seed_in = nullptr;  // encoder: kSeedBytes seed bytes, or null
  uint8_t* seed_out = nullptr;       // decoder: where the kSeedBytes seeds go, or null
};
// c without lane contexts (n = 1), seeds kept: what a decoder specialised
// for n = 1 passes to rans_decode_tail, so that the compiler folds its
// context branches as it does for RansCtx{}.
TZ_HD RansCtx rans_ctx_seeds_only(const RansCtx& c) {
  RansCtx r{};
  r.seed_in = c.seed_in;
  r.seed_out = c.seed_out;
  return r;
}
// Initial encoder state of lane l.
TZ_HD uint32_t rans_lane_start(const RansCtx& c, int l) {
  return kRansL | (c.seed_in ? (uint32_t)load_le16(c.seed_in + 2 * l) : 0u);
}
// The decoder's end condition on the 32 final lane states, and the seeds
// handed back (only once every lane passed).
TZ_HD int rans_lanes_end(const uint32_t* x, const RansCtx& c) {
  if (!c.seed_out) {
    for (int l = 0; l < kLanes; ++l)
      if (x[l] != kRansL) return kErrCorruptBlock;
    return kOk;
  }
  for (int l = 0; l < kLanes; ++l)
    if ((x[l] >> 16) != 1u) return kErrCorruptBlock;
  for (int l = 0; l < kLanes; ++l) store_le16(c.seed_out + 2 * l, (uint16_t)(x[l] & 0xFFFFu));
  return kOk;
}
TZ_HD uint32_t rans_ctx_of(uint32_t prev_sym, const RansCtx& c) {
  const uint32_t d = prev_sym > c.base ? prev_sym - c.base : 0u;
  return d < c.n ? d : c.n - 1u;
}

// The frequencies' greedy fix-up (rans_normalize_with): from freq summing
// to sum (every present symbol >= 1), adds one to or takes one from a
// symbol at a time until the sum is kProbScale. Adding one to symbol s gains
// about c[s]/freq[s] bits of total cost; removing one loses about
// c[s]/(freq[s]-1). Each step picks the best; ties go to the lowest symbol.
// The picks are a strict total order (ratio, then symbol), so every way of
// making them gives the same table. This one scans (no local array: the
// device form, and the reference the host's faster form is tested against,
// test_rans.cpp).
TZ_HD bool rans_inc_better(const uint64_t* c, const uint32_t* freq, int a, int b) {
  const uint64_t l = c[a] * freq[b], r = c[b] * freq[a];
  return l > r || (l == r && a < b);
}
TZ_HD bool rans_dec_better(const uint64_t* c, const uint32_t* freq, int a, int b) {
  const uint64_t l = c[a] * (freq[b] - 1), r = c[b] * (freq[a] - 1);
  return l < r || (l == r && a < b);
}
TZ_HD void rans_fixup_scan(const uint64_t* c, uint32_t* freq, int64_t sum) {
  while (sum < (int64_t)kProbScale) {
    int best = -1;
    for (int s = 0; s < 256; ++s) {
      if (!c[s]) continue;
      if (best < 0 || rans_inc_better(c, freq, s, best)) best = s;
    }
    ++freq[best];
    ++sum;
  }
  while (sum > (int64_t)kProbScale) {
    int best = -1;
    for (int s = 0; s < 256; ++s) {
      if (freq[s] <= 1) continue;
      if (best < 0 || rans_dec_better(c, freq, s, best)) best = s;
    }
    --freq[best];
    --sum;
  }
}

#if !defined(__CUDA_ARCH__)
// The same fix-up on the host. Adding (sum < kProbScale): with f0 =
// floor(c * M / t) (M = kProbScale, t the sum of c), every symbol with f0 >=
// 1 has ratio c / f0 >= t / M and, after one more, c / (f0 + 1) < t / M;
// a symbol raised from f0 = 0 to 1 has c / 1 < t / M. The deficit D is
// below the number of symbols with f0 >= 1 (each loses under one in the
// floor, and the raised ones' shares are each below one), so the D picks
// are the D best of those symbols' first ratios, one each: a selection, not
// D heap steps (the same symbols, so the same table). Removing (sum >
// kProbScale, after many raised symbols) keeps the heap: a symbol may lose
// more than one.
inline void rans_fixup_host(const uint64_t* c, uint32_t* freq, int64_t sum, uint64_t t) {
  if (sum < (int64_t)kProbScale) {
    uint8_t cand[256];
    int n = 0;
    for (int s = 0; s < 256; ++s)
      if (c[s] && c[s] * kProbScale >= t) cand[n++] = (uint8_t)s;  // f0 >= 1
    const int d = (int)((int64_t)kProbScale - sum);
    auto better = [&](uint8_t a, uint8_t b) { return rans_inc_better(c, freq, a, b); };
    if (d < n) std::nth_element(cand, cand + d, cand + n, better);
    for (int i = 0; i < d && i < n; ++i) ++freq[cand[i]];
    if (d > n) rans_fixup_scan(c, freq, sum + n);  // not reached (see above); the sum would still end at M
    return;
  }
  uint8_t heap[256];
  int hn = 0;
  auto sift_down = [&](int i) {
    for (;;) {
      int m = i;
      const int l = 2 * i + 1, r = l + 1;
      if (l < hn && rans_dec_better(c, freq, heap[l], heap[m])) m = l;
      if (r < hn && rans_dec_better(c, freq, heap[r], heap[m])) m = r;
      if (m == i) return;
      const uint8_t tmp = heap[i];
      heap[i] = heap[m];
      heap[m] = tmp;
      i = m;
    }
  };
  for (int s = 0; s < 256; ++s)
    if (freq[s] > 1) heap[hn++] = (uint8_t)s;
  for (int i = hn / 2; i-- > 0;) sift_down(i);
  while (sum > (int64_t)kProbScale) {
    const int b = heap[0];
    --freq[b];
    --sum;
    if (freq[b] <= 1) heap[0] = heap[--hn];
    sift_down(0);
  }
}
#endif

// The first part of rans_normalize_with: c = the counts scaled below 2^50
// (so that count * kProbScale and the fix-up's cross products, count *
// freq with freq <= 2^12, fit in 64 bits; a present symbol at least 1), t
// their sum, freq = floor(c * kProbScale / t) raised to 1 where that is 0,
// *sum their sum. Returns the number of present symbols; with 0 or 1, freq
// is final (all zero, or kProbScale for the one symbol).
TZ_HD int rans_normalize_start(const uint64_t* counts_in, uint32_t* freq, uint64_t* c, uint64_t* t_out,
                               int64_t* sum_out) {
  uint64_t total = 0;
  int present = 0;
  for (int s = 0; s < 256; ++s) {
    total += counts_in[s];
    present += counts_in[s] != 0;
  }
  for (int s = 0; s < 256; ++s) freq[s] = 0;
  if (present == 0) return 0;
  if (present == 1) {
    for (int s = 0; s < 256; ++s)
      if (counts_in[s]) freq[s] = kProbScale;
    return 1;
  }
  int shift = 0;
  while ((total >> shift) >= (UINT64_C(1) << 50)) ++shift;
  uint64_t t = 0;
  for (int s = 0; s < 256; ++s) {
    uint64_t v = counts_in[s] >> shift;
    if (counts_in[s] && v == 0) v = 1;
    c[s] = v;
    t += v;
  }
  int64_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    if (!c[s]) continue;
    uint64_t f = (c[s] * kProbScale) / t;
    if (f == 0) f = 1;
    freq[s] = (uint32_t)f;
    sum += (int64_t)f;
  }
  *t_out = t;
  *sum_out = sum;
  return present;
}

// Normalises a histogram to frequencies summing to kProbScale, every present
// symbol >= 1. Integer-only and deterministic: CPU and GPU encoders must
// produce identical tables. Returns the number of present symbols (0 if the
// histogram is empty).
//
// rans_normalize_with takes the 256-entry working array from the caller
// (the CUDA backend passes global scratch: a 2 KiB per-thread array would make
// the driver reserve that much local memory for every resident GPU thread).
TZ_HD_NOINLINE int rans_normalize_with(const uint64_t* counts_in, uint32_t* freq, uint64_t* c) {
  uint64_t t = 0;
  int64_t sum = 0;
  const int present = rans_normalize_start(counts_in, freq, c, &t, &sum);
  if (present < 2) return present;
#if defined(__CUDA_ARCH__)
  rans_fixup_scan(c, freq, sum);
#else
  rans_fixup_host(c, freq, sum, t);
#endif
  return present;
}

TZ_HD_NOINLINE int rans_normalize(const uint64_t* counts_in, uint32_t* freq) {
  uint64_t c[256];
  return rans_normalize_with(counts_in, freq, c);
}

// Serialised frequency table: a 32-byte presence bitmap (bit s%8 of byte s/8)
// then, for each present symbol in increasing order, its frequency as a
// 1- or 2-byte LEB128. Returns bytes written (<= kFreqTableMaxBytes).
TZ_HD size_t rans_write_table(const uint32_t* freq, uint8_t* out) {
  for (int i = 0; i < 32; ++i) out[i] = 0;
  size_t pos = 32;
  for (int s = 0; s < 256; ++s) {
    if (!freq[s]) continue;
    out[s >> 3] |= (uint8_t)(1u << (s & 7));
    const uint32_t f = freq[s];
    if (f < 128) {
      out[pos++] = (uint8_t)f;
    } else {
      out[pos++] = (uint8_t)(0x80u | (f & 0x7Fu));
      out[pos++] = (uint8_t)(f >> 7);
    }
  }
  return pos;
}

// Parses and validates a table. Returns bytes consumed, or 0 if malformed
// (truncated, non-canonical LEB128, zero frequency, sum != kProbScale).
TZ_HD size_t rans_read_table(const uint8_t* in, size_t n, uint32_t* freq) {
  if (n < 32) return 0;
  size_t pos = 32;
  uint32_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    freq[s] = 0;
    if (!((in[s >> 3] >> (s & 7)) & 1u)) continue;
    if (pos >= n) return 0;
    uint32_t f = in[pos++];
    if (f & 0x80u) {
      if (pos >= n) return 0;
      const uint32_t hi = in[pos++];
      if (hi == 0 || hi > 0x7Fu) return 0;
      f = (f & 0x7Fu) | (hi << 7);
    }
    if (f == 0 || f > kProbScale) return 0;
    freq[s] = f;
    sum += f;
  }
  if (sum != kProbScale) return 0;
  return pos;
}

TZ_HD void rans_build_enc(const uint32_t* freq, RansEncSym* enc) {
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = freq[s];
    enc[s].freq = f;
    enc[s].start = start;
    enc[s].rcp = f ? ((UINT64_C(1) << 44) + f - 1) / f : 0;
    start += f;
  }
}

// dec must hold kProbScale entries.
TZ_HD void rans_build_dec(const uint32_t* freq, uint32_t* dec) {
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = freq[s];
    for (uint32_t j = 0; j < f; ++j) dec[start + j] = rans_dec_entry((uint32_t)s, f, j);
    start += f;
  }
}

// Exact cost in bits of coding `counts` with `freq` (fixed point, 1/256 bit),
// used to decide whether a stream's table pays for itself. Host only.
// (Defined in src/cpu; declared here for discoverability.)

// ---------------------------------------------------------------- coding --

// One rANS encode step for state x and symbol e: emits the low 16 bits of x
// below *wp first when x >= freq << 20 (at most one word per symbol).
TZ_HD uint32_t rans_enc_put(uint32_t x, const RansEncSym& e, uint16_t** wp) {
  if ((uint64_t)x >= ((uint64_t)e.freq << 20)) {
    *--(*wp) = (uint16_t)(x & 0xFFFFu);
    x >>= 16;
  }
  const uint64_t q = mulhi64((uint64_t)x << 20, e.rcp);
  return (uint32_t)(q << kProbBits) + (x - (uint32_t)q * e.freq) + e.start;
}

// rans_enc_put without a branch (the portable encoder's hot loop): the word
// is always stored at wp[-1] and kept only by moving wp. Measured on real
// BF16 exponents (AMD EPYC Zen 4, 64 distinct blocks, CPU time): 6.0 cycles
// per symbol, against 6.9 with the branch and 6.8 coding all lanes first and
// pushing the words of a lane mask after. wp[-1] must be
// writable, which holds in rans_encode_ctx: with j symbols left to code, at
// most n - j words were pushed, so wp >= words + j >= words + 1.
TZ_HD uint32_t rans_enc_put_nb(uint32_t x, const RansEncSym& e, uint16_t*& wp) {
  const uint32_t out = (uint64_t)x >= ((uint64_t)e.freq << 20) ? 1u : 0u;
  wp[-1] = (uint16_t)(x & 0xFFFFu);
  wp -= out;
  x >>= 16u * out;
  const uint64_t q = mulhi64((uint64_t)x << 20, e.rcp);
  return (uint32_t)(q << kProbBits) + (x - (uint32_t)q * e.freq) + e.start;
}

// Encodes n symbols into out: 32 u32 final states, then u16 words.
// `words` is scratch of at least n u16. Returns the payload size, or 0 if
// it would not be smaller than `limit` bytes (the caller then stores raw).
// `enc` holds ctx.n tables of 256 entries (table c at enc + 256 c); every
// symbol must have freq != 0 in the table of its context.
TZ_HD_NOINLINE size_t rans_encode_ctx(const uint8_t* sym, uint32_t n, const RansEncSym* enc, const RansCtx& ctx,
                                      uint16_t* words, uint8_t* out, size_t limit) {
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = rans_lane_start(ctx, l);
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = n_steps; s-- > 0;) {
    const uint32_t base = s * kLanes;
    const uint32_t here = (n - base) < (uint32_t)kLanes ? (n - base) : (uint32_t)kLanes;
    const uint8_t* sp = sym + base;
    if (ctx.n > 1 && s > 0) {
      for (uint32_t l = here; l-- > 0;)
        x[l] = rans_enc_put_nb(x[l], enc[256 * rans_ctx_of(sym[base - kLanes + l], ctx) + sp[l]], wp);
    } else {
      for (uint32_t l = here; l-- > 0;) x[l] = rans_enc_put_nb(x[l], enc[sp[l]], wp);
    }
  }
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  for (int l = 0; l < kLanes; ++l) store_le32(out + 4 * l, x[l]);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}

TZ_HD size_t rans_encode(const uint8_t* sym, uint32_t n, const RansEncSym* enc, uint16_t* words, uint8_t* out,
                         size_t limit) {
  return rans_encode_ctx(sym, n, enc, RansCtx{}, words, out, limit);
}

// One decode step for lane state x: returns the symbol, updates x, and pulls
// a word from *p when the state drops below L. The caller guarantees a word
// is available (fast path) or checks `ok`.
TZ_HD uint32_t rans_dec_sym(uint32_t& x, const uint32_t* dec) {
  const uint32_t e = dec[x & (kProbScale - 1)];
  x = (((e >> 8) & 0xFFFu) + 1u) * (x >> kProbBits) + (e >> 20);
  return e & 0xFFu;
}

// Stores decoded symbols as bytes (the emitter of rans_decode).
struct RansEmitBytes {
  uint8_t* out;
  TZ_HD void operator()(uint32_t i, uint32_t sym) const { out[i] = (uint8_t)sym; }
};

// Checked scalar decoding of steps [s, ceil(n/32)) from lane states x[32]
// and word pointer p, then the end conditions (every word consumed, every
// lane back at L, or seeded: rans_lanes_end). Shared by rans_decode and the
// SIMD decoder's tail so both accept and reject exactly the same streams. emit(i, symbol) stores.
// With contexts (ctx.n > 1), cx[l] is the context of lane l's next symbol
// (table at dec + kProbScale * cx[l]); it is updated as symbols decode.
template <class Emit>
TZ_HD int rans_decode_tail(uint32_t* x, const uint8_t* p, const uint8_t* end, uint32_t s, uint32_t n,
                           const uint32_t* dec, const Emit& emit, const RansCtx& ctx = RansCtx{},
                           uint32_t* cx = nullptr) {
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (; s < n_steps; ++s) {
    const uint32_t base = s * kLanes;
    const uint32_t here = (n - base) < (uint32_t)kLanes ? (n - base) : (uint32_t)kLanes;
    for (uint32_t l = 0; l < here; ++l) {
      uint32_t xl = x[l];
      const uint32_t* d = ctx.n > 1 ? dec + (size_t)kProbScale * cx[l] : dec;
      const uint32_t sym = rans_dec_sym(xl, d);
      emit(base + l, sym);
      if (ctx.n > 1) cx[l] = rans_ctx_of(sym, ctx);
      if (xl < kRansL) {
        if (end - p < 2) return kErrCorruptBlock;
        xl = (xl << 16) | load_le16(p);
        p += 2;
      }
      x[l] = xl;
    }
  }
  if (p != end) return kErrCorruptBlock;
  return rans_lanes_end(x, ctx);
}

// Index of the lowest set bit of m != 0.
TZ_HD uint32_t rans_lowest_bit(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)__ffs((int)m) - 1u;
#else
  return (uint32_t)__builtin_ctz(m);
#endif
}
// The renormalisation of a decode step: the lanes whose bit is set in low
// (those that fell below L) take their next 16-bit word from p, in
// ascending lane order, as the format reads them.
TZ_HD void rans_refill_lanes(uint32_t* x, uint32_t low, const uint8_t*& p) {
  for (; low; low &= low - 1) {
    const uint32_t l = rans_lowest_bit(low);
    x[l] = (x[l] << 16) | load_le16(p);
    p += 2;
  }
}
// One step of the decoders' fast path (at least 2 * kLanes bytes left at p,
// all 32 lanes present): the lanes decode independently, noting in a mask
// which fell below L; then only those take their words, in ascending lane
// order, as the format reads them. Measured on real BF16 exponents (AMD EPYC
// Zen 4, 64 distinct blocks, CPU time): 4.5 cycles per symbol, against 6.9
// with a branch per lane (the word pointer then a chain through the lanes)
// and 5.0 with a branch-free select per lane.
template <bool Ctx, class Emit>
TZ_HD void rans_decode_step(uint32_t* x, uint32_t* cx, const uint8_t*& p, uint32_t base, const uint32_t* dec,
                            const RansCtx& ctx, const Emit& emit) {
  uint32_t low = 0;
  for (int l = 0; l < kLanes; ++l) {
    uint32_t xl = x[l];
    const uint32_t sym = rans_dec_sym(xl, Ctx ? dec + (size_t)kProbScale * cx[l] : dec);
    emit(base + (uint32_t)l, sym);
    if (Ctx) cx[l] = rans_ctx_of(sym, ctx);
    low |= (xl < kRansL ? 1u : 0u) << l;
    x[l] = xl;
  }
  rans_refill_lanes(x, low, p);
}

// Decodes n symbols from a payload of `size` bytes; emit(i, symbol) stores
// symbol i (RansEmitBytes: as bytes; the frame decoder also merges fields on
// the fly). Never reads outside [in, in+size). Returns kOk only if the
// words are consumed exactly and every lane ends in the encoder's initial
// state L, which catches most corruption before the checksum does.
// `dec` holds ctx.n tables of kProbScale entries.
template <class Emit>
TZ_HD int rans_decode_ctx_with(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx_in,
                               const Emit& emit_in) {
  // Local copies: stores through the emitter cannot then alias them, so
  // their fields stay in registers.
  const Emit emit = emit_in;
  const RansCtx ctx = ctx_in;
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32_t x[kLanes];
  uint32_t cx[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    x[l] = load_le32(in + 4 * l);
    cx[l] = 0;
  }
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full_steps = n / kLanes;
  uint32_t s = 0;
  if (ctx.n > 1) {
    for (; s < full_steps && (size_t)(end - p) >= 2 * kLanes; ++s)
      rans_decode_step<true>(x, cx, p, s * kLanes, dec, ctx, emit);
  } else {
    for (; s < full_steps && (size_t)(end - p) >= 2 * kLanes; ++s)
      rans_decode_step<false>(x, cx, p, s * kLanes, dec, ctx, emit);
  }
  return rans_decode_tail(x, p, end, s, n, dec, emit, ctx, cx);
}

// As rans_decode_ctx_with, storing bytes: never writes outside [out, out+n).
TZ_HD_NOINLINE int rans_decode_ctx(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                                   const RansCtx& ctx, uint8_t* out) {
  return rans_decode_ctx_with(in, size, n, dec, ctx, RansEmitBytes{out});
}

TZ_HD int rans_decode(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, uint8_t* out) {
  return rans_decode_ctx(in, size, n, dec, RansCtx{}, out);
}

}  // namespace tz
