// Hugging Face model folders: *.safetensors <-> *.tzip, every other file
// (model.safetensors.index.json, configs, tokenizer) copied byte for byte.
// The output folder is built under a temporary name beside the target and
// renamed when complete, so a failure never leaves a half-written folder.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include "cli_support.hpp"
#include "internal.hpp"
#include "file_io.hpp"

namespace tz::container {

using namespace detail;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

struct Entry {
  std::string rel;  // relative path
  bool dir;
  uint64_t size;
};

// The names in folder `dir` (without "." and ".."), sorted.
std::vector<std::string> sorted_names(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) fail_errno(dir, "cannot open folder", errno);
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Lists a folder recursively (symlinks followed, as in Hugging Face cache
// snapshots), sorted, skipping the inode `skip` (our own output).
void walk(const std::string& root, const std::string& rel, int depth, dev_t skip_dev, ino_t skip_ino,
          std::vector<Entry>* out) {
  if (depth > 32) fail(ErrorKind::kUsage, root + "/" + rel + ": folder nesting too deep (symlink loop?)");
  for (const auto& n : sorted_names(rel.empty() ? root : root + "/" + rel)) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    const std::string full = root + "/" + r;
    struct stat st;
    if (stat(full.c_str(), &st) != 0) fail_errno(full, "cannot stat", errno);
    if (st.st_dev == skip_dev && st.st_ino == skip_ino) continue;
    if (is_temp_name(n)) continue;  // someone's temporary
    if (S_ISDIR(st.st_mode)) {
      out->push_back(Entry{r, true, 0});
      walk(root, r, depth + 1, skip_dev, skip_ino, out);
    } else if (S_ISREG(st.st_mode)) {
      out->push_back(Entry{r, false, (uint64_t)st.st_size});
    } else {
      fail(ErrorKind::kUsage, full + ": not a regular file or folder");
    }
  }
}

// Copies src to dst (a temporary until committed); returns false, leaving
// nothing behind, once *stop is set.
bool copy_file(const std::string& src, const std::string& dst, const std::atomic<bool>& stop) {
  InFile in(src);
  in.advise_sequential();
  OutFile out(dst, false, src);
  Buf buf;  // not zero-filled: every byte is read into before it is written
  uint8_t* const p = buf.reserve((size_t)std::min<uint64_t>(in.size(), 8u << 20));
  for (uint64_t off = 0; off < in.size();) {
    if (stop.load(std::memory_order_relaxed)) return false;
    const size_t n = (size_t)std::min<uint64_t>(buf.size, in.size() - off);
    in.pread_exact(off, p, n);
    out.write(p, n);
    off += n;
  }
  out.commit();
  return true;
}

// Entries of an existing folder, links not followed: (relative path, mode).
void list_nofollow(const std::string& root, const std::string& rel, int depth,
                   std::vector<std::pair<std::string, mode_t>>* out) {
  if (depth > 32) fail(ErrorKind::kUsage, root + "/" + rel + ": folder nesting too deep");
  for (const auto& n : sorted_names(rel.empty() ? root : root + "/" + rel)) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    struct stat st;
    if (lstat((root + "/" + r).c_str(), &st) != 0) fail_errno(root + "/" + r, "cannot stat", errno);
    out->emplace_back(r, st.st_mode);
    if (S_ISDIR(st.st_mode)) list_nofollow(root, r, depth + 1, out);
  }
}

// -f replaces an existing output folder only if it holds nothing but what
// the new output holds (same relative names, files as files, folders as
// folders, no links): a folder of this command's own output.
void check_replaceable_folder(const std::string& out, const std::set<std::pair<std::string, bool>>& expected) {
  std::vector<std::pair<std::string, mode_t>> have;
  list_nofollow(out, "", 0, &have);
  for (const auto& [rel, mode] : have) {
    const bool ok = (S_ISDIR(mode) && expected.count({rel, true})) || (S_ISREG(mode) && expected.count({rel, false}));
    if (!ok)
      fail(ErrorKind::kExists, out + ": exists and holds " + rel + ", which this command does not write; -f replaces "
                                     "only a folder of its own output (move it away, or give another output)");
  }
}

ProgressFn offset_progress(const ProgressFn& p, uint64_t base, uint64_t total) {
  if (!p) return nullptr;
  return [p, base, total](uint64_t d, uint64_t) { p(base + d, total); };
}

}  // namespace

PathKind path_kind(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (S_ISDIR(st.st_mode)) return PathKind::kDir;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  return PathKind::kOther;
}

namespace {
// "." and ".." (and "x/." ...) have no name of their own: the folder's real
// name, beside it ("." -> "../NAME"). Empty for "/".
std::string named_path(const std::string& p) {
  const std::string b = base_of(p);
  if (b != "." && b != "..") return p;
  char* rp = realpath(p.c_str(), nullptr);
  if (!rp) return p;
  const std::string r = rp;
  std::free(rp);
  if (r == "/") return "";
  if (p == ".") return "../" + base_of(r);
  return r;
}
}  // namespace

std::string default_compressed_name(const std::string& in, bool is_dir) {
  const std::string p = named_path(strip_slashes(in));
  if (p.empty() || p == "/") return "";
  if (is_dir) return p + ".tzip";
  if (ends_with(p, ".safetensors")) return p.substr(0, p.size() - 12) + ".tzip";
  return p + ".tzip";
}

std::string default_decompressed_name(const std::string& in, bool is_dir) {
  const std::string p = named_path(strip_slashes(in));
  if (!ends_with(p, ".tzip") || base_of(p) == ".tzip") return "";
  const std::string stem = p.substr(0, p.size() - 5);
  return is_dir ? stem : stem + ".safetensors";
}

// The shared part of compress_folder / decompress_folder. The constructor
// checks the input folder and the output (output rules of output.hpp:
// not the input, not inside it, not holding it; an existing folder only
// with force and only if it holds nothing but what this output holds, as
// out_name maps the input's entries) and lists the input. begin() creates
// the output under a temporary name beside it with the input's subfolders;
// publish_output() gives every folder its input's mode and times and
// renames it into place.
struct FolderPass {
  std::string in, out;
  Temporary tmp;
  std::vector<Entry> entries;
  FolderPass(const std::string& in_dir, const std::string& out_dir, bool force,
             const std::function<std::string(const std::string&)>& out_name)
      : in(strip_slashes(in_dir)), out(strip_slashes(out_dir)) {
    if (path_kind(in) != PathKind::kDir) fail(ErrorKind::kUsage, in + ": not a folder");
    check_output_vs_input(in, out);
    walk(in, "", 0, 0, 0, &entries);
    struct stat st;
    if (lstat(out.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) fail(ErrorKind::kUsage, out + ": is a symbolic link; it is not replaced");
      if (!S_ISDIR(st.st_mode)) fail(ErrorKind::kUsage, out + ": exists and is not a folder");
      if (!force) fail(ErrorKind::kExists, out + ": already exists");
      std::set<std::pair<std::string, bool>> expected;
      for (const auto& e : entries) expected.insert({e.dir ? e.rel : out_name(e.rel), e.dir});
      check_replaceable_folder(out, expected);
    } else if (errno != ENOENT) {
      fail_errno(out, "cannot check the output", errno);
    }
  }
  void begin() {
    remove_stale_temporaries(out);
    tmp = Temporary::create_dir(out);
    for (const auto& e : entries) {
      if (!e.dir) continue;
      auto lk = output_lock();  // nothing is created in a temporary after a signal
      check_cancel();
      if (mkdir((tmp.path() + "/" + e.rel).c_str(), 0700) != 0) fail_errno(out + "/" + e.rel, "cannot create folder", errno);
    }
  }
  void publish_output(bool force) {
    // Deepest folders first: a folder's times are set once nothing more is
    // added to it.
    for (auto it = entries.rbegin(); it != entries.rend(); ++it)
      if (it->dir) apply_dir_attrs(tmp.path() + "/" + it->rel, attrs_of(in + "/" + it->rel));
    apply_dir_attrs(tmp.path(), attrs_of(in));
    publish(tmp.path(), out, force, true);
    tmp.release();
  }
};

// Runs `code` (the pass over the folder's safetensors or .tzip files) on
// the calling thread while a thread of its own copies the entries `copied`
// selects (the other files) into the temporary output: each copy mostly
// waits for its fsync, so the copies overlap the coding instead of
// following it. Progress: code's, then `total` once both are done. The
// first error, code's before a copy's, is rethrown once both have stopped;
// a failing code stops the copies at their next chunk.
template <class Code>
void code_and_copy(const FolderPass& fp, bool (*copied)(const Entry&), Code&& code, const ProgressFn& progress,
                   uint64_t total) {
  std::atomic<bool> stop{false};
  std::exception_ptr copy_error;
  std::thread copier([&] {
    try {
      for (const auto& e : fp.entries)
        if (!e.dir && copied(e) && !copy_file(fp.in + "/" + e.rel, fp.tmp.path() + "/" + e.rel, stop)) return;
    } catch (...) {
      copy_error = std::current_exception();
    }
  });
  try {
    code();
  } catch (...) {
    stop.store(true);
    copier.join();
    throw;
  }
  copier.join();
  if (copy_error) std::rethrow_exception(copy_error);
  if (progress) progress(total, total);
}

void compress_folder(const std::string& in_dir, const std::string& out_dir_arg, const WriteOptions& opt) {
  FolderPass fp(in_dir, out_dir_arg, opt.force,
                [](const std::string& rel) { return ends_with(rel, ".safetensors") ? default_compressed_name(rel, false) : rel; });
  const std::string& in = fp.in;
  const std::vector<Entry>& entries = fp.entries;
  const Temporary& tmp = fp.tmp;
  uint64_t total = 0;
  size_t n_st = 0;
  for (const auto& e : entries) {
    total += e.size;
    if (!e.dir && ends_with(e.rel, ".tzip"))
      fail(ErrorKind::kUsage, in + "/" + e.rel + ": folder already holds a .tzip file; it would not round-trip");
    if (!e.dir && ends_with(e.rel, ".safetensors")) ++n_st;
  }
  if (n_st == 0) fail(ErrorKind::kUsage, in + ": folder holds no .safetensors files");
  // opt.ref for a folder: the previous checkpoint's compressed folder; each
  // file is coded against the .tzip of the same relative path there.
  if (!opt.ref.empty() && path_kind(opt.ref) != PathKind::kDir)
    fail(ErrorKind::kUsage, opt.ref + ": reference of a folder must be a folder of .tzip files");
  if (!opt.ref_original.empty() && (opt.ref.empty() || path_kind(opt.ref_original) != PathKind::kDir))
    fail(ErrorKind::kUsage, opt.ref_original + ": with a folder, the reference's original must be a folder of "
                                               ".safetensors files, given with a reference folder");
  // Folders first, then every safetensors file of the folder as one
  // checkpoint (casts across files), the other files copied meanwhile.
  fp.begin();
  code_and_copy(fp, [](const Entry& e) { return !ends_with(e.rel, ".safetensors"); }, [&] {
    std::vector<std::string> ins, outs, refs, ref_origs;
    for (const auto& e : entries) {
      if (e.dir || !ends_with(e.rel, ".safetensors")) continue;
      ins.push_back(in + "/" + e.rel);
      outs.push_back(tmp.path() + "/" + default_compressed_name(e.rel, false));
      const std::string r = opt.ref.empty() ? "" : opt.ref + "/" + default_compressed_name(e.rel, false);
      refs.push_back(!r.empty() && path_kind(r) == PathKind::kFile ? r : "");
      // The previous checkpoint's safetensors file of the same relative name.
      const std::string ro = opt.ref_original.empty() ? "" : opt.ref_original + "/" + e.rel;
      ref_origs.push_back(!refs.back().empty() && !ro.empty() && path_kind(ro) == PathKind::kFile ? ro : "");
    }
    WriteOptions o = opt;
    o.force = false;
    o.ref.clear();
    o.ref_original.clear();
    o.progress = offset_progress(opt.progress, 0, total);
    compress_checkpoint(ins, outs, o, refs, ref_origs);
  }, opt.progress, total);
  fp.publish_output(opt.force);
}

void decompress_folder(const std::string& in_dir, const std::string& out_dir_arg, const ReadOptions& opt) {
  FolderPass fp(in_dir, out_dir_arg, opt.force,
                [](const std::string& rel) { return ends_with(rel, ".tzip") ? default_decompressed_name(rel, false) : rel; });
  const std::string& in = fp.in;
  const std::vector<Entry>& entries = fp.entries;
  const Temporary& tmp = fp.tmp;
  // Totals in original bytes: open every .tzip first (header only), which
  // also rejects a damaged folder before anything is written.
  uint64_t total = 0;
  size_t n_tz = 0;
  for (const auto& e : entries) {
    if (e.dir) continue;
    n_tz += ends_with(e.rel, ".tzip");
    if (ends_with(e.rel, ".safetensors"))
      fail(ErrorKind::kUsage, in + "/" + e.rel + ": compressed folder holds a .safetensors file; it would not round-trip");
    total += ends_with(e.rel, ".tzip") ? Reader(in + "/" + e.rel, 1).original_size() : e.size;
  }
  if (n_tz == 0) fail(ErrorKind::kUsage, in + ": folder holds no .tzip files");
  fp.begin();
  code_and_copy(fp, [](const Entry& e) { return !ends_with(e.rel, ".tzip"); }, [&] {
    // All .tzip files as one checkpoint: referenced files are restored
    // first and serve as predictors of the others (section 12).
    std::vector<std::string> ins, outs;
    for (const auto& e : entries) {
      if (e.dir || !ends_with(e.rel, ".tzip")) continue;
      ins.push_back(in + "/" + e.rel);
      outs.push_back(tmp.path() + "/" + default_decompressed_name(e.rel, false));
    }
    ReadOptions o = opt;
    o.force = false;
    o.progress = offset_progress(opt.progress, 0, total);
    decompress_checkpoint(ins, outs, o);
  }, opt.progress, total);
  fp.publish_output(opt.force);
}

void verify_folder(const std::string& dir_arg, const std::string& original_arg, const ReadOptions& opt) {
  const std::string dir = strip_slashes(dir_arg);
  const std::string orig = original_arg.empty() ? "" : strip_slashes(original_arg);
  if (path_kind(dir) != PathKind::kDir) fail(ErrorKind::kUsage, dir + ": not a folder");
  if (!orig.empty() && path_kind(orig) != PathKind::kDir) fail(ErrorKind::kUsage, orig + ": not a folder");
  std::vector<Entry> entries, orig_entries;
  walk(dir, "", 0, 0, 0, &entries);
  uint64_t total = 0, base = 0;
  size_t n_tz = 0;
  for (const auto& e : entries) total += e.size, n_tz += !e.dir && ends_with(e.rel, ".tzip");
  if (n_tz == 0) fail(ErrorKind::kUsage, dir + ": folder holds no .tzip files");
  for (const auto& e : entries) {
    if (e.dir) continue;
    const std::string p = dir + "/" + e.rel;
    ReadOptions o = opt;
    o.progress = offset_progress(opt.progress, base, total);
    if (ends_with(e.rel, ".tzip")) {
      Reader r(p, opt.threads);
      r.verify(orig.empty() ? "" : orig + "/" + default_decompressed_name(e.rel, false), o);
    } else if (!orig.empty()) {
      InFile a(p), b(orig + "/" + e.rel);
      if (a.size() != b.size()) fail(ErrorKind::kBadInput, p + ": differs from " + b.path() + " (size)");
      std::vector<uint8_t> x(1 << 20), y(1 << 20);
      for (uint64_t off = 0; off < a.size();) {
        const size_t n = (size_t)std::min<uint64_t>(x.size(), a.size() - off);
        a.pread_exact(off, x.data(), n);
        b.pread_exact(off, y.data(), n);
        if (std::memcmp(x.data(), y.data(), n) != 0) fail(ErrorKind::kBadInput, p + ": differs from " + b.path());
        off += n;
      }
    }
    base += e.size;
  }
  if (!orig.empty()) {
    walk(orig, "", 0, 0, 0, &orig_entries);
    for (const auto& e : orig_entries) {
      const std::string want = ends_with(e.rel, ".safetensors") && !e.dir ? default_compressed_name(e.rel, false) : e.rel;
      if (path_kind(dir + "/" + want) == PathKind::kMissing)
        fail(ErrorKind::kBadInput, dir + ": " + want + " is missing (present in " + orig + ")");
    }
  }
}

}  // namespace tz::container
