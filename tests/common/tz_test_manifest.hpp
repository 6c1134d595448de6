// Rewriting a checkpoint manifest with its body checksum recomputed, so that
// a test (or the manifest fuzz target) reaches the manifest validation
// itself instead of stopping at the hash. The hash is unkeyed: anyone can
// do this, which is why restore must not trust what the manifest says.
#pragma once

#include <xxhash.h>

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
// text unchanged if it is not a JSON object with a "body".
inline std::string rehash_manifest(const std::string& text, const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("body")) return text;
  if (edit) edit(j["body"]);
  j["body_xxh64"] = manifest_body_hash(j["body"]);
  return j.dump(1) + "\n";
}

}  // namespace tz_test
