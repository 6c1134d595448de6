// tzip inspect, verify, bench and --version.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "tensorzip/tensorzip.h"
#include "tzip_cli.hpp"

namespace tzip {

using tc::ErrorKind;

#ifdef TZ_HAVE_CUDA_INFO
std::string cuda_status();  // tzip_cuda_info.cpp
#else
static std::string cuda_status() { return "not built"; }
#endif

int print_version() {
  std::printf("tzip %d.%d.%d (container format %d.%d, frame format %d)\nCPU kernels: %s\nCUDA: %s\n",
              TZ_VERSION_MAJOR, TZ_VERSION_MINOR, TZ_VERSION_PATCH, tc::kTzipVersionMajor, tc::kTzipVersionMinor,
              TZ_FORMAT_VERSION, tz_simd_kernels(), cuda_status().c_str());
  return kExitOk;
}

namespace {

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The .tzip files of the inputs (a folder: every .tzip file in it; one
// without any is an error, as is a missing input).
std::vector<std::string> tzip_files_of(const std::vector<std::string>& inputs) {
  std::vector<std::string> v;
  for (const auto& in : inputs) {
    const tc::PathKind k = tc::path_kind(in);
    if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
    const auto f = files_with_suffix(in, ".tzip");
    if (k == tc::PathKind::kDir && f.empty()) throw tc::Error(ErrorKind::kUsage, in + ": folder holds no .tzip files");
    v.insert(v.end(), f.begin(), f.end());
  }
  return v;
}

}  // namespace

int cmd_inspect(const Args& a) {
  if (a.inputs.empty()) throw UsageError("inspect: give a .tzip file or folder (try 'tzip inspect --help')");
  nlohmann::json all = nlohmann::json::array();
  for (const auto& path : tzip_files_of(a.inputs)) {
    tc::Reader r(path, 1);
    uint64_t raw = 0, comp = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;
    for (const auto& t : r.tensors()) {
      raw += t.raw_size();
      comp += t.compressed_size();
      by_dtype[t.dtype].first += t.raw_size();
      by_dtype[t.dtype].second += t.compressed_size();
    }
    uint64_t gap_raw = 0, gap_comp = 0;
    for (const auto& g : r.gaps()) gap_raw += g.raw_size(), gap_comp += g.compressed_size();
    if (a.json) {
      nlohmann::json j;
      j["file"] = path;
      j["file_size"] = r.file_size();
      j["original_size"] = r.original_size();
      j["created_by"] = r.created_by();
      j["metadata"] = r.metadata();
      j["user_metadata"] = r.user_metadata();
      j["chunk_bytes"] = r.chunk_bytes();
      j["format_version"] = std::to_string(r.version_major()) + "." + std::to_string(r.version_minor());
      nlohmann::json refs = nlohmann::json::array();
      for (const auto& rf : r.references()) {
        char hx[17];
        std::snprintf(hx, sizeof hx, "%016" PRIx64, rf.xxh64);
        refs.push_back({{"file", rf.file}, {"xxh64", hx}});
      }
      j["references"] = refs;
      nlohmann::json ts = nlohmann::json::array();
      for (const auto& t : r.tensors()) {
        nlohmann::json e = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"size", t.raw_size()},
                            {"compressed_size", t.compressed_size()}, {"codec_dtype", tz_dtype_name(t.codec_dtype)},
                            {"level", t.level}, {"block_elems", t.block_elems}, {"frames", t.frames.size()}};
        if (t.predict.kind != tc::PredictKind::kNone) {
          nlohmann::json p = {{"kind", t.predict.kind == tc::PredictKind::kCast ? "cast" : "delta"}};
          p["source"] = t.predict.kind == tc::PredictKind::kCast ? t.predict.source : t.name;
          p["file"] = t.predict.ref < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.references()[t.predict.ref].file);
          e["predict"] = p;
        }
        ts.push_back(e);
      }
      j["tensors"] = ts;
      j["gaps"] = {{"count", r.gaps().size()}, {"size", gap_raw}, {"compressed_size", gap_comp}};
      j["ratio"] = r.file_size() ? (double)r.original_size() / r.file_size() : 0.0;
      all.push_back(j);
      continue;
    }
    // Names, metadata and paths come from the file: printed through printable().
    const auto P = [](const std::string& s) { return tc::printable(s); };
    std::printf("%s: %zu tensors, %s original, %s compressed, ratio %s (%s)\n", P(path).c_str(), r.tensors().size(),
                human(r.original_size()).c_str(), human(r.file_size()).c_str(),
                ratio_str(r.original_size(), r.file_size()).c_str(), P(r.created_by()).c_str());
    size_t w = 4;
    for (const auto& t : r.tensors()) w = std::max(w, P(t.name).size());
    w = std::min<size_t>(w, 60);
    std::printf("  %-*s  %-7s  %-20s  %12s  %12s  %6s%s  %s\n", (int)w, "name", "dtype", "shape", "bytes", "compressed",
                "ratio", verbosity >= 2 ? "  codec    level  block  frames" : "", "predicted from");
    for (const auto& t : r.tensors()) {
      std::printf("  %-*s  %-7s  %-20s  %12" PRIu64 "  %12" PRIu64 "  %6s", (int)w, P(t.name).c_str(), P(t.dtype).c_str(),
                  shape_str(t.shape).c_str(), t.raw_size(), t.compressed_size(),
                  ratio_str(t.raw_size(), t.compressed_size()).c_str());
      if (verbosity >= 2)
        std::printf("  %-7s  %5d  %5u  %6zu", tz_dtype_name(t.codec_dtype), t.level, t.block_elems, t.frames.size());
      if (t.predict.kind == tc::PredictKind::kCast)
        std::printf("  cast of %s%s", P(t.predict.source).c_str(),
                    t.predict.ref < 0 ? " (this file)" : (" in " + P(r.references()[t.predict.ref].file)).c_str());
      else if (t.predict.kind == tc::PredictKind::kDelta)
        std::printf("  delta vs %s", P(r.references()[t.predict.ref].file).c_str());
      std::printf("\n");
    }
    for (const auto& [dt, s] : by_dtype)
      std::printf("  total %-7s %s -> %s, ratio %s\n", P(dt).c_str(), human(s.first).c_str(), human(s.second).c_str(),
                  ratio_str(s.first, s.second).c_str());
    for (const auto& [k, v] : r.user_metadata()) std::printf("  user metadata: %s = %s\n", P(k).c_str(), P(v).c_str());
    for (const auto& rf : r.references())
      std::printf("  needs reference: %s (xxh64 %016" PRIx64 ")\n", P(rf.file).c_str(), rf.xxh64);
    if (r.version_major() >= 2) {
      size_t nc = 0, nd = 0;
      for (const auto& t : r.tensors())
        nc += t.predict.kind == tc::PredictKind::kCast, nd += t.predict.kind == tc::PredictKind::kDelta;
      std::printf("  predicted tensors: %zu cast, %zu delta (format version %u.%u)\n", nc, nd, r.version_major(),
                  r.version_minor());
    }
    if (!r.gaps().empty())
      std::printf("  gaps: %zu, %" PRIu64 " bytes (kept for a byte-identical export)\n", r.gaps().size(), gap_raw);
    std::printf("  total: tensors %s -> %s (ratio %s); file %s -> %s (ratio %s)\n", human(raw).c_str(),
                human(comp).c_str(), ratio_str(raw, comp).c_str(), human(r.original_size()).c_str(),
                human(r.file_size()).c_str(), ratio_str(r.original_size(), r.file_size()).c_str());
  }
  if (a.json) std::printf("%s\n", (all.size() == 1 && a.inputs.size() == 1 && tc::path_kind(a.inputs[0]) == tc::PathKind::kFile ? all[0] : all).dump(2, ' ', true).c_str());  // ASCII: names' control characters as \u escapes
  return kExitOk;
}


int cmd_verify(const Args& a) {
  if (a.inputs.empty()) throw UsageError("verify: give a .tzip file or folder (try 'tzip verify --help')");
  if (!a.against.empty() && a.inputs.size() > 1) throw UsageError("verify: --against takes one input");
  if (!a.against.empty() && tc::path_kind(a.against) == tc::PathKind::kMissing)
    throw tc::Error(ErrorKind::kIO, a.against + ": no such file or folder");
  // Every input is checked; the first failure decides the exit status.
  std::exception_ptr first;
  for (const auto& in : a.inputs) {
    try {
      const tc::PathKind k = tc::path_kind(in);
      if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
      tc::ReadOptions o;
      o.threads = a.threads;
      o.refs = a.refs;
      Progress bar(in);
      o.progress = bar.fn();
      if (k == tc::PathKind::kDir) {
        if (!a.refs.empty()) throw UsageError("--ref applies to a single .tzip file (a folder uses its recorded paths)");
        tc::verify_folder(in, a.against, o);
      } else {
        if (!a.against.empty() && tc::path_kind(a.against) == tc::PathKind::kDir)
          throw tc::Error(ErrorKind::kUsage, a.against + ": is a folder, expected the original file");
        tc::Reader r(in, a.threads);
        r.verify(a.against, o);
      }
      bar.finish();
      say(in + ": OK" + (a.against.empty() ? std::string(" (all checksums verified)") : ", identical to " + a.against));
    } catch (const std::exception& e) {
      if (a.inputs.size() == 1) throw;
      std::fprintf(stderr, "tzip: %s\n", tc::printable(e.what()).c_str());
      if (!first) first = std::current_exception();
    }
  }
  if (first) {
    try {
      std::rethrow_exception(first);
    } catch (const tc::Error& e) {
      return e.kind() == ErrorKind::kBadInput ? kExitBadInput : e.kind() == ErrorKind::kIO ? kExitIO : kExitUsage;
    } catch (const UsageError&) {
      return kExitUsage;
    }
  }
  return kExitOk;
}

namespace {
// ---- bench -----------------------------------------------------------------
struct BenchUnit {
  std::string dtype;
  tz_dtype codec;
  std::vector<uint8_t> raw;
  std::vector<uint8_t> comp;
  size_t comp_size = 0;
};

template <class F>
double parallel_time(size_t n, unsigned threads, F&& f) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const double t0 = now_s();
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      for (size_t i; (i = next++) < n;)
        if (!f(i, w)) failed = true;
    });
  for (auto& t : pool) t.join();
  if (failed) throw tc::Error(ErrorKind::kInternal, "bench: codec failure");
  return now_s() - t0;
}

}  // namespace

int cmd_bench(const Args& a) {
  if (a.inputs.empty()) throw UsageError("bench: give a safetensors file or folder (try 'tzip bench --help')");
  const unsigned threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t cap = a.max_mib << 20, chunk = 4u << 20;
  std::vector<BenchUnit> units;
  uint64_t loaded = 0;
  std::vector<std::string> files;
  for (const auto& in : a.inputs) {
    if (tc::path_kind(in) == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
    const auto f = files_with_suffix(in, ".safetensors");
    if (f.empty()) throw tc::Error(ErrorKind::kUsage, in + ": no .safetensors files found");
    files.insert(files.end(), f.begin(), f.end());
  }
  const std::string in = a.inputs.size() == 1 ? a.inputs[0] : std::to_string(a.inputs.size()) + " inputs";
  for (const auto& f : files) {
    const tc::SafetensorsInfo st = tc::read_safetensors_info(f);
    FILE* fp = std::fopen(f.c_str(), "rb");
    if (!fp) throw tc::Error(ErrorKind::kIO, f + ": cannot open: " + std::strerror(errno));
    std::unique_ptr<FILE, int (*)(FILE*)> guard(fp, &std::fclose);
    for (const auto& t : st.tensors) {
      for (uint64_t off = 0; off < t.raw_size() && loaded < cap; off += chunk) {
        BenchUnit u;
        u.dtype = t.dtype;
        u.codec = t.codec_dtype;
        u.raw.resize(std::min(chunk, t.raw_size() - off));
        if (fseeko(fp, (off_t)(st.data_start + t.data_begin + off), SEEK_SET) != 0 ||
            std::fread(u.raw.data(), 1, u.raw.size(), fp) != u.raw.size())
          throw tc::Error(ErrorKind::kIO, f + ": read failed");
        u.comp.resize(tz_compress_bound(u.raw.size()));
        loaded += u.raw.size();
        units.push_back(std::move(u));
      }
    }
  }
  if (loaded == 0) throw tc::Error(ErrorKind::kUsage, in + ": no tensor data");
  std::vector<std::string> dtypes;
  for (const auto& u : units)
    if (std::find(dtypes.begin(), dtypes.end(), u.dtype) == dtypes.end()) dtypes.push_back(u.dtype);
  std::printf("tzip bench: %s, %zu file(s), %s of tensor data in %zu chunks, %u thread(s)\n", in.c_str(), files.size(),
              human(loaded).c_str(), units.size(), threads);
  // One column per dtype, as wide as its title ("BF16 ratio", "F8_E4M3 ratio").
  std::vector<int> width;
  std::printf("%-6s %8s", "level", "ratio");
  for (const auto& d : dtypes) {
    width.push_back(std::max<int>(9, (int)d.size() + 6));
    std::printf(" %*s", width.back(), (d + " ratio").c_str());
  }
  std::printf(" %12s %12s\n", "comp GB/s", "decomp GB/s");
  std::vector<tz_ctx*> ctx;
  for (unsigned w = 0; w < threads; ++w) ctx.push_back(tz_ctx_create(1));
  std::vector<std::vector<uint8_t>> scratch(threads, std::vector<uint8_t>(chunk));
  const std::vector<int> levels = a.levels.empty() ? std::vector<int>{-1, 1, 2, 3} : a.levels;
  for (int level : levels) {
    const double tc_ = parallel_time(units.size(), threads, [&](size_t i, unsigned w) {
      tz_params p{};
      p.dtype = units[i].codec;
      p.level = level;
      p.threads = 1;
      const size_t r = tz_ctx_compress(ctx[w], units[i].comp.data(), units[i].comp.size(), units[i].raw.data(),
                                       units[i].raw.size(), &p);
      units[i].comp_size = r;
      return !tz_is_error(r);
    });
    const double td = parallel_time(units.size(), threads, [&](size_t i, unsigned w) {
      const size_t r = tz_ctx_decompress(ctx[w], scratch[w].data(), scratch[w].size(), units[i].comp.data(),
                                         units[i].comp_size);
      return !tz_is_error(r) && r == units[i].raw.size() &&
             std::memcmp(scratch[w].data(), units[i].raw.data(), r) == 0;
    });
    uint64_t comp = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> by;
    for (const auto& u : units) {
      comp += u.comp_size;
      by[u.dtype].first += u.raw.size();
      by[u.dtype].second += u.comp_size;
    }
    std::printf("%-6d %8s", level, ratio_str(loaded, comp).c_str());
    for (size_t di = 0; di < dtypes.size(); ++di)
      std::printf(" %*s", width[di], ratio_str(by[dtypes[di]].first, by[dtypes[di]].second).c_str());
    std::printf(" %12.2f %12.2f\n", loaded / tc_ / 1e9, loaded / td / 1e9);
    std::fflush(stdout);
  }
  for (auto* c : ctx) tz_ctx_free(c);
  return kExitOk;
}

}  // namespace tzip
