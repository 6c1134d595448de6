// libFuzzer target for the checkpoint manifest (doc/checkpoint.md, "Manifest
// validation"), on the template checkpoints of manifest_fuzz_template.hpp.
// The first input byte selects what the rest is (mod 5):
//   0: B/manifest.json, verbatim
//   1: B/manifest.json with body_xxh64 recomputed, so that edits reach the
//      validation instead of stopping at the (unkeyed) hash
//   2: as 1, each rank's file_size and file_xxh64 set to B's real ones, so
//      that edits reach the rank-file checks and the loads
//   3: as 2, and the frames of each tensor whose name and frame count match
//      B's taken from B's manifest (edits of the other fields then reach
//      the decoders and the cast/delta arithmetic with real frames)
//   4: C/rank-00000.json (a rank index), then commit(C, 1)
// Then is_complete(), latest(), Checkpoint, a load of every tensor into a
// buffer of exactly its size, and verify(). Bad input must end in
// tz::checkpoint::Error; anything else (a crash, a sanitizer report, another
// exception, a hang) is a bug.
//   build-fuzz/tests/checkpoint/fuzz_manifest -max_total_time=1800 tests/checkpoint/corpus
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "manifest_fuzz_template.hpp"
#include "tz_test_manifest.hpp"  // tests/support

namespace ck = tz::checkpoint;
using nlohmann::json;

namespace {

void put(const std::string& path, const char* p, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(p, (std::streamsize)n);
}

// Edits mode 2 and 3 make: the real rank file's facts (and frames).
std::string fix_up(const std::string& text, const tz_fuzz::ManifestTemplate& t, bool frames) {
  const json real = json::parse(t.manifest_b)["body"];
  std::map<std::string, json> real_frames;
  for (const auto& x : real["ranks"][0]["tensors"]) real_frames[x["name"].get<std::string>()] = x["frames"];
  return tz_test::rehash_manifest(text, [&](json& body) {
    if (!body.is_object() || !body.contains("ranks") || !body["ranks"].is_array()) return;
    for (auto& r : body["ranks"]) {
      if (!r.is_object()) continue;
      r["file_size"] = real["ranks"][0]["file_size"];
      r["file_xxh64"] = real["ranks"][0]["file_xxh64"];
      if (!frames || !r.contains("tensors") || !r["tensors"].is_array()) continue;
      for (auto& x : r["tensors"]) {
        if (!x.is_object() || !x.contains("name") || !x["name"].is_string() || !x.contains("frames")) continue;
        const auto it = real_frames.find(x["name"].get<std::string>());
        if (it != real_frames.end() && x["frames"].is_array() && x["frames"].size() == it->second.size())
          x["frames"] = it->second;
      }
    }
  });
}

// TZ_FUZZ_VERBOSE=1: print what each input ends in (for reading a corpus).
void note(const char* what, const std::string& msg) {
  static const bool verbose = [] {
    const char* v = getenv("TZ_FUZZ_VERBOSE");
    return v && *v == '1';
  }();
  if (verbose) std::fprintf(stderr, "  %s: %s\n", what, msg.c_str());
}

void exercise(const std::string& dir, const std::string& root) {
  note("is_complete", ck::is_complete(dir) ? "yes" : "no");
  (void)ck::latest(root);
  try {
    ck::Checkpoint c(dir, 1);
    note("open", "ok, " + std::to_string(c.tensors().size()) + " tensors");
    for (const auto& t : c.tensors()) {
      if (t.size > (16u << 20)) continue;  // the manifest's word only: not worth a buffer here
      std::vector<uint8_t> out(t.size);
      const ck::LoadRequest r{t.name, out.data(), out.size(), ck::Memory::kHost};
      try {
        c.load(std::span<const ck::LoadRequest>(&r, 1));
        note("load", t.name + " ok");
      } catch (const ck::Error& e) {
        note("load", e.what());
      }
    }
    note("verify", std::to_string(c.verify().size()) + " damaged");
  } catch (const ck::Error& e) {
    note("open", e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (4u << 20)) return 0;
  const tz_fuzz::ManifestTemplate& t = tz_fuzz::manifest_template();
  const unsigned mode = data[0] % 5;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 4) {
    put(t.c + "/rank-00000.json", text.data(), text.size());
    ::unlink((t.c + "/manifest.json").c_str());
    try {
      ck::commit(t.c, 1);
      note("commit", "ok");
    } catch (const ck::Error& e) {
      note("commit", e.what());
    }
    exercise(t.c, t.root);
    ::unlink((t.c + "/manifest.json").c_str());
    return 0;
  }
  if (mode == 1) text = tz_test::rehash_manifest(text);
  if (mode >= 2) text = fix_up(text, t, mode == 3);
  put(t.b + "/manifest.json", text.data(), text.size());
  exercise(t.b, t.root);
  return 0;
}
