// Rewriting a checkpoint manifest with its body checksum recomputed, so that
// a test (or the manifest fuzz target) reaches the manifest validation
// itself instead of stopping at the hash. The hash is unkeyed: anyone can
// do this, which is why restore must not trust what the manifest says.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace tz_test {

// body_xxh64 of a manifest body (what the engine writes).
inline std::string manifest_body_hash(const nlohmann::json& body) {
  const std::string d = body.dump();
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)XXH64(d.data(), d.size(), 0));
  return b;
}

// The manifest text with edit(body) applied and the checksum fixed; the
// text unchanged if it is not a JSON object with a "body", or nests deeper
// than 64 levels (serialising that would recurse as deep: the engine's own
// parser refuses it anyway).
inline std::string rehash_manifest(const std::string& text, const std::function<void(nlohmann::json&)>& edit = {}) {
  struct TooDeep {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(
        text,
        [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
          if (depth > 64) throw TooDeep{};
          return true;
        },
        /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    return text;
  }
  if (!j.is_object() || !j.contains("body")) return text;
  if (edit) edit(j["body"]);
  j["body_xxh64"] = manifest_body_hash(j["body"]);
  return j.dump(1) + "\n";
}

// A manifest tensor entry made `factor` times larger in its first
// dimension, size and (with frames) its frame list (frames repeated, each
// holding min(chunk, what is left)): a lie that stays consistent with
// itself.
inline void grow_tensor(nlohmann::json& t, uint64_t factor, bool frames, uint64_t chunk = 1u << 20) {
  t["shape"][0] = t["shape"][0].get<uint64_t>() * factor;
  t["size"] = t["size"].get<uint64_t>() * factor;
  if (!frames) return;
  nlohmann::json fs = nlohmann::json::array();
  uint64_t left = t["size"];
  for (size_t k = 0; left; ++k) {
    nlohmann::json g = t["frames"][std::min<size_t>(k, t["frames"].size() - 1)];
    g["raw_size"] = std::min<uint64_t>(left, chunk);
    left -= g["raw_size"].get<uint64_t>();
    fs.push_back(g);
  }
  t["frames"] = fs;
}

}  // namespace tz_test
