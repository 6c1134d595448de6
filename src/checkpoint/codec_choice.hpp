// Which codec a checkpoint save uses (raw, fast or strong), from the time
// model of one save of S raw bytes (the cost model of `tzip plan`,
// programs/plan.hpp, reports the same figures):
//   raw:         t = S / B                         (B: storage bandwidth)
//   compressed:  t = max(S / E, S / (r x B))       (E: encode throughput of raw
//                bytes, r: ratio; encode of chunk k+1 overlaps the write of
//                chunk k, so the slower stage sets the pace)
// A codec is chosen only when its t is strictly below the raw t, so
// compression never makes a save slower than writing the raw bytes.
// Sizes in bytes, bandwidths in GiB/s (2^30 bytes).
#pragma once

#include <string>

namespace tz::checkpoint {

// Codec choice for one save.
enum class CodecKind { kRaw = 0, kFast = 1, kStrong = 2 };
const char* codec_kind_name(CodecKind k);  // "raw", "fast", "strong"
int codec_kind_level(CodecKind k);         // tz_params.level: -1 (store), 1, 2

struct CodecChoice {
  CodecKind kind = CodecKind::kRaw;
  double t_raw_s = 0, t_fast_s = 0, t_strong_s = 0;
  std::string model;  // the time model with the numbers plugged in, one line
};

// Seconds to move `bytes` raw bytes through a codec of `codec_bps` raw bytes/s and
// storage of `storage_bps` bytes/s when coding and I/O overlap (the slower stage
// sets the pace); infinite when a figure is zero or negative.
double pipelined_seconds(double bytes, double storage_bps, double codec_bps, double ratio);

// Picks raw / fast / strong for `bytes` raw bytes given the storage bandwidth
// and each setting's aggregate encode throughput and ratio. Zero or negative
// speeds/ratios make that setting unavailable. `forced` (optional) overrides
// the choice but the model still reports every time.
CodecChoice choose_codec(double bytes, double storage_gibps, double fast_gibps, double fast_ratio,
                         double strong_gibps, double strong_ratio, const CodecKind* forced = nullptr);

}  // namespace tz::checkpoint
