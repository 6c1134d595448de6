// .tzip header JSON: strict, streaming validation (doc/container.md,
// "Header" and "Safe reading"). The JSON is read once, in order, with the
// pull reader of strict_json.hpp; only validated fields are kept, so time is
// linear in the header and memory linear in what the header describes.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "codec/format.h"
#include "internal.hpp"
#include "file_io.hpp"
#include "strict_json.hpp"

namespace tz::container::detail {

namespace {

using Kind = JsonReader::Kind;

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  fail(ErrorKind::kBadInput, what + ": corrupt .tzip header: " + msg);
}

bool parse_hex(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t r = 0;
  for (char ch : s) {
    int v;
    if (ch >= '0' && ch <= '9') v = ch - '0';
    else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
    else return false;
    r = (r << 4) | (uint64_t)v;
  }
  *out = r;
  return true;
}

// A field read from the JSON: present, and of the expected type/range.
struct U64Field {
  bool present = false, ok = false;
  uint64_t v = 0;
  void read(JsonReader& r) {
    present = true;
    ok = r.read_u64(&v);
  }
};

// Everything of a segment object, read in whatever order its keys come;
// checked afterwards (check_segment), in a fixed order, so that messages do
// not depend on key order.
struct RawSegment {
  bool is_object = true;
  bool has_name = false, name_ok = false, has_dtype = false, dtype_ok = false;
  bool has_shape = false, shape_ok = true;
  bool offsets_ok = false;
  bool has_codec = false, codec_dtype_ok = false, level_ok = false;
  U64Field block_elems;
  int64_t level = 0;
  bool has_frames = false, frames_ok = true;
  std::string frame_error;
  bool has_predict = false;
  std::string predict_error;
  bool offsets_array = false, offsets_int = true;
  size_t n_offsets = 0;
  uint64_t offsets[2] = {0, 0};
};

void read_codec(JsonReader& r, RawSegment& raw, TensorEntry* t) {
  if (r.peek() != Kind::kObject) {
    r.skip();
    return;
  }
  raw.has_codec = true;
  r.for_each_member([&](std::string_view ck) {
    if (ck == "dtype") {
      if (r.peek() == Kind::kString)
        raw.codec_dtype_ok = codec_dtype_from_name(std::string(r.read_string()), &t->codec_dtype);
      else
        r.skip();
    } else if (ck == "level") {
      raw.level_ok = r.read_i64(&raw.level);
    } else if (ck == "block_elems") {
      raw.block_elems.read(r);
    } else {
      r.skip();
    }
  });
}

void read_frames(JsonReader& r, RawSegment& raw, TensorEntry* t) {
  if (r.peek() != Kind::kArray) {
    r.skip();
    return;
  }
  raw.has_frames = true;
  r.for_each_element([&] {
    if (r.peek() != Kind::kObject) {
      r.skip();
      if (raw.frame_error.empty()) raw.frame_error = "frame is not an object";
      return;
    }
    FrameRef f;
    U64Field off, size;
    bool hash_ok = false;
    r.for_each_member([&](std::string_view k) {
      if (k == "offset") off.read(r);
      else if (k == "size") size.read(r);
      else if (k == "xxh64" && r.peek() == Kind::kString) hash_ok = parse_hex(r.read_string(), &f.xxh64);
      else r.skip();
    });
    if (raw.frame_error.empty()) {
      if (!off.ok) raw.frame_error = "offset missing or not a non-negative integer";
      else if (!size.ok) raw.frame_error = "size missing or not a non-negative integer";
      else if (!hash_ok) raw.frame_error = "bad frame xxh64";
    }
    f.offset = off.v;
    f.size = size.v;
    t->frames.push_back(f);
  });
}

void read_predict(JsonReader& r, RawSegment& raw, TensorEntry* t) {
  raw.has_predict = true;
  if (r.peek() != Kind::kObject) {
    r.skip();
    raw.predict_error = "bad predict";
    return;
  }
  bool has_kind = false, kind_string = false, has_ref = false, ref_ok = false, has_source = false;
  std::string kind, unknown;
  uint64_t ref = 0;
  r.for_each_member([&](std::string_view k) {
    if (k == "kind") {
      has_kind = true;
      kind_string = r.peek() == Kind::kString;
      if (kind_string) kind = std::string(r.read_string());
      else r.skip();
    } else if (k == "ref") {
      has_ref = true;
      ref_ok = r.read_u64(&ref) && ref < kMaxTensors;
    } else if (k == "source") {
      if (r.peek() == Kind::kString) {
        t->predict.source = std::string(r.read_string());
        has_source = !t->predict.source.empty();
      } else {
        r.skip();
      }
    } else {
      if (unknown.empty()) unknown = std::string(k);
      r.skip();
    }
  });
  auto& e = raw.predict_error;
  if (!has_kind || !kind_string) e = "predict.kind missing";
  else if (kind == "cast") t->predict.kind = PredictKind::kCast;
  else if (kind == "delta") t->predict.kind = PredictKind::kDelta;
  else e = "unknown predict.kind '" + kind + "'";
  if (e.empty() && has_ref && !ref_ok) e = "bad predict.ref";
  if (e.empty() && has_ref) t->predict.ref = (int)ref;
  if (e.empty() && t->predict.kind == PredictKind::kCast && !has_source) e = "predict.source missing";
  if (e.empty() && t->predict.kind == PredictKind::kDelta && t->predict.ref < 0) e = "delta prediction without a reference";
  if (e.empty() && !unknown.empty()) e = "unknown predict key '" + unknown + "'";
}

void check_segment(const RawSegment& raw, bool gap, const std::string& what, TensorEntry* t);

// Reads one segment object (a tensor, or a gap) and checks what does not
// depend on chunk_bytes.
void read_segment(JsonReader& r, bool gap, const std::string& what, TensorEntry* t) {
  RawSegment raw;
  t->is_gap = gap;
  if (r.peek() != Kind::kObject) bad(what, "segment is not an object");
  r.for_each_member([&](std::string_view k) {
    if (k == "name" && !gap) {
      raw.has_name = true;
      if (r.peek() == Kind::kString) {
        t->name = std::string(r.read_string());
        raw.name_ok = !t->name.empty();
      } else {
        r.skip();
      }
    } else if (k == "dtype" && !gap) {
      raw.has_dtype = r.peek() == Kind::kString;
      if (raw.has_dtype) t->dtype = std::string(r.read_string());
      else r.skip();
    } else if (k == "shape" && !gap) {
      if (r.peek() != Kind::kArray) {
        r.skip();
        return;
      }
      raw.has_shape = true;
      r.for_each_element([&] {
        uint64_t v = 0;
        if (!r.read_u64(&v)) raw.shape_ok = false;
        if (t->shape.size() > 64) {  // "too long": stop keeping them
          raw.shape_ok = false;
          return;
        }
        t->shape.push_back(v);
      });
    } else if (k == "data_offsets") {
      if (r.peek() != Kind::kArray) {
        r.skip();
        return;
      }
      raw.offsets_array = true;
      r.for_each_element([&] {
        uint64_t v = 0;
        if (!r.read_u64(&v)) raw.offsets_int = false;
        if (raw.n_offsets < 2) raw.offsets[raw.n_offsets] = v;
        ++raw.n_offsets;
      });
    } else if (k == "codec") {
      read_codec(r, raw, t);
    } else if (k == "frames") {
      read_frames(r, raw, t);
    } else if (k == "predict") {
      read_predict(r, raw, t);
    } else {
      r.skip();
    }
  });
  check_segment(raw, gap, what, t);
}

// What a segment's own fields must satisfy (in a fixed order, whatever the
// order of its keys).
void check_segment(const RawSegment& raw, bool gap, const std::string& what, TensorEntry* t) {
  std::string ctx = "gap: ";
  if (!gap) {
    if (!raw.name_ok) bad(what, "tensor without a name");
    ctx = "tensor '" + t->name + "': ";
    if (!raw.has_dtype) bad(what, ctx + "dtype missing");
    if (!codec_dtype_for(t->dtype, nullptr)) bad(what, ctx + "unknown dtype '" + t->dtype + "'");
    if (!raw.has_shape || t->shape.size() > 64) bad(what, ctx + "shape missing or too long");
    if (!raw.shape_ok) bad(what, ctx + "shape holds a non-integer");
  }
  if (!raw.offsets_array || raw.n_offsets != 2 || !raw.offsets_int || raw.offsets[0] > raw.offsets[1])
    bad(what, ctx + "bad data_offsets");
  t->data_begin = raw.offsets[0];
  t->data_end = raw.offsets[1];
  if (!gap) {
    uint64_t nbytes = 0;
    try {
      nbytes = tensor_nbytes(t->dtype, t->shape, what, t->name);
    } catch (const Error&) {
      bad(what, ctx + "shape x dtype size overflows or is not whole bytes");
    }
    if (nbytes != t->raw_size()) bad(what, ctx + "shape x dtype does not match data_offsets");
  }
  if (!raw.has_codec) bad(what, ctx + "codec missing");
  if (!raw.codec_dtype_ok) bad(what, ctx + "bad codec dtype");
  if (gap && t->codec_dtype != TZ_DTYPE_BYTES) bad(what, ctx + "gap codec dtype is not bytes");
  if (!raw.level_ok || raw.level < -1 || raw.level > 9) bad(what, ctx + "bad codec level");
  t->level = (int)raw.level;
  if (!raw.block_elems.ok) bad(what, ctx + "block_elems missing or not a non-negative integer");
  const uint64_t be = raw.block_elems.v;
  if (be > UINT32_MAX || !tz::block_elems_valid((uint32_t)be)) bad(what, ctx + "bad block_elems");
  t->block_elems = (unsigned)be;
  if (t->raw_size() % codec_elem_size(t->codec_dtype) != 0) bad(what, ctx + "size is not a whole number of elements");
  if (!raw.has_frames) bad(what, ctx + "frames missing");
  if (!raw.frame_error.empty()) bad(what, ctx + raw.frame_error);
  if (raw.has_predict) {
    if (gap) bad(what, ctx + "bad predict");
    if (!raw.predict_error.empty()) bad(what, ctx + raw.predict_error);
    if (t->predict.kind == PredictKind::kCast && t->dtype != "BF16" && t->dtype != "F16")
      bad(what, ctx + "cast prediction of a " + t->dtype + " tensor");
  }
}

// What needs chunk_bytes (known only once the whole object is read): block
// size, frame count and each frame's raw size, with checked arithmetic, and
// that each frame is large enough for the blocks it must hold.
void check_chunking(TensorEntry& t, uint64_t chunk_bytes, const std::string& what) {
  const std::string ctx = t.is_gap ? "gap at data offset " + std::to_string(t.data_begin) + ": " : "tensor '" + t.name + "': ";
  const uint64_t bb = t.block_bytes();
  if (chunk_bytes % bb != 0) bad(what, ctx + "chunk_bytes is not a multiple of the block size");
  // ceil(raw / chunk) without overflow: raw may be close to 2^64.
  const uint64_t want = t.raw_size() / chunk_bytes + (t.raw_size() % chunk_bytes != 0);
  if (t.frames.size() != want)
    bad(what, ctx + "expected " + std::to_string(want) + " frames, found " + std::to_string(t.frames.size()));
  uint64_t left = t.raw_size();
  for (auto& f : t.frames) {
    f.raw_size = std::min(left, chunk_bytes);
    left -= f.raw_size;
    // A codec frame holds a 32-byte header, a 4-byte index entry per block
    // and at least 8 bytes per block (doc/format.md 3, 6.2); size 0 is an
    // all-zero residual chunk (section 12.2, checked with the tiling).
    const uint64_t blocks = (f.raw_size + bb - 1) / bb;
    if (f.size != 0 && f.size < 32 + 12 * blocks)
      bad(what, ctx + "frame of " + std::to_string(f.size) + " bytes cannot hold " + std::to_string(f.raw_size) +
                    " bytes (" + std::to_string(blocks) + " blocks)");
    // Nor larger than any valid frame of that raw size (every stream of
    // every block at most its raw length, doc/format.md 6.2): reading a frame
    // allocates its size.
    if (f.size > tz_compress_bound(f.raw_size))
      bad(what, ctx + "frame of " + std::to_string(f.size) + " bytes is larger than any frame of " +
                    std::to_string(f.raw_size) + " bytes");
  }
  if (left != 0) bad(what, ctx + "frames do not cover the declared size");
}

bool same_tensor(const TensorEntry& a, const TensorEntry& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data_begin == b.data_begin &&
         a.data_end == b.data_end;
}

void read_string_map(JsonReader& r, const char* key, const std::string& what, std::map<std::string, std::string>* dst) {
  if (r.peek() != Kind::kObject) bad(what, std::string(key) + " is not an object");
  r.for_each_member([&](std::string_view k) {
    if (r.peek() != Kind::kString) bad(what, std::string(key) + " value is not a string");
    std::string name(k);
    (*dst)[std::move(name)] = std::string(r.read_string());
  });
}

void read_references(JsonReader& r, const std::string& what, std::vector<Reference>* out) {
  if (r.peek() != Kind::kArray) bad(what, "references missing");
  r.for_each_element([&] {
    if (out->size() >= kMaxReferences) bad(what, "more than " + std::to_string(kMaxReferences) + " references");
    if (r.peek() != Kind::kObject) bad(what, "reference is not an object");
    Reference ref;
    bool has_file = false, has_sum = false, header_sum_ok = true;
    r.for_each_member([&](std::string_view k) {
      if (k == "file") {
        if (r.peek() == Kind::kString) ref.file = std::string(r.read_string()), has_file = !ref.file.empty();
        else r.skip();
      } else if (k == "xxh64") {
        if (r.peek() == Kind::kString) has_sum = parse_hex(r.read_string(), &ref.xxh64);
        else r.skip();
      } else if (k == "header_xxh64") {
        ref.has_header_xxh64 = true;
        if (r.peek() == Kind::kString) header_sum_ok = parse_hex(r.read_string(), &ref.header_xxh64);
        else r.skip(), header_sum_ok = false;
      } else {
        r.skip();  // keys of later minor versions
      }
    });
    if (!has_file) bad(what, "reference without a file name");
    if (!has_sum) bad(what, "reference without a valid xxh64");
    if (!header_sum_ok) bad(what, "reference with an invalid header_xxh64");
    out->push_back(std::move(ref));
  });
}

// Predictions (section 12): version 2 only; casts within the file name an
// FP32 tensor of the same shape that is not itself a cast (no cycles).
void check_predictions(const TzipHeader& h, bool has_refs, const std::string& what) {
  if (h.major < 2) {
    if (has_refs) bad(what, "references in a version 1 file");
    for (const auto& t : h.tensors)
      if (t.predict.kind != PredictKind::kNone) bad(what, "tensor '" + t.name + "': predicted tensor in a version 1 file");
    return;
  }
  if (!has_refs) bad(what, "references missing");
  for (const auto& t : h.tensors) {
    if (t.predict.ref >= (int)h.references.size()) bad(what, "tensor '" + t.name + "': predict.ref out of range");
    if (t.predict.kind != PredictKind::kCast || t.predict.ref >= 0) continue;
    const auto it = h.by_name.find(t.predict.source);
    if (it == h.by_name.end()) bad(what, "tensor '" + t.name + "': cast source '" + t.predict.source + "' not in the file");
    const TensorEntry& s = h.tensors[it->second];
    if (s.dtype != "F32" || s.shape != t.shape || s.predict.kind == PredictKind::kCast)
      bad(what, "tensor '" + t.name + "': cast source '" + s.name + "' is not an FP32 tensor of the same shape");
  }
}

// Segments tile [0, data_size) exactly; frames tile [64, header_offset) in
// the same order, each at the next multiple of 64.
void check_tiling(const TzipHeader& h, uint64_t header_offset, const std::string& what) {
  uint64_t pos = 0, file_pos = kPreambleSize;
  for (const TensorEntry* s : h.segments) {
    if (s->data_begin != pos)
      bad(what, (s->is_gap ? std::string("gap") : "tensor '" + s->name + "'") + " does not start where the previous segment ends");
    pos = s->data_end;
    if (s->is_gap && s->raw_size() == 0) bad(what, "empty gap");
    for (const auto& f : s->frames) {
      const uint64_t expect = align_up(file_pos);
      if (f.offset != expect) bad(what, "frame offsets are not contiguous (tensor '" + s->name + "')");
      uint64_t end;
      // Size 0: an all-zero residual chunk of a predicted tensor (section 12.2).
      const bool empty_ok = f.size == 0 && s->predict.kind != PredictKind::kNone;
      if ((f.size < 32 && !empty_ok) || !checked_add(f.offset, f.size, &end) || end > header_offset)
        bad(what, "frame of tensor '" + s->name + "' out of range");
      file_pos = end;
    }
  }
  if (pos != h.data_size) bad(what, "segments do not cover data_size");
  if (align_up(file_pos) != header_offset) bad(what, "frames do not end where the header starts");
}

// The verbatim safetensors header must describe the same tensors. Its
// entries are compared one by one, by name, as they are parsed (no second
// table is built). Names are unique in both, so equal counts make the two
// sets equal; the gaps, derived from the same ranges and data size, are
// then equal too (the tiling check has accepted those of the table).
void check_embedded_header(const TzipHeader& h, const std::string& what) {
  const uint64_t st_len = h.safetensors_header.size();
  uint64_t st_file_size;
  if (!checked_add(8 + st_len, h.data_size, &st_file_size)) bad(what, "sizes overflow");
  SafetensorsInfo st;
  size_t n = 0;
  parse_safetensors_json(h.safetensors_header.data(), st_len, h.data_size, what + " (embedded safetensors header)", &st,
                         [&](TensorEntry&& e) {
                           const auto it = h.by_name.find(e.name);
                           if (it == h.by_name.end())
                             bad(what, "tensor table disagrees with the embedded safetensors header");
                           if (!same_tensor(e, h.tensors[it->second]))
                             bad(what, "tensor '" + e.name + "' disagrees with the embedded safetensors header");
                           ++n;
                         });
  if (n != h.tensors.size()) bad(what, "tensor table disagrees with the embedded safetensors header");
}

}  // namespace

bool parse_hex64(const std::string& s, uint64_t* out) { return parse_hex(s, out); }

void decode_header(std::string&& json_in, uint64_t header_offset, uint16_t major, const std::string& what,
                   TzipHeader* out) {
  out->major = major;
  std::string json = std::move(json_in);
  JsonReader r(json.data(), json.size(), what, ".tzip header");
  if (r.peek() != Kind::kObject) bad(what, "not a JSON object");
  bool format_ok = false, version_ok = false, created_ok = true, has_st = false, has_tensors = false, has_gaps = false;
  bool has_refs = false;
  U64Field chunk, data_size;
  uint64_t table_bytes = 0;
  // "data_offsets" occurs once per tensor or gap entry.
  const size_t entries_hint = count_occurrences(json, "\"data_offsets\"", kMaxTensors);
  r.for_each_member([&](std::string_view k) {
    if (k == "format") {
      if (r.peek() == Kind::kString) format_ok = r.read_string() == "tzip";
      else r.skip();
    } else if (k == "version") {
      uint64_t v = 0;
      version_ok = r.read_u64(&v) && v == major;
    } else if (k == "created_by") {
      created_ok = r.peek() == Kind::kString;
      if (created_ok) out->created_by = std::string(r.read_string());
      else r.skip();
    } else if (k == "chunk_bytes") {
      chunk.read(r);
    } else if (k == "data_size") {
      data_size.read(r);
    } else if (k == "metadata") {
      read_string_map(r, "metadata", what, &out->metadata);
    } else if (k == "user_metadata") {
      read_string_map(r, "user_metadata", what, &out->user_metadata);
    } else if (k == "safetensors_header") {
      has_st = r.peek() == Kind::kString;
      if (has_st) out->safetensors_header = std::string(r.read_string());
      else r.skip();
    } else if (k == "tensors" || k == "gaps") {
      const bool gap = k == "gaps";
      if (r.peek() != Kind::kArray) bad(what, gap ? "gaps missing" : "tensors missing");
      (gap ? has_gaps : has_tensors) = true;
      auto& list = gap ? out->gaps : out->tensors;
      // Reserved from a count of the entries' keys (an upper bound for a
      // well-formed header; untouched capacity costs no memory): growing
      // the table by doubling would briefly hold two copies of it.
      if (!gap) list.reserve(entries_hint);
      r.for_each_element([&] {
        if (list.size() >= kMaxTensors) bad(what, "too many tensors");
        list.emplace_back();
        read_segment(r, gap, what, &list.back());
        const TensorEntry& t = list.back();
        table_bytes += sizeof(TensorEntry) + t.name.size() + t.dtype.size() + t.predict.source.size() +
                       8 * t.shape.size() + sizeof(FrameRef) * t.frames.size();
        if (table_bytes > kMaxTableBytes)
          bad(what, "tensor table larger than " + std::to_string(kMaxTableBytes >> 20) + " MiB");
      });
    } else if (k == "references") {
      has_refs = true;
      read_references(r, what, &out->references);
    } else {
      r.skip();
    }
  });
  r.finish();
  std::string().swap(json);

  if (!format_ok) bad(what, "format is not \"tzip\"");
  if (!version_ok) bad(what, "version does not match the preamble");
  if (!created_ok) bad(what, "created_by is not a string");
  if (!chunk.ok) bad(what, "chunk_bytes missing or not a non-negative integer");
  out->chunk_bytes = chunk.v;
  if (!chunk_bytes_valid(out->chunk_bytes)) bad(what, "chunk_bytes out of range");
  if (!data_size.ok) bad(what, "data_size missing or not a non-negative integer");
  out->data_size = data_size.v;
  if (!has_st) bad(what, "safetensors_header missing");
  if (!has_tensors) bad(what, "tensors missing");
  if (!has_gaps) bad(what, "gaps missing");
  for (auto& t : out->tensors) check_chunking(t, out->chunk_bytes, what);
  for (auto& t : out->gaps) check_chunking(t, out->chunk_bytes, what);
  out->by_name.reserve(out->tensors.size());
  for (size_t i = 0; i < out->tensors.size(); ++i)
    if (!out->by_name.emplace(out->tensors[i].name, i).second)
      bad(what, "duplicate tensor '" + out->tensors[i].name + "'");
  auto by_data = [](const TensorEntry& a, const TensorEntry& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  };
  if (!std::is_sorted(out->tensors.begin(), out->tensors.end(), by_data) ||
      !std::is_sorted(out->gaps.begin(), out->gaps.end(), by_data))
    bad(what, "segments not in data order");
  link_segments(out);
  check_predictions(*out, has_refs, what);
  check_tiling(*out, header_offset, what);
  check_embedded_header(*out, what);
}

}  // namespace tz::container::detail
