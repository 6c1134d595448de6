// Frame and block layout constants of the tensorzip block bitstream, format
// versions 1, 2 (2 = 1 plus lane-context streams) and 3 (table sets per
// stream chosen per block, compact tables). doc/format.md is the normative
// description; this header mirrors it. Every multi-byte field is
// little-endian.
#pragma once
#include "common/tz_hd.h"

namespace tz {

constexpr uint8_t kFrameMagic[4] = {'T', 'Z', 'F', 'R'};
// Byte i of kFrameMagic. Device code cannot index a host constexpr array at
// run time; a string literal works on both sides.
TZ_HD uint8_t frame_magic(int i) { return (uint8_t)"TZFR"[i]; }
constexpr uint8_t kFormatVersion = 1;     // written when no stream uses lane contexts
constexpr uint8_t kFormatVersionCtx = 2;  // written when a stream uses lane contexts (kind 3)
constexpr uint8_t kFormatVersionSets = 3; // table sets and compact tables (doc/format.md 5.7, 6.1)
constexpr size_t kFrameHeaderSize = 32;

// Entropy coder parameters (fixed by the format, not per frame).
constexpr int kLanes = 32;                 // interleaved rANS states per stream
constexpr uint32_t kProbBits = 12;         // frequencies sum to 1 << kProbBits
constexpr uint32_t kProbScale = 1u << kProbBits;
constexpr uint32_t kRansL = 1u << 16;      // state lower bound; states live in [L, 2^32)
constexpr size_t kRansStateBytes = kLanes * 4;
// Seeded lane states (doc/format.md 5.8, version 3 with header flag bit 0):
// a coded stream's lanes start at L | seed (16 bits each), the seeds of a
// stream are kSeedBytes bytes of the block's last raw-kind stream.
constexpr uint8_t kFlagSeededLanes = 1u;
constexpr uint32_t kSeedBytes = 2 * kLanes;
// Self-seeded streams (doc/format.md 5.9, version 3 with header flag bit 1):
// a coded stream that takes no seed under bit 0's rule, in a block of at
// least kSelfSeedMinElems elements, codes its first n - kSeedBytes symbols
// and carries its last kSeedBytes symbols in its lane states.
constexpr uint8_t kFlagSelfSeeded = 2u;
// Zero elision (doc/format.md 5.10, version 3 with header flag bit 2): a
// block may store a stream in mode kModeRawElided, its raw bytes less those
// of the elements whose stream 0 is 0 (they are 0 in that stream).
constexpr uint8_t kFlagZeroElided = 4u;
constexpr uint8_t kFrameFlagsKnown = kFlagSeededLanes | kFlagSelfSeeded | kFlagZeroElided;
constexpr uint32_t kSelfSeedMinElems = 2 * kSeedBytes;
// A coded rANS stream holds the lane states and then whole 16-bit words
// (doc/format.md section 5): the size check every decoder makes first.
TZ_HD bool rans_stream_size_ok(size_t size) { return size >= kRansStateBytes && ((size - kRansStateBytes) & 1u) == 0; }
constexpr size_t kChecksumSegment = 4096;  // block checksum segment, see checksum.h

constexpr int kMaxStreams = 4;
constexpr uint32_t kMinBlockElems = 1u << 12;  // keeps tz_compress_bound within ~1% of the input
constexpr uint32_t kMaxBlockElems = 1u << 20;
constexpr uint32_t kDefaultBlockElems = 1u << 16;
constexpr uint32_t kDefaultBytesBlockElems = 1u << 18;  // generic byte frames
constexpr uint64_t kMaxRawSize = UINT64_C(1) << 56;     // largest raw_size of a frame
constexpr size_t kFreqTableMaxBytes = 32 + 256 * 2;
// Lane contexts (kind kKindRansCtx): a stream may carry 2..kMaxContexts
// tables; symbol i is coded with table ctx_of(symbol i - 32) (doc/format.md 5.5).
constexpr uint32_t kMaxContexts = 4;
// Frequency tables in one frame, over all streams (bounds decoder table memory:
// 8 x 16 KiB fits a GPU's shared memory).
constexpr uint32_t kMaxFrameTables = 8;
// Largest table section: every stream contextual with kMaxContexts tables.
constexpr size_t kMaxTablesSize = kMaxStreams * (3 + kMaxContexts * kFreqTableMaxBytes) + 4;

// Format version 3. A rANS stream carries n_sets table sets of ctx.n tables
// each; every block names the set each of its coded streams uses (bits 22..29
// of the stream word). A block's tables (one set per stream) stay within
// kMaxFrameTables; the frame holds at most kMaxFrameTablesV3 tables.
constexpr uint32_t kMaxFrameTablesV3 = 32;
constexpr uint32_t kMaxTableSets = 32;          // sets per stream
// Encoder only, never in a frame: the per-block set number of a stream the
// block stores raw without coding it (codec/policy_raw_runs.h).
constexpr uint8_t kSetRaw = 0xFF;
// Compact table (doc/format.md 5.7): 3 bytes, then at most 256 Exp-Golomb
// codes of values <= 8192, each at most 27 bits (order 0), padded to a byte.
constexpr size_t kCompactTableMaxBytes = 3 + (256 * 27 + 7) / 8;
constexpr size_t kMaxTablesSizeV3 = 4 * kMaxStreams + kMaxFrameTablesV3 * kCompactTableMaxBytes + 4;
constexpr size_t kMaxTablesSizeAny = kMaxTablesSizeV3 > kMaxTablesSize ? kMaxTablesSizeV3 : kMaxTablesSize;

// Element types of a frame. Values are part of the format.
enum DType : uint8_t {
  kBytes = 0,   // generic path: any bytes, one stream, zstd or raw
  kBF16 = 1,
  kF16 = 2,
  kF32 = 3,
  kF8E4M3 = 4,
  kF8E5M2 = 5,
  kDTypeCount = 6,
};

// Tensor-level kind of a stream (in the table section).
enum StreamKind : uint8_t { kKindRaw = 0, kKindRans = 1, kKindZstd = 2, kKindRansCtx = 3 };
TZ_HD bool kind_is_rans(uint8_t kind) { return kind == kKindRans || kind == kKindRansCtx; }
// Per-block mode of a stream (top two bits of the block's stream word).
enum BlockMode : uint8_t { kModeRaw = 0, kModeRans = 1, kModeZstd = 2, kModeRawElided = 3 };

// The name of each element type (the container's "codec" key and the C
// API's tz_dtype_name use these); nullptr for a value that is not one.
TZ_HD const char* dtype_name(uint8_t dt) {
  switch (dt) {
    case kBytes: return "bytes";
    case kBF16: return "bf16";
    case kF16: return "f16";
    case kF32: return "f32";
    case kF8E4M3: return "f8_e4m3";
    case kF8E5M2: return "f8_e5m2";
    default: return nullptr;
  }
}

TZ_HD uint32_t dtype_elem_size(uint8_t dt) {
  switch (dt) {
    case kBF16: case kF16: return 2;
    case kF32: return 4;
    default: return 1;
  }
}

TZ_HD int dtype_stream_count(uint8_t dt) {
  switch (dt) {
    case kBF16: case kF16: return 2;
    case kF32: return 4;
    default: return 1;
  }
}

// Parsed fixed-size frame header.
struct FrameHeader {
  uint8_t version;
  uint8_t dtype;
  uint8_t n_streams;
  uint8_t flags;
  uint64_t raw_size;
  uint32_t block_elems;
  uint32_t n_blocks;
  uint32_t tables_size;
  uint32_t header_crc;
};

// Status codes shared by the per-block code (mirrored in the public enum).
enum Status : int {
  kOk = 0,
  kErrGeneric = 1,
  kErrDstTooSmall = 2,
  kErrSrcTruncated = 3,
  kErrBadMagic = 4,
  kErrBadVersion = 5,
  kErrCorruptHeader = 6,
  kErrCorruptBlock = 7,
  kErrChecksum = 8,
  kErrBadParam = 9,
  kErrUnsupported = 10,
  kErrAlloc = 11,
};

// block_elems of a frame: a power of two in [kMinBlockElems, kMaxBlockElems].
TZ_HD bool block_elems_valid(uint32_t be) {
  return be >= kMinBlockElems && be <= kMaxBlockElems && (be & (be - 1)) == 0;
}

TZ_HD uint64_t frame_n_blocks(uint64_t n_elems, uint32_t block_elems) {
  return (n_elems + block_elems - 1) / block_elems;
}

// Number of elements in block b.
TZ_HD uint32_t block_elem_count(const FrameHeader& h, uint32_t b) {
  const uint64_t n = h.raw_size / dtype_elem_size(h.dtype);
  const uint64_t start = (uint64_t)b * h.block_elems;
  const uint64_t rem = n - start;
  return rem < h.block_elems ? (uint32_t)rem : h.block_elems;
}

// Block header: u32 checksum, then one u32 word per stream.
TZ_HD size_t block_header_size(int n_streams) { return 4 + 4 * (size_t)n_streams; }
TZ_HD uint32_t stream_word(uint32_t size, uint8_t mode) { return size | ((uint32_t)mode << 30); }
TZ_HD uint32_t stream_word_size(uint32_t w) { return w & 0x3FFFFFFFu; }
TZ_HD uint8_t stream_word_mode(uint32_t w) { return (uint8_t)(w >> 30); }
// Format version 3: bits 0..21 size, 22..29 table set, 30..31 mode.
TZ_HD uint32_t stream_word_v3(uint32_t size, uint8_t mode, uint32_t set) {
  return size | (set << 22) | ((uint32_t)mode << 30);
}
TZ_HD uint32_t stream_word_v3_size(uint32_t w) { return w & 0x3FFFFFu; }
TZ_HD uint32_t stream_word_v3_set(uint32_t w) { return (w >> 22) & 0xFFu; }

}  // namespace tz
