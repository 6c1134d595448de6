// Helpers and the test fixture shared by the checkpoint-aware coding suites
// (test_predict.cpp, test_predict_checkpoints.cpp, test_predict_all_or_none.cpp):
// safetensors files of named tensors, FP32 values and their casts, an
// independent BF16 rounding reference, and the Predict fixture (a fresh
// folder per test, export round trips).
#pragma once
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>
#include <zstd.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "codec/predict.h"
#include "tensorzip/container.hpp"
#include "tz_test_files.hpp"       // tests/support
#include "tz_test_tzip_edit.hpp"  // tests/support

namespace tc = tz::container;
namespace tp = tz::predict;
using namespace tz_test;

namespace predict_test {

inline bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

struct T {
  std::string name, dtype, shape;
  Bytes data;
};
inline void write_st(const std::string& path, const std::vector<T>& ts) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  Bytes data;
  for (const auto& t : ts) {
    const size_t b = data.size();
    data.insert(data.end(), t.data.begin(), t.data.end());
    h += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + t.shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(data.size()) + "]}";
  }
  h += "}";
  while ((8 + h.size()) % 8) h += ' ';
  Bytes out(8);
  for (int i = 0; i < 8; ++i) out[i] = (uint8_t)((uint64_t)h.size() >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  write_all(path, out);
}

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n FP32 values ~ N(0, scale) as bytes.
inline Bytes normal_f32(size_t n, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  Bytes b(n * 4);
  for (size_t i = 0; i < n; ++i) {
    const float v = d(g);
    std::memcpy(&b[4 * i], &v, 4);
  }
  return b;
}
inline Bytes cast_of(const Bytes& f32, int kind) {
  Bytes b(f32.size() / 2);
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    uint32_t u;
    std::memcpy(&u, &f32[4 * i], 4);
    const uint16_t v = tp::cast_f32(u, kind);
    std::memcpy(&b[2 * i], &v, 2);
  }
  return b;
}

// Independent reference for BF16 RNE: the two neighbours in double precision.
inline uint16_t bf16_reference(uint32_t x) {
  const float f = u2f(x);
  if (std::isnan(f)) return 0x7FC0;
  if (std::isinf(f)) return (uint16_t)(x >> 16);
  const uint16_t lo = (uint16_t)(x >> 16);  // truncation toward zero
  const uint16_t hi = (uint16_t)(lo + 1);   // next magnitude (may be inf)
  const double dl = std::fabs((double)f - (double)u2f((uint32_t)lo << 16));
  // Past the largest finite BF16 the next "value" is 2^128 (IEEE overflow rule).
  const double vh = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(f < 0 ? -1.0 : 1.0, 128) : (double)u2f((uint32_t)hi << 16);
  const double dh = std::fabs(vh - (double)f);
  if ((x & 0xFFFF) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

class Predict : public DirTest {
 protected:
  std::string tag() const override { return "tz_predict"; }
  void roundtrip(const std::string& tz, const std::string& orig, const tc::ReadOptions& ro = {}) {
    tc::Reader r(tz);
    tc::ReadOptions o = ro;
    o.force = true;
    r.export_safetensors(p("rt.safetensors"), o);
    EXPECT_EQ(read_all(p("rt.safetensors")), read_all(orig)) << tz;
  }
};

inline const tc::TensorEntry& entry(const tc::Reader& r, const std::string& name) {
  const long i = r.find(name);
  EXPECT_GE(i, 0) << name;
  return r.tensors()[(size_t)i];
}

inline uint16_t preamble_major(const std::string& path) {
  const Bytes b = read_all(path);
  return (uint16_t)(b[4] | (b[5] << 8));
}

}  // namespace predict_test
