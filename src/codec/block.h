// Per-block encode and decode (doc/format.md section 6). No allocation, no
// I/O, no threads: callers hand in scratch memory and tables, so the same
// functions run in a CPU worker and in a GPU thread.
#pragma once
#include "codec/fields.h"
#include "codec/rans.h"
#include "codec/zero_elision.h"

namespace tz {

// The tables one block is coded with. In format version 3 (v3 = 1) each
// coded stream names its table set in its stream word: enc[k] then points at
// that set's tables and set[k] is its number.
struct BlockEncTables {
  uint8_t kind[kMaxStreams];          // StreamKind per stream
  const RansEncSym* enc[kMaxStreams];  // ctx[k].n x 256 entries where kind_is_rans(kind)
  RansCtx ctx[kMaxStreams];            // n = 1 unless kind == kKindRansCtx
  uint8_t set[kMaxStreams];            // v3: table set of stream k in this block (kSetRaw: stored raw, not coded)
  uint8_t v3;                          // stream words in the version-3 layout
  uint8_t flags;                       // the frame's flags (v3): kFlagSeededLanes, kFlagSelfSeeded; kFlagZeroElided:
                                       // streams may be stored elided (the header gets the bit if a block is)
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
  uint8_t flags;   // the frame's flags: kFlagSeededLanes (doc/format.md 5.8), kFlagSelfSeeded (5.9)
  TZ_HD const uint8_t* sets() const { return v3 ? n_sets : nullptr; }
  // Decode tables of stream k in table set j.
  TZ_HD const uint32_t* dec_of(int k, uint32_t j) const { return dec[k] + (size_t)j * ctx[k].n * kProbScale; }
};

// ------------------------------------------------ seeded lane states --
// (doc/format.md 5.8). The one statement of the rule, for every encoder and
// decoder (CPU and CUDA).

// The stream whose head carries the seeds of a block of n elements in a
// seeded frame: the last stream of kind raw, provided a rANS-kind stream
// comes before it and n >= kSeedBytes x (rANS-kind streams before it);
// otherwise -1 (the block is not seeded: every lane ends at L). Known from
// the frame's kinds and n alone, before any stream is coded.
TZ_HD int block_seed_stream(int K, const uint8_t* kind, uint32_t n) {
  int r = -1;
  for (int k = 0; k < K; ++k)
    if (kind[k] == kKindRaw) r = k;
  if (r < 0) return -1;
  uint32_t coded = 0;
  for (int k = 0; k < r; ++k) coded += kind_is_rans(kind[k]) ? 1u : 0u;
  if (coded == 0 || n < kSeedBytes * coded) return -1;
  return r;
}
// Offset in the seed stream of the seeds of the i-th (from 0) stream of the
// block coded in rANS mode before it: the seeds fill the stream's head in
// that order, so the encoder places stream i's seeds before it knows whether
// later streams code; the seed stream's payload is its bytes from
// kSeedBytes x (seeded streams) on.
TZ_HD uint32_t block_seed_at(uint32_t i) { return kSeedBytes * i; }
// Where the seeds of stream k come from, in a block of n elements that codes
// stream k in rANS mode (doc/format.md 5.8, 5.9): the one statement of the
// rule for every encoder and decoder. r: the block's seed stream
// (block_seed_stream; -1 when the frame is not seeded or the block has
// none); seeded_before: the streams before k that took seeds from it.
struct StreamSeeds {
  int from;        // the stream whose bytes [at, at + kSeedBytes) are the seeds; -1: none (lanes end at L)
  uint32_t at;
  uint32_t coded;  // symbols the payload codes: n, or n - kSeedBytes when the stream seeds itself (from = k)
  TZ_HD bool self(int k) const { return from == k; }
};
TZ_HD StreamSeeds block_stream_seeds(uint8_t flags, int k, int r, uint32_t n, uint32_t seeded_before) {
  if (k < r) return StreamSeeds{r, block_seed_at(seeded_before), n};  // bit 0: the seed stream's head
  if ((flags & kFlagSelfSeeded) && n >= kSelfSeedMinElems)
    return StreamSeeds{k, n - kSeedBytes, n - kSeedBytes};  // bit 1: its own last kSeedBytes symbols
  return StreamSeeds{-1, 0, n};
}
// The block's seed stream under the frame's flags (-1 without bit 0).
TZ_HD int block_seed_stream_of(uint8_t flags, int K, const uint8_t* kind, uint32_t n) {
  return (flags & kFlagSeededLanes) ? block_seed_stream(K, kind, n) : -1;
}
// The flags byte the reference encoders (CPU and CUDA) write for a frame of
// this version and these stream kinds, in version 3: seeded lane states
// wherever a block can be seeded (a raw-kind stream after a rANS-kind one),
// self-seeded streams wherever a rANS-kind stream can take no seed from it
// (it comes after the last raw-kind stream, or there is none).
TZ_HD uint8_t encoder_frame_flags(uint8_t version, int K, const uint8_t* kind) {
  if (version < kFormatVersionSets) return 0;
  int last_raw = -1;
  for (int k = 0; k < K; ++k)
    if (kind[k] == kKindRaw) last_raw = k;
  bool unseedable = false;
  for (int k = last_raw + 1; k < K; ++k) unseedable = unseedable || kind_is_rans(kind[k]);
  return (uint8_t)((block_seed_stream(K, kind, UINT32_MAX) >= 0 ? kFlagSeededLanes : 0u) |
                   (unseedable ? kFlagSelfSeeded : 0u));
}
// The flags an encoder codes a frame's blocks with: the header's
// (encoder_frame_flags) and, in version 3 with two streams or more,
// kFlagZeroElided, which the header keeps only where a block elides a
// stream (block_elides).
TZ_HD uint8_t encoder_block_flags(uint8_t version, int K, const uint8_t* kind) {
  const uint8_t f = encoder_frame_flags(version, K, kind);
  return version >= kFormatVersionSets && K >= 2 ? (uint8_t)(f | kFlagZeroElided) : f;
}
// Whether an encoded block of K streams stores a stream elided.
TZ_HD bool block_elides(const uint8_t* blk, int K) {
  for (int k = 0; k < K; ++k)
    if (stream_word_mode(load_le32(blk + 4 + 4 * k)) == kModeRawElided) return true;
  return false;
}
// The header's flags for blocks coded with encoder_block_flags' `flags`.
TZ_HD uint8_t encoder_header_flags(uint8_t flags, bool any_elided) {
  return any_elided ? flags : (uint8_t)(flags & ~kFlagZeroElided);
}

// A decoder that merged the seed stream's head into dst before the seeds
// were known (the decode-and-merge paths: they read the seed stream from
// payload - kSeedBytes x S, which lies inside the block, see
// BlockView::stream_bytes): re-merges elements [first, n) of dst with
// bytes [first, n) of the seed stream r, sr.
TZ_HD void block_seed_remerge(uint8_t dtype, int r, const uint8_t* sr, uint32_t first, uint32_t n, uint8_t* dst) {
  const uint32_t es = dtype_elem_size(dtype);
  const int K = dtype_stream_count(dtype);
  uint8_t f[kMaxStreams][kSeedBytes];
  for (uint32_t i0 = first; i0 < n; i0 += kSeedBytes) {
    const uint32_t m = n - i0 < kSeedBytes ? n - i0 : kSeedBytes;
    uint8_t* fp[kMaxStreams];
    const uint8_t* cf[kMaxStreams];
    for (int k = 0; k < K; ++k) fp[k] = f[k];
    split_fields(dtype, dst + (size_t)i0 * es, m, fp);
    for (int k = 0; k < K; ++k) cf[k] = k == r ? sr + i0 : f[k];
    merge_fields(dtype, cf, m, dst + (size_t)i0 * es);
  }
}

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
  TZ_HD size_t operator()(int k, const uint8_t* sym, uint32_t n, const uint8_t* seed, uint16_t* words, uint8_t* out,
                          size_t limit) const {
    RansCtx c = t->ctx[k];
    c.seed_in = seed;
    return rans_encode_ctx(sym, n, t->enc[k], c, words, out, limit);
  }
};

// Encodes one block whose decoded bytes have checksum `checksum` (see
// checksum.h; computed by the caller with its fastest CRC). `out` must hold
// block_bound(n, K) bytes. Returns the encoded size (a multiple of 4).
// `coder(k, symbols, n, seed, word_scratch, out, limit)` entropy-codes stream
// k with its lanes seeded from `seed` (kSeedBytes bytes, or null: lanes start
// at L) and returns its payload size, or 0 when the payload would not be <
// limit;
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
  const int r = block_seed_stream_of(t.flags, K, t.kind, n);
  // Zero elision (doc/format.md 5.10): the streams stored without the
  // bytes of the elements whose stream 0 is 0, and how many elements are kept.
  uint32_t kept;
  const uint32_t elidable = block_elided_streams(t.flags, K, sym, n, &kept);
  uint32_t seeded = 0;  // streams coded with seeds of the seed stream so far
  for (int k = 0; k < K; ++k) {
    size_t size = 0;
    uint8_t mode = kModeRaw;
    const bool elide = (elidable >> k) & 1u;
    if (kind_is_rans(t.kind[k]) && t.set[k] != kSetRaw) {
      const StreamSeeds sd = block_stream_seeds(t.flags, k, r, n, seeded);
      const uint8_t* seed = sd.from >= 0 ? sym[sd.from] + sd.at : nullptr;
      size = coder(k, sym[k], sd.coded, seed, words, out + pos, elide ? kept : n);
      if (size) {
        mode = kModeRans;
        seeded += sd.from == r && r >= 0 ? 1u : 0u;
      }
    }
    if (mode == kModeRaw) {
      const uint32_t skip = k == r ? kSeedBytes * seeded : 0u;  // the seeds, carried by the lane states
      if (elide) {
        mode = kModeRawElided;
        size = elide_zeros(sym[0] + skip, sym[k] + skip, n - skip, out + pos);
      } else {
        size = n - skip;
        memcpy(out + pos, sym[k] + skip, size);
      }
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
  // Seeded lane states (doc/format.md 5.8): seed_stream is the stream whose
  // head holds the seeds (-1: none in this block), n_seeded the streams
  // coded with seeds from it, seed_at[k] where stream k's seeds lie in the
  // seed stream (kNoSeed: stream k ends at L, or seeds itself).
  // Self-seeded streams (5.9): bit k of self_seeded; such a stream's payload
  // codes its first coded[k] = n - kSeedBytes symbols, its lanes' final
  // states its last kSeedBytes. coded[k]: the symbols stream k's rANS
  // payload decodes to (n for every other coded stream).
  int seed_stream;
  uint32_t n_seeded;
  uint32_t seed_at[kMaxStreams];
  uint32_t coded[kMaxStreams];
  uint32_t self_seeded;
  // Zero elision (5.10): bit k set where stream k is stored in mode
  // kModeRawElided (its payload: the bytes of the elements whose stream 0 is
  // not 0; the decoder checks their count once stream 0 is decoded).
  uint32_t elided;
  static constexpr uint32_t kNoSeed = 0xFFFFFFFFu;
  TZ_HD bool self_seeds(int k) const { return (self_seeded >> k) & 1u; }
  // The lane model of stream k for its decode: ctx with seed_out at its
  // seeds' place in sr (the seed stream's first kSeedBytes x n_seeded
  // bytes), or for a self-seeded stream at tail (where its last kSeedBytes
  // symbols go; a decoder into a stream buffer s passes s + coded[k]).
  TZ_HD RansCtx seeded_ctx(int k, RansCtx ctx, uint8_t* sr, uint8_t* tail) const {
    ctx.seed_out = seed_at[k] != kNoSeed ? sr + seed_at[k] : self_seeds(k) ? tail : nullptr;
    return ctx;
  }
  // Stream k's bytes as a decoder merges them: its payload, or for the seed
  // stream of a seeded block its payload less kSeedBytes x n_seeded, so that
  // element i reads byte i. The bytes before the payload lie inside the
  // block (the seeded streams' payloads, at least kRansStateBytes each, come
  // before it), so this reads no memory outside it; the elements of the head
  // are merged again with the seeds (block_seed_remerge).
  TZ_HD const uint8_t* stream_bytes(int k) const {
    return k == seed_stream ? payload[k] - kSeedBytes * n_seeded : payload[k];
  }
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
// must be below its count, every other stream's set field zero. flags: the
// frame's flags (version 3 only, checked with the header). kFlagZeroElided:
// streams k >= 1 may be stored elided, in at most the bytes of their raw
// payload (the exact size is checked against stream 0, expand_elided).
// kFlagSeededLanes:
// the seed stream's raw payload is n - kSeedBytes x (streams coded before it)
// bytes, and every coded stream before it is seeded; kFlagSelfSeeded: where
// each coded stream's seeds come from (block_stream_seeds).
template <int KC>
TZ_HD int parse_block_impl(int k_streams, const uint8_t* kind, const uint8_t* n_sets, uint8_t flags,
                           const uint8_t* blk, size_t blk_size, uint32_t n, BlockView* v) {
  const int K = KC > 0 ? KC : k_streams;
  const size_t hdr = block_header_size(K);
  if (blk_size < hdr || (blk_size & 3u)) return kErrCorruptBlock;
  v->checksum = load_le32(blk);
  const int r = block_seed_stream_of(flags, K, kind, n);
  v->seed_stream = r;
  v->n_seeded = 0;
  v->self_seeded = 0;
  v->elided = 0;
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
    v->seed_at[k] = BlockView::kNoSeed;
    v->coded[k] = n;
    if (mode == kModeRaw) {
      if (size != (k == r ? n - kSeedBytes * v->n_seeded : n)) return kErrCorruptBlock;
    } else if (mode == kModeRans) {
      if (!kind_is_rans(kind[k])) return kErrCorruptBlock;
      if (!rans_stream_size_ok(size)) return kErrCorruptBlock;
      const StreamSeeds sd = block_stream_seeds(flags, k, r, n, v->n_seeded);
      v->coded[k] = sd.coded;
      if (sd.self(k)) v->self_seeded |= 1u << k;
      else if (sd.from >= 0) v->seed_at[k] = block_seed_at(v->n_seeded++);
    } else if (mode == kModeZstd) {
      if (kind[k] != kKindZstd) return kErrCorruptBlock;
    } else {
      // kModeRawElided: only with the frame's flag, never stream 0 (the
      // elements' key); at most the bytes a raw payload would hold.
      if (!(flags & kFlagZeroElided) || k == 0 || size > (k == r ? n - kSeedBytes * v->n_seeded : n))
        return kErrCorruptBlock;
      v->elided |= 1u << k;
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

// Once stream 0 of a block is decoded (streams[0]): every elided stream's
// payload holds exactly one byte per element kept (from element `from` on:
// kSeedBytes x n_seeded for the seed stream, whose head the seeds carry, 0
// for every other), and its n symbols are expanded into out[k] (n bytes
// each, the caller's scratch); streams[k] then points there. The seed
// stream's head is copied from seed_head unless that is null (out[r]
// already holds it).
TZ_HD int expand_elided(const BlockView& v, int K, uint32_t n, uint8_t* const* out, const uint8_t** streams,
                        const uint8_t* seed_head) {
  if (!v.elided) return kOk;
  const uint8_t* s0 = streams[0];
  // Elements kept: in the block, and in the seed stream's head (counted once).
  const uint32_t head = v.seed_stream >= 0 ? kSeedBytes * v.n_seeded : 0u;
  const uint32_t kept = n - elided_count(s0, n);
  const uint32_t kept_head = head - elided_count(s0, head);
  for (int k = 1; k < K; ++k) {
    if (!((v.elided >> k) & 1u)) continue;
    const uint32_t from = k == v.seed_stream ? head : 0u;
    if (v.size[k] != (from ? kept - kept_head : kept)) return kErrCorruptBlock;
    if (from && seed_head) memcpy(out[k], seed_head, from);
    expand_zeros(s0 + from, v.payload[k], n - from, out[k] + from);
    streams[k] = out[k];
  }
  return kOk;
}

TZ_HD int parse_block(int K, const uint8_t* kind, const uint8_t* blk, size_t blk_size, uint32_t n, BlockView* v) {
  return parse_block_impl<0>(K, kind, nullptr, 0, blk, blk_size, n, v);
}
TZ_HD int parse_block(int K, const uint8_t* kind, const uint8_t* n_sets, uint8_t flags, const uint8_t* blk,
                      size_t blk_size, uint32_t n, BlockView* v) {
  return parse_block_impl<0>(K, kind, n_sets, flags, blk, blk_size, n, v);
}
template <int K>
TZ_HD int parse_block_k(const uint8_t* kind, const uint8_t* n_sets, uint8_t flags, const uint8_t* blk,
                        size_t blk_size, uint32_t n, BlockView* v) {
  return parse_block_impl<K>(K, kind, n_sets, flags, blk, blk_size, n, v);
}

// Decodes one block of n elements into dst (n * elem_size bytes). On kOk,
// *stored_checksum holds the checksum the encoder recorded; the caller
// compares it with the checksum of dst. Streams in zstd mode are rejected
// here with kErrUnsupported; the CPU backend decodes those itself.
TZ_HD_NOINLINE int decode_block(uint8_t dtype, const BlockDecTables& t, const uint8_t* blk, size_t blk_size,
                                uint32_t n, uint8_t* scratch, uint8_t* dst, uint32_t* stored_checksum) {
  const int K = dtype_stream_count(dtype);
  BlockView v;
  const int pst = parse_block(K, t.kind, t.sets(), t.flags, blk, blk_size, n, &v);
  if (pst != kOk) return pst;
  *stored_checksum = v.checksum;
  const uint8_t* streams[kMaxStreams];
  // The seed stream is assembled in its scratch area: the seeds land at its
  // head as the streams before it decode, then its payload goes behind them.
  uint8_t* const sr = v.n_seeded ? scratch + (size_t)v.seed_stream * align4(n) : nullptr;
  for (int k = 0; k < K; ++k) {
    if (v.mode[k] == kModeRaw) {
      streams[k] = v.payload[k];
      if (sr && k == v.seed_stream) {
        memcpy(sr + kSeedBytes * v.n_seeded, v.payload[k], v.size[k]);
        streams[k] = sr;
      }
    } else if (v.mode[k] == kModeRans) {
      uint8_t* s = scratch + (size_t)k * align4(n);
      const int st = rans_decode_ctx(v.payload[k], v.size[k], v.coded[k], t.dec_of(k, v.set[k]),
                                     v.seeded_ctx(k, t.ctx[k], sr, s + v.coded[k]), s);
      if (st != kOk) return st;
      streams[k] = s;
    } else if (v.mode[k] == kModeRawElided) {
      streams[k] = nullptr;  // expand_elided, below
    } else {
      return kErrUnsupported;
    }
  }
  uint8_t* slot[kMaxStreams];  // the seed stream's holds its seeds (sr)
  for (int k = 0; k < K; ++k) slot[k] = scratch + (size_t)k * align4(n);
  const int est = expand_elided(v, K, n, slot, streams, nullptr);
  if (est != kOk) return est;
  merge_fields(dtype, streams, n, dst);
  return kOk;
}

}  // namespace tz
