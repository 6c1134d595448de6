// Internals of checkpoint-aware coding (doc/container.md section 12): the
// writer with extra cast sources from other files of the same checkpoint.
#pragma once

#include <string>
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

// Path of `target` relative to the folder of `from_file` (both resolved with
// realpath on their folders); absolute if they share nothing but the root.
std::string relative_path(const std::string& target, const std::string& from_file);

}  // namespace tz::container::detail
