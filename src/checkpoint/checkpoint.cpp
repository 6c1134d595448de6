// Checkpoint save/restore pipeline (doc/checkpoint.md).
//
// Save: tensors are cut into chunks of chunk_bytes (the .tzip chunking);
// `threads` workers encode chunks (one single-threaded tz_ctx each) into a
// ring of `slots` reusable buffers, while the writer thread, in data order,
// hashes each finished frame and queues it on the storage back end
// (src/io/write_queue.hpp); a slot is reused once its write completed. So
// encode of chunk k+1.. overlaps the write of chunk k, and memory is
// slots x tz_compress_bound(chunk_bytes) whatever the checkpoint size.
// The rank file is a valid .tzip container (doc/container.md sections 2-3),
// written under a temporary name, fsync'd and renamed; the manifest, which
// also indexes every frame so that restore needs nothing else, is written
// last with temp + fsync + rename + fsync(dir).
#include "tensorzip/checkpoint.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../io/write_queue.hpp"
#include "plan.hpp"
#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"

#ifdef TZ_CHECKPOINT_CUDA
#include <cuda_runtime_api.h>

#include "tensorzip/tensorzip_cuda.h"
#endif

namespace tz::checkpoint {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

[[noreturn]] void fail(ErrorKind k, const std::string& m) { throw Error(k, m); }
[[noreturn]] void fail_errno(const std::string& path, const std::string& what, int err) {
  const ErrorKind k = (err == ENOSPC || err == EFBIG || err == EDQUOT) ? ErrorKind::kNoSpace : ErrorKind::kIO;
  fail(k, path + ": " + what + ": " + std::strerror(err));
}

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}
uint64_t parse_hex64(const std::string& s) {
  if (s.size() != 16) fail(ErrorKind::kCorrupt, "bad hash '" + s + "'");
  uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) fail(ErrorKind::kCorrupt, "bad hash '" + s + "'");
    v = (v << 4) | (uint64_t)d;
  }
  return v;
}

const char* codec_dtype_str(tz_dtype d) {
  switch (d) {
    case TZ_DTYPE_BF16: return "bf16";
    case TZ_DTYPE_F16: return "f16";
    case TZ_DTYPE_F32: return "f32";
    case TZ_DTYPE_F8_E4M3: return "f8_e4m3";
    case TZ_DTYPE_F8_E5M2: return "f8_e5m2";
    default: return "bytes";
  }
}

void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t align64(uint64_t x) { return (x + 63) & ~uint64_t{63}; }

std::string rank_file(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.tzip", rank);
  return b;
}
std::string rank_index(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.json", rank);
  return b;
}

void fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail_errno(p, "open for fsync", errno);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail_errno(p, "fsync", e);
  }
  ::close(fd);
}

// Writes `text` to dir/name atomically: temp + fsync + rename + fsync(dir).
void write_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp-" + std::to_string(::getpid());
  const std::string fin = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(tmp, "create", errno);
  int err = tz::io::pwrite_full(fd, text.data(), text.size(), 0);
  if (!err && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (!err && ::rename(tmp.c_str(), fin.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    fail_errno(fin, "write", err);
  }
  fsync_path(dir, true);
}

std::string read_small(const std::string& path, ErrorKind missing_kind) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail(missing_kind, path + ": missing");
    fail_errno(path, "open", e);
  }
  struct stat st {};
  ::fstat(fd, &st);
  if (st.st_size > (off_t)(1ll << 32)) {
    ::close(fd);
    fail(ErrorKind::kCorrupt, path + ": too large");
  }
  std::string s((size_t)st.st_size, '\0');
  const int err = tz::io::pread_full(fd, s.data(), s.size(), 0);
  ::close(fd);
  if (err) fail_errno(path, "read", err);
  return s;
}

// The manifest wraps its body with a hash of the body's canonical dump, so a
// torn or edited manifest is detected before any of it is used.
std::string wrap_manifest(const json& body) {
  const std::string d = body.dump();
  return json{{"format", "tensorzip-checkpoint"}, {"version", 1}, {"body_xxh64", hex64(XXH64(d.data(), d.size(), 0))},
              {"body", body}}
             .dump(1) +
         "\n";
}

json unwrap_manifest(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(ErrorKind::kCorrupt, what + ": manifest is not valid JSON");
  }
  if (!j.is_object() || j.value("format", "") != "tensorzip-checkpoint" || !j.contains("body") ||
      !j["body"].is_object() || !j.contains("body_xxh64") || !j["body_xxh64"].is_string())
    fail(ErrorKind::kCorrupt, what + ": not a tensorzip checkpoint manifest");
  if (j.value("version", 0) != 1) fail(ErrorKind::kCorrupt, what + ": unsupported manifest version");
  const std::string d = j["body"].dump();
  if (XXH64(d.data(), d.size(), 0) != parse_hex64(j["body_xxh64"].get<std::string>()))
    fail(ErrorKind::kCorrupt, what + ": manifest checksum mismatch");
  return j["body"];
}

// ---- codec choice for kAuto ----------------------------------------------
std::mutex g_bw_mu;
std::map<std::string, double> g_bw_cache;  // folder -> GiB/s

std::string parent_of(const std::string& p);

// Measured in the checkpoint's folder; cached by its parent (the folder that
// holds successive checkpoints), so a training run pays for it once.
double probe_storage_gibps(const std::string& dir) {
  std::lock_guard<std::mutex> lk(g_bw_mu);
  const std::string key = parent_of(dir);
  auto it = g_bw_cache.find(key);
  if (it != g_bw_cache.end()) return it->second;
  const std::string p = dir + "/.bw-probe-" + std::to_string(::getpid());
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(p, "create", errno);
  // Large enough to get past the first burst of a device's or the page
  // cache's write-back; still an estimate: pass storage_gibps when known.
  constexpr size_t kProbe = 128u << 20, kBuf = 4u << 20;
  std::vector<uint8_t> buf(kBuf);
  for (size_t i = 0; i < kBuf; ++i) buf[i] = (uint8_t)(i * 2654435761u >> 13);  // not all zeros
  const auto t0 = Clock::now();
  int err = 0;
  for (size_t off = 0; off < kProbe && !err; off += kBuf) err = tz::io::pwrite_full(fd, buf.data(), kBuf, off);
  if (!err && ::fdatasync(fd) != 0) err = errno;
  const double t = secs(t0, Clock::now());
  ::close(fd);
  ::unlink(p.c_str());
  if (err) fail_errno(p, "bandwidth probe", err);
  const double bw = kProbe / kGiB / std::max(t, 1e-6);
  g_bw_cache[key] = bw;
  return bw;
}

}  // namespace

// ===========================================================================
// Save
// ===========================================================================
namespace {

struct FrameOut {
  uint64_t offset = 0, size = 0, raw_size = 0, xxh64 = 0;
};

struct Seg {
  const TensorView* t = nullptr;
  tz_dtype cd = TZ_DTYPE_BYTES;
  unsigned block_elems = 0;
  uint64_t data_begin = 0;
  std::vector<FrameOut> frames;
};

struct Unit {
  size_t seg;
  uint64_t off;
  size_t n;
};

struct Slot {
  std::vector<uint8_t> comp;  // frame + zero padding to 64
  std::vector<uint8_t> raw;   // device tensors only: host copy of the chunk
  size_t frame_size = 0;
  uint64_t frame_hash = 0;
  size_t allowed = 0;         // the unit that may use this slot next
  bool encoded = false;
};

void validate(std::span<const TensorView> tensors, std::vector<Seg>& segs) {
  std::set<std::string> names;
  uint64_t pos = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(ErrorKind::kUsage, "tensor with an empty name");
    if (!names.insert(t.name).second) fail(ErrorKind::kUsage, "duplicate tensor name '" + t.name + "'");
    Seg s;
    s.t = &t;
    if (!tz::container::codec_dtype_for(t.dtype, &s.cd))
      fail(ErrorKind::kUsage, "tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    const unsigned bits = tz::container::dtype_bits(t.dtype);
    unsigned __int128 n = bits;
    for (uint64_t d : t.shape) {
      n *= d;
      if (n > ((unsigned __int128)1 << 70)) fail(ErrorKind::kUsage, "tensor '" + t.name + "': shape too large");
    }
    if (n % 8 != 0 || (uint64_t)(n / 8) != t.size)
      fail(ErrorKind::kUsage, "tensor '" + t.name + "': size " + std::to_string(t.size) +
                                  " bytes does not match its dtype and shape");
    if (t.size && !t.data) fail(ErrorKind::kUsage, "tensor '" + t.name + "': null data");
#ifndef TZ_CHECKPOINT_CUDA
    if (t.memory == Memory::kDevice)
      fail(ErrorKind::kUsage, "tensor '" + t.name + "' is in device memory but tensorzip was built without CUDA");
#endif
    s.block_elems = s.cd == TZ_DTYPE_BYTES ? 262144 : 65536;
    s.data_begin = pos;
    pos += t.size;
    segs.push_back(std::move(s));
  }
}

// safetensors header and .tzip header of the rank file (doc/container.md 3).
std::string tzip_header(const std::vector<Seg>& segs, uint64_t chunk, uint64_t data_size, int level,
                        const std::map<std::string, std::string>& meta) {
  json st = json::object();
  if (!meta.empty()) st["__metadata__"] = meta;
  std::vector<const Seg*> order;
  for (const auto& s : segs) {
    st[s.t->name] = {{"dtype", s.t->dtype}, {"shape", s.t->shape}, {"data_offsets", {s.data_begin, s.data_begin + s.t->size}}};
    order.push_back(&s);
  }
  std::stable_sort(order.begin(), order.end(), [](const Seg* a, const Seg* b) {
    const uint64_t ea = a->data_begin + a->t->size, eb = b->data_begin + b->t->size;
    if (a->data_begin != b->data_begin) return a->data_begin < b->data_begin;
    if (ea != eb) return ea < eb;
    return a->t->name < b->t->name;
  });
  json tensors = json::array();
  for (const Seg* s : order) {
    json fr = json::array();
    for (const auto& f : s->frames) fr.push_back({{"offset", f.offset}, {"size", f.size}, {"xxh64", hex64(f.xxh64)}});
    tensors.push_back({{"name", s->t->name},
                       {"dtype", s->t->dtype},
                       {"shape", s->t->shape},
                       {"data_offsets", {s->data_begin, s->data_begin + s->t->size}},
                       {"codec", {{"dtype", codec_dtype_str(s->cd)}, {"level", level}, {"block_elems", s->block_elems}}},
                       {"frames", fr}});
  }
  json h = {{"format", "tzip"},
            {"version", 1},
            {"created_by", "tensorzip checkpoint"},
            {"chunk_bytes", chunk},
            {"data_size", data_size},
            {"metadata", meta},
            {"safetensors_header", st.dump()},
            {"tensors", tensors},
            {"gaps", json::array()}};
  return h.dump();
}

struct Choice {
  int level = -1;
  std::string name, model;
};

// Level-1 encode throughput per worker thread that a save of this process
// really achieved (GiB/s; the workers share cores, caches and memory
// bandwidth with the writer, the kernel's copies and other processes, which
// a short calibration on a warm sample does not see); 0 until a level-1 save
// of at least 64 MiB finished. Later kAuto choices use it instead of the
// calibrated level-1 speed, and scale level 2 by the calibrated ratio.
std::mutex g_enc_mu;
double g_enc_obs = 0;

Choice pick_codec(const std::string& dir, const std::vector<Seg>& segs, const std::vector<Unit>& units,
                  uint64_t raw_total, const SaveOptions& opt, unsigned threads, double* cal_gibps) {
  Choice c;
  if (opt.codec == Codec::kRaw) return {-1, "raw", "forced: raw"};
  if (opt.codec == Codec::kFast) return {1, "fast", "forced: fast (level 1)"};
  if (opt.codec == Codec::kStrong) return {2, "strong", "forced: strong (level 2)"};
  // Byte-weighted sample: the chunks that hold bytes S*i/k, i = 0..k-1, so
  // that dtypes and small tensors (whose per-frame overhead is higher) weigh
  // as much as their share of the bytes. Each sampled chunk stands for S/k
  // bytes: time and compressed size are estimated as sum(x_i / n_i) * S/k.
  constexpr int kSamples = 8;
  std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(1), &tz_ctx_free);
  double per_byte_t[2] = {0, 0}, per_byte_c[2] = {0, 0}, sampled = 0;
  int used = 0;
  std::vector<uint8_t> comp;
  size_t ui = 0;
  uint64_t unit_end = units.empty() ? 0 : units[0].n;
  for (int i = 0; i < kSamples && !units.empty(); ++i) {
    const uint64_t at = raw_total * (uint64_t)i / kSamples;
    while (ui + 1 < units.size() && unit_end <= at) unit_end += units[++ui].n;
    const Unit& u = units[ui];
    const Seg& s = segs[u.seg];
    if (s.t->memory != Memory::kHost || u.n == 0) continue;
    if (comp.size() < tz_compress_bound(u.n)) comp.resize(tz_compress_bound(u.n));
    for (int l = 0; l < 2; ++l) {
      tz_params p{};
      p.dtype = s.cd;
      p.level = l + 1;
      p.block_elems = s.block_elems;
      const auto t0 = Clock::now();
      const size_t r = tz_ctx_compress(ctx.get(), comp.data(), comp.size(),
                                       static_cast<const uint8_t*>(s.t->data) + u.off, u.n, &p);
      const double dt = secs(t0, Clock::now());
      if (tz_is_error(r)) fail(ErrorKind::kInternal, std::string("calibration: ") + tz_get_error_name(r));
      per_byte_t[l] += dt / (double)u.n;
      per_byte_c[l] += (double)r / (double)u.n;
    }
    sampled += (double)u.n;
    ++used;
  }
  const double bw = opt.storage_gibps > 0 ? opt.storage_gibps : probe_storage_gibps(dir);
  if (used == 0) return {-1, "raw", "no host data to calibrate the codec on: raw"};
  double obs = 0;
  {
    std::lock_guard<std::mutex> lk(g_enc_mu);
    obs = g_enc_obs;
  }
  // Per-byte means over the sample -> aggregate speed (GiB/s) and ratio.
  double e[2], r[2];
  for (int l = 0; l < 2; ++l) {
    e[l] = used / per_byte_t[l] / kGiB * threads;
    r[l] = used / per_byte_c[l];
  }
  *cal_gibps = e[0];
  const double factor = obs > 0 ? obs * threads / e[0] : 0;
  if (factor > 0) e[0] *= factor, e[1] *= factor;
  const CodecChoice cc = choose_codec((double)raw_total, bw, e[0], r[0], e[1], r[1]);
  c.level = codec_kind_level(cc.kind);
  c.name = codec_kind_name(cc.kind);
  char fb[128] = "";
  if (factor > 0)
    std::snprintf(fb, sizeof fb, ", speeds scaled by %.2f to the level-1 throughput a previous save achieved", factor);
  c.model = std::string(opt.storage_gibps > 0 ? "storage bandwidth given; " : "storage bandwidth measured; ") +
            "codec calibrated on " + std::to_string(used) + " chunks (" + std::to_string((uint64_t)sampled) +
            " bytes, byte-weighted) x " + std::to_string(threads) + " threads" + fb + ": " + cc.model;
  return c;
}

unsigned resolve_threads(unsigned t) {
  if (t) return t;
  const unsigned h = std::thread::hardware_concurrency();
  return h ? h : 1;
}

void ensure_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail_errno(dir, "mkdir", errno);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail(ErrorKind::kIO, dir + ": not a directory");
}

std::string parent_of(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : p.substr(0, s);
}

// Writes this rank's .tzip file; returns the rank's manifest entry.
json write_rank_file(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt,
                     SaveStats& stats) {
  const uint64_t chunk = opt.chunk_bytes;
  if (chunk < (1u << 20) || chunk > (64u << 20) || (chunk & (chunk - 1)))
    fail(ErrorKind::kUsage, "chunk_bytes must be a power of two in [1 MiB, 64 MiB]");
  std::vector<Seg> segs;
  validate(tensors, segs);
  uint64_t data_size = 0;
  std::vector<Unit> units;
  for (size_t i = 0; i < segs.size(); ++i) {
    const uint64_t n = segs[i].t->size;
    for (uint64_t off = 0; off < n; off += chunk) units.push_back({i, off, (size_t)std::min<uint64_t>(chunk, n - off)});
    data_size += n;
  }
  const unsigned threads = resolve_threads(opt.threads);
  double cal_gibps = 0;  // level-1 calibration (kAuto only)
  const Choice choice = pick_codec(dir, segs, units, data_size, opt, threads, &cal_gibps);
  const auto t_pipe = Clock::now();
  std::atomic<uint64_t> encode_ns{0};  // summed over workers
  stats.codec = choice.name;
  stats.model = choice.model;
  if (opt.log) opt.log("codec " + choice.name + ": " + choice.model);

  const std::string fin = dir + "/" + rank_file(opt.rank);
  const std::string tmp = dir + "/." + rank_file(opt.rank) + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(tmp, "create", errno);
  struct Cleanup {
    int fd;
    std::string tmp;
    bool keep = false;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      if (!keep) ::unlink(tmp.c_str());
    }
  } cleanup{fd, tmp};

  XXH64_state_t* fh = XXH64_createState();
  XXH64_reset(fh, 0);
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> fh_guard(fh, &XXH64_freeState);

  uint8_t pre[64] = {'T', 'Z', 'I', 'P'};
  put_le(pre + 4, 1, 2);
  put_le(pre + 6, 0, 2);
  XXH64_update(fh, pre, 64);

  const size_t n_slots = std::max<size_t>(2, opt.slots ? opt.slots : threads + 4);
  std::vector<Slot> slots(n_slots);
  for (size_t i = 0; i < n_slots; ++i) slots[i].allowed = i;
  const size_t cap = tz_compress_bound(chunk) + 64;

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  bool stop = false;
  std::exception_ptr error;
  auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(mu);
    if (!error) error = e;
    stop = true;
    cv.notify_all();
  };

  const Io io = opt.io;
  tz::io::WriteQueue wq(fd, io == Io::kPosix ? tz::io::Backend::kPosix
                            : io == Io::kUring ? tz::io::Backend::kUring
                                               : tz::io::Backend::kAuto,
                        std::max(1u, opt.io_threads), (unsigned)std::min<size_t>(n_slots, 64));
  stats.io = tz::io::backend_name(wq.backend());
  {
    // The preamble goes first (synchronously, small).
    const int e = tz::io::pwrite_full(fd, pre, 64, 0);
    if (e) fail_errno(tmp, "write", e);
  }

  std::vector<std::thread> workers;
  for (unsigned w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(1), &tz_ctx_free);
#ifdef TZ_CHECKPOINT_CUDA
      void* d_comp = nullptr;
      cudaStream_t stream = nullptr;
#endif
      try {
        if (!ctx) fail(ErrorKind::kInternal, "cannot create a codec context");
        for (;;) {
          const size_t u = next.fetch_add(1);
          if (u >= units.size()) break;
          Slot& s = slots[u % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || s.allowed == u; });
            if (stop) break;
          }
          const Unit& un = units[u];
          const Seg& sg = segs[un.seg];
          if (s.comp.size() < cap) s.comp.resize(cap);
          tz_params p{};
          p.dtype = sg.cd;
          p.level = choice.level;
          p.block_elems = sg.block_elems;
          const uint8_t* src = static_cast<const uint8_t*>(sg.t->data) + un.off;
          size_t r = 0;
          bool done = false;
#ifdef TZ_CHECKPOINT_CUDA
          if (sg.t->memory == Memory::kDevice) {
            // GPU encode when the codec supports the dtype there (same bitstream
            // as the CPU), else copy the chunk to the host and encode on the CPU.
            if (sg.cd != TZ_DTYPE_BYTES && un.n % (tz::container::dtype_bits(sg.t->dtype) / 8) == 0) {
              if (!stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
                fail(ErrorKind::kInternal, "cudaStreamCreate failed");
              if (!d_comp && cudaMalloc(&d_comp, cap) != cudaSuccess) fail(ErrorKind::kInternal, "cudaMalloc failed");
              r = tz_cuda_compress_tensor(d_comp, cap, src, un.n, &p, stream);
              if (!tz_is_error(r)) {
                if (cudaMemcpy(s.comp.data(), d_comp, r, cudaMemcpyDeviceToHost) != cudaSuccess)
                  fail(ErrorKind::kInternal, "cudaMemcpy failed");
                done = true;
              }
            }
            if (!done) {
              if (s.raw.size() < un.n) s.raw.resize(un.n);
              if (cudaMemcpy(s.raw.data(), src, un.n, cudaMemcpyDeviceToHost) != cudaSuccess)
                fail(ErrorKind::kInternal, "cudaMemcpy failed");
              src = s.raw.data();
            }
          }
#endif
          if (!done) {
            const auto te = Clock::now();
            r = tz_ctx_compress(ctx.get(), s.comp.data(), cap - 64, src, un.n, &p);
            encode_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - te).count();
          }
          if (tz_is_error(r))
            fail(ErrorKind::kInternal, "tensor '" + sg.t->name + "': " + tz_get_error_name(r) + ": " +
                                           tz_last_error_detail());
          const size_t padded = align64(r);
          std::memset(s.comp.data() + r, 0, padded - r);
          const uint64_t h = XXH64(s.comp.data(), r, 0);  // frame hash here, in parallel
          std::lock_guard<std::mutex> lk(mu);
          s.frame_size = r;
          s.frame_hash = h;
          s.encoded = true;
          cv.notify_all();
        }
      } catch (...) {
        set_error(std::current_exception());
      }
#ifdef TZ_CHECKPOINT_CUDA
      if (d_comp) cudaFree(d_comp);
      if (stream) cudaStreamDestroy(stream);
#endif
    });
  }

  // Writer: data order, offsets, hashes, queue the writes.
  uint64_t pos = 64;
  try {
    for (size_t u = 0; u < units.size(); ++u) {
      Slot& s = slots[u % n_slots];
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || (s.allowed == u && s.encoded); });
        if (stop) break;
      }
      if (const int e = wq.error()) fail_errno(tmp, "write", e);
      const size_t padded = align64(s.frame_size);
      Seg& sg = segs[units[u].seg];
      sg.frames.push_back({pos, s.frame_size, units[u].n, s.frame_hash});
      XXH64_update(fh, s.comp.data(), padded);
      wq.submit(pos, s.comp.data(), padded, [&, u] {
        std::lock_guard<std::mutex> lk(mu);
        Slot& sl = slots[u % n_slots];
        sl.encoded = false;
        sl.allowed = u + n_slots;
        cv.notify_all();
      });
      pos += padded;
    }
  } catch (...) {
    set_error(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (error) stop = true;
    cv.notify_all();
  }
  for (auto& t : workers) t.join();
  const int werr = wq.drain();
  if (error) std::rethrow_exception(error);
  if (werr) fail_errno(tmp, "write", werr);
  // Feedback for later kAuto choices: level-1 throughput per worker that
  // this save achieved, over the whole pipeline's time (encode is what
  // limits a CPU-bound save; an I/O-bound one understates it, which only
  // makes later choices more cautious).
  (void)cal_gibps;
  if (choice.level == 1 && data_size >= (64u << 20)) {
    const double wall = secs(t_pipe, Clock::now());
    const double achieved = (double)data_size / kGiB / wall / threads;
    std::lock_guard<std::mutex> lk(g_enc_mu);
    g_enc_obs = achieved;
  }
  if (opt.log && choice.level >= 0)
    opt.log("encode: " + std::to_string(threads) + " workers, " + std::to_string(encode_ns.load() / 1000000) +
            " ms of encode time in total for " + std::to_string(data_size) + " bytes");

  // Header + trailer.
  std::string tail = tzip_header(segs, chunk, data_size, choice.level, opt.metadata);
  const uint64_t header_off = pos, header_size = tail.size();
  uint8_t tr[48] = {};
  put_le(tr + 0, header_off, 8);
  put_le(tr + 8, header_size, 8);
  put_le(tr + 16, XXH64(tail.data(), tail.size(), 0), 8);
  put_le(tr + 24, 1, 2);
  put_le(tr + 26, 0, 2);
  XXH64_update(fh, tail.data(), tail.size());
  XXH64_update(fh, tr, 32);
  const uint64_t file_hash = XXH64_digest(fh);
  put_le(tr + 32, file_hash, 8);
  tr[44] = 'P', tr[45] = 'I', tr[46] = 'Z', tr[47] = 'T';
  tail.append(reinterpret_cast<const char*>(tr), 48);
  if (const int e = tz::io::pwrite_full(fd, tail.data(), tail.size(), header_off)) fail_errno(tmp, "write", e);
  if (::fsync(fd) != 0) fail_errno(tmp, "fsync", errno);
  ::close(cleanup.fd);
  cleanup.fd = -1;
  if (::rename(tmp.c_str(), fin.c_str()) != 0) fail_errno(fin, "rename", errno);
  cleanup.keep = true;
  fsync_path(dir, true);
  stats.raw_bytes = data_size;
  stats.file_bytes = header_off + tail.size();

  json jt = json::array();
  for (const auto& s : segs) {
    json fr = json::array();
    for (const auto& f : s.frames)
      fr.push_back({{"offset", f.offset}, {"size", f.size}, {"raw_size", f.raw_size}, {"xxh64", hex64(f.xxh64)}});
    jt.push_back({{"name", s.t->name},
                  {"dtype", s.t->dtype},
                  {"shape", s.t->shape},
                  {"size", s.t->size},
                  {"codec_dtype", codec_dtype_str(s.cd)},
                  {"level", choice.level},
                  {"frames", fr}});
  }
  return json{{"rank", opt.rank},
              {"file", rank_file(opt.rank)},
              {"file_size", stats.file_bytes},
              {"file_xxh64", hex64(file_hash)},
              {"chunk_bytes", chunk},
              {"codec", choice.name},
              {"time_model", choice.model},
              {"metadata", opt.metadata},
              {"tensors", jt}};
}

}  // namespace

SaveStats save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.world_size < 1 || opt.rank < 0 || opt.rank >= opt.world_size)
    fail(ErrorKind::kUsage, "rank must be in [0, world_size)");
  ensure_dir(dir);
  {
    struct stat st {};
    if (::stat((dir + "/" + kManifest).c_str(), &st) == 0)
      fail(ErrorKind::kUsage, dir + ": already holds a complete checkpoint (save into a new directory)");
  }
  // The checkpoint's directory entry must be durable in its parent too.
  fsync_path(parent_of(dir), true);
  SaveStats stats;
  json rank = write_rank_file(dir, tensors, opt, stats);
  if (opt.world_size == 1) {
    json body = {{"world_size", 1}, {"metadata", opt.metadata}, {"ranks", json::array({rank})}};
    write_atomic(dir, kManifest, wrap_manifest(body));
  } else {
    write_atomic(dir, rank_index(opt.rank), rank.dump());
  }
  stats.seconds = secs(t0, Clock::now());
  stats.stall_seconds = stats.seconds;
  return stats;
}

void commit(const std::string& dir, int world_size) {
  if (world_size < 1) fail(ErrorKind::kUsage, "world_size must be >= 1");
  json ranks = json::array();
  json meta = json::object();
  for (int r = 0; r < world_size; ++r) {
    const std::string p = dir + "/" + rank_index(r);
    json j;
    try {
      j = json::parse(read_small(p, ErrorKind::kIncomplete));
    } catch (const json::exception&) {
      fail(ErrorKind::kCorrupt, p + ": not valid JSON");
    }
    if (r == 0 && j.contains("metadata")) meta = j["metadata"];
    ranks.push_back(j);
  }
  write_atomic(dir, kManifest, wrap_manifest({{"world_size", world_size}, {"metadata", meta}, {"ranks", ranks}}));
}

// ===========================================================================
// Async save
// ===========================================================================
struct AsyncSaver::Impl {
  std::unique_ptr<uint8_t[]> arena;  // staging, reused across saves (not zero-filled)
  uint64_t arena_size = 0;
  std::vector<TensorView> staged;
  std::thread th;
  mutable std::mutex mu;
  bool running = false, finished = false;
  std::exception_ptr err;
  SaveStats stats;
  double stall = 0;

  void join() {
    if (th.joinable()) th.join();
  }
};

AsyncSaver::AsyncSaver() : impl_(std::make_unique<Impl>()) {}
AsyncSaver::~AsyncSaver() { impl_->join(); }

void AsyncSaver::save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt) {
  impl_->join();  // one save in flight
  const auto t0 = Clock::now();
  uint64_t total = 0;
  for (const auto& t : tensors) total += align64(t.size);
  if (impl_->arena_size < total) {
    impl_->arena.reset();
    impl_->arena_size = 0;
    impl_->arena.reset(new uint8_t[total]);
    impl_->arena_size = total;
  }
  impl_->staged.assign(tensors.begin(), tensors.end());
  // Copy with `threads` threads, each taking a contiguous run of tensors of
  // about total/threads bytes (one thread cannot saturate memory bandwidth).
  std::vector<uint8_t*> dst(impl_->staged.size());
  {
    uint64_t off = 0;
    for (size_t i = 0; i < impl_->staged.size(); ++i) dst[i] = impl_->arena.get() + off, off += align64(impl_->staged[i].size);
  }
  const unsigned nt = (unsigned)std::max<size_t>(1, std::min<size_t>(resolve_threads(opt.threads), impl_->staged.size()));
  std::vector<std::exception_ptr> errs(nt);
  auto copy_range = [&](unsigned w) {
    try {
      const uint64_t lo = total * w / nt, hi = total * (w + 1) / nt;
      for (size_t i = 0; i < impl_->staged.size(); ++i) {
        const uint64_t at = (uint64_t)(dst[i] - impl_->arena.get());
        if (at < lo || at >= hi) continue;
        const TensorView& t = impl_->staged[i];
#ifdef TZ_CHECKPOINT_CUDA
        if (t.memory == Memory::kDevice) {
          if (cudaMemcpy(dst[i], t.data, t.size, cudaMemcpyDeviceToHost) != cudaSuccess)
            fail(ErrorKind::kInternal, "tensor '" + t.name + "': cudaMemcpy failed");
          continue;
        }
#endif
        if (t.size) std::memcpy(dst[i], t.data, t.size);
      }
    } catch (...) {
      errs[w] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> th;
    for (unsigned w = 1; w < nt; ++w) th.emplace_back(copy_range, w);
    copy_range(0);
    for (auto& x : th) x.join();
  }
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (size_t i = 0; i < impl_->staged.size(); ++i) {
    impl_->staged[i].data = dst[i];
    impl_->staged[i].memory = Memory::kHost;
  }
  impl_->stall = secs(t0, Clock::now());
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->running = true;
    impl_->finished = false;
    impl_->err = nullptr;
  }
  Impl* im = impl_.get();
  im->th = std::thread([im, dir, opt, t0] {
    SaveStats st;
    std::exception_ptr e;
    try {
      st = tz::checkpoint::save(dir, im->staged, opt);
      st.seconds = secs(t0, Clock::now());
      st.stall_seconds = im->stall;
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(im->mu);
    im->stats = st;
    im->err = e;
    im->finished = true;
    im->running = false;
  });
}

bool AsyncSaver::done() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return !impl_->running;
}

SaveStats AsyncSaver::wait() {
  impl_->join();
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->err) std::rethrow_exception(impl_->err);
  return impl_->stats;
}

std::exception_ptr AsyncSaver::error() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->finished ? impl_->err : nullptr;
}

// ===========================================================================
// Restore
// ===========================================================================
namespace {
struct RFrame {
  uint64_t offset, size, raw_size, raw_off, xxh64;
};
struct RTensor {
  TensorInfo info;
  size_t file;  // index into Impl::files
  tz_dtype cd;
  std::vector<RFrame> frames;
};
}  // namespace

struct Checkpoint::Impl {
  std::string dir;
  unsigned threads;
  std::vector<std::string> files;
  std::vector<int> fds;
  std::vector<int> dfds;  // O_DIRECT descriptors (-1: not requested or refused)
  std::atomic<bool> direct_ok{true};
  std::vector<TensorInfo> infos;
  std::vector<RTensor> tensors;
  std::map<std::string, size_t> by_name;
  std::map<std::string, std::string> meta;
  ~Impl() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    for (int fd : dfds)
      if (fd >= 0) ::close(fd);
  }
};

Checkpoint::Checkpoint(const std::string& dir, unsigned threads, bool direct_io) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.dir = dir;
  m.threads = resolve_threads(threads);
  const std::string mp = dir + "/" + kManifest;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(ErrorKind::kNotFound, dir + ": no such checkpoint");
  const json body = unwrap_manifest(read_small(mp, ErrorKind::kIncomplete), mp);
  try {
    if (body.contains("metadata") && body["metadata"].is_object())
      for (auto& [k, v] : body["metadata"].items())
        if (v.is_string()) m.meta[k] = v.get<std::string>();
    for (const auto& r : body.at("ranks")) {
      const std::string f = r.at("file").get<std::string>();
      if (f.find('/') != std::string::npos || f.empty() || f[0] == '.')
        fail(ErrorKind::kCorrupt, mp + ": bad file name '" + f + "'");
      m.files.push_back(dir + "/" + f);
      const uint64_t fsize = r.at("file_size").get<uint64_t>();
      for (const auto& t : r.at("tensors")) {
        RTensor rt;
        rt.info.name = t.at("name").get<std::string>();
        rt.info.dtype = t.at("dtype").get<std::string>();
        rt.info.shape = t.at("shape").get<std::vector<uint64_t>>();
        rt.info.size = t.at("size").get<uint64_t>();
        rt.info.rank = r.at("rank").get<int>();
        rt.file = m.files.size() - 1;
        if (!tz::container::codec_dtype_for(rt.info.dtype, &rt.cd))
          fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': unknown dtype");
        uint64_t raw_off = 0;
        for (const auto& fr : t.at("frames")) {
          RFrame f{fr.at("offset").get<uint64_t>(), fr.at("size").get<uint64_t>(), fr.at("raw_size").get<uint64_t>(),
                   raw_off, parse_hex64(fr.at("xxh64").get<std::string>())};
          if (f.offset > fsize || f.size > fsize - f.offset || f.raw_size > rt.info.size - raw_off)
            fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': frame outside its file");
          raw_off += f.raw_size;
          rt.info.compressed_size += f.size;
          rt.frames.push_back(f);
        }
        if (raw_off != rt.info.size) fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': frames do not cover it");
        if (!m.by_name.emplace(rt.info.name, m.tensors.size()).second)
          fail(ErrorKind::kCorrupt, mp + ": duplicate tensor '" + rt.info.name + "'");
        m.infos.push_back(rt.info);
        m.tensors.push_back(std::move(rt));
      }
    }
  } catch (const json::exception& e) {
    fail(ErrorKind::kCorrupt, mp + ": malformed manifest: " + e.what());
  }
  for (const auto& f : m.files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_errno(f, "open", errno);
    m.fds.push_back(fd);
    m.dfds.push_back(direct_io ? ::open(f.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1);
  }
}

Checkpoint::~Checkpoint() = default;
bool Checkpoint::direct_io() const {
  bool d = impl_->direct_ok && !impl_->dfds.empty();
  for (int fd : impl_->dfds) d = d && fd >= 0;
  return d;
}
const std::vector<TensorInfo>& Checkpoint::tensors() const { return impl_->infos; }
const std::map<std::string, std::string>& Checkpoint::metadata() const { return impl_->meta; }
long Checkpoint::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? -1 : (long)it->second;
}

void Checkpoint::load(std::span<const LoadRequest> requests) {
  auto& m = *impl_;
  struct Job {
    const RTensor* t;
    const RFrame* f;
    const LoadRequest* req;
  };
  std::vector<Job> jobs;
  for (const auto& r : requests) {
    const long i = find(r.name);
    if (i < 0) fail(ErrorKind::kNotFound, m.dir + ": no tensor '" + r.name + "'");
    const RTensor& t = m.tensors[(size_t)i];
    if (r.capacity < t.info.size)
      fail(ErrorKind::kUsage, "tensor '" + r.name + "': destination holds " + std::to_string(r.capacity) +
                                  " bytes, needs " + std::to_string(t.info.size));
#ifndef TZ_CHECKPOINT_CUDA
    if (r.memory == Memory::kDevice) fail(ErrorKind::kUsage, "device destinations need a CUDA build");
#endif
    for (const auto& f : t.frames) jobs.push_back({&t, &f, &r});
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr err;
  const unsigned n_workers = (unsigned)std::min<size_t>(m.threads, std::max<size_t>(1, jobs.size()));
  bool direct = m.direct_ok;  // O_DIRECT reads bypass the page cache: no read-ahead hints then
  for (int fd : m.dfds) direct = direct && fd >= 0;
  for (const auto& j : jobs)  // the first window of reads starts now
    if (direct || &j - jobs.data() >= (long)(2 * n_workers)) break;
    else ::posix_fadvise(m.fds[j.t->file], (off_t)j.f->offset, (off_t)j.f->size, POSIX_FADV_WILLNEED);
  auto worker = [&] {
    std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(1), &tz_ctx_free);
    std::vector<uint8_t> buf, host;
    void* dbuf = nullptr;  // O_DIRECT reads, 4 KiB aligned
    uint64_t dbuf_cap = 0;
    struct FreeDbuf {
      void*& p;
      ~FreeDbuf() { std::free(p); }
    } free_dbuf{dbuf};
#ifdef TZ_CHECKPOINT_CUDA
    cudaStream_t stream = nullptr;
    void* d_frame = nullptr;
    size_t d_frame_cap = 0;
#endif
    try {
      for (;;) {
        {
          std::lock_guard<std::mutex> lk(mu);
          if (err) return;
        }
        const size_t j = next.fetch_add(1);
        if (j >= jobs.size()) return;
        const Job& jb = jobs[j];
        // Ask the kernel to start reading a few frames ahead, so the disk
        // stays busy while the workers decode.
        if (const size_t ahead = j + 2 * n_workers; ahead < jobs.size() && !direct)
          ::posix_fadvise(m.fds[jobs[ahead].t->file], (off_t)jobs[ahead].f->offset, (off_t)jobs[ahead].f->size,
                          POSIX_FADV_WILLNEED);
        const std::string what = "tensor '" + jb.t->info.name + "' (" + m.files[jb.t->file] + ", frame at offset " +
                                 std::to_string(jb.f->offset) + ")";
        const uint8_t* frame = nullptr;
        const int dfd = m.dfds[jb.t->file];
        if (dfd >= 0 && m.direct_ok.load(std::memory_order_relaxed)) {
          // O_DIRECT: offset, length and buffer aligned to 4 KiB; the frame
          // lies inside the aligned range (the read may stop at end of file).
          constexpr uint64_t kAlign = 4096;
          const uint64_t lo = jb.f->offset & ~(kAlign - 1);
          const uint64_t need = jb.f->offset + jb.f->size - lo;
          const uint64_t len = (need + kAlign - 1) & ~(kAlign - 1);
          if (dbuf_cap < len) {
            std::free(dbuf);
            dbuf = nullptr;
            dbuf_cap = 0;
            if (::posix_memalign(&dbuf, kAlign, len) != 0) fail(ErrorKind::kInternal, "out of memory");
            dbuf_cap = len;
          }
          uint64_t got = 0;
          int e = 0;
          while (got < need) {
            const ssize_t r = ::pread(dfd, static_cast<uint8_t*>(dbuf) + got, len - got, (off_t)(lo + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
              e = errno;
              break;
            }
            if (r == 0) {
              e = EIO;
              break;
            }
            got += (uint64_t)r;
          }
          if (e == EINVAL) m.direct_ok = false;  // alignment refused here: buffered reads from now on
          else if (e) fail(e == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO, what + ": read failed: " + std::strerror(e));
          else frame = static_cast<const uint8_t*>(dbuf) + (jb.f->offset - lo);
        }
        if (!frame) {
          if (buf.size() < jb.f->size) buf.resize(jb.f->size);
          if (const int e = tz::io::pread_full(m.fds[jb.t->file], buf.data(), jb.f->size, jb.f->offset))
            fail(e == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO, what + ": read failed: " + std::strerror(e));
          frame = buf.data();
        }
        if (XXH64(frame, jb.f->size, 0) != jb.f->xxh64) fail(ErrorKind::kCorrupt, what + ": checksum mismatch");
        uint8_t* dst = static_cast<uint8_t*>(jb.req->dst) + jb.f->raw_off;
#ifdef TZ_CHECKPOINT_CUDA
        const bool dev = jb.req->memory == Memory::kDevice;
        if (dev) {
          // GPU decode (same bitstream, block checksums checked on the GPU).
          // Frames the GPU codec does not take (zstd streams of TZ_DTYPE_BYTES)
          // are decoded on the CPU below and copied.
          if (!stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
            fail(ErrorKind::kInternal, what + ": cudaStreamCreate failed");
          if (d_frame_cap < jb.f->size) {
            if (d_frame) cudaFree(d_frame);
            d_frame = nullptr;
            d_frame_cap = 0;
            if (cudaMalloc(&d_frame, jb.f->size) != cudaSuccess) fail(ErrorKind::kInternal, what + ": cudaMalloc failed");
            d_frame_cap = jb.f->size;
          }
          if (cudaMemcpyAsync(d_frame, frame, jb.f->size, cudaMemcpyHostToDevice, stream) != cudaSuccess)
            fail(ErrorKind::kInternal, what + ": cudaMemcpyAsync failed");
          const size_t g = tz_cuda_decompress_tensor(dst, jb.f->raw_size, d_frame, jb.f->size, stream);
          if (!tz_is_error(g) && g == jb.f->raw_size) continue;
          if (tz_get_error_code(g) != TZ_ERROR_UNSUPPORTED)
            fail(ErrorKind::kCorrupt, what + ": GPU decode: " + tz_get_error_name(g));
          if (host.size() < jb.f->raw_size) host.resize(jb.f->raw_size);
          dst = host.data();
        }
#endif
        const size_t r = tz_ctx_decompress(ctx.get(), dst, jb.f->raw_size, frame, jb.f->size);
        if (tz_is_error(r) || r != jb.f->raw_size)
          fail(ErrorKind::kCorrupt, what + ": " + (tz_is_error(r) ? std::string(tz_get_error_name(r)) + ": " +
                                                                         tz_last_error_detail()
                                                                   : std::string("wrong decoded size")));
#ifdef TZ_CHECKPOINT_CUDA
        if (dev && cudaMemcpy(static_cast<uint8_t*>(jb.req->dst) + jb.f->raw_off, host.data(), r,
                              cudaMemcpyHostToDevice) != cudaSuccess)
          fail(ErrorKind::kInternal, what + ": cudaMemcpy failed");
#endif
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!err) err = std::current_exception();
    }
#ifdef TZ_CHECKPOINT_CUDA
    if (d_frame) cudaFree(d_frame);
    if (stream) cudaStreamDestroy(stream);
#endif
  };
  std::vector<std::thread> th;
  for (unsigned i = 1; i < n_workers; ++i) th.emplace_back(worker);
  worker();
  for (auto& t : th) t.join();
  if (err) std::rethrow_exception(err);
}

std::vector<uint8_t> Checkpoint::read(const std::string& name) {
  const long i = find(name);
  if (i < 0) fail(ErrorKind::kNotFound, impl_->dir + ": no tensor '" + name + "'");
  std::vector<uint8_t> out(impl_->infos[(size_t)i].size);
  LoadRequest r{name, out.data(), out.size(), Memory::kHost};
  load(std::span<const LoadRequest>(&r, 1));
  return out;
}

std::vector<std::string> Checkpoint::verify() {
  std::vector<std::string> bad;
  std::vector<uint8_t> buf;
  for (const auto& t : impl_->infos) {
    buf.resize(t.size);
    LoadRequest r{t.name, buf.data(), buf.size(), Memory::kHost};
    try {
      load(std::span<const LoadRequest>(&r, 1));
    } catch (const Error& e) {
      bad.push_back(t.name + ": " + e.what());
    }
  }
  return bad;
}

bool is_complete(const std::string& dir) {
  try {
    unwrap_manifest(read_small(dir + "/" + kManifest, ErrorKind::kIncomplete), dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string latest(const std::string& root) {
  DIR* d = ::opendir(root.c_str());
  if (!d) return "";
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n[0] != '.') names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.rbegin(), names.rend());
  for (const auto& n : names)
    if (is_complete(root + "/" + n)) return root + "/" + n;
  return "";
}

}  // namespace tz::checkpoint
