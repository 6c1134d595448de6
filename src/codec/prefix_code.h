// Length-limited prefix (Huffman) codes of one byte stream, decoded several
// symbols per table lookup: the building blocks of a prefix-coded stream.
// Not a block mode of the format yet: bench/experiments/prefix_decode_study.cpp
// measures this coder against the 32-lane rANS coder on real exponent
// streams (bench/experiments/README.md says what it showed). Header-only
// TZ_HD code, bounded arrays and no recursion, so that the CPU and CUDA
// backends can share it as they share rans.h.
//
// The pieces:
//   prefix_code_lengths    code lengths of a histogram, none longer than a
//                          limit (Huffman's, then the JPEG adjustment)
//   prefix_lengths_valid   a complete code within the limit (every bit
//                          pattern decodes), or one symbol of length 1
//   prefix_canonical_codes the canonical codes of the lengths
//   prefix_desc_*          the lengths as bytes: lo, hi, then 4 bits per
//                          symbol lo..hi (0 = absent), low nibble first
//   prefix_build_single    decode table: 2^limit entries sym | len << 8
//   prefix_build_multi     decode table: every whole codeword of a limit-bit
//                          window, up to kPrefixLookupSyms symbols
//   prefix_encode          symbols to one MSB-first bit stream, the bit
//                          offset of each of nseg equal segments' ends kept
//   prefix_decode          one run of bits back to symbols, exactly
#pragma once
#include "codec/format.h"

namespace tz {

constexpr uint32_t kPrefixMaxBits = 11;   // longest codeword and lookup width (a 16 KiB multi table)
constexpr uint32_t kPrefixLookupSyms = 6; // symbols of one multi-symbol entry (bytes 0..5)

// Present symbols ordered by (count, symbol), ascending; returns how many.
TZ_HD uint32_t prefix_sorted_symbols(const uint64_t* counts, uint8_t* order) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    if (!counts[s]) continue;
    uint32_t i = n++;
    while (i > 0 && counts[order[i - 1]] > counts[s]) {
      order[i] = order[i - 1];
      --i;
    }
    order[i] = (uint8_t)s;
  }
  return n;
}

// Code lengths of counts[256] (len[s] = 0 where counts[s] = 0), none above
// limit (8 .. 16: any 256 symbols fit), the code complete (counts below
// 2^40, as a block's are).
// Huffman's lengths by the in-place method of Moffat and Katajainen on the
// sorted counts, then, where some exceed limit, the repair below. A single
// symbol gets length 1. A function of counts alone.
TZ_HD void prefix_code_lengths(const uint64_t* counts, uint32_t limit, uint8_t* len) {
  uint8_t order[256];
  const uint32_t n = prefix_sorted_symbols(counts, order);
  for (uint32_t s = 0; s < 256; ++s) len[s] = 0;
  if (n == 0) return;
  if (n == 1) {
    len[order[0]] = 1;
    return;
  }
  int64_t a[256];
  for (uint32_t i = 0; i < n; ++i) a[i] = (int64_t)counts[order[i]];
  // Phase 1: internal node weights, parents as indices.
  int64_t root = 0, leaf = 2;
  a[0] += a[1];
  for (int64_t next = 1; next < (int64_t)n - 1; ++next) {
    if (leaf >= (int64_t)n || a[root] < a[leaf]) {
      a[next] = a[root];
      a[root++] = next;
    } else {
      a[next] = a[leaf++];
    }
    if (leaf >= (int64_t)n || (root < next && a[root] < a[leaf])) {
      a[next] += a[root];
      a[root++] = next;
    } else {
      a[next] += a[leaf++];
    }
  }
  // Phase 2: depths of the internal nodes.
  a[n - 2] = 0;
  for (int64_t next = (int64_t)n - 3; next >= 0; --next) a[next] = a[a[next]] + 1;
  // Phase 3: depths of the leaves, a[0] the deepest.
  int64_t avail = 1, used = 0, depth = 0, next = (int64_t)n - 1;
  root = (int64_t)n - 2;
  while (avail > 0) {
    while (root >= 0 && a[root] == depth) {
      ++used;
      --root;
    }
    while (avail > used) {
      a[next--] = depth;
      --avail;
    }
    avail = 2 * used;
    ++depth;
    used = 0;
  }
  for (uint32_t i = 0; i < n; ++i) len[order[i]] = (uint8_t)(a[i] < (int64_t)limit ? a[i] : limit);
  // Codes longer than limit are cut to limit, which over-fills the code
  // (Kraft sum above 1, in units of 2^-limit); then lengthen, one bit at a
  // time, the code that costs the fewest bits per unit it frees, never
  // freeing more than the excess where a code allows it; then, while the
  // code is not full, shorten the code that gains the most bits per unit
  // it takes. Ties go to the lower count, then the lower symbol (lengthen),
  // and to the higher count, then the higher symbol (shorten).
  const int64_t full = (int64_t)1 << limit;
  int64_t units = 0;
  for (uint32_t i = 0; i < n; ++i) units += (int64_t)1 << (limit - len[order[i]]);
  while (units > full) {
    int best = -1, fallback = -1;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t s = order[i], l = len[s];
      if (l >= limit) continue;
      const int64_t freed = (int64_t)1 << (limit - l - 1);
      if (freed <= units - full) {
        // cost per unit freed: counts / freed, compared as counts << (l + 1)
        if (best < 0 || (counts[s] << (l + 1)) < (counts[best] << (len[best] + 1))) best = (int)s;
      }
      if (fallback < 0 || l > len[fallback] || (l == len[fallback] && counts[s] < counts[fallback])) fallback = (int)s;
    }
    const uint32_t s = (uint32_t)(best >= 0 ? best : fallback);
    units -= (int64_t)1 << (limit - len[s] - 1);
    ++len[s];
  }
  while (units < full) {
    int best = -1;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t s = order[i], l = len[s];
      if (l <= 1 || ((int64_t)1 << (limit - l)) > full - units) continue;
      // gain per unit taken: counts / 2^(limit - l), compared as counts << l
      if (best < 0 || (counts[s] << l) >= (counts[best] << len[best])) best = (int)s;
    }
    units += (int64_t)1 << (limit - len[best]);
    --len[best];
  }
}

// Whether len[256] is a code the decoders accept: every length <= limit
// (<= kPrefixMaxBits), and either a complete code (Kraft sum exactly 1, so
// every window of limit bits starts with a codeword) or one symbol of
// length 1.
TZ_HD bool prefix_lengths_valid(const uint8_t* len, uint32_t limit) {
  if (limit == 0 || limit > kPrefixMaxBits) return false;
  uint32_t kraft = 0, present = 0, one = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    if (!len[s]) continue;
    if (len[s] > limit) return false;
    kraft += 1u << (limit - len[s]);
    ++present;
    one = len[s];
  }
  if (present == 1) return one == 1;
  return present > 1 && kraft == (1u << limit);
}

// Canonical codes (DEFLATE's rule: shorter codes first, within a length by
// symbol), code[s] in its len[s] low bits. len must be valid.
TZ_HD void prefix_canonical_codes(const uint8_t* len, uint16_t* code) {
  uint32_t count[kPrefixMaxBits + 1] = {0}, next[kPrefixMaxBits + 1] = {0};
  for (uint32_t s = 0; s < 256; ++s)
    if (len[s]) ++count[len[s]];
  uint32_t c = 0;
  for (uint32_t d = 1; d <= kPrefixMaxBits; ++d) {
    c = (c + count[d - 1]) << 1;
    next[d] = c;
  }
  for (uint32_t s = 0; s < 256; ++s) code[s] = len[s] ? (uint16_t)next[len[s]]++ : 0;
}

// ------------------------------------------------------- description --

TZ_HD size_t prefix_desc_size(const uint8_t* len) {
  uint32_t lo = 256, hi = 0;
  for (uint32_t s = 0; s < 256; ++s)
    if (len[s]) {
      if (lo == 256) lo = s;
      hi = s;
    }
  return lo == 256 ? 0 : 2 + (hi - lo + 2) / 2;
}
// Writes the description (prefix_desc_size bytes) of a non-empty code.
TZ_HD size_t prefix_desc_write(const uint8_t* len, uint8_t* out) {
  const size_t size = prefix_desc_size(len);
  if (!size) return 0;
  uint32_t lo = 0, hi = 255;
  while (!len[lo]) ++lo;
  while (!len[hi]) --hi;
  out[0] = (uint8_t)lo;
  out[1] = (uint8_t)hi;
  for (size_t i = 2; i < size; ++i) out[i] = 0;
  for (uint32_t s = lo; s <= hi; ++s) out[2 + (s - lo) / 2] |= (uint8_t)(len[s] << (4 * ((s - lo) & 1)));
  return size;
}
// Reads a description from in[0..size) into len[256]; returns the bytes it
// took, or 0 when they are not a valid code of at most limit bits (range
// reversed, a length above limit, not complete, a nibble past hi set).
TZ_HD size_t prefix_desc_read(const uint8_t* in, size_t size, uint32_t limit, uint8_t* len) {
  for (uint32_t s = 0; s < 256; ++s) len[s] = 0;
  if (size < 2 || in[0] > in[1]) return 0;
  const uint32_t lo = in[0], hi = in[1];
  const size_t need = 2 + (hi - lo + 2) / 2;
  if (size < need) return 0;
  for (uint32_t s = lo; s <= hi; ++s) len[s] = (uint8_t)((in[2 + (s - lo) / 2] >> (4 * ((s - lo) & 1))) & 15);
  if (((hi - lo) & 1) == 0 && (in[need - 1] >> 4) != 0) return 0;  // the unused nibble is zero
  return prefix_lengths_valid(len, limit) && len[lo] && len[hi] ? need : 0;
}

// ------------------------------------------------------------ tables --

// single[2^limit]: the codeword at the top of a limit-bit window, as
// symbol | length << 8. A one-symbol code fills every entry (its decoder
// takes one bit a symbol, whatever the bit).
TZ_HD void prefix_build_single(const uint8_t* len, const uint16_t* code, uint32_t limit, uint16_t* single) {
  uint32_t present = 0, last = 0;
  for (uint32_t s = 0; s < 256; ++s)
    if (len[s]) ++present, last = s;
  if (present == 1) {
    for (uint32_t i = 0; i < (1u << limit); ++i) single[i] = (uint16_t)(last | 1u << 8);
    return;
  }
  for (uint32_t s = 0; s < 256; ++s) {
    if (!len[s]) continue;
    const uint32_t lo = (uint32_t)code[s] << (limit - len[s]), n = 1u << (limit - len[s]);
    for (uint32_t i = 0; i < n; ++i) single[lo + i] = (uint16_t)(s | (uint32_t)len[s] << 8);
  }
}
// multi[2^limit]: every whole codeword of the window, in order, at most
// kPrefixLookupSyms: symbols in bytes 0..5, the bits they take in byte 6,
// their number (>= 1) in byte 7.
TZ_HD void prefix_build_multi(const uint16_t* single, uint32_t limit, uint64_t* multi) {
  const uint32_t mask = (1u << limit) - 1;
  for (uint32_t idx = 0; idx <= mask; ++idx) {
    uint64_t e = 0;
    uint32_t pos = 0, k = 0;
    while (k < kPrefixLookupSyms) {
      const uint16_t sl = single[(idx << pos) & mask];
      if (pos + (sl >> 8) > limit) break;
      e |= (uint64_t)(sl & 0xFF) << (8 * k);
      pos += sl >> 8;
      ++k;
    }
    multi[idx] = e | (uint64_t)pos << 48 | (uint64_t)k << 56;
  }
}

// ----------------------------------------------------------- streams --

// The n symbols as one MSB-first bit stream (the last byte zero-padded),
// cut into nseg segments of ceil(n / nseg) symbols (the last shorter):
// seg_end[k] is the bit offset where segment k ends (nseg entries; a
// decoder of segment k starts at seg_end[k - 1], or 0). Returns the bytes
// written, or 0 when they would exceed cap. len/code valid, every symbol
// present in them.
TZ_HD size_t prefix_encode(const uint8_t* sym, uint32_t n, const uint8_t* len, const uint16_t* code, uint32_t nseg,
                           uint64_t* seg_end, uint8_t* out, size_t cap) {
  const uint32_t per = (n + nseg - 1) / nseg;
  uint64_t acc = 0, bits = 0;
  uint32_t pending = 0;  // bits in acc not yet written
  size_t o = 0;
  for (uint32_t k = 0; k < nseg; ++k) {
    const uint32_t a = k * per < n ? k * per : n, b = a + per < n ? a + per : n;
    for (uint32_t i = a; i < b; ++i) {
      acc = acc << len[sym[i]] | code[sym[i]];
      pending += len[sym[i]];
      bits += len[sym[i]];
      while (pending >= 8) {
        if (o >= cap) return 0;
        out[o++] = (uint8_t)(acc >> (pending - 8));
        pending -= 8;
      }
    }
    seg_end[k] = bits;
  }
  if (pending) {
    if (o >= cap) return 0;
    out[o++] = (uint8_t)(acc << (8 - pending));
  }
  return o;
}

// Decodes count symbols from bits [bit_begin, bit_end) of in[0..size) with
// a single table of limit bits. Returns 0 when the symbols took exactly
// those bits, 1 otherwise (a codeword crossing bit_end, bits left over).
// Never reads outside in[0..size) (bit_end <= 8 * size is checked).
TZ_HD int prefix_decode(const uint8_t* in, size_t size, uint64_t bit_begin, uint64_t bit_end, uint32_t count,
                        const uint16_t* single, uint32_t limit, uint8_t* out) {
  if (bit_begin > bit_end || bit_end > 8 * (uint64_t)size) return 1;
  uint64_t pos = bit_begin;
  for (uint32_t i = 0; i < count; ++i) {
    // The limit bits at pos (zeros past the end of in).
    uint32_t w = 0;
    const uint64_t byte = pos >> 3;
    for (uint32_t j = 0; j < 3; ++j) w = w << 8 | (byte + j < size ? in[byte + j] : 0u);
    const uint32_t window = (w >> (24 - limit - (uint32_t)(pos & 7))) & ((1u << limit) - 1);
    const uint16_t sl = single[window];
    out[i] = (uint8_t)sl;
    pos += sl >> 8;
    if (pos > bit_end) return 1;
  }
  return pos == bit_end ? 0 : 1;
}

}  // namespace tz
