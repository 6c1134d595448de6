// safetensors header parsing with strict validation (doc/container.md,
// "safetensors import"). The file is untrusted: every size is checked with
// overflow-safe arithmetic before use.
#include <algorithm>
#include <set>
#include <string_view>

#include "tensorzip/container.hpp"
#include "internal.hpp"
#include "file_io.hpp"
#include "strict_json.hpp"

namespace tz::container {

using detail::fail;

namespace {
struct DTypeRow {
  std::string_view name;  // compared length first: a header of 10^5 tensors looks its dtypes up 3x each
  unsigned bits;
  tz_dtype codec;
};
// Every dtype of safetensors 0.8 (including the sub-byte MX types). The codec is lossless
// for any bytes; the float codecs only code better where the data has their layout. Chosen by
// measurement on real tensors (bench/dtype_codec_bench.py, bench/experiments/notebook.md "Codec of the
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

}  // namespace detail

using namespace detail;

namespace detail {

namespace {

// One tensor entry of the header (the value of key `name`), checked on its
// own: types, dtype, shape x dtype = data_offsets span, inside the data section.
TensorEntry read_entry(JsonReader& r, std::string_view name, uint64_t data_size, const std::string& what) {
  TensorEntry t;
  t.name = std::string(name);
  const std::string tw = what + ": tensor '" + t.name + "'";
  if (t.name.empty()) fail(ErrorKind::kBadInput, what + ": tensor with an empty name");
  if (r.peek() != JsonReader::Kind::kObject) {
    r.skip();  // a syntax or depth error in it is reported first
    fail(ErrorKind::kBadInput, tw + ": entry is not an object");
  }
  bool has_dtype = false, has_shape = false, offsets_array = false;
  const char* shape_bad = nullptr;    // the first value that is not a size, and why
  const char* offsets_bad = nullptr;
  size_t n_offsets = 0;
  uint64_t offs[2] = {0, 0};
  r.for_each_member([&](std::string_view k) {
    if (k == "dtype") {
      if (r.peek() != JsonReader::Kind::kString) fail(ErrorKind::kBadInput, tw + ": missing or non-string dtype");
      t.dtype = std::string(r.read_string());
      has_dtype = true;
    } else if (k == "shape") {
      if (r.peek() != JsonReader::Kind::kArray) fail(ErrorKind::kBadInput, tw + ": missing or non-array shape");
      has_shape = true;
      r.for_each_element([&] {
        if (t.shape.size() >= 64) fail(ErrorKind::kBadInput, tw + ": shape has more than 64 dimensions");
        uint64_t dim = 0;
        const char* why = r.read_u64_why(&dim);
        if (why && !shape_bad) shape_bad = why;
        t.shape.push_back(dim);
      });
    } else if (k == "data_offsets") {
      if (r.peek() != JsonReader::Kind::kArray) {
        r.skip();
        return;
      }
      offsets_array = true;
      r.for_each_element([&] {
        uint64_t v = 0;
        const char* why = r.read_u64_why(&v);
        if (why && !offsets_bad) offsets_bad = why;
        if (n_offsets < 2) offs[n_offsets] = v;
        ++n_offsets;
      });
    } else {
      r.skip();  // extra keys are kept in the verbatim header
    }
  });
  if (!has_dtype) fail(ErrorKind::kBadInput, tw + ": missing or non-string dtype");
  if (!has_shape) fail(ErrorKind::kBadInput, tw + ": missing or non-array shape");
  if (!offsets_array || n_offsets != 2)
    fail(ErrorKind::kBadInput, tw + ": data_offsets is not an array of two integers");
  if (!codec_dtype_for(t.dtype, &t.codec_dtype)) fail(ErrorKind::kBadInput, tw + ": unknown dtype '" + t.dtype + "'");
  if (shape_bad) fail(ErrorKind::kBadInput, tw + ": shape holds a value that is " + shape_bad);
  if (offsets_bad) fail(ErrorKind::kBadInput, tw + ": data_offsets hold a value that is " + offsets_bad);
  t.data_begin = offs[0];
  t.data_end = offs[1];
  if (t.data_begin > t.data_end)
    fail(ErrorKind::kBadInput, tw + ": data_offsets [" + std::to_string(t.data_begin) + ", " +
                                   std::to_string(t.data_end) + "] are reversed");
  if (t.data_end > data_size)
    fail(ErrorKind::kBadInput, tw + ": data_offsets [" + std::to_string(t.data_begin) + ", " +
                                   std::to_string(t.data_end) + "] out of range (data section is " +
                                   std::to_string(data_size) + " bytes)");
  const uint64_t nbytes = tensor_nbytes(t.dtype, t.shape, what, t.name);
  if (nbytes != t.data_end - t.data_begin)
    fail(ErrorKind::kBadInput, tw + ": shape " + shape_string(t.shape) + " x " + t.dtype + " is " +
                                   std::to_string(nbytes) + " bytes but data_offsets span " +
                                   std::to_string(t.data_end - t.data_begin));
  return t;
}

}  // namespace

void parse_safetensors_json(const char* header, size_t header_len, uint64_t data_size, const std::string& what,
                            SafetensorsInfo* out, const std::function<void(TensorEntry&&)>& on_tensor) {
  SafetensorsInfo& info = *out;
  info.data_size = data_size;
  if (header_len < 2 || header[0] != '{')
    fail(ErrorKind::kBadInput, what + ": not a safetensors file (header does not start with '{')");
  JsonReader r(header, header_len, what, "safetensors header");
  // Entries are read in file order, validated as each one closes, and kept
  // as TensorEntry only: memory is linear in what is kept, within
  // kMaxTableBytes. The table is reserved from a count of the entries' keys
  // (untouched capacity costs no memory; growth by doubling would briefly
  // hold two copies).
  uint64_t table_bytes = 0;
  size_t n_tensors = 0;
  if (!on_tensor) info.tensors.reserve(count_occurrences(std::string_view(header, header_len), "\"data_offsets\"", kMaxTensors));
  r.for_each_member([&](std::string_view key) {
    if (key == "__metadata__") {
      if (r.peek() != JsonReader::Kind::kObject) fail(ErrorKind::kBadInput, what + ": __metadata__ is not an object");
      r.for_each_member([&](std::string_view mk) {
        if (r.peek() != JsonReader::Kind::kString)
          fail(ErrorKind::kBadInput, what + ": __metadata__ value of '" + std::string(mk) + "' is not a string");
        std::string k(mk);
        info.metadata[std::move(k)] = std::string(r.read_string());
      });
      return;
    }
    if (++n_tensors > kMaxTensors)
      fail(ErrorKind::kBadInput, what + ": too many tensors (limit " + std::to_string(kMaxTensors) + ")");
    TensorEntry t = read_entry(r, key, info.data_size, what);
    table_bytes += sizeof(TensorEntry) + t.name.size() + t.dtype.size() + 8 * t.shape.size();
    if (table_bytes > kMaxTableBytes)
      fail(ErrorKind::kBadInput, what + ": tensor table larger than " + std::to_string(kMaxTableBytes >> 20) + " MiB");
    if (on_tensor) on_tensor(std::move(t));
    else info.tensors.push_back(std::move(t));
  });
  r.finish();
  if (on_tensor) return;
  // Data order; ties (zero-size tensors) by end offset, then name.
  std::sort(info.tensors.begin(), info.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
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
}

}  // namespace detail

namespace {
// The header bytes become info.header_bytes (no second copy).
SafetensorsInfo parse_owned_header(std::string&& header, uint64_t file_size, const std::string& what) {
  SafetensorsInfo info;
  const size_t header_len = header.size();
  info.file_size = file_size;
  info.header_len = header_len;
  info.data_start = 8 + (uint64_t)header_len;
  if (info.data_start > file_size)
    fail(ErrorKind::kBadInput, what + ": not a safetensors file (header length " + std::to_string(header_len) +
                                   " larger than the file, " + std::to_string(file_size) + " bytes)");
  info.header_bytes = std::move(header);
  parse_safetensors_json(info.header_bytes.data(), header_len, file_size - info.data_start, what, &info);
  return info;
}
}  // namespace

SafetensorsInfo parse_safetensors_header(const uint8_t* header, size_t header_len, uint64_t file_size,
                                         const std::string& what) {
  if (8 + (uint64_t)header_len > file_size)
    fail(ErrorKind::kBadInput, what + ": not a safetensors file (header length " + std::to_string(header_len) +
                                   " larger than the file, " + std::to_string(file_size) + " bytes)");
  return parse_owned_header(std::string(reinterpret_cast<const char*>(header), header_len), file_size, what);
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
  return parse_owned_header(std::move(h), f.size(), path);
}

}  // namespace tz::container
