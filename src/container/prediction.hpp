// Internals of checkpoint-aware coding (doc/container.md section 12): the
// writer with extra cast sources from other files of the same checkpoint,
// and the rules its prediction discovery applies.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorzip/container.hpp"
#include "file_io.hpp"

namespace tz::container::detail {

// Another file of the same checkpoint, already written: its FP32 tensors may
// be cast sources. Predictor bytes are read from the safetensors original
// (identical to what the .tzip decodes to); the .tzip is what is recorded.
struct CastSourceFile {
  std::string st_path;
  SafetensorsInfo st;
  std::string tzip_path;
  uint64_t xxh64 = 0;         // the .tzip's whole-file checksum
  uint64_t header_xxh64 = 0;  // and its header checksum (what readers verify)
};

// compress_file, with cast sources in other files of the checkpoint
// (compress_checkpoint; writer/compress_file.cpp).
PassStats compress_safetensors(const std::string& in, const std::string& out, const WriteOptions& opt,
                               std::vector<CastSourceFile> others);

// ---- discovery rules of the writer (writer/discovery.cpp) -------------

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

// Cast discovery: which FP32 tensor a BF16/F16 target (n elements of 2
// bytes; kind tz::predict::kCastBF16 or kCastF16) is a round-to-nearest-even
// cast of. Candidates (FP32 tensors of the target's shape) are tried in the
// caller's order:
//  - probe: 64 elements from the middle of the tensor (cheap first filter);
//    a candidate whose cast matches fewer than half of them is skipped;
//  - cost: on the sample_runs(n) sample, the order-0 per-byte-plane cost of
//    the residual (value XOR cast(candidate)) must be below (1 - min_gain)
//    of the values' own cost; the cheapest candidate wins (ties: the first);
//  - stop_at_exact (PredictionRules::name_first): the search ends at the first candidate
//    that matches the whole probe and passes the cost test, so that a save
//    holding many FP32 tensors of one shape stays linear in its size.
// Returns the winner's index, or -1. The data come through callbacks (from
// files or memory), asked only for what the rule needs; element offsets and
// counts are in elements:
struct CastData {
  // count 16-bit elements of the target from element `first` into dst
  std::function<void(uint64_t first, uint64_t count, uint8_t* dst)> read_target;
  // candidate i's FP32 elements [first, first + count) (the probe; the
  // caller may cache it: every call for one target asks for the same range)
  std::function<const uint8_t*(size_t i, uint64_t first, uint64_t count)> cand_probe;
  // count FP32 elements of candidate i from element `first` into dst
  std::function<void(size_t i, uint64_t first, uint64_t count, uint8_t* dst)> read_cand;
};
struct CastScratch {  // buffers reused across targets
  std::vector<uint8_t> probe, sample, cand, resid;
};
// tz::predict::kCastBF16 / kCastF16 for a cast target's dtype, else -1.
int cast_kind(const std::string& dtype);
long find_cast_source(uint64_t n, int kind, double min_gain, size_t n_cands, const CastData& data,
                      bool stop_at_exact, CastScratch* scratch);

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

// The safetensors original of a delta reference (WriteOptions::ref_original,
// TensorWriterOptions::ref_original): the file the reference `ref` was made
// from, or its export. Opening checks that it has the header and size of what
// `ref` decodes to (kUsage otherwise); read_checked() reads predictor bytes
// from it, checked against the reference's stored block checksums (kUsage when
// they differ), so a wrong file cannot make a file that decodes wrongly.
class RefOriginal {
 public:
  RefOriginal(const std::string& path, const Reader& ref, const std::string& ref_path);
  const SafetensorsInfo& info() const { return info_; }
  const InFile& file() const { return *file_; }
  // Absolute offset in this file of the reference's tensor `t`.
  uint64_t tensor_offset(const TensorEntry& t) const { return info_.data_start + t.data_begin; }
  // Bytes [off, off + n) of the reference's tensor `index` into dst, checked.
  void read_checked(Reader& ref, size_t index, uint64_t off, uint64_t n, uint8_t* dst) const;

 private:
  std::string path_, ref_path_;
  SafetensorsInfo info_;
  std::unique_ptr<InFile> file_;
};

// Path of `target` relative to the folder of `from_file` (both resolved with
// realpath on their folders); absolute if they share nothing but the root.
std::string relative_path(const std::string& target, const std::string& from_file);

}  // namespace tz::container::detail
