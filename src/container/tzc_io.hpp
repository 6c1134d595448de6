// POSIX file helpers of the container layer: pread-based input, atomic
// output (temporary name in the target folder, fsync, rename), error text.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::detail {

[[noreturn]] void fail(ErrorKind kind, const std::string& msg);
// "<path>: <what>: <strerror(err)>"
[[noreturn]] void fail_errno(const std::string& path, const std::string& what, int err);

// Read-only file accessed with pread; never modified.
class InFile {
 public:
  explicit InFile(const std::string& path);
  ~InFile();
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  const struct stat& status() const { return st_; }  // fstat at open (device, inode)
  // Reads exactly n bytes at off; a short file is reported as truncated
  // (kBadInput), a read error as kIO.
  void pread_exact(uint64_t off, void* buf, size_t n) const;
  void advise_sequential() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  struct stat st_ {};
};

// Output written to "<dir>/.<name>.tmp-<pid>-<n>", fsync'd and renamed onto
// the final path by commit(). Destroying it uncommitted removes the file.
class OutFile {
 public:
  OutFile(const std::string& final_path, bool force);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* p, size_t n);  // buffered
  uint64_t offset() const { return offset_; }
  void commit();
  const std::string& path() const { return final_; }

 private:
  void flush_buffer();
  std::string final_, tmp_;
  int fd_ = -1;
  bool force_ = false;
  int slot_ = -1;
  uint64_t offset_ = 0;
  uint8_t* buf_ = nullptr;
  size_t buf_used_ = 0;
};

// Throws Error(kInterrupted) if request_cancel() was called.
void check_cancel();

// Registry of temporary paths for signal-time cleanup.
int register_temp(const std::string& path);
void unregister_temp(int slot);

// Atomically replaces/creates final with the already-written temporary
// (file or folder). Refuses an existing final unless force.
void publish(const std::string& tmp, const std::string& final_path, bool force, bool is_dir);
void fsync_dir_of(const std::string& path);
std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);
std::string make_temp_name(const std::string& final_path);
void remove_tree(const std::string& path);

unsigned resolve_threads(unsigned t);  // 0 -> hardware threads
// Refuses an output path that names the input file itself.
void check_not_same_file(const std::string& in, const std::string& out);

// One single-threaded codec context per pipeline worker.
struct CtxSet {
  explicit CtxSet(unsigned n);
  ~CtxSet();
  CtxSet(const CtxSet&) = delete;
  CtxSet& operator=(const CtxSet&) = delete;
  std::vector<tz_ctx*> v;
};

// Growable byte buffer that does not zero-fill (reused across chunks).
struct Buf {
  std::unique_ptr<uint8_t[]> p;
  size_t cap = 0;
  size_t size = 0;
  uint8_t* reserve(size_t n) {
    if (cap < n) {
      p.reset(new uint8_t[n]);
      cap = n;
    }
    size = n;
    return p.get();
  }
};

}  // namespace tz::container::detail
