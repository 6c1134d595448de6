// Test data for the codec suite: a minimal safetensors reader for the real
// checkpoint slices in tests/data, float casts with round-to-nearest-even
// (to derive FP16 and FP8 tensors from real FP32/BF16 values), and a
// counter-mode hash stream for incompressible bytes. No GoogleTest here, so
// the fuzz corpus generator can use it too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tzt {

using Bytes = std::vector<uint8_t>;

struct Tensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "BF16", "F32", ...
  std::vector<uint64_t> shape;
  Bytes data;
};

// Reads every tensor of a safetensors file, in data-offset order. Throws
// std::runtime_error on a malformed file.
std::vector<Tensor> read_safetensors(const std::string& path);

// tests/data/<file>, cached after the first call.
const std::vector<Tensor>& bf16_slice();  // fixture-slice-bf16.safetensors
const std::vector<Tensor>& fp32_slice();  // fixture-slice-fp32.safetensors
const Tensor& find_tensor(const std::vector<Tensor>& ts, const std::string& name);

// All tensors of a slice back to back.
Bytes concat(const std::vector<Tensor>& ts);
// The first n bytes of `src` repeated as often as needed.
Bytes tile(const Bytes& src, size_t n);
// n_elems nearly constant little-endian elements of elem_size bytes (a few
// distinct values, about 1 % of them changing; deterministic in seed):
// streams cheap enough to be coded in blocks of a little over 128 elements.
Bytes concentrated_bytes(size_t elem_size, size_t n_elems, uint32_t seed);

// Real FP32 values (the fixture slice's master proj.weight, repeated) of
// n_blocks x block_elems elements, with blocks [fp16_b0, fp16_b1) rounded to
// FP16 precision (their 13 low mantissa bits zero): an embedding's rows that
// training never touched, kept at the precision they were made in. Its
// streams 2 and 3 pay in those blocks alone (policy_raw_runs).
Bytes f32_with_fp16_blocks(uint32_t block_elems, uint32_t n_blocks, uint32_t fp16_b0, uint32_t fp16_b1);
// n real FP32 values (the fixture's master weights, tiled) in rows of
// row_elems, of which the rows r with (r * 37) % every == 0 are exactly 0:
// an optimizer moment's rows that training never touched (zero elision,
// doc/format.md 5.10). neg_zero: those rows hold -0.0 instead.
Bytes f32_with_zero_rows(size_t n, size_t row_elems, uint32_t every, bool neg_zero = false);
// n real BF16 weights (the fixture's, tiled) pruned 2:4: in every group of
// four, the two of smallest magnitude set to +0.0.
Bytes bf16_pruned_2of4(size_t n);

// Real values as other dtypes (little-endian element bytes).
std::vector<float> as_floats_f32(const Bytes& f32_bytes);
std::vector<float> as_floats_bf16(const Bytes& bf16_bytes);
Bytes to_f16(const std::vector<float>& v);
Bytes to_bf16(const std::vector<float>& v);
Bytes to_f8_e4m3(const std::vector<float>& v);
Bytes to_f8_e5m2(const std::vector<float>& v);

// Round-to-nearest-even casts of one value. NaN stays NaN (sign kept,
// quiet); overflow gives inf, except E4M3 (the "fn" variant: no inf, one
// NaN code per sign, max 448) where it gives NaN, as torch's cast does.
uint16_t f32_to_bf16(float f);
uint16_t f32_to_f16(float f);
uint8_t f32_to_e4m3(float f);
uint8_t f32_to_e5m2(float f);
// Exact value of a code (NaN for NaN codes).
double f16_to_double(uint16_t h);
double e4m3_to_double(uint8_t b);
double e5m2_to_double(uint8_t b);
float bf16_to_f32(uint16_t h);

// Counter-mode hash (splitmix64 of seed + i): statistically random bytes.
Bytes hash_stream(size_t n, uint64_t seed);
uint64_t splitmix64(uint64_t x);

}  // namespace tzt
