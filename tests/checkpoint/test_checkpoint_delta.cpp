// Delta checkpoints (SaveOptions::ref): tensors stored as XOR residuals
// against the same-named tensors of the previous checkpoint's rank file.
// Byte-identical restores (whole and partial), smaller rank files, the
// dependency in the manifest, clear errors when the previous checkpoint is
// missing or changed, casts and deltas in one file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "tensorzip/checkpoint.hpp"
#include "tensorzip/container.hpp"
#include "tz_test_checkpoint.hpp"  // tests/support

namespace fs = std::filesystem;
namespace ck = tz::checkpoint;
using namespace tz_test;

namespace {

void expect_identical(ck::Checkpoint& c, const std::vector<Owned>& ref) {
  ASSERT_EQ(c.tensors().size(), ref.size());
  for (const auto& o : ref) EXPECT_TRUE(c.read(o.name) == o.bytes) << o.name;
}

ck::SaveOptions opts() {
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  return o;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Step B from step A: master weights get a small update (low mantissa bits
// of one element in 16), Adam moments are replaced by unrelated values of
// the same distribution (A's reversed), BF16 weights stay.
std::vector<Owned> next_step(std::vector<Owned> v) {
  for (auto& t : v) {
    if (starts_with(t.name, "master.")) {
      for (size_t i = 0; i < t.bytes.size(); i += 4 * 16) t.bytes[i] ^= (uint8_t)(1 + (i / 64) % 7);
    } else if (starts_with(t.name, "exp_avg")) {
      const size_t n = t.bytes.size() / 4;
      for (size_t i = 0; i < n / 2; ++i) std::swap_ranges(&t.bytes[4 * i], &t.bytes[4 * i + 4], &t.bytes[4 * (n - 1 - i)]);
    }
  }
  return v;
}

}  // namespace

TEST(CheckpointDelta, SaveWithPreviousCheckpointAsReference) {
  const std::string data = TZ_TEST_DATA_DIR;
  const auto a = load_pair(data + "/fixture-slice-bf16.safetensors", data + "/fixture-slice-fp32.safetensors");
  const auto b = next_step(a);
  TempDir d;
  auto o = opts();
  const auto sa = ck::save(d.path + "/step-A", views(a), o);
  EXPECT_EQ(sa.deltas, 0u);
  const auto s0 = ck::save(d.path + "/step-B0", views(b), o);  // without ref
  o.ref = d.path + "/step-A";
  const auto sb = ck::save(d.path + "/step-B", views(b), o);
  EXPECT_GT(sb.deltas, 0u);
  EXPECT_GT(sb.predicted, 0u);  // casts and deltas in one file
  EXPECT_LT(sb.file_bytes, s0.file_bytes);
  std::printf("slices: raw %llu, without ref %llu, with ref %llu (%llu deltas, %llu casts)\n",
              (unsigned long long)sb.raw_bytes, (unsigned long long)s0.file_bytes, (unsigned long long)sb.file_bytes,
              (unsigned long long)sb.deltas, (unsigned long long)sb.predicted);

  // The dependency: in the manifest (folder name) and in the rank file
  // (relative path + checksum); no dependency recorded without ref.
  const std::string mb = slurp(d.path + "/step-B/manifest.json");
  EXPECT_NE(mb.find("\"depends_on\": \"step-A\""), std::string::npos) << mb.substr(0, 400);
  EXPECT_NE(mb.find("\"version\": 3"), std::string::npos);
  EXPECT_EQ(slurp(d.path + "/step-B0/manifest.json").find("depends_on"), std::string::npos);
  {
    tz::container::Reader rd(d.path + "/step-B/rank-00000.tzip", 1);
    ASSERT_EQ(rd.references().size(), 1u);
    EXPECT_EQ(rd.references()[0].file, "../step-A/rank-00000.tzip");
    EXPECT_EQ(rd.references()[0].xxh64, tz::container::Reader(d.path + "/step-A/rank-00000.tzip", 1).file_checksum());
    size_t master_deltas = 0, moment_deltas = 0;
    for (const auto& t : rd.tensors()) {
      if (t.predict.kind != tz::container::PredictKind::kDelta) continue;
      if (starts_with(t.name, "master.")) ++master_deltas;
      if (starts_with(t.name, "exp_avg") && t.raw_size() >= (256u << 10)) ++moment_deltas;
    }
    EXPECT_GT(master_deltas, 0u);
    EXPECT_EQ(moment_deltas, 0u);  // the large moments: replaced, unrelated values
    // The container reader resolves the reference by its relative path.
    for (const auto& t : b) EXPECT_TRUE(rd.read_tensor(t.name) == t.bytes) << t.name;
  }

  // Whole restore, then one delta tensor alone, then a subset.
  {
    ck::Checkpoint c(d.path + "/step-B", 2);
    expect_identical(c, b);
    EXPECT_TRUE(c.verify().empty());
  }
  const Owned* master = nullptr;
  for (const auto& t : b)
    if (t.name == "master.blocks.2.proj.weight") master = &t;
  ASSERT_NE(master, nullptr);
  EXPECT_TRUE(ck::Checkpoint(d.path + "/step-B").read(master->name) == master->bytes);
  {
    ck::Checkpoint c(d.path + "/step-B", 2);
    std::vector<uint8_t> x(master->bytes.size()), y(b[0].bytes.size());
    const ck::LoadRequest req[] = {{master->name, x.data(), x.size()}, {b[0].name, y.data(), y.size()}};
    c.load(req);
    EXPECT_TRUE(x == master->bytes);
    EXPECT_TRUE(y == b[0].bytes);
  }

  // A third step on top of B: a chain (C -> B -> A) restores too.
  {
    const auto c3 = next_step(b);
    o.ref = d.path + "/step-B";
    const auto sc = ck::save(d.path + "/step-C", views(c3), o);
    EXPECT_GT(sc.deltas, 0u);
    ck::Checkpoint c(d.path + "/step-C", 2);
    expect_identical(c, c3);
  }

  // The previous checkpoint moved away: a clear error naming both files.
  fs::rename(d.path + "/step-A", d.path + "/moved");
  try {
    ck::Checkpoint c(d.path + "/step-B");
    ADD_FAILURE() << "missing reference not detected";
  } catch (const ck::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("step-B/rank-00000.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("step-A/rank-00000.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("missing"), std::string::npos) << w;
    EXPECT_EQ(w.find("/../"), std::string::npos) << w;  // the reference's path, normalized
    std::printf("missing reference: %s\n", w.c_str());
  }
  // Replaced by another checkpoint of the same name: changed.
  ck::SaveOptions o2 = opts();
  ck::save(d.path + "/step-A", views(b), o2);
  try {
    ck::Checkpoint c(d.path + "/step-B");
    ADD_FAILURE() << "changed reference not detected";
  } catch (const ck::Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt);
    EXPECT_NE(w.find("step-B/rank-00000.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("step-A/rank-00000.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("changed"), std::string::npos) << w;
    std::printf("changed reference: %s\n", w.c_str());
  }
  // Put back: restorable again.
  fs::remove_all(d.path + "/step-A");
  fs::rename(d.path + "/moved", d.path + "/step-A");
  ck::Checkpoint c(d.path + "/step-B", 2);
  expect_identical(c, b);
}

TEST(CheckpointDelta, BadReferenceIsRefused) {
  const std::string data = TZ_TEST_DATA_DIR;
  const auto a = load_safetensors(data + "/fixture-slice-fp32.safetensors");
  TempDir d;
  auto o = opts();
  o.ref = d.path + "/nothing-here";
  try {
    ck::save(d.path + "/B", views(a), o);
    ADD_FAILURE() << "missing reference checkpoint accepted";
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("nothing-here"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path + "/B/manifest.json"));
}

TEST(CheckpointDelta, MultiRankManifestRecordsDependency) {
  const std::string data = TZ_TEST_DATA_DIR;
  const auto a = load_safetensors(data + "/fixture-slice-fp32.safetensors");
  const auto b = next_step(a);
  TempDir d;
  auto o = opts();
  o.world_size = 2;
  // Each rank holds its own tensors (names prefixed by the rank).
  auto of_rank = [](std::vector<Owned> v, int r) {
    for (auto& t : v) t.name = "r" + std::to_string(r) + "." + t.name;
    return v;
  };
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    ck::save(d.path + "/A", views(of_rank(a, r)), o);
  }
  ck::commit(d.path + "/A", 2);
  o.ref = d.path + "/A/";  // a trailing slash is fine
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    const auto v = of_rank(b, r);
    EXPECT_GT(ck::save(d.path + "/B", views(v), o).deltas, 0u);
  }
  ck::commit(d.path + "/B", 2);
  EXPECT_NE(slurp(d.path + "/B/manifest.json").find("\"depends_on\": \"A\""), std::string::npos);
  EXPECT_TRUE(ck::Checkpoint(d.path + "/B", 2).verify().empty());
}

// A delta checkpoint whose previous one is gone (or damaged) is not
// complete, and latest() falls back to the newest restorable one.
TEST(CheckpointDelta, LatestSkipsCheckpointsWithAMissingDependency) {
  const std::string data = TZ_TEST_DATA_DIR;
  const auto a = load_safetensors(data + "/fixture-slice-fp32.safetensors");
  const auto b = next_step(a);
  const auto c = next_step(b);
  TempDir d;
  auto o = opts();
  ck::save(d.path + "/step-1", views(a), o);
  o.ref = d.path + "/step-1";
  EXPECT_GT(ck::save(d.path + "/step-2", views(b), o).deltas, 0u);
  o.ref = d.path + "/step-2";
  EXPECT_GT(ck::save(d.path + "/step-3", views(c), o).deltas, 0u);
  o.ref.clear();
  ck::save(d.path + "/step-0", views(a), o);  // standalone, oldest by name
  EXPECT_TRUE(ck::is_complete(d.path + "/step-3"));
  EXPECT_TRUE(ck::is_complete(d.path + "/step-3/"));
  EXPECT_EQ(ck::latest(d.path), d.path + "/step-3");

  // The chain's root damaged: step-2 and step-3 cannot be restored.
  fs::rename(d.path + "/step-1/manifest.json", d.path + "/step-1/manifest.json.bak");
  EXPECT_FALSE(ck::is_complete(d.path + "/step-1"));
  EXPECT_FALSE(ck::is_complete(d.path + "/step-2"));
  EXPECT_FALSE(ck::is_complete(d.path + "/step-3"));
  EXPECT_EQ(ck::latest(d.path), d.path + "/step-0");
  fs::rename(d.path + "/step-1/manifest.json.bak", d.path + "/step-1/manifest.json");
  EXPECT_EQ(ck::latest(d.path), d.path + "/step-3");

  // The middle link deleted (a retention policy that ignored depends_on).
  fs::remove_all(d.path + "/step-2");
  EXPECT_FALSE(ck::is_complete(d.path + "/step-3"));
  EXPECT_EQ(ck::latest(d.path), d.path + "/step-1");
  EXPECT_THROW(ck::Checkpoint(d.path + "/step-3", 1), ck::Error);
}

// The real AdamW run: step 400 saved with step 200 as reference. Prints the
// sizes (bench/experiments/notebook.md); master weights take a delta.
TEST(CheckpointDelta, FixtureStep200ToStep400) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  if (!fs::exists(fx + "/gpt-small-step200-model-bf16.safetensors")) GTEST_SKIP() << "no shared fixtures at " << fx;
  const auto s200 = load_pair(fx + "/gpt-small-step200-model-bf16.safetensors", fx + "/gpt-small-step200-optim-fp32.safetensors");
  const auto s400 = load_pair(fx + "/gpt-small-step400-model-bf16.safetensors", fx + "/gpt-small-step400-optim-fp32.safetensors");
  TempDir d;
  auto o = opts();
  ck::save(d.path + "/step200", views(s200), o);
  const auto plain = ck::save(d.path + "/step400-plain", views(s400), o);
  o.ref = d.path + "/step200";
  const auto delta = ck::save(d.path + "/step400", views(s400), o);
  std::printf("fixture step400: raw %llu, without ref %llu (ratio %.4f), with ref step200 %llu (ratio %.4f); "
              "%llu deltas, %llu casts\n",
              (unsigned long long)plain.raw_bytes, (unsigned long long)plain.file_bytes,
              (double)plain.raw_bytes / (double)plain.file_bytes, (unsigned long long)delta.file_bytes,
              (double)delta.raw_bytes / (double)delta.file_bytes, (unsigned long long)delta.deltas,
              (unsigned long long)delta.predicted);
  EXPECT_GT(delta.deltas, 0u);
  tz::container::Reader rd(d.path + "/step400/rank-00000.tzip", 1);
  size_t master_deltas = 0, moment_deltas = 0, masters = 0;
  for (const auto& t : rd.tensors()) {
    if (starts_with(t.name, "master.")) ++masters;
    if (t.predict.kind != tz::container::PredictKind::kDelta) continue;
    if (starts_with(t.name, "master.")) ++master_deltas;
    if (starts_with(t.name, "exp_avg")) ++moment_deltas;
  }
  std::printf("fixture step400: %zu of %zu masters take a delta, %zu Adam moments; save %.2f s without ref, "
              "%.2f s with ref\n",
              master_deltas, masters, moment_deltas, plain.seconds, delta.seconds);
  EXPECT_GT(master_deltas, 0u);
  ck::Checkpoint c(d.path + "/step400", 2);
  expect_identical(c, s400);
}

// depends_on chains follow the references module's rules: a cycle of
// checkpoint folders, or a chain of more than 64 links, is not complete (and
// is found without reading a manifest more than once per folder).
TEST(CheckpointDelta, DependsOnCycleAndOverlongChainsAreNotComplete) {
  TempDir d;
  // Valid manifests (the strict parser accepts them) of one rank whose file
  // is a placeholder of the recorded size: is_complete checks the chain and
  // the files' presence and sizes, not their content.
  auto manifest = [&](const std::string& dir, const std::string& dep) {
    fs::create_directories(dir);
    const std::string placeholder(4096, 'x');
    std::ofstream(dir + "/rank-00000.tzip", std::ios::binary) << placeholder;
    nlohmann::json rank = {{"rank", 0},
                           {"file", "rank-00000.tzip"},
                           {"file_size", placeholder.size()},
                           {"file_xxh64", "0123456789abcdef"},
                           {"chunk_bytes", 1u << 20},
                           {"tensors", nlohmann::json::array()}};
    if (!dep.empty()) {
      rank["depends_on"] = dep;
      rank["references"] = {{{"file", "../" + dep + "/rank-00000.tzip"}, {"xxh64", "0123456789abcdef"}}};
    }
    nlohmann::json body = {{"world_size", 1}, {"ranks", nlohmann::json::array({rank})}};
    if (!dep.empty()) body["depends_on"] = dep;
    const std::string b = body.dump();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(b.data(), b.size(), 0));
    std::ofstream(dir + "/manifest.json") << nlohmann::json{{"format", "tensorzip-checkpoint"}, {"version", 3},
                                                            {"body_xxh64", hex}, {"body", body}}
                                                 .dump();
  };
  manifest(d.path + "/A", "B");
  manifest(d.path + "/B", "A");
  EXPECT_FALSE(ck::is_complete(d.path + "/A"));
  manifest(d.path + "/S", "S");  // itself
  EXPECT_FALSE(ck::is_complete(d.path + "/S"));
  // A chain: c0 <- c1 <- ... <- c70.
  manifest(d.path + "/c0", "");
  ASSERT_TRUE(ck::is_complete(d.path + "/c0"));  // the placeholder manifests are valid ones
  for (int i = 1; i <= 70; ++i) manifest(d.path + "/c" + std::to_string(i), "c" + std::to_string(i - 1));
  EXPECT_TRUE(ck::is_complete(d.path + "/c64"));  // 64 links
  EXPECT_FALSE(ck::is_complete(d.path + "/c65"));
  EXPECT_FALSE(ck::is_complete(d.path + "/c70"));
  // depends_on naming anything but a sibling folder.
  manifest(d.path + "/up", "../c0");
  EXPECT_FALSE(ck::is_complete(d.path + "/up"));
  // Newest by name first: "up" (broken), then "c9" (a chain of 9 links).
  EXPECT_EQ(ck::latest(d.path), d.path + "/c9");
}
