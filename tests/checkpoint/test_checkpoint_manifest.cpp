// Checkpoint manifests validated as strictly as .tzip headers: every edit of
// a manifest whose (unkeyed) body checksum was recomputed is refused with a
// kCorrupt error naming the manifest and what is wrong, by is_complete() and
// by Checkpoint, before anything is read or allocated from it. Rank files
// are checked by fstat and through the container Reader's index.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensorzip/checkpoint.hpp"
#include "tz_test_checkpoint.hpp"  // tests/support
#include "tz_test_manifest.hpp"

namespace fs = std::filesystem;
namespace ck = tz::checkpoint;
using nlohmann::json;
using namespace tz_test;

namespace {

// The fixture slices: BF16 weights that are exact casts of their FP32
// masters (stored as cast residuals, empty frames), Adam moments.
std::vector<Owned> real_tensors() {
  return load_pair(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-bf16.safetensors",
                   std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors");
}

ck::SaveOptions opts() {
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  return o;
}

// A saved checkpoint in a temporary folder, its manifest text and the first
// cast-predicted tensor (and its source) as the manifest lists them.
struct Saved {
  TempDir tmp;
  std::string dir;
  std::string manifest;
  std::vector<Owned> data;
  std::string cast, source;
  Saved() : dir(tmp.path + "/step-1"), data(real_tensors()) {
    ck::save(dir, views(data), opts());
    manifest = slurp(dir + "/manifest.json");
    const json j = json::parse(manifest);
    for (const auto& t : j["body"]["ranks"][0]["tensors"])
      if (t.contains("predict") && t["predict"]["kind"] == "cast" && cast.empty()) {
        cast = t["name"];
        source = t["predict"]["source"];
      }
  }
  void write_manifest(const std::string& text) const { write_all(dir + "/manifest.json", Bytes(text.begin(), text.end())); }
  void edit(const std::function<void(json&)>& f) const { write_manifest(rehash_manifest(manifest, f)); }
};

json& tensor(json& body, const std::string& name) {
  for (auto& t : body["ranks"][0]["tensors"])
    if (t["name"] == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static json none;
  return none;
}

// Opening fails with `kind` and a message holding `part`; is_complete() is false.
void expect_refused(const std::string& dir, const std::string& part, ck::ErrorKind kind = ck::ErrorKind::kCorrupt) {
  EXPECT_FALSE(ck::is_complete(dir)) << part;
  try {
    ck::Checkpoint c(dir);
    ADD_FAILURE() << "accepted; expected: " << part;
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();  // names the file
  }
}

}  // namespace

// The case of the review: the size of a cast-predicted BF16 tensor made
// larger (frames added to cover it), hash recomputed. Restore used to XOR
// the cast of bytes past the end of the FP32 source buffer.
TEST(CheckpointManifest, EditedSizeOfCastTensorIsRefused) {
  Saved s;
  ASSERT_FALSE(s.cast.empty()) << "the fixture slices should give a cast-predicted tensor";
  ck::Checkpoint(s.dir).read(s.cast);  // the unedited checkpoint restores
  // size alone: does not match dtype x shape
  s.edit([&](json& b) { tensor(b, s.cast)["size"] = tensor(b, s.cast)["size"].get<uint64_t>() * 4; });
  expect_refused(s.dir, "does not match dtype BF16 x shape");
  // shape and size grown together, frames added: the cast source no longer fits
  s.edit([&](json& b) { grow_tensor(tensor(b, s.cast), 4, true); });
  expect_refused(s.dir, "is not an FP32 tensor of the same shape");
  // A consistent lie: source and cast grown together. The manifest alone
  // cannot tell; the rank file's own index (container Reader) refuses it.
  s.edit([&](json& b) {
    grow_tensor(tensor(b, s.cast), 2, true);
    grow_tensor(tensor(b, s.source), 2, true);
  });
  EXPECT_TRUE(ck::is_complete(s.dir));  // manifests only: consistent
  ck::Checkpoint c(s.dir);
  try {
    c.read(s.cast);
    ADD_FAILURE() << "lie accepted";
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("does not match"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dtype, shape or size differ"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(c.verify().empty());
}

// Rank files: the recorded size is checked by fstat at open, the recorded
// checksum against the file's trailer, every frame against its index.
TEST(CheckpointManifest, RankFileMustBeTheOneTheManifestDescribes) {
  Saved s;
  const std::string rf = s.dir + "/rank-00000.tzip";
  s.edit([](json& b) { b["ranks"][0]["file_size"] = b["ranks"][0]["file_size"].get<uint64_t>() + 4096; });
  EXPECT_FALSE(ck::is_complete(s.dir));
  expect_refused(s.dir, "the manifest records");
  s.edit([](json& b) { b["ranks"][0]["file_xxh64"] = "0123456789abcdef"; });
  {
    ck::Checkpoint c(s.dir);  // open reads the manifest and fstat's the file only
    try {
      c.read(s.data[0].name);
      ADD_FAILURE();
    } catch (const ck::Error& e) {
      EXPECT_NE(std::string(e.what()).find("file checksum"), std::string::npos) << e.what();
    }
  }
  s.edit([](json& b) {  // a frame's hash: the Reader's index says otherwise
    for (auto& t : b["ranks"][0]["tensors"])
      if (!t["frames"].empty() && t["frames"][0]["size"].get<uint64_t>() > 0) {
        t["frames"][0]["xxh64"] = "00000000000000ff";
        break;
      }
  });
  {
    ck::Checkpoint c(s.dir);
    EXPECT_FALSE(c.verify().empty());
  }
  s.write_manifest(s.manifest);
  EXPECT_TRUE(ck::is_complete(s.dir));
  // Truncated rank file: not complete, refused, latest() skips it.
  ASSERT_EQ(::truncate(rf.c_str(), (off_t)fs::file_size(rf) - 100), 0);
  expect_refused(s.dir, "truncated or replaced");
  EXPECT_EQ(ck::latest(s.tmp.path), "");
  ASSERT_EQ(::unlink(rf.c_str()), 0);
  expect_refused(s.dir, "missing");
}

// Each structural rule of the manifest, one edit at a time.
TEST(CheckpointManifest, EveryRuleRefusesItsEdit) {
  Saved s;
  const std::string plain = s.data.back().name;  // an FP32 Adam moment, not predicted
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
  };
  const std::vector<Case> cases = {
      {"'world_size' is not a non-negative integer", [](json& b) { b["world_size"] = -1; }},
      {"rank entries for world_size", [](json& b) { b["world_size"] = 2; }},
      {"says it is rank", [](json& b) { b["ranks"][0]["rank"] = 3; }},
      {"is not 'rank-00000.tzip'", [](json& b) { b["ranks"][0]["file"] = "../step-0/rank-00000.tzip"; }},
      {"is not 'rank-00000.tzip'", [](json& b) { b["ranks"][0]["file"] = "/etc/passwd"; }},
      {"is not the size of a .tzip file", [](json& b) { b["ranks"][0]["file_size"] = 7; }},
      {"'file_size' is not a non-negative integer", [](json& b) { b["ranks"][0]["file_size"] = 1.5; }},
      {"'file_xxh64' is not 16 lower-case hex digits", [](json& b) { b["ranks"][0]["file_xxh64"] = "XYZ"; }},
      {"chunk_bytes", [](json& b) { b["ranks"][0]["chunk_bytes"] = 12345; }},
      {"'tensors' is not an array", [](json& b) { b["ranks"][0]["tensors"] = json::object(); }},
      {"unknown dtype", [&](json& b) { tensor(b, plain)["dtype"] = "F33"; }},
      {"does not match dtype", [&](json& b) { tensor(b, plain)["dtype"] = "F16"; }},
      {"overflows or is not whole bytes",
       [&](json& b) { tensor(b, plain)["shape"] = json::array({1ull << 62, 1ull << 62}); }},
      {"'shape' has more than 64 entries", [&](json& b) { tensor(b, plain)["shape"] = json(std::vector<int>(65, 1)); }},
      {"frames, a tensor of", [&](json& b) { tensor(b, plain)["frames"].push_back(tensor(b, plain)["frames"][0]); }},
      {"holds", [&](json& b) { tensor(b, plain)["frames"][0]["raw_size"] = 17; }},
      {"outside the frame area",
       [&](json& b) { tensor(b, plain)["frames"][0]["offset"] = b["ranks"][0]["file_size"].get<uint64_t>(); }},
      {"outside the frame area", [&](json& b) { tensor(b, plain)["frames"][0]["size"] = ~0ull; }},
      {"outside the frame area", [&](json& b) { tensor(b, plain)["frames"][0]["offset"] = 65; }},
      {"empty frame of a tensor that is not predicted", [&](json& b) { tensor(b, plain)["frames"][0]["size"] = 0; }},
      {"duplicate tensor", [&](json& b) { b["ranks"][0]["tensors"].push_back(tensor(b, plain)); }},
      {"unknown prediction kind", [&](json& b) { tensor(b, s.cast)["predict"]["kind"] = "magic"; }},
      {"unknown predict key", [&](json& b) { tensor(b, s.cast)["predict"]["ref"] = 0; }},
      {"cast prediction of a F32 tensor", [&](json& b) { tensor(b, plain)["predict"] = {{"kind", "cast"}, {"source", s.source}}; }},
      {"is not an FP32 tensor of the same shape", [&](json& b) { tensor(b, s.cast)["predict"]["source"] = "nothing"; }},
      {"delta reference 0 out of range", [&](json& b) { tensor(b, plain)["predict"] = {{"kind", "delta"}, {"ref", 0}}; }},
      {"'codec_dtype'", [&](json& b) { tensor(b, plain)["codec_dtype"] = "f64"; }},
      {"bad 'level'", [&](json& b) { tensor(b, plain)["level"] = 77; }},
      {"depends_on '../x' is not a folder name", [](json& b) { b["depends_on"] = "../x"; }},
      {"depends_on without any rank", [](json& b) { b["depends_on"] = "step-0"; }},
      {"references without depends_on",
       [](json& b) { b["ranks"][0]["references"] = json::array({{{"file", "../a/rank-00000.tzip"}, {"xxh64", "0000000000000000"}}}); }},
      {"'metadata' value of 'step' is not a string", [](json& b) { b["metadata"] = {{"step", 4}}; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    s.edit(c.edit);
    expect_refused(s.dir, c.what);
  }
  // Not the body: format, version, hash, JSON itself.
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"not a tensorzip checkpoint manifest", "{\"format\": \"tzip\"}"},
      {"not valid JSON", "{\"format\": \"tensorzip-checkpoint\", "},
      {"duplicate key", "{\"format\": \"tensorzip-checkpoint\", \"format\": \"tensorzip-checkpoint\"}"},
      {"nests deeper", std::string(1000, '[') + std::string(1000, ']')},
      {"manifest checksum mismatch", [&] {
         json j = json::parse(s.manifest);
         j["body"]["world_size"] = 1;
         j["body"]["metadata"] = {{"x", "y"}};
         return j.dump();
       }()},
      {"unsupported manifest version 4", [&] {
         json j = json::parse(s.manifest);
         j["version"] = 4;
         return j.dump();
       }()},
      {"manifest version 1 cannot hold cast-predicted tensors", [&] {
         json j = json::parse(s.manifest);
         j["version"] = 1;
         return j.dump();
       }()},
  };
  for (const auto& [part, text] : texts) {
    SCOPED_TRACE(part);
    s.write_manifest(text);
    expect_refused(s.dir, part);
  }
  s.write_manifest(s.manifest);
  EXPECT_TRUE(ck::is_complete(s.dir));
  ck::Checkpoint c(s.dir);
  EXPECT_TRUE(c.verify().empty());
}

// The manifest file itself: a FIFO is refused at once (not waited on), an
// oversized one before it is read.
TEST(CheckpointManifest, ManifestFileIsBoundedAndRegular) {
  Saved s;
  const std::string mp = s.dir + "/manifest.json";
  ASSERT_EQ(::unlink(mp.c_str()), 0);
  ASSERT_EQ(::mkfifo(mp.c_str(), 0644), 0);
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(s.dir, "not a regular file");
  EXPECT_EQ(ck::latest(s.tmp.path), "");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_EQ(::unlink(mp.c_str()), 0);
  {
    const int fd = ::open(mp.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, (off_t)300 << 20), 0);  // sparse: costs no disk
    ::close(fd);
  }
  expect_refused(s.dir, "-byte limit");
}

// A multi-rank commit validates every rank index as restore would, and
// writes no manifest from a bad one.
TEST(CheckpointManifest, CommitRefusesABadRankIndex) {
  const auto data = real_tensors();
  const auto v = views(data);
  TempDir d;
  const std::string dir = d.path + "/c";
  auto o = opts();
  o.world_size = 2;
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    auto part = std::span<const ck::TensorView>(v).subspan(r ? v.size() / 2 : 0, r ? v.size() - v.size() / 2 : v.size() / 2);
    ck::save(dir, part, o);
  }
  const std::string idx = dir + "/rank-00001.json";
  const std::string good = slurp(idx);
  json j = json::parse(good);
  j["tensors"][0]["size"] = j["tensors"][0]["size"].get<uint64_t>() + 2;
  auto put = [&](const std::string& text) { write_all(idx, Bytes(text.begin(), text.end())); };
  put(j.dump());
  try {
    ck::commit(dir, 2);
    ADD_FAILURE() << "bad rank index committed";
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("rank-00001.json"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/manifest.json"));
  j = json::parse(good);
  j["rank"] = 0;  // rank 1's index claiming to be rank 0
  put(j.dump());
  EXPECT_THROW(ck::commit(dir, 2), ck::Error);
  EXPECT_FALSE(fs::exists(dir + "/manifest.json"));
  put(good);
  ck::commit(dir, 2);
  ck::Checkpoint c(dir);
  EXPECT_TRUE(c.verify().empty());
}

// depends_on names a sibling folder: a reference elsewhere is refused at
// save time (the manifest could not name it), a cycle makes no checkpoint
// complete.
TEST(CheckpointManifest, ReferenceMustBeASiblingAndChainsEnd) {
  const auto data = real_tensors();
  TempDir d, other;
  ck::save(other.path + "/A", views(data), opts());
  auto o = opts();
  o.ref = other.path + "/A";
  try {
    ck::save(d.path + "/B", views(data), o);
    ADD_FAILURE() << "reference in another folder accepted";
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("beside"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path + "/B/manifest.json"));
  // A -> B -> A: two delta checkpoints depending on each other.
  ck::save(d.path + "/A", views(data), opts());
  auto data2 = data;
  for (auto& t : data2)
    if (t.dtype == "F32") t.bytes[0] ^= 1;
  o.ref = d.path + "/A";
  ck::save(d.path + "/B", views(data2), o);
  ASSERT_TRUE(ck::is_complete(d.path + "/B"));
  const std::string ma = slurp(d.path + "/A/manifest.json"), mb = slurp(d.path + "/B/manifest.json");
  const json jb = json::parse(mb)["body"];
  if (!jb.contains("depends_on")) GTEST_SKIP() << "no delta was taken";
  const std::string text = rehash_manifest(ma, [&](json& b) {
    b["depends_on"] = "B";
    b["ranks"][0]["depends_on"] = "B";
    b["ranks"][0]["references"] = json::array({{{"file", "../B/rank-00000.tzip"}, {"xxh64", jb["ranks"][0]["file_xxh64"]}}});
  });
  write_all(d.path + "/A/manifest.json", Bytes(text.begin(), text.end()));
  EXPECT_FALSE(ck::is_complete(d.path + "/A"));
  EXPECT_FALSE(ck::is_complete(d.path + "/B"));
  EXPECT_EQ(ck::latest(d.path), "");
}
