// Set-up helpers shared by the container and checkpoint GoogleTest suites
// (tests/container, tests/checkpoint): whole-file read/write, temporary
// folders, and the tensors of a safetensors file held in memory.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz_test {

using Bytes = std::vector<uint8_t>;

inline Bytes read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline void write_all(const std::string& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
}

inline std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A new empty folder base/<tag>_XXXXXX; "" if it cannot be made.
inline std::string make_temp_dir(const std::string& base = "/tmp", const std::string& tag = "tz_test") {
  std::string t = base + "/" + tag + "_XXXXXX";
  std::vector<char> b(t.begin(), t.end());
  b.push_back(0);
  return ::mkdtemp(b.data()) ? std::string(b.data()) : std::string();
}

// A temporary folder removed with everything in it at the end of the scope.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& base = "/tmp", const std::string& tag = "tz_test")
      : path(make_temp_dir(base, tag)) {
    EXPECT_FALSE(path.empty()) << "cannot make a temporary folder in " << base;
  }
  ~TempDir() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  size_t entries() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(path)) (void)e, ++n;
    return n;
  }
};

// A fixture with a temporary folder per test: dir, and p(name) inside it.
class DirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = make_temp_dir("/tmp", tag());
    ASSERT_FALSE(dir.empty());
  }
  void TearDown() override {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  virtual std::string tag() const { return "tz_test"; }
  std::string p(const std::string& n) const { return dir + "/" + n; }
  std::string dir;
};

// A tensor held in memory.
struct Owned {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

// Every tensor of a safetensors file (names prefixed with `prefix`), read
// with the container's header parser.
inline std::vector<Owned> load_safetensors(const std::string& path, const std::string& prefix = "") {
  const auto st = tz::container::read_safetensors_info(path);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  std::vector<Owned> out;
  for (const auto& t : st.tensors) {
    Owned o{prefix + t.name, t.dtype, t.shape, std::vector<uint8_t>(t.raw_size())};
    EXPECT_EQ(::pread(fd, o.bytes.data(), o.bytes.size(), (off_t)(st.data_start + t.data_begin)),
              (ssize_t)o.bytes.size());
    out.push_back(std::move(o));
  }
  ::close(fd);
  return out;
}

// The tensors of a, then those of b.
inline std::vector<Owned> load_pair(const std::string& a, const std::string& b) {
  auto x = load_safetensors(a);
  auto y = load_safetensors(b);
  x.insert(x.end(), std::make_move_iterator(y.begin()), std::make_move_iterator(y.end()));
  return x;
}

}  // namespace tz_test
