// Per-block encode and decode (doc/format.md section 6). No allocation, no
// I/O, no threads: callers hand in scratch memory and tables, so the same
// functions run in a CPU worker and in a GPU thread.
#pragma once
#include "codec/fields.h"
#include "codec/rans.h"

namespace tz {

struct BlockEncTables {
  uint8_t kind[kMaxStreams];          // StreamKind per stream
  const RansEncSym* enc[kMaxStreams];  // non-null where kind == kKindRans
};

struct BlockDecTables {
  uint8_t kind[kMaxStreams];
  const uint32_t* dec[kMaxStreams];  // kProbScale entries where kind == kKindRans
};

// Worst-case encoded size of a block of n elements: every stream raw.
TZ_HD size_t block_bound(uint32_t n, int n_streams) {
  return block_header_size(n_streams) + (size_t)n_streams * align4(n);
}

// Scratch bytes needed by encode_block / decode_block for n elements.
TZ_HD size_t block_scratch_size(uint32_t n, int n_streams) {
  return (size_t)n_streams * align4(n) + 2 * (size_t)align4(n);
}

// Encodes one block whose decoded bytes have checksum `checksum` (see
// checksum.h; computed by the caller with its fastest CRC). `out` must hold
// block_bound(n, K) bytes. Returns the encoded size (a multiple of 4).
TZ_HD_NOINLINE size_t encode_block(uint8_t dtype, const BlockEncTables& t, const uint8_t* src, uint32_t n,
                                   uint32_t checksum, uint8_t* scratch, uint8_t* out) {
  const int K = dtype_stream_count(dtype);
  uint8_t* streams[kMaxStreams];
  for (int k = 0; k < K; ++k) streams[k] = scratch + (size_t)k * align4(n);
  uint16_t* words = (uint16_t*)(scratch + (size_t)K * align4(n));
  split_fields(dtype, src, n, streams);

  store_le32(out, checksum);
  size_t pos = block_header_size(K);
  for (int k = 0; k < K; ++k) {
    size_t size = 0;
    uint8_t mode = kModeRaw;
    if (t.kind[k] == kKindRans) {
      size = rans_encode(streams[k], n, t.enc[k], words, out + pos, n);
      if (size) mode = kModeRans;
    }
    if (mode == kModeRaw) {
      memcpy(out + pos, streams[k], n);
      size = n;
    }
    store_le32(out + 4 + 4 * k, stream_word((uint32_t)size, mode));
    const size_t padded = align4(size);
    for (size_t i = size; i < padded; ++i) out[pos + i] = 0;
    pos += padded;
  }
  return pos;
}

// Decodes one block of n elements into dst (n * elem_size bytes). On kOk,
// *stored_checksum holds the checksum the encoder recorded; the caller
// compares it with the checksum of dst. Streams in zstd mode are rejected
// here with kErrUnsupported; the CPU backend decodes those itself.
TZ_HD_NOINLINE int decode_block(uint8_t dtype, const BlockDecTables& t, const uint8_t* blk, size_t blk_size,
                                uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored_checksum) {
  const int K = dtype_stream_count(dtype);
  const size_t hdr = block_header_size(K);
  if (blk_size < hdr || (blk_size & 3u)) return kErrCorruptBlock;
  *stored_checksum = load_le32(blk);
  const uint8_t* streams[kMaxStreams];
  size_t pos = hdr;
  for (int k = 0; k < K; ++k) {
    const uint32_t w = load_le32(blk + 4 + 4 * k);
    const uint32_t size = stream_word_size(w);
    const uint8_t mode = stream_word_mode(w);
    const size_t padded = align4(size);
    if (padded > blk_size - pos) return kErrCorruptBlock;
    const uint8_t* payload = blk + pos;
    for (size_t i = size; i < padded; ++i)
      if (payload[i] != 0) return kErrCorruptBlock;
    if (mode == kModeRaw) {
      if (size != n) return kErrCorruptBlock;
      streams[k] = payload;
    } else if (mode == kModeRans) {
      if (t.kind[k] != kKindRans) return kErrCorruptBlock;
      uint8_t* s = scratch + (size_t)k * align4(n);
      const int st = rans_decode(payload, size, n, t.dec[k], s);
      if (st != kOk) return st;
      streams[k] = s;
    } else if (mode == kModeZstd) {
      return kErrUnsupported;
    } else {
      return kErrCorruptBlock;
    }
    pos += padded;
  }
  if (pos != blk_size) return kErrCorruptBlock;
  merge_fields(dtype, streams, n, dst);
  return kOk;
}

}  // namespace tz
