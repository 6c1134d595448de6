#include "tzc_io.hpp"
#include "tzip_refs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tz::container::detail {

void fail(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

void fail_errno(const std::string& path, const std::string& what, int err) {
  const ErrorKind kind = (err == ENOMEM) ? ErrorKind::kInternal : ErrorKind::kIO;
  fail(kind, path + ": " + what + ": " + std::strerror(err));
}

// ---- temporaries registry (signal-safe removal) ---------------------------
namespace {
constexpr int kMaxTemps = 64;
constexpr size_t kTempPathMax = 4096;
char g_temp_paths[kMaxTemps][kTempPathMax];
std::atomic<bool> g_temp_used[kMaxTemps];
std::atomic<unsigned> g_temp_counter{0};
std::atomic<bool> g_cancel{false};
}  // namespace

void check_cancel() {
  if (g_cancel.load(std::memory_order_relaxed)) fail(ErrorKind::kInterrupted, "interrupted");
}

int register_temp(const std::string& path) {
  if (path.size() + 1 > kTempPathMax) return -1;
  for (int i = 0; i < kMaxTemps; ++i) {
    bool expected = false;
    if (!g_temp_used[i].load() && g_temp_used[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
      return i;
    }
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0 && slot < kMaxTemps) g_temp_used[slot].store(false);
}

}  // namespace tz::container::detail

namespace tz::container {
void request_cancel() { detail::g_cancel.store(true); }
void clear_cancel() { detail::g_cancel.store(false); }

void remove_temporaries_on_signal() {
  using namespace detail;
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i].load()) {
      // Files only: a temporary folder is removed by its owner on normal
      // unwinding; unlink leaves a non-empty folder in place (harmless name).
      unlink(g_temp_paths[i]);
      rmdir(g_temp_paths[i]);
    }
}
}  // namespace tz::container

namespace tz::container::detail {

std::string dir_of(const std::string& path) {
  const auto s = path.find_last_of('/');
  if (s == std::string::npos) return ".";
  if (s == 0) return "/";
  return path.substr(0, s);
}

std::string base_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string make_temp_name(const std::string& final_path) {
  std::string p = final_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::string dir = dir_of(p);
  const std::string base = base_of(p);
  const unsigned n = g_temp_counter.fetch_add(1);
  return (dir == "." && p.find('/') == std::string::npos ? std::string() : dir + "/") + "." + base + ".tmp-" +
         std::to_string(getpid()) + "-" + std::to_string(n);
}

void fsync_dir_of(const std::string& path) {
  const int fd = open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  fsync(fd);
  close(fd);
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      closedir(d);
      for (const auto& n : names) remove_tree(path + "/" + n);
    }
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

void publish(const std::string& tmp, const std::string& final_path, bool force, bool is_dir) {
  struct stat st;
  const bool exists = stat(final_path.c_str(), &st) == 0;
  if (exists && !force) fail(ErrorKind::kExists, final_path + ": already exists (use -f to overwrite)");
  if (exists && S_ISDIR(st.st_mode) != is_dir)
    fail(ErrorKind::kUsage, final_path + ": exists and is " + (is_dir ? "not a directory" : "a directory"));
  if (!exists) {
    // No-replace rename, so that a concurrent writer is never clobbered.
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) == 0) {
      fsync_dir_of(final_path);
      return;
    }
    const int err = errno;
    if (err == EEXIST) fail(ErrorKind::kExists, final_path + ": already exists (use -f to overwrite)");
    if (err != EINVAL && err != ENOSYS) fail_errno(final_path, "cannot rename " + tmp, err);
  }
  if (is_dir && exists) {
    // A folder cannot be replaced in one step: move the old one aside first.
    const std::string old = make_temp_name(final_path) + "-old";
    if (rename(final_path.c_str(), old.c_str()) != 0) fail_errno(final_path, "cannot move aside", errno);
    if (rename(tmp.c_str(), final_path.c_str()) != 0) {
      const int err = errno;
      rename(old.c_str(), final_path.c_str());
      fail_errno(final_path, "cannot rename " + tmp, err);
    }
    remove_tree(old);
  } else if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    fail_errno(final_path, "cannot rename " + tmp, errno);
  }
  fsync_dir_of(final_path);
}

unsigned resolve_threads(unsigned t) {
  if (t) return t;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

void check_not_same_file(const std::string& in, const std::string& out) {
  struct stat a, b;
  if (stat(in.c_str(), &a) == 0 && stat(out.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    fail(ErrorKind::kUsage, out + ": output is the input file");
}

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
}

OutFile::OutFile(const std::string& final_path, bool force) : final_(final_path), force_(force) {
  struct stat st;
  if (stat(final_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(ErrorKind::kUsage, final_ + ": is a directory, expected a file name");
    if (!force_) fail(ErrorKind::kExists, final_ + ": already exists (use -f to overwrite)");
  }
  tmp_ = make_temp_name(final_);
  slot_ = register_temp(tmp_);
  fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    unregister_temp(slot_);
    fail_errno(final_, "cannot create output in " + dir_of(final_), err);
  }
  buf_ = static_cast<uint8_t*>(std::malloc(kOutBuf));
  if (!buf_) {
    close(fd_);
    unlink(tmp_.c_str());
    unregister_temp(slot_);
    fail(ErrorKind::kInternal, final_ + ": out of memory");
  }
}

OutFile::~OutFile() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(tmp_.c_str());
  }
  unregister_temp(slot_);
  std::free(buf_);
}

void OutFile::flush_buffer() {
  const uint8_t* p = buf_;
  size_t n = buf_used_;
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno(final_, "write failed", errno);
    }
    p += w;
    n -= (size_t)w;
  }
  buf_used_ = 0;
}

void OutFile::write(const void* src, size_t n) {
  check_cancel();
  if (n == 0) return;  // src may be null (a size-0 frame)
  const uint8_t* p = static_cast<const uint8_t*>(src);
  offset_ += n;
  if (buf_used_ + n <= kOutBuf) {
    std::memcpy(buf_ + buf_used_, p, n);
    buf_used_ += n;
    return;
  }
  flush_buffer();
  if (n < kOutBuf) {
    std::memcpy(buf_, p, n);
    buf_used_ = n;
    return;
  }
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno(final_, "write failed", errno);
    }
    p += w;
    n -= (size_t)w;
  }
}

void OutFile::commit() {
  flush_buffer();
  if (fsync(fd_) != 0) fail_errno(final_, "fsync failed", errno);
  if (close(fd_) != 0) {
    fd_ = -1;
    unlink(tmp_.c_str());
    fail_errno(final_, "close failed", errno);
  }
  fd_ = -1;
  try {
    publish(tmp_, final_, force_, false);
  } catch (...) {
    unlink(tmp_.c_str());
    throw;
  }
}

}  // namespace tz::container::detail
