// Checkpoint manifest: write, bounded read, strict validation (manifest.hpp),
// and the functions that only need manifests: is_complete(), latest().
#include "manifest.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "../io/write_queue.hpp"  // pread_full
#include "tensorzip/container.hpp"  // chunk_bytes_valid
#include "container/file_refs.hpp"    // is_complete: depends_on chains
#include "container/internal.hpp"     // the container's strict JSON parser and checked arithmetic
#include "container/strict_json.hpp"  // the container's strict JSON reader

namespace tz::checkpoint::detail {

using nlohmann::json;
using tz::container::PredictKind;
namespace tcd = tz::container::detail;

bool parse_hex64(const std::string& s, uint64_t* out) { return tcd::parse_hex64(s, out); }

// ===========================================================================
// Writing
// ===========================================================================
namespace {
const char* codec_dtype_str(tz_dtype d) { return tcd::codec_dtype_name(d); }
}  // namespace

json rank_entry_json(const RankFileFacts& r) {
  json jt = json::array();
  for (const auto& t : r.tensors) {
    json fr = json::array();
    for (const auto& f : t.frames)
      fr.push_back({{"offset", f.offset}, {"size", f.size}, {"raw_size", f.raw_size}, {"xxh64", hex64(f.xxh64)}});
    json e = {{"name", t.name},
              {"dtype", t.dtype},
              {"shape", t.shape},
              {"size", t.raw_size()},
              {"codec_dtype", codec_dtype_str(t.codec_dtype)},
              {"level", t.level},
              {"frames", fr}};
    if (t.predict.kind == PredictKind::kCast)
      e["predict"] = {{"kind", "cast"}, {"source", t.predict.source}};
    else if (t.predict.kind == PredictKind::kDelta)
      e["predict"] = {{"kind", "delta"}, {"ref", t.predict.ref}};
    jt.push_back(std::move(e));
  }
  json out = json{{"rank", r.rank},
                  {"file", rank_file(r.rank)},
                  {"file_size", r.file_size},
                  {"file_xxh64", hex64(r.file_xxh64)},
                  {"chunk_bytes", r.chunk_bytes},
                  {"codec", r.codec},
                  {"time_model", r.time_model},
                  {"metadata", r.metadata},
                  {"tensors", jt}};
  if (!r.references.empty()) {
    json jrefs = json::array();
    for (const auto& x : r.references) {
      json jr = {{"file", x.file}, {"xxh64", hex64(x.xxh64)}};
      if (x.has_header_xxh64) jr["header_xxh64"] = hex64(x.header_xxh64);
      jrefs.push_back(std::move(jr));
    }
    out["references"] = jrefs;
    out["depends_on"] = r.depends_on;
  }
  return out;
}

json manifest_body(int world_size, const json& metadata, const json& ranks, const std::string& dir) {
  json body = {{"world_size", world_size}, {"metadata", metadata}, {"ranks", ranks}};
  std::string dep;
  for (const auto& r : ranks)
    if (r.contains("depends_on")) {
      const std::string d = r["depends_on"].get<std::string>();
      if (!dep.empty() && d != dep)
        fail(ErrorKind::kUsage, dir + ": ranks reference different previous checkpoints ('" + dep + "', '" + d + "')");
      dep = d;
    }
  if (!dep.empty()) body["depends_on"] = dep;
  return body;
}

std::string manifest_text(const json& body) {
  const std::string d = body.dump();
  int version = 1;
  for (const auto& r : body.at("ranks"))
    for (const auto& t : r.at("tensors"))
      if (t.contains("predict")) version = std::max(version, t["predict"].value("kind", "") == "delta" ? 3 : 2);
  return json{{"format", "tensorzip-checkpoint"}, {"version", version},
              {"body_xxh64", hex64(XXH64(d.data(), d.size(), 0))}, {"body", body}}
             .dump(1) +
         "\n";
}

// ===========================================================================
// Reading
// ===========================================================================
std::string read_bounded(const std::string& path, uint64_t max, ErrorKind missing_kind) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail(missing_kind, path + ": missing");
    fail_errno(path, "open", e);
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kCorrupt, path + ": not a regular file");
  if ((uint64_t)st.st_size > max)
    fail(ErrorKind::kCorrupt, path + ": " + std::to_string((uint64_t)st.st_size) + " bytes, over the " +
                                  std::to_string(max) + "-byte limit");
  std::string s((size_t)st.st_size, '\0');
  if (const int err = tz::io::pread_full(fd, s.data(), s.size(), 0)) fail_errno(path, "read", err);
  return s;
}

namespace {

// Where a check is (the file, then "rank R: tensor 'N': ") and its failure.
struct Ctx {
  const std::string& what;
  std::string where;
  [[noreturn]] void bad(const std::string& m) const { fail(ErrorKind::kCorrupt, what + ": " + where + m); }
  Ctx in(const std::string& w) const { return Ctx{what, where + w}; }

  const json& need(const json& o, const char* k) const {
    const auto it = o.find(k);
    if (it == o.end()) bad(std::string("'") + k + "' missing");
    return *it;
  }
  uint64_t u64(const json& v, const char* k) const {
    uint64_t x = 0;
    if (v.is_number_unsigned())
      x = v.get<uint64_t>();
    else if (v.is_number_integer() && v.get<int64_t>() >= 0)
      x = (uint64_t)v.get<int64_t>();
    else
      bad(std::string("'") + k + "' is not a non-negative integer");
    return x;
  }
  uint64_t u64_at(const json& o, const char* k) const { return u64(need(o, k), k); }
  std::string str_at(const json& o, const char* k) const {
    const json& v = need(o, k);
    if (!v.is_string()) bad(std::string("'") + k + "' is not a string");
    return v.get<std::string>();
  }
  uint64_t hex_at(const json& o, const char* k) const {
    uint64_t x = 0;
    const json& v = need(o, k);
    if (!v.is_string() || !tcd::parse_hex64(v.get<std::string>(), &x))
      bad(std::string("'") + k + "' is not 16 lower-case hex digits");
    return x;
  }
  const json& array_at(const json& o, const char* k, size_t max) const {
    const json& v = need(o, k);
    if (!v.is_array()) bad(std::string("'") + k + "' is not an array");
    if (v.size() > max) bad(std::string("'") + k + "' has more than " + std::to_string(max) + " entries");
    return v;
  }
  // Optional object of strings.
  std::map<std::string, std::string> strings_at(const json& o, const char* k) const {
    std::map<std::string, std::string> out;
    const auto it = o.find(k);
    if (it == o.end()) return out;
    if (!it->is_object()) bad(std::string("'") + k + "' is not an object");
    for (auto e = it->begin(); e != it->end(); ++e) {
      if (!e.value().is_string()) bad(std::string("'") + k + "' value of '" + e.key() + "' is not a string");
      out[e.key()] = e.value().get<std::string>();
    }
    return out;
  }
  void optional_string(const json& o, const char* k) const {
    const auto it = o.find(k);
    if (it != o.end() && !it->is_string()) bad(std::string("'") + k + "' is not a string");
  }
};

// A previous checkpoint's folder as depends_on records it: the name of a
// sibling folder, nothing else.
bool plain_folder_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

ManifestTensor parse_tensor(const json& t, const ManifestRank& r, const Ctx& rc) {
  if (!t.is_object()) rc.bad("tensor entry is not an object");
  ManifestTensor mt;
  mt.name = rc.str_at(t, "name");
  if (mt.name.empty()) rc.bad("tensor with an empty name");
  const Ctx c = rc.in("tensor '" + mt.name + "': ");
  mt.dtype = c.str_at(t, "dtype");
  if (!tz::container::codec_dtype_for(mt.dtype, nullptr)) c.bad("unknown dtype '" + mt.dtype + "'");
  for (const auto& d : c.array_at(t, "shape", 64)) mt.shape.push_back(c.u64(d, "shape"));
  mt.size = c.u64_at(t, "size");
  uint64_t nbytes = 0;
  try {
    nbytes = tcd::tensor_nbytes(mt.dtype, mt.shape, c.what, mt.name);
  } catch (const tz::container::Error&) {
    c.bad("dtype " + mt.dtype + " x shape " + tcd::shape_string(mt.shape) + " overflows or is not whole bytes");
  }
  if (nbytes != mt.size)
    c.bad("size " + std::to_string(mt.size) + " does not match dtype " + mt.dtype + " x shape " +
          tcd::shape_string(mt.shape) + " (" + std::to_string(nbytes) + " bytes)");
  if (const auto it = t.find("codec_dtype"); it != t.end()) {
    tz_dtype cd;
    if (!it->is_string() || !tcd::codec_dtype_from_name(it->get<std::string>(), &cd)) c.bad("bad 'codec_dtype'");
    mt.codec_dtype = it->get<std::string>();
  }
  if (const auto it = t.find("level"); it != t.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < -1 || it->get<int64_t>() > 9) c.bad("bad 'level'");
    mt.level = (int)it->get<int64_t>();
    mt.has_level = true;
  }
  if (const auto it = t.find("predict"); it != t.end()) {
    const json& p = *it;
    if (!p.is_object()) c.bad("'predict' is not an object");
    const std::string kind = c.str_at(p, "kind");
    if (kind != "cast" && kind != "delta") c.bad("unknown prediction kind '" + kind + "'");
    for (auto k = p.begin(); k != p.end(); ++k)
      if (k.key() != "kind" && k.key() != (kind == "cast" ? "source" : "ref")) c.bad("unknown predict key '" + k.key() + "'");
    if (kind == "cast") {
      if (mt.dtype != "BF16" && mt.dtype != "F16") c.bad("cast prediction of a " + mt.dtype + " tensor");
      mt.predict = PredictKind::kCast;
      mt.cast_source = c.str_at(p, "source");
      if (mt.cast_source.empty() || mt.cast_source == mt.name) c.bad("bad cast source");
    } else {
      const uint64_t k = c.u64_at(p, "ref");
      if (k >= r.references.size()) c.bad("delta reference " + std::to_string(k) + " out of range");
      mt.predict = PredictKind::kDelta;
      mt.delta_ref = (int)k;
    }
  }
  // Frames: one per chunk_bytes of the tensor, in order, each inside the
  // rank file's frame area [64, file_size - 48).
  const json& frames = c.need(t, "frames");
  if (!frames.is_array()) c.bad("'frames' is not an array");
  const uint64_t want = mt.size / r.chunk_bytes + (mt.size % r.chunk_bytes != 0);
  if (frames.size() != want)
    c.bad(std::to_string(frames.size()) + " frames, a tensor of " + std::to_string(mt.size) + " bytes in chunks of " +
          std::to_string(r.chunk_bytes) + " has " + std::to_string(want));
  constexpr uint64_t kFrameArea = 64, kTrailer = 48;
  const uint64_t area_end = r.file_size - kTrailer;  // parse_rank_entry: file_size >= kMinRankFile
  const uint64_t empty_hash = XXH64(nullptr, 0, 0);
  uint64_t raw_off = 0;
  mt.frames.reserve(frames.size());
  for (const auto& f : frames) {
    if (!f.is_object()) c.bad("frame is not an object");
    ManifestFrame mf;
    mf.offset = c.u64_at(f, "offset");
    mf.size = c.u64_at(f, "size");
    mf.raw_size = c.u64_at(f, "raw_size");
    mf.xxh64 = c.hex_at(f, "xxh64");
    mf.raw_off = raw_off;
    const std::string fc = "frame at offset " + std::to_string(mf.offset) + ": ";
    if (mf.raw_size != std::min(r.chunk_bytes, mt.size - raw_off))
      c.bad(fc + "holds " + std::to_string(mf.raw_size) + " bytes, expected " +
            std::to_string(std::min(r.chunk_bytes, mt.size - raw_off)));
    uint64_t end = 0;
    if (mf.offset < kFrameArea || mf.offset % 64 != 0 || !tcd::checked_add(mf.offset, mf.size, &end) || end > area_end)
      c.bad(fc + "outside the frame area of its rank file (" + std::to_string(r.file_size) + " bytes)");
    if (mf.size == 0 && (mt.predict == PredictKind::kNone || mf.xxh64 != empty_hash))
      c.bad(fc + "empty frame of a tensor that is not predicted");
    raw_off += mf.raw_size;
    mt.frames.push_back(mf);
  }
  return mt;
}

}  // namespace

ManifestRank parse_rank_entry(const json& j, int expect_rank, const std::string& what) {
  const Ctx top{what, ""};
  if (!j.is_object()) top.bad("rank entry is not an object");
  ManifestRank r;
  const uint64_t rank = top.u64_at(j, "rank");
  if (rank != (uint64_t)expect_rank)
    top.bad("rank entry " + std::to_string(expect_rank) + " says it is rank " + std::to_string(rank));
  r.rank = expect_rank;
  const Ctx c = top.in("rank " + std::to_string(expect_rank) + ": ");
  r.file = c.str_at(j, "file");
  if (r.file != rank_file(r.rank)) c.bad("file '" + r.file + "' is not '" + rank_file(r.rank) + "'");
  r.file_size = c.u64_at(j, "file_size");
  constexpr uint64_t kMinRankFile = 64 + 48, kMaxRankFile = 1ull << 62;
  if (r.file_size < kMinRankFile || r.file_size > kMaxRankFile)
    c.bad("file_size " + std::to_string(r.file_size) + " is not the size of a .tzip file");
  r.file_xxh64 = c.hex_at(j, "file_xxh64");
  r.chunk_bytes = c.u64_at(j, "chunk_bytes");
  if (!tz::container::chunk_bytes_valid(r.chunk_bytes))
    c.bad("chunk_bytes " + std::to_string(r.chunk_bytes) + " is not a power of two in [1 MiB, 64 MiB]");
  r.metadata = c.strings_at(j, "metadata");
  c.optional_string(j, "codec");
  c.optional_string(j, "time_model");
  if (j.contains("depends_on")) {
    r.depends_on = c.str_at(j, "depends_on");
    if (!plain_folder_name(r.depends_on)) c.bad("depends_on '" + r.depends_on + "' is not a folder name");
  }
  if (j.contains("references")) {
    // A delta save records one reference: the same rank's file of the
    // previous checkpoint, a sibling folder (depends_on).
    const json& refs = c.array_at(j, "references", 1);
    if (r.depends_on.empty()) c.bad("references without depends_on");
    const std::string expect = "../" + r.depends_on + "/" + rank_file(r.rank);
    for (const auto& x : refs) {
      if (!x.is_object()) c.bad("reference is not an object");
      ManifestReference mr{c.str_at(x, "file"), c.hex_at(x, "xxh64")};
      if (x.contains("header_xxh64")) {
        mr.has_header_xxh64 = true;
        mr.header_xxh64 = c.hex_at(x, "header_xxh64");
      }
      if (mr.file != expect) c.bad("reference '" + mr.file + "' is not '" + expect + "'");
      r.references.push_back(mr);
    }
  } else if (!r.depends_on.empty()) {
    c.bad("depends_on without references");
  }
  std::map<std::string, size_t> by_name;
  for (const auto& t : c.array_at(j, "tensors", tz::container::kMaxTensors)) {
    ManifestTensor mt = parse_tensor(t, r, c);
    if (!by_name.emplace(mt.name, r.tensors.size()).second) c.bad("duplicate tensor '" + mt.name + "'");
    r.tensors.push_back(std::move(mt));
  }
  // Cast sources: FP32, same shape, same rank file, not casts themselves (a
  // delta-predicted source is restored first like any other); restore XORs
  // the cast of exactly 2 x size bytes of the source.
  for (const auto& t : r.tensors) {
    if (t.predict != PredictKind::kCast) continue;
    const auto it = by_name.find(t.cast_source);
    const ManifestTensor* s = it == by_name.end() ? nullptr : &r.tensors[it->second];
    if (!s || s->dtype != "F32" || s->shape != t.shape || s->predict == PredictKind::kCast || s->size != 2 * t.size)
      c.bad("tensor '" + t.name + "': cast source '" + t.cast_source +
            "' is not an FP32 tensor of the same shape in its file");
  }
  return r;
}

// The container's strict JSON reader validates the text first (RFC 8259
// syntax, UTF-8, no duplicate key in any object, nesting depth: the rules of
// .tzip headers, one validator); only then is the DOM built.
json parse_json_text(const std::string& text, const std::string& what, const std::string& part) {
  try {
    tcd::JsonReader r(text.data(), text.size(), what, part);
    r.skip();
    r.finish();
  } catch (const tz::container::Error& e) {
    fail(ErrorKind::kCorrupt, e.what());
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorKind::kCorrupt, what + ": " + part + " is not valid JSON");
  }
}

Manifest parse_manifest(const std::string& text, const std::string& what) {
  const Ctx c{what, ""};
  const json j = parse_json_text(text, what, "manifest");
  if (!j.is_object() || j.value("format", json()) != "tensorzip-checkpoint")
    c.bad("not a tensorzip checkpoint manifest");
  Manifest m;
  const uint64_t version = c.u64_at(j, "version");
  if (version < 1 || version > 3) c.bad("unsupported manifest version " + std::to_string(version));
  m.version = (int)version;
  const uint64_t hash = c.hex_at(j, "body_xxh64");
  const json& body = c.need(j, "body");
  if (!body.is_object()) c.bad("'body' is not an object");
  const std::string d = body.dump();
  if (XXH64(d.data(), d.size(), 0) != hash) c.bad("manifest checksum mismatch");
  const uint64_t ws = c.u64_at(body, "world_size");
  if (ws < 1 || ws > (uint64_t)kMaxWorldSize) c.bad("world_size " + std::to_string(ws) + " out of range");
  m.world_size = (int)ws;
  m.metadata = c.strings_at(body, "metadata");
  if (body.contains("depends_on")) {
    m.depends_on = c.str_at(body, "depends_on");
    if (!plain_folder_name(m.depends_on)) c.bad("depends_on '" + m.depends_on + "' is not a folder name");
  }
  const json& ranks = c.array_at(body, "ranks", (size_t)kMaxWorldSize);
  if (ranks.size() != ws) c.bad(std::to_string(ranks.size()) + " rank entries for world_size " + std::to_string(ws));
  std::set<std::string> names;
  bool any_cast = false, any_delta = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    m.ranks.push_back(parse_rank_entry(ranks[i], (int)i, what));
    const ManifestRank& r = m.ranks.back();
    if (r.depends_on != m.depends_on && !r.depends_on.empty())
      c.bad("rank " + std::to_string(i) + " depends on '" + r.depends_on + "', the checkpoint on '" + m.depends_on + "'");
    for (const auto& t : r.tensors) {
      if (!names.insert(t.name).second) c.bad("tensor '" + t.name + "' appears in more than one rank");
      any_cast = any_cast || t.predict == PredictKind::kCast;
      any_delta = any_delta || t.predict == PredictKind::kDelta;
    }
  }
  if ((any_cast && m.version < 2) || (any_delta && m.version < 3))
    c.bad("manifest version " + std::to_string(m.version) + " cannot hold " + (any_delta ? "delta" : "cast") +
          "-predicted tensors");
  bool any_refs = false;
  for (const auto& r : m.ranks) any_refs = any_refs || !r.references.empty();
  if (!m.depends_on.empty() && !any_refs) c.bad("depends_on without any rank referencing it");
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string mp = dir + "/" + kManifest;
  return parse_manifest(read_bounded(mp, kMaxManifestBytes, ErrorKind::kIncomplete), mp);
}

}  // namespace tz::checkpoint::detail

// ===========================================================================
// Complete checkpoints
// ===========================================================================
namespace tz::checkpoint {

using namespace detail;

bool is_complete(const std::string& dir) {
  // A valid manifest, every rank file a regular file of the recorded size,
  // and the same for each checkpoint of the depends_on chain (sibling
  // folders followed with the references module's chain rules: a cycle,
  // by device and inode, or more than refs::kMaxDepth links counts as
  // damage). Rank-file checksums are checked when the checkpoint is opened.
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  tz::container::refs::Chain chain;
  try {
    while (true) {
      struct stat dst {};
      if (::stat(d.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode)) return false;
      chain = chain.then(d, dst);
      const Manifest m = read_manifest(d);
      for (const auto& r : m.ranks) {
        struct stat st {};
        if (::stat((d + "/" + r.file).c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != r.file_size)
          return false;
      }
      if (m.depends_on.empty()) return true;
      d = tz::container::refs::sibling_folder(d, m.depends_on);
    }
  } catch (const Error&) {
    return false;
  } catch (const tz::container::Error&) {
    return false;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

std::string latest(const std::string& root) {
  DIR* d = ::opendir(root.c_str());
  if (!d) return "";
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n[0] != '.') names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.rbegin(), names.rend());
  for (const auto& n : names)
    if (is_complete(root + "/" + n)) return root + "/" + n;
  return "";
}

}  // namespace tz::checkpoint
