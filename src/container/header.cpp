// .tzip header JSON: encoding and strict validation (doc/container.md,
// "Header" and "Safe reading").
#include <algorithm>
#include <map>
#include <set>

#include <zstd.h>

#include "codec/policy.h"
#include "internal.hpp"
#include "file_io.hpp"
#include "strict_json.hpp"

namespace tz::container {

uint64_t TensorEntry::compressed_size() const {
  uint64_t s = 0;
  for (const auto& f : frames) s += f.size;
  return s;
}

uint64_t TensorEntry::block_bytes() const {
  return (uint64_t)block_elems * detail::codec_elem_size(codec_dtype);
}

uint64_t TensorEntry::n_blocks() const {
  const uint64_t bb = block_bytes();
  return bb ? (raw_size() + bb - 1) / bb : 0;
}

}  // namespace tz::container

namespace tz::container::detail {

// Codec dtype names and sizes: the codec's own (codec/format.h).
const char* codec_dtype_name(tz_dtype d) {
  const char* n = (unsigned)d < tz::kDTypeCount ? tz::dtype_name((uint8_t)d) : nullptr;
  return n ? n : "?";
}
bool codec_dtype_from_name(const std::string& s, tz_dtype* out) {
  for (uint8_t d = 0; d < tz::kDTypeCount; ++d)
    if (s == tz::dtype_name(d)) {
      *out = (tz_dtype)d;
      return true;
    }
  return false;
}
unsigned codec_elem_size(tz_dtype d) { return tz::dtype_elem_size((uint8_t)d); }
unsigned default_block_elems(tz_dtype d) { return tz::policy_block_elems(0, (uint8_t)d); }  // the codec's rule

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

namespace {

// Keys in sorted order, as the std::map-backed DOM of earlier writers wrote
// them (the bytes of a header are unchanged).
void encode_segment(JsonWriter& w, const TensorEntry& t) {
  w.begin_object();
  w.key("codec");
  w.begin_object();
  w.key("block_elems"), w.u64(t.block_elems);
  w.key("dtype"), w.string(codec_dtype_name(t.codec_dtype));
  w.key("level"), w.i64(t.level);
  w.end_object();
  w.key("data_offsets");
  w.begin_array(), w.u64(t.data_begin), w.u64(t.data_end), w.end_array();
  if (!t.is_gap) w.key("dtype"), w.string(t.dtype);
  w.key("frames");
  w.begin_array();
  for (const auto& f : t.frames) {
    w.begin_object();
    w.key("offset"), w.u64(f.offset);
    w.key("size"), w.u64(f.size);
    w.key("xxh64"), w.string(hex64(f.xxh64));
    w.end_object();
  }
  w.end_array();
  if (!t.is_gap) w.key("name"), w.string(t.name);
  if (t.predict.kind != PredictKind::kNone) {
    w.key("predict");
    w.begin_object();
    w.key("kind"), w.string(t.predict.kind == PredictKind::kCast ? "cast" : "delta");
    if (t.predict.ref >= 0) w.key("ref"), w.i64(t.predict.ref);
    if (t.predict.kind == PredictKind::kCast) w.key("source"), w.string(t.predict.source);
    w.end_object();
  }
  if (!t.is_gap) {
    w.key("shape");
    w.begin_array();
    for (uint64_t d : t.shape) w.u64(d);
    w.end_array();
  }
  w.end_object();
}

void encode_map(JsonWriter& w, const std::map<std::string, std::string>& m) {
  w.begin_object();
  for (const auto& [k, v] : m) w.key(k), w.string(v);
  w.end_object();
}

}  // namespace

std::string encode_header(const TzipHeader& h) {
  std::string out;
  out.reserve(4096 + h.safetensors_header.size() * 5 / 4 + (h.tensors.size() + h.gaps.size()) * 256);
  JsonWriter w(&out);
  w.begin_object();
  w.key("chunk_bytes"), w.u64(h.chunk_bytes);
  w.key("created_by"), w.string(h.created_by);
  w.key("data_size"), w.u64(h.data_size);
  w.key("format"), w.string("tzip");
  w.key("gaps");
  w.begin_array();
  for (const auto& e : h.gaps) encode_segment(w, e);
  w.end_array();
  w.key("metadata"), encode_map(w, h.metadata);
  if (h.major >= 2) {
    w.key("references");
    w.begin_array();
    for (const auto& e : h.references) {
      w.begin_object();
      w.key("file"), w.string(e.file);
      if (e.has_header_xxh64) w.key("header_xxh64"), w.string(hex64(e.header_xxh64));
      w.key("xxh64"), w.string(hex64(e.xxh64));
      w.end_object();
    }
    w.end_array();
  }
  w.key("safetensors_header"), w.string(h.safetensors_header);
  w.key("tensors");
  w.begin_array();
  for (const auto& e : h.tensors) encode_segment(w, e);
  w.end_array();
  w.key("user_metadata"), encode_map(w, h.user_metadata);
  w.key("version"), w.u64(h.major);
  w.end_object();
  return out;
}

void link_segments(TzipHeader* h) {
  h->segments.clear();
  for (const auto& t : h->tensors) h->segments.push_back(&t);
  for (const auto& t : h->gaps) h->segments.push_back(&t);
  std::stable_sort(h->segments.begin(), h->segments.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->data_end < b->data_end;
  });
}

namespace {
// One zstd frame (RFC 8878 section 3.1.1) holding `json` in raw blocks:
// single segment, 8-byte content size, no checksum (the trailer's
// header_xxh64 covers the stored bytes).
std::string raw_zstd_frame(const std::string& json) {
  constexpr size_t kBlockMax = 128 * 1024;
  std::string out;
  out.reserve(json.size() + 16 + 3 * (json.size() / kBlockMax + 1));
  const uint8_t magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
  out.append(reinterpret_cast<const char*>(magic), 4);
  out.push_back((char)0xE0);  // FCS_Field_Size 3 (8 bytes), Single_Segment
  uint8_t fcs[8];
  put_le64(fcs, json.size());
  out.append(reinterpret_cast<const char*>(fcs), 8);
  size_t pos = 0;
  do {
    const size_t n = std::min(kBlockMax, json.size() - pos);
    const bool last = pos + n == json.size();
    const uint32_t bh = (uint32_t)last | (0u << 1) | ((uint32_t)n << 3);  // Block_Type 0: raw
    out.push_back((char)(bh & 0xFF));
    out.push_back((char)((bh >> 8) & 0xFF));
    out.push_back((char)((bh >> 16) & 0xFF));
    out.append(json, pos, n);
    pos += n;
  } while (pos < json.size());
  return out;
}
}  // namespace

// Headers hold repetitive JSON (names, shapes, frame lists). Level 9 packs
// them 7-13x at about 50-100 MB/s; above 1 MiB of JSON (some 4,000 tensors)
// level 1 is used, some 10x faster at a few percent more bytes (200,000
// tensors: 59.8 MB of JSON in 0.13 s to 2.11 MB, where level 9 takes 1.2 s
// for 1.98 MB), so writing a header stays linear and cheap in the tensor
// count. Both are deterministic functions of the JSON. A header that packs better
// than kMaxHeaderInflation (long runs of empty delta frames) is stored in raw
// blocks, so that every file a writer makes passes the reader's bound.
std::string pack_header(const std::string& json) {
  std::string out(ZSTD_compressBound(json.size()), '\0');
  const int level = json.size() <= (1u << 20) ? 9 : 1;
  const size_t r = ZSTD_compress(out.data(), out.size(), json.data(), json.size(), level);
  if (ZSTD_isError(r)) fail(ErrorKind::kInternal, std::string("header compression failed: ") + ZSTD_getErrorName(r));
  out.resize(r);
  if (json.size() > kMaxHeaderInflation * out.size()) return raw_zstd_frame(json);
  return out;
}

std::string unpack_header(const uint8_t* p, size_t n, const std::string& what) {
  const unsigned long long size = ZSTD_getFrameContentSize(p, n);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN)
    fail(ErrorKind::kBadInput, what + ": .tzip header is not a zstd frame with a recorded size (header corrupted)");
  if (size > kMaxHeaderBytes)
    fail(ErrorKind::kBadInput, what + ": .tzip header declares " + std::to_string(size) + " bytes, over the " +
                                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  // Checked before any memory is spent on it (n <= file size, so this also
  // bounds the header by kMaxHeaderInflation x the file size).
  if (size > kMaxHeaderInflation * (unsigned long long)n)
    fail(ErrorKind::kBadInput, what + ": .tzip header of " + std::to_string(n) + " stored bytes declares " +
                                   std::to_string(size) + " bytes, more than " + std::to_string(kMaxHeaderInflation) +
                                   " times its stored size (header corrupted or hostile)");
  if (ZSTD_findFrameCompressedSize(p, n) != n)
    fail(ErrorKind::kBadInput, what + ": .tzip header is not exactly one zstd frame (header corrupted)");
  std::string out(size, '\0');
  const size_t r = ZSTD_decompress(out.data(), out.size(), p, n);
  if (ZSTD_isError(r) || r != size)
    fail(ErrorKind::kBadInput, what + ": .tzip header does not decompress (header corrupted)");
  return out;
}

}  // namespace tz::container::detail
