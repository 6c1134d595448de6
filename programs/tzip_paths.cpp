// Where outputs go (doc/cli.md "Outputs"): -o as a file or an existing
// folder to write into, default names beside the inputs, standard input
// and output, --rm, and the dependency summary.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tzip_cli.hpp"

namespace tzip {

using tc::ErrorKind;

namespace {
std::string g_stdin_path;  // set once by stdin_path()

std::string base_name(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const auto k = s.find_last_of('/');
  return k == std::string::npos ? s : s.substr(k + 1);
}

bool is_temp_name(const std::string& n) { return n.size() > 1 && n[0] == '.' && n.find(".tmp-") != std::string::npos; }

mode_t default_file_mode() {
  const mode_t m = umask(022);
  umask(m);
  return 0666 & ~m;
}
}  // namespace

std::string stdin_path() {
  if (!g_stdin_path.empty()) return g_stdin_path;
  struct stat st;
  if (fstat(STDIN_FILENO, &st) != 0) throw tc::Error(ErrorKind::kIO, "stdin: cannot read: " + std::string(std::strerror(errno)));
  if (S_ISREG(st.st_mode)) return g_stdin_path = "/proc/self/fd/0";
  if (isatty(STDIN_FILENO)) throw UsageError("standard input is a terminal; give a file, or redirect the input");
  // A pipe: the formats need random access (a safetensors header first, a
  // .tzip trailer last), so the stream is spooled to an unnamed file.
  const char* t = std::getenv("TMPDIR");
  const std::string dir = t && *t ? t : "/tmp";
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string tmpl = dir + "/.tzip-stdin-XXXXXX";
    fd = mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) throw tc::Error(ErrorKind::kIO, "stdin: cannot create a spool file in " + dir + ": " + std::strerror(errno));
    unlink(tmpl.c_str());
  }
  fchmod(fd, default_file_mode());  // an output made from it gets the usual mode, not 0600
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = read(STDIN_FILENO, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR && !pending_signal()) continue;
      if (errno == EINTR) throw tc::Error(ErrorKind::kInterrupted, "interrupted");
      throw tc::Error(ErrorKind::kIO, "stdin: read failed: " + std::string(std::strerror(errno)));
    }
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = write(fd, buf.data() + off, (size_t)(n - off));
      if (w < 0 && errno == EINTR && !pending_signal()) continue;
      if (w < 0)
        throw tc::Error(ErrorKind::kIO, "stdin: cannot spool to " + dir + ": " + std::strerror(errno));
      off += w;
    }
  }
  return g_stdin_path = "/proc/self/fd/" + std::to_string(fd);
}

std::string display_name(const std::string& path) {
  if (path == "-" || (!g_stdin_path.empty() && path == g_stdin_path)) return "stdin";
  return path;
}

std::string stdin_in_message(const std::string& msg) {
  if (g_stdin_path.empty()) return msg;
  std::string m = msg;
  for (size_t k; (k = m.find(g_stdin_path)) != std::string::npos;) m.replace(k, g_stdin_path.size(), "stdin");
  return m;
}

std::string output_for(const Args& a, const std::string& in, const std::string& default_name) {
  if (a.output.empty()) return default_name;
  if (tc::path_kind(a.output) == tc::PathKind::kDir)
    return a.output + (a.output.back() == '/' ? "" : "/") + base_name(default_name);
  // "-o new/" names a folder: the output folder of a folder input (as cp -r),
  // but no file's name.
  if (a.output.back() == '/' && tc::path_kind(in) != tc::PathKind::kDir)
    throw tc::Error(ErrorKind::kIO, a.output + ": no such folder");
  return a.output;
}

void check_stdout_usable() {
  if (isatty(STDOUT_FILENO))
    throw UsageError("standard output is a terminal; binary data is not written to a terminal (redirect it, or "
                     "give -o FILE)");
}

void remove_input(const std::string& in) {
  if (unlink(in.c_str()) != 0) throw tc::Error(ErrorKind::kIO, in + ": cannot remove (--rm): " + std::strerror(errno));
  say("removed " + in);
}

std::vector<std::string> files_with_suffix(const std::string& in, const std::string& suffix) {
  if (tc::path_kind(in) != tc::PathKind::kDir) return {in};
  std::vector<std::string> v, stack{in};
  while (!stack.empty()) {
    const std::string d = stack.back();
    stack.pop_back();
    std::vector<std::string> names;
    if (auto* dp = opendir(d.c_str())) {
      while (auto* e = readdir(dp)) names.push_back(e->d_name);
      closedir(dp);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      if (n == "." || n == ".." || is_temp_name(n)) continue;
      const std::string p = d + "/" + n;
      if (tc::path_kind(p) == tc::PathKind::kDir) stack.push_back(p);
      else if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        v.push_back(p);
    }
  }
  return v;
}

uint64_t tree_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return (uint64_t)st.st_size;
  uint64_t s = 0;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") s += tree_size(path + "/" + n);
    }
    closedir(d);
  }
  return s;
}

void report_dependencies(const std::vector<std::string>& tzip_files) {
  bool cross_cast = false;
  for (const auto& f : tzip_files) {
    if (tc::path_kind(f) != tc::PathKind::kFile) continue;  // written through (/dev/null, a FIFO)
    tc::Reader r(f, 1);
    const auto& refs = r.references();
    for (size_t k = 0; k < refs.size(); ++k) {
      size_t casts = 0, deltas = 0;
      for (const auto& t : r.tensors())
        if (t.predict.ref == (int)k) (t.predict.kind == tc::PredictKind::kCast ? casts : deltas)++;
      std::string why;
      if (casts) why += std::to_string(casts) + " tensor(s) stored as casts of its FP32 tensors";
      if (deltas) why += std::string(why.empty() ? "" : ", ") + std::to_string(deltas) + " as deltas against it";
      say("note: " + f + " needs " + refs[k].file + " to decompress (" + why + ")");
      cross_cast = cross_cast || casts > 0;
    }
  }
  if (cross_cast) say("note: keep those files together (or compress with --independent: no output needs another)");
}

}  // namespace tzip
