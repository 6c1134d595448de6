// Seed corpus of the manifest fuzz target (fuzz_manifest.cpp): the template
// checkpoint's manifest and rank index in every mode, and the crafted
// manifests of the review (an edited cast tensor size with the hash
// recomputed, a consistent lie, sizes, frames, predictions, references,
// depends_on, JSON oddities), each prefixed with its mode byte. Run by
// hand, output committed in tests/checkpoint/corpus:
//   build/tests/checkpoint/tz_make_manifest_corpus tests/checkpoint/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "manifest_fuzz_template.hpp"
#include "tz_test_manifest.hpp"  // tests/support

using nlohmann::json;

namespace {

json& tensor(json& b, const std::string& name) {
  for (auto& t : b["ranks"][0]["tensors"])
    if (t["name"] == name) return t;
  static json none;
  return none;
}

using tz_test::grow_tensor;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 1;
  }
  const std::string out = argv[1];
  std::filesystem::create_directories(out);
  const auto& t = tz_fuzz::manifest_template();
  int n = 0;
  auto seed = [&](const std::string& name, unsigned mode, const std::string& text) {
    std::ofstream f(out + "/seed_" + name, std::ios::binary | std::ios::trunc);
    const char m = (char)mode;
    f.write(&m, 1);
    f.write(text.data(), (std::streamsize)text.size());
    ++n;
  };
  auto edited = [&](const std::string& name, unsigned mode, const std::function<void(json&)>& edit) {
    seed(name, mode, tz_test::rehash_manifest(t.manifest_b, edit));
  };
  for (unsigned m = 0; m < 4; ++m) seed("template_mode" + std::to_string(m), m, t.manifest_b);
  seed("template_index", 4, t.index_c);

  // The review's case and its variants (mode 2: real file facts).
  edited("cast_size_x4", 2, [](json& b) { tensor(b, "w")["size"] = tensor(b, "w")["size"].get<uint64_t>() * 4; });
  edited("cast_grown_with_frames", 2, [](json& b) { grow_tensor(tensor(b, "w"), 4, true); });
  edited("cast_and_source_grown", 2, [](json& b) {
    grow_tensor(tensor(b, "w"), 2, true);
    grow_tensor(tensor(b, "w.master"), 2, true);
  });
  edited("cast_source_is_int", 2, [](json& b) { tensor(b, "w")["predict"]["source"] = "s"; });
  edited("cast_source_self", 2, [](json& b) { tensor(b, "w")["predict"]["source"] = "w"; });
  edited("cast_source_missing", 2, [](json& b) { tensor(b, "w")["predict"].erase("source"); });
  edited("cast_of_f32", 2, [](json& b) { tensor(b, "m")["predict"] = {{"kind", "cast"}, {"source", "w.master"}}; });
  edited("cast_source_is_cast", 2, [](json& b) {
    tensor(b, "w.master")["predict"] = {{"kind", "cast"}, {"source", "w"}};
  });
  // Sizes and the rank file.
  edited("file_size_plus", 1, [](json& b) { b["ranks"][0]["file_size"] = b["ranks"][0]["file_size"].get<uint64_t>() + 4096; });
  edited("file_size_minus", 1, [](json& b) { b["ranks"][0]["file_size"] = b["ranks"][0]["file_size"].get<uint64_t>() - 64; });
  edited("file_size_huge", 1, [](json& b) { b["ranks"][0]["file_size"] = ~0ull; });
  edited("file_xxh64_other", 1, [](json& b) { b["ranks"][0]["file_xxh64"] = "0123456789abcdef"; });
  edited("chunk_bytes_odd", 2, [](json& b) { b["ranks"][0]["chunk_bytes"] = 3u << 20; });
  edited("chunk_bytes_small", 2, [](json& b) { b["ranks"][0]["chunk_bytes"] = 4096; });
  // Frames.
  edited("frame_xxh64", 2, [](json& b) { tensor(b, "m")["frames"][0]["xxh64"] = "00000000000000ff"; });
  edited("frame_offset_past_end", 2, [](json& b) { tensor(b, "m")["frames"][1]["offset"] = 1ull << 40; });
  edited("frame_size_max", 2, [](json& b) { tensor(b, "m")["frames"][1]["size"] = ~0ull; });
  edited("frame_offset_unaligned", 2, [](json& b) { tensor(b, "m")["frames"][0]["offset"] = 65; });
  edited("frame_offset_zero", 2, [](json& b) { tensor(b, "m")["frames"][0]["offset"] = 0; });
  edited("frame_raw_size", 2, [](json& b) { tensor(b, "m")["frames"][1]["raw_size"] = 1u << 20; });
  edited("frame_extra", 2, [](json& b) { tensor(b, "m")["frames"].push_back(tensor(b, "m")["frames"][1]); });
  edited("frame_missing", 2, [](json& b) { tensor(b, "m")["frames"].erase(1); });
  edited("frames_swapped", 3, [](json& b) {
    std::swap(tensor(b, "m")["frames"][0]["offset"], tensor(b, "w.master")["frames"][0]["offset"]);
  });
  edited("frame_empty_plain", 2, [](json& b) { tensor(b, "s")["frames"][0]["size"] = 0; });
  edited("frame_negative", 2, [](json& b) { tensor(b, "m")["frames"][0]["offset"] = -64; });
  edited("frame_float", 2, [](json& b) { tensor(b, "m")["frames"][0]["size"] = 1e30; });
  // Shapes and dtypes.
  edited("shape_overflow", 3, [](json& b) { tensor(b, "m")["shape"] = json::array({1ull << 62, 1ull << 62}); });
  edited("shape_65_dims", 3, [](json& b) { tensor(b, "m")["shape"] = json(std::vector<int>(65, 1)); });
  edited("shape_string", 3, [](json& b) { tensor(b, "m")["shape"][0] = "300"; });
  edited("dtype_unknown", 3, [](json& b) { tensor(b, "m")["dtype"] = "F33"; });
  edited("dtype_f64_same_size", 3, [](json& b) {
    tensor(b, "m")["dtype"] = "F64";
    tensor(b, "m")["shape"][1] = 512;
  });
  edited("dtype_sub_byte", 3, [](json& b) {
    tensor(b, "s")["dtype"] = "F4";
    tensor(b, "s")["shape"] = json::array({1});
  });
  edited("size_shape_both_edited", 3, [](json& b) {
    tensor(b, "s")["shape"][0] = 6;
    tensor(b, "s")["size"] = 48;
  });
  // Predictions, references, depends_on.
  edited("delta_ref_out_of_range", 3, [](json& b) {
    for (auto& x : b["ranks"][0]["tensors"])
      if (x.contains("predict") && x["predict"]["kind"] == "delta") x["predict"]["ref"] = 5;
  });
  edited("delta_ref_negative", 3, [](json& b) {
    for (auto& x : b["ranks"][0]["tensors"])
      if (x.contains("predict") && x["predict"]["kind"] == "delta") x["predict"]["ref"] = -1;
  });
  edited("delta_without_references", 3, [](json& b) {
    b["ranks"][0].erase("references");
    b["ranks"][0].erase("depends_on");
    b.erase("depends_on");
  });
  edited("predict_unknown_kind", 3, [](json& b) { tensor(b, "w")["predict"]["kind"] = "magic"; });
  edited("predict_extra_key", 3, [](json& b) { tensor(b, "w")["predict"]["ref"] = 0; });
  edited("depends_on_self", 3, [](json& b) {
    b["depends_on"] = "B";
    b["ranks"][0]["depends_on"] = "B";
    b["ranks"][0]["references"][0]["file"] = "../B/rank-00000.tzip";
  });
  edited("depends_on_no_manifest", 3, [](json& b) {
    b["depends_on"] = "C";
    b["ranks"][0]["depends_on"] = "C";
    b["ranks"][0]["references"][0]["file"] = "../C/rank-00000.tzip";
  });
  edited("depends_on_escapes", 3, [](json& b) { b["depends_on"] = "../../etc"; });
  edited("reference_absolute", 3, [](json& b) { b["ranks"][0]["references"][0]["file"] = "/etc/passwd"; });
  edited("reference_twice", 3, [](json& b) { b["ranks"][0]["references"].push_back(b["ranks"][0]["references"][0]); });
  edited("reference_hash_other", 3, [](json& b) { b["ranks"][0]["references"][0]["xxh64"] = "1111111111111111"; });
  // Ranks, names, metadata, versions.
  edited("world_size_2", 3, [](json& b) { b["world_size"] = 2; });
  edited("world_size_2_two_ranks", 3, [](json& b) {
    json r = b["ranks"][0];
    r["rank"] = 1;
    r["file"] = "rank-00001.tzip";
    b["ranks"].push_back(r);
    b["world_size"] = 2;
  });
  edited("rank_3", 3, [](json& b) { b["ranks"][0]["rank"] = 3; });
  edited("file_escapes", 3, [](json& b) { b["ranks"][0]["file"] = "../A/rank-00000.tzip"; });
  edited("file_absolute", 3, [](json& b) { b["ranks"][0]["file"] = "/etc/passwd"; });
  edited("duplicate_tensor", 3, [](json& b) { b["ranks"][0]["tensors"].push_back(tensor(b, "s")); });
  edited("name_empty", 3, [](json& b) { tensor(b, "s")["name"] = ""; });
  edited("name_nul", 3, [](json& b) { tensor(b, "s")["name"] = std::string("s\0x", 3); });
  edited("name_long", 3, [](json& b) { tensor(b, "s")["name"] = std::string(100000, 'n'); });
  edited("metadata_number", 3, [](json& b) { b["metadata"] = {{"step", 2}}; });
  edited("metadata_nested", 3, [](json& b) { b["metadata"] = {{"step", {{"a", "b"}}}}; });
  {
    json j = json::parse(t.manifest_b);
    j["version"] = 1;
    seed("version_1_with_predictions", 0, j.dump());
    j["version"] = 4;
    seed("version_4", 0, j.dump());
    j["version"] = -3;
    seed("version_negative", 0, j.dump());
  }
  // JSON itself.
  seed("empty", 0, "");
  seed("not_json", 0, "manifest");
  seed("deep_nesting", 1, "{\"format\":\"tensorzip-checkpoint\",\"body\":" + std::string(5000, '[') + std::string(5000, ']') + "}");
  seed("duplicate_key", 0, "{\"format\":\"tensorzip-checkpoint\",\"format\":\"x\",\"body\":{}}");
  seed("trailing_garbage", 0, t.manifest_b + "}}");
  seed("bom", 0, "\xEF\xBB\xBF" + t.manifest_b);
  seed("truncated", 0, t.manifest_b.substr(0, t.manifest_b.size() / 2));
  seed("big_number", 1, "{\"format\":\"tensorzip-checkpoint\",\"version\":3,\"body_xxh64\":\"0\",\"body\":{\"world_size\":1e400}}");
  // Rank indexes (commit path).
  {
    json j = json::parse(t.index_c);
    j["tensors"][0]["size"] = j["tensors"][0]["size"].get<uint64_t>() + 2;
    seed("index_size", 4, j.dump());
    j = json::parse(t.index_c);
    j["rank"] = 1;
    seed("index_rank_1", 4, j.dump());
    j = json::parse(t.index_c);
    j["file_size"] = 100;
    seed("index_file_size", 4, j.dump());
    j = json::parse(t.index_c);
    for (auto& x : j["tensors"])
      if (x["name"] == "w") grow_tensor(x, 2, true);
    seed("index_cast_grown", 4, j.dump());
    seed("index_is_a_manifest", 4, t.manifest_b);
  }
  std::printf("wrote %d seeds to %s\n", n, out.c_str());
  return 0;
}
