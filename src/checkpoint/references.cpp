#include "references.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <system_error>

#include "container/file_refs.hpp"

namespace tz::checkpoint::detail {

namespace fs = std::filesystem;

SaveReference resolve_save_reference(const std::string& ref, const std::string& dir, int rank) {
  std::string rd = ref;
  while (rd.size() > 1 && rd.back() == '/') rd.pop_back();
  if (!is_complete(rd))
    fail(ErrorKind::kUsage, rd + ": not a complete checkpoint (no valid manifest); it cannot be the reference of " + dir);
  // The manifest records the previous checkpoint by folder name only
  // (depends_on) and the rank file by "../NAME/rank-NNNNN.tzip": it must be
  // a sibling of dir, as the real paths (symbolic links resolved) say.
  std::error_code e1, e2;
  const fs::path real_ref = fs::canonical(rd, e1), real_dir = fs::canonical(dir, e2);
  if (e1 || e2) fail(ErrorKind::kUsage, rd + ": cannot resolve the reference checkpoint's path");
  if (real_ref == real_dir) fail(ErrorKind::kUsage, dir + ": a checkpoint cannot reference itself");
  if (real_ref.parent_path() != real_dir.parent_path())
    fail(ErrorKind::kUsage, rd + ": the reference checkpoint must be a folder beside " + dir +
                                " (in the same parent folder), so that the checkpoint can name it");
  SaveReference out;
  out.depends_on = real_ref.filename().string();
  out.rank_path = rd + "/" + rank_file(rank);
  struct stat st {};
  if (::stat(out.rank_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    fail(ErrorKind::kUsage, out.rank_path + ": missing (the reference checkpoint has no file for rank " +
                                std::to_string(rank) + ")");
  return out;
}

std::vector<std::unique_ptr<tz::container::Reader>> open_rank_references(const std::string& dir,
                                                                         const ManifestRank& r,
                                                                         const std::string& depends_on) {
  namespace refs = tz::container::refs;
  std::vector<std::unique_ptr<tz::container::Reader>> out;
  const std::string self = dir + "/" + r.file;
  for (const auto& mr : r.references) {
    // parse_rank_entry checked the form "../<depends_on>/rank-NNNNN.tzip";
    // resolved, opened (regular files only, never blocking) and identified
    // by the references module, as the container Reader does.
    tz::container::Reference ref;
    ref.file = mr.file;
    ref.xxh64 = mr.xxh64;
    ref.has_header_xxh64 = mr.has_header_xxh64;
    ref.header_xxh64 = mr.header_xxh64;
    std::string rp;
    try {
      rp = refs::resolve(self, ref.file, {});
    } catch (const tz::container::Error& e) {
      fail(ErrorKind::kCorrupt, self + ": " + e.what());
    }
    const std::string who = self + ": needs " + fs::path(rp).lexically_normal().string() +
                            (depends_on.empty() ? std::string() : " (previous checkpoint '" + depends_on + "')");
    struct stat st {};
    if (::stat(rp.c_str(), &st) != 0)
      fail(ErrorKind::kNotFound, who + ", which is missing: the checkpoint depends on it; restore it there");
    if (!S_ISREG(st.st_mode)) fail(ErrorKind::kCorrupt, who + ", which is not a regular file");
    std::unique_ptr<tz::container::Reader> rd;
    try {
      rd = refs::open_reference(self, ref, rp, {}, 1, {});
    } catch (const tz::container::Error& e) {
      fail(ErrorKind::kCorrupt, who + ", which has changed or cannot be read: " + e.what());
    }
    try {
      rd->check_references();
    } catch (const tz::container::Error& e) {
      fail(ErrorKind::kCorrupt, who + ": " + e.what());
    }
    out.push_back(std::move(rd));
  }
  return out;
}

}  // namespace tz::checkpoint::detail
