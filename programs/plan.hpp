// tzip plan: the checkpoint cost model (doc/checkpoint.md, "Cost model").
//
// Units: sizes in bytes, printed in GiB (2^30 bytes); bandwidths in GiB/s.
// The seed's worked example ("782 GB ... 5 GB/s ... 156 s") is only
// consistent in binary units (70e9 x 12 bytes = 782 GiB; 782 / 5 = 156 s),
// so every figure here is binary. A month is 730 hours (8760 / 12).
//
// Time model of one save: src/checkpoint/codec_choice.hpp (choose_codec, also
// used by the save pipeline to choose its codec).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/codec_choice.hpp"

namespace tz::checkpoint {

// One codec setting's figures: throughput of raw bytes per writer (per GPU
// rank; the plan multiplies by the number of GPUs) and ratio per part.
struct CodecSpeed {
  double compress_gibps = 0;
  double decompress_gibps = 0;
};

// A part of the checkpoint (e.g. "weights BF16"): raw bytes and the ratio
// of each codec setting on it.
struct PlanPart {
  std::string label;
  std::string dtype;  // safetensors dtype string
  uint64_t bytes = 0;
  double ratio_fast = 1.0;    // level 1
  double ratio_strong = 1.0;  // level 2
};

struct PlanInput {
  std::vector<PlanPart> parts;
  unsigned gpus = 64;
  double usd_per_gpu_hour = 2.0;
  double interval_min = 30;
  double storage_gibps = 5;      // aggregate write (and read) bandwidth of the storage
  double usd_per_tib_month = 20;
  unsigned retained = 3;         // checkpoints kept on storage at any time
  double snapshot_gibps = 20;    // per GPU: device -> host copy of an async save
  CodecSpeed fast, strong;       // per GPU rank
  bool have_forced = false;
  CodecKind forced = CodecKind::kRaw;
  std::vector<std::string> sources;  // where the figures came from (printed)
};

struct PlanResult {
  uint64_t raw_bytes = 0;
  double comp_bytes = 0;  // with the chosen codec
  double ratio = 1;
  CodecChoice choice;
  double sync_stall_raw_s = 0, sync_stall_comp_s = 0;
  double async_stall_raw_s = 0, async_stall_comp_s = 0;
  double restore_raw_s = 0, restore_comp_s = 0;
  double checkpoints_per_month = 0;
  double gpu_hours_saved_sync = 0, usd_saved_sync = 0;
  double gpu_hours_saved_async = 0, usd_saved_async = 0;
  double storage_saved_tib = 0, usd_storage_saved = 0;
};

// Parts of a model of `params` parameters: BF16 weights (2 B), optional FP32
// master weights (4 B), Adam m and v in FP32 (4 B each), optional gradients
// (grad_bytes_per_param: 0 none, 2 BF16, 4 FP32). With the defaults
// (no master, BF16 gradients) a 70e9 model gives the seed's 782 GiB.
std::vector<PlanPart> model_parts(double params, bool master, unsigned grad_bytes_per_param);

// Default codec figures (documented in plan.cpp with their source).
void apply_default_codec_figures(PlanInput& in);

PlanResult plan(const PlanInput& in);

// Human-readable report and JSON (one object).
std::string plan_report(const PlanInput& in, const PlanResult& r);
std::string plan_json(const PlanInput& in, const PlanResult& r);

// Sizes by dtype of a checkpoint file (.safetensors or .tzip) or of every such
// file in a folder (recursive). For .tzip files the ratio of each part is
// the file's own (compressed bytes per raw bytes); for safetensors it stays
// 1 unless measure_codec() is run. Throws std::runtime_error.
std::vector<PlanPart> parts_from_checkpoint(const std::string& path, bool* had_tzip = nullptr);

// Compresses up to max_bytes of each part's tensors (read from `path`) at
// level 1 and 2 with `threads` threads through the C API; sets the parts'
// ratios and the per-rank speeds in `in` (speed of this machine with that
// many threads). Appends a line to in.sources.
void measure_codec(const std::string& path, PlanInput& in, unsigned threads, uint64_t max_bytes);

}  // namespace tz::checkpoint
