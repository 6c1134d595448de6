// Host/device helpers of the CUDA backend that are independent of CUDA
// itself, so the CPU test suite can check them against the reference codec
// (tests/cuda/test_cuda_hd.cpp): field access per element, the word slot
// arithmetic of the warp rANS coder, a CPU emulation of the warp encoder and
// decoder built from the same step functions, and a slicing-by-8 CRC32C.
#pragma once
#include "codec/checksum.h"
#include "codec/fields.h"
#include "codec/rans.h"

namespace tz::warp {

// ------------------------------------------------------------ fields --
// Field k of one element given as its bit pattern v (u16, u32 or u8 widened).
// Same mapping as split_fields (codec/fields.h).
template <int DT>
TZ_HD uint32_t elem_field(uint32_t v, int k) {
  if constexpr (DT == kBF16) {
    uint8_t s0, s1;
    split_elem_bf16((uint16_t)v, s0, s1);
    return k == 0 ? s0 : s1;
  } else if constexpr (DT == kF16) {
    return k == 0 ? (v >> 8) & 0xFFu : v & 0xFFu;
  } else if constexpr (DT == kF32) {
    uint8_t s[4];
    split_elem_f32(v, s[0], s[1], s[2], s[3]);
    return s[k];
  } else {
    return v & 0xFFu;
  }
}

// Inverse: element bits from its K field bytes (as merge_fields).
template <int DT>
TZ_HD uint32_t elem_merge(const uint32_t* s) {
  if constexpr (DT == kBF16) {
    return merge_elem_bf16((uint8_t)s[0], (uint8_t)s[1]);
  } else if constexpr (DT == kF16) {
    return (s[0] << 8) | s[1];
  } else if constexpr (DT == kF32) {
    return merge_elem_f32((uint8_t)s[0], (uint8_t)s[1], (uint8_t)s[2], (uint8_t)s[3]);
  } else {
    return s[0];
  }
}

// Element bits v with field r replaced by byte b (the seeded lane states'
// tail, doc/format.md 5.8: the decoder learns those bytes last).
template <int DT>
TZ_HD uint32_t elem_with_field(uint32_t v, int r, uint32_t b) {
  constexpr int K = DT == kF32 ? 4 : (DT == kBF16 || DT == kF16) ? 2 : 1;
  uint32_t f[K];
  for (int k = 0; k < K; ++k) f[k] = k == r ? b : elem_field<DT>(v, k);
  return elem_merge<DT>(f);
}

// ------------------------------------------------------- rANS words --
// Encoder, one step of 32 symbols: lanes emit in descending lane order, each
// word pushed in front of the previous one. With `ballot` the set of lanes
// that emit and wp the index just past the free space, lane l's word lands at
// wp - #(emitting lanes with index >= l); afterwards wp -= popc(ballot).
// In memory the step's words are therefore in ascending lane order, which is
// what the decoder reads.
TZ_HD uint32_t enc_word_slot(uint32_t wp, uint32_t ballot, uint32_t lane) { return wp - popc32(ballot >> lane); }

// Decoder: lane l's word is at p + #(lanes below l that need one).
TZ_HD uint32_t dec_word_slot(uint32_t ballot, uint32_t lane) { return popc32(ballot & ((1u << lane) - 1u)); }

// One encoder step of a lane: same arithmetic as rans_enc_put, but returns
// the renormalisation word instead of storing it.
TZ_HD uint32_t enc_step(uint32_t x, const RansEncSym& e, bool* emit, uint16_t* word) {
  *emit = (uint64_t)x >= ((uint64_t)e.freq << 20);
  if (*emit) {
    *word = (uint16_t)(x & 0xFFFFu);
    x >>= 16;
  }
  const uint64_t q = mulhi64((uint64_t)x << 20, e.rcp);
  return (uint32_t)(q << kProbBits) + (x - (uint32_t)q * e.freq) + e.start;
}

// Most 16-bit words a rANS payload of an n-symbol stream may hold and still
// be smaller than the raw stream (128 + 2 * words < n), or -1 if even zero
// words cannot beat raw. rans_encode(limit = n) succeeds exactly when the
// word count is <= this cap.
TZ_HD int64_t enc_word_cap(uint32_t n) { return n <= kRansStateBytes ? -1 : (int64_t)(n - kRansStateBytes - 1) / 2; }

// CPU emulation of the warp encoder (src/cuda/cuda_codec.cu,
// warp_rans_encode): 32 "lanes" run each step, the ballot is formed, words
// are written backwards into out[128 .. 128 + 2*cap) at enc_word_slot, and
// at the end moved down to out + 128 and the states stored in front.
// Returns the payload size, or 0 where raw is chosen. out must hold n bytes.
TZ_HD_NOINLINE size_t rans_encode_warp_emul(const uint8_t* sym, uint32_t n, const RansEncSym* enc, uint8_t* out) {
  const int64_t cap = enc_word_cap(n);
  if (cap < 0) return 0;
  uint16_t* const W = (uint16_t*)(out + kRansStateBytes);  // out is 4-aligned in the kernel
  uint32_t wp = (uint32_t)cap;
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = n_steps; s-- > 0;) {
    bool emit[kLanes];
    uint16_t word[kLanes];
    uint32_t ballot = 0;
    for (uint32_t l = 0; l < (uint32_t)kLanes; ++l) {
      const uint32_t i = s * kLanes + l;
      emit[l] = false;
      if (i < n) x[l] = enc_step(x[l], enc[sym[i]], &emit[l], &word[l]);
      if (emit[l]) ballot |= 1u << l;
    }
    const uint32_t cnt = popc32(ballot);
    if (cnt > wp) return 0;
    for (uint32_t l = 0; l < (uint32_t)kLanes; ++l)
      if (emit[l]) W[enc_word_slot(wp, ballot, l)] = word[l];
    wp -= cnt;
  }
  const uint32_t nw = (uint32_t)cap - wp;
  // Move down in chunks of 32 words, each chunk read before it is written
  // (the kernel's __syncwarp-separated copy); safe because the move is
  // towards lower addresses.
  for (uint32_t base = 0; base < nw; base += kLanes) {
    uint16_t tmp[kLanes];
    for (uint32_t l = 0; l < (uint32_t)kLanes && base + l < nw; ++l) tmp[l] = W[wp + base + l];
    for (uint32_t l = 0; l < (uint32_t)kLanes && base + l < nw; ++l) W[base + l] = tmp[l];
  }
  for (int l = 0; l < kLanes; ++l) store_le32(out + 4 * l, x[l]);
  return kRansStateBytes + 2 * (size_t)nw;
}

// CPU emulation of the warp decoder's word placement (the fused decode loop
// of the kernel, one stream): per step, lanes that need a word take it at
// dec_word_slot. Same result and the same acceptance rule as rans_decode.
TZ_HD_NOINLINE int rans_decode_warp_emul(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec,
                                         uint8_t* out) {
  if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = load_le32(in + 4 * l);
  size_t p = kRansStateBytes;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = 0; s < n_steps; ++s) {
    uint32_t ballot = 0;
    for (uint32_t l = 0; l < (uint32_t)kLanes; ++l) {
      const uint32_t i = s * kLanes + l;
      if (i >= n) continue;
      out[i] = (uint8_t)rans_dec_sym(x[l], dec);
      if (x[l] < kRansL) ballot |= 1u << l;
    }
    const uint32_t cnt = popc32(ballot);
    if (p + 2 * (size_t)cnt > size) return kErrCorruptBlock;
    for (uint32_t l = 0; l < (uint32_t)kLanes; ++l)
      if ((ballot >> l) & 1u) x[l] = (x[l] << 16) | load_le16(in + p + 2 * dec_word_slot(ballot, l));
    p += 2 * (size_t)cnt;
  }
  if (p != size) return kErrCorruptBlock;
  for (int l = 0; l < kLanes; ++l)
    if (x[l] != kRansL) return kErrCorruptBlock;
  return kOk;
}

// ---------------------------------------------------------- CRC32C --
// Slicing-by-8 tables: t[0] is the byte table of crc32c_make_table, t[k][i]
// advances t[k-1][i] by one more zero byte. t holds 8 * 256 entries.
TZ_HD void crc32c_make_table8_entry(uint32_t* t, uint32_t i) {
  uint32_t c = i;
  for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
  t[i] = c;
}
TZ_HD void crc32c_extend_table8(uint32_t* t, uint32_t i) {  // after all of t[0] exists
  uint32_t c = t[i];
  for (int k = 1; k < 8; ++k) {
    c = (c >> 8) ^ t[c & 0xFFu];
    t[k * 256 + i] = c;
  }
}
TZ_HD void crc32c_make_table8(uint32_t* t) {
  for (uint32_t i = 0; i < 256; ++i) crc32c_make_table8_entry(t, i);
  for (uint32_t i = 0; i < 256; ++i) crc32c_extend_table8(t, i);
}

// Raw state update (as crc32c_update), 8 bytes per round once p is 8-aligned.
TZ_HD uint32_t crc32c_update8(uint32_t st, const uint8_t* p, size_t n, const uint32_t* t) {
  while (n && ((uintptr_t)p & 7u)) {
    st = t[(st ^ *p++) & 0xFFu] ^ (st >> 8);
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
#if defined(__CUDA_ARCH__)
    const uint2 v = *(const uint2*)p;
    const uint32_t lo = v.x ^ st, hi = v.y;
#else
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= st;
#endif
    st = t[7 * 256 + (lo & 0xFFu)] ^ t[6 * 256 + ((lo >> 8) & 0xFFu)] ^ t[5 * 256 + ((lo >> 16) & 0xFFu)] ^
         t[4 * 256 + (lo >> 24)] ^ t[3 * 256 + (hi & 0xFFu)] ^ t[2 * 256 + ((hi >> 8) & 0xFFu)] ^
         t[1 * 256 + ((hi >> 16) & 0xFFu)] ^ t[hi >> 24];
  }
  for (; n; --n) st = t[(st ^ *p++) & 0xFFu] ^ (st >> 8);
  return st;
}

// Folds one segment CRC into the running block checksum state.
TZ_HD uint32_t crc32c_fold_segment(uint32_t acc, uint32_t seg_crc, const uint32_t* t) {
  uint8_t le[4];
  store_le32(le, seg_crc);
  return crc32c_update(acc, le, 4, t);
}

// Block checksum (codec/checksum.h) with the slicing tables, sequentially.
TZ_HD uint32_t block_checksum8(const uint8_t* p, size_t n, const uint32_t* t) {
  uint32_t acc = ~0u;
  for (size_t off = 0; off < n; off += kChecksumSegment) {
    const size_t len = (n - off) < kChecksumSegment ? (n - off) : kChecksumSegment;
    acc = crc32c_fold_segment(acc, ~crc32c_update8(~0u, p + off, len, t), t);
  }
  return ~acc;
}

}  // namespace tz::warp
