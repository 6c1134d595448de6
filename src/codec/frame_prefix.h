// The frame prefix (doc/format.md sections 3, 5.2 and 6.2): fixed header,
// table section and block index, read and written. This is the one validator
// of a frame before any block is decoded: the CPU backend (parse_prefix in
// src/cpu/frame.cpp) and the CUDA decoder (d_parse_kernel in
// src/cuda/cuda_codec.cu) both call these functions, in the order below, so
// the two backends accept the same frames and reject the others with the same
// error code. Header-only TZ_HD code: no allocation, no I/O, no threads.
//
// Order of checks (doc/format.md section 8 refers here):
//   1. check_frame_header: the 32 fixed bytes alone;
//   2. parse_frame_head: the prefix lies inside the input, the table section
//      (parse_table_section), then the header CRC;
//   3. block_index_entry_valid: every block index entry (a CPU loop, or one
//      warp lane per entry; every failure is the same defect);
//   4. check_frame_extent: the blocks end exactly where the input ends.
// Blocks are then validated by parse_block (codec/block.h).
#pragma once
#include "codec/block.h"
#include "codec/table_code.h"

namespace tz {

// What is wrong with a frame, one value per validation rule. Each maps to one
// status code (frame_defect_status) and one message (frame_defect_text).
enum FrameDefect : uint8_t {
  kDefectNone = 0,
  // 1. fixed header
  kDefectHeaderTruncated,  // fewer than 32 bytes
  kDefectBadMagic,
  kDefectBadVersion,
  kDefectDType,            // unknown dtype
  kDefectStreamCount,      // n_streams does not match the dtype
  kDefectFlags,            // a flag bit other than kFlagSeededLanes / kFlagSelfSeeded / kFlagZeroElided, or any before version 3
  kDefectBlockElems,       // not a power of two in [4096, 2^20]
  kDefectRawSize,          // not a multiple of the element size, or > 2^56
  kDefectBlockCount,       // n_blocks != ceil(elements / block_elems)
  kDefectTablesSize,       // tables_size not a multiple of 4, or too large
  // 2. prefix, table section, header CRC
  kDefectPrefixTruncated,  // the input ends inside header + tables + index
  kDefectTableMissing,     // the table section ends before a stream's entry
  kDefectStreamKind,       // kind not allowed for this dtype / format version
  kDefectContextCount,     // lane contexts n outside [2, kMaxContexts]
  kDefectTooManyTables,    // more than kMaxFrameTables frequency tables (v3: kMaxFrameTablesV3)
  kDefectTableSets,        // v3: a rANS stream with 0 or more than kMaxTableSets table sets
  kDefectBlockTables,      // v3: one set of every stream is more than kMaxFrameTables tables
  kDefectFreqTable,        // malformed frequency table (rans_read_table)
  kDefectTableTrailing,    // 4 or more bytes after the last stream's entry
  kDefectTablePadding,     // non-zero padding byte in the table section
  kDefectHeaderCrc,
  // 3. block index
  kDefectIndexEntry,       // not a multiple of 4, < block header, > block bound
  // 4. extent
  kDefectFrameTruncated,   // the input ends inside the blocks
  kDefectTrailingBytes,    // bytes after the last block
};

TZ_HD int frame_defect_status(FrameDefect d) {
  switch (d) {
    case kDefectNone: return kOk;
    case kDefectHeaderTruncated:
    case kDefectPrefixTruncated:
    case kDefectFrameTruncated: return kErrSrcTruncated;
    case kDefectBadMagic: return kErrBadMagic;
    case kDefectBadVersion: return kErrBadVersion;
    case kDefectHeaderCrc: return kErrChecksum;
    default: return kErrCorruptHeader;
  }
}

// Host-side message of a defect (the CPU backend's error detail).
inline const char* frame_defect_text(FrameDefect d) {
  switch (d) {
    case kDefectNone: return "ok";
    case kDefectHeaderTruncated: return "frame shorter than its 32-byte header";
    case kDefectBadMagic: return "not a tensorzip frame (bad magic)";
    case kDefectBadVersion: return "frame format version not supported";
    case kDefectDType: return "corrupt frame header: unknown dtype";
    case kDefectStreamCount: return "corrupt frame header: stream count does not match the dtype";
    case kDefectFlags: return "corrupt frame header: unknown flag bits, or flags before version 3";
    case kDefectBlockElems: return "corrupt frame header: block_elems is not a power of two in [4096, 1048576]";
    case kDefectRawSize: return "corrupt frame header: raw size not a multiple of the element size or above 2^56";
    case kDefectBlockCount: return "corrupt frame header: block count does not match raw size and block_elems";
    case kDefectTablesSize: return "corrupt frame header: table section size not a multiple of 4 or too large";
    case kDefectPrefixTruncated: return "frame truncated inside its header/index";
    case kDefectTableMissing: return "stream table missing";
    case kDefectStreamKind: return "invalid stream kind";
    case kDefectContextCount: return "invalid number of lane contexts";
    case kDefectTooManyTables: return "too many frequency tables";
    case kDefectTableSets: return "invalid number of table sets";
    case kDefectBlockTables: return "a block would use more than 8 frequency tables";
    case kDefectFreqTable: return "corrupt frequency table";
    case kDefectTableTrailing: return "trailing bytes in table section";
    case kDefectTablePadding: return "non-zero padding in table section";
    case kDefectHeaderCrc: return "frame header checksum mismatch";
    case kDefectIndexEntry: return "invalid size in block index";
    case kDefectFrameTruncated: return "frame truncated";
    case kDefectTrailingBytes: return "trailing bytes after the frame";
  }
  return "corrupt frame";
}

// ------------------------------------------------------------ header --

TZ_HD void write_frame_header(uint8_t* p, const FrameHeader& h) {
  for (int i = 0; i < 4; ++i) p[i] = frame_magic(i);
  p[4] = h.version;
  p[5] = h.dtype;
  p[6] = h.n_streams;
  p[7] = h.flags;
  store_le64(p + 8, h.raw_size);
  store_le32(p + 16, h.block_elems);
  store_le32(p + 20, h.n_blocks);
  store_le32(p + 24, h.tables_size);
  store_le32(p + 28, h.header_crc);
}

// Step 1: everything that can be checked from the 32 fixed bytes alone.
TZ_HD FrameDefect check_frame_header(const uint8_t* p, size_t n, FrameHeader* h) {
  if (n < kFrameHeaderSize) return kDefectHeaderTruncated;
  for (int i = 0; i < 4; ++i)
    if (p[i] != frame_magic(i)) return kDefectBadMagic;
  h->version = p[4];
  if (h->version != kFormatVersion && h->version != kFormatVersionCtx && h->version != kFormatVersionSets)
    return kDefectBadVersion;
  h->dtype = p[5];
  h->n_streams = p[6];
  h->flags = p[7];
  h->raw_size = load_le64(p + 8);
  h->block_elems = load_le32(p + 16);
  h->n_blocks = load_le32(p + 20);
  h->tables_size = load_le32(p + 24);
  h->header_crc = load_le32(p + 28);
  if (h->dtype >= kDTypeCount) return kDefectDType;
  if (h->n_streams != dtype_stream_count(h->dtype)) return kDefectStreamCount;
  if ((h->flags & ~kFrameFlagsKnown) != 0) return kDefectFlags;
  if (h->flags != 0 && h->version < kFormatVersionSets) return kDefectFlags;
  if (!block_elems_valid(h->block_elems)) return kDefectBlockElems;
  const uint32_t es = dtype_elem_size(h->dtype);
  if (h->raw_size % es != 0 || h->raw_size > kMaxRawSize) return kDefectRawSize;
  if (frame_n_blocks(h->raw_size / es, h->block_elems) != h->n_blocks) return kDefectBlockCount;
  const size_t max_tables = h->version >= kFormatVersionSets ? kMaxTablesSizeV3 : kMaxTablesSize;
  if (h->tables_size % 4 != 0 || h->tables_size > (uint32_t)max_tables) return kDefectTablesSize;
  return kDefectNone;
}

// check_frame_header as a status code.
TZ_HD int parse_frame_header(const uint8_t* p, size_t n, FrameHeader* h) {
  return frame_defect_status(check_frame_header(p, n, h));
}

// Size of header + tables + block index: the "prefix" a reader needs before
// it can locate any block.
TZ_HD uint64_t frame_prefix_size(const FrameHeader& h) {
  return kFrameHeaderSize + (uint64_t)h.tables_size + 4ull * h.n_blocks;
}

// The header CRC (bytes 28..31): CRC32C of bytes 0..27, then of the table
// section and block index. `crc(state, p, len)` continues a CRC32C state
// (each backend passes its fastest implementation).
template <class Crc>
TZ_HD uint32_t frame_header_crc(const uint8_t* frame, uint64_t prefix_size, const Crc& crc) {
  const uint32_t st = crc(~0u, frame, 28);
  return ~crc(st, frame + kFrameHeaderSize, (size_t)(prefix_size - kFrameHeaderSize));
}

// ----------------------------------------------------- table section --

// The frame's stream kinds and frequency tables, validated. Stream k's
// table for set j and context c is freq[first_table[k] + j * ctx[k].n + c].
struct FrameTables {
  uint8_t kind[kMaxStreams];         // StreamKind per stream
  uint8_t first_table[kMaxStreams];  // index in freq of stream k's first table
  uint8_t n_sets[kMaxStreams];       // table sets of a rANS stream (1 before version 3), else 0
  RansCtx ctx[kMaxStreams];          // lane contexts (n = 1 unless kind 3)
  uint32_t n_tables;                 // frequency tables over all streams
  uint32_t freq[kMaxFrameTablesV3][256];
};

// Reference table of compact table j of a stream (mode 2, doc/format.md
// 5.7): the same context of the previous set, else the previous context.
TZ_HD int compact_table_ref(uint32_t j, uint32_t n_ctx) {
  if (j >= n_ctx) return (int)(j - n_ctx);
  return j > 0 ? (int)j - 1 : -1;
}

// Stream kinds a frame of this dtype and format version may carry: raw;
// zstd for dtype bytes; rANS for the float types; rANS with lane contexts
// for the float types from format version 2 on.
TZ_HD bool stream_kind_allowed(const FrameHeader& h, uint8_t kind) {
  if (kind == kKindRaw) return true;
  if (h.dtype == kBytes) return kind == kKindZstd;
  return kind == kKindRans || (kind == kKindRansCtx && h.version >= kFormatVersionCtx);
}

// Step 2a: parses the tables_size bytes at p (h from check_frame_header).
TZ_HD FrameDefect parse_table_section(const FrameHeader& h, const uint8_t* p, FrameTables* t) {
  const uint8_t* const end = p + h.tables_size;
  const bool v3 = h.version >= kFormatVersionSets;
  uint32_t n_tables = 0, per_block = 0;
  t->n_tables = 0;
  for (int k = 0; k < h.n_streams; ++k) {
    if (p >= end) return kDefectTableMissing;
    const uint8_t kind = *p++;
    if (!stream_kind_allowed(h, kind)) return kDefectStreamKind;
    t->kind[k] = kind;
    t->first_table[k] = (uint8_t)n_tables;
    t->n_sets[k] = 0;
    t->ctx[k] = RansCtx{};
    if (kind == kKindRansCtx) {
      if (end - p < 2) return kDefectTableMissing;
      t->ctx[k].base = p[0];
      t->ctx[k].n = p[1];
      p += 2;
      if (t->ctx[k].n < 2 || t->ctx[k].n > kMaxContexts) return kDefectContextCount;
    }
    if (kind_is_rans(kind)) {
      uint32_t sets = 1;
      if (v3) {
        if (p >= end) return kDefectTableMissing;
        sets = *p++;
        if (sets == 0 || sets > kMaxTableSets) return kDefectTableSets;
        per_block += t->ctx[k].n;
        if (per_block > kMaxFrameTables) return kDefectBlockTables;
      }
      t->n_sets[k] = (uint8_t)sets;
      const uint32_t nt = sets * t->ctx[k].n;
      n_tables += nt;
      if (n_tables > (v3 ? kMaxFrameTablesV3 : kMaxFrameTables)) return kDefectTooManyTables;
      uint32_t* const f0 = t->freq[t->first_table[k]];
      for (uint32_t j = 0; j < nt; ++j) {
        size_t r;
        if (v3) {
          const int ref = compact_table_ref(j, t->ctx[k].n);
          r = read_compact_table(p, (size_t)(end - p), ref >= 0 ? f0 + 256 * ref : nullptr, f0 + 256 * j);
        } else {
          r = rans_read_table(p, (size_t)(end - p), f0 + 256 * j);
        }
        if (!r) return kDefectFreqTable;
        p += r;
      }
    }
    t->n_tables = n_tables;
  }
  if (end - p >= 4) return kDefectTableTrailing;
  for (; p < end; ++p)
    if (*p) return kDefectTablePadding;
  return kDefectNone;
}

// A frame with a zstd stream is valid (dtype bytes only) but decodable by
// the CPU backend only: the CUDA decoder answers TZ_ERROR_UNSUPPORTED for it,
// and for nothing else that is valid.
TZ_HD bool stream_kinds_use_zstd(const uint8_t* kind, int n_streams) {
  for (int k = 0; k < n_streams; ++k)
    if (kind[k] == kKindZstd) return true;
  return false;
}

// Serialised size of stream k's entry in the table section: the kind byte,
// for kind 3 the context base and count, then its ctx.n frequency tables
// (rans_write_table's format). `freq` holds ctx.n tables of 256.
TZ_HD size_t freq_table_size(const uint32_t* freq) {
  size_t n = 32;
  for (int s = 0; s < 256; ++s)
    if (freq[s]) n += freq[s] < 128 ? 1 : 2;
  return n;
}
TZ_HD size_t stream_table_size(uint8_t kind, const uint32_t* freq, const RansCtx& ctx) {
  size_t n = 1;
  if (kind == kKindRansCtx) n += 2;
  if (kind_is_rans(kind))
    for (uint32_t c = 0; c < ctx.n; ++c) n += freq_table_size(freq + 256 * c);
  return n;
}
// Writes that entry to out; returns stream_table_size bytes.
TZ_HD size_t write_stream_table(uint8_t kind, const uint32_t* freq, const RansCtx& ctx, uint8_t* out) {
  size_t n = 0;
  out[n++] = kind;
  if (kind == kKindRansCtx) {
    out[n++] = (uint8_t)ctx.base;
    out[n++] = (uint8_t)ctx.n;
  }
  if (kind_is_rans(kind))
    for (uint32_t c = 0; c < ctx.n; ++c) n += rans_write_table(freq + 256 * c, out + n);
  return n;
}

// Format version 3 entry of stream k: the kind byte, for kind 3 base and
// n, for a rANS kind the number of sets, then sets x ctx.n compact tables
// (set-major; freq holds them in that order, 256 entries each).
TZ_HD size_t stream_table_size_v3(uint8_t kind, const uint32_t* freq, const RansCtx& ctx, uint32_t sets) {
  size_t n = 1;
  if (kind == kKindRansCtx) n += 2;
  if (kind_is_rans(kind)) {
    n += 1;
    for (uint32_t j = 0; j < sets * ctx.n; ++j) {
      const int ref = compact_table_ref(j, ctx.n);
      n += compact_table_size(freq + 256 * j, ref >= 0 ? freq + 256 * ref : nullptr);
    }
  }
  return n;
}
TZ_HD size_t write_stream_table_v3(uint8_t kind, const uint32_t* freq, const RansCtx& ctx, uint32_t sets,
                                   uint8_t* out) {
  size_t n = 0;
  out[n++] = kind;
  if (kind == kKindRansCtx) {
    out[n++] = (uint8_t)ctx.base;
    out[n++] = (uint8_t)ctx.n;
  }
  if (kind_is_rans(kind)) {
    out[n++] = (uint8_t)sets;
    for (uint32_t j = 0; j < sets * ctx.n; ++j) {
      const int ref = compact_table_ref(j, ctx.n);
      n += write_compact_table(freq + 256 * j, ref >= 0 ? freq + 256 * ref : nullptr, out + n);
    }
  }
  return n;
}

// ------------------------------------------------- prefix, index, extent --

// A frame prefix that passed steps 1 and 2 (and 3, from parse_frame_prefix).
struct FramePrefixView {
  FrameHeader h;
  FrameTables t;
  const uint8_t* index;  // n_blocks LE32 block sizes
  uint64_t prefix_size;  // header + tables + index
  uint64_t blocks_size;  // sum of the index entries (parse_frame_prefix only)
};

// Step 2: steps 1 and 2 on the n bytes at src.
template <class Crc>
TZ_HD FrameDefect parse_frame_head(const uint8_t* src, size_t n, const Crc& crc, FramePrefixView* v) {
  FrameDefect d = check_frame_header(src, n, &v->h);
  if (d != kDefectNone) return d;
  v->prefix_size = frame_prefix_size(v->h);
  if (n < v->prefix_size) return kDefectPrefixTruncated;
  d = parse_table_section(v->h, src + kFrameHeaderSize, &v->t);
  if (d != kDefectNone) return d;
  v->index = src + kFrameHeaderSize + v->h.tables_size;
  v->blocks_size = 0;
  if (frame_header_crc(src, v->prefix_size, crc) != v->h.header_crc) return kDefectHeaderCrc;
  return kDefectNone;
}

// Step 3, one entry: block b of `size` bytes is a whole number of words, holds
// its block header and is at most the block's bound (every stream raw).
TZ_HD bool block_index_entry_valid(const FrameHeader& h, uint32_t b, uint32_t size) {
  const int K = h.n_streams;
  return size % 4 == 0 && size >= block_header_size(K) && size <= block_bound(block_elem_count(h, b), K);
}

// Steps 1 to 3 (the serial form). On kDefectIndexEntry, *bad_entry is the
// first invalid entry. Fills v->blocks_size.
template <class Crc>
TZ_HD FrameDefect parse_frame_prefix(const uint8_t* src, size_t n, const Crc& crc, FramePrefixView* v,
                                     uint32_t* bad_entry) {
  const FrameDefect d = parse_frame_head(src, n, crc, v);
  if (d != kDefectNone) return d;
  uint64_t total = 0;
  for (uint32_t b = 0; b < v->h.n_blocks; ++b) {
    const uint32_t sz = load_le32(v->index + 4ull * b);
    if (!block_index_entry_valid(v->h, b, sz)) {
      *bad_entry = b;
      return kDefectIndexEntry;
    }
    total += sz;
  }
  v->blocks_size = total;
  return kDefectNone;
}

// Step 4: a whole frame of prefix_size + blocks_size bytes is exactly the
// n bytes of input.
TZ_HD FrameDefect check_frame_extent(uint64_t prefix_size, uint64_t blocks_size, uint64_t n) {
  const uint64_t frame = prefix_size + blocks_size;
  if (n < frame) return kDefectFrameTruncated;
  if (n > frame) return kDefectTrailingBytes;
  return kDefectNone;
}

}  // namespace tz
