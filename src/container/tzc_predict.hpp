// Internals of checkpoint-aware coding (doc/container.md section 12): the
// writer with extra cast sources from other files of the same checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::detail {

// Another file of the same checkpoint, already written: its FP32 tensors may
// be cast sources. Predictor bytes are read from the safetensors original
// (identical to what the .tzip decodes to); the .tzip is what is recorded.
struct CastSourceFile {
  std::string st_path;
  SafetensorsInfo st;
  std::string tzip_path;
  uint64_t xxh64 = 0;  // the .tzip's whole-file checksum
};

PassStats compress_file_ex(const std::string& in, const std::string& out, const WriteOptions& opt,
                           const std::vector<CastSourceFile>& others);

// ---- discovery rules shared by compress_file and TensorWriter -------------

// Order-0 cost, in bits, of n elements of esz bytes, one histogram per byte
// plane (what the codec's per-plane coding approaches on float data).
double plane_cost(const uint8_t* p, size_t n, unsigned esz);

// Sample of a tensor of n elements: up to R runs, 16384 elements in all,
// spread over it (cast discovery).
struct SampleRuns {
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // element offset, count
  uint64_t elems = 0;
};
SampleRuns sample_runs(uint64_t n, uint64_t R = 4);

// Delta discovery sample: the first 16384 elements of the reference tensor's
// middle codec block (one block to decode from the reference).
struct DeltaWindow {
  uint64_t blk_off = 0, blk_len = 0;  // the reference block, bytes in the tensor
  uint64_t first = 0, elems = 0;      // sampled elements (first element index, count)
};
DeltaWindow delta_window(const TensorEntry& ref_tensor, unsigned esz);

// The min_gain rule of a delta: `cur` (elems elements of esz bytes, the new
// values; overwritten with cur XOR ref) pays if the residual's order-0 cost
// is below (1 - min_gain) of the values' own cost.
bool delta_pays(uint8_t* cur, const uint8_t* ref, uint64_t elems, unsigned esz, double min_gain);

// Path of `target` relative to the folder of `from_file` (both resolved with
// realpath on their folders); absolute if they share nothing but the root.
std::string relative_path(const std::string& target, const std::string& from_file);

}  // namespace tz::container::detail
