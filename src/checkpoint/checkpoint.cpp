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
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../container/tzc_output.hpp"
#include "../io/read_queue.hpp"
#include "../io/queue_sink.hpp"
#include "../io/write_queue.hpp"
#include "codec/predict.h"
#include "plan.hpp"
#include "container/tzip_refs.hpp"
#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"

#include "../io/cufile.hpp"
#ifdef TZ_CHECKPOINT_CUDA
#include <cuda_runtime_api.h>

#include "checkpoint_gpu.hpp"
#include "tensorzip/tensorzip_cuda.h"
#endif

namespace tz::checkpoint {

using nlohmann::json;
namespace tzd = tz::container::detail;  // output temporaries (src/container/tzc_output.hpp)
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
// The temporary is the container's (unpredictable name, O_EXCL|O_NOFOLLOW,
// removed on every failure path).
void write_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string fin = dir + "/" + name;
  try {
    int fd = -1;
    tzd::Temporary tmp = tzd::Temporary::create_file(fin, &fd);
    int err = tz::io::pwrite_full(fd, text.data(), text.size(), 0);
    if (!err) tzd::apply_attrs(fd, tzd::attrs_of(""), fin);
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    if (err) fail_errno(fin, "write", err);
    tzd::publish(tmp.path(), fin, /*force=*/true, /*is_dir=*/false);  // rename, fsync(dir)
    tmp.release();
  } catch (const tz::container::Error& e) {
    fail(ErrorKind::kIO, e.what());
  }
}

std::string read_small(const std::string& path, ErrorKind missing_kind) {
  // O_NONBLOCK: a FIFO in place of a manifest must not block latest().
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail(missing_kind, path + ": missing");
    fail_errno(path, "open", e);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::kCorrupt, path + ": not a regular file");
  }
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
// Version 2 when any tensor is cast-predicted: a version-1 reader (which
// would return the stored residuals as the values) refuses it instead;
// version 3 when any is delta-predicted (SaveOptions::ref).
std::string wrap_manifest(const json& body) {
  const std::string d = body.dump();
  int version = 1;
  for (const auto& r : body.at("ranks"))
    for (const auto& t : r.at("tensors"))
      if (t.contains("predict")) version = std::max(version, t["predict"].value("kind", "") == "delta" ? 3 : 2);
  return json{{"format", "tensorzip-checkpoint"}, {"version", version},
              {"body_xxh64", hex64(XXH64(d.data(), d.size(), 0))}, {"body", body}}
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
  const int version = j.value("version", 0);
  if (version < 1 || version > 3) fail(ErrorKind::kCorrupt, what + ": unsupported manifest version");
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
  int fd = -1;
  tzd::Temporary probe;  // removed on return
  try {
    probe = tzd::Temporary::create_file(dir + "/bw-probe", &fd);
  } catch (const tz::container::Error& e) {
    fail(ErrorKind::kIO, e.what());
  }
  const std::string& p = probe.path();
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

struct Seg {
  const TensorView* t = nullptr;
  tz_dtype cd = TZ_DTYPE_BYTES;
  unsigned block_elems = 0;
  uint64_t data_begin = 0;
};

struct Unit {
  size_t seg;
  uint64_t off;
  size_t n;
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

[[noreturn]] void rethrow_container(const tz::container::Error& e) {
  using CK = tz::container::ErrorKind;
  const int en = e.sys_errno();
  ErrorKind k = ErrorKind::kInternal;
  switch (e.kind()) {
    case CK::kUsage:
    case CK::kBadInput: k = ErrorKind::kUsage; break;
    case CK::kIO:
    case CK::kExists: k = (en == ENOSPC || en == EFBIG || en == EDQUOT) ? ErrorKind::kNoSpace : ErrorKind::kIO; break;
    default: k = ErrorKind::kInternal;
  }
  throw Error(k, e.what());
}

// GPUDirect Storage for this save or restore: requested with Io::kGds, and
// the cuFile library, its driver and a GPU present (else POSIX/io_uring and
// the reason is reported).
tz::io::GdsDecision gds_decision(Io io) {
  tz::io::GdsDecision d;
  if (io != Io::kGds) return d;
#ifdef TZ_CHECKPOINT_CUDA
  const char* lib = std::getenv("TZ_CUFILE_LIB");
  return tz::io::decide_gds(true, gpu::device_count(), lib && *lib ? lib : "libcufile.so.0");
#else
  d.reason = "built without CUDA";
  return d;
#endif
}

// Writes this rank's .tzip file with the container's TensorWriter (encode
// over a thread pool into a bounded ring of buffers, writes queued on the
// src/io back end, temp + fsync + rename); returns the rank's manifest entry.
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
  (void)cal_gibps;
  const auto t_pipe = Clock::now();
  stats.codec = choice.name;
  stats.model = choice.model;
  if (opt.log) opt.log("codec " + choice.name + ": " + choice.model);

  const std::string fin = dir + "/" + rank_file(opt.rank);
  tz::container::TensorWriterOptions wo;
  wo.level = choice.level;
  wo.threads = threads;
  wo.chunk_bytes = chunk;
  wo.slots = (unsigned)std::max<size_t>(2, opt.slots ? opt.slots : threads + 4);
  wo.force = true;  // a rank file of an interrupted save (no manifest) is replaced
  wo.metadata = opt.metadata;
  wo.created_by = "tensorzip checkpoint";
  wo.predict = opt.predict;
  wo.direct_io = opt.direct_io;
  std::string depends_on;  // the previous checkpoint's folder name (SaveOptions::ref)
  if (!opt.ref.empty()) {
    std::string rd = opt.ref;
    while (rd.size() > 1 && rd.back() == '/') rd.pop_back();
    if (!is_complete(rd))
      fail(ErrorKind::kUsage, rd + ": not a complete checkpoint (no valid manifest); it cannot be the reference of " + dir);
    wo.ref = rd + "/" + rank_file(opt.rank);
    struct stat st {};
    if (::stat(wo.ref.c_str(), &st) != 0)
      fail(ErrorKind::kUsage, wo.ref + ": missing (the reference checkpoint has no file for rank " +
                                  std::to_string(opt.rank) + ")");
    const auto sl = rd.find_last_of('/');
    depends_on = sl == std::string::npos ? rd : rd.substr(sl + 1);
  }
  const tz::io::Backend be = opt.io == Io::kPosix  ? tz::io::Backend::kPosix
                             : opt.io == Io::kUring ? tz::io::Backend::kUring
                                                    : tz::io::Backend::kAuto;  // kAuto, kGds
  const unsigned io_threads = std::max(1u, opt.io_threads);
  const unsigned depth = (unsigned)std::min<size_t>(std::max<size_t>(wo.slots, 4), 64);
  wo.sink = [be, io_threads, depth](int fd, bool) -> std::unique_ptr<tz::container::Sink> {
    return std::make_unique<tz::io::QueueSink>(fd, be, io_threads, depth);
  };
  tz::container::TensorWriterStats ws;
  std::vector<tz::container::TensorEntry> stored;
  try {
    tz::container::TensorWriter w(fin, wo);
#ifdef TZ_CHECKPOINT_CUDA
    // Device tensors: batched GPU encode into pinned buffers, handed to the
    // writer chunk by chunk as encoded frames (gpu::WriterEncoder).
    gpu::WriterEncoder genc(choice.level);
    bool any_dev = false;
#endif
    for (size_t i = 0; i < segs.size(); ++i) {
      const Seg& s = segs[i];
#ifdef TZ_CHECKPOINT_CUDA
      if (s.t->memory == Memory::kDevice) {
        genc.add(w, s.t->name, s.t->dtype, s.t->shape, s.t->data, s.t->size, s.block_elems);
        any_dev = true;
        continue;
      }
#endif
      w.add(s.t->name, s.t->dtype, s.t->shape, s.t->data, s.t->size);
    }
#ifdef TZ_CHECKPOINT_CUDA
    if (any_dev) genc.start();
#endif
    ws = w.finish();
    stored = w.tensors();
  } catch (const tz::container::Error& e) {
    rethrow_container(e);
  }
  stats.io = ws.io;
  if (opt.io == Io::kGds) {
    const auto g = gds_decision(opt.io);
    stats.io += g.use ? " (cuFile available; frames are checksummed in host memory, so they are written from pinned "
                        "host buffers)"
                      : " (cuFile not used: " + g.reason + ")";
    if (opt.log) opt.log("io: " + stats.io);
  }
  stats.predicted = ws.predicted;
  stats.deltas = ws.deltas;
  stats.raw_bytes = data_size;
  stats.file_bytes = ws.file_bytes;
  // Feedback for later kAuto choices: level-1 throughput per worker that
  // this save achieved, over the whole pipeline's time (encode is what
  // limits a CPU-bound save; an I/O-bound one understates it, which only
  // makes later choices more cautious).
  if (choice.level == 1 && data_size >= (64u << 20)) {
    const double wall = secs(t_pipe, Clock::now());
    const double achieved = (double)data_size / kGiB / wall / threads;
    std::lock_guard<std::mutex> lk(g_enc_mu);
    g_enc_obs = achieved;
  }
  if (opt.log && choice.level >= 0)
    opt.log("encode: " + std::to_string(threads) + " workers, " + std::to_string((uint64_t)(ws.encode_seconds * 1000)) +
            " ms of encode time in total for " + std::to_string(data_size) + " bytes; " +
            std::to_string(ws.predicted) + " tensors stored as cast residuals, " + std::to_string(ws.deltas) +
            " as delta residuals; io " + ws.io);
  // The references the rank file records (delta: the previous rank file).
  json jrefs = json::array();
  if (ws.deltas) {
    try {
      tz::container::Reader rr(fin, 1);
      for (const auto& r : rr.references()) {
        json jr = {{"file", r.file}, {"xxh64", hex64(r.xxh64)}};
        if (r.has_header_xxh64) jr["header_xxh64"] = hex64(r.header_xxh64);
        jrefs.push_back(std::move(jr));
      }
    } catch (const tz::container::Error& e) {
      rethrow_container(e);
    }
  }

  json jt = json::array();
  for (const auto& t : stored) {
    json fr = json::array();
    for (const auto& f : t.frames)
      fr.push_back({{"offset", f.offset}, {"size", f.size}, {"raw_size", f.raw_size}, {"xxh64", hex64(f.xxh64)}});
    json e = {{"name", t.name},
              {"dtype", t.dtype},
              {"shape", t.shape},
              {"size", t.raw_size()},
              {"codec_dtype", codec_dtype_str(t.codec_dtype)},
              {"level", t.level},
              {"frames", fr}};
    if (t.predict.kind == tz::container::PredictKind::kCast)
      e["predict"] = {{"kind", "cast"}, {"source", t.predict.source}};
    else if (t.predict.kind == tz::container::PredictKind::kDelta)
      e["predict"] = {{"kind", "delta"}, {"ref", t.predict.ref}};
    jt.push_back(std::move(e));
  }
  json out = json{{"rank", opt.rank},
              {"file", rank_file(opt.rank)},
              {"file_size", stats.file_bytes},
              {"file_xxh64", hex64(ws.file_xxh64)},
              {"chunk_bytes", chunk},
              {"codec", choice.name},
              {"time_model", choice.model},
              {"metadata", opt.metadata},
              {"tensors", jt}};
  if (ws.deltas) {
    out["references"] = jrefs;
    out["depends_on"] = depends_on;
  }
  return out;
}

// The manifest body's "depends_on": the previous checkpoint folder the ranks'
// delta tensors need (one for all ranks).
void add_depends_on(json& body, const std::string& dir) {
  std::string dep;
  for (const auto& r : body.at("ranks"))
    if (r.contains("depends_on")) {
      const std::string d = r["depends_on"].get<std::string>();
      if (!dep.empty() && d != dep)
        fail(ErrorKind::kUsage, dir + ": ranks reference different previous checkpoints ('" + dep + "', '" + d + "')");
      dep = d;
    }
  if (!dep.empty()) body["depends_on"] = dep;
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
    add_depends_on(body, dir);
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
  json body = {{"world_size", world_size}, {"metadata", meta}, {"ranks", ranks}};
  add_depends_on(body, dir);
  write_atomic(dir, kManifest, wrap_manifest(body));
}

// ===========================================================================
// Async save
// ===========================================================================
struct AsyncSaver::Impl {
  // Staging, reused across saves (not zero-filled); pinned (cudaHostAlloc,
  // from the process's pinned pool) when device tensors are staged, so the
  // device-to-host copies run at full DMA speed.
  uint8_t* arena = nullptr;
  uint64_t arena_size = 0;
  bool arena_pinned = false;
  void free_arena() {
    if (!arena) return;
#ifdef TZ_CHECKPOINT_CUDA
    if (arena_pinned) gpu::pinned_put(arena);
    else
#endif
      delete[] arena;
    arena = nullptr;
    arena_size = 0;
  }
  ~Impl() {
    join();
    free_arena();
  }
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
  bool want_pinned = false;
#ifdef TZ_CHECKPOINT_CUDA
  for (const auto& t : tensors) want_pinned = want_pinned || t.memory == Memory::kDevice;
#endif
  if (impl_->arena_size < total || impl_->arena_pinned != want_pinned) {
    impl_->free_arena();
#ifdef TZ_CHECKPOINT_CUDA
    if (want_pinned) {
      try {
        impl_->arena = static_cast<uint8_t*>(gpu::pinned_get(total));
      } catch (const std::runtime_error& e) {
        fail(ErrorKind::kInternal, e.what());
      }
    } else
#endif
      impl_->arena = new uint8_t[total ? total : 1];
    impl_->arena_size = total;
    impl_->arena_pinned = want_pinned;
  }
  impl_->staged.assign(tensors.begin(), tensors.end());
  // Copy with `threads` threads, each taking a contiguous run of tensors of
  // about total/threads bytes (one thread cannot saturate memory bandwidth).
  std::vector<uint8_t*> dst(impl_->staged.size());
  {
    uint64_t off = 0;
    for (size_t i = 0; i < impl_->staged.size(); ++i) dst[i] = impl_->arena + off, off += align64(impl_->staged[i].size);
  }
  const unsigned nt = (unsigned)std::max<size_t>(1, std::min<size_t>(resolve_threads(opt.threads), impl_->staged.size()));
  std::vector<std::exception_ptr> errs(nt);
  auto copy_range = [&](unsigned w) {
    try {
      const uint64_t lo = total * w / nt, hi = total * (w + 1) / nt;
      for (size_t i = 0; i < impl_->staged.size(); ++i) {
        const uint64_t at = (uint64_t)(dst[i] - impl_->arena);
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
  // Cast prediction: frames hold value XOR cast(source), source an FP32
  // tensor of the same shape in the same rank file; -1: none.
  int cast_kind = -1;
  std::string cast_source;
  // Delta prediction: frames hold value XOR the tensor `delta_index` of the
  // reference reader `delta_ref` (Impl::refs); -1: none.
  int delta_ref = -1;
  size_t delta_index = 0;
};
}  // namespace

struct Checkpoint::Impl {
  std::string dir;
  unsigned threads;
  tz::io::Backend io = tz::io::Backend::kAuto;
  std::string io_name = "none";  // read back end of the last load
  tz::io::GdsDecision gds;       // Io::kGds: cuFile for device destinations
  std::vector<std::string> files;
  std::vector<int> fds;
  std::vector<int> dfds;  // O_DIRECT descriptors (-1: not requested or refused)
  std::atomic<bool> direct_ok{true};
  std::vector<TensorInfo> infos;
  std::vector<RTensor> tensors;
  std::map<std::string, size_t> by_name;
  std::map<std::string, std::string> meta;
  // References of delta tensors (the previous checkpoint's rank files),
  // opened and checked by the constructor.
  std::vector<std::unique_ptr<tz::container::Reader>> refs;
  ~Impl() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    for (int fd : dfds)
      if (fd >= 0) ::close(fd);
  }
};

Checkpoint::Checkpoint(const std::string& dir, unsigned threads, bool direct_io, Io io)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.dir = dir;
  m.io = io == Io::kPosix ? tz::io::Backend::kPosix : io == Io::kUring ? tz::io::Backend::kUring : tz::io::Backend::kAuto;
  m.gds = gds_decision(io);
  // TZ_TEST_REFUSE_O_DIRECT=1: behave as on a file system refusing O_DIRECT.
  if (const char* r = std::getenv("TZ_TEST_REFUSE_O_DIRECT"); r && *r == '1') direct_io = false;
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
      // This rank file's references: opened and checked now, so that a
      // missing or changed previous checkpoint fails here, naming both.
      std::vector<int> ref_slot;
      if (r.contains("references")) {
        const std::string dep = body.value("depends_on", std::string());
        for (const auto& jr : r.at("references")) {
          // Resolved, opened and identified by the references module
          // (container/tzip_refs.hpp), as the container Reader does.
          tz::container::Reference ref;
          ref.file = jr.at("file").get<std::string>();
          ref.xxh64 = parse_hex64(jr.at("xxh64").get<std::string>());
          if (jr.contains("header_xxh64")) {
            ref.has_header_xxh64 = true;
            ref.header_xxh64 = parse_hex64(jr.at("header_xxh64").get<std::string>());
          }
          std::string rp;
          try {
            rp = tz::container::refs::resolve(m.files.back(), ref.file, {});
          } catch (const tz::container::Error& e) {
            fail(ErrorKind::kCorrupt, mp + ": " + e.what());
          }
          const std::string who = m.files.back() + ": needs " + std::filesystem::path(rp).lexically_normal().string() +
                                  (dep.empty() ? std::string() : " (previous checkpoint '" + dep + "')");
          struct stat rst {};
          if (::stat(rp.c_str(), &rst) != 0)
            fail(ErrorKind::kNotFound, who + ", which is missing: the checkpoint depends on it; restore it there");
          std::unique_ptr<tz::container::Reader> rd;
          try {
            rd = tz::container::refs::open_reference(m.files.back(), ref, rp, {}, 1, {});
            rd->check_references();
          } catch (const tz::container::Error& e) {
            fail(ErrorKind::kCorrupt, who + ", which has changed or cannot be used: " + e.what());
          }
          ref_slot.push_back((int)m.refs.size());
          m.refs.push_back(std::move(rd));
        }
      }
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
        if (t.contains("predict") && t.at("predict").at("kind").get<std::string>() == "delta") {
          const int k = t.at("predict").at("ref").get<int>();
          if (k < 0 || (size_t)k >= ref_slot.size())
            fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': bad delta reference");
          tz::container::Reader& rd = *m.refs[(size_t)ref_slot[(size_t)k]];
          const long ri = rd.find(rt.info.name);
          if (ri < 0 || rd.tensors()[(size_t)ri].dtype != rt.info.dtype ||
              rd.tensors()[(size_t)ri].shape != rt.info.shape)
            fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': no tensor of the same dtype and shape in " +
                                          rd.path());
          rt.delta_ref = ref_slot[(size_t)k];
          rt.delta_index = (size_t)ri;
        } else if (t.contains("predict")) {
          const json& pr = t.at("predict");
          if (pr.at("kind").get<std::string>() != "cast" || (rt.info.dtype != "BF16" && rt.info.dtype != "F16"))
            fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': bad prediction");
          rt.cast_kind = rt.info.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16;
          rt.cast_source = pr.at("source").get<std::string>();
        }
        for (const auto& f : rt.frames)
          if (f.size == 0 && ((rt.cast_kind < 0 && rt.delta_ref < 0) || f.xxh64 != XXH64(nullptr, 0, 0)))
            fail(ErrorKind::kCorrupt, mp + ": tensor '" + rt.info.name + "': empty frame");
        if (!m.by_name.emplace(rt.info.name, m.tensors.size()).second)
          fail(ErrorKind::kCorrupt, mp + ": duplicate tensor '" + rt.info.name + "'");
        m.infos.push_back(rt.info);
        m.tensors.push_back(std::move(rt));
      }
    }
    for (const auto& t : m.tensors) {
      if (t.cast_kind < 0) continue;
      const auto it = m.by_name.find(t.cast_source);
      const RTensor* src = it == m.by_name.end() ? nullptr : &m.tensors[it->second];
      if (!src || src->info.dtype != "F32" || src->info.shape != t.info.shape || src->file != t.file ||
          src->cast_kind >= 0)
        fail(ErrorKind::kCorrupt, mp + ": tensor '" + t.info.name + "': cast source '" + t.cast_source +
                                      "' is not an FP32 tensor of the same shape in its file");
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
std::string Checkpoint::io() const {
  const auto& m = *impl_;
  if (!m.gds.use && !m.gds.reason.empty()) return m.io_name + " (cuFile not used: " + m.gds.reason + ")";
  return m.io_name;
}
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
  // Phase 1: plain tensors and the FP32 sources of requested cast tensors
  // (into the caller's buffer when it asked for the source in host memory,
  // else into a temporary); phase 2: the cast tensors, residual XOR cast.
  std::vector<LoadRequest> first;
  std::vector<const LoadRequest*> second;
  std::map<size_t, const uint8_t*> src_bytes;
  std::vector<std::unique_ptr<uint8_t[]>> temps;
  first.reserve(requests.size() * 2);
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
    if (t.cast_kind < 0) {
      first.push_back(r);
      if (r.memory == Memory::kHost) src_bytes.emplace((size_t)i, static_cast<const uint8_t*>(r.dst));
    } else {
      second.push_back(&r);
    }
  }
  for (const LoadRequest* r : second) {
    const size_t s = m.by_name.at(m.tensors[(size_t)find(r->name)].cast_source);
    if (src_bytes.count(s)) continue;
    const uint64_t n = m.tensors[s].info.size;
    temps.emplace_back(new uint8_t[n ? n : 1]);
    first.push_back({m.tensors[s].info.name, temps.back().get(), n, Memory::kHost});
    src_bytes[s] = temps.back().get();
  }
  run_load(first, src_bytes);
  std::vector<LoadRequest> casts;
  for (const LoadRequest* r : second) casts.push_back(*r);
  run_load(casts, src_bytes);
}

void Checkpoint::run_load(std::span<const LoadRequest> requests, const std::map<size_t, const uint8_t*>& src_bytes) {
  auto& m = *impl_;
  struct Job {
    const RTensor* t;
    const RFrame* f;
    const LoadRequest* req;
    const uint8_t* cast_src;  // FP32 source bytes of a cast tensor
    tz::container::Reader* dref;  // reference of a delta tensor
  };
  std::vector<Job> jobs;
  for (const auto& r : requests) {
    const RTensor& t = m.tensors[(size_t)find(r.name)];
    const uint8_t* cs = t.cast_kind >= 0 ? src_bytes.at(m.by_name.at(t.cast_source)) : nullptr;
    tz::container::Reader* dr = t.delta_ref >= 0 ? m.refs[(size_t)t.delta_ref].get() : nullptr;
    for (const auto& f : t.frames) jobs.push_back({&t, &f, &r, cs, dr});
  }
#ifdef TZ_CHECKPOINT_CUDA
  {
    // Device destinations (not cast-predicted): read in batches (cuFile
    // straight into device memory with Io::kGds, else through pinned
    // buffers) and decoded on the GPU in batches.
    std::vector<gpu::DevFrame> dev;
    std::vector<Job> rest;
    for (const auto& j : jobs) {
      if (j.req->memory != Memory::kDevice || j.cast_src || j.dref) {
        rest.push_back(j);
        continue;
      }
      gpu::DevFrame f;
      f.fd = m.fds[j.t->file];
      f.dfd = m.dfds[j.t->file];
      f.offset = j.f->offset;
      f.size = j.f->size;
      f.xxh64 = j.f->xxh64;
      f.dst = static_cast<uint8_t*>(j.req->dst) + j.f->raw_off;
      f.raw_size = j.f->raw_size;
      f.what = "tensor '" + j.t->info.name + "' (" + m.files[j.t->file] + ", frame at offset " +
               std::to_string(j.f->offset) + ")";
      dev.push_back(std::move(f));
    }
    if (!dev.empty()) {
      std::string note;
      for (bool use_gds = m.gds.use;; use_gds = false) {
        try {
          gpu::load_frames(dev, use_gds);
          m.io_name = use_gds ? "cuFile" : "pread+pinned" + note;
          break;
        } catch (const std::runtime_error& e) {
          const std::string w = e.what();
          if (w.rfind("corrupt: ", 0) == 0) fail(ErrorKind::kCorrupt, w.substr(9));
          // cuFile refused this file (registration or a read): POSIX reads,
          // as KvikIO's compatibility mode does. The destinations are simply
          // written again.
          if (!use_gds) fail(ErrorKind::kIO, w);
          note = " (cuFile failed: " + w + ")";
        }
      }
    }
    jobs.swap(rest);
  }
#endif
  if (jobs.empty()) return;
  // Reads are issued in job order by a reader thread through the src/io
  // read queue (io_uring, or pread threads) into a ring of `n_slots`
  // 4 KiB-aligned buffers; workers take jobs in the same order, wait for
  // their frame, check and decode it, and free the slot. So the reads of
  // frames k+1.. are in flight while frame k is decoded, and memory is
  // bounded by the ring.
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr err;
  bool stop = false;
  const unsigned n_workers = (unsigned)std::min<size_t>(m.threads, std::max<size_t>(1, jobs.size()));
  const size_t n_slots = std::min<size_t>(jobs.size(), std::max<size_t>(4, 2 * (size_t)n_workers));
  struct RSlot {
    void* buf = nullptr;
    uint64_t cap = 0;
    size_t job = 0;
    bool ready = false;    // read completed (or failed: rerr)
    int rerr = 0;
    uint64_t got = 0;
    uint64_t lo = 0;       // file offset of buf[0]
    bool direct = false;   // read with O_DIRECT
    ~RSlot() { std::free(buf); }
  };
  std::vector<RSlot> slots(n_slots);
  for (size_t i = 0; i < n_slots; ++i) slots[i].job = i;
  constexpr uint64_t kAlign = 4096;
  auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(mu);
    if (!err) err = e;
    stop = true;
    cv.notify_all();
  };
  {
    tz::io::ReadQueue rq(m.io, 2, (unsigned)std::min<size_t>(n_slots, 64));
    m.io_name = tz::io::backend_name(rq.backend());
    std::thread reader([&] {
      struct Drain {  // this thread's io_uring reads complete through it: stay until they have
        tz::io::ReadQueue& q;
        ~Drain() { q.drain(); }
      } drain{rq};
      try {
        for (size_t j = 0; j < jobs.size(); ++j) {
          RSlot& sl = slots[j % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || (sl.job == j && !sl.ready); });
            if (stop) return;
          }
          const Job& jb = jobs[j];
          const int dfd = m.dfds[jb.t->file];
          const bool direct = dfd >= 0 && m.direct_ok.load(std::memory_order_relaxed);
          // O_DIRECT: offset, length and buffer aligned to 4 KiB; the frame
          // lies inside the aligned range (the read may stop at end of file).
          const uint64_t lo = direct ? jb.f->offset & ~(kAlign - 1) : jb.f->offset;
          const uint64_t need = jb.f->offset + jb.f->size - lo;
          const uint64_t len = direct ? (need + kAlign - 1) & ~(kAlign - 1) : need;
          if (sl.cap < len) {
            std::free(sl.buf);
            sl.buf = nullptr;
            sl.cap = 0;
            if (::posix_memalign(&sl.buf, kAlign, len) != 0) fail(ErrorKind::kInternal, "out of memory");
            sl.cap = len;
          }
          sl.lo = lo;
          sl.direct = direct;
          if (len == 0) {  // empty frame (exact cast prediction): nothing to read
            std::lock_guard<std::mutex> lk(mu);
            sl.ready = true, sl.rerr = 0, sl.got = 0;
            cv.notify_all();
            continue;
          }
          rq.submit(direct ? dfd : m.fds[jb.t->file], lo, sl.buf, len, [&, j](int e, size_t got) {
            std::lock_guard<std::mutex> lk(mu);
            RSlot& s2 = slots[j % n_slots];
            s2.ready = true, s2.rerr = e, s2.got = got;
            cv.notify_all();
          });
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    });
    auto worker = [&] {
      std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(1), &tz_ctx_free);
      std::vector<uint8_t> buf, host, pred;
      try {
        for (;;) {
          const size_t j = next.fetch_add(1);
          if (j >= jobs.size()) break;
          RSlot& sl = slots[j % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || (sl.job == j && sl.ready); });
            if (stop) break;
          }
          // The slot goes to job j + n_slots once this one is decoded.
          struct Release {
            std::mutex& mu;
            std::condition_variable& cv;
            RSlot& sl;
            size_t n;
            ~Release() {
              std::lock_guard<std::mutex> lk(mu);
              sl.ready = false;
              sl.job += n;
              cv.notify_all();
            }
          } release{mu, cv, sl, n_slots};
          const Job& jb = jobs[j];
          const std::string what = "tensor '" + jb.t->info.name + "' (" + m.files[jb.t->file] + ", frame at offset " +
                                   std::to_string(jb.f->offset) + ")";
          const uint8_t* frame = nullptr;
          if (jb.f->size) {
            const uint64_t need = jb.f->offset + jb.f->size - sl.lo;
            if (sl.rerr == EINVAL && sl.direct) {
              m.direct_ok = false;  // alignment refused here: buffered reads from now on
            } else if (sl.rerr) {
              fail(sl.rerr == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO,
                   what + ": read failed: " + std::strerror(sl.rerr));
            } else if (sl.got < need) {
              fail(ErrorKind::kCorrupt, what + ": read failed: file truncated");
            } else {
              frame = static_cast<const uint8_t*>(sl.buf) + (jb.f->offset - sl.lo);
            }
            if (!frame) {
              if (buf.size() < jb.f->size) buf.resize(jb.f->size);
              if (const int e = tz::io::pread_full(m.fds[jb.t->file], buf.data(), jb.f->size, jb.f->offset))
                fail(e == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO, what + ": read failed: " + std::strerror(e));
              frame = buf.data();
            }
          }
          if (XXH64(frame, jb.f->size, 0) != jb.f->xxh64) fail(ErrorKind::kCorrupt, what + ": checksum mismatch");
          uint8_t* dst = static_cast<uint8_t*>(jb.req->dst) + jb.f->raw_off;
          if (jb.cast_src || jb.dref) {
            // Predicted: decode the residual on the CPU (an empty frame is an
            // all-zero residual), then XOR the cast of the FP32 source, or the
            // reference's bytes of this frame (delta).
            uint8_t* out = dst;
            const bool to_dev = jb.req->memory == Memory::kDevice;
            if (to_dev) {
              if (host.size() < jb.f->raw_size) host.resize(jb.f->raw_size);
              out = host.data();
            }
            if (jb.f->size == 0) {
              std::memset(out, 0, jb.f->raw_size);
            } else {
              const size_t r = tz_ctx_decompress(ctx.get(), out, jb.f->raw_size, frame, jb.f->size);
              if (tz_is_error(r) || r != jb.f->raw_size)
                fail(ErrorKind::kCorrupt, what + ": " + (tz_is_error(r) ? std::string(tz_get_error_name(r)) + ": " +
                                                                               tz_last_error_detail()
                                                                         : std::string("wrong decoded size")));
            }
            if (jb.cast_src) {
              tz::predict::cast_xor(jb.cast_src + jb.f->raw_off * 2, out, jb.f->raw_size / 2, jb.t->cast_kind);
            } else {
              if (pred.size() < jb.f->raw_size) pred.resize(jb.f->raw_size);
              try {
                jb.dref->read_range(jb.t->delta_index, jb.f->raw_off, jb.f->raw_size, pred.data());
              } catch (const tz::container::Error& e) {
                fail(ErrorKind::kCorrupt, what + ": reference " + jb.dref->path() + ": " + e.what());
              }
              tz::predict::xor_bytes(pred.data(), out, jb.f->raw_size);
            }
#ifdef TZ_CHECKPOINT_CUDA
            if (to_dev && cudaMemcpy(dst, out, jb.f->raw_size, cudaMemcpyHostToDevice) != cudaSuccess)
              fail(ErrorKind::kInternal, what + ": cudaMemcpy failed");
#endif
            continue;
          }
          const size_t r = tz_ctx_decompress(ctx.get(), dst, jb.f->raw_size, frame, jb.f->size);
          if (tz_is_error(r) || r != jb.f->raw_size)
            fail(ErrorKind::kCorrupt, what + ": " + (tz_is_error(r) ? std::string(tz_get_error_name(r)) + ": " +
                                                                           tz_last_error_detail()
                                                                     : std::string("wrong decoded size")));
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    };
    std::vector<std::thread> th;
    for (unsigned i = 1; i < n_workers; ++i) th.emplace_back(worker);
    worker();
    for (auto& t : th) t.join();
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;  // the reader may wait for a slot no worker will free
      cv.notify_all();
    }
    reader.join();
  }  // rq drains before the slots go away
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
  // A delta checkpoint needs the one it depends_on (a sibling folder), and
  // that one its own: follow the chain with the references module's rules
  // (a cycle, or more than refs::kMaxDepth links, counts as damage).
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  tz::container::refs::Chain chain;
  try {
    while (true) {
      struct stat st {};
      if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
      chain = chain.then(d, st);
      const json body = unwrap_manifest(read_small(d + "/" + kManifest, ErrorKind::kIncomplete), d);
      const std::string dep = body.value("depends_on", std::string());
      if (dep.empty()) return true;
      d = tz::container::refs::sibling_folder(d, dep);
    }
  } catch (const std::exception&) {
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
