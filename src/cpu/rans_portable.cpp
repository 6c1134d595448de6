// The portable rANS coder (see rans_portable.h). Same algorithm, words and
// checks as src/codec/rans.h; what differs is only how the work is laid out
// for a scalar out-of-order core:
//   - a step's 32 lanes are unrolled, so no loop counter, lane index or
//     variable shift is computed per symbol;
//   - renormalisation: the lanes decode independently, noting in a mask which
//     fell below L, then those take their words in ascending lane order (the
//     format's order); the step checks once that 64 bytes are left, so no
//     lane checks bounds;
//   - the encoder stores each lane's word at the front unconditionally and
//     keeps it by moving a count, not a pointer; it codes from entries built
//     per stream (bound (freq << 20) - 1, M - freq, start next to the
//     reciprocal) and computes x' = x + q * (M - freq) + start, the same
//     value mod 2^32 as (q << 12) + (x - q * freq) + start;
//   - with lane contexts, the table of the next symbol comes from a 256-entry
//     array of table offsets built once per stream, instead of the compare
//     and clamp of rans_ctx_of per symbol (a data-dependent branch there);
//   - a long stream (8192 symbols per table or more) decodes from its tables
//     split into symbol, frequency and offset arrays, so a lookup needs no
//     shifts or masks; the split tables of a thread's last four table sets
//     are kept, so the streams of a run of blocks build them once, and
//     shorter streams (1024 symbols per table or more) use them when there.
// The decoder's last partial step and end conditions are the shared
// rans_decode_tail, so it accepts and rejects exactly what
// tz::rans_decode_ctx does.
#include "cpu/rans_portable.h"

#include <bit>
#include <cstring>
#include <memory>
#include <new>

namespace tz::cpu {

namespace {

// off[s] = scale * (context that follows symbol s).
void context_offsets(const RansCtx& ctx, uint32_t scale, uint32_t* off) {
  for (uint32_t s = 0; s < 256; ++s) off[s] = scale * rans_ctx_of(s, ctx);
}

// One full step of 32 symbols from at least 2 * kLanes bytes at p.
// coff[l]: table offset of lane l's next symbol (Ctx only).
template <bool Ctx>
inline void decode_step(uint32_t* x, uint32_t* coff, const uint32_t* next_off, const uint32_t* dec,
                        const uint8_t*& p, uint8_t* o) {
  uint32_t low = 0;
#pragma GCC unroll 32
  for (int l = 0; l < kLanes; ++l) {
    uint32_t xl = x[l];
    const uint32_t e = (Ctx ? dec + coff[l] : dec)[xl & (kProbScale - 1u)];
    o[l] = (uint8_t)e;
    if (Ctx) coff[l] = next_off[e & 0xFFu];
    xl = (((e >> 8) & 0xFFFu) + 1u) * (xl >> kProbBits) + (e >> 20);
    low |= (xl < kRansL ? 1u : 0u) << l;
    x[l] = xl;
  }
  rans_refill_lanes(x, low, p);
}

// The decode tables split into the fields the step uses, so that a lookup
// is three loads and no shifts or masks: slot i's symbol, its frequency and
// the slot's offset in the symbol's range (the fields of rans_dec_entry).
// One array per field, so that the build vectorises (no interleaving).
// Built per stream from the shared tables when the stream is long enough to
// repay the build.
struct SplitDecTables {
  uint16_t freq[kProbScale * kMaxContexts];
  uint16_t off[kProbScale * kMaxContexts];
  uint8_t sym[kProbScale * kMaxContexts];
};

void split_dec_tables(const uint32_t* __restrict dec, uint32_t entries, SplitDecTables& t) {
  uint16_t* __restrict freq = t.freq;
  uint16_t* __restrict off = t.off;
  uint8_t* __restrict sym = t.sym;
  for (uint32_t i = 0; i < entries; ++i) {
    const uint32_t e = dec[i];
    freq[i] = (uint16_t)(((e >> 8) & 0xFFFu) + 1u);
    off[i] = (uint16_t)(e >> 20);
    sym[i] = (uint8_t)e;
  }
}

// The renormalisation of a step (rans_refill_lanes): lanes whose bit is set
// in low take the next word, in ascending lane order.
inline void refill_lanes(uint32_t* x, uint32_t low, const uint8_t*& p) {
  const uint8_t* q = p;
  for (; low; low &= low - 1) {
    uint32_t& xl = x[(uint32_t)std::countr_zero(low)];
    xl <<= 16;
    xl |= load_le16(q);
    q += 2;
  }
  p = q;
}

// decode_step from split tables. The lanes go from 31 down to 0 so that the
// mask of lanes below L builds by doubling (bit l = lane l), its bit as
// arithmetic (a subtract and a shift) rather than a compare and a set.
template <bool Ctx>
inline void decode_step_split(uint32_t* x, uint32_t* coff, const uint32_t* next_off, const SplitDecTables& t,
                              const uint8_t*& p, uint8_t* o) {
  uint32_t low = 0;
#pragma GCC unroll 32
  for (int l = kLanes - 1; l >= 0; --l) {
    uint32_t xl = x[l];
    const size_t i = (Ctx ? (size_t)coff[l] : 0u) + (size_t)(xl & (kProbScale - 1u));  // 64-bit sum: no zero-extension
    const uint8_t s = t.sym[i];
    o[l] = s;
    if (Ctx) coff[l] = next_off[s];
    xl = (uint32_t)t.freq[i] * (xl >> kProbBits) + t.off[i];
    low = low + low + (uint32_t)(((uint64_t)xl - kRansL) >> 63);  // xl < L, as arithmetic
    x[l] = xl;
  }
  refill_lanes(x, low, p);
}

// Symbols per table from which the split tables are built: the build costs
// about 5.6 instructions per entry (vectorised, but SSE2 narrows 32-bit
// lanes to 16 by shuffles), 23,000 per table, and the split step saves 4 to
// 5 instructions per symbol (callgrind), so a table repays from some 5,000
// symbols; shorter streams (small tensors, a frame's short last block) use
// split tables only where a recent stream left them (SplitTablesCache).
constexpr uint32_t kSplitTablesMinSymbolsPerTable = 8192;
// Symbols per table from which split tables left by a recent stream are
// looked for: finding them compares the decode tables (16 KiB a table, a
// memcmp of some 2,000 instructions), which the split step repays from
// some 500 symbols.
constexpr uint32_t kSplitTablesReuseMinSymbolsPerTable = 1024;

// The split tables of the last few decode table sets a thread decoded
// with, each beside a copy of the decode tables it was built from. The
// blocks of a frame's run share one table set, so all but the first stream
// of each field find theirs here instead of rebuilding it; four entries hold
// every stream of a block of any dtype (at most four fields). An entry is
// found by the content of the tables, never by their address, so a buffer
// reused for another frame's tables cannot return stale ones.
class SplitTablesCache {
 public:
  // The split tables of dec[0, entries): found, or built when build is
  // true; nullptr otherwise (or when memory is short).
  const SplitDecTables* get(const uint32_t* dec, uint32_t entries, bool build) {
    for (Entry& e : entry_)
      if (e.entries == entries && memcmp(e.dec.get(), dec, sizeof(uint32_t) * entries) == 0) return e.split.get();
    if (!build) return nullptr;
    Entry& e = entry_[next_];
    next_ = (next_ + 1) % kEntries;
    e.entries = 0;
    if (!e.split) e.split.reset(new (std::nothrow) SplitDecTables);
    if (!e.dec) e.dec.reset(new (std::nothrow) uint32_t[kProbScale * kMaxContexts]);
    if (!e.split || !e.dec) return nullptr;
    split_dec_tables(dec, entries, *e.split);
    memcpy(e.dec.get(), dec, sizeof(uint32_t) * entries);
    e.entries = entries;
    return e.split.get();
  }

 private:
  static constexpr unsigned kEntries = 4;
  struct Entry {
    uint32_t entries = 0;  // 0: empty
    std::unique_ptr<uint32_t[]> dec;
    std::unique_ptr<SplitDecTables> split;
  };
  Entry entry_[kEntries];
  unsigned next_ = 0;
};

template <bool Ctx>
int decode_lanes(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx_in,
                 uint8_t* out) {
  const RansCtx ctx = ctx_in;
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32_t x[kLanes], coff[kLanes], cx[kLanes];
  uint32_t next_off[256];
  if (Ctx) context_offsets(ctx, kProbScale, next_off);
  for (int l = 0; l < kLanes; ++l) {
    x[l] = load_le32(in + 4 * l);
    coff[l] = 0;
  }
  const uint8_t* p = in + kRansStateBytes;
  const uint8_t* const end = in + size;
  const uint32_t full_steps = n / kLanes;
  uint32_t s = 0;
  const uint32_t n_tables = Ctx ? ctx.n : 1u;
  const SplitDecTables* split = nullptr;
  if (n / n_tables >= kSplitTablesReuseMinSymbolsPerTable && (size_t)(end - p) >= 2 * kLanes) {
    thread_local SplitTablesCache cache;  // per thread: a decode may run on any pool worker
    split = cache.get(dec, n_tables * kProbScale, n / n_tables >= kSplitTablesMinSymbolsPerTable);
  }
  if (split) {
    for (; s < full_steps && (size_t)(end - p) >= 2 * kLanes; ++s)
      decode_step_split<Ctx>(x, coff, next_off, *split, p, out + (size_t)s * kLanes);
  } else {
    for (; s < full_steps && (size_t)(end - p) >= 2 * kLanes; ++s)
      decode_step<Ctx>(x, coff, next_off, dec, p, out + (size_t)s * kLanes);
  }
  for (int l = 0; l < kLanes; ++l) cx[l] = coff[l] >> kProbBits;
  return rans_decode_tail(x, p, end, s, n, dec, RansEmitBytes{out}, ctx, cx);
}

// The encoder's view of one table entry, built per stream from RansEncSym:
// the renormalisation bound and the coding step's terms ready to use.
struct EncEntry {
  uint64_t rcp;    // RansEncSym::rcp
  uint32_t xmax;   // (freq << 20) - 1: a word goes out when x > xmax
  uint16_t cmpl;   // kProbScale - freq
  uint16_t start;  // RansEncSym::start
};

void build_enc_entries(const RansEncSym* enc, uint32_t n_tables, EncEntry* out) {
  for (uint32_t i = 0; i < 256 * n_tables; ++i) {
    const RansEncSym& e = enc[i];
    out[i] = EncEntry{e.rcp, (uint32_t)(((uint64_t)e.freq << 20) - 1u), (uint16_t)(kProbScale - e.freq),
                      (uint16_t)e.start};
  }
}

// One coding step of state x (rans_enc_put_nb's result): the word is stored
// at front[at] and kept by moving `at` down (front = the stream's first word
// minus one; at <= 0 counts the words pushed in this step, negated, so the
// store is one addressing mode).
inline uint32_t enc_put(uint32_t x, const EncEntry& e, uint16_t* front, ptrdiff_t& at) {
  // 1 when x > xmax, as arithmetic (a compare here becomes a branch, taken at random)
  const uint32_t out = (uint32_t)(((uint64_t)e.xmax - x) >> 63);
  front[at] = (uint16_t)(x & 0xFFFFu);
  at -= out;
  x >>= 16u * out;
  const uint32_t q = (uint32_t)mulhi64((uint64_t)x << 20, e.rcp);
  return x + q * e.cmpl + e.start;
}

// One full step, lanes 31 down to 0, table of lane l: enc + tab_off(l).
template <class TabOff>
inline void encode_step(uint32_t* x, const uint8_t* sp, const EncEntry* enc, const TabOff& tab_off,
                        uint16_t*& wp) {
  uint16_t* const front = wp - 1;
  ptrdiff_t at = 0;
#pragma GCC unroll 32
  for (int l = kLanes - 1; l >= 0; --l) x[l] = enc_put(x[l], enc[tab_off(l) + sp[l]], front, at);
  wp += at;
}

template <bool Ctx>
size_t encode_lanes(const uint8_t* sym, uint32_t n, const RansEncSym* enc_sym, const RansCtx& ctx_in,
                    uint16_t* words, uint8_t* out, size_t limit) {
  const RansCtx ctx = ctx_in;
  EncEntry enc[256 * kMaxContexts];
  build_enc_entries(enc_sym, Ctx ? ctx.n : 1u, enc);
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = rans_lane_start(ctx, l);
  uint32_t next_tab[256];
  if (Ctx) context_offsets(ctx, 256, next_tab);
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  uint32_t s = (n + kLanes - 1) / kLanes;
  if (n % kLanes) {  // the partial last step, coded first
    --s;
    const uint32_t base = s * kLanes;
    uint16_t* const front = wp - 1;
    ptrdiff_t at = 0;
    for (uint32_t l = n - base; l-- > 0;) {
      const uint32_t t = Ctx && s > 0 ? next_tab[sym[base - kLanes + l]] : 0u;
      x[l] = enc_put(x[l], enc[t + sym[base + l]], front, at);
    }
    wp += at;
  }
  if (Ctx) {
    for (; s > 1; --s) {
      const uint8_t* sp = sym + (size_t)(s - 1) * kLanes;
      encode_step(x, sp, enc, [&](int l) { return next_tab[sp[l - kLanes]]; }, wp);
    }
  }
  for (; s > 0; --s) encode_step(x, sym + (size_t)(s - 1) * kLanes, enc, [](int) { return 0u; }, wp);
  const size_t n_words = (size_t)(wend - wp);
  const size_t size = kRansStateBytes + 2 * n_words;
  if (size >= limit) return 0;
  for (int l = 0; l < kLanes; ++l) store_le32(out + 4 * l, x[l]);
  memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return size;
}

}  // namespace

size_t rans_encode_portable(const uint8_t* sym, uint32_t n, const RansEncSym* enc, const RansCtx& ctx,
                            uint16_t* words, uint8_t* out, size_t limit) {
  return ctx.n > 1 ? encode_lanes<true>(sym, n, enc, ctx, words, out, limit)
                   : encode_lanes<false>(sym, n, enc, ctx, words, out, limit);
}

int rans_decode_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                         uint8_t* out) {
  return ctx.n > 1 ? decode_lanes<true>(in, size, n, dec, ctx, out) : decode_lanes<false>(in, size, n, dec, ctx, out);
}

}  // namespace tz::cpu
