// safetensors header parsing with strict validation (doc/container.md,
// "safetensors import"). The file is untrusted: every size is checked with
// overflow-safe arithmetic before use.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "tensorzip/container.hpp"
#include "tzc_internal.hpp"
#include "tzc_io.hpp"

namespace tz::container {

using detail::fail;
using nlohmann::json;

namespace {
struct DTypeRow {
  const char* name;
  unsigned bits;
  tz_dtype codec;
};
// Every dtype of safetensors 0.8 (including the sub-byte MX types). The codec is lossless
// for any bytes; the float codecs only code better where the data has their layout. Chosen by
// measurement on real tensors (bench/dtype_codec_bench.py, bench/RESULTS.md "Codec of the
// dtypes added for safetensors parity"): F8_E4M3FNUZ / F8_E5M2FNUZ (the bit fields of F8_E4M3 /
// F8_E5M2, another bias) and F8_E8M0 (MX block scales: an 8-bit exponent) code better with the
// FP8 codec (E8M0 scales 6.5x against 5.2x), C64 (two F32 per element) with the F32 codec
// (1.20-1.26x against 1.08-1.11x); packed FP4 stays on the byte codec (the FP8 codec gains
// under 1.5% on MXFP4 elements). The codec dtype is recorded per tensor, so changing a choice
// here keeps older files readable.
constexpr DTypeRow kDTypes[] = {
    {"BOOL", 8, TZ_DTYPE_BYTES},     {"U8", 8, TZ_DTYPE_BYTES},        {"I8", 8, TZ_DTYPE_BYTES},
    {"F8_E5M2", 8, TZ_DTYPE_F8_E5M2}, {"F8_E4M3", 8, TZ_DTYPE_F8_E4M3}, {"F8_E8M0", 8, TZ_DTYPE_F8_E4M3},
    {"F8_E4M3FNUZ", 8, TZ_DTYPE_F8_E4M3}, {"F8_E5M2FNUZ", 8, TZ_DTYPE_F8_E5M2},
    {"I16", 16, TZ_DTYPE_BYTES},     {"U16", 16, TZ_DTYPE_BYTES},      {"F16", 16, TZ_DTYPE_F16},
    {"BF16", 16, TZ_DTYPE_BF16},     {"I32", 32, TZ_DTYPE_BYTES},      {"U32", 32, TZ_DTYPE_BYTES},
    {"F32", 32, TZ_DTYPE_F32},       {"F64", 64, TZ_DTYPE_BYTES},      {"I64", 64, TZ_DTYPE_BYTES},
    {"U64", 64, TZ_DTYPE_BYTES},     {"C64", 64, TZ_DTYPE_F32},      {"F4", 4, TZ_DTYPE_BYTES},
    {"F6_E2M3", 6, TZ_DTYPE_BYTES},  {"F6_E3M2", 6, TZ_DTYPE_BYTES},
};
}  // namespace

unsigned dtype_bits(const std::string& s) {
  for (const auto& r : kDTypes)
    if (s == r.name) return r.bits;
  return 0;
}

bool codec_dtype_for(const std::string& s, tz_dtype* out) {
  for (const auto& r : kDTypes)
    if (s == r.name) {
      if (out) *out = r.codec;
      return true;
    }
  return false;
}

namespace detail {

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

uint64_t tensor_nbytes(const std::string& dtype, const std::vector<uint64_t>& shape, const std::string& what,
                       const std::string& name) {
  const unsigned bits = dtype_bits(dtype);
  if (bits == 0) fail(ErrorKind::kBadInput, what + ": tensor '" + name + "': unknown dtype '" + dtype + "'");
  uint64_t n = 1;
  for (uint64_t d : shape)
    if (!checked_mul(n, d, &n))
      fail(ErrorKind::kBadInput, what + ": tensor '" + name + "': shape element count overflows 64 bits");
  uint64_t total_bits;
  if (!checked_mul(n, bits, &total_bits))
    fail(ErrorKind::kBadInput, what + ": tensor '" + name + "': shape x dtype size overflows 64 bits");
  if (total_bits % 8 != 0)
    fail(ErrorKind::kBadInput, what + ": tensor '" + name + "': " + std::to_string(n) + " elements of " + dtype +
                                   " do not fill whole bytes");
  return total_bits / 8;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Parses JSON and rejects duplicate keys in any object (nlohmann keeps the
// last one silently; two readers could then disagree on a tensor).
json parse_json_strict(const char* begin, const char* end, const std::string& what, const std::string& part) {
  std::vector<std::set<std::string>> keys;
  std::string dup;
  struct TooDeep {};
  // Both formats nest 3 levels; a cap stops hostile headers from costing
  // gigabytes of DOM nodes.
  constexpr int kMaxDepth = 32;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > kMaxDepth) throw TooDeep{};
    switch (ev) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end: if (!keys.empty()) keys.pop_back(); break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && dup.empty())
          dup = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const TooDeep&) {
    fail(ErrorKind::kBadInput, what + ": " + part + " nests deeper than " + std::to_string(kMaxDepth) + " levels");
  } catch (const json::exception& e) {
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> keep the part after "] "
    const auto p = msg.find("] ");
    if (p != std::string::npos) msg = msg.substr(p + 2);
    fail(ErrorKind::kBadInput, what + ": " + part + " is not valid JSON (" + msg + ")");
  }
  if (!dup.empty()) fail(ErrorKind::kBadInput, what + ": " + part + " has duplicate key '" + dup + "'");
  return j;
}

bool get_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = (uint64_t)s;
    return true;
  }
  return false;
}

}  // namespace detail

using namespace detail;

SafetensorsInfo parse_safetensors_header(const uint8_t* header, size_t header_len, uint64_t file_size,
                                         const std::string& what) {
  SafetensorsInfo info;
  info.file_size = file_size;
  info.header_len = header_len;
  info.data_start = 8 + (uint64_t)header_len;
  if (info.data_start > file_size)
    fail(ErrorKind::kBadInput, what + ": not a safetensors file (header length " + std::to_string(header_len) +
                                   " larger than the file, " + std::to_string(file_size) + " bytes)");
  info.data_size = file_size - info.data_start;
  if (header_len < 2 || header[0] != '{')
    fail(ErrorKind::kBadInput, what + ": not a safetensors file (header does not start with '{')");
  info.header_bytes.assign(reinterpret_cast<const char*>(header), header_len);
  const json j = parse_json_strict(info.header_bytes.data(), info.header_bytes.data() + header_len, what,
                                   "safetensors header");
  if (!j.is_object()) fail(ErrorKind::kBadInput, what + ": safetensors header is not a JSON object");
  if (j.size() > kMaxTensors) fail(ErrorKind::kBadInput, what + ": too many tensors (limit " + std::to_string(kMaxTensors) + ")");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(ErrorKind::kBadInput, what + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(ErrorKind::kBadInput, what + ": __metadata__ value of '" + m.key() + "' is not a string");
        info.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tw = what + ": tensor '" + name + "'";
    if (name.empty()) fail(ErrorKind::kBadInput, what + ": tensor with an empty name");
    if (!v.is_object()) fail(ErrorKind::kBadInput, tw + ": entry is not an object");
    const auto d = v.find("dtype");
    const auto s = v.find("shape");
    const auto o = v.find("data_offsets");
    if (d == v.end() || !d->is_string()) fail(ErrorKind::kBadInput, tw + ": missing or non-string dtype");
    if (s == v.end() || !s->is_array()) fail(ErrorKind::kBadInput, tw + ": missing or non-array shape");
    if (o == v.end() || !o->is_array() || o->size() != 2)
      fail(ErrorKind::kBadInput, tw + ": data_offsets is not an array of two integers");
    TensorEntry t;
    t.name = name;
    t.dtype = d->get<std::string>();
    if (!codec_dtype_for(t.dtype, &t.codec_dtype)) fail(ErrorKind::kBadInput, tw + ": unknown dtype '" + t.dtype + "'");
    if (s->size() > 64) fail(ErrorKind::kBadInput, tw + ": shape has more than 64 dimensions");
    for (const json& e : *s) {
      uint64_t dim;
      if (!get_u64(e, &dim)) fail(ErrorKind::kBadInput, tw + ": shape holds a non-integer or negative value");
      t.shape.push_back(dim);
    }
    if (!get_u64((*o)[0], &t.data_begin) || !get_u64((*o)[1], &t.data_end))
      fail(ErrorKind::kBadInput, tw + ": data_offsets hold a non-integer or negative value");
    if (t.data_begin > t.data_end)
      fail(ErrorKind::kBadInput, tw + ": data_offsets [" + std::to_string(t.data_begin) + ", " +
                                     std::to_string(t.data_end) + "] are reversed");
    if (t.data_end > info.data_size)
      fail(ErrorKind::kBadInput, tw + ": data_offsets [" + std::to_string(t.data_begin) + ", " +
                                     std::to_string(t.data_end) + "] out of range (data section is " +
                                     std::to_string(info.data_size) + " bytes)");
    const uint64_t nbytes = tensor_nbytes(t.dtype, t.shape, what, name);
    if (nbytes != t.data_end - t.data_begin)
      fail(ErrorKind::kBadInput, tw + ": shape " + shape_string(t.shape) + " x " + t.dtype + " is " +
                                     std::to_string(nbytes) + " bytes but data_offsets span " +
                                     std::to_string(t.data_end - t.data_begin));
    info.tensors.push_back(std::move(t));
  }
  std::stable_sort(info.tensors.begin(), info.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  // Non-overlapping; uncovered bytes become gaps so that export is byte-identical.
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : info.tensors) {
    if (t.data_begin < pos)
      fail(ErrorKind::kBadInput, what + ": tensors '" + prev->name + "' and '" + t.name + "' overlap (data_offsets [" +
                                     std::to_string(prev->data_begin) + ", " + std::to_string(prev->data_end) +
                                     "] and [" + std::to_string(t.data_begin) + ", " + std::to_string(t.data_end) + "])");
    if (t.data_begin > pos) {
      TensorEntry g;
      g.is_gap = true;
      g.data_begin = pos;
      g.data_end = t.data_begin;
      info.gaps.push_back(g);
    }
    if (t.data_end > pos || t.data_begin == t.data_end) {
      pos = std::max(pos, t.data_end);
      prev = &t;
    }
  }
  if (pos < info.data_size) {
    TensorEntry g;
    g.is_gap = true;
    g.data_begin = pos;
    g.data_end = info.data_size;
    info.gaps.push_back(g);
  }
  return info;
}

SafetensorsInfo read_safetensors_info(const std::string& path) {
  InFile f(path);
  if (f.size() < 8) fail(ErrorKind::kBadInput, path + ": not a safetensors file (only " + std::to_string(f.size()) + " bytes)");
  uint8_t len8[8];
  f.pread_exact(0, len8, 8);
  if (len8[0] == 'T' && len8[1] == 'Z' && len8[2] == 'I' && len8[3] == 'P')
    fail(ErrorKind::kBadInput, path + ": not a safetensors file (it is a .tzip file already)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  if (n > kMaxHeaderBytes) {
    if (n > f.size() - 8)
      fail(ErrorKind::kBadInput, path + ": not a safetensors file (header length " + std::to_string(n) +
                                     " larger than the file, " + std::to_string(f.size()) + " bytes)");
    fail(ErrorKind::kBadInput, path + ": safetensors header of " + std::to_string(n) + " bytes exceeds the " +
                                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (n > f.size() - 8)
    fail(ErrorKind::kBadInput, path + ": not a safetensors file (header length " + std::to_string(n) +
                                   " larger than the file, " + std::to_string(f.size()) + " bytes)");
  std::string h(n, '\0');
  f.pread_exact(8, h.data(), n);
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(h.data()), n, f.size(), path);
}

}  // namespace tz::container
