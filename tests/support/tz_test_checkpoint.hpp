// Checkpoint-suite helpers (tests/checkpoint) on top of tz_test_files.hpp.
#pragma once

#include <vector>

#include "tensorzip/checkpoint.hpp"
#include "tz_test_files.hpp"

namespace tz_test {

// Views of in-memory tensors, for tz::checkpoint::save.
inline std::vector<tz::checkpoint::TensorView> views(const std::vector<Owned>& v) {
  std::vector<tz::checkpoint::TensorView> out;
  for (const auto& o : v) out.push_back({o.name, o.dtype, o.shape, o.bytes.data(), o.bytes.size()});
  return out;
}

}  // namespace tz_test
