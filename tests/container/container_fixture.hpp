// Helpers and the test fixture shared by the container suites
// (test_container.cpp, test_container_damage.cpp).
#pragma once
#include <gtest/gtest.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <initializer_list>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>
#include <zstd.h>

#include "container/cli_support.hpp"  // src/container: path_kind, default output names
#include "tensorzip/container.hpp"
#include "tensorzip/tzip_file.h"
#include "tz_test_files.hpp"       // tests/support
#include "tz_test_tzip_edit.hpp"  // tests/support

namespace tc = tz::container;
using namespace tz_test;

namespace container_test {

inline void write_st(const std::string& p, const std::string& header, const Bytes& data) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  write_all(p, b);
}

// Data section of a committed slice of the real checkpoint.
inline Bytes real_bytes(const char* file) {
  const Bytes b = read_all(std::string(TZ_TEST_DATA_DIR) + "/" + file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return Bytes(b.begin() + 8 + (long)n, b.end());
}

// Runs f, which must throw a tc::Error of kind `kind` whose message holds
// every one of `parts`; `what` names the case in the failure messages.
// Returns the message, or "" (and a test failure) when f throws nothing.
template <class F>
std::string expect_error(F&& f, tc::ErrorKind kind, std::initializer_list<std::string> parts,
                         const std::string& what = "") {
  try {
    f();
  } catch (const tc::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), kind) << what << ": " << m;
    for (const std::string& part : parts) EXPECT_NE(m.find(part), std::string::npos) << what << ": " << m;
    return m;
  }
  ADD_FAILURE() << what << ": no error";
  return "";
}

inline std::vector<std::string> list_dir(const std::string& d) {
  std::vector<std::string> v;
  if (DIR* p = opendir(d.c_str())) {
    while (dirent* e = readdir(p)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") v.push_back(n);
    }
    closedir(p);
  }
  std::sort(v.begin(), v.end());
  return v;
}

class Container : public DirTest {
 protected:
  std::string tag() const override { return "tz_container"; }

  // Compresses `name` (a .safetensors of the test folder) with o at each of
  // `threads` (the first makes the reference): the same .tzip bytes at every
  // count; export and verify of the reference at each of `read_threads` give
  // the original back. Returns the reference's path.
  std::string expect_same_bytes_at_thread_counts(const std::string& name, tc::WriteOptions o,
                                                 std::initializer_list<unsigned> threads,
                                                 std::initializer_list<unsigned> read_threads) {
    const Bytes orig = read_all(p(name));
    std::string ref;
    Bytes want;
    for (unsigned t : threads) {
      o.threads = t;
      const std::string out = p(name + "." + std::to_string(t) + ".tzip");
      tc::compress_file(p(name), out, o);
      if (ref.empty()) {
        ref = out;
        want = read_all(out);
      } else {
        EXPECT_EQ(read_all(out), want) << name << ": compress, " << t << " threads";
      }
    }
    for (unsigned t : read_threads) {
      tc::ReadOptions ro;
      ro.threads = t;
      ro.force = true;
      tc::Reader(ref, t).export_safetensors(p(name + ".back"), ro);
      EXPECT_EQ(read_all(p(name + ".back")), orig) << name << ": export, " << t << " threads";
      tc::Reader(ref, t).verify(p(name), ro);
    }
    return ref;
  }

  // A file with several real tensors, one of them large enough to span
  // several 1 MiB frames, non-float dtypes, a zero-size tensor, a gap and
  // trailing bytes.
  std::string make_mixed(const std::string& name) {
    const Bytes bf = real_bytes("fixture-slice-bf16.safetensors");
    const Bytes f32 = real_bytes("fixture-slice-fp32.safetensors");
    Bytes big;  // 3.25 MiB of real BF16 values
    while (big.size() < (13u << 18)) big.insert(big.end(), bf.begin(), bf.end());
    big.resize(13u << 18);
    Bytes data;
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"},";
    auto add = [&](const std::string& n, const std::string& dt, const std::string& shape, const Bytes& src, size_t len) {
      const size_t b = data.size();
      data.insert(data.end(), src.begin(), src.begin() + (long)len);
      h += "\"" + n + "\":{\"dtype\":\"" + dt + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) +
           "," + std::to_string(data.size()) + "]},";
    };
    add("big", "BF16", "[1664,1024]", big, big.size());
    add("master", "F32", "[256,256]", f32, 262144);
    data.insert(data.end(), {1, 2, 3, 4, 5, 6, 7});  // a gap
    add("ids", "I64", "[1000]", f32, 8000);
    add("mask", "BOOL", "[3]", bf, 3);
    add("empty", "F16", "[0,4]", bf, 0);
    add("half", "F16", "[4096]", bf, 8192);
    add("fp8", "F8_E4M3", "[5000]", bf, 5000);
    add("f64", "F64", "[100]", f32, 800);
    h.back() = '}';
    h += "    ";  // trailing padding, as writers align the header
    data.insert(data.end(), {9, 9, 9});  // trailing bytes
    write_st(p(name), h, data);
    return p(name);
  }
};

inline tc::WriteOptions small_chunks() {
  tc::WriteOptions o;
  o.chunk_bytes = 1u << 20;
  o.threads = 3;
  return o;
}

}  // namespace container_test

using namespace container_test;
