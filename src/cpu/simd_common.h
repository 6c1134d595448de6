// Pieces shared by the SIMD kernel files (no intrinsics here: what is inlined
// into a function with a target attribute must not need one itself).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "codec/fields.h"

namespace tz::cpu {

// 8-lane rANS decoders (AVX2: the frame codec's and the KV page codec's):
// for lane mask m (bit i: lane i takes a word), byte i of kTakeIndex[m] is
// the index among the vector's words of the word lane i takes: the number of
// lanes below i that take one.
constexpr std::array<std::array<uint8_t, 8>, 256> make_take_index() {
  std::array<std::array<uint8_t, 8>, 256> t{};
  for (int m = 0; m < 256; ++m) {
    int c = 0;
    for (int i = 0; i < 8; ++i) {
      t[m][i] = (uint8_t)c;
      c += (m >> i) & 1;
    }
  }
  return t;
}
alignas(64) inline constexpr std::array<std::array<uint8_t, 8>, 256> kTakeIndex = make_take_index();

// 8-lane rANS encoders (AVX2, and AVX-512VL in 256-bit vectors): for lane
// mask m (bit i: lane i emits a word), kEmitShuffle[m] is the byte shuffle
// of the 8 lanes' low 16-bit halves that puts the emitting lanes' words, in
// ascending lane order, at the top of 16 bytes (zero below).
constexpr std::array<std::array<uint8_t, 16>, 256> make_emit_shuffle() {
  std::array<std::array<uint8_t, 16>, 256> t{};
  for (int m = 0; m < 256; ++m) {
    int cnt = 0;
    for (int i = 0; i < 8; ++i) cnt += (m >> i) & 1;
    for (int j = 0; j < 16; ++j) t[m][j] = 0x80;
    int slot = 8 - cnt;
    for (int i = 0; i < 8; ++i)
      if ((m >> i) & 1) {
        t[m][2 * slot] = (uint8_t)(2 * i);
        t[m][2 * slot + 1] = (uint8_t)(2 * i + 1);
        ++slot;
      }
  }
  return t;
}
alignas(64) inline constexpr std::array<std::array<uint8_t, 16>, 256> kEmitShuffle = make_emit_shuffle();

// The Newton step's constant of the x86 encoders' float quotient (AVX2's
// enc_quotient8, which says why 2 + 2^-21 and not 2; the AVX-512VL step
// computes the same reciprocal).
inline constexpr float kEncNewtonTwo = 2.0f + 0x1p-21f;

// Views of caller buffers for element loads and stores: the C API accepts
// any address, so these must not assume 2- or 4-byte alignment.
typedef uint16_t u16_unaligned __attribute__((aligned(1), may_alias));
typedef uint32_t u32_unaligned __attribute__((aligned(1), may_alias));

// Elements per chunk when a histogram extracts stream bytes with SIMD first.
inline constexpr uint32_t kHistChunk = 1024;

// Byte counts in eight sub-histograms: runs of equal symbols (common in
// exponents) would otherwise serialise on one counter's load-add-store.
// Holds up to 2^32 - 1 counts per symbol: callers flush per call (blocks
// are at most 2^20 elements).
struct HistogramCounter {
  uint32_t h[8][256] = {};
  inline void add(const uint8_t* b, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {  // one 8-byte load, bytes by shifts
      uint64_t w;
      __builtin_memcpy(&w, b + i, 8);
      ++h[0][w & 0xFF];
      ++h[1][(w >> 8) & 0xFF];
      ++h[2][(w >> 16) & 0xFF];
      ++h[3][(w >> 24) & 0xFF];
      ++h[4][(w >> 32) & 0xFF];
      ++h[5][(w >> 40) & 0xFF];
      ++h[6][(w >> 48) & 0xFF];
      ++h[7][w >> 56];
    }
    for (; i < n; ++i) ++h[0][b[i]];
  }
  inline void flush(uint64_t* hist) const {
    for (int s = 0; s < 256; ++s) {
      uint64_t t = 0;
      for (int j = 0; j < 8; ++j) t += h[j][s];
      hist[s] += t;
    }
  }
};

// Destinations of the merged decoders' emitters (CodecKernels::
// rans_decode_merged) with their scalar step, one element of the checked
// tail; each path's emitter adds its vector step.
struct MergedTailF16 {
  uint8_t* out;
  const uint8_t* low;  // stream 1
  void operator()(uint32_t i, uint32_t sym) const { store_le16(out + 2 * (size_t)i, merge_elem_f16((uint8_t)sym, low[i])); }
};
struct MergedTailF32 {
  uint8_t* out;
  const uint8_t* s1;
  const uint8_t* s2;
  const uint8_t* s3;
  void operator()(uint32_t i, uint32_t sym) const {
    store_le32(out + 4 * (size_t)i, merge_elem_f32((uint8_t)sym, s1[i], s2[i], s3[i]));
  }
};

}  // namespace tz::cpu
