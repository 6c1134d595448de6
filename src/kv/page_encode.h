// KV-cache page codec, encoding side (doc/kv.md): the fixed-mode codes and
// planes, escapes, stream placement and kv_encode_page_with. Included by
// kv/page.h; the page header, bound and checksum are in kv_page_format.h.
#pragma once
#include "kv/page_format.h"

namespace tz::kv {

// Size of the fixed-mode page of n elements with n_esc escapes.
TZ_HD size_t kv_fixed_page_size(uint32_t bits, int K, uint32_t n, size_t n_esc) {
  return kPageHeaderSize + 4 * (size_t)bits * ((n + kGroup - 1) / kGroup) + (size_t)(K - 1) * align4(n) + n_esc;
}

// Bit planes of one group of up to 32 codes: plane b holds bit b of code j at bit j.
TZ_HD void kv_fixed_planes(const uint8_t* code, uint32_t here, uint32_t bits, uint32_t* plane) {
  for (uint32_t b = 0; b < bits; ++b) plane[b] = 0;
  for (uint32_t j = 0; j < here; ++j)
    for (uint32_t b = 0; b < bits; ++b) plane[b] |= ((uint32_t)(code[j] >> b) & 1u) << j;
}

// Whether stream k of a rANS page may be coded, and its escapes: copies the
// symbols the table lacks to lit (in element order) and returns their count,
// or -1 when a symbol is not codable (the table has no escape).
TZ_HD int64_t kv_collect_escapes(const KvCodecTables& c, int k, const uint8_t* s, uint32_t n, uint8_t* lit) {
  const KvStreamTable& st = c.t.st[k];
  size_t L = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (c.direct[k][s[i]]) continue;
    if (!st.has_escape) return -1;
    lit[L++] = s[i];
  }
  return (int64_t)L;
}

// Places one stream of a rANS page: r = coded payload size already written
// at dst + pos (0: store raw from s). Writes the stream word at dst + wpos
// when the stream has a table. Returns the new pos.
TZ_HD size_t kv_place_stream(const KvStreamTable& st, const uint8_t* s, uint32_t n, size_t r, uint8_t* dst,
                             size_t pos, size_t* wpos) {
  if (st.kind == kKindRans) {
    store_le32(dst + *wpos, r ? stream_word((uint32_t)r, kModeRans) : stream_word(n, kModeRaw));
    *wpos += 4;
  }
  if (!r) {
    memcpy(dst + pos, s, n);
    r = n;
  }
  for (size_t i = r; i < align4(r); ++i) dst[pos + i] = 0;
  return pos + align4(r);
}

// The coder's acceptance rule for a stream with L escapes and a payload of r
// bytes (0 = did not fit the limit n - L).
TZ_HD size_t kv_accept_coded(size_t r, size_t L, uint32_t n) { return (r && align4(r) + L < n) ? r : 0; }

// Fixed-mode codes of stream 0: codes[i] = fixed_code[s[i]]; returns the
// number of escapes.
TZ_HD size_t kv_fixed_codes(const KvCodecTables& c, const uint8_t* s, uint32_t n, uint8_t* codes) {
  const uint32_t esc = fixed_escape_code(c.t.fixed_bits);
  size_t n_esc = 0;
  for (uint32_t i = 0; i < n; ++i) {
    codes[i] = c.fixed_code[s[i]];
    n_esc += codes[i] == esc;
  }
  return n_esc;
}

// The bit planes of groups g0.. (4 * bits bytes each, group after group) at
// planes + 4 * bits * g0; the stream-0 bytes of their escaped elements, in
// order, at lit. (g0 > 0: the tail after a SIMD coder's full groups.)
TZ_HD void kv_fixed_planes_from(const KvCodecTables& c, const uint8_t* codes, const uint8_t* s0, uint32_t n,
                                uint32_t g0, uint8_t* planes, uint8_t* lit) {
  const uint32_t bits = c.t.fixed_bits, esc = fixed_escape_code(bits);
  for (uint32_t g = g0; g * kGroup < n; ++g) {
    uint32_t plane[kMaxFixedBits];
    const uint32_t here = n - g * kGroup < kGroup ? n - g * kGroup : kGroup;
    kv_fixed_planes(codes + g * kGroup, here, bits, plane);
    for (uint32_t b = 0; b < bits; ++b) store_le32(planes + 4 * ((size_t)g * bits + b), plane[b]);
  }
  for (uint32_t i = g0 * kGroup; i < n; ++i)
    if (codes[i] == esc) *lit++ = s0[i];
}

// Whether none of the count bytes at p has a fixed-mode code (what every
// literal of a fixed page must be).
TZ_HD bool kv_all_uncoded(const KvCodecTables& c, const uint8_t* p, size_t count) {
  const uint32_t esc = fixed_escape_code(c.t.fixed_bits);
  for (size_t i = 0; i < count; ++i)
    if (c.fixed_code[p[i]] != esc) return false;
  return true;
}

// The reference coder of kv_encode_page_with: the portable pieces. A SIMD
// coder supplies the same five operations with the same results.
struct KvScalarCoder {
  const KvCodecTables* c;
  TZ_HD void split(const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    split_fields(c->t.dtype, src, n, streams);
  }
  // kv_collect_escapes
  TZ_HD int64_t escapes(int k, const uint8_t* s, uint32_t n, uint8_t* lit) const {
    return kv_collect_escapes(*c, k, s, n, lit);
  }
  // rans_encode with the escape-mapped table of stream k
  TZ_HD size_t rans(int k, const uint8_t* s, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return rans_encode(s, n, c->enc[k], words, out, limit);
  }
  // kv_fixed_codes
  TZ_HD size_t fixed_codes(const uint8_t* s, uint32_t n, uint8_t* codes) const { return kv_fixed_codes(*c, s, n, codes); }
  // kv_fixed_planes_from group 0.
  TZ_HD void fixed_planes(const uint8_t* codes, const uint8_t* s0, uint32_t n, uint8_t* planes, uint8_t* lit) const {
    kv_fixed_planes_from(*c, codes, s0, n, 0, planes, lit);
  }
};

// Encoder of one page: n elements of t.dtype at src. dst holds
// kv_page_bound(n) bytes, scratch kv_page_scratch_size(n). Returns the page
// size; the checksum field is left 0 (kv_seal_page fills it).
//
// Encoder rule (normative for byte-identical encoders, doc/kv.md 4):
//   rANS: a coded stream with L escaped symbols is stored coded when its
//   payload of R bytes satisfies align4(R) + L < n, else raw; fixed: codes as
//   calibrated; then the page is stored verbatim unless the coded page is
//   smaller than kPageHeaderSize + n * elem_size.
template <class Coder>
TZ_HD size_t kv_encode_page_with(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch,
                                 uint8_t* dst, const Coder& coder) {
  const KvTables& t = c.t;
  const int K = t.n_streams;
  const size_t stored = kPageHeaderSize + (size_t)n * dtype_elem_size(t.dtype);
  uint8_t* streams[kMaxStreams] = {};
  for (int k = 0; k < K; ++k) streams[k] = scratch + (size_t)k * align4(n);
  uint8_t* lit = scratch + 2 * align4(n);
  uint16_t* words = (uint16_t*)(scratch + 3 * align4(n) + 64);  // 64 bytes of slack below for SIMD stores
  size_t pos = kPageHeaderSize;
  uint8_t mode = kPageStored;
  if (t.mode == kModeFixedTables) {
    const size_t planes = 4 * (size_t)t.fixed_bits * ((n + kGroup - 1) / kGroup);
    const size_t raw_end = pos + planes + (size_t)(K - 1) * align4(n);  // where the literals go
    // A coder may place the planes and the raw streams in one pass over src
    // (fixed_page): same bytes; it writes dst before the page's size is known,
    // so only where they fit kv_page_bound, and a stored page then overwrites them.
    // It may use the scratch below lit (2 * align4(n) bytes) and writes the
    // escaped bytes to lit.
    if constexpr (requires { coder.fixed_page(src, n, scratch, dst, dst, lit); }) {
      if (raw_end <= kv_page_bound(n, t.dtype)) {
        const size_t n_esc = coder.fixed_page(src, n, scratch, dst + pos, dst + pos + planes, lit);
        if (kv_fixed_page_size(t.fixed_bits, K, n, n_esc) < stored) {
          memcpy(dst + raw_end, lit, n_esc);
          kv_write_page_header(dst, kPageFixed, t.id, n);
          return raw_end + n_esc;
        }
        kv_write_page_header(dst, kPageStored, t.id, n);
        memcpy(dst + kPageHeaderSize, src, stored - kPageHeaderSize);
        return stored;
      }
    }
    coder.split(src, n, streams);
    const size_t n_esc = coder.fixed_codes(streams[0], n, lit);
    if (kv_fixed_page_size(t.fixed_bits, K, n, n_esc) < stored) {
      mode = kPageFixed;
      coder.fixed_planes(lit, streams[0], n, dst + pos, dst + raw_end);
      pos += planes;
      for (int k = 1; k < K; ++k) {
        memcpy(dst + pos, streams[k], n);
        for (size_t i = n; i < align4(n); ++i) dst[pos + i] = 0;
        pos += align4(n);
      }
      pos += n_esc;
    }
  } else {
    coder.split(src, n, streams);
    size_t wpos = kPageHeaderSize, nlit = 0;
    for (int k = 0; k < K; ++k) pos += t.st[k].kind == kKindRans ? 4 : 0;
    for (int k = 0; k < K; ++k) {
      size_t r = 0;
      if (t.st[k].kind == kKindRans) {
        const int64_t L = coder.escapes(k, streams[k], n, lit + nlit);
        if (L >= 0 && (size_t)L + kRansStateBytes < n) {
          r = kv_accept_coded(coder.rans(k, streams[k], n, words, dst + pos, n - (size_t)L), (size_t)L, n);
          if (r) nlit += (size_t)L;
        }
      }
      pos = kv_place_stream(t.st[k], streams[k], n, r, dst, pos, &wpos);
    }
    memcpy(dst + pos, lit, nlit);
    pos += nlit;
    if (pos < stored) mode = kPageRans;
  }
  kv_write_page_header(dst, mode, t.id, n);
  if (mode != kPageStored) return pos;
  memcpy(dst + kPageHeaderSize, src, stored - kPageHeaderSize);
  return stored;
}

TZ_HD_NOINLINE size_t kv_encode_page(const KvCodecTables& c, const uint8_t* src, uint32_t n, uint8_t* scratch,
                                     uint8_t* dst) {
  return kv_encode_page_with(c, src, n, scratch, dst, KvScalarCoder{&c});
}

// Fills the checksum field when the tables ask for one.
template <class PageSum>
TZ_HD void kv_seal_page(const KvTables& t, uint8_t* page, size_t size, const PageSum& sum) {
  store_le32(page + 12, (t.flags & kFlagChecksum) ? sum(page, size) : 0u);
}

}  // namespace tz::kv
