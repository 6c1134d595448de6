// The checkpoint manifest (doc/checkpoint.md, "Layout and atomicity"):
// writing it, reading it within fixed bounds, and validating it as strictly
// as the container validates a .tzip header. Every number restore uses for
// memory is checked here: sizes from dtype x shape with checked arithmetic,
// frames tiling each tensor in chunk_bytes pieces inside the rank file's
// recorded size, cast sources of the right dtype, shape and rank, delta
// references in range. restore.cpp then checks the rank file itself (its
// size by fstat, its index through the container Reader) against it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_internal.hpp"

namespace tz::checkpoint::detail {

// Bounds (a manifest past them is refused before it is parsed).
inline constexpr uint64_t kMaxManifestBytes = 256ull << 20;  // manifest.json and rank-NNNNN.json
inline constexpr int kMaxWorldSize = 1 << 20;

struct ManifestFrame {
  uint64_t offset = 0;    // in the rank file
  uint64_t size = 0;      // stored bytes (0: all-zero residual of a predicted tensor)
  uint64_t raw_size = 0;  // bytes of the tensor it holds: min(chunk_bytes, what is left)
  uint64_t raw_off = 0;   // where they start in the tensor
  uint64_t xxh64 = 0;     // of the stored bytes
};

struct ManifestTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  uint64_t size = 0;  // = dtype x shape
  std::string codec_dtype;  // informative; "" when absent
  int level = 0;
  bool has_level = false;
  std::vector<ManifestFrame> frames;
  tz::container::PredictKind predict = tz::container::PredictKind::kNone;
  std::string cast_source;  // kCast: an FP32 tensor of the same shape in the same rank file
  int delta_ref = -1;       // kDelta: index into the rank's references
};

struct ManifestReference {
  std::string file;  // "../<depends_on>/rank-NNNNN.tzip", relative to the rank file's folder
  uint64_t xxh64 = 0;
  // The reference's header checksum (its trailer's header_xxh64), which the
  // container Reader checks against the header bytes it verified; absent in
  // manifests of earlier writers (then the whole-file checksum identifies it).
  bool has_header_xxh64 = false;
  uint64_t header_xxh64 = 0;
};

struct ManifestRank {
  int rank = 0;
  std::string file;  // rank_file(rank)
  uint64_t file_size = 0, file_xxh64 = 0, chunk_bytes = 0;
  std::map<std::string, std::string> metadata;
  std::vector<ManifestReference> references;  // delta references (previous checkpoint's rank file)
  std::string depends_on;                     // rank indexes of delta saves; "" otherwise
  std::vector<ManifestTensor> tensors;
};

struct Manifest {
  int version = 1;
  int world_size = 1;
  std::map<std::string, std::string> metadata;
  std::string depends_on;  // previous checkpoint folder (a sibling) the delta tensors need
  std::vector<ManifestRank> ranks;
};

// ---- writing ---------------------------------------------------------------
struct RankFileFacts {
  int rank = 0;
  uint64_t file_size = 0, file_xxh64 = 0, chunk_bytes = 0;
  std::string codec, time_model, depends_on;
  std::map<std::string, std::string> metadata;
  std::vector<tz::container::Reference> references;
  std::vector<tz::container::TensorEntry> tensors;  // as stored (TensorWriter::tensors())
};
// A rank's entry of the manifest body (also the multi-rank rank-NNNNN.json).
nlohmann::json rank_entry_json(const RankFileFacts& r);
// The manifest body from the ranks' entries; "depends_on" from theirs (they
// must agree: kUsage naming `dir` otherwise).
nlohmann::json manifest_body(int world_size, const nlohmann::json& metadata, const nlohmann::json& ranks,
                             const std::string& dir);
// manifest.json's text: {format, version, body_xxh64, body}. Version 2 when a
// tensor is cast-predicted, 3 when one is delta-predicted (older readers
// refuse such a manifest instead of returning residuals).
std::string manifest_text(const nlohmann::json& body);

// ---- reading ---------------------------------------------------------------
// The bytes of a regular file of at most `max` bytes (opened without
// blocking: a FIFO is refused, not waited on). A missing file is
// Error(missing_kind) "<path>: missing".
std::string read_bounded(const std::string& path, uint64_t max, ErrorKind missing_kind);
// JSON text parsed by the container's strict parser (duplicate keys and
// nesting past its depth cap refused); Error(kCorrupt) naming `what`.
nlohmann::json parse_json_text(const std::string& text, const std::string& what, const std::string& part);
// Parses manifest text: checksum over the body, then every rule above.
// Throws Error(kCorrupt) "<what>: <problem>" naming the rank and tensor.
Manifest parse_manifest(const std::string& text, const std::string& what);
// dir/manifest.json read and parsed (kIncomplete if missing).
Manifest read_manifest(const std::string& dir);
// One rank's entry (of a manifest body or a rank-NNNNN.json), validated;
// `expect_rank` is the index it must carry.
ManifestRank parse_rank_entry(const nlohmann::json& j, int expect_rank, const std::string& what);

}  // namespace tz::checkpoint::detail
