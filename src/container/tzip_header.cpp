// .tzip header JSON: encoding and strict validation (doc/container.md,
// "Header" and "Safe reading").
#include <algorithm>
#include <map>
#include <set>

#include <zstd.h>

#include "tzc_internal.hpp"
#include "tzc_io.hpp"

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

using nlohmann::json;

namespace {
struct CodecName {
  tz_dtype d;
  const char* name;
  unsigned size;
};
constexpr CodecName kCodecNames[] = {
    {TZ_DTYPE_BYTES, "bytes", 1},     {TZ_DTYPE_BF16, "bf16", 2},        {TZ_DTYPE_F16, "f16", 2},
    {TZ_DTYPE_F32, "f32", 4},         {TZ_DTYPE_F8_E4M3, "f8_e4m3", 1}, {TZ_DTYPE_F8_E5M2, "f8_e5m2", 1},
};
}  // namespace

const char* codec_dtype_name(tz_dtype d) {
  for (const auto& c : kCodecNames)
    if (c.d == d) return c.name;
  return "?";
}
bool codec_dtype_from_name(const std::string& s, tz_dtype* out) {
  for (const auto& c : kCodecNames)
    if (s == c.name) {
      *out = c.d;
      return true;
    }
  return false;
}
unsigned codec_elem_size(tz_dtype d) {
  for (const auto& c : kCodecNames)
    if (c.d == d) return c.size;
  return 1;
}
unsigned default_block_elems(tz_dtype d) { return d == TZ_DTYPE_BYTES ? (1u << 18) : (1u << 16); }

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

namespace {

json encode_segment(const TensorEntry& t) {
  json j = json::object();
  if (!t.is_gap) {
    j["name"] = t.name;
    j["dtype"] = t.dtype;
    j["shape"] = t.shape;
  }
  j["data_offsets"] = {t.data_begin, t.data_end};
  j["codec"] = {{"dtype", codec_dtype_name(t.codec_dtype)}, {"level", t.level}, {"block_elems", t.block_elems}};
  json fr = json::array();
  for (const auto& f : t.frames) fr.push_back({{"offset", f.offset}, {"size", f.size}, {"xxh64", hex64(f.xxh64)}});
  j["frames"] = std::move(fr);
  if (t.predict.kind != PredictKind::kNone) {
    json pj = {{"kind", t.predict.kind == PredictKind::kCast ? "cast" : "delta"}};
    if (t.predict.ref >= 0) pj["ref"] = t.predict.ref;
    if (t.predict.kind == PredictKind::kCast) pj["source"] = t.predict.source;
    j["predict"] = std::move(pj);
  }
  return j;
}

}  // namespace

std::string encode_header(const TzipHeader& h) {
  json j = json::object();
  j["format"] = "tzip";
  j["version"] = h.major;
  j["created_by"] = h.created_by;
  j["chunk_bytes"] = h.chunk_bytes;
  j["data_size"] = h.data_size;
  j["metadata"] = h.metadata;
  j["user_metadata"] = h.user_metadata;
  j["safetensors_header"] = h.safetensors_header;
  json t = json::array(), g = json::array();
  for (const auto& e : h.tensors) t.push_back(encode_segment(e));
  for (const auto& e : h.gaps) g.push_back(encode_segment(e));
  j["tensors"] = std::move(t);
  j["gaps"] = std::move(g);
  if (h.major >= 2) {
    json r = json::array();
    for (const auto& e : h.references) {
      json rj = {{"file", e.file}, {"xxh64", hex64(e.xxh64)}};
      if (e.has_header_xxh64) rj["header_xxh64"] = hex64(e.header_xxh64);
      r.push_back(std::move(rj));
    }
    j["references"] = std::move(r);
  }
  try {
    return j.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    // Only user-given strings can be invalid UTF-8: parsed headers were validated.
    fail(ErrorKind::kUsage, "metadata and tensor names must be valid UTF-8");
  }
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

// Level 9: headers hold repetitive JSON (names, shapes, frame lists), which
// this level packs 7-13x at about 100 MB/s, so even the ~1 MB header of a
// rank file with 10^4 tensors costs milliseconds. A header that packs better
// than kMaxHeaderInflation (long runs of empty delta frames) is stored in raw
// blocks, so that every file a writer makes passes the reader's bound.
std::string pack_header(const std::string& json) {
  std::string out(ZSTD_compressBound(json.size()), '\0');
  const size_t r = ZSTD_compress(out.data(), out.size(), json.data(), json.size(), 9);
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
