// Helpers shared by the TensorWriter suites (test_tensor_writer.cpp,
// test_tensor_writer_prediction.cpp): a mixed set of tensors, and the check
// that a file holds exactly the given tensors (Reader, verify, export, and
// the tzip CLI when the build has it).
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"
#include "tz_test_files.hpp"  // tests/support

namespace fs = std::filesystem;
namespace tc = tz::container;
using namespace tz_test;

namespace tensor_writer_test {

inline std::vector<Owned> mixed_tensors() {
  auto v = load_safetensors(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-bf16.safetensors");
  auto f = load_safetensors(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors", "opt.");
  v.insert(v.end(), f.begin(), f.end());
  std::mt19937 rng(7);
  Owned big{"big.f32", "F32", {3 << 18}, std::vector<uint8_t>(3u << 20)};  // 3 MiB: several chunks
  for (size_t i = 0; i < big.bytes.size(); i += 4) {
    const float x = std::normal_distribution<float>(0, 0.02f)(rng);
    std::memcpy(&big.bytes[i], &x, 4);
  }
  v.push_back(big);
  v.push_back({"ids", "I64", {5}, std::vector<uint8_t>(40, 3)});
  v.push_back({"empty", "BF16", {0, 4}, {}});
  v.push_back({"flag", "BOOL", {3}, {1, 0, 1}});
  return v;
}

// Checks the file three ways: Reader tensor by tensor, verify (what `tzip
// verify` runs), and export to a safetensors file that holds exactly them.
inline void expect_file_holds(const std::string& file, const std::vector<Owned>& ref,
                       const std::map<std::string, std::string>& meta = {}) {
  tc::Reader r(file, 2);
  ASSERT_EQ(r.tensors().size(), ref.size());
  for (const auto& o : ref) EXPECT_TRUE(r.read_tensor(o.name) == o.bytes) << o.name;
  tc::ReadOptions ro;
  ro.threads = 2;
  r.verify("", ro);
  const std::string st = file + ".safetensors";
  r.export_safetensors(st, ro);
  const auto back = load_safetensors(st);
  ASSERT_EQ(back.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(back[i].name, ref[i].name);
    EXPECT_EQ(back[i].dtype, ref[i].dtype);
    EXPECT_EQ(back[i].shape, ref[i].shape);
    EXPECT_TRUE(back[i].bytes == ref[i].bytes) << ref[i].name;
  }
  EXPECT_EQ(tc::read_safetensors_info(st).metadata, meta);
  fs::remove(st);
#ifdef TZ_TZIP_BIN
  // The tzip CLI too: verify, and export to a safetensors file that is
  // byte-identical to the library's export.
  const std::string cmd = std::string(TZ_TZIP_BIN) + " verify '" + file + "' > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string st2 = file + ".cli.safetensors";
  const std::string dc = std::string(TZ_TZIP_BIN) + " decompress '" + file + "' -o '" + st2 + "' > /dev/null";
  EXPECT_EQ(std::system(dc.c_str()), 0) << dc;
  const auto back2 = load_safetensors(st2);
  ASSERT_EQ(back2.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(back2[i].bytes == ref[i].bytes) << ref[i].name;
  fs::remove(st2);
#endif
}

}  // namespace tensor_writer_test
