// Internals shared by the container sources: the .tzip byte layout
// (doc/container.md is normative), checked arithmetic, header codec.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::detail {

// ---- byte layout, version 1 ----------------------------------------------
constexpr uint8_t kMagic[4] = {'T', 'Z', 'I', 'P'};
constexpr uint8_t kEndMagic[4] = {'P', 'I', 'Z', 'T'};
constexpr size_t kPreambleSize = 16;
constexpr size_t kTrailerSize = 48;
constexpr size_t kTrailerHashedSize = 32;  // trailer bytes covered by the file checksum
constexpr uint64_t kAlign = 64;            // frames and the header start at multiples of 64
constexpr uint64_t kMinChunkBytes = 1ull << 20;
constexpr uint64_t kMaxChunkBytes = 64ull << 20;  // bounds reader memory on hostile input
// Preamble flags (section 2.1). Bit 0: the header is stored as one zstd
// frame (section 3.2). Every other bit is reserved and must be 0.
constexpr uint32_t kFlagHeaderZstd = 1;
// A compressed header may inflate to at most this many times its stored
// size (section 3.2): bounds the work a small hostile file can cause before
// any of it is validated. Writers store a header whose JSON compresses
// better than this in a zstd frame of raw blocks instead.
constexpr uint64_t kMaxHeaderInflation = 128;
constexpr size_t kMaxReferences = 4096;
// What a parsed tensor table may take (entries, names, shapes, frame lists):
// with the JSON it comes from, opening a file stays under ~256 MiB whatever
// its header says. A real header at the 100 MiB JSON cap (some 350,000
// tensors) needs about 100 MiB of table.
constexpr uint64_t kMaxTableBytes = 128ull << 20;

inline uint64_t align_up(uint64_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }

inline void put_le16(uint8_t* p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
inline void put_le32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i)); }
inline void put_le64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i)); }
inline uint16_t get_le16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
inline uint32_t get_le32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out);
bool checked_add(uint64_t a, uint64_t b, uint64_t* out);

// Bytes of a tensor from dtype and shape, with overflow checks (throws kBadInput).
uint64_t tensor_nbytes(const std::string& dtype, const std::vector<uint64_t>& shape, const std::string& what,
                       const std::string& name);
std::string shape_string(const std::vector<uint64_t>& shape);
// The safetensors header JSON (header_len bytes) of a file whose data section
// has data_size bytes, validated as parse_safetensors_header does; fills
// *out except its file_size, header_len, header_bytes and data_start.
// With on_tensor, each validated tensor entry is handed to it (in file
// order) instead of being kept, and out->tensors/gaps stay empty: the
// overlap and gap rules then rest with the caller.
void parse_safetensors_json(const char* header, size_t header_len, uint64_t data_size, const std::string& what,
                            SafetensorsInfo* out,
                            const std::function<void(TensorEntry&&)>& on_tensor = nullptr);

const char* codec_dtype_name(tz_dtype d);
bool codec_dtype_from_name(const std::string& s, tz_dtype* out);
unsigned codec_elem_size(tz_dtype d);
unsigned default_block_elems(tz_dtype d);
std::string hex64(uint64_t v);

// Parsed and validated .tzip header.
struct TzipHeader {
  uint16_t major = kTzipVersionMajor;  // 2 when any tensor is predicted
  std::vector<Reference> references;   // version 2 only
  std::string created_by;
  uint64_t chunk_bytes = 0;
  uint64_t data_size = 0;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> user_metadata;
  std::string safetensors_header;
  std::vector<TensorEntry> tensors;   // data order
  std::vector<TensorEntry> gaps;      // data order
  std::vector<const TensorEntry*> segments;  // tensors and gaps merged, data order = file order
  // tensor name (a view of tensors[i].name) -> i; filled once tensors is complete
  std::unordered_map<std::string_view, size_t> by_name;
};

// Serialises the header JSON (segments must already carry their frames).
std::string encode_header(const TzipHeader& h);
// Parses and validates everything that can be checked without reading the
// frames: tiling of the data section, frame offsets tiling [64, header_offset)
// in order with 64-byte alignment, agreement with the verbatim safetensors
// header. Throws kBadInput naming `what`.
// `major` is the preamble's version_major (1 or 2).
// The JSON is released as soon as it is parsed, before the checks that
// build more (the embedded safetensors header's table), so that peak memory
// is about twice the JSON, not three times.
void decode_header(std::string&& json, uint64_t header_offset, uint16_t major, const std::string& what,
                   TzipHeader* out);
bool parse_hex64(const std::string& s, uint64_t* out);
// The stored form of a header JSON (kFlagHeaderZstd): one zstd frame that
// records its content size. unpack_header checks what section 3.2 requires
// (a single frame, the declared size <= kMaxHeaderBytes and exact) and
// throws kBadInput naming `what`.
std::string pack_header(const std::string& json);
std::string unpack_header(const uint8_t* p, size_t n, const std::string& what);
void link_segments(TzipHeader* h);

// What the references module (file_refs.cpp) needs of a Reader's insides.
struct ReaderAccess {
  // A Reader reached through `via` (cycles and depth checked on open).
  static std::unique_ptr<Reader> open(const std::string& path, unsigned threads, const refs::Chain& via);
  // From now on, a frame is checked against its header xxh64 before use.
  static void verify_frames_on_use(Reader& r);
  // Computes the whole-file checksum from the bytes (kBadInput if it is not
  // the trailer's).
  static void check_file_checksum(Reader& r);
};

}  // namespace tz::container::detail
