// A plain reference of the 32-lane rANS stream of doc/format.md 5 (kinds 1
// and 3), written straight from the text: integer division, a checked read
// for every word, no fast path. The codec's portable coder (src/codec/rans.h)
// and every SIMD kernel table must give exactly its bytes and statuses.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/rans.h"

namespace tz::ref {

// Encodes n symbols with ctx.n tables freq (256 each, table c at +256 c).
// Returns the payload (32 LE u32 states, then LE u16 words). Lane l starts
// at x0[l] when x0 is given (a seeded stream of doc/format.md 5.8: L + seed;
// anything else only to build invalid streams), else at L.
inline std::vector<uint8_t> rans_encode(const uint8_t* sym, uint32_t n, const uint32_t* freq, const RansCtx& ctx,
                                        const uint32_t* x0 = nullptr) {
  std::vector<uint32_t> start((size_t)ctx.n * 256);
  for (uint32_t c = 0; c < ctx.n; ++c) {
    uint32_t acc = 0;
    for (int s = 0; s < 256; ++s) {
      start[256 * c + s] = acc;
      acc += freq[256 * c + s];
    }
  }
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = x0 ? x0[l] : kRansL;
  std::vector<uint16_t> rev;  // words in push order (last word of the stream first)
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = n_steps; s-- > 0;) {
    for (uint32_t l = kLanes; l-- > 0;) {
      const uint32_t i = s * kLanes + l;
      if (i >= n) continue;
      const uint32_t c = (ctx.n > 1 && s > 0) ? rans_ctx_of(sym[i - kLanes], ctx) : 0;
      const uint32_t f = freq[256 * c + sym[i]], st = start[256 * c + sym[i]];
      if ((uint64_t)x[l] >= ((uint64_t)f << 20)) {
        rev.push_back((uint16_t)(x[l] & 0xFFFF));
        x[l] >>= 16;
      }
      x[l] = (x[l] / f) * kProbScale + (x[l] % f) + st;
    }
  }
  std::vector<uint8_t> out(kRansStateBytes + 2 * rev.size());
  for (int l = 0; l < kLanes; ++l) store_le32(out.data() + 4 * l, x[l]);
  for (size_t j = 0; j < rev.size(); ++j) store_le16(out.data() + kRansStateBytes + 2 * j, rev[rev.size() - 1 - j]);
  return out;
}

// Decodes n symbols into out; kOk, or kErrCorruptBlock when a word is
// missing, words are left over, a lane does not end at L, or the payload
// size is not 128 + an even number. With seed (a seeded stream, 5.8): a lane
// must end with x >> 16 == 1 instead, and seed[l] receives x & 0xFFFF.
inline int rans_decode(const uint8_t* in, size_t size, uint32_t n, const uint32_t* freq, const RansCtx& ctx,
                       uint8_t* out, uint16_t* seed = nullptr) {
  if (size < kRansStateBytes || (size - kRansStateBytes) % 2) return kErrCorruptBlock;
  std::vector<uint8_t> sym_of((size_t)ctx.n * kProbScale);
  std::vector<uint32_t> start((size_t)ctx.n * 256);
  for (uint32_t c = 0; c < ctx.n; ++c) {
    uint32_t acc = 0;
    for (int s = 0; s < 256; ++s) {
      start[256 * c + s] = acc;
      for (uint32_t j = 0; j < freq[256 * c + s]; ++j) sym_of[(size_t)c * kProbScale + acc + j] = (uint8_t)s;
      acc += freq[256 * c + s];
    }
  }
  uint32_t x[kLanes], cx[kLanes] = {};
  for (int l = 0; l < kLanes; ++l) x[l] = load_le32(in + 4 * l);
  size_t pos = kRansStateBytes;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t l = i % kLanes, c = cx[l];
    const uint32_t slot = x[l] % kProbScale;
    const uint8_t s = sym_of[(size_t)c * kProbScale + slot];
    out[i] = s;
    x[l] = freq[256 * c + s] * (x[l] / kProbScale) + slot - start[256 * c + s];
    if (ctx.n > 1) cx[l] = rans_ctx_of(s, ctx);
    if (x[l] < kRansL) {
      if (pos + 2 > size) return kErrCorruptBlock;
      x[l] = (x[l] << 16) | load_le16(in + pos);
      pos += 2;
    }
  }
  if (pos != size) return kErrCorruptBlock;
  for (int l = 0; l < kLanes; ++l)
    if (seed ? (x[l] >> 16) != 1 : x[l] != kRansL) return kErrCorruptBlock;
  if (seed)
    for (int l = 0; l < kLanes; ++l) seed[l] = (uint16_t)(x[l] & 0xFFFF);
  return kOk;
}

}  // namespace tz::ref
