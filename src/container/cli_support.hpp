// What the tzip command line (programs/) uses of the container beyond the
// public API of include/tensorzip/container.hpp: default output names, path
// kinds, the files that depend on a .tzip (--rm), and the clean-up of
// temporaries from a signal watchdog. Private to the project: defined in
// folder.cpp, file_refs.cpp and output.cpp, used there, by programs/ and by
// the container tests.
#pragma once

#include <string>
#include <vector>

namespace tz::container {

// Default output names: x.safetensors -> x.tzip, x.tzip -> x.safetensors,
// folder x -> x.tzip, folder x.tzip -> x. Empty if there is none.
std::string default_compressed_name(const std::string& in, bool is_dir);
std::string default_decompressed_name(const std::string& in, bool is_dir);
// The .tzip files in the folder of `tzip_file` that record it as one of their
// references: they cannot be decompressed without it (outputs never replace
// such a file, even with force; tzip --rm never removes it alone).
std::vector<std::string> dependents_of(const std::string& tzip_file);

// Path kinds (follows symlinks).
enum class PathKind { kMissing, kFile, kDir, kOther };
PathKind path_kind(const std::string& path);

// Removes the temporary files this process is writing, without unwinding
// (last resort for a second signal). Async-signal-safe, so files and empty
// folders only, and the first 256 temporaries only.
void remove_temporaries_on_signal();
// Removes every temporary (files and whole folders) this process is
// writing and makes later attempts to create or publish one fail with
// kInterrupted. Waits for a rename in progress, so a published output is
// never half-replaced. For a watchdog thread after request_cancel() (not
// async-signal-safe); the process is expected to exit afterwards.
void remove_temporaries();

}  // namespace tz::container
