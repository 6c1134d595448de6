// GPUDirect Storage through cuFile, loaded at run time with
// dlopen("libcufile.so.0") (no build-time dependency on the GDS SDK): where
// the library, its driver or a GPU is missing, callers fall back to POSIX
// I/O and report why (KvikIO-style compatibility). Reads and writes move
// bytes between a file (opened with O_DIRECT for the direct path) and GPU
// memory without a host bounce buffer.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tz::io {

// The outcome of trying to use cuFile in this process.
struct GdsDecision {
  bool use = false;
  std::string reason;  // why not (or "cuFile <driver ok>")
};

// Decides whether cuFile can be used: `wanted` (the caller asked for it),
// the library `lib` loads and exports the needed symbols, `gpus` > 0
// (CUDA devices visible; the caller counts them, this file needs no CUDA),
// and cuFileDriverOpen succeeds. The first successful load is kept for the
// process; `lib` other than the default is for tests.
GdsDecision decide_gds(bool wanted, int gpus, const char* lib = "libcufile.so.0");

// A file registered with cuFile (valid only after decide_gds(...).use).
class GdsFile {
 public:
  explicit GdsFile(int fd);  // throws std::runtime_error if registration fails
  ~GdsFile();
  GdsFile(const GdsFile&) = delete;
  GdsFile& operator=(const GdsFile&) = delete;
  // Whole transfers between GPU memory and the file; return 0 or an errno
  // value (EIO for a cuFile error, with its code in the message of last_error()).
  int read(void* dev, size_t n, uint64_t file_off);
  int write(const void* dev, size_t n, uint64_t file_off);

 private:
  void* handle_ = nullptr;
};

// Optional: registers a device buffer for faster repeated transfers.
bool gds_register_buffer(const void* dev, size_t n);
void gds_deregister_buffer(const void* dev);

}  // namespace tz::io
