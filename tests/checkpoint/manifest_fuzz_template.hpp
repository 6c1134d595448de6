// The checkpoints the manifest fuzz target (fuzz_manifest.cpp) and its seed
// generator (make_manifest_corpus.cpp) work on, saved once per process into
// a temporary folder (removed at exit):
//   A/  a plain checkpoint: FP32 master + its exact BF16 cast (cast-predicted,
//       empty frames), an FP32 tensor of two frames, an I64 and an empty tensor
//   B/  the next step, saved with A as reference (delta-predicted tensors)
//   C/  B's rank file without a manifest, for the multi-rank commit() path
// Deterministic: same tensors, level 1, one thread.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensorzip/checkpoint.hpp"

namespace tz_fuzz {

struct ManifestTemplate {
  std::string root, a, b, c;
  std::string manifest_b;  // B/manifest.json as saved
  std::string index_c;     // C/rank-00000.json as saved
};

inline uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

inline std::string slurp_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Tensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

inline std::vector<Tensor> template_tensors(int step) {
  std::vector<Tensor> v;
  uint32_t x = 12345;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  auto f32 = [&](const char* name, uint64_t rows) {
    Tensor t{name, "F32", {rows, 1024}, std::vector<uint8_t>(rows * 1024 * 4)};
    for (size_t i = 0; i < rows * 1024; ++i) {
      float f = ((float)(next() >> 8) / 16777216.0f - 0.5f) * 0.02f;
      if (step && i % 16 == 0) f *= 1.0001f;  // the next step: small updates
      std::memcpy(&t.bytes[4 * i], &f, 4);
    }
    return t;
  };
  v.push_back(f32("w.master", 256));
  Tensor w{"w", "BF16", {256, 1024}, std::vector<uint8_t>(256 * 1024 * 2)};
  for (size_t i = 0; i < 256 * 1024; ++i) {
    float f;
    std::memcpy(&f, &v[0].bytes[4 * i], 4);
    const uint16_t h = bf16_rne(f);
    std::memcpy(&w.bytes[2 * i], &h, 2);
  }
  v.push_back(std::move(w));
  v.push_back(f32("m", 300));
  v.push_back({"s", "I64", {3}, std::vector<uint8_t>(24, 7)});
  v.push_back({"e", "BF16", {0}, {}});
  return v;
}

inline std::vector<tz::checkpoint::TensorView> template_views(const std::vector<Tensor>& v) {
  std::vector<tz::checkpoint::TensorView> out;
  for (const auto& t : v) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

struct TemplateDir {
  ManifestTemplate t;
  TemplateDir() {
    const char* tmp = getenv("TMPDIR");
    std::string p = std::string(tmp && *tmp ? tmp : "/tmp") + "/tz_fuzz_manifest_XXXXXX";
    std::vector<char> b(p.begin(), p.end());
    b.push_back(0);
    if (!mkdtemp(b.data())) abort();
    t.root = b.data();
    t.a = t.root + "/A";
    t.b = t.root + "/B";
    t.c = t.root + "/C";
    namespace ck = tz::checkpoint;
    ck::SaveOptions o;
    o.codec = ck::Codec::kFast;
    o.threads = 1;
    o.chunk_bytes = 1u << 20;
    o.metadata = {{"step", "1"}};
    const auto a = template_tensors(0), bb = template_tensors(1);
    ck::save(t.a, template_views(a), o);
    o.ref = t.a;
    o.metadata = {{"step", "2"}};
    ck::save(t.b, template_views(bb), o);
    o.world_size = 2;  // leaves rank-00000.json, no manifest
    ck::save(t.c, template_views(bb), o);
    t.manifest_b = slurp_file(t.b + "/manifest.json");
    t.index_c = slurp_file(t.c + "/rank-00000.json");
  }
  ~TemplateDir() { std::filesystem::remove_all(t.root); }
};

inline const ManifestTemplate& manifest_template() {
  static TemplateDir d;
  return d.t;
}

}  // namespace tz_fuzz
