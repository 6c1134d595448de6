// POSIX file helpers of the container layer: pread-based input, atomic
// output (a temporary beside the target, fsync, rename: output.hpp),
// error text.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"
#include "output.hpp"
#include "io/writeback.hpp"

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

// An output file. Written to a registered temporary beside the final path
// (output.hpp), fsync'd and published by commit(); destroying it
// uncommitted removes the temporary. The final path is checked first
// (check_file_target): an existing regular file only with force; a FIFO or
// a character device such as /dev/null is written through in order, never
// renamed over. `attrs_from`: the input whose permission bits and times the
// output takes on (empty: 0666 & ~umask, now). stream_fd >= 0: write to that
// open descriptor instead (not closed; final_path names it in messages).
class OutFile {
 public:
  OutFile(const std::string& final_path, bool force, const std::string& attrs_from = {}, int stream_fd = -1);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* p, size_t n);  // buffered
  uint64_t offset() const { return offset_; }
  // Positional writes, for an output written out of order by several
  // threads: a regular file only (the temporary; not a stream). flush()
  // first writes what write() buffered; then write_at() from any thread
  // (ranges from offset() on, tiling it without overlaps), and
  // end_positional() once they all returned: offset() then counts their
  // bytes too, and write() may follow.
  bool positional() const { return !stream_; }
  void flush();
  void write_at(const void* p, size_t n, uint64_t off);
  void end_positional();
  void commit();
  const std::string& path() const { return final_; }

 private:
  void flush_buffer();
  void write_fd(const uint8_t* p, size_t n);
  std::string final_;
  Temporary tmp_;
  OutputAttrs attrs_;
  int fd_ = -1;
  bool own_fd_ = true;
  bool stream_ = false;  // written through (FIFO, device, caller's descriptor)
  bool force_ = false;
  uint64_t offset_ = 0;
  uint64_t written_ = 0;  // bytes written to fd_
  std::atomic<uint64_t> written_at_{0};  // by write_at since the last end_positional
  tz::io::Writeback writeback_;
  uint8_t* buf_ = nullptr;
  size_t buf_used_ = 0;
};

unsigned resolve_threads(unsigned t);  // 0 -> hardware threads
// Refuses an output that is the input, contains it or lies inside it
// (check_output_vs_input).
void check_not_same_file(const std::string& in, const std::string& out);

// One single-threaded codec context per pipeline worker.
struct CtxSet {
  explicit CtxSet(unsigned n);
  ~CtxSet();
  CtxSet(const CtxSet&) = delete;
  CtxSet& operator=(const CtxSet&) = delete;
  std::vector<tz_ctx*> v;
};

// Memory for byte buffers. With huge_pages, a buffer of at least
// kHugeBufferMin bytes is its own anonymous mapping, whole 2 MiB, aligned
// to 2 MiB and offered transparent huge pages (madvise MADV_HUGEPAGE; the
// kernel may decline): its first touch then costs one page fault per 2 MiB
// instead of one per 4 KiB. On this project's 2-vCPU VMs a 4 KiB fault
// cost ~2-4 us, more than the codec's time for the page's bytes, and two
// threads fault in twice the buffers one thread does. Being mappings of
// their own they leave malloc's heap as it was. Every other buffer comes
// from new[] (the readers' and TensorWriter's: in a long-lived process
// malloc's heap, already warm, serves them and the tensors the caller
// allocates next).
constexpr size_t kHugeBufferMin = 1u << 20;
constexpr size_t kHugePage = 2u << 20;
struct BufferFree {
  size_t mapped = 0;  // bytes of the mapping; 0: from new[]
  void operator()(uint8_t* p) const;
};
using BufferPtr = std::unique_ptr<uint8_t[], BufferFree>;
// Uninitialised; *cap set to the bytes usable (>= n). Throws std::bad_alloc.
BufferPtr alloc_buffer(size_t n, bool huge_pages, size_t* cap);

// Growable byte buffer that does not zero-fill (reused across chunks).
// reserve(n, at_least): when it must grow, it grows to at_least (the
// largest n its user will ask for) at once, so a buffer reused for items of
// varying size is allocated, and its pages first touched, only once.
// Buf(true): large sizes on huge pages (alloc_buffer), for the whole-file
// passes (compress_file, export, verify), whose buffers are first touched
// once per run.
struct Buf {
  Buf() = default;
  explicit Buf(bool huge) : huge_pages(huge) {}
  BufferPtr p;
  size_t cap = 0;
  size_t size = 0;
  bool huge_pages = false;
  uint8_t* reserve(size_t n, size_t at_least = 0) {
    if (cap < n) {
      p.reset();
      cap = 0;
      p = alloc_buffer(std::max(n, at_least), huge_pages, &cap);
    }
    size = n;
    return p.get();
  }
};

}  // namespace tz::container::detail
