// Where outputs go (doc/cli.md "Outputs"): -o as a file or an existing
// folder to write into, default names beside the inputs, standard output,
// --rm, and the dependency summary.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "tzip_cli.hpp"

namespace tzip {

using tc::ErrorKind;

namespace {
std::string base_name(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const auto k = s.find_last_of('/');
  return k == std::string::npos ? s : s.substr(k + 1);
}

bool is_temp_name(const std::string& n) { return n.size() > 1 && n[0] == '.' && n.find(".tmp-") != std::string::npos; }

}  // namespace

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

namespace {
// Relative paths of a folder's entries (folders end in '/'), temporaries skipped.
void list_tree(const std::string& root, const std::string& rel, std::set<std::string>* out, int depth = 0) {
  DIR* dp = opendir((rel.empty() ? root : root + "/" + rel).c_str());
  if (!dp || depth > 64) {
    if (dp) closedir(dp);
    return;
  }
  while (auto* e = readdir(dp)) {
    const std::string n = e->d_name;
    if (n == "." || n == ".." || is_temp_name(n)) continue;
    const std::string r = rel.empty() ? n : rel + "/" + n;
    if (tc::path_kind(root + "/" + r) == tc::PathKind::kDir) {
      out->insert(r + "/");
      list_tree(root, r, out, depth + 1);
    } else {
      out->insert(r);
    }
  }
  closedir(dp);
}
}  // namespace

bool is_output_folder_of(const std::string& in_dir, const std::string& out_dir, bool compress) {
  std::set<std::string> have, inputs;
  list_tree(out_dir, "", &have);
  if (have.empty()) return false;
  list_tree(in_dir, "", &inputs);
  const std::string from = compress ? ".safetensors" : ".tzip";
  std::set<std::string> expected;
  for (const auto& r : inputs) {
    const bool file_to_code = r.back() != '/' && r.size() > from.size() &&
                              r.compare(r.size() - from.size(), from.size(), from) == 0;
    if (!file_to_code) expected.insert(r);
    else expected.insert(compress ? tc::default_compressed_name(r, false) : tc::default_decompressed_name(r, false));
  }
  for (const auto& r : have)
    if (!expected.count(r)) return false;
  return true;
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
