// tensorzip checkpoints: save named tensors to a checkpoint directory with
// compression overlapped with the writes, restore them (all, or only the
// requested ones) with every checksum verified. doc/checkpoint.md.
//
// Layout of one checkpoint directory:
//   rank-00000.tzip ...   one .tzip container (doc/container.md) per rank
//   manifest.json         written last, atomically (temp + fsync + rename +
//                         fsync dir): a directory without it is an
//                         incomplete save and is never opened.
// Every failure throws tz::checkpoint::Error (out of memory included: kInternal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tz::checkpoint {

enum class ErrorKind {
  kUsage = 1,       // bad argument (unknown dtype, duplicate name, size mismatch)
  kIO = 2,          // cannot create/write/read/rename
  kNoSpace = 3,     // ENOSPC / EFBIG while writing
  kCorrupt = 4,     // checksum mismatch or malformed file; what() names the tensor
  kIncomplete = 5,  // directory has no manifest (interrupted save)
  kNotFound = 6,    // requested tensor not in the checkpoint
  kInternal = 7,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

enum class Memory { kHost = 0, kDevice = 1 };  // kDevice: CUDA device memory (builds with CUDA only)

// A tensor to save: bytes of `size` at `data` (not copied by save(); copied
// by AsyncSaver before it returns). dtype is a safetensors dtype string.
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  const void* data = nullptr;
  uint64_t size = 0;
  Memory memory = Memory::kHost;
};

enum class Codec { kAuto = 0, kRaw = 1, kFast = 2, kStrong = 3 };
// Storage back end. kAuto: io_uring where the build and kernel allow it,
// else a pread/pwrite thread pool. kGds: GPUDirect Storage (cuFile, loaded
// with dlopen("libcufile.so.0")) for frames restored into device memory;
// where the library, its driver or a GPU is missing, kAuto is used and
// SaveStats::io / Checkpoint::io() say why.
enum class Io { kAuto = 0, kPosix = 1, kUring = 2, kGds = 3 };

struct SaveOptions {
  Codec codec = Codec::kAuto;
  // For kAuto: storage write bandwidth in GiB/s; 0 = measure it (a short
  // fdatasync'd write in the checkpoint's folder, once per process and folder).
  double storage_gibps = 0;
  unsigned threads = 0;              // encoder threads; 0 = all hardware threads
  uint64_t chunk_bytes = 4u << 20;   // raw bytes per frame: power of two in [1, 64] MiB
  unsigned slots = 0;                // chunks in flight; 0 = threads + 4. Memory ~ slots x chunk
  Io io = Io::kAuto;
  unsigned io_threads = 2;           // posix back end
  // Cast prediction: a BF16/F16 host tensor of this save that is the
  // round-to-nearest-even cast of an FP32 host tensor of the same shape
  // (mixed precision: BF16 weights + FP32 masters) is stored as the XOR
  // residual against that cast (doc/container.md section 12), where a
  // sample says it pays. Restore returns the same bytes either way.
  bool predict = true;
  // Delta prediction: a previous complete checkpoint directory (e.g. the
  // last step's). A tensor of this rank whose name, dtype and shape match a
  // tensor of that checkpoint's file of the same rank is stored as the XOR
  // residual against it where a sample says it pays (the container's
  // min_gain rule). The rank file then records the previous rank file (path
  // relative to it + checksum) and the manifest records "depends_on": the
  // previous folder's name; restoring needs that folder, unchanged, at the
  // same relative place. It must be a folder beside the one saved (same
  // parent folder): kUsage otherwise. Empty: self-contained checkpoint.
  std::string ref;
  // O_DIRECT writes: frames gathered into 4 KiB-aligned staging buffers and
  // written bypassing the page cache; buffered where the file system refuses
  // (SaveStats::io then lacks "+O_DIRECT").
  bool direct_io = false;
  int rank = 0;
  int world_size = 1;                // > 1: call commit() once every rank has saved
  std::map<std::string, std::string> metadata;
  std::function<void(const std::string&)> log;  // codec choice and time model, one line each
};

struct SaveStats {
  uint64_t raw_bytes = 0;
  uint64_t file_bytes = 0;       // bytes of the rank file
  double seconds = 0;            // whole save, from call to manifest
  double stall_seconds = 0;      // time the caller was blocked (async: staging copy)
  std::string codec;             // "raw", "fast", "strong"
  std::string io;                // back end used, e.g. "io_uring+O_DIRECT"
  std::string model;             // time model of the codec choice
  uint64_t predicted = 0;        // tensors stored as cast residuals (SaveOptions::predict)
  uint64_t deltas = 0;           // tensors stored as delta residuals (SaveOptions::ref)
};

// Synchronous save of this rank's tensors into `dir` (created if missing;
// refused if it already holds a manifest). With world_size 1 the manifest is
// written too; otherwise each rank leaves rank-NNNNN.json and commit() writes
// the manifest.
SaveStats save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt = {});

// Writes dir/manifest.json from the world_size rank indexes (multi-rank).
void commit(const std::string& dir, int world_size);

// Asynchronous saves: save() copies the tensors into a staging area owned by
// the saver (reused by the next save; only one save in flight: a new save()
// first waits for the previous one), returns, and encodes + writes in the
// background. A failed background save is always reported: by wait(), or,
// if nobody waited, by the next save(), which then throws it (an Error of
// the same kind, naming that save's folder) and starts nothing.
class AsyncSaver {
 public:
  AsyncSaver();
  ~AsyncSaver();  // waits for the save in flight; an error nobody was told of goes to its SaveOptions::log
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  void save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt = {});
  bool done() const;           // poll
  SaveStats wait();            // blocks; rethrows the save's error (every time, until the next save)
  std::exception_ptr error() const;  // null while running or on success

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t size = 0;             // raw bytes
  uint64_t compressed_size = 0;
  int rank = 0;
};

// A tensor to load and where to put it (capacity >= its size).
struct LoadRequest {
  std::string name;
  void* dst = nullptr;
  uint64_t capacity = 0;
  Memory memory = Memory::kHost;
};

// A complete checkpoint opened for reading: reads and validates the
// manifest (doc/checkpoint.md, "Manifest validation") and checks each rank
// file's size by fstat; before the first read from a rank file, its own
// index (the container Reader's) must agree with the manifest.
class Checkpoint {
 public:
  // direct_io: read frames with O_DIRECT (4 KiB-aligned ranges around each
  // frame; frames are 64-byte aligned in the file), bypassing the page
  // cache; falls back to buffered reads where the file system refuses it.
  // io: read back end (src/io): kUring reads through io_uring where the
  // build and kernel allow it, kPosix with pread threads; kAuto = io_uring,
  // else pread. Reads run ahead of the decode workers into a bounded ring.
  explicit Checkpoint(const std::string& dir, unsigned threads = 0, bool direct_io = false, Io io = Io::kAuto);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::vector<TensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;
  long find(const std::string& name) const;  // index or -1
  // True while frames are read with O_DIRECT (requested, and not refused).
  bool direct_io() const;
  // Read back end of the last load(): "io_uring", "posix" ("none" before).
  std::string io() const;

  // Reads the requested tensors only: frames are read and decoded by
  // `threads` workers in parallel (the read of one overlaps the decode of
  // another), each frame's xxh64 and every block checksum verified. Throws
  // Error(kCorrupt) naming the tensor on damage.
  void load(std::span<const LoadRequest> requests);
  std::vector<uint8_t> read(const std::string& name);
  // Checks every tensor; returns "name: problem" for each corrupt one.
  std::vector<std::string> verify();

 private:
  void run_load(std::span<const LoadRequest> requests, const std::map<size_t, const uint8_t*>& src_bytes);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True if dir holds a complete checkpoint: a manifest that parses, matches
// its checksum and passes validation, every rank file a regular file of the
// recorded size, and, for a delta checkpoint (SaveOptions::ref), the same for
// every checkpoint it depends on (manifest "depends_on", a sibling folder; a
// cycle or a chain of more than 64 is not complete), so that a checkpoint
// whose previous one was deleted does not count. Reads manifests and stats
// files only.
bool is_complete(const std::string& dir);
// The last complete checkpoint folder directly under `root` (by name order),
// or "" if none: after a crash, restart from this one. Retention: delete a
// checkpoint folder only when no kept checkpoint depends on it.
std::string latest(const std::string& root);

}  // namespace tz::checkpoint
