// Per-block encode and decode (doc/format.md section 6). No allocation, no
// I/O, no threads: callers hand in scratch memory and tables, so the same
// functions run in a CPU worker and in a GPU thread.
#pragma once
#include "codec/fields.h"
#include "codec/rans.h"

namespace tz {

// The tables one block is coded with. In format version 3 (v3 = 1) each
// coded stream names its table set in its stream word: enc[k] then points at
// that set's tables and set[k] is its number.
struct BlockEncTables {
  uint8_t kind[kMaxStreams];          // StreamKind per stream
  const RansEncSym* enc[kMaxStreams];  // ctx[k].n x 256 entries where kind_is_rans(kind)
  RansCtx ctx[kMaxStreams];            // n = 1 unless kind == kKindRansCtx
  uint8_t set[kMaxStreams];            // v3: table set of stream k in this block
  uint8_t v3;                          // stream words in the version-3 layout
};

// Decode tables of a frame. dec[k] holds stream k's n_sets[k] sets of
// ctx[k].n tables of kProbScale entries (set-major); a block's stream word
// picks the set (version 3; before it, one set).
struct BlockDecTables {
  uint8_t kind[kMaxStreams];
  const uint32_t* dec[kMaxStreams];  // n_sets[k] x ctx[k].n x kProbScale entries where kind_is_rans(kind)
  RansCtx ctx[kMaxStreams];
  uint8_t n_sets[kMaxStreams];
  uint8_t v3;  // stream words in the version-3 layout (then n_sets validates their set field)
  TZ_HD const uint8_t* sets() const { return v3 ? n_sets : nullptr; }
  // Decode tables of stream k in table set j.
  TZ_HD const uint32_t* dec_of(int k, uint32_t j) const { return dec[k] + (size_t)j * ctx[k].n * kProbScale; }
};

// Worst-case encoded size of a block of n elements: every stream raw.
TZ_HD size_t block_bound(uint32_t n, int n_streams) {
  return block_header_size(n_streams) + (size_t)n_streams * align4(n);
}

// Scratch bytes needed by encode_block / decode_block for n elements.
TZ_HD size_t block_scratch_size(uint32_t n, int n_streams) {
  return (size_t)n_streams * align4(n) + 2 * (size_t)align4(n);
}

// Default stream coder: the portable scalar rANS encoder of rans.h.
struct ScalarStreamEncoder {
  const BlockEncTables* t;
  TZ_HD void split(uint8_t dtype, const uint8_t* src, uint32_t n, uint8_t* const* streams) const {
    split_fields(dtype, src, n, streams);
  }
  TZ_HD size_t operator()(int k, const uint8_t* sym, uint32_t n, uint16_t* words, uint8_t* out, size_t limit) const {
    return rans_encode_ctx(sym, n, t->enc[k], t->ctx[k], words, out, limit);
  }
};

// Encodes one block whose decoded bytes have checksum `checksum` (see
// checksum.h; computed by the caller with its fastest CRC). `out` must hold
// block_bound(n, K) bytes. Returns the encoded size (a multiple of 4).
// `coder(k, symbols, n, word_scratch, out, limit)` entropy-codes stream k and
// returns its payload size, or 0 when the payload would not be < limit;
// `coder.split` cuts elements into streams. The CPU backend passes a SIMD
// coder that produces the same bytes.
template <class Coder>
TZ_HD size_t encode_block_with(uint8_t dtype, const BlockEncTables& t, const uint8_t* src, uint32_t n,
                               uint32_t checksum, uint8_t* scratch, uint8_t* out, const Coder& coder) {
  const int K = dtype_stream_count(dtype);
  uint8_t* streams[kMaxStreams];
  for (int k = 0; k < K; ++k) streams[k] = scratch + (size_t)k * align4(n);
  uint16_t* words = (uint16_t*)(scratch + (size_t)K * align4(n));
  // One stream (FP8): the elements are its bytes (split_fields would only
  // copy them), so it is coded from src.
  const uint8_t* sym[kMaxStreams];
  if (K == 1) {
    sym[0] = src;
  } else {
    coder.split(dtype, src, n, streams);
    for (int k = 0; k < K; ++k) sym[k] = streams[k];
  }

  store_le32(out, checksum);
  size_t pos = block_header_size(K);
  for (int k = 0; k < K; ++k) {
    size_t size = 0;
    uint8_t mode = kModeRaw;
    if (kind_is_rans(t.kind[k])) {
      size = coder(k, sym[k], n, words, out + pos, n);
      if (size) mode = kModeRans;
    }
    if (mode == kModeRaw) {
      memcpy(out + pos, sym[k], n);
      size = n;
    }
    store_le32(out + 4 + 4 * k, t.v3 ? stream_word_v3((uint32_t)size, mode, mode == kModeRans ? t.set[k] : 0u)
                                     : stream_word((uint32_t)size, mode));
    const size_t padded = align4(size);
    for (size_t i = size; i < padded; ++i) out[pos + i] = 0;
    pos += padded;
  }
  return pos;
}

TZ_HD size_t encode_block(uint8_t dtype, const BlockEncTables& t, const uint8_t* src, uint32_t n,
                          uint32_t checksum, uint8_t* scratch, uint8_t* out) {
  return encode_block_with(dtype, t, src, n, checksum, scratch, out, ScalarStreamEncoder{&t});
}

// A block's header, validated: where each stream's payload is and how it is
// coded. Everything a decoder needs before touching payload bytes.
struct BlockView {
  uint32_t checksum;
  uint8_t mode[kMaxStreams];
  uint8_t set[kMaxStreams];  // table set of a rANS stream (version 3), else 0
  uint32_t size[kMaxStreams];
  const uint8_t* payload[kMaxStreams];
};

// Validates the block header against the frame's stream kinds: sizes inside
// the block, zero padding, raw payloads of exactly n bytes, rANS only where
// the frame has a table and with at least the lane states and whole words,
// zstd only where the frame says so, payloads filling the block exactly.
// The one block-header validator of both backends (the CPU decoders and the
// CUDA warp decoder): every failure is kErrCorruptBlock, found before any
// payload is decoded.
// KC > 0: the stream count K known at compile time (the CUDA warp decoder,
// instantiated per dtype, keeps the view in registers); KC = 0: K at run
// time (the CPU decoders). n_sets: null before format version 3 (30-bit
// sizes); in version 3 the table sets of each stream: a rANS stream's set
// must be below its count, every other stream's set field zero.
template <int KC>
TZ_HD int parse_block_impl(int k_streams, const uint8_t* kind, const uint8_t* n_sets, const uint8_t* blk,
                           size_t blk_size, uint32_t n, BlockView* v) {
  const int K = KC > 0 ? KC : k_streams;
  const size_t hdr = block_header_size(K);
  if (blk_size < hdr || (blk_size & 3u)) return kErrCorruptBlock;
  v->checksum = load_le32(blk);
  size_t pos = hdr;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < K; ++k) {
    const uint32_t w = load_le32(blk + 4 + 4 * k);
    const uint32_t size = n_sets ? stream_word_v3_size(w) : stream_word_size(w);
    const uint32_t set = n_sets ? stream_word_v3_set(w) : 0u;
    const uint8_t mode = stream_word_mode(w);
    if (set != 0 && (mode != kModeRans || set >= n_sets[k])) return kErrCorruptBlock;
    const size_t padded = align4(size);
    if (padded > blk_size - pos) return kErrCorruptBlock;
    const uint8_t* payload = blk + pos;
    for (size_t i = size; i < padded; ++i)
      if (payload[i] != 0) return kErrCorruptBlock;
    if (mode == kModeRaw) {
      if (size != n) return kErrCorruptBlock;
    } else if (mode == kModeRans) {
      if (!kind_is_rans(kind[k])) return kErrCorruptBlock;
      if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
    } else if (mode == kModeZstd) {
      if (kind[k] != kKindZstd) return kErrCorruptBlock;
    } else {
      return kErrCorruptBlock;
    }
    v->mode[k] = mode;
    v->set[k] = (uint8_t)set;
    v->size[k] = size;
    v->payload[k] = payload;
    pos += padded;
  }
  if (pos != blk_size) return kErrCorruptBlock;
  return kOk;
}

TZ_HD int parse_block(int K, const uint8_t* kind, const uint8_t* blk, size_t blk_size, uint32_t n, BlockView* v) {
  return parse_block_impl<0>(K, kind, nullptr, blk, blk_size, n, v);
}
TZ_HD int parse_block(int K, const uint8_t* kind, const uint8_t* n_sets, const uint8_t* blk, size_t blk_size,
                      uint32_t n, BlockView* v) {
  return parse_block_impl<0>(K, kind, n_sets, blk, blk_size, n, v);
}
template <int K>
TZ_HD int parse_block_k(const uint8_t* kind, const uint8_t* n_sets, const uint8_t* blk, size_t blk_size, uint32_t n,
                        BlockView* v) {
  return parse_block_impl<K>(K, kind, n_sets, blk, blk_size, n, v);
}

// Decodes one block of n elements into dst (n * elem_size bytes). On kOk,
// *stored_checksum holds the checksum the encoder recorded; the caller
// compares it with the checksum of dst. Streams in zstd mode are rejected
// here with kErrUnsupported; the CPU backend decodes those itself.
TZ_HD_NOINLINE int decode_block(uint8_t dtype, const BlockDecTables& t, const uint8_t* blk, size_t blk_size,
                                uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored_checksum) {
  const int K = dtype_stream_count(dtype);
  BlockView v;
  const int pst = parse_block(K, t.kind, t.sets(), blk, blk_size, n, &v);
  if (pst != kOk) return pst;
  *stored_checksum = v.checksum;
  const uint8_t* streams[kMaxStreams];
  for (int k = 0; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      streams[k] = v.payload[k];
    } else if (v.mode[k] == kModeRans) {
      uint8_t* s = scratch + (size_t)k * align4(n);
      const int st = rans_decode_ctx(v.payload[k], v.size[k], n, t.dec_of(k, v.set[k]), t.ctx[k], s);
      if (st != kOk) return st;
      streams[k] = s;
    } else {
      return kErrUnsupported;
    }
  }
  merge_fields(dtype, streams, n, dst);
  return kOk;
}

}  // namespace tz
