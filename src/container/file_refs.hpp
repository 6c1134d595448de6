// References between .tzip files (doc/container.md 12.3), in one place: the
// container Reader, the checkpoint engine (delta checkpoints' rank files)
// and tz::checkpoint::is_complete/latest (depends_on chains) all resolve,
// open and identify what another file names through this module.
//
// The rules:
//  - Where a recorded path may point. It is resolved against the folder of
//    the file that records it. Without the caller's say-so it must be
//    *contained*: relative; no empty or "." component; ".." only as a
//    leading run of k components, followed by at least k folder names and
//    the file name. So a reference stays in the file's own folder (k = 0,
//    "optim.tzip"), or in a folder tree parallel to it
//    ("../step-200/rank-00000.tzip", "../../prev/sub/model.tzip"): the
//    paths writers record for cross-file casts, delta checkpoints and
//    compressed folders against a previous folder. Anything else (absolute,
//    climbing higher, ".." in the middle) is used only when the caller
//    allows any location (Policy::any_location) or names the file itself
//    (ReadOptions::refs, tzip --ref, Python refs=): given locations are
//    matched by checksum and may be anywhere.
//  - What is opened: a regular file only, opened with O_NONBLOCK (a FIFO or
//    a device never blocks the open) and checked with fstat before any read.
//  - Chains: each file reached through references carries the chain that
//    led to it; a file (device and inode) that is already in the chain is a
//    cycle, and a chain of more than kMaxDepth references is refused; both
//    messages name the chain. A cycle is found before the repeated file's
//    header is read, so no level holds a second copy of a header.
//  - Identity: the reference's header_xxh64, which the Reader checked
//    against the header bytes it read, must equal the one recorded (files of
//    current writers), and each frame read from the reference is checked
//    against the xxh64 its verified header lists before it is used; for a
//    reference recorded by earlier writers (file_xxh64 only), the
//    reference's whole-file checksum is computed from its bytes once, when
//    it is opened. The trailer's file_xxh64 (a stored number) must match the
//    record too, but it alone never identifies a file.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::refs {

// Longest chain of references followed from the first file.
constexpr size_t kMaxDepth = 64;

struct Policy {
  // Also recorded paths that are not contained (absolute, climbing above
  // the parallel tree). Given locations never need it.
  bool any_location = false;
};

// "" when `recorded` is a contained path (rule above), else why not.
std::string why_not_contained(std::string_view recorded);

// Where the reference `recorded` of `referring_file` lies:
// dirname(referring_file)/recorded (or `recorded` itself when it is absolute
// and the policy allows it). Throws Error(kBadInput)
// "<referring_file>: reference '<recorded>' <why>; give its location ...".
std::string resolve(const std::string& referring_file, const std::string& recorded, const Policy& policy);

// The files (or folders) followed from a first one, for cycles and depth.
// Copies share their links (no per-level copy of anything but one node).
class Chain {
 public:
  Chain() = default;
  // This chain followed by `path`, identified by its device and inode.
  // Throws Error(kBadInput) "reference cycle: a -> b -> a" when the file is
  // already in the chain, "reference chain of more than 64 files: a -> ..."
  // when it would be longer than kMaxDepth references.
  Chain then(const std::string& path, const struct stat& st) const;
  size_t size() const;  // files in the chain
  // "a -> b -> c" (long chains abbreviated in the middle).
  std::string describe() const;

 private:
  struct Node;
  std::shared_ptr<const Node> tail_;
};

// The .tzip files in the folder of `file` (other than itself) that record
// `file` as one of their references (the recorded path, resolved under the
// default policy, names the same device and inode). Files that cannot be
// read are skipped: they depend on nothing that could be lost.
std::vector<std::string> dependents_in_folder(const std::string& file);

// Opens `path` for reading: O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
// then fstat; a folder is kUsage ("is a directory"), anything but a regular
// file kUsage ("not a regular file"), a missing file kIO. O_NONBLOCK is
// cleared again on the returned descriptor. *st receives the fstat.
int open_regular(const std::string& path, struct stat* st);

// Opens reference `r` of `referring_file` and checks its identity (rules
// above). `location`: where the caller says it is (any location; matched
// by the caller, by checksum), or empty for the recorded path under
// `policy`. `via`: the chain that led to the referring file (the checkpoint
// engine passes an empty chain). Errors name both files:
//  - kIO "<referring>: needs reference file <path> (recorded as '<file>'),
//    which is missing; give its location (tzip --ref, Python refs=)";
//  - kBadInput "<referring>: reference file <path> is not the file it was
//    compressed against (...)", and the rule, cycle and depth messages;
//  - any other failure to open it: "<referring>: reference file <path>
//    cannot be read: <why>".
std::unique_ptr<Reader> open_reference(const std::string& referring_file, const Reference& r,
                                       const std::string& location, const Policy& policy, unsigned threads,
                                       const Chain& via);

// depends_on of a checkpoint folder: the sibling folder `name` of `dir`
// (a plain name: no '/', not "." or ".."); throws Error(kBadInput) otherwise.
std::string sibling_folder(const std::string& dir, const std::string& name);

}  // namespace tz::container::refs
