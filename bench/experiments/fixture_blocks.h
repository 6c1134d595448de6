// Whole 64 Ki-element blocks of the fixture checkpoint's tensors, split
// into the codec's byte streams: the data the experiments in this folder
// measure on (never random numbers). Shared by tz_ctx_decode_bench and
// tz_prefix_decode_study.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codec/fields.h"

namespace tz::experiments {

inline constexpr uint32_t kFixtureBlock = 65536;

// Elements of every tensor of `file` whose name starts with `prefix` and
// whose dtype is `dtype`, whole 64 Ki-element blocks only (tensors smaller
// than a block are left out), as (exponent, stream-1) byte pairs.
inline bool load_blocks(const std::string& file, const char* prefix, const char* dtype, std::vector<uint8_t>& s0,
                 std::vector<uint8_t>& s1, std::string& err) {
  FILE* fp = std::fopen(file.c_str(), "rb");
  uint64_t hl = 0;
  if (!fp || std::fread(&hl, 8, 1, fp) != 1 || hl > (1u << 24)) {
    err = "cannot read the safetensors header of " + file;
    if (fp) std::fclose(fp);
    return false;
  }
  std::string h(hl, '\0');
  if (std::fread(h.data(), 1, hl, fp) != hl) {
    std::fclose(fp);
    err = "truncated header in " + file;
    return false;
  }
  const bool f32 = !std::strcmp(dtype, "F32");
  const size_t esz = f32 ? 4 : 2;
  size_t pos = 0;
  const std::string key = std::string("\"") + prefix;
  while ((pos = h.find(key, pos)) != std::string::npos) {
    const size_t name_end = h.find('"', pos + 1);
    const size_t obj_end = h.find('}', name_end);
    if (name_end == std::string::npos || obj_end == std::string::npos) break;
    const std::string obj = h.substr(name_end, obj_end - name_end);
    pos = obj_end;
    if (obj.find(std::string("\"dtype\":\"") + dtype + "\"") == std::string::npos) continue;
    const size_t d = obj.find("\"data_offsets\":[");
    if (d == std::string::npos) continue;
    unsigned long long a = 0, b = 0;
    if (std::sscanf(obj.c_str() + d, "\"data_offsets\":[%llu,%llu]", &a, &b) != 2 || b < a) continue;
    const size_t n = (size_t)(b - a) / esz;
    const size_t whole = n / kFixtureBlock * kFixtureBlock;
    if (!whole) continue;
    std::vector<uint8_t> raw(whole * esz);
    if (std::fseek(fp, (long)(8 + hl + a), SEEK_SET) != 0 || std::fread(raw.data(), 1, raw.size(), fp) != raw.size()) {
      std::fclose(fp);
      err = "truncated data in " + file;
      return false;
    }
    for (size_t i = 0; i < whole; ++i) {
      uint8_t x0, x1, x2, x3;
      if (f32) split_elem_f32(load_le32(raw.data() + 4 * i), x0, x1, x2, x3);
      else split_elem_bf16(load_le16(raw.data() + 2 * i), x0, x1);
      s0.push_back(x0);
      s1.push_back(x1);
    }
  }
  std::fclose(fp);
  if (s0.empty()) err = std::string("no ") + dtype + " tensor of >= 64 Ki elements named " + prefix + "* in " + file;
  return !s0.empty();
}

// load_blocks of fixtures/file, kept to at most max_blocks whole blocks
// (0: all); nb is their number. The error, if any, printed to stderr.
inline bool load_fixture_blocks(const std::string& fixtures, const char* file, const char* prefix, const char* dtype,
                                size_t max_blocks, std::vector<uint8_t>& s0, std::vector<uint8_t>& s1, size_t& nb) {
  std::string err;
  if (!load_blocks(fixtures + "/" + file, prefix, dtype, s0, s1, err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return false;
  }
  nb = s0.size() / kFixtureBlock;
  if (max_blocks && nb > max_blocks) nb = max_blocks;
  s0.resize(nb * kFixtureBlock);
  s1.resize(nb * kFixtureBlock);
  return true;
}

}  // namespace tz::experiments
