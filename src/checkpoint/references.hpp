// Delta references of the checkpoint engine (SaveOptions::ref, manifest
// "depends_on" / rank "references"): where a save finds the previous rank
// file, and where restore opens it. All path resolution of references is
// here, one function per side, so that a shared references module can
// replace it in one place.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "tensorzip/container.hpp"

namespace tz::checkpoint::detail {

struct SaveReference {
  std::string rank_path;   // the previous checkpoint's file of this rank (TensorWriterOptions::ref)
  std::string depends_on;  // its folder's name (a sibling of the checkpoint being saved)
};
// SaveOptions::ref for a save of `rank` into `dir` (which exists): a complete
// checkpoint in the same parent folder as dir, holding this rank's file.
// Error(kUsage) naming it otherwise, before anything is written.
SaveReference resolve_save_reference(const std::string& ref, const std::string& dir, int rank);

// Restore: the references of rank entry `r` of the checkpoint in `dir`
// (manifest depends_on `depends_on`), each opened as a container Reader and
// checked: the file exists (kNotFound otherwise), its checksum is the
// recorded one (kCorrupt "changed") and its own references check out.
// Messages name the rank file and the reference.
std::vector<std::unique_ptr<tz::container::Reader>> open_rank_references(const std::string& dir,
                                                                         const ManifestRank& r,
                                                                         const std::string& depends_on);

}  // namespace tz::checkpoint::detail
