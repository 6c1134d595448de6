// io_bench: checkpoint save and load through the tensorzip I/O engine versus
// plain pwrite/pread of the same bytes, on real tensors tiled to a target
// size, with the engine's options side by side (cast prediction on/off,
// O_DIRECT writes on/off, codec auto, async), a raw pwrite and a safetensors
// file written from the same buffers. Results go to bench/experiments/notebook.md
// ("Checkpoint I/O"); bench/io_bench.py measures torch.save and the
// safetensors library on the same data.
//
//   tz_io_bench --fixtures DIR --gib 4 --dir /path/on/disk [--dir /dev/shm/x] [--threads N] [--gpu]
//   (--gpu, CUDA builds: save from / load into GPU memory, with and without Io::kGds)
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

#ifdef TZ_IO_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

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

// --gpu (CUDA builds): the same tensors in device memory; save from it
// (batched GPU encode) and load into it (batched GPU decode), with the
// POSIX/io_uring back end and with Io::kGds (cuFile where present).
bool gpu_rows(const std::vector<std::string>& dirs, const std::vector<ck::TensorView>& host,
              std::vector<std::vector<uint8_t>>& mem, const std::vector<Owned>& base, double S, unsigned threads) {
#ifdef TZ_IO_BENCH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("--gpu: no CUDA device\n");
    return false;
  }
  std::vector<void*> dev(host.size(), nullptr);
  std::vector<ck::TensorView> dv = host;
  for (size_t i = 0; i < host.size(); ++i) {
    if (cudaMalloc(&dev[i], host[i].size ? host[i].size : 1) != cudaSuccess ||
        cudaMemcpy(dev[i], host[i].data, host[i].size, cudaMemcpyHostToDevice) != cudaSuccess) {
      std::printf("--gpu: cudaMalloc/cudaMemcpy failed\n");
      return false;
    }
    dv[i].data = dev[i];
    dv[i].memory = ck::Memory::kDevice;
  }
  bool ok = true;
  for (const auto& root : dirs) {
    fs::create_directories(root);
    const std::string where = root.rfind("/dev/shm", 0) == 0 ? "tmpfs" : "disk";
    for (ck::Io io : {ck::Io::kAuto, ck::Io::kGds}) {
      const std::string dir = root + "/tz-gpu";
      fs::remove_all(dir);
      ck::SaveOptions o;
      o.codec = ck::Codec::kFast;
      o.threads = threads;
      o.io = io;
      const auto st = ck::save(dir, dv, o);
      const double ratio = (double)st.raw_bytes / (double)st.file_bytes;
      row(where.c_str(), io == ck::Io::kGds ? "tensorzip sync save from GPU memory, fast, Io::kGds" : "tensorzip sync save from GPU memory, fast",
          S, st.seconds, st.stall_seconds, ratio, st.io);
      ck::AsyncSaver saver;
      for (int rep = 0; rep < 2; ++rep) {
        fs::remove_all(dir);
        const auto t1 = Clock::now();
        saver.save(dir, dv, o);
        const double stall = since(t1);
        const auto ast = saver.wait();
        if (rep) row(where.c_str(), "tensorzip async save from GPU memory (pinned staging reused)", S, ast.seconds, stall,
                     ratio, ast.io);
      }
      drop_cache(dir + "/rank-00000.tzip");
      ck::Checkpoint c(dir, threads, false, io);
      for (size_t i = 0; i < dev.size(); ++i) cudaMemset(dev[i], 0x5a, dv[i].size);
      std::vector<ck::LoadRequest> req;
      for (size_t i = 0; i < dv.size(); ++i) req.push_back({dv[i].name, dev[i], dv[i].size, ck::Memory::kDevice});
      const auto t0 = Clock::now();
      c.load(req);
      cudaDeviceSynchronize();
      const double tl = since(t0);
      bool same = true;
      for (size_t i = 0; i < dv.size() && same; ++i) {
        if (cudaMemcpy(mem[i].data(), dev[i], mem[i].size(), cudaMemcpyDeviceToHost) != cudaSuccess) same = false;
        else same = std::memcmp(mem[i].data(), base[i % base.size()].bytes.data(), mem[i].size()) == 0;
      }
      ok = ok && same;
      row(where.c_str(), io == ck::Io::kGds ? "tensorzip load into GPU memory, Io::kGds" : "tensorzip load into GPU memory",
          S, tl, 0, ratio, c.io() + (same ? "; verified" : "; MISMATCH"));
      fs::remove_all(dir);
    }
  }
  for (void* p : dev) cudaFree(p);
  return ok;
#else
  (void)dirs, (void)host, (void)mem, (void)base, (void)S, (void)threads;
  std::printf("--gpu: this build has no CUDA backend\n");
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string fixtures;
  double gib = 4;
  unsigned threads = 0;
  std::vector<std::string> dirs;
  bool gpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fixtures" && i + 1 < argc) fixtures = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = std::stod(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = (unsigned)std::stoul(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dirs.push_back(argv[++i]);
    else if (a == "--gpu") gpu = true;
    else {
      std::fprintf(stderr, "usage: tz_io_bench --fixtures DIR [--gib N] [--threads N] [--gpu] --dir PATH...\n");
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
  if (gpu) return gpu_rows(dirs, views, mem, base, S, threads) ? 0 : 1;
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
    // 2. safetensors layout written the way safetensors' save_file does
    //    (8-byte length, JSON header, tensor bytes), here with pwrite from
    //    the tensors' own buffers + fsync; load = pread of every tensor.
    {
      std::string hdr = "{";
      uint64_t off = 0;
      for (const auto& v : views) {
        std::string shape;
        for (size_t k = 0; k < v.shape.size(); ++k) {
          if (k) shape += ",";
          shape += std::to_string(v.shape[k]);
        }
        if (hdr.size() > 1) hdr += ",";
        hdr += "\"";
        hdr += v.name;
        hdr += "\":{\"dtype\":\"";
        hdr += v.dtype;
        hdr += "\",\"shape\":[";
        hdr += shape;
        hdr += "],\"data_offsets\":[";
        hdr += std::to_string(off);
        hdr += ",";
        hdr += std::to_string(off + v.size);
        hdr += "]}";
        off += v.size;
      }
      hdr += "}";
      while (hdr.size() % 8) hdr += ' ';
      const std::string stp = root + "/bench.safetensors";
      const auto t0 = Clock::now();
      const int fd = ::open(stp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      uint8_t len[8];
      for (int k = 0; k < 8; ++k) len[k] = (uint8_t)((uint64_t)hdr.size() >> (8 * k));
      bool ok = ::pwrite(fd, len, 8, 0) == 8 && ::pwrite(fd, hdr.data(), hdr.size(), 8) == (ssize_t)hdr.size();
      uint64_t pos = 8 + hdr.size();
      for (const auto& v : views)
        for (uint64_t o = 0; o < v.size && ok; o += 4u << 20) {
          const size_t n = (size_t)std::min<uint64_t>(4u << 20, v.size - o);
          ok = ::pwrite(fd, static_cast<const uint8_t*>(v.data) + o, n, (off_t)pos) == (ssize_t)n;
          pos += n;
        }
      ::fsync(fd);
      ::close(fd);
      fsync_dir(root);
      const double ts = since(t0);
      row(where.c_str(), "safetensors file, C++ pwrite + fsync (save)", S, ts, ts, 0,
          ok ? "same layout as save_file; torch/safetensors library rows: io_bench.py" : "WRITE FAILED");
      // Must parse as a safetensors file.
      const auto info = tz::container::read_safetensors_info(stp);
      drop_cache(stp);
      clobber();
      const auto t1 = Clock::now();
      const int rfd = ::open(stp.c_str(), O_RDONLY);
      for (size_t i = 0; i < info.tensors.size(); ++i)
        if (::pread(rfd, mem[i].data(), mem[i].size(), (off_t)(info.data_start + info.tensors[i].data_begin)) !=
            (ssize_t)mem[i].size())
          ok = false;
      ::close(rfd);
      const double tl = since(t1);
      row(where.c_str(), "safetensors file, pread per tensor (load)", S, tl, 0, 0,
          ok && check() ? "page cache dropped first; verified" : "MISMATCH");
      fs::remove(stp);
    }
    // 3. tensorzip: codec fast with cast prediction on/off x O_DIRECT
    //    writes off/on, codec auto, async; each restored (buffered reads
    //    through the read queue; one also with O_DIRECT reads).
    struct Variant {
      const char* label;
      ck::Codec codec;
      bool predict, direct, async;
    };
    const Variant variants[] = {
        {"fast, predict off, buffered", ck::Codec::kFast, false, false, false},
        {"fast, predict on, buffered", ck::Codec::kFast, true, false, false},
        {"fast, predict off, O_DIRECT", ck::Codec::kFast, false, true, false},
        {"fast, predict on, O_DIRECT", ck::Codec::kFast, true, true, false},
        {"auto, predict on, buffered", ck::Codec::kAuto, true, false, false},
        {"async fast, predict on, buffered", ck::Codec::kFast, true, false, true},
    };
    double t_sync_best = 1e30, ratio_best = 0, stall_async = 0;
    for (const auto& vr : variants) {
      const std::string dir = root + "/tz";
      fs::remove_all(dir);
      ck::SaveOptions o;
      o.codec = vr.codec;
      o.threads = threads;
      o.predict = vr.predict;
      o.direct_io = vr.direct;
      std::string model;
      o.log = [&](const std::string& s) {
        if (s.rfind("codec", 0) == 0) model = s;
      };
      ck::SaveStats st;
      double stall = 0;
      if (vr.async) {
        ck::AsyncSaver saver;
        // The first save allocates (page-faults) the staging area; the
        // second reuses it, as every later checkpoint of a run does.
        for (int rep = 0; rep < 2; ++rep) {
          fs::remove_all(dir);
          const auto t1 = Clock::now();
          saver.save(dir, views, o);
          stall = since(t1);
          st = saver.wait();
          if (rep == 0) {
            row(where.c_str(), "tensorzip async save, fast, predict on (first: allocates staging)", S, st.seconds, stall,
                (double)st.raw_bytes / (double)st.file_bytes, st.io);
          }
        }
        stall_async = stall;
      } else {
        st = ck::save(dir, views, o);
        stall = st.stall_seconds;
      }
      const double ratio = (double)st.raw_bytes / (double)st.file_bytes;
      row(where.c_str(), (std::string("tensorzip ") + (vr.async ? "" : "sync ") + "save, " + vr.label).c_str(), S,
          st.seconds, stall, ratio,
          "chose " + st.codec + ", io " + st.io + ", " + std::to_string(st.predicted) + " cast-predicted tensors");
      if (vr.codec == ck::Codec::kAuto) std::printf("  time model: %s\n", model.c_str());
      if (!vr.async && vr.codec == ck::Codec::kFast && st.seconds < t_sync_best) t_sync_best = st.seconds, ratio_best = ratio;
      std::vector<ck::LoadRequest> req;
      for (size_t i = 0; i < views.size(); ++i) req.push_back({views[i].name, mem[i].data(), mem[i].size()});
      for (bool rdirect : {false, true}) {
        if (rdirect && !(vr.predict && vr.direct && !vr.async)) continue;
        drop_cache(dir + "/rank-00000.tzip");
        ck::Checkpoint ckp(dir, threads, rdirect);
        clobber();
        const auto t0 = Clock::now();
        ckp.load(req);
        const double tl = since(t0);
        row(where.c_str(), (std::string("tensorzip load (") + vr.label + (rdirect ? ", O_DIRECT reads" : "") + ")").c_str(),
            S, tl, 0, ratio,
            "reads " + ckp.io() + (rdirect ? (ckp.direct_io() ? " O_DIRECT" : " (O_DIRECT refused)") : "") +
                (check() ? "; page cache dropped first; verified" : "; MISMATCH"));
      }
      fs::remove_all(dir);
    }
    std::printf("  target check (%s): raw write %.2f s; best sync fast save %.2f s vs raw/ratio %.2f s -> %s; "
                "async stall %.3f s = %.1f%% of raw write -> %s\n",
                where.c_str(), t_raw, t_sync_best, t_raw / ratio_best, t_sync_best <= t_raw / ratio_best ? "met" : "not met",
                stall_async, 100 * stall_async / t_raw, stall_async < 0.1 * t_raw ? "met" : "not met");
  }
  return 0;
}
