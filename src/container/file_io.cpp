#include "file_io.hpp"
#include "file_refs.hpp"
#include "write_queue.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

namespace tz::container::detail {

void fail(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

void fail_errno(const std::string& path, const std::string& what, int err) {
  const ErrorKind kind = (err == ENOMEM) ? ErrorKind::kInternal : ErrorKind::kIO;
  throw Error(kind, path + ": " + what + ": " + std::strerror(err), err);  // sys_errno(): ENOSPC, ENOENT, ...
}

unsigned resolve_threads(unsigned t) {
  if (t) return t;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

void check_not_same_file(const std::string& in, const std::string& out) { check_output_vs_input(in, out); }

CtxSet::CtxSet(unsigned n) {
  for (unsigned i = 0; i < n; ++i) {
    tz_ctx* c = tz_ctx_create(1);
    if (!c) fail(ErrorKind::kInternal, "cannot create a codec context (out of memory)");
    v.push_back(c);
  }
}

CtxSet::~CtxSet() {
  for (auto* c : v) tz_ctx_free(c);
}

// ---- buffers -------------------------------------------------------------
BufferPtr alloc_buffer(size_t n, bool huge_pages, size_t* cap) {
  const size_t want = std::max<size_t>(n, 1);
  if (!huge_pages || want < kHugeBufferMin) {
    uint8_t* p = new uint8_t[want];  // std::bad_alloc on out of memory, as every allocation here
    *cap = want;
    return BufferPtr(p, BufferFree{0});
  }
  if (want > SIZE_MAX - 2 * kHugePage) throw std::bad_alloc();
  const size_t c = (want + kHugePage - 1) / kHugePage * kHugePage;
  // Mapped with one huge page of slack, then trimmed to the aligned part.
  void* m = mmap(nullptr, c + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  uint8_t* const base = static_cast<uint8_t*>(m);
  uint8_t* const p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(uintptr_t)(kHugePage - 1));
  if (p > base) munmap(base, (size_t)(p - base));
  if (const size_t tail = (size_t)(base + c + kHugePage - (p + c))) munmap(p + c, tail);
#ifdef MADV_HUGEPAGE
  madvise(p, c, MADV_HUGEPAGE);  // a hint: refused (EINVAL) where THP is absent
#endif
  *cap = c;
  return BufferPtr(p, BufferFree{c});
}

void BufferFree::operator()(uint8_t* p) const {
  if (mapped) munmap(p, mapped);
  else delete[] p;
}

// ---- InFile ------------------------------------------------------------
InFile::InFile(const std::string& path) : path_(path) {
  // Never blocks (a FIFO given as input or as a reference), regular files only.
  fd_ = refs::open_regular(path, &st_);
  size_ = (uint64_t)st_.st_size;
}

InFile::~InFile() {
  if (fd_ >= 0) close(fd_);
}

void InFile::advise_sequential() const { posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL); }

void InFile::pread_exact(uint64_t off, void* buf, size_t n) const {
  uint8_t* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = pread(fd_, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno(path_, "read failed", errno);
    }
    if (r == 0) fail(ErrorKind::kBadInput, path_ + ": truncated (unexpected end of file at byte " + std::to_string(off) + ")");
    p += r;
    off += (uint64_t)r;
    n -= (size_t)r;
  }
}

// ---- OutFile -----------------------------------------------------------
namespace {
constexpr size_t kOutBuf = 1u << 20;
// Writes of at least this many bytes skip the buffer (after flushing it):
// one system call each, and no copy; smaller ones are gathered.
constexpr size_t kOutDirect = 128u << 10;
}

OutFile::OutFile(const std::string& final_path, bool force, const std::string& attrs_from, int stream_fd)
    : final_(final_path), force_(force) {
  if (stream_fd >= 0) {
    fd_ = stream_fd;
    own_fd_ = false;
    stream_ = true;
  } else if (check_file_target(final_, force_) == FileTarget::kStream) {
    // A FIFO blocks here until a reader opens it; a signal interrupts it.
    for (;;) {
      check_cancel();
      fd_ = open(final_.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
      if (fd_ >= 0) break;
      if (errno != EINTR) fail_errno(final_, "cannot open for writing", errno);
    }
    stream_ = true;
  } else {
    remove_stale_temporaries(final_);
    tmp_ = Temporary::create_file(final_, &fd_);
    attrs_ = attrs_of(attrs_from);
  }
  buf_ = static_cast<uint8_t*>(std::malloc(kOutBuf));
  if (!buf_) {
    if (own_fd_) close(fd_);
    fd_ = -1;
    fail(ErrorKind::kInternal, final_ + ": out of memory");
  }
}

OutFile::~OutFile() {
  if (fd_ >= 0 && own_fd_) close(fd_);
  std::free(buf_);
  // tmp_ (if still held) removes the temporary.
}

void OutFile::write_fd(const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) {
        check_cancel();
        continue;
      }
      fail_errno(final_, "write failed", errno);
    }
    p += w;
    n -= (size_t)w;
    written_ += (uint64_t)w;
  }
  // The temporary's writeback starts as it is written (commit's fsync then
  // waits for the last chunk only); written-through outputs are left alone.
  if (!stream_) writeback_.written_to(fd_, written_);
}

void OutFile::flush() { flush_buffer(); }

void OutFile::write_at(const void* src, size_t n, uint64_t off) {
  check_cancel();
  if (const int e = tz::io::pwrite_full(fd_, src, n, off)) fail_errno(final_, "write failed", e);
  // Each range's writeback starts as it is written (out of order, so not
  // through writeback_, which follows a growing prefix).
  tz::io::Writeback::start(fd_, off, n);
  written_at_.fetch_add(n, std::memory_order_relaxed);
}

void OutFile::end_positional() {
  offset_ += written_at_.exchange(0);
  written_ = offset_;
  if (lseek(fd_, (off_t)offset_, SEEK_SET) < 0) fail_errno(final_, "seek failed", errno);
}

void OutFile::flush_buffer() {
  write_fd(buf_, buf_used_);
  buf_used_ = 0;
}

void OutFile::write(const void* src, size_t n) {
  check_cancel();
  if (n == 0) return;  // src may be null (a size-0 frame)
  const uint8_t* p = static_cast<const uint8_t*>(src);
  offset_ += n;
  if (n >= kOutDirect) {
    if (buf_used_) flush_buffer();
    write_fd(p, n);
    return;
  }
  if (buf_used_ + n > kOutBuf) flush_buffer();
  std::memcpy(buf_ + buf_used_, p, n);
  buf_used_ += n;
}

void OutFile::commit() {
  flush_buffer();
  if (stream_) {
    // Written through: nothing to publish. A regular file behind the
    // caller's descriptor (stdout redirected) is synced; pipes cannot be.
    struct stat st;
    if (fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && fsync(fd_) != 0) fail_errno(final_, "fsync failed", errno);
    if (own_fd_) {
      const int fd = fd_;
      fd_ = -1;
      if (close(fd) != 0) fail_errno(final_, "close failed", errno);
    }
    return;
  }
  apply_attrs(fd_, attrs_, final_);
  if (fsync(fd_) != 0) fail_errno(final_, "fsync failed", errno);
  // Published while still open, then closed (close after fsync reports nothing new).
  publish(tmp_.path(), final_, force_, false);
  tmp_.release();
  close(fd_);
  fd_ = -1;
}

}  // namespace tz::container::detail
