#include "tz_test_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>

#ifndef TZ_TEST_DATA_DIR
#error "TZ_TEST_DATA_DIR must point at tests/data"
#endif

namespace tzt {

namespace {

uint64_t elem_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "BF16" || dt == "F16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "F8_E4M3" || dt == "F8_E5M2" || dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
  throw std::runtime_error("unknown safetensors dtype " + dt);
}

uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// Rounds a >= 0 (finite) to the nearest value with M mantissa bits and
// minimum normal exponent emin (ties to even), and encodes it as
// exponent-field << M | mantissa. Returns -1 if the rounded value exceeds
// max_finite. Exact: a is a float, scaling by powers of two is exact in
// double, and nearbyint uses the default ties-to-even mode.
int64_t encode_small_float(double a, int E, int M, double max_finite) {
  const int bias = (1 << (E - 1)) - 1;
  const int emin = 1 - bias;
  if (a == 0) return 0;
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  const double q = std::ldexp(1.0, e - M);
  const double v = std::nearbyint(a / q) * q;
  if (v > max_finite) return -1;
  if (v == 0) return 0;
  const int ev = std::ilogb(v);
  if (ev < emin) return (int64_t)(v / std::ldexp(1.0, emin - M));  // subnormal, exponent field 0
  const int64_t mant = (int64_t)(v / std::ldexp(1.0, ev - M)) - (INT64_C(1) << M);
  return ((int64_t)(ev + bias) << M) | mant;
}

}  // namespace

std::vector<Tensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  Bytes all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (all.size() < 8) throw std::runtime_error(path + ": too short");
  uint64_t n;
  memcpy(&n, all.data(), 8);
  if (n > all.size() - 8) throw std::runtime_error(path + ": header length past the end");
  const auto hdr = nlohmann::json::parse(all.begin() + 8, all.begin() + 8 + (ptrdiff_t)n);
  const uint64_t data_size = all.size() - 8 - n;
  const uint8_t* data = all.data() + 8 + n;
  std::vector<Tensor> out;
  for (const auto& [name, e] : hdr.items()) {
    if (name == "__metadata__") continue;
    Tensor t;
    t.name = name;
    t.dtype = e.at("dtype").get<std::string>();
    t.shape = e.at("shape").get<std::vector<uint64_t>>();
    const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[0] > off[1] || off[1] > data_size)
      throw std::runtime_error(path + ": bad data_offsets for " + name);
    uint64_t count = 1;
    for (uint64_t d : t.shape) count *= d;
    if (count * elem_size(t.dtype) != off[1] - off[0])
      throw std::runtime_error(path + ": size of " + name + " does not match its shape");
    t.data.assign(data + off[0], data + off[1]);
    out.push_back(std::move(t));
  }
  // nlohmann sorts keys; put tensors back in file order.
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto off = hdr.at(out[i].name).at("data_offsets").get<std::vector<uint64_t>>();
    order.push_back({off[0], i});
  }
  std::sort(order.begin(), order.end());
  std::vector<Tensor> sorted;
  for (const auto& o : order) sorted.push_back(std::move(out[o.second]));
  return sorted;
}

const std::vector<Tensor>& bf16_slice() {
  static const std::vector<Tensor> t = read_safetensors(TZ_TEST_DATA_DIR "/fixture-slice-bf16.safetensors");
  return t;
}

const std::vector<Tensor>& fp32_slice() {
  static const std::vector<Tensor> t = read_safetensors(TZ_TEST_DATA_DIR "/fixture-slice-fp32.safetensors");
  return t;
}

const Tensor& find_tensor(const std::vector<Tensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

Bytes concat(const std::vector<Tensor>& ts) {
  Bytes out;
  for (const auto& t : ts) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

Bytes tile(const Bytes& src, size_t n) {
  if (src.empty()) throw std::runtime_error("tile of empty data");
  Bytes out(n);
  for (size_t off = 0; off < n; off += src.size()) memcpy(out.data() + off, src.data(), std::min(src.size(), n - off));
  return out;
}

std::vector<float> as_floats_f32(const Bytes& b) {
  std::vector<float> v(b.size() / 4);
  memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::vector<float> as_floats_bf16(const Bytes& b) {
  std::vector<float> v(b.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
  return v;
}

template <class F>
static Bytes cast16(const std::vector<float>& v, F f) {
  Bytes out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f(v[i]);
    out[2 * i] = (uint8_t)h;
    out[2 * i + 1] = (uint8_t)(h >> 8);
  }
  return out;
}

Bytes to_f16(const std::vector<float>& v) { return cast16(v, f32_to_f16); }
Bytes to_bf16(const std::vector<float>& v) { return cast16(v, f32_to_bf16); }

Bytes to_f8_e4m3(const std::vector<float>& v) {
  Bytes out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_e4m3(v[i]);
  return out;
}

Bytes to_f8_e5m2(const std::vector<float>& v) {
  Bytes out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_e5m2(v[i]);
  return out;
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if (std::isnan(f)) return (uint16_t)((u >> 16) | 0x40u);  // keep sign and top payload, set quiet bit
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (std::isnan(f)) return (uint16_t)(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
  if (std::isinf(f)) return (uint16_t)(sign | 0x7C00u);
  const int64_t c = encode_small_float(std::fabs((double)f), 5, 10, 65504.0);
  return (uint16_t)(sign | (c < 0 ? 0x7C00u : (uint16_t)c));
}

uint8_t f32_to_e5m2(float f) {
  const uint8_t sign = (uint8_t)((f32_bits(f) >> 24) & 0x80u);
  if (std::isnan(f)) return (uint8_t)(sign | 0x7Eu);
  if (std::isinf(f)) return (uint8_t)(sign | 0x7Cu);
  const int64_t c = encode_small_float(std::fabs((double)f), 5, 2, 57344.0);
  return (uint8_t)(sign | (c < 0 ? 0x7Cu : (uint8_t)c));
}

uint8_t f32_to_e4m3(float f) {
  const uint8_t sign = (uint8_t)((f32_bits(f) >> 24) & 0x80u);
  if (std::isnan(f) || std::isinf(f)) return (uint8_t)(sign | 0x7Fu);
  const int64_t c = encode_small_float(std::fabs((double)f), 4, 3, 448.0);
  return (uint8_t)(sign | (c < 0 ? 0x7Fu : (uint8_t)c));
}

double f16_to_double(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000u) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (e == 0) return s * std::ldexp((double)m, -24);
  return s * std::ldexp((double)(1024 + m), e - 25);
}

double e5m2_to_double(uint8_t b) {
  const int e = (b >> 2) & 31, m = b & 3;
  const double s = (b & 0x80u) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (e == 0) return s * std::ldexp((double)m, -16);
  return s * std::ldexp((double)(4 + m), e - 17);
}

double e4m3_to_double(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double s = (b & 0x80u) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return s * std::ldexp((double)m, -9);
  return s * std::ldexp((double)(8 + m), e - 10);
}

uint64_t splitmix64(uint64_t x) {
  x += UINT64_C(0x9E3779B97F4A7C15);
  x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
  return x ^ (x >> 31);
}

Bytes hash_stream(size_t n, uint64_t seed) {
  Bytes out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = splitmix64(seed * UINT64_C(0x100000001B3) + i / 8);
    for (size_t k = 0; k < 8 && i + k < n; ++k) out[i + k] = (uint8_t)(v >> (8 * k));
  }
  return out;
}

Bytes concentrated_bytes(size_t elem_size, size_t n_elems, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n_elems * elem_size);
  for (size_t i = 0; i < n_elems; ++i) {
    const uint32_t r = rng() % 200;
    const uint8_t v = r == 0 ? 0x3A : r == 1 ? 0x41 : 0x3C;
    for (size_t j = 0; j < elem_size; ++j) b[i * elem_size + j] = j + 1 == elem_size ? v : (uint8_t)(j == 0 ? 0x10 : 0);
  }
  return b;
}

Bytes f32_with_fp16_blocks(uint32_t block_elems, uint32_t n_blocks, uint32_t fp16_b0, uint32_t fp16_b1) {
  const Bytes& real = find_tensor(fp32_slice(), "master.blocks.2.proj.weight").data;
  const size_t n = (size_t)block_elems * n_blocks;
  Bytes b(n * 4);
  for (size_t i = 0; i < n * 4; i += real.size()) std::memcpy(b.data() + i, real.data(), std::min(real.size(), n * 4 - i));
  for (size_t i = (size_t)fp16_b0 * block_elems; i < (size_t)fp16_b1 * block_elems && i < n; ++i) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    const double h = f16_to_double(f32_to_f16(f));
    f = (float)h;
    std::memcpy(b.data() + 4 * i, &f, 4);
  }
  return b;
}

Bytes f32_with_zero_rows(size_t n, size_t row_elems, uint32_t every, bool neg_zero) {
  Bytes b = tile(find_tensor(fp32_slice(), "master.blocks.2.proj.weight").data, n * 4);
  const uint32_t zero = neg_zero ? 0x80000000u : 0u;
  for (size_t r = 0; r * row_elems < n; ++r)
    if ((r * 37) % every == 0)
      for (size_t i = r * row_elems; i < std::min(n, (r + 1) * row_elems); ++i) std::memcpy(b.data() + 4 * i, &zero, 4);
  return b;
}

Bytes bf16_pruned_2of4(size_t n) {
  const std::vector<Tensor>& ts = bf16_slice();
  Bytes b = tile(ts[0].data, n * 2);
  for (size_t g = 0; g + 4 <= n; g += 4) {
    uint16_t v[4], mag[4];
    std::memcpy(v, b.data() + 2 * g, 8);
    for (int j = 0; j < 4; ++j) mag[j] = v[j] & 0x7FFF;
    int order[4] = {0, 1, 2, 3};
    std::sort(order, order + 4, [&](int x, int y) { return mag[x] < mag[y] || (mag[x] == mag[y] && x < y); });
    v[order[0]] = 0;
    v[order[1]] = 0;
    std::memcpy(b.data() + 2 * g, v, 8);
  }
  return b;
}

}  // namespace tzt
