// Rewriting a .tzip file's JSON header with every checksum fixed, so that a
// test of header validation sees the validation itself (not a hash) catch
// the edit. Shared by tests/container/test_container.cpp and test_predict.cpp.
#pragma once

#include <xxhash.h>
#include <zstd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tz_test {

inline uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

// f: a whole .tzip file; returns it with the stored header bytes replaced
// by `stored` and the preamble flags by `flags`, checksums fixed.
inline std::vector<uint8_t> with_stored_header(const std::vector<uint8_t>& f, const std::string& stored,
                                               uint8_t flags) {
  using Bytes = std::vector<uint8_t>;
  const uint8_t* tr = f.data() + f.size() - 48;
  const uint64_t ho = le64(tr);
  Bytes out(f.begin(), f.begin() + (long)ho);
  out[8] = flags;
  out.insert(out.end(), stored.begin(), stored.end());
  Bytes t(tr, tr + 48);
  put64(t.data() + 8, stored.size());
  put64(t.data() + 16, XXH64(stored.data(), stored.size(), 0));
  out.insert(out.end(), t.begin(), t.end());
  put64(out.data() + out.size() - 16, XXH64(out.data(), out.size() - 16, 0));
  return out;
}

// f: a whole .tzip file; edit: changes its header. Returns the new file. A
// header stored zstd-compressed (preamble flag bit 0) is decompressed for
// the edit and compressed again.
inline std::vector<uint8_t> with_header(const std::vector<uint8_t>& f,
                                        const std::function<void(nlohmann::json&)>& edit) {
  const uint8_t* tr = f.data() + f.size() - 48;
  const uint64_t ho = le64(tr), hs = le64(tr + 8);
  const bool packed = f[8] & 1;
  std::string text(f.begin() + (long)ho, f.begin() + (long)(ho + hs));
  if (packed) {
    std::string u(ZSTD_getFrameContentSize(text.data(), text.size()), '\0');
    EXPECT_EQ(ZSTD_decompress(u.data(), u.size(), text.data(), text.size()), u.size());
    text = u;
  }
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  std::string h = j.dump();
  if (packed) {
    std::string z(ZSTD_compressBound(h.size()), '\0');
    z.resize(ZSTD_compress(z.data(), z.size(), h.data(), h.size(), 3));
    h = z;
  }
  return with_stored_header(f, h, f[8]);
}

}  // namespace tz_test
