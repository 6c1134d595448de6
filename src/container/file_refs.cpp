// References between .tzip files: path rule, non-blocking regular-file
// open, chains (cycles, depth) and identity (file_refs.hpp).
#include "file_refs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cli_support.hpp"
#include "internal.hpp"
#include "file_io.hpp"

namespace tz::container::refs {

using detail::fail;

std::string why_not_contained(std::string_view p) {
  if (p.empty()) return "is empty";
  if (p.find('\0') != std::string_view::npos) return "holds a NUL byte";
  if (p.front() == '/') return "is an absolute path";
  size_t up = 0, names = 0;
  size_t i = 0;
  while (i <= p.size()) {
    const size_t j = std::min(p.find('/', i), p.size());
    const std::string_view c = p.substr(i, j - i);
    if (c.empty()) return "has an empty path component";
    if (c == ".") return "has a '.' component";
    if (c == "..") {
      if (names) return "has '..' after a folder name";
      ++up;
    } else {
      ++names;
    }
    i = j + 1;
  }
  // names counts the file name too: k steps up need k folder names after them.
  if (up && names < up + 1) return "climbs above the folder tree of this file";
  return "";
}

std::string resolve(const std::string& referring_file, const std::string& recorded, const Policy& policy) {
  const std::string why = why_not_contained(recorded);
  if (!why.empty()) {
    const bool absolute = !recorded.empty() && recorded[0] == '/';
    if (policy.any_location && recorded.find('\0') == std::string::npos && !recorded.empty())
      return absolute ? recorded : detail::dir_of(referring_file) + "/" + recorded;
    // At most 256 bytes of the recorded path in the message (it is untrusted).
    const std::string shown = recorded.size() > 256 ? recorded.substr(0, 256) + "..." : recorded;
    fail(ErrorKind::kBadInput, referring_file + ": reference '" + shown + "' " + why +
                                   "; it is used only from a location given explicitly (tzip --ref, Python refs=)");
  }
  return detail::dir_of(referring_file) + "/" + recorded;
}

// ---- chains -------------------------------------------------------------------
struct Chain::Node {
  std::string path;
  dev_t dev;
  ino_t ino;
  size_t size;
  std::shared_ptr<const Node> prev;
};

size_t Chain::size() const { return tail_ ? tail_->size : 0; }

std::string Chain::describe() const {
  std::vector<const Node*> v;
  for (const Node* n = tail_.get(); n; n = n->prev.get()) v.push_back(n);
  std::string s;
  const size_t n = v.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = n - 1 - k;  // first file first
    if (n > 8 && k == 3) {
      s += " -> ... (" + std::to_string(n - 6) + " more)";
      k = n - 4;
      continue;
    }
    if (k) s += " -> ";
    s += v[i]->path;
  }
  return s;
}

Chain Chain::then(const std::string& path, const struct stat& st) const {
  Chain c;
  auto node = std::make_shared<Node>();
  node->path = path;
  node->dev = st.st_dev;
  node->ino = st.st_ino;
  node->size = size() + 1;
  node->prev = tail_;
  c.tail_ = node;
  for (const Node* n = tail_.get(); n; n = n->prev.get())
    if (n->dev == st.st_dev && n->ino == st.st_ino)
      fail(ErrorKind::kBadInput, "reference cycle: " + c.describe());
  if (node->size > kMaxDepth + 1)
    fail(ErrorKind::kBadInput, "reference chain of more than " + std::to_string(kMaxDepth) + " references: " + c.describe());
  return c;
}

// ---- opening ------------------------------------------------------------------
int open_regular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    detail::fail_errno(path, err == ENOENT ? "cannot open" : "cannot open for reading", err);
  }
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    detail::fail_errno(path, "cannot stat", err);
  }
  if (S_ISDIR(st->st_mode)) {
    ::close(fd);
    fail(ErrorKind::kUsage, path + ": is a directory, expected a file");
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    fail(ErrorKind::kUsage, path + ": not a regular file");
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

std::unique_ptr<Reader> open_reference(const std::string& referring_file, const Reference& r,
                                       const std::string& location, const Policy& policy, unsigned threads,
                                       const Chain& via) {
  const std::string p = location.empty() ? resolve(referring_file, r.file, policy) : location;
  if (path_kind(p) == PathKind::kMissing)
    fail(ErrorKind::kIO, referring_file + ": needs reference file " + p + " (recorded as '" + r.file +
                             "'), which is missing; give its location (tzip --ref, Python refs=)");
  std::unique_ptr<Reader> rd;
  try {
    rd = detail::ReaderAccess::open(p, threads, via);
  } catch (const Error& e) {
    // What the referring file names is not a readable .tzip: its fault
    // (bad input), unless the system failed (I/O, memory).
    const ErrorKind k = e.kind() == ErrorKind::kUsage ? ErrorKind::kBadInput : e.kind();
    fail(k, referring_file + ": reference file " + p + " cannot be read: " + e.what());
  }
  auto wrong = [&](const std::string& detail_text) {
    fail(ErrorKind::kBadInput, referring_file + ": reference file " + p +
                                   " is not the file it was compressed against (" + detail_text + ")");
  };
  if (rd->file_checksum() != r.xxh64)
    wrong("checksum " + detail::hex64(rd->file_checksum()) + ", recorded " + detail::hex64(r.xxh64));
  if (r.has_header_xxh64) {
    // Checked by the Reader against the header bytes; the header lists each
    // frame's xxh64, checked before a frame of this reference is used.
    if (rd->header_checksum() != r.header_xxh64)
      wrong("header checksum " + detail::hex64(rd->header_checksum()) + ", recorded " + detail::hex64(r.header_xxh64));
    detail::ReaderAccess::verify_frames_on_use(*rd);
  } else {
    // Recorded by an earlier writer: only the whole-file checksum names it,
    // so it is computed from the bytes.
    try {
      detail::ReaderAccess::check_file_checksum(*rd);
    } catch (const Error& e) {
      wrong(e.what());
    }
  }
  return rd;
}

namespace {
// The first 16 bytes of a regular file (the .tzip preamble), or false.
bool read_preamble(const std::string& path, uint8_t pre[16]) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::pread(fd, pre, 16, 0) == 16;
  ::close(fd);
  return ok;
}
}  // namespace

std::vector<std::string> dependents_in_folder(const std::string& file) {
  std::vector<std::string> out;
  struct stat target;
  if (::stat(file.c_str(), &target) != 0 || !S_ISREG(target.st_mode)) return out;
  // Only a .tzip file can be a reference, and only a file of version 2
  // (predicted tensors) records references: both read from the preambles,
  // so that replacing a safetensors file, or a folder of version-1 files,
  // parses no header.
  uint8_t pre[16];
  if (!read_preamble(file, pre) || std::memcmp(pre, "TZIP", 4) != 0) return out;
  std::string dir = detail::dir_of(file);
  std::vector<std::string> names;
  if (DIR* dp = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(dp)) names.push_back(e->d_name);
    ::closedir(dp);
  }
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    if (n.size() <= 5 || n.compare(n.size() - 5, 5, ".tzip") != 0 || n[0] == '.') continue;
    const std::string p = (dir == "." && file.find('/') == std::string::npos) ? n : dir + "/" + n;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_dev == target.st_dev && st.st_ino == target.st_ino) continue;
    if (!read_preamble(p, pre) || std::memcmp(pre, "TZIP", 4) != 0 || (pre[4] | pre[5] << 8) < 2) continue;
    try {
      const Reader r(p, 1);
      for (const auto& ref : r.references()) {
        struct stat rs;
        const std::string rp = resolve(p, ref.file, Policy{});
        if (::stat(rp.c_str(), &rs) == 0 && rs.st_dev == target.st_dev && rs.st_ino == target.st_ino) {
          out.push_back(p);
          break;
        }
      }
    } catch (const Error&) {
      // not a readable .tzip file, or a reference outside the rules: nothing to keep
    }
  }
  return out;
}

std::string sibling_folder(const std::string& dir, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      name.find('\0') != std::string::npos)
    fail(ErrorKind::kBadInput, dir + ": depends_on '" + name + "' is not the name of a sibling folder");
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return detail::dir_of(d) + "/" + name;
}

}  // namespace tz::container::refs

namespace tz::container {
std::vector<std::string> dependents_of(const std::string& tzip_file) { return refs::dependents_in_folder(tzip_file); }
}  // namespace tz::container
