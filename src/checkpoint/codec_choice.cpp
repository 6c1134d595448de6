// Codec choice of a checkpoint save (codec_choice.hpp).
#include "checkpoint/codec_choice.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tz::checkpoint {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
}  // namespace

double pipelined_seconds(double bytes, double storage_bps, double codec_bps, double ratio) {
  if (codec_bps <= 0 || ratio <= 0 || storage_bps <= 0) return INFINITY;
  return std::max(bytes / codec_bps, bytes / (ratio * storage_bps));
}

const char* codec_kind_name(CodecKind k) {
  switch (k) {
    case CodecKind::kFast: return "fast";
    case CodecKind::kStrong: return "strong";
    default: return "raw";
  }
}

int codec_kind_level(CodecKind k) {
  switch (k) {
    case CodecKind::kFast: return 1;
    case CodecKind::kStrong: return 2;
    default: return -1;
  }
}

CodecChoice choose_codec(double bytes, double storage_gibps, double fast_gibps, double fast_ratio,
                         double strong_gibps, double strong_ratio, const CodecKind* forced) {
  CodecChoice c;
  const double B = storage_gibps * kGiB;
  c.t_raw_s = B > 0 ? bytes / B : INFINITY;
  c.t_fast_s = pipelined_seconds(bytes, B, fast_gibps * kGiB, fast_ratio);
  c.t_strong_s = pipelined_seconds(bytes, B, strong_gibps * kGiB, strong_ratio);
  c.kind = CodecKind::kRaw;
  double best = c.t_raw_s;
  // Strictly faster than raw, and strong only when strictly faster than fast.
  if (c.t_fast_s < best) best = c.t_fast_s, c.kind = CodecKind::kFast;
  if (c.t_strong_s < best) best = c.t_strong_s, c.kind = CodecKind::kStrong;
  const char* why = "fastest";
  if (forced) c.kind = *forced, why = "forced by --codec";
  const double gib = bytes / kGiB;
  c.model = "S=" + fmt("%.3f", gib) + " GiB, B=" + fmt("%.3f", storage_gibps) + " GiB/s: raw S/B=" +
            fmt("%.3f", c.t_raw_s) + " s; fast max(S/E1, S/(r1*B)) = max(" + fmt("%.3f", gib / fast_gibps) +
            ", " + fmt("%.3f", gib / (fast_ratio * storage_gibps)) + ") = " + fmt("%.3f", c.t_fast_s) +
            " s (E1=" + fmt("%.3f", fast_gibps) + " GiB/s, r1=" + fmt("%.4f", fast_ratio) +
            "); strong max(S/E2, S/(r2*B)) = " + fmt("%.3f", c.t_strong_s) + " s (E2=" +
            fmt("%.3f", strong_gibps) + " GiB/s, r2=" + fmt("%.4f", strong_ratio) + ") -> " +
            codec_kind_name(c.kind) + " (" + why + ")";
  return c;
}

}  // namespace tz::checkpoint
