// The prefix decoders of tz_prefix_decode_study (prefix_decode_study.cpp),
// and the block layout they read: K segments of a block, each its own
// byte-aligned MSB-first stream coded with src/codec/prefix_code.h. Study
// code, not the library's: forms of the decode loop measured against each
// other (bench/experiments/README.md).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/prefix_code.h"
#include "cpu/prefix_step.h"

namespace tz::experiments {

constexpr uint32_t kMaxSyms = kPrefixLookupSyms;  // symbols per lookup entry (bytes 0..5)

struct PrefixBlock {
  std::vector<uint8_t> bytes;     // the segments, each padded with 16 zero bytes (reads run ahead)
  std::vector<uint32_t> start;    // segment offsets in bytes
  size_t payload = 0;             // bytes of the segments without padding
  std::vector<uint16_t> single;   // 2^L entries: symbol | length << 8
  std::vector<uint64_t> multi;    // 2^L entries: symbols | bits << 48 | count << 56
};

inline void build_tables(const uint8_t* len, const uint16_t* code, unsigned L, PrefixBlock& pb) {
  pb.single.assign((size_t)1 << L, 0);
  pb.multi.assign((size_t)1 << L, 0);
  prefix_build_single(len, code, L, pb.single.data());
  prefix_build_multi(pb.single.data(), L, pb.multi.data());
}

// The K segments each its own stream, byte-aligned (the codec's encoder on
// each), padded.
inline void encode_prefix(const uint8_t* sym, uint32_t n, unsigned K, const uint8_t* len, const uint16_t* code,
                   PrefixBlock& pb) {
  pb.bytes.clear();
  pb.start.clear();
  pb.payload = 0;
  const uint32_t per = (n + K - 1) / K;
  for (unsigned k = 0; k < K; ++k) {
    pb.start.push_back((uint32_t)pb.bytes.size());
    const uint32_t a = std::min(n, k * per), b = std::min(n, a + per);
    std::vector<uint8_t> seg(2 * (size_t)(b - a) + 8);
    uint64_t end = 0;
    seg.resize(prefix_encode(sym + a, b - a, len, code, 1, &end, seg.data(), seg.size()));
    pb.payload += seg.size();
    pb.bytes.insert(pb.bytes.end(), seg.begin(), seg.end());
    pb.bytes.insert(pb.bytes.end(), 16, 0);
  }
}

// The decoders use BMI2's shifts by a register (shlx / shrx: any count
// register, no flags), as every AVX2 CPU has them; -march of the build
// alone would not.
#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("bmi,bmi2")
#endif

inline uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// One segment's decoder state: buf holds cnt valid bits from its top.
struct Seg {
  const uint8_t* p;
  uint64_t buf;
  unsigned cnt;
  uint8_t* out;
  uint8_t* end;
};

// Branchless refill: afterwards cnt is 56..63 (the byte at p lines up with
// bit cnt of buf; re-reading bytes already in buf ORs in the same bits).
inline void refill(Seg& s) {
  s.buf |= load_be64(s.p) >> s.cnt;
  s.p += (63 - s.cnt) >> 3;
  s.cnt |= 56;
}

template <unsigned L>
inline void lookup(Seg& s, const uint64_t* multi) {
  const uint64_t e = multi[s.buf >> (64 - L)];
  std::memcpy(s.out, &e, 8);
  s.out += e >> 56;
  const unsigned nb = (unsigned)(e >> 48) & 0xFF;
  s.buf <<= nb;
  s.cnt -= nb;
}

// The symbols left in a segment, one at a time (exact writes).
template <unsigned L>
void finish(Seg& s, const uint16_t* single) {
  while (s.out < s.end) {
    if (s.cnt < L) refill(s);
    const uint16_t sl = single[s.buf >> (64 - L)];
    *s.out++ = (uint8_t)sl;
    s.buf <<= sl >> 8;
    s.cnt -= sl >> 8;
  }
}

// Decodes the K segments of a block, G at a time interleaved: four lookups
// per refill (4 x L <= 56 bits).
template <unsigned L, unsigned G>
void decode_prefix(const PrefixBlock& pb, unsigned K, uint32_t n, uint8_t* out) {
  static_assert(4 * L <= 56, "four lookups per refill");
  const uint32_t per = (n + K - 1) / K;
  const uint64_t* multi = pb.multi.data();
  for (unsigned g = 0; g < K; g += G) {
    Seg s[G];
    for (unsigned j = 0; j < G; ++j) {
      const uint32_t a = std::min(n, (g + j) * per), b = std::min(n, a + per);
      s[j] = {pb.bytes.data() + pb.start[g + j], 0, 0, out + a, out + b};
    }
    for (;;) {
      bool room = true;
      for (unsigned j = 0; j < G; ++j) room &= s[j].out + 4 * kMaxSyms + 8 <= s[j].end;
      if (!room) break;
      for (unsigned j = 0; j < G; ++j) refill(s[j]);
      for (int r = 0; r < 4; ++r)
        for (unsigned j = 0; j < G; ++j) lookup<L>(s[j], multi);
    }
    for (unsigned j = 0; j < G; ++j) {
      while (s[j].out + 4 * kMaxSyms + 8 <= s[j].end) {
        refill(s[j]);
        for (int r = 0; r < 4; ++r) lookup<L>(s[j], multi);
      }
      finish<L>(s[j], pb.single.data());
    }
  }
}

// The same as decode_prefix<L, 4> with the four segments' states in local
// scalars (the stores through the output pointers could otherwise alias
// an array of states, which the compiler then keeps in memory), and the
// symbol count taken with the bit count from one field.
template <unsigned L>
void decode_prefix4_regs(const PrefixBlock& pb, unsigned K, uint32_t n, uint8_t* out) {
  const uint32_t per = (n + K - 1) / K;
  const uint64_t* multi = pb.multi.data();
  for (unsigned g = 0; g < K; g += 4) {
    const uint8_t *p0 = pb.bytes.data() + pb.start[g], *p1 = pb.bytes.data() + pb.start[g + 1],
                  *p2 = pb.bytes.data() + pb.start[g + 2], *p3 = pb.bytes.data() + pb.start[g + 3];
    uint64_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    unsigned c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    uint8_t *o0 = out + std::min(n, g * per), *o1 = out + std::min(n, (g + 1) * per),
            *o2 = out + std::min(n, (g + 2) * per), *o3 = out + std::min(n, (g + 3) * per);
    uint8_t *const e0 = o1, *const e1 = o2, *const e2 = o3, *const e3 = out + std::min(n, (g + 4) * per);
    constexpr size_t kRoom = 4 * kMaxSyms + 8;  // bytes four lookups may write
    while (o0 + kRoom <= e0 && o1 + kRoom <= e1 && o2 + kRoom <= e2 && o3 + kRoom <= e3) {
      TZ_PREFIX_REFILL(b0, c0, p0) TZ_PREFIX_REFILL(b1, c1, p1) TZ_PREFIX_REFILL(b2, c2, p2) TZ_PREFIX_REFILL(b3, c3, p3)
      for (int r = 0; r < 4; ++r) {
        TZ_PREFIX_LOOKUP(multi, L, b0, c0, o0) TZ_PREFIX_LOOKUP(multi, L, b1, c1, o1) TZ_PREFIX_LOOKUP(multi, L, b2, c2, o2) TZ_PREFIX_LOOKUP(multi, L, b3, c3, o3)
      }
    }
    Seg s[4] = {{p0, b0, c0, o0, e0}, {p1, b1, c1, o1, e1}, {p2, b2, c2, o2, e2}, {p3, b3, c3, o3, e3}};
    for (Seg& x : s) {
      while (x.out + 4 * kMaxSyms + 8 <= x.end) {
        refill(x);
        for (int r = 0; r < 4; ++r) lookup<L>(x, multi);
      }
      finish<L>(x, pb.single.data());
    }
  }
}

// K = 32 byte-aligned segments, four in flight all the way: lane j decodes
// segments j, j + 4, j + 8, ... one after the other; when its segment has
// no room left for a round of four lookups, that lane alone finishes the
// segment (its tail one symbol at a time, exactly) and starts its next
// one, while the other lanes keep their state. States in scalars, as
// decode_prefix4_regs.
template <unsigned L>
void decode_prefix32_rotating(const PrefixBlock& pb, uint32_t n, uint8_t* out) {
  constexpr unsigned K = 32;
  const uint32_t per = (n + K - 1) / K;
  const uint64_t* multi = pb.multi.data();
  const uint16_t* single = pb.single.data();
  constexpr size_t kRoom = 4 * kMaxSyms + 8;
  const uint8_t* p[4];
  uint64_t b[4];
  unsigned c[4], seg[4];
  uint8_t *o[4], *e[4];
  auto start = [&](unsigned j, unsigned k) {
    seg[j] = k;
    if (k >= K) {  // done: a lane that never has room
      o[j] = e[j] = nullptr;
      return;
    }
    const uint32_t a = std::min(n, k * per), z = std::min(n, a + per);
    p[j] = pb.bytes.data() + pb.start[k];
    b[j] = 0;
    c[j] = 0;
    o[j] = out + a;
    e[j] = out + z;
  };
  for (unsigned j = 0; j < 4; ++j) start(j, j);
  unsigned live = 4;
  while (live) {
    uint64_t b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3];
    unsigned c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    const uint8_t *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    uint8_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
    uint8_t *const e0 = e[0], *const e1 = e[1], *const e2 = e[2], *const e3 = e[3];
    if (live == 4) {
      while (o0 + kRoom <= e0 && o1 + kRoom <= e1 && o2 + kRoom <= e2 && o3 + kRoom <= e3) {
        TZ_PREFIX_REFILL(b0, c0, p0) TZ_PREFIX_REFILL(b1, c1, p1) TZ_PREFIX_REFILL(b2, c2, p2) TZ_PREFIX_REFILL(b3, c3, p3)
        for (int r = 0; r < 4; ++r) {
          TZ_PREFIX_LOOKUP(multi, L, b0, c0, o0) TZ_PREFIX_LOOKUP(multi, L, b1, c1, o1) TZ_PREFIX_LOOKUP(multi, L, b2, c2, o2) TZ_PREFIX_LOOKUP(multi, L, b3, c3, o3)
        }
      }
    }
    b[0] = b0, b[1] = b1, b[2] = b2, b[3] = b3;
    c[0] = c0, c[1] = c1, c[2] = c2, c[3] = c3;
    p[0] = p0, p[1] = p1, p[2] = p2, p[3] = p3;
    o[0] = o0, o[1] = o1, o[2] = o2, o[3] = o3;
    // Every lane without room finishes its segment and moves on; once a
    // lane has no segment left, the others run alone.
    for (unsigned j = 0; j < 4; ++j) {
      if (seg[j] >= K) continue;
      if (live == 4 && o[j] + kRoom <= e[j]) continue;
      Seg x{p[j], b[j], c[j], o[j], e[j]};
      while (x.out + kRoom <= x.end) {
        refill(x);
        for (int r = 0; r < 4; ++r) lookup<L>(x, multi);
      }
      finish<L>(x, single);
      start(j, seg[j] + 4);
      if (seg[j] >= K) --live;
      else if (live < 4) --j;  // running alone: finish this lane's next segment too
    }
  }
}

// Entries laid out for the shortest dependency chain: byte 0 holds the
// bits consumed (bits 0..5, which shlx reads as its count: the entry itself
// shifts the buffer, no field extracted on the chain) and the symbol count
// less one (bits 6..7: at most 4 symbols a lookup), bytes 1..4 the symbols.
// The bit count is not kept: the refill reads at the bit position instead.
inline std::vector<uint64_t> short_chain_table(const PrefixBlock& pb, unsigned L) {
  std::vector<uint64_t> t(pb.multi.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const uint64_t e = pb.multi[i];
    unsigned k = (unsigned)(e >> 56), bits = 0;
    if (k > 4) k = 4;
    uint64_t syms = 0;
    for (unsigned j = 0; j < k; ++j) {
      const uint8_t sym = (uint8_t)(e >> (8 * j));
      syms |= (uint64_t)sym << (8 * j);
      bits += pb.single[((uint32_t)i << bits) & ((1u << L) - 1)] >> 8;
    }
    t[i] = (uint64_t)bits | (uint64_t)(k - 1) << 6 | syms << 8;
  }
  return t;
}

template <unsigned L>
void decode_prefix4_short(const PrefixBlock& pb, const uint64_t* t, unsigned K, uint32_t n, uint8_t* out) {
  const uint32_t per = (n + K - 1) / K;
  for (unsigned g = 0; g < K; g += 4) {
    const uint8_t* base[4];
    uint64_t pos[4], b[4];
    uint8_t *o[4], *e[4];
    for (int j = 0; j < 4; ++j) {
      base[j] = pb.bytes.data() + pb.start[g + j];
      pos[j] = 0;
      o[j] = out + std::min(n, (g + j) * per);
      e[j] = out + std::min(n, (g + j + 1) * per);
    }
    uint64_t b0, b1, b2, b3, q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    const uint8_t *a0 = base[0], *a1 = base[1], *a2 = base[2], *a3 = base[3];
    uint8_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
    constexpr size_t kRoom = 4 * 4 + 8;
    // q: bits consumed; each round reloads 64 bits at byte q / 8 and drops
    // q % 8 (at least 57 valid bits: four lookups of up to L bits).
#define TZ_LOAD(bb, a, q) bb = load_be64(a + (q >> 3)) << (q & 7);
#define TZ_STEP(bb, q, oo)                                  \
  {                                                         \
    const uint64_t x = t[bb >> (64 - L)];                   \
    const uint64_t syms = x >> 8;                           \
    std::memcpy(oo, &syms, 8);                              \
    oo += ((x >> 6) & 3) + 1;                               \
    bb <<= x;                                               \
    q += x & 63;                                            \
  }
    while (o0 + kRoom <= e[0] && o1 + kRoom <= e[1] && o2 + kRoom <= e[2] && o3 + kRoom <= e[3]) {
      TZ_LOAD(b0, a0, q0) TZ_LOAD(b1, a1, q1) TZ_LOAD(b2, a2, q2) TZ_LOAD(b3, a3, q3)
      for (int r = 0; r < 4; ++r) {
        TZ_STEP(b0, q0, o0) TZ_STEP(b1, q1, o1) TZ_STEP(b2, q2, o2) TZ_STEP(b3, q3, o3)
      }
    }
#undef TZ_LOAD
#undef TZ_STEP
    uint8_t* oo[4] = {o0, o1, o2, o3};
    const uint64_t qq[4] = {q0, q1, q2, q3};
    (void)b; (void)pos;
    for (int j = 0; j < 4; ++j) {
      // The rest one symbol at a time from the bit position reached.
      Seg x{base[j] + (qq[j] >> 3), 0, 0, oo[j], e[j]};
      refill(x);
      x.buf <<= (qq[j] & 7);
      x.cnt -= (unsigned)(qq[j] & 7);
      finish<L>(x, pb.single.data());
    }
  }
}

#if defined(__x86_64__)
#pragma GCC pop_options
#endif

}  // namespace tz::experiments
