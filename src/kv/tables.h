// KV-cache page codec tables (doc/kv.md section 2, normative): the calibrated
// tables of one codec as parsed from their blob ("TZKT"), their
// serialisation and checks, and the forms derived from them for the page
// functions (kv_page.h). TZ_HD: the same code on the CPU and in GPU kernels.
#pragma once
#include "codec/checksum.h"
#include "codec/fields.h"
#include "codec/rans.h"

namespace tz::kv {

// ------------------------------------------------------------ constants --
constexpr uint8_t kTablesVersion = 1;
constexpr uint8_t kPageVersion = 1;
constexpr size_t kTablesFixedSize = 28;  // magic .. row_dims
constexpr size_t kPageHeaderSize = 16;
constexpr uint32_t kMaxPageElems = 1u << 26;
constexpr int kMaxRowDims = 4;
constexpr int kMaxKvStreams = 2;       // the KV dtypes split into at most 2 streams
constexpr uint32_t kGroup = 32;        // fixed mode: elements per bit-plane group
constexpr uint32_t kMaxFixedBits = 7;
constexpr size_t kMaxTablesSize = kTablesFixedSize + kMaxKvStreams * (3 + kFreqTableMaxBytes) + 4;

enum TablesMode : uint8_t { kModeRansTables = 1, kModeFixedTables = 2 };
enum PageMode : uint8_t { kPageStored = 0, kPageRans = 1, kPageFixed = 2 };
enum TablesFlags : uint8_t { kFlagChecksum = 1 };

TZ_HD uint8_t tables_magic(int i) { return (uint8_t)"TZKT"[i]; }

TZ_HD bool kv_dtype_ok(uint8_t dt) { return dt == kBF16 || dt == kF16 || dt == kF8E4M3 || dt == kF8E5M2; }

// ------------------------------------------------------------ tables --
struct KvStreamTable {
  uint8_t kind;        // kKindRaw or kKindRans
  uint8_t has_escape;  // 1: `escape` stands for every symbol the sample lacked
  uint8_t escape;
  uint32_t freq[256];  // kind rANS: sums to kProbScale
};

// Parsed table blob (doc/kv.md section 2).
struct KvTables {
  uint8_t dtype;
  uint8_t mode;   // TablesMode
  uint8_t flags;  // TablesFlags
  uint8_t n_streams;
  uint8_t n_row_dims;
  uint32_t row_dims[kMaxRowDims];
  uint32_t id;  // CRC32C of the blob: every page names the tables it needs
  KvStreamTable st[kMaxKvStreams];
  uint8_t fixed_bits;       // fixed mode
  uint8_t fixed_sym[128];   // code -> symbol, codes 0 .. 2^bits - 2
};

// Everything the page functions read: the parsed tables and what is derived
// from them. Plain data, so it can be copied to a GPU as is.
struct KvCodecTables {
  KvTables t;
  uint8_t direct[kMaxKvStreams][256];  // rANS: symbol coded as itself (else as the escape)
  RansEncSym enc[kMaxKvStreams][256];  // escape-mapped: enc[s] = enc[escape] where !direct[s]
  uint32_t fs[kMaxKvStreams][256];     // the same as freq | start << 13 (SIMD encoders)
  uint32_t dec[kMaxKvStreams][kProbScale];
  uint8_t fixed_code[256];             // fixed mode: symbol -> code (escape = 2^bits - 1)
  // Forms of the same tables for byte-shuffle SIMD kernels:
  uint8_t direct_bits[kMaxKvStreams][32];  // bit s%8 of byte s/8 = direct[k][s]
  uint8_t fixed_hi_n;                      // high nibbles h with a coded symbol h*16+l ...
  uint8_t fixed_hi[16];                    // ... in increasing order
  uint8_t fixed_lut[16][16];               // fixed_lut[h][l] = fixed_code[h*16+l]
};

TZ_HD uint32_t fixed_escape_code(uint32_t bits) { return (1u << bits) - 1u; }

TZ_HD size_t kv_tables_size(const KvTables& t) {
  size_t n = kTablesFixedSize + 4;
  if (t.mode == kModeFixedTables) return n + 1 + fixed_escape_code(t.fixed_bits);
  for (int k = 0; k < t.n_streams; ++k) {
    n += 1;
    if (t.st[k].kind != kKindRans) continue;
    n += 2;
    for (int s = 0; s < 256; ++s) n += t.st[k].freq[s] ? (t.st[k].freq[s] < 128 ? 1 : 2) : 0;
    n += 32;
  }
  return n;
}

// Serialises t (its id is ignored and recomputed). out holds
// kv_tables_size(t) bytes; returns that size.
TZ_HD size_t kv_write_tables(const KvTables& t, uint8_t* out, const uint32_t* crc_table) {
  for (int i = 0; i < 4; ++i) out[i] = tables_magic(i);
  out[4] = kTablesVersion;
  out[5] = t.dtype;
  out[6] = t.mode;
  out[7] = t.flags;
  out[8] = t.n_row_dims;
  out[9] = out[10] = out[11] = 0;
  for (int d = 0; d < kMaxRowDims; ++d) store_le32(out + 12 + 4 * d, d < t.n_row_dims ? t.row_dims[d] : 0u);
  size_t pos = kTablesFixedSize;
  if (t.mode == kModeFixedTables) {
    out[pos++] = t.fixed_bits;
    for (uint32_t c = 0; c < fixed_escape_code(t.fixed_bits); ++c) out[pos++] = t.fixed_sym[c];
  } else {
    for (int k = 0; k < t.n_streams; ++k) {
      out[pos++] = t.st[k].kind;
      if (t.st[k].kind != kKindRans) continue;
      out[pos++] = t.st[k].has_escape;
      out[pos++] = t.st[k].escape;
      pos += rans_write_table(t.st[k].freq, out + pos);
    }
  }
  store_le32(out + pos, crc32c(out, pos, crc_table));
  return pos + 4;
}

// Parses and validates a table blob (doc/kv.md 2.3). kOk or kErrBadMagic,
// kErrBadVersion, kErrCorruptHeader, kErrChecksum, kErrUnsupported.
TZ_HD int kv_read_tables(const uint8_t* in, size_t n, KvTables* t, const uint32_t* crc_table) {
  if (n < kTablesFixedSize + 4) return kErrSrcTruncated;
  for (int i = 0; i < 4; ++i)
    if (in[i] != tables_magic(i)) return kErrBadMagic;
  if (in[4] != kTablesVersion) return kErrBadVersion;
  if (n > kMaxTablesSize) return kErrCorruptHeader;
  const uint32_t crc = load_le32(in + n - 4);
  if (crc32c(in, n - 4, crc_table) != crc) return kErrChecksum;
  t->id = crc;
  t->dtype = in[5];
  t->mode = in[6];
  t->flags = in[7];
  t->n_row_dims = in[8];
  if (!kv_dtype_ok(t->dtype)) return kErrUnsupported;
  if (t->mode != kModeRansTables && t->mode != kModeFixedTables) return kErrCorruptHeader;
  if (t->flags & ~(uint32_t)kFlagChecksum) return kErrCorruptHeader;
  if (t->n_row_dims > kMaxRowDims || in[9] || in[10] || in[11]) return kErrCorruptHeader;
  for (int d = 0; d < kMaxRowDims; ++d) {
    t->row_dims[d] = load_le32(in + 12 + 4 * d);
    if ((d < t->n_row_dims) != (t->row_dims[d] != 0)) return kErrCorruptHeader;
  }
  t->n_streams = (uint8_t)dtype_stream_count(t->dtype);
  const size_t end = n - 4;
  size_t pos = kTablesFixedSize;
  for (int k = 0; k < kMaxKvStreams; ++k) {
    t->st[k].kind = kKindRaw;
    t->st[k].has_escape = 0;
    t->st[k].escape = 0;
    for (int s = 0; s < 256; ++s) t->st[k].freq[s] = 0;
  }
  t->fixed_bits = 0;
  for (int c = 0; c < 128; ++c) t->fixed_sym[c] = 0;
  if (t->mode == kModeFixedTables) {
    if (pos >= end) return kErrCorruptHeader;
    const uint32_t bits = in[pos++];
    if (bits < 1 || bits > kMaxFixedBits) return kErrCorruptHeader;
    const uint32_t m = fixed_escape_code(bits);
    if (end - pos != m) return kErrCorruptHeader;
    uint8_t seen[256];
    for (int s = 0; s < 256; ++s) seen[s] = 0;
    for (uint32_t c = 0; c < m; ++c) {
      const uint8_t s = in[pos + c];
      if (seen[s]) return kErrCorruptHeader;  // codes name distinct symbols
      seen[s] = 1;
      t->fixed_sym[c] = s;
    }
    t->fixed_bits = (uint8_t)bits;
    return kOk;
  }
  for (int k = 0; k < t->n_streams; ++k) {
    if (pos >= end) return kErrCorruptHeader;
    KvStreamTable& st = t->st[k];
    st.kind = in[pos++];
    if (st.kind == kKindRaw) continue;
    if (st.kind != kKindRans || end - pos < 2) return kErrCorruptHeader;
    st.has_escape = in[pos++];
    st.escape = in[pos++];
    if (st.has_escape > 1) return kErrCorruptHeader;
    const size_t used = rans_read_table(in + pos, end - pos, st.freq);
    if (!used) return kErrCorruptHeader;
    pos += used;
    if (st.has_escape) {
      if (!st.freq[st.escape]) return kErrCorruptHeader;
    } else {
      // Without an escape every symbol must be codable.
      if (st.escape) return kErrCorruptHeader;
      for (int s = 0; s < 256; ++s)
        if (!st.freq[s]) return kErrCorruptHeader;
    }
  }
  if (pos != end) return kErrCorruptHeader;
  return kOk;
}

// Fills the derived tables from c->t (already parsed or calibrated).
TZ_HD_NOINLINE void kv_derive_tables(KvCodecTables* c) {
  const KvTables& t = c->t;
  for (int k = 0; k < kMaxKvStreams; ++k) {
    const KvStreamTable& st = t.st[k];
    for (int s = 0; s < 256; ++s) c->direct[k][s] = 0;
    if (t.mode != kModeRansTables || st.kind != kKindRans) {
      for (int s = 0; s < 256; ++s) {
        c->enc[k][s] = RansEncSym{0, 0, 0};
        c->fs[k][s] = 0;
      }
      for (uint32_t j = 0; j < kProbScale; ++j) c->dec[k][j] = 0;
      continue;
    }
    rans_build_enc(st.freq, c->enc[k]);
    rans_build_dec(st.freq, c->dec[k]);
    for (int s = 0; s < 256; ++s) c->direct[k][s] = st.freq[s] != 0 && !(st.has_escape && s == st.escape);
    for (int s = 0; s < 256; ++s)
      if (!c->direct[k][s] && st.has_escape) c->enc[k][s] = c->enc[k][st.escape];
    for (int s = 0; s < 256; ++s) c->fs[k][s] = c->enc[k][s].freq | (c->enc[k][s].freq ? c->enc[k][s].start << 13 : 0u);
  }
  const uint32_t esc = t.mode == kModeFixedTables ? fixed_escape_code(t.fixed_bits) : 0u;
  for (int s = 0; s < 256; ++s) c->fixed_code[s] = (uint8_t)esc;
  if (t.mode == kModeFixedTables)
    for (uint32_t code = 0; code < esc; ++code) c->fixed_code[t.fixed_sym[code]] = (uint8_t)code;
  for (int k = 0; k < kMaxKvStreams; ++k) {
    for (int i = 0; i < 32; ++i) c->direct_bits[k][i] = 0;
    for (int s = 0; s < 256; ++s) c->direct_bits[k][s >> 3] |= (uint8_t)(c->direct[k][s] << (s & 7));
  }
  c->fixed_hi_n = 0;
  for (int h = 0; h < 16; ++h) {
    bool any = false;
    for (int l = 0; l < 16; ++l) {
      c->fixed_lut[h][l] = c->fixed_code[h * 16 + l];
      any = any || (t.mode == kModeFixedTables && c->fixed_code[h * 16 + l] != esc);
    }
    if (any) c->fixed_hi[c->fixed_hi_n++] = (uint8_t)h;
  }
  for (int h = c->fixed_hi_n; h < 16; ++h) c->fixed_hi[h] = 0;
}

}  // namespace tz::kv
