// KV-cache page codec (doc/kv.md, normative): per-page encode and decode with
// tables calibrated once and stored apart from the pages. No allocation, no
// I/O, no threads: the same functions run in a CPU thread and in a GPU warp
// (src/runtime/kv/kv_cuda.cu), and the SIMD kernels of src/runtime/kv must produce
// exactly their bytes and statuses.
//
// Two page modes share the field split of the frame format (codec/fields.h):
//   rANS   the coded streams use the calibrated static tables with the
//          32-lane coder of rans.h; a symbol the sample never showed is
//          coded as the table's escape symbol and its byte stored as a
//          literal at the end of the page;
//   fixed  stream 0 becomes a `bits`-wide code per element (code c < 2^bits-1
//          = the c-th calibrated symbol, 2^bits-1 = escape + literal), stored
//          as bit planes of 32 elements; the other streams are stored raw.
// Any page may instead be "stored" (its bytes verbatim) when coding would not
// make it smaller.
#pragma once
#include "codec/kv_tables.h"

namespace tz::kv {

// ------------------------------------------------------------ page header --
struct KvPageHeader {
  uint8_t mode;  // PageMode
  uint32_t table_id;
  uint32_t n_elems;
  uint32_t checksum;
};

TZ_HD void kv_write_page_header(uint8_t* p, uint8_t mode, uint32_t table_id, uint32_t n) {
  p[0] = 'K';
  p[1] = 'V';
  p[2] = kPageVersion;
  p[3] = mode;
  store_le32(p + 4, table_id);
  store_le32(p + 8, n);
  store_le32(p + 12, 0);
}

// Header checks that need no tables.
TZ_HD int kv_parse_page_header(const uint8_t* p, size_t size, KvPageHeader* h) {
  if (size < kPageHeaderSize) return kErrSrcTruncated;
  if (p[0] != 'K' || p[1] != 'V') return kErrBadMagic;
  if (p[2] != kPageVersion) return kErrBadVersion;
  h->mode = p[3];
  h->table_id = load_le32(p + 4);
  h->n_elems = load_le32(p + 8);
  h->checksum = load_le32(p + 12);
  if (h->mode > kPageFixed) return kErrCorruptHeader;
  if (h->n_elems == 0 || h->n_elems > kMaxPageElems) return kErrCorruptHeader;
  return kOk;
}

// Largest encoded page of n elements (every coded stream falls back to raw
// before a page grows past this; stored pages are smaller).
TZ_HD size_t kv_page_bound(uint32_t n, uint8_t dtype) {
  const int K = dtype_stream_count(dtype);
  return kPageHeaderSize + 4 * (size_t)K + (size_t)K * align4(n);
}

// Scratch bytes the page functions (and the SIMD kernels) need for n elements.
TZ_HD size_t kv_page_scratch_size(uint32_t n) { return 5 * align4(n) + 256; }

// Page checksum (doc/kv.md 3.4): CRC32C of the list (LE32 each) of the
// CRC32C of the page's 1 KiB segments (the last one shorter), the checksum
// field (bytes 12..15) read as zero. Segments give a CPU four independent
// CRC chains even on a small page, and a GPU warp one lane per segment.
constexpr size_t kKvChecksumSegment = 1024;

// crc(state, p, n) is a raw CRC32C state update (table, SSE4.2, GPU lane).
template <class Crc>
TZ_HD uint32_t kv_segment_crc(const uint8_t* p, size_t size, size_t off, const Crc& crc) {
  const size_t len = (size - off) < kKvChecksumSegment ? (size - off) : kKvChecksumSegment;
  if (off != 0) return ~crc(~0u, p + off, len);
  const uint8_t zero[4] = {0, 0, 0, 0};
  uint32_t s = crc(~0u, p, 12);
  s = crc(s, zero, 4);
  return ~crc(s, p + 16, len - 16);
}

template <class Crc>
TZ_HD uint32_t kv_page_checksum(const uint8_t* p, size_t size, const Crc& crc) {
  uint32_t acc = ~0u;
  for (size_t off = 0; off < size; off += kKvChecksumSegment) {
    uint8_t le[4];
    store_le32(le, kv_segment_crc(p, size, off, crc));
    acc = crc(acc, le, 4);
  }
  return ~acc;
}

struct KvTableCrc {  // the reference CRC (table driven; device code keeps the table in shared memory)
  const uint32_t* table;
  TZ_HD uint32_t operator()(uint32_t s, const uint8_t* p, size_t n) const { return crc32c_update(s, p, n, table); }
};

// The reference page checksum as a functor of (page, size): what
// kv_seal_page and kv_check_page take (the CPU passes a faster equal one).
struct KvRefPageSum {
  const uint32_t* table;
  TZ_HD uint32_t operator()(const uint8_t* p, size_t size) const { return kv_page_checksum(p, size, KvTableCrc{table}); }
};

// ------------------------------------------------------------ encoding --
TZ_HD uint32_t kv_popc32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)__popc(v);
#else
  return (uint32_t)__builtin_popcount(v);
#endif
}

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

// ------------------------------------------------------------ decoding --
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
    n += kv_popc32(all);
  }
  return n;
}

// kv_fixed_escapes for any width: the widths calibration picks on real KV
// (about 3 bits) and SplitZip's 4 get loops of their own. A SIMD decoder
// calls it from a function of its own file (SimdDecoder::fixed_escapes,
// kv_kernel_set.inc), so that it is compiled with popcnt; the portable
// decoder and the CUDA kernels call it through the page view's default.
TZ_KV_VIEW_FN size_t kv_fixed_escapes_any(const uint8_t* q, uint32_t groups, uint32_t bits) {
  if (bits == 3) return kv_fixed_escapes_t<3>(q, groups);
  if (bits == 4) return kv_fixed_escapes_t<4>(q, groups);
  size_t n = 0;
  for (uint32_t g = 0; g < groups; ++g, q += 4 * (size_t)bits) {
    uint32_t all = load_le32(q);
    for (uint32_t b = 1; b < bits; ++b) all &= load_le32(q + 4 * b);
    n += kv_popc32(all);
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
      n_esc += kv_popc32(all);
    }
    pos += planes;
    for (int k = 1; k < K; ++k) {
      if (size - pos < align4(n)) return kErrCorruptBlock;
      if (!kv_zero(p + pos, n, align4(n))) return kErrCorruptBlock;
      v->payload[k] = p + pos;
      v->size[k] = n;
      v->smode[k] = kModeRaw;
      pos += align4(n);
    }
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
    if (size - pos < align4(sz)) return kErrCorruptBlock;
    if (!kv_zero(p + pos, sz, align4(sz))) return kErrCorruptBlock;
    v->payload[k] = p + pos;
    v->size[k] = sz;
    v->smode[k] = m;
    pos += align4(sz);
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
