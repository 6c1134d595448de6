#include "output.hpp"
#include "cli_support.hpp"
#include "file_refs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>

#include "file_io.hpp"

namespace tz::container::detail {

// ---- registry ----------------------------------------------------------------
namespace {
constexpr int kMaxTemps = 256;
constexpr size_t kTempPathMax = 4096;
char g_temp_paths[kMaxTemps][kTempPathMax];
std::atomic<bool> g_temp_used[kMaxTemps];
std::atomic<bool> g_cancel{false};
std::atomic<bool> g_dead{false};  // remove_temporaries() ran: nothing new is created

std::recursive_mutex& output_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

// Beyond the fixed slots (which remove_temporaries_on_signal can read from
// a signal handler), under the output lock: e.g. the staged outputs of a
// folder of hundreds of shards.
std::set<std::string>& overflow_paths() {
  static std::set<std::string> s;
  return s;
}
constexpr int kOverflowSlot = -2;

int register_path(const std::string& path) {
  if (path.size() + 1 <= kTempPathMax)
    for (int i = 0; i < kMaxTemps; ++i) {
      bool expected = false;
      if (!g_temp_used[i].load() && g_temp_used[i].compare_exchange_strong(expected, true)) {
        std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
        return i;
      }
    }
  overflow_paths().insert(path);  // callers hold the output lock
  return kOverflowSlot;
}

void unregister_path(int slot, const std::string& path) {
  if (slot >= 0 && slot < kMaxTemps) g_temp_used[slot].store(false);
  if (slot == kOverflowSlot) overflow_paths().erase(path);
}

// Same machine and pid namespace: the part of a temporary's name that tells
// whether its pid can be checked from here.
const std::string& machine_tag() {
  static const std::string tag = [] {
    std::string id;
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) id += host;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string b;
    if (boot >> b) {
      id.push_back('/');
      id.append(b);
    }
    struct stat ns {};
    if (stat("/proc/self/ns/pid", &ns) == 0) {
      id.push_back('/');
      id.append(std::to_string((unsigned long long)ns.st_ino));
    }
    uint32_t h = 2166136261u;  // FNV-1a
    for (unsigned char c : id) h = (h ^ c) * 16777619u;
    char out[9];
    std::snprintf(out, sizeof out, "%08" PRIx32, h);
    return std::string(out);
  }();
  return tag;
}

uint64_t random64() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, 0) == (ssize_t)sizeof r) return r;
  // No getrandom (old kernel): time, pid and a counter, mixed.
  static std::atomic<uint64_t> counter{0};
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ counter++;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

constexpr size_t kMaxBaseInTemp = 160;  // keeps temporary names within NAME_MAX

std::string temp_prefix(const std::string& base) {
  std::string p = ".";
  p.append(base, 0, std::min(base.size(), kMaxBaseInTemp));
  p.append(".tmp-");
  return p;
}

// Read each time (a long-lived process may change it); /proc reads it
// without changing it, which umask() cannot do safely with other threads.
mode_t current_umask() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Umask:", 0) == 0) return (mode_t)std::strtoul(line.c_str() + 6, nullptr, 8);
  const mode_t old = umask(022);  // no /proc
  umask(old);
  return old;
}

bool same_inode(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

[[noreturn]] void fail_exists(const std::string& path) { fail(ErrorKind::kExists, path + ": already exists"); }
}  // namespace

void check_cancel() {
  if (g_cancel.load(std::memory_order_relaxed)) fail(ErrorKind::kInterrupted, "interrupted");
}

std::unique_lock<std::recursive_mutex> output_lock() { return std::unique_lock<std::recursive_mutex>(output_mutex()); }

// ---- paths -------------------------------------------------------------------
std::string dir_of(const std::string& path) {
  const std::string p = strip_slashes(path);
  const auto s = p.find_last_of('/');
  if (s == std::string::npos) return ".";
  if (s == 0) return "/";
  return p.substr(0, s);
}

std::string base_of(const std::string& path) {
  const std::string p = strip_slashes(path);
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

void fsync_dir_of(const std::string& path) {
  const int fd = open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems refuse directory descriptors
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

std::string make_temp_name(const std::string& final_path) {
  const std::string p = strip_slashes(final_path);
  const std::string dir = p.find('/') == std::string::npos ? std::string() : dir_of(p);
  char tail[64];
  std::snprintf(tail, sizeof tail, "%s-%ld-%016" PRIx64, machine_tag().c_str(), (long)getpid(), random64());
  return (dir.empty() ? std::string() : dir == "/" ? dir : dir + "/") + temp_prefix(base_of(p)) + tail;
}

bool is_temp_name(const std::string& n) { return n.size() > 1 && n[0] == '.' && n.find(".tmp-") != std::string::npos; }

// ---- Temporary -----------------------------------------------------------------
Temporary::Temporary(Temporary&& o) noexcept : path_(std::move(o.path_)), slot_(o.slot_) {
  o.path_.clear();
  o.slot_ = -1;
}

Temporary& Temporary::operator=(Temporary&& o) noexcept {
  if (this != &o) {
    remove();
    path_ = std::move(o.path_);
    slot_ = o.slot_;
    o.path_.clear();
    o.slot_ = -1;
  }
  return *this;
}

Temporary::~Temporary() { remove(); }

void Temporary::release() {
  auto lk = output_lock();
  unregister_path(slot_, path_);
  slot_ = -1;
  path_.clear();
}

void Temporary::remove() {
  if (path_.empty()) return;
  auto lk = output_lock();
  remove_tree(path_);
  unregister_path(slot_, path_);
  slot_ = -1;
  path_.clear();
}

// Takes the lock, refuses after a signal, registers the name.
Temporary Temporary::make(const std::string& final_path, const std::function<int(const std::string&)>& create) {
  auto lk = output_lock();
  check_cancel();
  if (g_dead.load()) fail(ErrorKind::kInterrupted, "interrupted");
  for (int attempt = 0;; ++attempt) {
    const std::string name = make_temp_name(final_path);
    const int err = create(name);
    if (err == EEXIST && attempt < 8) continue;  // 64 random bits: never, but a collision is no error
    if (err) fail_errno(final_path, "cannot create output in " + dir_of(final_path), err);
    Temporary t;
    try {
      t.slot_ = register_path(name);
    } catch (...) {
      remove_tree(name);
      throw;
    }
    t.path_ = name;
    return t;
  }
}

Temporary Temporary::reserve(const std::string& final_path) {
  return make(final_path, [](const std::string&) { return 0; });
}

Temporary Temporary::create_file(const std::string& final_path, int* fd) {
  *fd = -1;
  return make(final_path, [fd](const std::string& name) {
    *fd = open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    return *fd < 0 ? errno : 0;
  });
}

Temporary Temporary::create_dir(const std::string& final_path) {
  return make(final_path, [](const std::string& name) { return mkdir(name.c_str(), 0700) == 0 ? 0 : errno; });
}

// ---- publishing ------------------------------------------------------------------
namespace {
// Swaps the names of a and b in one step (renameat2 RENAME_EXCHANGE): 0 or
// the errno (EINVAL, ENOSYS: a file system or kernel without it).
int exchange_names(const std::string& a, const std::string& b) {
  return renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
}
bool no_exchange(int err) { return err == EINVAL || err == ENOSYS; }

// Onto a name nothing has: a no-replace rename, so that a file that
// appeared meanwhile is never clobbered.
void publish_new(const std::string& tmp, const std::string& final_path) {
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) == 0) return;
  const int err = errno;
  if (err == EEXIST) fail_exists(final_path);
  if (err != EINVAL && err != ENOSYS) fail_errno(final_path, "cannot rename " + tmp, err);
  // A file system without renameat2 flags: checked by the caller, plain rename.
  if (rename(tmp.c_str(), final_path.c_str()) != 0) fail_errno(final_path, "cannot rename " + tmp, errno);
}

// What a file output may replace (with force): a regular file no other
// output of the call's folder needs.
void check_replaceable_file(const std::string& final_path, const struct stat& st,
                            const std::vector<std::string>& together) {
  if (!S_ISREG(st.st_mode))
    fail(ErrorKind::kUsage, final_path + (S_ISLNK(st.st_mode) ? ": is a symbolic link, not replaced"
                                           : S_ISDIR(st.st_mode) ? ": is a folder, expected a file name"
                                                                 : ": not a regular file, not replaced"));
  check_not_a_reference(final_path, together);
}

// A folder replaced atomically: the old folder and the new one swap names,
// then the old one (now under the temporary name) is removed.
void replace_folder(const std::string& tmp, const std::string& final_path, const struct stat& st) {
  if (!S_ISDIR(st.st_mode))
    fail(ErrorKind::kUsage, final_path + (S_ISLNK(st.st_mode) ? ": is a symbolic link, not replaced" : ": exists and is not a folder"));
  const int err = exchange_names(tmp, final_path);
  if (err == 0) {
    fsync_dir_of(final_path);
    remove_tree(tmp);
    return;
  }
  if (!no_exchange(err)) fail_errno(final_path, "cannot replace with " + tmp, err);
  // No RENAME_EXCHANGE: move the old folder aside (registered, so that an
  // interrupt cannot lose it unnoticed: it is put back on failure).
  Temporary old = Temporary::reserve(final_path);
  if (rename(final_path.c_str(), old.path().c_str()) != 0) {
    const int e = errno;
    old.release();
    fail_errno(final_path, "cannot move aside", e);
  }
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    rename(old.path().c_str(), final_path.c_str());
    old.release();
    fail_errno(final_path, "cannot rename " + tmp, e);
  }
  old.remove();
}

// A regular file replaced and kept: exchanged with the new one (or, without
// RENAME_EXCHANGE, kept under a hard link and renamed over); `stage` then
// names the old file.
void replace_file_keeping(Temporary& stage, const std::string& final_path) {
  const int err = exchange_names(stage.path(), final_path);
  if (err == 0) return;
  if (!no_exchange(err)) fail_errno(final_path, "cannot replace", err);
  Temporary keep = Temporary::reserve(final_path);
  if (link(final_path.c_str(), keep.path().c_str()) != 0) {
    const int e = errno;
    keep.release();
    fail_errno(final_path, "cannot keep the file being replaced", e);
  }
  if (rename(stage.path().c_str(), final_path.c_str()) != 0) fail_errno(final_path, "cannot rename", errno);
  stage = std::move(keep);  // the old file, as after an exchange
}

// The one publisher: `stage` (a file, or a folder when is_dir) onto final_path.
bool publish_onto(Temporary* stage, const std::string& tmp, const std::string& final_path, bool force, bool is_dir,
                  const std::vector<std::string>& together) {
  auto lk = output_lock();
  check_cancel();
  if (g_dead.load()) fail(ErrorKind::kInterrupted, "interrupted");
  struct stat st;
  if (lstat(final_path.c_str(), &st) != 0) {
    if (errno != ENOENT) fail_errno(final_path, "cannot check the output", errno);
    publish_new(tmp, final_path);
    fsync_dir_of(final_path);
    return false;
  }
  if (!force) fail_exists(final_path);
  bool kept = false;
  if (is_dir) {
    replace_folder(tmp, final_path, st);
  } else {
    check_replaceable_file(final_path, st, together);
    if (stage) {
      replace_file_keeping(*stage, final_path);
      kept = true;
    } else if (rename(tmp.c_str(), final_path.c_str()) != 0) {
      fail_errno(final_path, "cannot rename " + tmp, errno);
    }
  }
  fsync_dir_of(final_path);
  return kept;
}
}  // namespace

void publish(const std::string& tmp, const std::string& final_path, bool force, bool is_dir) {
  publish_onto(nullptr, tmp, final_path, force, is_dir, {});
}

bool publish_keeping_replaced(Temporary& stage, const std::string& final_path, bool force,
                              const std::vector<std::string>& together) {
  return publish_onto(&stage, stage.path(), final_path, force, false, together);
}

void restore_replaced(Temporary& stage, const std::string& final_path) {
  auto lk = output_lock();
  // Swap back: the replaced file returns, the new one is removed with the stage.
  const int err = exchange_names(stage.path(), final_path);
  if (err != 0 && rename(stage.path().c_str(), final_path.c_str()) == 0)
    stage.release();  // (no RENAME_EXCHANGE: the kept file was renamed back over the new one)
}

// ---- targets -------------------------------------------------------------------
void check_not_a_reference(const std::string& final_path, const std::vector<std::string>& together) {
  for (const std::string& dep : refs::dependents_in_folder(final_path)) {
    struct stat d;
    bool replaced_too = false;
    if (stat(dep.c_str(), &d) == 0)
      for (const auto& t : together) {
        struct stat ts;
        replaced_too = replaced_too || (stat(t.c_str(), &ts) == 0 && same_inode(ts, d));
      }
    if (!replaced_too)
      fail(ErrorKind::kExists, final_path + ": not replaced, even with -f/overwrite: " + dep +
                                   " needs it to decompress (it is recorded as its reference); rebase " + dep +
                                   " first (tzip rebase), remove it, or write to another name");
  }
}

FileTarget check_file_target(const std::string& final_path, bool force, const std::vector<std::string>& together) {
  struct stat l;
  if (lstat(final_path.c_str(), &l) != 0) {
    if (errno == ENOENT) return FileTarget::kNew;
    fail_errno(final_path, "cannot check the output", errno);
  }
  struct stat t = l;
  if (S_ISLNK(l.st_mode)) {
    if (stat(final_path.c_str(), &t) != 0 || !(S_ISFIFO(t.st_mode) || S_ISCHR(t.st_mode)))
      fail(ErrorKind::kUsage, final_path + ": is a symbolic link; neither the link nor the file behind it is "
                                           "replaced (give the file's own path, or remove the link)");
  }
  if (S_ISREG(t.st_mode)) {
    if (!force) fail_exists(final_path);
    check_not_a_reference(final_path, together);
    return FileTarget::kReplace;
  }
  if (S_ISDIR(t.st_mode)) fail(ErrorKind::kUsage, final_path + ": is a folder, expected a file name");
  if (S_ISFIFO(t.st_mode)) return FileTarget::kStream;
  if (S_ISCHR(t.st_mode)) {
    const int fd = open(final_path.c_str(), O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail_errno(final_path, "cannot open for writing", errno);
    const bool tty = isatty(fd);
    close(fd);
    if (tty) fail(ErrorKind::kUsage, final_path + ": is a terminal; binary data is not written to a terminal");
    return FileTarget::kStream;
  }
  fail(ErrorKind::kUsage, final_path + ": is a block device or a socket; outputs are regular files, FIFOs or "
                                       "character devices");
}

// ---- inputs and outputs ---------------------------------------------------------------
namespace {
// `path` and its real parents up to "/": calls f(stat) for each; stops when f returns true.
template <class F>
bool any_real_ancestor(const std::string& path, F&& f) {
  char* rp = realpath(path.c_str(), nullptr);
  if (!rp) return false;
  std::string p = rp;
  std::free(rp);
  for (;;) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && f(st)) return true;
    if (p == "/" || p.empty()) return false;
    p = dir_of(p);
  }
}
}  // namespace

void check_output_vs_input(const std::string& input, const std::string& output) {
  struct stat is, os;
  if (stat(input.c_str(), &is) != 0) return;  // a missing input is reported by whoever opens it
  const bool out_exists = stat(output.c_str(), &os) == 0;
  if (out_exists && same_inode(is, os)) fail(ErrorKind::kUsage, output + ": the output would be the input " + input);
  if (out_exists && S_ISDIR(os.st_mode) &&
      any_real_ancestor(dir_of(input), [&](const struct stat& a) { return same_inode(a, os); }))
    fail(ErrorKind::kUsage, output + ": the output folder contains the input " + input);
  if (S_ISDIR(is.st_mode) &&
      any_real_ancestor(dir_of(output), [&](const struct stat& a) { return same_inode(a, is); }))
    fail(ErrorKind::kUsage, output + ": the output would lie inside the input folder " + input);
}

void check_output_vs_inputs(const std::vector<std::string>& inputs, const std::string& output) {
  for (const auto& in : inputs) check_output_vs_input(in, output);
}

// ---- attributes -------------------------------------------------------------------
OutputAttrs attrs_of(const std::string& source) {
  OutputAttrs a;
  struct stat st;
  if (source.empty() || stat(source.c_str(), &st) != 0) return a;
  a.from_source = true;
  a.mode = st.st_mode & 0777;  // no set-id or sticky bits on an output
  a.uid = st.st_uid;
  a.gid = st.st_gid;
  a.atime = st.st_atim;
  a.mtime = st.st_mtim;
  return a;
}

void apply_attrs(int fd, const OutputAttrs& a, const std::string& name) {
  (void)name;
  if (!a.from_source) {
    fchmod(fd, 0666 & ~current_umask());
    return;
  }
  // Owner first (a chown clears set-id bits), best effort as zstd does: an
  // unprivileged user keeps their own uid and may set only their groups.
  if (a.uid != geteuid() || a.gid != getegid())
    if (fchown(fd, a.uid, a.gid) != 0 && fchown(fd, (uid_t)-1, a.gid) != 0) {
    }
  // Mode and times: best effort too (a refusing file system leaves the
  // temporary's 0600, the safe side).
  fchmod(fd, a.mode);
  const struct timespec ts[2] = {a.atime, a.mtime};
  futimens(fd, ts);
}

void apply_dir_attrs(const std::string& dir, const OutputAttrs& a) {
  if (!a.from_source) {
    chmod(dir.c_str(), 0777 & ~current_umask());
    return;
  }
  if (a.uid != geteuid() || a.gid != getegid())
    if (lchown(dir.c_str(), a.uid, a.gid) != 0 && lchown(dir.c_str(), (uid_t)-1, a.gid) != 0) {
    }
  chmod(dir.c_str(), a.mode);
  const struct timespec ts[2] = {a.atime, a.mtime};
  utimensat(AT_FDCWD, dir.c_str(), ts, AT_SYMLINK_NOFOLLOW);
}

// ---- stale temporaries ---------------------------------------------------------------
void remove_stale_temporaries(const std::string& final_path) {
  const std::string dir = dir_of(final_path);
  // Inside a temporary folder (ours, fresh): nothing stale there.
  for (size_t b = 0; b < dir.size();) {
    const size_t e = std::min(dir.find('/', b), dir.size());
    if (is_temp_name(dir.substr(b, e - b))) return;
    b = e + 1;
  }
  const std::string prefix = temp_prefix(base_of(final_path));
  const std::string mine = machine_tag() + "-";
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string tail = n.substr(prefix.size());
    // "<tag>-<pid>-<16 hex>": made on this machine by a process that has ended.
    if (tail.compare(0, mine.size(), mine) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(tail.c_str() + mine.size(), &end, 10);
    if (pid <= 0 || *end != '-' || std::strlen(end + 1) != 16) continue;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    stale.push_back((dir == "." ? std::string() : dir + "/") + n);
  }
  closedir(d);
  if (stale.empty()) return;
  auto lk = output_lock();
  for (const auto& s : stale) remove_tree(s);
}

}  // namespace tz::container::detail

namespace tz::container {
void request_cancel() { detail::g_cancel.store(true); }
void clear_cancel() { detail::g_cancel.store(false); }

void remove_temporaries_on_signal() {
  using namespace detail;
  // Async-signal-safe: files and empty folders only.
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i].load()) {
      unlink(g_temp_paths[i]);
      rmdir(g_temp_paths[i]);
    }
}

void remove_temporaries() {
  using namespace detail;
  auto lk = output_lock();
  g_dead.store(true);
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i].load()) {
      remove_tree(g_temp_paths[i]);
      g_temp_used[i].store(false);
    }
  for (const auto& p : overflow_paths()) remove_tree(p);
  overflow_paths().clear();
}
}  // namespace tz::container
