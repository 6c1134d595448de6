// KV-cache page codec, decoding side (doc/kv.md 5): the page view that
// validates a page against its tables, escape counts, payload decoding and
// kv_decode_page_with. Included by kv/page.h.
#pragma once
#include "kv/page_format.h"

namespace tz::kv {

// Where the parts of a page are, validated against its tables (everything a
// decoder checks before touching payload bytes; doc/kv.md 5).
struct KvPageView {
  KvPageHeader h;
  const uint8_t* payload[kMaxKvStreams];  // rANS / raw payload of each stream; fixed: [0] = planes
  uint32_t size[kMaxKvStreams];
  uint8_t smode[kMaxKvStreams];           // kModeRaw / kModeRans per stream
  const uint8_t* lit;                     // literals
  size_t n_lit;                           // rANS: literal bytes present; fixed: escapes counted from the planes
};

// On the host the page view is inlined into each kernel set's decoder, so that
// it is compiled with that set's instructions (popcnt for the escape count: an
// out-of-line copy is the baseline one, whichever file the linker keeps);
// CUDA: as TZ_HD_NOINLINE.
#if defined(__CUDACC__)
#define TZ_KV_VIEW_FN TZ_HD_NOINLINE
#else
#define TZ_KV_VIEW_FN inline __attribute__((always_inline))
#endif

// Escapes (codes with every bit set) of `groups` whole groups of bit planes
// at q: the popcount of the AND of each group's planes.
template <uint32_t Bits>
TZ_KV_VIEW_FN size_t kv_fixed_escapes_t(const uint8_t* q, uint32_t groups) {
  size_t n = 0;
  for (uint32_t g = 0; g < groups; ++g, q += 4 * Bits) {
    uint32_t all = load_le32(q);
    for (uint32_t b = 1; b < Bits; ++b) all &= load_le32(q + 4 * b);
    n += popc32(all);
  }
  return n;
}

// kv_fixed_escapes for any width: the widths calibration picks on real KV
// (about 3 bits) and SplitZip's 4 get loops of their own. A SIMD decoder
// calls it from a function of its own file (SimdDecoder::fixed_escapes,
// kernel_set.inc), so that it is compiled with popcnt; the portable
// decoder and the CUDA kernels call it through the page view's default.
TZ_KV_VIEW_FN size_t kv_fixed_escapes_any(const uint8_t* q, uint32_t groups, uint32_t bits) {
  if (bits == 3) return kv_fixed_escapes_t<3>(q, groups);
  if (bits == 4) return kv_fixed_escapes_t<4>(q, groups);
  size_t n = 0;
  for (uint32_t g = 0; g < groups; ++g, q += 4 * (size_t)bits) {
    uint32_t all = load_le32(q);
    for (uint32_t b = 1; b < bits; ++b) all &= load_le32(q + 4 * b);
    n += popc32(all);
  }
  return n;
}

// The page view's default count: out of line on the host, so that the
// decoders the view is inlined into (the portable one) keep their size.
#if defined(__CUDACC__)
TZ_HD_NOINLINE size_t kv_fixed_escapes(const uint8_t* q, uint32_t groups, uint32_t bits) {
#else
__attribute__((noinline)) inline size_t kv_fixed_escapes(const uint8_t* q, uint32_t groups, uint32_t bits) {
#endif
  return kv_fixed_escapes_any(q, groups, bits);
}

struct KvFixedEscapes {  // the page view's escape count (a decoder may pass its own, same results)
  TZ_HD size_t operator()(const uint8_t* q, uint32_t groups, uint32_t bits) const {
    return kv_fixed_escapes(q, groups, bits);
  }
};

TZ_HD bool kv_zero(const uint8_t* p, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (p[i]) return false;
  return true;
}

// Binds stream k of the page view to the sz bytes at p + pos (padded with
// zeros to 4 bytes, which are checked) and moves pos past them; false when
// the page is too short or the padding is not zero.
TZ_HD bool kv_take_stream(const uint8_t* p, size_t size, size_t* pos, int k, uint32_t sz, uint8_t mode,
                          KvPageView* v) {
  if (size - *pos < align4(sz) || !kv_zero(p + *pos, sz, align4(sz))) return false;
  v->payload[k] = p + *pos;
  v->size[k] = sz;
  v->smode[k] = mode;
  *pos += align4(sz);
  return true;
}

// Header, tables binding and layout. The checksum is checked by the caller
// (kv_check_page) so that a SIMD or GPU CRC can be used.
// count(q, groups, bits): the escapes of whole groups (kv_fixed_escapes).
template <class EscapeCount = KvFixedEscapes>
TZ_KV_VIEW_FN int kv_view_page(const KvCodecTables& c, const uint8_t* p, size_t size, KvPageView* v,
                               const EscapeCount& count = EscapeCount{}) {
  const KvTables& t = c.t;
  int st = kv_parse_page_header(p, size, &v->h);
  if (st != kOk) return st;
  if (v->h.table_id != t.id) return kErrBadParam;  // encoded with other tables
  if (!(t.flags & kFlagChecksum) && v->h.checksum != 0) return kErrCorruptHeader;
  const uint32_t n = v->h.n_elems;
  const int K = t.n_streams;
  const size_t es = dtype_elem_size(t.dtype);
  v->lit = p + size;
  v->n_lit = 0;
  if (v->h.mode == kPageStored) {
    if (size != kPageHeaderSize + (size_t)n * es) return kErrCorruptBlock;
    return kOk;
  }
  if ((v->h.mode == kPageFixed) != (t.mode == kModeFixedTables)) return kErrCorruptHeader;
  size_t pos = kPageHeaderSize;
  if (v->h.mode == kPageFixed) {
    const uint32_t bits = t.fixed_bits;
    const uint32_t n_groups = (n + kGroup - 1) / kGroup;
    const size_t planes = 4 * (size_t)bits * n_groups;
    if (size - pos < planes) return kErrCorruptBlock;
    v->payload[0] = p + pos;
    v->size[0] = (uint32_t)planes;
    v->smode[0] = kModeRaw;
    // Count escapes (codes with every bit set); bits of elements past n must be 0.
    size_t n_esc = count(p + pos, n / kGroup, bits);
    if (n % kGroup) {
      const uint8_t* q = p + pos + 4 * (size_t)bits * (n_groups - 1);
      const uint32_t valid = (1u << (n % kGroup)) - 1u;
      uint32_t all = ~0u;
      for (uint32_t b = 0; b < bits; ++b) {
        const uint32_t w = load_le32(q + 4 * b);
        if (w & ~valid) return kErrCorruptBlock;
        all &= w;
      }
      n_esc += popc32(all);
    }
    pos += planes;
    for (int k = 1; k < K; ++k)
      if (!kv_take_stream(p, size, &pos, k, n, kModeRaw, v)) return kErrCorruptBlock;
    if (size - pos != n_esc) return kErrCorruptBlock;
    v->lit = p + pos;
    v->n_lit = n_esc;
    return kOk;
  }
  size_t wpos = pos;
  for (int k = 0; k < K; ++k) pos += t.st[k].kind == kKindRans ? 4 : 0;
  if (size < pos) return kErrCorruptBlock;
  for (int k = 0; k < K; ++k) {
    uint32_t sz = n;
    uint8_t m = kModeRaw;
    if (t.st[k].kind == kKindRans) {
      const uint32_t w = load_le32(p + wpos);
      wpos += 4;
      sz = stream_word_size(w);
      m = stream_word_mode(w);
      if (m == kModeRaw) {
        if (sz != n) return kErrCorruptBlock;
      } else if (m == kModeRans) {
        if (sz < kRansStateBytes || (sz & 1u) || align4(sz) >= n) return kErrCorruptBlock;
      } else {
        return kErrCorruptBlock;
      }
    }
    if (!kv_take_stream(p, size, &pos, k, sz, m, v)) return kErrCorruptBlock;
  }
  v->lit = p + pos;
  v->n_lit = size - pos;
  return kOk;
}

template <class PageSum>
TZ_HD int kv_check_page(const KvCodecTables& c, const uint8_t* p, size_t size, const KvPageView& v, const PageSum& sum) {
  if (!(c.t.flags & kFlagChecksum)) return kOk;
  return sum(p, size) == v.h.checksum ? kOk : kErrChecksum;
}

// Replaces the escapes of decoded stream k (n symbols in s) by the literals
// from *lp on, advancing *lp. Each literal must be a symbol that is not coded
// directly (the encoder never escapes one that is): anything else, or too
// few literals, is corruption.
TZ_HD int kv_patch_escapes(const KvCodecTables& c, int k, uint8_t* s, uint32_t n, const uint8_t* lit, size_t n_lit,
                           size_t* lp) {
  const KvStreamTable& st = c.t.st[k];
  if (!st.has_escape) return kOk;
  size_t j = *lp;
  for (uint32_t i = 0; i < n; ++i) {
    if (s[i] != st.escape) continue;
    if (j >= n_lit) return kErrCorruptBlock;
    const uint8_t v = lit[j++];
    if (c.direct[k][v]) return kErrCorruptBlock;
    s[i] = v;
  }
  *lp = j;
  return kOk;
}

// Fixed mode: stream 0 symbols from the bit planes and literals (whose count
// kv_view_page has checked). A literal must be a symbol without a code.
// kv_fixed_decode_from starts at group g0 with literal j (SIMD tails).
TZ_HD int kv_fixed_decode_from(const KvCodecTables& c, const uint8_t* planes, uint32_t n, uint32_t g0,
                               const uint8_t* lit, size_t j, uint8_t* out) {
  const uint32_t bits = c.t.fixed_bits, esc = fixed_escape_code(bits);
  for (uint32_t g = g0; g * kGroup < n; ++g) {
    uint32_t w[kMaxFixedBits];
    for (uint32_t b = 0; b < bits; ++b) w[b] = load_le32(planes + 4 * ((size_t)g * bits + b));
    const uint32_t here = n - g * kGroup < kGroup ? n - g * kGroup : kGroup;
    for (uint32_t i = 0; i < here; ++i) {
      uint32_t code = 0;
      for (uint32_t b = 0; b < bits; ++b) code |= ((w[b] >> i) & 1u) << b;
      uint8_t v = c.t.fixed_sym[code < esc ? code : 0];
      if (code == esc) {
        v = lit[j++];
        if (c.fixed_code[v] != esc) return kErrCorruptBlock;
      }
      out[g * kGroup + i] = v;
    }
  }
  return kOk;
}

TZ_HD int kv_fixed_decode(const KvCodecTables& c, const uint8_t* planes, uint32_t n, const uint8_t* lit, uint8_t* out) {
  return kv_fixed_decode_from(c, planes, n, 0, lit, 0, out);
}

// Escapes of every coded stream patched (stream order), all literals used,
// then the streams merged into dst: the last step of a rANS page.
TZ_HD int kv_finish_rans(const KvCodecTables& c, uint8_t* const* coded, const uint8_t* const* streams, uint32_t n,
                         const uint8_t* lit, size_t n_lit, uint8_t* dst) {
  size_t lp = 0;
  for (int k = 0; k < c.t.n_streams; ++k) {
    if (!coded[k]) continue;
    const int st = kv_patch_escapes(c, k, coded[k], n, lit, n_lit, &lp);
    if (st != kOk) return st;
  }
  if (lp != n_lit) return kErrCorruptBlock;
  merge_fields(c.t.dtype, streams, n, dst);
  return kOk;
}

// The reference pieces of kv_decode_page_with; SIMD decoders supply the same
// operations with the same results and statuses.
struct KvScalarDecoder {
  const KvCodecTables* c;
  // Stream k's symbols from its rANS payload (escapes not yet patched).
  TZ_HD int rans(int k, const uint8_t* in, size_t size, uint32_t n, uint8_t* out) const {
    return rans_decode(in, size, n, c->dec[k], out);
  }
  // kv_finish_rans. coded[k]: stream k's decoded symbols (null where raw);
  // streams[k]: what to merge (coded[k] or the raw payload).
  TZ_HD int finish(uint8_t* const* coded, const uint8_t* const* streams, uint32_t n, const uint8_t* lit,
                   size_t n_lit, uint8_t* dst) const {
    return kv_finish_rans(*c, coded, streams, n, lit, n_lit, dst);
  }
  // Fixed mode: stream 0 from planes and literals (into scratch), merged with
  // the raw streams[1..] into dst.
  // (n_lit: the number of literals, as kv_view_page counted them.)
  TZ_HD int fixed(const uint8_t* planes, uint32_t n, const uint8_t* lit, size_t n_lit, const uint8_t** streams,
                  uint8_t* scratch, uint8_t* dst) const {
    (void)n_lit;  // (kv_fixed_decode takes the literals in order; kv_view_page counted them)
    const int st = kv_fixed_decode(*c, planes, n, lit, scratch);
    if (st != kOk) return st;
    streams[0] = scratch;
    merge_fields(c->t.dtype, streams, n, dst);
    return kOk;
  }
};

// The payload of a page whose view kv_view_page accepted, decoded into dst.
template <class Decoder>
TZ_HD int kv_decode_payload(const KvCodecTables& c, const uint8_t* p, const KvPageView& v, uint8_t* dst,
                            uint8_t* scratch, const Decoder& d) {
  int st = kOk;
  const KvTables& t = c.t;
  const uint32_t n = v.h.n_elems;
  const int K = t.n_streams;
  if (v.h.mode == kPageStored) {
    memcpy(dst, p + kPageHeaderSize, (size_t)n * dtype_elem_size(t.dtype));
    return kOk;
  }
  const uint8_t* streams[kMaxStreams] = {};
  for (int k = 1; k < K; ++k) streams[k] = v.payload[k];
  if (v.h.mode == kPageFixed) return d.fixed(v.payload[0], n, v.lit, v.n_lit, streams, scratch, dst);
  // A decoder may fuse the common rANS page (stream 0 coded, stream 1 raw) into
  // one pass: decode, merge, patch (same result and status as the steps below).
  if constexpr (requires { d.rans_merge(p, v.n_lit, n, p, p, v.n_lit, scratch, dst); }) {
    if (K == 2 && v.smode[0] == kModeRans && v.smode[1] == kModeRaw)
      return d.rans_merge(v.payload[0], v.size[0], n, v.payload[1], v.lit, v.n_lit, scratch, dst);
  }
  uint8_t* coded[kMaxStreams] = {};
  for (int k = 0; k < K; ++k) {
    streams[k] = v.payload[k];
    if (v.smode[k] == kModeRaw) continue;
    coded[k] = scratch + (size_t)k * align4(n);
    st = d.rans(k, v.payload[k], v.size[k], n, coded[k]);
    if (st != kOk) return st;
    streams[k] = coded[k];
  }
  return d.finish(coded, streams, n, v.lit, v.n_lit, dst);
}

// A decoder that declares kChecksumAfterPayload = true has the checksum
// verified after the payload is decoded rather than before (see below).
template <class Decoder>
TZ_HD constexpr bool kv_checksum_after_payload() {
  if constexpr (requires { Decoder::kChecksumAfterPayload; })
    return Decoder::kChecksumAfterPayload;
  else
    return false;
}

// Decoder of one page: its elements into dst (n_elems * elem_size bytes;
// the caller checked dst capacity against the header), with the checksum
// verified through sum (KvRefPageSum or an equal one). scratch:
// kv_page_scratch_size(n). Returns kOk or the first failed check of
// doc/kv.md 5; dst may then hold partial output.
// Checksum after the payload (a CPU decoder's choice): the payload decoder
// then reads the page from memory at its own pace, the loads overlapped
// with its work, and the CRC runs over bytes already in the caches (the
// CRC first would wait for memory alone). The status is the same: a
// checksum mismatch is reported whatever the payload decoding returned
// (the payload decoders are safe on any page the layout checks accept,
// doc/kv.md 5), else the payload's status.
template <class PageSum, class Decoder>
TZ_HD int kv_decode_page_with(const KvCodecTables& c, const uint8_t* p, size_t size, uint8_t* dst, uint8_t* scratch,
                              const PageSum& crc, const Decoder& d) {
  KvPageView v;
  int st = kOk;
  if constexpr (requires { d.fixed_escapes(p, 0u, 0u); })
    st = kv_view_page(c, p, size, &v, [&](const uint8_t* q, uint32_t g, uint32_t b) { return d.fixed_escapes(q, g, b); });
  else
    st = kv_view_page(c, p, size, &v);
  if (st != kOk) return st;
  if constexpr (kv_checksum_after_payload<Decoder>()) {
    st = kv_decode_payload(c, p, v, dst, scratch, d);
    const int sum = kv_check_page(c, p, size, v, crc);
    return sum != kOk ? sum : st;
  } else {
    st = kv_check_page(c, p, size, v, crc);
    if (st != kOk) return st;
    return kv_decode_payload(c, p, v, dst, scratch, d);
  }
}

template <class PageSum>
TZ_HD_NOINLINE int kv_decode_page(const KvCodecTables& c, const uint8_t* p, size_t size, uint8_t* dst,
                                  uint8_t* scratch, const PageSum& crc) {
  return kv_decode_page_with(c, p, size, dst, scratch, crc, KvScalarDecoder{&c});
}

}  // namespace tz::kv
