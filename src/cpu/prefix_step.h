// One refill and one lookup of a prefix-stream decoder whose state is in
// scalars: b, a 64-bit buffer whose top c bits are the next bits of the
// stream; p, the byte whose first bit lines up with bit c of b; o, the
// output. Written once for the library's run decoder (prefix_decode.cpp)
// and the study that chose its form (bench/experiments/prefix_decoders.h).
#pragma once
#include <cstdint>
#include <cstring>

namespace tz::cpu {

inline uint64_t prefix_load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

}  // namespace tz::cpu

// Leaves 56..63 valid bits in b (re-reading bytes already in b ORs in the
// same bits): room for four lookups of at most 14 bits.
#define TZ_PREFIX_REFILL(b, c, p)            \
  b |= ::tz::cpu::prefix_load_be64(p) >> c; \
  p += (63 - c) >> 3;                        \
  c |= 56;
// Every whole codeword of the next L bits, from a multi-symbol table
// (codec/prefix_code.h, prefix_build_multi): 8 bytes stored at o (at most
// 6 of them symbols), o moved by the number of symbols, their bits dropped.
#define TZ_PREFIX_LOOKUP(multi, L, b, c, o)          \
  {                                                  \
    const uint64_t x_ = (multi)[(b) >> (64 - (L))];  \
    std::memcpy(o, &x_, 8);                          \
    o += x_ >> 56;                                   \
    const unsigned nb_ = (unsigned)(x_ >> 48) & 0xFF; \
    b <<= nb_;                                       \
    c -= nb_;                                        \
  }
