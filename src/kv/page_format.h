// KV-cache page codec: what encoder and decoder share (doc/kv.md): the page
// header, the page bound and scratch size, the page checksum, a bit count.
// kv/page.h includes this and both sides.
#pragma once
#include "kv/tables.h"

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

}  // namespace tz::kv
