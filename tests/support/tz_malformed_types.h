// The record of one malformed frame and the check that must reject it:
// shared by the malformed-frame table (tz_malformed_frames.h) and the
// header that adds its seeded-lane rows (tz_malformed_seeded.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "codec/frame_prefix.h"
#include "tz_test_data.h"

namespace tzt {

// Which check must reject the frame (pinned by the CPU tests).
enum class Stage {
  kValid,        // no error on the CPU
  kPrefix,       // parse_frame_prefix / check_frame_extent: `defect`
  kDestination,  // the destination is too small
  kBlockHeader,  // parse_block rejects block `block`
  kBlockDecode,  // parse_block accepts block `block`; its rANS decoding fails
  kBlockCrc,     // block `block` decodes but its checksum differs
};

struct MalformedFrame {
  std::string rule;
  Bytes frame;
  size_t dst_capacity;  // the raw size, unless the rule is about it
  int code;             // tz_error_code expected from every backend (0 = TZ_OK)
  int gpu_code;         // what the CUDA decoder returns (differs only for zstd frames)
  Stage stage;
  tz::FrameDefect defect = tz::kDefectNone;  // for Stage::kPrefix
  unsigned block = 0;                        // for the block stages
};

}  // namespace tzt
