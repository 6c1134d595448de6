// io_bench: checkpoint save and load through the tensorzip I/O engine versus
// plain pwrite/pread of the same bytes, on real tensors tiled to a target
// size. Results go to bench/RESULTS.md ("Checkpoint I/O"); bench/io_bench.py
// measures torch.save and safetensors on the same data.
//
//   tz_io_bench --fixtures DIR --gib 4 --dir /path/on/disk [--dir /dev/shm/x] [--threads N]
//
// Every save ends with fsync of its files (and of the folder); before each
// load the files are dropped from the page cache (posix_fadvise DONTNEED) so
// that a disk load reads the disk (tmpfs has no cache to drop).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tensorzip/checkpoint.hpp"
#include "tensorzip/container.hpp"

namespace fs = std::filesystem;
namespace ck = tz::checkpoint;
using Clock = std::chrono::steady_clock;

namespace {

struct Owned {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Owned> load_file(const std::string& path) {
  const auto st = tz::container::read_safetensors_info(path);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open");
  std::vector<Owned> out;
  for (const auto& t : st.tensors) {
    Owned o{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.raw_size())};
    if (::pread(fd, o.bytes.data(), o.bytes.size(), (off_t)(st.data_start + t.data_begin)) != (ssize_t)o.bytes.size())
      throw std::runtime_error(path + ": short read");
    out.push_back(std::move(o));
  }
  ::close(fd);
  return out;
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void fsync_dir(const std::string& d) {
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) ::fsync(fd), ::close(fd);
}

void row(const char* where, const char* what, double bytes, double secs, double stall, double ratio, const std::string& note) {
  std::printf("| %s | %s | %.2f | %.2f | %.2f | %s | %s |\n", where, what, secs, bytes / secs / 1e9,
              stall, ratio > 0 ? std::to_string(ratio).substr(0, 5).c_str() : "1", note.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string fixtures;
  double gib = 4;
  unsigned threads = 0;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fixtures" && i + 1 < argc) fixtures = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = std::stod(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = (unsigned)std::stoul(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dirs.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: tz_io_bench --fixtures DIR [--gib N] [--threads N] --dir PATH...\n");
      return 1;
    }
  }
  if (fixtures.empty() || dirs.empty()) {
    std::fprintf(stderr, "usage: tz_io_bench --fixtures DIR [--gib N] [--threads N] --dir PATH...\n");
    return 1;
  }
  // The real checkpoint (BF16 model + FP32 master/Adam), tiled: tile k is a
  // copy of every tensor, named "tK.<name>". Copies, not aliases, so that no
  // method reads a few MB of cache-resident memory over and over. Loads go
  // back into these buffers (as a trainer restores into its parameters) and
  // are then compared with the originals.
  std::vector<Owned> base = load_file(fixtures + "/gpt-small-step400-model-bf16.safetensors");
  for (auto& t : load_file(fixtures + "/gpt-small-step400-optim-fp32.safetensors")) base.push_back(std::move(t));
  uint64_t base_bytes = 0;
  for (const auto& t : base) base_bytes += t.bytes.size();
  const uint64_t target = (uint64_t)(gib * (1ull << 30));
  const unsigned tiles = (unsigned)((target + base_bytes - 1) / base_bytes);
  std::vector<std::vector<uint8_t>> mem;
  std::vector<ck::TensorView> views;
  mem.reserve((size_t)tiles * base.size());
  for (unsigned k = 0; k < tiles; ++k)
    for (const auto& t : base) {
      mem.push_back(t.bytes);
      views.push_back({"t" + std::to_string(k) + "." + t.name, t.dtype, t.shape, mem.back().data(), t.bytes.size()});
    }
  const double S = (double)base_bytes * tiles;
  std::printf("data: %u tiles of the step-400 fixture checkpoint (%.1f MB each) = %zu tensors, %.3f GB (%.3f GiB)\n",
              tiles, base_bytes / 1e6, views.size(), S / 1e9, S / (1ull << 30));
  auto clobber = [&] {
    for (auto& m : mem) std::memset(m.data(), 0x5a, m.size());
  };
  auto check = [&]() -> bool {
    for (size_t i = 0; i < mem.size(); ++i)
      if (std::memcmp(mem[i].data(), base[i % base.size()].bytes.data(), mem[i].size()) != 0) return false;
    return true;
  };

  std::printf("| storage | method | seconds | GB/s (raw bytes) | stall s | ratio | notes |\n|---|---|---|---|---|---|---|\n");
  for (const auto& root : dirs) {
    fs::create_directories(root);
    const std::string where = root.rfind("/dev/shm", 0) == 0 ? "tmpfs" : "disk";
    // 1. raw: one file, pwrite of every tensor in 4 MiB pieces, fsync.
    const std::string raw = root + "/raw.bin";
    double t_raw = 0;
    {
      const auto t0 = Clock::now();
      const int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      uint64_t off = 0;
      for (const auto& v : views)
        for (uint64_t o = 0; o < v.size; o += 4u << 20) {
          const size_t n = (size_t)std::min<uint64_t>(4u << 20, v.size - o);
          if (::pwrite(fd, static_cast<const uint8_t*>(v.data) + o, n, (off_t)off) != (ssize_t)n) {
            std::perror("pwrite");
            return 1;
          }
          off += n;
        }
      ::fsync(fd);
      ::close(fd);
      fsync_dir(root);
      t_raw = since(t0);
      row(where.c_str(), "raw pwrite + fsync (save)", S, t_raw, t_raw, 0, "one file, 4 MiB writes");
    }
    drop_cache(raw);
    clobber();
    {
      const auto t0 = Clock::now();
      const int fd = ::open(raw.c_str(), O_RDONLY);
      uint64_t off = 0;
      for (size_t i = 0; i < mem.size(); ++i)
        for (uint64_t o = 0; o < mem[i].size(); o += 4u << 20) {
          const size_t n = (size_t)std::min<uint64_t>(4u << 20, mem[i].size() - o);
          if (::pread(fd, mem[i].data() + o, n, (off_t)off) != (ssize_t)n) return 1;
          off += n;
        }
      ::close(fd);
      const double tl = since(t0);
      row(where.c_str(), "raw pread (load)", S, tl, 0, 0, check() ? "page cache dropped first; verified" : "MISMATCH");
    }
    fs::remove(raw);
    // 2. tensorzip: auto codec (bandwidth probed), forced fast, async.
    const ck::Codec codecs[] = {ck::Codec::kAuto, ck::Codec::kFast};
    for (const ck::Codec c : codecs) {
      const std::string dir = root + (c == ck::Codec::kAuto ? "/tz-auto" : "/tz-fast");
      fs::remove_all(dir);
      ck::SaveOptions o;
      o.codec = c;
      o.threads = threads;
      std::string model;
      o.log = [&](const std::string& s) {
        if (s.rfind("codec", 0) == 0) model = s;
      };
      const auto st = ck::save(dir, views, o);
      const double ratio = (double)st.raw_bytes / (double)st.file_bytes;
      row(where.c_str(), (std::string("tensorzip sync save, codec ") + (c == ck::Codec::kAuto ? "auto" : "fast")).c_str(),
          S, st.seconds, st.stall_seconds, ratio, "chose " + st.codec + ", " + st.io);
      std::printf("  time model: %s\n", model.c_str());
      drop_cache(dir + "/rank-00000.tzip");
      ck::Checkpoint ckp(dir, threads);
      std::vector<ck::LoadRequest> req;
      for (size_t i = 0; i < views.size(); ++i) req.push_back({views[i].name, mem[i].data(), mem[i].size()});
      clobber();
      const auto t0 = Clock::now();
      ckp.load(req);
      const double tl = since(t0);
      row(where.c_str(), (std::string("tensorzip load, codec ") + st.codec).c_str(), S, tl, 0, ratio,
          check() ? "page cache dropped first; verified" : "MISMATCH");
      {
        drop_cache(dir + "/rank-00000.tzip");
        ck::Checkpoint ckd(dir, threads, /*direct_io=*/true);
        clobber();
        const auto t2 = Clock::now();
        ckd.load(req);
        const double td = since(t2);
        row(where.c_str(), (std::string("tensorzip load O_DIRECT, codec ") + st.codec).c_str(), S, td, 0, ratio,
            std::string(ckd.direct_io() ? "O_DIRECT" : "O_DIRECT refused: buffered") +
                (check() ? "; verified" : "; MISMATCH"));
      }
      if (c == ck::Codec::kFast) {
        const std::string adir = root + "/tz-async";
        fs::remove_all(adir);
        ck::AsyncSaver saver;
        // First save allocates (page-faults) the staging area; the second
        // reuses it, as every later checkpoint of a training run does.
        double stall = 0;
        for (int rep = 0; rep < 2; ++rep) {
          fs::remove_all(adir);
          const auto t1 = Clock::now();
          saver.save(adir, views, o);
          stall = since(t1);
          const auto ast = saver.wait();
          row(where.c_str(), rep ? "tensorzip async save (staging reused)" : "tensorzip async save (first: allocates staging)",
              S, ast.seconds, stall, (double)ast.raw_bytes / (double)ast.file_bytes,
              "codec fast; stall = staging copy; seconds = until durable");
        }
        std::printf("  target check (%s): raw write %.2f s; sync fast %.2f s vs raw/ratio %.2f s -> %s; "
                    "async stall %.3f s = %.1f%% of raw write -> %s\n",
                    where.c_str(), t_raw, st.seconds, t_raw / ratio,
                    st.seconds <= t_raw / ratio ? "met" : "not met", stall, 100 * stall / t_raw,
                    stall < 0.1 * t_raw ? "met" : "not met");
        fs::remove_all(adir);
      }
      fs::remove_all(dir);
    }
  }
  return 0;
}
