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
    for (const auto& e : h.references) r.push_back({{"file", e.file}, {"xxh64", hex64(e.xxh64)}});
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

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  fail(ErrorKind::kBadInput, what + ": corrupt .tzip header: " + msg);
}

uint64_t need_u64(const json& o, const char* key, const std::string& what, const std::string& ctx) {
  const auto it = o.find(key);
  uint64_t v;
  if (it == o.end() || !get_u64(*it, &v)) bad(what, ctx + std::string(key) + " missing or not a non-negative integer");
  return v;
}

bool parse_hex(const std::string& s, uint64_t* out) {
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

void decode_segment(const json& j, bool gap, uint64_t chunk_bytes, const std::string& what, TensorEntry* t) {
  if (!j.is_object()) bad(what, "segment is not an object");
  std::string ctx = "gap: ";
  t->is_gap = gap;
  if (!gap) {
    const auto n = j.find("name");
    const auto d = j.find("dtype");
    const auto s = j.find("shape");
    if (n == j.end() || !n->is_string() || n->get<std::string>().empty()) bad(what, "tensor without a name");
    t->name = n->get<std::string>();
    ctx = "tensor '" + t->name + "': ";
    if (d == j.end() || !d->is_string()) bad(what, ctx + "dtype missing");
    t->dtype = d->get<std::string>();
    if (!codec_dtype_for(t->dtype, nullptr)) bad(what, ctx + "unknown dtype '" + t->dtype + "'");
    if (s == j.end() || !s->is_array() || s->size() > 64) bad(what, ctx + "shape missing or too long");
    for (const auto& e : *s) {
      uint64_t v;
      if (!get_u64(e, &v)) bad(what, ctx + "shape holds a non-integer");
      t->shape.push_back(v);
    }
  }
  const auto o = j.find("data_offsets");
  if (o == j.end() || !o->is_array() || o->size() != 2 || !get_u64((*o)[0], &t->data_begin) ||
      !get_u64((*o)[1], &t->data_end) || t->data_begin > t->data_end)
    bad(what, ctx + "bad data_offsets");
  if (!gap) {
    uint64_t nbytes = 0;
    try {
      nbytes = tensor_nbytes(t->dtype, t->shape, what, t->name);
    } catch (const Error&) {
      bad(what, ctx + "shape x dtype size overflows or is not whole bytes");
    }
    if (nbytes != t->raw_size()) bad(what, ctx + "shape x dtype does not match data_offsets");
  }
  const auto c = j.find("codec");
  if (c == j.end() || !c->is_object()) bad(what, ctx + "codec missing");
  const auto cd = c->find("dtype");
  if (cd == c->end() || !cd->is_string() || !codec_dtype_from_name(cd->get<std::string>(), &t->codec_dtype))
    bad(what, ctx + "bad codec dtype");
  if (gap && t->codec_dtype != TZ_DTYPE_BYTES) bad(what, ctx + "gap codec dtype is not bytes");
  const auto lv = c->find("level");
  if (lv == c->end() || !lv->is_number_integer()) bad(what, ctx + "bad codec level");
  const int64_t level = lv->get<int64_t>();
  if (level < -1 || level > 9) bad(what, ctx + "bad codec level");
  t->level = (int)level;
  const uint64_t be = need_u64(*c, "block_elems", what, ctx);
  if (be < 4096 || be > (1u << 20) || (be & (be - 1)) != 0) bad(what, ctx + "bad block_elems");
  t->block_elems = (unsigned)be;
  if (chunk_bytes % t->block_bytes() != 0) bad(what, ctx + "chunk_bytes is not a multiple of the block size");
  if (t->raw_size() % codec_elem_size(t->codec_dtype) != 0) bad(what, ctx + "size is not a whole number of elements");
  const auto fr = j.find("frames");
  if (fr == j.end() || !fr->is_array()) bad(what, ctx + "frames missing");
  const uint64_t want = (t->raw_size() + chunk_bytes - 1) / chunk_bytes;
  if (fr->size() != want) bad(what, ctx + "expected " + std::to_string(want) + " frames, found " + std::to_string(fr->size()));
  uint64_t left = t->raw_size();
  for (const auto& f : *fr) {
    if (!f.is_object()) bad(what, ctx + "frame is not an object");
    FrameRef r;
    r.offset = need_u64(f, "offset", what, ctx);
    r.size = need_u64(f, "size", what, ctx);
    r.raw_size = std::min(left, chunk_bytes);
    left -= r.raw_size;
    const auto h = f.find("xxh64");
    if (h == f.end() || !h->is_string() || h->get<std::string>().size() != 16) bad(what, ctx + "bad frame xxh64");
    for (char ch : h->get<std::string>()) {
      int v;
      if (ch >= '0' && ch <= '9') v = ch - '0';
      else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
      else bad(what, ctx + "bad frame xxh64");
      r.xxh64 = (r.xxh64 << 4) | (uint64_t)v;
    }
    t->frames.push_back(r);
  }
  if (const auto pr = j.find("predict"); pr != j.end()) {
    if (gap || !pr->is_object()) bad(what, ctx + "bad predict");
    const auto k = pr->find("kind");
    if (k == pr->end() || !k->is_string()) bad(what, ctx + "predict.kind missing");
    if (*k == "cast") t->predict.kind = PredictKind::kCast;
    else if (*k == "delta") t->predict.kind = PredictKind::kDelta;
    else bad(what, ctx + "unknown predict.kind '" + k->get<std::string>() + "'");
    if (const auto r = pr->find("ref"); r != pr->end()) {
      uint64_t v;
      if (!get_u64(*r, &v) || v >= kMaxTensors) bad(what, ctx + "bad predict.ref");
      t->predict.ref = (int)v;
    }
    if (t->predict.kind == PredictKind::kCast) {
      const auto s = pr->find("source");
      if (s == pr->end() || !s->is_string() || s->get<std::string>().empty()) bad(what, ctx + "predict.source missing");
      t->predict.source = s->get<std::string>();
      if (t->dtype != "BF16" && t->dtype != "F16") bad(what, ctx + "cast prediction of a " + t->dtype + " tensor");
    } else if (t->predict.ref < 0) {
      bad(what, ctx + "delta prediction without a reference");
    }
    for (auto it = pr->begin(); it != pr->end(); ++it)
      if (it.key() != "kind" && it.key() != "ref" && it.key() != "source")
        bad(what, ctx + "unknown predict key '" + it.key() + "'");
  }
}

bool same_tensor(const TensorEntry& a, const TensorEntry& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data_begin == b.data_begin &&
         a.data_end == b.data_end;
}

}  // namespace

bool parse_hex64(const std::string& s, uint64_t* out) { return parse_hex(s, out); }

void decode_header(const char* p, size_t n, uint64_t header_offset, uint16_t major, const std::string& what,
                   TzipHeader* out) {
  out->major = major;
  const json j = parse_json_strict(p, p + n, what, ".tzip header");
  if (!j.is_object()) bad(what, "not a JSON object");
  const auto fmt = j.find("format");
  if (fmt == j.end() || *fmt != "tzip") bad(what, "format is not \"tzip\"");
  const auto ver = j.find("version");
  if (ver == j.end() || !ver->is_number_unsigned() || ver->get<uint64_t>() != major)
    bad(what, "version does not match the preamble");
  if (const auto cb = j.find("created_by"); cb != j.end()) {
    if (!cb->is_string()) bad(what, "created_by is not a string");
    out->created_by = cb->get<std::string>();
  }
  out->chunk_bytes = need_u64(j, "chunk_bytes", what, "");
  if (out->chunk_bytes < kMinChunkBytes || out->chunk_bytes > kMaxChunkBytes ||
      (out->chunk_bytes & (out->chunk_bytes - 1)) != 0)
    bad(what, "chunk_bytes out of range");
  out->data_size = need_u64(j, "data_size", what, "");
  for (const char* key : {"metadata", "user_metadata"}) {
    const auto m = j.find(key);
    if (m == j.end()) continue;
    if (!m->is_object()) bad(what, std::string(key) + " is not an object");
    auto& dst = std::string(key) == "metadata" ? out->metadata : out->user_metadata;
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (!it.value().is_string()) bad(what, std::string(key) + " value is not a string");
      dst[it.key()] = it.value().get<std::string>();
    }
  }
  const auto sh = j.find("safetensors_header");
  if (sh == j.end() || !sh->is_string()) bad(what, "safetensors_header missing");
  out->safetensors_header = sh->get<std::string>();
  const auto ts = j.find("tensors");
  const auto gs = j.find("gaps");
  if (ts == j.end() || !ts->is_array()) bad(what, "tensors missing");
  if (gs == j.end() || !gs->is_array()) bad(what, "gaps missing");
  if (ts->size() > kMaxTensors || gs->size() > kMaxTensors) bad(what, "too many tensors");
  out->tensors.resize(ts->size());
  out->gaps.resize(gs->size());
  std::set<std::string> names;
  for (size_t i = 0; i < ts->size(); ++i) {
    decode_segment((*ts)[i], false, out->chunk_bytes, what, &out->tensors[i]);
    if (!names.insert(out->tensors[i].name).second) bad(what, "duplicate tensor '" + out->tensors[i].name + "'");
  }
  for (size_t i = 0; i < gs->size(); ++i) decode_segment((*gs)[i], true, out->chunk_bytes, what, &out->gaps[i]);
  auto by_data = [](const TensorEntry& a, const TensorEntry& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  };
  if (!std::is_sorted(out->tensors.begin(), out->tensors.end(), by_data) ||
      !std::is_sorted(out->gaps.begin(), out->gaps.end(), by_data))
    bad(what, "segments not in data order");
  link_segments(out);

  // Predictions (version 2 only): references, and casts within the file.
  const auto rs = j.find("references");
  if (major < 2) {
    if (rs != j.end()) bad(what, "references in a version 1 file");
    for (const auto& t : out->tensors)
      if (t.predict.kind != PredictKind::kNone) bad(what, "tensor '" + t.name + "': predicted tensor in a version 1 file");
  } else {
    if (rs == j.end() || !rs->is_array() || rs->size() > 4096) bad(what, "references missing");
    for (const auto& r : *rs) {
      Reference ref;
      if (!r.is_object()) bad(what, "reference is not an object");
      const auto f = r.find("file");
      const auto x = r.find("xxh64");
      if (f == r.end() || !f->is_string() || f->get<std::string>().empty()) bad(what, "reference without a file name");
      if (x == r.end() || !x->is_string() || !parse_hex(x->get<std::string>(), &ref.xxh64))
        bad(what, "reference without a valid xxh64");
      ref.file = f->get<std::string>();
      out->references.push_back(ref);
    }
    std::map<std::string, const TensorEntry*> by_name;
    for (const auto& t : out->tensors) by_name[t.name] = &t;
    for (const auto& t : out->tensors) {
      if (t.predict.ref >= (int)out->references.size())
        bad(what, "tensor '" + t.name + "': predict.ref out of range");
      if (t.predict.kind != PredictKind::kCast || t.predict.ref >= 0) continue;
      const auto it = by_name.find(t.predict.source);
      if (it == by_name.end()) bad(what, "tensor '" + t.name + "': cast source '" + t.predict.source + "' not in the file");
      const TensorEntry& s = *it->second;
      // The source is FP32 and never itself a cast: no cycles within a file.
      if (s.dtype != "F32" || s.shape != t.shape || s.predict.kind == PredictKind::kCast)
        bad(what, "tensor '" + t.name + "': cast source '" + s.name + "' is not an FP32 tensor of the same shape");
    }
  }

  // Segments tile [0, data_size) exactly; frames tile [64, header_offset) in
  // the same order, each at the next multiple of 64.
  uint64_t pos = 0, file_pos = kPreambleSize;
  for (const TensorEntry* s : out->segments) {
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
  if (pos != out->data_size) bad(what, "segments do not cover data_size");
  if (align_up(file_pos) != header_offset) bad(what, "frames do not end where the header starts");

  // The verbatim safetensors header must describe the same tensors.
  const uint64_t st_len = out->safetensors_header.size();
  uint64_t st_file_size;
  if (!checked_add(8 + st_len, out->data_size, &st_file_size)) bad(what, "sizes overflow");
  SafetensorsInfo st = parse_safetensors_header(reinterpret_cast<const uint8_t*>(out->safetensors_header.data()),
                                                st_len, st_file_size, what + " (embedded safetensors header)");
  if (st.tensors.size() != out->tensors.size() || st.gaps.size() != out->gaps.size())
    bad(what, "tensor table disagrees with the embedded safetensors header");
  for (size_t i = 0; i < st.tensors.size(); ++i)
    if (!same_tensor(st.tensors[i], out->tensors[i]))
      bad(what, "tensor '" + out->tensors[i].name + "' disagrees with the embedded safetensors header");
  for (size_t i = 0; i < st.gaps.size(); ++i)
    if (st.gaps[i].data_begin != out->gaps[i].data_begin || st.gaps[i].data_end != out->gaps[i].data_end)
      bad(what, "gaps disagree with the embedded safetensors header");
}


// Level 9: headers hold repetitive JSON (names, shapes, frame lists), which
// this level packs 7-10x at about 100 MB/s, so even the ~1 MB header of a
// rank file with 10^4 tensors costs milliseconds.
std::string pack_header(const std::string& json) {
  std::string out(ZSTD_compressBound(json.size()), '\0');
  const size_t r = ZSTD_compress(out.data(), out.size(), json.data(), json.size(), 9);
  if (ZSTD_isError(r)) fail(ErrorKind::kInternal, std::string("header compression failed: ") + ZSTD_getErrorName(r));
  out.resize(r);
  return out;
}

std::string unpack_header(const uint8_t* p, size_t n, const std::string& what) {
  const unsigned long long size = ZSTD_getFrameContentSize(p, n);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN)
    fail(ErrorKind::kBadInput, what + ": .tzip header is not a zstd frame with a recorded size (header corrupted)");
  if (size > kMaxHeaderBytes)
    fail(ErrorKind::kBadInput, what + ": .tzip header declares " + std::to_string(size) + " bytes, over the " +
                                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  if (ZSTD_findFrameCompressedSize(p, n) != n)
    fail(ErrorKind::kBadInput, what + ": .tzip header is not exactly one zstd frame (header corrupted)");
  std::string out(size, '\0');
  const size_t r = ZSTD_decompress(out.data(), out.size(), p, n);
  if (ZSTD_isError(r) || r != size)
    fail(ErrorKind::kBadInput, what + ": .tzip header does not decompress (header corrupted)");
  return out;
}

}  // namespace tz::container::detail
